"""Whole models against onnxruntime and OpenVINO, each at float32 and at its default (lower) precision.

    python benchmarks/openvino_compare.py MODEL.onnx[:input=d0,d1,...] ... [--threads 2] [--rounds 15] [--out DIR]
        [--precisions fp32,bf16]

For each float32 model: onnxruntime fp32; OpenVINO's CPU plugin at its default precision (its INFERENCE_PRECISION_HINT:
bf16 where the CPU has avx512_bf16 or AMX) and at f32; onnxopt's written files at `--precision fp32` and `bf16`
(built by `onnxopt.optimize(..., threads=N)`, measurement on, loaded through `onnxopt.runtime`, their kernels
counted). All run on the same random inputs, timed taking turns (benchmarks/precision_gemms.py `interleaved`), and
each output is compared with onnxruntime fp32's (max |diff| / max |reference|): the lower precisions' error side by
side. Needs `pip install openvino`; prints one JSON line a model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from precision_gemms import interleaved, session_options  # noqa: E402

import onnxopt  # noqa: E402
import onnxopt.runtime as rt  # noqa: E402
from onnxopt.errors import VerificationError  # noqa: E402

_NP = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def feeds_for(session, shapes: dict, rng) -> dict:
    out = {}
    for i in session.get_inputs():
        shape = shapes.get(i.name) or [d if isinstance(d, int) else 1 for d in i.shape]
        dtype = _NP[i.type]
        out[i.name] = (rng.standard_normal(shape).astype(dtype) if dtype == np.float32
                       else rng.integers(0, 2, shape).astype(dtype))  # token ids / masks: small valid values
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    ap.add_argument("--precisions", default="fp32,bf16", help="onnxopt's builds to time (fp32 alone: float32 only)")
    a = ap.parse_args(argv)
    import openvino as ov

    folder = a.out or tempfile.mkdtemp(prefix="openvino-compare-")
    os.makedirs(folder, exist_ok=True)
    core = ov.Core()
    for spec in a.models:
        path, _, shape_text = spec.partition(":")
        shapes = {}
        for item in filter(None, shape_text.split(";")):
            name, dims = item.split("=")
            shapes[name] = [int(d) for d in dims.split(",")]
        name = os.path.splitext(os.path.basename(path))[0]
        reference = ort.InferenceSession(path, session_options(a.threads), providers=["CPUExecutionProvider"])
        feeds = feeds_for(reference, shapes, np.random.default_rng(0))
        want = reference.run(None, feeds)
        calls, labels, outputs = [lambda: reference.run(None, feeds)], ["onnxruntime_fp32"], [want]
        for hint in (None, "f32"):
            config = {"INFERENCE_NUM_THREADS": a.threads, "PERFORMANCE_HINT": "LATENCY"}
            if hint:
                config["INFERENCE_PRECISION_HINT"] = hint
            model = core.read_model(path)
            if shapes:
                model.reshape({k: ov.PartialShape(v) for k, v in shapes.items()})
            compiled = core.compile_model(model, "CPU", config)
            request = compiled.create_infer_request()
            label = f"openvino_{hint or compiled.get_property('INFERENCE_PRECISION_HINT').to_string()}"
            ov_feeds = dict(feeds)
            result = request.infer(ov_feeds)
            outputs.append([result[o] for o in compiled.outputs])
            calls.append(lambda request=request, ov_feeds=ov_feeds: request.infer(ov_feeds))
            labels.append(label if hint is None else "openvino_f32")
        for precision in a.precisions.split(","):
            out = os.path.join(folder, f"{name}_{precision}.onnx")
            given = [f"{k}:{','.join(map(str, v))}" for k, v in shapes.items()] or None
            try:
                res = onnxopt.optimize(path, out, precision=precision, threads=a.threads, input_shape=given)
            except VerificationError as e:  # bf16 past its tolerance on this model: what auto keeps
                print(f"{name}: bf16 refused ({str(e)[:160]}...); measuring --precision auto", file=sys.stderr)
                precision = "auto"
                res = onnxopt.optimize(path, out, precision="auto", threads=a.threads, input_shape=given)
            if res.library is None:  # written unchanged: it runs as onnxruntime does
                s = ort.InferenceSession(out, session_options(a.threads), providers=["CPUExecutionProvider"])
            else:
                s = rt.InferenceSession(out, session_options(a.threads))
            outputs.append(s.run(None, feeds))
            if res.library is not None and not sum(rt.kernel_calls(rt.registered_library(s, loadable=True)).values()):
                raise SystemExit(f"{out}: its kernels did not run")
            calls.append(lambda s=s: s.run(None, feeds))
            lowered = (res.report.get("precision") or {}).get("written", {}).get("lowered_regions", 0)
            labels.append(f"onnxopt_{precision}" + ("" if res.library else "_unchanged"))
            if precision != "fp32":
                labels[-1] += f"({lowered} bf16 kernels)"
        times = interleaved(calls, a.rounds)
        row = {"model": name, "threads": a.threads}
        for label, t, got in zip(labels, times, outputs):
            err = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))) /
                            max(float(np.max(np.abs(w))), 1e-30)) for g, w in zip(got, want))
            row[label] = {"ms": round(t * 1e3, 3), "max_rel_err": float(f"{err:.3g}")}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
