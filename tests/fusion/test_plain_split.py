"""Splits as our copy kernel (fusion/blocked_copy.py split_copies and plain_splits, codegen/glue/copy_exec.c
cp_split): the rule's forms of the sizes against onnxruntime, the kernel against numpy over drawn ranks, axes and
sizes, the glue's refusal of another length, and YOLOv8's C2f block written by onnxopt and loaded in a fresh
process: its Split runs inside the one sequence, on blocked tensors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fresh_process import assert_written_model_runs
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import const, make_model
from onnxopt.codegen.copy.build import build_copy
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.blocked_copy import plain_splits
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.fusion.graph_index import GraphIndex

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info
LANES = host_target().float32_lanes


def _found(model, opset):
    ew = ElementwiseRule(model)

    def const_of(name):
        return numpy_helper.to_array(ew.inits[name]) if name in ew.inits else None

    return plain_splits(GraphIndex(model.graph), ew.shape_of, ew.dtype_of, const_of, set(), opset)


def _split_model(dims, axis, outputs, opset, sizes=None, how="input", dtype=F):
    inits, ins, attrs = [], ["x"], {"axis": axis}
    if how == "input":
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        ins.append("sizes")
    elif how == "attribute":
        attrs["split"] = sizes
    elif how == "num_outputs":
        attrs["num_outputs"] = outputs
    elif how == "runtime":
        ins.append("sizes")
    names = [f"y{k}" for k in range(outputs)]
    node = helper.make_node("Split", ins, names, name="split", **attrs)
    graph_in = [vi("x", dtype, dims)] + ([vi("sizes", TensorProto.INT64, [outputs])] if how == "runtime" else [])
    g = helper.make_graph([node], "g", graph_in, [vi(n, dtype, None) for n in names], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                                                               ir_version=8))


@pytest.mark.parametrize("how, opset, sizes", [("input", 17, [2, 3, 1]), ("attribute", 11, [1, 4, 1]),
                                               ("num_outputs", 18, [2, 2, 2]), ("equal", 17, [2, 2, 2])])
def test_the_sizes_in_every_form_are_onnxruntimes(how, opset, sizes):
    model = _split_model([2, 6, 3], 1, 3, opset, sizes if how in ("input", "attribute") else None,
                         how if how != "equal" else "none")
    regions = _found(model, opset)
    assert len(regions) == 1 and regions[0].copy.split == sizes and regions[0].copy.axis == 1
    x = np.arange(36, dtype=np.float32).reshape(2, 6, 3)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert [g.shape[1] for g in got] == sizes


def test_refused_forms():
    assert _found(_split_model([2, 6], 1, 2, 17, how="runtime"), 17) == []
    assert _found(_split_model([2, 6], 1, 2, 17, [3, 3], dtype=TensorProto.INT64), 17) == []
    model = _split_model([2, 6], 1, 2, 17, [3, 3])
    model.graph.node[0].output[1] = ""  # an omitted output
    assert _found(model, 17) == []
    assert _found(_split_model([2, 6], 1, 2, 17, [3, 3]), 17) != []


def _split_session(tmp_path, dims, axis, sizes):
    region = _found(_split_model(dims, axis, len(sizes), 17, sizes), 17)[0]
    region.op_type = "Copy_split_test"
    obj, desc, _ = build_copy(region, host_target())
    lib = str(tmp_path / "split.so")
    link_library([desc], [obj], host_target(), lib)
    names = [f"y{k}" for k in range(len(sizes))]
    node = helper.make_node(region.op_type, ["x"], names, domain="onnxopt")
    model = helper.make_model(helper.make_graph([node], "g", [vi("x", F, None)], [vi(n, F, None) for n in names]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxopt", 1)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(lib)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_kernel_matches_numpy(tmp_path_factory, data):
    rank = data.draw(st.integers(1, 4))
    # Sometimes large enough (up to 64 x 64 x 64 floats) for the copy to be split over the threads.
    dims = [data.draw(st.integers(1, 64 if rank <= 3 else 8)) for _ in range(rank)]
    axis = data.draw(st.integers(0, rank - 1))
    dims[axis] = max(dims[axis], 2)
    cuts = sorted(data.draw(st.sets(st.integers(1, dims[axis] - 1), min_size=1, max_size=min(5, dims[axis] - 1))))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [dims[axis]])]
    x = np.random.default_rng(rank).standard_normal(dims).astype(np.float32)
    got = _split_session(tmp_path_factory.mktemp("split"), dims, axis, sizes).run(None, {"x": x})
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_kernel_refuses_another_length(tmp_path):
    sess = _split_session(tmp_path, [2, 6, 5], 1, [2, 4])
    with pytest.raises(Exception, match="another length along its axis"):
        sess.run(None, {"x": np.zeros((2, 7, 5), np.float32)})


def c2f_model(c=32, hw=12):
    """YOLOv8's C2f block: a 1x1 convolution, its output split in two halves, a bottleneck on the second half, and
    the halves and the bottleneck's output concatenated into a 1x1 convolution."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    h = c // 2
    inits = [const("w1", w(c, 8, 1, 1)), const("wb1", w(h, h, 3, 3)), const("wb2", w(h, h, 3, 3)),
             const("w2", w(16, c + h, 1, 1)), numpy_helper.from_array(np.array([h, h], np.int64), "halves")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="cv1"),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Split", ["ar", "halves"], ["s0", "s1"], axis=1, name="split"),
             helper.make_node("Conv", ["s1", "wb1"], ["b"], pads=[1, 1, 1, 1], name="m_cv1"),
             helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Conv", ["br", "wb2"], ["b2"], pads=[1, 1, 1, 1], name="m_cv2"),
             helper.make_node("Relu", ["b2"], ["b2r"]),
             helper.make_node("Add", ["s1", "b2r"], ["m"]),
             helper.make_node("Concat", ["s0", "s1", "m"], ["cat"], axis=1, name="cat"),
             helper.make_node("Conv", ["cat", "w2"], ["y"], name="cv2")]
    return make_model(nodes, [vi("x", F, [1, 8, hw, hw])], [vi("y", F, [1, 16, hw, hw])], inits)


@pytest.mark.skipif(LANES < 8, reason="the blocked plan needs 8 or 16 float lanes")
def test_a_c2f_split_runs_in_the_one_sequence_of_the_written_model(tmp_path):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(c2f_model(), src)
    res = onnxopt.optimize(src, out, threads=2, cost_cache=False, min_speedup=0.0, plan="compute-blocked",
                           skip_fusion=["afusion", "horizontal"])
    entry = next(e for e in res.report["regions"] if e["ops"] == "Split")
    assert entry["layout"] == "blocked->blocked"
    fused = onnx.load(out)
    assert [n.op_type.startswith("Sequence_") for n in fused.graph.node] == [True]
    assert entry["op_type"] in [n.op_type for n in expand_sequences(fused).graph.node]
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    assert_written_model_runs(src, out, {"x": x}, entry["op_type"], tmp_path)
