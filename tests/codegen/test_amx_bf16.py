"""bfloat16 GEMMs on AMX tiles (codegen/compute/amx_tile.py, `--precision bf16` on an AMX-BF16 target).

On any host: the descriptions choose tdpbf16ps and the plain mapping; the tile program, on the kernel's own packing,
computes tdpbf16ps's rule (each product added in turn) in the reference interpreter; the compiled tiles hold the AMX
instructions. With the tiles built as plain code (ONNXOPT_EMULATE_TILES=1) the written model runs its AMX path here,
in a fresh process through the public loader: the glue's blocks of 16 and 32 rows over the whole K, K
padded to whole steps, the epilogue, and the rows left to the register tiles. The AMX rows are bit-exact to the
instruction's rule, which the vdpbf16ps tiles are not (they sum each pair first), so the test sees which tiles ran.
Where the CPU has AMX-BF16 the same model runs on the real tiles. Their sums do not round as the SDM's pseudo-code
reads (measured on a Sapphire Rapids: no order of exact or rounded pair sums matched every bit), so there the AMX rows
are held to float32 accumulation's error bound over bf16-rounded operands and to differ from the vdpbf16ps tiles'."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from amx_rules import tile_rule, within_accumulation_bound
from fresh_process import run_written
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.codegen.compile import compile_assembly, new_module
from onnxopt.codegen.compute import amx_tile
from onnxopt.codegen.compute.describe import identity_program
from onnxopt.codegen.compute.tile import TileSpec
from onnxopt.codegen.instructions import amx as amx_instructions
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import host_cpu_flags, parse_target
from onnxopt.fusion.compute import bfloat16_bits, bfloat16_pairs
from onnxopt.verify import LOW_PRECISION_TOLERANCE, compare

AMX_BF16_TARGET = "cpu=x86-64-v4,+avx512bf16,+avx512vnni,+amx-tile,+amx-bf16"
HAS_BF16 = "avx512_bf16" in host_cpu_flags()
HAS_AMX_BF16 = {"amx_tile", "amx_bf16"} <= host_cpu_flags()
FAST = {"measure": False, "threads": 1, "cost_cache": False, "tune_budget": 0}
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 (the AMX target's vector tiles)")


def test_the_descriptions_choose_tdpbf16ps_and_the_plain_mapping():
    ins, m = amx_tile.choose(parse_target(AMX_BF16_TARGET), 16)
    assert ins is amx_instructions.TDPBF16PS
    assert (m.of("m"), m.of("n"), m.of("k")) == ({"row"}, {"column"}, {"depth"})
    none, why = amx_tile.choose(parse_target("cpu=x86-64-v4,+avx512vnni,+amx-tile,+amx-int8"), 16)
    assert none is None and "no bf16 matrix instruction" in why  # AMX-INT8 alone: tdpbusd does not take bf16
    none, why = amx_tile.choose(parse_target(AMX_BF16_TARGET), 8)
    assert none is None and "16-lane" in why


@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("nv", [1, 2, 3, 4])
def test_the_tile_program_on_the_kernels_packing_is_the_instructions_rule(groups, nv, blocks):
    """The packing the written model stores (bfloat16 pairs, K padded to 32) and A rounded into its zero-padded
    buffer, through the program over the whole K, or over two K blocks as the glue walks them (the first block's
    sums start from zeros and go to the partial sums, the second starts from those): tdpbf16ps's rule, bit for bit."""
    rng = np.random.default_rng(10 * groups + nv)
    rows, k, panel = 16 * groups, 100, 64
    kp = 128
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, panel)).astype(np.float32)
    a16 = np.zeros((rows, kp), np.uint16)
    a16[:, :k] = bfloat16_bits(a)
    b = bfloat16_pairs(w[None], amx_tile.K_CHUNK).view(np.uint8).reshape(-1)
    prog = amx_tile.program(amx_instructions.TDPBF16PS, groups, nv, panel)
    assert len(prog.shapes) <= 8
    sums = np.zeros(rows * nv * 16 * 4, np.uint8)
    kc = kp // blocks
    for block in range(blocks):
        k0 = block * kc
        memory = {"a16": a16.reshape(-1)[k0:].copy().view(np.uint8),  # from the block's first column, rows kp apart
                  "b": b[k0 * panel * 2:].copy(),  # the block's first pair row
                  "cin": sums.copy() if block else np.zeros_like(sums), "cout": sums}
        prog.run(memory, {"a_rs": 2 * kp, "chunks": kc // amx_tile.K_CHUNK})
    got = sums.view(np.float32).reshape(rows, nv * 16)
    np.testing.assert_array_equal(got, tile_rule(a, w[:, :nv * 16]))


def test_the_interpreter_refuses_a_read_past_the_weights():
    prog = amx_tile.program(amx_instructions.TDPBF16PS, 1, 1, 16)
    memory = {"a16": np.zeros(16 * 64, np.uint8), "b": np.zeros(10 * 64, np.uint8),  # 10 pair rows of the 16
              "cin": np.zeros(1024, np.uint8), "cout": np.zeros(1024, np.uint8)}
    with pytest.raises(IndexError, match="load of tile b"):
        prog.run(memory, {"a_rs": 64, "chunks": 1})


def test_the_amx_tiles_compile_to_tile_instructions():
    target = parse_target(AMX_BF16_TARGET)
    tile = select(target).packed_b_tile
    spec = TileSpec(tile, identity_program(), (), packed_a=False, packed_b=tile.ni * tile.lanes, b_format="bf16_dot")
    module = new_module(target, "amx_bf16")
    names = amx_tile.define_amx_tile_functions(module, "t", spec, "tdpbf16ps", emulate=False)
    # the tiles' rows, the rounding function, then the tiles writing a bfloat16 output (a sequence's bf16 tensor)
    assert [len(row) for row in names] == [tile.ni] * amx_tile.MAX_GROUPS + [1] + [tile.ni] * amx_tile.MAX_GROUPS
    assert names[-1][-1] == names[1][-1] + "h"
    ir_text = str(module)
    assert '"llvm.x86.tdpbf16ps"(' in ir_text and "x86_amx" not in ir_text  # named registers
    asm = compile_assembly(ir_text, target)
    for mnemonic in ("tileloadd", "tdpbf16ps", "tilestored", "vcvtneps2bf16"):
        assert mnemonic in asm, mnemonic
    # the task loads the configuration once (matrix_engine.c amx_tiles_configure), not every call
    assert "ldtilecfg" not in asm and "tilerelease" not in asm
    for groups, nv in [(1, 1), (1, 4), (2, 4)]:  # within the glue's: tiles 0-7, 16 rows of 64 bytes
        prog = amx_tile.program(amx_instructions.TDPBF16PS, groups, nv, 64)
        n = len(prog.shapes)
        assert n <= 8 and prog.configuration() == bytes([1] + [0] * 15 + [64, 0] * n + [0, 0] * (16 - n) +
                                                        [16] * n + [0] * (16 - n))


@needs_bf16
@pytest.mark.parametrize("k", [1, 16, 48, 64, 100])
def test_the_rounding_function_writes_every_value_and_the_zero_padding(k):
    """A's bfloat16 copy, rows K-rounded-up-to-32 apart: whole vectors by plain stores, the rest masked, and the
    padding zeroed even where K is a whole number of vectors (K = 48: 16 zeros after the last vector), into a
    buffer that held NaNs (the per-thread scratch keeps its last contents)."""
    from kernel_harness import jit_function

    from onnxopt.codegen.compute import tile as ct

    target = parse_target("cpu=x86-64-v4,+avx512bf16")
    module = new_module(target, "amx_round")
    amx_tile.define_amx_round_function(module, "round")
    fn, engine = jit_function(str(module), target, "round", 1)
    rows, kp = 3, -(-k // 32) * 32
    a = np.random.default_rng(k).standard_normal((rows, k + 5)).astype(np.float32)  # rows k + 5 apart
    a16 = np.full((rows, kp), 0x7FC0, np.uint16)  # bf16 NaN
    t = np.zeros(ct.SLOTS, np.int64)
    t[ct.SLOT_A], t[ct.SLOT_A_MS], t[ct.SLOT_K] = a.ctypes.data, a.shape[1], k
    t[amx_tile.SLOT_A16], t[amx_tile.SLOT_A16_ROWS] = a16.ctypes.data, rows
    fn(t.ctypes.data)
    np.testing.assert_array_equal(a16[:, :k], bfloat16_bits(a[:, :k]))
    assert not a16[:, k:].any()
    del engine


def _matmul(m: int, k: int, n: int, seed: int = 0, bias: bool = False) -> onnx.ModelProto:
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h" if bias else "y"])]
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        nodes.append(helper.make_node("Add", ["h", "b"], ["y"]))
        inits.append(numpy_helper.from_array(np.linspace(-1, 1, n).astype(np.float32), "b"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _build(tmp_path, model, target=AMX_BF16_TARGET):
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "out.onnx"
    onnx.save(model, src)
    out.parent.mkdir(exist_ok=True)
    res = onnxopt.optimize(str(src), str(out), precision="bf16", target=target, **FAST)
    return res, out


def _within_bf16(want, got) -> bool:
    return all(d.ok for d in compare(["y"], [want], [got], LOW_PRECISION_TOLERANCE))


@needs_bf16
@pytest.mark.parametrize("m,k,n", [(77, 600, 100), (40, 257, 100), (16, 64, 100), (32, 48, 100), (4096, 4096, 16)])
def test_the_whole_path_on_emulated_tiles_in_a_fresh_process(tmp_path, monkeypatch, m, k, n):
    """77 rows: two blocks of 32 on AMX, 13 on the register tiles; K = 600 in two K blocks (the sums wait in the
    task's buffer between them), A rounded once for the op's two panel tasks;
    K = 257: padded to 288 with zero rows, in the stored weights and in A's tile buffer; K = 48: whole vectors, then
    zeros alone up to 64; 4096 x 4096 (one panel, 16 row tasks of 256 rows): A's bf16 copy (1 MiB) holds 128 rows,
    so each task's rows go through it in two chunks."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    res, out = _build(tmp_path, _matmul(m, k, n, seed=m))
    regions = res.report["regions"]
    assert [r.get("matrix_instruction") for r in regions] == ["tdpbf16ps"]
    assert res.report["verification"]["amx"]["state"] == "emulated" and res.report["verification"]["ok"]
    packed = next(t for t in onnx.load(out).graph.initializer if t.data_type == TensorProto.BFLOAT16)
    assert packed.dims[1] == -(-k // 32) * 32  # whole tile steps
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert sum(loader["calls"].values()) == 1 and loader["amx"] == "emulated", loader
    w = numpy_helper.to_array(_matmul(m, k, n, seed=m).graph.initializer[0])
    want = tile_rule(x, w)
    on_tiles = m // 16 * 16
    np.testing.assert_array_equal(got[:on_tiles], want[:on_tiles])  # tdpbf16ps's rule: the AMX tiles ran
    assert _within_bf16(x @ w, got)
    # the function bodies read the same padded bf16 weights
    bodies = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _within_bf16(x @ w, bodies)


@needs_bf16
def test_turned_off_the_register_tiles_run_the_same_library(tmp_path, monkeypatch):
    """ONNXOPT_AMX=0: the loader says so, the vdpbf16ps tiles give the answer (within bf16's tolerance, not the
    AMX rule's bits)."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model = _matmul(64, 256, 48, seed=3, bias=True)
    _, out = _build(tmp_path, model)
    x = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1", "ONNXOPT_AMX": "0"})
    assert loader["amx"] == "turned off (ONNXOPT_AMX=0)" and sum(loader["calls"].values()) == 1
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _within_bf16(ref, got)


@needs_bf16
def test_a_library_for_an_amx_target_runs_here_and_says_which_tiles(tmp_path):
    """Built with real AMX tiles and loaded in a fresh process: where this CPU has AMX-BF16 they run and the AMX rows
    follow the instruction's rule (K = 400: two K blocks, the sums through the task's buffer between them);
    elsewhere the loader says why not and the vdpbf16ps tiles run."""
    model = _matmul(50, 400, 80, seed=4, bias=True)
    _, out = _build(tmp_path, model)
    x = np.random.default_rng(3).standard_normal((50, 400)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path)
    assert sum(loader["calls"].values()) == 1
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _within_bf16(ref, got)
    if HAS_AMX_BF16:
        assert loader["amx"] == "granted" or loader["amx"].startswith("refused"), loader
        if loader["amx"] == "granted":
            w = numpy_helper.to_array(model.graph.initializer[0])
            b = numpy_helper.to_array(model.graph.initializer[1])
            assert within_accumulation_bound(x[:48], w, got[:48] - b)
            assert not within_accumulation_bound(x[:48], w, x[:48].astype(np.float64) @ w)  # the bound sees bf16
            register_tiles, off = run_written(out, x, tmp_path, env={"ONNXOPT_AMX": "0"})
            assert off["amx"] == "turned off (ONNXOPT_AMX=0)"
            assert np.any(got[:48] != register_tiles[:48])  # another unit summed these rows
    else:
        assert loader["amx"] == "no AMX on this CPU", loader


def test_a_target_without_amx_keeps_pairs(tmp_path):
    """Only an AMX-BF16 target pads K to whole tile steps; vdpbf16ps's packing stays in pairs."""
    res, out = _build(tmp_path, _matmul(8, 257, 32), target="cpu=x86-64-v4,+avx512bf16")
    assert [r.get("matrix_instruction") for r in res.report["regions"]] == [None]
    packed = next(t for t in onnx.load(out).graph.initializer if t.data_type == TensorProto.BFLOAT16)
    assert packed.dims[1] == 258


def test_percent_of_peak_uses_the_tile_units_peak():
    """A bf16 GEMM with tdpbf16ps tiles is measured against the AMX bf16 peak where the machine model has it (the
    host has AMX and Linux granted it), else against vdpbf16ps's."""
    from types import SimpleNamespace

    from onnxopt.measure import peak_dtype

    region = SimpleNamespace(compute=SimpleNamespace(attrs=SimpleNamespace(b_dtype="bfloat16")),
                             params=SimpleNamespace(family="compute"))
    desc = SimpleNamespace(matrix_instruction="tdpbf16ps")
    amx_host = SimpleNamespace(peak_flops={"float32": 1.0, "bfloat16": 2.0, "amx_bf16": 8.0})
    plain_host = SimpleNamespace(peak_flops={"float32": 1.0, "bfloat16": 2.0})
    assert peak_dtype(region, desc, amx_host) == "amx_bf16"
    assert peak_dtype(region, desc, plain_host) == "bfloat16"
    assert peak_dtype(region, SimpleNamespace(matrix_instruction=""), amx_host) == "bfloat16"
