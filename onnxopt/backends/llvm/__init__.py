"""The LLVM CPU backend: kernels written as LLVM IR with llvmlite (codegen/: the kinds' lower.py, the micro-kernels,
vector math, the ISA table), compiled by LLVM for the target's CPU, linked with the C glue by the system compiler."""

from __future__ import annotations

from onnxopt.backends.base import Backend
from onnxopt.codegen.target import Target


class LlvmBackend(Backend):
    name = "llvm"
    target_help = ("native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4, aarch64, aarch64-dotprod, "
                   "cpu=NAME,+feature,...")

    def owns(self, spec: str) -> bool:
        return True

    def parse_target(self, spec: str) -> Target:
        from onnxopt.codegen.target import parse_target

        return parse_target(spec)

    def compile(self, source: str, target: Target, vectorize: bool = True) -> bytes:
        from onnxopt.codegen.compile import compile_object

        return compile_object(source, target, vectorize=vectorize)


BACKEND = LlvmBackend()
