"""The matrix instructions' descriptions (codegen/instructions/matrix.py, amx.py) and tile programs
(tile_program.py): packing, the accumulation rules, the operand rules, the mapper on them, and the same program
as LLVM IR. All on any host: nothing here runs a tile instruction."""

from __future__ import annotations

import numpy as np
import pytest

from onnxopt.codegen.compile import compile_assembly
from onnxopt.codegen.instructions import amx, mapping
from onnxopt.codegen.instructions.expr import evaluate
from onnxopt.codegen.instructions.matrix import TileShape, bf16_bits
from onnxopt.codegen.instructions.tile_program import Dot, Load, Repeat, Store, TileProgram, Zero, affine
from onnxopt.codegen.target import parse_target

INT8 = [amx.TDPBUSD, amx.TDPBSSD, amx.TDPBSUD, amx.TDPBUUD]
RANGES = {"u8": (0, 256, np.uint8), "s8": (-128, 128, np.int8)}


def _int8_operands(ins, rng, m=16, n=16, k=64):
    (lo_a, hi_a, ta), (lo_b, hi_b, tb) = (RANGES[d] for d in ins.source_dtypes)
    return rng.integers(lo_a, hi_a, (m, k)).astype(ta), rng.integers(lo_b, hi_b, (k, n)).astype(tb)


@pytest.mark.parametrize("ins", INT8, ids=lambda i: i.name)
def test_int8_rule_is_the_descriptions_computation(ins):
    """Tile bytes through `execute` equal the description's computation evaluated on the logical matrices."""
    rng = np.random.default_rng(len(ins.name))
    a, b = _int8_operands(ins, rng)
    c = rng.integers(-2**20, 2**20, (16, 16)).astype(np.int32)
    got = ins.execute(c.view(np.uint8).reshape(16, 64), ins.pack_a(a), ins.pack_b(b)).view(np.int32)
    want = evaluate(ins.computation, {"a": a, "b": b}, c)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, c + a.astype(np.int64) @ b.astype(np.int64))


def test_int8_sums_wrap_without_saturating():
    ins = amx.TDPBUUD
    a = np.full((16, 64), 255, np.uint8)
    b = np.full((64, 16), 255, np.uint8)
    c = np.full((16, 16), 2**31 - 1000, np.int32)
    got = ins.execute(c.view(np.uint8).reshape(16, 64), ins.pack_a(a), ins.pack_b(b)).view(np.int32)
    exact = (2**31 - 1000) + 64 * 255 * 255
    assert (got == np.int32(exact - 2**32)).all()  # past int32's top: wrapped, as the hardware does


def test_the_packed_layouts_put_each_element_where_the_description_says():
    ins = amx.TDPBF16PS
    a = np.arange(16 * 32, dtype=np.uint16).reshape(16, 32)
    b = np.arange(32 * 16, dtype=np.uint16).reshape(32, 16)
    ta, tb = ins.pack_a(a), ins.pack_b(b)
    for (m, k) in [(0, 0), (3, 7), (15, 31)]:
        row, byte = ins.a_at(m, k)
        assert ta[row, byte:byte + 2].view(np.uint16)[0] == a[m, k]
    for (k, n) in [(0, 0), (5, 9), (31, 15)]:
        row, byte = ins.b_at(k, n)
        assert tb[row, byte:byte + 2].view(np.uint16)[0] == b[k, n]
    assert tb.shape == (16, 64) and amx.TDPBUSD.pack_b(np.zeros((64, 16), np.int8)).shape == (16, 64)


@pytest.mark.parametrize("m,n,k", [(5, 7, 12), (16, 3, 4), (1, 16, 64)])
def test_partial_tiles(m, n, k):
    ins = amx.TDPBSSD
    rng = np.random.default_rng(m * n * k)
    a, b = _int8_operands(ins, rng, m, n, k)
    cs, as_, bs = ins.shapes_for(m, n, k)
    got = ins.execute(np.zeros((cs.rows, cs.colsb), np.uint8), ins.pack_a(a), ins.pack_b(b)).view(np.int32)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


