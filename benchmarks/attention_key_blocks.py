"""The attention kernel's l tile: the data-movement model's choice against every other capacity, measured.

    python benchmarks/attention_key_blocks.py [--threads 2] [--min-time 1] [--chains none|relu|softmax]

Per shape (softmax attention, Q, K, V graph inputs [1, heads, M, d] / [1, heads, L, d]): the fused model built with
the model's capacity (capacity.py: whole rows where the machine's L3 keeps up with them, else a share of a core's
L2), with whole rows and with a quarter, half, one and two shares of a core's L2; candidates that give the same key
block are timed once. All of them and
onnxruntime's own graph are timed interleaved in one process through their sessions (the written model and its
library). Prints, per candidate, its key block, the model's DV (plan.key_block_moved, all heads), the median time
and the ratio to the fastest, and TileFlow's latency of the kernel's tile tree (plan.tileflow_seconds); per shape,
R^2 of time against DV and against TileFlow's latency (a line fitted over the shape's candidates), and the choices
of the data-movement model and of TileFlow's latency against the best measured one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from onnxopt.codegen.target import host_target  # noqa: E402
from onnxopt.hardware.measure import cached_machine  # noqa: E402
from onnxopt.kinds.attention import KIND, plan  # noqa: E402
from onnxopt.kinds.attention.lower import MR  # noqa: E402
from onnxopt.models.conv_shapes import CHIMERA_GEMM_CHAINS, gemm_chain_model  # noqa: E402
from onnxopt.timing import make_session, time_interleaved  # noqa: E402

# (heads, M = L, head dim): long sequences where K^T and V outgrow a core's L2, and two that fit (BERT-base at 512,
# Chimera's G12 with a softmax)
SHAPES = [(2, 4096, 64), (4, 2048, 64), (1, 4096, 128), (8, 1024, 64), (12, 512, 64), (1, 1024, 64)]


def r_squared(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0:
        return float("nan")
    fit = np.polyval(np.polyfit(x, y, 1), x)
    return float(1 - ((y - fit) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def main(argv=None) -> None:
    from attention_models import attention_model, feeds_for
    from kind_harness import fuse_kind

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--chains", choices=("none", "relu", "softmax"), default=None,
                    help="Chimera's G1-G12 with this middle instead of the long-sequence attention shapes")
    a = ap.parse_args(argv)
    model_cap = plan.key_floats(MR)
    machine = cached_machine()
    share = int(plan.KEY_SHARE * plan.core_cache_bytes(2)) // 4  # the cache the blocks are sized for
    panel = 2 * host_target().float32_lanes  # the kernel's column block at its default vectors a row
    print(f"L3 balance {plan.l3_balance(cached_machine()) or float('nan'):.2f} flop/byte (blocks pay above "
          f"{MR / 2}); the model's capacity {model_cap} floats (0: whole rows); {plan.KEY_SHARE} of a core's L2 "
          f"{share} floats")
    print("| shape (heads x M x L x d) | capacity | key block | model DV MB | TileFlow ms | ms | vs fastest | |")
    print("|---|---|---|---|---|---|---|---|")
    within, fits, tf_within, tf_fits = [], [], [], []
    softmax = a.chains in (None, "softmax")
    if a.chains:
        middle = None if a.chains == "none" else a.chains
        cases = [(f"{c.name} {c.batch} x {c.m} x {c.l} x {c.k}", gemm_chain_model(c, middle=middle), c.batch, c.m,
                  c.l, c.k, c.n) for c in CHIMERA_GEMM_CHAINS.values()]
    else:
        cases = [(f"{h} x {seq} x {seq} x {d}", attention_model("sdpa", 1, h, seq, seq, d, "none", False), h, seq,
                  seq, d, d) for h, seq, d in SHAPES]
    with tempfile.TemporaryDirectory() as folder:
        for name, model, heads, M, L, d, dv in cases:
            model = onnx.shape_inference.infer_shapes(model)
            rows = plan.task_rows(M, heads)
            cands = {}
            for label, cap in (("model", model_cap or -1), ("whole", -1), ("quarter share", share // 4),
                               ("half share", share // 2), ("share", share), ("twice share", 2 * share)):
                block = plan.key_block(L, d, dv, rows, max(cap, 0), panel)
                cands.setdefault(block, (label, cap))
            built = []
            for block, (label, cap) in cands.items():
                so = f"{heads}_{M}_{L}_{d}_{label.replace(' ', '_')}.so"
                fused, lib, region, _ = fuse_kind(KIND, model, folder, name=so,
                                                  params=lambda p, c=cap: dataclasses.replace(p, key_floats=c))
                built.append((label, cap, block, make_session(fused, a.threads, library=lib)))
            feeds = feeds_for(model)
            scale = float(np.abs(feeds[model.graph.input[0].name]).max())
            ort = make_session(model, a.threads)
            want = ort.run(None, feeds)[0]
            for *_, s in built:
                got = s.run(None, feeds)[0]
                assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()), scale), name
            t = [r["median"] for r in time_interleaved([ort] + [b[3] for b in built], feeds, min_time=a.min_time,
                                                       max_blocks=100000)]
            best = min(t[1:])
            moved, tile_flow = [], []
            for (label, cap, block, _), ti in zip(built, t[1:]):
                moved.append(heads * plan.key_block_moved(M, L, d, dv, rows, block, share))  # the cache's size
                tile_flow.append(plan.tileflow_seconds(machine, heads, M, L, d, dv, block, softmax=softmax,
                                                       panel=panel))
                mark = "model's choice" if label == "model" else ""
                print(f"| {name} | {label} | {block} | {4 * moved[-1] / 1e6:.1f} | {tile_flow[-1] * 1e3:.2f} | "
                      f"{ti * 1e3:.2f} | {ti / best:.2f} | {mark} |", flush=True)
            fit, tf_fit = r_squared(moved, t[1:]), r_squared(tile_flow, t[1:])
            chosen = t[1 + [b[0] for b in built].index("model")]
            tf_chosen = t[1 + int(np.argmin(tile_flow))]
            within.append(chosen / best)
            fits.append(fit)
            tf_within.append(tf_chosen / best)
            tf_fits.append(tf_fit)
            print(f"| {name} | onnxruntime | | | | {t[0] * 1e3:.2f} | {t[0] / best:.2f} | R^2 DV {fit:.2f}, "
                  f"TileFlow {tf_fit:.2f}; choice: the model's {chosen / best:.3f}x the fastest, TileFlow's "
                  f"{tf_chosen / best:.3f}x |", flush=True)
    show = lambda fs: ", ".join("n/a" if np.isnan(f) else f"{f:.2f}" for f in fs)  # noqa: E731
    print(f"the model's choice within {max(within):.3f}x of the fastest on every shape, TileFlow's within "
          f"{max(tf_within):.3f}x; R^2 per shape: DV {show(fits)}; TileFlow {show(tf_fits)}")


if __name__ == "__main__":
    main()
