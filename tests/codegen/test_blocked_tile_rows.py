"""Several tiles in one call of a blocked convolution tile (codegen/compute/blocked_tile.py): the tiles of a row
(the COUNT slot), and for a depthwise tile the rows of a column (the ROWS slots).

The glue passes COUNT tiles of `mi` pixels that sit side by side in one row (compute_exec.c, afusion_exec.c,
winograd_exec.c): tile t reads its pixels from A + t * mi * A_MS and writes them at t * mi * LDC past the outputs,
with the epilogue (a bias per channel, a residual per position) on each. These tests call the generated functions
directly and compare every written vector with numpy, and check that nothing past the last tile is written."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from onnxopt.codegen.compile import new_module
from onnxopt.codegen.compute import tile as ct
from onnxopt.codegen.compute.blocked_tile import (
    SLOT_COUNT,
    SLOT_DW_A_ROW,
    SLOT_DW_C_ROW,
    SLOT_DW_ROWS,
    define_blocked_tile_functions,
    define_depthwise_tile_functions,
)
from onnxopt.codegen.compute.tile import TileSpec
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import missing_cpu_flags, parse_target

from onnxopt.fusion.compute import ACC
from onnxopt.fusion.region import EwOp, EwProgram, Value

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_microkernel import LEVELS, _identity_program, _Jit


def _bias_residual_relu() -> tuple[EwProgram, tuple[int, ...]]:
    """y = Relu(acc + bias + residual): a CHANNEL and a POSITION input, as a ResNet block's last convolution."""
    x = [Value(ACC, "float32"), Value("bias", "float32"), Value("res", "float32")]
    ops = [EwOp("Add", (ACC, "bias"), "t1", "float32"), EwOp("Add", ("t1", "res"), "t2", "float32"),
           EwOp("Relu", ("t2",), "y", "float32")]
    return EwProgram(inputs=x, consts={}, ops=ops, outputs=[Value("y", "float32")]), (ct.CHANNEL, ct.POSITION)


def _tiles(level: str):
    target = parse_target(level)
    missing = missing_cpu_flags(target.required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)} for {level}")
    tile = select(target).tile
    prog, kinds = _bias_residual_relu()
    module = new_module(target, "rows")
    names = define_blocked_tile_functions(module, "row", TileSpec(tile, prog, kinds, packed_a=True), target.features)
    return tile, _Jit(target, str(module)), names


def _run(fn, tile, mi: int, nv: int, count: int, lanes: list[int], k: int, rng):
    """One call over `count` tiles (count 0 means one); returns (the output buffer, the wanted values by position)."""
    L, tiles = tile.lanes, max(count, 1)
    pixels = tiles * mi
    a_ms = L + 3  # pixels of A need not be packed
    koff = rng.permutation(4 * k)[:k].astype(np.int64)  # taps at scattered offsets
    a_buf = rng.standard_normal((pixels - 1) * a_ms + 4 * k + 1).astype(np.float32)
    b_rows = rng.standard_normal((k, tile.ni * L)).astype(np.float32)  # packed weights, rows ni * L floats
    voff = np.arange(nv, dtype=np.int64) * L
    bias = rng.standard_normal(tile.ni * L).astype(np.float32)
    coff = np.array([j * (L + 2) + 1 for j in range(nv)], np.int64)
    ldc = int(coff[-1]) + L + 5
    size = (pixels + 2) * ldc  # room past the last tile, which must stay untouched
    res = rng.standard_normal(size).astype(np.float32)
    out = np.full(size, np.nan, np.float32)

    t = np.zeros(ct.SLOTS, np.int64)
    t[ct.SLOT_A], t[ct.SLOT_A_MS] = a_buf.ctypes.data, a_ms
    t[ct.SLOT_B], t[ct.SLOT_KOFF], t[ct.SLOT_K], t[ct.SLOT_LDC] = b_rows.ctypes.data, koff.ctypes.data, k, ldc
    t[SLOT_COUNT] = count
    t[ct.SLOT_VOFF:ct.SLOT_VOFF + nv] = voff
    t[ct.SLOT_COFF:ct.SLOT_COFF + nv] = coff
    t[ct.SLOT_LANES:ct.SLOT_LANES + nv] = lanes
    t[ct.SLOT_OUT] = out.ctypes.data
    t[ct.SLOT_EXTRA], t[ct.SLOT_EXTRA + 1] = bias.ctypes.data, res.ctypes.data
    fn(t.ctypes.data)

    want = {}
    for p in range(pixels):
        a_row = a_buf[p * a_ms + koff].astype(np.float64)
        for j in range(nv):
            at = p * ldc + int(coff[j])
            acc = a_row @ b_rows[:, j * L:(j + 1) * L].astype(np.float64)
            y = np.maximum(acc + bias[j * L:(j + 1) * L] + res[at:at + L], 0.0)
            y[lanes[j]:] = 0.0  # lanes past the channels are stored as zeros
            want[at] = y.astype(np.float32)
    return out, want


