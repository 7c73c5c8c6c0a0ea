"""The outer-product micro-kernel: Chimera's register-tile solver, the per-target registry, the generated code.

- the solver's tiles for 32 x 16 and 16 x 8 registers, what the formula alone prefers, and that every tile fits;
- `select` picks the kernel each x86-64 level can run;
- on the AVX-512 and AVX2 targets the K loop of every tile function keeps C in registers (no vector instruction
  touches the stack), does MI * NV FMAs per k step (after LLVM's unrolling) on the target's full vector width;
- every (mi, nv) tile function, JIT-compiled in this process, computes `reference` on random data with random
  koff tables, partial lane counts and all four kinds of epilogue inputs, and writes nothing outside its lanes.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import re
import zlib

import numpy as np
import pytest

from onnxopt.codegen.compile import compile_assembly, new_module, optimize
from onnxopt.codegen.compute import tile as ct
from onnxopt.codegen.compute.tile import TileSpec, define_tile_functions
from onnxopt.codegen.microkernel.register_tile import BLOCK_FLOATS, RegisterTile, intensity, solve_register_tile
from onnxopt.codegen.microkernel.registry import MICRO_KERNELS, reference, select
from onnxopt.codegen.target import _llvm, missing_cpu_flags, parse_target
from onnxopt.fusion.compute import ACC
from onnxopt.fusion.region import EwOp, EwProgram, Value

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="the micro-kernels and the x86-64 level targets are x86-64 only")

LEVELS = ("x86-64-v4", "x86-64-v3", "x86-64")


def _identity_program() -> EwProgram:
    """What ComputeRule builds for a bare conv/matmul: the accumulator, copied to the one output."""
    return EwProgram(inputs=[Value(ACC, "float32")], consts={}, ops=[EwOp("Identity", (ACC,), "y", "float32")],
                     outputs=[Value("y", "float32")])


# ---- the register-tile solver -----------------------------------------------------------------------------------


def _as_tuple(t: RegisterTile):
    return t.mi, t.ni, t.mii


def test_solver_avx512_tile():
    t = solve_register_tile(32, 16)
    assert _as_tuple(t) == (6, 4, 2)
    assert t.lanes == 16 and t.columns == 64
    assert t.registers() == 6 * 4 + 4 + 2 == 30


def test_solver_avx2_tile():
    t = solve_register_tile(16, 8)
    assert _as_tuple(t) == (6, 2, 2)
    assert t.lanes == 8 and t.columns == 16
    assert t.registers() == 16


def test_formula_alone_prefers_the_square_tile():
    t = solve_register_tile(32, 16, tie_breaks=False)
    assert _as_tuple(t) == (5, 5, 1)
    assert t.registers() <= 32
    # ...because it has the higher intensity: the tie-breaks, not the formula, give 6 x 4.
    assert intensity(5, 5, 64) > intensity(6, 4, 64)


def test_intensity_formula():
    assert intensity(6, 4, 64) == pytest.approx(6 * 4 * 64 / (64 * (6 + 4) + 2 * 6 * 4))
    assert intensity(1, 1, 1) == pytest.approx(1 / 4)
    # Longer K loops amortize reading and writing C: the intensity grows towards MI*NI/(MI+NI).
    assert intensity(6, 4, 8) < intensity(6, 4, 64) < intensity(6, 4, 4096) < 6 * 4 / 10


def _brute_force(registers, lanes, ki=64, tie_breaks=True):
    """The best intensity over every tile that satisfies the constraints, found independently of the solver."""
    best = None
    for ni in range(1, registers + 1):
        for mi in range(1, registers + 1):
            for mii in range(1, mi + 1):
                if mi * ni + ni + mii > registers:
                    continue
                if tie_breaks and (BLOCK_FLOATS % (ni * lanes) or mii < min(2, mi) or mi % mii):
                    continue
                v = intensity(mi, ni, ki)
                best = v if best is None else max(best, v)
    return best


@pytest.mark.parametrize("tie_breaks", [True, False])
@pytest.mark.parametrize("registers,lanes", [(32, 16), (16, 8), (16, 4), (32, 8), (32, 4), (16, 16), (8, 4),
                                             (12, 8), (64, 16)])
def test_tile_fits_the_register_file_and_is_optimal(registers, lanes, tie_breaks):
    t = solve_register_tile(registers, lanes, tie_breaks=tie_breaks)
    assert t.lanes == lanes
    assert t.mi >= 1 and t.ni >= 1 and 1 <= t.mii <= t.mi
    assert t.registers() == t.mi * t.ni + t.ni + t.mii <= registers
    if tie_breaks:
        assert BLOCK_FLOATS % t.columns == 0
        assert t.mi % t.mii == 0
        assert t.mii >= min(2, t.mi)
    assert intensity(t.mi, t.ni, 64) == pytest.approx(_brute_force(registers, lanes, tie_breaks=tie_breaks))


def test_no_tile_fits_a_tiny_register_file():
    with pytest.raises(ValueError, match="no register tile"):
        solve_register_tile(2, 16)
    with pytest.raises(ValueError, match="no register tile"):
        solve_register_tile(32, 128)  # a vector wider than the 64-float block


# ---- the registry -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level,name,tile", [
    ("x86-64-v4", "avx512_fp32_outer_product", (6, 4, 2, 16)),
    ("x86-64-v3", "avx2_fp32_outer_product", (4, 2, 2, 8)),
    ("x86-64-v2", "sse_fp32_outer_product", (4, 2, 2, 4)),
    ("x86-64", "sse_fp32_outer_product", (4, 2, 2, 4)),
])
def test_select_by_target_features(level, name, tile):
    mk = select(parse_target(level))
    assert mk.name == name
    t = mk.tile
    assert (t.mi, t.ni, t.mii, t.lanes) == tile
    # The kernel's lanes are the target's vector width.
    assert t.lanes == parse_target(level).float32_lanes


def test_select_needs_every_required_feature():
    # AVX2 without FMA (no such CPU, but a custom target can say so) cannot use the AVX2 kernel.
    assert select(parse_target("cpu=x86-64,+avx,+avx2")).name == "sse_fp32_outer_product"
    assert select(parse_target("cpu=x86-64,+avx,+avx2,+fma")).name == "avx2_fp32_outer_product"
    assert select(parse_target("cpu=x86-64-v3,+avx512f")).name == "avx512_fp32_outer_product"


def test_registry_is_best_first_and_ends_with_a_fallback():
    assert MICRO_KERNELS[-1].requires == ()
    widths = [mk.lanes for mk in MICRO_KERNELS]
    assert widths == sorted(widths, reverse=True)


def test_reference_accumulates_in_double():
    a = np.full((1, 3), 1.0, np.float32)
    b = np.array([[1e8], [1.0], [-1e8]], np.float32)
    # float32 accumulation in this order would lose the 1.0.
    assert reference(a, b)[0, 0] == np.float32(1.0)
    assert reference(a, b).dtype == np.float32


# ---- the generated code -----------------------------------------------------------------------------------------


@functools.cache
def _module(level: str, packed: bool):
    target = parse_target(level)
    tile = select(target).tile
    spec = TileSpec(tile, _identity_program(), (), packed_a=packed)
    module = new_module(target, "tiles")
    names = define_tile_functions(module, "tile", spec, target.features)
    return target, tile, str(module), names


@functools.cache
def _assembly(level: str, packed: bool) -> dict[str, list[str]]:
    target, _, ir_text, _ = _module(level, packed)
    asm = compile_assembly(ir_text, target)
    functions: dict[str, list[str]] = {}
    current = None
    for line in asm.splitlines():
        m = re.match(r"^([A-Za-z_][\w.$]*):", line)
        if m and not m.group(1).startswith(".L"):
            current = m.group(1)
            functions[current] = []
        elif current is not None:
            functions[current].append(line.split("#")[0].rstrip())
    return functions


def _instructions(lines):
    return [ln.strip() for ln in lines if ln.startswith(("\t", " ")) and ln.strip() and not ln.strip().startswith(".")]


def _loops(lines):
    """Every block that ends with a jump back to its own label (a loop), as lists of instructions."""
    labels = {}
    loops = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\.L\w+):", line)
        if m:
            labels[m.group(1)] = i
            continue
        m = re.match(r"^\s+j[a-z]+\s+(\.L\w+)\s*$", line)
        if m and m.group(1) in labels:
            loops.append(_instructions(lines[labels[m.group(1)]:i + 1]))
    return loops


VECTOR_PREFIXES = ("v",)


def _fma_loops(level, packed, mi, nv):
    lines = _assembly(level, packed)[f"tile_m{mi}v{nv}"]
    loops = [lp for lp in _loops(lines) if any(ins.startswith("vfmadd") for ins in lp)]
    assert loops, f"no K loop with vfmadd in tile_m{mi}v{nv}:\n" + "\n".join(lines)
    return loops




def _variants(levels):
    for level in levels:
        tile = select(parse_target(level)).tile
        for packed in (True, False):
            for mi in range(1, tile.mi + 1):
                for nv in range(1, tile.ni + 1):
                    yield pytest.param(level, packed, mi, nv,
                                       id=f"{level}-{'packed' if packed else 'strided'}-m{mi}v{nv}")


@pytest.mark.parametrize("level,packed,mi,nv", list(_variants(("x86-64-v4", "x86-64-v3"))))
def test_k_loop_has_no_vector_stack_traffic(level, packed, mi, nv):
    for loop in _fma_loops(level, packed, mi, nv):
        spills = [ins for ins in loop if ins.startswith(VECTOR_PREFIXES) and "(%rsp)" in ins]
        assert not spills, f"vector spills/reloads in the K loop of m{mi}v{nv}: {spills}"


def _koff_loads(loop) -> int:
    """k steps per trip, counted as the loads of the B-row offset table (one 64-bit load per k step); the
    induction register's step does not tell, since LLVM may count in bytes."""
    return sum(bool(re.match(r"^movq\s+-?\d*\(%\w+(,%\w+(,\d)?)?\),\s*%\w+$", ins)) and "(%rsp)" not in ins
               for ins in loop)


