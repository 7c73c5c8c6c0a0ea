"""The QDQ GlobalAveragePool kind (onnxopt/kinds/qgap): DequantizeLinear -> GlobalAveragePool -> QuantizeLinear kept
in int8, as onnxruntime's QLinearGlobalAveragePool runs it. The kernel alone against onnxruntime on the unit, for
uint8 and int8 and planes with a tail; the refusals; and a model from onnxruntime's own quantize_static, written by
`onnxopt.optimize` and run in a fresh process through the public loader, its kernels counted."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from int8_models import assert_written_runs_within_a_step, quantize_static_defaults
from kind_harness import fuse_kind
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.kinds.qgap import KIND
from onnxopt.kinds.qgap.find import find_regions
from onnxopt.timing import make_session


def _unit(dtype: str, shape, x_scale=0.05, x_zero=7, y_scale=0.02, y_zero=3, q_type=None) -> onnx.ModelProto:
    """x (int8 type) -> DequantizeLinear -> GlobalAveragePool -> QuantizeLinear -> y."""
    np_t = np.uint8 if dtype == "uint8" else np.int8
    t = TensorProto.UINT8 if dtype == "uint8" else TensorProto.INT8
    q_np = np_t if q_type is None else q_type
    inits = [numpy_helper.from_array(np.array(x_scale, np.float32), "sx"),
             numpy_helper.from_array(np.array(x_zero, np_t), "zx"),
             numpy_helper.from_array(np.array(y_scale, np.float32), "sy"),
             numpy_helper.from_array(np.array(y_zero, q_np), "zy")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("GlobalAveragePool", ["xf"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "sy", "zy"], ["y"])]
    out_t = TensorProto.UINT8 if q_np == np.uint8 else TensorProto.INT8
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, list(shape))],
                          [helper.make_tensor_value_info("y", out_t, list(shape[:2]) + [1] * (len(shape) - 2))],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _x(dtype: str, shape, seed=0) -> np.ndarray:
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.uint8 if dtype == "uint8" else np.int8)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("shape", [(1, 24, 12, 48), (2, 5, 7, 3), (1, 3, 33)])
def test_the_kernel_is_onnxruntimes_qlinear_global_average_pool(tmp_path, dtype, shape):
    """Against onnxruntime running the unit (its QDQ fusion makes it QLinearGlobalAveragePool): equal, and within
    one step of the spec's float arithmetic (DequantizeLinear, a float mean, QuantizeLinear) at every output."""
    model = _unit(dtype, shape)
    fused, lib, region, ir_text = fuse_kind(KIND, model, tmp_path)
    assert [n.op_type for n in region.nodes] == ["DequantizeLinear", "GlobalAveragePool", "QuantizeLinear"]
    assert "sext" in ir_text if dtype == "int8" else "zext" in ir_text
    x = _x(dtype, shape)
    got = make_session(fused, 2, library=lib).run(None, {"x": x})[0]
    ort_all = make_session(model, 1).run(None, {"x": x})[0]
    spec = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    assert got.dtype == ort_all.dtype and got.shape == ort_all.shape
    np.testing.assert_array_equal(got, ort_all)
    assert np.abs(got.astype(np.int32) - spec.astype(np.int32)).max() <= 1
    bodies = make_session(fused, 1).run(None, {"x": x})[0]  # without the library: the unit's own nodes
    np.testing.assert_array_equal(bodies, ort_all)


def test_saturates_and_rounds_half_to_even(tmp_path):
    """Means that land on a half step round to even, and past the type's range saturate."""
    model = _unit("uint8", (1, 4, 1, 2), x_scale=1.0, x_zero=0, y_scale=1.0, y_zero=0)
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path)
    x = np.array([[[[1, 2]], [[2, 3]], [[255, 254]], [[0, 0]]]], np.uint8)  # means 1.5, 2.5, 254.5, 0
    got = make_session(fused, 2, library=lib).run(None, {"x": x})[0].reshape(-1)
    assert got.tolist() == [2, 2, 254, 0]
    model = _unit("uint8", (1, 1, 1, 2), x_scale=1.0, x_zero=0, y_scale=0.5, y_zero=10)
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path, name="sat.so")
    got = make_session(fused, 2, library=lib).run(None, {"x": np.array([[[[200, 250]]]], np.uint8)})[0]
    assert got.reshape(-1).tolist() == [255]


def test_refusals_say_why():
    per_channel = _unit("uint8", (1, 4, 3, 3))
    per_channel.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(4, 0.05, np.float32), "sx"))
    per_channel.graph.node[0].attribute.append(helper.make_attribute("axis", 1))
    rejected: list = []
    assert find_regions(per_channel, set(), rejected) == []
    assert "scale is not one constant" in rejected[0]["reason"]
    other_type = _unit("uint8", (1, 4, 3, 3), q_type=np.int8)
    rejected = []
    assert find_regions(other_type, set(), rejected) == []
    assert "same type out" in rejected[0]["reason"]


def _se_block() -> onnx.ModelProto:
    """A squeeze-excite block: Conv -> Relu -> GlobalAveragePool -> 1x1 Conv -> Sigmoid -> Mul, as MobileNetV3's."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Conv", ["g", "w2"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["a"]),
             helper.make_node("Mul", ["r", "a"], ["y"])]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 20, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 20, 24])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_a_quantize_static_model_runs_its_pool_in_a_fresh_process(tmp_path):
    """onnxruntime's quantize_static (QDQ, its defaults) of a squeeze-excite block: the pool's unit becomes a qgap
    region, the written files run in a fresh process through the public loader with the qgap kernel called, and the
    output is within one step of onnxruntime's on the QDQ model."""
    q = quantize_static_defaults(_se_block(), tmp_path, (1, 8, 20, 24))
    assert any(n.op_type == "GlobalAveragePool" for n in q.graph.node)
    out = tmp_path / "w" / "out.onnx"
    out.parent.mkdir()
    res = onnxopt.optimize(str(tmp_path / "q.onnx"), str(out), measure=False, threads=2, cost_cache=False)
    regions = [r for r in res.report["regions"] if r["op_type"].startswith("qgap")]
    assert len(regions) == 1, [r["ops"] for r in res.report["regions"]]
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    written = onnx.load(str(out))
    assert not any(n.op_type == "GlobalAveragePool" for n in written.graph.node)
    x = np.random.default_rng(9).standard_normal((1, 8, 20, 24)).astype(np.float32)
    assert_written_runs_within_a_step(out, q, x, regions[0]["op_type"], tmp_path)
