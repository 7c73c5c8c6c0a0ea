"""What optimize() returns: the fused model, the report, and where the model and its library were written."""

from __future__ import annotations

from dataclasses import dataclass

import onnx


@dataclass
class Result:
    model: onnx.ModelProto
    report: dict
    output: str | None = None
    library: str | None = None
