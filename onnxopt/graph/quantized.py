"""The parts of a quantized model that onnxruntime must keep seeing as they are.

onnxruntime runs a QDQ model (onnxruntime.quantization.quantize_static) by matching DequantizeLinear -> op ->
QuantizeLinear node units and replacing each with an int8 kernel (QLinearConv, QLinearMatMul, QLinearAdd...), and a
dynamically quantized one (quantize_dynamic) by fusing MatMulInteger with the Cast and Mul that scale its result
(MatMulIntegerToFloat). Folding a DequantizeLinear of a constant weight into float, or fusing one of the ops of such
a unit into a kernel of ours, breaks the match: the op then runs in float, slower, and no longer rounds the way the
quantized model does (a quantization step off). Nor may anything upstream of a quantizer round differently. Those
nodes stay onnxruntime's, except an integer product with its rescaling (`integer_product_units`), which the int8
GEMM kind (onnxopt/kinds/qmatmul) runs whole: exact sums, then the same float Cast, Mul and Add.
"""

from __future__ import annotations

import numpy as np
import onnx

# Ops that carry quantized tensors or are onnxruntime's own quantized kernels (ai.onnx and com.microsoft).
QUANTIZATION_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv",
    "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
    "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSoftmax", "QGemm", "QAttention",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM", "QEmbedLayerNormalization",
    "QOrderedMatMul", "MatMulNBits", "DequantizeLinear4Bit",
})
# Ops whose result is scaled back to float by elementwise ops that onnxruntime fuses with them.
_INTEGER_PRODUCTS = frozenset({"MatMulInteger", "ConvInteger"})
# How far (in elementwise ops) the rescaling of an integer product reaches: Cast -> Mul -> Mul -> Add.
_RESCALE_DEPTH = 4
_RESCALE_OPS = frozenset({"Cast", "Mul", "Add", "Div", "Reshape"})


def _consumers(graph: onnx.GraphProto) -> dict[str, list]:
    consumers: dict[str, list] = {}
    for n in graph.node:
        for x in n.input:
            if x:
                consumers.setdefault(x, []).append(n)
    return consumers


def is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in QUANTIZATION_OPS for n in model.graph.node)


def quantized_nodes(graph: onnx.GraphProto) -> set[str]:
    """The nodes (by their first output) that belong to onnxruntime's quantized patterns: the quantization ops,
    every node that reads a DequantizeLinear or feeds a QuantizeLinear (the op of a QDQ node unit), every node whose
    result reaches a quantizer, and the elementwise rescaling after an integer product."""
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers = _consumers(graph)
    keep: set[str] = set()

    def key(n):
        return n.output[0] if n.output else n.name

    for n in graph.node:
        if n.op_type in QUANTIZATION_OPS:
            keep.add(key(n))
            continue
        reads_dq = any(producer.get(x) is not None and producer[x].op_type in QUANTIZATION_OPS for x in n.input)
        feeds_q = any(c.op_type == "QuantizeLinear" for o in n.output for c in consumers.get(o, ()))
        if reads_dq or feeds_q:
            keep.add(key(n))
    # Everything whose result reaches a static quantizer: a kernel that rounds a float differently by one ulp moves a
    # value across a quantization step there, and a QDQ model's outputs are compared step for step. A dynamic
    # quantizer (DynamicQuantizeLinear) is not guarded: its steps move with any rounding, onnxruntime's own graph
    # optimizations included (a dynamically quantized MiniLM-L6's output moves 9% of its scale between onnxruntime's
    # optimization levels), so the whole-model check allows that spread instead (driver/outputs.py).
    quantizer_inputs = [n.input[0] for n in graph.node if n.op_type == "QuantizeLinear" and n.input]
    seen: set[str] = set()
    while quantizer_inputs:
        x = quantizer_inputs.pop()
        if x in seen or x not in producer:
            continue
        seen.add(x)
        p = producer[x]
        keep.add(key(p))
        quantizer_inputs.extend(i for i in p.input if i)
    keep |= integer_product_units(graph)
    return keep


