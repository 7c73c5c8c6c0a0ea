"""The packed-B tiles with bfloat16 weights (codegen/microkernel/outer_product.py, B_FORMATS; float16 ones:
tests/codegen/test_amx_fp16.py), run on their own: against numpy doing the same rounding, with float32 sums;
vdpbf16ps in the code exactly where the target has avx512_bf16; the K blocks the glue gives them (phase bits,
partial sums) as for float32."""

from __future__ import annotations

import ctypes
import functools
import re

import numpy as np
import pytest
from onnxopt.codegen.compile import compile_assembly, new_module, optimize
from onnxopt.codegen.compute import tile as ct
from onnxopt.codegen.compute.describe import b_format_for, identity_program
from onnxopt.codegen.compute.tile import TileSpec, define_tile_functions
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import missing_cpu_flags, parse_target

from onnxopt.fusion.compute import bfloat16_pairs, bfloat16_values

# (target, weight type) -> the format its tiles take
CASES = [("native", "bfloat16"), ("x86-64-v4", "bfloat16"), ("x86-64-v3", "bfloat16")]


def _spec(level: str, b_dtype: str):
    target = parse_target(level)
    tile = select(target).packed_b_tile
    fmt = b_format_for(b_dtype, target, tile.lanes)
    return target, TileSpec(tile, identity_program(), (), packed_a=False, packed_b=tile.ni * tile.lanes,
                            b_format=fmt)


@functools.cache
def _module(level: str, b_dtype: str):
    target, spec = _spec(level, b_dtype)
    module = new_module(target, "tiles")
    names = define_tile_functions(module, "tile", spec, target.features)
    return target, spec, str(module), names


def _llvm():
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm


@functools.cache
def _jit(level: str, b_dtype: str):
    target, spec, ir_text, names = _module(level, b_dtype)
    missing = missing_cpu_flags(target.required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)} for {level}")
    llvm = _llvm()
    machine = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.llvm_features, opt=3, codemodel="jitdefault")
    engine = llvm.create_mcjit_compiler(optimize(ir_text, target), machine)
    engine.finalize_object()
    return spec, engine, names


def _packed_weights(b: np.ndarray, b_dtype: str, panel: int) -> np.ndarray:
    """One panel [K][panel] of B as the region stores it (fusion/compute.py lower_packed_b)."""
    packed = b.reshape(1, *b.shape)
    return bfloat16_pairs(packed)[0]


def _want(a, b, spec) -> np.ndarray:
    """What the format computes, in float64: B rounded to its type, A to bfloat16 on vdpbf16ps."""
    b = bfloat16_values(b)
    if spec.b_format == "bf16_dot":
        a = bfloat16_values(a)
    return a.astype(np.float64) @ b.astype(np.float64)


def _call(engine, names, spec, a, packed_b, mi, nv, k, phase=0, sums=None):
    L = spec.tile.lanes
    out = np.full((mi, spec.packed_b), np.nan, np.float32)
    t = np.zeros(ct.SLOTS, np.int64)
    a = np.ascontiguousarray(a)
    t[ct.SLOT_A] = a.ctypes.data
    t[ct.SLOT_A_MS], t[ct.SLOT_A_KS] = a.shape[1], 1
    t[ct.SLOT_B] = packed_b.ctypes.data
    t[ct.SLOT_K], t[ct.SLOT_LDC], t[ct.SLOT_M0] = k, spec.packed_b, 0
    for j in range(nv):
        t[ct.SLOT_VOFF + j] = t[ct.SLOT_COFF + j] = j * L
        t[ct.SLOT_LANES + j] = L
    t[ct.SLOT_OUT] = out.ctypes.data
    t[ct.SLOT_PHASE] = phase
    if sums is not None:
        t[ct.SLOT_ACC] = sums.ctypes.data
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.get_function_address(names[mi - 1][nv - 1]))
    fn(t.ctypes.data)
    return out


@pytest.mark.parametrize("level,b_dtype", CASES)
@pytest.mark.parametrize("k", [1, 2, 37, 38, 256])
def test_low_precision_tile_matches_its_rounding(level, b_dtype, k):
    spec, engine, names = _jit(level, b_dtype)
    rng = np.random.default_rng(k)
    mi, nv = spec.tile.mi, spec.tile.ni
    a = rng.standard_normal((mi, k + 3)).astype(np.float32)  # rows k + 3 apart: a_ms is honoured
    a[:, k:] = np.nan  # past K: a read of it (an odd K's missing second k) would make NaNs
    b = rng.standard_normal((k, spec.packed_b)).astype(np.float32)
    got = _call(engine, names, spec, a, _packed_weights(b, b_dtype, spec.packed_b), mi, nv, k)
    want = _want(a[:, :k], b, spec)
    # float32 sums of exactly rounded products: within a few float32 roundings of the float64 sum
    bound = 1e-5 * (np.abs(a[:, :k]).astype(np.float64) @ np.abs(b).astype(np.float64)) + 1e-6
    assert np.all(np.abs(got - want) <= bound), (spec.b_format, np.max(np.abs(got - want) - bound))
    # and it is not the float32 product (the weights really were rounded)
    assert np.max(np.abs(got - a[:, :k] @ b)) > 1e-4


