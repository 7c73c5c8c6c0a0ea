"""The writer carries every ModelProto field, inline and with external data: the fields are walked by reflection over
the proto's descriptor, so a field the fixture does not set (one a new onnx adds) fails the test until it does."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.graph.large import light_copy
from onnxopt.graph.load import save_model


def _every_field_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")  # 16 KB: external
    w.doc_string = "the weight"
    w.metadata_props.add(key="tensor-key", value="tensor-value")
    small = numpy_helper.from_array(np.array([1.5], np.float32), "b")
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([2.0], np.float32), "sp"),
                                       numpy_helper.from_array(np.array([3], np.int64), "sp_idx"), [4])
    node = helper.make_node("MatMul", ["x", "w"], ["y0"], name="mm", doc_string="a node")
    node2 = helper.make_node("Add", ["y0", "b"], ["y"], name="add")
    g = helper.make_graph([node, node2], "every-field", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], [w, small],
                          doc_string="the graph", value_info=[helper.make_tensor_value_info("y0", TensorProto.FLOAT,
                                                                                             [2, 64])],
                          sparse_initializer=[sparse])
    qa = g.quantization_annotation.add(tensor_name="y0")
    qa.quant_parameter_tensor_names.add(key="SCALE_TENSOR", value="b")
    g.metadata_props.add(key="graph-key", value="graph-value")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.domain", 1)],
                          producer_name="a producer", producer_version="9.9", domain="org.example",
                          model_version=42, doc_string="the model")
    m.ir_version = 10
    m.metadata_props.add(key="onnxopt.library", value="f.onnx.so")
    m.metadata_props.add(key="author", value="someone else")
    f = helper.make_function("custom.domain", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                             [helper.make_opsetid("", 17)], doc_string="a function")
    m.functions.append(f)
    ti = m.training_info.add()
    ti.algorithm.name = "training-algorithm"
    ti.initialization.name = "training-init"
    ti.update_binding.add(key="w", value="w_new")
    conf = m.configuration.add()
    conf.name = "device-config"
    conf.num_devices = 2
    return m


def test_the_fixture_sets_every_field():
    m = _every_field_model()
    for message in (m, m.graph):
        unset = {f.name for f in message.DESCRIPTOR.fields} - {f.name for f, _ in message.ListFields()}
        assert not unset, f"{type(message).__name__} fields the fixture does not set: {sorted(unset)}"


def _same_fields(got, want, skip=()):
    for fd in want.DESCRIPTOR.fields:
        if fd.name in skip:
            continue
        assert getattr(got, fd.name) == getattr(want, fd.name), fd.name


@pytest.mark.parametrize("external", [False, True])
def test_every_field_round_trips(tmp_path, external):
    m = _every_field_model()
    out = tmp_path / "f.onnx"
    written = save_model(m, str(out), external=external)
    assert written == ([str(out) + ".data"] if external else []) + [str(out)]
    back = onnx.load(str(out))
    _same_fields(back, m, skip=("graph",))
    _same_fields(back.graph, m.graph, skip=("initializer",))
    raw = onnx.load(str(out), load_external_data=False)
    assert (raw.graph.initializer[0].data_location == TensorProto.EXTERNAL) == external
    for a, b in zip(back.graph.initializer, m.graph.initializer):
        assert (a.name, a.doc_string, list(a.metadata_props)) == (b.name, b.doc_string, list(b.metadata_props))
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_light_copy_keeps_every_field_but_the_weights_data():
    m = _every_field_model()
    light = light_copy(m, strip_above=1024)
    _same_fields(light, m, skip=("graph",))
    _same_fields(light.graph, m.graph, skip=("initializer",))
    stub = light.graph.initializer[0]
    assert stub.data_location == TensorProto.EXTERNAL and not stub.raw_data
    assert (stub.name, list(stub.dims), stub.doc_string) == ("w", [64, 64], "the weight")


def test_an_optimized_external_data_model_keeps_its_metadata(tmp_path):
    """What lost transformers their kernels: a model with external data written without its metadata."""
    import onnxopt
    from onnxopt.emit.model import META_LIBRARY

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Mul", ["r", "r"], ["s"]), helper.make_node("Sigmoid", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 256])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    m.metadata_props.add(key="author", value="someone else")
    src = tmp_path / "m.onnx"
    onnx.save(m, str(src), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    out = tmp_path / "f.onnx"
    res = onnxopt.optimize(str(src), str(out), measure=False)
    assert os.path.exists(str(out) + ".data") and os.path.exists(str(out) + ".so")
    meta = {p.key: p.value for p in onnx.load(str(out), load_external_data=False).metadata_props}
    assert meta[META_LIBRARY] == "f.onnx.so" and meta["author"] == "someone else"
    assert res.report["verification"]["kernel_calls"] >= 1


def test_the_written_files_are_timed_as_a_user_loads_them(tmp_path):
    """With measurement on, the written model (loaded through onnxopt.runtime, its kernels counted) is timed against
    the original: the report's written_timing."""
    import onnxopt

    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Sigmoid", ["t"], ["s"]),
             helper.make_node("Mul", ["s", "x"], ["y"])]
    a = numpy_helper.from_array(rng.standard_normal((1, 32, 64, 64)).astype(np.float32), "a")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64, 64])], [a])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    res = onnxopt.optimize(m, str(tmp_path / "f.onnx"), min_speedup=0, threads=1, tune_budget=0, cost_cache=False)
    assert res.report["verification"]["kernel_calls"] >= 1
    timing = res.report["written_timing"]
    assert timing["loaded_by"] == "onnxopt.runtime" and timing["written_s"] > 0 and timing["speedup"] > 0
