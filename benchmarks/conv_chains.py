"""Chimera's conv chains C1-C8 as AFUSION kernels: every band height timed, against TileFlow's latency of the kernel's
tile tree and against the scratch-size rule the optimizer builds with.

    python benchmarks/conv_chains.py [--threads 2] [--min-time 1] [--only C1,C6] [--json out.json]

Per chain (models/conv_shapes.py `conv_chain_model`: Conv + bias + Relu twice, batch 1), timed interleaved in one
process: onnxruntime on the original; our two separate kernels (`--plan compute-blocked`); one AFUSION kernel
(`--plan afusion`, ONNXOPT_AFUSION_PAIRS=all: fused whatever the search would say) per band height balanced over the
threads (ONNXOPT_AFUSION_BAND_ROWS). Printed per height:
TileFlow's predicted time (fusion/afusion/band_tree.py `predicted_seconds`), the measured time and its ratio to the
fastest height; per chain: R^2 (a line through the heights) and Spearman of the time against the prediction, the
heights TileFlow (`model_band_rows`), Chimera's data-movement model (`chimera_band_rows`, with the R^2 of its DV
against the times) and the scratch rule (`choose_band_rows`, what `--no-measure` builds) choose against the fastest,
and the fastest AFUSION kernel against the separate kernels and onnxruntime; then Chimera's multi-level cost of the
chain fused and apart (annotate/data_movement.py `conv_chain_seconds`: compute against each level's data) and its
free tiles (`conv_chain_tiles`: any rows, columns and channel blocks) at a core's L2.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import onnx
from afusion import _build as build_plan
from attention_key_blocks import r_squared

from onnxopt.annotate.data_movement import conv_chain_movement, conv_chain_seconds, conv_chain_tiles
from onnxopt.fusion.afusion.band_tree import ConvPair, chimera_band_rows, model_band_rows, predicted_seconds
from onnxopt.fusion.afusion.siso import balanced_rows
from onnxopt.hardware.measure import load_machine
from onnxopt.models import random_inputs
from onnxopt.models.conv_shapes import CHIMERA_CONV_CHAINS, conv_chain_model
from onnxopt.timing import make_session, time_interleaved


def spearman(x, y) -> float:
    if len(x) < 3 or np.ptp(x) == 0:
        return float("nan")
    rank = lambda v: np.argsort(np.argsort(v)).astype(float)  # noqa: E731
    return float(np.corrcoef(rank(x), rank(y))[0, 1])


def _build(src: str, out: str, plan: str, rows: int | None):
    os.environ["ONNXOPT_AFUSION_PAIRS"] = "all"  # the pair fused even where the search would not
    try:
        return build_plan(src, out, plan, str(rows) if rows else None)
    finally:
        os.environ.pop("ONNXOPT_AFUSION_PAIRS", None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--only", help="comma-separated chain names (default: C1-C8)")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    machine = load_machine(quick=True)
    names = a.only.split(",") if a.only else list(CHIMERA_CONV_CHAINS)
    print("| chain | plan | band rows | TileFlow ms | ms | vs fastest band | |")
    print("|---|---|---|---|---|---|---|")
    out_rows = []
    for name in names:
        chain = CHIMERA_CONV_CHAINS[name]
        model = conv_chain_model(chain, batch=1)
        oh, ow = chain.conv2.out_hw
        g = ConvPair(chain.ic, chain.oc1, chain.oc2, chain.k1, chain.k2, chain.st1, chain.st2, oh, ow)
        heights = sorted({balanced_rows(r, oh, 1, a.threads) for r in range(1, oh + 1)})
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "m.onnx")
            onnx.save(model, src)
            sessions, labels = [make_session(src, a.threads)], ["onnxruntime"]
            res, _ = _build(src, os.path.join(d, "separate.onnx"), "compute-blocked", None)
            sessions.append(make_session(res.output, a.threads, res.library))
            labels.append("separate")
            res, fused = _build(src, os.path.join(d, "rule.onnx"), "afusion", None)
            if not fused:
                why = [r["reason"] for r in res.report.get("afusion", {}).get("refused", [])] or ["no pair"]
                print(f"| {name} | not fused: {why[0]} | | | | | |")
                continue
            rule_rows = res.report["afusion"]["pairs"][0]["band_rows"]
            for rows in heights:
                res, _ = _build(src, os.path.join(d, f"afusion{rows}.onnx"), "afusion", rows)
                sessions.append(make_session(res.output, a.threads, res.library))
                labels.append(rows)
            times = [t["median"] for t in time_interleaved(sessions, random_inputs(model), min_time=a.min_time,
                                                            max_blocks=1_000_000)]
        band_t = times[2:]
        best = min(band_t)
        predicted = [predicted_seconds(g, r, machine, a.threads) for r in heights]
        chosen = model_band_rows(g, machine, a.threads)
        chimera = chimera_band_rows(g, machine, a.threads)
        for rows, tp, tm in zip(heights, predicted, band_t):
            mark = ", ".join(x for x, r in (("TileFlow's choice", chosen), ("the scratch rule's", rule_rows),
                                            ("Chimera's", chimera)) if r == rows)
            print(f"| {name} | AFUSION | {rows} | {tp * 1e3:.3f} | {tm * 1e3:.3f} | {tm / best:.3f} | {mark} |")
        tf_ratio = band_t[heights.index(chosen)] / best
        chimera_ratio = band_t[heights.index(chimera)] / best
        # Chimera's DV of each height at a core's L2 (the band form), against the measured times
        l2_floats = next(lv for lv in machine.levels if lv.name == "L2").size_bytes // machine.cores // 4
        dv = [conv_chain_movement(g, dict(h=r, w=ow, c=g.oc1, i=g.ic, o=g.oc2)).dv for r in heights]
        free = conv_chain_tiles(g, l2_floats, a.threads, 16)
        fused_s, fused_by = conv_chain_seconds(g, machine, 16, a.threads)
        apart_s, apart_by = conv_chain_seconds(g, machine, 16, a.threads, fused=False)
        rule_ratio = band_t[heights.index(rule_rows)] / best if rule_rows in heights else float("nan")
        fit, rank = r_squared(predicted, band_t), spearman(predicted, band_t)
        print(f"| {name} | onnxruntime | | | {times[0] * 1e3:.3f} | {times[0] / best:.3f} | |")
        print(f"| {name} | separate kernels | | | {times[1] * 1e3:.3f} | {times[1] / best:.3f} | R^2 {fit:.2f}, "
              f"Spearman {rank:.2f}; TileFlow's height {tf_ratio:.3f}x the fastest, the scratch rule's "
              f"{rule_ratio:.3f}x, Chimera's {chimera_ratio:.3f}x (R^2 of its DV {r_squared(dv, band_t):.2f}); the "
              f"fastest band {times[1] / best:.2f}x separate, {times[0] / best:.2f}x onnxruntime |", flush=True)
        print(f"| {name} | Chimera's model | | {fused_s * 1e3:.3f} | | | fused bound by {fused_by}, apart "
              f"{apart_s * 1e3:.3f} ms by {apart_by}: predicted gain {apart_s / fused_s:.3f}x; its free tiles at "
              f"L2 {free} |", flush=True)
        out_rows.append({"chain": name, "heights": heights, "predicted_s": predicted, "measured_s": band_t,
                         "onnxruntime_s": times[0], "separate_s": times[1], "tileflow_rows": chosen,
                         "rule_rows": rule_rows, "r2": fit, "spearman": rank, "chimera_rows": chimera,
                         "chimera_dv": dv, "chimera_r2": r_squared(dv, band_t), "chimera_free_l2": free,
                         "chimera_fused_s": fused_s, "chimera_apart_s": apart_s, "chimera_bound": fused_by})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out_rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
