"""Building every candidate kernel once, the searches that tune them (tiles, Winograd, bands), and each kernel's
check against its region run by onnxruntime: right, and faster.

A stage of the driver (onnxopt/pipeline.py, _Optimizer): its methods read and write the run's state there."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np

from onnxopt.codegen.compute.build import tile_sets_of
from onnxopt.codegen.compute.tile_sets import prebuild
from onnxopt.codegen.microkernel.depthwise import depthwise_mi_for
from onnxopt.cost_cache import open_cost_cache
from onnxopt.kinds import kind_for
from onnxopt.fusion.compute import apply_tile
from onnxopt.fusion.elementwise import _opset
from onnxopt.fusion.layout import (blocked_inputs, blocked_outputs, from_blocked, is_depthwise, to_blocked,
                                   with_channel_vectors)
from onnxopt.fusion.region import Region
from onnxopt.measure import exact_integer_reference as _exact_integer_reference
from onnxopt.measure import bytes_moved as _bytes_moved
from onnxopt.measure import kernel_error_bound, runtime_inputs
from onnxopt.measure import peak_dtype as _peak_dtype
from onnxopt.measure import region_feeds as _region_feeds
from onnxopt.measure import region_flops as _region_flops
from onnxopt.measure import region_models as _region_models
from onnxopt.measure import weight_bytes as _weight_bytes
from onnxopt.timing import time_interleaved
from onnxopt.fusion import winograd
from onnxopt.tune import search_tile
from onnxopt.tune.tile_search import kernel_tolerance
from onnxopt.verify import KERNEL_ATOL, KERNEL_RTOL, LOW_PRECISION_TOLERANCE, Tolerance, compare
from onnxopt.driver.precision import is_lowered, lowered_dtype
from onnxopt.driver.policy import (COLD_REGION_BYTES, SETTLED_BEYOND, ALONE_CHECK_S, _machine, custom_ops,
                                   pool_passes, runs_quantized_units)

POOLED = "pooled"  # a verdict decided with the region's pool (KernelStage._judge_pool)


class KernelStage:

    def _build(self, regions):
        """Compile each distinct kernel once, on all cores (codegen/parallel.py); a region whose kernel fails to
        compile is rejected."""
        from onnxopt.codegen.parallel import build_many

        built = {}  # op_type -> (obj, desc, [regions])
        todo: dict[str, list[Region]] = {}
        for r in regions:
            if r.relayout is not None:  # onnxruntime's own nodes: nothing to compile
                continue
            if r.op_type in self.prebuilt:
                built.setdefault(r.op_type, (*self.prebuilt[r.op_type], []))[2].append(r)
                continue
            todo.setdefault(r.op_type, []).append(r)

        def job(r):
            # The kind's lowering for the target's backend (onnxopt/backends, onnxopt/kinds).
            return lambda: self.backend.lower(kind_for(r), r, self.opts.target)

        # The compute kernels' tile sets first, each distinct one once (codegen/compute/tile_sets.py): most
        # convolutions of a network share a few. The kernels then only describe themselves.
        prebuild(tile_sets_of([rs[0] for rs in todo.values()], self.opts.target), self.opts.target)
        results = build_many([job(rs[0]) for rs in todo.values()])
        for (op_type, rs), res in zip(todo.items(), results):
            if isinstance(res, Exception):  # reported, regions left unfused
                for r in rs:
                    self._reject(r, f"code generation failed: {res}")
                continue
            built[op_type] = (res[0], res[1], rs)
        return built

    def _cost_cache(self):
        """The measured-cost cache (onnxopt/cost_cache.py), opened on first use; None when off or unusable."""
        if self.costs is None and self.opts.cost_cache is not False:
            self.costs = open_cost_cache(self.opts.cost_cache)
            if self.costs.warning:
                self.say(self.costs.warning)
        return self.costs if self.costs is not None and self.costs.enabled else None

    def _close_cost_cache(self):
        """Close the cache and put its summary in the report, once (before the report is published, and at the
        end of every run)."""
        if "cost_cache" in self.report:
            return
        if self.costs is not None:
            self.report["cost_cache"] = self.costs.summary()
            self.costs.close()
        else:
            self.report["cost_cache"] = {"path": None, "enabled": False, "hits": 0, "misses": 0}

    def _weights_flush(self, work) -> int:
        """Bytes to flush before each run of a cold timing (tune/winograd_search.weights_cold_flush), once."""
        if self.weights_flush is None:
            from onnxopt.hardware.measure import cache_levels
            from onnxopt.tune.winograd_search import weights_cold_flush

            self.weights_flush = weights_cold_flush(work, cache_levels()[-1].total_bytes)
        return self.weights_flush

    def _cached_times(self, r: Region, feeds, entry, measure, cold: bool = False):
        """The region's (original, fused) timings: from the cost cache when it holds them for this op type, these
        input shapes, threads, machine and versions; else `measure()`d and stored. Only the timing is reused: the
        kernel was checked against onnxruntime before this is called."""
        cache = self._cost_cache()
        shapes = [list(np.shape(v)) for v in feeds.values()]
        # The same kernel on the same shapes in another region of this run (a network's repeated cells: NASNet's,
        # Inception's modules, and the same convolution in several plans): its time is that one's.
        same = self._region_times.get((r.op_type, repr(shapes)))
        if same is not None:
            entry["timed_as"] = "the same kernel and shapes in another region"
            return same
        hit = cache.get_region(r.op_type, shapes, self.opts.threads, cold) if cache else None
        if hit is not None:
            entry["cost_cache"] = "hit"
            return {"median": hit["original_s"]}, {"median": hit["fused_s"]}
        t_orig, t_fused = measure()
        self._region_times[(r.op_type, repr(shapes))] = (t_orig, t_fused)
        if cache is not None:
            cache.put_region(r.op_type, shapes, self.opts.threads, t_orig["median"], t_fused["median"], cold)
            if cache.enabled:
                entry["cost_cache"] = "miss"
        return t_orig, t_fused

    def _tile_of(self, r: Region) -> list[int]:
        mk = self.backend.layout(self.opts.target)
        c = r.compute
        if c.op in ("afusion", "siblings"):  # the parts' tiles
            return [self._tile_of(p) for p in c.parts]
        if is_depthwise(c) and (c.attrs.out_blocked or c.attrs.channel_vectors):
            # Its own tile: pixels of one channel vector (codegen/microkernel/depthwise.py), as build_compute picks.
            return [depthwise_mi_for(mk, c.attrs.kernel[1]), 1, 1]
        if c.attrs.packed_b:  # a constant B in panels: the mask-free tile, or the schedule search's
            t = c.tile if c.tile is not None else mk.packed_b_tile
            return [t.mi, t.ni, t.mii]
        t = c.tile if c.tile is not None else mk.tile
        return [t.mi, t.ni, t.mii]

    def _search_tiles(self, work, regions):
        """The register tile of each compute region, by a small measured search (onnxopt/tune/tile_search.py):
        the winner, when it is not the target's default tile, is applied to the region (weights repacked, new op
        type) before the kernels are built. Regions with the same op type and shapes are searched once."""
        from onnxopt.annotate.shapes import tensor_info

        from onnxopt.tune.tile_search import region_flops

        t = time.perf_counter()
        info = tensor_info(work)
        done: dict[tuple, object] = {}
        # Winograd choices first: they gain 1.5-3x where they win, a register tile a few percent. Then largest first,
        # so that a tuning budget spent leaves the default tile on the cheapest regions.
        wino = self.opts.winograd == "auto"
        lanes = self.backend.layout(self.opts.target).lanes

        def winograd_candidate(r):  # blocked, or NCHW that the channel-vector kernel would give Winograd tiles
            return wino and (winograd.applies(r) is None or winograd.applies_on_channel_vectors(r, lanes))
        # Regions whose kernels read bf16/fp16 weights (driver/precision.py) keep their default tile: the searches
        # repack float32 weights. float32 kernels whose weights are only stored as float16 take part.
        order = sorted((r for r in regions if r.compute is not None and r.compute.op not in ("afusion", "siblings")
                        and r.compute.attrs.b_dtype is None),
                       key=lambda r: (not winograd_candidate(r),
                                      -region_flops(r, info, self._bindings())))
        split = {"build_s": 0.0, "measure_s": 0.0}
        # AFUSION band heights cost a compile and a short timing per op type: a third of the budget is kept for them.
        has_bands = any(r.compute is not None and r.compute.op == "afusion" for r in regions)
        tile_share = 2 / 3 if has_bands else 1
        # The Winograd choices come first, with all of tune_budget: on Inception-v3 its 49 candidate layers took
        # 11 s. The register tiles and band heights then share what is left, but at least a third of it (ours gain
        # a few percent; Winograd 1.5-3x where it wins).
        t_tiles, rest = None, self.opts.tune_budget
        for r in order:
            feeds_key = (r.op_type, tuple(tuple(d if isinstance(d, int) else self.bindings.get(d, d)
                                                for d in (info[x].shape if x in info else ()))
                                          for x in runtime_inputs(r, work)))
            if winograd_candidate(r):
                spent = time.perf_counter() - t
                over = f"the Winograd budget ({self.opts.tune_budget:g} s) is spent" \
                    if spent > self.opts.tune_budget else None
                nchw = winograd.applies(r) is not None
                self._search_winograd(work, r, info, feeds_key, done, over, split)
                if not nchw or r.compute.attrs.winograd:
                    continue
                # an NCHW convolution that stays direct: its register tile or channel vectors are searched below
            if t_tiles is None:
                t_tiles = time.perf_counter()
                rest = max(self.opts.tune_budget - (t_tiles - t), self.opts.tune_budget / 3)
            spent = time.perf_counter() - t_tiles
            over = f"the tuning budget ({self.opts.tune_budget:g} s) is spent" if spent > rest * tile_share else None
            if r.compute.attrs.packed_b:  # its own space: the register tile and the schedule (tune/heron)
                self._choose_schedule(work, r, info, feeds_key, done, split, over)
                continue
            res = self._once(r, feeds_key, done, split, "tile_search", lambda r=r, over=over: search_tile(
                r, work, self.opts.target, self.opts.threads, self._cost_cache(), info=info, bindings=self._bindings(),
                seed=self.opts.seed, cache_only=over))
            if res is None:
                continue
            if res.changed:
                try:
                    if res.vectors == "channels":
                        mk = self.backend.layout(self.opts.target)
                        with_channel_vectors(r, mk.lanes, mk.tile.ni, _opset(work))
                    else:
                        apply_tile(r, res.tile)
                except Exception as e:  # noqa: BLE001
                    self.tile_info[id(r)] = {"tile": self._tile_of(r),
                                             "tile_search": dict(res.to_report(), skipped=f"cannot apply: {e}")}
                    continue
            # (an NCHW convolution that stayed direct keeps its Winograd timings in the report)
            self.tile_info[id(r)] = {**self.tile_info.get(id(r), {}), "tile": self._tile_of(r),
                                     "tile_search": res.to_report()}
            if not res.skipped:
                self.say(f"tile {self._tile_of(r)} for {r.describe()}"
                         + (f" ({res.to_report().get('gain', 1.0):.2f}x the default)" if res.changed else ""))
        if t_tiles is None:  # no region for the tile search: the bands get what the Winograd choices left
            t_tiles = time.perf_counter()
            rest = max(self.opts.tune_budget - (t_tiles - t), self.opts.tune_budget / 3)
        self._search_int8_schedules(work, regions, info, t_tiles, rest * tile_share, split, done)
        self._search_bands(work, regions, info, t_tiles, rest, split)
        wins = [v["winograd"] for v in self.tile_info.values() if "winograd" in v]
        if wins:
            chosen = {}
            for kernel, ms in winograd.SIZES_BY_KERNEL.items():
                for m in ms:
                    n = sum(1 for w in wins if w.get("chosen") == m and tuple(w.get("kernel", ())) == kernel)
                    if n or kernel == (3, 3):
                        chosen[winograd.label(kernel, m)] = n
            self.report["winograd"] = {"searched": sum(1 for w in wins if not w.get("skipped")), "chosen": chosen,
                                       "weights": "cold" if self._weights_flush(work) else "warm",
                                       "direct": sum(1 for w in wins if not w.get("chosen"))}
        schedules = [v["matmul_schedule"] for v in self.tile_info.values() if "matmul_schedule" in v]
        self.report["matmul_schedule"] = {
            "searched": sum(1 for x in schedules if not x.get("skipped")),
            "changed": sum(1 for x in schedules if not x.get("skipped") and x["chosen"] != x["default"]),
            "from_records": sum(1 for x in schedules if x.get("records") == "hit"),
            "skipped": sum(1 for x in schedules if x.get("skipped"))}
        searches = [v["tile_search"] for v in self.tile_info.values() if "tile_search" in v]
        self.report["tile_search"] = {"searched": sum(1 for x in searches if not x.get("skipped")),
                                      "changed": sum(1 for x in searches if not x.get("skipped")
                                                     and (x["chosen"] != x["default"]
                                                          or x.get("vectors", "pixels") != "pixels")),
                                      "skipped": sum(1 for x in searches if x.get("skipped")),
                                      "over_budget": sum(1 for x in searches if "tuning budget" in x.get("skipped", "")),
                                      "budget_s": self.opts.tune_budget}
        self.report["timings"]["tile_search_s"] = time.perf_counter() - t
        self.report["timings"]["tile_search_build_s"] = split["build_s"]
        self.report["timings"]["tile_search_measure_s"] = split["measure_s"]

    def _search_int8_schedules(self, work, regions, info, t_tiles: float, budget: float, split: dict, done: dict):
        """The schedule of each int8 GEMM and convolution region (mr, the parallel extent), by measurement
        (onnxopt/tune/int8_schedule.py), in what the register tiles left of their share of the tuning budget; the
        winner replaces the region's parameters (a new op type)."""
        from onnxopt.tune.int8_schedule import FAMILIES, search_schedule

        def ops(r):  # outputs x reduction: largest first, as the tile search goes
            dims = [d if isinstance(d, int) else int(self.bindings.get(d, 1)) for d in (r.shape or [])]
            return int(np.prod(dims or [0])) * getattr(r.params, "k4", getattr(r.params, "k", 1))

        for r in sorted((r for r in regions if r.params.family in FAMILIES), key=ops, reverse=True):
            feeds_key = ("int8", r.op_type, tuple(tuple(d if isinstance(d, int) else self.bindings.get(d, d)
                                                        for d in (info[x].shape if x in info else ()))
                                                  for x in runtime_inputs(r, work)))
            over = f"the tuning budget ({self.opts.tune_budget:g} s) is spent" \
                if time.perf_counter() - t_tiles > budget else None
            res = self._once(r, feeds_key, done, split, "schedule_search", lambda r=r, over=over: search_schedule(
                r, work, self.opts.target, self.opts.threads or os.cpu_count() or 1, info=info,
                bindings=self._bindings(), seed=self.opts.seed, cache_only=over))
            if res is None:
                continue
            # Only the schedule: a result shared with a region of the same op type and shapes (_once) carries that
            # region's function body, whose tensor names are its own.
            if (res.params.mr, res.params.tasks) != (r.params.mr, r.params.tasks):
                r.params = replace(r.params, mr=res.params.mr, tasks=res.params.tasks)
                r.compute_op_type(r.op_type_key)
            self.tile_info[id(r)] = {"schedule_search": res.to_report()}
        searched = [v["schedule_search"] for v in self.tile_info.values() if "schedule_search" in v]
        if searched:
            self.report["int8_schedule_search"] = {
                "searched": sum(1 for x in searched if not x.get("skipped")),
                "changed": sum(1 for x in searched
                               if not x.get("skipped") and x["chosen"] != {"mr": 4, "tasks": 16}),
                "skipped": sum(1 for x in searched if x.get("skipped"))}

    def _choose_schedule(self, work, r: Region, info, feeds_key, done: dict, split: dict, over: str | None):
        """The register tile and schedule (K block, L2 group, task split) of a float32 matmul with its B packed in
        panels, by the schedule search's default mode (onnxopt/tune/heron/choose.py): the analytic model ranks
        samples of the constrained space, a few measurements decide, the cost cache's tuning records answer for
        a problem measured before. The winner is applied to the region (panels repacked, new op type)."""
        from onnxopt.annotate.shapes import concrete
        from onnxopt.tune.heron.choose import apply_choice, choose_schedule

        mk = self.backend.layout(self.opts.target)
        a = info.get(runtime_inputs(r, work)[0])
        dims = concrete(a.shape, self._bindings()) if a is not None else None
        if not dims or len(dims) < 2 or r.compute.attrs.trans_a:
            self.tile_info[id(r)] = {"tile": self._tile_of(r),
                                     "matmul_schedule": {"skipped": "A's shape is not known as a matrix"}}
            return
        items = int(np.prod(dims[:-2])) if len(dims) > 2 else 1
        shape = (items, dims[-2], dims[-1], int(r.compute.attrs.n))
        res = self._once(r, ("schedule",) + feeds_key, done, split, "matmul_schedule",
                         lambda: choose_schedule(r, self.opts.target, shape, self.opts.threads, self._cost_cache(),
                                                 seed=self.opts.seed, cache_only=over))
        if res is None:
            return
        if res.changed:
            try:
                apply_choice(r, res.point, mk.lanes)
            except Exception as e:  # noqa: BLE001
                self.tile_info[id(r)] = {"tile": self._tile_of(r),
                                         "matmul_schedule": dict(res.to_report(), skipped=f"cannot apply: {e}")}
                return
        self.tile_info[id(r)] = {"tile": self._tile_of(r), "matmul_schedule": res.to_report()}
        if not res.skipped:
            self.say(f"tile {self._tile_of(r)} and schedule {list((res.point or res.default)['schedule'])} for "
                     f"{r.describe()}" + (f" ({res.to_report().get('gain', 1.0):.2f}x the default)"
                                          if res.changed else ""))

    def _once(self, r: Region, key, done: dict, split: dict, report_key: str, search):
        """`search()` once per key (regions with the same op type and shapes share the result): its build and
        measurement time go into `split`, the kernels it compiled into the prebuilt set. None when it failed, the
        reason kept in the region's report under `report_key`: a search is an optimization, the region keeps its
        kernel."""
        try:
            res = done.get(key) or search()
        except Exception as e:  # noqa: BLE001
            tile = self._tile_of(r) if r.compute is not None else None
            self.tile_info[id(r)] = {"tile": tile, report_key: {"skipped": f"{type(e).__name__}: {e}"[:300]}}
            return None
        if key not in done:
            split["build_s"] += res.build_s
            split["measure_s"] += res.measure_s
        done[key] = res
        self.prebuilt.update(res.built)
        return res

    def _search_winograd(self, work, r: Region, info, feeds_key, done: dict, over: str | None, split: dict):
        """Direct or Winograd for one blocked convolution (onnxopt/tune/winograd_search.py); the winner is
        applied to the region in place (the plans share it; AFUSION and sibling parts are copies)."""
        from onnxopt.tune.winograd_search import search_winograd

        res = self._once(r, ("winograd",) + feeds_key, done, split, "winograd", lambda: search_winograd(
            r, work, self.opts.target, self.opts.threads, self._cost_cache(), info=info, bindings=self._bindings(),
            seed=self.opts.seed, cache_only=over, flush_bytes=self._weights_flush(work)))
        if res is None:
            return
        if res.m:
            mk = self.backend.layout(self.opts.target)
            if res.nchw:  # the tiles run on the channel-vector kernel, NCHW in and out
                with_channel_vectors(r, mk.lanes, mk.tile.ni, _opset(work))
            winograd.apply_winograd(r, res.m, mk.lanes, mk.tile.ni)
            self.say(f"Winograd {winograd.label(r.compute.attrs.kernel, res.m)} for {r.describe()}"
                     + (f" ({res.to_report()['gain']:.2f}x the direct kernel)" if "gain" in res.to_report() else ""))
        self.tile_info[id(r)] = {"tile": self._tile_of(r), "winograd": res.to_report()}

    def _search_bands(self, work, regions, info, t_start, budget, split):
        """The band height of each AFUSION region (onnxopt/tune/band_search.py), in what is left of `budget` seconds
        from t_start (shared with the register-tile search), largest first; the chosen variant is applied and its
        object code kept for _build."""
        from onnxopt.tune.band_search import apply_band, search_band
        from onnxopt.tune.tile_search import region_flops

        bands = sorted((r for r in regions if r.compute is not None and r.compute.op == "afusion"),
                       key=lambda r: -region_flops(r, info, self._bindings()))
        found, done = [], {}
        for r in bands:
            # One search per op type: regions that share it share the object code, whose symbols carry its name,
            # so they must keep sharing one height (and one op type).
            res = done.get(r.op_type)
            if res is None:
                if time.perf_counter() - t_start > budget:
                    found.append({"nodes": r.node_names, "skipped": "the tuning budget is spent"})
                    continue
                try:
                    res = search_band(r, work, self.opts.target, self.opts.threads, info=info,
                                      bindings=self._bindings(), seed=self.opts.seed)
                except Exception as e:  # noqa: BLE001 - the search is an optimization: keep the model's height
                    found.append({"nodes": r.node_names, "skipped": f"{type(e).__name__}: {e}"[:300]})
                    continue
                done[r.op_type] = res
                split["build_s"] += res.build_s
                split["measure_s"] += res.measure_s
            if res.rows != res.default:
                apply_band(r, res.rows)
                for pair in (self.report.get("afusion") or {}).get("pairs", []):
                    if pair["nodes"] == r.node_names:
                        pair["band_rows"], pair["band_rows_model"] = res.rows, res.default
            self.prebuilt.update(res.built)
            found.append(dict(res.to_report(), nodes=r.node_names))
        self.report["band_search"] = found

    def _reject(self, r: Region, reason: str):
        r.rejected = reason
        self.report["rejected"].append({"op_type": r.op_type, "nodes": r.node_names, "ops": r.describe(),
                                        "reason": reason})

    def _check_regions(self, work, built) -> list[Region]:
        """Run every kernel against its region in onnxruntime: right answers first, then speed."""
        from onnxopt.annotate.shapes import tensor_info

        info = tensor_info(work)
        if self.cannot_run:
            self.report["kernels_not_run"] = (f"this CPU lacks {', '.join(self.cannot_run)} that target "
                                              f"{self.opts.target.name} needs: kernels were compiled but not run here")
            accepted = [r for _, _, regions in built.values() for r in regions]
            for r in accepted:
                r.measured = {"op_type": r.op_type, "ops": r.describe(), "nodes": r.node_names, "inputs": r.inputs,
                              "outputs": r.outputs, "shape": r.shape, "checked": False}
                self.report["regions"].append(r.measured)
            return accepted
        lib = os.path.join(self.tmpdir, "candidates.so")
        self.backend.link([b[1] for b in built.values()], [b[0] for b in built.values()], self.opts.target, lib)
        bindings = self._bindings()
        accepted = []
        machine = _machine()
        # The same kernel on the same shapes in another region (a network's repeated cells) gets that region's
        # verdict without two more sessions (NASNet's checks: 32 s -> 25.5 s): the code is the same, only the
        # weights differ, and the whole-model check still runs every region with its own.
        verdicts: dict[tuple, tuple] = {}  # key -> (rejection reason or None, accepted entry or None)
        # Regions judged alone on speed whose kernels are the same code on the same shapes, their weights and
        # fallback constants aside (a transformer's repeated layers), are judged together: each is timed as before,
        # and where the median of their speedups passes the bar, all of them pass. One by one, each was a coin flip:
        # MiniLM's 64 x 384 x 384 projections measured 0.89-1.16x in one build, and those that lost went to
        # onnxruntime, outside their neighbours' sequences, with their bias Adds. Where the median does not pass,
        # each is judged on its own time as before (the whole-model decision then sees the ones that passed).
        pooled: dict[tuple, list] = {}  # (kernel key, shapes) -> [(region, its key, its entry or None: a duplicate)]
        order = {id(r): i for i, r in enumerate(r for _, _, regions in built.values() for r in regions)}
        for op_type, (_, desc, regions) in built.items():
            for r in regions:
                feeds = _region_feeds(r, info, bindings, self.opts.seed, work)
                shapes = repr([np.shape(v) for v in feeds.values()])
                key = (r.op_type, shapes)
                if key in verdicts:
                    if verdicts[key][0] is POOLED:  # decided with its pool, below
                        pooled[(r.kernel_key(), shapes)].append((r, key, None))
                    else:
                        self._reuse_verdict(r, key, verdicts[key], accepted)
                    continue
                verdicts[key] = (None, None)  # filled in below; a crash leaves it unknown
                orig, fused = _region_models(r, work, info)
                # Blocked tensors go in and come out in the kernel's layout; the check compares NCHW values and
                # that the padding channels are exact zeros (the next blocked kernel relies on it).
                lanes = r.params.tensor_lanes()
                fused_feeds = {x: to_blocked(v, lanes) if x in blocked_inputs(r) else v for x, v in feeds.items()}
                try:
                    s_orig = self._session(orig)
                    s_fused = self._session(fused, library=lib, ops=custom_ops(fused))
                    exact = _exact_integer_reference(orig)  # int8 kernels: the spec's exact sums
                    want = (s_orig if exact is orig else self._session(exact)).run(None, feeds)
                    got = s_fused.run(None, fused_feeds)
                    b_out = blocked_outputs(r)
                    for i, name in enumerate(r.outputs):
                        if name in b_out:
                            ch = want[i].shape[1]
                            back = to_blocked(from_blocked(got[i], ch), lanes)
                            if got[i].shape != back.shape or not np.array_equal(got[i], back):
                                raise RuntimeError(f"blocked output {name} is not zero in its padding channels")
                            got[i] = from_blocked(got[i], ch)
                except Exception as e:  # noqa: BLE001
                    self._reject(r, f"kernel check could not run: {str(e).splitlines()[0][:200]}")
                    verdicts[key] = (r.rejected, None)
                    continue
                tol = Tolerance(dict(KERNEL_RTOL), dict(KERNEL_ATOL), {})
                if r.compute is not None:
                    # A reduction over K terms in another order differs by about K * eps * sum |a * b|: where
                    # terms cancel, the relative error of a small result is large while the error itself is
                    # rounding. Judge it against the output's scale.
                    tol = kernel_tolerance(want, kernel_error_bound(r))
                if is_lowered(r):  # bf16 / fp16 weights (driver/precision.py): against float32 at their tolerance
                    tol = LOW_PRECISION_TOLERANCE
                diffs = compare(r.outputs, want, got, tol)
                bad = [d for d in diffs if not d.ok]
                if bad:
                    d = bad[0]
                    self._reject(r, f"kernel gives wrong results on {d.name} (max abs {d.max_abs:.3g}, "
                                    f"max rel {d.max_rel:.3g}) {d.detail}".strip())
                    verdicts[key] = (r.rejected, None)
                    continue
                bytes_moved = _bytes_moved(r, feeds, want)
                entry = {"op_type": r.op_type, "ops": r.describe(), "nodes": r.node_names, "inputs": r.inputs,
                         "outputs": r.outputs, "shape": r.shape, "bytes": bytes_moved,
                         "max_abs_err": max(d.max_abs for d in diffs)}
                if is_lowered(r):  # its weights' type; "% of peak" is still against the float32 peak
                    entry["weights_dtype"] = lowered_dtype(r)
                if blocked_inputs(r) or blocked_outputs(r):
                    entry["layout"] = (("blocked" if r.inputs[0] in blocked_inputs(r) else "nchw") + "->"
                                       + ("blocked" if blocked_outputs(r) else "nchw"))
                if getattr(desc, "matrix_instruction", ""):  # AMX tiles, where the CPU and the OS allow them
                    entry["matrix_instruction"] = desc.matrix_instruction
                flops = _region_flops(r, feeds, want)
                if flops:
                    entry["flops"] = flops
                    # int8: the flops are integer ops, against the int8 (or the AMX int8) peak
                    entry["arithmetic"] = _peak_dtype(r, desc, machine, self.opts.target)
                if machine is not None:
                    level = machine.level_for(bytes_moved)
                    # Roofline: the slower of the arithmetic at peak and the bytes at the level's bandwidth.
                    peak = machine.peak_flops.get(_peak_dtype(r, desc, machine, self.opts.target)) or machine.peak_flops["float32"]
                    entry["predicted_s"] = max(bytes_moved / level.bandwidth, flops / peak if flops else 0.0)
                    entry["memory_level"] = level.name
                    entry["level_bandwidth"] = level.bandwidth
                if r.compute is not None:
                    entry.update(self.tile_info.get(id(r)) or {"tile": self._tile_of(r)})
                elif id(r) in self.tile_info:  # an int8 kind's schedule search
                    entry.update(self.tile_info[id(r)])
                kind = kind_for(r)
                if kind is not None and kind.report is not None:
                    try:
                        entry.update(kind.report(r, feeds, desc))
                    except Exception as e:  # noqa: BLE001 - the report's extras never stop a build
                        entry["report_error"] = f"{type(e).__name__}: {e}"[:200]
                if self.opts.measure:
                    # A region of a blocked chain is judged with its chain in the whole-model timing; its own time
                    # is for the report (and AFUSION's measured savings): a shorter timing does. A copy kernel has
                    # its passthrough nodes to fall back on (fusion/blocked_copy.py); without sequences it is judged
                    # alone. With them it keeps its neighbours in one sequence, though alone it is hardly faster
                    # than onnxruntime's Concat: only the whole model shows that. So is a lone elementwise op
                    # between two kernels (a bridge: fusion/elementwise.py sequence_bridges).
                    # So is a quantized model's unit run whole (an int8 convolution, a QDQ Add) with sequences: its
                    # time at these sizes is mostly a node's overhead, which a sequence of its neighbours saves
                    # (PP-OCR cls QDQ: 0.838 -> 0.765 ms with the units slower alone kept), and the drop trials
                    # remove the kinds that lose in the model. Only a statically quantized model's: a dynamic one's
                    # units are few and large, and judged in the model one more was kept that lost (MiniLM int8:
                    # 0.985x of the build that judged them alone).
                    chained = ((blocked_inputs(r) or blocked_outputs(r)) and r.copy is None) or \
                        (r.copy is not None and self.opts.sequences) or \
                        (getattr(r.params, "bridge", False) and self.opts.sequences) or \
                        (self.opts.sequences and self.quantizes_statically and runs_quantized_units(r))
                    # Blocks of 4 ms, not 10: a chain's kernel is timed three blocks a side, and NASNet-A's 200
                    # checks took 14 s with 10 ms blocks.
                    # A kernel judged alone stops timing once it is far from the bar either way (SETTLED_BEYOND):
                    # NASNet-A's NCHW kernels measured 0.1-0.2x, 0.1 s each.
                    bar = self.opts.min_speedup
                    quick = dict(min_time=0.012, max_blocks=6, min_blocks=3, block_s=0.004) if chained \
                        else dict(min_time=ALONE_CHECK_S, max_blocks=15, block_s=0.005,
                                  settled_outside=(bar / SETTLED_BEYOND, bar * SETTLED_BEYOND))
                    # Judged alone with large weights in a model whose weights do not fit in the caches: timed with
                    # them out of the caches, as in the model (ResNet-50's classifier, 8 MB: ours measured faster
                    # warm and ran 550 us in the model against onnxruntime's 325).
                    cold = not chained and self._weights_flush(work) > 0 and _weight_bytes(r, work) >= COLD_REGION_BYTES
                    if cold:
                        quick = {"min_time": 0.1, "min_blocks": 8, "max_blocks": 16,
                                 "flush_bytes": self._weights_flush(work)}
                        entry["weights"] = "cold"
                    t_orig, t_fused = self._cached_times(r, feeds, entry, lambda: time_interleaved(
                        [s_orig, s_fused], [feeds, fused_feeds], **quick), cold)
                    self._timed[id(r)] = t_fused["median"]  # for the measured search, even if rejected below
                    self._timed_by_key[key] = t_fused["median"]
                    entry["measured_original_s"] = t_orig["median"]
                    entry["measured_fused_s"] = t_fused["median"]
                    entry["speedup"] = t_orig["median"] / t_fused["median"]
                    entry["achieved_bandwidth"] = bytes_moved / t_fused["median"]
                    if machine is not None:
                        entry["bandwidth_fraction"] = entry["achieved_bandwidth"] / entry["level_bandwidth"]
                    if flops:
                        entry["achieved_flops"] = flops / t_fused["median"]
                        peak = machine.peak_flops.get(_peak_dtype(r, desc, machine, self.opts.target)) if machine is not None else None
                        if peak:
                            entry["peak_fraction"] = entry["achieved_flops"] / peak
                    # A region of a blocked chain is judged with its chain, in the whole-model timing (`chained`);
                    # one judged alone, with its pool (below).
                    if not chained:
                        pooled.setdefault((r.kernel_key(), shapes), []).append((r, key, entry))
                        verdicts[key] = (POOLED, entry)
                        continue
                r.measured = entry
                self.report["regions"].append(entry)
                accepted.append(r)
                verdicts[key] = (None, entry)
        for members in pooled.values():
            self._judge_pool(members, verdicts, accepted)
        accepted.sort(key=lambda r: order[id(r)])
        return accepted

    def _judge_pool(self, members: list, verdicts: dict, accepted: list) -> None:
        """The speed verdict of regions that run the same kernel code on the same shapes: every one passes where the
        median of their speedups passes the bar, else each on its own speedup (duplicates of a timed region's op
        type take its verdict)."""
        timed = [(r, key, e) for r, key, e in members if e is not None]
        median, passes = pool_passes([e["speedup"] for _, _, e in timed], self.opts.min_speedup)
        for (r, key, entry), passed in zip(timed, passes):
            if len(timed) > 1:
                entry["pooled"] = {"regions": len(timed), "median_speedup": median}
            if passed:
                r.measured = entry
                self.report["regions"].append(entry)
                accepted.append(r)
                verdicts[key] = (None, entry)
            else:
                pool = f"; the median of {len(timed)} regions of this kernel and shapes {median:.2f}x" \
                    if len(timed) > 1 else ""
                self._reject(r, f"not faster than onnxruntime ({entry['speedup']:.2f}x, needs "
                                f"{self.opts.min_speedup:.2f}x{pool})")
                verdicts[key] = (r.rejected, None)
        for r, key, entry in members:
            if entry is None:
                self._reuse_verdict(r, key, verdicts[key], accepted)

    def _reuse_verdict(self, r: Region, key: tuple, verdict: tuple, accepted: list) -> None:
        """_check_regions for a region whose kernel and shapes an earlier region had: the same outcome."""
        reason, first = verdict
        if key in self._timed_by_key:  # the measured AFUSION search reads every region's time, rejected ones too
            self._timed[id(r)] = self._timed_by_key[key]
        if reason is None and first is None:
            reason = "kernel check could not run (the same kernel and shapes in another region)"
        if reason is not None:
            self._reject(r, reason)
            return
        entry = dict(first, nodes=r.node_names, inputs=r.inputs, outputs=r.outputs, shape=r.shape,
                     checked_as="the same kernel and shapes in another region")
        if r.compute is not None:
            entry.update(self.tile_info.get(id(r)) or {"tile": self._tile_of(r)})
        elif id(r) in self.tile_info:
            entry.update(self.tile_info[id(r)])
        r.measured = entry
        self.report["regions"].append(entry)
        accepted.append(r)
