"""Chimera's batched GEMM chains (Table IV, G1-G12) as one kernel against onnxruntime's two MatMuls.

    python benchmarks/gemm_chains.py [--threads 2] [--min-time 2] [--middle relu|softmax]

Per chain: MatMul(A [b, M, K], B [b, K, L]) -> MatMul(., D [b, L, N]) with A, B and D graph inputs (the notes'
protocol, ../shared/notes/chimera.md section 6), onnxruntime with all its graph optimizations against the same model
with the chain as the attention kind's kernel without its softmax (our library registered), timed interleaved in
one process. `--middle` puts a Relu or a Softmax between the products (Chimera's BMM-softmax-BMM family). Prints the
medians, the ratio, each side's GFLOP/s and the geomean.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from onnxopt.kinds.attention import KIND  # noqa: E402
from onnxopt.models.conv_shapes import CHIMERA_GEMM_CHAINS, gemm_chain_model  # noqa: E402
from onnxopt.timing import make_session, time_interleaved  # noqa: E402


def main(argv=None) -> None:
    from kind_harness import fuse_kind

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=2.0)
    ap.add_argument("--middle", choices=("relu", "softmax"), default=None)
    a = ap.parse_args(argv)
    print("| chain | b x M x N x K x L | onnxruntime us | onnxopt us | speedup | onnxruntime GFLOP/s | "
          "onnxopt GFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        for name, chain in CHIMERA_GEMM_CHAINS.items():
            batch, m, n, k, l = chain.batch, chain.m, chain.n, chain.k, chain.l
            model = onnx.shape_inference.infer_shapes(gemm_chain_model(chain, middle=a.middle))
            fused, lib, region, _ = fuse_kind(KIND, model, folder, name=f"{name}.so")
            rng = np.random.default_rng(0)
            feeds = {"A": rng.standard_normal((batch, m, k)).astype(np.float32),
                     "B": rng.standard_normal((batch, k, l)).astype(np.float32),
                     "D": rng.standard_normal((batch, l, n)).astype(np.float32)}
            sessions = [make_session(model, a.threads), make_session(fused, a.threads, library=lib)]
            want, got = (s.run(None, feeds)[0] for s in sessions)
            err = float(np.abs(got - want).max() / np.abs(want).max())
            assert err < 1e-4, (name, err)
            t = [r["median"] for r in time_interleaved(sessions, feeds, min_time=a.min_time, max_blocks=100000)]
            flops = 2.0 * batch * m * l * (k + n)
            ratios.append(t[0] / t[1])
            print(f"| {name} | {batch} x {m} x {n} x {k} x {l} | {t[0] * 1e6:.0f} | {t[1] * 1e6:.0f} | "
                  f"{t[0] / t[1]:.2f}x | {flops / t[0] / 1e9:.1f} | {flops / t[1] / 1e9:.1f} |", flush=True)
    print(f"geomean speedup {np.exp(np.mean(np.log(ratios))):.2f}x, lowest {min(ratios):.2f}x")


if __name__ == "__main__":
    main()
