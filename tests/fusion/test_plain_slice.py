"""Slices as our copy kernel (fusion/blocked_copy.py plain_slices, codegen/glue/copy_exec.c cp_slice): the box rule
against onnxruntime over drawn ranks, axes, negative and out-of-range indices; the kernel against numpy; the glue's
refusal of other dims; and NASNet's factorized reduction, whose crop now stays in the sequence (and is written in
place in the Concat after it)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import assert_fused_answers, const, library_op_session, make_model
from onnxopt.codegen.copy.build import build_copy
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.blocked_copy import CopyParams, _slice_box, plain_slices
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.fusion.graph_index import GraphIndex
from onnxopt.fusion.region import EwProgram, Region, Value

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info
LANES = host_target().float32_lanes
BIG = 2**62  # "to the end", as exporters write it


def _slice_model(dims, starts, ends, axes, steps=None, opset=17):
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("starts", starts), ("ends", ends), ("axes", axes)) if v is not None]
    ins = ["x", "starts", "ends", "axes" if axes is not None else ""]
    if steps is not None:
        inits.append(numpy_helper.from_array(np.array(steps, np.int64), "steps"))
        ins.append("steps")
    node = helper.make_node("Slice", ins, ["y"], name="slice")
    g = helper.make_graph([node], "g", [vi("x", F, dims)], [vi("y", F, None)], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                                                               ir_version=8))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_box_matches_onnxruntime(data):
    rank = data.draw(st.integers(1, 4))
    dims = [data.draw(st.integers(1, 7)) for _ in range(rank)]
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                              unique_by=lambda a: a % rank))
    index = st.one_of(st.integers(-9, 9), st.sampled_from([BIG, -BIG]))
    starts = [data.draw(index) for _ in axes]
    ends = [data.draw(index) for _ in axes]
    model = _slice_model(dims, starts, ends, axes)
    x = np.arange(np.prod(dims), dtype=np.float32).reshape(dims)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    start, end = _slice_box(model.graph.node[0], dims, inits.get, 17)
    np.testing.assert_array_equal(x[tuple(slice(b, e) for b, e in zip(start, end))], want)


def test_box_refuses_steps_and_variable_arguments_and_reads_opset_9_attributes():
    model = _slice_model([4, 5], [1], [3], [1], steps=[2])
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert _slice_box(model.graph.node[0], [4, 5], inits.get, 17) is None
    assert _slice_box(model.graph.node[0], [4, 5], lambda name: None, 17) is None
    old = helper.make_node("Slice", ["x"], ["y"], starts=[1, -2], ends=[BIG, 5], axes=[0, -1])
    assert _slice_box(old, [4, 5], None, 9) == ([1, 3], [4, 5])


def _slice_session(tmp_path, dims, start, end):
    region = Region("Copy", [], ["x"], ["y"], EwProgram(inputs=[Value("x", "float32")], consts={}, ops=[],
                                                         outputs=[]), [])
    region.params = CopyParams(lanes=0, factors=[(1, 1)], slice=(list(dims), list(start), list(end)))
    region.op_type = "Copy_slice_test"
    obj, desc, _ = build_copy(region, host_target())
    lib = str(tmp_path / "slice.so")
    link_library([desc], [obj], host_target(), lib)
    return library_op_session(lib, region.op_type, ["x"], ["y"])


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_kernel_matches_numpy(tmp_path_factory, data):
    rank = data.draw(st.integers(1, 5))
    # Large enough sometimes (up to 64 x 64 x 64 floats) for the copy to be split over the threads.
    dims = [data.draw(st.integers(1, 64 if rank <= 3 else 6)) for _ in range(rank)]
    start = [data.draw(st.integers(0, d)) for d in dims]
    end = [data.draw(st.integers(b, d)) for b, d in zip(start, dims)]  # empty boxes too
    x = np.random.default_rng(rank).standard_normal(dims).astype(np.float32)
    got = _slice_session(tmp_path_factory.mktemp("slice"), dims, start, end).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x[tuple(slice(b, e) for b, e in zip(start, end))])


def test_kernel_refuses_other_dims(tmp_path):
    sess = _slice_session(tmp_path, [2, 6, 5], [0, 1, 1], [2, 6, 5])
    with pytest.raises(Exception, match="other dims than the ones it was built for"):
        sess.run(None, {"x": np.zeros((2, 6, 6), np.float32)})


def test_rule_takes_float_slices_with_constant_unit_steps_only():
    nodes = [helper.make_node("Slice", ["a", "s", "e"], ["b"], name="ok"),
             helper.make_node("Slice", ["a", "s", "e", "ax", "two"], ["c"], name="stepped"),
             helper.make_node("Slice", ["a", "s", "n"], ["d"], name="runtime_end")]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("s", [1]), ("e", [3]), ("ax", [0]), ("two", [2]))]
    g = helper.make_graph(nodes, "g", [vi("a", F, [5, 4]), vi("n", TensorProto.INT64, [1])],
                          [vi("b", F, None), vi("c", F, None), vi("d", F, None)], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    ew = ElementwiseRule(model)

    def const_of(name):
        return numpy_helper.to_array(ew.inits[name]) if name in ew.inits else None

    regions = plain_slices(GraphIndex(model.graph), ew.shape_of, ew.dtype_of, const_of, set(), 17)
    assert [r.node_names for r in regions] == [["ok"]]
    assert regions[0].copy.slice == ([5, 4], [1, 0], [3, 4]) and regions[0].inputs == ["a"]
    assert plain_slices(GraphIndex(model.graph), ew.shape_of, ew.dtype_of, const_of, {0}, 17) == []


def factorized_reduction(batch=1, c=16, hw=12):
    """NASNet's: a conv, then two paths into a Concat, the second shifted by a pixel
    (Pad -> Slice -> AveragePool 1x1/2 -> Conv 1x1), and a conv after the Concat. graph/subsample_conv.py turns the
    second path into a stride-2 1x1 convolution with padding and a crop of its output."""
    rng = np.random.default_rng(0)
    inits = [const("w0", rng.standard_normal((c, 8, 3, 3)).astype(np.float32) * 0.2),
             const("w1", rng.standard_normal((c // 2, c, 1, 1)).astype(np.float32) * 0.2),
             const("w2", rng.standard_normal((c // 2, c, 1, 1)).astype(np.float32) * 0.2),
             const("w3", rng.standard_normal((8, c, 3, 3)).astype(np.float32) * 0.2),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array([1, 1], np.int64), "s"),
             numpy_helper.from_array(np.array([BIG, BIG], np.int64), "e"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "ax")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h0"], pads=[1, 1, 1, 1], name="stem"),
             helper.make_node("Relu", ["h0"], ["h"]),
             helper.make_node("AveragePool", ["h"], ["p1"], kernel_shape=[1, 1], strides=[2, 2], name="pool1"),
             helper.make_node("Conv", ["p1", "w1"], ["y1"], name="path1"),
             helper.make_node("Pad", ["h", "pads"], ["padded"], mode="constant", name="pad"),
             helper.make_node("Slice", ["padded", "s", "e", "ax"], ["shifted"], name="shift"),
             helper.make_node("AveragePool", ["shifted"], ["p2"], kernel_shape=[1, 1], strides=[2, 2], name="pool2"),
             helper.make_node("Conv", ["p2", "w2"], ["y2"], name="path2"),
             helper.make_node("Concat", ["y1", "y2"], ["cat"], axis=1, name="cat"),
             helper.make_node("Conv", ["cat", "w3"], ["y"], pads=[1, 1, 1, 1], name="out")]
    return make_model(nodes, [vi("x", F, [batch, 8, hw, hw])], [vi("y", F, [batch, 8, hw // 2, hw // 2])], inits)


@pytest.mark.skipif(LANES < 8, reason="the blocked plan needs 8 or 16 float lanes")
@pytest.mark.parametrize("batch", [1, 2])
def test_factorized_reduction_crop_stays_in_the_sequence(tmp_path, batch):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(factorized_reduction(batch=batch), src)
    res = onnxopt.optimize(src, out, measure=False, plan="compute-blocked")
    assert res.report["rewrites"]["subsampling_into_convs"] > 0
    crops = [e for e in res.report["regions"] if e["ops"] == "Slice"]
    assert len(crops) == 1
    fused = onnx.load(out)
    assert [n.op_type.startswith("Sequence_") for n in fused.graph.node] == [True]
    assert any(n.op_type.startswith("Copy_") and n.name.startswith(crops[0]["nodes"][0])
               for n in expand_sequences(fused).graph.node)
    # At batch 1 the crop is written in place inside the Concat's output, with the other path's conv.
    assert res.report["sequences"][0]["concat_inputs_in_place"] == (2 if batch == 1 else 0)
    feeds = {"x": np.random.default_rng(1).standard_normal((batch, 8, 12, 12)).astype(np.float32)}
    assert_fused_answers(src, out, feeds)
