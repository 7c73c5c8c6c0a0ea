"""Fuzzing onnxopt with mutated small models: the seeds, the mutations, and the checks of one run (issue 31, item 8).

Shared by tests/fuzz/test_fuzz_models.py (200 hypothesis cases, the CLI run in-process) and benchmarks/fuzz.py (N
cases, each run in a subprocess so that crashes and hangs are caught for real).

A case is drawn through a `Chooser` (hypothesis' `data.draw` in the test, `random.Random` in the script): a seed
model, a mutation kind and the mutation's parameters. Its files (model.onnx, model.onnx.data for external data) are
written to a fresh folder and `onnxopt model.onnx -o out.onnx` runs on them. What every run must satisfy
(`check_run`):

- the exit code is 0, 1 or 2: never 3 (internal error), never a signal, never a hang;
- no Python traceback on stderr; a non-zero exit prints exactly one line, "onnxopt: error: ...";
- a non-zero exit leaves nothing at out.onnx, out.onnx.so, out.onnx.data, and no run leaves temporaries (.*.tmp
  files, .onnxopt-* folders) in the folder or in the temporary folder (TMPDIR);
- the input files are never changed (sha256 before and after);
- on exit 0 the output model loads in a plain onnxruntime session (without the kernel library: the function bodies)
  and through `onnxopt.runtime.InferenceSession` (with the library), and both give the input model's outputs on
  random inputs (symbolic dims at two sizes; overridable initializers both left alone and fed).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import random
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL = "model.onnx"
DATA = "model.onnx.data"
OUT = "out.onnx"
OUTPUTS = (OUT, OUT + ".so", OUT + ".data")
CLI_FLAGS = ["--threads", "1", "--tune-budget", "0", "--no-cost-cache", "--no-measure", "-q"]
TIME_LIMIT_S = 60.0
# onnxruntime's telemetry writes a session marker to TMPDIR when it is first imported: not a temporary of onnxopt's.
TMPDIR_NOT_OURS = {".ses"}
RTOL, ATOL, SCALE_TOL = 1e-3, 1e-4, 1e-4
MAX_CHECK_ELEMENTS = 1 << 24  # inputs bigger than this are not checked numerically (the run itself still is)


# ----------------------------------------------------------------------------------------------------- choosers --

class Chooser:
    """Where a case's random choices come from. Every draw is recorded in `trail` (for the reproduction notes)."""

    def __init__(self):
        self.trail: list[str] = []

    def integer(self, lo: int, hi: int, label: str = "") -> int:  # lo..hi inclusive
        v = self._integer(lo, hi)
        self.trail.append(f"{label or 'int'}={v}")
        return v

    def choice(self, options: Sequence, label: str = ""):
        v = self._choice(list(options))
        shown = f"<{type(v).__name__} {v.name!r}>" if hasattr(v, "DESCRIPTOR") and hasattr(v, "name") else repr(v)
        self.trail.append(f"{label or 'choice'}={shown}"[:120])
        return v

    def boolean(self, label: str = "") -> bool:
        return bool(self.integer(0, 1, label))

    def _integer(self, lo, hi):
        raise NotImplementedError

    def _choice(self, options):
        raise NotImplementedError


class RandomChooser(Chooser):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.rng = rng

    def _integer(self, lo, hi):
        return self.rng.randint(lo, hi)

    def _choice(self, options):
        return self.rng.choice(options)


class HypothesisChooser(Chooser):
    """Draws through hypothesis (`st.data()`), so failing cases shrink toward the first options and small numbers."""

    def __init__(self, data):
        super().__init__()
        self.data = data

    def _integer(self, lo, hi):
        from hypothesis import strategies as st
        return self.data.draw(st.integers(lo, hi))

    def _choice(self, options):
        from hypothesis import strategies as st
        return self.data.draw(st.sampled_from(options))


# -------------------------------------------------------------------------------------------------------- seeds --

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "fuzz", inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="fuzz")
    m.ir_version = 8
    return m


def seed_elementwise():
    """x[1,8,8,8] -> Add(c) -> Relu -> Sigmoid -> Mul(x)."""
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["s", "x"], ["y"], name="mul")]
    return _model(nodes, [vi("x", F, [1, 8, 8, 8])], [vi("y", F, [1, 8, 8, 8])],
                  [numpy_helper.from_array(_rand([1, 8, 8, 8], 1), "c")])


