"""AFUSION SIMO kernels (onnxopt/fusion/afusion/simo.py, codegen/glue/afusion_exec.c): a convolution and the two or
more convolutions reading its output in one kernel, the intermediate kept in one scratch band, the union of what
the readers need. Checked against onnxruntime with the library and through the function fallback, on OptiFX's SIMO
sub-graphs (G5: a SqueezeNet fire module, G7: UNet) and on drawn groups (kernel sizes, paddings, dilations and
strides that differ between the readers, depthwise first convolutions, uneven and one-row bands, batch 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxopt
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onnxopt.fusion.afusion.simo import simo_reason
from onnxopt.models import random_inputs
from onnxopt.models.conv_shapes import optifx_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from afusion_harness import afusion_nodes, optimize_afusion  # noqa: E402
from test_layout import Chain, check_answers, needs_vectors  # noqa: E402

pytestmark = needs_vectors


@pytest.mark.parametrize("name", ["G5", "G7"])
def test_optifx_simo_subgraphs_fuse_into_one_kernel(tmp_path, name):
    """G5 (squeeze 1x1 -> expand 1x1 and 3x3) and G7 (3x3 /2 -> 1x1 and 3x3) become one AFUSION node with the two
    expand outputs, which the Concat joins; the answers are onnxruntime's with the library and without it."""
    model = optifx_model(name)
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    nodes = afusion_nodes(res)
    assert len(nodes) == 1 and len(nodes[0].output) == 2, res.report["regions"]
    pair = res.report["afusion"]["pairs"][0]
    assert pair["pattern"] == "SIMO" and len(pair["nodes"]) == 6  # three convolutions, three Relus
    check_answers(res, model, random_inputs(model))


def test_one_row_bands_and_batch(tmp_path, monkeypatch):
    """One-row bands: each band recomputes the 3x3 reader's halo rows, which the 1x1 reader does not need."""
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", "1")
    model = optifx_model("G5", batch=2)
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    assert res.report["afusion"]["pairs"][0]["band_rows"] == 1
    check_answers(res, model, random_inputs(model))


def test_three_readers_inside_a_blocked_chain(tmp_path):
    """conv -> {1x1, 3x3, 5x5 dilated} -> Concat -> conv: three readers with different paddings, in the blocked
    layout of their neighbours."""
    ch = Chain(8, 15, 13, batch=1)
    a = ch.conv("x", "a", 24, k=3, s=1)
    b1 = ch.conv(a, "b1", 16, k=1, p=0)
    b2 = ch.conv(a, "b2", 16, k=3, p=1)
    b3 = ch.conv(a, "b3", 32, k=3, p=2, d=2)
    ch.nodes.append(onnx_concat([b1, b2, b3], "cat"))
    ch.c["cat"] = 64
    d = ch.conv("cat", "d", 8, k=1, p=0)
    model = ch.model([d])
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    nodes = afusion_nodes(res)
    assert len(nodes) == 1 and len(nodes[0].output) == 3, (res.report["regions"], res.report["afusion"])
    check_answers(res, model, ch.feeds)


def test_readers_with_different_strides_are_refused(tmp_path):
    ch = Chain(8, 12, 12)
    a = ch.conv("x", "a", 16, k=1, p=0)
    b1 = ch.conv(a, "b1", 16, k=1, p=0, s=2)
    b2 = ch.conv(a, "b2", 16, k=3, p=1, s=1)
    model = ch.model([b1, b2])
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False)
    refused = res.report["afusion"]["refused"]
    assert any("different strides" in r["reason"] for r in refused), refused


def test_reason_needs_two_readers():
    assert "2 to 4" in simo_reason(None, [None], 16)


def onnx_concat(inputs, out):
    from onnx import helper

    return helper.make_node("Concat", inputs, [out], axis=1, name=out)


@st.composite
def simo_groups(draw):
    depthwise = draw(st.booleans())
    c_in = draw(st.integers(1, 24))
    c_mid = c_in if depthwise else draw(st.integers(1, 24))
    k1 = draw(st.sampled_from([1, 3]))
    s1 = draw(st.integers(1, 2))
    p1 = draw(st.integers(0, (k1 - 1) // 2 + 1))
    stride = draw(st.integers(1, 2))
    readers = []
    for _ in range(draw(st.integers(2, 3))):
        k = draw(st.sampled_from([1, 3, 5]))
        d = draw(st.integers(1, 2))
        readers.append((k, d, (k - 1) * d // 2, draw(st.integers(1, 20))))  # "same" padding: one output size
    h, w = draw(st.integers(2, 20), ), draw(st.integers(2, 24))
    batch = draw(st.sampled_from([1, 2]))
    band = draw(st.sampled_from(["", "1", "2", "5"]))
    return depthwise, c_in, c_mid, k1, s1, p1, stride, readers, h, w, batch, band


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(simo_groups())
def test_simo_group_hypothesis(tmp_path_factory, monkeypatch, group):
    depthwise, c_in, c_mid, k1, s1, p1, stride, readers, h, w, batch, band = group
    oh1 = (h + 2 * p1 - k1) // s1 + 1
    ow1 = (w + 2 * p1 - k1) // s1 + 1
    assume(oh1 >= 1 and ow1 >= 1)
    assume(all(oh1 + 2 * p >= (k - 1) * d + 1 and ow1 + 2 * p >= (k - 1) * d + 1 for k, d, p, _ in readers))
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", band) if band else monkeypatch.delenv(
        "ONNXOPT_AFUSION_BAND_ROWS", raising=False)
    ch = Chain(c_in, h, w, batch=batch, seed=c_in * 5 + h)
    a = ch.conv("x", "a", c_mid, k=k1, s=s1, p=p1, group=c_in if depthwise else 1)
    outs = [ch.conv(a, f"b{i}", oc, k=k, s=stride, p=p, d=d, act="Sigmoid") for i, (k, d, p, oc) in
            enumerate(readers)]
    model = ch.model(outs)
    res = optimize_afusion(model, tmp_path_factory.mktemp("simo") / "fused.onnx")
    nodes = afusion_nodes(res)
    assert len(nodes) == 1 and len(nodes[0].output) == len(readers), (res.report["regions"],
                                                                        res.report.get("afusion"))
    check_answers(res, model, ch.feeds)
