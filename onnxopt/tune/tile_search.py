"""The register-tile search: a few tiles that the machine model ranks best, each built, checked and timed.

The space is every register tile the micro-kernel can use on the target (MI rows of C by NI vectors, MII
broadcasts in flight) under the solver's legality rules; `candidate_tiles` ranks it by Chimera's intensity
formula and keeps the best few (3), the solver's own tile first. That is the pruning: on AVX-512 (32 zmm) the
space holds about fifty (MI, NI) shapes and the search times (6, 4), (5, 4) and (4, 4) ((14, 2) is next, and was
always slower here).

Each candidate is compiled (`build_compute` with the region retiled: a convolution's weights are repacked for the
tile's MI), linked into one library, run on the region's runtime shapes in onnxruntime, checked against
onnxruntime running the original ops, and then all are timed in one interleaved run. The fastest wins if it beats
the default tile by 3% (less is timing noise); otherwise the default stays. Regions under 2 MFLOP are not searched
(the tile cannot matter there), nor blocked-layout convolutions (their tile is a different kernel).

A one-group NCHW convolution also gets one more candidate: the blocked-layout kernel (vectors of output channels,
fusion/layout.py) run with NCHW inputs and outputs, which wins on narrow images and loses where its reorders cost
more than the idle lanes of the NCHW kernel.

The result is kept in the cost cache under the region's default op type, its input shapes and the thread count,
with the candidate space in the key: a second run reuses it without building anything.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from onnxopt.codegen.compute.build import build_compute, tile_sets_of
from onnxopt.codegen.compute.tile_sets import prebuild
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.parallel import build_many
from onnxopt.codegen.microkernel.register_tile import RegisterTile, candidate_tiles
from onnxopt.codegen.microkernel.registry import select
from dataclasses import replace

from onnxopt.fusion.compute import conv_macs_per_output, retile
from onnxopt.fusion.layout import channel_vectors_apply, with_channel_vectors
from onnxopt.timing import make_session, time_interleaved
from onnxopt.verify import Tolerance, compare, finite_scale

MIN_SEARCH_FLOPS = 2e6
CANDIDATES = 3
MARGIN = 1.03  # a candidate must be this much faster than the default tile to replace it


def tile_list(t: RegisterTile) -> list[int]:
    return [t.mi, t.ni, t.mii, t.lanes]


def tile_from(values) -> RegisterTile:
    mi, ni, mii, lanes = (int(v) for v in values)
    return RegisterTile(mi, ni, mii, lanes)


@dataclass
class TileSearchResult:
    tile: RegisterTile  # the tile to use
    default: RegisterTile  # the target's solver tile
    candidates: list[dict] = field(default_factory=list)  # {"tile": [mi, ni, mii, lanes], "seconds": s | None, ...}
    cost_cache: str | None = None  # "hit", "miss", or None without a cache
    skipped: str | None = None  # why no search ran
    vectors: str = "pixels"  # "channels": the blocked kernel with NCHW inputs and outputs (fusion/layout.py)
    # op type -> (object code, glue description) of each candidate built: the pipeline reuses the chosen one
    built: dict = field(default_factory=dict, repr=False)
    build_s: float = 0.0  # compiling the candidates
    measure_s: float = 0.0  # running, checking and timing them

    @property
    def changed(self) -> bool:
        return self.tile != self.default or self.vectors != "pixels"

    def to_report(self) -> dict:
        out = {"chosen": tile_list(self.tile), "default": tile_list(self.default), "candidates": self.candidates,
               "vectors": self.vectors}
        if self.cost_cache:
            out["cost_cache"] = self.cost_cache
        if self.skipped:
            out["skipped"] = self.skipped
        if not self.skipped:
            secs = {(tuple(c["tile"]), c.get("vectors", "pixels")): c.get("seconds") for c in self.candidates}
            d = secs.get((tuple(tile_list(self.default)), "pixels"))
            t = secs.get((tuple(tile_list(self.tile)), self.vectors))
            if d and t:
                out["gain"] = d / t
        return out


def search_space(target, limit: int = CANDIDATES) -> list[RegisterTile]:
    """The tiles the search times on this target, best predicted first (the solver's tile)."""
    mk = select(target)
    return candidate_tiles(mk.registers, mk.lanes, mk.masks_in_vector_registers, limit=limit)


def region_flops(region, info, bindings) -> float:
    """2 x multiply-adds of a compute region on its inferred shapes (symbolic dims from `bindings`, else 1)."""
    c = region.compute

    def dims(shape):
        return [d if isinstance(d, int) else int(bindings.get(d, 1)) if isinstance(d, str) else 1 for d in shape]

    out = int(np.prod(dims(region.shape))) if region.shape else 0
    macs = conv_macs_per_output(c)
    if macs is not None:
        return 2.0 * out * macs
    a = info.get(region.inputs[0])
    if a is None or not a.shape:
        return 0.0
    k = dims(a.shape)[-2] if c.attrs.trans_a and len(a.shape) >= 2 else dims(a.shape)[-1]
    return 2.0 * out * k


def kernel_tolerance(want, bound: float) -> Tolerance:
    # As the pipeline's kernel check: a reduction in another order differs by about K * eps * sum |a * b|; a
    # Winograd kernel by more (onnxopt/measure.py, kernel_error_bound).
    scale = finite_scale(want)
    return Tolerance({"float32": 1e-4}, {"float32": max(1e-5, bound * scale)}, {})


def search_tile(region, model, target, threads: int | None = None, cache=None, *, info=None, bindings=None,
                seed: int = 0, space: list[RegisterTile] | None = None, min_time: float = 0.1,
                min_flops: float = MIN_SEARCH_FLOPS, margin: float = MARGIN,
                cache_only: str | None = None) -> TileSearchResult:
    """Time the candidate register tiles of one compute region (op type computed with the default tile) on its
    runtime shapes and return the fastest. `model` is the shape-inferred graph the region was found in; `cache`
    a CostCache or None. `space` replaces the machine model's candidates (the first is the baseline).
    `cache_only`: a reason not to build or time anything (the tuning budget is spent, say): the cost cache's answer
    or the default tile, skipped for that reason."""
    from onnxopt.annotate.shapes import tensor_info
    from onnxopt.measure import region_feeds as _region_feeds

    default = select(target).tile
    if region.compute is None:
        return TileSearchResult(default, default, skipped="not a compute region")
    c = region.compute
    if c.attrs.in_blocked or c.attrs.out_blocked:
        return TileSearchResult(default, default, skipped="blocked layout: the tile is the blocked kernel's")
    if c.op == "conv_transpose":
        return TileSearchResult(default, default, skipped="a transposed convolution's kernel is chosen by its output channels")
    if c.attrs.packed_b:
        own = select(target).packed_b_tile
        return TileSearchResult(own, own, skipped="a matmul with its B packed in panels runs the mask-free tile")
    current = c.tile if c.tile is not None else default
    if current != default:
        return TileSearchResult(current, default, skipped="the tile is already chosen")
    tiles = list(space) if space is not None else search_space(target)
    if len(tiles) < 1 or (space is None and len(tiles) < 2):
        return TileSearchResult(default, default, skipped="no other tile fits the register file")
    info = info if info is not None else tensor_info(model)
    bindings = bindings or {}
    flops = region_flops(region, info, bindings)
    if flops < min_flops:
        return TileSearchResult(default, default, skipped=f"{flops / 1e6:.2f} MFLOP: the tile cannot matter")

    feeds = _region_feeds(region, info, bindings, seed, model)
    shapes = [list(v.shape) for v in feeds.values()]
    # Besides the tiles, a one-group convolution can run the blocked kernel (vectors of output channels) with NCHW
    # inputs and outputs: better where the image rows leave the NCHW kernel's lanes idle, worse where the reorders
    # cost more than the lanes gain. Only timing tells.
    mk = select(target)
    channels = space is None and channel_vectors_apply(region, mk.lanes)
    space_key = [tile_list(t) for t in tiles] + ([tile_list(default) + [1]] if channels else [])
    if cache is not None and cache.enabled:
        hit = cache.get_tile(region.op_type, shapes, threads, space_key)
        if hit is not None:
            return TileSearchResult(tile_from(hit["tile"][:4]), default, hit["candidates"], cost_cache="hit",
                                    vectors="channels" if hit["tile"][4:] == [1] else "pixels")
    if cache_only:
        return TileSearchResult(default, default, skipped=cache_only)

    candidates = [{"tile": tile_list(t)} for t in tiles]
    kinds = [(t, "pixels") for t in tiles]
    if channels:
        candidates.append({"tile": tile_list(default), "vectors": "channels"})
        kinds.append((default, "channels"))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    variants = []
    for cand, (t, vectors) in zip(candidates, kinds):
        try:
            if vectors == "channels":
                v = with_channel_vectors(replace(region, measured={}, rejected=None), mk.lanes, mk.tile.ni, opset)
            else:
                v = region if t == current else retile(region, t)
        except Exception as e:  # noqa: BLE001 - a tile that does not apply is left out
            cand["error"] = f"build: {type(e).__name__}: {e}"
            continue
        variants.append((cand, (t, vectors), v))
    baseline = (default if space is None else tiles[0], "pixels")
    try:
        timing = time_candidates(region, variants, model, info, feeds, target, threads, baseline,
                                 min_time=min_time, margin=margin)
    except CannotRun as e:  # no search; the pipeline checks the default kernel as usual
        return TileSearchResult(default, default, candidates, skipped=f"could not run: {e}")
    chosen, timed, objs, descs, build_s, t_measure = (timing.chosen, timing.timed, timing.objs, timing.descs,
                                                       timing.build_s, timing.t_measure)
    variants = timing.variants
    secs = {t: cand["seconds"] for cand, t in timed}
    if not variants or not secs:
        chosen = (default, "pixels")
    result = TileSearchResult(chosen[0], default, candidates, cost_cache="miss" if cache is not None and cache.enabled
                              else None, built={d.op_type: (o, d) for o, d in zip(objs, descs)}, vectors=chosen[1],
                              build_s=build_s, measure_s=time.perf_counter() - t_measure)
    if cache is not None and cache.enabled and secs:
        cache.put_tile(region.op_type, shapes, threads, space_key,
                       tile_list(chosen[0]) + ([1] if chosen[1] == "channels" else []), candidates)
    return result


class CannotRun(Exception):
    """The candidates could not be linked, or the original region could not run."""


@dataclass
class CandidateTiming:
    chosen: object  # the key of the candidate to use
    timed: list  # (candidate dict, key) of those checked and timed
    variants: list  # (candidate dict, key, region) of those built
    objs: list
    descs: list
    build_s: float
    t_measure: float  # perf_counter() when measuring began


def time_candidates(region, variants, model, info, feeds, target, threads, baseline, *,
                    min_time: float, margin: float, flush_bytes: int = 0) -> CandidateTiming:
    """Build, check and time the variants of one region: `variants` is [(candidate dict, key, region variant)];
    each candidate dict gets its "seconds" (or an "error"). All are built (their tile sets first, on all cores),
    linked into one library, checked against onnxruntime running the original ops (as the pipeline's kernel check),
    then timed in one interleaved run. The fastest replaces `baseline` (a key) only when
    it wins by `margin` twice: in that run and in a second one of the two alone (a win of a few percent can be
    noise), or, when the second contradicts the first, in the median of those two and a third (confirm_win).
    `flush_bytes` > 0: every timed run starts with the caches flushed (timing.time_interleaved). Raises CannotRun."""
    from onnxopt.measure import kernel_error_bound, region_models as _region_models
    from onnxopt.verify import LOW_PRECISION_TOLERANCE

    jobs = [lambda v=v: build_compute(v, target) for _, _, v in variants]
    t_build = time.perf_counter()
    # The candidates' tile sets (codegen/compute/tile_sets.py) compile on all cores, each once: regions with the
    # same epilogue share them, so after the first region a search mostly times. Then the candidates describe
    # themselves from those sets.
    prebuild(tile_sets_of([v for _, _, v in variants], target), target)
    results = build_many(jobs)
    build_s = time.perf_counter() - t_build
    objs, descs = [], []
    for (cand, _, _), res in zip(variants, results):
        if isinstance(res, Exception):  # a candidate that does not build is left out
            cand["error"] = f"build: {res}"
            continue
        objs.append(res[0])
        descs.append(res[1])
    variants = [v for v, res in zip(variants, results) if not isinstance(res, Exception)]
    # The same op type twice (the default and its copy) would register twice: keep the first.
    seen: set[str] = set()
    keep = []
    for i, (cand, _, v) in enumerate(variants):
        if v.op_type in seen:
            cand["error"] = "duplicate op type"
            continue
        seen.add(v.op_type)
        keep.append(i)
    variants = [variants[i] for i in keep]
    objs = [objs[i] for i in keep]
    descs = [descs[i] for i in keep]

    timed = []
    chosen = baseline
    t_measure = time.perf_counter()
    if variants:
        with tempfile.TemporaryDirectory(prefix="onnxopt-tiles-") as tmp:
            lib = os.path.join(tmp, "tiles.so")
            try:
                link_library(descs, objs, target, lib)
                orig, _ = _region_models(region, model, info)
                want = make_session(orig, threads, provider=target.execution_provider).run(None, feeds)
            except Exception as e:
                raise CannotRun(str(e).splitlines()[0][:200]) from e
            sessions = []
            for cand, key, v in variants:
                try:
                    _, fused = _region_models(v, model, info)
                    s = make_session(fused, threads, library=lib, provider=target.execution_provider)
                    got = s.run(None, _fused_feeds(v, feeds))
                    got = _nchw_outputs(v, got, want)
                except Exception as e:  # noqa: BLE001
                    cand["error"] = f"run: {str(e).splitlines()[0][:200]}"
                    continue
                # weights stored in float16 (driver/precision.py): against float32 at their tolerance, as the
                # pipeline's kernel check
                low = v.compute is not None and (v.compute.attrs.b_dtype or v.compute.attrs.stored_dtype)
                tol = LOW_PRECISION_TOLERANCE if low else kernel_tolerance(want, kernel_error_bound(v))
                bad = [d for d in compare(region.outputs, want, got, tol) if not d.ok]
                if bad:
                    cand["error"] = f"wrong results on {bad[0].name} (max abs {bad[0].max_abs:.3g})"
                    continue
                sessions.append((s, _fused_feeds(v, feeds)))
                timed.append((cand, key))
            if sessions:
                times = _time_sessions(sessions, min_time, flush_bytes)
                for (cand, _), tm in zip(timed, times):
                    cand["seconds"] = tm["median"]
                secs = {t: cand["seconds"] for cand, t in timed}
                best = min(secs, key=secs.get)
                base = secs.get(baseline)
                if base is None:
                    chosen = best
                elif secs[best] * margin < base:
                    at = {t: i for i, (_, t) in enumerate(timed)}

                    def retime():  # the baseline and the best alone, interleaved: the best's gain
                        again = _time_sessions([sessions[at[baseline]], sessions[at[best]]], min_time, flush_bytes)
                        return again[0]["median"] / again[1]["median"]

                    won, gains = confirm_win(base / secs[best], retime, margin)
                    timed[at[best]][0]["confirm_gain"] = gains[1]
                    if len(gains) > 2:
                        timed[at[best]][0]["tiebreak_gain"] = gains[2]
                    if won:
                        chosen = best
            del sessions
    return CandidateTiming(chosen, timed, variants, objs, descs, build_s, t_measure)


def confirm_win(first_gain: float, retime, margin: float) -> tuple[bool, list[float]]:
    """Whether a candidate that won its first timing by `first_gain` (> margin) wins: `retime()` times it against
    the baseline again and returns its gain, which must also pass `margin`. When it does not, a third timing breaks
    the tie and the median of the three decides. A second timing alone that contradicts the first is as likely the
    noisy one: UNet-16's full-resolution 16-channel convolution ran 1.75x faster as F(4x4, 3x3) Winograd, 1.03x in
    its confirmation under a burst of the host's steal (18%), and stayed direct at 582 us instead of 366 us in the
    emitted model. Returns (won, the gains measured)."""
    gains = [first_gain, retime()]
    if gains[1] > margin:
        return True, gains
    gains.append(retime())
    return sorted(gains)[1] > margin, gains


def _fused_feeds(region, feeds):
    """The feeds in the fused op's layout: blocked inputs reordered (fusion/layout.py)."""
    from onnxopt.fusion.layout import blocked_inputs, to_blocked

    lanes = region.compute.attrs.block if region.compute is not None else 0
    b_in = blocked_inputs(region)
    return {x: to_blocked(v, lanes) if x in b_in else v for x, v in feeds.items()}


def _nchw_outputs(region, got, want):
    from onnxopt.fusion.layout import blocked_outputs, from_blocked

    b_out = blocked_outputs(region)
    return [from_blocked(g, w.shape[1]) if o in b_out else g for o, g, w in zip(region.outputs, got, want)]


def _time_sessions(sessions, min_time, flush_bytes: int = 0):
    """Interleaved timing of (session, its feeds) pairs: blocked kernels take blocked inputs. Flushed runs are
    single runs, so more of them."""
    blocks = (8, 16) if flush_bytes else (3, 10)
    return time_interleaved([s for s, _ in sessions], [f for _, f in sessions], min_time=min_time,
                            min_blocks=blocks[0], max_blocks=blocks[1], flush_bytes=flush_bytes)


def _main(argv=None) -> int:
    """`python -m onnxopt.tune unit/U14 chimera/G1.gemm1 ...`: search the tile of one seed conv or
    matmul (models.conv_shapes' tables) at a time and print each candidate's time; no cache."""
    import argparse

    from onnxopt.codegen.target import parse_target
    from onnxopt.fusion.compute import ComputeRule
    from onnxopt.models.conv_shapes import ALL_CONVS, ALL_MATMULS, conv_model, matmul_model
    from onnxopt.graph.infer import infer as _infer

    p = argparse.ArgumentParser(prog="python -m onnxopt.tune")
    p.add_argument("shapes", nargs="+", help="names from onnxopt.models.conv_shapes (ALL_CONVS, ALL_MATMULS)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of interleaved timing per search")
    p.add_argument("--epilogue", default="relu")
    a = p.parse_args(argv)
    target = parse_target(None)
    for name in a.shapes:
        if name in ALL_CONVS:
            model = conv_model(ALL_CONVS[name], epilogue=a.epilogue)
        elif name in ALL_MATMULS:
            model = matmul_model(ALL_MATMULS[name], epilogue=a.epilogue)
        else:
            p.error(f"unknown shape {name}")
        work = _infer(model)
        regions = ComputeRule(work, select(target).tile.mi).find_regions(set(), [])
        for r in regions:
            r.compute_op_type(f"{target.name}|{target.cpu}|{target.llvm_features}|rank{len(r.shape)}")
            res = search_tile(r, work, target, a.threads, None, min_time=a.min_time)
            base = next((c.get("seconds") for c in res.candidates if c["tile"] == tile_list(res.default)), None)
            print(f"{name} ({r.describe()}): chosen {tile_list(res.tile)[:3]} {res.vectors}"
                  + (f" [{res.skipped}]" if res.skipped else ""))
            for c in res.candidates:
                s = c.get("seconds")
                rel = f"  {base / s:5.2f}x the default" if s and base else ""
                if "confirm_gain" in c:
                    rel += f" (timed again: {c['confirm_gain']:.2f}x)"
                if "tiebreak_gain" in c:
                    rel += f" (and a third time: {c['tiebreak_gain']:.2f}x)"
                label = f"{str(c['tile'][:3])} {c.get('vectors', 'pixels')}"
                print(f"   {label:20s} {s * 1e6:10.1f} us{rel}" if s else f"   {label} {c}")
    return 0
