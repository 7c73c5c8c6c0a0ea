"""What the AFUSION kernel tests share: the optimizer run on the afusion plan alone, and its fused nodes."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxopt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_layout import fused_nodes  # noqa: E402


def optimize_afusion(model, path):
    return onnxopt.optimize(model, str(path), plan="afusion", measure=False)


def afusion_nodes(result):
    return [nd for nd in fused_nodes(result.model) if nd.op_type.startswith("afusion_")]
