"""SqueezeNet 1.0, laid out as torchvision's `squeezenet1_0` exported in eval mode.

Convs carry biases (no BatchNorm). At 227x227: conv1 7x7/2 3 -> 96 (111x111) + Relu, MaxPool 3x3/2 ceil_mode
(55x55), fire2..fire4, MaxPool, fire5..fire8, MaxPool, fire9, then (dropout is the identity in eval) conv10
1x1 512 -> num_classes + Relu, GlobalAveragePool (adaptive pool to 1x1) and Flatten. Fire module
(squeeze s, expand e): 1x1 conv to s + Relu, then 1x1 conv to e + Relu and 3x3 conv (pad 1) to e + Relu on
the squeezed tensor, Concat on channels (2e). Fires 2..9: s/e = 16/64, 16/64, 32/128, 32/128, 48/192, 48/192,
64/256, 64/256. 26 convs, 8 Concats, 3 MaxPools.

Every fire is a SIMO pattern; fire2 (squeeze 96 -> 16 at 55x55, then 1x1 and 3x3 16 -> 64) is OptiFX's G5.
Source: torchvision/models/squeezenet.py (Iandola et al., "SqueezeNet: AlexNet-level accuracy with 50x fewer
parameters and <0.5MB model size", 2016).
"""

from __future__ import annotations

import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder

FIRES = ((16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256), (64, 256))
POOL_AFTER = (0, 3, 7)  # fires preceded by a MaxPool (features.2, .6, .11: after conv1, fire4, fire8)


def _relu_conv(g: GraphBuilder, x: str, c_in: int, c_out: int, k: int, scope: str, name: str, param: str) -> str:
    h = g.conv(x, c_in, c_out, k, f"{scope}/{name}", f"{param}.{name}")
    return g.node("Relu", [h], f"{scope}/{name}_activation")


def _fire(g: GraphBuilder, x: str, c_in: int, squeeze: int, expand: int, idx: int) -> str:
    scope, param = f"/features/features.{idx}", f"features.{idx}"
    s = _relu_conv(g, x, c_in, squeeze, 1, scope, "squeeze", param)
    e1 = _relu_conv(g, s, squeeze, expand, 1, scope, "expand1x1", param)
    e3 = _relu_conv(g, s, squeeze, expand, 3, scope, "expand3x3", param)
    return g.node("Concat", [e1, e3], scope, axis=1)


def _max_pool(g: GraphBuilder, x: str, idx: int) -> str:
    return g.node("MaxPool", [x], f"/features/features.{idx}", ceil_mode=1, dilations=[1, 1], kernel_shape=[3, 3],
                  pads=[0, 0, 0, 0], strides=[2, 2])


def build(batch: int = 1, image_size: int = 227, *, num_classes: int = 1000, opset: int = 17, seed: int = 0,
          constants: str = "initializer") -> onnx.ModelProto:
    """SqueezeNet 1.0 classifier: input `input` [batch, 3, image_size, image_size] -> `output` [batch, num_classes].

    `image_size` must be at least 29 (the last max pool needs a 3x3 window).
    """
    if not isinstance(image_size, int) or image_size < 29:
        raise UsageError(f"image_size must be an integer >= 29, not {image_size!r}")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"num_classes must be a positive integer, not {num_classes!r}")
    g = GraphBuilder(opset, seed, constants)
    x = g.input("input", FLOAT, [batch, 3, image_size, image_size])

    h = g.conv(x, 3, 96, 7, "/features/features.0", "features.0", stride=2, pad=0)
    h = g.node("Relu", [h], "/features/features.1")
    c, idx = 96, 2
    for i, (squeeze, expand) in enumerate(FIRES):
        if i in POOL_AFTER:
            h = _max_pool(g, h, idx)
            idx += 1
        h = _fire(g, h, c, squeeze, expand, idx)
        c, idx = 2 * expand, idx + 1
    h = g.conv(h, c, num_classes, 1, "/classifier/classifier.1", "classifier.1")
    h = g.node("Relu", [h], "/classifier/classifier.2")
    h = g.node("GlobalAveragePool", [h], "/classifier/classifier.3")
    h = g.node("Flatten", [h], "", axis=1)
    g.output(h, "output", FLOAT, [batch, num_classes])
    return g.model("squeezenet1_0", {
        "model": "squeezenet", "num_classes": num_classes, "batch": batch, "image_size": image_size,
    })
