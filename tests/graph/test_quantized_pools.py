"""A quantized model's MaxPools and nearest Resizes moved onto int8 tensors (graph/quantized_pools.py): MaxPool ->
QuantizeLinear becomes QuantizeLinear -> MaxPool, and a DequantizeLinear -> MaxPool -> QuantizeLinear unit with
equal steps an integer MaxPool alone; the same for a nearest Resize. Exact: onnxruntime gives the same outputs
before and after on values that saturate, sit on rounding midpoints and fill whole windows with the padding's value;
the refusals leave the graph as it was; and a model from onnxruntime's own quantize_static, written by
`onnxopt.optimize`, runs its MaxPool in our kernel in a fresh process."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from int8_models import assert_written_runs_within_a_step, quantize_static_defaults
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.graph.quantized_pools import quantize_before_max_pools
from onnxopt.timing import make_session

U8, S8, F = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT


def _model(nodes, inits, x_type=F, y_type=U8, opset=13, x_shape=(1, 3, 9, 10)):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, list(x_shape))],
                          [helper.make_tensor_value_info("y", y_type, [1, 3, 5, 6])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _step(name, scale, zero, t=U8):
    return [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
            numpy_helper.from_array(np.array(zero, np.uint8 if t == U8 else np.int8), f"{name}_z")]


POOL = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)


def _float_pool_then_quantize(opset=13, **attrs):
    """x -> Relu -> MaxPool -> QuantizeLinear -> y (a float MaxPool whose result is quantized)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], **(attrs or POOL)),
             helper.make_node("QuantizeLinear", ["p", "q_s", "q_z"], ["y"])]
    return _model(nodes, _step("q", 0.05, 3), opset=opset)


def _dq_pool_q(dq=(0.05, 7), q=(0.05, 7), t=U8):
    """x (int8) -> DequantizeLinear -> MaxPool -> QuantizeLinear -> y."""
    nodes = [helper.make_node("DequantizeLinear", ["x", "d_s", "d_z"], ["f"]),
             helper.make_node("MaxPool", ["f"], ["p"], **POOL),
             helper.make_node("QuantizeLinear", ["p", "q_s", "q_z"], ["y"])]
    return _model(nodes, _step("d", *dq, t) + _step("q", *q, t), x_type=t, y_type=t)


def _feeds(model, rng):
    t = model.graph.input[0].type.tensor_type.elem_type
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if t == F:
        # midpoints of the steps (k + 1/2) * 0.05, values past the range, and plain noise
        x = rng.standard_normal(shape).astype(np.float32) * 8
        x.reshape(-1)[::7] = (rng.integers(-10, 300, x.size)[::7] + 0.5) * np.float32(0.05)
        return {"x": x}
    lo, hi, nt = (0, 256, np.uint8) if t == U8 else (-128, 128, np.int8)
    x = rng.integers(lo, hi, shape).astype(nt)
    x[..., :3, :3] = lo  # a corner of the type's least value: the padding's
    return {"x": x}


def _same_outputs(before, after, seeds=3):
    for seed in range(seeds):
        feeds = _feeds(before, np.random.default_rng(seed))
        want = make_session(before, 1, optimization="none").run(None, feeds)[0]
        got = make_session(after, 1, optimization="none").run(None, feeds)[0]
        assert want.dtype == got.dtype
        np.testing.assert_array_equal(want, got)


def _rewritten(m, op="MaxPool"):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return quantize_before_max_pools(out)[op], out


def test_a_float_max_pool_before_a_quantizer_runs_on_the_quantized_tensor():
    m = _float_pool_then_quantize()
    moved, after = _rewritten(m)
    assert moved == 1
    assert [n.op_type for n in after.graph.node] == ["Relu", "QuantizeLinear", "MaxPool"]
    onnx.checker.check_model(after)
    onnx.shape_inference.infer_shapes(after, strict_mode=True)  # the integer MaxPool is valid ONNX
    _same_outputs(m, after)


@pytest.mark.parametrize("t", [U8, S8])
def test_equal_steps_around_a_max_pool_go(t):
    m = _dq_pool_q(t=t)
    moved, after = _rewritten(m)
    assert moved == 1 and [n.op_type for n in after.graph.node] == ["MaxPool"]
    assert after.graph.node[0].input[0] == "x" and after.graph.node[0].output[0] == "y"
    _same_outputs(m, after)


def test_different_steps_requantize_before_the_pool():
    m = _dq_pool_q(dq=(0.05, 7), q=(0.03, 100))
    moved, after = _rewritten(m)
    assert moved == 1
    assert [n.op_type for n in after.graph.node] == ["DequantizeLinear", "QuantizeLinear", "MaxPool"]
    _same_outputs(m, after)


