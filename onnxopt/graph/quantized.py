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
