"""ConvTranspose kernels (output phases on the channel-vector kernel) against onnxruntime, in one run.

    python benchmarks/conv_transpose.py [--threads 2] [--min-time 0.5]

Each case is one ConvTranspose with bias and an activation (batch 1), on shapes of the networks that use it: the
upsampling heads of OCR detectors (DBNet: 2x2 / 2), a 16-channel UNet's decoder (2x2 / 2), DCGAN's generator and
FCN-style decoders (4x4 / 2, pads 1), and a 3x3 / 2 with output_padding. onnxopt optimizes it with the speed check
off (the kernel is kept whatever its speed), then the original and the fused model run through onnxruntime
(ORT_ENABLE_ALL, same threads), interleaved. Printed: ORT's time, the ratio (ORT / ours: above 1 means ours is
faster) and our GFLOP/s (useful multiply-adds only: the zeros a strided transposed convolution inserts are not
counted, nor computed).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxopt import optimize
from onnxopt.timing import make_session, time_interleaved

# name: (C_in, C_out, H, W, kernel, stride, pads, output_padding, activation)
CASES = {
    "DBNet head 1 (64->16, 80x80, 2/2)": (64, 16, 80, 80, 2, 2, 0, 0, "Relu"),
    "DBNet head 2 (16->1, 160x160, 2/2)": (16, 1, 160, 160, 2, 2, 0, 0, "Sigmoid"),
    "UNet-16 up 1 (256->128, 16x16, 2/2)": (256, 128, 16, 16, 2, 2, 0, 0, "Relu"),
    "UNet-16 up 4 (32->16, 128x128, 2/2)": (32, 16, 128, 128, 2, 2, 0, 0, "Relu"),
    "DCGAN 2 (512->256, 8x8, 4/2 p1)": (512, 256, 8, 8, 4, 2, 1, 0, "Relu"),
    "DCGAN 3 (256->128, 16x16, 4/2 p1)": (256, 128, 16, 16, 4, 2, 1, 0, "Relu"),
    "DCGAN 4 (128->64, 32x32, 4/2 p1)": (128, 64, 32, 32, 4, 2, 1, 0, "Relu"),
    "decoder (96->64, 28x28, 3/2 p1 op1)": (96, 64, 28, 28, 3, 2, 1, 1, "Relu"),
}


def model(ci, co, h, w, k, s, p, op, act):
    rng = np.random.default_rng(0)
    wt = (rng.standard_normal((ci, co, k, k)) / math.sqrt(ci * k * k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    if op:
        attrs["output_padding"] = [op, op]
    oh, ow = ((h - 1) * s - 2 * p + k + op), ((w - 1) * s - 2 * p + k + op)
    g = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], **attrs), helper.make_node(act, ["t"], ["y"])],
        "convt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ci, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, oh, ow])],
        [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, 2.0 * ci * h * w * co * k * k


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--min-time", type=float, default=0.5)
    a = p.parse_args(argv)
    ratios = []
    print("| case | ORT ms | ours ms | ratio | ours GFLOP/s |")
    print("|---|---|---|---|---|")
    for name, case in CASES.items():
        m, flops = model(*case)
        with tempfile.TemporaryDirectory() as tmp:
            src, out = os.path.join(tmp, "m.onnx"), os.path.join(tmp, "f.onnx")
            onnx.save(m, src)
            res = optimize(src, out, measure=False, threads=a.threads)
            if not any(r["ops"].startswith("ConvTranspose") for r in res.report["regions"]):
                print(f"| {name} | not fused: {res.report['rejected']} |")
                continue
            orig = make_session(src, a.threads)
            fused = make_session(out, a.threads, library=res.library)
            x = np.random.default_rng(1).standard_normal((1, *case[:1], case[2], case[3])).astype(np.float32)
            feeds = {"x": x}
            want = orig.run(None, feeds)[0]
            np.testing.assert_allclose(fused.run(None, feeds)[0], want, rtol=1e-3, atol=1e-4)
            t0, t1 = (d["median"] for d in time_interleaved([orig, fused], [feeds, feeds], min_time=a.min_time))
        ratios.append(t0 / t1)
        print(f"| {name} | {t0 * 1e3:.3f} | {t1 * 1e3:.3f} | {t0 / t1:.2f} | {flops / t1 / 1e9:.1f} |", flush=True)
    if ratios:
        print(f"\ngeomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}, min {min(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
