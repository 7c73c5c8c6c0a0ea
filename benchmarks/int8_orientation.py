"""Table I's 1x1 layers two ways on our int8 kernels, against onnxruntime's int8 beside each:

    python benchmarks/int8_orientation.py [--min-time 1] [--threads 2]

1. as a convolution: QLinearConv on NCHW, our qconv kernel (output channels broadcast over panels of 16 pixels);
2. as a GEMM over NHWC rows: QLinearMatMul [H * W, C] x [C, K], our qmatmul kernel (pixels broadcast over panels of
   16 output channels: MLAS's orientation).

QOperator models (no QuantizeLinear or DequantizeLinear around them), s8 weights per output channel scaled as the
quantizer scales them (the largest magnitude 127), u8 activations and output; the four sessions are timed
interleaved. Printed: milliseconds, ours over onnxruntime's per form, and the GEMM form over our conv kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxopt import optimize
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_convs import TABLE_I  # noqa: E402


def _constants(rng, c: int, k: int) -> tuple[list, np.ndarray]:
    g = rng.standard_normal((k, c))
    w = np.rint(g / np.abs(g).max(axis=1, keepdims=True) * 127).astype(np.int8)  # per channel, as the quantizer
    inits = [numpy_helper.from_array(np.float32(0.02), "sx"), numpy_helper.from_array(np.array(9, np.uint8), "zx"),
             numpy_helper.from_array((rng.uniform(0.5, 2, k) * 0.01).astype(np.float32), "sw"),
             numpy_helper.from_array(np.zeros(k, np.int8), "zw"),
             numpy_helper.from_array(np.float32(0.04 * np.sqrt(c)), "sy"),
             numpy_helper.from_array(np.array(120, np.uint8), "zy")]
    return inits, w


def _model(op: str, xshape: list, inits: list) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", "sx", "zx", "W", "sw", "zw", "sy", "zy"], ["y"])
    g = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.UINT8, xshape)],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=1.0)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for number, (c, hw, k, r, s) in enumerate(TABLE_I, 1):
            if r != 1 or s != 1:
                continue
            inits, w = _constants(rng, c, k)
            w_conv = numpy_helper.from_array(w.reshape(k, c, 1, 1), "W")
            w_gemm = numpy_helper.from_array(np.ascontiguousarray(w.T), "W")
            conv = _model("QLinearConv", [1, c, hw, hw], inits + [w_conv])
            gemm = _model("QLinearMatMul", [hw * hw, c], inits + [w_gemm])
            oc = optimize(conv, output=os.path.join(tmp, f"c{number}.onnx"), measure=False, threads=a.threads)
            og = optimize(gemm, output=os.path.join(tmp, f"g{number}.onnx"), measure=False, threads=a.threads)
            x = rng.integers(0, 256, (1, c, hw, hw)).astype(np.uint8)
            conv_feeds, gemm_feeds = {"x": x}, {"x": np.ascontiguousarray(x.reshape(c, -1).T)}
            sessions = [make_session(conv, a.threads), make_session(oc.model, a.threads, library=oc.library),
                        make_session(gemm, a.threads), make_session(og.model, a.threads, library=og.library)]
            t = [x_["median"] for x_ in time_interleaved(sessions, [conv_feeds, conv_feeds, gemm_feeds, gemm_feeds],
                                                         min_time=a.min_time, max_blocks=60)]
            print(f"#{number:<2d} M {hw * hw:4d} K {c:4d} N {k:4d}  conv: onnxruntime {t[0] * 1e3:.3f} ms, ours "
                  f"{t[1] * 1e3:.3f} ms ({t[0] / t[1]:.2f}x)  GEMM: onnxruntime {t[2] * 1e3:.3f} ms, ours "
                  f"{t[3] * 1e3:.3f} ms ({t[2] / t[3]:.2f}x)  our GEMM over our conv {t[1] / t[3]:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
