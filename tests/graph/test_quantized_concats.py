"""A quantized model's Concats moved onto int8 tensors (graph/quantized_concats.py): DequantizeLinear per input ->
Concat -> QuantizeLinear becomes a Concat of the int8 tensors, each input at other steps first requantized by its
DequantizeLinear -> QuantizeLinear pair. Exact: onnxruntime gives the same outputs before and after on every byte
value; the refusals leave the graph as it was; and onnxruntime's quantize_static of SqueezeNet's fire module,
written by `onnxopt.optimize`, runs its Concat in our copy kernel in a fresh process, the requantization in the
convolution's table."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from int8_models import assert_written_runs_within_a_step, quantize_static_defaults, quantized_cnn
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.graph.quantized_concats import requantize_before_concats
from onnxopt.timing import make_session

U8, S8, F = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT


def _unit(steps, out_step, t=U8, axis=1):
    """a, b, c (int8, [1, 2, 4, 32]) -> DequantizeLinear each at `steps` -> Concat(axis) -> QuantizeLinear -> y."""
    np_t = np.uint8 if t == U8 else np.int8
    inits, nodes, xs = [], [], []
    for i, (s, z) in enumerate(list(steps) + [out_step]):
        inits += [numpy_helper.from_array(np.array(s, np.float32), f"s{i}"),
                  numpy_helper.from_array(np.array(z, np_t), f"z{i}")]
    for i in range(len(steps)):
        nodes.append(helper.make_node("DequantizeLinear", [f"x{i}", f"s{i}", f"z{i}"], [f"f{i}"]))
        xs.append(helper.make_tensor_value_info(f"x{i}", t, [1, 2, 4, 32]))
    k = len(steps)
    nodes += [helper.make_node("Concat", [f"f{i}" for i in range(k)], ["c"], axis=axis),
              helper.make_node("QuantizeLinear", ["c", f"s{k}", f"z{k}"], ["y"])]
    g = helper.make_graph(nodes, "g", xs, [helper.make_tensor_value_info("y", t, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _rewritten(m):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return requantize_before_concats(out), out


def _same_outputs(before, after):
    t = before.graph.input[0].type.tensor_type.elem_type
    lo = 0 if t == U8 else -128
    # every byte value in each input, in a different order per input
    np_t = np.uint8 if t == U8 else np.int8
    feeds = {i.name: np.roll(np.arange(256) + lo, 37 * k).reshape(1, 2, 4, 32).astype(np_t)
             for k, i in enumerate(before.graph.input)}
    want = make_session(before, 1, optimization="none").run(None, feeds)[0]
    got = make_session(after, 1, optimization="none").run(None, feeds)[0]
    assert want.dtype == got.dtype
    np.testing.assert_array_equal(want, got)


@pytest.mark.parametrize("t", [U8, S8])
def test_inputs_at_other_steps_are_requantized_and_the_concat_runs_on_int8(t):
    z = 0 if t == U8 else -3
    m = _unit([(0.0555, z), (0.0563, z + 5), (0.01, z)], (0.0563, z + 5), t=t)
    moved, after = _rewritten(m)
    assert moved == 1
    ops = [n.op_type for n in after.graph.node]
    assert ops == ["DequantizeLinear", "DequantizeLinear", "QuantizeLinear", "QuantizeLinear", "Concat"], ops
    concat = after.graph.node[-1]
    assert concat.input[1] == "x1" and concat.output[0] == "y"  # the input at the output's steps: itself
    onnx.shape_inference.infer_shapes(after, strict_mode=True)  # a Concat of int8 tensors is valid ONNX
    _same_outputs(m, after)


def test_equal_steps_leave_a_plain_concat():
    m = _unit([(0.05, 7), (0.05, 7)], (0.05, 7), axis=-1)
    moved, after = _rewritten(m)
    assert moved == 1 and [n.op_type for n in after.graph.node] == ["Concat"]
    assert list(after.graph.node[0].input) == ["x0", "x1"]
    _same_outputs(m, after)


def _qlinear_concat(steps, out_step, t=U8):
    """a, b, c (int8, [1, 2, 4, 32]) -> com.microsoft's QLinearConcat(axis 1) at `steps` -> y."""
    np_t = np.uint8 if t == U8 else np.int8
    inits, args, xs = [], ["sy", "zy"], []
    for name, (s, z) in [("y", out_step)] + [(str(i), st) for i, st in enumerate(steps)]:
        inits += [numpy_helper.from_array(np.array(s, np.float32), f"s{name}"),
                  numpy_helper.from_array(np.array(z, np_t), f"z{name}")]
    for i in range(len(steps)):
        args += [f"x{i}", f"s{i}", f"z{i}"]
        xs.append(helper.make_tensor_value_info(f"x{i}", t, [1, 2, 4, 32]))
    node = helper.make_node("QLinearConcat", args, ["y"], axis=1, domain="com.microsoft")
    g = helper.make_graph([node], "g", xs, [helper.make_tensor_value_info("y", t, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("t", [U8, S8])
def test_a_qlinear_concat_becomes_the_same_concat_of_int8_tensors(t):
    """QOperator's QLinearConcat: the inputs at other steps requantized by a DequantizeLinear -> QuantizeLinear
    pair, then a Concat; equal to onnxruntime's QLinearConcat on every byte value."""
    z = 0 if t == U8 else -3
    m = _qlinear_concat([(0.0555, z), (0.0563, z + 5), (0.01, z)], (0.0563, z + 5), t=t)
    moved, after = _rewritten(m)
    assert moved == 1
    ops = [n.op_type for n in after.graph.node]
    assert ops == ["DequantizeLinear", "QuantizeLinear", "DequantizeLinear", "QuantizeLinear", "Concat"], ops
    assert after.graph.node[-1].input[1] == "x1" and after.graph.node[-1].output[0] == "y"
    _same_outputs(m, after)


def test_what_is_left_as_it_was():
    def unchanged(m):
        moved, after = _rewritten(m)
        assert moved == 0 and [n.op_type for n in after.graph.node] == [n.op_type for n in m.graph.node]

    # a dequantized input read by another node too
    m = _unit([(0.05, 7), (0.06, 7)], (0.06, 7))
    m.graph.node.append(helper.make_node("Relu", ["f0"], ["r"]))
    m.graph.output.append(helper.make_tensor_value_info("r", F, None))
    unchanged(m)
    # the float Concat read by another node
    m = _unit([(0.05, 7), (0.06, 7)], (0.06, 7))
    m.graph.node.append(helper.make_node("Relu", ["c"], ["r"]))
    m.graph.output.append(helper.make_tensor_value_info("r", F, None))
    unchanged(m)
    # per-channel steps on an input
    m = _unit([(0.05, 7), (0.06, 7)], (0.06, 7))
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(2, 0.05, np.float32), "s0"))
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.full(2, 7, np.uint8), "z0"))
    unchanged(m)
    # an input of another int8 type than the output
    m = _unit([(0.05, 7), (0.06, 7)], (0.06, 7))
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(7, np.int8), "z0"))
    m.graph.input[0].type.tensor_type.elem_type = S8
    unchanged(m)
    # a QLinearConcat whose step is computed
    m = _qlinear_concat([(0.05, 7), (0.06, 7)], (0.06, 7))
    m.graph.input.append(helper.make_tensor_value_info("s0_in", F, []))
    m.graph.node[0].input[3] = "s0_in"
    unchanged(m)


