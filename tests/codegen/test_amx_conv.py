"""bfloat16 convolutions on AMX tiles (codegen/compute/amx_conv_tile.py, the glue's cb_run_amx_task and its copy of
the input in blocks of 32 channels; `--precision bf16` on an AMX-BF16 target).

On any host: the tile program, on the weights' and the copy's layouts, computes tdpbf16ps's rule (each product added
in turn, K = channel blocks, then kernel rows, then columns) in the reference interpreter, over strides, pads,
dilations, channel counts that are not whole blocks and rows that run past the output row; the compiled tiles hold
the AMX instructions; the driver lowers the convolutions the tiles speed up and keeps the others float32, saying
why. With the tiles built as plain code (ONNXOPT_EMULATE_TILES=1) the written model runs its AMX path here, in a
fresh process through the public loader, bit-exact to the instruction's rule (the vdpbf16ps tiles sum each pair
first, so the test sees which tiles ran): a 1x1 convolution reading an NCHW input (the copy's gather) and the
convolution under test reading its blocked output. Where the CPU has AMX-BF16 the same models run on the real tiles,
held to float32 accumulation's bound over the bf16-rounded operands and to differ from the vdpbf16ps tiles' bits."""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import pytest
from amx_rules import tile_rule
from fresh_process import run_written
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.codegen.compile import compile_assembly, new_module
from onnxopt.codegen.compute import amx_conv_tile
from onnxopt.codegen.compute.describe import identity_program
from onnxopt.codegen.compute.tile import TileSpec
from onnxopt.codegen.instructions import amx as amx_instructions
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import host_cpu_flags, parse_target
from onnxopt.fusion.compute import bfloat16_bits, bfloat16_values

