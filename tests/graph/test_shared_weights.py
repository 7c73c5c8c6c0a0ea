"""Big models analysed light and plan models that share one weights file (graph/large.py): the same answers as the
whole model gives, without copying or serializing its weights for each use."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnxopt.graph.large as large
from onnxopt.emit.model import build_fused_model
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.graph.large import DATA_ALIGN, STRIP_TENSOR_BYTES, SharedWeights, model_bytes

WIDTH = 160  # a 160 x 160 float32 weight: 100 KB, past STRIP_TENSOR_BYTES


def _model(symbolic: bool = False) -> onnx.ModelProto:
    """Two MatMuls on big weights, a small bias, and a Reshape whose shape is a small constant (shape inference needs
    its value): the parts a light copy must keep and the parts it may strip."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w2")
    bias = numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float32), "bias")
    shape = numpy_helper.from_array(np.array([-1, 2, WIDTH // 2], np.int64), "shape")
    batch = "batch" if symbolic else 4
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]),
             helper.make_node("Add", ["a", "bias"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("MatMul", ["c", "w2"], ["d"]),
             helper.make_node("Reshape", ["d", "shape"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [batch, WIDTH])],
                          [vi("y", TensorProto.FLOAT, None)], [w1, w2, bias, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(source, x):
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_model_bytes_is_exact_for_small_models_and_a_bound_for_big_ones(monkeypatch):
    m = _model()
    assert model_bytes(m) == m.ByteSize()
    monkeypatch.setattr(large, "ANALYSE_LIGHT_BYTES", 1000)  # take the part-by-part sum, as for a big model
    summed = model_bytes(m)
    assert m.ByteSize() <= summed <= m.ByteSize() + 1024


def test_models_built_on_shared_weights_run_like_the_whole_model(tmp_path):
    m = _model()
    shared = SharedWeights(m, str(tmp_path))
    data = tmp_path / "shared-weights.data"
    stubs = {t.name: t for t in shared.light.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert set(stubs) == {"w1", "w2"}  # the small bias and shape stay inline
    assert all(t.ByteSize() < STRIP_TENSOR_BYTES for t in shared.light.graph.initializer)
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in stubs.values()]
    assert all(o % DATA_ALIGN == 0 for o in offsets)
    assert os.path.getsize(data) < 2 * WIDTH * WIDTH * 4 + DATA_ALIGN
    x = np.random.default_rng(1).standard_normal((4, WIDTH)).astype(np.float32)
    want = _run(m.SerializeToString(), x)
    for k in range(2):  # two models share the one data file, each written small
        path = tmp_path / f"plan{k}.onnx"
        onnx.save_model(shared.light, str(path))
        assert os.path.getsize(path) < 4096
        np.testing.assert_array_equal(_run(str(path), x), want)
    assert np.array_equal(numpy_helper.to_array(m.graph.initializer[0]),
                          np.fromfile(data, np.float32, WIDTH * WIDTH, offset=offsets[0]).reshape(WIDTH, WIDTH))


def test_a_light_base_builds_function_bodies_from_the_whole_models_constants(tmp_path):
    """A fused BatchNormalization whose function body embeds its big parameters: built on the light copy, the plan
    model's function carries the parameters' data, not the light copy's
    stubs, and the fallback (no library) runs like the original."""
    c = 20_000  # each BatchNormalization parameter 80 KB, past STRIP_TENSOR_BYTES
    rng = np.random.default_rng(3)
    params = [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), n)
              for n in ("gamma", "beta", "mean", "var")]
    vi = helper.make_tensor_value_info
    shape = [1, c, 2, 2]
    g = helper.make_graph([helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["a"]),
                           helper.make_node("Relu", ["a"], ["y"])],
                          "g", [vi("x", TensorProto.FLOAT, shape)], [vi("y", TensorProto.FLOAT, shape)], params)
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    regions = ElementwiseRule(m).find_regions([])
    assert len(regions) == 1
    regions[0].compute_op_type("t")
    shared = SharedWeights(m, str(tmp_path))
    plan = build_fused_model(shared.light, regions, None, None, {}, [], constants=m)
    assert any(t.name == "gamma" and t.data_location == TensorProto.EXTERNAL for t in shared.light.graph.initializer)
    embedded = {n.output[0]: n.attribute[0].t for n in plan.functions[0].node if n.op_type == "Constant"}
    assert "gamma" in embedded and embedded["gamma"].data_location == TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(embedded["gamma"]), numpy_helper.to_array(params[0]))
    path = tmp_path / "plan.onnx"
    onnx.save_model(plan, str(path))
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(_run(str(path), x), _run(m.SerializeToString(), x))


def test_big_models_are_inferred_light_with_the_same_shapes(monkeypatch):
    m = _model(symbolic=True)
    from onnxopt.graph import infer

    whole = infer.infer(m)
    monkeypatch.setattr(infer, "ANALYSE_LIGHT_BYTES", 1000)
    light = infer.infer(m)
    key = lambda mp: sorted(v.SerializeToString() for v in mp.graph.value_info)  # noqa: E731
    assert key(light) == key(whole) and len(whole.graph.value_info) >= 4
    # the inferred model holds the whole weights, and the caller's model is not changed
    assert {t.name: t.data_location for t in light.graph.initializer} == {"w1": 0, "w2": 0, "bias": 0, "shape": 0}
    assert len(m.graph.value_info) == 0
