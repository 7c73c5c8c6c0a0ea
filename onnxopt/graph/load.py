"""Load and save models the way users expect.

- Any model onnxruntime can load: old IR versions, opsets 7 and up, external data, control flow, custom domains.
- `--input-shape name:d0,d1,...` fixes symbolic dims; everything else keeps its symbolic dims. A dim declared -1
  (Paddle2ONNX's dynamic dim) is symbolic: it gets a name of its own (graph/bindings.py, name_dynamic_dims).
- Saving never writes over the input, is atomic (a temporary name, then a rename), keeps large initializers in
  `<output>.data` when the input used external data or the model passes 2 GB, and emits an IR version the installed
  onnxruntime reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnx
from onnx import external_data_helper

from onnxopt.errors import InputError, UsageError

from .bindings import has_dynamic_dims, name_dynamic_dims
from .large import model_bytes, save_with_external_data, tensor_bytes
from .publish import DATA_SUFFIX, Staging, check_destination, check_output, create_new
from .ort_compat import max_ir_version

TWO_GB = 2**31
# Types whose elements are whole bytes (4-bit types pack two an element: their sizes are not checked).
_WHOLE_BYTE_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                     onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16,
                     onnx.TensorProto.UINT16, onnx.TensorProto.INT32, onnx.TensorProto.UINT32,
                     onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL}
MAX_INPUT_ELEMENTS = 2**32  # one input of 16 GiB of float32: larger is a typo, not a serving shape


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    path: str | None
    used_external_data: bool
    size_bytes: int
    files: list = None  # the model file and every external-data file it references: never written over
    # The graph's inputs, value_info (and outputs) as the file declares them, before --input-shape fixed them or
    # their -1 dims were named (restore_given)
    given: tuple = ((), ())

    def restore_given(self, model: onnx.ModelProto) -> None:
        """Put back the declared input shapes in `model` (a copy of `self.model`): a model written unchanged is the
        model as given. onnxruntime optimizes a model with fixed input dims differently, and on a dynamically
        quantized BERT-base that moved outputs by 0.08 (quantization steps)."""
        inputs, value_info, *outputs = self.given
        if not inputs:
            return
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        del model.graph.value_info[:]
        model.graph.value_info.extend(value_info)
        if outputs:  # their -1 dims (name_dynamic_dims)
            del model.graph.output[:]
            model.graph.output.extend(outputs[0])


def external_data_files(model: onnx.ModelProto, folder: str) -> list[str]:
    """The files a model's external tensors live in, as absolute paths (before the data is loaded)."""
    files = []
    for t in external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            if info.get("location"):
                files.append(os.path.abspath(os.path.join(folder, info["location"])))
    return list(dict.fromkeys(files))


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def check_no_overwrite(inputs: list[str], outputs: list[str], what: str = "onnxopt") -> None:
    """Refuse (exit 2) when a file this run would write, or delete, is one it reads: the model, its external data,
    a check input. Copying model.onnx to orig.onnx and writing model.onnx from it would otherwise replace
    model.onnx.data, which orig.onnx still reads."""
    for out in outputs:
        for src in inputs:
            if src and _same_file(out, src):
                raise UsageError(f"{what} would write over {src}, which the input reads; onnxopt never writes "
                                 f"over its inputs. Choose another output name")


