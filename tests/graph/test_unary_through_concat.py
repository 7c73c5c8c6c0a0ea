"""A unary elementwise op that is a Concat's only reader moves in front of it (onnxopt/graph/unary_through_concat.py):
NASNet's cell output, the same numbers bit for bit, existing copies merged by CSE, and the cases left alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxopt.graph.cse import eliminate_common_subexpressions
from onnxopt.graph.unary_through_concat import push_unary_through_concats

F32 = TensorProto.FLOAT
n = helper.make_node


def _model(nodes, outputs=("y",), inits=()):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [2, 4, 6, 6])],
                          [helper.make_tensor_value_info(o, F32, None) for o in outputs], initializer=[w, *inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model):
    x = np.random.default_rng(0).standard_normal((2, 4, 6, 6)).astype(np.float32)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _cell():
    """left = Conv(x), c0 = Conv(x) + left, c1 = Conv(left); Concat(left, c0, c1, c0) -> Relu -> Conv.
    left is also read by c0 and c1; c0 twice by the Concat; and left already has a Relu of its own."""
    return [n("Conv", ["x", "w"], ["left"], pads=[1, 1, 1, 1]),
            n("Conv", ["x", "w", "bias"], ["a"], pads=[1, 1, 1, 1]), n("Add", ["a", "left"], ["c0"]),
            n("Conv", ["left", "w"], ["c1"], pads=[1, 1, 1, 1]),
            n("Relu", ["left"], ["left_relu"]), n("Sigmoid", ["left_relu"], ["side"]),
            n("Concat", ["left", "c0", "c1", "c0"], ["cat"], axis=1, name="cat"),
            n("Relu", ["cat"], ["h"], name="relu"),
            n("Conv", ["h", "w16"], ["y"])]


def test_a_cell_output_relu_moves_to_the_concat_inputs_and_merges_with_the_existing_one():
    w16 = numpy_helper.from_array(np.random.default_rng(4).standard_normal((3, 16, 1, 1)).astype(np.float32), "w16")
    bias = numpy_helper.from_array(np.full(4, 0.25, np.float32), "bias")
    model = _model(_cell(), outputs=("y", "side"), inits=[w16, bias])
    want = _run(model)
    assert push_unary_through_concats(model) == 1
    ops = [m.op_type for m in model.graph.node]
    assert ops.count("Relu") == 4  # the existing Relu(left), and one each for left, c0 and c1 (c0 once)
    assert eliminate_common_subexpressions(model) == 1  # the new Relu(left) is the old one
    cat = next(m for m in model.graph.node if m.op_type == "Concat")
    assert cat.output[0] == "h" and cat.name == "cat"
    assert list(cat.input) == ["left_relu", "c0__relu", "c1__relu", "c0__relu"]
    assert "cat" not in {x for m in model.graph.node for x in m.input}
    got = _run(model)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_clip_with_constant_bounds_moves_and_a_graph_output_keeps_its_name():
    lo = numpy_helper.from_array(np.array(-0.5, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(0.5, np.float32), "hi")
    nodes = [n("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]), n("Sigmoid", ["x"], ["b"]),
             n("Concat", ["a", "b"], ["cat"], axis=2), n("Clip", ["cat", "lo", "hi"], ["y"])]
    model = _model(nodes, inits=[lo, hi])
    want = _run(model)
    assert push_unary_through_concats(model) == 1
    assert [m.op_type for m in model.graph.node] == ["Conv", "Sigmoid", "Clip", "Clip", "Concat"]
    assert model.graph.node[-1].output[0] == "y"
    np.testing.assert_array_equal(_run(model)[0], want[0])


def test_what_is_left_alone():
    bounds = [numpy_helper.from_array(np.array(0.0, np.float32), "lo")]
    cases = {
        "the Concat read twice": ([n("Relu", ["x"], ["a"]), n("Sigmoid", ["x"], ["b"]),
                                   n("Concat", ["a", "b"], ["cat"], axis=1), n("Relu", ["cat"], ["y"]),
                                   n("Tanh", ["cat"], ["z"])], ("y", "z"), ()),
        "the Concat a graph output": ([n("Relu", ["x"], ["a"]), n("Sigmoid", ["x"], ["b"]),
                                       n("Concat", ["a", "b"], ["cat"], axis=1), n("Relu", ["cat"], ["y"])],
                                      ("y", "cat"), ()),
        "an input that is the graph's input": ([n("Relu", ["x"], ["a"]), n("Concat", ["a", "x"], ["cat"], axis=1),
                                                n("Relu", ["cat"], ["y"])], ("y",), ()),
        "an op with a second tensor": ([n("Relu", ["x"], ["a"]), n("Sigmoid", ["x"], ["b"]),
                                        n("Concat", ["a", "b"], ["cat"], axis=1), n("Add", ["cat", "cat"], ["y"])],
                                       ("y",), ()),
        "Clip with a computed bound": ([n("Relu", ["x"], ["a"]), n("Sigmoid", ["x"], ["b"]),
                                        n("ReduceMax", ["b"], ["m"], keepdims=0),
                                        n("Concat", ["a", "b"], ["cat"], axis=1), n("Clip", ["cat", "lo", "m"], ["y"])],
                                       ("y",), bounds),
    }
    for why, (nodes, outs, inits) in cases.items():
        model = _model(nodes, outputs=outs, inits=inits)
        before = model.SerializeToString()
        assert push_unary_through_concats(model) == 0, why
        assert model.SerializeToString() == before, why
