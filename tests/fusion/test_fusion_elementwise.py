"""ElementwiseRule: admission of nodes, grouping into regions, boundaries, constants and legality."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxopt.fusion.elementwise import MAX_INPUTS, ElementwiseRule

from onnx_builders import const, make_model  # noqa: E402

F32, I32, I64, BOOL, F16 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL, TensorProto.FLOAT16
vi = helper.make_tensor_value_info


def infer(m):
    return onnx.shape_inference.infer_shapes(m, data_prop=True)


def find(m, rejected=None):
    m = infer(m)
    return ElementwiseRule(m).find_regions(rejected if rejected is not None else [])


def rule_for(m):
    return ElementwiseRule(infer(m))


def node(rule, out):
    return next(n for n in rule.graph.node if out in n.output)


def hardswish_nodes(x="x", prefix="", three="three", zero="zero", six="six", out="y"):
    p = prefix
    return [
        helper.make_node("Add", [x, three], [p + "a"], name=p + "add"),
        helper.make_node("Clip", [p + "a", zero, six], [p + "c"], name=p + "clip"),
        helper.make_node("Mul", [x, p + "c"], [p + "m"], name=p + "mul"),
        helper.make_node("Div", [p + "m", six], [out], name=p + "div"),
    ]


def hardswish_consts(three="three", zero="zero", six="six"):
    return [const(three, 3.0), const(zero, 0.0), const(six, 6.0)]


def hardswish_model(shape=(1, 8, 4, 4)):
    return make_model(hardswish_nodes(), [vi("x", F32, list(shape))], [vi("y", F32, list(shape))],
                      hardswish_consts())


# ---------------------------------------------------------------- patterns


def test_hardswish_is_one_region_with_inlined_constants():
    regions = find(hardswish_model())
    assert len(regions) == 1
    r = regions[0]
    assert r.label == "Elementwise"
    assert [n.op_type for n in r.nodes] == ["Add", "Clip", "Mul", "Div"]
    assert r.inputs == ["x"]
    assert r.outputs == ["y"]
    assert r.shape == [1, 8, 4, 4]
    prog = r.program
    assert [v.name for v in prog.inputs] == ["x"] and prog.inputs[0].dtype == "float32"
    assert prog.consts == {"three": (3.0, "float32"), "zero": (0.0, "float32"), "six": (6.0, "float32")}
    assert [o.op for o in prog.ops] == ["Add", "Clip", "Mul", "Div"]
    assert prog.ops[0].args == ("x", "three")
    assert prog.ops[1].args == ("a", "zero", "six")
    assert prog.ops[3].args == ("m", "six")
    assert all(o.dtype == "float32" for o in prog.ops)
    assert [(v.name, v.dtype) for v in prog.outputs] == [("y", "float32")]
    assert prog.masks == [1]
    assert r.node_names == ["add", "clip", "mul", "div"]
    assert r.describe() == "Add -> Clip -> Mul -> Div"
    assert r.rejected is None and r.op_type == ""


def test_silu():
    m = make_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                   [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16])])
    (r,) = find(m)
    assert [n.op_type for n in r.nodes] == ["Sigmoid", "Mul"]
    assert r.inputs == ["x"] and r.outputs == ["y"]
    assert r.program.consts == {}
    assert r.program.ops[1].args == ("x", "s")


def test_gelu_erf():
    nodes = [
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["x", "a"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ]
    m = make_model(nodes, [vi("x", F32, ["B", 128])], [vi("y", F32, ["B", 128])],
                   [const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)])
    (r,) = find(m)
    assert [n.op_type for n in r.nodes] == ["Div", "Erf", "Add", "Mul", "Mul"]
    assert r.inputs == ["x"] and r.outputs == ["y"]
    assert set(r.program.consts) == {"sqrt2", "one", "half"}
    assert r.program.consts["sqrt2"][0] == pytest.approx(np.sqrt(2), rel=1e-6)
    assert r.shape == ["B", 128]


def test_non_scalar_initializer_is_a_runtime_input():
    nodes = [helper.make_node("Add", ["x", "bias"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [2, 8, 4, 4])], [vi("y", F32, [2, 8, 4, 4])],
                   [const("bias", np.ones((1, 8, 1, 1)))])
    (r,) = find(m)
    assert r.inputs == ["x", "bias"]
    assert r.program.consts == {}
    assert r.program.masks == [0b01]  # x contiguous inside, bias broadcast along H*W


def test_scalar_graph_input_is_not_inlined():
    nodes = [helper.make_node("Mul", ["x", "s"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4, 4]), vi("s", F32, [])], [vi("y", F32, [4, 4])])
    (r,) = find(m)
    assert r.inputs == ["x", "s"]
    assert r.program.consts == {}
    assert r.program.masks == [0b01]


def test_overridable_scalar_initializer_is_not_inlined():
    nodes = [helper.make_node("Mul", ["x", "s"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4, 4]), vi("s", F32, [])], [vi("y", F32, [4, 4])], [const("s", 2.0)])
    (r,) = find(m)
    assert r.inputs == ["x", "s"] and r.program.consts == {}


# ---------------------------------------------------------------- boundaries


def test_intermediate_graph_output_is_materialized():
    m = make_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                   [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16]), vi("s", F32, [2, 16])])
    (r,) = find(m)
    assert r.outputs == ["s", "y"]
    assert [v.name for v in r.program.outputs] == ["s", "y"]


def test_intermediate_used_by_non_elementwise_node_is_materialized():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0])]
    m = make_model(nodes, [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16]), vi("t", F32, [16, 2])])
    (r,) = find(m)
    assert r.outputs == ["s", "y"]


def test_unused_final_output_is_not_an_output():
    # m2 = Neg(y) is dead; the region {Sigmoid, Mul, Neg} writes only the used tensors
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("Neg", ["y"], ["dead"])]
    m = make_model(nodes, [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16])])
    (r,) = find(m)
    assert r.outputs == ["y"]


def test_region_without_used_output_is_rejected():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["dead"]),
             helper.make_node("Relu", ["x"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16])])
    rejected = []
    assert find(m, rejected) == []
    assert rejected and rejected[0]["reason"] == "no output is used"


def test_non_scalar_constant_counts_as_runtime_input():
    nodes = [helper.make_node("Add", ["c1", "c2"], ["a"]), helper.make_node("Neg", ["a"], ["n"]),
             helper.make_node("Add", ["x", "n"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [3])], [vi("y", F32, [3])],
                   [const("c1", [1, 2, 3]), const("c2", 4.0)])
    (r,) = find(m)
    assert r.describe() == "Add -> Neg -> Add"
    assert r.inputs == ["c1", "x"]
    assert r.program.consts == {"c2": (4.0, "float32")}


def test_constant_only_group_is_rejected_as_foldable():
    nodes = [helper.make_node("Neg", ["c2"], ["a"], name="neg"), helper.make_node("Exp", ["a"], ["b"], name="exp"),
             helper.make_node("Transpose", ["b"], ["t"], name="tr"), helper.make_node("Add", ["x", "t"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [])], [vi("y", F32, [])], [const("c2", 4.0)])
    rejected = []
    assert find(m, rejected) == []
    assert rejected == [{"nodes": ["neg", "exp"], "reason": "no runtime input (constant-foldable)"}]


def test_different_output_shapes_are_not_merged():
    nodes = [
        helper.make_node("Sigmoid", ["b"], ["sb"]),  # [8]
        helper.make_node("Relu", ["sb"], ["rb"]),  # [8]
        helper.make_node("Add", ["x", "rb"], ["a"]),  # [4, 8]
        helper.make_node("Mul", ["a", "x"], ["y"]),  # [4, 8]
    ]
    m = make_model(nodes, [vi("x", F32, [4, 8]), vi("b", F32, [8])], [vi("y", F32, [4, 8])])
    regions = find(m)
    assert sorted([n.op_type for n in r.nodes] for r in regions) == [["Add", "Mul"], ["Sigmoid", "Relu"]]
    rule = rule_for(m)
    for r in regions:
        shapes = {rule.shape_of(n.output[0]) for n in r.nodes}
        assert len(shapes) == 1
        assert list(shapes.pop()) == r.shape
    small = next(r for r in regions if r.nodes[0].op_type == "Sigmoid")
    big = next(r for r in regions if r.nodes[0].op_type == "Add")
    assert small.outputs == ["rb"] and small.shape == [8]
    assert big.inputs == ["x", "rb"] and big.shape == [4, 8]
    assert big.program.masks == [0b11]


def test_symbolic_dims_match_by_name():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Add", ["a", "z"], ["y"])]
    m = make_model(nodes, [vi("x", F32, ["N", 8]), vi("z", F32, ["M", 8])], [vi("y", F32, None)])
    # N vs M: the Add's output dim is unknown ('unk__'), so it is not admitted and nothing merges
    rule = rule_for(m)
    assert rule.admits(node(rule, "y")) == "output shape unknown"
    assert rule.find_regions([]) == []
    m = make_model(nodes, [vi("x", F32, ["N", 8]), vi("z", F32, ["N", 8])], [vi("y", F32, ["N", 8])])
    (r,) = find(m)
    assert r.shape == ["N", 8] and r.inputs == ["x", "z"]


def test_single_op_is_not_a_region():
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [4])], [vi("y", F32, [4])])
    assert find(m) == []
    # two elementwise ops separated by a non-elementwise one: two singletons, no region
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
             helper.make_node("Relu", ["t"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4, 4])], [vi("y", F32, [4, 4])])
    assert find(m) == []


def test_independent_chains_are_separate_regions():
    nodes = [helper.make_node("Relu", ["x1"], ["a1"]), helper.make_node("Neg", ["a1"], ["y1"]),
             helper.make_node("Relu", ["x2"], ["a2"]), helper.make_node("Neg", ["a2"], ["y2"])]
    m = make_model(nodes, [vi("x1", F32, [4]), vi("x2", F32, [4])], [vi("y1", F32, [4]), vi("y2", F32, [4])])
    regions = find(m)
    assert sorted(r.inputs[0] for r in regions) == ["x1", "x2"]
    assert all(len(r.nodes) == 2 for r in regions)


def test_diamond_is_one_region():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Tanh", ["a"], ["c"]), helper.make_node("Add", ["b", "c"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [3, 5])], [vi("y", F32, [3, 5])])
    (r,) = find(m)
    assert len(r.nodes) == 4 and r.inputs == ["x"] and r.outputs == ["y"]


def test_max_inputs_bounds_a_region():
    n_in = MAX_INPUTS + 4
    nodes, prev = [], "x0"
    for i in range(1, n_in):
        nodes.append(helper.make_node("Add", [prev, f"x{i}"], [f"s{i}"]))
        prev = f"s{i}"
    m = make_model(nodes, [vi(f"x{i}", F32, [8]) for i in range(n_in)], [vi(prev, F32, [8])])
    regions = find(m)
    assert regions
    for r in regions:
        assert len(r.inputs) <= MAX_INPUTS
    assert sum(len(r.nodes) for r in regions) <= len(nodes)


# ---------------------------------------------------------------- legality: no cycles


def _conv_sandwich():
    """x -> A=Relu -> Conv -> B=Add(conv, A's output): fusing A with B would make a cycle through the Conv."""
    w = np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="A"),
        helper.make_node("Conv", ["a", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "a"], ["y"], name="B"),
    ]
    return make_model(nodes, [vi("x", F32, [1, 2, 4, 4])], [vi("y", F32, [1, 2, 4, 4])], [const("w", w)])


