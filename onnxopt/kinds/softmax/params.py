"""The softmax kind's parameters: which function, and from which axis on a row runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SoftmaxParams:
    op: str  # "softmax" or "log_softmax"
    axis: int  # rows are the dims from `axis` on, flattened (opset 13's last axis, or opset 1-12's coercion to 2-D)
    dtype: str = "float32"

    def key(self) -> list:
        return [self.op, self.axis, self.dtype]
