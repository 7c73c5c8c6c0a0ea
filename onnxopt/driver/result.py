"""What optimize() returns: the fused model, the report, and where the model and its library were written."""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnx

from onnxopt.errors import UsageError


@dataclass
class Result:
    model: onnx.ModelProto
    report: dict
    output: str | None = None  # where the model was written (optimize's `output`), or None
    library: str | None = None  # the kernel library written beside it, or None
    # Without an output path: the kernel library's bytes (the model then names no library file; `save` writes both)
    library_data: bytes | None = None

    def save(self, path: str) -> list[str]:
        """Write the model to `path` and its kernel library to `<path>.so`, named in the model's metadata, as
        `optimize(model, path)` would have: whole or not at all, never through a link (graph/publish.py). For a
        Result of optimize() without an output path, or a copy of one written to `output` (its library copied
        too). Returns the paths written."""
        from onnxopt.emit.model import set_library_name
        from onnxopt.graph.load import write_model
        from onnxopt.graph.publish import LIBRARY_SUFFIX, Staging, check_output, create_new

        check_output(path, "Result.save")
        library = self.library_data
        if library is None and self.library:  # written with `output`: the model names that library, copy it
            try:
                with open(self.library, "rb") as f:
                    library = f.read()
            except OSError as e:
                raise UsageError(f"Result.save {path}: cannot read this result's kernel library {self.library} "
                                 f"({e.strerror or e})") from None
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        if library is not None:
            set_library_name(model, os.path.basename(os.path.abspath(path)) + LIBRARY_SUFFIX)
        with Staging(path) as staging:
            suffixes = []
            if library is not None:
                with create_new(staging.path(LIBRARY_SUFFIX)) as f:
                    f.write(library)
                suffixes.append(LIBRARY_SUFFIX)
            suffixes += write_model(model, staging.path(), external=False)
            staging.publish(suffixes, remove=[] if library is not None else [LIBRARY_SUFFIX])
        return [staging.destination + s for s in suffixes]