AMX_BF16_TARGET = "cpu=x86-64-v4,+avx512bf16,+avx512vnni,+amx-tile,+amx-bf16"
HAS_BF16 = "avx512_bf16" in host_cpu_flags()
HAS_AMX_BF16 = {"amx_tile", "amx_bf16"} <= host_cpu_flags()
FAST = {"measure": False, "threads": 2, "cost_cache": False, "tune_budget": 0, "plan": "compute-blocked"}
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 (the AMX target's vector code)")


def im2col(x: np.ndarray, kh: int, kw: int, s: int, p: int, d: int, blocks: int) -> tuple[np.ndarray, int, int]:
    """x [C, H, W] (bf16 values) as [OH * OW, K] in the tiles' K order: (channel block, kernel row, kernel column,
    channel in the block), channels zero-padded to `blocks` x 32."""
    c, h, w = x.shape
    xp = np.zeros((blocks * 32, h + 2 * p, w + 2 * p), np.float32)
    xp[:c, p:p + h, p:p + w] = x
    oh, ow = (h + 2 * p - d * (kh - 1) - 1) // s + 1, (w + 2 * p - d * (kw - 1) - 1) // s + 1
    cols = np.zeros((oh * ow, blocks, kh, kw, 32), np.float32)
    for r in range(kh):
        for q in range(kw):
            patch = xp[:, r * d: r * d + s * (oh - 1) + 1: s, q * d: q * d + s * (ow - 1) + 1: s]
            cols[:, :, r, q, :] = patch.reshape(blocks, 32, oh * ow).transpose(2, 0, 1)
    return cols.reshape(oh * ow, -1), oh, ow


def weights_in_k_order(w: np.ndarray, blocks: int) -> np.ndarray:
    """w [OC, C, kh, kw] as [K, OC] in the tiles' K order."""
    oc, c, kh, kw = w.shape
    wp = np.zeros((oc, blocks * 32, kh, kw), np.float32)
    wp[:, :c] = w
    return wp.reshape(oc, blocks, 32, kh, kw).transpose(1, 3, 4, 2, 0).reshape(-1, oc)


# (C, OC, kernel, stride, pad, dilation, H, W): channels that are not whole blocks, strides, pads, a dilation, a
# 5x5 kernel, rows shorter and longer than a call
GEOMETRIES = [(40, 48, 3, 1, 1, 1, 5, 21), (64, 16, 3, 2, 1, 1, 9, 13), (33, 32, 1, 1, 0, 1, 4, 37),
              (48, 32, 3, 1, 2, 2, 6, 9), (32, 64, 5, 1, 0, 1, 7, 8), (20, 16, 2, 2, 0, 1, 6, 40)]


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_the_conv_tile_program_is_the_instructions_rule(groups, geometry):
    """One call of the program per output row (strided: its pixels sw * 64 bytes apart) on the copy's layout
    [blocks][Hp][Wp][32] and the weights' (pairs of channels, row (pair, tap), [blocks * 16 * taps][NI * 16][2]),
    every pixel of the row that exists against tdpbf16ps's rule, bit for bit; the copy has the slack the glue gives
    it for the pixels past the row."""
    c, oc, k, s, p, d, h, w = geometry
    ni, nv = 4, -(-oc // 16)
    rng = np.random.default_rng(sum(geometry) + groups)
    x = bfloat16_values(rng.standard_normal((c, h, w)).astype(np.float32))
    wt = bfloat16_values(rng.standard_normal((oc, c, k, k)).astype(np.float32))
    blocks, taps, hp, wp = -(-c // 32), k * k, h + 2 * p, w + 2 * p
    xp = np.zeros((blocks * 32, hp, wp), np.float32)
    xp[:c, p:p + h, p:p + w] = x
    copy = bfloat16_bits(np.ascontiguousarray(xp.reshape(blocks, 32, hp, wp).transpose(0, 2, 3, 1)))
    width = ni * 16
    wpad = np.zeros((blocks * 32, taps, width), np.float32)
    wpad[:c, :, :oc] = wt.reshape(oc, c, taps).transpose(1, 2, 0)
    packed = bfloat16_bits(np.ascontiguousarray(wpad.reshape(blocks * 16, 2, taps, width).transpose(0, 2, 3, 1)))
    slack = np.zeros((32 * s + (k - 1) * d + wp + 32) * 64, np.uint8)
    geometry_table = dict(zip(amx_conv_tile.AMX_GEOMETRY, (
        hp * wp * 64, d * wp * 64, d * 64, blocks, k, k, 16 * taps * ni * 64, k * ni * 64, ni * 64, taps * ni * 64)))
    cols, oh, ow = im2col(x, k, k, s, p, d, blocks)
    want = tile_rule(cols, weights_in_k_order(wt, blocks))
    prog = amx_conv_tile.program(amx_instructions.TDPBF16PS, groups, nv)
    assert len(prog.shapes) <= 8
    rows = 16 * groups
    for r in range(oh):
        for p0 in range(0, ow, rows):
            start = (r * s * wp + p0 * s) * 64
            memory = {"a16": np.concatenate([copy.view(np.uint8).reshape(-1)[start:], slack]),
                      "b": packed.view(np.uint8).reshape(-1).copy(), "cout": np.zeros(rows * nv * 64, np.uint8)}
            prog.run(memory, dict(geometry_table, a_ms=s * 64))
            got = memory["cout"].view(np.float32).reshape(rows, nv * 16)[:, :oc]
            n = min(rows, ow - p0)
            np.testing.assert_array_equal(got[:n], want[r * ow + p0: r * ow + p0 + n])


def test_the_conv_tiles_compile_to_tile_instructions():
    target = parse_target(AMX_BF16_TARGET)
    tile = select(target).tile
    spec = TileSpec(tile, identity_program(), (), packed_a=True, b_format="bf16_dot")
    module = new_module(target, "amx_conv")
    names = amx_conv_tile.define_amx_conv_functions(module, "t", spec, "tdpbf16ps", emulate=False)
    assert [len(row) for row in names] == [tile.ni] * 2
    asm = compile_assembly(str(module), target)
    for mnemonic in ("tileloadd", "tdpbf16ps", "tilestored", "tilezero"):
        assert mnemonic in asm, mnemonic
    # named registers: the task loads the configuration once (matrix_engine.c amx_tiles_configure)
    assert "ldtilecfg" not in asm and "tilerelease" not in asm


def two_convs(ic: int, layer: tuple, h: int, w: int, seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray, tuple]:
    """A 1x1 convolution that copies 32 NCHW input channels into `ic` (weights 0 and 1: exact), then the
    convolution under test (oc, kernel, stride, pad, dilation) with a bias, and a Relu."""
    oc, k, s, p, d = layer
    rng = np.random.default_rng(seed)
    sel = np.zeros((ic, 32, 1, 1), np.float32)
    sel[np.arange(ic), np.arange(ic) % 32] = 1.0
    wt = (rng.standard_normal((oc, ic, k, k)) / np.sqrt(ic * k * k)).astype(np.float32)
    b = (rng.standard_normal(oc) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "sel"], ["h"], kernel_shape=[1, 1], name="copy"),
             helper.make_node("Conv", ["h", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                              dilations=[d, d], name="conv"),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(sel, "sel"), numpy_helper.from_array(wt, "w"),
                           numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, sel, (wt, b, s, p, d)


def expected(x: np.ndarray, sel: np.ndarray, params: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the AMX rule's output, the operands in K order) of the model on bf16-exact `x`."""
    wt, b, s, p, d = params
    h = np.einsum("oi,ihw->ohw", sel[:, :, 0, 0], x[0]).astype(np.float32)  # exact: one 1.0 a row
    blocks = -(-h.shape[0] // 32)
    cols, oh, ow = im2col(h, wt.shape[2], wt.shape[3], s, p, d, blocks)
    wk = weights_in_k_order(bfloat16_values(wt), blocks)
    sums = tile_rule(cols, wk)
    out = np.maximum((sums + b[None, :]).astype(np.float32), 0)
    return out.T.reshape(1, -1, oh, ow), cols, wk


def _build(tmp_path, model, target=AMX_BF16_TARGET):
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "out.onnx"
    onnx.save(model, src)
    out.parent.mkdir(exist_ok=True)
    return onnxopt.optimize(str(src), str(out), precision="bf16", target=target, **FAST), out


# (input channels, (OC, kernel, stride, pad, dilation), H, W): a stride-1 3x3 over rows of 40 (the walk's runs
# over the padded width), a strided one, a dilated 5x5-reach, 1x1 with a short last block
CASES = [(64, (64, 3, 1, 1, 1), 12, 40), (48, (80, 3, 2, 1, 1), 11, 23), (40, (32, 3, 1, 2, 2), 9, 17),
         (96, (72, 1, 1, 0, 1), 5, 33)]


@needs_bf16
@pytest.mark.parametrize("ic, layer, h, w", CASES)
def test_the_whole_path_on_emulated_tiles_in_a_fresh_process(tmp_path, monkeypatch, ic, layer, h, w):
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model, sel, params = two_convs(ic, layer, h, w)
    res, out = _build(tmp_path, model)
    conv = [r for r in res.report["regions"] if "conv" in r["nodes"]]
    assert conv and conv[0].get("matrix_instruction") == "tdpbf16ps", res.report["precision"]["float32_regions"]
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    padded = [int(t.dims[1]) for t in onnx.load(out).graph.initializer if t.data_type == TensorProto.BFLOAT16]
    assert -(-ic // 32) * 32 * layer[1] ** 2 in padded  # input channels padded to whole blocks of 32
    x = bfloat16_values(np.random.default_rng(1).standard_normal((1, 32, h, w)).astype(np.float32))
    got, loader = run_written(out, x, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert loader["amx"] == "emulated" and sum(loader["calls"].values()) >= 1, loader
    want, _, _ = expected(x, sel, params)
    np.testing.assert_array_equal(got, want)  # tdpbf16ps's rule: the AMX tiles ran, on every pixel and channel


@needs_bf16
@pytest.mark.parametrize("ic, layer, h, w", CASES[:2])
def test_on_this_cpu_the_tiles_run_or_the_loader_says_why_not(tmp_path, ic, layer, h, w):
    """Built with real AMX tiles: where the CPU has AMX-BF16 and the OS grants it, every output is within float32
    accumulation's bound over the bf16 operands and differs from the vdpbf16ps tiles' (ONNXOPT_AMX=0) bits;
    elsewhere the vdpbf16ps tiles run the same library."""
    model, sel, params = two_convs(ic, layer, h, w, seed=5)
    _, out = _build(tmp_path, model)
    x = bfloat16_values(np.random.default_rng(2).standard_normal((1, 32, h, w)).astype(np.float32))
    got, loader = run_written(out, x, tmp_path)
    want, cols, wk = expected(x, sel, params)
    a64, w64, b64 = cols.astype(np.float64), wk.astype(np.float64), params[1][None, :].astype(np.float64)
    sums64 = a64 @ w64
    bound = (cols.shape[1] + 2) * 2.0 ** -24 * (np.abs(a64) @ np.abs(w64)) + 2.0 ** -24 * np.abs(sums64 + b64)
    exact = np.maximum(sums64 + b64, 0).T.reshape(want.shape)
    assert np.all(np.abs(got - exact) <= bound.T.reshape(want.shape))
    off, stated = run_written(out, x, tmp_path, env={"ONNXOPT_AMX": "0"})
    assert stated["amx"] == "turned off (ONNXOPT_AMX=0)"
    if HAS_AMX_BF16 and loader["amx"] == "granted":
        assert np.any(got != off)  # another unit summed them
    else:
        assert loader["amx"] != "granted", loader
        np.testing.assert_array_equal(got, off)


@needs_bf16
def test_the_convolutions_the_tiles_do_not_speed_up_keep_float32_and_say_why(tmp_path):
    """On an AMX target: a 3x3 convolution of fewer than 16 input channels (a 1x1's: 32), and one whose input values
    meet fewer than 64 outputs, keep float32 weights with the reason; an NCHW-kernel convolution is given the blocked
    kernel and lowered."""
    from onnxopt.driver.precision import AMX_CONV_MIN_OUTPUTS

    rng = np.random.default_rng(0)
    shapes = {"narrow": (48, 12, 3), "few_outputs": (16, 48, 1), "taps": (64, 16, 3),  # (OC, C, kernel)
              "lowered": (64, 64, 3)}
    nodes, inits, x = [], [], "x"
    for name, (oc, ic, k) in shapes.items():
        inits.append(numpy_helper.from_array(rng.standard_normal((oc, ic, k, k)).astype(np.float32), f"{name}_w"))
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [name], kernel_shape=[k, k], pads=[k // 2] * 4,
                                      name=name))
        x = name
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 10, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    res, out = _build(tmp_path, model)
    p = res.report["precision"]
    reasons = {e["nodes"][0]: e["reason"] for e in p["float32_regions"]}
    assert f"meets 16 outputs, fewer than {AMX_CONV_MIN_OUTPUTS}" in reasons["few_outputs"]
    assert "its 12 input channels would pad to a tile row of 32" in reasons["narrow"]
    for name in ("taps", "lowered"):  # 16 channels suffice a 3x3 kernel (each copied value is read once a tap)
        region = [r for r in res.report["regions"] if r["nodes"] == [name]]
        assert region and region[0].get("matrix_instruction") == "tdpbf16ps", (name, reasons)
    # on its NCHW output too (the model's last convolution): the blocked kernel, NCHW in and out
    assert res.report["verification"]["ok"]


def test_the_library_carries_the_tiles_and_the_vdpbf16ps_tiles(tmp_path):
    """One library for both: the AMX tiles where granted, vdpbf16ps where not (compiled on any host)."""
    model, _, _ = two_convs(64, (64, 3, 1, 1, 1), 8, 16)
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "out.onnx"
    onnx.save(model, src)
    out.parent.mkdir()
    onnxopt.optimize(str(src), str(out), precision="bf16", target=AMX_BF16_TARGET, verify=False, **FAST)
    asm = subprocess.run(["objdump", "-d", str(out) + ".so"], capture_output=True, text=True, check=True).stdout
    assert "tdpbf16ps" in asm and "vdpbf16ps" in asm
