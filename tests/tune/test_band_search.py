"""The band-height search of AFUSION kernels (onnxopt/tune/band_search.py): candidates around the machine model's
height, timed on the region's shapes, one compile for all; the chosen height is applied and the kernel still right."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxopt


from onnxopt.models import random_inputs
from onnxopt.models.conv_shapes import optifx_model
from onnxopt.tune.band_search import band_candidates

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import check_answers, needs_vectors  # noqa: E402


def test_candidates_are_the_model_height_then_half_and_double():
    assert band_candidates(7, 28, 1, 2) == [7, 3]  # twice, 14, is two tasks for two threads: balanced back to 7
    assert band_candidates(1, 5, 1, 2) == [1]  # two rows would make 3 uneven tasks on 2 threads
    assert band_candidates(14, 14, 1, 1) == [14, 7]  # twice is past the output


@needs_vectors
def test_search_times_heights_and_applies_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXOPT_AFUSION_PAIRS", "all")
    model = optifx_model("G3")
    # min_speedup=0: the kernel is emitted whatever the whole-model timing says (it is checked here, not timed)
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), plan="afusion", tune_budget=60, min_speedup=0)
    (found,) = res.report["band_search"]
    assert "skipped" not in found, found
    heights = [c["rows"] for c in found["candidates"]]
    assert heights[0] == found["default"] and len(heights) >= 2
    assert all(c["seconds"] > 0 for c in found["candidates"])
    assert found["chosen"] in heights
    assert res.report["afusion"]["pairs"][0]["band_rows"] == found["chosen"]
    check_answers(res, model, random_inputs(model))


@needs_vectors
def test_forced_height_is_not_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXOPT_AFUSION_PAIRS", "all")
    monkeypatch.setenv("ONNXOPT_AFUSION_BAND_ROWS", "3")
    res = onnxopt.optimize(optifx_model("G3"), str(tmp_path / "fused.onnx"), plan="afusion", tune_budget=60)
    assert "forced" in res.report["band_search"][0]["skipped"]
    assert res.report["afusion"]["pairs"][0]["band_rows"] == 3



