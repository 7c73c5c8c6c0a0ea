"""AFUSION with a depthwise second convolution (codegen/glue/afusion_exec.c): MobileNetV2's 1x1 expand -> 3x3
depthwise, whose intermediate (six times the block's channels) is the widest tensor of the network. The depthwise
convolution reads the scratch band in place, one channel vector at a time, its padding as the band's zero rows and
columns. Checked against onnxruntime with the library and through the function fallback: strides, dilations, pads,
uneven and one-row bands, batch 8, a SIMO group with a dense and a depthwise reader, and on MobileNetV2's blocks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from afusion_harness import afusion_nodes, optimize_afusion  # noqa: E402
from test_layout import Chain, check_answers, needs_vectors  # noqa: E402

pytestmark = needs_vectors


def _clip6(ch, x, out):
    """ReLU6 as MobileNetV2 exports it: Clip with its bounds as initializers."""
    if "lo6" not in {t.name for t in ch.inits}:
        ch.inits += [onnx.numpy_helper.from_array(np.float32(0.0), "lo6"),
                     onnx.numpy_helper.from_array(np.float32(6.0), "hi6")]
    ch.nodes.append(onnx.helper.make_node("Clip", [x, "lo6", "hi6"], [out], name=f"{out}_clip"))
    ch.c[out] = ch.c[x]
    return out


def test_expand_then_depthwise_is_one_kernel(tmp_path):
    """1x1 expand 16 -> 96 with ReLU6, then depthwise 3x3 with ReLU6: one AFUSION node, the right answers."""
    ch = Chain(16, 28, 28)
    e = _clip6(ch, ch.conv("x", "e", 96, k=1, p=0, act=None), "e6")
    d = _clip6(ch, ch.conv(e, "d", 96, k=3, p=1, group=96, act=None), "d6")
    model = ch.model([d])
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    assert len(afusion_nodes(res)) == 1, (res.report["regions"], res.report["afusion"])
    check_answers(res, model, ch.feeds)


def test_stride_two_depthwise_inside_a_blocked_chain(tmp_path, monkeypatch):
    """conv -> [1x1 -> depthwise 3x3 /2] -> 1x1 at batch 2, with one-row bands: the pair reads and writes the
    blocked layout of its neighbours, and every band recomputes its halo rows."""
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", "1")
    ch = Chain(8, 21, 19, batch=2)
    a = ch.conv("x", "a", 24, k=3)
    e = ch.conv(a, "e", 40, k=1, p=0)
    d = ch.conv(e, "d", 40, k=3, s=2, p=1, group=40)
    out = ch.conv(d, "o", 16, k=1, p=0, act=None)
    model = ch.model([out])
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    fused = afusion_nodes(res)
    assert fused and any(len(n.output) == 1 for n in fused), res.report["regions"]
    pairs = res.report["afusion"]["pairs"]
    assert any(p["nodes"][0] == "e" or "e" in p["nodes"][0] for p in pairs), pairs
    check_answers(res, model, ch.feeds)


def test_simo_with_a_dense_and_a_depthwise_reader(tmp_path):
    """One 1x1 producer read by a 1x1 and a depthwise 3x3 (same output size): one SIMO kernel."""
    ch = Chain(12, 15, 17)
    m = ch.conv("x", "m", 32, k=1, p=0)
    a = ch.conv(m, "a", 24, k=1, p=0)
    b = ch.conv(m, "b", 32, k=3, p=1, group=32, act="Sigmoid")
    model = ch.model([a, b])
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    nodes = afusion_nodes(res)
    assert len(nodes) == 1 and len(nodes[0].output) == 2, res.report["regions"]
    check_answers(res, model, ch.feeds)


@st.composite
def expand_depthwise(draw):
    c_in = draw(st.integers(1, 24))
    c_mid = draw(st.integers(1, 72))
    k1 = draw(st.sampled_from([1, 3]))
    p1 = draw(st.integers(0, k1 // 2))
    k2 = draw(st.sampled_from([3, 5]))
    s2, d2 = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    p2 = draw(st.integers(0, (k2 - 1) * d2 // 2 + 1))
    h, w = draw(st.integers(1, 20)), draw(st.integers(1, 26))
    batch = draw(st.sampled_from([1, 2, 8]))
    band = draw(st.sampled_from(["", "1", "2", "5"]))
    return c_in, c_mid, k1, p1, k2, s2, d2, p2, h, w, batch, band


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expand_depthwise())
def test_expand_depthwise_hypothesis(tmp_path_factory, monkeypatch, chain):
    c_in, c_mid, k1, p1, k2, s2, d2, p2, h, w, batch, band = chain
    oh1, ow1 = h + 2 * p1 - k1 + 1, w + 2 * p1 - k1 + 1
    assume(oh1 >= 1 and ow1 >= 1)
    assume(oh1 + 2 * p2 >= (k2 - 1) * d2 + 1 and ow1 + 2 * p2 >= (k2 - 1) * d2 + 1)
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", band) if band else monkeypatch.delenv(
        "ONNXOPT_AFUSION_BAND_ROWS", raising=False)
    ch = Chain(c_in, h, w, batch=batch, seed=c_mid * 5 + w)
    a = ch.conv("x", "a", c_mid, k=k1, p=p1)
    b = ch.conv(a, "b", c_mid, k=k2, s=s2, p=p2, d=d2, group=c_mid, act="Sigmoid")
    model = ch.model([b])
    res = optimize_afusion(model, tmp_path_factory.mktemp("dw2") / "fused.onnx")
    assert len(afusion_nodes(res)) == 1, (res.report["regions"], res.report["rejected"], res.report.get("afusion"))
    check_answers(res, model, ch.feeds)


@pytest.mark.parametrize("blocks", [2])
def test_mobilenetv2_expand_depthwise_pairs_are_legal(tmp_path, blocks):
    """On MobileNetV2 the expand -> depthwise edges are no longer refused for the depthwise reader (the only
    refusals left on them are other rules: a residual read twice, say)."""
    import onnxopt
    from onnxopt.models import build_model, random_inputs

    model = build_model("mobilenetv2")
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), plan="afusion", measure=False)
    refused = res.report["afusion"]["refused"]
    assert not any("grouped" in r["reason"] for r in refused), refused
    legal_dw = [p for p in res.report["afusion"]["pairs"] if "conv.0" in p["nodes"][0] and "conv.1" in
                " ".join(p["nodes"][1:])]
    assert len(legal_dw) >= blocks, res.report["afusion"]["pairs"]
    check_answers(res, model, random_inputs(model), rtol=1e-3, atol=1e-3)
