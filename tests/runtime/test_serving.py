"""Serving: the library is registered only when it is safe, and the answers are the same with or without it."""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxopt
import onnxopt.runtime as rt
from onnxopt.models import build_model


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    src = str(d / "mbv3.onnx")
    onnx.save(build_model("mobilenetv3", image_size=64), src)
    out = str(d / "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False)
    assert res.report["fused_regions"] > 0
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    return d, src, out, x, want


def test_runtime_session_uses_library_and_matches(optimized):
    d, src, out, x, want = optimized
    assert os.path.exists(out + ".so")
    with warnings.catch_warnings():
        warnings.simplefilter("error", rt.LibraryNotUsedWarning)
        sess = rt.InferenceSession(out)
    got = sess.run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fresh_process_with_only_onnxruntime(optimized):
    """Any ORT host: register the library by path, nothing of onnxopt or llvmlite imported."""
    d, src, out, x, want = optimized
    np.save(d / "x.npy", x)
    np.save(d / "want.npy", want)
    code = textwrap.dedent(f"""
        import sys, numpy as np, onnxruntime as ort
        so = ort.SessionOptions()
        so.register_custom_ops_library({out + '.so'!r})
        s = ort.InferenceSession({out!r}, so, providers=["CPUExecutionProvider"])
        y = s.run(None, {{"input": np.load({str(d / 'x.npy')!r})}})[0]
        assert not any(m.startswith(("onnxopt", "llvmlite")) for m in sys.modules), "imported onnxopt/llvmlite"
        np.testing.assert_allclose(y, np.load({str(d / 'want.npy')!r}), rtol=1e-4, atol=1e-5)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(d))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_plain_onnxruntime_without_library_runs_function_bodies(optimized):
    d, src, out, x, want = optimized
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_missing_or_tampered_library_warns_and_falls_back(optimized, tmp_path):
    d, src, out, x, want = optimized
    m = onnx.load(out)
    moved = str(tmp_path / "fused.onnx")
    onnx.save(m, moved)  # the library is not next to it
    with pytest.warns(rt.LibraryNotUsedWarning, match="not found"):
        sess = rt.InferenceSession(moved)
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], want, rtol=1e-4, atol=1e-5)
    with open(moved + ".so", "wb") as f:
        f.write(open(out + ".so", "rb").read() + b"\0")
    with pytest.warns(rt.LibraryNotUsedWarning, match="does not match"):
        sess = rt.InferenceSession(moved)
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], want, rtol=1e-4, atol=1e-5)


def test_library_for_missing_cpu_feature_is_not_loaded(tmp_path, monkeypatch):
    """Compiled for Sapphire Rapids, loaded on a CPU without its AVX-512 FP16 and BF16: loads, warns, and answers
    right through the functions. The host is made to lack them on every machine (ONNXOPT_HOST_LEVEL caps the
    features the loader sees), so the test runs on such hosts too. AMX itself is not a requirement: the library
    checks it at run time and carries kernels without it (codegen/isa.py DISPATCHED_AT_RUN_TIME)."""
    from onnxopt.codegen.target import host_cpu_flags

    monkeypatch.setenv("ONNXOPT_HOST_LEVEL", "x86-64-v4")
    assert "avx512_fp16" not in host_cpu_flags()
    src = str(tmp_path / "m.onnx")
    onnx.save(build_model("mobilenetv3", image_size=32), src)
    out = str(tmp_path / "spr.onnx")
    res = onnxopt.optimize(src, out, target="cpu=sapphirerapids", measure=False)
    assert res.report["fused_regions"] > 0 and "kernels_not_run" in res.report
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    flags = meta["onnxopt.cpu_flags"].split(",")
    assert "avx512_fp16" in flags and not any(f.startswith("amx") for f in flags)
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with pytest.warns(rt.LibraryNotUsedWarning, match="lacks .*avx512_fp16"):
        sess = rt.InferenceSession(out)
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], want, rtol=1e-4, atol=1e-5)


def test_library_for_an_amx_target_runs_its_kernels_without_amx(tmp_path, monkeypatch):
    """AVX-512 plus AMX, loaded on an AVX-512 CPU without AMX (made so on every host): the kernels run."""
    from onnxopt.codegen.target import host_cpu_flags

    if "avx512f" not in host_cpu_flags():
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setenv("ONNXOPT_HOST_LEVEL", "x86-64-v4")
    src = str(tmp_path / "m.onnx")
    onnx.save(build_model("mobilenetv3", image_size=32), src)
    out = str(tmp_path / "amx.onnx")
    res = onnxopt.optimize(src, out, target="cpu=x86-64-v4,+amx-tile,+amx-int8", measure=False)
    assert res.report["fused_regions"] > 0 and "kernels_not_run" not in res.report
    sess = rt.InferenceSession(out)
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    sess.run(None, {"input": x})
    assert sum(rt.kernel_calls(rt.registered_library(sess, loadable=True)).values()) > 0


def test_two_models_share_one_process(tmp_path):
    """Content-hashed op types: two optimized models with their own libraries in one process."""
    outs = []
    for name, kw in (("mobilenetv3", {"image_size": 32}), ("yolo", {"image_size": 64})):
        src = str(tmp_path / f"{name}.onnx")
        onnx.save(build_model(name, **kw), src)
        out = str(tmp_path / f"{name}_fused.onnx")
        onnxopt.optimize(src, out, measure=False)
        outs.append((src, out, kw["image_size"]))
    for src, out, size in outs:
        x = np.random.default_rng(2).standard_normal((1, 3, size, size)).astype(np.float32)
        name = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).get_inputs()[0].name
        want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {name: x})
        got = rt.InferenceSession(out).run(None, {name: x})
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
