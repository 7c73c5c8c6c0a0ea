"""Padded blocked convolutions read their input in place; only tiles whose taps cross the border copy a zero-padded
window (codegen/glue/compute_exec.c, cb_window). The library picks windows or a full padded copy per convolution,
whichever copies less; ONNXOPT_CONV_BORDER=window|copy forces one way, so both are checked here on every shape."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import Chain, check_answers, fused_nodes, needs_vectors, optimize_blocked  # noqa: E402


@contextmanager
def border_mode(mode):
    old = os.environ.get("ONNXOPT_CONV_BORDER")
    if mode is None:
        os.environ.pop("ONNXOPT_CONV_BORDER", None)
    else:
        os.environ["ONNXOPT_CONV_BORDER"] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ONNXOPT_CONV_BORDER", None)
        else:
            os.environ["ONNXOPT_CONV_BORDER"] = old


@st.composite
def padded_convs(draw):
    """A kernel, its dilation, pads up to its reach (onnxruntime rejects larger ones), and an image at least as
    large as one kernel window after padding, twice (the second convolution keeps the size)."""
    k, d = draw(st.sampled_from([2, 3, 5, 7])), draw(st.integers(1, 2))
    span = (k - 1) * d + 1
    pads = [draw(st.integers(0, min(3, span - 1))) for _ in range(4)]
    s = draw(st.integers(1, 3))
    h = draw(st.integers(max(1, span - pads[0] - pads[2]), 14))
    w = draw(st.integers(max(1, span - pads[1] - pads[3]), 30))
    return k, d, pads, s, h, w


@needs_vectors
@pytest.mark.parametrize("mode", ["window", "copy"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c_in=st.integers(1, 20), c_mid=st.integers(1, 40), conv=padded_convs(), batch=st.sampled_from([1, 2]))
def test_border_windows_match_onnxruntime(tmp_path_factory, mode, c_in, c_mid, conv, batch):
    """An NCHW-input convolution (the network's first), then a blocked-input one, both padded and writing blocked
    tensors (a 1x1 convolution ends the chain): pads up to the kernel's reach, images narrower than a tile, windows
    that cross both borders at once."""
    k, d, pads, s, h, w = conv
    span = (k - 1) * d + 1
    oh, ow = (h + pads[0] + pads[2] - span) // s + 1, (w + pads[1] + pads[3] - span) // s + 1
    assume(oh + pads[0] + pads[2] >= span and ow + pads[1] + pads[3] >= span)
    ch = Chain(c_in, h, w, batch=batch, seed=c_mid + 7 * k)
    a = ch.conv("x", "a", c_mid, k=k, s=s, d=d, pads=pads, act="Relu")
    b = ch.conv(a, "b", 19, k=k, s=1, d=d, pads=pads, act="Sigmoid")
    ch.conv(b, "c", 5, k=1, p=0, act=None)
    model = ch.model(["c"])
    with border_mode(mode):
        res = optimize_blocked(model, tmp_path_factory.mktemp("border"))
        assert [r["layout"] for r in res.report["regions"]] == ["nchw->blocked", "blocked->blocked", "blocked->nchw"]
        check_answers(res, model, ch.feeds)


@needs_vectors
@pytest.mark.parametrize("mode", [None, "window", "copy"])
def test_wide_early_layers_and_deep_small_layers(tmp_path, mode):
    """Shapes where the library's own choice differs: wide early layers (few border tiles: windows) and a deep
    7x7 layer (every tile on a border: the full copy). Its choice is not observable from outside, so the forced
    modes run the same shapes."""
    ch = Chain(3, 24, 70, batch=2, seed=5)
    a = ch.conv("x", "a", 16, k=3, s=2, p=1, act="Sigmoid")
    b = ch.conv(a, "b", 32, k=3, s=1, p=1)
    c = ch.conv(b, "c", 64, k=5, s=2, pads=[2, 1, 1, 2])
    d = ch.conv(c, "d", 96, k=3, s=2, p=1)
    e = ch.conv(d, "e", 48, k=3, s=1, p=1, d=2, pads=[2, 2, 2, 2], act=None)
    ch.conv(e, "f", 8, k=1, p=0)
    model = ch.model(["f"])
    with border_mode(mode):
        res = optimize_blocked(model, tmp_path)
        assert len(fused_nodes(res.model)) == 6
        check_answers(res, model, ch.feeds)
