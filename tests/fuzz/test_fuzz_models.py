"""Fuzzing: onnxopt on 200 mutated small models (issue 31, item 8).

Each hypothesis case draws a seed model (elementwise chain, Conv -> Relu -> MaxPool, MatMul -> Gelu, a symbolic batch,
external data), a mutation (truncated or flipped bytes, dropped or mistyped initializers, renamed inputs, cycles,
wrong attributes, odd dims, unknown ops and domains, bad opsets and IR versions, missing or duplicate outputs, empty
graphs, ... and valid-but-unusual rewrites that reach fusion and code generation) and its parameters, then runs the
CLI in this process (`onnxopt.cli.main.main`, one thread, no timing) under a per-case alarm. See mutations.py for
what every run must satisfy: exit 0, 1 or 2 with one clean error line, nothing written on failure, no temporaries
left, the input untouched, and on success an output that gives the input's answers with and without its library.

benchmarks/fuzz.py runs the same mutations N at a time in subprocesses (crashes and hangs caught for real) and keeps
the failing models.
"""

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import mutations as M

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fuzz"))


_FAILURES: dict[str, type] = {}


def _failure(category: str) -> type:
    """One exception class per failure category, so that hypothesis reports each kind of bug it finds (it keeps
    failures apart by exception type and place) instead of only the first."""
    name = "Fuzz" + "".join(w.title() for w in category.replace("-", " ").split())
    return _FAILURES.setdefault(category, type(name, (AssertionError,), {}))


def _report(case: M.Case, verdict: M.Verdict, command: str) -> str:
    lines = [f"onnxopt fails on a mutated model: {case.describe()}",
             f"draws: {', '.join(case.trail)}",
             f"command: {command}",
             f"exit code: {verdict.run.exit_code} ({M.outcome_label(verdict.run.exit_code)}), "
             f"{verdict.run.seconds:.1f} s",
             "problems:", *("  " + p for p in verdict.problems),
             "stderr:", verdict.run.stderr.rstrip()]
    return "\n".join(lines)


@settings(max_examples=200, **SETTINGS)
@given(data=st.data())
def test_mutated_models(data, fuzz_root):
    case = M.make_case(M.HypothesisChooser(data))
    note(case.describe())
    root = tempfile.mkdtemp(prefix=f"{case.seed}-{case.kind}-", dir=fuzz_root)
    folder, path, tmpdir, before = M.prepare(case, root)
    out = os.path.join(folder, M.OUT)
    run = M.run_in_process(path, out, tmpdir)
    verdict = M.check_run(case, folder, tmpdir, before, run)
    event(f"exit {M.outcome_label(run.exit_code)}")
    event(f"kind {case.kind}")
    if verdict.failed:
        M.write_failure(case, verdict, os.path.join(root, "failure"),
                        "onnxopt " + " ".join(M.cli_args(path, out)))
        raise _failure(verdict.category)(_report(case, verdict, "onnxopt " + " ".join(M.cli_args(path, out))))
    shutil.rmtree(root, ignore_errors=True)


def test_a_good_share_of_cases_are_valid():
    """At least a fifth of the drawn cases are models onnxruntime loads and runs: those reach onnxopt's fusion and
    code generation rather than its load-time checks."""
    runs = []

    @settings(max_examples=200, **SETTINGS)
    @given(data=st.data())
    def draw(data):
        runs.append(M.onnxruntime_runs(M.make_case(M.HypothesisChooser(data))))

    draw()
    assert len(runs) >= 100 and sum(runs) >= 0.2 * len(runs), f"{sum(runs)} of {len(runs)} cases are valid models"


@pytest.mark.parametrize("seed", sorted(M.SEEDS))
def test_seed_models_optimize(seed, tmp_path):
    """Every seed, unmutated, optimizes to a model that gives its answers (a broken seed would hide every case)."""
    case = M.Case(seed, "none", "the seed unchanged", M.serialize(M.SEEDS[seed][0](), M.SEEDS[seed][1]))
    folder, path, tmpdir, before = M.prepare(case, str(tmp_path))
    run = M.run_in_process(path, os.path.join(folder, M.OUT), tmpdir)
    verdict = M.check_run(case, folder, tmpdir, before, run)
    assert run.exit_code == 0 and not verdict.failed, _report(case, verdict, "")