def test_operand_rules():
    ins = amx.TDPBUSD
    with pytest.raises(ValueError, match="break its rules"):
        ins.check_shapes(TileShape(16, 64), TileShape(8, 64), TileShape(16, 64))  # A's rows are not C's
    with pytest.raises(ValueError, match="break its rules"):
        ins.check_shapes(TileShape(16, 64), TileShape(16, 32), TileShape(16, 64))  # A's bytes != 4 x B's rows
    with pytest.raises(ValueError, match="rows 1..16"):
        TileShape(17, 64).check()


def _reference_float(ins, a32, b32, c):
    """The rule written out once more, independently: per K pair, each product added in float32 in turn."""
    acc = c.astype(np.float32).copy()
    for k in range(a32.shape[1]):
        for mi in range(acc.shape[0]):
            for ni in range(acc.shape[1]):
                acc[mi, ni] = np.float32(acc[mi, ni] + np.float32(a32[mi, k] * b32[k, ni]))
    return acc


def test_bf16_rule_adds_each_product_in_turn():
    ins = amx.TDPBF16PS
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal((8, 4)).astype(np.float32)
    a16, b16 = bf16_bits(a), bf16_bits(b)
    a32 = (a16.astype(np.uint32) << 16).view(np.float32)
    b32 = (b16.astype(np.uint32) << 16).view(np.float32)
    c = rng.standard_normal((4, 4)).astype(np.float32) * 100
    cs, _, _ = ins.shapes_for(4, 4, 8)
    got = ins.execute(c.view(np.uint8).reshape(cs.rows, cs.colsb), ins.pack_a(a16), ins.pack_b(b16))
    np.testing.assert_array_equal(got.view(np.float32), _reference_float(ins, a32, b32, c))


def test_denormals_as_the_sdm_says():
    """TDPFP16PS uses fp16 denormal inputs; TDPBF16PS reads bf16 denormal inputs as zero; both flush denormal
    outputs."""
    ins = amx.TDPFP16PS
    a = np.array([[1.0, 2.0, 6e-8, 3.0]], np.float16)  # 6e-8: an fp16 denormal
    b = np.array([[1.0], [1.0], [1e4], [-1.0]], np.float16)
    cs, _, _ = ins.shapes_for(1, 1, 4)
    got = ins.execute(np.zeros((cs.rows, cs.colsb), np.uint8), ins.pack_a(a), ins.pack_b(b)).view(np.float32)
    d = np.float16(6e-8).astype(np.float32)
    assert d != 0 and got[0, 0] == np.float32(np.float32(3.0 + d * np.float32(1e4)) - np.float32(3.0))
    bf = amx.TDPBF16PS
    tiny = bf16_bits(np.array([1e-39], np.float32))  # a bf16 denormal (float32's too)
    a16 = np.array([[tiny[0], bf16_bits(np.array([1.0], np.float32))[0]]], np.uint16)
    b16 = bf16_bits(np.array([[1e30], [0.0]], np.float32))
    cs, _, _ = bf.shapes_for(1, 1, 2)
    got = bf.execute(np.zeros((cs.rows, cs.colsb), np.uint8), bf.pack_a(a16), bf.pack_b(b16)).view(np.float32)
    assert got[0, 0] == 0.0  # 1e-39 * 1e30 would be 1e-9: the input read as 0
    small = bf16_bits(np.array([[1e-20], [0.0]], np.float32))
    got = bf.execute(np.zeros((cs.rows, cs.colsb), np.uint8), bf.pack_a(small.T.copy()), bf.pack_b(small)).view(
        np.float32)
    assert got[0, 0] == 0.0  # 1e-40: a denormal output, flushed


