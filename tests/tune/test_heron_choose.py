"""The schedule search in the product: the optimizer's default mode (analytic ranking, a few measurements, tuning
records reused without measuring), the chosen register tile and schedule written into fused.onnx and run there by
the public loader in a fresh process, and `onnxopt tune` filling the records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from fresh_process import run_written

import onnxopt
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import parse_target
from onnxopt.cost_cache import CostCache
from onnxopt.tune.heron import packed_matmul as pm
from onnxopt.tune.heron.choose import KIND, choose_schedule

TARGET = parse_target(None)


def test_default_mode_measures_a_few_and_records_them(tmp_path):
    model = pm.matmul_model(96, 256, 192)
    region = pm.matmul_region(model, TARGET)
    cache = CostCache(tmp_path / "costs.sqlite")
    first = choose_schedule(region, TARGET, (1, 96, 256, 192), 2, cache, min_time=0.005)
    assert first.records == "miss" and not first.skipped
    assert len(first.candidates) == 7 and all(c["seconds"] for c in first.candidates)
    assert first.candidates[0]["point"] == first.default  # the default is always timed
    assert all(c["predicted_s"] > 0 for c in first.candidates[1:])
    # the model's best three, then three drawn from the rest at random: predicted slower, and seeded
    ranked, drawn = first.candidates[1:4], first.candidates[4:]
    assert not any(c.get("drawn") for c in ranked) and all(c["drawn"] for c in drawn)
    assert min(c["predicted_s"] for c in drawn) >= max(c["predicted_s"] for c in ranked)
    again_drawn = choose_schedule(region, TARGET, (1, 96, 256, 192), 2, None, min_time=0.005).candidates[4:]
    assert [c["point"] for c in again_drawn] == [c["point"] for c in drawn]
    again = choose_schedule(region, TARGET, (1, 96, 256, 192), 2, cache)
    assert again.records == "hit" and again.build_s == 0.0 and again.measure_s == 0.0
    assert again.point == first.point
    # another thread count is another problem
    assert choose_schedule(region, TARGET, (1, 96, 256, 192), 1, cache, cache_only="budget").records == "miss"
    small = choose_schedule(region, TARGET, (1, 4, 16, 16), 2, cache)
    assert small.skipped and "MFLOP" in small.skipped


def _mlp(tmp_path, M=64, K=256, N=320):
    rng = np.random.default_rng(0)
    from onnx import helper, numpy_helper

    w = (rng.standard_normal((K, N)) / 16).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"]),
                           helper.make_node("Relu", ["y"], ["z"])], "mlp",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [M, N])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, rng.standard_normal((M, K)).astype(np.float32)


def test_a_recorded_schedule_is_written_and_runs_in_a_fresh_process(tmp_path):
    """Records that make another point the best (as `onnxopt tune` would leave them): the optimizer takes it
    without measuring, the written model's kernel is built at that point, and the public loader runs it in a new
    process with the same answers as onnxruntime."""
    path, x = _mlp(tmp_path)
    cache_path = tmp_path / "costs.sqlite"
    cache = CostCache(cache_path)
    d = select(TARGET).packed_b_tile
    lanes = select(TARGET).lanes
    other = {"tile": [3, 1, 1], "schedule": [64, 2, 2, 2]}
    target_key = f"{TARGET.name}|{TARGET.cpu}|{TARGET.llvm_features}"
    threads = len(os.sched_getaffinity(0))
    cache.put_records(KIND, (1, 64, 256, 320), target_key, "float32", threads,
                      [({"tile": [d.mi, d.ni, d.mii], "schedule": [0, 0, 0, 0]}, 1e-3), (other, 5e-4)], "tune")
    cache.close()
    out = tmp_path / "fused.onnx"
    # the compute plan, kept whatever the timing says: this small MLP need not beat onnxruntime on every CPU
    res = onnxopt.optimize(str(path), str(out), cost_cache=str(cache_path), plan="compute", min_speedup=0.0)
    assert res.report["matmul_schedule"]["from_records"] == 1 and res.report["matmul_schedule"]["changed"] == 1
    import onnxruntime as ort

    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, said = run_written(out, x, tmp_path)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert said["calls"], "the kernels did not run"
    # the written kernel is the recorded point's: its packed B in panels of that tile's vectors
    m = onnx.load(str(out))
    packed = [t for t in m.graph.initializer if t.name.endswith("__packed_b")]
    assert packed and packed[0].dims[-1] == other["tile"][1] * lanes


def test_onnxopt_tune_fills_the_records(tmp_path):
    path, _ = _mlp(tmp_path, M=32, K=256, N=160)  # 2.6 MFLOP: above choose.MIN_FLOPS
    cache_path = tmp_path / "costs.sqlite"
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "onnxopt", "tune", str(path), "--trials", "12", "--threads", "1",
                        "--cost-cache", str(cache_path), "--json"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (p,) = doc["problems"]
    assert p["shape"] == [1, 32, 256, 160] and p["trials"] == 12 and p["best_s"] <= p["default_s"]
    cache = CostCache(cache_path)
    target_key = f"{TARGET.name}|{TARGET.cpu}|{TARGET.llvm_features}"
    recs = cache.get_records(KIND, (1, 32, 256, 160), target_key, "float32", 1)
    assert len(recs) >= 12 and any(s for _, s in recs)
    # run again, the records are reused (nothing measured); --retune searches again
    for extra, reused in (([], True), (["--retune"], False)):
        r = subprocess.run([sys.executable, "-m", "onnxopt", "tune", str(path), "--trials", "4", "--threads", "1",
                            "--cost-cache", str(cache_path), "--json", *extra], capture_output=True, text=True,
                           env=env, timeout=600)
        (again,) = json.loads(r.stdout)["problems"]
        assert again.get("reused", False) is reused and again["trials"] == (0 if reused else 4), again
        assert again["best_s"] <= p["best_s"] * (1.0 if reused else 10.0)


@pytest.mark.parametrize("args,says", [(["missing.onnx"], "no such file"), (["{model}", "--trials", "0"], "--trials"),
                                       (["{model}", "--target", "aarch64"], "--target")])
def test_onnxopt_tune_refuses_bad_input(tmp_path, args, says):
    path, _ = _mlp(tmp_path, M=8, K=16, N=16)
    argv = [a.format(model=path) for a in args]
    r = subprocess.run([sys.executable, "-m", "onnxopt", "tune", *argv, "--cost-cache", str(tmp_path / "c.sqlite")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_tuner_sees_matmuls_behind_an_exporters_shape_arithmetic(tmp_path):
    """Position embeddings sliced by indices the graph computes (Shape -> Gather -> Slice, as torch's exporter
    writes BERT's) hide the matmul's rows until the constants are folded with the input's dims fixed: `onnxopt
    tune` folds them first, as optimize does, and finds the matmul."""
    from onnx import helper, numpy_helper

    from onnxopt.graph.load import fix_input_shapes, load_model
    from onnxopt.tune.heron.tune_model import matmul_problems, prepared_model

    consts = [numpy_helper.from_array(np.ones((256, 160), np.float32), "w"),
              numpy_helper.from_array(np.ones((512, 256), np.float32), "positions"),
              numpy_helper.from_array(np.arange(512, dtype=np.int64)[None], "position_ids"),
              numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array(1, np.int64), "one"),
              numpy_helper.from_array(np.array(2, np.int64), "two")]
    # the position embeddings of the input's length, sliced by indices the graph computes (as torch's exporter
    # writes BERT's): Slice(position_ids, 0, seq, axis rank - 2)
    node = helper.make_node
    g = helper.make_graph([node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "one"], ["seq"]),
                           node("Unsqueeze", ["seq", "zero"], ["ends"]), node("Size", ["shape"], ["rank"]),
                           node("Sub", ["rank", "two"], ["axis"]), node("Unsqueeze", ["axis", "zero"], ["axes"]),
                           node("Slice", ["position_ids", "zero", "ends", "axes"], ["ids"]),
                           node("Gather", ["positions", "ids"], ["embedded"]),
                           node("Add", ["x", "embedded"], ["x2"]), node("MatMul", ["x2", "w"], ["y"])], "exported",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", 256])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], consts)
    path = tmp_path / "exported.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    unfolded = load_model(str(path)).model
    fix_input_shapes(unfolded, {"x": [1, 32, 256]})
    assert matmul_problems(unfolded, TARGET) == []
    assert matmul_problems(prepared_model(str(path), {"x": [1, 32, 256]}), TARGET) == [(1, 32, 256, 160)]
