"""AFUSION conv -> pool kernels (onnxopt/fusion/afusion/conv_pool.py, codegen/glue/afusion_exec.c af_pool_compute):
a convolution and the MaxPool or AveragePool reading its output in one kernel, the conv rows a band of pool rows
needs kept in a scratch band. Checked against onnxruntime with the library and through the function fallback, on
the stems of ResNet and SqueezeNet, UNet's 2x2 pool and drawn pools (kernels, strides, dilations, pads, ceil_mode,
count_include_pad, one-row bands, batch 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxopt
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from onnxopt.fusion.afusion.conv_pool import pool_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from afusion_harness import afusion_nodes, optimize_afusion
from test_layout import Chain, check_answers, needs_vectors

pytestmark = needs_vectors


def stem(pool="MaxPool", k=3, s=2, p=1, d=1, ceil=0, include_pad=0, batch=1, hw=32, oc=32, conv_k=7, conv_s=2,
         act="Relu", depthwise_first=False):
    """conv -> pool -> conv: the pool sits in a blocked chain, as in a network's stem."""
    c = Chain(3, hw, hw, batch=batch)
    if depthwise_first:  # after a dense conv, so that its input is blocked too
        c.conv("x", "c0", 16, k=3, s=1, p=1)
        c.conv("c0", "c1", 16, k=3, s=1, p=1, group=16, act=act)
        oc = 16
    else:
        c.conv("x", "c1", oc, k=conv_k, s=conv_s, p=conv_k // 2, act=act)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "ceil_mode": ceil}
    if pool == "AveragePool":
        attrs["count_include_pad"] = include_pad
    elif d != 1:
        attrs["dilations"] = [d, d]
    c.nodes.append(helper.make_node(pool, ["c1"], ["p1"], name="pool1", **attrs))
    c.c["p1"] = oc
    c.conv("p1", "c2", 16, k=3)
    if depthwise_first:
        # c0 -> c1 is a legal pair too (a depthwise second convolution) and comes first in graph order: a second
        # reader of c0 (a blocked one, so c0 stays blocked) keeps that pair out, and the pool pair is the one fused.
        c.conv("c0", "c3", 8, k=1, p=0)
        return c, c.model(["c2", "c3"])
    return c, c.model(["c2"])


def fused_pool_pairs(res):
    return [p for p in res.report["afusion"]["pairs"] if p["nodes"][-1] == "pool1"]


@pytest.fixture(autouse=True)
def every_pair(monkeypatch):
    monkeypatch.setenv("ONNXOPT_AFUSION_PAIRS", "all")


@pytest.mark.parametrize("name,kw", [
    ("resnet stem: 7x7 /2 conv, 3x3 /2 MaxPool pad 1", {}),
    ("squeezenet stem: 3x3 /2 MaxPool, ceil_mode", {"p": 0, "ceil": 1, "hw": 30}),
    ("unet: 2x2 /2 MaxPool", {"k": 2, "p": 0, "conv_k": 3, "conv_s": 1, "hw": 20}),
    ("inception: 3x3 /1 AveragePool pad 1, count_include_pad", {"pool": "AveragePool", "s": 1, "include_pad": 1}),
    ("3x3 /2 AveragePool without the padding, ceil_mode", {"pool": "AveragePool", "ceil": 1, "hw": 30}),
    ("negative conv outputs: MaxPool padding is -inf, not 0", {"act": None}),
])
def test_stems_fuse_into_one_kernel(tmp_path, name, kw):
    c, model = stem(**kw)
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    (pair,) = fused_pool_pairs(res)
    assert pair["pattern"] == "SISO"
    assert len(afusion_nodes(res)) == 1
    check_answers(res, model, c.feeds)


def test_one_row_bands_batch_and_uneven_channels(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", "1")
    c, model = stem(batch=2, oc=20, hw=27)
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    assert fused_pool_pairs(res)[0]["band_rows"] == 1
    check_answers(res, model, c.feeds)


def test_dilated_maxpool_after_a_depthwise_conv(tmp_path):
    c, model = stem(d=2, p=2, s=1, depthwise_first=True, hw=18)
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    assert fused_pool_pairs(res)
    check_answers(res, model, c.feeds)


def test_refusals_say_why():
    node = helper.make_node("AveragePool", ["a"], ["b"], kernel_shape=[3, 3], dilations=[2, 2])
    assert pool_params(node) == "a dilated AveragePool"
    node = helper.make_node("MaxPool", ["a"], ["b"], kernel_shape=[3, 3], auto_pad="SAME_UPPER")
    assert "auto_pad" in pool_params(node)
    node = helper.make_node("MaxPool", ["a"], ["b", "idx"], kernel_shape=[3, 3])
    assert "Indices" in pool_params(node)
    node = helper.make_node("MaxPool", ["a"], ["b"], kernel_shape=[3])
    assert "2-D" in pool_params(node)


def test_an_intermediate_read_elsewhere_is_refused(tmp_path):
    c, _ = stem()
    c.conv("c1", "c3", 16, k=1, p=0)  # another reader of the conv's output
    model = c.model(["c2", "c3"])
    res = optimize_afusion(model, tmp_path / "fused.onnx")
    assert not fused_pool_pairs(res)
    assert any("conv -> pool" in r["reason"] and "read outside" in r["reason"]
               for r in res.report["afusion"]["refused"]), res.report["afusion"]


def test_ceil_mode_disagreement_is_refused(tmp_path):
    """10 rows, a 1x1 window every 2 with ceil_mode: onnx counts 6 rows, onnxruntime 5 (its last window would start
    past the input). The pool does not join the blocked chain (fusion/blocked_passthrough.py compares the two
    sizes), so there is no conv -> pool pair; AFUSION's own rule (ceil_mode_reason) says the same."""
    from onnxopt.fusion.afusion.conv_pool import ceil_mode_reason, pool_params

    c, model = stem(k=1, s=2, p=0, ceil=1, hw=10, conv_k=1, conv_s=1)
    pool = next(n for n in model.graph.node if n.name == "pool1")
    assert "ceil_mode" in ceil_mode_reason(pool_params(pool), 10, 10)
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), plan="compute-blocked", measure=False)
    assert "pool1" not in res.report.get("blocked_passthrough", [])
    assert not any(n.domain == "onnxopt" and n.name.startswith("pool1") for n in res.model.graph.node)


