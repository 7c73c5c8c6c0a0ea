"""`onnxopt tune MODEL`: the full search (CGA with the XGBoost cost model, on real measurements through the C entry
point) for every distinct packed-B matmul of a model, its measurements written to the cost cache's tuning records.
An optimization of any model with the same problems then takes the best record without measuring
(choose.py's default mode reads them), and a build from the same records chooses the same kernels."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from . import packed_matmul as pm
from .choose import KIND, MIN_FLOPS, default_point, target_key
from .rules import derive
from .search import Problem, cga

CONFIRM = 5  # the search's best points re-timed (MatmulBench.confirm) before the records keep them


@dataclass
class TunedProblem:
    shape: tuple  # (items, M, K, N)
    default_s: float | None
    best_s: float | None
    best: dict | None
    trials: int
    seconds: float
    times: dict = field(default_factory=dict)
    skipped: str | None = None
    reused: bool = False  # the cost cache had this problem's tuning records already (another model's, a batch's)

    def to_dict(self) -> dict:
        out = {"shape": list(self.shape), "default_s": self.default_s, "best_s": self.best_s, "best": self.best,
               "trials": self.trials, "seconds": round(self.seconds, 2), "search_times": self.times}
        if self.default_s and self.best_s:
            out["gain"] = self.default_s / self.best_s
        if self.skipped:
            out["skipped"] = self.skipped
        if self.reused:
            out["reused"] = True
        return out


def matmul_problems(model, target, bindings: dict | None = None) -> list[tuple[int, int, int, int]]:
    """The distinct (items, M, K, N) of the float32 matmuls with a constant B the optimizer packs in panels."""
    from onnxopt.annotate.shapes import concrete, tensor_info
    from onnxopt.codegen.microkernel.registry import select
    from onnxopt.fusion.compute import ComputeRule
    from onnxopt.graph.infer import infer

    work = infer(model)
    info = tensor_info(work)
    mk = select(target)
    t = mk.packed_b_tile
    rule = ComputeRule(work, mk.tile.mi, panel=t.ni * t.lanes)
    found = []
    for r in rule.find_regions(set(), []):
        c = r.compute
        if c is None or not c.attrs.packed_b or c.attrs.trans_a:
            continue
        a = info.get(r.inputs[0])
        dims = concrete(a.shape, bindings or {}) if a is not None else None
        if not dims or len(dims) < 2:
            continue
        items = int(np.prod(dims[:-2])) if len(dims) > 2 else 1
        shape = (items, int(dims[-2]), int(dims[-1]), int(c.attrs.n))
        if shape not in found:
            found.append(shape)
    return found


def tune_problem(shape, target, threads: int, trials: int, cache=None, seed: int = 0, pop: int = 200,
                 gens: int = 5, min_time: float = 0.02, retune: bool = False) -> TunedProblem:
    """The full search for one problem, its measurements recorded; where the cache holds an earlier search's records
    of this problem on this machine (another model of a batch tuned it), those are reused unless `retune`. While
    another process searches the same problem (its claim in the cache), this one waits for its records."""
    items, M, K, N = shape
    t0 = time.perf_counter()
    if items != 1:
        return TunedProblem(shape, None, None, None, 0, 0.0, skipped="several matrices of A share B")
    if 2.0 * M * K * N < MIN_FLOPS:
        return TunedProblem(shape, None, None, None, 0, 0.0, skipped="below the FLOPs where a schedule matters")
    tkey = target_key(target)
    if cache is not None and cache.enabled:
        # another process searching this problem now (a batch's other model, a Ray task): wait for its records
        while True:
            earlier = None if retune else _reuse(cache, shape, target, threads, t0)
            if earlier is not None:
                return earlier
            if cache.claim(KIND, shape, tkey, "float32", threads) is None:
                break
            time.sleep(CLAIM_POLL_S)
    try:
        return _search(shape, target, threads, trials, cache, seed, pop, gens, min_time, t0)
    finally:
        if cache is not None and cache.enabled:
            cache.release(KIND, shape, tkey, "float32", threads)


CLAIM_POLL_S = 1.0  # how often a process waiting for another's search of the same problem looks for its records


def _reuse(cache, shape, target, threads: int, t0: float) -> TunedProblem | None:
    """The problem as an earlier search left it in the records, or None where none searched it."""
    done = [(p, s) for p, s in cache.get_records(KIND, shape, target_key(target), "float32", threads, "tune") if s]
    if not done:
        return None
    default = default_point(target)
    best_s, best = min(((s, p) for p, s in done), key=lambda x: x[0])
    default_s = next((s for p, s in done if p == default), None)
    return TunedProblem(shape, default_s, best_s, best, 0, time.perf_counter() - t0, reused=True)


def _search(shape, target, threads, trials, cache, seed, pop, gens, min_time, t0) -> TunedProblem:
    items, M, K, N = shape
    cap = pm.capacities(target)
    csp = derive(pm.schedule(M, K, N, cap), cap, pm.ROLES)
    bench = pm.MatmulBench(M, K, N, target, threads=threads, seed=seed, min_time=min_time)
    measured: dict = {}

    def measure(a):
        p = pm.kernel_point(a)
        key = (p["tile"], p["schedule"])
        if key not in measured:
            measured[key] = bench.measure(p).seconds
        return measured[key]

    try:
        d = default_point(target)
        default_key = (tuple(d["tile"]), tuple(d["schedule"]))
        measured[default_key] = bench.measure({"tile": default_key[0], "schedule": default_key[1]}).seconds
        problem = Problem(csp, measure, lambda a: pm.features(a, M, K, N, cap.lanes), pm.FEATURE_DEPS)
        run = cga(problem, trials, seed, pop=pop, gens=gens)
        # the winners and the default timed again, longer: records keep the confirmed times
        top = sorted((k for k, s in measured.items() if s), key=measured.get)[:CONFIRM]
        keys = top + ([default_key] if default_key not in top else [])
        for k, m in zip(keys, bench.confirm([{"tile": k[0], "schedule": k[1]} for k in keys])):
            measured[k] = m.seconds
    finally:
        bench.close()
    records = [({"tile": list(k[0]), "schedule": list(k[1])}, s) for k, s in measured.items()]
    if cache is not None and cache.enabled:
        cache.put_records(KIND, shape, target_key(target), "float32", threads, records, "tune")
    timed = [(s, p) for p, s in records if s]
    best_s, best = min(timed, key=lambda x: x[0]) if timed else (None, None)
    return TunedProblem(shape, measured[default_key], best_s, best, len(run.measured),
                        time.perf_counter() - t0, dict(run.times))


def prepared_model(path: str, input_shapes: dict | None = None):
    """The model at `path` as optimize sees it before finding regions: its inputs' symbolic dims fixed and its
    constants folded (an exporter's shape arithmetic, such as BERT's position ids sliced by Shape -> Gather ->
    Slice, becomes constants, so the matmuls' shapes are known)."""
    from onnxopt.graph.fold import fold_constants
    from onnxopt.graph.load import fix_input_shapes, load_model

    model = load_model(path).model
    if input_shapes:
        fix_input_shapes(model, input_shapes)
    try:
        fold_constants(model)
    except Exception:  # noqa: BLE001 - folding is best effort, as in optimize
        pass
    return model


def tune_model(path: str, target, threads: int | None, trials: int, cache, input_shapes=None, seed: int = 0,
               on_problem=None, retune: bool = False) -> list[TunedProblem]:
    """Tune every distinct packed-B matmul of the model at `path` (those with records already reused unless
    `retune`); `on_problem(result)` after each."""
    model = prepared_model(path, input_shapes)
    threads = int(threads or len(os.sched_getaffinity(0)))
    out = []
    for shape in matmul_problems(model, target):
        res = tune_problem(shape, target, threads, trials, cache, seed, retune=retune)
        out.append(res)
        if on_problem is not None:
            on_problem(res)
    return out
