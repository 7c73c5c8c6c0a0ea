"""Writing built models to disk."""

from __future__ import annotations

import os

import onnx

from onnxopt.errors import UsageError


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> str:
    """Save `model` to `path` (a single .onnx file, weights inline) and return the path."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write {path}: directory {parent} does not exist; create it first")
    onnx.save(model, path)
    return path
