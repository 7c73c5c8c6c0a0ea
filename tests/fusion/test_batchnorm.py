"""A BatchNormalization that no convolution absorbs joins an elementwise region as x * scale + shift
(onnxopt/fusion/batchnorm.py): DenseNet's pre-activation BN -> ReLU in one pass."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import const, make_model

import onnxopt
from onnxopt.fusion import batchnorm
from onnxopt.fusion.elementwise import ElementwiseRule

vi = helper.make_tensor_value_info


def _params(rng, c, prefix=""):
    return [const(prefix + "gamma", rng.uniform(0.5, 2.0, c)), const(prefix + "beta", rng.standard_normal(c)),
            const(prefix + "mean", rng.standard_normal(c)), const(prefix + "var", rng.uniform(0.1, 3.0, c))]


def preactivation_model(c=24, hw=16, seed=0, dtype=np.float32, conv=True):
    """Concat -> BatchNormalization -> Relu [-> 1x1 Conv], the Concat also a graph output (as in a dense block)."""
    rng = np.random.default_rng(seed)
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    half = c // 2
    inits = [const(t.name, numpy_helper.to_array(t), dtype) for t in _params(rng, c)]
    nodes = [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1, name="cat"),
             helper.make_node("BatchNormalization", ["cat", "gamma", "beta", "mean", "var"], ["bn"], name="bn",
                              epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["act"], name="relu")]
    outs = [vi("cat", et, [1, c, hw, hw])]
    if conv:
        inits.append(const("w", rng.standard_normal((8, c, 1, 1)) * 0.2, dtype))
        nodes.append(helper.make_node("Conv", ["act", "w"], ["y"], name="conv"))
        outs.insert(0, vi("y", et, [1, 8, hw, hw]))
    else:
        outs.insert(0, vi("act", et, [1, c, hw, hw]))
    return make_model(nodes, [vi("a", et, [1, half, hw, hw]), vi("b", et, [1, c - half, hw, hw])], outs, inits)


def _rule(m):
    return ElementwiseRule(onnx.shape_inference.infer_shapes(m))


def test_scale_and_shift_are_the_batchnorm_formula():
    m = preactivation_model()
    rule = _rule(m)
    bn = next(n for n in rule.graph.node if n.op_type == "BatchNormalization")
    assert rule.admits(bn) is None
    scale, shift = batchnorm.affine(bn, rule.inits, 4, "float32")
    assert list(scale.dims) == [24, 1, 1] and list(shift.dims) == [24, 1, 1]
    g, b, mu, var = (numpy_helper.to_array(rule.inits[x]).astype(np.float64) for x in bn.input[1:5])
    x = np.random.default_rng(1).standard_normal((1, 24, 3, 3))
    want = (x - mu[:, None, None]) / np.sqrt(var[:, None, None] + 1e-3) * g[:, None, None] + b[:, None, None]
    got = x * numpy_helper.to_array(scale) + numpy_helper.to_array(shift)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_batchnorm_and_relu_are_one_region_reading_the_new_constants():
    rule = _rule(preactivation_model())
    (r,) = rule.find_regions([])
    assert [n.op_type for n in r.nodes] == ["BatchNormalization", "Relu"]
    assert r.inputs == ["cat", "bn__bn_scale", "bn__bn_shift"]
    assert [t.name for t in r.initializers] == ["bn__bn_scale", "bn__bn_shift"]
    assert [o.op for o in r.program.ops] == ["Mul", "Add", "Relu"]


@pytest.mark.parametrize("change,reason", [
    (lambda n, m: n.attribute.append(helper.make_attribute("training_mode", 1)), "training mode"),
    (lambda n, m: m.graph.input.append(vi("var", TensorProto.FLOAT, [24])), "not constants"),
])
def test_refused_batchnorms_say_why(change, reason):
    m = preactivation_model()
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    change(bn, m)
    if reason == "not constants":  # a parameter fed at run time
        m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "var"))
    rule = _rule(m)
    assert reason in rule.admits(next(n for n in rule.graph.node if n.op_type == "BatchNormalization"))


def _feeds(seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((1, 12, 16, 16)).astype(dtype),
            "b": rng.standard_normal((1, 12, 16, 16)).astype(dtype)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_model_matches_onnxruntime_with_and_without_the_library(tmp_path, dtype):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(preactivation_model(dtype=dtype, conv=False), src)
    res = onnxopt.optimize(src, out, threads=2, cost_cache=False, min_speedup=0.0, measure=False)
    fused = onnx.load(out)
    (node,) = [n for n in fused.graph.node if n.domain == "onnxopt"]
    assert node.op_type.startswith("Elementwise_") and list(node.input)[1:] == ["bn__bn_scale", "bn__bn_shift"]
    assert res.report["verification"]["ok"]
    feeds = _feeds(3, dtype)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)
    so = ort.SessionOptions()
    so.register_custom_ops_library(out + ".so")
    with_lib = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    fallback = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, feeds)  # the function body
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for w, a, b in zip(want, with_lib, fallback):
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol)
        np.testing.assert_array_equal(b, w)
