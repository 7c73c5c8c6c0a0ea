"""Values for a model's symbolic input dims: the shapes its checks and timings run at.

A model as exporters write it often declares dims it can only run at some values: YOLOv8's height and width must be
multiples of its total stride (32), a ViT's must be 224, Silero VAD's `sr` input must be 8000 or 16000. The
optimizer checks and times a model at one set of values for its symbolic dims (`candidates`), tried in this order
against onnxruntime, the first that runs kept (driver/outputs.py, `_choose_bindings`):

1. the values the model itself implies (`implied_bindings`: its metadata, such as Ultralytics' `imgsz`, and fixed
   dims that a symbol meets in an elementwise op or a Concat), on top of 2;
2. the values models are served at (`typical_bindings`): an image input's height and width at 224, batch 1,
   sequence dims 128 (and the image at 320, then 640: multiples of 64 and 128 for deeper networks);
3. the old small values: distinct ones > 1 (2, 3, ...: dims that only happen to be equal cannot hide a broadcasting
   mistake), then all 2, then all 1.

Realistic sizes come before the small distinct ones because the chosen values are also the timing's: a kernel timed
at 2x3 pixels says nothing about its speed at 640x640. The user's values (--measure-shape, and the shapes of
--check-input arrays) are not candidates but constraints: every candidate takes them.

Each try runs the model once in onnxruntime (one session for all tries), so the list is short (MAX_CANDIDATES).

A dim declared `-1` (Paddle2ONNX writes dynamic dims that way; onnxruntime treats it as symbolic) gets a symbol of
its own at load (`name_dynamic_dims`), so that everything downstream treats it as the symbolic dim it is.
"""

from __future__ import annotations

import ast
import re

import numpy as np
import onnx

from onnxopt.errors import UsageError

# The batch status and the words of the optimizer's error for a model that runs at no candidate.
NEEDS_INPUT = "needs input shapes or data"
MAX_CANDIDATES = 6
TEXT_LINE = (48, 320)  # height, width
IMAGE_SIZES = (224, 320, 640)  # multiples of 32, the usual total stride (320: of 64, 640: of 128)
SEQUENCE_LENGTH = 128
DYNAMIC_PREFIX = "dyn__"  # not "unk__": fusion rules read that prefix as "unknown, equal to nothing"

_BATCH_NAMES = re.compile(r"^(n|b|bs|batch|batch_?size|.*batch.*|dyn__.*_0)$", re.IGNORECASE)
_SEQUENCE_NAMES = re.compile(r"(seq|sequence|tokens?|length|len|time|frames?)", re.IGNORECASE)
_INT_KINDS = "iu"


def name_dynamic_dims(model: onnx.ModelProto) -> bool:
    """Give every input dim declared with a negative value (-1), or with neither a value nor a name (Silero VAD's
    export: an unknown dim, symbolic to onnxruntime), a symbol of its own, `dyn__<input>_<axis>`, and drop
    negative values from the outputs and value_info (an unknown dim there, which shape inference fills). Returns
    whether anything changed (the caller keeps the declared shapes to restore: LoadedModel.restore_given)."""
    g = model.graph
    used = {d.dim_param for vi in list(g.input) + list(g.output) + list(g.value_info)
            for d in vi.type.tensor_type.shape.dim if d.dim_param}
    changed = False
    inits = {t.name for t in g.initializer}
    for vi in g.input:
        if vi.name in inits:
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if (d.HasField("dim_value") and d.dim_value < 0) or d.WhichOneof("value") is None:
                name = f"{DYNAMIC_PREFIX}{vi.name}_{axis}"
                while name in used:
                    name += "_"
                used.add(name)
                d.dim_param = name  # a oneof with dim_value: this clears the -1
                changed = True
    for vi in list(g.output) + list(g.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.ClearField("dim_value")
                changed = True
    return changed


def _inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits and vi.type.HasField("tensor_type")]


def _dims(vi: onnx.ValueInfoProto) -> list:
    """An input's dims: an int where fixed, the symbol's name where symbolic, None where neither."""
    out = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            out.append(d.dim_value)
        else:
            out.append(d.dim_param or None)
    return out


