"""One model of a batch: `python -m onnxopt MODEL -o OUT ...` in a child process under a wall-time and an
address-space limit, then `onnxopt bench ORIG OUT --json` in another, and one record of what happened.

Children run in their own process group (start_new_session), so a timeout kills the optimizer together with the
kernel-build workers it forked. The memory limit is RLIMIT_AS, set by the child's interpreter on itself before it
imports onnxopt (no preexec_fn: the batch driver is threaded, and a Ray worker is too); it also dies with its
parent. A Ray task calls the same `run_model_job`, so both ways of running write the same files and return the same
record.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from onnxopt.graph.bindings import NEEDS_INPUT
from onnxopt.graph.publish import open_own

from .sources import LIST_LINE_EXAMPLE, OUTPUT_SUFFIXES

# The child's first lines, then onnxopt exactly as `python -m onnxopt` runs it: its address-space limit (0: none),
# and death with its parent (PR_SET_PDEATHSIG), so that a driver or Ray worker that is killed leaves no optimizer
# running on without its timeout.
_CHILD_MAIN = """
import os, resource, runpy, signal, sys
limit, parent = int(sys.argv.pop(1)), int(sys.argv.pop(1))
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != parent:
    sys.exit("onnxopt batch: the driver is gone")
sys.argv[0] = "onnxopt"
runpy.run_module("onnxopt", run_name="__main__", alter_sys=True)
"""

# What a child that ran out of memory leaves in its output: Python's MemoryError, C++'s std::bad_alloc, an mmap
# or fork refused by the limit (ENOMEM), a shared library that could not be mapped, LLVM's and onnxruntime's words.
_OUT_OF_MEMORY = re.compile(r"MemoryError|bad_alloc|out of memory|Cannot allocate memory|failed to map segment|"
                            r"Failed to allocate|ENOMEM|Resource temporarily unavailable.*thread", re.IGNORECASE)

# Under an address-space limit a process also dies of memory where it cannot say so: glibc cannot map libgcc_s to
# unwind a cancelled thread ("libgcc_s.so.1 must be installed for pthread_cancel to work", then SIGABRT), C++
# cannot start a thread (std::system_error), the loader cannot map a library. Read as out-of-memory only under a limit.
_UNDER_LIMIT = re.compile(r"libgcc_s|pthread_cancel|std::system_error|error while loading shared libraries",
                          re.IGNORECASE)

# "slower": written, correct, but `onnxopt bench` measured it slower than the original (a speedup below 1).
FINISHED = ("optimized", "unchanged", "slower")  # a rerun skips these
FAILURES = ("failed", "crashed", "timeout", "out-of-memory")
# A model that runs at none of the shapes the optimizer tries (graph/bindings.py): nothing was written, nothing
# failed; it needs input shapes or data, given on its line of a list file. Neither finished (a rerun runs it again:
# it is refused in seconds) nor a failure (the batch's exit code stays 0).
NEEDS_INPUT_STATUS = "needs-input"

# Children alive now, so that an interrupted batch can kill them (all threads of the driver share it), and whether
# it was interrupted: a worker thread then starts no new child.
_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


@dataclass
class ModelJob:
    source: str                    # absolute path of the model
    output: str                    # OUT_DIR/<rel>.onnx
    stem_path: str                 # OUT_DIR/<rel>: the other files are this plus a suffix
    optimize_args: list[str] = field(default_factory=list)
    timeout: float = 1800.0
    memory_limit_gb: float | None = None
    bench: bool = True
    bench_time: float = 2.0
    threads: int | None = None
    env: dict = field(default_factory=dict)   # added to the child's environment
    remove_previous: bool = False  # the state file says an earlier run wrote this model's files: delete them first
    tune_args: list[str] = field(default_factory=list)  # `onnxopt tune MODEL ...`'s, run first; [] for none


@dataclass
class ChildResult:
    returncode: int | None         # None: killed at the timeout
    wall_s: float
    output: str                    # its stdout and stderr, as written to the log
    stdout: str = ""


def run_child(argv: list[str], timeout: float, memory_limit_gb: float | None, log_path: str,
              env: dict | None = None, stdout_path: str | None = None) -> ChildResult:
    """Run `python -m onnxopt ARGV` with the limits; stderr (and stdout unless `stdout_path`) appended to
    `log_path`. Files, not pipes: a grandchild that outlives its parent cannot keep us waiting on a pipe."""
    limit = int(memory_limit_gb * 2**30) if memory_limit_gb else 0
    cmd = [sys.executable, "-c", _CHILD_MAIN, str(limit), str(os.getpid()), *argv]
    start = time.perf_counter()
    with open_own(log_path, "a") as log:
        log.write(f"$ python -m onnxopt {shlex.join(argv)}\n")
        log.flush()
        offset = log.tell()
        out = open_own(stdout_path, "w") if stdout_path else log
        try:
            with _live_lock:
                if _stopping.is_set():
                    return ChildResult(-int(signal.SIGINT), 0.0, "interrupted: the batch is stopping")
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=log,
                                        start_new_session=True, env={**os.environ, **(env or {})})
                _live.add(proc)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                rc = None
            finally:
                with _live_lock:
                    _live.discard(proc)
                kill_group(proc)  # what it left running in its group (a build worker) goes with it
        finally:
            if stdout_path:
                out.close()
    with open(log_path, errors="replace") as f:
        f.seek(offset)
        text = f.read()
    stdout = ""
    if stdout_path:
        with open(stdout_path, errors="replace") as f:
            stdout = f.read()
    return ChildResult(rc, time.perf_counter() - start, text, stdout)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def stop_all() -> None:
    """An interrupted batch (Ctrl-C, SIGTERM) takes every running model with it, and starts no other."""
    with _live_lock:
        _stopping.set()
        procs = list(_live)
    for p in procs:
        kill_group(p)


def reset_stop() -> None:
    _stopping.clear()


def classify(child: ChildResult, timeout: float, memory_limit_gb: float | None = None) -> tuple[str, str]:
    """(status, reason) of a child that did not exit 0."""
    if child.returncode is None:
        return "timeout", f"killed after the {timeout:g} s limit"
    if _OUT_OF_MEMORY.search(child.output) or (memory_limit_gb and _UNDER_LIMIT.search(child.output)):
        limit = f"over the {memory_limit_gb:g} GB memory limit: " if memory_limit_gb else ""
        return "out-of-memory", limit + (last_error_line(child.output) or "out of memory")
    if child.returncode < 0:
        sig = -child.returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        if sig == signal.SIGKILL:  # not ours (ours is the timeout): the kernel's out-of-memory killer
            return "out-of-memory", "killed by SIGKILL (the kernel's out-of-memory killer?)"
        line = last_error_line(child.output)
        return "crashed", f"killed by {name}" + (f": {line}" if line else "")
    if child.returncode == 2 and NEEDS_INPUT in last_error_line(child.output):
        return NEEDS_INPUT_STATUS, last_error_line(child.output)
    if child.returncode in (1, 2):
        return "failed", last_error_line(child.output) or f"exit code {child.returncode}"
    return "crashed", f"exit code {child.returncode}" + (f": {last_error_line(child.output)}"
                                                         if last_error_line(child.output) else "")


def list_line_advice(source: str, reason: str) -> str:
    """How to give this model its shapes or data in a batch: a line of a list file (`onnxopt batch @list.txt`),
    with the flags the optimizer named for it ("Give them with `...`"), else the general form."""
    m = re.search(r"Give them with `([^`]*)`", reason)
    flags = m.group(1) if m else LIST_LINE_EXAMPLE.split(" ", 1)[1]
    return (f"in a batch, give them on the model's line of a list file (onnxopt batch @list.txt): "
            f"`{shlex.quote(os.path.basename(source))} {flags}` (paths relative to the list file"
            + ("; D: a size)" if re.search(r"[:,]D(,|$| )", flags) else ")"))


def last_error_line(text: str) -> str:
    """The one-line error onnxopt prints (`onnxopt: error: ...`), else the last line that is not blank."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    for ln in reversed(lines):
        for prefix in ("onnxopt: error: ", "onnxopt: "):
            if ln.startswith(prefix):  # whole enough to keep a needs-input error's advice (about 900 characters)
                return ln[len(prefix):][:2000]
    return lines[-1][:2000] if lines else ""


