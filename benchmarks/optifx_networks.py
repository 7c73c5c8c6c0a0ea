"""The seven OptiFX networks, batch 1: onnxruntime against onnxopt, and onnxopt against itself without AFUSION.

    python benchmarks/optifx_networks.py [--threads 2] [--min-time 6] [--sessions 3] [--only resnet50] [--out DIR]
    python benchmarks/optifx_networks.py --out DIR --retime [--min-time 15 --sessions 5]   # time DIR's models again

Per network (models/: ResNet-50, Inception-v3, DenseNet-BC k=12 L=100, MobileNetV2, SqueezeNet 1.0, the NASNet-A
style stack, UNet-16): the model is optimized twice with no cost cache (a first run, so the offline time is what a
user waits): the default pipeline and `--no-afusion`. The three models are then timed interleaved in one process, for
--min-time seconds in all (onnxruntime's own optimizations on, same thread count; a short timing let this machine's
bursts of noise move a 4 ms network by 10%), in --sessions rounds of fresh sessions: one model in three sessions
measured up to 4% apart, so a model's time is the median over the rounds (one round at a time: idle sessions'
spinning threads slow the timed one). Printed: a markdown table with the medians, the ratios, the
plan each run emitted (with its kernel count; "nothing" when no plan was faster than onnxruntime in the graph,
with the best plan's ratio), how many AFUSION groups the emitted model has, and the first run's offline time split as
OptiFX's Table 7 (search / codegen / measurement), and the share of CPU time the hypervisor stole during the
network's timing (`steal`, from /proc/stat; "-" where there is none). Each run's report is kept next to its model
(`--out`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from types import SimpleNamespace

import numpy as np
import onnx

import onnxopt
from onnxopt.models import build_model, random_inputs
from onnxopt.emit.sequence import expand_sequences
from onnxopt.timing import make_session, time_interleaved

NETWORKS = [
    ("resnet50", {}),
    ("inception_v3", {}),
    ("densenet_bc", {}),
    ("mobilenetv2", {}),
    ("squeezenet", {}),
    ("nasnet_a", {}),
    ("unet16", {}),
]


def _optimize(src: str, out: str, threads: int, **kw):
    t = time.perf_counter()
    res = onnxopt.optimize(src, out, threads=threads, cost_cache=False, **kw)
    wall = time.perf_counter() - t
    groups = sum(1 for n in expand_sequences(res.model).graph.node if n.op_type.startswith("afusion_"))
    return res, wall, groups


def _written(path: str):
    """An earlier run's model, library and report in --out (for --retime): what _optimize returns, and the path."""
    if not os.path.exists(path + ".report.json"):
        raise SystemExit(f"--retime: {path}.report.json is missing; run once with --out {os.path.dirname(path)} first")
    with open(path + ".report.json") as f:
        report = json.load(f)
    lib = path + ".so" if os.path.exists(path + ".so") else None
    groups = sum(1 for n in expand_sequences(onnx.load(path, load_external_data=False)).graph.node
                 if n.op_type.startswith("afusion_"))
    return SimpleNamespace(report=report, library=lib), report["timings"]["total_s"], groups, path


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, all) clock ticks of the machine so far, from /proc/stat (None where there is none): the share of its
    CPU time the hypervisor gave to other guests. On this 2-core host it comes in bursts (0-5% over 10 s), and one
    burst during a timing moves a network's speedup by 20%, so each row says how much there was."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (ticks[7], sum(ticks[:8])) if len(ticks) >= 8 else None


