"""Chimera's data-movement model (onnxopt/annotate/data_movement.py): the paper's golden values, the pitfalls of
the digest, and a tile-trace simulator that walks the fused loop nest block by block."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxopt.annotate.data_movement import (balanced, bottleneck, closed_form_tile, gemm_chain, illegal, movement,
                                            orders, plan_levels, softmax_strategy, solve_tiles, trips)
from onnxopt.hardware.machine_model import Machine, MemoryLevel

MLKN = tuple("mlkn")
LEGAL_WITH_SOFTMAX = {"mlkn", "mlnk", "lmkn", "lmnk"}


def simulate(chain, order, tiles, partial=True):
    """Elements loaded when the fused nest runs block by block and each boundary tensor keeps its last tile: a
    tile moves when the block needs another one. `partial`: a ragged last block moves only what it covers."""
    t = trips(chain, tiles)
    ext = chain.extents
    shared = [x for x in order if x in chain.shared()]
    resident, moved = {}, 0
    for shared_idx in itertools.product(*(range(t[x]) for x in shared)):
        for op in chain.ops:
            private = [x for x in order if x in chain.private(op)]
            for private_idx in itertools.product(*(range(t[x]) for x in private)):
                idx = dict(zip(shared, shared_idx)) | dict(zip(private, private_idx))
                for ten in op.tensors:
                    key = tuple(idx[x] for x in ten.loops)
                    if not ten.boundary or resident.get(ten.name) == key:
                        continue
                    resident[ten.name] = key
                    moved += math.prod(min(tiles[x], ext[x] - idx[x] * tiles[x]) if partial else tiles[x]
                                       for x in ten.loops)
    return moved


# ---- Algorithm 1 and Table III ----
def test_golden_mlkn_volume_and_memory_use():
    # One batch of BERT-base's attention (M = L = 512, K = N = 64) with 128 x 128 score tiles.
    chain = gemm_chain(512, 64, 64, 512, middle="softmax")
    mv = movement(chain, MLKN, dict(m=128, l=128, k=64, n=64))
    assert (mv.dv, mv.mu) == (524_288, 32_768)
    assert mv.per_tensor == {"A": 131_072, "B": 131_072, "D": 131_072, "E": 131_072}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([64, 128, 256, 512]), st.sampled_from([32, 64, 80]), st.sampled_from([32, 64]),
       st.sampled_from([64, 128, 512]), st.data())
def test_table_three_closed_form(m, n, k, l, data):
    """With divisor tiles, Algorithm 1 on mlkn is Table III: DV = ML(K+N)(1/T_M + 1/T_L)."""
    tiles = {x: data.draw(st.sampled_from([d for d in (8, 16, 32, 64, 128) if e % d == 0] or [e]), label=x)
             for x, e in dict(m=m, n=n, k=k, l=l).items()}
    chain = gemm_chain(m, n, k, l)
    mv = movement(chain, MLKN, tiles)
    assert mv.dv == m * l * (k + n) * (1 / tiles["m"] + 1 / tiles["l"])
    assert mv.dv == movement(chain, MLKN, tiles, table_form=True).dv
    t = tiles
    assert mv.mu == max(t["m"] * t["k"] + t["k"] * t["l"] + t["m"] * t["l"], t["m"] * t["l"] + t["l"] * t["n"]
                        + t["m"] * t["n"])


def test_private_k_never_multiplies_the_second_gemms_tensors():
    chain = gemm_chain(512, 64, 256, 512)
    per = [movement(chain, MLKN, dict(m=64, l=64, k=tk, n=16)).per_tensor for tk in (8, 32, 256)]
    assert len({(p["D"], p["E"]) for p in per}) == 1
    assert len({p["A"] for p in per}) == 1 and len({p["B"] for p in per}) == 1  # K/T_K * T_K = K


def test_partial_tiles_pitfall():
    """T = 75 over 512 leaves a ragged block: Algorithm 1 counts whole footprints (940,800), Table III's form the
    extents (917,504); the simulator moving only what the ragged block covers agrees with the latter."""
    chain = gemm_chain(512, 64, 64, 512, middle="softmax")
    tiles = dict(m=75, l=75, k=16, n=16)
    assert movement(chain, MLKN, tiles).dv == 940_800
    assert movement(chain, MLKN, tiles, table_form=True).dv == 917_504
    assert simulate(chain, MLKN, tiles) == 917_504
    assert simulate(chain, MLKN, tiles, partial=False) == 940_800


def test_trip1_pitfall():
    """T_K = K and T_N = N: the tiles of A and E never move across those loops. Algorithm 1 as published says 655,360
    for every legal order; the simulator measures 589,824 (mlkn) and 196,608 (lmkn), as `ignore_trip1` does."""
    chain = gemm_chain(512, 64, 64, 512, middle="softmax")
    tiles = dict(m=64, l=256, k=64, n=64)
    want = {"mlkn": 589_824, "mlnk": 589_824, "lmkn": 196_608, "lmnk": 196_608}
    for name, dv in want.items():
        order = tuple(name)
        assert movement(chain, order, tiles).dv == 655_360
        assert movement(chain, order, tiles, ignore_trip1=True).dv == dv == simulate(chain, order, tiles)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 160), st.integers(1, 80), st.integers(1, 80), st.integers(1, 160), st.booleans(), st.data())
def test_legal_orders_match_the_simulator(m, n, k, l, batched, data):
    chain = gemm_chain(m, n, k, l, batch=2 if batched else None, middle="softmax")
    # at most 6 blocks per loop, so the simulated nest stays small; ragged blocks and single blocks included
    tiles = {x: data.draw(st.integers(-(-e // 6), e), label=x) for x, e in chain.extents.items()}
    for order in orders(chain):
        if illegal(chain, order) is None:
            assert movement(chain, order, tiles, ignore_trip1=True, table_form=True).dv == \
                simulate(chain, order, tiles)
            assert movement(chain, order, tiles, ignore_trip1=True).dv == simulate(chain, order, tiles, False)


# ---- orders and legality ----
def test_order_counts():
    assert len(orders(gemm_chain(8, 8, 8, 8))) == 24
    assert len(orders(gemm_chain(8, 8, 8, 8, batch=2))) == 120


def test_softmax_between_leaves_four_orders_and_mnkl_is_refused_with_its_reason():
    chain = gemm_chain(512, 64, 64, 512, middle="softmax")
    legal = {"".join(o) for o in orders(chain) if illegal(chain, o) is None}
    assert legal == LEGAL_WITH_SOFTMAX
    why = illegal(chain, tuple("mnkl"))
    assert "k (private to gemm1) is outside the shared loop l" in why and "softmax" in why and "not linear" in why
    # The literal search (DV alone, no legality) picks exactly that order: the reason the check exists.
    tiles = dict(m=64, l=1, k=64, n=64)
    by_dv = min(orders(chain), key=lambda o: movement(chain, o, tiles).dv)
    assert illegal(chain, by_dv) is not None


def test_without_a_middle_op_a_private_loop_outside_means_recomputation():
    chain = gemm_chain(512, 64, 64, 512)
    assert "repeated for every block of k" in illegal(chain, tuple("mkln"))
    assert "gemm1 would be recomputed for every block of n" in illegal(chain, tuple("mnlk"))
    # A loop of one block is nowhere: with T_K = K the order is fine.
    assert illegal(chain, tuple("mkln"), dict(m=64, l=64, k=64, n=16)) is None


# ---- tiles ----
def test_closed_form_tile_golden():
    t = closed_form_tile(8192, 16)
    assert t == pytest.approx(75.91, abs=0.01)
    assert t * t + 2 * 16 * t == pytest.approx(8192)  # on the capacity bound: MU = MC
    chain = gemm_chain(512, 64, 64, 512, middle="softmax")
    tiles = solve_tiles(chain, 8192, 16)
    assert tiles == dict(m=75, l=75, k=16, n=16)
    assert movement(chain, MLKN, tiles).mu == 8025 <= 8192
    assert movement(chain, MLKN, tiles, table_form=True).dv == 917_504
    # the real-valued optimum the integer tiles approach
    assert 2 * 512 * 512 * (64 + 64) / t == pytest.approx(884_023, abs=1)


def test_closed_form_is_the_kkt_point():
    """min 1/T_M + 1/T_L s.t. T_M T_L + alpha (T_M + T_L) = MC: the symmetric point beats its neighbours on the
    constraint."""
    mc, alpha = 8192, 16
    t = closed_form_tile(mc, alpha)
    for tm in (t * 0.8, t * 0.95, t * 1.05, t * 1.3):
        tl = (mc - alpha * tm) / (tm + alpha)
        assert 1 / tm + 1 / tl > 2 / t


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([128, 256, 512]), st.sampled_from([128, 208, 256, 512]), st.sampled_from([2048, 8192, 32768]),
       st.sampled_from([8, 16]))
def test_solver_is_near_the_brute_force_optimum(m, l, mc, alpha):
    chain = gemm_chain(m, 64, 64, l, middle="softmax")
    tiles = solve_tiles(chain, mc, alpha)
    got = movement(chain, MLKN, tiles, table_form=True).dv
    assert movement(chain, MLKN, tiles).mu <= mc
    # Every integer (T_M, T_L) at once, in Table III's form (checked against the model on the solver's tiles).
    tm, tl = np.meshgrid(np.arange(1, m + 1), np.arange(1, l + 1), indexing="ij")
    dv = (m * 64 + m * 64) * -(-l // tl) + (64 * l + 64 * l) * -(-m // tm)
    mu = np.maximum(tm * alpha + alpha * tl + tm * tl, tm * tl + tl * alpha + tm * alpha)
    best = int(dv[mu <= mc].min())
    assert got == dv[tiles["m"] - 1, tiles["l"] - 1]
    t = closed_form_tile(mc, alpha)
    bound = max(1 + t / x + 1 / min(x, t) for x in (m, l))  # the digest's error bound
    assert best <= got <= best * bound


def test_tiles_split_the_rows_across_cores():
    chain = gemm_chain(512, 64, 64, 512)
    assert solve_tiles(chain, 8192, 16, cores=16)["m"] == 32  # 16 blocks of rows, one per core
    heads = gemm_chain(512, 64, 64, 512, batch=12)
    assert solve_tiles(heads, 8192, 16, cores=16)["m"] == 75  # 12 heads x 7 row blocks already feed 16 cores
    assert solve_tiles(heads, 262144, 16, cores=16)["m"] == 256  # two row blocks per head


def test_balanced_tile_keeps_the_blocks_and_their_volume():
    chain = gemm_chain(512, 64, 64, 512)
    assert balanced(496, 512) == 256 and balanced(75, 512) == 74
    for t in (75, 496):
        a, b = dict(m=t, l=t, k=16, n=16), dict(m=balanced(t, 512), l=balanced(t, 512), k=16, n=16)
        assert movement(chain, MLKN, a, table_form=True).dv == movement(chain, MLKN, b, table_form=True).dv


# ---- several memory levels ----
def _machine(l2_bw=400e9, dram_bw=50e9):
    return Machine("test", 4, ["avx2"], {"float32": 1e12},
                   [MemoryLevel("L1", 4 * 32 * 1024, 1600e9), MemoryLevel("L2", 4 * 1024 * 1024, l2_bw),
                    MemoryLevel("L3", 16 * 1024 * 1024, 200e9), MemoryLevel("DRAM", None, dram_bw)])


def test_levels_nest_fit_and_move_less_outward():
    chain = gemm_chain(512, 64, 64, 512, batch=12, middle="softmax")
    plans = plan_levels(chain, _machine(), alpha=16)
    assert [p.name for p in plans] == ["L1", "L2", "L3"]
    for inner, outer in zip(plans, plans[1:]):
        assert all(outer.tiles[x] % inner.tiles[x] == 0 for x in inner.tiles)
        assert inner.dv >= outer.dv
    for p in plans:
        assert movement(chain, ("b",) + MLKN, p.tiles).mu <= p.capacity


def test_a_faster_feeder_moves_the_bottleneck():
    chain = gemm_chain(512, 64, 64, 512, batch=12, middle="softmax")
    slow = bottleneck(plan_levels(chain, _machine(l2_bw=20e9), alpha=16))
    assert slow.name == "L1"  # L2 feeds L1 and is starved
    fast = bottleneck(plan_levels(chain, _machine(l2_bw=4000e9), alpha=16))
    assert fast.name != "L1"


def test_softmax_keeps_the_row_or_goes_online():
    chain = gemm_chain(128, 64, 64, 128, middle="softmax")
    kind, why = softmax_strategy(chain, dict(m=32, l=128, k=16, n=16))
    assert kind == "row" and "spans the row" in why
    kind, why = softmax_strategy(chain, dict(m=32, l=64, k=16, n=16))
    assert kind == "online" and "rescaled" in why


# ---- conv chains ----
from onnxopt.annotate.data_movement import (ConvPair, conv_chain_flops, conv_chain_levels,  # noqa: E402
                                            conv_chain_movement, conv_chain_seconds, conv_chain_tiles)


def test_conv_chain_movement_by_hand():
    """C = conv 3x3 /2 (4 -> 8) then 1x1 (8 -> 6) to 10 x 10, in blocks of 5 whole rows and every channel: the digest's
    formulas term by term. A block's 5 output rows need 5 intermediate rows and (5 - 1) * 2 + 3 = 11 input rows of
    21 columns; each of the 2 blocks reads both weights; the output moves once."""
    g = ConvPair(ic=4, oc1=8, oc2=6, k1=3, k2=1, st1=2, st2=1, out_h=10, out_w=10)
    mv = conv_chain_movement(g, dict(h=5, w=10, c=8, i=4, o=6))
    assert mv.per_tensor == {"I": 2 * 4 * 11 * 21, "W1": 2 * 8 * 4 * 9, "W2": 2 * 6 * 8, "O2": 6 * 10 * 10}
    assert mv.dv == 1848 + 576 + 96 + 600
    assert mv.mu == max(4 * 11 * 21 + 8 * 4 * 9 + 8 * 5 * 10, 8 * 5 * 10 + 6 * 8 + 6 * 5 * 10)
    # the intermediate's channels in 2 blocks: the input moves once per block, the output's partial sums twice
    halves = conv_chain_movement(g, dict(h=5, w=10, c=4, i=4, o=6))
    assert halves.per_tensor["I"] == 2 * mv.per_tensor["I"] and halves.per_tensor["O2"] == 2 * 600
    # a 3x3 second convolution: 5 x 10 output pixels need 7 x 12 intermediate ones (the halo), 15 x 25 input ones
    g3 = ConvPair(ic=4, oc1=8, oc2=6, k1=3, k2=3, st1=2, st2=1, out_h=10, out_w=10)
    assert conv_chain_movement(g3, dict(h=5, w=10, c=8, i=4, o=6)).per_tensor["I"] == 2 * 4 * 15 * 25


def _all_tiles(g, lanes):
    def channels(e):
        return sorted({min(e, v) for v in range(lanes, e + lanes, lanes)})
    for th, tw in itertools.product(range(1, g.out_h + 1), range(1, g.out_w + 1)):
        for tc, ti, to in itertools.product(channels(g.oc1), channels(g.ic), channels(g.oc2)):
            yield dict(h=th, w=tw, c=tc, i=ti, o=to)


@settings(max_examples=25, deadline=None)
@given(ic=st.sampled_from([4, 8, 12]), oc1=st.sampled_from([4, 8, 16]), oc2=st.sampled_from([4, 12]),
       k1=st.sampled_from([1, 3]), k2=st.sampled_from([1, 3]), st1=st.sampled_from([1, 2]), h=st.integers(1, 7),
       w=st.integers(1, 7), capacity=st.integers(200, 6000), cores=st.sampled_from([1, 2]))
def test_conv_chain_tiles_are_the_least_movement_that_fits(ic, oc1, oc2, k1, k2, st1, h, w, capacity, cores):
    """Against every tile of a small chain (any rows and columns, channel blocks of 4): the chosen tiles fit the
    capacity, give every core a block, and move no more than the least-moving tiles that do the same."""
    g = ConvPair(ic, oc1, oc2, k1, k2, st1, 1, h, w)
    t = conv_chain_tiles(g, capacity, cores, lanes=4)
    fits = [(conv_chain_movement(g, c).dv, c) for c in _all_tiles(g, 4)
            if conv_chain_movement(g, c).mu <= capacity and -(-h // c["h"]) * -(-w // c["w"]) >= min(cores, h * w)]
    if not fits:  # nothing fits: the least memory
        assert conv_chain_movement(g, t).mu == min(conv_chain_movement(g, c).mu for c in _all_tiles(g, 4))
        return
    assert conv_chain_movement(g, t).mu <= capacity
    assert -(-h // t["h"]) * -(-w // t["w"]) >= min(cores, h * w)
    assert conv_chain_movement(g, t).dv == min(dv for dv, _ in fits)


def test_the_band_form_keeps_whole_rows_and_channels_and_grows_with_the_capacity():
    g = ConvPair(ic=64, oc1=128, oc2=64, k1=3, k2=1, st1=1, st2=1, out_h=56, out_w=56)  # Chimera's C3
    heights = []
    for capacity in (100_000, 150_000, 250_000, 1 << 22):  # its first weights alone are 73,728
        t = conv_chain_tiles(g, capacity, 2, 16, band=True)
        assert (t["w"], t["c"], t["i"], t["o"]) == (56, 128, 64, 64)
        assert conv_chain_movement(g, t).mu <= capacity
        heights.append(t["h"])
    assert heights == sorted(heights) and heights[0] < heights[-1] == 28  # two blocks: one a core


def test_conv_chain_levels_and_what_bounds_the_chain():
    """C3 on a machine whose peak is far above its memory: fusion keeps the intermediate (6.4 MB) out of the slow
    levels, so the chain apart is bound by a level and predicted slower; on a machine whose bandwidths dwarf its
    peak both are bound by compute and fusion gains nothing."""
    g = ConvPair(ic=64, oc1=128, oc2=64, k1=3, k2=1, st1=1, st2=1, out_h=56, out_w=56)
    slow = Machine("test", 2, ["avx2"], {"float32": 1e13},
                   [MemoryLevel("L1", 64 << 10, 400e9), MemoryLevel("L2", 2 << 20, 100e9),
                    MemoryLevel("L3", 8 << 20, 20e9), MemoryLevel("DRAM", None, 10e9)])
    plans = conv_chain_levels(g, slow, 16)
    assert [p.name for p in plans] == ["L1", "L2", "L3"]
    assert plans[0].dv >= plans[1].dv >= plans[2].dv
    for p in plans:
        assert conv_chain_movement(g, p.tiles).mu <= p.capacity
    fused, apart = conv_chain_seconds(g, slow, 16, 2), conv_chain_seconds(g, slow, 16, 2, fused=False)
    assert fused[1] != "compute" and apart[0] > fused[0]
    fast = Machine("test", 2, ["avx2"], {"float32": 1e11},
                   [MemoryLevel("L1", 64 << 10, 4e13), MemoryLevel("L2", 2 << 20, 4e13),
                    MemoryLevel("L3", 8 << 20, 4e13), MemoryLevel("DRAM", None, 4e13)])
    fused, apart = conv_chain_seconds(g, fast, 16, 2), conv_chain_seconds(g, fast, 16, 2, fused=False)
    assert fused == apart == (conv_chain_flops(g) / 1e11, "compute")


def test_conv_chain_flops_count_the_halo_a_band_recomputes():
    g = ConvPair(ic=8, oc1=16, oc2=8, k1=1, k2=3, st1=1, st2=1, out_h=12, out_w=10)
    whole = conv_chain_flops(g)
    assert conv_chain_flops(g, rows=12) == whole
    # bands of 4 rows: 3 bands of 6 intermediate rows each, against 14 once
    assert conv_chain_flops(g, rows=4) - whole == 2 * 16 * (18 - 14) * 12 * 8
