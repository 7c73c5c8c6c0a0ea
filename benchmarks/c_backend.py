"""The C backend's kernels against the LLVM backend's and onnxruntime, on the kinds both lower.

    python benchmarks/c_backend.py [--threads 2] [--min-time 4]
    python benchmarks/c_backend.py --corpus ~/.cache/onnxopt/corpus-small   # the C backend over the float corpus

Per case (an elementwise chain, softmax rows, a residual LayerNorm, at transformer and CNN sizes) the model is
optimized twice with every correct kernel kept (`min_speedup=0`, no sequences): `--target native` (LLVM IR) and
`--target c` (plain C through the system compiler, `-O3` with the target's `-m` flags). The original and the two
written models, each loaded as a user loads it, are then timed interleaved in one process. With --corpus, every
float model of a `benchmarks/corpus.py` folder is optimized with `--target c` (no measurement: every correct kernel
kept) and the table says what was fused and that the written files were verified with and without the library.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.runtime import written_session
from onnxopt.timing import make_session, time_interleaved

F = TensorProto.FLOAT


def _model(nodes, shape, inits=(), extra_inputs=()):
    ins = [helper.make_tensor_value_info("x", F, shape)] + [helper.make_tensor_value_info(n, F, shape)
                                                          for n in extra_inputs]
    m = helper.make_model(helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, shape)],
                                            list(inits)), opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def cases():
    rng = np.random.default_rng(0)
    silu = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    gelu = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Add", ["a", "x"], ["b"]),
            helper.make_node("Relu", ["b"], ["y"])]
    yield "SiLU 1x64x56x56", _model(silu, [1, 64, 56, 56])
    yield "x*x+x, Relu 1x128x768", _model(gelu, [1, 128, 768])
    yield "softmax 12x128x128", _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [12, 128, 128])
    g = numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "g")
    b = numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "b")
    ln = [helper.make_node("Add", ["x", "r"], ["a"]),
          helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1)]
    yield "residual LayerNorm 1x128x768", _model(ln, [1, 128, 768], [g, b], ["r"])


QUANTIZED = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger"}


def corpus(folder: Path, threads: int) -> None:
    print("| model | regions checked (elementwise / softmax / layernorm) | kernel calls, one run of the written model | "
          "verified with the library / without |\n|---|---|---|---|")
    for e in json.loads((folder / "manifest.json").read_text()):
        path = folder / e["file"]
        if QUANTIZED & {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}:
            continue
        with tempfile.TemporaryDirectory() as d:
            r = onnxopt.optimize(str(path), os.path.join(d, "f.onnx"), target="c", measure=False, threads=threads,
                                 verify_fallback=True, cost_cache=False).report
        kinds = [reg["op_type"].rsplit("_", 1)[0].lower() for reg in r["regions"]]
        v, fb = r.get("verification", {}), r.get("fallback_verification", {})
        counts = " / ".join(str(kinds.count(k)) for k in ("elementwise", "softmax", "layernorm"))
        print(f"| {path.stem} | {counts} | {v.get('kernel_calls') or 0} | {v.get('ok')} / {fb.get('ok')} |",
              flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=4.0)
    ap.add_argument("--corpus", type=Path, help="a benchmarks/corpus.py folder: the C backend over its float models")
    a = ap.parse_args(argv)
    if a.corpus:
        return corpus(a.corpus, a.threads)
    print("| case | onnxruntime ms | LLVM ms | C ms | LLVM / ORT | C / ORT | C / LLVM |\n|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in cases():
            src = os.path.join(tmp, "m.onnx")
            onnx.save(model, src)
            outs = []
            for target in ("native", "c"):
                out = os.path.join(tmp, target, f"{len(os.listdir(tmp))}.onnx")
                os.makedirs(os.path.dirname(out), exist_ok=True)
                onnxopt.optimize(src, out, target=target, min_speedup=0, sequences=False, threads=a.threads,
                                 cost_cache=False)
                outs.append(out)
            feeds = {i.name: np.random.default_rng(1).standard_normal(
                [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
            sessions = [make_session(src, a.threads)] + [written_session(o, a.threads) for o in outs]
            t = [r["median"] * 1e3 for r in time_interleaved(sessions, feeds, min_time=a.min_time)]
            print(f"| {name} | {t[0]:.3f} | {t[1]:.3f} | {t[2]:.3f} | {t[0] / t[1]:.2f}x | {t[0] / t[2]:.2f}x | "
                  f"{t[1] / t[2]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
