"""graph/quantized_weights.py: QuantizeLinear of constant weights folded offline, bit for bit as onnxruntime
quantizes them at run time."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.graph.quantized_weights import fold_quantized_weights


def _weights(shape, scale, zero, rng) -> np.ndarray:
    """Float weights that hit every hard case: values exactly half-way between two steps (both parities), values
    past both ends of the range (saturation), infinities, negative zero and ordinary values."""
    scale_b = np.broadcast_to(np.asarray(scale, np.float32).reshape([-1] + [1] * (len(shape) - 1)), shape)
    zero_b = np.broadcast_to(np.asarray(zero, np.float64).reshape([-1] + [1] * (len(shape) - 1)), shape)
    steps = rng.integers(-300, 300, size=shape).astype(np.float32)
    half = ((steps + 0.5) * scale_b).astype(np.float32)  # x / scale lands on k + 0.5 (or a float32 neighbour)
    ordinary = (rng.normal(size=shape) * 200 * scale_b).astype(np.float32)
    w = np.where(rng.random(shape) < 0.5, half, ordinary).astype(np.float32)
    flat = w.reshape(-1)
    flat[:4] = [np.inf, -np.inf, -0.0, 1e30]
    flat[4] = (255 - zero_b.reshape(-1)[4] + 0.5) * scale_b.reshape(-1)[4]  # just past the top: saturates
    return w


def _model(w, scale, zero, axis, as_constant: bool, through_identity: bool):
    """W -> QuantizeLinear -> output; W an initializer or a Constant node (through an Identity if asked)."""
    nodes, inits = [], [numpy_helper.from_array(np.asarray(scale, np.float32), "s"),
                        numpy_helper.from_array(np.asarray(zero), "z")]
    w_name = "w"
    if as_constant:
        nodes.append(helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    if through_identity:
        nodes.append(helper.make_node("Identity", ["w"], ["w_id"]))
        w_name = "w_id"
    attrs = {"axis": axis} if np.asarray(scale).size > 1 else {}
    nodes.append(helper.make_node("QuantizeLinear", [w_name, "s", "z"], ["q"], **attrs))
    nodes.append(helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs))
    # q is copied to an output (an output itself is never folded)
    nodes.append(helper.make_node("Identity", ["q"], ["q_out"]))
    out_type = helper.np_dtype_to_tensor_dtype(np.asarray(zero).dtype)
    g = helper.make_graph(nodes, "qw", [], [helper.make_tensor_value_info("q_out", out_type, list(w.shape)),
                                            helper.make_tensor_value_info("y", TensorProto.FLOAT, list(w.shape))],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _run(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(["q_out", "y"], {})


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
@pytest.mark.parametrize("as_constant,through_identity", [(True, False), (False, False), (True, True)])
def test_fold_is_onnxruntimes_quantization(dtype, per_axis, as_constant, through_identity):
    rng = np.random.default_rng(7)
    shape = (6, 5, 3, 3)
    if per_axis:
        scale = rng.uniform(0.001, 0.05, size=6).astype(np.float32)
        zero = (rng.integers(90, 160, size=6) - (128 if dtype == np.int8 else 0)).astype(dtype)
    else:
        scale, zero = np.float32(0.0123), dtype(131 if dtype == np.uint8 else -7)
    w = _weights(shape, scale, zero, rng)
    model = _model(w, scale, zero, 0, as_constant, through_identity)
    want_q, want_y = _run(model)
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert fold_quantized_weights(folded) == 1
    assert not any(n.op_type in ("QuantizeLinear", "Constant") for n in folded.graph.node)
    q_init = next(t for t in folded.graph.initializer if t.name == "q")
    assert q_init.data_type == helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    assert "w" not in {t.name for t in folded.graph.initializer}  # the float weights are gone
    got_q, got_y = _run(folded)
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_y, want_y)
    assert np.any(want_q == np.iinfo(dtype).max) and np.any(want_q == np.iinfo(dtype).min)  # saturation was hit
    # half-way points were hit, so both roundings of them were compared
    ratio = (w / np.broadcast_to(np.asarray(scale).reshape([-1, 1, 1, 1]), shape)).astype(np.float32)
    ratio = ratio[np.isfinite(ratio)]
    assert np.sum(ratio - np.floor(ratio) == 0.5) > 50


def test_no_zero_point_is_uint8_and_the_user_model_is_untouched():
    w = np.array([[-1.0, 0.25, 0.5, 0.75, 3.0, 300.0]], np.float32)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
             helper.make_node("QuantizeLinear", ["w", "s"], ["q"]),
             helper.make_node("Identity", ["q"], ["q_out"])]
    g = helper.make_graph(nodes, "qw", [], [helper.make_tensor_value_info("q_out", TensorProto.UINT8, [1, 6])],
                          initializer=[numpy_helper.from_array(np.float32(0.5), "s")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    before = model.SerializeToString()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert fold_quantized_weights(copy) == 1
    assert model.SerializeToString() == before
    so = ort.SessionOptions()
    want = ort.InferenceSession(before, so, providers=["CPUExecutionProvider"]).run(None, {})[0]
    got = ort.InferenceSession(copy.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {})[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [[0, 0, 1, 2, 6, 255]])  # 0.25/0.5 = 0.5 -> 0, 0.75/0.5 = 1.5 -> 2


def test_what_is_not_constant_is_left():
    """An activation's quantizer, a weight that is a graph input too (replaceable at run time) and a graph output
    stay nodes."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["qx"]),
             helper.make_node("QuantizeLinear", ["w", "s", "z"], ["qw"]),
             helper.make_node("Add", ["qx", "qw"], ["sum"])]
    g = helper.make_graph(nodes, "qw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                        helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("sum", TensorProto.UINT8, [2])],
                          initializer=[numpy_helper.from_array(np.float32(0.5), "s"),
                                       numpy_helper.from_array(np.uint8(3), "z"),
                                       numpy_helper.from_array(np.ones(2, np.float32), "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert fold_quantized_weights(model) == 0
    assert [n.op_type for n in model.graph.node] == ["QuantizeLinear", "QuantizeLinear", "Add"]