def test_acyclicity_check_keeps_a_and_b_apart():
    m = _conv_sandwich()
    rule = rule_for(m)
    assert rule.admits(node(rule, "a")) is None and rule.admits(node(rule, "y")) is None
    assert rule.shape_of("a") == rule.shape_of("y")
    assert rule.index.escapes_and_returns({0, 2}) is True
    assert rule.index.escapes_and_returns({0}) is False
    assert rule.index.escapes_and_returns({2}) is False
    regions = rule.find_regions([])
    for r in regions:
        outs = {o for n in r.nodes for o in n.output}
        assert not {"a", "y"} <= outs
    assert regions == []


def test_acyclicity_with_longer_chains_keeps_legal_parts():
    w = np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["a0"]),
        helper.make_node("Neg", ["a0"], ["a"]),
        helper.make_node("Conv", ["a", "w"], ["c"]),
        helper.make_node("Add", ["c", "a"], ["b0"]),
        helper.make_node("Sigmoid", ["b0"], ["y"]),
    ]
    m = make_model(nodes, [vi("x", F32, [1, 2, 4, 4])], [vi("y", F32, [1, 2, 4, 4])], [const("w", w)])
    regions = find(m)
    got = sorted([n.op_type for n in r.nodes] for r in regions)
    assert got == [["Add", "Sigmoid"], ["Relu", "Neg"]]
    first = next(r for r in regions if r.nodes[0].op_type == "Relu")
    assert first.outputs == ["a"]  # used by the Conv and by the other region


