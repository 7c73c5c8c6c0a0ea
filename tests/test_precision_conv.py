"""`--precision bf16` for convolutions (issue 46, item 5; fusion/layout.py `lower_blocked_conv`, the vdpbf16ps tile
in codegen/microkernel/outer_product.py `emit_conv_bf16_dot`, the glue's bfloat16 input copy in
conv_blocked_exec.c): the written files run by the public loader in a fresh process, their kernels counted, against
the float32 original at the bf16 tolerance and, tightly, against the same convolutions computed in float64 on the
bfloat16-rounded inputs and weights (which pins the rounding, the channel pairs and the taps); odd input channels,
pads, strides and dilations; the function bodies without the library; targets without avx512_bf16 keep float32 and
say why."""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fresh_process import run_written
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.codegen.target import parse_target
from onnxopt.fusion.compute import bfloat16_values
from onnxopt.verify import LOW_PRECISION_TOLERANCE, compare

# vdpbf16ps without AMX (Zen 4 and 5, Cooper Lake); AMX targets: tests/codegen/test_amx_conv.py
BF16_TARGET = "cpu=x86-64-v4,+avx512bf16"
FAST = {"measure": False, "threads": 2, "cost_cache": False, "tune_budget": 0, "target": BF16_TARGET}
HAS_BF16 = parse_target("native").has("avx512bf16")
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 (vdpbf16ps)")

# (name, input channels, output channels, kernel, stride, pad, dilation): the first reads the graph's NCHW image
# (float32), the rest blocked tensors; 63 and 33 input channels make an odd last pair.
LAYERS = [("c1", 3, 32, 3, 2, 1, 1), ("c2", 32, 63, 3, 1, 1, 1), ("c3", 63, 33, 1, 1, 0, 1),
          ("c4", 33, 48, 3, 2, 1, 1), ("c5", 48, 40, 3, 1, 2, 2), ("c6", 40, 64, 5, 1, 0, 1)]


def chain(seed=0):
    """Convolutions with biases and Relus, their weights and biases (for the float64 reference)."""
    rng = np.random.default_rng(seed)
    nodes, inits, params, x = [], [], [], "x"
    for name, ic, oc, k, s, p, d in LAYERS:
        w = (rng.standard_normal((oc, ic, k, k)) / np.sqrt(ic * k * k)).astype(np.float32)
        b = (rng.standard_normal(oc) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
        nodes += [helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], kernel_shape=[k, k],
                                   strides=[s, s], pads=[p] * 4, dilations=[d, d]),
                  helper.make_node("Relu", [name], [f"{name}_r"])]
        params.append((w, b, s, p, d))
        x = f"{name}_r"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 40, 48])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, params


def conv64(x, w, b, s, p, d):
    """Conv2d in float64, NCHW, batch 1."""
    x = np.pad(x, ((0, 0), (p, p), (p, p)))
    oc, ic, kh, kw = w.shape
    oh = (x.shape[1] - d * (kh - 1) - 1) // s + 1
    ow = (x.shape[2] - d * (kw - 1) - 1) // s + 1
    out = np.zeros((oc, oh, ow))
    for r in range(kh):
        for c in range(kw):
            patch = x[:, r * d: r * d + s * (oh - 1) + 1: s, c * d: c * d + s * (ow - 1) + 1: s]
            out += np.einsum("oi,ihw->ohw", w[:, :, r, c], patch)
    return out + b[:, None, None]


def reference(params, x, lowered):
    """The chain in float64 where layer i's input and weights are rounded to bfloat16 when lowered[i]."""
    h = x[0].astype(np.float64)
    for (w, b, s, p, d), low in zip(params, lowered):
        if low:
            h, w = bfloat16_values(h.astype(np.float32)).astype(np.float64), bfloat16_values(w)
        h = np.maximum(conv64(h, w.astype(np.float64), b.astype(np.float64), s, p, d), 0)
    return h[None]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("conv_bf16")
    model, params = chain()
    src = str(d / "chain.onnx")
    onnx.save(model, src)
    (d / "w").mkdir()
    out = str(d / "w" / "chain.onnx")
    res = onnxopt.optimize(src, out, precision="bf16", plan="compute-blocked", **FAST)
    x = np.random.default_rng(1).standard_normal((1, 3, 40, 48)).astype(np.float32)
    return {"src": src, "out": out, "res": res, "params": params, "x": x, "dir": d}


