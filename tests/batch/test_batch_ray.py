"""`--ray`: the same per-model jobs as tasks of a real local Ray cluster, started and stopped by this test."""

import os

import pytest
from batch_models import add_relu_mul, conv_relu, tree_hashes

from onnxopt.batch import run_batch


def test_two_models_as_ray_tasks(tmp_path, quick_kwargs):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install onnxopt[ray]")
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    add_relu_mul(zoo / "a.onnx")
    conv_relu(zoo / "sub" / "b.onnx")
    sources = tree_hashes(zoo)
    # Our own cluster in this process (its processes end with ray.shutdown); "auto" then uses it.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        result = run_batch([str(zoo)], str(out), ray="auto", bench_time=0.2, **quick_kwargs)
        assert ray.is_initialized()  # run_batch leaves a cluster it did not start alone
    finally:
        ray.shutdown()
    by = {m["model"]: m for m in result.records}
    # kept untimed as a whole (--min-speedup 0): the bench decides whether each may be called optimized
    assert {k: m["status"] for k, m in by.items()} == {
        k: "optimized" if m["bench"]["speedup"] >= 1 else "slower" for k, m in by.items()}
    assert set(by) == {"a.onnx", "sub/b.onnx"}
    assert result.exit_code == 0 and by["a.onnx"]["bench"]["speedup"] > 0
    assert os.path.isfile(out / "sub" / "b.onnx.so") and os.path.isfile(out / "report.html")
    assert result.report["options"]["ray"] == "auto"
    # the driver kept the state: a rerun (local now) skips both
    again = run_batch([str(zoo)], str(out), **quick_kwargs)
    assert [m["status"] for m in again.records] == ["skipped", "skipped"]
    assert tree_hashes(zoo) == sources
