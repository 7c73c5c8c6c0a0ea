"""A classifier after a global pool rewritten as a 1x1 convolution and a Flatten (onnxopt/graph/classifier_conv.py):
the rewritten graph gives onnxruntime's answers of the original, hypothesis-drawn shapes and Gemm forms, the
classifiers that must be left alone, and the whole optimizer keeping the classifier in the network's sequence."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxopt.emit.sequence import expand_sequences
from onnxopt.graph.classifier_conv import classifiers_as_convs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import Chain, check_answers, needs_vectors, optimize_blocked

F32 = TensorProto.FLOAT
n = helper.make_node


def _classifier(c, m, batch=1, trans_b=1, bias="1d", pool="GlobalAveragePool", gemm_attrs=None, h=3, w=4,
                extra_nodes=(), outputs=("y",)):
    rng = np.random.default_rng(c * 31 + m)
    wmat = rng.standard_normal((m, c) if trans_b else (c, m)).astype(np.float32)
    inits = [numpy_helper.from_array(wmat, "W")]
    ins = ["flat", "W"]
    if bias is not None:
        bv = rng.standard_normal(m).astype(np.float32)
        inits.append(numpy_helper.from_array(bv if bias == "1d" else bv.reshape(1, m), "B"))
        ins.append("B")
    nodes = [n(pool, ["x"], ["p"], name="pool"), n("Flatten", ["p"], ["flat"], name="flatten", axis=1),
             n("Gemm", ins, ["y"], name="fc", transB=trans_b, **(gemm_attrs or {}))] + list(extra_nodes)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [batch, c, h, w])],
                          [helper.make_tensor_value_info(o, F32, None) for o in outputs], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _shapes(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(inferred.graph.input) + list(inferred.graph.value_info)}


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _rewrite_and_compare(model):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = _run(model, x)
    count = classifiers_as_convs(model, _shapes(model))
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    got = _run(model, x)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return count


@settings(max_examples=25, deadline=None)
@given(c=st.integers(1, 70), m=st.integers(1, 40), batch=st.integers(1, 3), trans_b=st.integers(0, 1),
       bias=st.sampled_from(["1d", "2d", None]), pool=st.sampled_from(["GlobalAveragePool", "GlobalMaxPool"]))
def test_rewritten_classifier_gives_the_original_answers(c, m, batch, trans_b, bias, pool):
    model = _classifier(c, m, batch, trans_b, bias, pool)
    assert _rewrite_and_compare(model) == 1
    ops = [nd.op_type for nd in model.graph.node]
    assert ops == [pool, "Conv", "Flatten"]
    conv = model.graph.node[1]
    assert conv.input[0] == "p" and conv.name == "fc" and model.graph.node[2].output[0] == "y"
    inits = {t.name: t for t in model.graph.initializer}
    assert list(inits[conv.input[1]].dims) == [m, c, 1, 1]
    assert "W" not in inits and "B" not in inits  # the Gemm's constants went with it


@pytest.mark.parametrize("why, kwargs", [
    ("alpha scales the product", {"gemm_attrs": {"alpha": 0.5}}),
    ("beta scales the bias", {"gemm_attrs": {"beta": 2.0}}),
    ("A transposed", {"gemm_attrs": {"transA": 1}}),
    ("the pool leaves an image", {"pool": "Relu"}),
])
def test_classifiers_left_alone(why, kwargs):
    c, m = 6, 6  # square, so that transA still makes a valid model
    model = _classifier(c, m, h=1, w=1, **kwargs) if kwargs.get("pool") == "Relu" else _classifier(c, m, **kwargs)
    before = model.SerializeToString()
    assert classifiers_as_convs(model, _shapes(model)) == 0, why
    assert model.SerializeToString() == before


def test_flatten_read_elsewhere_stays():
    extra = [n("Relu", ["flat"], ["r"], name="relu")]
    model = _classifier(12, 7, extra_nodes=extra, outputs=("y", "r"))
    assert _rewrite_and_compare(model) == 1
    assert [nd.op_type for nd in model.graph.node] == ["GlobalAveragePool", "Flatten", "Conv", "Flatten", "Relu"]


def test_weights_read_elsewhere_stay():
    """Two heads share the classifier's weights: both are rewritten, and W stays for nothing else only when unread."""
    model = _classifier(9, 5)
    g = model.graph
    g.node.append(n("Gemm", ["flat", "W"], ["y2"], name="fc2", transB=1))
    g.output.append(helper.make_tensor_value_info("y2", F32, None))
    assert _rewrite_and_compare(model) == 2
    assert "W" not in {t.name for t in g.initializer}
    assert [nd.op_type for nd in g.node] == ["GlobalAveragePool", "Conv", "Flatten", "Conv", "Flatten"]


def test_initializer_listed_as_an_input_is_kept():
    model = _classifier(9, 5)
    model.graph.input.append(helper.make_tensor_value_info("W", F32, [5, 9]))
    assert _rewrite_and_compare(model) == 1
    assert "W" in {t.name for t in model.graph.initializer}


@needs_vectors
def test_classifier_joins_the_blocked_sequence(tmp_path):
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm: the pool and the classifier (a 1x1 convolution on
    vectors of output channels) run in the sequence after the convolution, and only the Flatten is onnxruntime's.
    Checked with the library and through the function fallbacks."""
    ch = Chain(8, 7, 7, batch=1)
    a = ch.conv("x", "a", 40)
    ch.nodes.append(n("GlobalAveragePool", [a], ["gap"], name="gap"))
    ch.nodes.append(n("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    rng = np.random.default_rng(3)
    ch.inits += [numpy_helper.from_array(rng.standard_normal((37, 40)).astype(np.float32), "fc_w"),
                 numpy_helper.from_array(rng.standard_normal(37).astype(np.float32), "fc_b")]
    ch.nodes.append(n("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1))
    model = ch.model(["logits"])
    res = optimize_blocked(model, tmp_path)
    assert res.report["rewrites"]["classifiers_as_convs"] == 1
    assert [nd.op_type for nd in res.model.graph.node if nd.domain != "onnxopt"] == ["Flatten"]
    entries = {r["nodes"][0]: r for r in res.report["regions"]}
    assert entries["gap"]["layout"] == "blocked->blocked" and entries["fc"]["layout"] == "blocked->nchw"
    producer = {o: nd for nd in expand_sequences(res.model).graph.node for o in nd.output}
    assert producer["gap"].domain == "onnxopt"
    check_answers(res, model, ch.feeds)