def steps_region_refusal(graph: onnx.GraphProto, quantized: set[str], float_names: set[str], nodes: list,
                         inputs: list[str], outputs: list[str]) -> str | None:
    """For a region that runs quantization steps itself (an elementwise kernel holding DequantizeLinear and
    QuantizeLinear: a QDQ Add, Mul, HardSigmoid... unit run whole, in the spec's float arithmetic): None when it
    takes its units whole, so every unit left to onnxruntime keeps its pattern; else why not. `quantized`: the
    nodes of quantized patterns by first output (quantized_nodes); `float_names`: the float tensors.
    - A float input must come from outside the quantized patterns (a graph input, a float op): a float made by a
      unit's op would lose that unit's QuantizeLinear to the region.
    - A float output must not be read by a quantized node outside the region: a unit's op reads its
      DequantizeLinear's result, which the region would then hide."""
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers = _consumers(graph)

    def key(n):
        return n.output[0] if n.output else n.name

    inside = {key(n) for n in nodes}

    for x in inputs:
        p = producer.get(x)
        if x in float_names and p is not None and key(p) in quantized:
            return f"its float input {x} comes from {p.op_type}, part of a quantized unit it does not take whole"
    for o in outputs:
        if o in float_names and any(key(c) not in inside and key(c) in quantized for c in consumers.get(o, ())):
            return f"its float output {o} is read by a quantized unit it does not take whole"
    return None


def integer_product_units(graph: onnx.GraphProto) -> set[str]:
    """The integer products (MatMulInteger, ConvInteger) and the elementwise rescaling after each (Cast -> Mul ->
    Add ..., up to _RESCALE_DEPTH ops), by first output."""
    consumers = _consumers(graph)
    units: set[str] = set()
    for n in graph.node:
        if n.op_type not in _INTEGER_PRODUCTS:
            continue
        units.add(n.output[0] if n.output else n.name)
        frontier = [n]
        for _ in range(_RESCALE_DEPTH):
            frontier = [c for m in frontier for o in m.output for c in consumers.get(o, ())
                        if c.op_type in _RESCALE_OPS]
            units.update(c.output[0] if c.output else c.name for c in frontier)
    return units


def qdq_conv_units(graph: onnx.GraphProto) -> set[str]:
    """The static QDQ convolution units, DequantizeLinear -> Conv -> [Relu | Clip] -> QuantizeLinear, by first
    output: the Conv, its activation and quantizer, the DequantizeLinear of its weights and bias, and that of its
    input where the Conv is its only reader. The int8 conv kind (onnxopt/kinds/qconv) runs such a unit whole, with
    its requantization, as onnxruntime's QLinearConv does."""
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers = _consumers(graph)
    units: set[str] = set()

    def dq(name):
        p = producer.get(name)
        return p if p is not None and p.op_type == "DequantizeLinear" else None

    for n in graph.node:
        if n.op_type == "QLinearConv":  # the QOperator format's unit is one node
            units.add(n.output[0])
            continue
        if n.op_type != "Conv" or len(n.input) < 2 or dq(n.input[0]) is None or dq(n.input[1]) is None:
            continue
        chain = [n]
        nxt = consumers.get(n.output[0], [])
        if len(nxt) == 1 and nxt[0].op_type in ("Relu", "Clip"):
            chain.append(nxt[0])
            nxt = consumers.get(nxt[0].output[0], [])
        if len(nxt) != 1 or nxt[0].op_type != "QuantizeLinear":
            continue
        chain.append(nxt[0])
        for x in n.input[1:]:
            if dq(x) is not None:
                chain.append(dq(x))
        if len(consumers.get(n.input[0], [])) == 1:
            chain.append(dq(n.input[0]))
        units.update(m.output[0] for m in chain)
    return units


def qdq_matmul_units(graph: onnx.GraphProto) -> set[str]:
    """The static QDQ matmul units, DequantizeLinear(A) -> MatMul or Gemm(DequantizeLinear(B constant), a Gemm's
    DequantizeLinear(bias)) -> [Relu] -> QuantizeLinear, by first output (the product, its Relu and quantizer, the
    dequantizers of B and the bias, and A's where the product is its only reader), and the QOperator format's
    QLinearMatMul and QGemm nodes: the int8 GEMM kind (onnxopt/kinds/qmatmul) runs them whole."""
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers = _consumers(graph)
    consts = {t.name for t in graph.initializer}
    units: set[str] = set()
    for n in graph.node:
        if n.op_type in ("QLinearMatMul", "QGemm"):
            units.add(n.output[0])
            continue
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        a, b = producer.get(n.input[0]), producer.get(n.input[1])
        if a is None or b is None or a.op_type != "DequantizeLinear" or b.op_type != "DequantizeLinear" \
                or b.input[0] not in consts:
            continue
        chain = [n, b]
        nxt = consumers.get(n.output[0], [])
        if len(nxt) == 1 and nxt[0].op_type == "Relu":
            chain.append(nxt[0])
            nxt = consumers.get(nxt[0].output[0], [])
        if len(nxt) != 1 or nxt[0].op_type != "QuantizeLinear":
            continue
        chain.append(nxt[0])
        c = producer.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        if c is not None and c.op_type == "DequantizeLinear":
            chain.append(c)
        units.update(m.output[0] for m in chain)
        if len(consumers.get(n.input[0], [])) == 1:
            units.add(a.output[0])
    return units


