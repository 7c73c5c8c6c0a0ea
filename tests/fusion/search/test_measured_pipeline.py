"""The search on measured costs inside `onnxopt.optimize` (pipeline._search_pairs, _measured_afusion): every legal
AFUSION group is built and timed, the search runs again on the times, and the times go in the cost cache's
kernel_cost table, from which later runs' searches start. Real kernels, real timings, a real SQLite file."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from onnxopt.models.conv_shapes import optifx_model

import onnxopt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_layout import needs_vectors

pytestmark = needs_vectors


def kernel_rows(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT signature, op_type, seconds FROM kernel_cost").fetchall()


def set_group_seconds(path, seconds):
    with sqlite3.connect(path) as db:
        n = db.execute("UPDATE kernel_cost SET seconds = ? WHERE op_type LIKE 'afusion%'", (seconds,)).rowcount
    assert n == 1


@pytest.fixture(scope="module")
def fire_runs(tmp_path_factory):
    """G5 (a fire module) optimized twice on one cache file."""
    d = tmp_path_factory.mktemp("measured")
    path = str(d / "costs.sqlite")
    model = optifx_model("G5")
    first = onnxopt.optimize(model, str(d / "a.onnx"), cost_cache=path, threads=1, tile_search=False)
    rows = kernel_rows(path)
    second = onnxopt.optimize(model, str(d / "b.onnx"), cost_cache=path, threads=1, tile_search=False)
    return model, path, first, rows, second


def test_the_group_and_its_parts_are_timed_and_cached(fire_runs):
    _, _, first, rows, _ = fire_runs
    ms = first.report["search"]["measured_search"]
    # Three conv kernels (squeeze, expand 1x1, expand 3x3) in the blocked plan, the SIMO group and the expands as
    # siblings (horizontal fusion).
    assert ms["kernels_timed"] == 5 and ms["measured_kernels"] == 5
    assert len(rows) == 5 and sum(op.startswith("afusion") for _, op, _ in rows) == 1
    assert sum(op.startswith("siblings") for _, op, _ in rows) == 1
    assert all(s > 0 for _, _, s in rows)
    timed = {e["op_type"]: e["measured_fused_s"] for e in first.report["regions"]}
    assert all(s == timed[op] for _, op, s in rows if op in timed)
    # The measured search chose between the group and its parts: what it chose is the AFUSION plan's groups.
    chosen = [p["nodes"] for p in first.report["afusion"]["pairs"]]
    assert ms["afusion_after"] == chosen
    assert first.report["cost_cache"]["kernel_misses"] > 0


def test_a_later_run_starts_from_the_measured_costs(fire_runs):
    second = fire_runs[4]
    s = second.report["search"]
    assert s["measured_kernels"] == 5  # the first search already had them
    assert second.report["cost_cache"]["kernel_hits"] >= 5


def test_the_cached_costs_decide(fire_runs, tmp_path):
    """A cached time makes the search's choice: the group measured at a second is left out, at a nanosecond taken
    (without timing anything in this run, so only the cache speaks)."""
    model, path, _, _, _ = fire_runs
    set_group_seconds(path, 1.0)
    slow = onnxopt.optimize(model, str(tmp_path / "slow.onnx"), cost_cache=path, threads=1, measure=False)
    assert slow.report["search"]["afusion_pairs_chosen"] == 0 and slow.report["afusion"]["pairs"] == []
    set_group_seconds(path, 1e-9)
    fast = onnxopt.optimize(model, str(tmp_path / "fast.onnx"), cost_cache=path, threads=1, measure=False)
    assert fast.report["search"]["afusion_pairs_chosen"] == 1
    assert fast.report["afusion"]["pairs"][0]["pattern"] == "SIMO"
