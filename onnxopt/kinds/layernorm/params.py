"""The layernorm kind's parameters: epsilon, and which of the optional parts the kernel has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from onnxopt.fusion.params import KindParams


@dataclass(frozen=True)
class LayerNormParams(KindParams):
    family: ClassVar[str] = "layernorm"
    epsilon: float
    residual: bool  # the row is x + r, the Add before the normalization (a transformer's residual connection)
    sum_output: bool  # x + r is read elsewhere too: the kernel writes it as a second output
    has_bias: bool  # LayerNormalization's B is given
    dtype: str = "float32"  # the rows' element type, from the graph
    lanes: int = 0  # the schedule (schedule.py): float32 lanes of the row loop's vectors; 0, the target's

    def key(self) -> list:
        key = [repr(self.epsilon), self.residual, self.sum_output, self.has_bias]
        key = key if self.dtype == "float32" else key + [self.dtype]  # float32's op types as before the field
        return key + ([self.lanes] if self.lanes else [])
