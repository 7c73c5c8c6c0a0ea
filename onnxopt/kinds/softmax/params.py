"""The softmax kind's parameters: which function, and from which axis on a row runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from onnxopt.fusion.params import KindParams


@dataclass(frozen=True)
class SoftmaxParams(KindParams):
    family: ClassVar[str] = "softmax"
    op: str  # "softmax" or "log_softmax"
    axis: int  # rows are the dims from `axis` on, flattened (opset 13's last axis, or opset 1-12's coercion to 2-D)
    dtype: str = "float32"
    lanes: int = 0  # the schedule (schedule.py): float32 lanes of the row loop's vectors; 0, the target's
    columns: bool = False  # opset 13+ reducing an axis that is not the last: the dims after it are columns

    def key(self) -> list:
        return [self.op, self.axis, self.dtype] + ([self.lanes] if self.lanes else []) + (["columns"] if self.columns
                                                                                           else [])
