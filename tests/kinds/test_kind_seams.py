"""What every kind answers the same way (issue 45): its lowering per backend, whether it builds bfloat16, and its
schedule space, whose random valid point builds a kernel that gives the default point's answers."""

from __future__ import annotations

import os
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.backends import backend_of, parse_target
from onnxopt.codegen.glue.library import link_library
from onnxopt.emit.model import build_fused_model
from onnxopt.kinds import KINDS, all_kinds, kind_for
from onnxopt.kinds.schedule import ScheduleSpace
from onnxopt.timing import make_session

F = TensorProto.FLOAT


def test_every_kind_answers_for_bfloat16():
    """Each kind builds bfloat16 or says why not, as a sentence that names the kind and what it builds."""
    for kind in all_kinds():
        why = kind.dtype_refusal("bfloat16")
        if why is None:
            assert "bfloat16" in kind.dtypes
        else:
            assert kind.name in why and "bfloat16" in why, (kind.name, why)
        assert kind.dtypes and all(kind.dtype_refusal(d) is None for d in kind.dtypes), kind.name


def test_every_kind_is_found_once_with_its_folder_name():
    names = [k.name for k in all_kinds()]
    assert len(names) == len(set(names))
    for kind in KINDS:
        assert os.path.isdir(os.path.join(os.path.dirname(__import__("onnxopt.kinds").kinds.__file__), kind.name))


def test_the_c_backend_lowers_the_elementwise_and_row_kinds():
    c = backend_of(parse_target("c"))
    missing = set(c.families_not_lowered(all_kinds()))
    assert {"elementwise", "softmax", "layernorm"}.isdisjoint(missing)
    assert {"compute", "pool", "copy", "afusion", "horizontal", "attention", "qmatmul", "qconv"} <= missing
    assert backend_of(parse_target("native")).families_not_lowered(all_kinds()) == ()


def _model(nodes, inputs, outputs, inits=(), opset=18):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _elementwise():
    x = helper.make_tensor_value_info("x", F, [3, 5, 45])
    y = helper.make_tensor_value_info("y", F, [3, 5, 45])
    m = _model([helper.make_node("Mul", ["x", "x"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
                helper.make_node("Add", ["s", "x"], ["y"])], [x], [y])
    from onnxopt.fusion.elementwise import ElementwiseRule

    return m, ElementwiseRule(m).find_regions()


def _rows(op):
    x = helper.make_tensor_value_info("x", F, [3, 7, 50])
    r = helper.make_tensor_value_info("r", F, [3, 7, 50])
    y = helper.make_tensor_value_info("y", F, [3, 7, 50])
    if op == "softmax":
        m = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [x], [y])
    else:
        rng = np.random.default_rng(3)
        g = numpy_helper.from_array(rng.standard_normal(50).astype(np.float32), "g")
        b = numpy_helper.from_array(rng.standard_normal(50).astype(np.float32), "b")
        m = _model([helper.make_node("Add", ["x", "r"], ["a"]),
                    helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1)], [x, r], [y], [g, b])
    kind = next(k for k in KINDS if k.name == op)
    return m, kind.find(m, set(), [])


