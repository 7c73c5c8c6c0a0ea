"""Build a model's kernel library: LLVM objects for the kernels plus the project's C glue, linked into one .so.

The glue is generic (ort_glue.c); this module writes the per-library part (the op tables and the CPU check) and
runs the system C compiler and linker. The library needs only libc: it does not link libonnxruntime, ORT hands it
the API table when it calls RegisterCustomOps.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources

from onnxopt.errors import ToolchainError

from ..target import Target

# Features gcc's __builtin_cpu_supports knows by these names: checked inside the library itself, so a non-Python
# host on an older CPU also falls back to the function bodies instead of dying on SIGILL.
_GCC_CPU_NAMES = {"sse4.1", "sse4.2", "avx", "avx2", "fma", "bmi2", "avx512f", "avx512vl", "avx512bw", "avx512dq",
                  "avx512cd", "avx512vnni", "avx512bf16"}


@dataclass
class EwKernelDesc:
    """What the glue needs to know of one elementwise op type."""

    op_type: str
    in_types: list[int]
    out_types: list[int]
    in_sizes: list[int]
    out_sizes: list[int]
    out_rank: int
    out_deps: list[int]  # per output, a bitmask of the inputs it depends on
    parallel_min: int  # elements from which the work is split over onnxruntime's thread pool
    variants: list[tuple[int, str]]  # (mask, symbol)
    generic: str


def _c_array(ctype: str, name: str, values) -> str:
    body = ", ".join(str(v) for v in values) or "0"
    return f"static const {ctype} {name}[] = {{{body}}};\n"


def library_source(kernels: list[EwKernelDesc], target: Target) -> str:
    parts = []
    for k in kernels:
        for _, sym in k.variants:
            parts.append(f"extern void {sym}(void **, void **, int64_t);\n")
        parts.append(f"extern void {k.generic}(void **, void **, int64_t, const int64_t *);\n")
    for i, k in enumerate(kernels):
        parts.append(_c_array("int", f"k{i}_in_types", k.in_types))
        parts.append(_c_array("int", f"k{i}_out_types", k.out_types))
        parts.append(_c_array("int", f"k{i}_in_sizes", k.in_sizes))
        parts.append(_c_array("int", f"k{i}_out_sizes", k.out_sizes))
        parts.append(_c_array("uint32_t", f"k{i}_masks", [m for m, _ in k.variants]))
        parts.append(_c_array("uint32_t", f"k{i}_deps", k.out_deps))
        parts.append(_c_array("row_fn", f"k{i}_variants", [s for _, s in k.variants] or ["NULL"]))
    parts.append("static const onnxopt_ew_desc ONNXOPT_OPS[] = {\n")
    for i, k in enumerate(kernels):
        parts.append(f'  {{"{k.op_type}", {len(k.in_types)}, {len(k.out_types)}, {k.out_rank}, k{i}_in_types, '
                     f"k{i}_out_types, k{i}_in_sizes, k{i}_out_sizes, {len(k.variants)}, k{i}_masks, "
                     f"k{i}_variants, {k.generic}, k{i}_deps, {k.parallel_min}}},\n")
    if not kernels:
        parts.append("  {0}\n")
    parts.append("};\n")
    parts.append(f"#define ONNXOPT_N_OPS {len(kernels)}\n")
    checks = [f for f in target.features if f in _GCC_CPU_NAMES]
    cond = " && ".join(f'__builtin_cpu_supports("{f}")' for f in checks) or "1"
    parts.append(f"static int onnxopt_cpu_ok(void) {{\n  __builtin_cpu_init();\n  return {cond};\n}}\n")
    glue = resources.files("onnxopt.codegen.glue").joinpath("ort_glue.c").read_text()
    return glue.replace("/*@@LIBRARY@@*/", "".join(parts))


def _cc() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise ToolchainError("no C compiler found (cc/gcc/clang): install one, for example `apt-get install gcc`, "
                         "or point $CC at it")


def link_library(kernels: list[EwKernelDesc], objects: list[bytes], target: Target, output: str) -> str:
    """Compile the glue, link it with the kernel objects into `output`; returns the library's sha256."""
    cc = _cc()
    with tempfile.TemporaryDirectory(prefix="onnxopt-link-") as tmp:
        src = os.path.join(tmp, "glue.c")
        with open(src, "w") as f:
            f.write(library_source(kernels, target))
        objs = []
        for i, data in enumerate(objects):
            p = os.path.join(tmp, f"kernels{i}.o")
            with open(p, "wb") as f:
                f.write(data)
            objs.append(p)
        glue_o = os.path.join(tmp, "glue.o")
        # The glue is built for the baseline ISA so that its CPU check itself runs anywhere.
        _run([cc, "-O2", "-fPIC", "-fvisibility=hidden", "-std=c11", "-Wall", "-Werror", "-c", src, "-o", glue_o])
        so = os.path.join(tmp, "lib.so")
        _run([cc, "-shared", "-Wl,-Bsymbolic", "-Wl,-z,noexecstack", "-o", so, glue_o, *objs, "-lm"])
        with open(so, "rb") as f:
            data = f.read()
        tmp_out = output + ".tmp"
        with open(tmp_out, "wb") as f:
            f.write(data)
        os.replace(tmp_out, output)
    return hashlib.sha256(data).hexdigest()


def _run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise ToolchainError(f"could not run {cmd[0]}: {e}") from None
    if r.returncode != 0:
        raise ToolchainError(f"{' '.join(cmd[:2])}... failed:\n{r.stderr.strip()[-2000:]}")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
