"""Shape inference for analysis: onnx's, then onnxruntime's symbolic one where onnx lost dims; and the checks on
the shapes it finds."""

from __future__ import annotations

import math
import os
import sys

import onnx

from onnxopt.errors import InputError
from onnxopt.verify import MAX_RANDOM_ELEMENTS

from .large import ANALYSE_LIGHT_BYTES, light_copy, model_bytes


def _symbolic_shape_inference():
    """onnxruntime's SymbolicShapeInference class, its module loaded from its file: importing it as
    onnxruntime.tools.symbolic_shape_infer runs the tools package's __init__, which imports torch where torch is
    installed (2.7 s, for nothing onnxopt uses)."""
    import importlib.util

    import onnxruntime

    name = "onnxopt._ort_symbolic_shape_infer"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(onnxruntime.__file__), "tools", "symbolic_shape_infer.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name].SymbolicShapeInference


def _symbolic_shapes(model: onnx.ModelProto) -> list[onnx.ValueInfoProto] | None:
    """onnxruntime's symbolic shape inference, driven step by step: its `infer_shapes` entry point saves a debug
    model into the current directory when inference is incomplete, and a library must not write there. Returns the
    inferred value_info (graph inputs and outputs stay as the model declares them)."""
    try:
        ssi = _symbolic_shape_inference()(2**31 - 1, True, False, 0)
        ssi._preprocess(model)
        while ssi.run_:
            ssi._infer_impl()
        declared = {v.name for v in list(model.graph.input) + list(model.graph.output)}
        return [v for v in ssi.out_mp_.graph.value_info
                if v.name not in declared and v.type.HasField("tensor_type")]
    except Exception:  # noqa: BLE001 - unknown ops, or an onnxruntime whose internals moved: keep onnx's shapes
        return None


def _has_unknown_shapes(model: onnx.ModelProto) -> bool:
    known = {v.name for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
             if v.type.tensor_type.HasField("shape")
             and all(d.HasField("dim_value") or (d.dim_param and not d.dim_param.startswith("unk__"))
                     for d in v.type.tensor_type.shape.dim)}
    known |= {t.name for t in model.graph.initializer}
    return any(o and o not in known for n in model.graph.node for o in n.output)


def complete_output_types(model: onnx.ModelProto, inferred: onnx.ModelProto) -> None:
    """Graph outputs declared without a shape (onnxruntime runs such models, the ONNX checker rejects them) get the
    inferred one, so the emitted model passes the checker. Outputs with a declared shape are left as declared."""
    shapes = {o.name: o.type for o in inferred.graph.output if o.type.tensor_type.HasField("shape")}
    for o in model.graph.output:
        if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape") and o.name in shapes:
            o.type.tensor_type.shape.CopyFrom(shapes[o.name].tensor_type.shape)


# onnxruntime's QOperator contrib ops (com.microsoft) as the standard op whose output has the same shape and type:
# op -> (standard op, the inputs it keeps, the attributes it keeps). onnx's inference does not know them, and the
# tensors after the first QLinearConcat of a QOperator model would otherwise have no shape.
_QLINEAR_TWINS = {
    "QLinearConcat": ("Concat", slice(2, None, 3), ("axis",)),
    "QLinearAdd": ("Add", (0, 3), ()),
    "QLinearMul": ("Mul", (0, 3), ()),
    "QLinearSigmoid": ("Identity", (0,), ()),
    "QLinearLeakyRelu": ("Identity", (0,), ()),
    "QLinearSoftmax": ("Identity", (0,), ()),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", (0,), ()),
    "QLinearAveragePool": ("AveragePool", (0,), ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape",
                                                 "pads", "strides")),
}


