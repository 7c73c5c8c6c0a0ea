"""Models over protobuf's 2 GB limit, end to end: loaded with their external data, optimized without serializing
them whole (shape inference, plan models, checks and sessions all go through graph/large.py), written with
external data, and verified with and without the library."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
import onnxopt.runtime
from onnxopt.graph.large import LARGE_BYTES, is_large, light_copy, session_source

ROWS, WIDTH = 8_400_000, 64  # one float32 table of 2.15 GB


def _big_model(folder) -> onnx.ModelProto:
    """An embedding table past 2 GB (written straight to its external-data file: building it in memory would take
    protobuf past its limit), a lookup, then an elementwise chain (what gets fused) on the rows."""
    table = np.empty((ROWS, WIDTH), np.float32)
    table[:] = np.linspace(-1, 1, WIDTH, dtype=np.float32)
    table[:, 0] = np.arange(ROWS, dtype=np.float32) * 1e-6
    table.tofile(folder / "big.onnx.data")
    t = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[ROWS, WIDTH],
                    data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "big.onnx.data"), ("offset", "0"), ("length", str(table.nbytes))):
        t.external_data.add(key=k, value=v)
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("Mul", ["rows", "x"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Mul", ["m", "s"], ["y"])]
    g = helper.make_graph(nodes, "big", [vi("ids", TensorProto.INT64, [1, 16]),
                                         vi("x", TensorProto.FLOAT, [1, 16, WIDTH])],
                          [vi("y", TensorProto.FLOAT, [1, 16, WIDTH])], [t])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    onnx.save_model(_big_model(d), str(d / "big.onnx"))
    assert os.path.getsize(d / "big.onnx.data") > 2**31  # past what one protobuf message can hold
    return d


def test_light_copy_and_session_source_never_serialize_the_whole_model():
    small_table = numpy_helper.from_array(np.zeros((300, 300), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    g = helper.make_graph([helper.make_node("Reshape", ["w", "shape"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [small_table, shape])
    m = helper.make_model(g)
    light = light_copy(m, strip_above=1024)
    stripped = {t.name: t for t in light.graph.initializer}
    assert stripped["w"].data_location == TensorProto.EXTERNAL and list(stripped["w"].dims) == [300, 300]
    assert numpy_helper.to_array(stripped["shape"]).tolist() == [1, -1]  # small constants keep their values
    assert not is_large(m) and isinstance(session_source(m)[0], bytes) and LARGE_BYTES < 2**31


def test_a_model_past_2gb_optimizes_end_to_end(big):
    src, out = big / "big.onnx", big / "fused.onnx"
    before = {p: _sha(big / p) for p in ("big.onnx", "big.onnx.data")}
    res = onnxopt.optimize(str(src), str(out), threads=2, measure=False)
    assert res.report["input"]["external_data"] and res.report["fused_regions"] >= 1
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    assert {p: _sha(big / p) for p in before} == before  # the input and its data untouched
    assert os.path.getsize(out) < 1 << 20 and os.path.getsize(str(out) + ".data") > 2**31  # weights beside it
    rng = np.random.default_rng(0)
    feeds = {"ids": rng.integers(0, ROWS, (1, 16)).astype(np.int64),
             "x": rng.standard_normal((1, 16, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxopt.runtime.InferenceSession(str(out)).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
