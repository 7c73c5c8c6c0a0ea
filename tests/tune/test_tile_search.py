"""The register-tile search: the candidate space (legality, pruning by intensity, the solver's tile first),
retiled kernels (repacked weights, rebuilt fallbacks) checked against onnxruntime, op types, and a real measured
search with its cost-cache entry."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from onnxopt.annotate.shapes import tensor_info
from onnxopt.codegen.compute.build import build_compute
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.microkernel.register_tile import (BLOCK_FLOATS, candidate_tiles, intensity,
                                                       solve_register_tile)
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import parse_target
from onnxopt.cost_cache import CostCache
from onnxopt.emit.model import build_fused_model, fallback_key
from onnxopt.fusion.compute import ComputeRule, retile
from onnxopt.models.conv_shapes import ConvShape, MatMulShape, conv_model, matmul_model
from onnxopt.graph.infer import infer as _infer
from onnxopt.measure import region_feeds as _region_feeds, region_models as _region_models
from onnxopt.timing import make_session
from onnxopt.tune import search_space, search_tile

TARGET = parse_target(None)
REGISTER_FILES = [(32, 16, False), (16, 8, True), (16, 4, True), (32, 8, False)]


def legal(t, registers, lanes, masks):
    return (t.mi * t.ni + t.ni + t.mii + (t.ni if masks else 0) <= registers and t.mii >= min(2, t.mi)
            and t.mi % t.mii == 0 and BLOCK_FLOATS % (t.ni * lanes) == 0 and t.ni <= 4 and t.lanes == lanes)


@pytest.mark.parametrize("registers,lanes,masks", REGISTER_FILES)
def test_candidates_are_legal_ranked_and_start_with_the_solver(registers, lanes, masks):
    tiles = candidate_tiles(registers, lanes, masks, limit=6)
    assert tiles[0] == solve_register_tile(registers, lanes, mask_registers=masks)
    assert 2 <= len(tiles) <= 6 and len({(t.mi, t.ni) for t in tiles}) == len(tiles)
    assert all(legal(t, registers, lanes, masks) for t in tiles)
    # The pruning keeps the best by intensity of every legal (MI, NI): compare with brute force.
    shapes = {(mi, ni) for ni in range(1, 5) for mi in range(1, registers) for mii in range(1, mi + 1)
              if legal(type(tiles[0])(mi, ni, mii, lanes), registers, lanes, masks)}
    ranked = sorted((intensity(mi, ni, 64) for mi, ni in shapes), reverse=True)
    got = [intensity(t.mi, t.ni, 64) for t in tiles[1:]]
    assert got == sorted(got, reverse=True)
    assert got[-1] >= ranked[len(tiles) - 1] - 1e-12  # nothing better than the last kept was left out
    assert candidate_tiles(registers, lanes, masks, limit=1) == [tiles[0]]


def test_avx512_space():
    tiles = candidate_tiles(32, 16, False, limit=4)
    assert [(t.mi, t.ni, t.mii) for t in tiles] == [(6, 4, 2), (5, 4, 5), (4, 4, 2), (14, 2, 2)]


def _compute_region(model):
    work = _infer(model)
    mi = select(TARGET).tile.mi
    regions = ComputeRule(work, mi).find_regions(set(), [])
    assert len(regions) == 1
    r = regions[0]
    r.fallback_key = fallback_key(r, work)  # as the pipeline names it: the function body is part of the op type
    r.compute_op_type(TARGET.name + "|" + TARGET.cpu + "|" + TARGET.llvm_features + f"|rank{len(r.shape)}")
    return work, r


def _check_against_ort(work, region, tmp_path, tag):
    """The region's kernel and its function fallback (no library) against onnxruntime running the original ops."""
    info = tensor_info(work)
    obj, desc = build_compute(region, TARGET)
    lib = str(tmp_path / f"{tag}.so")
    link_library([desc], [obj], TARGET, lib)
    orig, fused = _region_models(region, work, info)
    feeds = _region_feeds(region, info, {}, 0, work)
    want = make_session(orig, 1).run(None, feeds)
    got = make_session(fused, 1, library=lib).run(None, feeds)
    scale = max(float(np.max(np.abs(w))) for w in want)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=max(1e-5, 2e-6 * scale))
    # The whole model, once with the kernel and once through the fallback body (repacked weights unpacked).
    m = build_fused_model(work, [region], None, None, {}, [])
    onnx.checker.check_model(m)
    names = [o.name for o in work.graph.output]
    full = {i.name: feeds.get(i.name) for i in work.graph.input}
    want_m = make_session(work, 1).run(names, full)
    for library in (lib, None):
        got_m = make_session(m, 1, library=library).run(names, full)
        for a, b in zip(want_m, got_m):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=max(1e-5, 2e-6 * scale))


