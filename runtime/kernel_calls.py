"""How many times each fused op's kernel ran in this process: the library counts its Compute calls (register.c,
`onnxopt_compute_counts`), so a user, a test or a benchmark can see that the kernels ran, not only that the answers
match (a model whose library was not picked up gives the same answers through its function bodies)."""

from __future__ import annotations

import _ctypes
import ctypes


def kernel_calls(library: str) -> dict[str, int]:
    """{op type: Compute calls} of the kernel library at `library` in this process: give
    `registered_library(session, loadable=True)`, the name bound to the file onnxruntime loaded (a path may name
    another file by now, which ctypes would load apart). The library onnxruntime loaded is the one read: the dynamic loader hands back the loaded copy
    of the same file rather than loading it twice. A library no session registered counts 0 for every op."""
    lib = ctypes.CDLL(library)
    try:
        counts_of = lib.onnxopt_compute_counts
        counts_of.restype = ctypes.c_int
        counts_of.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int]
        n = counts_of(None, None, 0)
        names = (ctypes.c_char_p * n)()
        counts = (ctypes.c_ulonglong * n)()
        counts_of(names, counts, n)
        return {names[i].decode(): int(counts[i]) for i in range(n)}
    finally:
        # Our reference only: onnxruntime's keeps the library loaded while it uses it, and a process that checks
        # many models (the optimizer) does not keep every library mapped for good.
        _ctypes.dlclose(lib._handle)


def bf16_tensors(library: str) -> int:
    """How many tensors the library's sequences kept in bfloat16 in this process (one per tensor per run): a bf16
    GEMM's output that only bf16 GEMMs read as their A (codegen/glue/sequence_exec.c). 0 where the AMX tiles do not
    run, with ONNXOPT_SEQUENCE_BF16=0, or for a library written before."""
    lib = ctypes.CDLL(library)
    try:
        count = getattr(lib, "onnxopt_sequence_bf16_tensors", None)
        if count is None:
            return 0
        count.restype = ctypes.c_ulonglong
        return int(count())
    finally:
        _ctypes.dlclose(lib._handle)
