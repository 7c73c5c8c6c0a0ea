"""The QDQ GlobalAveragePool's parameters: the int8 type, and the scales and zero points of its two steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from onnxopt.fusion.params import KindParams


@dataclass(frozen=True)
class QGapParams(KindParams):
    family: ClassVar[str] = "qgap"
    dtype: str  # "uint8" or "int8", in and out (a QuantizeLinear to another type is refused)
    x_scale: float
    x_zero: int
    y_scale: float
    y_zero: int

    def key(self) -> list:
        # The scales are in the op type: its function fallback holds the unit's nodes with their constants.
        return [self.dtype, repr(self.x_scale), self.x_zero, repr(self.y_scale), self.y_zero]
