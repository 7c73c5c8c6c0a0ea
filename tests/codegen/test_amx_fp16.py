"""float16 GEMMs on AMX-FP16 tiles (`tdpfp16ps`, Granite Rapids; `--precision fp16` on an AMX-FP16 target).

The same tile program and glue as bfloat16's (codegen/compute/amx_tile.py), on float16 operands: the weights in
pairs along K, padded to whole tile steps of 32 (fusion/compute.py `lower_packed_b`), A rounded to float16 by the
set's rounding function (vcvtps2ph), the rows the tiles do not take on the register tiles that widen the pairs
(`f16_pairs`). No development host has AMX-FP16, so the tile program runs in the reference interpreter and the whole
path on emulated tiles (ONNXOPT_EMULATE_TILES=1) in a fresh process; where a CPU has AMX-FP16, on the real tiles."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from amx_rules import tile_rule
from fresh_process import run_written
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import make_model

import onnxopt
from onnxopt.codegen.compile import compile_assembly, new_module
from onnxopt.codegen.compute import amx_tile
from onnxopt.codegen.compute.describe import identity_program
from onnxopt.codegen.compute.tile import TileSpec
from onnxopt.codegen.instructions import amx as amx_instructions
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import host_cpu_flags, parse_target
from onnxopt.driver.precision import fp16_k_step, kernel_path
from onnxopt.fusion.compute import in_pairs

AMX_FP16_TARGET = "cpu=x86-64-v4,+avx512bf16,+avx512vnni,+amx-tile,+amx-bf16,+amx-fp16"
SPR_TARGET = "cpu=x86-64-v4,+avx512bf16,+avx512vnni,+amx-tile,+amx-bf16"
HAS_BF16 = "avx512_bf16" in host_cpu_flags()  # the AMX-FP16 target's vector code needs it to run here
HAS_AMX_FP16 = {"amx_tile", "amx_fp16"} <= host_cpu_flags()
HAS_AMX_BF16 = {"amx_tile", "amx_bf16"} <= host_cpu_flags()
FAST = {"measure": False, "threads": 2, "cost_cache": False, "tune_budget": 0}
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 (the AMX target's vector code)")


def test_the_descriptions_choose_tdpfp16ps_only_where_the_target_has_amx_fp16():
    ins, m = amx_tile.choose(parse_target(AMX_FP16_TARGET), 16, "f16")
    assert ins is amx_instructions.TDPFP16PS
    assert (m.of("m"), m.of("n"), m.of("k")) == ({"row"}, {"column"}, {"depth"})
    none, why = amx_tile.choose(parse_target(SPR_TARGET), 16, "f16")
    assert none is None and "no f16 matrix instruction" in why
    assert fp16_k_step(parse_target(AMX_FP16_TARGET)) == 32 and fp16_k_step(parse_target(SPR_TARGET)) == 1
    assert "tdpfp16ps" in kernel_path("fp16", parse_target(AMX_FP16_TARGET))
    assert "tdpfp16ps" not in kernel_path("fp16", parse_target(SPR_TARGET))


@pytest.mark.parametrize("groups,nv", [(1, 1), (2, 4)])
def test_the_tile_program_on_float16_pairs_is_the_instructions_rule(groups, nv):
    """The weights as the written model stores them (float16 pairs, K padded to 32) and A rounded into its
    zero-padded buffer, through the bfloat16 kernel's program on tdpfp16ps: the instruction's rule, bit for bit."""
    rng = np.random.default_rng(groups * 10 + nv)
    rows, k, panel, kp = 16 * groups, 100, 64, 128
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, panel)).astype(np.float32)
    a16 = np.zeros((rows, kp), np.float16)
    a16[:, :k] = a
    b = in_pairs(w[None], amx_tile.K_CHUNK).astype(np.float16).view(np.uint8).reshape(-1)
    prog = amx_tile.program(amx_instructions.TDPFP16PS, groups, nv, panel)
    sums = np.zeros(rows * nv * 16 * 4, np.uint8)
    prog.run({"a16": a16.view(np.uint8).reshape(-1), "b": b, "cin": np.zeros_like(sums), "cout": sums},
             {"a_rs": 2 * kp, "chunks": kp // amx_tile.K_CHUNK})
    np.testing.assert_array_equal(sums.view(np.float32).reshape(rows, nv * 16), tile_rule(a, w[:, :nv * 16], "f16"))


def test_the_fp16_tiles_compile_to_tdpfp16ps_and_vcvtps2ph():
    target = parse_target(AMX_FP16_TARGET)
    tile = select(target).packed_b_tile
    spec = TileSpec(tile, identity_program(), (), packed_a=False, packed_b=tile.ni * tile.lanes, b_format="f16_pairs")
    module = new_module(target, "amx_fp16")
    amx_tile.define_amx_tile_functions(module, "t", spec, "tdpfp16ps", emulate=False)
    asm = compile_assembly(str(module), target)
    for mnemonic in ("tileloadd", "tdpfp16ps", "tilestored", "vcvtps2ph"):
        assert mnemonic in asm, mnemonic
    assert "ldtilecfg" not in asm and "tdpbf16ps" not in asm


def _matmul(m: int, k: int, n: int, seed: int = 0) -> onnx.ModelProto:
    """x [1, m, k] @ w + b, the weights scaled as a trained layer's (within float16's range)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = (rng.standard_normal(n) * 0.1).astype(np.float32)
    return make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
                      [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], ir_version=8)


