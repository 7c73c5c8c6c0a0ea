"""The qmatmul kind on AMX tiles (onnxopt/kinds/qmatmul/amx.py).

On any host: the instruction and mapping come from the descriptions, the tile program the kernel compiles runs in
the reference interpreter on the kernel's own packing and gives the exact GEMM, the compiled tiles hold the AMX
instructions, and a library built for an AMX target runs its dot-product tiles where the CPU (or the OS) refuses
AMX, saying why. Where the CPU has AMX, the same model runs its AMX tiles: the numbers must not change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from fresh_process import run_written
from int8_models import matmul_exact, matmul_integer_model
from kind_harness import fuse_kind
from onnx import TensorProto, helper, numpy_helper

from onnxopt.codegen.compile import compile_assembly
from onnxopt.codegen.instructions import amx as amx_instructions
from onnxopt.codegen.target import host_cpu_flags, parse_target
from onnxopt.kinds.qmatmul import KIND
from onnxopt.kinds.qmatmul import amx
from onnxopt.kinds.qmatmul.find import pack
from onnxopt.measure import exact_integer_reference
from onnxopt.timing import make_session
from onnxopt.verify import STEP_BAND

AMX_TARGET = "cpu=x86-64-v4,+avx512vnni,+amx-tile,+amx-int8"
HAS_AMX = {"amx_tile", "amx_int8"} <= host_cpu_flags()
HAS_VNNI = "avx512_vnni" in host_cpu_flags() and "avx512bw" in host_cpu_flags()


def test_the_descriptions_choose_tdpbusd_and_the_plain_mapping():
    target = parse_target(AMX_TARGET)
    ins, m = amx.choose(target)
    assert ins is amx_instructions.TDPBUSD  # u8 x s8: the inspector refuses tdpbssd, tdpbsud, tdpbuud
    assert (m.of("m"), m.of("n"), m.of("k")) == ({"row"}, {"column"}, {"depth"})
    s8, why = amx.choose(target, "s8", "s8")
    assert s8 is amx_instructions.TDPBSSD
    none, why = amx.choose(parse_target("x86-64-v4"))
    assert none is None and "no matrix instruction" in why


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [64, 192, 100])
def test_the_tile_program_on_the_kernels_packing_is_the_exact_gemm(groups, k):
    """The kernel's own packing of B (find.py `pack`) and its program, in the reference interpreter: A's rows read in
    place (a_rs bytes apart, from row m0), the whole 64-byte chunks of K only (the rest is the vector tiles')."""
    rng = np.random.default_rng(groups * 1000 + k)
    rows, m0, n = 16 * groups + 5, 3, 16  # k a multiple of 4, as the kind requires
    a = rng.integers(0, 256, (rows, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = pack(w)["packed"]  # [1][K / 4][16][4], pairs the AVX2 sequence would saturate split (find.py)
    logical = packed[0].transpose(0, 2, 1).reshape(k, n)  # the B those bytes hold, [K, 16]
    prog = amx.program(amx_instructions.TDPBUSD, groups)
    memory = {"a": a.reshape(-1).copy(), "b": packed.view(np.uint8).reshape(-1).copy(),
              "acc": np.zeros(groups * 16 * 16 * 4, np.uint8)}
    chunks = k // 64
    prog.run(memory, {"m0": m0, "a_rs": k, "chunks": chunks})
    got = memory["acc"].view(np.int32).reshape(groups * 16, 16)
    kk = 64 * chunks
    want = a[m0:m0 + 16 * groups, :kk].astype(np.int64) @ logical[:kk].astype(np.int64)
    np.testing.assert_array_equal(got, want)


def test_the_interpreter_refuses_a_read_past_the_activations():
    prog = amx.program(amx_instructions.TDPBUSD, 2)
    memory = {"a": np.zeros(20 * 64, np.uint8), "b": np.zeros(16 * 64, np.uint8), "acc": np.zeros(2 * 1024, np.uint8)}
    with pytest.raises(IndexError, match="load of tile a1"):
        prog.run(memory, {"m0": 0, "a_rs": 64, "chunks": 1})  # 32 rows asked of 20


def _model(k: int, n: int, seed: int = 0) -> onnx.ModelProto:
    """MatMulInteger (u8 activations with a zero point, s8 weights) -> Cast -> Mul (scale) -> Add (bias)."""
    return matmul_integer_model(k, n, _weights(k, n, seed), [])


def _weights(k: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, (k, n), dtype=np.int8)


def test_the_amx_tiles_compile_to_tile_instructions(tmp_path):
    target = parse_target(AMX_TARGET)
    _, _, region, ir_text = fuse_kind(KIND, _model(200, 40), tmp_path, target=target)
    assert "x86_amx" in ir_text and "llvm.x86.tdpbusd.internal" in ir_text
    asm = compile_assembly(ir_text, target)
    for mnemonic in ("ldtilecfg", "tileloadd", "tdpbusd", "tilestored", "tilerelease", "vpdpbusd"):
        assert mnemonic in asm, mnemonic
    # no tiles for a target without AMX
    _, _, _, plain = fuse_kind(KIND, _model(200, 40), tmp_path, name="plain.so", target=parse_target("x86-64-v4"))
    assert "x86_amx" not in plain


_RUN = textwrap.dedent("""
    import faulthandler, json, sys
    import numpy as np, onnx, onnxruntime as ort
    faulthandler.enable()  # as pytest runs: a signal stack the AMX request must cope with
    import onnxopt.runtime as rt
    from onnxopt.runtime.matrix_engine import amx_status
    model, rows = sys.argv[1], int(sys.argv[2])
    sess = rt.InferenceSession(model)
    lib = rt.registered_library(sess, loadable=True)
    a = np.random.default_rng(1).integers(0, 256, (rows, 200), dtype=np.uint8)
    y = sess.run(None, {"a": a, "za": np.array(7, np.uint8), "scale": np.array(0.01, np.float32)})[0]
    np.save(sys.argv[3], y)
    print(json.dumps({"calls": sum(rt.kernel_calls(lib).values()), "amx": amx_status(lib)}))
""")


def _run_fresh(tmp_path, fused, rows: int, env=None, tag="") -> tuple[dict, np.ndarray]:
    """The written model loaded through the public loader in a fresh process, on `rows` rows of A: its report
    (kernel calls, the AMX state) and its output."""
    path, out = tmp_path / f"fused{tag}.onnx", tmp_path / f"y{tag}.npy"
    onnx.save(fused, path)
    r = subprocess.run([sys.executable, "-c", _RUN, str(path), str(rows), str(out)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), np.load(out)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
@pytest.mark.parametrize("rows", [16, 77, 130])
def test_a_library_for_an_amx_target_runs_here_and_says_which_tiles(tmp_path, rows):
    """Written for an AMX target, loaded in a fresh process through the public loader: the kernel runs, the answer
    is exact (onnxruntime's MatMulInteger on the original model), and the loader says whether AMX ran and why not."""
    fused, _, _, _ = fuse_kind(KIND, _model(200, 40, seed=rows), tmp_path, target=parse_target(AMX_TARGET))
    report, got = _run_fresh(tmp_path, fused, rows)
    assert report["calls"] == 1
    if HAS_AMX:
        assert report["amx"]["state"] == "granted" or "refused" in report["amx"]["state"], report
    else:
        assert report["amx"]["state"] == "no AMX on this CPU" and "dot-product tiles" in report["amx"]["why"]
    a = np.random.default_rng(1).integers(0, 256, (rows, 200), dtype=np.uint8)
    want = matmul_exact(a, _weights(200, 40, rows), 7, 0.01, 40)  # the exact integer sums, then the epilogue
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
@pytest.mark.parametrize("rows", [16, 40, 50, 77, 130])
def test_the_amx_kernels_whole_path_with_emulated_tiles(tmp_path, monkeypatch, rows):
    """Built with the tile programs as plain code (ONNXOPT_EMULATE_TILES=1), the library runs its AMX kernels here:
    the executor's blocks of 16 to 64 rows, the program as compiled, the rest of K on VNNI, the corrections and the
    epilogue, then the rows left to the vector tiles; exact, in a fresh process."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    fused, _, region, ir_text = fuse_kind(KIND, _model(200, 40, seed=rows), tmp_path, target=parse_target(AMX_TARGET))
    assert "x86_amx" not in ir_text and "tile.c0" in ir_text  # the tiles as stack buffers
    report, got = _run_fresh(tmp_path, fused, rows)
    assert report["calls"] == 1 and report["amx"]["state"] == "emulated"
    a = np.random.default_rng(1).integers(0, 256, (rows, 200), dtype=np.uint8)
    np.testing.assert_allclose(got, matmul_exact(a, _weights(200, 40, rows), 7, 0.01, 40), rtol=1e-6, atol=1e-5)
    assert region.params.has_fix  # the split pairs' corrections ran on the AMX rows too


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (amx_tile, amx_int8): the tiles cannot run here")
def test_amx_and_vector_tiles_agree_bit_for_bit(tmp_path):
    fused, _, _, _ = fuse_kind(KIND, _model(200, 72, seed=5), tmp_path, target=parse_target(AMX_TARGET))
    on, y_on = _run_fresh(tmp_path, fused, 150, tag="on")
    off, y_off = _run_fresh(tmp_path, fused, 150, env={"ONNXOPT_AMX": "0"}, tag="off")
    assert on["amx"]["state"] == "granted", on
    assert off["amx"]["state"] == "turned off (ONNXOPT_AMX=0)"
    np.testing.assert_array_equal(y_on, y_off)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
def test_optimize_for_an_amx_target_reports_the_instruction_and_the_engine(tmp_path):
    """`onnxopt.optimize` on a model quantize_dynamic wrote, for an AMX target: the region names its matrix
    instruction, and the report says whether the tiles ran here and why not."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import onnxopt

    rng = np.random.default_rng(0)
    k, n = 256, 96
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "W"], ["mm"]), onnx.helper.make_node("Add", ["mm", "bias"], ["y"])],
        "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [64, k])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, n])],
        [onnx.numpy_helper.from_array((rng.standard_normal((k, n)) / 16).astype(np.float32), "W"),
         onnx.numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    result = onnxopt.optimize(str(tmp_path / "q.onnx"), str(tmp_path / "out.onnx"), target=AMX_TARGET,
                              min_speedup=0.0, search_budget=5)
    report = result.report
    regions = [r for r in report["regions"] if r.get("matrix_instruction")]
    assert regions and all(r["matrix_instruction"] == "tdpbusd" for r in regions)
    amx = report["verification"]["amx"]
    if HAS_AMX:
        assert amx["state"] == "granted" or amx["state"].startswith("refused"), amx
    else:
        assert amx["state"] == "no AMX on this CPU", amx


def _qdq_u8_weights(k: int, n: int) -> onnx.ModelProto:
    """A QDQ MatMul unit whose u8 weights (zero point 30, values 0..255) do not fit s8 less their zero point: the
    kind stores B - 128 and its tiles add (128 - 30) x the row's sum of (a - za)."""
    w = np.random.default_rng(9).integers(0, 256, (k, n)).astype(np.uint8)
    inits = [numpy_helper.from_array(v, name) for name, v in (
        ("sa", np.array(0.02, np.float32)), ("za", np.array(7, np.uint8)), ("w", w),
        ("sw", np.array(0.01, np.float32)), ("zw", np.array(30, np.uint8)), ("sy", np.array(2.5, np.float32)),
        ("zy", np.array(0, np.uint8)))]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["af"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
             helper.make_node("MatMul", ["af", "wf"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, ["rows", k])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, ["rows", n])], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI (the AMX target's vector tiles)")
def test_u8_weights_row_term_on_emulated_amx_tiles(tmp_path, monkeypatch):
    """u8 weights with the row term, on the AMX path (tiles as plain code) and the vector tiles' rows after it, in a
    fresh process through the public loader: every output the spec's nearest step."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = _qdq_u8_weights(200, 40)
    fused, _, region, ir_text = fuse_kind(KIND, model, tmp_path, target=parse_target(AMX_TARGET))
    assert region.params.has_asum and "tile.c0" in ir_text
    path = tmp_path / "fused.onnx"
    onnx.save(fused, path)
    a = np.random.default_rng(2).integers(0, 256, (77, 200)).astype(np.uint8)  # 64 rows on tiles, 13 on vectors
    got, loader = run_written(path, a, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert sum(loader["calls"].values()) == 1 and loader["amx"] == "emulated", loader
    steps = make_session(exact_integer_reference(model), 1, optimization="none").run(None, {"a": a})[0]
    assert np.abs(got.astype(np.float64) - steps).max() <= 0.5 + STEP_BAND
    assert np.ptp(got) > 50  # not a saturated or constant output
