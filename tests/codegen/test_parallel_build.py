"""Kernels built in forked workers (codegen/parallel.py): the same object code as a build in this process, in the
order asked, and a kernel that fails to build fails alone, with its own message."""

from __future__ import annotations

import pytest

from onnxopt.codegen.compile import compile_object
from onnxopt.codegen.parallel import BuildError, build_many, build_workers
from onnxopt.codegen.target import parse_target

TARGET = parse_target("x86-64")


def scale_ir(k: int) -> str:
    """A function that multiplies a float array by k: small, and different for each k."""
    return f"""
target triple = "{TARGET.triple}"
define void @scale{k}(float* %p, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%j, %loop]
  %q = getelementptr float, float* %p, i64 %i
  %v = load float, float* %q
  %w = fmul float %v, {float(k):.1f}
  store float %w, float* %q
  %j = add i64 %i, 1
  %c = icmp slt i64 %j, %n
  br i1 %c, label %loop, label %done
done:
  ret void
}}
"""


def job(k):
    return lambda: (compile_object(scale_ir(k), TARGET), f"scale{k}")


def broken():
    raise ValueError("no kernel for this op")


def test_workers_give_the_serial_objects_in_order():
    jobs = [job(k) for k in range(1, 6)]
    serial = build_many(jobs, workers=1)
    forked = build_many(jobs, workers=2)
    assert [d for _, d in forked] == [f"scale{k}" for k in range(1, 6)]
    assert forked == serial
    assert all(b"scale" in obj for obj, _ in forked)  # the symbol is in the object


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_kernel_fails_alone(workers):
    out = build_many([job(1), broken, job(2)], workers=workers)
    assert out[0][1] == "scale1" and out[2][1] == "scale2"
    assert isinstance(out[1], BuildError) and "ValueError: no kernel for this op" in str(out[1])


def test_worker_count_from_the_environment(monkeypatch):
    monkeypatch.setenv("ONNXOPT_BUILD_WORKERS", "3")
    assert build_workers() == 3
    monkeypatch.setenv("ONNXOPT_BUILD_WORKERS", "many")
    with pytest.raises(ValueError, match="whole number"):
        build_workers()


# ---- workers die with their parent ----

PR_GET_PDEATHSIG = 2


def _death_signal_then_exit():
    """In a forked child: run the pool's initializer as a worker does, then exit with the death signal it set."""
    import ctypes
    import os

    from onnxopt.codegen.parallel import _worker_start

    _worker_start(os.getppid())
    sig = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    os._exit(sig.value)


def test_the_initializer_sets_sigkill_as_death_signal_and_rechecks_the_parent():
    import multiprocessing
    import signal

    from onnxopt.codegen.parallel import _worker_start

    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_death_signal_then_exit)
    p.start()
    p.join(30)
    assert p.exitcode == signal.SIGKILL  # PR_GET_PDEATHSIG read back in the worker
    # a worker told of a parent it does not have (its parent died and it was adopted before the signal was set)
    p = ctx.Process(target=_worker_start, args=(1,))
    p.start()
    p.join(30)
    assert p.exitcode == 1


def test_off_the_main_thread_jobs_run_in_this_process_in_order():
    import os
    import threading

    jobs = [lambda k=k: (os.getpid(), f"job{k}") for k in range(3)]
    assert {pid for pid, _ in build_many(jobs, workers=2)} != {os.getpid()}  # the main thread forks workers
    out = []
    t = threading.Thread(target=lambda: out.extend(build_many(jobs + [broken], workers=2)))
    t.start()
    t.join(60)
    assert [d for _, d in out[:3]] == ["job0", "job1", "job2"] and {pid for pid, _ in out[:3]} == {os.getpid()}
    assert isinstance(out[3], BuildError) and "no kernel for this op" in str(out[3])


# A parent that builds two jobs: one returns 64 MB (its worker blocks writing it into the result pipe once the parent
# stops reading), one sleeps. Each worker leaves a file named by its pid.
_PARENT = r"""
import os, sys, time
from onnxopt.codegen.parallel import build_many
d = sys.argv[1]

def mark(name):
    open(os.path.join(d, f"{name}.{os.getpid()}"), "w").close()

def big():
    mark("big")
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < deadline:
        time.sleep(0.01)
    return b"x" * (64 << 20), "big"

def sleepy():
    mark("sleepy")
    time.sleep(600)
    return b"", "sleepy"

build_many([big, sleepy], workers=2)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie has ended
    except FileNotFoundError:
        return True


def test_workers_die_when_the_parent_is_killed_even_blocked_in_a_pipe_write(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path)], start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
            workers = {n.split(".")[0]: int(n.split(".")[1]) for n in os.listdir(tmp_path) if "." in n}
            time.sleep(0.05)
        assert len(workers) == 2, parent.stderr.read().decode() if parent.poll() is not None else "no workers"
        os.kill(parent.pid, signal.SIGSTOP)  # it reads no more results
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 10  # until the big result fills the pipe
        while time.monotonic() < deadline:
            with open(f"/proc/{workers['big']}/wchan") as f:
                if "pipe" in f.read():
                    break
            time.sleep(0.05)
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + 15
        while not all(map(_gone, workers.values())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(map(_gone, workers.values())), {n: p for n, p in workers.items() if not _gone(p)}
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)  # the workers kept the parent's group: nothing outlives the test
        except ProcessLookupError:
            pass
        parent.wait(30)
        parent.stderr.close()


def test_a_stopped_pool_is_left_out_of_the_interpreters_exit_hook():
    """The exit hook (concurrent.futures.process._python_exit) wakes each pool's manager thread through a pipe that
    thread closes without a lock; a stopped pool is taken off its list, so an interrupted run cannot print an EBADF
    traceback at exit (tests/cli's SIGTERM test caught one), and its manager thread is gone."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import process as futures_process

    from onnxopt.codegen.parallel import _stop

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    assert pool.submit(abs, -3).result() == 3
    manager = pool._executor_manager_thread
    assert manager in futures_process._threads_wakeups
    _stop(pool)
    assert manager not in futures_process._threads_wakeups
    assert not manager.is_alive()