@pytest.mark.parametrize("level,b_dtype", [("native", "bfloat16"), ("x86-64-v3", "bfloat16")])
def test_partial_rows_and_vectors(level, b_dtype):
    spec, engine, names = _jit(level, b_dtype)
    rng = np.random.default_rng(5)
    k = 64
    for mi in range(1, spec.tile.mi + 1):
        for nv in range(1, spec.tile.ni + 1):
            a = rng.standard_normal((mi, k)).astype(np.float32)
            b = rng.standard_normal((k, spec.packed_b)).astype(np.float32)
            got = _call(engine, names, spec, a, _packed_weights(b, b_dtype, spec.packed_b), mi, nv, k)
            cols = nv * spec.tile.lanes
            np.testing.assert_allclose(got[:, :cols], _want(a, b, spec)[:, :cols], rtol=1e-4, atol=1e-4)
            assert np.all(np.isnan(got[:, cols:])), "wrote past its vectors"


def test_k_blocks_continue_the_sums():
    """The glue runs K in even blocks: phase bit 0 stores the sums, bit 1 continues them (tile.py)."""
    spec, engine, names = _jit("native", "bfloat16")
    rng = np.random.default_rng(9)
    mi, nv, k = spec.tile.mi, spec.tile.ni, 256
    a = rng.standard_normal((mi, k)).astype(np.float32)
    b = rng.standard_normal((k, spec.packed_b)).astype(np.float32)
    packed = _packed_weights(b, "bfloat16", spec.packed_b)  # [k/2][P][2]
    sums = np.zeros(mi * spec.packed_b, np.float32)
    half = k // 2
    _call(engine, names, spec, np.ascontiguousarray(a[:, :half]), np.ascontiguousarray(packed[:half // 2]), mi, nv,
          half, phase=1, sums=sums)
    got = _call(engine, names, spec, np.ascontiguousarray(a[:, half:]), np.ascontiguousarray(packed[half // 2:]),
                mi, nv, half, phase=2, sums=sums)
    np.testing.assert_allclose(got, _want(a, b, spec), rtol=1e-4, atol=1e-4)


def _function_asm(level: str, b_dtype: str, name: str) -> str:
    target, _, ir_text, _ = _module(level, b_dtype)
    asm = compile_assembly(ir_text, target)
    start = asm.index(f"\n{name}:")
    end = asm.find(".Lfunc_end", start)
    return asm[start:end]


def test_vdpbf16ps_only_where_the_target_has_avx512_bf16():
    full = "tile_m{}v{}"
    native = parse_target("native")
    tile = select(native).packed_b_tile
    name = full.format(tile.mi, tile.ni)
    if native.has("avx512bf16"):
        asm = _function_asm("native", "bfloat16", name)
        assert len(re.findall(r"\bvdpbf16ps\b", asm)) >= tile.mi * tile.ni
        assert "vcvtneps2bf16" in asm  # A rounded in the kernel
        assert "vfmadd" not in asm
        # each row's rounded A pair is broadcast from the stack buffer, not converted per pair
        assert asm.count("vcvtneps2bf16") == tile.mi
    for level in ("x86-64-v4", "x86-64-v3"):
        t = select(parse_target(level)).packed_b_tile
        asm = _function_asm(level, "bfloat16", full.format(t.mi, t.ni))
        assert "vdpbf16ps" not in asm and "vcvtneps2bf16" not in asm
        assert "vfmadd" in asm and "vpslld" in asm  # widened by a shift, float32 FMAs


def test_float16_weights_reach_a_kernel_only_on_amx_fp16_tiles():
    """Elsewhere they are only stored as float16, for the float32 tile (fusion/compute.py store_weights_f16):
    widening them in the K loop cost FMA throughput."""
    for level in ("x86-64-v3", "x86-64-v4"):
        with pytest.raises(ValueError, match="AMX-FP16"):
            b_format_for("float16", parse_target(level), 16)
    amx_fp16 = parse_target("cpu=x86-64-v4,+avx512bf16,+amx-tile,+amx-bf16,+amx-fp16")
    assert b_format_for("float16", amx_fp16, 16) == "f16_pairs"


def test_lowered_sets_are_other_sets():
    """A lowered tile set has its own digest (its symbols), float32's default format is f32."""
    from onnxopt.codegen.compute.tile_sets import TileSetRequest

    target = parse_target("x86-64-v4")
    tile = select(target).packed_b_tile
    base = TileSpec(tile, identity_program(), (), packed_a=False, packed_b=64)
    lowered = TileSpec(tile, identity_program(), (), packed_a=False, packed_b=64, b_format="bf16")
    assert base.b_format == "f32"
    assert TileSetRequest("nchw", base).key != TileSetRequest("nchw", lowered).key