def input_symbols(model: onnx.ModelProto) -> list[str]:
    """The symbolic dims of the graph's inputs, in order of first appearance."""
    symbols: list[str] = []
    for vi in _inputs(model):
        for d in _dims(vi):
            if isinstance(d, str) and d not in symbols:
                symbols.append(d)
    return symbols


def user_bindings(model: onnx.ModelProto, measure: dict[str, int], arrays: dict[str, np.ndarray]) -> dict[str, int]:
    """The values the user gave: --measure-shape's (`measure`, from load.measure_bindings) and the shapes of the
    --check-input arrays; a symbol given two values is refused."""
    out = dict(measure or {})
    for vi in _inputs(model):
        if vi.name not in (arrays or {}):
            continue
        shape = np.shape(arrays[vi.name])
        for axis, (d, n) in enumerate(zip(_dims(vi), shape)):
            if isinstance(d, str):
                if out.get(d, n) != n:
                    raise UsageError(f"--check-input {vi.name}: dim {axis} is '{d}', {out[d]} elsewhere and {n} "
                                     "here; give arrays (and --measure-shape) that agree")
                out[d] = int(n)
    return out


def _roles(model: onnx.ModelProto) -> dict[str, str]:
    """What each input symbol looks like: "image" (an image's height or width), "batch" or "sequence"."""
    roles: dict[str, str] = {}

    def put(sym, role):
        if isinstance(sym, str) and sym not in roles:
            roles[sym] = role

    for vi in _inputs(model):
        dims = _dims(vi)
        kind = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)).kind \
            if vi.type.tensor_type.elem_type else "?"
        if len(dims) == 4 and kind == "f":
            hw = None
            if dims[1] in (1, 3):
                hw = (dims[2], dims[3])  # NCHW, grey or colour
            elif dims[3] in (1, 3):
                hw = (dims[1], dims[2])  # NHWC
            if hw is not None:
                for s in hw:
                    put(s, "image")
                put(dims[0], "batch")
        if len(dims) == 2 and kind in _INT_KINDS:  # token ids, attention masks: [batch, sequence]
            put(dims[0], "batch")
            put(dims[1], "sequence")
    for vi in _inputs(model):
        dims = _dims(vi)
        for axis, s in enumerate(dims):
            if not isinstance(s, str):
                continue
            if axis == 0 and len(dims) >= 2 and _BATCH_NAMES.match(s):
                put(s, "batch")
            elif axis > 0 and _SEQUENCE_NAMES.search(s):
                put(s, "sequence")
    return roles


def typical_bindings(model: onnx.ModelProto, symbols: list[str], image: int = IMAGE_SIZES[0]) -> dict[str, int]:
    """Images at `image` x `image`, batch 1, sequences 128; any other symbol as the distinct candidate has it."""
    roles = _roles(model)
    value = {"image": image, "batch": 1, "sequence": SEQUENCE_LENGTH}
    return {s: value[roles[s]] if s in roles else 2 + i for i, s in enumerate(symbols)}


_IMAGE_SIZE_KEYS = ("imgsz", "img_size", "image_size", "input_size")  # Ultralytics writes imgsz: [640, 640]
_METADATA_KEYS = set(_IMAGE_SIZE_KEYS) | {"batch"}


def _metadata_ints(model: onnx.ModelProto) -> dict[str, list[int]]:
    out = {}
    for p in model.metadata_props:
        if p.key.lower() not in _METADATA_KEYS or len(p.value) > 200:
            continue
        try:
            v = ast.literal_eval(p.value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(v, int) and not isinstance(v, bool):
            out[p.key.lower()] = [v]
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            out[p.key.lower()] = list(v)
    return out


# Broadcasting ops: a symbol aligned with a fixed dim > 1 of another operand must equal it.
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
              "And", "Or", "Xor", "Max", "Min", "Sum", "Mean", "PRelu", "BitShift", "Mod"}