@pytest.mark.parametrize("level", LEVELS)
def test_a_call_computes_every_tile_of_its_row_and_nothing_past_it(level):
    tile, jit, names = _tiles(level)
    rng = np.random.default_rng(zlib.crc32(level.encode()))
    L = tile.lanes
    for mi in sorted({1, 2, tile.mi}):
        for nv in sorted({1, tile.ni}):
            fn = jit.function(names[mi - 1][nv - 1])
            for count in (0, 1, 2, 5):
                lanes = [L] * (nv - 1) + [int(rng.integers(1, L + 1))]
                out, want = _run(fn, tile, mi, nv, count, lanes, k=int(rng.integers(1, 40)), rng=rng)
                written = np.zeros(out.shape, bool)
                for at, y in want.items():
                    np.testing.assert_allclose(out[at:at + L], y, rtol=1e-4, atol=1e-4,
                                               err_msg=f"{level} m{mi}v{nv} count={count} at {at}")
                    written[at:at + L] = True
                assert np.isnan(out[~written]).all(), f"{level} m{mi}v{nv} count={count}: wrote outside its tiles"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kw,sw", [(3, 1), (5, 2)])
def test_a_depthwise_call_computes_every_row_it_is_given(level, kw, sw):
    """ROWS tiles one above the other (the glue's rows whose kernel rows lie inside the image): row q reads from
    A + q * A_ROW and writes at q * C_ROW past the outputs; a row more than asked must not be written."""
    target = parse_target(level)
    missing = missing_cpu_flags(target.required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)} for {level}")
    tile = select(target).tile
    L, kh, mi = tile.lanes, 3, 4
    module = new_module(target, "dw_rows")
    spec = TileSpec(tile, _identity_program(), (), packed_a=True)
    names = define_depthwise_tile_functions(module, "dw", spec, target.features, mi, kw, sw, 1)
    jit = _Jit(target, str(module))  # owns the code: alive while fn runs
    fn = jit.function(names[mi - 1][0])
    rng = np.random.default_rng(kw * 10 + sw)
    W = (mi - 1) * sw + kw + 3  # input pixels per row
    for rows in (0, 1, 3):
        n = max(rows, 1)
        H = (n - 1) + kh + 1
        x = rng.standard_normal(H * W * L).astype(np.float32)
        w = rng.standard_normal(kh * kw * L).astype(np.float32)
        koff = np.array([(r * W + c) * L for r in range(kh) for c in range(kw)], np.int64)
        c_row = mi * L + 7
        out = np.full((n + 1) * c_row, np.nan, np.float32)
        t = np.zeros(ct.SLOTS, np.int64)
        t[ct.SLOT_A], t[ct.SLOT_A_MS], t[ct.SLOT_B] = x.ctypes.data, sw * L, w.ctypes.data
        t[ct.SLOT_KOFF], t[ct.SLOT_K], t[ct.SLOT_LDC] = koff.ctypes.data, kh * kw, L
        t[ct.SLOT_LANES] = L
        t[SLOT_DW_ROWS], t[SLOT_DW_A_ROW], t[SLOT_DW_C_ROW] = rows, W * L, c_row
        t[ct.SLOT_OUT] = out.ctypes.data
        fn(t.ctypes.data)
        img = x.reshape(H, W, L).astype(np.float64)
        filt = w.reshape(kh, kw, L).astype(np.float64)
        written = np.zeros(out.shape, bool)
        for q in range(n):
            for i in range(mi):
                want = sum(img[q + r, i * sw + c] * filt[r, c] for r in range(kh) for c in range(kw))
                at = q * c_row + i * L
                np.testing.assert_allclose(out[at:at + L], want, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{level} rows={rows} row {q} pixel {i}")
                written[at:at + L] = True
        assert np.isnan(out[~written]).all(), f"{level} rows={rows}: wrote outside its rows"
