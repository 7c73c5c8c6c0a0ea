"""MobileNetV3 (Small / Large), laid out as torchvision's `mobilenet_v3_*` exports in eval mode.

BatchNorm is folded into the convolutions (conv with bias). Hardswish is decomposed as
`x * Clip(x + 3, 0, 6) / 6` (Add, Clip, Mul, Div), the squeeze-and-excitation gate's hardsigmoid as
`Clip(x + 3, 0, 6) / 6` (Add, Clip, Div) followed by a Mul with the block tensor.
"""

from __future__ import annotations

from typing import NamedTuple

import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder


class Block(NamedTuple):
    c_in: int
    kernel: int
    expanded: int
    c_out: int
    se: bool
    act: str  # "RE" (ReLU) or "HS" (hardswish)
    stride: int


# torchvision `_mobilenet_v3_conf` (dilation 1, reduce_divider 1).
SMALL = (
    Block(16, 3, 16, 16, True, "RE", 2),
    Block(16, 3, 72, 24, False, "RE", 2),
    Block(24, 3, 88, 24, False, "RE", 1),
    Block(24, 5, 96, 40, True, "HS", 2),
    Block(40, 5, 240, 40, True, "HS", 1),
    Block(40, 5, 240, 40, True, "HS", 1),
    Block(40, 5, 120, 48, True, "HS", 1),
    Block(48, 5, 144, 48, True, "HS", 1),
    Block(48, 5, 288, 96, True, "HS", 2),
    Block(96, 5, 576, 96, True, "HS", 1),
    Block(96, 5, 576, 96, True, "HS", 1),
)
LARGE = (
    Block(16, 3, 16, 16, False, "RE", 1),
    Block(16, 3, 64, 24, False, "RE", 2),
    Block(24, 3, 72, 24, False, "RE", 1),
    Block(24, 5, 72, 40, True, "RE", 2),
    Block(40, 5, 120, 40, True, "RE", 1),
    Block(40, 5, 120, 40, True, "RE", 1),
    Block(40, 3, 240, 80, False, "HS", 2),
    Block(80, 3, 200, 80, False, "HS", 1),
    Block(80, 3, 184, 80, False, "HS", 1),
    Block(80, 3, 184, 80, False, "HS", 1),
    Block(80, 3, 480, 112, True, "HS", 1),
    Block(112, 3, 672, 112, True, "HS", 1),
    Block(112, 5, 672, 160, True, "HS", 2),
    Block(160, 5, 960, 160, True, "HS", 1),
    Block(160, 5, 960, 160, True, "HS", 1),
)
VARIANTS = {"small": (SMALL, 1024), "large": (LARGE, 1280)}


def make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def layer_table(variant: str = "small", width_mult: float = 1.0) -> list[Block]:
    """The block table with channels scaled by `width_mult` (as torchvision's `adjust_channels`)."""
    if variant not in VARIANTS:
        raise UsageError(f"unknown MobileNetV3 variant {variant!r}; use one of {sorted(VARIANTS)}")
    if not width_mult > 0:
        raise UsageError(f"width_mult must be positive, not {width_mult!r}")
    adj = lambda c: make_divisible(c * width_mult)  # noqa: E731
    return [b._replace(c_in=adj(b.c_in), expanded=adj(b.expanded), c_out=adj(b.c_out)) for b in VARIANTS[variant][0]]


def _act(g: GraphBuilder, x: str, act: str, scope: str) -> str:
    return g.hardswish(x, scope) if act == "HS" else g.node("Relu", [x], scope)


def _block(g: GraphBuilder, x: str, b: Block, idx: int) -> str:
    scope, param = f"/features/features.{idx}", f"features.{idx}"
    h = x
    layer = 0
    if b.expanded != b.c_in:
        s = f"{scope}/block/block.{layer}"
        h = g.conv(h, b.c_in, b.expanded, 1, f"{s}/0", f"{param}.block.{layer}.0")
        h = _act(g, h, b.act, f"{s}/2")
        layer += 1
    s = f"{scope}/block/block.{layer}"
    h = g.conv(h, b.expanded, b.expanded, b.kernel, f"{s}/0", f"{param}.block.{layer}.0", stride=b.stride,
               pad=(b.kernel - 1) // 2, groups=b.expanded)
    h = _act(g, h, b.act, f"{s}/2")
    layer += 1
    if b.se:
        s, p = f"{scope}/block/block.{layer}", f"{param}.block.{layer}"
        squeeze = make_divisible(b.expanded // 4)
        z = g.node("GlobalAveragePool", [h], f"{s}/avgpool")
        z = g.conv(z, b.expanded, squeeze, 1, f"{s}/fc1", f"{p}.fc1")
        z = g.node("Relu", [z], f"{s}/activation")
        z = g.conv(z, squeeze, b.expanded, 1, f"{s}/fc2", f"{p}.fc2")
        z = g.hardsigmoid(z, f"{s}/scale_activation")
        h = g.node("Mul", [z, h], s)
        layer += 1
    s = f"{scope}/block/block.{layer}"
    h = g.conv(h, b.expanded, b.c_out, 1, f"{s}/0", f"{param}.block.{layer}.0")
    if b.stride == 1 and b.c_in == b.c_out:
        h = g.node("Add", [h, x], scope)
    return h


def build(batch: int = 1, image_size: int = 224, *, variant: str = "small", width_mult: float = 1.0,
          num_classes: int = 1000, dynamic: bool = False, opset: int = 17, seed: int = 0,
          constants: str = "initializer") -> onnx.ModelProto:
    """MobileNetV3 classifier: input `input` [batch, 3, image_size, image_size] -> `output` [batch, num_classes].

    `dynamic=True` makes the batch dimension symbolic ("batch"); `constants="node"` writes scalar constants
    as Constant nodes instead of initializers.
    """
    if not isinstance(image_size, int) or image_size < 32:
        raise UsageError(f"image_size must be an integer >= 32, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    table = layer_table(variant, width_mult)
    last_channel = make_divisible(VARIANTS[variant][1] * width_mult)
    g = GraphBuilder(opset, seed, constants)
    b_dim = "batch" if dynamic else batch
    x = g.input("input", FLOAT, [b_dim, 3, image_size, image_size])

    stem = table[0].c_in
    h = g.conv(x, 3, stem, 3, "/features/features.0/features.0.0", "features.0.0", stride=2)
    h = g.hardswish(h, "/features/features.0/features.0.2")
    for i, b in enumerate(table, start=1):
        h = _block(g, h, b, i)
    last_in = table[-1].c_out
    last_out = 6 * last_in
    n = len(table) + 1
    h = g.conv(h, last_in, last_out, 1, f"/features/features.{n}/features.{n}.0", f"features.{n}.0")
    h = g.hardswish(h, f"/features/features.{n}/features.{n}.2")
    h = g.node("GlobalAveragePool", [h], "/avgpool")
    h = g.node("Flatten", [h], "", axis=1)
    h = g.gemm(h, last_out, last_channel, "/classifier/classifier.0", "classifier.0")
    h = g.hardswish(h, "/classifier/classifier.1")
    h = g.gemm(h, last_channel, num_classes, "/classifier/classifier.3", "classifier.3")
    g.output(h, "output", FLOAT, [b_dim, num_classes])
    return g.model(f"mobilenet_v3_{variant}", {
        "model": "mobilenetv3", "variant": variant, "width_mult": width_mult,
        "batch": batch, "image_size": image_size,
    })
