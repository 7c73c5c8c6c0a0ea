"""DenseNet-BC for CIFAR (Huang et al., "Densely Connected Convolutional Networks", 2017), laid out as the
common PyTorch CIFAR implementation (andreasveit/densenet-pytorch `DenseNet3(depth, growth, bottleneck=True,
reduction=0.5)`) exported in eval mode.

32x32 input. `conv1`: 3x3 conv 3 -> 2k (no bias). Three dense blocks of n = (depth - 4) // 6 bottleneck layers
(depth 100: 16 per block); layer: BatchNormalization -> Relu -> 1x1 conv to 4k -> (BN, folded into that conv's
bias) Relu -> 3x3 conv to k (no bias) -> `Concat([x, out])`. Transitions after blocks 1 and 2 (compression 0.5):
BatchNormalization -> Relu -> 1x1 conv (no bias) -> AveragePool 2x2/2. Head: BatchNormalization -> Relu ->
GlobalAveragePool -> Flatten -> Gemm to num_classes.

BatchNorm stays a `BatchNormalization` node wherever it does not directly follow a single-use conv (torch's
export only folds Conv -> BN): the first BN of every layer (it reads a Concat, or in layer 1 of block 1 the stem
conv whose output also feeds the Concat), the transitions' and the final BN. With k = 12, L = 100: 24 -> 216
(block 1, 32x32) -> 108 -> 300 (16x16) -> 150 -> 342 (8x8) channels. Layer 4 of block 1 runs a 1x1 60 -> 48
then a 3x3 48 -> 12 at 32x32: OptiFX's G3 (SISO 1x1 -> 3x3).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder


def batch_norm(g: GraphBuilder, x: str, channels: int, scope: str, param: str, eps: float = 1e-5) -> str:
    """An unfolded eval-mode `nn.BatchNorm2d` (scale, bias, running mean and variance as initializers)."""
    scale = g.weight(f"{param}.weight", g.uniform((channels,), 0.8, 1.2))
    bias = g.weight(f"{param}.bias", g.normal((channels,), 0.05))
    mean = g.weight(f"{param}.running_mean", g.normal((channels,), 0.1))
    var = g.weight(f"{param}.running_var", g.uniform((channels,), 0.5, 1.5))
    return g.node("BatchNormalization", [x, scale, bias, mean, var], scope, epsilon=eps, momentum=0.9)


def _bn_relu(g: GraphBuilder, x: str, channels: int, scope: str, param: str, bn: str, relu: str) -> str:
    h = batch_norm(g, x, channels, f"{scope}/{bn}", f"{param}.{bn}".lstrip("."))
    return g.node("Relu", [h], f"{scope}/{relu}")


def _layer(g: GraphBuilder, x: str, c_in: int, growth: int, scope: str, param: str) -> str:
    inter = 4 * growth
    h = _bn_relu(g, x, c_in, scope, param, "bn1", "relu")
    h = g.conv(h, c_in, inter, 1, f"{scope}/conv1", f"{param}.conv1")  # bn2 folded into the bias
    h = g.node("Relu", [h], f"{scope}/relu_1")
    h = g.conv(h, inter, growth, 3, f"{scope}/conv2", f"{param}.conv2", bias=False)
    return g.node("Concat", [x, h], scope, axis=1)


def _transition(g: GraphBuilder, x: str, c_in: int, c_out: int, scope: str, param: str) -> str:
    h = _bn_relu(g, x, c_in, scope, param, "bn1", "relu")
    h = g.conv(h, c_in, c_out, 1, f"{scope}/conv1", f"{param}.conv1", bias=False)
    return g.node("AveragePool", [h], scope, ceil_mode=0, count_include_pad=1, kernel_shape=[2, 2],
                  pads=[0, 0, 0, 0], strides=[2, 2])


def build(batch: int = 1, image_size: int = 32, *, depth: int = 100, growth: int = 12, reduction: float = 0.5,
          num_classes: int = 10, opset: int = 17, seed: int = 0, constants: str = "initializer") -> onnx.ModelProto:
    """DenseNet-BC classifier: input `input` [batch, 3, image_size, image_size] -> `output` [batch, num_classes].

    `depth` = 6n + 4 gives n bottleneck layers per block (100 -> 16, 40 -> 6); `growth` is k.
    """
    if not isinstance(image_size, int) or image_size < 4:
        raise UsageError(f"image_size must be an integer >= 4, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        raise UsageError(f"depth must be 6n + 4 with n >= 1 (e.g. 40, 100, 250), not {depth!r}")
    if not isinstance(growth, int) or growth < 1:
        raise UsageError(f"growth must be a positive integer, not {growth!r}")
    if not 0 < reduction <= 1:
        raise UsageError(f"reduction must lie in (0, 1], not {reduction!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"num_classes must be a positive integer, not {num_classes!r}")
    n = (depth - 4) // 6
    g = GraphBuilder(opset, seed, constants)
    x = g.input("input", FLOAT, [batch, 3, image_size, image_size])

    c = 2 * growth
    h = g.conv(x, 3, c, 3, "/conv1", "conv1", bias=False)
    for b in range(1, 4):
        for i in range(n):
            h = _layer(g, h, c, growth, f"/block{b}/layer/layer.{i}", f"block{b}.layer.{i}")
            c += growth
        if b < 3:
            c_out = int(np.floor(c * reduction))
            h = _transition(g, h, c, c_out, f"/trans{b}", f"trans{b}")
            c = c_out
    h = _bn_relu(g, h, c, "", "", "bn1", "relu")
    h = g.node("GlobalAveragePool", [h], "/avgpool")
    h = g.node("Flatten", [h], "", axis=1)
    h = g.gemm(h, c, num_classes, "/fc", "fc")
    g.output(h, "output", FLOAT, [batch, num_classes])
    return g.model("densenet_bc", {
        "model": "densenet_bc", "depth": depth, "growth": growth, "layers_per_block": n,
        "num_classes": num_classes, "batch": batch, "image_size": image_size,
    })