def _steal_share(before, after) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _emitted(report: dict) -> str:
    """The plan whose kernels the written model has, with their count, or why it has none."""
    w = report.get("whole_model") or {}
    if report.get("fused_regions"):
        return f"{w.get('plan', '-')} ({report['fused_regions']} kernels)"
    best = w.get("plan")
    return f"nothing (best plan {best} {w['plans'][best]:.2f}x)" if best and best in w.get("plans", {}) else "nothing"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=6.0, help="seconds of interleaved timing per network")
    p.add_argument("--only", help="comma-separated network names")
    p.add_argument("--out", help="keep the models in this folder (default: a temporary one)")
    p.add_argument("--sessions", type=int, default=3,
                   help="rounds of fresh sessions, --min-time split among them; a model's time is the median over "
                        "the rounds (one model timed in three sessions of one process differed by up to 4%%)")
    p.add_argument("--retime", action="store_true",
                   help="time the models an earlier run wrote to --out again, without optimizing (offline times "
                        "are that run's)")
    a = p.parse_args(argv)
    if a.retime and not a.out:
        p.error("--retime times the models of an earlier run: give its --out folder")
    todo = [(n, kw) for n, kw in NETWORKS if not a.only or n in a.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = a.out or tmp
        os.makedirs(d, exist_ok=True)
        for name, kw in todo:
            src = os.path.join(d, f"{name}.onnx")
            if a.retime:
                model = onnx.load(src)
            else:
                model = build_model(name, **kw)
                onnx.save(model, src)
            outs = {}
            for label, opts in (("default", {}), ("no-afusion", {"skip_fusion": ["afusion"]})):
                path = os.path.join(d, f"{name}_{label}.onnx")
                if a.retime:
                    outs[label] = _written(path)
                    continue
                for f in (path, path + ".so"):
                    if os.path.exists(f):
                        os.remove(f)
                outs[label] = _optimize(src, path, a.threads, **opts) + (path,)
                with open(path + ".report.json", "w") as f:  # what was fused, refused, and where the time went
                    json.dump(outs[label][0].report, f, indent=1, default=str)
            rounds = []
            ticks = _cpu_ticks()
            for _ in range(max(1, a.sessions)):
                # Fresh sessions each round, and only these three alive: the idle sessions' spinning threads of a
                # longer interleave slowed the timed one (UNet's onnxruntime time 3.6 -> 6.4 ms with nine).
                sessions = [make_session(src, a.threads)]
                for label in ("default", "no-afusion"):
                    res, _, _, path = outs[label]
                    sessions.append(make_session(path, a.threads, res.library))
                # min_time, not a block count, ends the timing: a few-ms network gets as many seconds as ResNet-50
                # every block warmed, however long a run: the pipeline skips that for runs over 20 ms, to save
                # offline time; here the 1% it can cost is worth more than the seconds
                rounds.append([t["median"] for t in time_interleaved(
                    sessions, random_inputs(model), min_time=a.min_time / max(1, a.sessions), max_blocks=1_000_000,
                    warm_below_s=math.inf)])
                del sessions
            steal = _steal_share(ticks, _cpu_ticks())
            ort_t, ours, no_af = (float(np.median([r[k] for r in rounds])) for k in range(3))
            res, wall, groups, _ = outs["default"]
            off = res.report["offline"]
            stolen = "-" if steal is None else f"{100 * steal:.1f}%"
            rows.append((name, ort_t, ours, no_af, _emitted(res.report), _emitted(outs["no-afusion"][0].report), groups,
                         wall, off, stolen))
            print(f"{name}: onnxruntime {ort_t * 1e3:.2f} ms, onnxopt {ours * 1e3:.2f} ms ({ort_t / ours:.3f}x), "
                  f"--no-afusion {no_af * 1e3:.2f} ms ({ort_t / no_af:.3f}x); offline {wall:.0f} s; "
                  f"steal {stolen}", flush=True)
    print()
    print("| network | onnxruntime ms | onnxopt ms | speedup | --no-afusion ms | speedup | AFUSION vs without | "
          "emitted plan (without) | AFUSION nodes | offline s (search / codegen / measurement) | steal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, ort_t, ours, no_af, plan, plan_no, groups, wall, off, stolen in rows:
        print(f"| {name} | {ort_t * 1e3:.2f} | {ours * 1e3:.2f} | {ort_t / ours:.3f}x | {no_af * 1e3:.2f} | "
              f"{ort_t / no_af:.3f}x | {no_af / ours:.3f}x | {plan} ({plan_no}) | {groups} | "
              f"{wall:.0f} ({off['search_s']:.1f} / {off['codegen_s']:.1f} / {off['measurement_s']:.1f}) | "
              f"{stolen} |")
    if rows:
        geo = math.exp(sum(math.log(r[1] / r[2]) for r in rows) / len(rows))
        geo_no = math.exp(sum(math.log(r[1] / r[3]) for r in rows) / len(rows))
        print(f"\ngeometric mean speedup over onnxruntime: {geo:.3f}x (--no-afusion {geo_no:.3f}x), "
              f"{a.threads} threads, batch 1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
