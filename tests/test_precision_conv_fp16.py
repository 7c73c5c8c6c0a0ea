"""`--precision fp16` for convolutions (issue 46, item 5). Where no convolution tiles run float16 (every target
without AMX-FP16: tests/codegen/test_amx_fp16_conv.py has those), a convolution keeps its float32 kernel and its
weights are stored as float16 (fusion/compute.py `store_weights_f16`, emit/model.py): rounded at build time,
written once as float16 with a Cast outside the op, which onnxruntime's constant folding turns into float32 when a
session loads the model. The written files run by the public loader in a fresh process, their kernels counted,
against the float32 original at the low-precision tolerance and, tightly, against the same convolutions in float64
with the weights rounded to float16; AVX2 (8 lanes) and AVX-512 (16) targets; the Casts folded at load; the function
bodies without the library; what stays float32 and why."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fresh_process import run_written
from onnx import TensorProto, helper, numpy_helper
from test_precision_conv import LAYERS, chain, conv64

import onnxopt
from onnxopt.codegen.target import parse_target
from onnxopt.verify import LOW_PRECISION_TOLERANCE, compare

FAST = {"measure": False, "threads": 2, "cost_cache": False, "tune_budget": 0}
HOST = parse_target("native")
TARGETS = [pytest.param("x86-64-v3", id="avx2"),
           pytest.param("x86-64-v4", id="avx512", marks=pytest.mark.skipif(
               not HOST.has("avx512f"), reason="this CPU has no AVX-512"))]


def reference_f16(params, x):
    """The chain in float64 with every convolution's weights rounded to float16 (the input as it is)."""
    h = x[0].astype(np.float64)
    for w, b, s, p, d in params:
        w16 = w.astype(np.float16).astype(np.float64)
        h = np.maximum(conv64(h, w16, b.astype(np.float64), s, p, d), 0)
    return h[None]


@pytest.fixture(scope="module", params=TARGETS)
def written(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("conv_fp16")
    model, params = chain()
    src = str(d / "chain.onnx")
    onnx.save(model, src)
    (d / "w").mkdir()
    out = str(d / "w" / "chain.onnx")
    res = onnxopt.optimize(src, out, precision="fp16", plan="compute-blocked", target=request.param, **FAST)
    x = np.random.default_rng(1).standard_normal((1, 3, 40, 48)).astype(np.float32)
    return {"src": src, "out": out, "res": res, "params": params, "x": x, "dir": d}


def test_fp16_convolutions_run_in_a_fresh_process(written):
    res, out = written["res"], written["out"]
    p = res.report["precision"]
    assert p["written"]["precision"] == "fp16"
    # every convolution, the first (reading the NCHW image) too: their kernels are the float32 ones
    lowered = {n for names in p["lowered"] for n in names}
    assert {name for name, *_ in LAYERS} <= lowered, p
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    got, loader = run_written(out, written["x"], written["dir"])
    assert loader["precision"] == "fp16"
    assert sum(loader["calls"].values()) >= 1  # the kernels ran, not the function bodies
    want = ort.InferenceSession(written["src"], providers=["CPUExecutionProvider"]).run(None, {"x": written["x"]})[0]
    assert all(c.ok for c in compare(["y"], [want], [got], LOW_PRECISION_TOLERANCE))
    scale = float(np.max(np.abs(want)))
    assert np.max(np.abs(got - want)) > 1e-6 * scale  # the rounded weights, not float32 in disguise
    # against the same arithmetic in float64: float16 weights, float32 inputs, exact sums
    exact = reference_f16(written["params"], written["x"])
    assert np.max(np.abs(got - exact)) < 2e-5 * scale, np.max(np.abs(got - exact)) / scale


def test_weights_stored_once_as_float16_widened_by_a_cast_that_onnxruntime_folds(written):
    m = onnx.load(written["out"])
    f16 = {t.name: t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT16}
    assert len(f16) == len(LAYERS) and all(n.endswith("__float16") for n in f16)
    casts = [n for n in m.graph.node if n.op_type == "Cast" and n.input[0] in f16]
    assert len(casts) == len(LAYERS)
    # no float32 copy of the weights: the Casts' outputs are not initializers
    assert not {c.output[0] for c in casts} & {t.name for t in m.graph.initializer}
    # the kernels read float32: the Casts are folded into float32 constants when a session loads the model
    lib = written["out"] + ".so"
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(written["dir"] / "optimized.onnx")
    ort.InferenceSession(written["out"], so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(written["dir"] / "optimized.onnx"))
    assert not [n for n in optimized.graph.node if n.op_type == "Cast"]
    # the function bodies, run without the library, multiply the same float16 weights
    bodies = ort.InferenceSession(written["out"], providers=["CPUExecutionProvider"]).run(None, {"x": written["x"]})[0]
    exact = reference_f16(written["params"], written["x"])
    assert np.max(np.abs(bodies - exact)) < 2e-5 * float(np.max(np.abs(exact)))


def _two_convs(w, group=1):
    """A plain 3x3 convolution, then one with weights `w` (and `group`), each with a Relu."""
    oc, ic = w.shape[0], w.shape[1] * group
    w0 = (np.random.default_rng(1).standard_normal((ic, 16, 3, 3)) / 12).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c0"], ["r0"]),
         helper.make_node("Conv", ["r0", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oc, 20, 20])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _build_two(model, tmp_path):
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "w" / "m.onnx")
    onnx.save(model, src)
    (tmp_path / "w").mkdir()
    return onnxopt.optimize(src, out, precision="fp16", plan="compute-blocked", target="x86-64-v3", **FAST), out