def test_bf16_conversion_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, 1.0078125 + 2**-9, -2.5, np.inf, np.nan], np.float32)
    got = bf16_bits(x)
    back = (got.astype(np.uint32) << 16).view(np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8 halfway: to even (1 + 2^-6)
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == 1.015625
    assert back[3] == 1.0078125 + 2**-7 or back[3] == 1.0078125  # above half rounds up
    assert back[4] == -2.5 and np.isinf(back[5]) and np.isnan(back[6])


def _gemm(a, b, acc):
    from onnxopt.codegen.instructions.matrix import gemm_description

    return gemm_description("op", a, b, acc, 64, 48, 256)


def test_the_mapper_matches_dtypes_and_maps_a_gemm_once():
    assert len(mapping.mappings(_gemm("u8", "s8", "s32"), amx.TDPBUSD.computation)) == 1
    assert mapping.mappings(_gemm("u8", "s8", "s32"), amx.TDPBSSD.computation) == []  # u8 is not s8
    assert len(mapping.mappings(_gemm("bf16", "bf16", "f32"), amx.TDPBF16PS.computation)) == 1


def test_the_mapper_on_a_convolution_onto_amx():
    """The thesis's C2D (Table 5.3: 35 mappings onto a Tensor Core) onto tdpbusd: the same loop structure, the
    same 35."""
    from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, mul

    loops = tuple(Loop(n, 8) for n in "n k p q".split()) + tuple(Loop(n, 3, reduce=True) for n in ("rc", "rr", "rs"))
    c2d = Computation("C2D", loops, access("O", "s32", "n", "k", "p", "q"),
                      mul("s32", cast("s32", access("A", "u8", "n", "rc", "2*p+rr", "2*q+rs")),
                          cast("s32", access("W", "s8", "k", "rc", "rr", "rs"))))
    found = mapping.mappings(c2d, amx.TDPBUSD.computation)
    assert len(found) == 35 and all(mapping.valid(c2d, amx.TDPBUSD.computation, m) for m in found)


def _program(ins, tiles=None):
    cs, as_, bs = ins.shapes_for(16, 16, 64 // ins.element_bytes)
    steps = (Zero("c"), Repeat("i", affine("n"), (Load("a", "a", affine((as_.colsb, "i")), affine("lda")),
                                                 Load("b", "b", affine((bs.rows * bs.colsb, "i")), affine(const=64)),
                                                 Dot(ins, "c", "a", "b"))),
             Store("c", "c", affine(const=0), affine(const=64)))
    return TileProgram("t", tuple(tiles or (("c", cs), ("a", as_), ("b", bs))), steps, (ins,))


def test_programs_are_checked_when_made():
    ins = amx.TDPBUSD
    with pytest.raises(ValueError, match="not configured"):
        _program(ins, (("c", TileShape(16, 64)), ("a", TileShape(16, 64))))
    with pytest.raises(ValueError, match="the engine has 8"):
        TileProgram("many", tuple((f"t{i}", TileShape(16, 64)) for i in range(9)), ())
    with pytest.raises(ValueError, match="break its rules"):
        _program(ins, (("c", TileShape(16, 64)), ("a", TileShape(16, 32)), ("b", TileShape(16, 64))))


def test_a_program_runs_a_k_loop_in_the_interpreter():
    ins = amx.TDPBSSD
    rng = np.random.default_rng(9)
    a, b = _int8_operands(ins, rng, 16, 16, 192)
    memory = {"a": a.view(np.uint8).reshape(-1).copy(),
              "b": np.concatenate([ins.pack_b(b[64 * i:64 * (i + 1)]).reshape(-1) for i in range(3)]),
              "c": np.zeros(1024, np.uint8)}
    _program(ins).run(memory, {"n": 3, "lda": 192})
    np.testing.assert_array_equal(memory["c"].view(np.int32).reshape(16, 16), a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("ins", amx.INSTRUCTIONS, ids=lambda i: i.name)
def test_each_instruction_compiles_from_its_program(ins):
    """The program as LLVM IR, for a CPU with the instruction: one tile configuration, the loop keeps the tile in
    a register (no spill to the stack), the instruction itself in the loop."""
    from llvmlite import ir

    from onnxopt.codegen.compile import new_module

    target = parse_target("cpu=graniterapids")
    module = new_module(target, "t")
    i64, ptr = ir.IntType(64), ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, i64, i64]), name="t")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pa, pb, pc, n, lda = fn.args
    _program(ins).emit(b, {"a": pa, "b": pb, "c": pc}, {"n": n, "lda": lda})
    b.ret_void()
    asm = compile_assembly(str(module), target)
    assert asm.count("ldtilecfg") == 1 and "tilerelease" in asm
    assert ins.name in asm and asm.count("tilestored") == 1