def _fire_module() -> onnx.ModelProto:
    """SqueezeNet's fire module at 23 x 23: squeeze 1x1 (24 -> 8) -> Relu -> expand 1x1 and 3x3 (8 -> 16 each) ->
    Relu -> Concat -> a 1x1 convolution (32 -> 8)."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                       name)

    inits = [w("ws", 8, 24, 1, 1), w("we1", 16, 8, 1, 1), w("we3", 16, 8, 3, 3), w("wo", 8, 32, 1, 1)]
    nodes = [helper.make_node("Conv", ["x", "ws"], ["s"]), helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("Conv", ["sr", "we1"], ["e1"]), helper.make_node("Relu", ["e1"], ["e1r"]),
             helper.make_node("Conv", ["sr", "we3"], ["e3"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3"], ["e3r"]),
             helper.make_node("Concat", ["e1r", "e3r"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "wo"], ["y"])]
    g = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", F, [1, 24, 23, 23])],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("form,plan", [("qdq", None), ("qdq", "compute-blocked"), ("qoperator", None)])
def test_a_quantize_static_fire_module_runs_its_concat_in_our_kernel_in_a_fresh_process(tmp_path, form, plan):
    """The Concat of quantize_static's fire module runs in the copy kernel on uint8 (inside a sequence, its inputs
    written in place), the expand whose steps differ requantizes through its table, and the output equals
    onnxruntime's on the QDQ model within a step. In the blocked plan the expands write words of 4 channels, the
    Concat places them, and the last convolution reads them (kinds/qconv/layout.py); its fallbacks check out too.
    In the QOperator format (QLinearConv, com.microsoft's QLinearConcat) the same."""
    if form == "qdq":
        q = quantize_static_defaults(_fire_module(), tmp_path, (1, 24, 23, 23))
    else:
        fire = _fire_module()
        weights = {t.name: numpy_helper.to_array(t) for t in fire.graph.initializer}
        q = onnx.load(quantized_cnn(str(tmp_path), list(fire.graph.node), weights, (1, 24, 23, 23),
                                    np.random.default_rng(3), qoperator=True))
    assert any(n.op_type == ("Concat" if form == "qdq" else "QLinearConcat") for n in q.graph.node)
    out = tmp_path / "w" / "out.onnx"
    out.parent.mkdir()
    res = onnxopt.optimize(str(tmp_path / "q.onnx"), str(out), measure=False, threads=2, cost_cache=False,
                           plan=plan)
    assert res.report["rewrites"]["concats_on_int8"] == 1
    if plan:
        layouts = [r.get("layout") for r in res.report["regions"] if r["op_type"].startswith("qconv_")]
        assert layouts == ["nchw->blocked", "blocked->blocked", "blocked->blocked", "blocked->nchw"], layouts
    copies = [r for r in res.report["regions"] if r["op_type"].startswith("Copy")]
    assert len(copies) == 1 and copies[0]["ops"] == "Concat", [r["ops"] for r in res.report["regions"]]
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    written = onnx.load(str(out))
    assert not any(n.op_type in ("Concat", "QLinearConcat") for n in written.graph.node)
    x = np.random.default_rng(9).standard_normal((1, 24, 23, 23)).astype(np.float32)
    assert_written_runs_within_a_step(out, q, x, copies[0]["op_type"], tmp_path)
