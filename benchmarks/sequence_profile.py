"""Where a fused model's sequences spend their time, step by step.

    python benchmarks/sequence_profile.py FUSED.onnx [--original ORIGINAL.onnx] [--threads 2] [--seconds 20]

onnxruntime's profiler sees a sequence op as one node. This runs FUSED.onnx in a child process with
ONNXOPT_SEQUENCE_PROFILE set (the glue then times every step of every sequence, sequence_exec.c) and prints, per step,
the region it runs (its first node, ops and output shape, from the step's node in the sequence's function), its mean
latency, and its share. With --original, the original model is also timed through onnxruntime in the same child and
the table ends with the steps' sum, the fused model's time per run and the original's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import onnx

CHILD = r"""
import json, os, sys, time
import onnx
from onnxopt.models import random_inputs
from onnxopt.runtime import written_session
from onnxopt.timing import make_session

fused, original, threads, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
feeds = random_inputs(onnx.load(fused, load_external_data=False))
out = {}
for name, path, lib in (("fused", fused, os.path.abspath(fused + ".so")), ("original", original, None)):
    if not path:
        continue
    s = written_session(path, threads) if lib else make_session(path, threads)
    for _ in range(10):
        s.run(None, feeds)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / (2 if original else 1):
        s.run(None, feeds)
        n += 1
    out[name] = (time.perf_counter() - t0) / n
print(json.dumps(out))
"""


def step_regions(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Sequence op type -> the nodes of its function, in step order (one per step)."""
    return {f.name: list(f.node) for f in model.functions if f.name.startswith("Sequence")}


def read_profile(path: str) -> list[tuple[str, int, str, int, float]]:
    rows = []
    with open(path) as f:
        for line in f:
            seq, step, op, runs, us = line.rstrip("\n").split("\t")
            rows.append((seq, int(step), op, int(runs), float(us)))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fused")
    ap.add_argument("--original", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--top", type=int, default=0, help="print only the N slowest steps")
    a = ap.parse_args(argv)
    model = onnx.load(a.fused, load_external_data=False)
    regions = {}
    report = a.fused + ".report.json"
    if os.path.exists(report):
        with open(report) as f:
            entries = json.load(f)["regions"]
        for g in entries:
            regions[g["op_type"], g["nodes"][0]] = g
    with tempfile.TemporaryDirectory() as tmp:
        prof = os.path.join(tmp, "profile.tsv")
        env = dict(os.environ, ONNXOPT_SEQUENCE_PROFILE=prof)
        res = subprocess.run([sys.executable, "-c", CHILD, a.fused, a.original, str(a.threads), str(a.seconds)],
                             env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            sys.exit(f"the profiled run failed:\n{res.stderr}")
        times = json.loads(res.stdout.strip().splitlines()[-1])
        if not os.path.exists(prof):
            sys.exit(f"{a.fused} ran no sequence (built with --no-sequences, or its library has none)")
        rows = read_profile(prof)
    nodes = step_regions(model)
    table = []
    for seq, step, op, runs, us in rows:
        node = nodes[seq][step] if seq in nodes and step < len(nodes[seq]) else None
        first = node.name.split("__onnxopt")[0] if node is not None else "?"
        g = regions.get((op, first), {})
        table.append((us, seq, step, first, g.get("ops", op), g.get("shape", "")))
    total = sum(r[0] for r in table)
    shown = sorted(table, reverse=True)[: a.top] if a.top else table
    for us, seq, step, first, ops, shape in shown:
        print(f"{seq[:18]:18s} {step:4d} {us:9.1f} us {100 * us / total:5.1f}%  {first[-48:]:48s} {ops[:30]:30s} {shape}")
    print(f"steps' sum {total / 1e3:.3f} ms per run over {len(table)} steps")
    if "fused" in times:
        print(f"fused model {times['fused'] * 1e3:.3f} ms per run (with the clock around each step)")
    if "original" in times:
        print(f"original through onnxruntime {times['original'] * 1e3:.3f} ms per run")


if __name__ == "__main__":
    main()
