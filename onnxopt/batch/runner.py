"""`run_batch`: plan the models, skip what an earlier run finished, run the rest (local worker threads that each
drive one child process, or Ray tasks), keep the state file current, and write report.json and report.html."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from onnxopt.errors import UsageError
from onnxopt.graph.publish import open_own

from . import worker
from .options import optimize_argv, positive_float, positive_int
from .sources import HTML_FILE, REPORT_FILE, STATE_FILE, Source, collect_sources
from .state import BatchState, file_sha256, options_key, write_atomic
from .worker import FAILURES, ModelJob


@dataclass
class BatchResult:
    records: list[dict]   # one per model, in source order
    report: dict          # what OUT_DIR/report.json holds
    exit_code: int        # 0: every model optimized, unchanged, needs-input or skipped; 1: any failed


def run_batch(sources: list[str], out_dir: str, *, jobs: int = 1, timeout: float = 1800.0,
              memory_limit_gb: float | None = None, retry_failed: bool = False, bench: bool = True,
              bench_time: float = 2.0, ray: str | None = None, quiet: bool = False, console=None,
              tune: int | None = None, **optimize_options) -> BatchResult:
    """Optimize every model of `sources` (.onnx files, folders, list files) into `out_dir`. `optimize_options`
    are those of onnxopt.batch.options.PASS_THROUGH (threads=1, tune_budget=0, no_cost_cache=True, ...). `tune`:
    run `onnxopt tune` on each model first with this many trials a matmul, into the cost cache its optimization
    reads (the matmuls an earlier model tuned are reused)."""
    from rich.console import Console

    console = console or Console(stderr=True, quiet=quiet)
    jobs = positive_int(jobs, "--jobs")
    timeout = positive_float(timeout, "--timeout")
    memory_limit_gb = None if memory_limit_gb is None else positive_float(memory_limit_gb, "--memory-limit")
    bench_time = positive_float(bench_time, "--bench-time")
    if tune is not None:
        tune = positive_int(tune, "--tune")
        if optimize_options.get("no_cost_cache"):
            raise UsageError("--tune writes its records to the cost cache the optimizations read: drop "
                             "--no-cost-cache (or give --cost-cache PATH)")
    global_shapes = list(optimize_options.pop("input_shape", None) or [])
    base_args = optimize_argv(optimize_options)
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"-o {out_dir} is a file; give a folder (it is created if missing)")
    planned = collect_sources(list(sources), out_dir)
    for s in planned:
        if s.timeout is not None:
            s.timeout = positive_float(s.timeout, f"{s.path}: --timeout")
        if s.memory_limit_gb is not None:
            s.memory_limit_gb = positive_float(s.memory_limit_gb, f"{s.path}: --memory-limit")
    ray_module, own_ray = _connect_ray(ray) if ray is not None else (None, False)
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = _lock(out_dir)
        try:
            return _run(planned, out_dir, jobs, timeout, memory_limit_gb, retry_failed, bench, bench_time, ray,
                        ray_module, console, base_args, global_shapes, optimize_options.get("threads"), tune)
        finally:
            lock.close()
    finally:
        if own_ray:
            ray_module.shutdown()


def _lock(out_dir: str):
    f = open_own(os.path.join(out_dir, ".batch.lock"), "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise UsageError(f"-o {out_dir}: another onnxopt batch is writing there; wait for it or pick another folder") \
            from None
    return f


def _connect_ray(address: str):
    """(the ray module, whether we started the connection). A cluster this process already joined is used as it
    is (and left running); else `ray.init(address)`: "auto" finds a running cluster, or give host:port.

    Ray retries an address that does not answer for many minutes, logging each try to stderr from C++: the address
    is first probed with a TCP connect (a few seconds), and Ray's own lines during init go to a file, not the
    terminal."""
    import logging

    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: install onnxopt[ray]") from None
    if ray.is_initialized():
        return ray, False
    advice = "start a cluster with `ray start --head` or give its address"
    try:
        host_port = _ray_host_port(address)
        if host_port is not None:
            try:
                socket.create_connection(host_port, timeout=RAY_PROBE_S).close()
            except OSError as e:
                why = e.strerror or str(e) or type(e).__name__
                raise UsageError(f"--ray {address}: nothing answers at {host_port[0]}:{host_port[1]} ({why}); "
                                 f"{advice}") from None
        with _stderr_to_file():
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise UsageError(f"--ray {address}: cannot connect ({(str(e).splitlines() or [''])[0][:200]}); "
                         f"{advice}") from None
    return ray, True


RAY_PROBE_S = 5.0


def _ray_host_port(address: str) -> tuple[str, int] | None:
    """The host and port Ray would connect to for `address` ("auto": the running cluster Ray finds, if any), or
    None where that cannot be told (then ray.init decides alone)."""
    if address in ("auto", "") or address is None:
        try:
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address("auto")
        except ConnectionError:
            raise  # no cluster found: ray.init would say the same
        except Exception:  # noqa: BLE001 - a Ray without that helper: let ray.init find it
            return None
        if not address:
            return None
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


class _stderr_to_file:
    """File descriptor 2 into a temporary file for the block (what C++ libraries write there included)."""

    def __enter__(self):
        import tempfile

        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.close()
        return False


def _model_args(base_args: list[str], global_shapes: list[str], source: Source) -> list[str]:
    """The optimize arguments of one model: the batch's, with its list-file input shapes over the batch's."""
    shapes = {spec.rpartition(":")[0]: spec for spec in global_shapes}
    shapes.update({spec.rpartition(":")[0]: spec for spec in source.input_shape})
    args = base_args + [w for spec in shapes.values() for w in ("--input-shape", spec)]
    # The line's --measure-shape of an input replaces the batch's of that input.
    mine = {spec.rpartition(":")[0] for spec in source.measure_shape}
    out, i = [], 0
    while i < len(args):
        if args[i] == "--measure-shape" and i + 1 < len(args) and args[i + 1].rpartition(":")[0] in mine:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out + [w for spec in source.measure_shape for w in ("--measure-shape", spec)] \
        + [w for spec in source.check_input for w in ("--check-input", spec)]


# The optimize options `onnxopt tune` takes too (the same matmuls, threads, target and records), with their values.
TUNE_SHARES = ("--threads", "--target", "--cost-cache", "--input-shape")


def _tune_args(args: list[str], trials: int | None) -> list[str]:
    """`onnxopt tune`'s arguments after the model for a model optimized with `args`; [] without --tune."""
    if trials is None:
        return []
    out = ["--trials", str(trials), "--json"]
    for i, w in enumerate(args[:-1]):
        if w in TUNE_SHARES:
            out += [w, args[i + 1]]
    return out


