"""Standalone compute kernels against onnxruntime: the seeds' conv and GEMM tables, fp32, batch 1.

    python benchmarks/kernels.py [--set unit,chimera-conv,chimera-gemm] [--threads 2] [--json out.json]

Each shape is one op (Conv with bias, or MatMul of two graph inputs). onnxopt optimizes it with the speed check
off (so every kernel is kept and measured, win or lose), then the original and the fused model run through
onnxruntime (ORT_ENABLE_ALL, the same threads, spinning off) interleaved in one process. Reported: both medians,
the ratio (original / fused: above 1 means onnxopt is faster), achieved GFLOP/s and the fraction of the machine
model's measured fp32 peak for that many cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

from onnxopt import optimize
from onnxopt.hardware.measure import load_machine
from onnxopt.models.conv_shapes import CHIMERA_CONVS, CHIMERA_MATMULS, UNIT_CONVS, conv_model, matmul_model
from onnxopt.timing import make_session, time_interleaved
from onnxopt.verify import make_inputs

SETS = {"unit": UNIT_CONVS, "chimera-conv": CHIMERA_CONVS, "chimera-gemm": CHIMERA_MATMULS}


def conv_flops(s) -> float:
    oh, ow = s.out_hw
    return 2.0 * s.batch * s.c_out * oh * ow * (s.c_in // s.groups) * s.kernel * s.kernel


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", default="unit,chimera-conv,chimera-gemm")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--only", help="comma-separated shape names")
    p.add_argument("--json")
    a = p.parse_args(argv)
    unknown = [s for s in a.set.split(",") if s not in SETS]
    if unknown:
        p.error(f"unknown --set {', '.join(unknown)}; choose from {', '.join(SETS)}")
    machine = load_machine()
    # The machine model's peak is for all cores; scale it to the threads used.
    peak = machine.peak_flops["float32"] * min(a.threads, machine.cores) / machine.cores
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for set_name in a.set.split(","):
            for name, shape in SETS[set_name].items():
                if a.only and name not in a.only.split(","):
                    continue
                if set_name == "chimera-gemm":
                    model = matmul_model(shape)
                    flops = 2.0 * shape.batch * shape.m * shape.n * shape.k
                else:
                    model = conv_model(shape)
                    flops = conv_flops(shape)
                out = os.path.join(tmp, f"{name}.onnx")
                r = optimize(model, output=out, measure=False, threads=a.threads)
                fused = r.model
                fused_ok = any(n.domain == "onnxopt" for n in fused.graph.node)
                feeds = make_inputs(model, {}, 0, {})
                s0 = make_session(model, a.threads)
                s1 = make_session(fused, a.threads, library=r.library)
                t0, t1 = time_interleaved([s0, s1], feeds, min_time=a.min_time, max_blocks=60)
                ratio = t0["median"] / t1["median"]
                row = {"set": set_name, "shape": name, "fused": fused_ok, "ort_s": t0["median"],
                       "onnxopt_s": t1["median"], "ratio": ratio, "gflops": flops / t1["median"] / 1e9,
                       "ort_gflops": flops / t0["median"] / 1e9}
                row["peak_fraction"] = flops / t1["median"] / peak if peak else None
                rows.append(row)
                print(f"{set_name:13s} {name:10s} ort {t0['median'] * 1e6:9.1f} us  onnxopt {t1['median'] * 1e6:9.1f} us"
                      f"  ratio {ratio:5.2f}  {row['gflops']:6.1f} GFLOP/s ({row['peak_fraction'] or 0:.0%} of peak)"
                      f"  ort {row['ort_gflops']:6.1f}", flush=True)
    for set_name in a.set.split(","):
        rs = [r["ratio"] for r in rows if r["set"] == set_name]
        if rs:
            print(f"{set_name}: geomean {math.exp(np.mean(np.log(rs))):.3f}, min {min(rs):.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "peak_flops": peak, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