def test_a_weight_past_65504_keeps_its_convolution_float32_and_says_why(tmp_path):
    w = np.random.default_rng(0).standard_normal((32, 32, 3, 3)).astype(np.float32)
    w[3, 2, 1, 1] = 70000.0
    res, out = _build_two(_two_convs(w), tmp_path)
    p = res.report["precision"]
    assert p["lowered"] == [["c0", "r0"]]  # the first convolution's weights are float16, the second's float32
    assert [e["nodes"][0] for e in p["float32_regions"] if "65504" in e["reason"]] == ["c"], p["float32_regions"]
    assert sum(t.data_type == TensorProto.FLOAT16 for t in onnx.load(out).graph.initializer) == 1


def test_depthwise_and_grouped_convolutions_store_float16_too(tmp_path):
    """Their float32 kernels are kept as any convolution's: only the file's weights change."""
    rng = np.random.default_rng(0)
    model = _two_convs(rng.standard_normal((32, 1, 3, 3)).astype(np.float32), group=32)
    res, out = _build_two(model, tmp_path)
    assert sorted(res.report["precision"]["lowered"]) == [["c", "y"], ["c0", "r0"]]
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path)
    assert sum(loader["calls"].values()) >= 1
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert all(c.ok for c in compare(["y"], [want], [got], LOW_PRECISION_TOLERANCE))


def test_the_winograd_kernel_stores_its_transformed_weights_as_float16():
    """The Winograd search (driver/kernels.py) may give a float16-stored convolution its Winograd kernel: the
    transformed weights are rounded to float16 values in their turn, and the Cast outside the op still widens them."""
    from fusion.test_layout import LANES, NI, regions_of

    from onnxopt.fusion import winograd
    from onnxopt.fusion.compute import store_weights_f16

    model, _ = chain()
    regions, _ = regions_of(model)
    convs = [r for r in regions.values() if winograd.applies(r) is None]
    assert convs, "no convolution the Winograd kernel takes"
    r = convs[0]
    assert store_weights_f16(r) is None and r.compute.attrs.stored_dtype == "float16"
    w = winograd.to_winograd(r, 2, LANES, NI)
    assert w.compute.attrs.stored_dtype == "float16" and w.compute.attrs.winograd == 2
    packed = numpy_helper.to_array(next(t for t in w.compute.initializers if t.name == w.inputs[1]))
    np.testing.assert_array_equal(packed, packed.astype(np.float16).astype(np.float32))


def test_a_model_that_amplifies_the_rounding_keeps_its_costliest_regions_float32(tmp_path):
    """fp16's regions are chosen as auto's are (driver/precision.py choose_auto, FP16_BUDGET): the difference of two
    near-equal convolutions magnifies float16's rounding of everything before it, so only some regions keep float16
    weights, the others stay float32 and say why, and the written model, run as a user runs it, is within the
    fixed low-precision tolerance."""
    from onnxopt.driver.precision import FP16_BUDGET

    model, _ = chain()
    g, rng = model.graph, np.random.default_rng(3)
    wa = (rng.standard_normal((16, 64, 3, 3)) / 24).astype(np.float32)
    wb = (wa * (1 + 0.01 * rng.standard_normal(wa.shape))).astype(np.float32)
    g.initializer.extend([numpy_helper.from_array(wa, "wa"), numpy_helper.from_array(wb, "wb")])
    g.node.extend([helper.make_node("Conv", ["y", "wa"], ["ya"], kernel_shape=[3, 3], pads=[1] * 4, name="ca"),
                   helper.make_node("Conv", ["y", "wb"], ["yb"], kernel_shape=[3, 3], pads=[1] * 4, name="cb"),
                   helper.make_node("Sub", ["ya", "yb"], ["d"], name="d")])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("d", TensorProto.FLOAT, None))
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "w" / "m.onnx")
    onnx.save(model, src)
    (tmp_path / "w").mkdir()
    res = onnxopt.optimize(src, out, precision="fp16", plan="compute-blocked", target="x86-64-v3", **FAST)
    p = res.report["precision"]
    assert p["lowered"] and p["auto"]["simulated_max_rel_error"] <= FP16_BUDGET
    refused = [e for e in p["float32_regions"] if "accuracy budget" in e["reason"]]
    assert refused and len(refused) + len(p["lowered"]) == len(LAYERS) + 2
    assert p["cost"][0]["max_rel_error"] <= 2 * FP16_BUDGET
    x = np.random.default_rng(1).standard_normal((1, 3, 40, 48)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path)
    assert sum(loader["calls"].values()) >= 1 and loader["precision"] == "fp16"
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert all(c.ok for c in compare(["d"], [want], [got], LOW_PRECISION_TOLERANCE))
