"""The measured-cost cache: a real SQLite file, its keys, reuse across optimize() runs, a corrupt or locked file,
several processes writing at once, and the CLI flags."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.cost_cache import CostCache, CostCacheWarning, default_path, source_digest, tree_digest
from onnxopt.models.conv_shapes import ConvShape, conv_model


def rows(path, table="region_cost"):
    with sqlite3.connect(path) as c:
        return sorted(c.execute(f"SELECT * FROM {table}").fetchall())


def test_round_trip_in_a_real_file(tmp_path):
    path = tmp_path / "sub" / "costs.sqlite"
    c = CostCache(path)
    assert c.enabled and c.get_region("Conv_ab", [[1, 8, 4, 4]], 2) is None and c.misses == 1
    c.put_region("Conv_ab", [[1, 8, 4, 4]], 2, 3e-3, 1e-3)
    c.close()
    c = CostCache(path)  # another process later: reopened from disk
    got = c.get_region("Conv_ab", [[1, 8, 4, 4]], 2)
    assert got["original_s"] == 3e-3 and got["fused_s"] == 1e-3 and got["speedup"] == pytest.approx(3.0)
    assert c.summary()["hits"] == 1 and c.summary()["path"] == str(path)
    c.close()
    # The readable parts are columns, for inspection with any SQLite client.
    (row,) = rows(path)
    with sqlite3.connect(path) as db:
        cols = [d[1] for d in db.execute("PRAGMA table_info(region_cost)")]
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    rec = dict(zip(cols, row))
    assert rec["op_type"] == "Conv_ab" and json.loads(rec["shapes"]) == [[1, 8, 4, 4]] and rec["threads"] == 2
    assert rec["onnxopt_version"] == f"{onnxopt.__version__}+{source_digest()}" and rec["cpu"] and rec["ort_version"]


def test_source_digest_follows_the_kernel_sources(tmp_path):
    """A kernel timed by other glue or code generation is another kernel: the cache's version holds a digest of the
    sources, which changes with any .py, .c or .h file under the packages (and only with those)."""
    root = tmp_path / "codegen"
    (root / "glue").mkdir(parents=True)
    (root / "glue" / "exec.c").write_text("int task_split = 8;\n")
    (root / "build.py").write_text("TILE = 6\n")
    first = tree_digest([str(root)])
    (root / "NOTES.md").write_text("docs are not code\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "build.cpython-311.pyc").write_bytes(b"\0")
    assert tree_digest([str(root)]) == first
    (root / "glue" / "exec.c").write_text("int task_split = 16;\n")
    assert tree_digest([str(root)]) != first
    assert len(source_digest()) == 12


def test_key_depends_on_shapes_threads_and_op_type(tmp_path):
    c = CostCache(tmp_path / "c.sqlite")
    k = c.key("Conv_ab", [[1, 8, 4, 4]], 2)
    assert k == c.key("Conv_ab", [[1, 8, 4, 4]], 2)
    assert len({k, c.key("Conv_ab", [[1, 8, 4, 4]], 1), c.key("Conv_ab", [[1, 8, 4, 4]], None),
                c.key("Conv_ab", [[2, 8, 4, 4]], 2), c.key("Conv_cd", [[1, 8, 4, 4]], 2)}) == 5
    c.put_region("Conv_ab", [[1, 8, 4, 4]], 2, 2.0, 1.0)
    assert c.get_region("Conv_ab", [[1, 8, 4, 4]], 1) is None
    assert c.get_region("Conv_ab", [[1, 8, 5, 4]], 2) is None
    assert c.get_region("Conv_ab", [[1, 8, 4, 4]], 2) is not None
    c.close()


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.setenv("ONNXOPT_CACHE_DIR", str(tmp_path / "a"))
    assert default_path() == str(tmp_path / "a" / "costs.sqlite")
    monkeypatch.delenv("ONNXOPT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_path() == str(tmp_path / "x" / "onnxopt" / "costs.sqlite")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_path() == os.path.join(os.path.expanduser("~"), ".cache", "onnxopt", "costs.sqlite")


def test_tests_never_use_the_home_cache():
    assert not default_path().startswith(os.path.join(os.path.expanduser("~"), ".cache"))


def model():
    """A conv with its Relu (a compute region, which the whole-model timing may drop: onnxruntime's own conv is good
    in context) and a hardswish written out, x * clip(x + 3, 0, 6) / 6, on a separate input (an elementwise region:
    one pass instead of four, which the whole-model timing keeps)."""
    m = conv_model(ConvShape("cc", 8, 12, 12, 16, 3, 1, 1), epilogue="relu")
    g = m.graph
    g.input.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 32, 64, 64]))
    g.initializer.extend([numpy_helper.from_array(np.array(v, np.float32), k)
                          for k, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0))])
    g.node.extend([helper.make_node("Add", ["h", "three"], ["h1"]), helper.make_node("Clip", ["h1", "zero", "six"],
                                                                                    ["h2"]),
                   helper.make_node("Mul", ["h", "h2"], ["h3"]), helper.make_node("Div", ["h3", "six"], ["hs"])])
    g.output.append(helper.make_tensor_value_info("hs", TensorProto.FLOAT, [1, 32, 64, 64]))
    return m


def test_second_optimize_reuses_the_timings(tmp_path):
    path = str(tmp_path / "costs.sqlite")
    m = model()
    first = onnxopt.optimize(m, cost_cache=path, tile_search=False, min_speedup=1e-6, threads=1)
    cc1 = first.report["cost_cache"]
    assert cc1["path"] == path and cc1["enabled"] and cc1["hits"] == 0 and cc1["misses"] >= 1
    before = rows(path)
    assert len(before) == cc1["misses"]
    assert first.report["regions"] and all(e["cost_cache"] == "miss" for e in first.report["regions"])

    second = onnxopt.optimize(m, cost_cache=path, tile_search=False, min_speedup=1e-6, threads=1)
    cc2 = second.report["cost_cache"]
    assert cc2["hits"] == cc1["misses"] and cc2["misses"] == 0
    assert rows(path) == before  # nothing was timed again: no row rewritten (measured_at would change)
    assert second.report["regions"]
    for e in second.report["regions"]:
        assert e["cost_cache"] == "hit"
        stored = [r for r in before if r[1] == e["op_type"]]
        assert stored and e["measured_original_s"] == stored[0][8] and e["measured_fused_s"] == stored[0][9]
    # Every kernel is still checked against onnxruntime, and the model verified.
    assert second.report["verification"]["ok"]

    # Other threads: another measurement.
    third = onnxopt.optimize(m, cost_cache=path, tile_search=False, min_speedup=1e-6, threads=2)
    assert third.report["cost_cache"]["hits"] == 0 and len(rows(path)) == 2 * len(before)

    off = onnxopt.optimize(m, cost_cache=False, tile_search=False, min_speedup=1e-6, threads=1)
    assert off.report["cost_cache"]["enabled"] is False
    assert all("cost_cache" not in e for e in off.report["regions"])


def test_tile_search_results_are_cached(tmp_path):
    path = str(tmp_path / "costs.sqlite")
    m = conv_model(ConvShape("ts", 16, 16, 16, 32, 3, 1, 1))  # 2.4 MFLOP: searched
    # the register tile's search: Winograd's own, which takes a lone 3x3 convolution first, is off
    onnxopt.optimize(m, cost_cache=path, threads=1, min_speedup=1e-6, verify=False, winograd="off")
    (tile_row,) = rows(path, "tile_choice")
    again = onnxopt.optimize(m, cost_cache=path, threads=1, min_speedup=1e-6, verify=False, winograd="off")
    assert again.report["cost_cache"]["tile_hits"] == 1 and again.report["cost_cache"]["tile_misses"] == 0
    assert rows(path, "tile_choice") == [tile_row]
    for e in again.report["regions"]:
        assert e["tile_search"]["cost_cache"] == "hit" and e["tile"] == json.loads(tile_row[8])[:3]


def test_corrupt_file_warns_and_the_optimization_goes_on(tmp_path):
    path = tmp_path / "costs.sqlite"
    path.write_bytes(os.urandom(3000))
    with pytest.warns(CostCacheWarning, match="not a database"):
        res = onnxopt.optimize(model(), cost_cache=str(path), tile_search=False, threads=1)
    cc = res.report["cost_cache"]
    assert cc["enabled"] is False and "not a database" in cc["warning"] and cc["hits"] == cc["misses"] == 0
    assert res.report["verification"]["ok"]
    assert path.stat().st_size == 3000  # left alone


def test_locked_file_turns_the_cache_off(tmp_path):
    path = tmp_path / "costs.sqlite"
    CostCache(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holding the write lock past the timeout
    try:
        with pytest.warns(CostCacheWarning, match="locked"):
            c = CostCache(path, timeout=0.2)
        assert not c.enabled and c.get_region("x", [[1]], 1) is None
        c.put_region("x", [[1]], 1, 1.0, 1.0)  # a no-op, not an error
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _writer(path, worker, n):
    c = CostCache(path, timeout=30)
    assert c.enabled, c.warning
    for i in range(n):
        c.put_region(f"Op_{worker}_{i}", [[worker, i]], 1, 2.0, 1.0)
        assert c.get_region(f"Op_{worker}_{i}", [[worker, i]], 1) is not None
        c.put_region("Shared", [[1]], 1, 2.0 + worker, 1.0)  # the same row from every process
    assert c.enabled, c.warning
    c.close()


def test_processes_share_the_file(tmp_path):
    path = str(tmp_path / "costs.sqlite")  # created by the racing processes themselves
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    names = {r[1] for r in rows(path)}
    assert names == {f"Op_{w}_{i}" for w in range(4) for i in range(40)} | {"Shared"}


def test_cli_flags(tmp_path):
    from onnxopt.cli.main import _optimize_parser

    a = _optimize_parser().parse_args(["m.onnx", "-o", "f.onnx", "--no-cost-cache", "--no-tile-search"])
    assert a.no_cost_cache and a.no_tile_search and a.cost_cache is None
    a = _optimize_parser().parse_args(["m.onnx", "-o", "f.onnx", "--cost-cache", "c.sqlite"])
    assert a.cost_cache == "c.sqlite" and not a.no_cost_cache and not a.no_tile_search

    src = str(tmp_path / "m.onnx")
    onnx.save(model(), src)
    cache = str(tmp_path / "mine.sqlite")
    r = subprocess.run([sys.executable, "-m", "onnxopt", src, "-o", str(tmp_path / "f.onnx"), "--cost-cache", cache,
                        "--no-tile-search", "--threads", "1", "--report", str(tmp_path / "r.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.load(open(tmp_path / "r.json"))
    assert rep["cost_cache"]["path"] == cache and rep["cost_cache"]["misses"] >= 1 and rows(cache)


def test_kernel_costs_for_the_search_round_trip(tmp_path):
    """The fusion search's kernel costs: by signature, threads and target; kept across processes."""
    path = tmp_path / "costs.sqlite"
    c = CostCache(path)
    assert c.get_kernels(["sigA", "sigB"], 2, "x86|znver4|+avx512f") == {} and c.kernel_misses == 2
    c.put_kernel("sigA", 2, "x86|znver4|+avx512f", 4e-4, "afusion_ab")
    c.close()
    c = CostCache(path)
    assert c.get_kernels(["sigA", "sigB", "sigA"], 2, "x86|znver4|+avx512f") == {"sigA": 4e-4}
    assert c.get_kernels(["sigA"], 1, "x86|znver4|+avx512f") == {}  # other threads: not measured
    assert c.get_kernels(["sigA"], 2, "x86|skylake-avx512|+avx512f") == {}  # another target's kernel
    assert c.summary()["kernel_hits"] == 1 and c.summary()["kernel_misses"] == 3
    c.close()
    (row,) = rows(path, "kernel_cost")
    assert row[1] == "sigA" and "afusion_ab" in row and 4e-4 in row