@pytest.mark.parametrize("level,packed,mi,nv", list(_variants(("x86-64-v4", "x86-64-v3"))))
def test_k_loop_does_mi_times_nv_fmas_per_k_step(level, packed, mi, nv):
    for loop in _fma_loops(level, packed, mi, nv):
        fmas = sum(ins.startswith("vfmadd") for ins in loop)
        step = _koff_loads(loop)
        assert fmas == mi * nv * step, (fmas, step, loop)


@pytest.mark.parametrize("level,packed,mi,nv", list(_variants(("x86-64-v4", "x86-64-v3"))))
def test_k_loop_uses_the_full_vector_width(level, packed, mi, nv):
    reg = "zmm" if level == "x86-64-v4" else "ymm"
    other = {"zmm", "ymm", "xmm"} - {reg}
    for loop in _fma_loops(level, packed, mi, nv):
        for ins in loop:
            if ins.startswith("vfmadd"):
                assert f"%{reg}" in ins and not any(f"%{o}" in ins for o in other), ins


def test_full_tile_loop_is_the_outer_product():
    """The AVX-512 6 x 4 tile: 4 B vectors loaded (masked) per k, 24 FMAs, no stack traffic of any kind."""
    (loop,) = _fma_loops("x86-64-v4", True, 6, 4)
    step = _koff_loads(loop)
    loads = [ins for ins in loop if re.match(r"^vmov\w+\s+[^,]*\(.*\),\s*%zmm\d+ \{%k\d\}", ins)]
    assert len(loads) == 4 * step, loop
    assert sum(ins.startswith("vfmadd") for ins in loop) == 24 * step
    assert not [ins for ins in loop if "(%rsp)" in ins]


