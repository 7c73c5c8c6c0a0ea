"""The layernorm kind (onnxopt/kinds/layernorm): which nodes it takes, and its kernel against onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kind_harness import fuse_kind
from onnx import TensorProto, helper, numpy_helper

from onnxopt.kinds import KINDS
from onnxopt.kinds.layernorm import KIND
from onnxopt.timing import make_session

F = TensorProto.FLOAT


def _model(shape, *, residual=True, sum_read=False, bias=True, axis=-1, eps=1e-5, residual_shape=None,
           mean_output=False, seed=0):
    rng = np.random.default_rng(seed)
    h = shape[-1] if isinstance(shape[-1], int) else 64
    inits = [numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "gamma")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "beta"))
    ins = [helper.make_tensor_value_info("x", F, shape)]
    nodes, x = [], "x"
    if residual:
        ins.append(helper.make_tensor_value_info("r", F, residual_shape or shape))
        nodes.append(helper.make_node("Add", ["x", "r"], ["s"], name="residual"))
        x = "s"
    outs = ["y", "mean"] if mean_output else ["y"]
    nodes.append(helper.make_node("LayerNormalization", [x, "gamma"] + (["beta"] if bias else []), outs, name="ln",
                                  axis=axis, epsilon=eps))
    graph_outs = [helper.make_tensor_value_info("y", F, None)]
    if sum_read:  # the sum feeds another op too: a pre-LN block's next residual
        nodes.append(helper.make_node("Relu", ["s"], ["z"], name="next"))
        graph_outs.append(helper.make_tensor_value_info("z", F, None))
    if mean_output:
        graph_outs.append(helper.make_tensor_value_info("mean", F, None))
    g = helper.make_graph(nodes, "g", ins, graph_outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _fuse(model, tmp_path):
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    return fused, lib, region


def _feeds(model, shape, seed=1):
    rng = np.random.default_rng(seed)
    names = [i.name for i in model.graph.input]
    return {n: (rng.standard_normal(shape) * 3 + 1).astype(np.float32) for n in names}


def _check(model, fused, lib, feeds):
    want = make_session(model, 1, optimization="none").run(None, feeds)
    got = make_session(fused, 2, library=lib).run(None, feeds)
    alone = make_session(fused, 1).run(None, feeds)  # the function fallback, without our library
    for w, g, a in zip(want, got, alone):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=2e-5)  # onnxruntime fuses the fallback its own way


def test_the_kind_is_registered():
    assert KIND in KINDS and KIND.name == "layernorm"


@pytest.mark.parametrize("shape", [[1, 128, 768], [2, 7, 77], [3, 5], [2, 3, 4, 33], [1, 1, 8], [4, 1]])
@pytest.mark.parametrize("residual,bias", [(True, True), (False, True), (True, False)])
def test_matches_onnxruntime(tmp_path, shape, residual, bias):
    model = _model(shape, residual=residual, bias=bias)
    fused, lib, region = _fuse(model, tmp_path)
    assert [n.op_type for n in region.nodes] == (["Add"] if residual else []) + ["LayerNormalization"]
    _check(model, fused, lib, _feeds(model, shape))


def test_the_sum_read_elsewhere_is_a_second_output(tmp_path):
    shape = [2, 9, 40]
    model = _model(shape, sum_read=True, eps=1e-12)
    fused, lib, region = _fuse(model, tmp_path)
    assert region.params.sum_output and region.outputs == ["y", "s"]
    _check(model, fused, lib, _feeds(model, shape))


def test_symbolic_rows_at_every_sequence_length(tmp_path):
    model = _model([1, "seq", 64])
    fused, lib, _ = _fuse(model, tmp_path)
    for seq in (1, 7, 32, 128, 384, 512):
        _check(model, fused, lib, _feeds(model, [1, seq, 64], seed=seq))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), n=st.integers(1, 300), scale=st.sampled_from([1e-3, 1.0, 1e3]),
       eps=st.sampled_from([1e-12, 1e-5, 0.1]))
def test_drawn_rows(tmp_path, rows, n, scale, eps):
    model = _model([rows, n], eps=eps)
    fused, lib, _ = _fuse(model, tmp_path)
    feeds = {k: v * np.float32(scale) for k, v in _feeds(model, [rows, n], seed=rows * 1000 + n).items()}
    want = make_session(model, 1, optimization="none").run(None, feeds)[0]
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_broadcast_add_stays_outside(tmp_path):
    """Add(x, bias[H]) is not a residual: the kernel normalizes its result and the Add stays with onnxruntime."""
    model = _model([2, 5, 16], residual_shape=[16])
    regions = KIND.find(model, set(), [])
    assert [n.op_type for n in regions[0].nodes] == ["LayerNormalization"]
    fused, lib, _ = _fuse(model, tmp_path)
    feeds = {"x": np.random.default_rng(0).standard_normal([2, 5, 16]).astype(np.float32),
             "r": np.random.default_rng(1).standard_normal([16]).astype(np.float32)}
    _check(model, fused, lib, feeds)


@pytest.mark.parametrize("kw,reason", [
    (dict(axis=1), "it normalizes more than the last axis"),
    (dict(mean_output=True), "its mean or inverse standard deviation output is read"),
])
def test_refusals_say_why(kw, reason):
    rejected = []
    assert KIND.find(_model([2, 3, 8], **kw), set(), rejected) == []
    assert rejected == [{"nodes": ["ln"], "reason": f"LayerNormalization: {reason}"}]


def _decomposed(shape, *, residual=True, bias=True, square="Pow", opset=14, eps=1e-12, constants_as_nodes=False):
    """torch's TorchScript export of nn.LayerNorm below opset 17."""
    rng = np.random.default_rng(7)
    h = shape[-1]
    n = helper.make_node
    consts = {"two": np.float32(2.0), "eps": np.float32(eps)}
    inits = [numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "beta")]
    nodes = []
    if constants_as_nodes:
        nodes += [n("Constant", [], [k], value=numpy_helper.from_array(v, k)) for k, v in consts.items()]
    else:
        inits += [numpy_helper.from_array(v, k) for k, v in consts.items()]
    ins = [helper.make_tensor_value_info("x", F, shape)]
    x = "x"
    if residual:
        ins.append(helper.make_tensor_value_info("r", F, shape))
        nodes.append(n("Add", ["x", "r"], ["s"]))
        x = "s"

    def mean(src, dst):
        if opset >= 18:
            inits.append(numpy_helper.from_array(np.array([-1], np.int64), f"{dst}_axes"))
            return n("ReduceMean", [src, f"{dst}_axes"], [dst])
        return n("ReduceMean", [src], [dst], axes=[-1])

    nodes += [mean(x, "mu"), n("Sub", [x, "mu"], ["d"]),
              n("Pow", ["d", "two"], ["p"]) if square == "Pow" else n("Mul", ["d", "d"], ["p"]),
              mean("p", "var"), n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
              n("Div", ["d", "sd"], ["nrm"]), n("Mul", ["nrm", "gamma"], ["sc"])]
    if bias:
        nodes.append(n("Add", ["sc", "beta"], ["y"]))
    else:
        nodes[-1] = n("Mul", ["gamma", "nrm"], ["y"])
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("kw", [dict(), dict(residual=False), dict(square="Mul"), dict(bias=False), dict(opset=18)])
def test_the_decomposed_form(tmp_path, kw):
    shape = [1, 9, 48]
    model = _decomposed(shape, **kw)
    fused, lib, region = _fuse(model, tmp_path)
    ops = [n.op_type for n in region.nodes]
    assert ops[:2] == (["Add", "ReduceMean"] if kw.get("residual", True) else ["ReduceMean", "Sub"])
    assert region.params.epsilon == pytest.approx(1e-12) and region.params.has_bias == kw.get("bias", True)
    assert [n.op_type for n in fused.graph.node] == [fused.graph.node[0].op_type] and fused.graph.node[0].domain
    _check(model, fused, lib, _feeds(model, shape))


def test_the_decomposed_form_through_the_pipeline(tmp_path):
    """Constant nodes for 2 and epsilon, as the exporter writes them: the optimizer folds them and takes the form."""
    import onnxopt

    shape = [1, 16, 64]
    src, out = os.path.join(str(tmp_path), "m.onnx"), os.path.join(str(tmp_path), "f.onnx")
    onnx.save(_decomposed(shape, constants_as_nodes=True), src)
    res = onnxopt.optimize(src, out, measure=False)
    assert [r["ops"] for r in res.report["regions"]] == [
        "Add -> ReduceMean -> Sub -> Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul -> Add"]


def test_a_partial_decomposition_is_left_alone():
    """Without the Sqrt (a different normalization), nothing is taken."""
    model = _decomposed([2, 8])
    nodes = list(model.graph.node)
    sqrt = next(n for n in nodes if n.op_type == "Sqrt")
    sqrt.op_type = "Exp"
    assert KIND.find(model, set(), []) == []
