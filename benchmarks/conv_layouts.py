"""One-group convolutions of the seeds' tables in each of our kernel layouts, against onnxruntime, in one run.

    python benchmarks/conv_layouts.py [--threads 2] [--min-time 0.5] [--only U5,C4.conv1]

Per shape (Conv + bias + Relu, batch 1), four sessions are timed interleaved:
- onnxruntime running the Conv (ORT_ENABLE_ALL: its NCHWc kernels, with reorders around a single conv);
- `nchw`: our default kernel, vectors along image rows, NCHW in and out;
- `cv`: the channel-vector (blocked) kernel with NCHW in and out, reordering inside the kernel: the tile search's
  extra candidate;
- `blocked`: the channel-vector kernel reading and writing the blocked layout, as inside a compute-blocked chain
  (no reorders at all).
Printed: ORT's time and each kernel's ratio (ORT / ours: above 1 means ours is faster), GFLOP/s of the blocked one,
and geomeans. The outputs of `nchw` and `cv` are checked against onnxruntime first.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import numpy as np

from onnxopt.annotate.shapes import tensor_info
from onnxopt.codegen.compute.build import build_compute
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import parse_target
from onnxopt.fusion.compute import ComputeRule
from onnxopt.fusion.layout import _convert, to_blocked, use_channel_vectors
from onnxopt.models.conv_shapes import CHIMERA_CONVS, UNIT_CONVS, conv_model
from onnxopt.graph.infer import infer as _infer
from onnxopt.measure import region_models as _region_models
from onnxopt.timing import make_session, time_interleaved

VARIANTS = ("nchw", "cv", "blocked")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--only", help="comma-separated shape names")
    a = p.parse_args(argv)
    target = parse_target(None)
    mk = select(target)
    ratios = {v: [] for v in VARIANTS}
    print(f"| shape | C->K | image | k/s | ORT ms | {' | '.join(VARIANTS)} | blocked GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, s in {**UNIT_CONVS, **CHIMERA_CONVS}.items():
        if s.groups != 1 or (a.only and name not in a.only.split(",")):
            continue
        model = _infer(conv_model(s, epilogue="relu"))
        info = tensor_info(model)
        regions = []
        for v in VARIANTS:
            rule = ComputeRule(model, mk.tile.mi)
            r = rule.find_regions(set(), [])[0]
            if v == "cv":
                use_channel_vectors(r, mk.lanes, mk.tile.ni, rule.ew.opset)
            elif v == "blocked":
                _convert(r, True, True, rule.ew.shape_of, mk.lanes, mk.tile.ni, rule.ew.opset)
            r.compute_op_type(f"bench-{v}")
            regions.append(r)
        with tempfile.TemporaryDirectory() as tmp:
            built = [build_compute(r, target) for r in regions]
            lib = os.path.join(tmp, "kernels.so")
            link_library([b[1] for b in built], [b[0] for b in built], target, lib)
            x = np.random.default_rng(0).standard_normal(info["input"].shape).astype(np.float32)
            sessions = [make_session(_region_models(regions[0], model, info)[0], a.threads)]
            sessions += [make_session(_region_models(r, model, info)[1], a.threads, library=lib) for r in regions]
            feeds = {"input": x}
            want = sessions[0].run(None, feeds)[0]
            scale = float(np.abs(want).max())
            for s_ in sessions[1:3]:
                np.testing.assert_allclose(s_.run(None, feeds)[0], want, rtol=1e-3, atol=1e-4 * scale)
            t = [d["median"] for d in time_interleaved(sessions, [feeds] * 3 + [{"input": to_blocked(x, mk.lanes)}],
                                                       min_time=a.min_time)]
        oh, ow = s.out_hw
        flops = 2.0 * s.c_out * oh * ow * s.c_in * s.kernel ** 2
        for v, tv in zip(VARIANTS, t[1:]):
            ratios[v].append(t[0] / tv)
        cells = " | ".join(f"{t[0] / tv:.2f}" for tv in t[1:])
        print(f"| {name} | {s.c_in}->{s.c_out} | {s.height}x{s.width} | {s.kernel}/{s.stride} | {t[0] * 1e3:.3f} | "
              f"{cells} | {flops / t[3] / 1e9:.1f} |", flush=True)
    for v, xs in ratios.items():
        if xs:
            best = xs if v != "cv" else [max(c, n) for c, n in zip(xs, ratios["nchw"])]
            label = "best of nchw/cv (the tile search's choice)" if v == "cv" else v
            print(f"\n{label}: geomean {math.exp(sum(map(math.log, best)) / len(best)):.3f}, min {min(best):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
