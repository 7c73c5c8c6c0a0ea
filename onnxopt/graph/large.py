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
# Past this size a model is analysed (shape inference, the checker) as its light copy: the weights are only copied
# and serialized there, 0.3 s a time for BERT-base's 435 MB.
ANALYSE_LIGHT_BYTES = 1 << 26
# Bytes a message adds to its parts' sizes when serialized (a tag and a length): a bound, for model_bytes.
MESSAGE_OVERHEAD = 16
# Offsets of tensors in the data files written here: a page, so that onnxruntime can map them.
DATA_ALIGN = 4096
# The location of light_copy's stubs: no file has this name.
STRIPPED = "stripped-for-analysis"


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
    """The model's serialized size. A big model's is summed part by part: `ModelProto.ByteSize()` fails past 2 GB,
    and below it serializes the whole model (0.3 s for BERT-base's 435 MB, asked 33 times a run). The sum leaves out
    only the fields' tags and lengths, a few bytes a message, which MESSAGE_OVERHEAD bounds."""
    g = model.graph
    parts = [*g.sparse_initializer, *g.node, *model.functions, *g.input, *g.output, *g.value_info]
    total = sum(tensor_bytes(t) for t in g.initializer) + sum(p.ByteSize() for p in parts)
    total += MESSAGE_OVERHEAD * (len(parts) + len(g.initializer))
    return model.ByteSize() if total <= ANALYSE_LIGHT_BYTES else total  # exact where that is cheap


def is_large(model: onnx.ModelProto) -> bool:
    return model_bytes(model) > LARGE_BYTES


def _is_repeated(fd) -> bool:
    """protobuf 6.30+ has `is_repeated`; older ones only `label` (since removed)."""
    is_repeated = getattr(fd, "is_repeated", None)
    return bool(is_repeated) if is_repeated is not None else fd.label == fd.LABEL_REPEATED


def _copy_fields(src, dst, skip: tuple[str, ...] = ()) -> None:
    """Copy every field set in message `src` into `dst` but those named in `skip`, by reflection: a field onnx adds
    later is carried too. Repeated messages are added one by one (`extend` serializes them, which fails past 2 GB)."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        if _is_repeated(fd):
            field = getattr(dst, fd.name)
            if fd.type == fd.TYPE_MESSAGE:
                add_messages(field, value)
            else:
                field.extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def light_copy(model: onnx.ModelProto, strip_above: int = STRIP_TENSOR_BYTES) -> onnx.ModelProto:
    """The model with every initializer over `strip_above` bytes stripped of its data (an external-data stub with
    the same name, type and dims), built without copying those tensors: what shape inference and the checker need,
    and what `save_with_external_data` writes. Every other field of the model and its graph is kept (metadata,
    producer, doc strings, functions, training info...). Shape tensors and other small constants keep their values."""
    g = model.graph
    light = onnx.ModelProto()
    _copy_fields(model, light, skip=("graph",))
    lg = light.graph
    _copy_fields(g, lg, skip=("initializer",))
    for t in g.initializer:
        if tensor_bytes(t) <= strip_above or t.data_location == onnx.TensorProto.EXTERNAL:
            lg.initializer.add().CopyFrom(t)
            continue
        stub = lg.initializer.add()
        _copy_fields(t, stub, skip=("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                                    "double_data", "uint64_data", "external_data", "data_location"))
        stub.data_location = onnx.TensorProto.EXTERNAL
        e = stub.external_data.add()
        e.key, e.value = "location", STRIPPED
    return light


def check_model(model: onnx.ModelProto) -> None:
    """onnx.checker.check_model (without shape inference) for a model of any size: a big one is checked as a
    light copy whose large weights are one-element tensors of their types (the checker, without shape inference,
    does not compare them with their uses, and it rejects the external-data stubs of `light_copy`)."""
    if model_bytes(model) <= ANALYSE_LIGHT_BYTES:
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


def _write_stub_data(light: onnx.ModelProto, full: onnx.ModelProto, data_path: str) -> None:
    """Write the data of `light`'s stripped initializers (light_copy's stubs), taken from `full`, into `data_path`,
    one tensor at a time, and point the stubs at it (by its file name: the model goes in the same folder)."""
    stubs = [t for t in light.graph.initializer
             if t.data_location == onnx.TensorProto.EXTERNAL and len(t.external_data) == 1
             and t.external_data[0].value == STRIPPED]
    big = {t.name: t for t in full.graph.initializer if t.name in {s.name for s in stubs}}
    offset = 0
    with open(data_path, "wb") as f:
        for stub in stubs:
            t = big[stub.name]
            data = t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes()
            pad = -offset % DATA_ALIGN
            f.write(bytes(pad))
            offset += pad
            f.write(data)
            del stub.external_data[:]
            for k, v in (("location", os.path.basename(data_path)), ("offset", str(offset)),
                         ("length", str(len(data)))):
                stub.external_data.add(key=k, value=v)
            offset += len(data)
            del data


def save_with_external_data(model: onnx.ModelProto, path: str) -> None:
    """Write `model` to `path` with its larger tensors in `<name>.data` beside it, without serializing it whole
    and without copying the model or changing it: the light copy is written, and the large tensors' bytes are
    written one at a time into the data file it points to."""
    light = light_copy(model, strip_above=1024)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in light.graph.initializer):
        _write_stub_data(light, model, os.path.join(os.path.dirname(os.path.abspath(path)),
                                                    os.path.basename(path) + ".data"))
    onnx.save_model(light, path)


class SharedWeights:
    """A model whose large initializers are written once, to one data file in `folder`, as a light copy (`light`)
    that points into it: many models built from the light copy share that file, and each is written small. The
    whole-model decision builds a dozen plan models from one folded model; written whole, each cost BERT-base 0.9 s
    (435 MB serialized and written) and its session 0.3 s more."""

    def __init__(self, model: onnx.ModelProto, folder: str, name: str = "shared-weights.data"):
        self.light = light_copy(model)
        _write_stub_data(self.light, model, os.path.join(folder, name))


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
