"""Plain Concats as our copy kernel (lanes 0: fusion/blocked_copy.py plain_concats, codegen/glue/copy_exec.c
cp_plain): the kernel against numpy over drawn ranks, axes and sizes; the region rule; and a DenseNet-style block
whose Concats (12 channels a layer, not whole vectors) keep its kernels in one sequence."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx_builders import assert_fused_answers, const, library_op_session, make_model
from onnxopt.codegen.copy.build import build_copy
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.blocked_copy import CopyParams, plain_concats
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.fusion.graph_index import GraphIndex
from onnxopt.fusion.region import EwProgram, Region, Value

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info
LANES = host_target().float32_lanes


def _concat_session(tmp_path, n_in, axis):
    names = [f"x{i}" for i in range(n_in)]
    region = Region("Copy", [], names, ["y"], EwProgram(inputs=[Value(x, "float32") for x in names], consts={},
                                                         ops=[], outputs=[]), [])
    region.params = CopyParams(lanes=0, factors=[(1, 1)] * n_in, axis=axis)
    region.op_type = "Copy_plain_test"
    obj, desc, _ = build_copy(region, host_target())
    lib = str(tmp_path / "concat.so")
    link_library([desc], [obj], host_target(), lib)
    return library_op_session(lib, region.op_type, names, ["y"])


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_kernel_matches_numpy_on_any_axis(tmp_path_factory, data):
    rank = data.draw(st.integers(1, 5))
    axis = data.draw(st.integers(0, rank - 1))
    n_in = data.draw(st.integers(1, 4))
    # Large enough sometimes (up to 2 x 40 x 40 x 40 floats) for the copy to be split over the threads.
    base = [data.draw(st.integers(1, 40 if rank <= 3 else 6)) for _ in range(rank)]
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    xs = []
    for _ in range(n_in):
        shape = list(base)
        shape[axis] = data.draw(st.integers(0, 7))  # an empty input too
        xs.append(rng.standard_normal(shape).astype(np.float32))
    sess = _concat_session(tmp_path_factory.mktemp("cat"), n_in, axis)
    got = sess.run(None, {f"x{i}": x for i, x in enumerate(xs)})[0]
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


def test_kernel_refuses_inputs_that_differ_off_the_axis(tmp_path):
    sess = _concat_session(tmp_path, 2, 1)
    with pytest.raises(Exception, match="differ off the axis"):
        sess.run(None, {"x0": np.zeros((1, 2, 3), np.float32), "x1": np.zeros((1, 2, 4), np.float32)})


def test_rule_takes_float_concats_with_known_shapes_only():
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=-1, name="neg_axis"),
             helper.make_node("Concat", ["i", "j"], ["k"], axis=0, name="ints"),
             helper.make_node("Concat", ["a", "u"], ["v"], axis=1, name="unknown")]
    g = helper.make_graph(nodes, "g", [vi("a", F, [2, 3]), vi("b", F, [2, 5]), vi("u", F, ["N", 4]),
                                       vi("i", TensorProto.INT64, [2]), vi("j", TensorProto.INT64, [3])],
                          [vi("c", F, [2, 8]), vi("k", TensorProto.INT64, [5]), vi("v", F, None)])
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    ew = ElementwiseRule(model)
    regions = plain_concats(GraphIndex(model.graph), ew.shape_of, ew.dtype_of, set())
    assert [r.node_names for r in regions] == [["neg_axis"]]
    assert regions[0].copy.axis == 1 and regions[0].copy.lanes == 0 and regions[0].copy.body == [nodes[0]]
    assert plain_concats(GraphIndex(model.graph), ew.shape_of, ew.dtype_of, {0}) == []  # claimed elsewhere


def dense_block(layers=3, k=12, c0=32, hw=12, batch=1):
    """Two stem convolutions (the tensor between them blocked), then BN-free DenseNet layers: conv 3x3 (k channels)
    -> Relu -> Concat(x, .), and a 1x1."""
    rng = np.random.default_rng(0)
    inits = [const("ws0", rng.standard_normal((c0, 8, 3, 3)).astype(np.float32) * 0.2),
             const("ws1", rng.standard_normal((c0, c0, 3, 3)).astype(np.float32) * 0.1)]
    nodes = [helper.make_node("Conv", ["x", "ws0"], ["s0"], pads=[1, 1, 1, 1], name="stem0"),
             helper.make_node("Relu", ["s0"], ["s0r"]),
             helper.make_node("Conv", ["s0r", "ws1"], ["s1"], pads=[1, 1, 1, 1], name="stem1")]
    x, c = "s1", c0
    for i in range(layers):
        inits.append(const(f"w{i}", rng.standard_normal((k, c, 3, 3)).astype(np.float32) * 0.2))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"t{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"t{i}"], [f"r{i}"]))
        nodes.append(helper.make_node("Concat", [x, f"r{i}"], [f"cat{i}"], axis=1, name=f"cat{i}"))
        x, c = f"cat{i}", c + k
    inits.append(const("wo", rng.standard_normal((16, c, 1, 1)).astype(np.float32) * 0.2))
    nodes.append(helper.make_node("Conv", [x, "wo"], ["y"], name="out"))
    return make_model(nodes, [vi("x", F, [batch, 8, hw, hw])], [vi("y", F, [batch, 16, hw, hw])], inits)


@pytest.mark.skipif(LANES < 8, reason="the blocked plan needs 8 or 16 float lanes")
@pytest.mark.parametrize("batch", [1, 2])
def test_dense_block_concats_are_ours_and_keep_one_sequence(tmp_path, batch):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    model = dense_block(batch=batch)
    onnx.save(model, src)
    res = onnxopt.optimize(src, out, measure=False, plan="compute-blocked")
    fused = onnx.load(out)
    cats = [e for e in res.report["regions"] if e["ops"] == "Concat"]
    assert sorted(n for e in cats for n in e["nodes"]) == ["cat0", "cat1", "cat2"]
    assert not any(n.op_type == "Concat" for n in fused.graph.node)
    assert [n.op_type.startswith("Sequence_") for n in fused.graph.node] == [True]
    assert all(n.op_type.startswith("Copy_") for n in expand_sequences(fused).graph.node if n.name.startswith("cat"))
    feeds = {"x": np.random.default_rng(1).standard_normal((batch, 8, 12, 12)).astype(np.float32)}
    assert_fused_answers(src, out, feeds)


def test_without_sequences_concats_stay_onnxruntimes(tmp_path):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(dense_block(), src)
    res = onnxopt.optimize(src, out, measure=False, plan="compute-blocked", sequences=False)
    assert not any(e["ops"] == "Concat" for e in res.report["regions"])
    assert sum(n.op_type == "Concat" for n in onnx.load(out).graph.node) == 3
