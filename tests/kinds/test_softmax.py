"""The softmax kind (onnxopt/kinds/softmax): which nodes it takes, and its kernel against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from kind_harness import fuse_kind
from onnx import TensorProto, helper

from onnxopt.codegen.target import host_target
from onnxopt.kinds import KINDS, kind_of
from onnxopt.kinds.softmax import KIND
from onnxopt.timing import make_session


def _model(shape, op="Softmax", axis=None, opset=18, dtype=TensorProto.FLOAT):
    x = helper.make_tensor_value_info("x", dtype, shape)
    y = helper.make_tensor_value_info("y", dtype, shape)
    attrs = {} if axis is None else {"axis": axis}
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="sm", **attrs)], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _fuse(model, tmp_path):
    fused, lib, _, ir_text = fuse_kind(KIND, model, tmp_path)
    return fused, lib, ir_text


def test_the_kind_is_registered():
    assert KIND in KINDS and KIND.name == "softmax"


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [[4, 1], [3, 7], [2, 5, 64], [2, 3, 17, 33], [1, 200], [5, 8]])
def test_matches_onnxruntime(tmp_path, op, shape):
    model = _model(shape, op)
    fused, lib, _ = _fuse(model, tmp_path)
    x = (np.random.default_rng(1).standard_normal(shape) * 4).astype(np.float32)
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    got = make_session(fused, 2, library=lib).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)
    # the function fallback: the same model without our library
    alone = make_session(fused, 1).run(None, {"x": x})[0]
    np.testing.assert_allclose(alone, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis", [
    ([1, 16, 4, 2100], 1),  # YOLOv8's DFL head at 320 pixels: one slice, its 8,400 columns over the threads
    ([2, 3, 5], 1),  # fewer columns than a vector: the masked tail alone
    ([3, 17, 2, 33], 1),  # 66 columns a slice: whole vectors and a tail
    ([7, 40, 9], 0),  # axis 0: one slice
    ([64, 50, 30], 1),  # many slices, split between tasks
    ([2, 5, 3, 300], -3),
])
def test_an_axis_that_is_not_the_last_matches_onnxruntime(tmp_path, op, shape, axis):
    """Reduced down its columns, no transpose: the kernel is the columns form, checked with and without the library."""
    model = _model(shape, op, axis=axis)
    regions = KIND.find(model, set(), [])
    assert len(regions) == 1 and regions[0].params.columns
    fused, lib, ir_text = _fuse(model, tmp_path)
    assert "_columns" in ir_text and "_rows" not in ir_text
    x = (np.random.default_rng(6).standard_normal(shape) * 5).astype(np.float32)
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    session = make_session(fused, 2, library=lib)
    got = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 if op == "LogSoftmax" else 2e-7)
    x2 = (np.random.default_rng(7).standard_normal(shape) * 5).astype(np.float32)  # every element rewritten
    np.testing.assert_allclose(session.run(None, {"x": x2})[0],
                               make_session(model, 1, optimization="none").run(None, {"x": x2})[0],
                               rtol=2e-6, atol=2e-6 if op == "LogSoftmax" else 2e-7)
    np.testing.assert_allclose(make_session(fused, 1).run(None, {"x": x})[0], want, rtol=1e-6, atol=1e-6)


def test_columns_with_masked_entries_and_dynamic_dims(tmp_path):
    model = _model(["batch", 6, "w"], axis=1)
    fused, lib, _ = _fuse(model, tmp_path)
    session = make_session(fused, 2, library=lib)
    ref = make_session(model, 1, optimization="none")
    for shape in ([1, 6, 1], [2, 6, 70], [3, 6, 4000]):
        x = (np.random.default_rng(8).standard_normal(shape) * 30).astype(np.float32)
        x[:, 2:4, ::3] = -np.inf
        x[..., 1::5] += 80.0
        got = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=2e-6, atol=1e-7)
        assert np.all(got[:, 2:4, ::3] == 0)


def test_masked_rows_and_large_values(tmp_path):
    """Attention masks: -inf and finfo.min entries give zeros; large logits do not overflow."""
    shape = [2, 4, 9, 40]
    model = _model(shape)
    fused, lib, _ = _fuse(model, tmp_path)
    x = (np.random.default_rng(2).standard_normal(shape) * 30).astype(np.float32)
    x[..., 30:] = -np.inf
    x[0, 0, :, 10:20] = np.finfo(np.float32).min
    x[1, 1] += 80.0
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    got = make_session(fused, 2, library=lib).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    assert np.all(got[..., 30:] == 0)


def test_rows_long_enough_to_split_over_threads(tmp_path):
    shape = [64, 1000]  # 64,000 floats: several tasks of whole rows
    model = _model(shape, "LogSoftmax")
    fused, lib, _ = _fuse(model, tmp_path)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    got = make_session(fused, 2, library=lib).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_dynamic_dims_are_read_at_run_time(tmp_path):
    model = _model(["batch", 3, "seq"])
    fused, lib, _ = _fuse(model, tmp_path)
    session = make_session(fused, 2, library=lib)
    ref = make_session(model, 1, optimization="none")
    for shape in ([1, 3, 5], [2, 3, 130], [4, 3, 1]):
        x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=2e-6,
                                   atol=2e-7)


def test_opset_11_coerces_to_2d_at_axis(tmp_path):
    """Before opset 13 a row is every dim from `axis` on."""
    shape = [2, 3, 4, 5]
    model = _model(shape, axis=1, opset=11)
    fused, lib, _ = _fuse(model, tmp_path)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    np.testing.assert_allclose(make_session(fused, 2, library=lib).run(None, {"x": x})[0], want, rtol=2e-6,
                               atol=2e-7)


def test_the_kernel_is_vector_code(tmp_path):
    _, _, ir_text = _fuse(_model([8, 64]), tmp_path)
    lanes = host_target().float32_lanes
    assert f"<{lanes} x float>" in ir_text


@pytest.mark.parametrize("level, lanes", [("x86-64-v3", 8), ("x86-64-v4", 16)])
def test_builds_for_every_x86_level(level, lanes):
    """Compiled (not run) for AVX2 and AVX-512, whatever this host has: 16-lane reductions and the AVX-512 exp."""
    from onnxopt.codegen.target import parse_target

    target = parse_target(level)
    for op in ("Softmax", "LogSoftmax"):
        r = KIND.find(_model([4, 40], op), set(), [])[0]
        r.compute_op_type(target.name + target.llvm_features)
        obj, desc, ir_text = KIND.build(r, target)
        assert f"<{lanes} x float>" in ir_text and len(obj) > 500 and desc.rows in ir_text
        r = KIND.find(_model([4, 40, 3], op, axis=1), set(), [])[0]
        r.compute_op_type(target.name + target.llvm_features)
        obj, desc, ir_text = KIND.build(r, target)
        assert desc.columns and f"<{lanes} x float>" in ir_text and desc.rows.endswith("_columns")


@pytest.mark.parametrize("model, reason", [
    (lambda: _model([2, 3], dtype=TensorProto.DOUBLE), "takes float32 only"),
    (lambda: _model([2, 3], axis=5), "axis 5 is outside a rank-2 input"),
])
def test_refusals_say_why(model, reason):
    rejected = []
    assert KIND.find(model(), set(), rejected) == []
    assert len(rejected) == 1 and reason in rejected[0]["reason"], rejected
    assert rejected[0]["nodes"] == ["sm"]


def test_claimed_nodes_are_left_alone():
    model = _model([2, 8])
    assert KIND.find(model, {0}, []) == []
    claimed = set()
    regions = KIND.find(model, claimed, [])
    assert claimed == {0} and kind_of(regions[0]) is KIND


def test_optimize_fuses_a_softmax_end_to_end(tmp_path):
    """Through the driver: found, built, linked, verified with and without the library, reported."""
    import onnxopt

    src = tmp_path / "m.onnx"
    onnx.save(_model([2, 4, 32, 48]), str(src))
    out = tmp_path / "fused.onnx"
    result = onnxopt.optimize(str(src), str(out), min_speedup=0.0, measure=False)
    ops = [r["ops"] for r in result.report["regions"]]
    assert ops == ["Softmax"], result.report["regions"]
    fused = onnx.load(str(out))
    assert [n.op_type.split("_")[0] for n in fused.graph.node] == ["softmax"]
    skipped = onnxopt.optimize(str(src), str(tmp_path / "plain.onnx"), min_speedup=0.0, measure=False,
                               skip_fusion=["softmax"])
    assert skipped.report["regions"] == []


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_the_c_backend_reduces_columns_too(tmp_path, op):
    import os

    from onnxopt.backends import backend_of, parse_target
    from onnxopt.codegen.glue.library import link_library
    from onnxopt.emit.model import build_fused_model

    target = parse_target("c")
    shape = [3, 9, 2, 70]
    model = _model(shape, op, axis=1)
    region = KIND.find(model, set(), [])[0]
    region.compute_op_type(target.name + target.llvm_features)
    obj, desc, source = backend_of(target).lower(KIND, region, target)
    assert desc.columns and "_columns(" in source
    lib = os.path.join(str(tmp_path), "softmax_c.so")
    sha = link_library([desc], [obj], target, lib)
    fused = build_fused_model(model, [region], os.path.basename(lib), sha, target.to_dict(), target.required_cpu_flags)
    x = (np.random.default_rng(9).standard_normal(shape) * 5).astype(np.float32)
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    np.testing.assert_allclose(make_session(fused, 2, library=lib).run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
