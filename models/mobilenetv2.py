"""MobileNetV2 1.0, laid out as torchvision's `mobilenet_v2` exported in eval mode (OptiFX's "MobileNet").

BatchNorm is folded into the convolutions (conv with bias); ReLU6 is `Clip(x, 0, 6)`. Stem: 3x3/2 conv 3 -> 32
+ Clip. Inverted residual blocks, (t, c, n, s) = (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
(6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1): 1x1 expand to t * c_in + Clip (absent when t = 1), 3x3
depthwise conv carrying the stride + Clip, 1x1 linear projection to c, and an `Add` with the block input when
the stride is 1 and c_in == c (10 blocks). Then 1x1 conv 320 -> 1280 + Clip, GlobalAveragePool, Flatten and
Gemm 1280 -> num_classes (dropout is the identity in eval). 52 convs, 10 residual Adds, 35 Clips.

At 224x224 the first c = 32 block (features.4) runs 1x1 24 -> 144 at 56x56, a depthwise 3x3/2 over 144
channels from 56x56 to 28x28, then 1x1 144 -> 32: the depthwise -> projection pair is OptiFX's G4 (SISO).
Source: torchvision/models/mobilenetv2.py (Sandler et al., "MobileNetV2: Inverted Residuals and Linear
Bottlenecks", 2018).
"""

from __future__ import annotations

import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder
from .mobilenetv3 import make_divisible

SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
            (6, 320, 1, 1))


def _conv_relu6(g: GraphBuilder, x: str, c_in: int, c_out: int, k: int, scope: str, param: str, stride: int = 1,
                groups: int = 1) -> str:
    """`Conv2dNormActivation` `<scope>`: conv `<scope>/<scope>.0` (BN folded) + Clip `<scope>/<scope>.2`."""
    last = scope.rsplit("/", 1)[-1]
    h = g.conv(x, c_in, c_out, k, f"{scope}/{last}.0", f"{param}.0", stride=stride, groups=groups)
    return g.clip(h, 0.0, 6.0, f"{scope}/{last}.2")


def _inverted_residual(g: GraphBuilder, x: str, c_in: int, c_out: int, stride: int, t: int, idx: int) -> str:
    scope, param = f"/features/features.{idx}/conv", f"features.{idx}.conv"
    hidden = c_in * t
    h, layer = x, 0
    if t != 1:
        h = _conv_relu6(g, h, c_in, hidden, 1, f"{scope}/conv.{layer}", f"{param}.{layer}")
        layer += 1
    h = _conv_relu6(g, h, hidden, hidden, 3, f"{scope}/conv.{layer}", f"{param}.{layer}", stride=stride,
                    groups=hidden)
    h = g.conv(h, hidden, c_out, 1, f"{scope}/conv.{layer + 1}", f"{param}.{layer + 1}")
    if stride == 1 and c_in == c_out:
        h = g.node("Add", [x, h], f"/features/features.{idx}")
    return h


def build(batch: int = 1, image_size: int = 224, *, width_mult: float = 1.0, num_classes: int = 1000,
          opset: int = 17, seed: int = 0, constants: str = "initializer") -> onnx.ModelProto:
    """MobileNetV2 classifier: input `input` [batch, 3, image_size, image_size] -> `output` [batch, num_classes].

    `width_mult` scales the channels as torchvision does (rounded to multiples of 8; the last conv keeps 1280
    channels for width_mult <= 1).
    """
    if not isinstance(image_size, int) or image_size < 32:
        raise UsageError(f"image_size must be an integer >= 32, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not width_mult > 0:
        raise UsageError(f"width_mult must be positive, not {width_mult!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"num_classes must be a positive integer, not {num_classes!r}")
    g = GraphBuilder(opset, seed, constants)
    x = g.input("input", FLOAT, [batch, 3, image_size, image_size])

    c = make_divisible(32 * width_mult)
    last = make_divisible(1280 * max(1.0, width_mult))
    h = _conv_relu6(g, x, 3, c, 3, "/features/features.0", "features.0", stride=2)
    idx = 1
    for t, ch, n, s in SETTINGS:
        c_out = make_divisible(ch * width_mult)
        for i in range(n):
            h = _inverted_residual(g, h, c, c_out, s if i == 0 else 1, t, idx)
            c, idx = c_out, idx + 1
    h = _conv_relu6(g, h, c, last, 1, f"/features/features.{idx}", f"features.{idx}")
    h = g.node("GlobalAveragePool", [h], "")
    h = g.node("Flatten", [h], "", axis=1)
    h = g.gemm(h, last, num_classes, "/classifier/classifier.1", "classifier.1")
    g.output(h, "output", FLOAT, [batch, num_classes])
    return g.model("mobilenet_v2", {
        "model": "mobilenetv2", "width_mult": width_mult, "num_classes": num_classes, "batch": batch,
        "image_size": image_size,
    })
