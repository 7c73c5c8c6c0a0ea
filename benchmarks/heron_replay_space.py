"""Measures every point of one packed-B matmul's constrained space (Heron's replay): the table the search tests
replay (tests/tune/test_heron_search.py) instead of timing kernels in CI.

    python benchmarks/heron_replay_space.py --shape 64 128 64 --threads 1 \
        --output tests/tune/data/heron_gemm_64x128x64.json

The capacities are the target's (registers, lanes) and this machine's caches; the file records them, and the test
derives the same space from them, whatever host it runs on."""

from __future__ import annotations

import argparse
import json
import platform
import time

from onnxopt.codegen.target import host_target
from onnxopt.tune.heron import cpsat, packed_matmul as pm, rules


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", nargs=3, type=int, default=[64, 128, 64], metavar=("M", "K", "N"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=0.01)
    ap.add_argument("--output", required=True)
    a = ap.parse_args()
    M, K, N = a.shape
    target = host_target()
    cap = pm.capacities(target)
    csp = rules.derive(pm.schedule(M, K, N, cap), cap, pm.ROLES)
    t0 = time.perf_counter()
    points = sorted(cpsat.enumerate_knobs(csp))
    enum_s = time.perf_counter() - t0
    bench = pm.MatmulBench(M, K, N, target, threads=a.threads, min_time=a.min_time, repeats=5)
    by_kernel: dict = {}
    table = []
    for p in points:
        knobs = dict(zip(csp.knobs, p))
        full = cpsat.complete(csp, knobs)
        kp = pm.kernel_point(full)
        key = (kp["tile"], kp["schedule"])
        if key not in by_kernel:
            m = bench.measure(kp)
            by_kernel[key] = m.seconds
        table.append([list(p), by_kernel[key]])
    bench.close()
    out = {"shape": [M, K, N], "threads": a.threads, "target": target.name, "cpu": platform.processor() or "",
           "capacities": {"registers": cap.registers, "lanes": cap.lanes, "levels": cap.levels,
                          "max_tasks": cap.max_tasks},
           "knobs": csp.knobs, "points": table, "kernels_measured": len(by_kernel),
           "enumerate_s": round(enum_s, 1), "build_s": round(bench.build_s, 1)}
    with open(a.output, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"{len(table)} points, {len(by_kernel)} kernels measured, enumeration {enum_s:.0f} s")


if __name__ == "__main__":
    main()
