"""Transformer GEMMs (MatMul + bias; M = 128 unless --shapes) in each `--precision`, timed as written files.

    python benchmarks/precision_gemms.py [--threads 2] [--rounds 30] [--out DIR] [--shapes 128x768x768,...]
        [--variants bf16@native,...] [--openvino]

Each model is written by `onnxopt.optimize(..., precision=P, measure=False)` (fp32, bf16 on this CPU, bf16 for
x86-64-v4, which has no avx512_bf16 and so runs the emulated path, and fp16: float16 storage for the float32 kernel
where the CPU has no AMX-FP16), loaded through `onnxopt.runtime` as a
user loads it (its library must be registered and its kernel must run), and all sessions are timed taking turns:
per round each session's best of 5 runs, the median over rounds. Prints one JSON line a shape: times (us), GFLOP/s,
the error against onnxruntime fp32 (max |diff| / max |reference|), and the machine model's peaks (float32 and, where
the CPU has vdpbf16ps, bfloat16) for the fraction of peak. With --openvino (where the openvino package is
installed) OpenVINO's CPU plugin runs the same source model at its default precision (bf16 on a CPU with AMX or
AVX-512 BF16) in the same turns: oneDNN's GEMM on the same shapes and threads, what this machine lets a well-tuned
library reach.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnxopt
import onnxopt.runtime as rt
from onnxopt.hardware.measure import load_machine

VARIANTS = (("fp32", "native"), ("bf16", "native"), ("bf16", "x86-64-v4"), ("fp16", "native"))
SHAPES = ((128, 768, 768), (128, 768, 3072), (128, 3072, 768))


def gemm_model(m: int, k: int, n: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = (rng.standard_normal(n) * 0.1).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def session_options(threads: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def interleaved(calls, rounds: int, per: int = 5) -> list[float]:
    """Seconds of each of `calls` (no-argument functions), taking turns: per round each one's best of `per` runs,
    the median over rounds (other load on the cores hits them alike)."""
    for call in calls:
        for _ in range(3):
            call()
    best = [[] for _ in calls]
    for _ in range(rounds):
        for i, call in enumerate(calls):
            times = []
            for _ in range(per):
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            best[i].append(min(times))
    return [float(np.median(b)) for b in best]


def _openvino(src: str, threads: int, feeds: dict):
    """(a call running `src` on OpenVINO's CPU plugin at its default precision, that precision)."""
    import openvino as ov

    compiled = ov.Core().compile_model(src, "CPU", {"INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    return (lambda: request.infer(feeds)[compiled.output(0)]), str(compiled.get_property("INFERENCE_PRECISION_HINT"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default=None, help="where the written models go (default: a temporary folder)")
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                    help="the GEMMs as M x K x N, comma-separated (default: BERT-base's three at 128 tokens)")
    ap.add_argument("--variants", default=",".join(f"{p}@{t}" for p, t in VARIANTS),
                    help="precision@target of the written models, comma-separated (default: all four)")
    ap.add_argument("--openvino", action="store_true", help="time OpenVINO's default on the same models too")
    a = ap.parse_args(argv)
    variants = [tuple(text.split("@")) for text in a.variants.split(",")]
    shapes = [tuple(int(d) for d in text.split("x")) for text in a.shapes.split(",")]
    folder = a.out or tempfile.mkdtemp(prefix="precision-gemms-")
    os.makedirs(folder, exist_ok=True)
    peaks = load_machine().peak_flops
    for m, k, n in shapes:
        src = os.path.join(folder, f"mm_{m}x{k}x{n}.onnx")
        onnx.save(gemm_model(m, k, n), src)
        feeds = {"x": np.random.default_rng(1).standard_normal((1, m, k)).astype(np.float32)}
        reference = ort.InferenceSession(src, session_options(a.threads), providers=["CPUExecutionProvider"])
        want = reference.run(None, feeds)[0]
        row = {"shape": f"M={m} K={k} N={n}", "threads": a.threads,
               "peak_gflops": {dt: round(v / 1e9, 1) for dt, v in peaks.items() if dt in ("float32", "bfloat16")}}
        sessions = [reference]
        for precision, target in variants:
            name = f"{precision}@{target}"
            out = os.path.join(folder, f"{precision}_{target}_{m}x{k}x{n}.onnx")
            onnxopt.optimize(src, out, precision=precision, target=target, measure=False, threads=a.threads,
                             cost_cache=False, tune_budget=0)
            s = rt.InferenceSession(out, session_options(a.threads))
            if rt.registered_library(s) is None:
                raise SystemExit(f"{out}: its kernel library was not registered")
            got = s.run(None, feeds)[0]
            if not sum(rt.kernel_calls(rt.registered_library(s, loadable=True)).values()):
                raise SystemExit(f"{out}: its kernel did not run")
            row[f"{name}_max_rel"] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            sessions.append(s)
        calls = [lambda s=s: s.run(None, feeds) for s in sessions]
        names = ["onnxruntime_fp32"] + [f"{p}@{t}" for p, t in variants]
        if a.openvino:
            ov_call, ov_precision = _openvino(src, a.threads, feeds)
            got = ov_call()
            row["openvino_max_rel"] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            row["openvino_precision"] = ov_precision
            calls.append(ov_call)
            names.append("openvino")
        times = interleaved(calls, a.rounds)
        flops = 2.0 * m * k * n
        for name, t in zip(names, times):
            row[f"{name}_us"] = round(t * 1e6, 1)
            row[f"{name}_gflops"] = round(flops / t / 1e9, 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
