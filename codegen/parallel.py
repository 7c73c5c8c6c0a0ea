"""Build many kernels at once, one per CPU core.

Code generation costs about a second per compiled module (half in llvmlite's IR printing, which holds the GIL, half
in LLVM's passes and instruction selection): compute kernels share their tile sets (codegen/compute/tile_sets.py),
so a model compiles a few dozen sets, pools and elementwise kernels. They are independent, so they are built in
forked worker processes: a fork inherits the regions, the target and the sets compiled so far without pickling
them, and only the object code and the glue's description come back.

Forking is safe here because a worker only runs Python and llvmlite, never the onnxruntime sessions or the SQLite
connection the parent may hold. Where fork is unavailable (not Linux or macOS), with one core, or for one kernel,
everything is built in this process, in order.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Callable

# The jobs of the batch being built, read by the forked workers (set before the pool forks them).
_JOBS: list[Callable[[], tuple]] = []


def _run(i: int) -> tuple[str, object]:
    try:
        obj, desc = _JOBS[i]()[:2]
        return "ok", (obj, desc)
    except Exception as e:  # noqa: BLE001 - returned to the parent, which reports it for that kernel only
        return "error", f"{type(e).__name__}: {e}" + ("" if str(e) else traceback.format_exc(limit=3))


class BuildError(Exception):
    """A kernel that failed to build in a worker: the message is the worker's exception."""


def build_workers() -> int:
    """How many processes build kernels: ONNXOPT_BUILD_WORKERS, else the cores this process may use."""
    env = os.environ.get("ONNXOPT_BUILD_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"ONNXOPT_BUILD_WORKERS={env!r}: give a whole number of processes") from None
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def build_many(jobs: list[Callable[[], tuple]], workers: int | None = None) -> list[tuple | BuildError]:
    """Run each job (a no-argument callable returning (object code, description, ...)) and return, in order,
    (object code, description) or the BuildError it raised."""
    workers = min(build_workers() if workers is None else workers, len(jobs))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for job in jobs:
            try:
                out.append(tuple(job()[:2]))
            except Exception as e:  # noqa: BLE001
                out.append(BuildError(f"{type(e).__name__}: {e}"))
        return out
    global _JOBS
    _JOBS = list(jobs)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            # Largest-first scheduling is unknown here; chunks of one keep both cores busy to the end.
            results = list(pool.map(_run, range(len(jobs)), chunksize=1))
    finally:
        _JOBS = []
    return [tuple(v) if status == "ok" else BuildError(v) for status, v in results]
