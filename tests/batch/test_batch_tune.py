"""`onnxopt batch --tune`: each model's matmuls searched (`onnxopt tune`) into the cost cache before its
optimization, which reads the records; a matmul another model of the batch tuned is reused, not searched again,
locally and as tasks of a real local Ray cluster running at once, sharing one SQLite file (the claim a search
holds in it makes the other wait for its records)."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from batch_models import tree_hashes
from onnx import helper, numpy_helper

from onnxopt.batch import run_batch
from onnxopt.codegen.target import parse_target
from onnxopt.cost_cache import CostCache
from onnxopt.tune.heron.choose import KIND, target_key

SHAPE = (1, 32, 256, 160)  # 2.6 MFLOP: above the FLOPs where a schedule matters


def mlp(path, seed: int, relu: bool = True):
    """x [32, 256] @ W [256, 160] + b [-> Relu]: the same matmul problem whatever the seed and the tail."""
    _, M, K, N = SHAPE
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y" if not relu
                                                                                               else "t"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [M, N])],
                          [numpy_helper.from_array((rng.standard_normal((K, N)) / 16).astype(np.float32), "w"),
                           numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b")])
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), os.fspath(path))


def _kwargs(tmp_path):
    return {"threads": 1, "search_budget": 5, "min_speedup": 0, "cost_cache": str(tmp_path / "costs.sqlite"),
            "quiet": True, "bench": False}


def _check(result, out, cache_path):
    by = {m["model"]: m for m in result.records}
    assert result.exit_code == 0 and set(by) == {"a.onnx", "b.onnx"}
    # one of them searched the matmul, the other took its records (after it, or waiting for it when they ran at once)
    first, second = sorted((by["a.onnx"]["tune"], by["b.onnx"]["tune"]), key=lambda t: -t["searched"])
    assert first["status"] == "tuned" and first["searched"] == 1 and first["reused"] == 0
    assert second["status"] == "tuned" and second["searched"] == 0 and second["reused"] == 1
    with open(first["file"]) as f:
        (problem,) = json.load(f)["problems"]
    assert problem["shape"] == list(SHAPE) and problem["trials"] == 8
    # both optimizations read the records and measured no schedule of their own
    for name in ("a.onnx", "b.onnx"):
        with open(by[name]["report"]) as f:
            assert json.load(f)["matmul_schedule"]["from_records"] == 1, name
    recs = CostCache(cache_path).get_records(KIND, SHAPE, target_key(parse_target(None)), "float32", 1, "tune")
    assert len(recs) >= 8 and all(s is None or s > 0 for _, s in recs)
    assert os.path.isfile(out / "a.tune.json") and os.path.isfile(out / "b.tune.json")


def test_a_batch_tunes_each_matmul_once(tmp_path):
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    mlp(zoo / "a.onnx", 0)
    mlp(zoo / "b.onnx", 1, relu=False)
    sources = tree_hashes(zoo)
    result = run_batch([str(zoo / "a.onnx"), str(zoo / "b.onnx")], str(out), tune=8, **_kwargs(tmp_path))
    _check(result, out, tmp_path / "costs.sqlite")
    assert tree_hashes(zoo) == sources
    # the state knows the tuning was asked for: a rerun with --tune skips both, one without it runs them again
    assert [m["status"] for m in run_batch([str(zoo / "a.onnx"), str(zoo / "b.onnx")], str(out), tune=8,
                                           **_kwargs(tmp_path)).records] == ["skipped", "skipped"]


def test_ray_tasks_at_once_share_the_records(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install onnxopt[ray]")
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    mlp(zoo / "a.onnx", 0)
    mlp(zoo / "b.onnx", 1, relu=False)
    # two CPUs: both tasks start at once; the one that claims the matmul in the cache searches it, the other waits
    # for its records
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        result = run_batch([str(zoo / "a.onnx"), str(zoo / "b.onnx")], str(out), ray="auto", tune=8,
                           **_kwargs(tmp_path))
    finally:
        ray.shutdown()
    _check(result, out, tmp_path / "costs.sqlite")


@pytest.mark.parametrize("args,says", [(["--tune", "0"], "--tune"), (["--tune", "5", "--no-cost-cache"], "--tune")])
def test_bad_tune_options_are_one_line(tmp_path, args, says):
    mlp(tmp_path / "a.onnx", 0)
    r = subprocess.run([sys.executable, "-m", "onnxopt", "batch", str(tmp_path / "a.onnx"), "-o",
                        str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
