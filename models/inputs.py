"""Random feeds for the built models, read from the graph inputs and the builders' metadata."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from onnxopt.errors import UsageError

from ._graph import metadata


def random_inputs(model: onnx.ModelProto, seed: int = 0, batch: int | None = None,
                  seq_len: int | None = None) -> dict[str, np.ndarray]:
    """A feed dict for `model`. Symbolic dims "batch"/"sequence" take `batch`/`seq_len` (default: the values
    recorded when the model was built). Images are uniform in [0, 1); `input_ids` lie in the vocabulary,
    `token_type_ids` in {0, 1}; an int `attention_mask` masks the second half of the first row's tokens.
    """
    meta = metadata(model)
    rng = np.random.default_rng(seed)
    dims = {"batch": batch or int(meta.get("batch", 1)), "sequence": seq_len or int(meta.get("seq_len", 16))}
    init_names = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        shape = []
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in dims:
                shape.append(dims[d.dim_param])
            else:
                raise UsageError(f"input {vi.name!r} has unknown symbolic dim {d.dim_param!r}")
        elem = vi.type.tensor_type.elem_type
        if elem == TensorProto.INT64:
            if vi.name == "input_ids":
                arr = rng.integers(0, int(meta.get("vocab", 1000)), shape, dtype=np.int64)
            elif vi.name == "token_type_ids":
                arr = rng.integers(0, 2, shape, dtype=np.int64)
            elif vi.name == "attention_mask":
                arr = np.ones(shape, np.int64)
                arr[0, shape[1] - shape[1] // 2:] = 0
            else:
                arr = rng.integers(0, 2, shape, dtype=np.int64)
        elif elem == TensorProto.FLOAT:
            if vi.name == "attention_mask":  # additive float mask [batch, 1, 1, sequence]
                arr = np.zeros(shape, np.float32)
                arr[0, ..., shape[-1] - shape[-1] // 2:] = np.finfo(np.float32).min
            else:
                arr = rng.random(shape, dtype=np.float32)
        else:
            raise UsageError(f"input {vi.name!r} has element type {elem}, which random_inputs does not generate")
        feeds[vi.name] = arr
    return feeds