def test_what_is_left_as_it_was():
    # before opset 12 MaxPool takes no integers
    assert _rewritten(_float_pool_then_quantize(opset=11))[0] == 0
    # the Indices output is used
    m = _float_pool_then_quantize()
    m.graph.node[1].output.append("idx")
    m.graph.output.append(helper.make_tensor_value_info("idx", TensorProto.INT64, None))
    assert _rewritten(m)[0] == 0
    # the pooled float has another reader
    m = _float_pool_then_quantize()
    m.graph.node.append(helper.make_node("Relu", ["p"], ["p2"]))
    m.graph.output.append(helper.make_tensor_value_info("p2", F, None))
    assert _rewritten(m)[0] == 0
    # a per-channel quantizer (a vector of scales)
    m = _float_pool_then_quantize()
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(3, 0.05, np.float32), "q_s"))
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.full(3, 3, np.uint8), "q_z"))
    m.graph.node[2].attribute.append(helper.make_attribute("axis", 1))
    assert _rewritten(m)[0] == 0


def _dq_resize_q(mode="nearest", ctm="asymmetric", dq=(0.05, 7), q=(0.05, 7), t=U8, opset=13):
    """x (int8) -> DequantizeLinear -> Resize (x2 rows, x1.5 columns) -> QuantizeLinear -> y."""
    nodes = [helper.make_node("DequantizeLinear", ["x", "d_s", "d_z"], ["f"]),
             helper.make_node("Resize", ["f", "", "scales"], ["p"], mode=mode, coordinate_transformation_mode=ctm),
             helper.make_node("QuantizeLinear", ["p", "q_s", "q_z"], ["y"])]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")
    m = _model(nodes, _step("d", *dq, t) + _step("q", *q, t) + [scales], x_type=t, y_type=t, opset=opset)
    m.graph.output[0].type.tensor_type.shape.Clear()
    return m


@pytest.mark.parametrize("t", [U8, S8])
@pytest.mark.parametrize("ctm", ["asymmetric", "half_pixel", "align_corners"])
def test_equal_steps_around_a_nearest_resize_go(t, ctm):
    m = _dq_resize_q(ctm=ctm, t=t)
    moved, after = _rewritten(m, "Resize")
    assert moved == 1 and [n.op_type for n in after.graph.node] == ["Resize"]
    onnx.checker.check_model(after)
    _same_outputs(m, after)


def test_different_steps_requantize_before_a_nearest_resize():
    m = _dq_resize_q(dq=(0.05, 7), q=(0.03, 100))
    moved, after = _rewritten(m, "Resize")
    assert moved == 1
    assert [n.op_type for n in after.graph.node] == ["DequantizeLinear", "QuantizeLinear", "Resize"]
    _same_outputs(m, after)


def test_resizes_that_do_not_only_copy_values_are_left_as_they_were():
    for m in (_dq_resize_q(mode="linear"), _dq_resize_q(mode="cubic"), _dq_resize_q(ctm="tf_crop_and_resize"),
              _dq_resize_q(opset=10)):
        moved, after = _rewritten(m, "Resize")
        assert moved == 0 and [n.op_type for n in after.graph.node] == [n.op_type for n in m.graph.node]


def _conv_pool_block() -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool (3x3 / 2, ceil mode) -> Conv, as SqueezeNet's stem."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    g = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", F, [1, 3, 67, 75])],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_a_quantize_static_model_runs_its_max_pool_in_a_fresh_process(tmp_path):
    """onnxruntime's quantize_static (QDQ, its defaults) of a SqueezeNet-like stem: the MaxPool runs on uint8 in the
    pool kind's kernel (called in a fresh process through the public loader) and the output equals onnxruntime's on
    the QDQ model."""
    q = quantize_static_defaults(_conv_pool_block(), tmp_path, (1, 3, 67, 75))
    assert any(n.op_type == "MaxPool" for n in q.graph.node)
    out = tmp_path / "w" / "out.onnx"
    out.parent.mkdir()
    res = onnxopt.optimize(str(tmp_path / "q.onnx"), str(out), measure=False, threads=2, cost_cache=False)
    assert res.report["rewrites"]["max_pools_on_int8"] == 1
    pools = [r for r in res.report["regions"] if r["op_type"].startswith("MaxPool")]
    assert len(pools) == 1, [r["ops"] for r in res.report["regions"]]
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    written = onnx.load(str(out))
    assert not any(n.op_type == "MaxPool" for n in written.graph.node)
    x = np.random.default_rng(9).standard_normal((1, 3, 67, 75)).astype(np.float32)
    assert_written_runs_within_a_step(out, q, x, pools[0]["op_type"], tmp_path)
