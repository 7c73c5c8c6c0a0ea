"""Region and EwProgram: the name-independent signature that becomes the fused op type."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from onnx_builders import const, make_model  # noqa: E402

F32 = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def regions_of(m):
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    return ElementwiseRule(m).find_regions([])


def hardswish(x, p, three="three", zero="zero", six="six"):
    return [
        helper.make_node("Add", [x, three], [p + "a"]),
        helper.make_node("Clip", [p + "a", zero, six], [p + "c"]),
        helper.make_node("Mul", [x, p + "c"], [p + "m"]),
        helper.make_node("Div", [p + "m", six], [p + "y"]),
    ]


def two_hardswish_model():
    nodes = hardswish("x1", "first_") + hardswish("input_two", "q")
    return make_model(nodes, [vi("x1", F32, [2, 8]), vi("input_two", F32, [2, 8])],
                      [vi("first_y", F32, [2, 8]), vi("qy", F32, [2, 8])],
                      [const("three", 3.0), const("zero", 0.0), const("six", 6.0)])


def hardswish_model(x, p, three, zero, six, values=(3.0, 0.0, 6.0), dtype=np.float32, elem=F32):
    return make_model(hardswish(x, p, three, zero, six), [vi(x, elem, [2, 8])], [vi(p + "y", elem, [2, 8])],
                      [const(three, values[0], dtype), const(zero, values[1], dtype), const(six, values[2], dtype)])


def test_identical_regions_with_different_names_share_signature_and_op_type():
    r1, r2 = regions_of(two_hardswish_model())
    assert {o.out for o in r1.program.ops}.isdisjoint({o.out for o in r2.program.ops})
    assert r1.program.signature() == r2.program.signature()
    t1, t2 = r1.compute_op_type("t"), r2.compute_op_type("t")
    assert t1 == t2 == r1.op_type
    assert re.fullmatch(r"Elementwise_[0-9a-f]{16}", t1)


def test_signature_independent_of_names_across_models():
    (a,) = regions_of(hardswish_model("x", "", "three", "zero", "six"))
    # every tensor renamed; the constants keep the same relative name order (six < three < zero)
    (b,) = regions_of(hardswish_model("features", "blk7/", "k_three", "k_zero", "k_six"))
    assert a.program.signature() == b.program.signature()
    assert a.compute_op_type("cpu") == b.compute_op_type("cpu")


def test_signature_independent_of_constant_name_order():
    (a,) = regions_of(hardswish_model("x", "", "three", "zero", "six"))
    (b,) = regions_of(hardswish_model("x", "", "c3", "c0", "c6"))
    assert a.program.signature() == b.program.signature()


def test_signature_changes_with_constant_value():
    (a,) = regions_of(hardswish_model("x", "", "three", "zero", "six"))
    (b,) = regions_of(hardswish_model("x", "", "three", "zero", "six", values=(3.0, 0.0, 7.0)))
    assert a.program.signature() != b.program.signature()
    assert a.compute_op_type("t") != b.compute_op_type("t")


def test_signature_changes_with_dtype():
    (a,) = regions_of(hardswish_model("x", "", "three", "zero", "six"))
    (b,) = regions_of(hardswish_model("x", "", "three", "zero", "six", dtype=np.float64, elem=TensorProto.DOUBLE))
    assert a.program.signature() != b.program.signature()


def _leaky_model(alpha, name="x"):
    nodes = [helper.make_node("LeakyRelu", [name], ["l"], alpha=alpha), helper.make_node("Neg", ["l"], ["y"])]
    return make_model(nodes, [vi(name, F32, [4])], [vi("y", F32, [4])])


def test_signature_changes_with_attribute():
    (a,) = regions_of(_leaky_model(0.1))
    (b,) = regions_of(_leaky_model(0.2))
    (c,) = regions_of(_leaky_model(0.1, name="other"))
    assert a.program.ops[0].attr("alpha") == pytest.approx(0.1)
    assert a.program.signature() != b.program.signature()
    assert a.program.signature() == c.program.signature()
    assert a.compute_op_type("t") != b.compute_op_type("t")


def test_signature_changes_with_structure_and_masks():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    (same,) = regions_of(make_model(nodes, [vi("x", F32, [4, 8]), vi("b", F32, [4, 8])], [vi("y", F32, [4, 8])]))
    (bcast,) = regions_of(make_model(nodes, [vi("x", F32, [4, 8]), vi("b", F32, [4, 1])], [vi("y", F32, [4, 8])]))
    assert same.program.masks == [0b11] and bcast.program.masks == [0b01]
    assert same.program.signature() != bcast.program.signature()
    swapped = [helper.make_node("Add", ["b", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    (sw,) = regions_of(make_model(swapped, [vi("x", F32, [4, 8]), vi("b", F32, [4, 1])], [vi("y", F32, [4, 8])]))
    # inputs are ordered by first use, so Add(b, x) is the same program with inputs swapped: same mask pattern
    # reversed, different signature
    assert sw.inputs == ["b", "x"] and sw.program.masks == [0b10]
    assert sw.program.signature() != bcast.program.signature()
    sub = [helper.make_node("Sub", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    (s,) = regions_of(make_model(sub, [vi("x", F32, [4, 8]), vi("b", F32, [4, 8])], [vi("y", F32, [4, 8])]))
    assert s.program.signature() != same.program.signature()


def test_op_type_depends_on_target():
    (a,) = regions_of(hardswish_model("x", "", "three", "zero", "six"))
    t1 = a.compute_op_type("x86-64|skylake")
    t2 = a.compute_op_type("aarch64|neoverse")
    assert t1 != t2 and a.op_type == t2


def _prog(names):
    x, c, t, y = names
    return EwProgram(
        inputs=[Value(x, "float32")],
        consts={c: (2.0, "float32")},
        ops=[EwOp("Mul", (x, c), t, "float32"), EwOp("LeakyRelu", (t,), y, "float32", (("alpha", 0.01),))],
        outputs=[Value(t, "float32"), Value(y, "float32")],
        masks=[1],
    )


def test_signature_on_hand_built_programs():
    a = _prog(["x", "k", "t", "y"])
    b = _prog(["input:0", "model/const", "tmp_17", "out"])
    assert a.signature() == b.signature()
    text = b.signature()
    for name in ("input:0", "model/const", "tmp_17"):  # no tensor names inside
        assert name not in text
    c = _prog(["x", "k", "t", "y"])
    c.outputs = c.outputs[1:]
    assert c.signature() != a.signature()  # which intermediates are written is part of the program
    d = _prog(["x", "k", "t", "y"])
    d.consts["k"] = (2, "int64")
    assert d.signature() != a.signature()


def test_ewop_attr():
    op = EwOp("Cast", ("x",), "y", "int32", (("to", 6),))
    assert op.attr("to") == 6
    assert op.attr("missing") is None
    assert op.attr("missing", 3) == 3


def test_region_helpers():
    n1 = helper.make_node("Relu", ["x"], ["a"], name="relu1")
    n2 = helper.make_node("Neg", ["a"], ["y"])  # unnamed: falls back to its output
    r = Region("Elementwise", [n1, n2], ["x"], ["y"], _prog(["x", "k", "t", "y"]), [4])
    assert r.node_names == ["relu1", "y"]
    assert r.describe() == "Relu -> Neg"
    assert r.op_type == ""
    assert r.compute_op_type("t") == r.op_type
    assert r.rejected is None and r.measured == {}


def test_output_dependencies():
    prog = EwProgram(
        inputs=[Value("x", "float32"), Value("b", "float32"), Value("z", "float32")],
        consts={"k": (2.0, "float32")},
        ops=[EwOp("Mul", ("x", "k"), "t", "float32"),  # x
             EwOp("Add", ("t", "b"), "u", "float32"),  # x, b
             EwOp("Neg", ("z",), "v", "float32"),  # z
             EwOp("Sigmoid", ("k",), "w", "float32")],  # constants only
        outputs=[Value("t", "float32"), Value("u", "float32"), Value("v", "float32"), Value("w", "float32")],
    )
    assert prog.output_dependencies() == [0b001, 0b011, 0b100, 0]


def test_output_dependencies_from_rule():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "b"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4, 8]), vi("b", F32, [8])], [vi("y", F32, [4, 8]), vi("s", F32, [4, 8])])
    (r,) = regions_of(m)
    assert r.inputs == ["x", "b"] and r.outputs == ["s", "y"]
    assert r.program.output_dependencies() == [0b01, 0b11]
