"""AFUSION MISO kernels (onnxopt/fusion/afusion/miso.py, codegen/glue/afusion_exec.c): two convolutions on their own
inputs whose outputs meet in the second's epilogue, by bands of output rows, the first's rows written into the output
and read back there in place. Checked against onnxruntime with the library and through the function fallback, on
OptiFX's G6, on a ResNet downsample block inside a blocked chain, and on drawn pairs (strides, paddings, depthwise
parts, NCHW and blocked inputs, uneven and one-row bands, batch 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxopt
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from onnxopt.models import random_inputs
from onnxopt.models.conv_shapes import optifx_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from afusion_harness import afusion_nodes, optimize_afusion  # noqa: E402
from test_layout import Chain, check_answers, needs_vectors  # noqa: E402

pytestmark = needs_vectors


def miso_pairs(res):
    return [p for p in res.report["afusion"]["pairs"] if p["pattern"] == "MISO"]


def test_optifx_g6_fuses_into_one_kernel(tmp_path):
    """G6: two 1x1 convolutions on two inputs into Add -> Relu: one node reading both inputs."""
    model = optifx_model("G6")
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    nodes = afusion_nodes(res)
    assert len(nodes) == 1, (res.report["regions"], res.report["afusion"])
    assert {"input", "input2"} <= set(nodes[0].input)
    assert len(miso_pairs(res)) == 1
    check_answers(res, model, random_inputs(model))


@pytest.mark.parametrize("band", ["2"])
def test_resnet_downsample_block_in_a_blocked_chain(tmp_path, monkeypatch, band):
    """x -> 1x1 -> 3x3 /2 -> 1x1 (+ shortcut 1x1 /2 of x) -> Relu -> conv: the shortcut fuses with the main path's
    last 1x1 (MISO) or the 3x3 with it (SISO), whichever comes first; each fused kernel is right."""
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", band)
    ch = Chain(16, 14, 13, batch=2)
    x = ch.conv("x", "x0", 32, k=3)
    a = ch.conv(x, "a", 16, k=1, p=0)
    b = ch.conv(a, "b", 16, k=3, s=2)
    c = ch.conv(b, "c", 48, k=1, p=0, act=None)
    sc = ch.conv(x, "sc", 48, k=1, p=0, s=2, act=None)
    ch.add(c, sc, "y")
    d = ch.conv("y", "d", 8, k=3)
    model = ch.model([d])
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    assert afusion_nodes(res), (res.report["regions"], res.report["afusion"])
    check_answers(res, model, ch.feeds)


def test_intermediate_read_elsewhere_is_refused(tmp_path):
    """Both convolutions' outputs are graph outputs too: whichever the Add is fused into, the other's output would
    have to be written."""
    ch = Chain(8, 10, 10)
    a = ch.conv("x", "a", 16, k=1, p=0, act=None)
    b = ch.conv("x", "b", 16, k=3, act=None)
    ch.add(b, a, "y")
    model = ch.model(["y", a, b])
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False)
    assert any("MISO" in r["reason"] and "graph output" in r["reason"] for r in res.report["afusion"]["refused"])


@st.composite
def miso_pairs_drawn(draw):
    c_in = draw(st.integers(1, 24))
    c_out = draw(st.integers(1, 40))
    parts = []
    for _ in range(2):
        depthwise = draw(st.booleans()) and c_out == c_in
        k = draw(st.sampled_from([1, 3, 5]))
        s = draw(st.integers(1, 2))
        parts.append((depthwise, k, s, (k - 1) // 2))
    h, w = draw(st.integers(1, 20)), draw(st.integers(1, 24))
    batch = draw(st.sampled_from([1, 2]))
    band = draw(st.sampled_from(["", "1", "2", "5"]))
    blocked_in = draw(st.booleans())
    return c_in, c_out, parts, h, w, batch, band, blocked_in


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(miso_pairs_drawn())
def test_miso_pair_hypothesis(tmp_path_factory, monkeypatch, drawn):
    c_in, c_out, parts, h, w, batch, band, blocked_in = drawn
    (_, k1, s1, p1), (_, k2, s2, p2) = parts
    assume(s1 == s2)  # one output size ("same" padding)
    assume(h + 2 * p1 >= k1 and w + 2 * p1 >= k1 and h + 2 * p2 >= k2 and w + 2 * p2 >= k2)
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", band) if band else monkeypatch.delenv(
        "ONNXOPT_AFUSION_BAND_ROWS", raising=False)
    ch = Chain(c_in, h, w, batch=batch, seed=c_in * 3 + w)
    src = ch.conv("x", "x0", c_in, k=3) if blocked_in else "x"  # a conv before: the inputs are blocked
    outs = []
    for i, (depthwise, k, s, p) in enumerate(parts):
        oc = c_in if depthwise else c_out
        outs.append(ch.conv(src, f"m{i}", oc, k=k, s=s, p=p, group=c_in if depthwise else 1, act=None))
    assume(ch.c[outs[0]] == ch.c[outs[1]])
    ch.nodes.append(helper.make_node("Add", outs, ["sum"], name="sum"))
    ch.nodes.append(helper.make_node("Sigmoid", ["sum"], ["y"], name="y"))
    ch.c["y"] = ch.c[outs[0]]
    model = ch.model(["y"])
    res = optimize_afusion(model, tmp_path_factory.mktemp("miso") / "fused.onnx")
    assert len(miso_pairs(res)) == 1, (res.report["regions"], res.report.get("afusion"))
    check_answers(res, model, ch.feeds)