@pytest.mark.parametrize("level,fma,masked", [("x86-64-v4", "llvm.fma.v16f32", "llvm.masked.load.v16f32"),
                                              ("x86-64-v3", "llvm.fma.v8f32", "llvm.masked.load.v8f32"),
                                              ("x86-64", "llvm.fma.v4f32", "llvm.masked.load.v4f32")])
def test_ir_uses_the_targets_vector_type(level, fma, masked):
    _, tile, ir_text, names = _module(level, True)
    assert fma in ir_text and masked in ir_text
    assert [len(row) for row in names] == [tile.ni] * tile.mi
    assert names[tile.mi - 1][tile.ni - 1] == f"tile_m{tile.mi}v{tile.ni}"
    # The full tile: MI * NI FMA calls in its K loop.
    body = ir_text.split(f'define void @"tile_m{tile.mi}v{tile.ni}"')[1].split("\ndefine ")[0]
    assert body.count(f"call <{tile.lanes} x float> @\"{fma}\"") == tile.mi * tile.ni
    # Other widths never appear.
    for w in {4, 8, 16} - {tile.lanes}:
        assert f"llvm.fma.v{w}f32" not in ir_text


def test_optimized_v4_ir_keeps_the_fmas():
    target, tile, ir_text, _ = _module("x86-64-v4", True)
    opt = str(optimize(ir_text, target))
    body = opt.split(f"@tile_m{tile.mi}v{tile.ni}(")[1].split("\ndefine ")[0]
    assert "llvm.fma.v16f32" in body
    assert body.count("@llvm.fma.v16f32(") >= tile.mi * tile.ni


