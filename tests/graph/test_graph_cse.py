"""Common subexpression elimination (onnxopt/graph/cse.py): duplicate nodes become one, readers follow, graph
outputs and subgraph-read names are kept, nondeterministic ops are not merged, and the model computes the same."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxopt.graph.cse import eliminate_common_subexpressions

F32 = TensorProto.FLOAT
n = helper.make_node


def _model(nodes, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [1, 4, 5, 5])],
                          [helper.make_tensor_value_info(o, F32, None) for o in outputs], initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model):
    x = np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype(np.float32)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_repeated_relus_become_one_and_chains_merge_too():
    """Five Relus of one tensor (NASNet's stem) and the Sigmoids after two of them: one Relu, one Sigmoid."""
    nodes = [n("Relu", ["x"], [f"r{i}"], name=f"r{i}") for i in range(5)]
    nodes += [n("Sigmoid", ["r1"], ["s1"]), n("Sigmoid", ["r3"], ["s3"])]
    nodes += [n("Sum", ["r0", "r2", "r4", "s1", "s3"], ["y"])]
    model = _model(nodes, ["y"])
    want = _run(model)
    assert eliminate_common_subexpressions(model) == 5
    assert [m.op_type for m in model.graph.node] == ["Relu", "Sigmoid", "Sum"]
    assert list(model.graph.node[-1].input) == ["r0", "r0", "r0", "s1", "s1"]
    np.testing.assert_array_equal(_run(model)[0], want[0])


def test_attributes_and_input_order_count():
    nodes = [n("LeakyRelu", ["x"], ["a"], alpha=0.1), n("LeakyRelu", ["x"], ["b"], alpha=0.2),
             n("Sub", ["a", "b"], ["c"]), n("Sub", ["b", "a"], ["d"]), n("Add", ["c", "d"], ["y"])]
    model = _model(nodes, ["y"])
    assert eliminate_common_subexpressions(model) == 0


def test_graph_outputs_and_random_ops_are_kept():
    nodes = [n("Relu", ["x"], ["a"]), n("Relu", ["x"], ["y"]),  # y is a graph output: kept
             n("RandomNormalLike", ["x"], ["p"]), n("RandomNormalLike", ["x"], ["q"]), n("Add", ["p", "q"], ["z"])]
    model = _model(nodes, ["a", "y", "z"])
    assert eliminate_common_subexpressions(model) == 0
    assert len(model.graph.node) == 5


def test_a_name_a_subgraph_reads_is_kept():
    then = helper.make_graph([n("Identity", ["b"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F32, None)])
    other = helper.make_graph([n("Identity", ["a"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F32, None)])
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [n("Relu", ["x"], ["a"]), n("Relu", ["x"], ["b"]), n("If", ["cond"], ["y"], then_branch=then,
                                                                else_branch=other)]
    model = _model(nodes, ["y"], [cond])
    assert eliminate_common_subexpressions(model) == 0
    np.testing.assert_array_equal(_run(model)[0], np.maximum(_run(_model([n("Relu", ["x"], ["y"])], ["y"]))[0], 0))
