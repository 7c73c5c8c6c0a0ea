"""PoolRule (fusion/pool.py) and pool regions through the whole pipeline: what is fused, what is left alone and why,
and the fused model with and without the kernel library (the function fallback)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import onnxopt.runtime as rt
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.pool import PoolRule

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=19):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _regions(m):
    rejected = []
    regions = PoolRule(onnx.shape_inference.infer_shapes(m)).find_regions(set(), rejected)
    return regions, rejected


MP = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


def test_epilogue_growth():
    # MaxPool -> Add(residual) -> Relu fuses; the Conv after it does not; the pooled tensor read elsewhere is written.
    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["p", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"]),
             helper.make_node("Sigmoid", ["p"], ["s"])]
    m = _model(nodes, [_vi("x", [2, 4, 9, 9])], [_vi("y", [2, 4, 9, 9]), _vi("s", [2, 4, 9, 9])], [w])
    (r,), _ = _regions(m)
    assert r.describe() == "MaxPool -> Add -> Relu -> Sigmoid"
    assert r.inputs == ["x", "x"] and r.pool.extra_kinds == [0]  # the residual is laid out like the output
    assert set(r.outputs) == {"r", "s"}
    assert r.label == "MaxPool" and r.pool.op == "max"


def test_epilogue_stops_at_shape_change():
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("Mul", ["g", "scale"], ["m"]),  # per channel: joins
             helper.make_node("Add", ["m", "big"], ["y"])]  # broadcasts the pooled tensor up: does not join
    inits = [numpy_helper.from_array(np.ones((1, 6, 1, 1), np.float32), "scale"),
             numpy_helper.from_array(np.ones((1, 6, 4, 4), np.float32), "big")]
    m = _model(nodes, [_vi("x", [1, 6, 4, 4])], [_vi("y", [1, 6, 4, 4])], inits)
    (r,), _ = _regions(m)
    assert r.describe() == "GlobalAveragePool -> Mul" and r.outputs == ["m"]


def test_attributes_are_in_the_op_type():
    def one(**attrs):
        m = _model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [_vi("x", [1, 2, 8, 8])],
                   [_vi("y", None)])
        (r,), _ = _regions(m)
        return r.compute_op_type("t")

    base = one(kernel_shape=[3, 3])
    assert base == one(kernel_shape=[3, 3])
    others = [one(kernel_shape=[3, 3], strides=[2, 2]), one(kernel_shape=[3, 2]), one(kernel_shape=[3, 3], ceil_mode=1),
              one(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), one(kernel_shape=[3, 3], dilations=[2, 1]),
              one(kernel_shape=[3, 3], auto_pad="SAME_UPPER")]
    assert len({base, *others}) == 7


REJECTED = [
    ("Indices", helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]), [1, 2, 6, 6],
     [("y", [1, 2, 5, 5], F), ("i", [1, 2, 5, 5], TensorProto.INT64)], "Indices"),
    ("1-D", helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3]), [1, 2, 9], [("y", [1, 2, 7], F)], "2-D"),
    ("3-D", helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2, 2]), [1, 2, 4, 4, 4],
     [("y", [1, 2, 3, 3, 3], F)], "2-D"),
    ("double", helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2]), [1, 2, 6, 6],
     [("y", [1, 2, 5, 5], TensorProto.DOUBLE)], "float32"),
    # torch's export of an EfficientNet head: a global pool as a 1280 x 1280 window; unrolled, its build never ended
    ("huge-window", helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[1280, 1280], strides=[1280, 1280],
                                     ceil_mode=1), [1, 2, 7, 7], [("y", [1, 2, 1, 1], F)], "too large"),
    ("wide-stride", helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 40]), [1, 2, 6, 80],
     [("y", [1, 2, 5, 2], F)], "too large"),
]


@pytest.mark.parametrize("name,node,shape,outs,reason", REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected_pools_are_left_alone(tmp_path, name, node, shape, outs, reason):
    dtype = TensorProto.DOUBLE if name == "double" else F
    m = _model([node], [_vi("x", shape, dtype)], [_vi(n, s, t) for n, s, t in outs])
    src, out = os.path.join(tmp_path, "m.onnx"), os.path.join(tmp_path, "f.onnx")
    onnx.save(m, src)
    res = onnxopt.optimize(src, out, measure=False, skip_fusion=["elementwise"])
    assert not res.report["regions"]
    assert any(reason in r["reason"] for r in res.report["rejected"]), res.report["rejected"]
    assert [n.op_type for n in onnx.load(out).graph.node] == [node.op_type]


def test_unused_indices_output_still_fuses():
    m = _model([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])], [_vi("x", [1, 2, 6, 6])],
               [_vi("y", [1, 2, 5, 5])])
    (r,), _ = _regions(m)
    assert r.outputs == ["y"]


def _pipeline_model():
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], **MP),
             helper.make_node("Add", ["p", "res"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["q"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             helper.make_node("Clip", ["q", "lo", "hi"], ["c"]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(1.5, np.float32), "hi")]
    return _model(nodes, [_vi("x", ["N", 5, 27, 27]), _vi("res", ["N", 5, 14, 14])],
                  [_vi("y", ["N", 5, 1, 1]), _vi("c", ["N", 5, 7, 7])], inits)


def test_pipeline_with_and_without_library(tmp_path):
    m = _pipeline_model()
    src, out = os.path.join(tmp_path, "m.onnx"), os.path.join(tmp_path, "f.onnx")
    onnx.save(m, src)
    res = onnxopt.optimize(src, out, measure=False)
    assert sorted(r["ops"] for r in res.report["regions"]) == [
        "AveragePool -> Clip", "GlobalAveragePool -> Sigmoid", "MaxPool -> Add -> Relu"]
    fused = expand_sequences(onnx.load(out))
    assert all(n.domain == "onnxopt" for n in fused.graph.node) and len(fused.graph.node) == 3
    assert {f.name for f in fused.functions} == {n.op_type for n in fused.graph.node}
    rng = np.random.default_rng(0)
    names = ["y", "c"]
    for n in (1, 3):
        feeds = {"x": rng.standard_normal((n, 5, 27, 27)).astype(np.float32),
                 "res": rng.standard_normal((n, 5, 14, 14)).astype(np.float32)}
        want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(names, feeds)
        with warnings.catch_warnings():
            warnings.simplefilter("error", rt.LibraryNotUsedWarning)  # the library must really be used
            got_lib = rt.InferenceSession(out).run(names, feeds)
        got_fn = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(names, feeds)  # function bodies
        for a, b, c in zip(want, got_lib, got_fn):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-6)


def test_skip_fusion_pool(tmp_path):
    m = _pipeline_model()
    src, out = os.path.join(tmp_path, "m.onnx"), os.path.join(tmp_path, "f.onnx")
    onnx.save(m, src)
    res = onnxopt.optimize(src, out, measure=False, skip_fusion=["pool", "elementwise"])
    assert not res.report["regions"]
    assert [n.op_type for n in onnx.load(out).graph.node] == [n.op_type for n in m.graph.node]


def test_pools_without_compute_fusion(tmp_path):
    m = _pipeline_model()
    src, out = os.path.join(tmp_path, "m.onnx"), os.path.join(tmp_path, "f.onnx")
    onnx.save(m, src)
    res = onnxopt.optimize(src, out, measure=False, skip_fusion=["compute"])
    assert len(res.report["regions"]) == 3
    assert all(n.domain == "onnxopt" for n in onnx.load(out).graph.node)