def test_acyclicity_through_a_subgraph_reference():
    then_g = helper.make_graph([helper.make_node("Add", ["a", "a"], ["ob"])], "then", [], [vi("ob", F32, [4])])
    else_g = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["oe"])], "else", [], [vi("oe", F32, [4])])
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]),
             helper.make_node("If", ["cond"], ["i"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Mul", ["a", "i"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4]), vi("cond", BOOL, [])], [vi("y", F32, [4])])
    rule = rule_for(m)
    assert rule.shape_of("i") == (4,)
    assert rule.index.escapes_and_returns({0, 2}) is True
    assert rule.find_regions([]) == []


# ---------------------------------------------------------------- admission


def test_pow_constant_exponent_admitted():
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("Add", ["p", "x"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4])], [vi("y", F32, [4])], [const("two", 2.0)])
    rule = rule_for(m)
    assert rule.admits(node(rule, "p")) is None
    (r,) = rule.find_regions([])
    pw = r.program.ops[0]
    assert pw.op == "Pow" and pw.args == ("x",)
    assert pw.attr("exponent") == 2.0
    assert r.inputs == ["x"]


@pytest.mark.parametrize("exp_kind", ["graph_input", "vector_init", "computed"])
def test_pow_runtime_exponent_not_admitted(exp_kind):
    nodes = [helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Add", ["p", "x"], ["y"])]
    inputs, inits = [vi("x", F32, [4])], []
    if exp_kind == "graph_input":
        inputs.append(vi("e", F32, []))
    elif exp_kind == "vector_init":
        inits.append(const("e", [2.0, 2.0, 2.0, 2.0]))
    else:
        nodes.insert(0, helper.make_node("ReduceMax", ["x"], ["e"], keepdims=0))
    m = make_model(nodes, inputs, [vi("y", F32, [4])], inits)
    rule = rule_for(m)
    assert rule.admits(node(rule, "p")) == "Pow exponent is not a constant scalar"
    assert rule.find_regions([]) == []


def test_clip_opset6_attributes():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Clip", ["a"], ["y"], min=0.0, max=6.0)]
    m = make_model(nodes, [vi("x", F32, [4])], [vi("y", F32, [4])], opset=6)
    (r,) = find(m)
    clip = r.program.ops[1]
    assert clip.op == "Clip"
    assert clip.args == ("a", "y__clip1", "y__clip2")
    assert r.program.consts == {"y__clip1": (0.0, "float32"), "y__clip2": (6.0, "float32")}
    assert r.program.signature()  # canonical text works


def test_clip_opset13_inputs():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Clip", ["a", "lo", "hi"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4])], [vi("y", F32, [4])], [const("lo", -1.0), const("hi", 1.0)], opset=13)
    (r,) = find(m)
    assert r.program.ops[1].args == ("a", "lo", "hi")
    assert r.program.consts == {"lo": (-1.0, "float32"), "hi": (1.0, "float32")}
    assert r.inputs == ["x"]


def test_clip_opset13_runtime_scalar_bounds_admitted_vector_bounds_not():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Clip", ["a", "lo", "hi"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4]), vi("lo", F32, []), vi("hi", F32, [])], [vi("y", F32, [4])], opset=13)
    (r,) = find(m)
    assert r.inputs == ["x", "lo", "hi"]
    m = make_model(nodes, [vi("x", F32, [4]), vi("lo", F32, [1]), vi("hi", F32, [1])], [vi("y", F32, [4])],
                   opset=13)
    rule = rule_for(m)
    assert rule.admits(node(rule, "y")) == "Clip bounds are not scalars"


def test_clip_opset13_omitted_min():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Clip", ["a", "", "hi"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4])], [vi("y", F32, [4])], [const("hi", 1.0)], opset=13)
    (r,) = find(m)
    assert r.compute_op_type("t").startswith("Elementwise_")


def test_clip_opset6_only_min():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Clip", ["a"], ["y"], min=0.0)]
    m = make_model(nodes, [vi("x", F32, [4])], [vi("y", F32, [4])], opset=6)
    (r,) = find(m)
    assert r.compute_op_type("t").startswith("Elementwise_")


def test_where_with_bool_condition():
    nodes = [helper.make_node("Greater", ["x", "zero"], ["cond"]),
             helper.make_node("Mul", ["x", "slope"], ["neg"]),
             helper.make_node("Where", ["cond", "x", "neg"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [2, 3])], [vi("y", F32, [2, 3])], [const("zero", 0.0), const("slope", 0.1)])
    rule = rule_for(m)
    assert rule.dtype_of("cond") == "bool"
    assert rule.admits(node(rule, "y")) is None
    (r,) = rule.find_regions([])
    assert [o.op for o in r.program.ops] == ["Greater", "Mul", "Where"]
    assert r.program.ops[0].dtype == "bool"
    assert r.program.ops[2].args == ("cond", "x", "neg") and r.program.ops[2].dtype == "float32"
    assert r.inputs == ["x"]


def test_where_with_runtime_bool_condition_input():
    nodes = [helper.make_node("Where", ["c", "x", "z"], ["w"]), helper.make_node("Relu", ["w"], ["y"])]
    m = make_model(nodes, [vi("c", BOOL, [1, 3]), vi("x", F32, [2, 3]), vi("z", F32, [])], [vi("y", F32, [2, 3])])
    (r,) = find(m)
    assert r.inputs == ["c", "x", "z"]
    assert [v.dtype for v in r.program.inputs] == ["bool", "float32", "float32"]
    assert r.program.masks == [0b011]


def test_cast():
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=I32), helper.make_node("Add", ["i", "k"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [5])], [vi("y", I32, [5])], [const("k", 3, np.int32)])
    (r,) = find(m)
    cast = r.program.ops[0]
    assert cast.op == "Cast" and cast.dtype == "int32" and cast.attr("to") == I32
    assert r.program.ops[1].dtype == "int32"
    assert r.program.consts == {"k": (3, "int32")}


