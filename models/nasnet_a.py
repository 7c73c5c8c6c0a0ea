"""A small NASNet-A (mobile) network (Zoph et al., "Learning Transferable Architectures for Scalable Image
Recognition", 2018), with the cells of Cadene's `pretrainedmodels` (`NASNetAMobile`) exported in eval mode.

Configuration (F = `filters`, N = `cells`; defaults F = 16, N = 2, image_size = 224, penultimate filters 24F):

* `conv0`: 3x3/2 conv 3 -> 32, no padding (224 -> 111), BN folded (no activation; every branch starts with
  its own Relu).
* `cell_stem_0`: NASNet-A reduction cell on the stem (CellStem0) with F/2 filters -> 2F channels at 56x56.
* Stage 1 at 56x56: N normal cells with F filters (6F channels out); `reduction_cell_0` with 2F filters (8F
  channels at 28x28). Stage 2 at 28x28: N normal cells with 2F (12F out); `reduction_cell_1` with 4F
  (16F at 14x14). Stage 3 at 14x14: N normal cells with 4F (24F out).
* Head: Relu, GlobalAveragePool, Flatten, Gemm 24F -> num_classes (dropout is the identity in eval).

Differences from NASNet-A Mobile (4 @ 1056): one stem cell instead of two (so the first stage runs at 56x56,
not 28x28), N = 2 instead of 4, F = 16 instead of 44, and symmetric padding in the strided ops (no TF-style
pad-and-slice in the reduction cells' pools).

Cells. Each cell first adjusts its two inputs, h_i (the previous cell's output) and h_{i-1} (the one before):
`conv_1x1` on h_i and `conv_prev_1x1` on h_{i-1} are Relu -> 1x1 conv (BN folded). When h_{i-1} has twice the
resolution of h_i (the first cell after a reduction), it goes through the factorized reduction instead: Relu,
then two paths AveragePool 1x1/2 -> 1x1 conv to F/2, the second shifted by one pixel (Pad right/bottom, Slice
off the first row and column), Concat, BatchNormalization. A separable branch ("sepKxK") is twice Relu ->
depthwise KxK conv -> pointwise 1x1 conv (BN folded); the first depthwise conv carries the stride. Pools are
3x3 (average ones with count_include_pad=0). Writing L, R for the adjusted h_{i-1}, h_i:

* normal cell: c0 = sep5(R) + sep3(L), c1 = sep5(L) + sep3(L), c2 = avg(R) + L, c3 = avg(L) + avg(L),
  c4 = sep3(R) + R; output Concat(L, c0..c4) (6 x filters).
* reduction cell: c0 = sep5/2(R) + sep7/2(L), c1 = max/2(R) + sep7/2(L), c2 = avg/2(R) + sep5/2(L),
  c3 = avg(c0) + c1, c4 = sep3(c0) + max/2(R); output Concat(c1..c4) (4 x filters). The stem cell is the
  same with R = conv_1x1(conv0) and the separable branches on conv0 itself (their first pointwise conv
  widens 32 -> F/2).

MISO (OptiFX G6): every `Add` of two separable branches (c0 and c1 of each normal cell, c0 of each
reduction cell) adds the outputs of two plain 1x1 convs, the branches' last pointwise convs (filters ->
filters). In stage 1 these run at image_size / 4 (56x56), F -> F; with `filters=128` the normal cells' c0/c1
Adds are exactly G6, 2 x (128 -> 128 1x1) + Add at 56x56 (that configuration is about 44x the default's
FLOPs: 18.7 vs 0.43 GFLOP at 224). Source: github.com/Cadene/pretrained-models.pytorch,
pretrainedmodels/models/nasnet_mobile.py.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder
from .densenet_bc import batch_norm

STEM_FILTERS = 32


def _down(s: int) -> int:
    """Spatial size after a stride-2 op whose pad is k // 2 (or a 1x1/2 pool)."""
    return (s - 1) // 2 + 1


