"""`python -m onnxopt.models NAME -o out.onnx [--batch N] [--image-size S] [--seq-len L] ...`"""

from __future__ import annotations

import argparse
import collections
import inspect
import math
import sys

from onnxopt.errors import OnnxoptError, UsageError

from . import MODELS, build_model
from .save import save_model

# CLI flag -> builder keyword
_FLAGS = {"batch": "batch", "image_size": "image_size", "seq_len": "seq_len", "opset": "opset", "seed": "seed",
          "size": "size", "version": "version", "variant": "variant", "dynamic": "dynamic"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m onnxopt.models",
                                description="Write one of the built-in test/benchmark models as an .onnx file.")
    p.add_argument("name", help=f"model name: {', '.join(sorted(MODELS))}")
    p.add_argument("-o", "--output", required=True, help="path of the .onnx file to write")
    p.add_argument("--batch", type=int, help="batch size (all models)")
    p.add_argument("--image-size", type=int, help="input height and width (mobilenetv3, yolo)")
    p.add_argument("--seq-len", type=int, help="suggested/fixed sequence length (bert)")
    p.add_argument("--size", help="preset: tiny, bench, base (bert)")
    p.add_argument("--version", help="v8 or v5 (yolo)")
    p.add_argument("--variant", help="small or large (mobilenetv3)")
    p.add_argument("--dynamic", action=argparse.BooleanOptionalAction, default=None,
                   help="symbolic batch (and sequence for bert) dimensions")
    p.add_argument("--opset", type=int, help="ONNX opset (default 17)")
    p.add_argument("--seed", type=int, help="weight seed (default 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.name not in MODELS:
            raise UsageError(f"unknown model {args.name!r}; known models: {', '.join(sorted(MODELS))}")
        accepted = inspect.signature(MODELS[args.name]).parameters
        kwargs = {}
        for attr, key in _FLAGS.items():
            value = getattr(args, attr)
            if value is None:
                continue
            if key not in accepted:
                flag = "--" + attr.replace("_", "-")
                raise UsageError(f"{flag} does not apply to model {args.name!r}; drop it")
            kwargs[key] = value
        model = build_model(args.name, **kwargs)
        save_model(model, args.output)
    except OnnxoptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if not args.quiet:
        ops = collections.Counter(n.op_type for n in model.graph.node)
        params = sum(math.prod(t.dims) for t in model.graph.initializer)
        print(f"wrote {args.output}: {len(model.graph.node)} nodes, {params:,} initializer elements; "
              + ", ".join(f"{k} {v}" for k, v in ops.most_common(6)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