@needs_bf16
def test_bf16_convolutions_run_in_a_fresh_process(written):
    res, out = written["res"], written["out"]
    p = res.report["precision"]
    assert p["written"]["precision"] == "bf16"
    # every convolution after the first (which reads the NCHW image) runs in bfloat16
    lowered = {n for names in p["lowered"] for n in names}
    assert {"c2", "c3", "c4", "c5", "c6"} <= lowered and "c1" not in lowered
    assert any(e["nodes"][0] == "c1" and "mostly padding" in e["reason"] for e in p["float32_regions"])
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    got, loader = run_written(out, written["x"], written["dir"])
    assert loader["precision"] == "bf16"
    # the kernels ran (in one Sequence op), not the function bodies: those multiply float32 inputs, which the tight
    # check below tells apart
    assert sum(loader["calls"].values()) >= 1
    # against the float32 original: within the bf16 tolerance, and not float32 in disguise
    want = ort.InferenceSession(written["src"], providers=["CPUExecutionProvider"]).run(None, {"x": written["x"]})[0]
    assert all(c.ok for c in compare(["y"], [want], [got], LOW_PRECISION_TOLERANCE))
    scale = float(np.max(np.abs(want)))
    assert np.max(np.abs(got - want)) > 1e-4 * scale
    # against the same arithmetic in float64: bfloat16 inputs and weights (round to nearest even), exact sums
    exact = reference(written["params"], written["x"], [False, True, True, True, True, True])
    assert np.max(np.abs(got - exact)) < 2e-5 * scale, np.max(np.abs(got - exact)) / scale


@needs_bf16
def test_bf16_convolution_library_has_vdpbf16ps(written):
    asm = subprocess.run(["objdump", "-d", written["out"] + ".so"], capture_output=True, text=True,
                         check=True).stdout
    assert "vdpbf16ps" in asm


@needs_bf16
def test_weights_stored_once_in_pairs_and_bodies_read_them(written):
    """The blocked weights are bfloat16 initializers (an odd IC's pair padded by one channel), no float32 copy; the
    function bodies, run without the library, compute within the bf16 tolerance."""
    m = onnx.load(written["out"])
    bf16 = [t for t in m.graph.initializer if t.data_type == TensorProto.BFLOAT16]
    assert len(bf16) >= 5
    # c3 reads 63 channels: 64 * 1 * 1 rows of pairs; c5 reads 48: 48 * 9
    rows = sorted(int(t.dims[1]) for t in bf16)
    assert 64 in rows and 48 * 9 in rows
    assert not any(t.data_type == TensorProto.FLOAT and t.name.startswith(("c2_w", "c3_w", "c4_w"))
                   for t in m.graph.initializer)
    want = ort.InferenceSession(written["src"], providers=["CPUExecutionProvider"]).run(None, {"x": written["x"]})[0]
    bodies = ort.InferenceSession(written["out"], providers=["CPUExecutionProvider"]).run(None, {"x": written["x"]})[0]
    assert all(c.ok for c in compare(["y"], [want], [bodies], LOW_PRECISION_TOLERANCE))
    # the bodies multiply the same rounded weights with float32 inputs
    exact = reference(written["params"], written["x"], [False] * len(LAYERS))
    assert np.max(np.abs(bodies - exact)) > 0


def test_a_target_without_avx512_bf16_keeps_convolutions_float32_and_says_why(tmp_path):
    """(AMX targets lower their convolutions onto the tiles: tests/codegen/test_amx_conv.py.)"""
    target, why = "x86-64-v4", "no avx512_bf16"
    model, _ = chain()
    src, out = str(tmp_path / "chain.onnx"), str(tmp_path / "w" / "chain.onnx")
    onnx.save(model, src)
    (tmp_path / "w").mkdir()
    res = onnxopt.optimize(src, out, precision="bf16", plan="compute-blocked", **{**FAST, "target": target})
    p = res.report["precision"]
    assert p["written"]["lowered_regions"] == 0
    assert any(why in e["reason"] for e in p["float32_regions"])
    assert not any(t.data_type == TensorProto.BFLOAT16 for t in onnx.load(out).graph.initializer)


def test_bfloat16_decoding_before_opset_13_is_exact():
    """Before opset 13 (Paddle's exports are opset 11) Cast has no bfloat16: the weights are stored as their bits in
    UINT16 and the function bodies decode them by arithmetic (fusion/compute.py bfloat16_weights). Every finite
    bfloat16, denormals and both zeros included, decodes to exactly its float32 value."""
    from onnxopt.fusion.compute import bfloat16_weights

    bits = np.arange(1 << 16, dtype=np.uint32)
    finite = (bits & 0x7F80) != 0x7F80
    bits = bits[finite].astype(np.uint16)
    tensor, nodes = bfloat16_weights("w", bits, (bits.size,), 11, "y")
    assert tensor.data_type == TensorProto.UINT16
    g = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [tensor])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    want = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    tensor, nodes = bfloat16_weights("w", bits, (bits.size,), 13, "y")
    assert tensor.data_type == TensorProto.BFLOAT16 and [n.op_type for n in nodes] == ["Cast"]