class _Net:
    def __init__(self, g: GraphBuilder):
        self.g = g

    def relu_conv1x1(self, x: str, c_in: int, c_out: int, scope: str, param: str) -> str:
        """Relu -> 1x1 conv (BN folded): `conv_1x1` / `conv_prev_1x1`."""
        h = self.g.node("Relu", [x], f"{scope}/relu")
        return self.g.conv(h, c_in, c_out, 1, f"{scope}/conv", f"{param}.conv")

    def separable(self, x: str, c_in: int, c_out: int, k: int, stride: int, scope: str, param: str) -> str:
        """`SeparableConv2d` + BN: depthwise kxk (no bias), pointwise 1x1 (BN folded into its bias)."""
        g = self.g
        h = g.conv(x, c_in, c_in, k, f"{scope}/depthwise_conv2d", f"{param}.depthwise_conv2d", stride=stride,
                   groups=c_in, bias=False)
        return g.conv(h, c_in, c_out, 1, f"{scope}/pointwise_conv2d", f"{param}.pointwise_conv2d")

    def branch(self, x: str, c_in: int, c_out: int, k: int, stride: int, scope: str, param: str,
               stem: bool = False) -> str:
        """`BranchSeparables` (first separable conv keeps c_in) or `BranchSeparablesStem` (widens first)."""
        g = self.g
        mid = c_out if stem else c_in
        h = g.node("Relu", [x], f"{scope}/relu")
        h = self.separable(h, c_in, mid, k, stride, f"{scope}/separable_1", f"{param}.separable_1")
        h = g.node("Relu", [h], f"{scope}/relu1")
        return self.separable(h, mid, c_out, k, 1, f"{scope}/separable_2", f"{param}.separable_2")

    def pool(self, x: str, op: str, stride: int, scope: str) -> str:
        if op == "max":
            return self.g.node("MaxPool", [x], scope, ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
                               pads=[1, 1, 1, 1], strides=[stride, stride])
        return self.g.node("AveragePool", [x], scope, ceil_mode=0, count_include_pad=0, kernel_shape=[3, 3],
                           pads=[1, 1, 1, 1], strides=[stride, stride])

    def factorized_reduction(self, x: str, c_in: int, c_half: int, scope: str, param: str) -> str:
        """Relu, then AvgPool 1x1/2 -> 1x1 conv on x and on x shifted by one pixel, Concat, BatchNorm."""
        g = self.g
        h = g.node("Relu", [x], f"{scope}/relu")
        paths = []
        for i, src in enumerate((h, None), start=1):
            s = f"{scope}/path_{i}"
            if src is None:  # ZeroPad2d((0, 1, 0, 1)) then x[:, :, 1:, 1:]
                src = g.node("Pad", [h, g.const([0, 0, 0, 0, 0, 0, 1, 1], np.int64)], f"{s}/pad", mode="constant")
                src = g.node("Slice", [src, g.const([1, 1], np.int64), g.const([2**63 - 1] * 2, np.int64),
                                       g.const([2, 3], np.int64), g.const([1, 1], np.int64)], s)
            p = g.node("AveragePool", [src], f"{s}/avgpool", ceil_mode=0, count_include_pad=0,
                       kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[2, 2])
            paths.append(g.conv(p, c_in, c_half, 1, f"{s}/conv", f"{param}.path_{i}.conv", bias=False))
        h = g.node("Concat", paths, scope, axis=1)
        return batch_norm(g, h, 2 * c_half, f"{scope}/final_path_bn", f"{param}.final_path_bn", eps=1e-3)

    def add(self, a: str, b: str, scope: str) -> str:
        return self.g.node("Add", [a, b], scope)

    # -- cells ---------------------------------------------------------------------------------------------
    def normal_cell(self, x, c_x, prev, c_prev, reduce_prev: bool, f: int, scope: str, param: str):
        if reduce_prev:
            left = self.factorized_reduction(prev, c_prev, f // 2, scope, param)
        else:
            left = self.relu_conv1x1(prev, c_prev, f, f"{scope}/conv_prev_1x1", f"{param}.conv_prev_1x1")
        right = self.relu_conv1x1(x, c_x, f, f"{scope}/conv_1x1", f"{param}.conv_1x1")

        def br(name, src, k):
            return self.branch(src, f, f, k, 1, f"{scope}/{name}", f"{param}.{name}")

        c0 = self.add(br("comb_iter_0_left", right, 5), br("comb_iter_0_right", left, 3), scope)
        c1 = self.add(br("comb_iter_1_left", left, 5), br("comb_iter_1_right", left, 3), scope)
        c2 = self.add(self.pool(right, "avg", 1, f"{scope}/comb_iter_2_left"), left, scope)
        c3 = self.add(self.pool(left, "avg", 1, f"{scope}/comb_iter_3_left"),
                      self.pool(left, "avg", 1, f"{scope}/comb_iter_3_right"), scope)
        c4 = self.add(br("comb_iter_4_left", right, 3), right, scope)
        return self.g.node("Concat", [left, c0, c1, c2, c3, c4], scope, axis=1), 6 * f

    def reduction_cell(self, x, c_x, prev, c_prev, f: int, scope: str, param: str, stem: bool = False):
        """Reduction cell on (x, prev); `stem=True` is CellStem0 on x alone (its separable branches read x)."""
        right = self.relu_conv1x1(x, c_x, f, f"{scope}/conv_1x1", f"{param}.conv_1x1")
        if stem:
            left, c_left = x, c_x
        else:
            left, c_left = self.relu_conv1x1(prev, c_prev, f, f"{scope}/conv_prev_1x1", f"{param}.conv_prev_1x1"), f

        def br(name, src, c_in, k, stride, is_stem=False):
            return self.branch(src, c_in, f, k, stride, f"{scope}/{name}", f"{param}.{name}", stem=is_stem)

        c0 = self.add(br("comb_iter_0_left", right, f, 5, 2), br("comb_iter_0_right", left, c_left, 7, 2, stem),
                      scope)
        c1 = self.add(self.pool(right, "max", 2, f"{scope}/comb_iter_1_left"),
                      br("comb_iter_1_right", left, c_left, 7, 2, stem), scope)
        c2 = self.add(self.pool(right, "avg", 2, f"{scope}/comb_iter_2_left"),
                      br("comb_iter_2_right", left, c_left, 5, 2, stem), scope)
        c3 = self.add(self.pool(c0, "avg", 1, f"{scope}/comb_iter_3_right"), c1, scope)
        c4 = self.add(br("comb_iter_4_left", c0, f, 3, 1), self.pool(right, "max", 2, f"{scope}/comb_iter_4_right"),
                      scope)
        return self.g.node("Concat", [c1, c2, c3, c4], scope, axis=1), 4 * f


def build(batch: int = 1, image_size: int = 224, *, filters: int = 16, cells: int = 2, num_classes: int = 1000,
          opset: int = 17, seed: int = 0, constants: str = "initializer") -> onnx.ModelProto:
    """NASNet-A classifier: input `input` [batch, 3, image_size, image_size] -> `output` [batch, num_classes].

    `filters` (F, even) sets the stage-1 cell width (penultimate filters 24F); `cells` (N) the normal cells per
    stage. `image_size` must be at least 32.
    """
    if not isinstance(image_size, int) or image_size < 32:
        raise UsageError(f"image_size must be an integer >= 32, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(filters, int) or filters < 2 or filters % 2:
        raise UsageError(f"filters must be a positive even integer, not {filters!r}")
    if not isinstance(cells, int) or cells < 1:
        raise UsageError(f"cells must be a positive integer, not {cells!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"num_classes must be a positive integer, not {num_classes!r}")
    g = GraphBuilder(opset, seed, constants)
    net = _Net(g)
    x = g.input("input", FLOAT, [batch, 3, image_size, image_size])

    h = g.conv(x, 3, STEM_FILTERS, 3, "/conv0/conv", "conv0.conv", stride=2, pad=0)
    s = (image_size - 3) // 2 + 1
    prev, c_prev, s_prev = h, STEM_FILTERS, s
    cur, c_cur = net.reduction_cell(h, STEM_FILTERS, None, 0, filters // 2, "/cell_stem_0", "cell_stem_0",
                                    stem=True)
    s_cur = _down(s)
    idx = 0
    for stage in range(3):
        f = filters * 2 ** stage
        if stage:
            out, c_out = net.reduction_cell(cur, c_cur, prev, c_prev, f, f"/reduction_cell_{stage - 1}",
                                            f"reduction_cell_{stage - 1}")
            prev, c_prev, s_prev, cur, c_cur, s_cur = cur, c_cur, s_cur, out, c_out, _down(s_cur)
        for _ in range(cells):
            out, c_out = net.normal_cell(cur, c_cur, prev, c_prev, s_prev != s_cur, f, f"/cell_{idx}", f"cell_{idx}")
            prev, c_prev, s_prev, cur, c_cur = cur, c_cur, s_cur, out, c_out
            idx += 1
    h = g.node("Relu", [cur], "/relu")
    h = g.node("GlobalAveragePool", [h], "/avg_pool")
    h = g.node("Flatten", [h], "", axis=1)
    h = g.gemm(h, c_cur, num_classes, "/last_linear", "last_linear")
    g.output(h, "output", FLOAT, [batch, num_classes])
    return g.model("nasnet_a", {
        "model": "nasnet_a", "filters": filters, "cells": cells, "num_classes": num_classes, "batch": batch,
        "image_size": image_size,
    })