def _fp16_rule_rows(x, w, b, rows):
    return tile_rule(x[:rows], w, "f16") + b


@needs_bf16
@pytest.mark.parametrize("m,k,n", [(77, 600, 100), (40, 48, 64)])
def test_the_whole_path_on_emulated_tiles_in_a_fresh_process(tmp_path, monkeypatch, m, k, n):
    """77 rows: two blocks of 32 on the tiles (bit for bit tdpfp16ps's rule), 13 on the register tiles reading the
    same pairs (float32 A times the float16 weights); K = 600 in K blocks, K = 48 padded to 64. The function bodies
    (no library) read the same padded pairs."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = _matmul(m, k, n, seed=m)
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "out.onnx"
    onnx.save(model, src)
    out.parent.mkdir()
    res = onnxopt.optimize(str(src), str(out), precision="fp16", target=AMX_FP16_TARGET, **FAST)
    assert [r.get("matrix_instruction") for r in res.report["regions"]] == ["tdpfp16ps"]
    assert res.report["verification"]["ok"] and res.report["precision"]["written"]["precision"] == "fp16"
    packed = next(t for t in onnx.load(out).graph.initializer if t.data_type == TensorProto.FLOAT16)
    assert packed.dims[1] == -(-k // 32) * 32
    x = np.random.default_rng(1).standard_normal((1, m, k)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert loader["amx"] == "emulated" and sum(loader["calls"].values()) == 1 and loader["precision"] == "fp16"
    assert loader["amx_units"] == {"AMX-FP16": "runs"}
    w, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
    on_tiles = m // 16 * 16
    np.testing.assert_array_equal(got[0, :on_tiles], _fp16_rule_rows(x[0], w, b, on_tiles))
    w16 = w.astype(np.float16).astype(np.float64)
    rest = x[0, on_tiles:].astype(np.float64) @ w16 + b
    np.testing.assert_allclose(got[0, on_tiles:], rest, rtol=1e-5, atol=1e-5)
    bodies = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(bodies[0], x[0].astype(np.float64) @ w16 + b, rtol=1e-5, atol=1e-5)


@needs_bf16
def test_without_amx_fp16_the_register_tiles_read_the_pairs(tmp_path):
    """The same library on this CPU without emulation: where it has no AMX-FP16 (every development host), the
    register tiles take every row (float32 A, the float16 weights), and the loader still runs the kernel."""
    model = _matmul(50, 200, 64, seed=3)
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "out.onnx"
    onnx.save(model, src)
    out.parent.mkdir()
    onnxopt.optimize(str(src), str(out), precision="fp16", target=AMX_FP16_TARGET, **FAST)
    x = np.random.default_rng(2).standard_normal((1, 50, 200)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path)
    assert sum(loader["calls"].values()) == 1
    w, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
    if HAS_AMX_FP16 and loader["amx"] == "granted":
        assert loader["amx_units"] == {"AMX-FP16": "runs"}, loader
        np.testing.assert_allclose(got[0, :48], _fp16_rule_rows(x[0], w, b, 48), rtol=1e-5, atol=1e-5)
    else:
        if HAS_AMX_BF16 and not HAS_AMX_FP16:  # granted for AMX-BF16, but the loader names the missing unit
            assert loader["amx"] == "no AMX-FP16 on this CPU", loader
            assert loader["amx_units"]["AMX-FP16"].startswith("not on this CPU"), loader
        want = x[0].astype(np.float64) @ w.astype(np.float16).astype(np.float64) + b
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_a_target_without_amx_fp16_keeps_float16_unpaired(tmp_path):
    src, out = tmp_path / "src.onnx", tmp_path / "out.onnx"
    onnx.save(_matmul(8, 100, 32), src)
    res = onnxopt.optimize(str(src), str(out), precision="fp16", target="x86-64-v3", **FAST)
    assert [r.get("matrix_instruction") for r in res.report["regions"]] == [None]
    packed = next(t for t in onnx.load(out).graph.initializer if t.data_type == TensorProto.FLOAT16)
    assert packed.dims[1] == 100


@needs_bf16
def test_the_loader_names_the_amx_units_that_run_here(tmp_path):
    """A library with int8 tiles (AMX-INT8) and float16 ones (AMX-FP16): the loader's report names both units and
    says which run on this CPU. On a Sapphire Rapids the OS grants the tile state, the int8 tiles run, and the fp16
    kernel's register tiles run instead, which the state says rather than a bare "granted"."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W1"], ["h"], name="int8"),
                           helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("MatMul", ["r", "W2"], ["y"], name="float")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
                          [numpy_helper.from_array((rng.standard_normal((256, 96)) / 16).astype(np.float32), "W1"),
                           numpy_helper.from_array((rng.standard_normal((96, 64)) / 10).astype(np.float32), "W2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8,
                     nodes_to_quantize=["int8"])
    res = onnxopt.optimize(str(tmp_path / "q.onnx"), str(tmp_path / "out.onnx"), precision="fp16",
                           target=AMX_FP16_TARGET + ",+amx-int8", **FAST)
    assert sorted(r.get("matrix_instruction") for r in res.report["regions"]) == ["tdpbusd", "tdpfp16ps"]
    amx = res.report["verification"]["amx"]
    assert res.report["verification"]["ok"] and set(amx["units"]) == {"AMX-INT8", "AMX-FP16"}, amx
    has_int8 = {"amx_tile", "amx_int8"} <= host_cpu_flags()
    if HAS_AMX_FP16 and has_int8 and amx["state"] == "granted":
        assert set(amx["units"].values()) == {"runs"}, amx
    elif has_int8 and amx["state"].startswith("no AMX-FP16"):  # Sapphire Rapids
        assert amx["state"] == "no AMX-FP16 on this CPU (AMX-INT8 granted)", amx
        assert amx["units"]["AMX-INT8"] == "runs" and amx["units"]["AMX-FP16"].startswith("not on this CPU"), amx
        assert "AMX-FP16 run their dot-product tiles" in amx["why"], amx
    elif not has_int8:
        assert amx["state"] == "no AMX on this CPU", amx
        assert all("dot-product tiles" in why for why in amx["units"].values()), amx
    else:
        assert amx["state"].startswith("refused by the OS"), amx