@needs_bf16
def test_opset_11_model_lowers_with_its_weights_as_bits(tmp_path):
    model, params = chain()
    model.opset_import[0].version = 11
    model.ir_version = 7
    src = str(tmp_path / "chain11.onnx")
    onnx.save(model, src)
    (tmp_path / "w").mkdir()
    out = str(tmp_path / "w" / "chain11.onnx")
    res = onnxopt.optimize(src, out, precision="bf16", plan="compute-blocked", **FAST)
    assert res.report["precision"]["written"]["lowered_regions"] >= 5
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    m = onnx.load(out)
    assert m.opset_import[0].version == 11
    assert sum(t.data_type == TensorProto.UINT16 for t in m.graph.initializer) >= 5
    x = np.random.default_rng(1).standard_normal((1, 3, 40, 48)).astype(np.float32)
    scale = float(np.max(np.abs(reference(params, x, [False] * len(LAYERS)))))
    got = onnxopt.runtime.InferenceSession(out).run(None, {"x": x})[0]
    assert np.max(np.abs(got - reference(params, x, [False] + [True] * 5))) < 2e-5 * scale
    # the bodies decode the bits exactly: float32 inputs, the rounded weights
    bodies = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    rounded = [(bfloat16_values(w) if i else w, b, s, p, d) for i, (w, b, s, p, d) in enumerate(params)]
    assert np.max(np.abs(bodies - reference(rounded, x, [False] * len(LAYERS)))) < 2e-5 * scale


@needs_bf16
def test_auto_weighs_convolutions_against_the_budget(tmp_path):
    model, _ = chain()
    src = str(tmp_path / "chain.onnx")
    onnx.save(model, src)
    (tmp_path / "w").mkdir()
    res = onnxopt.optimize(src, str(tmp_path / "w" / "tight.onnx"), precision="auto", accuracy_budget=1e-7,
                           plan="compute-blocked", **FAST)
    p = res.report["precision"]
    assert p["written"]["lowered_regions"] == 0
    assert any("budget" in e["reason"] for e in p["float32_regions"])
    res = onnxopt.optimize(src, str(tmp_path / "w" / "loose.onnx"), precision="auto", accuracy_budget=0.02,
                           plan="compute-blocked", **FAST)
    p = res.report["precision"]
    assert p["written"]["lowered_regions"] >= 5 and p["within_budget"]
    assert p["auto"]["simulated_max_rel_error"] <= 0.02


@needs_bf16
def test_nchw_input_is_blocked_by_the_bfloat16_copy(tmp_path):
    """c3's output is also a graph output, so it stays NCHW: c4 reads it NCHW and the glue's bfloat16 copy blocks
    it (33 channels: three vectors, the last mostly padding)."""
    model, params = chain()
    model.graph.output.append(helper.make_tensor_value_info("c3_r", TensorProto.FLOAT, None))
    src = str(tmp_path / "c.onnx")
    onnx.save(model, src)
    (tmp_path / "w").mkdir()
    out = str(tmp_path / "w" / "c.onnx")
    res = onnxopt.optimize(src, out, precision="bf16", plan="compute-blocked", **FAST)
    layouts = {r["nodes"][0]: r.get("layout") for r in res.report["regions"]}
    assert layouts["c4"] == "nchw->blocked"
    assert ["c4", "c4_r"] in res.report["precision"]["lowered"]
    x = np.random.default_rng(1).standard_normal((1, 3, 40, 48)).astype(np.float32)
    got = onnxopt.runtime.InferenceSession(out).run(None, {"x": x})[0]
    ref = reference(params, x, [False] + [True] * 5)
    assert np.max(np.abs(got - ref)) < 2e-5 * float(np.max(np.abs(ref)))


@needs_bf16
def test_auto_before_opset_13_simulates_and_lowers(tmp_path):
    """Before opset 13 Cast has no bfloat16: auto's simulation rounds activations by Veltkamp's split instead, so an
    opset-11 model (Paddle's exports) takes bf16 within its budget, its weights stored as bits."""
    model, _ = chain()
    model.opset_import[0].version = 11
    model.ir_version = 7
    src = str(tmp_path / "chain11.onnx")
    onnx.save(model, src)
    (tmp_path / "w").mkdir()
    res = onnxopt.optimize(src, str(tmp_path / "w" / "c.onnx"), precision="auto", accuracy_budget=0.02,
                           plan="compute-blocked", **FAST)
    p = res.report["precision"]
    assert p["written"]["lowered_regions"] >= 5 and p["within_budget"]
    assert 0 < p["auto"]["simulated_max_rel_error"] <= 0.02
    # the simulation is what the kernels do: within a small factor of the written model's own error
    written = max(c["max_rel_error"] for c in p["cost"])
    assert 0.5 * written <= p["auto"]["simulated_max_rel_error"] <= 2 * written


@pytest.mark.parametrize("opset", [11, 13])
def test_the_simulations_rounding_is_bfloat16s(opset):
    """The simulated rounding of activations, as onnxruntime runs it, is vcvtneps2bf16's: round to nearest even,
    bit for bit, ties included, on values from 2^-29 to 2^29."""
    from onnxopt.driver.precision import _round_to

    rng = np.random.default_rng(opset)
    x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-20, 20, 200_000))).astype(np.float32)
    ties = (bfloat16_values(x[:2000]).view(np.uint32) + 0x8000).view(np.float32)  # halfway between two bf16
    x = np.concatenate([x, ties, -ties])
    g = helper.make_graph(_round_to("x", "y", opset), "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(got.view(np.uint32), bfloat16_values(x).view(np.uint32))