def read_report(path: str) -> dict | None:
    try:
        with open(path) as f:
            report = json.load(f)
        return report if isinstance(report, dict) else None
    except (OSError, ValueError):
        return None


def _remove_stale(job: ModelJob) -> None:
    """Outputs of an earlier run of this model: a failure now must not leave them looking current. (Only files the
    state file says were ours: a file of the user's that happens to lie there is not deleted for a failure.)"""
    for suffix in OUTPUT_SUFFIXES:
        path = job.stem_path + suffix
        if os.path.isfile(path):
            os.remove(path)


def run_model_job(job: ModelJob) -> dict:
    """Optimize one model (and benchmark it); returns its record. Never raises for the model's own failure."""
    if _stopping.is_set():
        return {"source": job.source, "status": "crashed", "reason": "not run: the batch was interrupted"}
    os.makedirs(os.path.dirname(job.output), exist_ok=True)
    if job.remove_previous:
        _remove_stale(job)
    log = job.stem_path + ".log"
    report_path = job.stem_path + ".report.json"
    tuned = run_tune(job, log) if job.tune_args else None
    argv = [job.source, "-o", job.output, "--report", report_path, "-q", *job.optimize_args]
    child = run_child(argv, job.timeout, job.memory_limit_gb, log, job.env)
    record = {"source": job.source, "output": None, "report": None, "log": log, "exit_code": child.returncode,
              "wall_s": round(child.wall_s, 3), "reason": ""}
    if tuned is not None:
        record["tune"] = tuned
    if child.returncode != 0:
        status, reason = classify(child, job.timeout, job.memory_limit_gb)
        # onnxopt's messages start with the model's path, which the record names already
        record["status"], record["reason"] = status, reason.removeprefix(job.source + ": ")
        if status == NEEDS_INPUT_STATUS:
            record["reason"] += "; " + list_line_advice(job.source, record["reason"])
        return record
    report = read_report(report_path)
    if report is None or not os.path.isfile(job.output):
        record["status"], record["reason"] = "crashed", "exit code 0 but no report or no model written"
        return record
    record.update(report_fields(report), output=job.output, report=report_path)
    unchanged = report.get("unchanged")
    if isinstance(unchanged, str) and unchanged:
        record["status"], record["reason"] = "unchanged", unchanged
    else:
        record["status"] = "optimized"
        if job.bench:
            record["bench"] = run_bench(job)
        record["status"], record["reason"] = optimized_status(record.get("bench"), "--no-measure" in job.optimize_args)
    return record