CONVS = [
    # oc_g not a multiple of 6, 5 or 4: padded rows in every packing; grouped; strided and padded.
    ConvShape("odd", 16, 12, 12, 22, 3, 1, 1),
    ConvShape("grouped", 12, 10, 10, 18, 3, 2, 1, groups=3),
    ConvShape("pointwise", 24, 9, 9, 40, 1),
]


@pytest.mark.parametrize("shape", CONVS, ids=lambda s: s.name)
def test_forced_tiles_give_correct_convolutions(shape, tmp_path):
    work, r = _compute_region(conv_model(shape, epilogue="relu"))
    default_op = r.op_type
    packed0 = [t for t in r.compute.initializers if t.name == r.inputs[1]][0]
    for i, tile in enumerate(search_space(TARGET)[1:]):
        v = retile(r, tile)
        assert v.op_type != default_op and v.compute.tile == tile
        assert r.op_type == default_op and r.compute.tile is None  # the original is untouched
        packed = [t for t in v.compute.initializers if t.name == r.inputs[1]][0]
        assert list(packed.dims)[-1] == tile.mi and list(packed.dims)[2] == list(packed0.dims)[2]
        _check_against_ort(work, v, tmp_path, f"t{i}")


def test_forced_tiles_give_correct_matmuls(tmp_path):
    work, r = _compute_region(matmul_model(MatMulShape("mm", 2, 23, 40, 37), bias=True, epilogue="relu"))
    for i, tile in enumerate(search_space(TARGET)[1:]):
        v = retile(r, tile)
        assert v.op_type != r.op_type
        assert v.compute.initializers == r.compute.initializers  # a matmul reads A through strides: no repacking
        _check_against_ort(work, v, tmp_path, f"m{i}")


def test_op_type_follows_the_tile():
    _, r = _compute_region(conv_model(ConvShape("c", 8, 8, 8, 16, 3, 1, 1)))
    tiles = search_space(TARGET)
    a, b = retile(r, tiles[1]), retile(r, tiles[1])
    assert a.op_type == b.op_type != r.op_type
    assert len({retile(r, t).op_type for t in tiles} | {r.op_type}) == len(tiles) + 1


def test_measured_search_and_its_cache_entry(tmp_path):
    # 2 * 32 * 20 * 20 * 32 * 9 = 7.4 MFLOP: searched.
    work, r = _compute_region(conv_model(ConvShape("s", 32, 20, 20, 32, 3, 1, 1), epilogue="relu"))
    cache = CostCache(tmp_path / "costs.sqlite")
    res = search_tile(r, work, TARGET, threads=1, cache=cache, min_time=0.05)
    space = search_space(TARGET)
    assert res.skipped is None and res.cost_cache == "miss" and res.tile in space
    pixels = [c for c in res.candidates if c.get("vectors", "pixels") == "pixels"]
    assert [c["tile"] for c in pixels] == [[t.mi, t.ni, t.mii, t.lanes] for t in space]
    # A one-group convolution also times the blocked kernel with NCHW inputs and outputs.
    assert [c["tile"] for c in res.candidates if c.get("vectors") == "channels"] == [
        [space[0].mi, space[0].ni, space[0].mii, space[0].lanes]]
    assert all(c.get("seconds", 0) > 0 and "error" not in c for c in res.candidates), res.candidates
    fastest = min(res.candidates, key=lambda c: c["seconds"])
    assert (res.tile, res.vectors) == (space[0], "pixels") or (
        [res.tile.mi, res.tile.ni, res.tile.mii, res.tile.lanes] == fastest["tile"]
        and res.vectors == fastest.get("vectors", "pixels"))
    rep = res.to_report()
    assert rep["chosen"][:3] == [res.tile.mi, res.tile.ni, res.tile.mii] and rep["cost_cache"] == "miss"
    again = search_tile(r, work, TARGET, threads=1, cache=cache)
    assert again.cost_cache == "hit" and again.tile == res.tile and again.candidates == res.candidates
    assert cache.tile_hits == 1 and cache.tile_misses == 1
    # Another thread count is another measurement.
    key = [[t.mi, t.ni, t.mii, t.lanes] for t in space] + [[space[0].mi, space[0].ni, space[0].mii, space[0].lanes, 1]]
    assert cache.get_tile(r.op_type, [[1, 32, 20, 20]], 1, key) is not None
    assert cache.get_tile(r.op_type, [[1, 32, 20, 20]], 2, key) is None
    cache.close()


def test_small_regions_are_not_searched():
    work, r = _compute_region(conv_model(ConvShape("tiny", 4, 8, 8, 8, 3, 1, 1)))  # 0.07 MFLOP
    res = search_tile(r, work, TARGET)
    assert res.skipped and "MFLOP" in res.skipped and res.tile == select(TARGET).tile and not res.changed


