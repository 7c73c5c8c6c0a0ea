"""The C backend: kernels written as plain C and compiled by the system C compiler for the target's CPU, the way
TVM's C backend and tinygrad's CPU backend work. It lowers the elementwise chains and the row kinds (softmax,
LayerNorm: their folders' c.py); the glue, link, sessions and checks are the host ones every CPU backend shares.

It proves the backend protocol end to end on any machine with a C compiler; its kernels need nothing of LLVM (the
target's description still comes from llvmlite's host query).
Targets: `c` (this machine), `c:x86-64-v2`, `c:x86-64-v3`, `c:x86-64-v4`: the vector width comes from the target's
features (-m flags, and 512-bit vectors preferred where it has AVX-512), never from the host.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import replace

from onnxopt.backends.base import Backend
from onnxopt.codegen.target import Target
from onnxopt.errors import ToolchainError, UsageError

# LLVM feature names (Target.features) that gcc and clang take as -m<name>.
_X86_FLAGS = ("sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq",
              "avx512vl", "avx512cd", "avx512vnni", "avx512bf16", "avxvnni")
# -fopenmp-simd: the kernels' `#pragma omp simd reduction(...)` loops (row sums and maxima) are vectorized without
# letting the compiler reassociate anything else.
CFLAGS = ("-O3", "-std=c11", "-fPIC", "-fno-math-errno", "-fopenmp-simd", "-Wall", "-Werror")
KERNEL_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.h")


def cpu_flags(target: Target) -> list[str]:
    """The compiler's flags for the target's instruction set."""
    if target.arch == "aarch64":
        return ["-march=armv8.2-a+dotprod" if target.has("dotprod") else "-march=armv8-a"]
    if target.arch != "x86_64":
        return []  # the compiler's default for its own machine
    flags = ["-march=x86-64", "-mtune=generic"] + [f"-m{f}" for f in target.features if f in _X86_FLAGS]
    if target.has("avx512f"):
        flags.append("-mprefer-vector-width=512")
    return flags


def compile_c(source: str, target: Target) -> bytes:
    """C source -> one object file's bytes, for `target`."""
    from onnxopt.codegen.glue.library import _cc, write_sources

    cc = _cc(target)
    with tempfile.TemporaryDirectory(prefix="onnxopt-c-") as tmp:
        src = os.path.join(tmp, "kernel.c")
        obj = os.path.join(tmp, "kernel.o")
        write_sources(tmp, [(src, source.encode())])
        cmd = [cc, *CFLAGS, *cpu_flags(target), "-I", os.path.dirname(KERNEL_H), "-c", src, "-o", obj]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise ToolchainError(f"could not run {cc}: {e}") from None
        if r.returncode != 0:
            digest = hashlib.sha256(source.encode()).hexdigest()[:12]
            raise ToolchainError(f"{cc} could not compile a C kernel ({digest}):\n{r.stderr.strip()[-2000:]}")
        with open(obj, "rb") as f:
            return f.read()


class CBackend(Backend):
    name = "c"
    target_help = "c, c:native, c:x86-64-v2, c:x86-64-v3, c:x86-64-v4 (plain C through the system compiler)"

    def owns(self, spec: str) -> bool:
        return spec == "c" or spec.startswith("c:")

    def parse_target(self, spec: str) -> Target:
        from onnxopt.codegen.target import parse_target

        cpu = spec.partition(":")[2] or "native"
        if cpu.startswith("cpu=") or cpu.startswith("aarch64") or cpu in ("c", "cuda"):
            raise UsageError(f"--target {spec}: the C backend takes c, c:native or c:x86-64-v2/v3/v4")
        base = parse_target(cpu)
        return replace(base, name=spec if spec != "c" else "c:native", backend="c")

    def compile(self, source: str, target: Target, **options) -> bytes:
        return compile_c(source, target)


BACKEND = CBackend()
