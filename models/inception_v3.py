"""Inception-v3, laid out as torchvision's `inception_v3(aux_logits=False, transform_input=False)` exported in
eval mode (OptiFX's "GoogLeNet": 11 mixed blocks, 94 convs).

Every `BasicConv2d` is conv (BatchNorm folded in, with bias) + Relu. Stem at 299x299: Conv2d_1a 3x3/2 3->32
(valid, 149), Conv2d_2a 3x3 32->32 (valid, 147), Conv2d_2b 3x3 32->64 (pad 1), MaxPool 3x3/2 (73),
Conv2d_3b 1x1 64->80, Conv2d_4a 3x3 80->192 (valid, 71), MaxPool 3x3/2 (35). The pair Conv2d_3b -> Conv2d_4a
at 73x73 is OptiFX's G1 (SISO 1x1 -> 3x3). Mixed blocks:

* Mixed_5b/5c/5d, InceptionA (pool features 32, 64, 64): 1x1 64 | 1x1 48 -> 5x5 64 | 1x1 64 -> 3x3 96 ->
  3x3 96 | AveragePool 3x3/1 (pad 1, count_include_pad) -> 1x1 pool features; Concat (35x35, 256/288/288).
* Mixed_6a, InceptionB: 3x3/2 384 | 1x1 64 -> 3x3 96 -> 3x3/2 96 | MaxPool 3x3/2; Concat (17x17, 768).
* Mixed_6b..6e, InceptionC (c7 = 128, 160, 160, 192): 1x1 192 | 1x1 c7 -> 1x7 c7 -> 7x1 192 |
  1x1 c7 -> 7x1 c7 -> 1x7 c7 -> 7x1 c7 -> 1x7 192 | AveragePool -> 1x1 192; Concat (768).
* Mixed_7a, InceptionD: 1x1 192 -> 3x3/2 320 | 1x1 192 -> 1x7 192 -> 7x1 192 -> 3x3/2 192 | MaxPool 3x3/2;
  Concat (8x8, 1280).
* Mixed_7b/7c, InceptionE: 1x1 320 | 1x1 384 -> (1x3 384, 3x1 384) Concat | 1x1 448 -> 3x3 384 ->
  (1x3 384, 3x1 384) Concat | AveragePool -> 1x1 192; Concat (2048).

Head: GlobalAveragePool (adaptive pool to 1x1), Flatten (dropout is the identity in eval), Gemm 2048 -> 1000.
Convs: 5 (stem) + 3 x 7 + 4 + 4 x 10 + 6 + 2 x 9 = 94. Source: torchvision/models/inception.py
(Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", 2016).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder

C7 = (128, 160, 160, 192)  # Mixed_6b..6e


class _Net:
    def __init__(self, g: GraphBuilder):
        self.g = g

    def conv(self, x: str, c_in: int, c_out: int, kernel, name: str, scope: str, stride: int = 1, pad=0) -> str:
        """`BasicConv2d` `name` under `scope`: conv (BN folded, bias) + Relu; kernel/pad an int or (h, w)."""
        g = self.g
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        param = f"{scope.strip('/').replace('/', '.')}.{name}".lstrip(".")
        w = g.weight(f"{param}.conv.weight", g.normal((c_out, c_in, kh, kw), np.sqrt(2.0 / (c_in * kh * kw))))
        b = g.weight(f"{param}.conv.bias", g.normal((c_out,), 0.05))
        h = g.node("Conv", [x, w, b], f"{scope}/{name}/conv", dilations=[1, 1], group=1, kernel_shape=[kh, kw],
                   pads=[ph, pw, ph, pw], strides=[stride, stride])
        return g.node("Relu", [h], f"{scope}/{name}")

    def max_pool(self, x: str, scope: str) -> str:
        return self.g.node("MaxPool", [x], scope, ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
                           pads=[0, 0, 0, 0], strides=[2, 2])

    def avg_pool(self, x: str, scope: str) -> str:
        """`F.avg_pool2d(x, 3, stride=1, padding=1)` (count_include_pad=True)."""
        return self.g.node("AveragePool", [x], scope, ceil_mode=0, count_include_pad=1, kernel_shape=[3, 3],
                           pads=[1, 1, 1, 1], strides=[1, 1])

    def cat(self, xs: list[str], scope: str) -> str:
        return self.g.node("Concat", xs, scope, axis=1)

    # -- mixed blocks ----------------------------------------------------------------------------------------
    def inception_a(self, x: str, c_in: int, pool_features: int, s: str) -> tuple[str, int]:
        b1 = self.conv(x, c_in, 64, 1, "branch1x1", s)
        b5 = self.conv(x, c_in, 48, 1, "branch5x5_1", s)
        b5 = self.conv(b5, 48, 64, 5, "branch5x5_2", s, pad=2)
        b3 = self.conv(x, c_in, 64, 1, "branch3x3dbl_1", s)
        b3 = self.conv(b3, 64, 96, 3, "branch3x3dbl_2", s, pad=1)
        b3 = self.conv(b3, 96, 96, 3, "branch3x3dbl_3", s, pad=1)
        bp = self.conv(self.avg_pool(x, s), c_in, pool_features, 1, "branch_pool", s)
        return self.cat([b1, b5, b3, bp], s), 64 + 64 + 96 + pool_features

    def inception_b(self, x: str, c_in: int, s: str) -> tuple[str, int]:
        b3 = self.conv(x, c_in, 384, 3, "branch3x3", s, stride=2)
        bd = self.conv(x, c_in, 64, 1, "branch3x3dbl_1", s)
        bd = self.conv(bd, 64, 96, 3, "branch3x3dbl_2", s, pad=1)
        bd = self.conv(bd, 96, 96, 3, "branch3x3dbl_3", s, stride=2)
        bp = self.max_pool(x, s)
        return self.cat([b3, bd, bp], s), 384 + 96 + c_in

    def inception_c(self, x: str, c_in: int, c7: int, s: str) -> tuple[str, int]:
        b1 = self.conv(x, c_in, 192, 1, "branch1x1", s)
        b7 = self.conv(x, c_in, c7, 1, "branch7x7_1", s)
        b7 = self.conv(b7, c7, c7, (1, 7), "branch7x7_2", s, pad=(0, 3))
        b7 = self.conv(b7, c7, 192, (7, 1), "branch7x7_3", s, pad=(3, 0))
        bd = self.conv(x, c_in, c7, 1, "branch7x7dbl_1", s)
        bd = self.conv(bd, c7, c7, (7, 1), "branch7x7dbl_2", s, pad=(3, 0))
        bd = self.conv(bd, c7, c7, (1, 7), "branch7x7dbl_3", s, pad=(0, 3))
        bd = self.conv(bd, c7, c7, (7, 1), "branch7x7dbl_4", s, pad=(3, 0))
        bd = self.conv(bd, c7, 192, (1, 7), "branch7x7dbl_5", s, pad=(0, 3))
        bp = self.conv(self.avg_pool(x, s), c_in, 192, 1, "branch_pool", s)
        return self.cat([b1, b7, bd, bp], s), 4 * 192

    def inception_d(self, x: str, c_in: int, s: str) -> tuple[str, int]:
        b3 = self.conv(x, c_in, 192, 1, "branch3x3_1", s)
        b3 = self.conv(b3, 192, 320, 3, "branch3x3_2", s, stride=2)
        b7 = self.conv(x, c_in, 192, 1, "branch7x7x3_1", s)
        b7 = self.conv(b7, 192, 192, (1, 7), "branch7x7x3_2", s, pad=(0, 3))
        b7 = self.conv(b7, 192, 192, (7, 1), "branch7x7x3_3", s, pad=(3, 0))
        b7 = self.conv(b7, 192, 192, 3, "branch7x7x3_4", s, stride=2)
        bp = self.max_pool(x, s)
        return self.cat([b3, b7, bp], s), 320 + 192 + c_in

    def inception_e(self, x: str, c_in: int, s: str) -> tuple[str, int]:
        b1 = self.conv(x, c_in, 320, 1, "branch1x1", s)
        b3 = self.conv(x, c_in, 384, 1, "branch3x3_1", s)
        b3 = self.cat([self.conv(b3, 384, 384, (1, 3), "branch3x3_2a", s, pad=(0, 1)),
                       self.conv(b3, 384, 384, (3, 1), "branch3x3_2b", s, pad=(1, 0))], s)
        bd = self.conv(x, c_in, 448, 1, "branch3x3dbl_1", s)
        bd = self.conv(bd, 448, 384, 3, "branch3x3dbl_2", s, pad=1)
        bd = self.cat([self.conv(bd, 384, 384, (1, 3), "branch3x3dbl_3a", s, pad=(0, 1)),
                       self.conv(bd, 384, 384, (3, 1), "branch3x3dbl_3b", s, pad=(1, 0))], s)
        bp = self.conv(self.avg_pool(x, s), c_in, 192, 1, "branch_pool", s)
        return self.cat([b1, b3, bd, bp], s), 320 + 768 + 768 + 192


def build(batch: int = 1, image_size: int = 299, *, num_classes: int = 1000, opset: int = 17, seed: int = 0,
          constants: str = "initializer") -> onnx.ModelProto:
    """Inception-v3 classifier: input `input` [batch, 3, image_size, image_size] -> `output` [batch, num_classes].

    `image_size` must be at least 75 (torchvision's minimum; 299 is the native size). `constants="node"`
    writes constants as Constant nodes (the graph has none by default).
    """
    if not isinstance(image_size, int) or image_size < 75:
        raise UsageError(f"image_size must be an integer >= 75, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"num_classes must be a positive integer, not {num_classes!r}")
    g = GraphBuilder(opset, seed, constants)
    net = _Net(g)
    x = g.input("input", FLOAT, [batch, 3, image_size, image_size])

    h = net.conv(x, 3, 32, 3, "Conv2d_1a_3x3", "", stride=2)
    h = net.conv(h, 32, 32, 3, "Conv2d_2a_3x3", "")
    h = net.conv(h, 32, 64, 3, "Conv2d_2b_3x3", "", pad=1)
    h = net.max_pool(h, "/maxpool1")
    h = net.conv(h, 64, 80, 1, "Conv2d_3b_1x1", "")
    h = net.conv(h, 80, 192, 3, "Conv2d_4a_3x3", "")
    h = net.max_pool(h, "/maxpool2")
    c = 192
    for name, pool_features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        h, c = net.inception_a(h, c, pool_features, f"/{name}")
    h, c = net.inception_b(h, c, "/Mixed_6a")
    for name, c7 in zip(("Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e"), C7):
        h, c = net.inception_c(h, c, c7, f"/{name}")
    h, c = net.inception_d(h, c, "/Mixed_7a")
    h, c = net.inception_e(h, c, "/Mixed_7b")
    h, c = net.inception_e(h, c, "/Mixed_7c")
    h = g.node("GlobalAveragePool", [h], "/avgpool")
    h = g.node("Flatten", [h], "", axis=1)
    h = g.gemm(h, c, num_classes, "/fc", "fc")
    g.output(h, "output", FLOAT, [batch, num_classes])
    return g.model("inception_v3", {
        "model": "inception_v3", "num_classes": num_classes, "batch": batch, "image_size": image_size,
    })
