"""The int8 kinds' schedule search (UNIT §4.2, the CPU side): of an int8 GEMM or convolution region (the qmatmul
and qconv kinds), the two points where UNIT's CPU schedule breaks the loop nest, timed rather than predicted.

- the unroll: rows a tile computes at once (the qconv kind's output channels, the qmatmul kind's rows of A), each
  row NR accumulators of the instruction: 2, 4 or 6 where NR vectors leave the registers for them (8 too with one
  vector a row, AVX-512's), 4 by default;
- the parallel extent: the most tasks a call is split into (runtime.c grid_split), one per core or 16.

Each candidate is built with the kind's own build, all linked into one library, checked against the spec's exact
integer result (measure.exact_integer_reference, in quantization steps for a quantized output) and timed
interleaved; the fastest replaces the default when it wins by MARGIN twice (tile_search.confirm_win), else the
default stays. Depthwise convolutions run their own tile and are not searched.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field, replace

from onnxopt.codegen.glue.library import link_library
from onnxopt.timing import make_session, time_interleaved
from onnxopt.verify import KERNEL_ATOL, KERNEL_RTOL, Tolerance, compare

from .tile_search import confirm_win

MARGIN = 1.03
MIN_OPS = 2e6  # integer ops below which the schedule cannot matter
FAMILIES = ("qconv", "qmatmul")


@dataclass
class ScheduleResult:
    params: object  # the parameters to use (the default's when nothing won)
    candidates: list = field(default_factory=list)  # {"mr": .., "tasks": .., "seconds" | "error": ..}
    skipped: str | None = None
    build_s: float = 0.0
    measure_s: float = 0.0
    built: dict = field(default_factory=dict)  # what the pipeline's prebuilt set takes (nothing: kinds rebuild)

    def to_report(self) -> dict:
        out = {"chosen": {"mr": self.params.mr, "tasks": self.params.tasks}, "candidates": self.candidates,
               "build_s": round(self.build_s, 3), "measure_s": round(self.measure_s, 3)}
        if self.skipped:
            out["skipped"] = self.skipped
        return out


def schedule_space(params, target, threads: int) -> list:
    """The schedules timed for `params` on `target`, the default (mr 4, 16 tasks) first: the kind's rows
    (onnxopt/kinds/schedule.py int8_rows, its declared space) by the default extent and one task per thread."""
    from onnxopt.kinds.schedule import int8_rows

    rows = int8_rows(target, bool(getattr(params, "out_blocked", False)))
    extents = list(dict.fromkeys([16, max(1, threads)]))
    return [replace(params, mr=m, tasks=t) for m in rows for t in extents]


def search_schedule(region, model, target, threads: int, *, info, bindings, seed: int = 0, min_time: float = 0.1,
                    margin: float = MARGIN, cache_only: str | None = None) -> ScheduleResult:
    """Time the schedules of one int8 region on its runtime shapes; returns the chosen parameters."""
    from onnxopt.kinds import kind_of
    from onnxopt.measure import exact_integer_reference, region_feeds, region_flops, region_models

    p = region.params
    if getattr(p, "depthwise", False):
        return ScheduleResult(p, skipped="a depthwise convolution runs its own tile")
    if cache_only:
        return ScheduleResult(p, skipped=cache_only)
    feeds = region_feeds(region, info, bindings, seed, model)
    orig, _ = region_models(region, model, info)
    try:
        want = make_session(exact_integer_reference(orig), threads, optimization="none",
                            provider=target.execution_provider).run(None, feeds)
    except Exception as e:  # noqa: BLE001 - no search; the pipeline checks the default kernel as usual
        return ScheduleResult(p, skipped=f"could not run the reference: {str(e).splitlines()[0][:200]}")
    if region_flops(region, feeds, want) < MIN_OPS:
        return ScheduleResult(p, skipped="too few operations for the schedule to matter")
    kind = kind_of(region)
    space = schedule_space(p, target, threads)
    candidates, variants, objs, descs = [], [], [], []
    t_build = time.perf_counter()
    for params in space:
        cand = {"mr": params.mr, "tasks": params.tasks}
        candidates.append(cand)
        v = replace(region, params=params, measured={}, rejected=None)
        v.compute_op_type(region.op_type_key)
        try:
            obj, desc, _ = kind.build(v, target)
        except Exception as e:  # noqa: BLE001 - a schedule that does not build is left out
            cand["error"] = f"build: {type(e).__name__}: {e}"
            continue
        variants.append((cand, v))
        objs.append(obj)
        descs.append(desc)
    build_s = time.perf_counter() - t_build
    t_measure = time.perf_counter()
    chosen = p
    with tempfile.TemporaryDirectory(prefix="onnxopt-int8-schedule-") as tmp:
        lib = os.path.join(tmp, "schedules.so")
        try:
            link_library(descs, objs, target, lib)
        except Exception as e:  # noqa: BLE001
            return ScheduleResult(p, candidates, skipped=f"could not link: {str(e).splitlines()[0][:200]}")
        sessions, timed = [], []
        tolerance = Tolerance(dict(KERNEL_RTOL), dict(KERNEL_ATOL), {})  # as the pipeline's kernel check
        for cand, v in variants:
            try:
                _, fused = region_models(v, model, info)
                s = make_session(fused, threads, library=lib, provider=target.execution_provider)
                got = s.run(None, feeds)
            except Exception as e:  # noqa: BLE001
                cand["error"] = f"run: {str(e).splitlines()[0][:200]}"
                continue
            bad = [d for d in compare(region.outputs, want, got, tolerance) if not d.ok]
            if bad:
                cand["error"] = f"wrong results on {bad[0].name} (max abs {bad[0].max_abs:.3g})"
                continue
            sessions.append(s)
            timed.append((cand, v))
        if sessions:
            times = time_interleaved(sessions, feeds, min_time=min_time, min_blocks=3, max_blocks=10)
            for (cand, _), tm in zip(timed, times):
                cand["seconds"] = tm["median"]
            best = min(range(len(timed)), key=lambda i: timed[i][0]["seconds"])
            base = next((i for i, (_, v) in enumerate(timed) if v.params == p), None)
            if base is None:
                chosen = timed[best][1].params
            elif best != base and timed[best][0]["seconds"] * margin < timed[base][0]["seconds"]:
                def retime():  # the default and the best alone, interleaved: the best's gain
                    again = time_interleaved([sessions[base], sessions[best]], feeds, min_time=min_time,
                                             min_blocks=3, max_blocks=10)
                    return again[0]["median"] / again[1]["median"]

                won, gains = confirm_win(timed[base][0]["seconds"] / timed[best][0]["seconds"], retime, margin)
                timed[best][0]["confirm_gain"] = gains[1]
                if won:
                    chosen = timed[best][1].params
        sessions.clear()
    return ScheduleResult(chosen, candidates, build_s=build_s, measure_s=time.perf_counter() - t_measure)