def test_optimize_reports_the_tile(tmp_path):
    m = conv_model(ConvShape("p", 32, 16, 16, 48, 3, 1, 1), epilogue="relu")
    path = str(tmp_path / "costs.sqlite")
    res = onnxopt_optimize(m, cost_cache=path, min_speedup=1e-6, threads=1)
    assert res.report["timings"]["tile_search_s"] > 0
    assert res.report["tile_search"]["searched"] == 1 and res.report["tile_search"]["skipped"] == 0
    for e in res.report["regions"]:
        assert len(e["tile"]) == 3 and e["tile_search"]["chosen"][:3] == e["tile"]
    # The whole model was verified against onnxruntime with whichever tile won.
    assert res.report["verification"]["ok"]
    off = onnxopt_optimize(m, cost_cache=False, tile_search=False, threads=1, measure=False)
    t = select(TARGET).tile
    assert off.report["regions"] and all(e["tile"] == [t.mi, t.ni, t.mii] and "tile_search" not in e
                                         for e in off.report["regions"])
    assert os.path.exists(path)


def onnxopt_optimize(m, **kw):
    import onnxopt

    # These are the register tile's searches: Winograd's own search takes a lone stride-1 3x3 convolution first
    # (and, where a tile wins, leaves no tile to search).
    kw.setdefault("winograd", "off")
    return onnxopt.optimize(m, **kw)


@pytest.mark.parametrize("kind", ["conv", "matmul", "channels"])
def test_a_cached_non_default_tile_goes_through_the_pipeline(kind, tmp_path):
    """The cost cache is the tuners' interface to the pipeline: a stored choice of a non-default tile is applied
    (weights repacked, new op type), the kernel is checked against onnxruntime, and the model verified."""
    m = (conv_model(ConvShape("f", 24, 14, 14, 28, 3, 1, 1), epilogue="relu") if kind == "conv" else
         conv_model(ConvShape("f", 24, 14, 14, 40, 3, 1, 1), batch=2, epilogue="residual") if kind == "channels" else
         matmul_model(MatMulShape("f", 2, 50, 160, 96), epilogue="relu"))  # 3 MFLOP
    work, r = _compute_region(m)
    info = tensor_info(work)
    shapes = [list(v.shape) for v in _region_feeds(r, info, {}, 0, work).values()]
    space = [[t.mi, t.ni, t.mii, t.lanes] for t in search_space(TARGET)]
    forced = space[2] if kind != "channels" else space[0] + [1]
    if kind != "matmul":  # the key lists the channel-vector candidate too
        space = space + [space[0] + [1]]
    path = tmp_path / "costs.sqlite"
    c = CostCache(path)
    c.put_tile(r.op_type, shapes, 1, space, forced, [{"tile": t} for t in space])
    c.close()
    # The compute plan, named: whether it or the elementwise plan wins a model this small is a matter of timing noise.
    res = onnxopt_optimize(m, cost_cache=str(path), threads=1, min_speedup=1e-6, plan="compute")
    rep = res.report
    assert rep["cost_cache"]["tile_hits"] == 1 and rep["tile_search"]["changed"] == 1
    if kind == "channels":
        from dataclasses import replace

        from onnxopt.fusion.layout import with_channel_vectors

        mk = select(TARGET)
        retiled = with_channel_vectors(replace(r), mk.lanes, mk.tile.ni, 17).op_type
        forced = forced[:4]
    else:
        retiled = retile(r, type(search_space(TARGET)[0])(*forced)).op_type
    assert retiled != r.op_type
    for e in rep["regions"]:
        assert e["op_type"] == retiled and e["tile"] == forced[:3]
    for e in rep["rejected"]:  # dropped only for speed, never for a wrong or failed kernel
        if not e["op_type"].startswith("Elementwise"):  # the residual's Add -> Relu in the elementwise plan
            assert e["op_type"] == retiled and "faster" in e["reason"], e
    assert len(rep["regions"]) + len(rep["rejected"]) >= 1
    assert rep["verification"]["ok"]


def test_a_contradicted_confirmation_is_broken_by_a_third_timing():
    """confirm_win: a candidate that won its first timing must win the confirmation too; when the confirmation
    contradicts it, a third timing is taken and the median of the three decides (the gains are given, the rule is
    tested; the timings themselves run in the searches above)."""
    from onnxopt.tune.tile_search import confirm_win

    def retimes(*gains):
        it = iter(gains)
        return lambda: next(it)

    assert confirm_win(1.75, retimes(1.4), 1.03) == (True, [1.75, 1.4])  # confirmed: no third timing
    assert confirm_win(1.75, retimes(1.029, 1.6), 1.03) == (True, [1.75, 1.029, 1.6])  # the burst outvoted
    assert confirm_win(1.75, retimes(1.0, 1.01), 1.03) == (False, [1.75, 1.0, 1.01])  # the first was the lucky one
    assert confirm_win(1.04, retimes(0.98, 1.031), 1.03) == (True, [1.04, 0.98, 1.031])
