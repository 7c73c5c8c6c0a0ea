"""The AFUSION tile algebra: Eq.4, chains, the SIMO union, T_red and row bands (OptiFX §2-3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxopt.fusion.afusion.tiles import (
    ConvGeometry,
    RowOp,
    band_rows,
    chain_tiles,
    input_tile,
    redundant_elements,
    redundant_flops,
    region_rows,
    simo_tile,
)

CONV3 = ConvGeometry(kernel=(3, 3), pads=(1, 1, 1, 1))
CONV1 = ConvGeometry(kernel=(1, 1))


def test_eq4_input_tile():
    assert input_tile(2, 2, (3, 3), (1, 1)) == (4, 4)  # the paper's (h' - 1) * st + R
    assert input_tile(2, 2, (1, 1), (1, 1)) == (2, 2)
    assert input_tile(2, 3, (3, 3), (2, 2)) == (5, 7)
    assert input_tile(1, 1, (3, 3), (1, 1), dilation=(2, 2)) == (5, 5)  # effective kernel 5
    assert input_tile(4, 4, 3, 1) == (6, 6)  # ints for square windows
    with pytest.raises(ValueError, match="at least 1x1"):
        input_tile(0, 2, (3, 3), (1, 1))


def test_chain_tiles_golden():
    # Fig.5: a 2x2 x3 tile of 3x3 -> 3x3 needs a 4x4 x2 tile and a 6x6 x1 tile.
    assert chain_tiles((2, 2), [CONV3, CONV3]) == [(6, 6), (4, 4), (2, 2)]
    assert chain_tiles((2, 2), [CONV3, CONV1]) == [(4, 4), (2, 2), (2, 2)]
    assert chain_tiles((2, 2), [CONV1, CONV3]) == [(4, 4), (4, 4), (2, 2)]
    assert chain_tiles((2, 2), [CONV1, CONV1]) == [(2, 2), (2, 2), (2, 2)]
    assert chain_tiles((1, 1), [ConvGeometry(kernel=3, stride=2), CONV1]) == [(3, 3), (1, 1), (1, 1)]


def test_simo_union_golden():
    # Fig.7a: x3 = x4 = 2x2 with consumers 1x1 and 3x3 -> x2 = 4x4; the 1x1 producer keeps x1 = 4x4.
    x2 = simo_tile([(2, 2), (2, 2)], [CONV1, CONV3])
    assert x2 == (4, 4)
    assert chain_tiles(x2, [CONV1])[0] == (4, 4)
    assert simo_tile([(3, 1), (1, 2)], [CONV1, CONV1]) == (3, 2)  # elementwise max
    with pytest.raises(ValueError, match="one output tile per consumer"):
        simo_tile([(2, 2)], [CONV1, CONV3])


def test_redundant_elements_golden_and_brute_force():
    assert redundant_elements(8, 8, 4, 4, 2, 2) == 132  # the paper's Fig.8
    assert redundant_elements(8, 8, 1, 1, 2, 2) == 0
    assert redundant_elements(8, 8, 4, 1, 2, 2) == 3 * 2 * 8  # bands: (T_H - 1) * phi_r * W
    # Brute force on Fig.6: 2x2 output tiles of a 3x3 (pad 1) consumer over an 8x8 intermediate; each task
    # computes the intermediate rows/cols its window covers, padding excluded.
    computed = 0
    for ty in range(4):
        for tx in range(4):
            r0, r1 = CONV3.input_rows(2 * ty, 2 * ty + 2, 8)
            c0, c1 = CONV3.input_rows(2 * tx, 2 * tx + 2, 8)
            computed += (r1 - r0) * (c1 - c0)
    assert computed - 8 * 8 == 132
    with pytest.raises(ValueError):
        redundant_elements(8, 8, 0, 4, 2, 2)


def test_redundant_flops():
    producer = ConvGeometry(kernel=(3, 3), in_channels=16, out_channels=32)
    assert redundant_flops(132, producer) == 132 * 32 * 2 * 16 * 3 * 3
    depthwise = ConvGeometry(kernel=(3, 3), groups=144, in_channels=144, out_channels=144)
    assert redundant_flops(10, depthwise) == 10 * 144 * 2 * 1 * 9


def test_geometry_validation_and_overlap():
    g = ConvGeometry(kernel=(3, 5), stride=(1, 2), pads=(1, 2))
    assert g.pads == (1, 2, 1, 2)
    assert g.overlap == (2, 3)
    assert ConvGeometry(kernel=2, stride=2).overlap == (0, 0)
    assert ConvGeometry(kernel=3, stride=4).overlap == (0, 0)  # the stride skips: no overlap, never negative
    assert g.output_size(10, 10) == (10, 5)
    with pytest.raises(ValueError, match="positive"):
        ConvGeometry(kernel=(0, 3))
    with pytest.raises(ValueError, match="pads"):
        ConvGeometry(pads=(1, 1, 1))


def test_band_rows_example():
    # 3x3 -> 3x3 (pad 1) on 8 rows, bands of 2 output rows: interior bands need 4 and 6 rows; the border bands
    # fewer (the padding is not computed). Over 4 bands the intermediate's 8 rows are computed 14 times.
    b = band_rows(2, [CONV3, CONV3], 8)
    assert b.heights == [8, 8, 8]
    assert b.bands == 4
    assert b.rows == [6, 4, 2]
    assert b.intermediate_rows == [4]
    assert b.computed_rows == [20, 14, 8]
    assert b.recomputed_rows == 6 == 3 * CONV3.overlap[0]  # (T_H - 1) * phi, as T_red with T_W = 1
    one_band = band_rows(8, [CONV3, CONV3], 8)
    assert one_band.bands == 1 and one_band.recomputed_rows == 0


def test_band_rows_stride_and_uneven_bands():
    # MobileNetV2's G4: depthwise 3x3 /2 (pad 1) -> 1x1 on 56 rows: the 1x1 needs no halo.
    dw = ConvGeometry(kernel=3, stride=2, pads=(1, 1))
    b = band_rows(4, [dw, CONV1], 56)
    assert b.heights == [56, 28, 28]
    assert b.rows == [9, 4, 4]  # (4 - 1) * 2 + 3 input rows
    assert b.recomputed_rows == 0
    # 1x1 then 3x3 /2 without padding on 73 rows (Inception's stem), bands of 8 over 36 output rows: 5 bands,
    # the last one 4 rows high.
    b = band_rows(8, [CONV1, ConvGeometry(kernel=3, stride=2)], 73)
    assert b.heights == [73, 73, 36]
    assert b.bands == 5
    assert b.rows[1] == 17
    assert b.recomputed_rows == 4 * 1  # phi = 3 - 2 = 1 row between adjacent bands


def test_region_rows_simo_union_and_miso():
    # SIMO: x2 read by a 1x1 and a 3x3; the 3x3's window decides the band of x2.
    ops = [RowOp(CONV1, "x1", "x2"), RowOp(CONV1, "x2", "x3"), RowOp(CONV3, "x2", "x4")]
    rr = region_rows(ops, {"x1": 16, "x2": 16, "x3": 16, "x4": 16}, 4)
    assert rr.intermediates == ("x2",)
    assert rr.outputs == ("x3", "x4")
    assert rr.band_rows["x2"] == 6
    assert rr.recomputed_rows["x2"] == 3 * 2
    # MISO: two branches write one row class (their sum) read by a 3x3; each branch reads its own input.
    ops = [RowOp(CONV1, "a", "s"), RowOp(ConvGeometry(kernel=1, stride=2), "b", "s"), RowOp(CONV3, "s", "y")]
    rr = region_rows(ops, {"a": 8, "b": 16, "s": 8, "y": 8}, 2)
    assert rr.inputs == ("a", "b")
    assert rr.band_rows["a"] == 4 and rr.band_rows["b"] == 7
    with pytest.raises(ValueError, match="different heights"):
        region_rows([RowOp(CONV1, "a", "b"), RowOp(ConvGeometry(kernel=1, stride=2), "a", "c")],
                    {"a": 8, "b": 8, "c": 4}, 2)


# Windows at least as tall as their stride (a 1x1 /2 skips rows, which a row range cannot express).
geometries = st.builds(
    lambda k, s, p, d: ConvGeometry(kernel=(k, k), stride=(min(s, k), min(s, k)), pads=(min(p, k - 1),) * 4,
                                    dilation=(d, d)),
    st.integers(1, 5), st.integers(1, 3), st.integers(0, 2), st.integers(1, 2))


@settings(max_examples=60, deadline=None)
@given(chain=st.lists(geometries, min_size=1, max_size=3), height=st.integers(12, 40), band=st.integers(1, 9))
def test_band_rows_properties(chain, height, band):
    """Clipping never makes a band bigger than Eq.4's tile; bands compute every row one whole-output band does
    (and maybe some twice); one band over the whole output recomputes nothing."""
    heights = [height]
    for g in chain:
        heights.append(g.output_size(heights[-1], 1)[0])
    if min(heights) < 1:
        return
    b = band_rows(band, chain, height)
    tiles = chain_tiles((min(band, heights[-1]), 1), chain)
    assert all(r <= t[0] for r, t in zip(b.rows, tiles))
    whole = band_rows(heights[-1], chain, height)
    assert all(c >= w for c, w in zip(b.computed_rows, whole.computed_rows))
    assert whole.recomputed_rows <= 0  # rows a strided consumer skips are never computed
