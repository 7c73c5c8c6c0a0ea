"""LayerNormalization over the last axis as a row kernel of its own, with the residual Add before it (find.py,
lower.py, exec.c)."""

from ..base import Kind
from .find import find_regions
from .lower import build

KIND = Kind(name="layernorm", find=find_regions, build=build)
