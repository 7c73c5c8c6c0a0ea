"""Nearest Resizes of NCHW tensors as our copy kernel (fusion/blocked_copy.py plain_resizes, lanes 1;
codegen/glue/copy_exec.c): which coordinate modes read pixel floor(o / s), checked against onnxruntime for every
mode taken and refused; the kernel against onnxruntime's Resize, bit for bit; and an FPN-like model written by
onnxopt and loaded in a fresh process, where the Resize runs inside the sequence."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fresh_process import assert_written_model_runs
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import const, library_op_session, make_model
from onnxopt.codegen.copy.build import build_copy
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target

import onnxopt
from onnxopt.emit.sequence import expand_sequences
from onnxopt.fusion.blocked_copy import NEAREST_FLOOR_MODES, plain_resizes
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.fusion.graph_index import GraphIndex

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info
COORDINATES = ["asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners", "tf_half_pixel_for_nn"]
ROUNDINGS = ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"]


def _resize_model(dims, factors, coordinate="asymmetric", rounding="floor", mode="nearest", by="scales"):
    n, c, h, w = dims
    fh, fw = factors
    if by == "scales":
        inits = [numpy_helper.from_array(np.array([1, 1, fh, fw], np.float32), "scales")]
        ins = ["x", "", "scales"]
    else:
        inits = [numpy_helper.from_array(np.array([n, c, h * fh, w * fw], np.int64), "sizes")]
        ins = ["x", "", "", "sizes"]
    node = helper.make_node("Resize", ins, ["y"], name="up", mode=mode, coordinate_transformation_mode=coordinate,
                            nearest_mode=rounding)
    g = helper.make_graph([node], "g", [vi("x", F, dims)], [vi("y", F, None)], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                                               ir_version=8))


def _found(model):
    ew = ElementwiseRule(model)

    def const_of(name):
        return numpy_helper.to_array(ew.inits[name]) if name in ew.inits else None

    return plain_resizes(GraphIndex(model.graph), ew.shape_of, ew.dtype_of, const_of, set(), 17)


def _repeat(x, fh, fw):
    return x.repeat(fh, axis=2).repeat(fw, axis=3)


@pytest.mark.parametrize("coordinate", COORDINATES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_taken_exactly_where_onnxruntime_reads_floor(coordinate, rounding):
    """For each mode and factors 2, 3 and 4: taken iff onnxruntime's answer is each pixel repeated, so the table of
    modes is neither too wide nor (for these factors) too narrow."""
    x = np.arange(2 * 3 * 5 * 4, dtype=np.float32).reshape(2, 3, 5, 4)
    repeats_everywhere = True
    for factors in ((2, 2), (3, 3), (4, 2)):
        model = _resize_model(list(x.shape), factors, coordinate, rounding)
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
        repeats_everywhere &= bool(np.array_equal(got, _repeat(x, *factors)))
        taken = _found(model)
        assert bool(taken) == ((coordinate, rounding) in NEAREST_FLOOR_MODES), (coordinate, rounding, factors)
        if taken:
            assert taken[0].copy.lanes == 1 and taken[0].copy.factors == [factors]
    assert repeats_everywhere == ((coordinate, rounding) in NEAREST_FLOOR_MODES)


def test_refused_forms():
    assert _found(_resize_model([1, 2, 4, 4], (2, 2), mode="linear")) == []
    assert _found(_resize_model([1, 2, 4, 4], (2, 2), by="sizes"))  # constant sizes of whole factors: taken
    fractional = _resize_model([1, 2, 4, 4], (1.5, 1.5))
    assert _found(fractional) == []
    nodes = [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest", name="runtime_scales")]
    g = helper.make_graph(nodes, "g", [vi("x", F, [1, 2, 4, 4]), vi("s", F, [4])], [vi("y", F, None)])
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert _found(model) == []


def _kernel_session(tmp_path, factors):
    region = _found(_resize_model([1, 1, 2, 2], factors))[0]
    region.op_type = "Copy_resize_test"
    obj, desc, _ = build_copy(region, host_target())
    lib = str(tmp_path / "resize.so")
    link_library([desc], [obj], host_target(), lib)
    return library_op_session(lib, region.op_type, ["x"], ["y"])


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_kernel_repeats_every_pixel(tmp_path_factory, data):
    factors = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)))
    # Sometimes large enough (up to 2 x 48 x 64 x 64 floats out) to be split over the threads.
    dims = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 48)), data.draw(st.integers(1, 32)),
            data.draw(st.integers(1, 32))]
    x = np.random.default_rng(sum(dims)).standard_normal(dims).astype(np.float32)
    got = _kernel_session(tmp_path_factory.mktemp("resize"), factors).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, _repeat(x, *factors))


def fpn_model(c=16, hw=10):
    """PP-OCRv4's FPN in small: a low level upsampled by 2 (nearest, asymmetric, floor) and added to the next
    level, then a convolution. The convolutions stay NCHW (their 3 input channels are not blocked)."""
    rng = np.random.default_rng(0)
    inits = [const("w_low", rng.standard_normal((c, 3, 3, 3)).astype(np.float32) * 0.2),
             const("w_hi", rng.standard_normal((c, 3, 3, 3)).astype(np.float32) * 0.2),
             const("w_out", rng.standard_normal((8, c, 3, 3)).astype(np.float32) * 0.2),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Conv", ["lo", "w_low"], ["a"], pads=[1, 1, 1, 1], name="conv_low"),
             helper.make_node("Resize", ["a", "", "scales"], ["up"], mode="nearest", name="up",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["hi", "w_hi"], ["b"], pads=[1, 1, 1, 1], name="conv_hi"),
             helper.make_node("Add", ["up", "b"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w_out"], ["y"], pads=[1, 1, 1, 1], name="conv_out")]
    return make_model(nodes, [vi("lo", F, [1, 3, hw, hw]), vi("hi", F, [1, 3, 2 * hw, 2 * hw])],
                      [vi("y", F, [1, 8, 2 * hw, 2 * hw])], inits)


def test_an_fpn_resize_runs_in_the_sequence_of_the_written_model(tmp_path):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(fpn_model(), src)
    res = onnxopt.optimize(src, out, threads=2, cost_cache=False, min_speedup=0.0, plan="compute-blocked",
                           skip_fusion=["afusion", "horizontal"])
    entry = next(e for e in res.report["regions"] if e["ops"] == "Resize")
    fused = onnx.load(out)
    assert not any(n.op_type == "Resize" for n in fused.graph.node)
    copies = [n for n in expand_sequences(fused).graph.node if n.op_type.startswith("Copy_")]
    assert [n.op_type for n in copies] == [entry["op_type"]]
    rng = np.random.default_rng(1)
    feeds = {"lo": rng.standard_normal((1, 3, 10, 10)).astype(np.float32),
             "hi": rng.standard_normal((1, 3, 20, 20)).astype(np.float32)}
    assert_written_model_runs(src, out, feeds, entry["op_type"], tmp_path)
