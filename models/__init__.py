"""Model builders: ONNX graphs shaped like `torch.onnx.export` output, used as optimizer test and benchmark inputs.

`build_model("mobilenetv3" | "yolo" | "bert" | "resnet50" | "ocr_detector", **kwargs)` returns an
`onnx.ModelProto`; see each module's `build` for its arguments. `random_inputs(model)` makes a matching feed dict.
The OptiFX paper's CNNs are "inception_v3", "densenet_bc", "mobilenetv2", "squeezenet", "nasnet_a", "unet16"
and "resnet50".
`conv_shapes` holds the seed papers' benchmark conv/GEMM shapes and single-op model builders.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from onnxopt.errors import UsageError

from . import (
    bert,
    conv_shapes,
    densenet_bc,
    inception_v3,
    mobilenetv2,
    mobilenetv3,
    nasnet_a,
    ocr_detector,
    resnet50,
    squeezenet,
    unet16,
    yolo,
)
from .inputs import random_inputs
from .save import save_model

MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "mobilenetv3": mobilenetv3.build,
    "yolo": yolo.build,
    "bert": bert.build,
    "resnet50": resnet50.build,
    "ocr_detector": ocr_detector.build,
    "inception_v3": inception_v3.build,
    "densenet_bc": densenet_bc.build,
    "mobilenetv2": mobilenetv2.build,
    "squeezenet": squeezenet.build,
    "nasnet_a": nasnet_a.build,
    "unet16": unet16.build,
}


def build_model(name: str, **kwargs) -> onnx.ModelProto:
    """Build the registered model `name` with the builder's keyword arguments."""
    try:
        builder = MODELS[name]
    except (KeyError, TypeError):
        raise UsageError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}") from None
    try:
        return builder(**kwargs)
    except TypeError as exc:  # an argument the builder does not take
        raise UsageError(f"bad arguments for model {name!r}: {exc}") from None


__all__ = ["MODELS", "build_model", "conv_shapes", "random_inputs", "save_model"]