def test_ct_tile_slots_match_the_glue():
    """tile.py reads the ct_tile record by 8-byte slot; the glue's C reads the struct generated from the same
    declaration (codegen/glue/contract.py, whose layout tests/codegen/test_contract.py compiles and checks); the
    epilogue-input kinds are still written on both sides."""
    import os

    from onnxopt.codegen.glue.contract import GLUE
    from onnxopt.fusion import compute as rule

    limits = GLUE.limits()
    assert limits["CT_NV_MAX"] == ct.NV_MAX
    assert limits["CT_MAX_OUT"] == ct.MAX_OUTPUTS == rule.MAX_OUTPUTS
    assert limits["CT_MAX_EXTRA"] == ct.MAX_EXTRAS == rule.MAX_EXTRAS
    with open(os.path.join(os.path.dirname(ct.__file__), "..", "glue", "compute_exec.c")) as f:
        src = f.read()
    kinds = dict(re.findall(r"EX_(\w+) = (\d+)", src))
    assert {k.lower(): int(v) for k, v in kinds.items()} == ct.KIND_NAMES
    assert (rule.POSITION, rule.CHANNEL, rule.COLUMN, rule.SCALAR) == (ct.POSITION, ct.CHANNEL, ct.COLUMN, ct.SCALAR)


# ---- running the tile functions ---------------------------------------------------------------------------------


class _Jit:
    def __init__(self, target, ir_text):
        llvm = _llvm()
        mod = optimize(ir_text, target)
        machine = llvm.Target.from_triple(target.triple).create_target_machine(
            cpu=target.cpu, features=target.llvm_features, opt=3, codemodel="jitdefault")
        self.engine = llvm.create_mcjit_compiler(mod, machine)
        self.engine.finalize_object()

    def function(self, name):
        address = self.engine.get_function_address(name)
        assert address, name
        return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)


@functools.cache
def _jit(level: str, packed: bool, program_key: str = "identity"):
    target = parse_target(level)
    missing = missing_cpu_flags(target.required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)} for {level}")
    tile = select(target).tile
    prog, kinds = _PROGRAMS[program_key]()
    spec = TileSpec(tile, prog, kinds, packed_a=packed)
    module = new_module(target, "jit")
    names = define_tile_functions(module, "tile", spec, target.features)
    return tile, _Jit(target, str(module)), names


def _epilogue_program():
    """y = Relu((acc + channel) * scalar + column + position); also writes t1 = acc + channel."""
    x = [Value(ACC, "float32"), Value("pos", "float32"), Value("chan", "float32"), Value("col", "float32"),
         Value("scal", "float32")]
    ops = [EwOp("Add", (ACC, "chan"), "t1", "float32"), EwOp("Mul", ("t1", "scal"), "t2", "float32"),
           EwOp("Add", ("t2", "col"), "t3", "float32"), EwOp("Add", ("t3", "pos"), "t4", "float32"),
           EwOp("Relu", ("t4",), "y", "float32")]
    prog = EwProgram(inputs=x, consts={}, ops=ops, outputs=[Value("y", "float32"), Value("t1", "float32")])
    return prog, (ct.POSITION, ct.CHANNEL, ct.COLUMN, ct.SCALAR)


