"""TileFlow's tile-tree analysis (onnxopt/annotate/tile_tree.py): figure 3.5's 168, the boundary-step sums against a
step-by-step enumeration on drawn nests, the primitives' rules, legality, and Chimera's GEMM chain seen both ways."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxopt.annotate import tile_tree as tt
from onnxopt.annotate.data_movement import gemm_chain, movement
from onnxopt.annotate.tile_tree import Arch, Loop, Tile, access, analyze, enumerate_movement, illegal

# Figure 3.5: a 1-D batched convolution C[i] += A[i, j + r] * B[j, r], one tile with serial loops i1, j1 of 3 steps
# each over 4 x 4 points (r whole): A's slice is 4 x 6; a step of j1 brings 4 x 4 new elements and reuses 4 x 2,
# B brings 4 x 3, C stays.
FIG_3_5 = Tile("L1", loops=(Loop("i", 3), Loop("j", 3)), op="conv1d",
               accesses=(access("A", "i", "j + r"), access("B", "j", "r"), access("C", "i", write=True)))
FIG_3_5_EXTENTS = {"i": 12, "j": 12, "r": 3}


def test_figure_3_5_moves_168_elements_of_a():
    assert tt._movement(FIG_3_5, FIG_3_5_EXTENTS, "A") == 168
    # the boundary steps: t0 the whole 4 x 6 slice, t1 (j1 advances) 4 x 4, t2 (i1 advances, j1 wraps) 4 x 6 again
    assert 24 + 16 * (3 - 1) * 3 + 24 * (3 - 1) == 168
    for tensor in "ABC":
        assert tt._movement(FIG_3_5, FIG_3_5_EXTENTS, tensor) == enumerate_movement(FIG_3_5, FIG_3_5_EXTENTS, tensor)


def test_figure_3_5_loads_and_stores():
    (link, (loads, stores)), = analyze(FIG_3_5, FIG_3_5_EXTENTS).links.items()
    assert link == ("DRAM", "L1")
    assert loads == 168 + 12 * 9  # A and B; C stays put while j1 walks its reduction
    assert stores == 12


@st.composite
def single_nests(draw):
    """One leaf: two or three problem dimensions, each split by up to two loops (some spatial), and accesses that
    index tensor dimensions by one dimension, a window (x + r) or a strided window (2*x + r)."""
    dims = ["x", "y", "r"][: draw(st.integers(2, 3))]
    loops, extents = [], {}
    for d in dims:
        inner = draw(st.integers(1, 3))
        trips = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
        extents[d] = inner * math.prod(trips)
        loops += [Loop(d, t, spatial=draw(st.booleans()) and draw(st.booleans())) for t in trips]
    order = draw(st.permutations(loops))
    exprs = [d for d in dims] + (["x + r", "2*x + r"] if "r" in dims else ["x + y"])
    accs = []
    for name in "PQ":
        index = draw(st.lists(st.sampled_from(exprs), min_size=1, max_size=2,
                              unique_by=lambda e: e.replace("2*", "")[0]).filter(
            lambda ix: len({c for e in ix for c in e if c.isalpha()}) == sum(
                len([c for c in e if c.isalpha()]) for e in ix)))
        accs.append(access(name, *index, write=name == "Q" and draw(st.booleans())))
    return Tile("L1", loops=tuple(order), op="op", accesses=tuple(accs)), extents


@settings(max_examples=150, deadline=None)
@given(single_nests())
def test_boundary_steps_equal_the_enumeration_in_one_tile(case):
    tile, extents = case
    for tensor in "PQ":
        assert tt._movement(tile, extents, tensor) == enumerate_movement(tile, extents, tensor)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(tt.PRIMITIVES), st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2),
       st.booleans(), st.permutations(["m", "l"]))
def test_boundary_steps_equal_the_enumeration_across_children(primitive, tm, tl, im, il, third, order):
    """A parent over m and l with two or three children (one touching only the output, so Seq evicts and Shar
    keeps the others' tiles): each primitive's sequence of slices, at the boundary steps and step by step."""
    ext = {"m": tm * im * 2, "l": tl * il * 2, "k": 2, "n": 2}
    kids = [Tile("L1", op="g1", accesses=(access("A", "m", "k"), access("B", "k", "l"),
                                          access("C", "m", "l", write=True))),
            Tile("L1", op="g2", accesses=(access("C", "m", "l"), access("D", "l", "n"),
                                          access("E", "m", "n", write=True)))]
    if third:
        kids.insert(1, Tile("L1", op="scale", accesses=(access("E", "m", "n"), access("E", "m", "n", write=True))))
    trips = {"m": tm, "l": tl}
    parent = Tile("L2", loops=tuple(Loop(d, trips[d]) for d in order), children=tuple(kids), primitive=primitive)
    for tensor in "ABCDE":
        assert tt._movement(parent, ext, tensor) == enumerate_movement(parent, ext, tensor), tensor


def test_seq_evicts_what_the_next_child_does_not_touch_and_shar_keeps_it():
    ext = {"m": 4, "k": 2, "n": 2}
    a = Tile("L1", op="a", accesses=(access("X", "m", "k"), access("Y", "m", write=True)))
    b = Tile("L1", op="b", accesses=(access("Z", "n"), access("W", "n", write=True)))
    seq = Tile("L2", loops=(Loop("n", 2),), children=(a, b), primitive="Seq")
    shar = Tile("L2", loops=(Loop("n", 2),), children=(a, b), primitive="Shar")
    # X does not depend on n: Shar loads it once; Seq loads it again after b evicts it
    assert tt._movement(shar, ext, "X") == 8
    assert tt._movement(seq, ext, "X") == 16


def test_footprint_and_processing_elements_per_primitive():
    ext = {"m": 8, "k": 4}
    a = Tile("L1", loops=(Loop("m", 2, spatial=True),), op="a", accesses=(access("X", "m", "k"),))  # 2 PEs, 32
    b = Tile("L1", loops=(Loop("m", 4, spatial=True),), op="b", accesses=(access("Y", "m"),))  # 4 PEs, 8
    results = {}
    for p in tt.PRIMITIVES:
        res = analyze(Tile("L2", children=(a, b), primitive=p), ext).tiles[0]
        results[p] = (res.footprint, res.num_pe)
    assert results["Seq"] == (32, 4)  # eq 3.13: the largest child; eq 3.12: the most PEs
    assert results["Shar"] == (40, 4)  # shared memory holds both; sequential, so the most PEs
    assert results["Para"] == results["Pipe"] == (40, 6)  # partitioned: both, side by side


def test_latency_follows_eq_3_22():
    arch = Arch(bandwidth={"DRAM": 1e3, "L2": 1e6}, pe_flops=1e3, elem_bytes=1)
    ext = {"m": 10, "k": 10}
    fast = Tile("L1", op="fast", flops=2, accesses=(access("X", "m", "k"),))  # 200 flops: 0.2 s
    slow = Tile("L1", op="slow", flops=6, accesses=(access("X", "m", "k"),))  # 600 flops: 0.6 s
    seq = analyze(Tile("L2", children=(fast, slow), primitive="Seq"), ext, arch)
    para = analyze(Tile("L2", children=(fast, slow), primitive="Para"), ext, arch)
    assert seq.latency == pytest.approx(0.8)  # sequential children add up
    assert para.latency == pytest.approx(0.6)  # partitioned ones overlap
    # 100 elements over 1,000 bytes/s: the load (0.1 s) hides behind the compute; at 10 bytes/s it does not
    slow_memory = analyze(Tile("L2", children=(fast, slow), primitive="Seq"), ext,
                          Arch(bandwidth={"DRAM": 10, "L2": 1e6}, pe_flops=1e3, elem_bytes=1))
    assert slow_memory.latency == pytest.approx(10.0)


def chain_tree(M, N, K, L, TM, TL, order=("m", "l")):
    """Chimera's GEMM chain C = A B, E = C D as a tile tree: a parent over m and l at L2, the GEMMs sharing it."""
    g1 = Tile("L1", op="gemm1", accesses=(access("A", "m", "k"), access("B", "k", "l"),
                                          access("C", "m", "l", write=True)))
    g2 = Tile("L1", op="gemm2", accesses=(access("C", "m", "l"), access("D", "l", "n"),
                                          access("E", "m", "n", write=True)))
    trips = {"m": M // TM, "l": L // TL}
    return Tile("L2", loops=tuple(Loop(d, trips[d]) for d in order), children=(g1, g2), primitive="Shar")


@pytest.mark.parametrize("M,N,K,L,TM,TL", [(8, 4, 4, 8, 2, 4), (16, 8, 8, 16, 4, 4), (12, 6, 6, 6, 3, 2)])
def test_the_gemm_chains_traffic_matches_chimeras_table(M, N, K, L, TM, TL):
    """Order m, l outside, k and n whole: both models move A and E once, B and D once a block of m rows (Table
    3.4 with T_K = K, T_N = N), and the intermediate C never leaves the tile."""
    ext = {"m": M, "n": N, "k": K, "l": L}
    an = analyze(chain_tree(M, N, K, L, TM, TL), ext)
    root = an.tiles[0]
    chimera = movement(gemm_chain(M, N, K, L), tuple("mlkn"), {"m": TM, "l": TL, "k": K, "n": N}, ignore_trip1=True)
    assert root.loads + root.stores == chimera.dv == M * K + K * L * (M // TM) + N * L * (M // TM) + M * N
    assert tt._inside(root.tile, root.tile, "C") and not tt._inside(an.tiles[1].tile, root.tile, "C")
    assert root.loads == M * K + (K + N) * L * (M // TM)  # no C, and E is written once
    # each GEMM still moves C between its own level and the shared one
    g1, g2 = an.tiles[1:]
    assert g1.stores == M * L
    assert g2.loads == M * L + N * L * (M // TM)  # C, and D again for every block of rows


def test_a_producers_reduction_loop_in_the_shared_tile_is_refused():
    ok = chain_tree(8, 4, 4, 8, 2, 4)
    assert illegal(ok) is None  # l is the consumer's reduction: fine
    bad = Tile("L2", loops=(Loop("m", 4), Loop("k", 2)), children=ok.children, primitive="Shar")
    why = illegal(bad)
    assert why and "k" in why and "gemm1" in why and "partial sums" in why
    with pytest.raises(ValueError, match="illegal tile tree"):
        analyze(bad, {"m": 8, "n": 4, "k": 4, "l": 8})


def test_loops_must_divide_what_they_split():
    with pytest.raises(ValueError, match="do not divide"):
        analyze(Tile("L1", loops=(Loop("m", 3),), op="a", accesses=(access("X", "m"),)), {"m": 8})
    with pytest.raises(ValueError, match="primitive"):
        Tile("L1", primitive="Fork", op="a", accesses=(access("X", "m"),))
