"""Deep small layers split by groups of output channels first (compute_exec.c, cb_weights_major).

When a blocked convolution's weights outweigh its input and output, its tasks go by group of output vectors first,
so that the tasks sharing a group's weights run together; otherwise by rows first. Which one runs is not observable
from outside, so ONNXOPT_WMAJOR forces each on the same shapes, and each must give onnxruntime's answer: a stride-2
3x3 and 1x1 convolutions at 7x7 with hundreds of channels (ResNet-50's last stage, smaller), batch 1 and 2, channel
counts that leave a part-filled last group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import (
    Chain,
    check_answers,
    fused_nodes,
    needs_vectors,
    optimize_blocked,
)


@needs_vectors
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("forced", [None, "0", "1"])
def test_weight_heavy_layers_give_the_same_answer_either_way(tmp_path, monkeypatch, batch, forced):
    if forced is None:
        monkeypatch.delenv("ONNXOPT_WMAJOR", raising=False)
    else:
        monkeypatch.setenv("ONNXOPT_WMAJOR", forced)
    ch = Chain(3, 14, 14, batch=batch, seed=3)
    a = ch.conv("x", "a", 96, k=3, s=1, p=1)
    b = ch.conv(a, "b", 200, k=3, s=2, p=1)  # 7x7 out: 0.7 MB of weights for 0.1 MB in and out
    c = ch.conv(b, "c", 328, k=1, p=0)
    d = ch.conv(c, "d", 136, k=1, p=0, act="Sigmoid")
    ch.conv(d, "e", 5, k=1, p=0, act=None)
    model = ch.model(["e"])
    res = optimize_blocked(model, tmp_path)
    assert len(fused_nodes(res.model)) == 5
    check_answers(res, model, ch.feeds)