_PROGRAMS = {"identity": lambda: (_identity_program(), ()), "epilogue": _epilogue_program}


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _run_tile(fn, tile, mi, nv, *, packed, trans_a=False, lanes_used, k, rng, extras=(), n_out=1, m0=None):
    """Lay out a random problem for one call, run it; returns (C from the kernel, want, outputs, layout)."""
    L = tile.lanes
    # B: rows at random, non-monotonic offsets in one buffer; vectors of a row at random offsets voff[j].
    row_len = nv * L + 40
    b_buf = rng.standard_normal(max(k, 1) * row_len + 64).astype(np.float32)
    koff = rng.permutation(max(k, 1))[:k].astype(np.int64) * row_len + rng.integers(0, 8, size=k)
    voff = np.array([j * (L + 3) + int(rng.integers(0, 4)) for j in range(nv)], np.int64)
    b_tile = np.zeros((k, nv * L), np.float32)
    for kk in range(k):
        for j in range(nv):
            b_tile[kk, j * L:(j + 1) * L] = b_buf[koff[kk] + voff[j]:koff[kk] + voff[j] + L]
    # A: packed [K][MI] (rows past mi are padding), or a strided matrix (row-major or transposed).
    a_tile = rng.standard_normal((mi, k)).astype(np.float32)
    if packed:
        a_buf = np.full((max(k, 1), tile.mi), np.nan, np.float32)  # padding rows must never be read into C
        a_buf[:k, :mi] = a_tile.T
        a_ms, a_ks = 1, tile.mi
    elif trans_a:
        m_total = mi + 5
        a_buf = rng.standard_normal((max(k, 1), m_total)).astype(np.float32)
        a_buf[:k, :mi] = a_tile.T
        a_ms, a_ks = 1, m_total
    else:
        ld = k + 7
        a_buf = rng.standard_normal((mi, ld)).astype(np.float32)
        a_buf[:, :k] = a_tile
        a_ms, a_ks = ld, 1
    # C: rows of ldc floats, vector j of row i at (m0 + i) * ldc + coff[j]; NaN everywhere it must not write.
    m0 = int(rng.integers(0, 4)) if m0 is None else m0
    coff = np.array([j * (L + 2) + 1 for j in range(nv)], np.int64)
    ldc = int(coff[-1]) + L + 5
    outs = [np.full((m0 + mi + 1) * ldc, np.nan, np.float32) for _ in range(n_out)]
    lanes = np.array(lanes_used, np.int64)

    t = np.zeros(ct.SLOTS, np.int64)
    t[ct.SLOT_A] = _ptr(a_buf)
    t[ct.SLOT_A_MS], t[ct.SLOT_A_KS] = a_ms, a_ks
    t[ct.SLOT_B] = _ptr(b_buf)
    t[ct.SLOT_KOFF] = _ptr(koff) if k else _ptr(np.zeros(1, np.int64))
    t[ct.SLOT_K], t[ct.SLOT_LDC], t[ct.SLOT_M0] = k, ldc, m0
    t[ct.SLOT_VOFF:ct.SLOT_VOFF + nv] = voff
    t[ct.SLOT_COFF:ct.SLOT_COFF + nv] = coff
    t[ct.SLOT_LANES:ct.SLOT_LANES + nv] = lanes
    for o, buf in enumerate(outs):
        t[ct.SLOT_OUT + o] = _ptr(buf)
    for e, buf in enumerate(extras):
        t[ct.SLOT_EXTRA + e] = _ptr(buf)
    keep = (a_buf, b_buf, koff, outs, extras)  # alive through the call
    fn(t.ctypes.data)
    del keep
    layout = dict(m0=m0, ldc=ldc, coff=coff, lanes=lanes, L=L)
    return outs, reference(a_tile, b_tile), layout


def _gather(out, mi, nv, layout):
    """C[mi, nv * L] from the kernel's output buffer (NaN for lanes past lanes[j]), and the untouched rest."""
    L, ldc, m0 = layout["L"], layout["ldc"], layout["m0"]
    c = np.full((mi, nv * L), np.nan, np.float32)
    written = np.zeros(out.shape, bool)
    for i in range(mi):
        for j in range(nv):
            n = int(layout["lanes"][j])
            at = (m0 + i) * ldc + int(layout["coff"][j])
            c[i, j * L:j * L + n] = out[at:at + n]
            written[at:at + n] = True
    return c, out[~written]


