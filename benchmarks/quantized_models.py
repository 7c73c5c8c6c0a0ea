"""The corpus's quantized models, whole, batch 1: the fp32 original and the quantized model through onnxruntime,
and the quantized model after onnxopt.

    python benchmarks/quantized_models.py [--list /tmp/corpus/corpus.txt] [--seqs 128] [--threads 2]
        [--min-time 6] [--only bert_base_int8,resnet50_qdq] [--out DIR] [--fused DIR] [--before DIR]

Quantized models are the list's files named `*_int8.onnx` (onnxruntime's quantize_dynamic: MatMulInteger,
ConvInteger) and `*_qdq.onnx` (quantize_static in QDQ form); the fp32 original is the same name without the
suffix, when the list's folder has it (`benchmarks/corpus.py` makes both). Text models run at each --seqs length
(their input_ids-like inputs' second dim), others at their listed shapes. onnxopt builds each with
`python -m onnxopt MODEL -o OUT --input-shape ... --threads N` (measurement on), or takes the model in --fused.

All three are timed interleaved in one process (onnxopt.timing.time_interleaved, the median block). Printed per
row: milliseconds, the quantized original's time over onnxopt's (above 1 = onnxopt faster), the fp32 original's
over onnxopt's, what onnxopt fused (its op types by kind), and how far onnxopt's output is from the quantized
model's beside onnxruntime's own spread between its optimization levels on the same inputs (a dynamically quantized
model's outputs move by whole quantization steps with any rounding: driver/outputs.py). Then the geomeans.
With --before (the --out folder of another build, say the last commit's), its model of the same name is timed in
the same interleaved runs, and each row says how much faster this build is than that one.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx

from onnxopt.runtime import written_session
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_sources import random_inputs  # noqa: E402
from transformer_models import read_list, runs_for  # noqa: E402

SUFFIXES = ("_int8", "_qdq", "_qop")


def fp32_original(path: str) -> str | None:
    stem, ext = os.path.splitext(path)
    for s in SUFFIXES:
        if stem.endswith(s) and os.path.exists(stem[: -len(s)] + ext):
            return stem[: -len(s)] + ext
    return None


def build(path: str, specs: list[str], out: str, threads: int) -> str | None:
    cmd = [sys.executable, "-m", "onnxopt", path, "-o", out, "--threads", str(threads)]
    for s in specs:
        cmd += ["--input-shape", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(out + ".log", "w") as f:
        f.write(r.stdout + r.stderr)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["failed"])[-1][:200]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--list", default="/tmp/corpus/corpus.txt")
    p.add_argument("--seqs", default="128")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=6.0)
    p.add_argument("--only", default="")
    p.add_argument("--out", default=None)
    p.add_argument("--fused", default=None, help="a folder with <stem>_<label>.onnx from an earlier --out")
    p.add_argument("--before", default=None, help="another build's --out folder, timed beside this one")
    a = p.parse_args(argv)
    only = {s for s in a.only.split(",") if s}
    out_dir = a.out or tempfile.mkdtemp(prefix="quantized_models_")
    os.makedirs(out_dir, exist_ok=True)
    seqs = [int(s) for s in a.seqs.split(",")]
    vs_q, vs_f, vs_before = [], [], []
    extra = " before ms | after / before |" if a.before else ""
    print("| model | shape | fp32 ms | int8 ms | onnxopt ms | vs int8 | vs fp32 | onnxopt kernels | diff / ORT spread |"
          + extra)
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if a.before else ""))
    for entry in read_list(a.list):
        if not entry["stem"].endswith(SUFFIXES) or (only and entry["stem"] not in only):
            continue
        for run in runs_for(entry, seqs):
            name = f"{entry['stem']}_{run['label']}"
            fused_path = os.path.join(a.fused or out_dir, name + ".onnx")
            if not a.fused:
                err = build(entry["path"], run["specs"], fused_path, a.threads)
                if err:
                    print(f"| {entry['stem']} | {run['label']} | | | | | | build failed: {err} | |", flush=True)
                    continue
            q = onnx.load(entry["path"])
            fused = onnx.load(fused_path)
            f32 = fp32_original(entry["path"])
            sessions = ([make_session(onnx.load(f32), a.threads)] if f32 else []) + \
                [make_session(q, a.threads), written_session(fused_path, a.threads)]  # as a user loads it
            before = os.path.join(a.before, name + ".onnx") if a.before else None
            if before and not os.path.exists(before):  # that build failed or wrote nothing
                before = None
            if before:
                sessions.append(written_session(before, a.threads))
            specs = [f"{k}:{','.join(map(str, v))}" for k, v in run["shapes"].items()]
            feeds = random_inputs(sessions[1 if f32 else 0], specs, np.random.default_rng(0))
            t = [r["median"] * 1e3 for r in time_interleaved(sessions, feeds, min_time=a.min_time)]
            t_b = t.pop() if before else None
            if before:
                sessions.pop()
            t_f = t[0] if f32 else None
            t_q, t_o = t[-2], t[-1]
            want = sessions[-2].run(None, feeds)
            got = sessions[-1].run(None, feeds)
            plain = make_session(q, a.threads, optimization="none").run(None, feeds)
            diff = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0))
                       for x, y in zip(want, got))
            spread = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0))
                         for x, y in zip(want, plain))
            kinds = collections.Counter(n.op_type.rsplit("_", 1)[0] for n in fused.graph.node if n.domain == "onnxopt")
            vs_q.append(t_q / t_o)
            if t_f:
                vs_f.append(t_f / t_o)
            shape = ",".join(f"{k}:{'x'.join(map(str, v))}" for k, v in run["shapes"].items())
            print(f"| {entry['stem']} | {shape} | {f'{t_f:.2f}' if t_f else '-'} | {t_q:.2f} | {t_o:.2f} | "
                  f"{t_q / t_o:.3f}x | {f'{t_f / t_o:.3f}x' if t_f else '-'} | "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or 'unchanged'} | "
                  f"{diff:.3g} / {spread:.3g} |" + (f" {t_b:.2f} | {t_b / t_o:.3f}x |" if before else
                                                     " - | - |" if a.before else ""),
                  flush=True)
            if before:
                vs_before.append(t_b / t_o)
    gm = lambda xs: math.exp(np.mean(np.log(xs))) if xs else float("nan")  # noqa: E731
    print(f"\ngeomean onnxopt vs the quantized model in onnxruntime: {gm(vs_q):.3f}x over {len(vs_q)} rows; "
          f"vs the fp32 original: {gm(vs_f):.3f}x over {len(vs_f)} rows"
          + (f"; vs the --before build: {gm(vs_before):.3f}x" if vs_before else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
