"""A whole transformer encoder layer, as the exporters write one, through the optimizer: the projections and FFN as
packed-B GEMM kernels with their epilogues, the attention chain with its head split and merge read in place, the
residual Adds with their LayerNorms as row kernels; the sequence symbolic, checked at every length the issue names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.timing import make_session

F = TensorProto.FLOAT
HIDDEN, HEADS = 64, 4
HEAD = HIDDEN // HEADS


def encoder_layer(ffn: int = 4 * HIDDEN, seed: int = 0) -> onnx.ModelProto:
    """x [1, seq, 64] and an additive mask [1, 1, 1, seq] -> one post-LN BERT layer (SDPA form, GELU through Erf)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def linear(x, k, n, name):
        w = const(f"{name}_w", rng.standard_normal((k, n)) / np.sqrt(k))
        b = const(f"{name}_b", rng.standard_normal(n) * 0.1)
        return node("Add", [node("MatMul", [x, w], f"{name}_mm"), b], f"{name}_out")

    def layernorm(x, r, name):
        s = node("Add", [x, r], f"{name}_sum")
        g = const(f"{name}_g", 1 + 0.1 * rng.standard_normal(HIDDEN))
        b = const(f"{name}_beta", 0.1 * rng.standard_normal(HIDDEN))
        nodes.append(helper.make_node("LayerNormalization", [s, g, b], [f"{name}_y"], axis=-1, epsilon=1e-12))
        return f"{name}_y"

    split = const("split_shape", [1, -1, HEADS, HEAD], np.int64)
    merge = const("merge_shape", [1, -1, HIDDEN], np.int64)
    scale = const("scale", np.sqrt(1 / np.sqrt(HEAD)))
    heads = {}
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        r = node("Reshape", [linear("x", HIDDEN, HIDDEN, t), split], f"{t}_split")
        heads[t] = node("Transpose", [r], f"{t}_heads", perm=perm)
    qs = node("Mul", [heads["q"], scale], "q_scaled")
    ks = node("Mul", [heads["k"], scale], "k_scaled")
    scores = node("Add", [node("MatMul", [qs, ks], "scores"), "mask"], "logits")
    probs = node("Softmax", [scores], "probs", axis=-1)
    zero = const("zero", 0.0)
    guarded = node("Where", [node("IsNaN", [probs], "nan"), zero, probs], "guarded")
    context = node("Transpose", [node("MatMul", [guarded, heads["v"]], "context")], "context_t", perm=[0, 2, 1, 3])
    merged = node("Reshape", [context, merge], "merged")
    h1 = layernorm(linear(merged, HIDDEN, HIDDEN, "o"), "x", "ln1")
    up = linear(h1, HIDDEN, ffn, "up")
    sqrt2, one, half = const("sqrt2", np.sqrt(2.0)), const("one", 1.0), const("half", 0.5)
    erf = node("Erf", [node("Div", [up, sqrt2], "up_div")], "up_erf")
    gelu = node("Mul", [node("Mul", [up, node("Add", [erf, one], "up_1")], "up_x"), half], "gelu")
    down = linear(gelu, ffn, HIDDEN, "down")
    y = layernorm(down, h1, "ln2")
    g = helper.make_graph(nodes, "encoder_layer",
                          [helper.make_tensor_value_info("x", F, [1, "seq", HIDDEN]),
                           helper.make_tensor_value_info("mask", F, [1, 1, 1, "seq"])],
                          [helper.make_tensor_value_info(y, F, [1, "seq", HIDDEN])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def feeds(seq: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.where(rng.random((1, 1, 1, seq)) > 0.2, 0.0, np.finfo(np.float32).min).astype(np.float32)
    mask[..., 0] = 0.0
    return {"x": rng.standard_normal((1, seq, HIDDEN)).astype(np.float32), "mask": mask}


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    model = encoder_layer()
    onnx.checker.check_model(model)
    out = str(tmp_path_factory.mktemp("layer") / "fused.onnx")
    return model, onnxopt.optimize(model, out, measure=False, threads=2)


def test_every_part_gets_its_kernel(fused):
    _, res = fused
    ops = sorted(r["ops"] for r in res.report["regions"])
    attention = [o for o in ops if "Softmax" in o]
    assert attention == ["Transpose -> Transpose -> Transpose -> Mul -> Mul -> MatMul -> Add -> Softmax -> IsNaN -> "
                         "Where -> MatMul -> Transpose"], ops
    assert ops.count("Add -> LayerNormalization") == 2
    assert ops.count("MatMul -> Add") == 5  # q, k, v, o, down
    assert "MatMul -> Add -> Div -> Erf -> Add -> Mul -> Mul" in ops
    left = [n.op_type for n in res.model.graph.node if n.domain in ("", "ai.onnx")]
    assert "Transpose" not in left and "MatMul" not in left and "LayerNormalization" not in left


@pytest.mark.parametrize("seq", [1, 7, 32, 128, 384, 512])
def test_every_sequence_length(fused, seq):
    model, res = fused
    want = make_session(model, 1, optimization="none").run(None, feeds(seq))[0]
    got = make_session(res.model, 2, library=res.library).run(None, feeds(seq))[0]
    assert got.shape == (1, seq, HIDDEN)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    alone = make_session(res.model, 2).run(None, feeds(seq))[0]  # the function fallbacks, without the library
    np.testing.assert_allclose(alone, want, rtol=1e-4, atol=1e-4)


def test_measured_at_one_length_and_still_dynamic(tmp_path):
    """--measure-shape: checked (and, with measurement, timed) at seq 128, written with `seq` still symbolic."""
    model = encoder_layer(seed=3)
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), measure=False, threads=2,
                           measure_shape=["x:1,128,64", "mask:1,1,1,128"])
    assert res.report["check_bindings"] == {"seq": 128}
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in res.model.graph.input]
    assert dims == [[1, "seq", HIDDEN], [1, 1, 1, "seq"]]
    for seq in (7, 300):
        want = make_session(model, 1, optimization="none").run(None, feeds(seq))[0]
        got = make_session(res.model, 2, library=res.library).run(None, feeds(seq))[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
