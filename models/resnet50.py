"""ResNet-50, laid out as torchvision's `resnet50` exported in eval mode.

BatchNorm is folded into the convolutions (conv with bias). Stem: 7x7/2 conv, Relu, MaxPool 3x3/2 (pad 1).
Four stages of bottleneck blocks ([3, 4, 6, 3]; widths 64, 128, 256, 512, expansion 4): 1x1 conv, Relu,
3x3 conv carrying the stage's stride (torchvision v1.5), Relu, 1x1 conv, then `Add` with the shortcut (a
strided 1x1 "downsample" conv in each stage's first block) and Relu. Head: GlobalAveragePool, Flatten and
Gemm 2048 -> num_classes.
"""

from __future__ import annotations

import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder

LAYERS = (3, 4, 6, 3)
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4


def _bottleneck(g: GraphBuilder, x: str, c_in: int, width: int, stride: int, scope: str, param: str) -> str:
    c_out = width * EXPANSION
    h = g.conv(x, c_in, width, 1, f"{scope}/conv1", f"{param}.conv1")
    h = g.node("Relu", [h], f"{scope}/relu")
    h = g.conv(h, width, width, 3, f"{scope}/conv2", f"{param}.conv2", stride=stride)
    h = g.node("Relu", [h], f"{scope}/relu_1")
    h = g.conv(h, width, c_out, 1, f"{scope}/conv3", f"{param}.conv3")
    shortcut = x
    if stride != 1 or c_in != c_out:
        shortcut = g.conv(x, c_in, c_out, 1, f"{scope}/downsample/downsample.0", f"{param}.downsample.0",
                          stride=stride)
    h = g.node("Add", [h, shortcut], scope)
    return g.node("Relu", [h], f"{scope}/relu_2")


def build(batch: int = 1, image_size: int = 224, *, num_classes: int = 1000, dynamic: bool = False,
          opset: int = 17, seed: int = 0, constants: str = "initializer") -> onnx.ModelProto:
    """ResNet-50 classifier: input `input` [batch, 3, image_size, image_size] -> `output` [batch, num_classes].

    `image_size` must be at least 32 (the last stage runs at 1/32). `dynamic=True` makes the batch dimension
    symbolic ("batch"); `constants="node"` writes constants as Constant nodes (the graph has none by default).
    """
    if not isinstance(image_size, int) or image_size < 32:
        raise UsageError(f"image_size must be an integer >= 32, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"num_classes must be a positive integer, not {num_classes!r}")
    g = GraphBuilder(opset, seed, constants)
    b_dim = "batch" if dynamic else batch
    x = g.input("input", FLOAT, [b_dim, 3, image_size, image_size])

    h = g.conv(x, 3, 64, 7, "/conv1", "conv1", stride=2, pad=3)
    h = g.node("Relu", [h], "/relu")
    h = g.node("MaxPool", [h], "/maxpool", ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               strides=[2, 2])
    c_in = 64
    for stage, (blocks, width) in enumerate(zip(LAYERS, WIDTHS), start=1):
        for i in range(blocks):
            stride = 2 if stage > 1 and i == 0 else 1
            h = _bottleneck(g, h, c_in, width, stride, f"/layer{stage}/layer{stage}.{i}", f"layer{stage}.{i}")
            c_in = width * EXPANSION
    h = g.node("GlobalAveragePool", [h], "/avgpool")
    h = g.node("Flatten", [h], "", axis=1)
    h = g.gemm(h, c_in, num_classes, "/fc", "fc")
    g.output(h, "output", FLOAT, [b_dim, num_classes])
    return g.model("resnet50", {
        "model": "resnet50", "num_classes": num_classes, "batch": batch, "image_size": image_size,
    })
