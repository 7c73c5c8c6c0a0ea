"""ONNX backend conformance: every case onnxruntime passes must still pass after onnxopt.

Per case (see check_case.run_case): onnxruntime on the original model must match the expected outputs, or the case
is skipped as "onnxruntime itself fails"; then `onnxopt.optimize(model, tmp/fused.onnx, verify=False,
measure=False)` must not raise, the ONNX checker must accept fused.onnx, and `onnxopt.runtime.InferenceSession`
(with the kernel library actually registered) must match the expected outputs with onnx's runner tolerances.

    python -m pytest -n 2 tests/conformance -q -p no:cacheprovider
    ONNXOPT_CONFORMANCE_REPORT=conf.jsonl python -m pytest -n 2 tests/conformance -q && \
        python tests/conformance/summarize.py conf.jsonl
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402
import check_case  # noqa: E402
import summarize  # noqa: E402
from known_failures import KNOWN_FAILURES  # noqa: E402

pytestmark = pytest.mark.conformance


def _params():
    out = []
    for name in cases.names():
        marks = []
        if name in KNOWN_FAILURES:
            exc, reason = KNOWN_FAILURES[name]
            marks.append(pytest.mark.xfail(raises=exc, reason=reason, strict=True))
        out.append(pytest.param(name, id=name, marks=marks))
    return out


@pytest.mark.parametrize("case_id", _params())
def test_conformance(case_id, tmp_path, record_property):
    case = cases.get(case_id)
    rec: dict = {}
    try:
        check_case.run_case(case, tmp_path, threads=1, rec=rec)
    except check_case.OrtFails as e:
        pytest.skip(f"{summarize.ORT_FAILS_PREFIX}: {e}")
    finally:
        rec.setdefault("kind", case.kind)
        for k, v in rec.items():
            if k != "id":
                record_property(k, v)


def test_known_failures_are_cases():
    """A stale KNOWN_FAILURES entry (renamed or removed case) would silently mark nothing."""
    missing = sorted(set(KNOWN_FAILURES) - set(cases.names()))
    assert not missing, f"KNOWN_FAILURES lists ids that are not conformance cases: {missing}"