def test_a_cache_file_from_before_the_kernel_table_gains_it(tmp_path):
    """Files written before kernel costs existed open as they are (same schema version) and gain the table."""
    path = tmp_path / "costs.sqlite"
    c = CostCache(path)
    c.put_region("Conv_ab", [[1, 8, 4, 4]], 2, 3e-3, 1e-3)
    c.close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE kernel_cost")
    c = CostCache(path)
    assert c.enabled and c.warning is None
    assert c.get_region("Conv_ab", [[1, 8, 4, 4]], 2)["fused_s"] == 1e-3
    c.put_kernel("sig", 2, "t", 1e-3, "Conv_ab")
    assert c.get_kernels(["sig"], 2, "t") == {"sig": 1e-3}
    c.close()


_HOLD_THE_WRITE_LOCK = r"""
import sys, time
from onnxopt.cost_cache import CostCache
c = CostCache(sys.argv[1])
c._conn.execute("BEGIN IMMEDIATE")  # the write lock, as while a row is being written
c.put_region("Op_killed", [[1]], 1, 2.0, 1.0)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_writer_killed_holding_the_lock_leaves_no_lock_and_no_open_file(tmp_path):
    """SQLite's locks are the process's own (POSIX record locks): a SIGKILL releases them with its files, so the next
    optimizer takes the cache at once, without the killed writer's uncommitted row."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    path = str(tmp_path / "costs.sqlite")
    p = subprocess.Popen([sys.executable, "-c", _HOLD_THE_WRITE_LOCK, path], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        held = [os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{p.pid}/fd")]
        assert path in held
        with pytest.warns(CostCacheWarning):
            blocked = CostCache(path, timeout=0.2)  # while it lives, the lock holds
        blocked.put_region("Op_other", [[1]], 1, 2.0, 1.0)
        assert not blocked.enabled and "locked" in blocked.warning
    finally:
        p.kill()
        p.wait(30)
        p.stdout.close()
    c = CostCache(path, timeout=0.2)
    c.put_region("Op_after", [[1]], 1, 2.0, 1.0)
    assert c.enabled and c.warning is None
    assert c.get_region("Op_after", [[1]], 1) and c.get_region("Op_killed", [[1]], 1) is None
    c.close()


def test_a_tuning_claim_is_held_released_and_taken_over_when_stale(tmp_path):
    """One process at a time searches a problem: a live claim of another process is reported, a released one or
    one whose process is gone (same host) or that is older than the limit is taken over."""
    import socket
    import subprocess
    import sys

    from onnxopt.cost_cache import CostCache

    path = tmp_path / "c.sqlite"
    problem = ("packed_matmul", (1, 32, 256, 160), "t", "float32", 1)
    other = subprocess.Popen([sys.executable, "-c", f"""
import sys; from onnxopt.cost_cache import CostCache
c = CostCache({str(path)!r}); assert c.claim(*{problem!r}) is None; print('held', flush=True); sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        mine = CostCache(path)
        assert mine.claim(*problem) == f"{socket.gethostname()}:{other.pid}"  # live: wait for it
        assert mine.claim(*problem, stale_s=0.0) is None  # too old: taken over
        mine.release(*problem)
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    # a claim whose process is gone is taken over at once
    gone = subprocess.run([sys.executable, "-c", f"""
from onnxopt.cost_cache import CostCache
c = CostCache({str(path)!r}); assert c.claim(*{problem!r}) is None
"""], timeout=60)
    assert gone.returncode == 0
    assert CostCache(path).claim(*problem) is None
