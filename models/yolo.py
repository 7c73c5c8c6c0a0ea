"""YOLO detectors laid out as the Ultralytics ONNX exports (`yolov5*.onnx`, `yolov8*.onnx`).

Every `Conv` module is conv (BatchNorm folded in, with bias) + SiLU written as `x * Sigmoid(x)`
(Sigmoid, Mul). Backbone: strided convs and CSP blocks (C2f for v8, C3 for v5), SPPF (MaxPool 5x5 three
times + Concat). Neck: PAN with Resize (nearest, scale 2) + Concat. Heads:

* v8: per level two conv branches (box distribution, class logits) -> Reshape/Concat -> DFL (Softmax over
  the bins + 1x1 conv with arange weights) -> dist2bbox with constant anchor points (Sub, Add, Add, Div,
  Sub, Concat) -> Mul by strides; classes through Sigmoid. Output `output0` [batch, 4 + classes, anchors].
* v5: per level a 1x1 conv -> Reshape/Transpose -> Sigmoid -> Split -> xy `(y * 2 + grid) * stride`,
  wh `(y * 2) ** 2 * anchor_grid` -> Concat. Output `output0` [batch, 3 * anchors, 5 + classes].
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder

BASE_WIDTHS = (64, 128, 256, 512, 1024)
V5_ANCHORS = (
    ((10, 13), (16, 30), (33, 23)),
    ((30, 61), (62, 45), (59, 119)),
    ((116, 90), (156, 198), (373, 326)),
)
STRIDES = (8, 16, 32)
REG_MAX = 16


def _width(c: int, width: float, max_channels: int = 1024) -> int:
    return int(math.ceil(min(c, max_channels) * width / 8) * 8)


def _depth(n: int, depth: float) -> int:
    return max(round(n * depth), 1) if n > 1 else n


class _Yolo:
    def __init__(self, g: GraphBuilder):
        self.g = g
        self.layer = 0

    def conv(self, x, c1, c2, k, scope, param, s=1, p=None, act=True):
        """Ultralytics `Conv`: conv (folded BN) + SiLU."""
        h = self.g.conv(x, c1, c2, k, f"{scope}/conv", f"{param}.conv", stride=s, pad=p)
        return self.g.silu(h, f"{scope}/act") if act else h

    def bottleneck(self, x, c1, c2, shortcut, k, scope, param):
        h = self.conv(x, c1, c2, k[0], f"{scope}/cv1", f"{param}.cv1")
        h = self.conv(h, c2, c2, k[1], f"{scope}/cv2", f"{param}.cv2")
        return self.g.node("Add", [x, h], scope) if shortcut and c1 == c2 else h

    def c2f(self, x, c1, c2, n, shortcut, scope, param):
        c = int(c2 * 0.5)
        h = self.conv(x, c1, 2 * c, 1, f"{scope}/cv1", f"{param}.cv1")
        ys = list(self.g.split(h, [c, c], 1, scope))
        for i in range(n):
            ys.append(self.bottleneck(ys[-1], c, c, shortcut, (3, 3), f"{scope}/m.{i}", f"{param}.m.{i}"))
        h = self.g.node("Concat", ys, scope, axis=1)
        return self.conv(h, (2 + n) * c, c2, 1, f"{scope}/cv2", f"{param}.cv2")

    def c3(self, x, c1, c2, n, shortcut, scope, param):
        c = int(c2 * 0.5)
        a = self.conv(x, c1, c, 1, f"{scope}/cv1", f"{param}.cv1")
        for i in range(n):
            a = self.bottleneck(a, c, c, shortcut, (1, 3), f"{scope}/m/m.{i}", f"{param}.m.{i}")
        b = self.conv(x, c1, c, 1, f"{scope}/cv2", f"{param}.cv2")
        h = self.g.node("Concat", [a, b], scope, axis=1)
        return self.conv(h, 2 * c, c2, 1, f"{scope}/cv3", f"{param}.cv3")

    def sppf(self, x, c1, c2, scope, param, k=5):
        c = c1 // 2
        ys = [self.conv(x, c1, c, 1, f"{scope}/cv1", f"{param}.cv1")]
        for _ in range(3):
            ys.append(self.g.node("MaxPool", [ys[-1]], f"{scope}/m", ceil_mode=0, dilations=[1, 1],
                                  kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1]))
        h = self.g.node("Concat", ys, scope, axis=1)
        return self.conv(h, 4 * c, c2, 1, f"{scope}/cv2", f"{param}.cv2")

    def upsample(self, x, scope):
        g = self.g
        return g.node("Resize", [x, "", g.const([1.0, 1.0, 2.0, 2.0])], scope,
                      coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.75, mode="nearest",
                      nearest_mode="floor")

    def concat(self, xs, scope):
        return self.g.node("Concat", xs, scope, axis=1)


def _m(i: int) -> tuple[str, str]:
    return f"/model.{i}", f"model.{i}"


def _v8(y: _Yolo, x, image_size, depth, width, nc):
    g = y.g
    w = [_width(c, width) for c in BASE_WIDTHS]
    d = lambda n: _depth(n, depth)  # noqa: E731
    h = y.conv(x, 3, w[0], 3, *_m(0), s=2)
    h = y.conv(h, w[0], w[1], 3, *_m(1), s=2)
    h = y.c2f(h, w[1], w[1], d(3), True, *_m(2))
    h = y.conv(h, w[1], w[2], 3, *_m(3), s=2)
    p3 = h = y.c2f(h, w[2], w[2], d(6), True, *_m(4))
    h = y.conv(h, w[2], w[3], 3, *_m(5), s=2)
    p4 = h = y.c2f(h, w[3], w[3], d(6), True, *_m(6))
    h = y.conv(h, w[3], w[4], 3, *_m(7), s=2)
    h = y.c2f(h, w[4], w[4], d(3), True, *_m(8))
    p5 = h = y.sppf(h, w[4], w[4], *_m(9))
    # PAN neck
    h = y.upsample(h, "/model.10")
    h = y.concat([h, p4], "/model.11")
    n12 = h = y.c2f(h, w[4] + w[3], w[3], d(3), False, *_m(12))
    h = y.upsample(h, "/model.13")
    h = y.concat([h, p3], "/model.14")
    o3 = h = y.c2f(h, w[3] + w[2], w[2], d(3), False, *_m(15))
    h = y.conv(h, w[2], w[2], 3, *_m(16), s=2)
    h = y.concat([h, n12], "/model.17")
    o4 = h = y.c2f(h, w[2] + w[3], w[3], d(3), False, *_m(18))
    h = y.conv(h, w[3], w[3], 3, *_m(19), s=2)
    h = y.concat([h, p5], "/model.20")
    o5 = y.c2f(h, w[3] + w[4], w[4], d(3), False, *_m(21))

    # Detect
    scope, param = _m(22)
    chs = (w[2], w[3], w[4])
    c2 = max(16, chs[0] // 4, REG_MAX * 4)
    c3 = max(chs[0], min(nc, 100))
    no = 4 * REG_MAX + nc
    flat = []
    for i, (feat, c) in enumerate(zip((o3, o4, o5), chs)):
        s, p = f"{scope}/cv2.{i}", f"{param}.cv2.{i}"
        b = y.conv(feat, c, c2, 3, f"{s}/cv2.{i}.0", f"{p}.0")
        b = y.conv(b, c2, c2, 3, f"{s}/cv2.{i}.1", f"{p}.1")
        b = g.conv(b, c2, 4 * REG_MAX, 1, f"{s}/cv2.{i}.2", f"{p}.2")
        s, p = f"{scope}/cv3.{i}", f"{param}.cv3.{i}"
        k = y.conv(feat, c, c3, 3, f"{s}/cv3.{i}.0", f"{p}.0")
        k = y.conv(k, c3, c3, 3, f"{s}/cv3.{i}.1", f"{p}.1")
        k = g.conv(k, c3, nc, 1, f"{s}/cv3.{i}.2", f"{p}.2")
        h = g.node("Concat", [b, k], scope, axis=1)
        flat.append(g.reshape(h, [0, no, -1], scope))
    cat = g.node("Concat", flat, scope, axis=2)
    box, cls = g.split(cat, [4 * REG_MAX, nc], 1, scope)
    # DFL: softmax over the REG_MAX bins, expectation by a fixed 1x1 conv
    dfl = f"{scope}/dfl"
    h = g.reshape(box, [0, 4, REG_MAX, -1], dfl)
    h = g.node("Transpose", [h], dfl, perm=[0, 2, 1, 3])
    h = g.node("Softmax", [h], dfl, axis=1)
    wdfl = g.weight(f"{param}.dfl.conv.weight", np.arange(REG_MAX, dtype=np.float32).reshape(1, REG_MAX, 1, 1))
    h = g.node("Conv", [h, wdfl], f"{dfl}/conv", dilations=[1, 1], group=1, kernel_shape=[1, 1],
               pads=[0, 0, 0, 0], strides=[1, 1])
    dist = g.reshape(h, [0, 4, -1], dfl)
    # dist2bbox(xywh=True) with constant anchor points, then scale by strides
    points, strides = [], []
    for st in STRIDES:
        n = image_size // st
        sx, sy = np.meshgrid(np.arange(n, dtype=np.float32) + 0.5, np.arange(n, dtype=np.float32) + 0.5)
        points.append(np.stack([sx.ravel(), sy.ravel()], 0))
        strides.append(np.full((1, n * n), st, np.float32))
    anchors = g.weight("anchors", np.concatenate(points, 1)[None])  # [1, 2, A]
    stride_t = g.weight("strides", np.concatenate(strides, 1))  # [1, A]
    lt, rb = g.split(dist, [2, 2], 1, scope)
    x1y1 = g.node("Sub", [anchors, lt], scope)
    x2y2 = g.node("Add", [anchors, rb], scope)
    c_xy = g.node("Div", [g.node("Add", [x1y1, x2y2], scope), g.const(2.0)], scope)
    wh = g.node("Sub", [x2y2, x1y1], scope)
    dbox = g.node("Mul", [g.node("Concat", [c_xy, wh], scope, axis=1), stride_t], scope)
    out = g.node("Concat", [dbox, g.node("Sigmoid", [cls], scope)], scope, axis=1)
    n_anchors = sum((image_size // st) ** 2 for st in STRIDES)
    return out, [4 + nc, n_anchors]


def _v5(y: _Yolo, x, image_size, depth, width, nc):
    g = y.g
    w = [_width(c, width) for c in BASE_WIDTHS]
    d = lambda n: _depth(n, depth)  # noqa: E731
    h = y.conv(x, 3, w[0], 6, *_m(0), s=2, p=2)
    h = y.conv(h, w[0], w[1], 3, *_m(1), s=2)
    h = y.c3(h, w[1], w[1], d(3), True, *_m(2))
    h = y.conv(h, w[1], w[2], 3, *_m(3), s=2)
    p3 = h = y.c3(h, w[2], w[2], d(6), True, *_m(4))
    h = y.conv(h, w[2], w[3], 3, *_m(5), s=2)
    p4 = h = y.c3(h, w[3], w[3], d(9), True, *_m(6))
    h = y.conv(h, w[3], w[4], 3, *_m(7), s=2)
    h = y.c3(h, w[4], w[4], d(3), True, *_m(8))
    h = y.sppf(h, w[4], w[4], *_m(9))
    # PAN neck
    n10 = h = y.conv(h, w[4], w[3], 1, *_m(10))
    h = y.upsample(h, "/model.11")
    h = y.concat([h, p4], "/model.12")
    h = y.c3(h, 2 * w[3], w[3], d(3), False, *_m(13))
    n14 = h = y.conv(h, w[3], w[2], 1, *_m(14))
    h = y.upsample(h, "/model.15")
    h = y.concat([h, p3], "/model.16")
    o3 = h = y.c3(h, 2 * w[2], w[2], d(3), False, *_m(17))
    h = y.conv(h, w[2], w[2], 3, *_m(18), s=2)
    h = y.concat([h, n14], "/model.19")
    o4 = h = y.c3(h, 2 * w[2], w[3], d(3), False, *_m(20))
    h = y.conv(h, w[3], w[3], 3, *_m(21), s=2)
    h = y.concat([h, n10], "/model.22")
    o5 = y.c3(h, 2 * w[3], w[4], d(3), False, *_m(23))

    # Detect
    scope, param = _m(24)
    na, no = 3, nc + 5
    outs, total = [], 0
    for i, (feat, c, st, anc) in enumerate(zip((o3, o4, o5), (w[2], w[3], w[4]), STRIDES, V5_ANCHORS)):
        n = image_size // st
        h = g.conv(feat, c, na * no, 1, f"{scope}/m.{i}", f"{param}.m.{i}")
        h = g.reshape(h, [0, na, no, n, n], scope)
        h = g.node("Transpose", [h], scope, perm=[0, 1, 3, 4, 2])
        h = g.node("Sigmoid", [h], scope)
        xy, wh, conf = g.split(h, [2, 2, nc + 1], 4, scope)
        yv, xv = np.meshgrid(np.arange(n, dtype=np.float32), np.arange(n, dtype=np.float32), indexing="ij")
        grid = np.broadcast_to(np.stack([xv, yv], -1)[None, None] - 0.5, (1, na, n, n, 2))
        anchor_grid = np.broadcast_to(np.asarray(anc, np.float32).reshape(1, na, 1, 1, 2), (1, na, n, n, 2))
        grid_t = g.weight(f"{param}.grid.{i}", np.array(grid, np.float32))
        anchor_t = g.weight(f"{param}.anchor_grid.{i}", np.array(anchor_grid, np.float32))
        xy = g.node("Mul", [xy, g.const(2.0)], scope)
        xy = g.node("Add", [xy, grid_t], scope)
        xy = g.node("Mul", [xy, g.const(float(st))], scope)
        wh = g.node("Mul", [wh, g.const(2.0)], scope)
        wh = g.node("Pow", [wh, g.const(2.0)], scope)
        wh = g.node("Mul", [wh, anchor_t], scope)
        h = g.node("Concat", [xy, wh, conf], scope, axis=4)
        outs.append(g.reshape(h, [0, -1, no], scope))
        total += na * n * n
    return g.node("Concat", outs, scope, axis=1), [total, no]


VERSIONS = {"v8": _v8, "v5": _v5}


def build(batch: int = 1, image_size: int = 320, *, version: str = "v8", depth: float = 0.33, width: float = 0.25,
          num_classes: int = 80, dynamic: bool = False, opset: int = 17, seed: int = 0,
          constants: str = "initializer") -> onnx.ModelProto:
    """YOLO detector: input `images` [batch, 3, image_size, image_size] -> `output0` (see the module doc).

    `depth`/`width` are the Ultralytics multipliers (0.33/0.25 is the "n" size); `image_size` must be a
    multiple of 32. `dynamic=True` makes the batch dimension symbolic ("batch").
    """
    if version not in VERSIONS:
        raise UsageError(f"unknown YOLO version {version!r}; use one of {sorted(VERSIONS)}")
    if not isinstance(image_size, int) or image_size < 32 or image_size % 32:
        raise UsageError(f"image_size must be a positive multiple of 32 for YOLO, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not (depth > 0 and width > 0):
        raise UsageError(f"depth and width multipliers must be positive, not {depth!r}, {width!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"num_classes must be a positive integer, not {num_classes!r}")
    g = GraphBuilder(opset, seed, constants)
    b_dim = "batch" if dynamic else batch
    x = g.input("images", FLOAT, [b_dim, 3, image_size, image_size])
    out, dims = VERSIONS[version](_Yolo(g), x, image_size, depth, width, num_classes)
    g.output(out, "output0", FLOAT, [b_dim, *dims])
    return g.model(f"yolo{version}", {
        "model": "yolo", "version": version, "depth": depth, "width": width, "num_classes": num_classes,
        "batch": batch, "image_size": image_size,
    })
