"""A transformer's projection and FFN GEMMs alone: the fused kernel (a MatMul with its constant B packed in panels,
and its epilogue) against onnxruntime running the same ops (MLAS).

    python benchmarks/transformer_gemms.py [--threads 2] [--min-time 2] [--seqs 128,512] [--hidden 768]

Per sequence length, BERT-base's shapes (batch 1): the Q/K/V/output projection (hidden x hidden + bias), the FFN's
first GEMM (hidden x 4 hidden + bias + GELU through Erf) and its second (4 hidden x hidden + bias + the residual Add),
and Q, K and V's projections merged into one GEMM (hidden x 3 hidden + bias), printed beside three projections'
time: what merging them would save.
Tokens are a symbolic dim, as in the exports. onnxopt builds each with the speed check off (so its kernel is always
the one timed); both models run through onnxruntime (all graph optimizations, the same threads, spinning off),
interleaved in one process. Prints the medians, the ratio (onnxruntime / onnxopt: above 1 means onnxopt is faster),
both sides' GFLOP/s (2 M N K) and onnxopt's fraction of the machine model's measured fp32 peak for that many threads.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxopt import optimize
from onnxopt.hardware.measure import load_machine
from onnxopt.timing import make_session, time_interleaved


def gemm_model(k: int, n: int, epilogue: str, seed: int = 0):
    """x [1, tokens, k] @ W [k, n] + b, then `epilogue`: "bias", "gelu" (erf form) or "residual" (+ r)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), "b")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "tokens", k])]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y0"])]
    out = "y0"
    if epilogue == "gelu":
        for name, v in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)):
            inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
        nodes += [helper.make_node("Div", ["y0", "sqrt2"], ["g1"]), helper.make_node("Erf", ["g1"], ["g2"]),
                  helper.make_node("Add", ["g2", "one"], ["g3"]), helper.make_node("Mul", ["y0", "g3"], ["g4"]),
                  helper.make_node("Mul", ["g4", "half"], ["y"])]
        out = "y"
    elif epilogue == "residual":
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, "tokens", n]))
        nodes.append(helper.make_node("Add", ["y0", "r"], ["y"]))
        out = "y"
    g = helper.make_graph(nodes, "gemm", ins, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=2.0)
    p.add_argument("--seqs", default="128,512")
    p.add_argument("--hidden", type=int, default=768)
    a = p.parse_args(argv)
    machine = load_machine()
    peak = machine.peak_flops["float32"] * min(a.threads, machine.cores) / machine.cores
    h = a.hidden
    shapes = [("projection", h, h, "bias"), ("ffn1+gelu", h, 4 * h, "gelu"), ("ffn2+residual", 4 * h, h, "residual"),
              ("qkv merged", h, 3 * h, "bias")]
    ratios = []
    projection = {}  # seq -> (onnxruntime, onnxopt) medians of one projection
    print(f"fp32 peak for {a.threads} threads (machine model): {peak / 1e9:.1f} GFLOP/s")
    with tempfile.TemporaryDirectory() as tmp:
        for name, k, n, epilogue in shapes:
            model = gemm_model(k, n, epilogue)
            r = optimize(model, output=os.path.join(tmp, f"{name}.onnx"), measure=False, threads=a.threads)
            if not any(nd.domain == "onnxopt" for nd in r.model.graph.node):
                print(f"{name}: not fused ({r.report['rejected']})")
                continue
            s0 = make_session(model, a.threads)
            s1 = make_session(r.model, a.threads, library=r.library)
            for seq in (int(s) for s in a.seqs.split(",")):
                rng = np.random.default_rng(seq)
                feeds = {"x": rng.standard_normal((1, seq, k)).astype(np.float32)}
                if epilogue == "residual":
                    feeds["r"] = rng.standard_normal((1, seq, n)).astype(np.float32)
                want, got = s0.run(None, feeds)[0], s1.run(None, feeds)[0]
                err = float(np.max(np.abs(want - got)))
                t0, t1 = time_interleaved([s0, s1], feeds, min_time=a.min_time, max_blocks=60)
                flops = 2.0 * seq * k * n
                ratio = t0["median"] / t1["median"]
                ratios.append(ratio)
                if name == "projection":
                    projection[seq] = (t0["median"], t1["median"])
                print(f"{name:14s} seq {seq:4d} {k:5d}x{n:<5d} onnxruntime {t0['median'] * 1e3:7.3f} ms "
                      f"({flops / t0['median'] / 1e9:6.1f} GFLOP/s)  onnxopt {t1['median'] * 1e3:7.3f} ms "
                      f"({flops / t1['median'] / 1e9:6.1f} GFLOP/s, {flops / t1['median'] / peak:4.0%} of peak)  "
                      f"ratio {ratio:5.3f}  max abs diff {err:.2g}", flush=True)
                if name == "qkv merged" and seq in projection:
                    p0, p1 = projection[seq]
                    print(f"{'':14s} three projections / one merged GEMM: onnxruntime {3 * p0 / t0['median']:.3f}x, "
                          f"onnxopt {3 * p1 / t1['median']:.3f}x", flush=True)
    if ratios:
        print(f"geomean ratio {math.exp(np.mean(np.log(ratios))):.3f}, min {min(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