@st.composite
def pools(draw):
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    k = draw(st.integers(1, 4))
    s = draw(st.integers(1, 3))
    p = draw(st.integers(0, k - 1))
    d = draw(st.integers(1, 2)) if op == "MaxPool" else 1
    return {"pool": op, "k": k, "s": s, "p": p, "d": d, "ceil": draw(st.integers(0, 1)),
            "include_pad": draw(st.integers(0, 1)), "batch": draw(st.sampled_from([1, 2])),
            "hw": draw(st.integers(9, 24)), "oc": draw(st.sampled_from([8, 13, 24])),
            "conv_k": draw(st.sampled_from([1, 3])), "conv_s": draw(st.integers(1, 2))}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pools(), st.sampled_from([None, "1", "3"]))
def test_drawn_pools_match_onnxruntime(tmp_path_factory, monkeypatch, kw, rows):
    out_h = (kw["hw"] + 2 * (kw["conv_k"] // 2) - kw["conv_k"]) // kw["conv_s"] + 1
    span = out_h + 2 * kw["p"] - (kw["k"] - 1) * kw["d"] - 1
    assume(span >= 0)  # the window fits the padded input
    # ceil_mode with a last window in the end padding is refused (test_ceil_mode_disagreement_is_refused)
    assume(not kw["ceil"] or (-(-span // kw["s"])) * kw["s"] < out_h + kw["p"])
    if rows:
        monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", rows)
    else:
        monkeypatch.delenv("ONNXOPT_AFUSION_BAND_ROWS", raising=False)
    c, model = stem(**kw)
    res = optimize_afusion(model, tmp_path_factory.mktemp("pool") / "fused.onnx")
    assert fused_pool_pairs(res), res.report["afusion"]
    check_answers(res, model, c.feeds)