def _conv():
    rng = np.random.default_rng(4)
    x = helper.make_tensor_value_info("x", F, [1, 8, 13, 11])
    y = helper.make_tensor_value_info("y", F, [1, 24, 13, 11])
    w = numpy_helper.from_array(rng.standard_normal([24, 8, 3, 3]).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "bias")
    m = _model([helper.make_node("Conv", ["x", "w", "bias"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"])], [x], [y], [w, bias])
    from onnxopt.codegen.microkernel.registry import select
    from onnxopt.fusion.compute import ComputeRule

    return m, ComputeRule(m, select(parse_target("native")).tile.mi).find_regions(set(), [])


def _qmatmul():
    from int8_models import matmul_integer_model

    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, size=(64, 40)).astype(np.int8)
    m = onnx.shape_inference.infer_shapes(matmul_integer_model(64, 40, w, [2, 9]))
    kind = next(k for k in KINDS if k.name == "qmatmul")
    return m, kind.find(m, set(), [])


def _attention():
    from attention_models import attention_model

    m = onnx.shape_inference.infer_shapes(attention_model("bert", 1, 2, 37, 40, 16, "add", False))
    kind = next(k for k in KINDS if k.name == "attention")
    return m, kind.find(m, set(), [])


def _pool():
    x = helper.make_tensor_value_info("x", F, [1, 16, 40, 40])
    y = helper.make_tensor_value_info("y", F, [1, 16, 20, 20])
    m = _model([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["p"], ["y"])], [x], [y])
    from onnxopt.fusion.pool import PoolRule

    return m, PoolRule(m).find_regions(set(), [])


def _copy():
    a = helper.make_tensor_value_info("a", F, [1, 24, 30, 40])
    b = helper.make_tensor_value_info("b", F, [1, 40, 30, 40])
    y = helper.make_tensor_value_info("y", F, [1, 64, 30, 40])
    m = _model([helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], [a, b], [y])
    from onnxopt.fusion.blocked_copy import plain_concats
    from onnxopt.fusion.elementwise import ElementwiseRule

    rule = ElementwiseRule(m)
    return m, plain_concats(rule.index, rule.shape_of, rule.dtype_of, set())


MODELS = {"elementwise": _elementwise, "attention": _attention, "pool": _pool, "copy": _copy, "softmax": lambda: _rows("softmax"), "layernorm": lambda: _rows("layernorm"),
          "compute": _conv, "qmatmul": _qmatmul}


def _feeds(model, rng):
    feeds = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(t.elem_type)
        feeds[vi.name] = (rng.integers(0, 256, size=shape).astype(dt) if dt == np.uint8 else
                          rng.integers(-128, 128, size=shape).astype(dt) if dt == np.int8 else
                          rng.standard_normal(shape).astype(dt))
    return feeds


def _run_point(name, point, tmp_path, target):
    model, regions = MODELS[name]()
    assert len(regions) == 1, (name, regions)
    region = regions[0]
    region.compute_op_type(target.name + target.llvm_features)
    kind = kind_for(region)
    space = kind.space(region, target)
    if point is not None:
        space.apply(region, point)
    obj, desc, _ = backend_of(target).lower(kind, region, target)
    lib = os.path.join(str(tmp_path), f"{region.op_type}.so")
    sha = link_library([desc], [obj], target, lib)
    fused = build_fused_model(model, [region], os.path.basename(lib), sha, target.to_dict(),
                              target.required_cpu_flags)
    feeds = _feeds(model, np.random.default_rng(7))
    got = make_session(fused, 2, library=lib).run(None, feeds)
    want = make_session(model, 1, optimization="none").run(None, feeds)
    return region.op_type, got, want, space


def test_every_kind_lists_its_schedule_space():
    target = parse_target("native")
    for name, make in MODELS.items():
        model, regions = make()
        region = regions[0]
        region.compute_op_type(target.name)
        kind = kind_for(region)
        space = kind.space(region, target)
        assert isinstance(space, ScheduleSpace) and space.size() >= 2, (name, space)
        space.check(space.default())
        with pytest.raises(ValueError):
            space.check({**space.default(), "no_such_knob": 1})
    for kind in all_kinds():  # the others list theirs too, maybe with no knobs and a note that says why
        assert kind.space is not None


@pytest.mark.parametrize("name", list(MODELS))
def test_a_random_point_gives_the_default_points_answers(name, tmp_path):
    target = parse_target("native")
    default_type, default_out, want, space = _run_point(name, None, tmp_path, target)
    rng = random.Random(f"{name}-45")
    others = [p for p in space.points() if p != space.default()]
    point = rng.choice(others)
    point_type, point_out, _, _ = _run_point(name, point, tmp_path, target)
    assert point_type != default_type, point  # another kernel
    for a, b, w in zip(default_out, point_out, want):
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(b, w, rtol=1e-4, atol=1e-4)
        else:
            np.testing.assert_array_equal(b, a)