def implied_bindings(model: onnx.ModelProto, symbols: list[str]) -> dict[str, int]:
    """Values the model says its symbols take: metadata (Ultralytics writes `imgsz: [640, 640]` and `batch: 1`) and
    the fixed dims a symbol meets in a broadcasting op or a Concat (a position table of 128 rows added to the
    embeddings fixes the sequence at 128). Best effort: a model onnx cannot infer says nothing."""
    if not symbols:
        return {}
    roles = _roles(model)
    out: dict[str, int] = {}
    meta = _metadata_ints(model)
    size = next((meta[k] for k in _IMAGE_SIZE_KEYS if k in meta), None)
    images = [s for s in symbols if roles.get(s) == "image"]
    if size and images:
        hw = size * 2 if len(size) == 1 else size[-2:]
        for vi in _inputs(model):  # the first image input's height and width, in its order
            dims = [d for d in _dims(vi) if d in images]
            for s, n in zip(dims, hw):
                out.setdefault(s, int(n))
    if "batch" in meta and len(meta["batch"]) == 1:
        for s in symbols:
            if roles.get(s) == "batch":
                out.setdefault(s, meta["batch"][0])
    found: dict[str, set[int]] = {}
    try:
        from .large import light_copy

        inferred = onnx.shape_inference.infer_shapes(light_copy(model))
    except Exception:  # noqa: BLE001 - onnx refuses some models onnxruntime runs: nothing implied
        inferred = None
    if inferred is not None:
        shapes = {vi.name: _dims(vi) for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
                  + list(inferred.graph.output) if vi.type.HasField("tensor_type")
                  and vi.type.tensor_type.HasField("shape")}
        for t in inferred.graph.initializer:
            shapes.setdefault(t.name, list(t.dims))
        for n in inferred.graph.node:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value" and a.t is not None:
                        shapes.setdefault(n.output[0], list(a.t.dims))
            operands = [shapes.get(x) for x in n.input if x]
            if n.op_type in _BROADCAST:
                if any(s is None for s in operands) or len(operands) < 2:
                    continue
                rank = max(len(s) for s in operands)
                aligned = [[None] * (rank - len(s)) + list(s) for s in operands]
                for column in zip(*aligned):
                    fixed = {d for d in column if isinstance(d, int) and d > 1}
                    if len(fixed) == 1:
                        for d in column:
                            if d in symbols:
                                found.setdefault(d, set()).add(next(iter(fixed)))
            elif n.op_type == "Concat" and len(operands) >= 2 and all(s is not None for s in operands):
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                rank = len(operands[0])
                if any(len(s) != rank for s in operands):
                    continue
                for i, column in enumerate(zip(*operands)):
                    if i == axis % max(rank, 1):
                        continue
                    fixed = {d for d in column if isinstance(d, int) and d > 0}
                    if len(fixed) == 1:
                        for d in column:
                            if d in symbols:
                                found.setdefault(d, set()).add(next(iter(fixed)))
    for s, values in found.items():
        if len(values) == 1:
            out.setdefault(s, values.pop())
    return {s: v for s, v in out.items() if s in symbols and isinstance(v, int) and v > 0}


def text_line_bindings(model: onnx.ModelProto, symbols: list[str]) -> dict[str, int]:
    """As `typical_bindings`, with a symbolic image height at 48 and width at 320 (`TEXT_LINE`): a text recognizer's
    line (PP-OCR's recognizers take 48 x 320; their heights are symbolic in the export but fixed by the network)."""
    out = typical_bindings(model, symbols)
    for vi in _inputs(model):
        dims = _dims(vi)
        if len(dims) == 4 and dims[1] in (1, 3):
            for s, v in zip(dims[2:], TEXT_LINE):
                if isinstance(s, str) and s in out:
                    out[s] = v
    return out


def candidates(model: onnx.ModelProto, given: dict[str, int] | None = None) -> list[tuple[str, dict[str, int]]]:
    """(label, bindings) to try in order, each with the user's values `given` on top; at most MAX_CANDIDATES, none
    twice. A model without symbolic dims has one: ("as declared", {})."""
    symbols = input_symbols(model)
    given = {k: v for k, v in (given or {}).items() if k in symbols}
    if not symbols or len(given) == len(symbols):
        return [("as declared" if not symbols else "as given", dict(given))]
    distinct = {s: 2 + i for i, s in enumerate(symbols)}
    roles = _roles(model)
    has_images = any(r == "image" for r in roles.values())
    typical = typical_bindings(model, symbols)
    implied = implied_bindings(model, symbols)
    listed = []
    if implied:
        listed.append(("implied by the model", {**typical, **implied}))
    listed.append(("typical (image 224, batch 1, sequence 128)" if has_images else
                   "typical (batch 1, sequence 128)", typical))
    if has_images:
        listed.append(("a text line (48 x 320)", text_line_bindings(model, symbols)))
        for size in IMAGE_SIZES[1:]:
            listed.append((f"typical (image {size})", typical_bindings(model, symbols, size)))
    listed += [("distinct small values", distinct), ("all 2", {s: 2 for s in symbols}),
               ("all 1", {s: 1 for s in symbols})]
    out, seen = [], set()
    for label, b in listed:
        b = {**b, **given}
        key = tuple(sorted(b.items()))
        if key not in seen:
            seen.add(key)
            out.append((label, b))
    if len(out) > MAX_CANDIDATES:  # the all-2 set goes first: "all 1" is the last resort of batch-1 exports
        out = [c for c in out if c[0] != "all 2"]
    return out[:MAX_CANDIDATES]


