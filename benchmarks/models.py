"""Reproduce the whole-model and kernel numbers of BENCHMARKS.md.

    python benchmarks/models.py [--out bench-out] [--min-time 3]

Builds each network of onnxopt.models, optimizes it with `onnxopt`, then times original vs fused with
`onnxopt bench` (1 and 2 threads) and each fused kernel with `onnxopt bench --kernels`. Prints markdown tables.
"""

import argparse
import json
import os
import subprocess
import sys

NETWORKS = [
    ("mobilenetv3", ["--image-size", "224"], []),
    ("yolo", ["--image-size", "320"], []),
    ("bert", ["--size", "bench", "--no-dynamic", "--seq-len", "128"], []),
    ("resnet50", ["--image-size", "224"], []),
    ("ocr_detector", ["--image-size", "320"], []),
]
# The `light` model-zoo graphs that ship with the onnx package (real architectures, synthetic weights).
LIGHT = ["light_bvlc_alexnet", "light_densenet121", "light_inception_v1", "light_inception_v2", "light_resnet50",
         "light_shufflenet", "light_squeezenet", "light_vgg19", "light_zfnet512"]


def sh(*args):
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--min-time", default="3")
    ap.add_argument("--only", help="comma-separated network names")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, kernels = [], []
    import shutil

    import onnx

    light_dir = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    todo = [(n, b, o, None) for n, b, o in NETWORKS] + [(n, [], [], os.path.join(light_dir, n + ".onnx"))
                                                        for n in LIGHT]
    if a.only:
        todo = [t for t in todo if t[0] in a.only.split(",")]
    for name, build_args, opt_args, path in todo:
        src = os.path.join(a.out, f"{name}.onnx")
        fused = os.path.join(a.out, f"{name}_fused.onnx")
        if path is None:
            sh("onnxopt.models", name, "-o", src, *build_args)
        else:
            shutil.copyfile(path, src)
        if os.path.exists(fused):
            os.remove(fused)
        sh("onnxopt", src, "-o", fused, "--report", fused + ".json", *opt_args)
        rep = json.load(open(fused + ".json"))
        for threads in ("1", "2"):
            r = json.loads(sh("onnxopt", "bench", src, fused, "--threads", threads, "--min-time", a.min_time,
                              "--json"))
            rows.append((name, threads, r, rep))
        if rep["output"]["library"]:  # nothing emitted (no plan was faster): no kernels to bench
            for k in json.loads(sh("onnxopt", "bench", "--kernels", fused, "--json")):
                kernels.append((name, k))
    print("| network | threads | original ms (p10-p90) | fused ms (p10-p90) | speedup | outputs match | "
          "plan | regions fused / rejected | nodes before -> after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, threads, r, rep in rows:
        plan = (rep.get("whole_model") or {}).get("plan", "-")
        print(f"| {name} | {threads} | {r['a']['median'] * 1e3:.3f} ({r['a']['p10'] * 1e3:.3f}-{r['a']['p90'] * 1e3:.3f})"
              f" | {r['b']['median'] * 1e3:.3f} ({r['b']['p10'] * 1e3:.3f}-{r['b']['p90'] * 1e3:.3f}) | "
              f"{r['speedup']:.3f}x | {r['outputs_match']} | {plan} | {rep['fused_regions']} / {len(rep['rejected'])} | "
              f"{sum(rep['before'].values())} -> {sum(rep['after'].values())} |")
    import math

    for threads in ("1", "2"):
        sp = [r["speedup"] for _, t, r, _ in rows if t == threads]
        if sp:
            print(f"\ngeomean speedup, {threads} thread(s): {math.exp(sum(map(math.log, sp)) / len(sp)):.3f}x "
                  f"over {len(sp)} networks, min {min(sp):.3f}x")
    print()
    print("| network | kernel | shape | bytes | µs | GB/s | level | cores | ceiling GB/s | % of ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, k in kernels:
        print(f"| {name} | {k['op_type'][:24]} | {'x'.join(map(str, k['shape']))} | {k['bytes']:,} | "
              f"{k['seconds'] * 1e6:.1f} | {k['bandwidth'] / 1e9:.1f} | {k['level']} | {k['cores']} | "
              f"{k['level_bandwidth'] / 1e9:.1f} | {100 * k['fraction']:.0f}% |")


if __name__ == "__main__":
    main()