def seed_conv():
    """x[1,8,8,8] -> Conv 3x3 (+bias, pads 1) -> Relu -> MaxPool 2x2/2."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[1, 1], dilations=[1, 1], group=1),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    return _model(nodes, [vi("x", F, [1, 8, 8, 8])], [vi("y", F, [1, 8, 4, 4])],
                  [numpy_helper.from_array(_rand([8, 8, 3, 3], 2, 0.2), "w"),
                   numpy_helper.from_array(_rand([8], 3, 0.1), "b")])


def seed_matmul_gelu():
    """x[1,16,32] -> MatMul(w) -> Add(b) -> y * 0.5 * (1 + Erf(y / sqrt 2))."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b"], ["h"], name="bias"),
             helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
             helper.make_node("Mul", ["h", "e1"], ["he"], name="mul"),
             helper.make_node("Mul", ["he", "half"], ["y"], name="half")]
    inits = [numpy_helper.from_array(_rand([32, 32], 4, 0.2), "w"), numpy_helper.from_array(_rand([32], 5, 0.1), "b"),
             numpy_helper.from_array(np.array(math.sqrt(2), np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    return _model(nodes, [vi("x", F, [1, 16, 32])], [vi("y", F, [1, 16, 32])], inits)


def seed_symbolic_batch():
    """x[N,8,8,8] -> Conv 1x1 (8 -> 16) -> SiLU (Sigmoid, Mul) -> Add(bias [1,16,1,1])."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["c", "s"], ["m"], name="silu"),
             helper.make_node("Add", ["m", "bias"], ["y"], name="add")]
    return _model(nodes, [vi("x", F, ["N", 8, 8, 8])], [vi("y", F, ["N", 16, 8, 8])],
                  [numpy_helper.from_array(_rand([16, 8, 1, 1], 6, 0.3), "w"),
                   numpy_helper.from_array(_rand([1, 16, 1, 1], 7, 0.1), "bias")])


def seed_external():
    """x[1,8,8,8] -> Conv 3x3 -> Relu -> Conv 1x1 -> Add(x); its weights in model.onnx.data (external data)."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             helper.make_node("Add", ["c2", "x"], ["y"], name="residual")]
    return _model(nodes, [vi("x", F, [1, 8, 8, 8])], [vi("y", F, [1, 8, 8, 8])],
                  [numpy_helper.from_array(_rand([8, 8, 3, 3], 8, 0.2), "w1"),
                   numpy_helper.from_array(_rand([8], 9, 0.1), "b1"),
                   numpy_helper.from_array(_rand([8, 8, 1, 1], 10, 0.3), "w2"),
                   numpy_helper.from_array(_rand([8], 11, 0.1), "b2")])


# name -> (builder, written with external data)
SEEDS: dict[str, tuple[Callable[[], onnx.ModelProto], bool]] = {
    "elementwise": (seed_elementwise, False),
    "conv": (seed_conv, False),
    "matmul_gelu": (seed_matmul_gelu, False),
    "symbolic_batch": (seed_symbolic_batch, False),
    "external": (seed_external, True),
}


# ---------------------------------------------------------------------------------------------------- the case --

@dataclass
class Case:
    seed: str
    kind: str
    detail: str
    files: dict[str, bytes]  # file name in the case folder -> content; MODEL is the model
    trail: list[str] = field(default_factory=list)
    model: onnx.ModelProto | None = None  # the mutated model before serialization (None after byte mutations)

    def describe(self) -> str:
        return f"{self.seed}/{self.kind}: {self.detail}"

    def write(self, folder: str) -> str:
        for name, data in self.files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        return os.path.join(folder, MODEL)


def serialize(model: onnx.ModelProto, external: bool) -> dict[str, bytes]:
    """The model's files. With `external`, every initializer's bytes go to DATA (16-byte aligned offsets)."""
    if not external:
        return {MODEL: model.SerializeToString()}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    blob = bytearray()
    for t in m.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL or t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
            continue
        try:
            raw = t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes()
        except Exception:  # noqa: BLE001 - a mutated tensor numpy cannot read: leave it inline
            continue
        blob += b"\0" * (-len(blob) % 16)
        offset = len(blob)
        blob += raw
        for fld in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
            t.ClearField(fld)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", DATA), ("offset", str(offset)), ("length", str(len(raw)))):
            e = t.external_data.add()
            e.key, e.value = k, v
    return {MODEL: m.SerializeToString(), DATA: bytes(blob)}


# ------------------------------------------------------------------------------------------------ the mutations --

def _values(model) -> list[str]:
    """Every tensor name in the graph, inputs and initializers first."""
    g = model.graph
    names = [i.name for i in g.input] + [t.name for t in g.initializer]
    for n in g.node:
        names += [o for o in n.output if o]
    return list(dict.fromkeys(names))


def _graph_inputs(model):
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _relax_outputs(model) -> None:
    """Forget the declared output shapes (and intermediate value_info), for mutations that change shapes legally."""
    del model.graph.value_info[:]
    for o in model.graph.output:
        if o.type.tensor_type.HasField("shape"):
            for d in o.type.tensor_type.shape.dim:
                d.Clear()


def _set_attr(node, name, value) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


def m_none(model, ch):
    return "the seed unchanged"


def m_drop_initializer(model, ch):
    i = ch.integer(0, len(model.graph.initializer) - 1, "initializer")
    name = model.graph.initializer[i].name
    del model.graph.initializer[i]
    return f"initializer {name!r} dropped"


DTYPES = {"float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64,
          "int32": TensorProto.INT32, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "bool": TensorProto.BOOL}


def m_init_dtype(model, ch):
    i = ch.integer(0, len(model.graph.initializer) - 1, "initializer")
    t = model.graph.initializer[i]
    dtype = ch.choice(list(DTYPES), "dtype")
    if ch.boolean("relabel_only"):  # the same bytes, another type tag (sizes may then disagree)
        arr = numpy_helper.to_array(t)
        t.ClearField("float_data")
        t.raw_data = arr.tobytes()
        t.data_type = DTYPES[dtype]
        return f"initializer {t.name!r}: its float32 bytes relabelled {dtype}"
    arr = numpy_helper.to_array(t).astype(np.dtype(dtype))
    model.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, t.name))
    return f"initializer {t.name!r} converted to {dtype}"


def m_init_shape(model, ch):
    i = ch.integer(0, len(model.graph.initializer) - 1, "initializer")
    t = model.graph.initializer[i]
    dims = list(t.dims)
    options = [[], [1], dims[:-1] or [2], dims + [1], [1] + dims, list(reversed(dims)) or [3],
               [d * 2 for d in dims] or [2], [max(d // 2, 1) for d in dims] or [1]]
    if len(dims) == 4:  # conv weights of another shape
        o, c, kh, kw = dims
        options += [[o, c, 5, 5], [o // 2 or 1, c, kh, kw], [o, c // 2 or 1, kh, kw], [o * 2, c, kh, kw],
                    [o, c, kh], [o, c, 1, 1], [o, c, kh, kw, 1], [o, c, 0, 0], [0, c, kh, kw]]
    new = ch.choice(options, "shape")
    if ch.integer(0, 3, "consistent") == 0:  # the dims change, the data does not
        del t.dims[:]
        t.dims.extend(new)
        return f"initializer {t.name!r}: dims {dims} -> {new}, data left as it was"
    arr = _rand(new, i + 20, 0.2) if new else np.array(0.3, np.float32)
    t.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), t.name))
    return f"initializer {t.name!r}: shape {dims} -> {new}"


def m_rename_input(model, ch):
    nodes = [n for n in model.graph.node if n.input]
    node = ch.choice(nodes, "node")
    j = ch.integer(0, len(node.input) - 1, "input")
    old = node.input[j]
    target = ch.choice(["missing", "other", "empty", "output"], "to")
    if target == "missing":
        new = old + "_typo"
    elif target == "empty":
        new = ""
    elif target == "output":
        new = model.graph.output[0].name
    else:
        new = ch.choice([v for v in _values(model) if v != old] or [old + "_x"], "value")
    node.input[j] = new
    if ch.boolean("relax_outputs"):
        _relax_outputs(model)
    return f"node {node.name!r} input {j}: {old!r} -> {new!r}"


def m_cycle(model, ch):
    g = model.graph
    if len(g.node) >= 2 and ch.boolean("pair"):
        a = ch.integer(0, len(g.node) - 2, "a")
        b = ch.integer(a + 1, len(g.node) - 1, "b")
        na, nb = g.node[a], g.node[b]
        na.input[0], nb.input[0] = nb.output[0], na.output[0]
        return f"nodes {na.name!r} and {nb.name!r} read each other's outputs"
    k = ch.integer(0, len(g.node) - 1, "node")
    n = g.node[k]
    j = ch.integer(0, len(n.input) - 1, "input")
    n.input[j] = n.output[0]
    return f"node {n.name!r} reads its own output (input {j})"


CONV_ATTRS = {
    "group": [3, 2, 8, 0, -1, 16, 4],
    "pads": [[100, 100, 100, 100], [-1, -1, -1, -1], [1, 1], [0, 0, 5, 5], [2, 2, 2, 2], [1, 0, 0, 1], [0, 0, 0, 0],
             [3, 3, 3, 3], [0, 2, 1, 0], [1 << 40] * 4],
    "kernel_shape": [[5, 5], [1, 1], [3], [3, 3, 3], [3, 3], [0, 0], [3, 1]],
    "strides": [[0, 0], [-1, -1], [2, 2], [3, 1], [100, 100], [2], [1, 1, 1]],
    "dilations": [[0, 0], [2, 2], [4, 4], [1, 2], [-1, -1], [100, 100]],
    "auto_pad": [b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"BOGUS", b"NOTSET"],
}
POOL_ATTRS = {
    "kernel_shape": [[0, 0], [3, 3], [9, 9], [2], [1, 1], [4, 2], [-2, -2], [2, 2, 2]],
    "strides": [[0, 0], [1, 1], [3, 3], [-1, -1], [2, 1]],
    "pads": [[1, 1, 1, 1], [-1, -1, -1, -1], [0, 0, 1, 1], [5, 5, 5, 5], [1, 1]],
    "ceil_mode": [1, 2, -1],
    "dilations": [[2, 2], [0, 0], [1, 3]],
    "storage_order": [1, 5],
    "auto_pad": [b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"BOGUS"],
}


def m_attribute(model, ch):
    windowed = [n for n in model.graph.node if n.op_type in ("Conv", "MaxPool")]
    node = ch.choice(windowed if windowed and ch.integer(0, 3, "windowed") else list(model.graph.node), "node")
    table = CONV_ATTRS if node.op_type == "Conv" else POOL_ATTRS if node.op_type == "MaxPool" else {}
    what = ch.choice(list(table) * 2 + ["unknown", "wrong_type", "remove"], "attribute")
    if what == "unknown":
        _set_attr(node, ch.choice(["foo", "alpha", "broadcast", "axis"], "name"), ch.integer(-1, 3, "value"))
        detail = f"node {node.name!r}: {node.attribute[-1].name}={node.attribute[-1].i}"
    elif what == "wrong_type":
        name = ch.choice([a.name for a in node.attribute] or ["kernel_shape"], "name")
        _set_attr(node, name, ch.choice([1.5, b"3", [1.0, 2.0], -7], "value"))
        detail = f"node {node.name!r}: {name} of the wrong type ({node.attribute[-1]})".replace("\n", " ")
    elif what == "remove":
        if not node.attribute:
            return f"node {node.name!r} has no attribute to remove"
        name = ch.choice([a.name for a in node.attribute], "name")
        _set_attr(node, name, None)
        detail = f"node {node.name!r}: attribute {name} removed"
    else:
        value = ch.choice(table[what], "value")
        _set_attr(node, what, value)
        detail = f"node {node.name!r}: {what}={value}"
    if ch.integer(0, 3, "relax_outputs"):
        _relax_outputs(model)
    return detail


DIM_VALUES = [0, -1, -7, 1 << 31, 1 << 40, 1 << 62, 1, 2, 3, 5, 16, 4096, "N", "batch size", "", 7]


def m_dims(model, ch):
    inputs = _graph_inputs(model)
    x = ch.choice(inputs, "input")
    shape = x.type.tensor_type.shape
    mode = ch.choice(["dim", "dim", "dim", "drop_dim", "add_dim", "no_shape", "all_symbolic"], "mode")
    if mode == "drop_dim":
        del shape.dim[-1]
        detail = f"input {x.name!r}: last dim dropped"
    elif mode == "add_dim":
        shape.dim.add().dim_value = ch.choice([1, 2], "size")
        detail = f"input {x.name!r}: a dim appended"
    elif mode == "no_shape":
        x.type.tensor_type.ClearField("shape")
        detail = f"input {x.name!r}: no shape"
    elif mode == "all_symbolic":
        for k, d in enumerate(shape.dim):
            d.Clear()
            d.dim_param = f"d{k}"
        detail = f"input {x.name!r}: every dim symbolic"
    else:
        k = ch.integer(0, len(shape.dim) - 1, "dim")
        v = ch.choice(DIM_VALUES, "value")
        d = shape.dim[k]
        d.Clear()
        if isinstance(v, str):
            if v:
                d.dim_param = v
        else:
            d.dim_value = v
        detail = f"input {x.name!r}: dim {k} = {v!r}"
    if ch.integer(0, 3, "relax_outputs"):
        _relax_outputs(model)
    return detail


def m_unknown_op(model, ch):
    if ch.integer(0, 2, "add_node") == 0:
        src = ch.choice(_values(model), "reads")
        op = ch.choice(["FooBar", "Gelu", "Relu6"], "op")
        model.graph.node.append(helper.make_node(op, [src], ["extra"], name="extra"))
        model.graph.output.append(vi("extra", F, None))
        return f"a node {op}({src!r}) -> graph output 'extra'"
    node = ch.choice(list(model.graph.node), "node")
    old = node.op_type
    node.op_type = ch.choice(["FooBar", old.lower(), "Gelu", "Conv2D", "", old + " "], "op")
    return f"node {node.name!r}: op {old!r} -> {node.op_type!r}"


def m_unknown_domain(model, ch):
    node = ch.choice(list(model.graph.node), "node")
    dom = ch.choice(["com.example", "ai.onnx.ml", "com.microsoft", "onnxopt", "ai.onnx"], "domain")
    node.domain = dom
    if ch.boolean("import_it"):
        model.opset_import.append(helper.make_opsetid(dom, ch.choice([1, 17, 999], "version")))
    return f"node {node.name!r} ({node.op_type}) in domain {dom!r}"


def m_opset(model, ch):
    mode = ch.choice(["version", "version", "remove", "duplicate"], "mode")
    if mode == "remove":
        del model.opset_import[:]
        return "no opset import"
    if mode == "duplicate":
        model.opset_import.append(helper.make_opsetid("", ch.choice([13, 11, 999], "version")))
        return f"two imports of the default domain: 17 and {model.opset_import[-1].version}"
    v = ch.choice([0, -1, 1, 6, 7, 9, 11, 13, 18, 21, 22, 999, 1 << 31], "version")
    model.opset_import[0].version = v
    return f"default-domain opset {v}"


def m_missing_output(model, ch):
    g = model.graph
    mode = ch.choice(["none", "dangling", "type_less"], "mode")
    if mode == "none":
        del g.output[:]
        return "no graph outputs"
    if mode == "dangling":
        g.output[0].name = "nowhere"
        return "the graph output names a value nothing produces"
    g.output[0].ClearField("type")
    return "the graph output has no type"


def m_duplicate_output(model, ch):
    g = model.graph
    mode = ch.choice(["listed_twice", "two_producers", "input_as_output", "output_is_initializer"], "mode")
    if mode == "listed_twice":
        g.output.append(g.output[0])
        return "the graph output listed twice"
    if mode == "two_producers":
        k = ch.integer(1, len(g.node) - 1, "node") if len(g.node) > 1 else 0
        g.node[k].output[0] = g.node[0].output[0] if k else g.node[0].input[0]
        return f"node {g.node[k].name!r} writes a name another node (or the input) already has"
    if mode == "input_as_output":
        g.output.append(_graph_inputs(model)[0])
        return "a graph input also listed as graph output"
    t = g.initializer[0]
    g.output.append(vi(t.name, t.data_type, list(t.dims)))
    return f"initializer {t.name!r} listed as a graph output"


def m_empty_graph(model, ch):
    g = model.graph
    mode = ch.choice(["no_nodes", "passthrough", "nothing"], "mode")
    del g.node[:]
    if mode == "passthrough":
        del g.output[:]
        g.output.append(_graph_inputs(model)[0])
        return "no nodes: the input is the output"
    if mode == "nothing":
        del g.input[:]
        del g.output[:]
        del g.initializer[:]
        return "an empty graph (no nodes, inputs, outputs or initializers)"
    return "no nodes (outputs dangling)"


def m_ir_version(model, ch):
    v = ch.choice([0, -1, 1, 2, 3, 4, 7, 9, 10, 11, 12, 13, 99, 1 << 40], "ir_version")
    model.ir_version = v
    return f"ir_version {v}"


# Mutations that keep the model valid (most of the time) but unusual: they reach fusion and code generation.

def m_reorder(model, ch):
    nodes = list(model.graph.node)
    if ch.boolean("reverse"):
        nodes.reverse()
    else:
        random.Random(ch.integer(0, 1000, "shuffle")).shuffle(nodes)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return "nodes out of topological order"


def m_extra_output(model, ch):
    g = model.graph
    produced = [o for n in g.node for o in n.output if o and o not in {x.name for x in g.output}]
    name = ch.choice(produced or [g.node[0].output[0]], "value")
    at = ch.integer(0, len(g.output), "position")
    typed = ch.boolean("typed")
    g.output.insert(at, vi(name, F, None) if typed else onnx.ValueInfoProto(name=name))
    return f"intermediate {name!r} also a graph output (position {at}{'' if typed else ', untyped'})"


def m_broadcast_const(model, ch):
    g = model.graph
    names = [t.name for t in g.initializer if not (len(t.dims) == 4 and t.dims[2:] != [1, 1]
                                                    and any(n.op_type == "Conv" and n.input[1] == t.name
                                                            for n in g.node))]
    name = ch.choice(names, "initializer")
    t = next(t for t in g.initializer if t.name == name)
    dims = list(t.dims)
    mode = ch.choice(["scalar", "one", "keep_last", "keep_first", "constant_node", "zeros", "nan", "huge"], "mode")
    arr = numpy_helper.to_array(t)
    if mode == "scalar":
        new = np.array(0.7, np.float32)
    elif mode == "one":
        new = np.full([1] * len(dims), 0.3, np.float32)
    elif mode == "keep_last":
        new = arr.reshape(-1)[:dims[-1]].reshape([1] * (len(dims) - 1) + dims[-1:]) if dims else arr
    elif mode == "keep_first":
        new = arr.reshape(-1)[:dims[1]].reshape([1, dims[1]] + [1] * (len(dims) - 2)) if len(dims) >= 2 else arr
    elif mode == "zeros":
        new = np.zeros_like(arr)
    elif mode == "nan":
        new = arr.copy()
        new.reshape(-1)[0] = np.nan
    elif mode == "huge":
        new = (arr * 1e30).astype(np.float32)
    else:  # the initializer becomes a Constant node
        g.initializer.remove(t)
        g.node.insert(0, helper.make_node("Constant", [], [name], name="const_" + name, value=t))
        return f"initializer {name!r} as a Constant node"
    t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(new, np.float32), name))
    return f"initializer {name!r} {dims} -> {list(new.shape)} ({mode})"


