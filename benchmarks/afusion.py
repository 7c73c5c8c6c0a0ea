"""AFUSION on the OptiFX sub-graphs G1-G7: one fused kernel against our two separate kernels and onnxruntime.

    python benchmarks/afusion.py [--threads 2] [--min-time 1] [--batch 1] [--only G1,G3] [--band-rows 1,2,4]
                                 [--search]

Per sub-graph (models/conv_shapes.py `optifx_model`, conv + bias + Relu each), three sessions timed interleaved
in one process: onnxruntime on the original; ours with `--plan compute-blocked` (each convolution its own kernel,
the intermediate in the blocked layout in memory); ours with `--plan afusion` (the pair in one kernel, the
intermediate in a scratch band). With --band-rows, one AFUSION session per band height
(ONNXOPT_AFUSION_BAND_ROWS) instead of the height the optimizer picks. Printed: microseconds and ratios, and the
achieved GFLOP/s of the fused kernel.

With --search, the third session is what the default pipeline writes (its search on measured kernel times decides
whether the group is fused; no cost cache), labelled with what it chose: the issue's bar is that every sub-graph
the search fuses runs faster than our separate kernels.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import onnx

import onnxopt
from onnxopt.annotate.graph import annotate
from onnxopt.emit.sequence import expand_sequences
from onnxopt.models import random_inputs
from onnxopt.models.conv_shapes import OPTIFX_SUBGRAPHS, optifx_model
from onnxopt.timing import make_session, time_interleaved


def _build(src: str, out: str, plan: str, band_rows: str | None):
    if band_rows:
        os.environ["ONNXOPT_AFUSION_BAND_ROWS"] = band_rows
    try:
        res = onnxopt.optimize(src, out, measure=False, plan=plan)
    finally:
        os.environ.pop("ONNXOPT_AFUSION_BAND_ROWS", None)
    fused = any(n.op_type.startswith("afusion_") for n in expand_sequences(res.model).graph.node)
    return res, fused


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--only", help="comma-separated sub-graph names (default: all of G1-G7)")
    p.add_argument("--band-rows", help="comma-separated band heights to time (default: the optimizer's choice)")
    p.add_argument("--search", action="store_true",
                   help="time the default pipeline's result (its search decides) instead of a forced AFUSION plan")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else list(OPTIFX_SUBGRAPHS)
    bands = a.band_rows.split(",") if a.band_rows else [None]
    for name in names:
        model = optifx_model(name, batch=a.batch)
        flops = annotate(model).total_flops
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "m.onnx")
            onnx.save(model, src)
            sessions, labels = [make_session(src, a.threads)], ["onnxruntime"]
            res, _ = _build(src, os.path.join(d, "blocked.onnx"), "compute-blocked", None)
            sessions.append(make_session(res.output, a.threads, res.library))
            labels.append("separate")
            for b in ([] if a.search else bands):
                out = os.path.join(d, f"afusion{b or ''}.onnx")
                res, fused = _build(src, out, "afusion", b)
                if not fused:
                    why = [r["reason"] for r in res.report.get("afusion", {}).get("refused", [])] or ["no pair"]
                    print(f"{name} ({OPTIFX_SUBGRAPHS[name].pattern}): not fused: {why[0]}")
                    continue
                rows = res.report["afusion"]["pairs"][0]["band_rows"]
                sessions.append(make_session(res.output, a.threads, res.library))
                labels.append(f"afusion rows={rows}")
            if a.search:
                res = onnxopt.optimize(src, os.path.join(d, "search.onnx"), threads=a.threads, cost_cache=False)
                kinds = sorted({n.op_type.split("_")[0] for n in expand_sequences(res.model).graph.node
                                if n.domain == "onnxopt"})
                chosen = len(res.report.get("afusion", {}).get("pairs", []))
                plan = (res.report.get("whole_model") or {}).get("plan") if kinds else "nothing"
                sessions.append(make_session(res.output, a.threads, res.library if kinds else None))
                labels.append(f"search (AFUSION groups chosen {chosen}, emitted {plan}: {','.join(kinds) or '-'})")
            # min_time, not a block count, ends the timing: a few-ms network gets as many seconds as ResNet-50
            times = time_interleaved(sessions, random_inputs(model), min_time=a.min_time, max_blocks=1_000_000)
        ort_t, sep_t = times[0]["median"], times[1]["median"]
        line = f"{name} b{a.batch}: onnxruntime {ort_t * 1e6:.0f} us, separate {sep_t * 1e6:.0f} us"
        for label, t in zip(labels[2:], times[2:]):
            m = t["median"]
            line += (f"; {label} {m * 1e6:.0f} us ({ort_t / m:.2f}x onnxruntime, {sep_t / m:.2f}x separate, "
                     f"{flops / m / 1e9:.0f} GFLOP/s)")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