def parse_input_shapes(specs: list[str] | None, option: str = "--input-shape") -> dict[str, list[int]]:
    """`["x:1,3,224,224", "mask:1,128"]` -> {"x": [1,3,224,224], ...}."""
    shapes: dict[str, list[int]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise UsageError(f"{option} '{spec}': write it as name:d0,d1,... (for example x:1,3,224,224)")
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise UsageError(f"{option} '{spec}': dims must be integers, got '{dims}'") from None
        if any(d < 0 for d in shapes[name]):
            raise UsageError(f"{option} '{spec}': dims must be 0 or more")
    return shapes


def measure_bindings(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> dict[str, int]:
    """--measure-shape: the values of the symbolic dims that these input shapes give (the model keeps them
    symbolic); a shape that contradicts the model's fixed dims, its rank or itself is refused."""
    inputs = {i.name: i for i in model.graph.input}
    out: dict[str, int] = {}
    for name, dims in shapes.items():
        if name not in inputs:
            raise UsageError(f"--measure-shape names '{name}', but the model's inputs are: {', '.join(inputs)}")
        declared = inputs[name].type.tensor_type.shape.dim
        if len(declared) != len(dims):
            raise UsageError(f"--measure-shape {name}: the model's input has rank {len(declared)}, you gave "
                             f"{len(dims)} dims")
        for i, (d, n) in enumerate(zip(declared, dims)):
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != n:
                raise UsageError(f"--measure-shape {name}: dim {i} is fixed at {d.dim_value} in the model, you "
                                 f"gave {n}")
            if d.dim_param:
                if out.get(d.dim_param, n) != n:
                    raise UsageError(f"--measure-shape {name}: dim {i} is '{d.dim_param}', given "
                                     f"{out[d.dim_param]} elsewhere and {n} here")
                out[d.dim_param] = n
    return out


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in external_data_helper._get_all_tensors(model))


def load_model(source, input_shapes: dict[str, list[int]] | None = None) -> LoadedModel:
    """Read a model from a path or take a ModelProto; external data is loaded into memory."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        path, ext, size = None, _uses_external_data(model), model_bytes(model)
        files = []
    else:
        path = os.fspath(source)
        if not os.path.exists(path):
            raise InputError(f"{path}: no such file; give the path of an .onnx model")
        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as e:  # noqa: BLE001 - protobuf raises several types
            raise InputError(f"{path}: not a readable ONNX model ({e}); check the file is a complete .onnx") from None
        ext = _uses_external_data(model)
        files = [os.path.abspath(path)] + external_data_files(model, os.path.dirname(os.path.abspath(path)))
        if ext:
            try:
                external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
            except Exception as e:  # noqa: BLE001 - onnx raises OSError, ValueError or its ValidationError
                raise InputError(f"{path}: its external data could not be read ({e}); keep the .data file "
                                 "next to the model") from None
            _check_data_sizes(model, path)
        size = os.path.getsize(path)
    if not model.graph.node:
        raise InputError(f"{path or 'model'}: the graph has no nodes")
    given = ((), ())
    if input_shapes or has_dynamic_dims(model):
        given = (_copies(model.graph.input), _copies(model.graph.value_info), _copies(model.graph.output))
    name_dynamic_dims(model)  # -1 (Paddle2ONNX's dynamic dim): a symbol of its own
    if input_shapes:
        fix_input_shapes(model, input_shapes)
    return LoadedModel(model, path, ext, size, files, given)


def _copies(messages) -> list:
    out = []
    for m in messages:
        c = type(m)()
        c.CopyFrom(m)
        out.append(c)
    return out


def _check_data_sizes(model: onnx.ModelProto, path: str) -> None:
    """Every initializer read from external data holds as many bytes as its dims and type say (a wrong length or
    offset in the model reads a short or empty tensor)."""
    for t in model.graph.initializer:
        if t.HasField("raw_data") and t.data_type not in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            want = tensor_bytes(t)
            have = len(t.raw_data)
            if have != want and t.data_type in _WHOLE_BYTE_TYPES:
                raise InputError(f"{path}: initializer {t.name} has {have} bytes of data where its dims "
                                 f"{list(t.dims)} need {want}; its external data (offset, length) is wrong")


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> None:
    inputs = {i.name: i for i in model.graph.input}
    for name, dims in shapes.items():
        if name not in inputs:
            raise UsageError(f"--input-shape names '{name}', but the model's inputs are: {', '.join(inputs)}")
        tt = inputs[name].type.tensor_type
        if tt.HasField("shape") and len(tt.shape.dim) != len(dims):
            raise UsageError(f"--input-shape {name}: the model's input has rank {len(tt.shape.dim)}, "
                             f"you gave {len(dims)} dims")
        if tt.HasField("shape"):
            for i, (d, n) in enumerate(zip(tt.shape.dim, dims)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != n:  # -1: dynamic (Paddle)
                    raise UsageError(f"--input-shape {name}: dim {i} is fixed at {d.dim_value} in the model, you "
                                     f"gave {n}; only symbolic dims can be set")
        elements = 1
        for n in dims:
            elements *= n
        if elements > MAX_INPUT_ELEMENTS:
            raise UsageError(f"--input-shape {name}: {'x'.join(map(str, dims))} is {elements:,} elements, more than "
                             f"{MAX_INPUT_ELEMENTS:,}; give the shape you will serve")
        tt.shape.Clear()
        for d in dims:
            tt.shape.dim.add().dim_value = d
    # Intermediate shapes computed for the old dims are stale now.
    del model.graph.value_info[:]


def ort_loadable_ir(model: onnx.ModelProto, needs_functions: bool) -> None:
    """Clamp the IR version to what the installed ORT reads; functions need IR >= 8."""
    ir = model.ir_version
    if needs_functions:
        ir = max(ir, 8)
    inputs = {i.name for i in model.graph.input}
    if ir < 4 and any(t.name not in inputs for t in model.graph.initializer):
        ir = 4  # IR 3 requires every initializer to be a graph input; folding adds initializers that are not
    model.ir_version = min(ir, max_ir_version())


def check_output_path(input_path: str | None, output_path: str) -> None:
    if not output_path:
        raise UsageError("no output path: give one with -o fused.onnx")
    out = os.path.abspath(output_path)
    if os.path.isdir(out):
        raise UsageError(f"-o {output_path} is a folder; give a file name such as {os.path.join(output_path, 'fused.onnx')}")
    if input_path and os.path.exists(out) and os.path.exists(input_path) and os.path.samefile(out, input_path):
        raise UsageError(f"-o {output_path} is the input model; onnxopt never writes over its input. "
                         "Choose another output name.")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise UsageError(f"-o {output_path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"-o {output_path}: the folder {parent} is not writable; choose another output folder")
    check_output(out, "-o")


def write_model(model: onnx.ModelProto, path: str, external: bool) -> list[str]:
    """Write the model at `path`, a new name in a folder the caller owns (a `Staging` folder), with its larger
    tensors in `<path>.data` when `external` or past 2 GB; every ModelProto field is kept (graph/large.py,
    light_copy). Returns the suffixes written ("" and maybe ".data"), the model's last."""
    external = external or model_bytes(model) >= TWO_GB
    if external:
        save_with_external_data(model, path)
    else:
        with create_new(path) as f:
            f.write(model.SerializeToString())
    suffixes = [DATA_SUFFIX] if os.path.exists(path + DATA_SUFFIX) else []
    return suffixes + [""]


def save_model(model: onnx.ModelProto, output_path: str, external: bool) -> list[str]:
    """Write the model (and `<output>.data` when `external` or past 2 GB: a relative location, so the pair can be
    moved together) whole or not at all: written in a private folder beside it, then renamed into place
    (graph/publish.py). Returns the paths published."""
    check_destination(os.path.abspath(output_path), "the output")
    with Staging(output_path) as staging:
        suffixes = write_model(model, staging.path(), external)
        staging.publish(suffixes)
    return [os.path.abspath(output_path) + s for s in suffixes]


def make_readable(path: str) -> None:
    """mkstemp creates files 0600; outputs get the permissions a plain open() would give (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
