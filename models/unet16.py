"""A small 16-channel UNet with strided-conv downsampling (our reconstruction of OptiFX's custom "UNet"; the
paper gives no layer table, only its G7 pattern: a 3x3/2 16 -> 16 conv at 56x56 feeding a 1x1 and a 3x3
16 -> 32 conv).

Every conv is conv (BatchNorm folded in, with bias) followed by Relu unless noted. At image_size S (112):

* `inc` at S x S: 3x3 3 -> 16, 3x3 16 -> 16 (skip e0).
* Encoder levels `down1`..`down4` with widths 16, 32, 64, 128 at S/2 .. S/16 (56, 28, 14, 7): a strided
  3x3/2 conv (pad 1) keeping the channels, then a residual block on its output: 3x3 c_in -> c_out, 3x3
  c_out -> c_out (no Relu), plus the shortcut, a 1x1 c_in -> c_out projection (identity when c_in == c_out,
  i.e. in `down1`), `Add`, Relu. Skips e1..e3 are the outputs of `down1`..`down3`.
* Decoder levels `up1`..`up4`: Resize (nearest, scale 2), Concat with the skip (upsampled tensor first),
  3x3 to the skip's width, 3x3 (widths 64, 32, 16, 16 at S/8 .. S).
* `outc`: 1x1 16 -> 1 (no activation) -> `output` [batch, 1, S, S] (logits).

26 convs, 4 Adds, 4 Resizes, 4 Concats. G7 (SIMO): `down2`'s downsampling conv 3x3/2 16 -> 16 reads the
56x56 output of `down1` and its (Relu'd) 28x28 output feeds both the 1x1 16 -> 32 projection and the first
3x3 16 -> 32 conv of the residual block; the two branches meet again in the `Add`.
"""

from __future__ import annotations

import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder

WIDTHS = (16, 32, 64, 128)  # encoder levels down1..down4
BASE = 16  # full-resolution width


def _conv(g: GraphBuilder, x: str, c_in: int, c_out: int, k: int, scope: str, stride: int = 1,
          relu: bool = True) -> str:
    h = g.conv(x, c_in, c_out, k, f"/{scope.replace('.', '/')}", scope, stride=stride)
    return g.node("Relu", [h], f"/{scope.replace('.', '/')}") if relu else h


def _down(g: GraphBuilder, x: str, c_in: int, c_out: int, name: str) -> str:
    d = _conv(g, x, c_in, c_in, 3, f"{name}.down", stride=2)
    h = _conv(g, d, c_in, c_out, 3, f"{name}.conv1")
    h = _conv(g, h, c_out, c_out, 3, f"{name}.conv2", relu=False)
    shortcut = d if c_in == c_out else _conv(g, d, c_in, c_out, 1, f"{name}.proj", relu=False)
    h = g.node("Add", [h, shortcut], f"/{name}")
    return g.node("Relu", [h], f"/{name}/relu")


def _up(g: GraphBuilder, x: str, c_in: int, skip: str, c_skip: int, name: str) -> str:
    u = g.node("Resize", [x, "", g.const([1.0, 1.0, 2.0, 2.0])], f"/{name}/up",
               coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")
    h = g.node("Concat", [u, skip], f"/{name}", axis=1)
    h = _conv(g, h, c_in + c_skip, c_skip, 3, f"{name}.conv1")
    return _conv(g, h, c_skip, c_skip, 3, f"{name}.conv2")


def build(batch: int = 1, image_size: int = 112, *, opset: int = 17, seed: int = 0,
          constants: str = "initializer") -> onnx.ModelProto:
    """UNet: input `input` [batch, 3, image_size, image_size] -> `output` [batch, 1, image_size, image_size].

    `image_size` must be a multiple of 16 (four stride-2 levels).
    """
    if not isinstance(image_size, int) or image_size < 16 or image_size % 16:
        raise UsageError(f"image_size must be a positive multiple of 16, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    g = GraphBuilder(opset, seed, constants)
    x = g.input("input", FLOAT, [batch, 3, image_size, image_size])

    h = _conv(g, x, 3, BASE, 3, "inc.0")
    h = _conv(g, h, BASE, BASE, 3, "inc.1")
    skips, c = [(h, BASE)], BASE
    for i, w in enumerate(WIDTHS, start=1):
        h = _down(g, h, c, w, f"down{i}")
        skips.append((h, w))
        c = w
    skips.pop()  # the bottleneck is no skip
    for i, (skip, c_skip) in enumerate(reversed(skips), start=1):
        h = _up(g, h, c, skip, c_skip, f"up{i}")
        c = c_skip
    h = _conv(g, h, c, 1, 1, "outc", relu=False)
    g.output(h, "output", FLOAT, [batch, 1, image_size, image_size])
    return g.model("unet16", {"model": "unet16", "batch": batch, "image_size": image_size})
