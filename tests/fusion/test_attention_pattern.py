"""Attention chains found in the forms exporters write (onnxopt/fusion/attention.py). Each record is checked by
recomputing the model's output from it in numpy: the tensors it names, its scale and its mask must give what
onnxruntime gives for the whole graph."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from attention_models import attention_model, feeds_for
from onnx import TensorProto, helper, numpy_helper

from onnxopt.fusion.attention import find_attention

F = TensorProto.FLOAT


def _values(model, feeds, names):
    """The graph's own values of `names` (run with them as outputs)."""
    m = model.__class__()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in m.graph.output], sess.run(None, feeds)))


def from_record(c, vals):
    """Attention computed from what the record says the kernel reads."""
    q, k, v = vals[c.q], vals[c.k], vals[c.v]
    kt = k if c.k_transposed else np.swapaxes(k, -1, -2)
    s = (q.astype(np.float64) @ kt) * c.scale
    if c.mask_kind == "add":
        s = s + vals[c.mask]
    elif c.mask_kind == "select":
        s = np.where(vals[c.mask], s, c.fill)
    elif c.mask_kind == "fill":
        s = np.where(vals[c.mask], c.fill, s)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(-1, keepdims=True)
    if c.nan_guard:
        p = np.nan_to_num(p, nan=0.0)
    return p @ v


def check(model, feeds):
    chains = find_attention(model)
    assert len(chains) == 1
    c = chains[0]
    names = [c.q, c.k, c.v, c.output] + ([c.mask] if c.mask else [])
    vals = {**feeds, **_values(model, feeds, [n for n in names if n not in feeds])}
    np.testing.assert_allclose(from_record(c, vals), vals[c.output], rtol=1e-4, atol=1e-5)
    # The chain's nodes are exactly what lies between its inputs and its output.
    ops = sorted(n.op_type for n in c.nodes)
    assert "Softmax" in ops and ops.count("MatMul") + ops.count("FusedMatMul") == 2
    return c


@settings(max_examples=30, deadline=None)
@given(form=st.sampled_from(["sdpa", "bert", "fused", "unscaled"]),
       mask=st.sampled_from(["none", "add", "causal", "select", "fill"]), guard=st.booleans(),
       b=st.integers(1, 3), h=st.integers(1, 4), m=st.integers(1, 24), lq=st.integers(1, 24),
       d=st.sampled_from([8, 32, 64]))
def test_every_form_is_found_and_its_record_reproduces_the_output(form, mask, guard, b, h, m, lq, d):
    if mask == "causal":
        lq = max(lq, m)  # every query row keeps at least one key
    model = attention_model(form, b, h, m, lq, d, mask, guard)
    c = check(model, feeds_for(model))
    assert c.nan_guard == guard
    assert c.mask_kind == {"none": "none", "add": "add", "causal": "add", "select": "select", "fill": "fill"}[mask]
    want_scale = 1.0 if form == "unscaled" else 1 / np.sqrt(d)
    assert c.scale == pytest.approx(want_scale, rel=1e-6)


def test_the_chain_owns_a_transpose_of_k_and_reads_k_itself():
    c = check(attention_model("bert", 1, 2, 5, 7, 8, "add", False), feeds_for(attention_model("bert", 1, 2, 5, 7, 8,
                                                                                               "add", False)))
    assert c.k == "k" and not c.k_transposed and "Transpose" in [n.op_type for n in c.nodes]
    c = find_attention(attention_model("sdpa", 1, 2, 5, 7, 8, "add", False))[0]
    assert c.k == "kt2" and c.k_transposed  # K^T made elsewhere: read as it is


def test_opset_11_softmax_over_the_last_axis_by_number():
    model = attention_model("bert", 1, 2, 4, 6, 8, "none", False, opset=11)
    assert find_attention(model) == []  # axis 3 says nothing without the rank...
    rejected = []
    find_attention(model, rejected=rejected)
    assert "not the last one" in rejected[0]["reason"]
    assert len(find_attention(model, ranks={"scores": 4})) == 1  # ...and is the last axis of a 4-D tensor


def _refused(model):
    rejected = []
    assert find_attention(model, rejected=rejected) == []
    return rejected[0]["reason"]


def test_probabilities_read_elsewhere_are_refused():
    model = attention_model("bert", 1, 2, 4, 6, 8, "add", True)
    model.graph.output.append(helper.make_tensor_value_info("probs", F, None))  # output_attentions=True
    assert "probabilities are read outside the chain" in _refused(model)
    model = attention_model("bert", 1, 2, 4, 6, 8, "add", False)
    model.graph.node.append(helper.make_node("Identity", ["probs"], ["p2"]))
    model.graph.output.append(helper.make_tensor_value_info("p2", F, None))
    assert "probabilities are read outside the chain" in _refused(model)


def test_a_softmax_that_is_not_attention_is_refused_with_its_reason():
    x = helper.make_tensor_value_info("x", F, [2, 8])
    y = helper.make_tensor_value_info("y", F, [2, 8])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["p"], axis=-1),
         helper.make_node("Identity", ["p"], ["y"])], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    assert "do not feed a MatMul with the values" in _refused(model)
    model.graph.node[2].CopyFrom(helper.make_node("MatMul", ["p", "w"], ["y"]))
    model.graph.initializer.append(numpy_helper.from_array(np.ones((8, 8), np.float32), "w"))
    assert "not a MatMul of queries and keys (it is Relu)" in _refused(model)


def test_a_runtime_scale_between_the_scores_and_the_softmax_is_refused():
    model = attention_model("unscaled", 1, 1, 3, 3, 8, "none", False)
    model.graph.input.append(helper.make_tensor_value_info("t", F, []))
    mm = next(n for n in model.graph.node if n.op_type == "MatMul")
    mm.output[0] = "raw"
    model.graph.node.insert(list(model.graph.node).index(mm) + 1, helper.make_node("Mul", ["raw", "t"], ["scores"]))
    feeds = {**feeds_for(attention_model("unscaled", 1, 1, 3, 3, 8, "none", False)), "t": np.array(0.7, np.float32)}
    rejected = []
    assert find_attention(model, rejected=rejected) == []
    assert "not a MatMul of queries and keys (it is Mul)" in rejected[0]["reason"]
    assert ort.InferenceSession(model.SerializeToString()).run(None, feeds)  # the model itself is fine