def m_overridable_init(model, ch):
    g = model.graph
    t = ch.choice(list(g.initializer), "initializer")
    g.input.append(vi(t.name, t.data_type, list(t.dims)))
    return f"initializer {t.name!r} also a graph input (overridable)"


WEIRD_NAMES = ["a b", "x/y:0", "ü-tensor", "n" * 300, "%1", "..", "out.onnx", "onnxopt", "0", "x", "y.so", "\t"]


def m_rename_values(model, ch):
    g = model.graph
    old = ch.choice(_values(model), "value")
    new = ch.choice(WEIRD_NAMES, "name")
    for n in g.node:
        n.input[:] = [new if v == old else v for v in n.input]
        n.output[:] = [new if v == old else v for v in n.output]
    for coll in (g.input, g.output, g.initializer, g.value_info):
        for v in coll:
            if v.name == old:
                v.name = new
    return f"value {old!r} renamed {new!r} everywhere"


def m_float_type(model, ch):
    """Every float32 tensor as float64 or float16 (initializers, inputs, outputs)."""
    dtype = ch.choice(["float64", "float16"], "dtype")
    code = DTYPES[dtype]
    g = model.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == F:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(dtype), t.name))
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == F:
            v.type.tensor_type.elem_type = code
    del g.value_info[:]
    return f"every float32 tensor as {dtype}"