def _lane_patterns(nv, L, rng):
    yield [L] * nv  # full vectors
    yield [1] * nv
    yield [int(x) for x in rng.integers(1, L + 1, size=nv)]
    yield [L] * (nv - 1) + [max(1, L - 3)]  # a tail vector


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "strided"])
@pytest.mark.parametrize("level", LEVELS)
def test_every_tile_function_matches_the_reference(level, packed):
    tile, jit, names = _jit(level, packed)
    rng = np.random.default_rng(zlib.crc32(f"{level}{packed}".encode()))
    for mi in range(1, tile.mi + 1):
        for nv in range(1, tile.ni + 1):
            fn = jit.function(names[mi - 1][nv - 1])
            for lanes in _lane_patterns(nv, tile.lanes, rng):
                for k in (1, 2, 3, 7, 64, 131):
                    (out,), want, layout = _run_tile(fn, tile, mi, nv, packed=packed, trans_a=not packed and k % 2,
                                                     lanes_used=lanes, k=k, rng=rng)
                    got, rest = _gather(out, mi, nv, layout)
                    mask = ~np.isnan(got)
                    assert mask.sum() == mi * sum(lanes)
                    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-5, atol=1e-5,
                                               err_msg=f"{level} m{mi}v{nv} lanes={lanes} K={k}")
                    assert np.isnan(rest).all(), f"{level} m{mi}v{nv} lanes={lanes}: wrote outside its lanes"


@pytest.mark.parametrize("level", LEVELS)
def test_empty_k_gives_zeros(level):
    tile, jit, names = _jit(level, True)
    rng = np.random.default_rng(1)
    fn = jit.function(names[-1][-1])
    (out,), _, layout = _run_tile(fn, tile, tile.mi, tile.ni, packed=True, lanes_used=[tile.lanes] * tile.ni, k=0,
                                  rng=rng)
    got, rest = _gather(out, tile.mi, tile.ni, layout)
    assert (got == 0).all() and np.isnan(rest).all()


@pytest.mark.parametrize("level", LEVELS)
def test_epilogue_inputs_of_every_kind(level):
    """Position (a residual), channel (a bias, per row), column (Gemm's bias, per column), scalar; two outputs."""
    tile, jit, names = _jit(level, True, "epilogue")
    rng = np.random.default_rng(2)
    L = tile.lanes
    for mi in range(1, tile.mi + 1):
        for nv in range(1, tile.ni + 1):
            fn = jit.function(names[mi - 1][nv - 1])
            lanes = [int(x) for x in rng.integers(1, L + 1, size=nv)]
            m0 = int(rng.integers(0, 5))
            coff_max = (nv - 1) * (L + 2) + 1
            ldc = coff_max + L + 5
            pos = rng.standard_normal((m0 + mi + 1) * ldc).astype(np.float32)
            chan = rng.standard_normal(m0 + mi + 1).astype(np.float32)
            col = rng.standard_normal(coff_max + L + 1).astype(np.float32)
            scal = np.array([rng.standard_normal()], np.float32)
            (y, t1), acc, layout = _run_tile(fn, tile, mi, nv, packed=True, lanes_used=lanes, k=19, rng=rng,
                                              extras=(pos, chan, col, scal), n_out=2, m0=m0)
            assert layout["ldc"] == ldc
            # The same epilogue in numpy, on the tile's positions.
            want_t1 = np.full((mi, nv * L), np.nan, np.float32)
            want_y = np.full((mi, nv * L), np.nan, np.float32)
            for i in range(mi):
                for j in range(nv):
                    n = lanes[j]
                    c = int(layout["coff"][j])
                    a = acc[i, j * L:j * L + n].astype(np.float64) + chan[m0 + i]
                    want_t1[i, j * L:j * L + n] = a
                    v = a * scal[0] + col[c:c + n] + pos[(m0 + i) * ldc + c:(m0 + i) * ldc + c + n]
                    want_y[i, j * L:j * L + n] = np.maximum(v, 0)
            for out, want in ((t1, want_t1), (y, want_y)):
                got, rest = _gather(out, mi, nv, layout)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True,
                                           err_msg=f"{level} m{mi}v{nv} lanes={lanes} m0={m0}")
                assert np.isnan(rest).all()
