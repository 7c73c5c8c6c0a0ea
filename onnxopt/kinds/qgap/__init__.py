"""A QDQ GlobalAveragePool unit (DequantizeLinear -> GlobalAveragePool -> QuantizeLinear) kept in int8: the channels'
integer sums and one requantization each (find.py, lower.py, exec.c), as onnxruntime's QLinearGlobalAveragePool."""

from ..base import Kind
from .find import find_regions
from .lower import build

# first: asked before the pool rule, which would take the GlobalAveragePool of the unit alone (a float pool).
KIND = Kind(name="qgap", find=find_regions, build=build, dtypes=("uint8", "int8"), first=True, order=30)