def test_cast_to_unsupported_dtype():
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=F16), helper.make_node("Cast", ["h"], ["y"], to=F32)]
    m = make_model(nodes, [vi("x", F32, [5])], [vi("y", F32, [5])])
    rule = rule_for(m)
    assert rule.admits(node(rule, "h")) == "Cast to an unsupported dtype"
    assert rule.admits(node(rule, "y")) == "dtype float16 not supported for Cast"


def test_integer_div_not_admitted():
    nodes = [helper.make_node("Div", ["x", "z"], ["d"]), helper.make_node("Add", ["d", "x"], ["y"])]
    m = make_model(nodes, [vi("x", I32, [4]), vi("z", I32, [4])], [vi("y", I32, [4])])
    rule = rule_for(m)
    assert rule.admits(node(rule, "d")) == "dtype int32 not supported for Div"
    assert rule.admits(node(rule, "y")) is None
    assert rule.find_regions([]) == []
    # float Div is admitted
    m = make_model(nodes, [vi("x", F32, [4]), vi("z", F32, [4])], [vi("y", F32, [4])])
    assert len(find(m)) == 1


def test_sigmoid_float64_not_admitted():
    m = make_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                   [vi("x", TensorProto.DOUBLE, [4])], [vi("y", TensorProto.DOUBLE, [4])])
    rule = rule_for(m)
    assert rule.admits(node(rule, "s")) == "dtype float64 not supported for Sigmoid"
    assert rule.admits(node(rule, "y")) is None


