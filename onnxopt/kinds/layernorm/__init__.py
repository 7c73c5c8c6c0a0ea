"""LayerNormalization over the last axis as a row kernel of its own, with the residual Add before it (find.py,
lower.py, exec.c)."""

from ..base import Kind
from .find import find_regions
from . import c
from .lower import build
from .schedule import space

# Asked before the compute rule, whose epilogue would otherwise take the residual Add: Add + LayerNormalization as
# one row kernel runs several times faster than onnxruntime's SkipLayerNormalization (BENCHMARKS.md), and it stays
# whether or not the matmul before it is fused.
KIND = Kind(name="layernorm", find=find_regions, build=build, lowerings={"c": c.build}, schedule=space, first=True,
            order=30)