def integer_inputs(model: onnx.ModelProto, given: dict | None = None) -> list[str]:
    """Integer inputs the user did not give: random ones (0 or 1) cannot select a mode (Silero's `sr`)."""
    out = []
    for vi in _inputs(model):
        et = vi.type.tensor_type.elem_type
        if et and vi.name not in (given or {}) and \
                np.dtype(onnx.helper.tensor_dtype_to_np_dtype(et)).kind in _INT_KINDS:
            out.append(vi.name)
    return out


def example_flags(model: onnx.ModelProto, given: dict | None = None) -> str:
    """`--input-shape x:1,3,224,224 --check-input sr:FILE.npy`: the flags a model that runs at no candidate needs,
    its own input names and dims in them (symbols written as D)."""
    words = []
    ints = set(integer_inputs(model, given))
    for vi in _inputs(model):
        if vi.name in (given or {}):
            continue
        dims = _dims(vi)
        if vi.name in ints:
            words.append(f"--check-input {vi.name}:FILE.npy")
        elif any(not isinstance(d, int) for d in dims):
            words.append(f"--input-shape {vi.name}:" + ",".join(str(d) if isinstance(d, int) else "D" for d in dims))
    return " ".join(words)


def needs_input_message(model: onnx.ModelProto, failure: str, tried: list[str], given: dict | None = None,
                        measure: bool = False) -> str:
    """The error of a model that runs at none of the candidates `tried` (their labels). Where the user could help
    (symbolic dims, or integer inputs they did not give), it says the model needs input shapes or data
    (NEEDS_INPUT, what the batch reads as its status) and which flags, with the model's own input names."""
    given = given or {}
    names = [vi.name for vi in _inputs(model)]
    what = ("the given" if all(n in given for n in names) else "the given and random") if given else \
        ("random (--measure-shape)" if measure else "random")
    ints = integer_inputs(model, given)
    open_dims = [s for s in input_symbols(model)]
    at = f" at every shape tried ({'; '.join(tried)})" if len(tried) > 1 else ""
    head = f"the model fails in onnxruntime on {what} inputs{at} ({failure})"
    skip = "or skip the checks with --no-verify --no-measure"
    if not ints and not open_dims:
        return f"{head}; give inputs it runs on with --check-input NAME:FILE.npy, {skip}"
    why = []
    if ints:
        why.append(f"its integer input{'s' if len(ints) > 1 else ''} {', '.join(ints)} may select a mode (a sample "
                   "rate, a flag) that random values (0, 1) do not")
    if open_dims:
        why.append(f"its symbolic dims ({', '.join(open_dims[:6])}{', ...' if len(open_dims) > 6 else ''}) may need "
                   "sizes other than those tried")
    scalar = f" (a scalar: np.save('{ints[0]}.npy', np.array(16000, np.int64)))" if ints else ""
    example = example_flags(model, given)
    dims = ", D a size" if " D" in example or ",D" in example or ":D" in example else ""
    return (f"{head}; it {NEEDS_INPUT}: {' and '.join(why)}. Give them with `{example}`{scalar}{dims}; or give real "
            "inputs with --check-input NAME:FILE.npy, or skip the checks with --no-verify --no-measure")


def has_dynamic_dims(model: onnx.ModelProto) -> bool:
    """Whether any input, output or value_info dim is declared negative (what name_dynamic_dims changes)."""
    g = model.graph
    return any(d.HasField("dim_value") and d.dim_value < 0 for vi in list(g.input) + list(g.output)
               + list(g.value_info) for d in vi.type.tensor_type.shape.dim)