def test_unknown_shapes_not_admitted():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    m = make_model(nodes, [vi("x", F32, None)], [vi("y", F32, None)])  # rank unknown
    rule = rule_for(m)
    assert rule.admits(node(rule, "a")) == "output shape unknown"
    assert rule.find_regions([]) == []
    m = make_model(nodes, [vi("x", F32, [None, 4])], [vi("y", F32, [None, 4])])  # one dim unknown
    rule = rule_for(m)
    assert rule.admits(node(rule, "a")) == "output shape unknown"
    assert rule.find_regions([]) == []


def test_unk_dims_from_inference_not_admitted():
    # Reshape to a runtime shape: inference gives fresh 'unk__' dims
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["a"]),
             helper.make_node("Neg", ["a"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4, 4]), vi("s", I64, [2])], [vi("y", F32, None)])
    rule = rule_for(m)
    ti = rule.info.get("a")
    if ti is not None and ti.shape is not None:
        assert all(isinstance(d, str) and d.startswith("unk__") or d is None for d in ti.shape)
    assert rule.admits(node(rule, "a")) in ("output shape unknown", "dtype of a unknown")
    assert rule.find_regions([]) == []


def test_other_rejection_reasons():
    w = np.ones((1, 1, 1, 1), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Foo", ["r"], ["f"], domain="my.ops"),
             helper.make_node("Dropout", ["r"], ["d", "mask"]),
             helper.make_node("Gelu", ["r"], ["g"])]
    m = make_model(nodes, [vi("x", F32, [1, 1, 2, 2])],
                   [vi("f", F32, [1, 1, 2, 2]), vi("d", F32, [1, 1, 2, 2]), vi("g", F32, [1, 1, 2, 2])],
                   [const("w", w)], opset=20)
    m.opset_import.append(helper.make_opsetid("my.ops", 1))
    rule = rule_for(m)
    assert rule.admits(node(rule, "c")) == "not elementwise"
    assert rule.admits(node(rule, "r")) is None
    assert rule.admits(node(rule, "f")) == "custom domain"
    assert rule.admits(node(rule, "d")) == "not elementwise"
    assert rule.admits(node(rule, "g")) is None  # Gelu exists from opset 20
    (r,) = rule.find_regions([])
    assert [n.op_type for n in r.nodes] == ["Relu", "Gelu"]
    assert r.outputs == ["r", "g"]


def test_scalar_const_helper():
    nodes = [helper.make_node("Add", ["x", "s"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4])], [vi("y", F32, [4])],
                   [const("s", 2.5), const("s1", [7.0]), const("v", [1.0, 2.0]), const("i", 3, np.int64),
                    const("h", 1.0, np.float16)])
    rule = rule_for(m)
    assert rule.scalar_const("s") == (2.5, "float32")
    assert rule.scalar_const("s1") == (7.0, "float32")  # one element, any rank
    assert rule.scalar_const("v") is None
    assert rule.scalar_const("i") == (3, "int64")
    assert rule.scalar_const("h") is None  # float16 is not a supported dtype
    assert rule.scalar_const("x") is None


def test_find_regions_does_not_modify_the_model():
    m = infer(hardswish_model())
    before = m.SerializeToString()
    ElementwiseRule(m).find_regions([])
    assert m.SerializeToString() == before


def test_min_ops_can_be_lowered_to_single_ops():
    m = infer(make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [4])], [vi("y", F32, [4])]))
    assert ElementwiseRule(m).find_regions([]) == []
    (r,) = ElementwiseRule(m, min_ops=1).find_regions([])
    assert r.describe() == "Relu" and r.inputs == ["x"] and r.outputs == ["y"]