def m_unused(model, ch):
    """Dead code: an unused initializer, an unused graph input, a node nothing reads."""
    g = model.graph
    mode = ch.choice(["initializer", "input", "dead_node"], "mode")
    if mode == "initializer":
        g.initializer.append(numpy_helper.from_array(_rand([4, 4], 99), "unused"))
    elif mode == "input":
        g.input.append(vi("unused_in", F, [2, 3]))
    else:
        src = ch.choice(_values(model), "reads")
        g.node.append(helper.make_node("Relu", [src], ["dead"], name="dead"))
    return f"an unused {mode}"


# kind -> mutation of the ModelProto (returns a description). Byte-level and external-data kinds are below.
MODEL_MUTATIONS: dict[str, Callable] = {
    "none": m_none,
    "drop_initializer": m_drop_initializer,
    "init_dtype": m_init_dtype,
    "init_shape": m_init_shape,
    "rename_input": m_rename_input,
    "cycle": m_cycle,
    "attribute": m_attribute,
    "dims": m_dims,
    "unknown_op": m_unknown_op,
    "unknown_domain": m_unknown_domain,
    "opset": m_opset,
    "missing_output": m_missing_output,
    "duplicate_output": m_duplicate_output,
    "empty_graph": m_empty_graph,
    "ir_version": m_ir_version,
    "reorder": m_reorder,
    "extra_output": m_extra_output,
    "broadcast_const": m_broadcast_const,
    "overridable_init": m_overridable_init,
    "rename_values": m_rename_values,
    "float_type": m_float_type,
    "unused": m_unused,
}
BYTE_MUTATIONS = ("truncate", "byte_flip")
EXTERNAL_MUTATIONS = ("external_data",)
# Kinds that mostly keep the model valid: weighted up so that a good share of cases reaches fusion and codegen.
VALID_KINDS = ("none", "attribute", "dims", "reorder", "extra_output", "broadcast_const", "overridable_init",
               "rename_values", "float_type", "unused", "byte_flip")
