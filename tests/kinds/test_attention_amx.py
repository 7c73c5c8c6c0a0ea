"""The attention chain's two products in bfloat16 on AMX tiles (onnxopt/kinds/attention/amx.py, `--precision bf16`
and `auto` on an AMX-BF16 target).

On any host: both products map onto tdpbf16ps; the tile program, on the glue's pair layouts of K^T and V, computes
the instruction's rule in the reference interpreter; the kernel compiles to tile instructions on named registers.
With the tiles built as plain code (ONNXOPT_EMULATE_TILES=1) the written model runs the bf16 kernel in a fresh
process through the public loader; the bf16 kernel is told from the float32 one it carries by its error (bf16's
rounding shows, float32's does not), and turned off (ONNXOPT_AMX=0) the float32 kernel answers. Where the CPU has
AMX-BF16 the same model runs on the real tiles."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from amx_rules import tile_rule
from attention_models import attention_model, feeds_for
from fresh_process import run_written
from kind_harness import fuse_kind

import onnxopt
from onnxopt.codegen.compile import compile_assembly, new_module
from onnxopt.codegen.instructions import amx as amx_instructions
from onnxopt.codegen.target import host_cpu_flags, parse_target
from onnxopt.fusion.compute import bfloat16_bits
from onnxopt.kinds.attention import KIND, amx
from onnxopt.timing import make_session

AMX_BF16_TARGET = "cpu=x86-64-v4,+avx512bf16,+avx512vnni,+amx-tile,+amx-bf16"
AMX_FP16_TARGET = AMX_BF16_TARGET + ",+amx-fp16"  # Granite Rapids: no development host has it
BITS = {"bf16": bfloat16_bits, "f16": lambda x: np.asarray(x, np.float32).astype(np.float16).view(np.uint16)}
HAS_BF16 = "avx512_bf16" in host_cpu_flags()
HAS_AMX_BF16 = {"amx_tile", "amx_bf16"} <= host_cpu_flags()
# the kernel's vector code (vcvtneps2bf16) runs on emulated tiles too
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 (the AMX target's vector code)")
FAST = {"measure": False, "threads": 2, "cost_cache": False, "tune_budget": 0}


def pack_kt(k: np.ndarray, lp: int, dp: int, dtype: str = "bf16") -> np.ndarray:
    """K [L, d] as exec.c's attn_pack16 lays K^T out: [dp / 2][lp][2] 16-bit values, zeros past d and L."""
    L, d = k.shape
    kt = np.zeros((dp, lp), np.uint16)
    kt[:d, :L] = BITS[dtype](k).T
    return np.ascontiguousarray(kt.reshape(dp // 2, 2, lp).transpose(0, 2, 1))


def pack_v(v: np.ndarray, lk: int, dvp: int, dtype: str = "bf16") -> np.ndarray:
    """V [L, dv] as attn_pack16 lays it out: [lk / 2][dvp][2] 16-bit values, zeros past L and dv."""
    L, dv = v.shape
    full = np.zeros((lk, dvp), np.uint16)
    full[:L, :dv] = BITS[dtype](v)
    return np.ascontiguousarray(full.reshape(lk // 2, 2, dvp).transpose(0, 2, 1))


def test_both_products_map_onto_tdpbf16ps():
    ins, why = amx.choose(parse_target(AMX_BF16_TARGET))
    assert ins is amx_instructions.TDPBF16PS and why == ""
    none, why = amx.choose(parse_target("cpu=x86-64-v4,+avx512bf16"))
    assert none is None and "no bf16 matrix instruction" in why
    none, why = amx.choose(parse_target("x86-64-v3"))
    assert none is None and "16-lane" in why
    assert amx.choose(parse_target(AMX_FP16_TARGET), "f16")[0] is amx_instructions.TDPFP16PS
    none, why = amx.choose(parse_target(AMX_BF16_TARGET), "f16")
    assert none is None and "no f16 matrix instruction" in why


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("L,d,dv", [(100, 80, 80), (64, 64, 64), (7, 32, 3)])
def test_the_tile_program_computes_both_products_by_the_instructions_rule(L, d, dv, dtype):
    """The scores q16 K^T over the glue's K^T pairs, then p16 V over its V pairs, through the one program in the
    reference interpreter: tdpbf16ps's (tdpfp16ps's) rule bit for bit, and zeros in the padding columns."""
    rng = np.random.default_rng(L + d)
    ins = {"bf16": amx_instructions.TDPBF16PS, "f16": amx_instructions.TDPFP16PS}[dtype]
    lp, dp, lk, dvp = -(-L // 64) * 64, -(-d // 32) * 32, -(-L // 32) * 32, -(-dv // 64) * 64
    q = rng.standard_normal((16, d)).astype(np.float32)
    k = rng.standard_normal((L, d)).astype(np.float32)
    v = rng.standard_normal((L, dv)).astype(np.float32)
    prog = amx.program(ins)
    assert len(prog.shapes) <= 8 and all((s.rows, s.colsb) == (16, 64) for _, s in prog.shapes)

    def product(a16, b_pairs, a_cols, c_cols, chunks):
        """a16 [16][a_cols] bf16 bits times the pairs into c [16][c_cols] float32 (NaN where not written)."""
        c = np.full((16, c_cols), np.nan, np.float32)
        memory = {"a": a16.view(np.uint8).reshape(-1), "b": b_pairs.view(np.uint8).reshape(-1),
                  "c": c.view(np.uint8).reshape(-1)}
        prog.run(memory, {"chunks": chunks, "groups": c_cols // 64, "a_rs": a_cols * 2, "b_rs": c_cols * 4,
                          "c_rs": c_cols * 4})
        return c

    q16 = np.zeros((16, dp), np.uint16)
    q16[:, :d] = BITS[dtype](q)
    s = product(q16, pack_kt(k, lp, dp, dtype), dp, lp, dp // 32)
    np.testing.assert_array_equal(s[:, :L], tile_rule(q, k.T, dtype))
    assert not s[:, L:].any()

    p = rng.random((16, L)).astype(np.float32)
    p16 = np.zeros((16, lp), np.uint16)
    p16[:, :L] = BITS[dtype](p)
    o = product(p16, pack_v(v, lk, dvp, dtype), lp, dvp, lk // 32)
    np.testing.assert_array_equal(o[:, :dv], tile_rule(p, v, dtype))
    assert not o[:, dv:].any()


def test_the_kernel_compiles_to_tile_instructions_on_named_registers():
    target = parse_target(AMX_BF16_TARGET)
    params = KIND.find(onnx.shape_inference.infer_shapes(attention_model("bert", 1, 2, 8, 8, 64, "add", True)),
                       set(), [])[0].params
    module = new_module(target, "attention_amx")
    amx.define_attention_amx(module, "attn_amx", params, amx_instructions.TDPBF16PS, emulate=False)
    ir_text = str(module)
    assert '"llvm.x86.tdpbf16ps"(' in ir_text and "x86_amx" not in ir_text
    asm = compile_assembly(ir_text, target)
    for mnemonic in ("tileloadd", "tdpbf16ps", "tilestored", "vcvtneps2bf16"):
        assert mnemonic in asm, mnemonic
    assert "ldtilecfg" not in asm and "tilerelease" not in asm  # the task loads the one configuration


def _written(tmp_path, model, name="attention.so", products="bfloat16"):
    """The model's one attention chain built with bf16 (fp16) products for the AMX (AMX-FP16) target, written to a
    file."""
    target = AMX_FP16_TARGET if products == "float16" else AMX_BF16_TARGET
    fused, lib, region, _ = fuse_kind(KIND, onnx.shape_inference.infer_shapes(model), tmp_path, name,
                                      target=parse_target(target),
                                      params=lambda p: dataclasses.replace(p, products=products))
    path = tmp_path / "fused.onnx"
    onnx.save(fused, path)
    return path, region


def _scaled_error(want, got) -> float:
    return float(np.nanmax(np.abs(got.astype(np.float64) - want)) / np.nanmax(np.abs(want)))


def _check_written(tmp_path, model, feeds, env, amx_state, products="bfloat16", error=(1e-4, 2e-2)):
    """Runs the written model in a fresh process: the loader's AMX state, one kernel call, and the output within
    bf16's (fp16's) error of the float32 reference, with its rounding visible (`error`: the band); then with
    ONNXOPT_AMX=0, the float32 kernel's answer."""
    path, region = _written(tmp_path, model, products=products)
    want = make_session(model, 1, optimization="none").run(None, feeds)[0].astype(np.float64)
    got, loader = run_written(path, feeds, tmp_path, env=env)
    assert loader["amx"] == amx_state and sum(loader["calls"].values()) == 1, loader
    assert np.array_equal(np.isnan(got), np.isnan(want))
    err = _scaled_error(want, got)
    assert error[0] < err < error[1], err  # bf16 operands: about 2^-9 of the largest output, not float32's 1e-7
    off, loader = run_written(path, feeds, tmp_path, env={**env, "ONNXOPT_AMX": "0"})
    assert loader["amx"] == "turned off (ONNXOPT_AMX=0)"
    assert _scaled_error(want, off) < 1e-5
    return got


SHAPES = [  # form, batch, heads, queries, keys, head dim, mask, split heads
    ("bert", 1, 2, 20, 37, 64, "add", True),  # one partial block of 16 rows and 4; keys padded to 64
    ("sdpa", 2, 3, 33, 128, 80, "add", False),  # head dim 80: padded to 96 (K^T) and 128 (V's columns)
    ("bert", 1, 4, 16, 70, 32, "select", False),  # a bool mask, 70 keys (padded to 128)
    ("sdpa", 1, 2, 40, 40, 64, "fill", True),
]


@needs_bf16
@pytest.mark.parametrize("form,b,h,m,lq,d,mask,split", SHAPES)
def test_the_bf16_kernel_on_emulated_tiles_in_a_fresh_process(tmp_path, monkeypatch, form, b, h, m, lq, d, mask,
                                                               split):
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = attention_model(form, b, h, m, lq, d, mask, True, split_heads=split)
    _check_written(tmp_path, model, feeds_for(model), {"ONNXOPT_EMULATE_TILES": "1"}, "emulated")


@needs_bf16
@pytest.mark.parametrize("form,b,h,m,lq,d,mask,split", SHAPES[:2] + [
    ("sdpa", 1, 2, 20, 37, 40, "add", False)])  # K^T's rows of 37 keys and V's of 40 columns: converted tails
def test_the_fp16_kernel_on_emulated_amx_fp16_tiles(tmp_path, monkeypatch, form, b, h, m, lq, d, mask, split):
    """`--precision fp16` on an AMX-FP16 target (tdpfp16ps): float16's rounding (about 8x finer than bf16's), and
    the float32 kernel where the tiles are turned off (on this host without emulation, where it has no AMX-FP16)."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = attention_model(form, b, h, m, lq, d, mask, True, split_heads=split)
    _check_written(tmp_path, model, feeds_for(model), {"ONNXOPT_EMULATE_TILES": "1"}, "emulated", "float16",
                   (1e-5, 2.5e-3))


@needs_bf16
@pytest.mark.parametrize("keys", [1, 32])
def test_fewer_keys_than_the_tiles_pay_for_run_the_float32_kernel(tmp_path, monkeypatch, keys):
    """Below amx.MIN_KEYS keys the float32 kernel the library carries is faster: the glue runs it (float32's
    error, not bf16's), with the tiles available."""
    assert keys < amx.MIN_KEYS
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = attention_model("bert", 1, 2, 20, keys, 64, "add", True)
    feeds = feeds_for(model)
    path, _ = _written(tmp_path, model)
    want = make_session(model, 1, optimization="none").run(None, feeds)[0].astype(np.float64)
    got, loader = run_written(path, feeds, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert loader["amx"] == "emulated" and sum(loader["calls"].values()) == 1
    assert _scaled_error(want, got) < 1e-5


@needs_bf16
def test_a_row_masked_everywhere_gives_zeros_on_the_tiles(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = attention_model("bert", 1, 2, 5, 45, 32, "add", True)
    feeds = feeds_for(model)
    feeds["mask"][0, 0, 0, :] = -np.inf
    path, _ = _written(tmp_path, model)
    got, loader = run_written(path, feeds, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert loader["amx"] == "emulated" and np.all(got == 0)


@pytest.mark.skipif(not HAS_AMX_BF16, reason="this CPU has no AMX-BF16")
@pytest.mark.parametrize("form,b,h,m,lq,d,mask,split", SHAPES[:2] + [("bert", 1, 12, 128, 128, 64, "add", True)])
def test_the_bf16_kernel_on_the_real_tiles(tmp_path, form, b, h, m, lq, d, mask, split):
    """Where Linux refuses the tile state, the loader says so (and the float32 kernel answers): not this test's."""
    model = attention_model(form, b, h, m, lq, d, mask, True, split_heads=split)
    _check_written(tmp_path, model, feeds_for(model), {}, "granted")


def _bert_like(seq=40, heads=2, d=32):
    """An exported attention block's shape: projections (constant weights) into a split-head attention chain."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    width = heads * d
    nodes, inits = [], []
    for name in "qkv":
        inits.append(numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) * 0.1,
                                             f"w{name}"))
        inits.append(numpy_helper.from_array(np.array([1, seq, heads, d], np.int64), f"shape_{name}"))
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}_flat"]),
                  helper.make_node("Reshape", [f"{name}_flat", f"shape_{name}"], [f"{name}_tokens"])]
    chain = attention_model("bert", 1, heads, seq, seq, d, "none", False, split_heads=True)
    nodes += list(chain.graph.node)
    inits += list(chain.graph.initializer)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, seq, heads, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _attention_entries(report):
    return [r for r in report["regions"] if r["op_type"].startswith("attention_")]


@needs_bf16
@pytest.mark.parametrize("precision", ["bf16", "auto"])
def test_the_driver_lowers_attention_and_checks_it(tmp_path, monkeypatch, precision):
    """bf16 and auto (within the default budget) give the chain bf16 products on the tiles: the report names the
    instruction, counts the region as lowered, and the written model runs its kernels in a fresh process."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = _bert_like()
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "out.onnx"
    onnx.save(model, src)
    out.parent.mkdir()
    res = onnxopt.optimize(str(src), str(out), precision=precision, target=AMX_BF16_TARGET, **FAST)
    (entry,) = _attention_entries(res.report)
    assert entry["matrix_instruction"] == "tdpbf16ps" and entry["weights_dtype"] == "bfloat16"
    assert res.report["verification"]["ok"]
    assert entry["nodes"] in res.report["precision"]["lowered"]
    # the data-movement view of the bf16 kernel: its tasks' rows in whole tile blocks (2 heads, 40 queries: tasks
    # of 16 rows rather than four of 10)
    assert entry["data_movement"]["tiles"]["m"] == 16
    x = np.random.default_rng(1).standard_normal((1, 40, 64)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert loader["amx"] == "emulated" and loader["calls"].get(entry["op_type"]) == 1, loader
    want = make_session(model, 1, optimization="none").run(None, {"x": x})[0]
    assert 1e-4 < _scaled_error(want.astype(np.float64), got) < 2e-2


@needs_bf16
def test_auto_keeps_attention_float32_past_a_tight_budget(tmp_path, monkeypatch):
    """The budget's simulation rounds the chain's operands as its kernel does: past a budget bf16 cannot meet, the
    chain stays float32 and the report says why."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    src = tmp_path / "src.onnx"
    onnx.save(_bert_like(), src)
    res = onnxopt.optimize(str(src), str(tmp_path / "out.onnx"), precision="auto", accuracy_budget=1e-6,
                           target=AMX_BF16_TARGET, **FAST)
    (entry,) = _attention_entries(res.report)
    assert "matrix_instruction" not in entry and "weights_dtype" not in entry
    kept = [e for e in res.report["precision"]["float32_regions"] if e["nodes"] == entry["nodes"]]
    assert kept and "accuracy budget" in kept[0]["reason"]


@needs_bf16
def test_fp16_lowers_attention_on_an_amx_fp16_target_only(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    src = tmp_path / "src.onnx"
    onnx.save(_bert_like(), src)
    res = onnxopt.optimize(str(src), str(tmp_path / "a.onnx"), precision="fp16", target=AMX_FP16_TARGET, **FAST)
    (entry,) = _attention_entries(res.report)
    assert entry["matrix_instruction"] == "tdpfp16ps" and entry["weights_dtype"] == "float16"
    res = onnxopt.optimize(str(src), str(tmp_path / "b.onnx"), precision="fp16", target=AMX_BF16_TARGET, **FAST)
    (entry,) = _attention_entries(res.report)
    assert "matrix_instruction" not in entry
    kept = [e for e in res.report["precision"]["float32_regions"] if e["nodes"] == entry["nodes"]]
    assert kept and "no f16 matrix instruction" in kept[0]["reason"]


def test_a_target_without_amx_keeps_attention_float32_and_says_why(tmp_path):
    src = tmp_path / "src.onnx"
    onnx.save(_bert_like(), src)
    res = onnxopt.optimize(str(src), str(tmp_path / "out.onnx"), precision="bf16", target="x86-64-v3", **FAST)
    (entry,) = _attention_entries(res.report)
    assert "matrix_instruction" not in entry
    kept = [e for e in res.report["precision"]["float32_regions"] if e["nodes"] == entry["nodes"]]
    assert kept and kept[0]["reason"].startswith("attention: float32")