def run_tune(job: ModelJob, log: str) -> dict:
    """`onnxopt tune MODEL` under the model's limits, before its optimization: what it tuned, or why it did not (a
    failed tuning leaves the optimization to its default schedules; the model is not failed for it)."""
    out_path = job.stem_path + ".tune.json"
    child = run_child(["tune", job.source, *job.tune_args], job.timeout, job.memory_limit_gb, log, job.env,
                      stdout_path=out_path)
    if child.returncode != 0:
        status, reason = classify(child, job.timeout, job.memory_limit_gb)
        return {"status": status, "reason": reason.removeprefix(job.source + ": "), "wall_s": round(child.wall_s, 3)}
    try:
        problems = json.loads(child.stdout)["problems"]
    except (ValueError, KeyError, TypeError):
        return {"status": "crashed", "reason": "onnxopt tune wrote no JSON", "wall_s": round(child.wall_s, 3)}
    return {"status": "tuned", "wall_s": round(child.wall_s, 3), "file": out_path,
            "searched": sum(1 for p in problems if p.get("trials")),
            "reused": sum(1 for p in problems if p.get("reused")),
            "skipped": sum(1 for p in problems if p.get("skipped")),
            "gains": [round(p["gain"], 3) for p in problems if p.get("gain")]}


def optimized_status(bench: dict | None, no_measure: bool) -> tuple[str, str]:
    """(status, reason) of a model written with kernels: "optimized" only when no measurement says it is slower."""
    speedup = bench.get("speedup") if isinstance(bench, dict) else None
    untimed = " (--no-measure: its kernels were kept untimed)" if no_measure else ""
    if isinstance(speedup, (int, float)) and speedup < 1.0:
        return "slower", f"onnxopt bench measured {speedup:.2f}x of the original's speed{untimed}"
    if no_measure and not isinstance(speedup, (int, float)):
        return "optimized", "not timed (--no-measure, and no benchmark): its speedup is unknown"
    return "optimized", ""