def qdq_pool_units(graph: onnx.GraphProto) -> set[str]:
    """The static QDQ GlobalAveragePool units, DequantizeLinear -> GlobalAveragePool -> QuantizeLinear, each the only
    reader of the one before, by first output: the int8 pool kind (onnxopt/kinds/qgap) runs them whole, as
    onnxruntime's QLinearGlobalAveragePool does."""
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers = _consumers(graph)
    units: set[str] = set()
    for n in graph.node:
        if n.op_type != "GlobalAveragePool" or not n.input:
            continue
        dq, nxt = producer.get(n.input[0]), consumers.get(n.output[0], [])
        if dq is None or dq.op_type != "DequantizeLinear" or len(consumers.get(dq.output[0], [])) != 1 \
                or len(nxt) != 1 or nxt[0].op_type != "QuantizeLinear":
            continue
        units.update((dq.output[0], n.output[0], nxt[0].output[0]))
    return units


def dedicate_unit_dequantizers(model: onnx.ModelProto) -> int:
    """Give QDQ units DequantizeLinear nodes of their own (in place), as onnxruntime's EnsureUniqueDQForNodeUnit
    does: every convolution, matmul and Gemm a copy of each one it reads that another node reads too (a block's
    input that the residual Add also dequantizes, a layer's input that Q, K and V's projections share; equal zero
    biases that common-subexpression elimination merged) or reads through Identity nodes; every other reader of a
    shared one (a residual Add, a squeeze-excite Mul, a pool) but the first a copy too, so a unit that one of our
    elementwise kernels runs whole leaves the others theirs. The same tensors, so the same results; a unit is then
    whole, for our kinds and for onnxruntime alike. A shared one that every reader now has a copy of goes (left,
    it would read the tensor for nothing and stop a kernel from passing it blocked). Returns how many copies were
    made."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers = _consumers(graph)
    outputs = {o.name for o in graph.output}
    nodes, made = [], 0
    kept: set[str] = set()  # shared dequantized tensors whose node a first reader other than a product keeps
    copied: set[int] = set()  # the nodes copied from
    for n in graph.node:
        if not n.output:
            nodes.append(n)
            continue
        product = n.op_type in ("Conv", "MatMul", "Gemm") and n.domain in ("", "ai.onnx")
        for k, x in enumerate(n.input):
            p, hops = producer.get(x), 0
            # exporters' DequantizeLinear -> Identity -> Conv
            while product and p is not None and p.op_type == "Identity" and p.input:
                p, hops = producer.get(p.input[0]), hops + 1
            if p is None or p.op_type != "DequantizeLinear":
                continue
            shared = len(consumers.get(x, [])) >= 2 or x in outputs
            if not hops and not shared:
                continue
            if not product and x not in kept and x not in outputs:
                kept.add(x)
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(p)
            copy.name = f"{p.name or x}__for_{n.output[0]}"
            copy.output[0] = f"{x}__for_{n.output[0]}"
            n.input[k] = copy.output[0]
            nodes.append(copy)
            copied.add(id(p))
            made += 1
        nodes.append(n)
    if made:
        read = {x for n in nodes for x in n.input} | outputs
        # a body of an If or a Loop may read it too (by name, not as an input): then it stays
        bodies = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes
                     for a in n.attribute)
        nodes = [n for n in nodes if bodies or id(n) not in copied or any(o in read for o in n.output)]
        del graph.node[:]
        graph.node.extend(nodes)
    return made


QLINEAR_PRODUCTS = ("QLinearConv", "QLinearMatMul", "QGemm")


def qlinear_params(n: onnx.NodeProto, inits: dict) -> dict | None:
    """A QLinearConv's, QLinearMatMul's or QGemm's constants as arrays (x_scale, x_zero, w, w_scale, w_zero,
    y_scale, y_zero, bias, and "alpha": a QGemm's, else 1), or None where one of them is not an initializer (or a
    QGemm transposes A or has a float output). A QGemm's "w" is B as the product reads it, [K, N] (transposed where
    transB is set), and its bias one int32 a column."""
    from onnx import helper, numpy_helper

    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    gemm = n.op_type == "QGemm"
    if gemm and (attrs.get("transA", 0) or len(n.input) < 8 or not n.input[7]):
        return None
    keys = ("sx", "zx", "w", "sw", "zw", "bias", "sy", "zy") if gemm else ("sx", "zx", "w", "sw", "zw", "sy", "zy",
                                                                           "bias")
    out = {}
    for k, name in zip(keys, list(n.input[1:]) + [""] * 9):
        if not name:
            out[k] = None
        elif name in inits:
            out[k] = numpy_helper.to_array(inits[name])
        else:
            return None
    if out["w"] is None or out["sx"] is None or out["sw"] is None or out["sy"] is None:
        return None
    if gemm:
        if attrs.get("transB", 0):
            out["w"] = np.ascontiguousarray(out["w"].T)
        if out["bias"] is not None:
            out["bias"] = np.broadcast_to(out["bias"].reshape(-1), (out["w"].shape[1],))
    out["alpha"] = np.float32(attrs.get("alpha", 1.0) if gemm else 1.0)
    return out


def expand_qlinear_products(model: onnx.ModelProto, expand) -> list[onnx.NodeProto]:
    """`model`'s nodes with each QLinearConv, QLinearMatMul and QGemm of constant weights and scales replaced by
    expand(index, node, its qlinear_params) (a list of nodes)."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = []
    for k, n in enumerate(model.graph.node):
        p = qlinear_params(n, inits) if n.op_type in QLINEAR_PRODUCTS else None
        nodes.extend([n] if p is None else expand(k, n, p))
    return nodes


