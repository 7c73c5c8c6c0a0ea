"""Conformance counts: from the pytest run itself (conftest.py prints them) or from a JSONL report file.

    ONNXOPT_CONFORMANCE_REPORT=conformance.jsonl python -m pytest -n 2 tests/conformance -q
    python tests/conformance/summarize.py conformance.jsonl [--json summary.json] [--list failed,xfailed]

Each line of the JSONL file is one test phase outcome for one case (written by whichever process ran it, so xdist
workers append concurrently; each line is a single O_APPEND write). The last word for a case is its worst phase
(a teardown error after a pass is a failure). Exit status: 1 if any case failed or xpassed(strict), else 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

ENV_REPORT = "ONNXOPT_CONFORMANCE_REPORT"
ORT_FAILS_PREFIX = "onnxruntime itself fails"
TEST_FILE = "test_conformance.py::test_conformance["
STATUS_ORDER = ["passed", "ort-fails", "skipped", "xfailed", "xpassed", "failed"]  # later = worse
_RANK = {s: i for i, s in enumerate(STATUS_ORDER)}


def case_id(nodeid: str) -> str | None:
    i = nodeid.find(TEST_FILE)
    if i < 0 or not nodeid.endswith("]"):
        return None
    return nodeid[i + len(TEST_FILE):-1]


def _skip_reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        msg = lr[2]
    else:
        msg = str(lr)
    return msg[len("Skipped: "):] if msg.startswith("Skipped: ") else msg


def _failure(report) -> tuple[str, str]:
    """(one-line message, traceback tail)."""
    text = getattr(report, "longreprtext", "") or str(report.longrepr)
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    msg = (crash or (lines[-1] if lines else "")).strip().splitlines()
    return (msg[0] if msg else "")[:500], "\n".join(lines[-25:])


def record_from_report(report) -> dict | None:
    """A JSON-able record of one phase of one conformance test, or None for phases that say nothing."""
    cid = case_id(report.nodeid)
    if cid is None:
        return None
    if report.when != "call" and not (report.failed or report.skipped):
        return None
    rec = {"id": cid, "when": report.when, "duration_s": round(report.duration, 4)}
    for k, v in getattr(report, "user_properties", []) or []:
        rec[k] = v
    if hasattr(report, "wasxfail"):
        rec["status"] = "xfailed" if report.skipped else "xpassed"
        rec["reason"] = report.wasxfail
    elif report.passed:
        rec["status"] = "passed"
    elif report.skipped:
        reason = _skip_reason(report)
        rec["status"] = "ort-fails" if reason.startswith(ORT_FAILS_PREFIX) else "skipped"
        rec["reason"] = reason
    else:
        rec["status"] = "failed"
        rec["reason"], rec["traceback_tail"] = _failure(report)
        if report.when != "call":
            rec["reason"] = f"[{report.when}] {rec['reason']}"
    return rec


def append_jsonl(path: str, rec: dict) -> None:
    line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def merge(records) -> dict[str, dict]:
    """One record per case: the call-phase record, overridden by a worse (failed/skipped setup) phase."""
    out: dict[str, dict] = {}
    for r in records:
        old = out.get(r["id"])
        if old is None:
            out[r["id"]] = dict(r)
        elif _RANK[r["status"]] > _RANK[old["status"]]:
            merged = {**old, **r}
            out[r["id"]] = merged
        else:
            for k, v in r.items():
                old.setdefault(k, v)
    return out


def load_jsonl(path: str) -> dict[str, dict]:
    with open(path) as f:
        return merge(json.loads(ln) for ln in f if ln.strip())


def ort_category(reason: str) -> str:
    r = reason[len(ORT_FAILS_PREFIX) + 2:] if reason.startswith(ORT_FAILS_PREFIX) else reason
    for pat, cat in [
        (r"Unsupported model IR version", "load: IR version newer than onnxruntime reads"),
        (r"opset version|Opset \d+ is under development|released onnx opset", "load: opset newer than onnxruntime"),
        (r"NOT_IMPLEMENTED|Could not find an implementation", "load: no CPU kernel for this op/type"),
        (r"is not a registered function/op|No Op registered|No opset import for domain", "load: unknown op/domain"),
        (r"can't be converted to MLDataType|Unable to handle object", "run: input type the Python binding refuses"),
        (r"Type Error: Type \(.*\) of (input|output) parameter", "load: no CPU kernel for this op/type"),
        (r"^load:", "load: other"),
        (r"^run:", "run: error"),
        (r"^mismatch:", "mismatch vs expected outputs"),
    ]:
        if re.search(pat, r):
            return cat
    return "other"


def summarize(recs: dict[str, dict]) -> dict:
    by_status = collections.Counter(r["status"] for r in recs.values())
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in recs.values():
        by_kind[r.get("kind", "?")][r["status"]] += 1
    fused = [r for r in recs.values() if (r.get("regions") or 0) > 0]
    timing = collections.Counter()
    for r in recs.values():
        for k in ("ort_s", "optimize_s", "fused_run_s", "duration_s"):
            timing[k] += float(r.get(k) or 0.0)
        for k, v in (r.get("timings") or {}).items():
            timing["optimize." + k] += float(v or 0.0)
    slowest = sorted(recs.values(), key=lambda r: -float(r.get("duration_s") or 0))[:10]
    return {
        "total": len(recs),
        "passed": by_status["passed"],
        "ort_fails": by_status["ort-fails"],
        "failed": by_status["failed"] + by_status["xpassed"],
        "xfailed": by_status["xfailed"],
        "skipped_other": by_status["skipped"],
        "with_fused_regions": len(fused),
        "with_fused_regions_passed": sum(1 for r in fused if r["status"] == "passed"),
        "left_files_in_cwd": sorted(r["id"] for r in recs.values() if r.get("cwd_litter")),
        "fused_regions_total": sum(int(r.get("regions") or 0) for r in recs.values()),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "ort_fails_by_category": dict(collections.Counter(
            ort_category(r.get("reason", "")) for r in recs.values() if r["status"] == "ort-fails").most_common()),
        "seconds_summed_over_cases": {k: round(v, 2) for k, v in sorted(timing.items())},
        "slowest": [(r["id"], round(float(r.get("duration_s") or 0), 2)) for r in slowest],
        "failures": {r["id"]: r.get("reason", "") for r in recs.values() if r["status"] in ("failed", "xpassed")},
        "xfails": {r["id"]: r.get("reason", "") for r in recs.values() if r["status"] == "xfailed"},
    }


def format_summary(s: dict) -> list[str]:
    lines = [
        f"conformance: {s['total']} cases | onnxruntime itself fails (skipped): {s['ort_fails']} | "
        f"passed: {s['passed']} | failed: {s['failed']} | xfailed (known onnxopt bugs): {s['xfailed']}"
        + (f" | other skips: {s['skipped_other']}" if s["skipped_other"] else ""),
        f"  with fused regions: {s['with_fused_regions']} cases ({s['with_fused_regions_passed']} passed), "
        f"{s['fused_regions_total']} regions in all",
    ]
    if s["left_files_in_cwd"]:
        litter = s["left_files_in_cwd"]
        lines.append(f"  optimize() left files in the current directory in {len(litter)} cases (e.g. "
                     f"{', '.join(litter[:3])}); see cwd_litter in the JSONL records")
    for kind, c in s["by_kind"].items():
        lines.append(f"  {kind:18s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    if s["ort_fails_by_category"]:
        lines.append("  onnxruntime failures by cause: "
                     + "; ".join(f"{k}: {v}" for k, v in s["ort_fails_by_category"].items()))
    t = s["seconds_summed_over_cases"]
    if t:
        lines.append("  seconds summed over cases: " + ", ".join(f"{k} {v}" for k, v in t.items()))
    lines.append("  slowest: " + ", ".join(f"{i} {d}s" for i, d in s["slowest"]))
    for cid, reason in sorted(s["failures"].items()):
        lines.append(f"  FAILED {cid}: {reason}")
    by_reason: dict[str, list[str]] = collections.defaultdict(list)
    for cid, reason in sorted(s["xfails"].items()):
        by_reason[reason].append(cid)
    for reason, ids in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(ids[:4]) + (f", ... ({len(ids) - 4} more)" if len(ids) > 4 else "")
        lines.append(f"  xfail x{len(ids)}: {reason[:150]}... [{shown}]")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", default=os.environ.get(ENV_REPORT), help=f"JSONL file (default ${ENV_REPORT})")
    ap.add_argument("--json", help="also write the summary as JSON here")
    ap.add_argument("--list", default="", help="comma-separated statuses whose case ids to print, e.g. failed,ort-fails")
    args = ap.parse_args(argv)
    if not args.report:
        ap.error(f"give the JSONL report path or set {ENV_REPORT}")
    recs = load_jsonl(args.report)
    s = summarize(recs)
    print("\n".join(format_summary(s)))
    for status in [x for x in args.list.split(",") if x]:
        for cid, r in sorted(recs.items()):
            if r["status"] == status:
                print(f"{status}\t{cid}\t{r.get('reason', '')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=1, sort_keys=True)
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
