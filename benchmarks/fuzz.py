"""Fuzz onnxopt with mutated small models, each run in a subprocess (issue 31, item 8).

    python benchmarks/fuzz.py [--cases 1000] [--jobs 2] [--timeout 60] [--seed 0] [--out fuzz-failures]
    python benchmarks/fuzz.py --only 17,242      # re-run these case numbers (the same models: cases are seeded)

Each case draws a seed model and a mutation (tests/fuzz/mutations.py: truncated or flipped bytes, dropped or
mistyped initializers, renamed inputs, cycles, wrong attributes, odd dims, unknown ops and domains, bad opsets and IR
versions, missing or duplicate outputs, empty graphs, broken external data, and valid-but-unusual rewrites that reach
fusion and code generation), writes it to a fresh folder and runs

    python -m onnxopt model.onnx -o out.onnx --threads 1 --tune-budget 0 --no-cost-cache --no-measure -q

with TMPDIR pointed at a folder of its own, killed after --timeout seconds. A run fails when it exits 3, dies of a
signal (a crash), hangs, prints a traceback or more than one error line, leaves output files after a non-zero exit or
temporaries anywhere, changes its input, or exits 0 with a model that does not load or does not give the input's
answers without and with its kernel library (checked in another subprocess, so a crashing library is caught too).

Prints a summary table (outcomes by exit code and by mutation kind, the failures by category, seconds) and writes
every failing case's model, notes and command to --out/case-NNNN-<category>-<seed>-<kind>/.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))

import mutations as M  # noqa: E402

COMPARE_TIMEOUT_S = 120


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the run's own session (start_new_session): it and its children
    except ProcessLookupError:
        pass


def run_subprocess(cmd: list[str], env: dict, timeout: float, cwd: str) -> tuple[int | None, str, str, float]:
    """(exit code or None on a timeout, stdout, stderr, seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        rc = None
    return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.perf_counter() - t0


def run_case(n: int, args, env: dict, work: str) -> M.Verdict:
    case = M.case_from_number(n, args.seed)
    root = tempfile.mkdtemp(prefix=f"case-{n:05d}-", dir=work)
    folder, path, tmpdir, before = M.prepare(case, root)
    out = os.path.join(folder, M.OUT)
    cmd = [sys.executable, "-m", "onnxopt", *M.cli_args(path, out)]
    rc, _, err, seconds = run_subprocess(cmd, dict(env, TMPDIR=tmpdir), args.timeout, folder)
    verdict = M.check_run(case, folder, tmpdir, before, M.RunResult(rc, err, seconds), numeric=False)
    if rc == 0 and os.path.exists(out):
        # The answers, in a process of its own: a library that crashes onnxruntime must not take the fuzzer down.
        crc, cout, cerr, _ = run_subprocess([sys.executable, os.path.abspath(__file__), "--compare", path, out],
                                            dict(env, TMPDIR=tmpdir), COMPARE_TIMEOUT_S, folder)
        if crc is None:
            verdict.problems.append(f"[hang] checking the output model took more than {COMPARE_TIMEOUT_S} s")
        elif crc < 0:
            verdict.problems.append(f"[crash] loading or running the output model killed the process "
                                    f"(signal {-crc}): {cerr.strip()[-500:]}")
        elif crc != 0:
            verdict.problems.append(f"[bad-output] the output check failed: {cerr.strip()[-1000:]}")
        else:
            verdict.problems += json.loads(cout.strip().splitlines()[-1])
        if verdict.problems and verdict.category == "ok":
            verdict.category = verdict.problems[0][1:verdict.problems[0].index("]")]
    if verdict.failed:
        keep = os.path.join(args.out, f"case-{n:05d}-{verdict.category}-{case.seed}-{case.kind}")
        shutil.rmtree(keep, ignore_errors=True)
        M.write_failure(case, verdict, keep, f"cd {keep} && python -m onnxopt {' '.join(M.cli_args(M.MODEL, M.OUT))}"
                                             f"\n  (the same case again: python benchmarks/fuzz.py --seed {args.seed} "
                                             f"--only {n})")
    shutil.rmtree(root, ignore_errors=True)
    verdict.number = n  # type: ignore[attr-defined]
    return verdict


def _private_env() -> tuple[dict, str]:
    """The environment of the runs: a private onnxopt cache (the machine model copied in, so it is not measured
    again; no cost cache), one build worker per run."""
    cache = tempfile.mkdtemp(prefix="onnxopt-fuzz-cache-")
    src = os.environ.get("ONNXOPT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "onnxopt")
    for f in glob.glob(os.path.join(src, "machine-*.json")):
        shutil.copy(f, cache)
    env = dict(os.environ, ONNXOPT_CACHE_DIR=cache, ONNXOPT_BUILD_WORKERS="1", PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    if not glob.glob(os.path.join(cache, "machine-*.json")):  # measure once here, not in the first case
        subprocess.run([sys.executable, "-c", "from onnxopt.hardware.measure import load_machine; "
                        "load_machine(quick=True)"], env=env, check=False)
    return env, cache


def summarize(verdicts: list[M.Verdict], seconds: float, args) -> str:
    lines = []
    n = len(verdicts)
    by_exit = collections.Counter(M.outcome_label(v.run.exit_code) for v in verdicts)
    failed = [v for v in verdicts if v.failed]
    categories = collections.Counter()
    for v in failed:
        for p in v.problems:
            categories[p[1:p.index("]")]] += 1
    run_s = [v.run.seconds for v in verdicts]
    lines.append(f"onnxopt fuzz: {n} cases (seed {args.seed}), {seconds:.0f} s wall, --jobs {args.jobs}, "
                 f"--timeout {args.timeout:.0f} s")
    lines.append("")
    lines.append(f"{'outcome':<28}{'cases':>7}{'share':>8}")
    for label, c in sorted(by_exit.items()):
        lines.append(f"{label:<28}{c:>7}{100 * c / max(n, 1):>7.1f}%")
    lines.append("")
    lines.append(f"{'failure':<28}{'problems':>9}")
    tb = sum(1 for v in verdicts if any(p.startswith("[traceback]") for p in v.problems))
    for label in ("traceback", "hang", "crash", "internal-error", "partial-output", "wrong-answer", "bad-output",
                  "stray-temporary", "stderr", "input-changed", "bad-exit"):
        lines.append(f"{label:<28}{categories.get(label, 0):>9}")
    lines.append(f"{'cases failing':<28}{len(failed):>9}")
    lines.append(f"{'(cases with a traceback)':<28}{tb:>9}")
    lines.append("")
    kinds = sorted({v.case.kind for v in verdicts})
    lines.append(f"{'mutation kind':<20}{'cases':>6}{'exit 0':>7}{'1':>5}{'2':>5}{'3':>5}{'other':>6}{'failing':>8}")
    for k in kinds:
        vs = [v for v in verdicts if v.case.kind == k]
        cnt = collections.Counter(v.run.exit_code for v in vs)
        other = len(vs) - sum(cnt.get(c, 0) for c in (0, 1, 2, 3))
        lines.append(f"{k:<20}{len(vs):>6}{cnt.get(0, 0):>7}{cnt.get(1, 0):>5}{cnt.get(2, 0):>5}{cnt.get(3, 0):>5}"
                     f"{other:>6}{sum(v.failed for v in vs):>8}")
    lines.append("")
    if run_s:
        run_s.sort()
        lines.append(f"seconds per onnxopt run: median {run_s[len(run_s) // 2]:.2f}, max {run_s[-1]:.1f}, "
                     f"total {sum(run_s):.0f}")
    if failed:
        lines.append("")
        lines.append(f"failing cases (models and notes in {os.path.abspath(args.out)}):")
        for v in sorted(failed, key=lambda v: v.number):
            lines.append(f"  #{v.number:<5} {M.outcome_label(v.run.exit_code):<22} {v.case.describe()[:110]}")
            for p in v.problems:
                lines.append(f"         {p.splitlines()[0][:160]}")
            err = [ln for ln in v.run.stderr.splitlines() if ln.startswith("onnxopt:")] or \
                [ln for ln in v.run.stderr.splitlines() if ln.strip()][-1:]
            if err:
                lines.append(f"         stderr: {err[0][:200]}")
    return "\n".join(lines)


def compare_main(src: str, out: str) -> int:
    """--compare: the output model's answers against the input's, as a JSON list of problems on the last line."""
    problems = M.compare_models(src, out)
    print(json.dumps([p if p.startswith("[") else
                      ("[wrong-answer] " if p.startswith("wrong answer") else "[bad-output] ") + p for p in problems]))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", type=int, default=1000, help="how many cases (default 1000)")
    p.add_argument("--only", help="run only these case numbers (comma-separated), e.g. to reproduce a failure")
    p.add_argument("--seed", type=int, default=0, help="the base seed of the cases (default 0)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="cases at a time (default 2)")
    p.add_argument("--timeout", type=float, default=M.TIME_LIMIT_S, help="seconds per case (default 60)")
    p.add_argument("--out", default="fuzz-failures", help="folder for the failing cases (default ./fuzz-failures)")
    p.add_argument("--json", help="also write every case's outcome here")
    p.add_argument("--compare", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.compare:
        return compare_main(*a.compare)
    numbers = [int(x) for x in a.only.split(",")] if a.only else list(range(a.cases))
    env, cache = _private_env()
    work = tempfile.mkdtemp(prefix="onnxopt-fuzz-")
    verdicts: list[M.Verdict] = []
    t0 = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
            futures = [pool.submit(run_case, n, a, env, work) for n in numbers]
            for i, f in enumerate(concurrent.futures.as_completed(futures), 1):
                v = f.result()
                verdicts.append(v)
                mark = "FAIL " + v.category if v.failed else ""
                print(f"[{i}/{len(numbers)}] #{v.number} {M.outcome_label(v.run.exit_code)} {v.run.seconds:.1f}s "
                      f"{v.case.describe()[:90]} {mark}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: the summary covers the cases that finished", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    seconds = time.perf_counter() - t0
    print(summarize(verdicts, seconds, a))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"case": v.number, "seed": v.case.seed, "kind": v.case.kind, "detail": v.case.detail,
                        "exit_code": v.run.exit_code, "seconds": v.run.seconds, "problems": v.problems,
                        "stderr": v.run.stderr} for v in sorted(verdicts, key=lambda v: v.number)], f, indent=1)
    return 1 if any(v.failed for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
