"""GraphIndex: producers, consumers, and the leave-and-come-back check that keeps contracted regions acyclic."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from onnxopt.fusion.graph_index import GraphIndex

F32 = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def graph(nodes, inputs=("x",), outputs=("y",)):
    return helper.make_graph(nodes, "g", [vi(n, F32, [2]) for n in inputs], [vi(n, F32, [2]) for n in outputs])


def n(op, ins, outs, **kw):
    return helper.make_node(op, list(ins), list(outs), **kw)


def test_producer_consumers_successors():
    g = graph([n("Relu", ["x"], ["a"]), n("Neg", ["a"], ["b"]), n("Add", ["a", "b"], ["y"]),
               n("Split", ["y"], ["s1", ""], axis=0)], outputs=("y", "s1"))
    idx = GraphIndex(g)
    assert idx.producer == {"a": 0, "b": 1, "y": 2, "s1": 3}
    assert dict(idx.consumers) == {"x": [0], "a": [1, 2], "b": [2], "y": [3]}
    assert idx.successors(0) == {1, 2}
    assert idx.successors(1) == {2}
    assert idx.successors(3) == set()
    assert idx.graph_outputs == {"y", "s1"}
    assert idx.used_by_subgraphs == set()


def test_is_used_outside():
    then_g = helper.make_graph([n("Identity", ["b"], ["t"])], "then", [], [vi("t", F32, [2])])
    else_g = helper.make_graph([n("Identity", ["b"], ["e"])], "else", [], [vi("e", F32, [2])])
    g = helper.make_graph(
        [n("Relu", ["x"], ["a"]), n("Neg", ["a"], ["b"]), n("Exp", ["b"], ["c"]), n("Abs", ["a"], ["y"]),
         n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)],
        "g", [vi("x", F32, [2]), vi("cond", TensorProto.BOOL, [])],
        [vi("y", F32, [2]), vi("z", F32, [2]), vi("c", F32, [2])])
    idx = GraphIndex(g)
    assert idx.used_by_subgraphs == {"b"}
    assert idx.is_used_outside("a", {0, 1}) is True  # Abs reads it
    assert idx.is_used_outside("a", {0, 1, 3}) is False
    assert idx.is_used_outside("b", {1, 2}) is True  # read by the If body through outer scope
    assert idx.is_used_outside("c", {2}) is True  # a graph output
    assert idx.is_used_outside("y", {3}) is True
    assert idx.is_used_outside("nobody", {0}) is False


def test_chain_never_escapes():
    g = graph([n("Relu", ["x"], ["a"]), n("Neg", ["a"], ["b"]), n("Exp", ["b"], ["y"])])
    idx = GraphIndex(g)
    for group in ({0}, {1}, {2}, {0, 1}, {1, 2}, {0, 1, 2}):
        assert idx.escapes_and_returns(group) is False
    assert idx.escapes_and_returns({0, 2}) is True  # skipping the middle node goes out through it and back


def test_path_through_outside_node_comes_back():
    # 0 -> 1 -> 2 and 0 -> 2: contracting {0, 2} would make 1 both an input and an output of the new node
    g = graph([n("Relu", ["x"], ["a"]), n("Transpose", ["a"], ["t"]), n("Add", ["a", "t"], ["y"])])
    idx = GraphIndex(g)
    assert idx.escapes_and_returns({0, 2}) is True
    assert idx.escapes_and_returns({0, 1, 2}) is False
    assert idx.escapes_and_returns({0, 1}) is False
    assert idx.escapes_and_returns({1, 2}) is False


def test_long_detour_comes_back():
    g = graph([n("Relu", ["x"], ["a"]), n("Neg", ["a"], ["o1"]), n("Exp", ["o1"], ["o2"]), n("Abs", ["o2"], ["o3"]),
               n("Add", ["a", "o3"], ["y"])])
    idx = GraphIndex(g)
    assert idx.escapes_and_returns({0, 4}) is True
    assert idx.escapes_and_returns({0, 1, 4}) is True
    assert idx.escapes_and_returns({0, 1, 2, 3, 4}) is False


def test_paths_that_leave_and_never_return():
    # 0 feeds 2 (in the group) and an outside branch 1 -> 3 that ends in a graph output
    g = graph([n("Relu", ["x"], ["a"]), n("Neg", ["a"], ["side"]), n("Exp", ["a"], ["y"]),
               n("Abs", ["side"], ["z"])], outputs=("y", "z"))
    idx = GraphIndex(g)
    assert idx.escapes_and_returns({0, 2}) is False


def test_outside_node_after_the_group_is_not_a_return():
    g = graph([n("Relu", ["x"], ["a"]), n("Neg", ["a"], ["b"]), n("Add", ["a", "b"], ["c"]), n("Exp", ["c"], ["y"])])
    idx = GraphIndex(g)
    assert idx.escapes_and_returns({0, 1}) is False  # 2 and 3 lie after the group: nothing can come back
    assert idx.escapes_and_returns({0, 2}) is True  # through 1


def test_escape_between_independent_members():
    # {0, 3}: 0 -> 1 -> 2 -> 3 goes out and back even though 0 and 3 share no tensor
    g = graph([n("Relu", ["x"], ["a"]), n("Transpose", ["a"], ["b"]), n("Neg", ["b"], ["c"]),
               n("Exp", ["c"], ["y"])])
    idx = GraphIndex(g)
    assert idx.escapes_and_returns({0, 3}) is True


def test_index_on_model_graph():
    m = helper.make_model(graph([n("Relu", ["x"], ["y"])]))
    onnx.checker.check_model(m)
    idx = GraphIndex(m.graph)
    assert len(idx.nodes) == 1 and idx.nodes[0].op_type == "Relu"
