"""The qconv kind on AMX tiles (onnxopt/kinds/qconv/amx.py): s8 weights x u8 im2col panels on `tdpbsud`.

On any host: the descriptions choose the instruction, the tile program runs exactly in the reference interpreter on
the kind's own layouts, the compiled tiles hold the tile instructions, and a library for an AMX target runs here
(its dot-product tiles where the CPU or the OS refuse AMX), exactly, in a fresh process through the public loader.
Where the CPU has AMX, the AMX and dot-product tiles must agree bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from int8_models import conv_attrs, conv_int, conv_integer_model, qdq_conv_model, requantized
from kind_harness import fuse_kind

from onnxopt.codegen.compile import compile_assembly
from onnxopt.codegen.instructions import amx as amx_instructions
from onnxopt.codegen.target import host_cpu_flags, parse_target
from onnxopt.kinds.qconv import KIND, amx

AMX_TARGET = "cpu=x86-64-v4,+avx512vnni,+amx-tile,+amx-int8"
HAS_AMX = {"amx_tile", "amx_int8"} <= host_cpu_flags()
HAS_VNNI = {"avx512_vnni", "avx512bw"} <= host_cpu_flags()


def test_the_descriptions_choose_tdpbsud():
    target = parse_target(AMX_TARGET)
    ins, m = amx.choose(target, "s8", "u8")
    assert ins is amx_instructions.TDPBSUD  # s8 weights x u8 activations
    assert (m.of("m"), m.of("n"), m.of("k")) == ({"row"}, {"column"}, {"depth"})


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
@pytest.mark.parametrize("k4", [64, 144, 200])
def test_the_tile_program_on_the_kinds_layouts_is_exact(groups, k4):
    """Weights as rows of k4 bytes read in place from channel m0, the im2col panel [k4 / 4][16][4]: the whole
    64-byte chunks of K give W x X exactly."""
    rng = np.random.default_rng(groups * 100 + k4)
    cout, m0 = 16 * groups + 7, 5
    w = rng.integers(-128, 128, (cout, k4), dtype=np.int8)
    x = rng.integers(0, 256, (k4, 16), dtype=np.uint8)  # K x 16 pixels
    panel = np.ascontiguousarray(x.reshape(k4 // 4, 4, 16).transpose(0, 2, 1))  # [k4 / 4][16 pixels][4]
    memory = {"w": w.view(np.uint8).reshape(-1).copy(), "panel": panel.reshape(-1).copy(),
              "acc": np.zeros(groups * 16 * 16 * 4, np.uint8)}
    chunks = k4 // 64
    amx.program(amx_instructions.TDPBSUD, groups).run(memory, {"m0": m0, "k4": k4, "chunks": chunks})
    got = memory["acc"].view(np.int32).reshape(groups * 16, 16)
    kk = 64 * chunks
    want = w[m0:m0 + 16 * groups, :kk].astype(np.int64) @ x[:kk].astype(np.int64)
    np.testing.assert_array_equal(got, want)


def _conv_integer(cout=70, cin=16, k=3, stride=2, h=13, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (cout, cin, k, k), dtype=np.int8)
    attrs = conv_attrs(k, k, stride, 1, 1, h, h)
    return conv_integer_model(w, np.array(0, np.int8), attrs, (1, cin, h, h)), w, attrs


def test_the_amx_tiles_compile_to_tile_instructions(tmp_path):
    model, _, _ = _conv_integer()
    target = parse_target(AMX_TARGET)
    _, _, region, ir_text = fuse_kind(KIND, model, tmp_path, target=target)
    assert not region.params.implicit and "llvm.x86.tdpbsud.internal" in ir_text
    asm = compile_assembly(ir_text, target)
    for mnemonic in ("ldtilecfg", "tileloadd", "tdpbsud", "tilestored", "tilerelease", "vpdpbusd"):
        assert mnemonic in asm, mnemonic
    _, _, _, plain = fuse_kind(KIND, model, tmp_path, name="plain.so", target=parse_target("x86-64-v4"))
    assert "x86_amx" not in plain


_RUN = textwrap.dedent("""
    import faulthandler, json, sys
    import numpy as np
    faulthandler.enable()
    import onnxopt.runtime as rt
    from onnxopt.runtime.matrix_engine import amx_status
    sess = rt.InferenceSession(sys.argv[1])
    lib = rt.registered_library(sess, loadable=True)
    feeds = dict(np.load(sys.argv[2]))
    np.save(sys.argv[3], sess.run(None, feeds)[0])
    print(json.dumps({"calls": sum(rt.kernel_calls(lib).values()), "amx": amx_status(lib)}))
