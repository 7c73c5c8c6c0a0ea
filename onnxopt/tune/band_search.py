"""The band-height search of AFUSION kernels: a few heights around the machine model's, timed, the fastest kept.

An AFUSION kernel (codegen/glue/afusion_exec.c) runs by bands of output rows; the band height is its tile (OptiFX's
T_H): taller bands recompute fewer halo rows and spread fewer, larger tasks; shorter ones keep the scratch band in a
nearer cache and balance the threads better. `choose_band_rows` (fusion/afusion/siso.py) picks one from the cache size
and the thread count; this search times it against half of it and twice it (within the output's rows, balanced over
the threads the same way) and keeps the fastest if it beats the model's choice by 3%.

The height is only a field of the glue's descriptor, not of the generated code: every candidate links the same
object code, so the search costs one compile, one link and the timing, not a compile per candidate. Correctness does
not depend on the height (the tests run one-row and uneven bands); the chosen kernel is still checked against
onnxruntime with the others.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field, replace

from onnxopt.codegen.compute.build import build_compute
from onnxopt.codegen.glue.library import link_library
from onnxopt.fusion.afusion.siso import balanced_rows
from onnxopt.fusion.layout import blocked_inputs, to_blocked
from onnxopt.timing import make_session, time_interleaved

MARGIN = 1.03  # a height must be this much faster than the model's choice to replace it


@dataclass
class BandSearchResult:
    rows: int  # the band height to use
    default: int  # the machine model's
    candidates: list[dict] = field(default_factory=list)  # {"rows": r, "seconds": s} or {"rows": r, "error": ...}
    built: dict = field(default_factory=dict, repr=False)  # op type -> (object code, desc) of the chosen variant
    skipped: str | None = None
    build_s: float = 0.0
    measure_s: float = 0.0

    def to_report(self) -> dict:
        out = {"chosen": self.rows, "default": self.default, "candidates": self.candidates}
        if self.skipped:
            out["skipped"] = self.skipped
        return out


def band_candidates(rows: int, out_h: int, batch: int, threads: int) -> list[int]:
    """The model's height first, then half and twice it, each balanced over the threads; no repeats."""
    out = [rows]
    for r in (max(1, rows // 2), min(out_h, 2 * rows)):
        r = balanced_rows(r, out_h, batch, threads)
        if r not in out:
            out.append(r)
    return out


def with_band_rows(region, rows: int):
    """A copy of the AFUSION region with another band height (and so another op type)."""
    c = region.compute
    r = replace(region, params=replace(c, attrs=replace(c.attrs, band_rows=int(rows))), measured={})
    if region.op_type_key:
        r.compute_op_type(region.op_type_key)
    return r


def search_band(region, model, target, threads: int | None, *, info, bindings, seed: int = 0,
                min_time: float = 0.1) -> BandSearchResult:
    """Time the band heights of one AFUSION region on its runtime shapes (fused kernels only: the original ops are
    the same for every height) and return the fastest."""
    from onnxopt.measure import region_feeds as _region_feeds, region_models as _region_models

    c = region.compute
    default = int(c.attrs.band_rows)
    if os.environ.get("ONNXOPT_AFUSION_BAND_ROWS"):
        return BandSearchResult(default, default, skipped="the height is forced (ONNXOPT_AFUSION_BAND_ROWS)")
    out_shape = info[region.outputs[0]].shape if region.outputs[0] in info else None
    if not out_shape or not all(isinstance(d, int) for d in out_shape):
        return BandSearchResult(default, default, skipped="the output's shape is not static")
    heights = band_candidates(default, out_shape[2], out_shape[0], threads or os.cpu_count() or 1)
    if len(heights) < 2:
        return BandSearchResult(default, default, skipped="one band height only")
    t = time.perf_counter()
    obj, desc = build_compute(region, target)
    build_s = time.perf_counter() - t
    variants, descs = [], []
    for rows in heights:
        v = region if rows == default else with_band_rows(region, rows)
        variants.append(v)
        descs.append(replace(desc, op_type=v.op_type, band_rows=rows))
    feeds = _region_feeds(region, info, bindings, seed, model)
    lanes = c.attrs.block
    fused_feeds = {x: to_blocked(a, lanes) if x in blocked_inputs(region) else a for x, a in feeds.items()}
    t = time.perf_counter()
    candidates = [{"rows": rows} for rows in heights]
    with tempfile.TemporaryDirectory(prefix="onnxopt-bands-") as tmp:
        lib = os.path.join(tmp, "bands.so")
        link_library(descs, [obj], target, lib)  # one object: the descriptors differ in the height only
        sessions = [make_session(_region_models(v, model, info)[1], threads, library=lib,
                                 provider=target.execution_provider) for v in variants]
        times = time_interleaved(sessions, fused_feeds, min_time=min_time, max_blocks=12, min_blocks=3)
        del sessions
    for cand, tm in zip(candidates, times):
        cand["seconds"] = tm["median"]
    best = min(range(len(heights)), key=lambda i: candidates[i]["seconds"])
    chosen = best if candidates[best]["seconds"] * MARGIN < candidates[0]["seconds"] else 0
    d = descs[chosen]
    return BandSearchResult(heights[chosen], default, candidates, built={d.op_type: (obj, d)}, build_s=build_s,
                            measure_s=time.perf_counter() - t)


def apply_band(region, rows: int) -> None:
    """Give the region the band height found (its op type changes with it)."""
    region.params = replace(region.compute, attrs=replace(region.compute.attrs, band_rows=int(rows)))
    if region.op_type_key:
        region.compute_op_type(region.op_type_key)


__all__ = ["BandSearchResult", "apply_band", "band_candidates", "search_band", "with_band_rows"]
