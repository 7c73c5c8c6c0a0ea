"""Which target-specific instructions the vector math may use for the vectors being built.

The lowering records the target's ISA row (codegen/isa.py) on the llvmlite module; the math functions ask here, so
the same code emits `vscalefps`/`vrcp14ps` on AVX-512 and portable IR elsewhere (and on the 1-lane generic loop).
"""

from __future__ import annotations

from llvmlite import ir

from ..isa import Features, isa_of


def set_features(module: ir.Module, features) -> None:
    """Record the ISA row of the module's target: its triple and these LLVM features."""
    module.onnxopt_features = frozenset(features)
    module.onnxopt_isa = isa_of(Features(module.triple or "", tuple(features)))


def avx512_f32(b: ir.IRBuilder, x: ir.Value) -> bool:
    isa = getattr(b.module, "onnxopt_isa", None)
    return isa is not None and isa.vmath == "avx512" and isinstance(x.type, ir.VectorType) and x.type.count == 16 \
        and isinstance(x.type.element, ir.FloatType)