def qlinear_as_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each QLinearConv, QLinearMatMul and QGemm of constant weights and scales run as the spec defines
    it, in float: DequantizeLinear(x) -> Conv, MatMul or Gemm (the dequantized weights, and bias) -> QuantizeLinear,
    which
    onnxruntime's graph optimizations fuse back (on AVX2 into kernels whose 16-bit pair sums saturate) unless they
    are off; the model itself when it has none. The whole-model check's reference for onnxruntime's own spread."""
    from onnx import helper, numpy_helper

    if not any(n.op_type in QLINEAR_PRODUCTS for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)

    def expand(k, n, p):
        u = f"__qlinear_float{k}"
        conv = n.op_type == "QLinearConv"
        cout = p["w"].shape[0 if conv else 1]
        # the weights' scale and zero point run along the output channels: axis 0 of a conv's, 1 of a matmul's
        along = (-1, 1, 1, 1) if conv else (1, -1)
        sw = np.broadcast_to(p["sw"].astype(np.float32).reshape(-1), (cout,))
        zw = np.broadcast_to((p["zw"] if p["zw"] is not None else np.zeros(1)).astype(np.float32).reshape(-1), (cout,))
        wf = ((p["w"].astype(np.float32) - zw.reshape(along)) * sw.reshape(along)).astype(np.float32)
        ins = [f"{u}_x", f"{u}_w"]
        out.graph.initializer.append(numpy_helper.from_array(wf, f"{u}_w"))
        if p["bias"] is not None:
            bf = (p["bias"].astype(np.float32) * (p["alpha"] * np.float32(p["sx"]) * sw)).astype(np.float32)
            out.graph.initializer.append(numpy_helper.from_array(bf, f"{u}_b"))
            ins.append(f"{u}_b")
        if conv:
            product = helper.make_node("Conv", ins, [f"{u}_y"], name=n.name)
            product.attribute.extend(n.attribute)
        elif n.op_type == "QGemm":  # "w" is [K, N]
            product = helper.make_node("Gemm", ins, [f"{u}_y"], name=n.name, alpha=float(p["alpha"]))
        else:
            product = helper.make_node("MatMul", ins, [f"{u}_y"], name=n.name)
        y_scale, y_zero = (n.input[7], n.input[8] if len(n.input) > 8 else "") if n.op_type == "QGemm" else \
            (n.input[6], n.input[7])
        return [helper.make_node("DequantizeLinear", [n.input[0], n.input[1], n.input[2]], [f"{u}_x"]), product,
                helper.make_node("QuantizeLinear", [f"{u}_y", y_scale, y_zero], list(n.output))]

    nodes = expand_qlinear_products(model, expand)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