""")


def _run_written(tmp_path, fused, feeds: dict, env=None, tag="") -> tuple[dict, np.ndarray]:
    path, inputs, out = tmp_path / f"fused{tag}.onnx", tmp_path / f"in{tag}.npz", tmp_path / f"out{tag}.npy"
    onnx.save(fused, path)
    np.savez(inputs, **feeds)
    r = subprocess.run([sys.executable, "-c", _RUN, str(path), str(inputs), str(out)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), np.load(out)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
def test_conv_integer_for_an_amx_target_is_exact_here(tmp_path):
    """70 channels: a block of 64 (four AMX groups where allowed) and 6 on the dot-product tiles; K = 144 bytes:
    two whole chunks and a rest of 16."""
    model, w, attrs = _conv_integer()
    fused, lib, _, _ = fuse_kind(KIND, model, tmp_path, target=parse_target(AMX_TARGET))
    x = np.random.default_rng(3).integers(0, 256, (1, 16, 13, 13), dtype=np.uint8)
    feeds = {"x": x, "zx": np.array(9, np.uint8), "scale": np.array(0.01, np.float32)}
    report, got = _run_written(tmp_path, fused, feeds)
    assert report["calls"] == 1
    if not HAS_AMX:
        assert report["amx"]["state"] == "no AMX on this CPU"
    exact = conv_int(x, w, np.uint8(9), 0, attrs["strides"], attrs["pads"], attrs["dilations"])
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, 70).astype(np.float32).reshape(70, 1, 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
def test_a_qdq_unit_for_an_amx_target_requantizes_exactly_here(tmp_path):
    rng = np.random.default_rng(4)
    cout, cin = 40, 32
    wt = rng.integers(-127, 128, (cout, cin, 3, 3)).astype(np.int8)
    sw = (rng.uniform(0.5, 2.0, cout) * 0.01).astype(np.float32)
    bias = rng.integers(-3000, 3000, cout).astype(np.int32)
    sx, sy, zx, zy = np.float32(0.02), np.float32(0.8), np.uint8(120), np.uint8(100)
    attrs = conv_attrs(3, 3, 2, 1, 1, 11, 11)
    model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (1, cin, 11, 11), relu=True)
    fused, _, region, _ = fuse_kind(KIND, model, tmp_path, target=parse_target(AMX_TARGET))
    x = rng.integers(0, 256, (1, cin, 11, 11)).astype(np.uint8)
    report, got = _run_written(tmp_path, fused, {"xq": x})
    assert report["calls"] == 1
    exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"])
    np.testing.assert_array_equal(got.astype(np.int64), requantized(exact, bias, sx, sw, sy, zy, relu=True))


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
@pytest.mark.parametrize("cout", [16, 36, 52, 70])
@pytest.mark.parametrize("form", ["float", "quant", "u8_weights"])
def test_the_amx_kernels_whole_path_with_emulated_tiles(tmp_path, monkeypatch, cout, form):
    """Built with emulated tiles (ONNXOPT_EMULATE_TILES=1), the AMX kernels run here: blocks of 16 to 64 channels,
    the rest of K on VNNI, the zero-point terms (u8 weights: stored w - 128, with the window-sum row term) and the
    float or requantizing epilogue; exact."""
    quant = form == "quant"
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    rng = np.random.default_rng(cout)
    cin = 16
    attrs = conv_attrs(3, 3, 2, 1, 1, 13, 13)
    x = rng.integers(0, 256, (1, cin, 13, 13)).astype(np.uint8)
    if quant:
        wt = rng.integers(-127, 128, (cout, cin, 3, 3)).astype(np.int8)
        sw = (rng.uniform(0.5, 2.0, cout) * 0.01).astype(np.float32)
        bias = rng.integers(-3000, 3000, cout).astype(np.int32)
        sx, sy, zx, zy = np.float32(0.02), np.float32(0.6), np.uint8(130), np.uint8(90)
        model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (1, cin, 13, 13), relu=False)
        feeds = {"xq": x}
        exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"])
        want = requantized(exact, bias, sx, sw, sy, zy, relu=False)
    else:
        if form == "u8_weights":
            wt, zw = rng.integers(0, 256, (cout, cin, 3, 3)).astype(np.uint8), np.uint8(37)
            model = conv_integer_model(wt, np.array(zw), attrs, (1, cin, 13, 13))
        else:
            (model, wt, _), zw = _conv_integer(cout=cout, cin=cin, seed=cout), 0
        feeds = {"x": x, "zx": np.array(9, np.uint8), "scale": np.array(0.01, np.float32)}
        exact = conv_int(x, wt, np.uint8(9), zw, attrs["strides"], attrs["pads"], attrs["dilations"])
        want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
            np.linspace(-1, 1, cout).astype(np.float32).reshape(cout, 1, 1)
    fused, _, region, ir_text = fuse_kind(KIND, model, tmp_path, target=parse_target(AMX_TARGET))
    assert "x86_amx" not in ir_text and "tile.c0" in ir_text
    assert region.params.has_asum == (form == "u8_weights")  # the row term
    report, got = _run_written(tmp_path, fused, feeds)
    assert report["calls"] == 1 and report["amx"]["state"] == "emulated"
    np.testing.assert_array_equal(got.astype(want.dtype) if quant else got, want)


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (amx_tile, amx_int8): the tiles cannot run here")
def test_amx_and_vector_tiles_agree_bit_for_bit(tmp_path):
    model, _, _ = _conv_integer(cout=100, cin=24, h=21, seed=7)
    fused, _, _, _ = fuse_kind(KIND, model, tmp_path, target=parse_target(AMX_TARGET))
    x = np.random.default_rng(8).integers(0, 256, (1, 24, 21, 21), dtype=np.uint8)
    feeds = {"x": x, "zx": np.array(3, np.uint8), "scale": np.array(0.01, np.float32)}
    on, y_on = _run_written(tmp_path, fused, feeds, tag="on")
    off, y_off = _run_written(tmp_path, fused, feeds, env={"ONNXOPT_AMX": "0"}, tag="off")
    assert on["amx"]["state"] == "granted", on
    assert off["amx"]["state"] == "turned off (ONNXOPT_AMX=0)"
    np.testing.assert_array_equal(y_on, y_off)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
def test_a_blocked_quantize_static_chain_on_emulated_amx_tiles(tmp_path, monkeypatch):
    """A quantize_static chain with the int8 tensors passed blocked between its kernels (4 channels a word), built
    for an AMX target with emulated tiles, every convolution in the packed form (the one on tiles): the optimizer's
    own checks (the whole model against onnxruntime, then without the library) pass with the AMX tiles running, as
    the report says."""
    from onnx import helper
    from int8_models import quantized_cnn

    import onnxopt
    from onnxopt.kinds.qconv.find import forced_form

    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    rng = np.random.default_rng(21)
    shapes = (("w1", (32, 10, 3, 3)), ("w2", (24, 32, 3, 3)), ("w3", (40, 24, 3, 3)), ("w4", (16, 40, 1, 1)))
    weights = {n: (rng.standard_normal(s) * 0.3).astype(np.float32) for n, s in shapes}
    weights.update({f"b{i}": (rng.standard_normal(s[0]) * 0.1).astype(np.float32)
                    for i, (_, s) in enumerate(shapes, 1)})
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Conv", ["c3", "w4", "b4"], ["y"])]
    q = quantized_cnn(str(tmp_path), nodes, weights, (1, 10, 19, 21), rng)
    with forced_form("packed"):
        result = onnxopt.optimize(q, str(tmp_path / "out.onnx"), measure=False, plan="compute-blocked",
                                  target=AMX_TARGET)
    regions = [r for r in result.report["regions"] if r["op_type"].startswith("qconv_")]
    assert "blocked->blocked" in [r.get("layout") for r in regions]
    assert all(r.get("matrix_instruction") == "tdpbsud" for r in regions)
    assert result.report["verification"]["ok"] and result.report["fallback_verification"]["ok"]
    assert result.report["verification"]["amx"]["state"] == "emulated"