def _run(planned, out_dir, jobs, timeout, memory_limit_gb, retry_failed, bench, bench_time, ray, ray_module,
         console, base_args, global_shapes, threads, tune) -> BatchResult:
    from .report import machine_info, summary_table, totals
    from .report_html import render_html

    state = BatchState(os.path.join(out_dir, STATE_FILE))
    if state.warning:  # even under --quiet: the earlier runs' records are set aside
        print(f"onnxopt: warning: {state.warning}", file=sys.stderr)
    records: list[dict | None] = [None] * len(planned)
    todo: list[tuple[int, ModelJob, str, str]] = []  # (index, job, sha256, options key)
    env = {}
    if jobs > 1 and "ONNXOPT_BUILD_WORKERS" not in os.environ:  # N optimizers each forking a builder per core
        env["ONNXOPT_BUILD_WORKERS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    for i, s in enumerate(planned):
        args = _model_args(base_args, global_shapes, s)
        tune_args = _tune_args(args, tune)
        sha, key = file_sha256(s.path), options_key(args + (["--tune"] + tune_args if tune_args else []))
        name = s.rel + ".onnx"
        prev = state.previous(s.path, sha, key)
        if state.is_finished(prev):
            records[i] = dict(prev, model=name, status="skipped", previous_status=prev["status"])
        elif prev and prev.get("status") in FAILURES and not retry_failed:
            records[i] = dict(prev, model=name, reason=f"{prev.get('reason', '')} (an earlier run's; "
                              "--retry-failed runs it again)", rerun=False)
        else:
            todo.append((i, ModelJob(s.path, s.output(out_dir), s.output(out_dir, ""), args,
                                     s.timeout or timeout, s.memory_limit_gb or memory_limit_gb,
                                     bench, bench_time, threads, env, remove_previous=s.path in state.models,
                                     tune_args=tune_args),
                          sha, key))

    def finished(i: int, sha: str, key: str, record: dict) -> None:
        record.update(model=planned[i].rel + ".onnx", sha256=sha, finished_at=time.strftime("%Y-%m-%d %H:%M:%S"))
        records[i] = record
        state.put(planned[i].path, sha, key, record)

    _execute(todo, jobs, ray_module, finished, console)
    done = [r for r in records if r is not None]
    exit_code = 1 if any(r["status"] in FAILURES for r in done) else 0
    machine = machine_info()
    report = {"onnxopt_version": machine["onnxopt"], "out_dir": out_dir,
              "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine,
              "options": {"jobs": jobs, "timeout_s": timeout, "memory_limit_gb": memory_limit_gb,
                          "bench": bench, "bench_time_s": bench_time, "ray": ray, "optimize_args": base_args,
                          "input_shape": global_shapes},
              "bench_note": _bench_note(jobs, ray, bench), "models": done, "totals": totals(done),
              "exit_code": exit_code}
    write_atomic(os.path.join(out_dir, REPORT_FILE), report)
    write_atomic(os.path.join(out_dir, HTML_FILE), render_html(report, out_dir))
    console.print(summary_table(done, f"onnxopt batch: {len(done)} models into {out_dir}"))
    console.print(f"report: {os.path.join(out_dir, HTML_FILE)}", soft_wrap=True, highlight=False)
    return BatchResult(done, report, exit_code)


def _bench_note(jobs: int, ray, bench: bool) -> str | None:
    if not bench:
        return None
    if ray is not None:
        return "Speedups were measured in Ray tasks, beside whatever else ran on each node."
    if jobs > 1:
        return (f"Speedups were measured while up to {jobs} models were optimized at once on "
                f"{os.cpu_count()} CPUs; rerun with --jobs 1 for timings to trust.")
    return None


def _execute(todo, jobs: int, ray_module, finished, console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not todo:
        return
    if jobs > 1 and ray_module is None:
        _measure_machine_once()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        bar = progress.add_task("optimizing", total=len(todo))

        def done(i, sha, key, record):
            finished(i, sha, key, record)
            progress.update(bar, advance=1, description=f"{record['model']}: {record['status']}")

        if ray_module is not None:
            _execute_ray(todo, ray_module, done)
        else:
            _execute_local(todo, jobs, done)


def _measure_machine_once() -> None:
    """Each optimizer reads the machine model (peaks, bandwidths) from its cache, and measures it when there is none:
    measured by several optimizers at once, on shared cores, it would be wrong and then cached. One child measures
    it first (when cached already, it just reads it)."""
    try:
        subprocess.run([sys.executable, "-m", "onnxopt", "machine", "--quick", "--json"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    except (OSError, subprocess.SubprocessError):
        pass  # the workers measure it themselves


def _execute_local(todo, jobs: int, done) -> None:
    worker.reset_stop()
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="onnxopt-batch")
    futures = {pool.submit(worker.run_model_job, job): (i, sha, key) for i, job, sha, key in todo}
    try:
        pending = set(futures)
        while pending:
            ready, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for f in ready:
                i, sha, key = futures[f]
                try:
                    record = f.result()
                except Exception as e:  # noqa: BLE001 - a bug of ours or a full disk: that model's record says so
                    record = {"status": "crashed", "reason": f"batch worker: {type(e).__name__}: {e}"}
                done(i, sha, key, record)
    except BaseException:  # Ctrl-C, SIGTERM: no model keeps running on its own, and none starts
        pool.shutdown(wait=False, cancel_futures=True)
        worker.stop_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _execute_ray(todo, ray, done) -> None:
    """Each model a Ray task running the same run_model_job; the driver takes the records as they come."""
    refs = {}
    task = ray.remote(worker.run_model_job)
    # A task asking for more CPUs than the cluster has would wait forever.
    most = max(1, int(ray.cluster_resources().get("CPU", 1)))
    try:
        for i, job, sha, key in todo:
            refs[task.options(num_cpus=min(job.threads or 1, most), max_retries=0).remote(job)] = (i, sha, key)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    record = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - the task's worker died, or the node went away
                    record = {"status": "crashed", "reason": f"Ray task: {type(e).__name__}: "
                                                             f"{(str(e).splitlines() or [''])[0][:300]}"}
                done(*refs[ref], record)
    except BaseException:
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished already, or the cluster is gone
                pass
        raise
