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

    def key(self) -> list:
        return [repr(self.epsilon), self.residual, self.sum_output, self.has_bias]
