"""int8 GEMMs alone (dynamic quantization, the qmatmul kind) against onnxruntime's int8 and against fp32.

    python benchmarks/int8_gemms.py [--threads 2] [--min-time 2] [--tokens 128,512]

Per shape (a transformer's projections and FFN: BERT-base 768 x 768, 768 x 3072, 3072 x 768 and BERT-large's
1024 x 1024, 1024 x 4096), the fp32 model x [1, tokens, K] @ W + b is quantized by onnxruntime's
`quantize_dynamic` (s8 weights, u8 activations: DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add), and
four ways of running it are timed interleaved in one process (2 threads, spinning off):

1. onnxruntime, fp32;  2. onnxopt's fp32 kernel (the fp32 model optimized, packed-B GEMM);
3. onnxruntime, int8 (its MatMulIntegerToFloat on MLAS);  4. onnxopt's int8 kernel (the quantized model optimized).

Both int8 columns include the DynamicQuantizeLinear that onnxruntime runs before the GEMM. Printed: milliseconds,
onnxopt int8 / onnxruntime int8, onnxopt int8 / onnxopt fp32 (the issue's "x our fp32 kernel's throughput"), GOP/s
(2 M N K) and the fraction of the machine model's measured int8 peak (hardware/measure.py: chains of the target's
dot-product instruction).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np
import onnx

from onnxopt import optimize
from onnxopt.codegen.instructions import available
from onnxopt.codegen.target import host_target
from onnxopt.hardware.measure import load_machine
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_gemms import gemm_model  # noqa: E402

SHAPES = [(768, 768), (768, 3072), (3072, 768), (1024, 1024), (1024, 4096)]


def int8_peak(threads: int):
    """The machine model's int8 peak for `threads` (None when it has none), after printing it and the instruction."""
    machine = load_machine()
    ins = available(host_target(), ("u8", "s8"))
    peak = machine.peak_flops.get("int8")
    if peak:
        peak *= min(threads, machine.cores) / machine.cores
    print(f"instruction: {ins[0].name if ins else 'none'}; int8 peak for {threads} threads (machine model): "
          f"{peak / 1e9:.0f} GOP/s" if peak else "no measured int8 peak")
    return peak


def row(t: list[float], ops: float, peak, ratios: list, vs_fp32: list) -> str:
    """The timings' columns (onnxruntime fp32, onnxopt fp32, onnxruntime int8, onnxopt int8), their ratios appended."""
    ratios.append(t[2] / t[3])
    vs_fp32.append(t[1] / t[3])
    frac = f", {ops / t[3] / peak:4.0%} of int8 peak" if peak else ""
    return (f"fp32: onnxruntime {t[0] * 1e3:7.3f} ms, onnxopt {t[1] * 1e3:7.3f} ms;  int8: onnxruntime "
            f"{t[2] * 1e3:7.3f} ms, onnxopt {t[3] * 1e3:7.3f} ms ({ops / t[3] / 1e9:5.0f} GOP/s{frac});  int8 vs "
            f"onnxruntime int8 {t[2] / t[3]:.3f}x, vs our fp32 {t[1] / t[3]:.3f}x")


def geomeans(ratios: list, vs_fp32: list) -> None:
    if ratios:
        gm = lambda xs: math.exp(np.mean(np.log(xs)))  # noqa: E731
        print(f"geomean: vs onnxruntime int8 {gm(ratios):.3f}x (min {min(ratios):.3f}), vs our fp32 kernel "
              f"{gm(vs_fp32):.3f}x (min {min(vs_fp32):.3f})")


def main(argv=None) -> int:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=2.0)
    p.add_argument("--tokens", default="128,512")
    a = p.parse_args(argv)
    peak = int8_peak(a.threads)
    ratios, vs_fp32 = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k, n in SHAPES:
            f32 = gemm_model(k, n, "bias")
            fpath, qpath = os.path.join(tmp, f"f{k}_{n}.onnx"), os.path.join(tmp, f"q{k}_{n}.onnx")
            onnx.save(f32, fpath)
            quantize_dynamic(fpath, qpath, weight_type=QuantType.QInt8)
            q = onnx.load(qpath)
            of = optimize(f32, output=os.path.join(tmp, f"of{k}_{n}.onnx"), measure=False, threads=a.threads)
            oq = optimize(q, output=os.path.join(tmp, f"oq{k}_{n}.onnx"), measure=False, threads=a.threads)
            if not any(nd.op_type.startswith("qmatmul_") for nd in oq.model.graph.node):
                print(f"{k}x{n}: no int8 kernel ({oq.report['rejected'][:1]})")
                continue
            sessions = [make_session(f32, a.threads), make_session(of.model, a.threads, library=of.library),
                        make_session(q, a.threads), make_session(oq.model, a.threads, library=oq.library)]
            for tokens in (int(t) for t in a.tokens.split(",")):
                feeds = {"x": np.random.default_rng(tokens).standard_normal((1, tokens, k)).astype(np.float32)}
                t = [r["median"] for r in time_interleaved(sessions, feeds, min_time=a.min_time, max_blocks=60)]
                ops = 2.0 * tokens * k * n
                print(f"{k:5d}x{n:<5d} tokens {tokens:4d}  {row(t, ops, peak, ratios, vs_fp32)}", flush=True)
    geomeans(ratios, vs_fp32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
