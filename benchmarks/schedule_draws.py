"""What the schedule search's default mode gains from its measured candidates (onnxopt/tune/heron/choose.py), on
transformer GEMMs: the analytic model's best three, its best six, and its best three with three samples drawn at
random from the rest (three seeds), each as the best measured point over the kernel's default.

    python benchmarks/schedule_draws.py [--threads 2]

Per shape the default mode's RandSAT samples (200, seed 0) are ranked by `packed_matmul.predicted_seconds`, and
every point is timed in one `MatmulBench` (the library's C entry point, each point checked against numpy first).
"""

from __future__ import annotations

import argparse
import random

from onnxopt.codegen.target import parse_target
from onnxopt.tune.heron import packed_matmul as pm
from onnxopt.tune.heron.choose import SAMPLES, _as_json, default_point
from onnxopt.tune.heron.cpsat import randsat
from onnxopt.tune.heron.rules import derive

# (M, K, N): MiniLM / BERT at sequence 64 (QKV and output, FFN up and down), ddddocr's classifier, ViT's FFN up
SHAPES = [(64, 384, 384), (64, 384, 1536), (64, 1536, 384), (64, 768, 768), (64, 768, 3072), (32, 1024, 8210),
          (197, 768, 3072)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    target = parse_target(None)
    print("| M x K x N | model's best 3 | best 6 | best 3 + 3 drawn, seed 1 | seed 2 | seed 3 |")
    print("|---|---|---|---|---|---|")
    for M, K, N in SHAPES:
        cap = pm.capacities(target)
        csp = derive(pm.schedule(M, K, N, cap), cap, pm.ROLES)
        rng = random.Random(0)
        ranked = {}
        for _ in range(SAMPLES):
            s = randsat(csp, rng)
            p = pm.kernel_point(s)
            ranked.setdefault((p["tile"], p["schedule"]), (pm.predicted_seconds(s, M, K, N, cap, a.threads), p))
        order = [_as_json(p) for _, p in sorted(ranked.values(), key=lambda x: x[0])]
        bench = pm.MatmulBench(M, K, N, target, threads=a.threads, min_time=0.03)
        try:
            def seconds(p):
                return bench.measure({"tile": tuple(p["tile"]), "schedule": tuple(p["schedule"])}).seconds or 1e9

            base = seconds(default_point(target))
            top = [seconds(p) for p in order[:6]]
            cells = [base / min(top[:3]), base / min(top)]
            for seed in (1, 2, 3):
                drawn = random.Random(seed).sample(order[3:], min(3, len(order) - 3))
                cells.append(base / min(top[:3] + [seconds(p) for p in drawn]))
        finally:
            bench.close()
        print(f"| {M} x {K} x {N} | " + " | ".join(f"{c:.3f}x" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
