"""Conformance-suite plumbing: the `conformance` marker, the JSONL report, and the counts at the end of the run.

With ONNXOPT_CONFORMANCE_REPORT=path set, the process that runs a case (each xdist worker, or the only process
without xdist) appends one JSON line per case phase to `path`; `python tests/conformance/summarize.py path`
aggregates it. The process that prints the terminal summary (the xdist controller, or the only process) prints the
counts at the end of the run.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import summarize  # noqa: E402

_records: list[dict] = []
_runs_tests = True  # False on the xdist controller, which only sees the workers' reports


def pytest_configure(config):
    global _runs_tests
    config.addinivalue_line("markers", "conformance: ONNX backend test cases run through onnxopt (tests/conformance)")
    is_worker = hasattr(config, "workerinput")
    _runs_tests = is_worker or getattr(config.option, "dist", "no") == "no"


def pytest_runtest_logreport(report):
    rec = summarize.record_from_report(report)
    if rec is None:
        return
    _records.append(rec)
    path = os.environ.get(summarize.ENV_REPORT)
    # a crashed xdist worker cannot write its line: the controller, which makes up the report, writes it
    crashed = rec["status"] == "failed" and "crashed while running" in rec.get("reason", "")
    if crashed and "kind" not in rec:
        try:
            import cases

            rec["kind"] = cases.get(rec["id"]).kind
        except Exception:  # noqa: BLE001 - the kind is only for the per-kind counts
            pass
    if path and (_runs_tests or crashed):
        summarize.append_jsonl(path, rec)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not _records:
        return
    s = summarize.summarize(summarize.merge(_records))
    terminalreporter.section("onnxopt conformance")
    for line in summarize.format_summary(s):
        terminalreporter.write_line(line)
    path = os.environ.get(summarize.ENV_REPORT)
    if path:
        terminalreporter.write_line(f"  per-case records: {path} (python tests/conformance/summarize.py {path})")