def report_fields(report: dict) -> dict:
    """What the batch keeps of a model's optimize report."""
    ver = report.get("verification") or {}
    fallback = report.get("fallback_verification")
    before, after = report.get("before") or {}, report.get("after") or {}
    return {
        "verified_library": ver.get("ok") if "ok" in ver else None,   # None: not verified (--no-verify)
        "verified_fallback": fallback.get("ok") if isinstance(fallback, dict) and "ok" in fallback else "unknown",
        "timings": report.get("timings") or {},
        "offline": report.get("offline") or {},
        "ops_before": before, "ops_after": after,
        "nodes_before": sum(before.values()), "nodes_after": sum(after.values()),
        "fused_regions": report.get("fused_regions"),
    }


def check_bindings(job: ModelJob) -> dict:
    """The symbolic dims' values the model was checked at (its report's check_bindings), or {}."""
    try:
        with open(job.stem_path + ".report.json") as f:
            return {str(k): int(v) for k, v in (json.load(f).get("check_bindings") or {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def run_bench(job: ModelJob) -> dict:
    """`onnxopt bench ORIG OUT --json`: the speedup (the ratio of the two sides' medians) and the band the two sides'
    spreads allow: original p10 / optimized p90 to original p90 / optimized p10. (bench gives percentiles per side,
    not per pair of runs; the ratios of the p10s and of the p90s need not bracket the median ratio, this band does.)"""
    argv = ["bench", job.source, job.output, "--json", "--min-time", repr(job.bench_time)]
    if job.threads:
        argv += ["--threads", str(job.threads)]
    # Timed at the dims the optimizer checked and timed at (a PP-OCR classifier at 224 x 224, not 1 x 1).
    argv += [f"--dim={k}={v}" for k, v in check_bindings(job).items()]
    # Model loading and warm-up come on top of the timed seconds; the batch's timeout bounds it all the same.
    child = run_child(argv, job.timeout, job.memory_limit_gb, job.stem_path + ".log", job.env,
                      stdout_path=job.stem_path + ".bench.json")
    if child.returncode != 0:
        status, reason = classify(child, job.timeout, job.memory_limit_gb)
        return {"error": f"{status}: {reason}"}
    try:
        r = json.loads(child.stdout)
        a, b = r["a"], r["b"]
        return {"speedup": r["speedup"], "speedup_low": a["p10"] / b["p90"], "speedup_high": a["p90"] / b["p10"],
                "original": {k: a[k] for k in ("median", "p10", "p90")},
                "optimized": {k: b[k] for k in ("median", "p10", "p90")},
                "library": b.get("library"), "threads": r.get("threads"), "outputs_match": r.get("outputs_match"),
                "min_time_s": job.bench_time}
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        return {"error": f"unreadable bench output ({type(e).__name__}: {e})"}
