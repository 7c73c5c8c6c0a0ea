"""Models past protobuf's 2 GB limit: nothing may serialize them whole.

A ModelProto over 2 GB cannot become one protobuf message (`SerializeToString` fails), so onnx's shape inference and
checker, and onnxruntime sessions made from bytes, cannot take it. Sessions are made from a file with its weights
in external data instead, and inference and checks run on a light copy whose large weights are declared, not held.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import onnx
from onnx import numpy_helper

# Past this size a model is handled as large (well under 2 GB: the inferred value_info and functions add to it).
LARGE_BYTES = 1 << 30
# In the light copy, initializers larger than this keep their dims and type but not their data.
STRIP_TENSOR_BYTES = 1 << 16


def tensor_bytes(t: onnx.TensorProto) -> int:
    """A tensor's size from its dims and type (`ByteSize()` fails on a tensor past 2 GB); external data counts 0."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return t.ByteSize()
    n = 1
    for d in t.dims:
        n *= d
    try:
        return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):  # a type numpy lacks (4-bit, float8): at most a byte an element
        return n


def add_messages(field, items) -> None:
    """`field.extend(items)` for repeated message fields that may hold a tensor past 2 GB: extend and append
    serialize each message, which fails past the limit, where add().CopyFrom does not."""
    for item in items:
        field.add().CopyFrom(item)


def model_bytes(model: onnx.ModelProto) -> int:
    """The model's serialized size; summed part by part for a large one, where `ModelProto.ByteSize()` fails."""
    g = model.graph
    total = sum(tensor_bytes(t) for t in g.initializer) + sum(t.ByteSize() for t in g.sparse_initializer)
    total += sum(n.ByteSize() for n in g.node) + sum(f.ByteSize() for f in model.functions)
    total += sum(v.ByteSize() for v in (*g.input, *g.output, *g.value_info))
    return model.ByteSize() if total < LARGE_BYTES else total  # exact where protobuf can say


def is_large(model: onnx.ModelProto) -> bool:
    return model_bytes(model) > LARGE_BYTES


def light_copy(model: onnx.ModelProto, strip_above: int = STRIP_TENSOR_BYTES) -> onnx.ModelProto:
    """The model with every initializer over `strip_above` bytes stripped of its data (an external-data stub with
    the same name, type and dims), built without copying those tensors: what shape inference and the checker need.
    Shape tensors and other small constants keep their values."""
    g = model.graph
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    lg = light.graph
    lg.name = g.name
    lg.node.extend(g.node)
    lg.input.extend(g.input)
    lg.output.extend(g.output)
    lg.value_info.extend(g.value_info)
    for t in g.initializer:
        if tensor_bytes(t) <= strip_above:
            lg.initializer.add().CopyFrom(t)
            continue
        stub = lg.initializer.add()
        stub.name, stub.data_type = t.name, t.data_type
        stub.dims.extend(t.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        e = stub.external_data.add()
        e.key, e.value = "location", "stripped-for-analysis"
    return light


def check_model(model: onnx.ModelProto) -> None:
    """onnx.checker.check_model (without shape inference) for a model of any size: a large one is checked as a
    light copy whose large weights are one-element tensors of their types (the checker, without shape inference,
    does not compare them with their uses, and it rejects the external-data stubs of `light_copy`)."""
    if not is_large(model):
        onnx.checker.check_model(model, full_check=False)
        return
    light = light_copy(model)
    for t in light.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            del t.dims[:]
            t.dims.append(1)
            t.raw_data = bytes(max(1, tensor_bytes(onnx.TensorProto(data_type=t.data_type, dims=[1]))))
    onnx.checker.check_model(light, full_check=False)


def save_with_external_data(model: onnx.ModelProto, path: str) -> None:
    """Write `model` to `path` with its larger tensors in `<name>.data` beside it, without serializing it whole
    and without copying the model or changing it: the light copy is written, and the large tensors' bytes are
    written one at a time into the data file it points to."""
    data_name = os.path.basename(path) + ".data"
    light = light_copy(model, strip_above=1024)
    big = {t.name: t for t in model.graph.initializer if tensor_bytes(t) > 1024}
    offset = 0
    if not big:  # everything inline: no data file
        onnx.save_model(light, path)
        return
    with open(os.path.join(os.path.dirname(os.path.abspath(path)), data_name), "wb") as f:
        for stub in light.graph.initializer:
            if stub.data_location != onnx.TensorProto.EXTERNAL or stub.name not in big:
                continue
            t = big[stub.name]
            data = t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes()
            f.write(data)
            del stub.external_data[:]
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(data)))):
                stub.external_data.add(key=k, value=v)
            offset += len(data)
            del data
    onnx.save_model(light, path)


def session_source(model: onnx.ModelProto, folder: str | None = None):
    """What onnxruntime.InferenceSession takes for this model: its bytes, or for a large model the path of a copy
    saved with external data in `folder` (a new temporary folder when None; the caller may delete it once the
    session exists, since onnxruntime has read the data by then). Returns (source, folder to delete or None)."""
    if not is_large(model):
        return model.SerializeToString(), None
    own = folder is None
    folder = folder or tempfile.mkdtemp(prefix="onnxopt-large-")
    fd, path = tempfile.mkstemp(prefix="model-", suffix=".onnx", dir=folder)
    os.close(fd)
    try:
        save_with_external_data(model, path)
    except BaseException:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return path, (folder if own else None)


def inference_session(model: onnx.ModelProto, sess_options, providers):
    """onnxruntime.InferenceSession of a ModelProto of any size."""
    import onnxruntime as ort

    source, scratch = session_source(model)
    try:
        return ort.InferenceSession(source, sess_options, providers=providers)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