def _qgemm_twin(n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """A QGemm with a quantized output as QLinearMatMul(transposes as QGemm's): the same [M, N] and type."""
    ins = list(n.input) + [""] * (9 - len(n.input))
    if not ins[7] or not ins[8]:
        return None
    attrs = {a.name: a.i for a in n.attribute if a.name in ("transA", "transB")}
    out = []
    for k, flag in ((0, "transA"), (3, "transB")):
        if attrs.get(flag):
            out.append(onnx.helper.make_node("Transpose", [ins[k]], [f"{n.output[0]}__twin{k}"], perm=[1, 0]))
            ins[k] = out[-1].output[0]
    return out + [onnx.helper.make_node("QLinearMatMul", ins[:6] + ins[7:9], [n.output[0]], name=n.name)]


def _standard_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its QOperator contrib ops replaced by their shape twins (_QLINEAR_TWINS), for inference only;
    `model` itself where it has none. Channels-last pools keep no twin (their layout differs)."""
    def twin(n):
        if n.domain == "com.microsoft" and n.op_type == "QGemm":
            return _qgemm_twin(n)
        if n.domain != "com.microsoft" or n.op_type not in _QLINEAR_TWINS:
            return None
        if any(a.name == "channels_last" and a.i for a in n.attribute):
            return None
        op, keep, attrs = _QLINEAR_TWINS[n.op_type]
        inputs = list(n.input)[keep] if isinstance(keep, slice) else [n.input[k] for k in keep]
        t = onnx.helper.make_node(op, inputs, list(n.output)[:1], name=n.name)
        t.attribute.extend(a for a in n.attribute if a.name in attrs)
        return [t]

    if not any(twin(n) is not None for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = [t for n in out.graph.node for t in (twin(n) or [n])]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference, then onnxruntime's symbolic one where onnx lost dims (Shape/Slice arithmetic on
    symbolic dims, common in exported transformers). The symbolic pass assumes broadcast symbolic dims are equal;
    the kernels check that assumption at run time (see codegen/glue/elementwise_exec.c). The result is for analysis
    only: the emitted model never carries inferred value_info (a wrong guess there would mislead onnxruntime's
    planner). A big model is inferred as its light copy (graph/large.py), whose weights are declared, not held, and
    the value_info is copied back."""
    light = model_bytes(model) > ANALYSE_LIGHT_BYTES
    analysed = light_copy(model) if light else model
    twin = _standard_twin(analysed)
    twinned, analysed = twin is not analysed, twin
    try:
        analysed = onnx.shape_inference.infer_shapes(analysed, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes are an optimization aid; without them nothing is fused
        pass
    symbolic_inputs = any(d.HasField("dim_param") or not d.HasField("dim_value")
                          for vi in model.graph.input for d in vi.type.tensor_type.shape.dim)
    value_info = analysed.graph.value_info
    # With static inputs, dims onnx could not infer are data-dependent: the symbolic pass would only be guessing.
    if symbolic_inputs and _has_unknown_shapes(analysed):
        value_info = _symbolic_shapes(analysed) or value_info
    value_info = list(value_info)
    out = analysed
    if light or twinned or analysed is model:  # never the caller's model, the light copy or the twin
        out = onnx.ModelProto()
        out.CopyFrom(model)
    del out.graph.value_info[:]
    out.graph.value_info.extend(value_info)
    return out


def static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor name -> shape, for the tensors whose dims are all known numbers."""
    out = {}
    for v in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[v.name] = [d.dim_value for d in t.shape.dim]
    return out


def check_tensor_sizes(static: dict[str, list[int]]) -> None:
    """A tensor whose fixed shape is past what the checks can hold in memory (an input declared 2^31 high, pads of
    2^40) makes a model that cannot run; the fusion stages' loops over its rows would not end either."""
    for name, dims in static.items():
        if all(d >= 0 for d in dims) and math.prod(dims) > MAX_RANDOM_ELEMENTS:  # -1: a dynamic dim
            raise InputError(f"tensor {name} has the shape {dims}, which no run of this model can hold; fix the "
                             "model's shapes (or its symbolic dims with --input-shape)")