# The kind list a case draws from (a kind listed twice is drawn twice as often); "none" first: cases shrink to it.
KINDS: tuple[str, ...] = tuple(MODEL_MUTATIONS) + BYTE_MUTATIONS + EXTERNAL_MUTATIONS + (
    "attribute", "dims", "broadcast_const", "extra_output", "attribute", "dims", "reorder", "float_type")


def _truncate(files, ch):
    data = files[MODEL]
    k = ch.integer(0, 999, "permille")
    cut = len(data) * k // 1000
    files[MODEL] = data[:cut]
    return f"model.onnx truncated to {cut} of {len(data)} bytes"


def _byte_flip(files, ch):
    data = bytearray(files[MODEL])
    flips = []
    for _ in range(ch.integer(1, 4, "flips")):
        pos = len(data) * ch.integer(0, 9999, "pos") // 10000
        x = ch.integer(1, 255, "xor")
        data[pos] ^= x
        flips.append(f"{pos}^{x:#04x}")
    files[MODEL] = bytes(data)
    return f"model.onnx bytes flipped: {', '.join(flips)}"


def _external_data(model, ch):
    """Mutations of the external-data references and file (the model is written with external data)."""
    mode = ch.choice(["truncate_data", "missing_file", "outside_path", "absolute_path", "offset_past_end",
                      "length_wrong", "empty_data", "named_like_the_output"], "mode")
    files = serialize(model, external=True)
    m = onnx.load_from_string(files[MODEL])
    t = ch.choice([t for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL], "tensor")
    info = {e.key: e for e in t.external_data}
    if mode == "truncate_data":
        files[DATA] = files[DATA][:len(files[DATA]) * ch.integer(0, 99, "percent") // 100]
    elif mode == "missing_file":
        del files[DATA]
    elif mode == "empty_data":
        files[DATA] = b""
    elif mode == "named_like_the_output":  # onnxopt must not write its out.onnx.data over the input's weights
        files[OUT + ".data"] = files.pop(DATA)
        for u in m.graph.initializer:
            for e in u.external_data:
                if e.key == "location":
                    e.value = OUT + ".data"
    elif mode == "outside_path":
        info["location"].value = "../" + DATA
    elif mode == "absolute_path":
        info["location"].value = ch.choice(["/etc/passwd", "/dev/zero", "/nonexistent/w.bin"], "path")
    elif mode == "offset_past_end":
        info["offset"].value = str(len(files[DATA]) + ch.integer(0, 1 << 20, "past"))
    else:
        info["length"].value = str(int(info["length"].value) + ch.choice([-4, 4, 1 << 30, -int(info["length"].value)],
                                                                         "delta"))
    if mode not in ("truncate_data", "missing_file", "empty_data"):  # the references changed
        files[MODEL] = m.SerializeToString()
    return files, f"external data: {mode} (tensor {t.name!r})"


def make_case(ch: Chooser) -> Case:
    """One case: a seed, a mutation kind and its parameters, all drawn from `ch`."""
    seed = ch.choice(list(SEEDS), "seed")
    kind = ch.choice(KINDS, "kind")
    build, external = SEEDS[seed]
    model = build()
    if kind in MODEL_MUTATIONS:
        detail = MODEL_MUTATIONS[kind](model, ch)
        files = serialize(model, external)
        return Case(seed, kind, detail, files, list(ch.trail), model)
    if kind in BYTE_MUTATIONS:
        files = serialize(model, external)
        detail = (_truncate if kind == "truncate" else _byte_flip)(files, ch)
        return Case(seed, kind, detail, files, list(ch.trail), None)
    files, detail = _external_data(model, ch)
    return Case(seed, kind, detail, files, list(ch.trail), model)


def case_from_number(n: int, base_seed: int = 0) -> Case:
    """The script's case number n (reproducible: `benchmarks/fuzz.py --only n`)."""
    return make_case(RandomChooser(random.Random(f"onnxopt-fuzz:{base_seed}:{n}")))


def onnxruntime_runs(case: Case) -> bool:
    """Does plain onnxruntime load the case's model and run it on random inputs? (Such a case is valid, if unusual:
    onnxopt should take it through fusion and code generation.)"""
    import shutil

    import onnxruntime as ort

    folder = tempfile.mkdtemp(prefix="fuzz-ort-")
    try:
        path = case.write(folder)
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.intra_op_num_threads = 1
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feeds = random_feeds(s, 2, np.random.default_rng(0))
        if feeds is None:
            return False
        s.run(None, feeds)
        return True
    except Exception:  # noqa: BLE001 - onnxruntime refuses the model
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------ checking --

def sha256_files(folder: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def stray_temporaries(folder: str, allowed: set[str]) -> list[str]:
    """Files and folders in `folder` that are neither inputs nor allowed outputs."""
    return sorted(n for n in os.listdir(folder) if n not in allowed)


NP_OF = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
         TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.INT8: np.int8,
         TensorProto.UINT8: np.uint8, TensorProto.BOOL: np.bool_}


def random_feeds(session, dim_value: int, rng, names: set[str] | None = None) -> dict[str, np.ndarray] | None:
    """Random inputs for an onnxruntime session's inputs (symbolic dims = dim_value); None if too big to check."""
    feeds = {}
    for i in session.get_inputs():
        if names is not None and i.name not in names:
            continue
        shape = [d if isinstance(d, int) and d >= 0 else dim_value for d in (i.shape or [])]
        if math.prod(shape) > MAX_CHECK_ELEMENTS:
            return None
        t = i.type  # "tensor(float)"
        dtype = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
                 "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
                 "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}.get(t)
        if dtype is None:
            return None
        if np.issubdtype(dtype, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            feeds[i.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[i.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def _close(got, want) -> str | None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if want.dtype.kind not in "fc":
        return None if np.array_equal(got, want) else "values differ"
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    if not np.array_equal(np.isnan(g), np.isnan(w)) or not np.array_equal(np.isinf(g) & (g > 0), np.isinf(w) & (w > 0)):
        return "NaN/inf at different positions"
    if not finite.any():
        return None
    scale = float(np.abs(w[finite]).max())
    tol = ATOL + RTOL * np.abs(w[finite]) + SCALE_TOL * scale
    err = np.abs(g[finite] - w[finite])
    if (err > tol).any():
        k = int(np.argmax(err - tol))
        return f"max abs error {err.max():.3g} (at {k}: got {g[finite][k]:.6g}, want {w[finite][k]:.6g})"
    return None


def compare_models(src: str, out: str) -> list[str]:
    """The output model, without and with its library, against the input model on random inputs."""
    import onnxruntime as ort

    import onnxopt.runtime as rt

    problems = []
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    try:
        want_s = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        return [f"the input model does not load in onnxruntime, yet onnxopt exited 0: {str(e)[:300]}"]
    sessions = {}
    try:
        sessions["plain onnxruntime"] = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        problems.append(f"out.onnx does not load in plain onnxruntime (no library): {str(e).splitlines()[0][:300]}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", rt.LibraryNotUsedWarning)
            so2 = ort.SessionOptions()
            so2.log_severity_level = 4
            so2.intra_op_num_threads = 1
            sessions["onnxopt.runtime (library)"] = rt.InferenceSession(out, so2)
    except Exception as e:  # noqa: BLE001
        problems.append(f"out.onnx does not load through onnxopt.runtime: {type(e).__name__}: "
                        f"{str(e).splitlines()[0][:300] if str(e) else ''}")
    want_names = [o.name for o in want_s.get_outputs()]
    required = {i.name for i in want_s.get_inputs()}
    src_model = onnx.load(src, load_external_data=False)
    overridable = {t.name for t in src_model.graph.initializer} & required
    symbolic = any(not isinstance(d, int) or d < 0 for i in want_s.get_inputs() for d in (i.shape or []))
    rng = np.random.default_rng(1234)
    for dim in ((1, 3) if symbolic else (1,)):
        for feed_overridable in ((False, True) if overridable else (False,)):
            feeds = random_feeds(want_s, dim, rng, required if feed_overridable else required - overridable)
            if feeds is None:
                continue
            try:
                want = want_s.run(None, feeds)
            except Exception:  # noqa: BLE001 - the input model itself fails on these inputs (e.g. another batch)
                continue
            what = f"symbolic dims={dim}" + (", overridable initializers fed" if feed_overridable else "")
            for label, s in sessions.items():
                got_names = [o.name for o in s.get_outputs()]
                if got_names != want_names:
                    problems.append(f"{label}: outputs {got_names}, the input model's {want_names}")
                    continue
                try:
                    got = s.run(None, feeds)
                except Exception as e:  # noqa: BLE001
                    problems.append(f"{label} fails to run ({what}): {str(e).splitlines()[0][:300]}")
                    continue
                for name, g, w in zip(want_names, got, want):
                    bad = _close(g, w)
                    if bad:
                        problems.append(f"wrong answer: {label}, output {name!r} ({what}): {bad}")
    return problems


@dataclass
class RunResult:
    exit_code: int | None  # None: did not end in time; negative: killed by that signal
    stderr: str
    seconds: float
    escaped: str | None = None  # a Python traceback that escaped main() (in-process runs)


@dataclass
class Verdict:
    case: Case
    run: RunResult
    problems: list[str]
    category: str  # "ok", "internal-error", "traceback", "hang", "crash", "partial-output", "wrong-answer", ...

    @property
    def failed(self) -> bool:
        return bool(self.problems)


def outcome_label(rc: int | None) -> str:
    return {0: "0 ok", 1: "1 verification failed", 2: "2 rejected", 3: "3 internal error", 130: "130 interrupted",
            None: "hang"}.get(rc, f"signal {-rc}" if rc is not None and rc < 0 else f"exit {rc}")


def check_run(case: Case, folder: str, tmpdir: str | None, before: dict[str, str], run: RunResult,
              numeric: bool = True) -> Verdict:
    """Everything a run of onnxopt on the case must satisfy (see the module docstring)."""
    problems: list[tuple[str, str]] = []  # (category, message)
    rc, err = run.exit_code, run.stderr
    if run.escaped:
        problems.append(("traceback", "a Python exception escaped main():\n" + run.escaped))
    if rc is None:
        problems.append(("hang", f"no exit within the time limit ({run.seconds:.0f} s)"))
    elif rc < 0:
        name = signal.Signals(-rc).name if -rc in {s.value for s in signal.Signals} else "?"
        problems.append(("crash", f"killed by signal {-rc} ({name})"))
    elif rc == 3:
        problems.append(("internal-error", "exit code 3 (internal error)"))
    elif rc not in (0, 1, 2):
        problems.append(("bad-exit", f"exit code {rc}"))
    if "Traceback (most recent call last)" in err:
        problems.append(("traceback", "a Python traceback on stderr"))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if rc is not None and rc > 0 and any(ln.startswith("onnxopt: error: internal error") for ln in lines):
        problems.append(("internal-error", f"exit {rc} with an 'internal error ... please report it' message"))
    if rc is not None and rc > 0 and rc != 3 and not run.escaped:
        if len(lines) != 1 or not lines[0].startswith("onnxopt: error:"):
            problems.append(("stderr", f"a non-zero exit should print one 'onnxopt: error:' line; stderr had "
                                       f"{len(lines)} line(s)"))
    after = sha256_files(folder)
    for name, h in before.items():
        if after.get(name) != h:
            problems.append(("input-changed", f"the input file {name} was {'changed' if name in after else 'removed'}"))
    present = [o for o in OUTPUTS if os.path.lexists(os.path.join(folder, o)) and o not in before]
    if rc != 0 and present:
        problems.append(("partial-output", f"exit {rc} but {', '.join(present)} exist"))
    allowed = set(before) | (set(OUTPUTS) if rc == 0 else set())
    stray = stray_temporaries(folder, allowed)
    if stray:
        problems.append(("stray-temporary", f"left in the model's folder: {stray}"))
    left = sorted(set(os.listdir(tmpdir)) - TMPDIR_NOT_OURS) if tmpdir and os.path.isdir(tmpdir) else []
    if left:
        problems.append(("stray-temporary", f"left in TMPDIR: {left}"))
    if rc == 0:
        out = os.path.join(folder, OUT)
        if not os.path.exists(out):
            problems.append(("partial-output", "exit 0 but no out.onnx"))
        else:
            try:
                meta = {p.key: p.value for p in onnx.load(out, load_external_data=False).metadata_props}
            except Exception as e:  # noqa: BLE001
                meta = {}
                problems.append(("partial-output", f"out.onnx is not readable: {e}"))
            lib = meta.get("onnxopt.library")
            if lib and not os.path.exists(os.path.join(folder, lib)):
                problems.append(("partial-output", f"out.onnx names the library {lib!r}, which is missing"))
            if numeric:
                for msg in compare_models(os.path.join(folder, MODEL), out):
                    problems.append(("wrong-answer" if msg.startswith("wrong answer") else "bad-output", msg))
    category = problems[0][0] if problems else "ok"
    return Verdict(case, run, [f"[{c}] {m}" for c, m in problems], category)


# --------------------------------------------------------------------------------------------- in-process runs --

class CaseTimeout(BaseException):
    """Raised by the per-case alarm; a BaseException so that main()'s `except Exception` does not swallow it."""


@contextlib.contextmanager
def captured_stderr():
    """sys.stderr and file descriptor 2 (onnxruntime's C++ log) into one buffer: yields a list, filled on exit."""
    box: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    tmp = tempfile.TemporaryFile(mode="w+b")
    os.dup2(tmp.fileno(), 2)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            yield box
    finally:
        try:
            sys.stderr.flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        box.append(buf.getvalue() + tmp.read().decode("utf-8", "replace"))
        tmp.close()


@contextlib.contextmanager
def _alarm(seconds: float):
    def ring(signum, frame):
        raise CaseTimeout(f"the case ran past {seconds:.0f} s")

    import faulthandler
    # A hang inside native code never returns to Python for the alarm: dump every thread's stack to the real stderr
    # (a copy of fd 2 taken before any capture) and end the process.
    real_stderr = os.fdopen(os.dup(2), "w")
    faulthandler.dump_traceback_later(seconds * 2 + 30, exit=True, file=real_stderr)
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        faulthandler.cancel_dump_traceback_later()
        real_stderr.close()


def cli_args(model_path: str, out_path: str) -> list[str]:
    return [model_path, "-o", out_path, *CLI_FLAGS]


def run_in_process(model_path: str, out_path: str, tmpdir: str, time_limit: float = TIME_LIMIT_S) -> RunResult:
    """`onnxopt model -o out` through `onnxopt.cli.main.main` in this process, TMPDIR pointed at `tmpdir`."""
    import traceback

    from onnxopt.cli.main import main

    old_tmp = tempfile.tempdir
    tempfile.tempdir = tmpdir
    old_env = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = tmpdir
    rc, escaped = None, None
    t0 = time.perf_counter()
    try:
        with _alarm(time_limit), captured_stderr() as box:
            try:
                rc = main(cli_args(model_path, out_path))
            except CaseTimeout:
                rc = None
            except BaseException as e:  # noqa: BLE001 - anything escaping main() is a failure to report
                if isinstance(e, KeyboardInterrupt):
                    raise
                escaped = traceback.format_exc()
                rc = 3
    finally:
        tempfile.tempdir = old_tmp
        if old_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_env
    return RunResult(rc, box[0], time.perf_counter() - t0, escaped)


def prepare(case: Case, root: str) -> tuple[str, str, str, dict[str, str]]:
    """The case's folders under `root`: (model folder, model path, TMPDIR for the run, input hashes)."""
    folder = os.path.join(root, "case")
    tmpdir = os.path.join(root, "tmp")
    os.makedirs(folder)
    os.makedirs(tmpdir)
    path = case.write(folder)
    return folder, path, tmpdir, sha256_files(folder)


def write_failure(case: Case, verdict: Verdict, folder: str, command: str) -> None:
    """The failing case's files and notes, for reproduction."""
    os.makedirs(folder, exist_ok=True)
    case.write(folder)
    if case.model is not None:
        with open(os.path.join(folder, "mutated_model.txt"), "w") as f:
            f.write(str(case.model))
    with open(os.path.join(folder, "README.txt"), "w") as f:
        f.write(f"case: {case.describe()}\n")
        f.write(f"draws: {', '.join(case.trail)}\n")
        f.write(f"command: {command}\n")
        f.write(f"exit code: {verdict.run.exit_code} ({outcome_label(verdict.run.exit_code)}), "
                f"{verdict.run.seconds:.1f} s\n")
        f.write("problems:\n" + "".join(f"  {p}\n" for p in verdict.problems))
        f.write("stderr:\n" + verdict.run.stderr + ("\n" if not verdict.run.stderr.endswith("\n") else ""))
        if verdict.run.escaped:
            f.write("escaped traceback:\n" + verdict.run.escaped)


__all__ = ["Case", "Chooser", "RandomChooser", "HypothesisChooser", "SEEDS", "KINDS", "VALID_KINDS", "make_case",
           "case_from_number", "serialize", "check_run", "run_in_process", "prepare", "RunResult", "Verdict",
           "write_failure", "outcome_label", "cli_args", "onnxruntime_runs", "TIME_LIMIT_S", "OUT", "MODEL", "DATA"]
