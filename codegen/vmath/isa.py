"""Which target-specific instructions the vector math may use for the vectors being built.

The lowering records the target's features on the llvmlite module; the math functions ask here, so the same code
emits `vscalefps`/`vrcp14ps` on AVX-512 and portable IR elsewhere (and on the 1-lane generic loop).
"""

from __future__ import annotations

from llvmlite import ir


def set_features(module: ir.Module, features) -> None:
    module.onnxopt_features = frozenset(features)


def avx512_f32(b: ir.IRBuilder, x: ir.Value) -> bool:
    feats = getattr(b.module, "onnxopt_features", frozenset())
    return "avx512f" in feats and isinstance(x.type, ir.VectorType) and x.type.count == 16 \
        and isinstance(x.type.element, ir.FloatType)
