"""Build many kernels at once, one per CPU core.

Code generation costs about a second per compiled module (half in llvmlite's IR printing, which holds the GIL, half
in LLVM's passes and instruction selection): compute kernels share their tile sets (codegen/compute/tile_sets.py),
so a model compiles a few dozen sets, pools and elementwise kernels. They are independent, so they are built in
forked worker processes: a fork inherits the regions, the target and the sets compiled so far without pickling
them, and only the object code and the glue's description come back.

Forking is safe here because a worker only runs Python and llvmlite, never the onnxruntime sessions or the SQLite
connection the parent may hold. Where fork is unavailable (not Linux or macOS) everything is built in this process,
in order.

A worker dies with its parent (PR_SET_PDEATHSIG, SIGKILL): an optimizer killed by a CI timeout or the OOM killer
would otherwise leave its workers blocked forever writing results into a pipe their siblings keep open, holding the
parent's open files (the cost cache). Linux sends that signal when the thread that forked the worker ends, so pools
are made only by the main thread; called from another thread, build_many builds in that thread, in order.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures import process as futures_process
from concurrent.futures.process import BrokenProcessPool
from collections.abc import Callable

from onnxopt.errors import ToolchainError

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


class WorkerError(ToolchainError):
    """A build worker died or hung: the whole run ends (exit 2) with this message."""


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


def build_timeout() -> float:
    """Seconds one kernel may take to build (ONNXOPT_BUILD_TIMEOUT, default 600): a build that runs longer is taken
    for a hung compiler, and the run ends with an error instead of waiting forever."""
    env = os.environ.get("ONNXOPT_BUILD_TIMEOUT")
    if env:
        try:
            value = float(env)
        except ValueError:
            value = float("nan")
        if not value > 0 or value == float("inf"):
            raise ValueError(f"ONNXOPT_BUILD_TIMEOUT={env!r}: give a positive number of seconds")
        return value
    return 600.0


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when its parent (the thread that forked it) ends; False where it cannot."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: no prctl
        return False


def _worker_start(parent: int) -> None:
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was set: nothing would ever send it
        os._exit(1)
    # The parent's signal handlers (the CLI's cleanup on SIGTERM) are not the worker's: it just dies.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_many(jobs: list[Callable[[], tuple]], workers: int | None = None) -> list[tuple | BuildError]:
    """Run each job (a no-argument callable returning (object code, description, ...)) and return, in order,
    (object code, description) or the BuildError it raised.

    Jobs run in forked worker processes even on one core (called from the main thread): LLVM reports some errors
    by exiting the process or leaves it hung, and a worker's death or a build past `build_timeout()` then ends the
    run with a WorkerError instead of killing or hanging this process."""
    workers = max(1, min(build_workers() if workers is None else workers, len(jobs)))
    if not jobs:
        return []
    # Off the main thread, build here: a forked worker's death signal would follow that thread, not the process.
    if "fork" not in multiprocessing.get_all_start_methods() or threading.current_thread() is not \
            threading.main_thread():
        out = []
        for job in jobs:
            try:
                out.append(tuple(job()[:2]))
            except Exception as e:  # noqa: BLE001
                out.append(BuildError(f"{type(e).__name__}: {e}"))
        return out
    global _JOBS
    _JOBS = list(jobs)
    timeout = build_timeout()
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_worker_start,
                               initargs=(os.getpid(),))
    try:
        # Largest-first scheduling is unknown here; one job a task keeps both cores busy to the end.
        futures = [pool.submit(_run, i) for i in range(len(jobs))]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:
                raise WorkerError(f"a kernel took more than {timeout:.0f} s to build, so the compiler is taken to "
                                  "hang; nothing was written. Try another --target or --skip-fusion, or raise "
                                  "ONNXOPT_BUILD_TIMEOUT")
        results = [f.result() for f in futures]
    except BrokenProcessPool:
        raise WorkerError("a kernel build worker died (LLVM stops the process on some errors, such as a CPU or "
                          "feature it does not know); nothing was written. Check --target, or try --skip-fusion "
                          "with the kind being built") from None
    finally:
        _JOBS = []
        _stop(pool)
    return [tuple(v) if status == "ok" else BuildError(v) for status, v in results]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Shut the pool down without waiting for a hung worker: kill what is still running."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() forgets it
    # The interpreter's exit hook (concurrent.futures.process._python_exit) wakes every pool's manager thread
    # through a pipe that thread closes as it ends, with no lock between the two (Python 3.11): a run interrupted
    # while stopping its pool (SIGTERM during the joins below) printed an EBADF traceback at exit. This pool is
    # stopped here, so the hook is told to leave it alone.
    wakeups = getattr(futures_process, "_threads_wakeups", None)
    if manager is not None and wakeups is not None:
        wakeups.pop(manager, None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)
    # The pool's manager thread may reap a killed worker itself, racing the join above (whose waitpid then sees
    # ECHILD and leaves the process listed as a child): wait for that thread, so no worker outlives this call.
    if manager is not None:
        manager.join(timeout=5)
