"""The backend protocol (onnxopt/backends): targets name their backend, the driver asks the backend for what it
does, and the C backend runs end to end here (compile, link, feed, time, check, fallback) as the LLVM one does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxopt
from onnxopt.backends import backend_named, backend_of, parse_target
from onnxopt.backends.c import cpu_flags
from onnxopt.errors import UsageError

F = TensorProto.FLOAT


@pytest.mark.parametrize("spec,backend,name", [("native", "llvm", "native"), (None, "llvm", "native"),
                                               ("x86-64-v3", "llvm", "x86-64-v3"), ("c", "c", "c:native"),
                                               ("c:x86-64-v3", "c", "c:x86-64-v3"), ("cuda:sm_90", "cuda", "cuda:sm_90")])
def test_a_target_names_its_backend(spec, backend, name):
    if spec and "x86-64" in spec and os.uname().machine != "x86_64":
        pytest.skip("an x86-64 level is a target on x86-64 hosts")
    t = parse_target(spec)
    assert t.backend == backend and t.name == name and backend_of(t).name == backend
    assert t.to_dict()["backend"] == backend


def test_bad_targets_say_what_to_give():
    for spec in ("c:cpu=znver3", "cuda:sm_42", "c:aarch64"):
        with pytest.raises(UsageError, match="give|take"):
            parse_target(spec)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 levels")
def test_the_c_backends_vector_width_comes_from_the_target():
    v3, v4 = cpu_flags(parse_target("c:x86-64-v3")), cpu_flags(parse_target("c:x86-64-v4"))
    assert "-mavx2" in v3 and "-mfma" in v3 and not any("avx512" in f for f in v3)
    assert "-mavx512f" in v4 and "-mprefer-vector-width=512" in v4
    assert "-march=native" not in v3 + v4  # never the host's


@pytest.mark.skipif(os.uname().machine != "x86_64" or not shutil.which("objdump"), reason="x86-64 and objdump")
def test_a_c_kernel_for_an_avx2_target_has_no_avx512_code(tmp_path):
    from onnxopt.backends.c.elementwise import program_source
    from onnxopt.backends.c import compile_c
    from onnxopt.fusion.region import EwOp, EwProgram, Value

    prog = EwProgram([Value("x", "float32"), Value("y", "float32")], {},
                     [EwOp("Mul", ("x", "y"), "m", "float32"), EwOp("Add", ("m", "x"), "z", "float32")],
                     [Value("z", "float32")], masks=[3])
    source, variants, generic = program_source(prog, "k")
    assert [v for _, v in variants] == ["k_m3"] and generic == "k_g"
    for spec, zmm in (("c:x86-64-v3", False), ("c:x86-64-v4", True)):
        obj = tmp_path / f"{spec[2:]}.o"
        obj.write_bytes(compile_c(source, parse_target(spec)))
        asm = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True).stdout
        assert ("zmm" in asm) == zmm, spec
        assert "ymm" in asm


def _model(path, external: bool = False):
    x = helper.make_tensor_value_info("x", F, [2, 16, 96])
    r = helper.make_tensor_value_info("r", F, [2, 16, 96])
    y = helper.make_tensor_value_info("y", F, [2, 16, 96])
    rng = np.random.default_rng(0)
    g = onnx.numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "g")
    b = onnx.numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b")
    nodes = [helper.make_node("Mul", ["x", "x"], ["m"]), helper.make_node("Tanh", ["m"], ["t"]),
             helper.make_node("Add", ["t", "r"], ["a"]),
             helper.make_node("LayerNormalization", ["a", "g", "b"], ["ln"], axis=-1),
             helper.make_node("Softmax", ["ln"], ["y"], axis=-1)]
    m = helper.make_model(helper.make_graph(nodes, "g", [x, r], [y], [g, b]),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    if external:  # the weights in a file beside the model, as big exports are saved
        onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data",
                  size_threshold=0)
    else:
        onnx.save(m, path)


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_the_c_backend_end_to_end(tmp_path, external):
    """Compiled, linked, checked and timed by the driver; the written files loaded by a user in a fresh process,
    whose library counts one Compute call per fused node, and run without the library; the compute kinds it has no
    lowering for left to onnxruntime."""
    src = str(tmp_path / "m.onnx")
    _model(src, external)
    out = str(tmp_path / "out" / "fused.onnx")
    os.makedirs(os.path.dirname(out))
    res = onnxopt.optimize(src, out, target="c", min_speedup=0, threads=2, sequences=False)
    kinds = sorted(r["op_type"].rsplit("_", 1)[0] for r in res.report["regions"])
    assert kinds == ["Elementwise", "layernorm", "softmax"], kinds
    assert all(r.get("speedup") for r in res.report["regions"])  # each kernel timed against onnxruntime
    assert res.report["verification"]["kernel_calls"] == 3
    x = np.random.default_rng(1).standard_normal([2, 16, 96]).astype(np.float32)
    r = np.random.default_rng(2).standard_normal([2, 16, 96]).astype(np.float32)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": x, "r": r})[0]
    code = ("import sys, numpy as np, onnxopt.runtime as rt\n"
            "from onnxopt.runtime.kernel_calls import kernel_calls\n"
            "s = rt.InferenceSession(sys.argv[1]); lib = rt.registered_library(s, loadable=True); assert lib\n"
            "x = np.load(sys.argv[2]); r = np.load(sys.argv[3])\n"
            "np.save(sys.argv[4], s.run(None, {'x': x, 'r': r})[0])\n"
            "assert sum(kernel_calls(lib).values()) == 3, kernel_calls(lib)\n")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "r.npy", r)
    subprocess.run([sys.executable, "-c", code, out, str(tmp_path / "x.npy"), str(tmp_path / "r.npy"),
                    str(tmp_path / "got.npy")], check=True, cwd=str(tmp_path))
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), want, rtol=1e-4, atol=1e-5)
    alone = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x, "r": r})[0]
    np.testing.assert_allclose(alone, want, rtol=1e-5, atol=1e-6)


def test_a_cuda_target_is_refused_with_what_to_do(tmp_path):
    src = str(tmp_path / "m.onnx")
    _model(src)
    r = subprocess.run([sys.executable, "-m", "onnxopt", src, "-o", str(tmp_path / "o.onnx"), "--target",
                        "cuda:sm_90"], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "CUDA" in r.stderr and "CPU target" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "o.onnx")


def test_the_cuda_backend_cannot_link_yet_and_says_why():
    cuda = backend_named("cuda")
    with pytest.raises(Exception, match="GPU issue"):
        cuda.link([], [], parse_target("cuda:sm_90"), "/nonexistent/lib.so")
    assert cuda.layout(parse_target("cuda:sm_90")) is None


def test_the_c_backends_exp_is_within_2_ulp_and_keeps_the_special_values(tmp_path):
    """kernel.h's vectorizable expf over every exponent range, against float64 exp rounded to float32."""
    import ctypes

    from onnxopt.backends.c import compile_c
    from onnxopt.codegen.glue.library import _cc

    source = ('#include "kernel.h"\nvoid ex(const float *x, float *y, int64_t n) {\n'
              "  for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);\n}\n")
    obj = tmp_path / "ex.o"
    obj.write_bytes(compile_c(source, parse_target("c")))
    so = tmp_path / "ex.so"
    subprocess.run([_cc(), "-shared", "-o", str(so), str(obj)], check=True)
    lib = ctypes.CDLL(str(so))
    x = np.concatenate([np.linspace(-104, 89, 200001, dtype=np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, -87.3, -103.9, -104.0, 1e-30],
                                 np.float32)])
    y = np.empty_like(x)
    lib.ex(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(y), np.isnan(want)) and np.array_equal(np.isinf(y), np.isinf(want))
    finite = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)  # normal results: ulps
    ulp = np.abs(y[finite].view(np.int32).astype(np.int64) - want[finite].view(np.int32).astype(np.int64))
    assert ulp.max() <= 2, (ulp.max(), x[finite][ulp.argmax()])
    sub = np.isfinite(want) & (want < np.finfo(np.float32).tiny)  # denormal results: within a denormal step
    assert np.all(np.abs(y[sub] - want[sub]) <= 2 * np.finfo(np.float32).smallest_subnormal)


def test_each_host_backend_compiles_its_source_to_an_object():
    """The protocol's compile: LLVM IR text for the llvm backend, C for the c backend, both ELF objects of the
    target's machine."""
    from onnxopt.codegen.compile import new_module

    target = parse_target("native")
    module = new_module(target, "k")
    module.triple = target.triple
    llvm_obj = backend_named("llvm").compile(str(module) + "define void @k() {\n  ret void\n}\n", target)
    c_obj = backend_named("c").compile("void k(void) {}\n", parse_target("c"))
    for obj in (llvm_obj, c_obj):
        assert obj[:4] == b"\x7fELF"
