"""Padded blocked convolutions: border windows against the full zero-padded copy, in one run.

    python benchmarks/conv_border.py [--threads 2] [--min-time 1]

Per shape (Conv + bias + SiLU, batch 1, the channel-vector kernel writing the blocked layout, reading the blocked
layout or, for a network's first convolution, NCHW), one session of ours is timed three ways, interleaved:
onnxruntime running the original ops, ours with ONNXOPT_CONV_BORDER=window (only border tiles copy a window) and
ours with ONNXOPT_CONV_BORDER=copy (the whole input copied with zero borders first). The library reads the variable
on every call, so both sides run the same kernel in the same process. Printed: microseconds, window/copy speedup, and
ORT / ours for the library's own choice (whichever copies less, what `auto` does).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from onnxopt.annotate.shapes import tensor_info
from onnxopt.codegen.compute.build import build_compute
from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import parse_target
from onnxopt.fusion.compute import ComputeRule
from onnxopt.fusion.layout import _convert, to_blocked
from onnxopt.models.conv_shapes import ConvShape, conv_model
from onnxopt.graph.infer import infer as _infer
from onnxopt.measure import region_models as _region_models
from onnxopt.timing import make_session, time_interleaved

# Layers of YOLOv8n at 320x320 and ResNet-50 at 224x224: (C, H, W, K, kernel, stride, pad, input blocked).
SHAPES = {
    "yolo first 3->16 /2": (3, 320, 320, 16, 3, 2, 1, False),
    "yolo 16->32 /2": (16, 160, 160, 32, 3, 2, 1, True),
    "yolo 16->16": (16, 80, 80, 16, 3, 1, 1, True),
    "yolo 32->32": (32, 40, 40, 32, 3, 1, 1, True),
    "yolo 64->64": (64, 20, 20, 64, 3, 1, 1, True),
    "resnet stem 3->64 7x7 /2": (3, 224, 224, 64, 7, 2, 3, False),
    "resnet 64->64": (64, 56, 56, 64, 3, 1, 1, True),
    "resnet 128->128 /2": (128, 56, 56, 128, 3, 2, 1, True),
    "resnet 256->256": (256, 14, 14, 256, 3, 1, 1, True),
    "resnet 512->512": (512, 7, 7, 512, 3, 1, 1, True),
}


class WithBorderMode:
    """A session whose runs set ONNXOPT_CONV_BORDER first (None: the library's own choice)."""

    def __init__(self, session, mode):
        self.session, self.mode = session, mode

    def run(self, outputs, feeds):
        if self.mode is None:
            os.environ.pop("ONNXOPT_CONV_BORDER", None)
        else:
            os.environ["ONNXOPT_CONV_BORDER"] = self.mode
        return self.session.run(outputs, feeds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--min-time", type=float, default=1.0)
    a = p.parse_args(argv)
    target = parse_target(None)
    mk = select(target)
    print("| layer | ORT µs | window µs | copy µs | window / copy | ORT / ours (auto) |")
    print("|---|---|---|---|---|---|")
    for name, (c, h, w, k, kernel, stride, pad, in_blocked) in SHAPES.items():
        s = ConvShape(name, c, h, w, k, kernel, stride, pad)
        model = _infer(conv_model(s, epilogue="silu"))
        info = tensor_info(model)
        rule = ComputeRule(model, mk.tile.mi)
        r = rule.find_regions(set(), [])[0]
        _convert(r, in_blocked, True, rule.ew.shape_of, mk.lanes, mk.tile.ni, rule.ew.opset)
        r.compute_op_type("bench-border")
        with tempfile.TemporaryDirectory() as tmp:
            obj, desc = build_compute(r, target)[:2]
            lib = os.path.join(tmp, "kernels.so")
            link_library([desc], [obj], target, lib)
            ours = make_session(_region_models(r, model, info)[1], a.threads, library=lib)
            x = np.random.default_rng(0).standard_normal(info["input"].shape).astype(np.float32)
            mine = {"input": to_blocked(x, mk.lanes) if in_blocked else x}
            outs = [WithBorderMode(ours, m).run(None, mine)[0] for m in ("window", "copy")]
            np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
            sessions = [make_session(model, a.threads)] + [WithBorderMode(ours, m) for m in ("window", "copy", None)]
            t = [d["median"] * 1e6 for d in time_interleaved(sessions, [{"input": x}] + [mine] * 3,
                                                              min_time=a.min_time)]
        os.environ.pop("ONNXOPT_CONV_BORDER", None)
        print(f"| {name} | {t[0]:.0f} | {t[1]:.0f} | {t[2]:.0f} | {t[2] / t[1]:.2f}x | {t[0] / t[3]:.2f}x |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
