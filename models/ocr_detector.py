"""An OCR text detector in the style of DBNet / PaddleOCR's mobile `det` model, as exported in eval mode.

BatchNorm is folded into every convolution (conv with bias). Hardswish is decomposed as
`x * Clip(x + 3, 0, 6) / 6` (Add, Clip, Mul, Div).

* Backbone (MobileNetV3-like, no squeeze-excite): stem 3x3/2 conv + hardswish, then inverted-residual blocks
  (1x1 expand + act, depthwise 3x3 with `group = channels` carrying the stride + act, 1x1 project, `Add` when
  the shape is kept). Stages end at 1/4, 1/8, 1/16 and 1/32 of the input.
* Neck (DBFPN): 1x1 lateral convs to `neck_channels`; top-down path `Resize` (nearest, scale 2) + `Add`; a 3x3
  conv per level to `neck_channels // 4`; the three coarser levels are upsampled to 1/4 (`Resize` nearest, scales
  8, 4, 2) and concatenated with the finest.
* Head (DB probability branch): 3x3 conv + Relu, `ConvTranspose` 2x2/2 + Relu, `ConvTranspose` 2x2/2, Sigmoid:
  output `maps` [batch, 1, image_size, image_size].
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder


class Block(NamedTuple):
    c_in: int
    expanded: int
    c_out: int
    act: str  # "RE" (Relu) or "HS" (hardswish)
    stride: int


STEM = 16
# One tuple of blocks per backbone stage; the stages' outputs are the FPN inputs at 1/4, 1/8, 1/16, 1/32.
STAGES = (
    (Block(16, 32, 24, "RE", 2), Block(24, 48, 24, "RE", 1)),
    (Block(24, 72, 32, "HS", 2), Block(32, 96, 32, "HS", 1)),
    (Block(32, 96, 48, "HS", 2), Block(48, 96, 48, "HS", 1)),
    (Block(48, 96, 64, "HS", 2), Block(64, 96, 64, "HS", 1)),
)


def _act(g: GraphBuilder, x: str, act: str, scope: str) -> str:
    return g.hardswish(x, scope) if act == "HS" else g.node("Relu", [x], scope)


def _block(g: GraphBuilder, x: str, b: Block, scope: str, param: str) -> str:
    h = g.conv(x, b.c_in, b.expanded, 1, f"{scope}/expand_conv", f"{param}.expand_conv")
    h = _act(g, h, b.act, f"{scope}/expand_act")
    h = g.conv(h, b.expanded, b.expanded, 3, f"{scope}/bottleneck_conv", f"{param}.bottleneck_conv", stride=b.stride,
               groups=b.expanded)
    h = _act(g, h, b.act, f"{scope}/bottleneck_act")
    h = g.conv(h, b.expanded, b.c_out, 1, f"{scope}/linear_conv", f"{param}.linear_conv")
    if b.stride == 1 and b.c_in == b.c_out:
        h = g.node("Add", [x, h], scope)
    return h


def _upsample(g: GraphBuilder, x: str, scale: int, scope: str) -> str:
    s = float(scale)
    return g.node("Resize", [x, "", g.const([1.0, 1.0, s, s])], scope, coordinate_transformation_mode="asymmetric",
                  cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")


def _conv_transpose(g: GraphBuilder, x: str, c_in: int, c_out: int, scope: str, param: str) -> str:
    """`nn.ConvTranspose2d(c_in, c_out, 2, stride=2)` with the following BatchNorm folded into its bias."""
    w = g.weight(f"{param}.weight", g.normal((c_in, c_out, 2, 2), np.sqrt(2.0 / (c_in * 4))))
    b = g.weight(f"{param}.bias", g.normal((c_out,), 0.05))
    return g.node("ConvTranspose", [x, w, b], scope, dilations=[1, 1], group=1, kernel_shape=[2, 2],
                  pads=[0, 0, 0, 0], strides=[2, 2])


def build(batch: int = 1, image_size: int = 320, *, neck_channels: int = 64, dynamic: bool = False,
          opset: int = 17, seed: int = 0, constants: str = "initializer") -> onnx.ModelProto:
    """Text detector: input `x` [batch, 3, image_size, image_size] -> `maps` [batch, 1, image_size, image_size].

    `image_size` must be a multiple of 32; `neck_channels` a multiple of 4 (the head works on a quarter of it).
    `dynamic=True` makes the batch dimension symbolic ("batch").
    """
    if not isinstance(image_size, int) or image_size < 32 or image_size % 32:
        raise UsageError(f"image_size must be a positive multiple of 32 for the OCR detector, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(neck_channels, int) or neck_channels < 4 or neck_channels % 4:
        raise UsageError(f"neck_channels must be a positive multiple of 4, not {neck_channels!r}")
    g = GraphBuilder(opset, seed, constants)
    b_dim = "batch" if dynamic else batch
    x = g.input("x", FLOAT, [b_dim, 3, image_size, image_size])

    # backbone
    h = g.conv(x, 3, STEM, 3, "/backbone/conv", "backbone.conv", stride=2)
    h = g.hardswish(h, "/backbone/conv/act")
    feats, chans = [], []
    for s, stage in enumerate(STAGES):
        for i, b in enumerate(stage):
            h = _block(g, h, b, f"/backbone/stages.{s}/stages.{s}.{i}", f"backbone.stages.{s}.{i}")
        feats.append(h)
        chans.append(stage[-1].c_out)

    # neck (DBFPN)
    inner = [g.conv(f, c, neck_channels, 1, f"/neck/in{k}_conv", f"neck.in{k}_conv", bias=False)
             for k, (f, c) in enumerate(zip(feats, chans), start=2)]
    outs = [inner[3]]
    for k in (2, 1, 0):  # out4 = in4 + up(in5), out3 = in3 + up(out4), out2 = in2 + up(out3)
        up = _upsample(g, outs[0], 2, f"/neck/up{k + 2}")
        outs.insert(0, g.node("Add", [inner[k], up], f"/neck/add{k + 2}"))
    quarter = neck_channels // 4
    ps = []
    for k, o in enumerate(outs, start=2):
        p = g.conv(o, neck_channels, quarter, 3, f"/neck/p{k}_conv", f"neck.p{k}_conv", bias=False)
        if k > 2:
            p = _upsample(g, p, 2 ** (k - 2), f"/neck/p{k}_up")
        ps.append(p)
    fuse = g.node("Concat", ps[::-1], "/neck", axis=1)

    # head (probability map)
    h = g.conv(fuse, neck_channels, quarter, 3, "/head/binarize/conv1", "head.binarize.conv1")
    h = g.node("Relu", [h], "/head/binarize/relu1")
    h = _conv_transpose(g, h, quarter, quarter, "/head/binarize/conv2", "head.binarize.conv2")
    h = g.node("Relu", [h], "/head/binarize/relu2")
    h = _conv_transpose(g, h, quarter, 1, "/head/binarize/conv3", "head.binarize.conv3")
    h = g.node("Sigmoid", [h], "/head/binarize")
    g.output(h, "maps", FLOAT, [b_dim, 1, image_size, image_size])
    return g.model("ocr_detector", {
        "model": "ocr_detector", "neck_channels": neck_channels, "batch": batch, "image_size": image_size,
    })
