"""The measurement layer: a region as models onnxruntime runs (its original nodes, and its fused node), their
inputs, and what a kernel's run is measured against (FLOPs, bytes, the error it may show). The driver, the search
and the tuners all measure regions through these."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.emit.model import DOMAIN
from onnxopt.fusion import winograd
from onnxopt.fusion.compute import conv_macs_per_output
from onnxopt.fusion.layout import blocked_inputs, blocked_outputs
from onnxopt.fusion.region import Region
from onnxopt.graph.quantized_weights import bias_in_sum_steps, dequantized_bias
from onnxopt.verify import random_array


def weight_bytes(region: Region, model: onnx.ModelProto) -> int:
    """Bytes of the constants the region's kernel reads: the model's initializers among its inputs, and those it
    carries itself (packed weights)."""
    carried = region.carried_initializers
    names = set(region.inputs)
    inits = list(carried) + [t for t in model.graph.initializer if t.name in names]
    return sum(int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in inits)


def region_models(region: Region, model: onnx.ModelProto, info) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The region as a standalone model (original ops) and as one fused node, same inputs and outputs."""
    inits = {t.name: t for t in model.graph.initializer}
    carried = region.carried_initializers
    new_inits = {t.name: t for t in carried}

    blocked = blocked_inputs(region) | blocked_outputs(region)

    def vi(name, fused_side=False):
        ti = info[name]
        if fused_side and name in blocked:  # [N, C / L, H, W, L]: left undeclared
            return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(ti.dtype)), None)
        dims = [d if isinstance(d, (int, str)) else None for d in ti.shape]
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(ti.dtype)), dims)

    ins = [vi(x) for x in runtime_inputs(region, model)]
    outs = [vi(o) for o in region.outputs]
    consts = [inits[c] for c in region.program.consts if c in inits]
    # Other constants the original nodes read: a BatchNormalization's parameters, a Resize's scales.
    consts += [inits[x] for x in dict.fromkeys(x for n in region.nodes for x in n.input)
               if x in inits and x not in region.program.consts and x not in region.inputs]
    if region.compute is not None:  # weights, biases, BatchNorm parameters: constants on both sides
        used = {x for n in region.nodes for x in n.input}
        consts = [t for name, t in inits.items() if name in used or name in region.program.consts]
        consts += list(region.compute.orig_consts)
    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    orig = helper.make_model(helper.make_graph(list(region.nodes), "region", ins, outs, initializer=consts),
                             opset_imports=opsets)
    fused_consts = [new_inits.get(x) or inits[x] for x in region.inputs if x in new_inits or x in inits]
    fused_node = helper.make_node(region.op_type, list(region.inputs), list(region.outputs), domain=DOMAIN)
    f_ins = [vi(x, True) for x in runtime_inputs(region, model)]
    f_outs = [vi(o, True) for o in region.outputs]
    fused = helper.make_model(helper.make_graph([fused_node], "fused", f_ins, f_outs, initializer=fused_consts),
                              opset_imports=opsets + [helper.make_opsetid(DOMAIN, 1)])
    for m in (orig, fused):
        m.ir_version = max(min(model.ir_version, 10), 7)
    return orig, fused


def exact_integer_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its integer products computed as the ONNX spec defines them, and its quantizers' results in
    quantization steps before rounding; the model itself when it has none of them.

    - MatMulInteger: sum (a - za)(b - zb) exact in int32 (Cast, Sub, an int32 MatMul). onnxruntime's AVX2 kernel
      adds pairs of u8 x s8 products in 16 bits with saturation and can differ from that by thousands
      (tests/kinds/test_qmatmul.py); the int8 kernels are exact, so they are checked against this.
    - ConvInteger: three float convolutions of (x - zx) with the weights less their zero point written in base 8,
      64 a + 8 b + c (digits within [-4, 7]), each exact below 2^24 (K * 255 * 7 for K up to 8192:
      onnxopt/kinds/qconv MAX_K), summed in int32.
    - QuantizeLinear (constant scale and zero point): x / scale + zero point, clamped to the type's range, as float:
      a quantized output is then compared in steps (verify.compare); one that other nodes read (an int8
      convolution's elementwise tail) stays a QuantizeLinear.
    - QLinearConv, QLinearMatMul and QGemm (constant weights and scales): the ConvInteger or MatMulInteger above
      plus the int32 bias, times [alpha *] x_scale * w_scale / y_scale, plus the zero point, clamped, in steps as a
      QuantizeLinear's;
      and so each QDQ convolution unit of constant scales, u8 or s8 weights and the quantizer's int32 bias, or a
      float one added as the qconv kind adds it (_qdq_convs_in_steps)."""
    ops = {"MatMulInteger", "ConvInteger", "QuantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm"}
    if not any(n.op_type in ops for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in model.graph.initializer}
    read = {x for n in model.graph.node for x in n.input}  # a quantizer's result other nodes read keeps its type
    nodes, stepped = [], {}
    _qdq_convs_in_steps(out, inits, stepped, read)
    for k, n in enumerate(_qlinear_in_steps(out, inits, stepped, read)):
        u = f"__exact{k}"
        if n.op_type == "MatMulInteger":
            a, b = _minus_zero(nodes, u, n, onnx.TensorProto.INT32, weights_axis=None)
            nodes.append(helper.make_node("MatMul", [a, b], list(n.output), name=n.name))
        elif n.op_type == "ConvInteger":
            x, w = _minus_zero(nodes, u, n, onnx.TensorProto.FLOAT, weights_axis=0)
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            nodes.append(helper.make_node("Constant", [], [f"{u}_8"], value=numpy_helper.from_array(np.int32(8))))
            total = None
            for d in range(3):  # w = 64 a + 8 b + c, digits within [-4, 7]
                last = d == 2
                digit = w if last else f"{u}_d{d}"
                if not last:
                    nodes += [helper.make_node("Mod", [w, f"{u}_8"], [digit]),
                              helper.make_node("Sub", [w, digit], [f"{u}_r{d}"]),
                              helper.make_node("Div", [f"{u}_r{d}", f"{u}_8"], [f"{u}_w{d}"])]
                nodes += [helper.make_node("Cast", [digit], [f"{u}_f{d}"], to=onnx.TensorProto.FLOAT),
                          helper.make_node("Conv", [x, f"{u}_f{d}"], [f"{u}_c{d}"], **attrs),
                          helper.make_node("Cast", [f"{u}_c{d}"], [f"{u}_i{d}"], to=onnx.TensorProto.INT32)]
                part = f"{u}_i{d}"
                for _ in range(d):
                    nodes.append(helper.make_node("Mul", [part, f"{u}_8"], [f"{part}x"]))
                    part = f"{part}x"
                if total is None:
                    total = part
                else:
                    out_name = n.output[0] if last else f"{u}_t{d}"
                    nodes.append(helper.make_node("Add", [total, part], [out_name], name=n.name if last else ""))
                    total = out_name
                if not last:
                    w = f"{u}_w{d}"
        elif n.op_type == "QuantizeLinear" and n.output[0] not in read and _steps(nodes, u, n, inits, stepped):
            pass
        else:
            nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    for o in out.graph.output:
        if o.name in stepped:
            o.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return out


def _qdq_convs_in_steps(model: onnx.ModelProto, inits: dict, stepped: dict, read: set) -> None:
    """Each QDQ convolution unit DequantizeLinear(x) -> Conv(DequantizeLinear(W u8 or s8, with its zero point),
    DequantizeLinear(bias int32, scale x_scale * w_scale)) -> [Relu] -> QuantizeLinear, all constant but x, replaced in
    `model` by its exact integer form (as the int8 conv kind computes it): ConvInteger -> Add(bias) -> Cast ->
    Mul(x_scale * w_scale / y_scale) -> Add(zero point) -> Max -> Min, in steps, or rounded half to even (before the
    zero point) to its type where other nodes (`read`) read it. A float Conv's rounding moves a value at a step's
    midpoint by one step, which an elementwise tail after the unit (kinds/qconv/lookup.py) would carry on as more."""
    g = model.graph
    graph_nodes = list(g.node)
    producer = {o: i for i, n in enumerate(graph_nodes) for o in n.output if o}
    consumers: dict[str, list] = {}
    for i, n in enumerate(graph_nodes):
        for x in n.input:
            consumers.setdefault(x, []).append(i)

    def const(name):
        t = inits.get(name) if name else None
        return None if t is None else numpy_helper.to_array(t)

    def dq_of(name):
        i = producer.get(name)
        while i is not None and graph_nodes[i].op_type == "Identity":
            i = producer.get(graph_nodes[i].input[0])
        return graph_nodes[i] if i is not None and graph_nodes[i].op_type == "DequantizeLinear" else None

    replaced: dict[int, list] = {}
    dropped: set[int] = set()
    for k, conv in enumerate(graph_nodes):
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or len(conv.input) < 2:
            continue
        xdq, wdq = dq_of(conv.input[0]), dq_of(conv.input[1])
        if xdq is None or wdq is None or len(xdq.input) < 3:
            continue
        # x's zero point may be an input (a region's check feeds it): ConvInteger takes it as one
        sx, zx, w, sw = const(xdq.input[1]), const(xdq.input[2]), const(wdq.input[0]), const(wdq.input[1])
        zw_name = wdq.input[2] if len(wdq.input) > 2 else ""
        zw = const(zw_name)
        # u8 weights with their zero point too (the quantizer's form for weights it quantized as activations)
        if any(v is None for v in (sx, w, sw)) or sx.size != 1 or (zx is not None and zx.size != 1) or \
                w.dtype not in (np.int8, np.uint8) or (zw_name and zw is None) or \
                (zw is not None and zw.size not in (1, w.shape[0])) or sw.size not in (1, w.shape[0]):
            continue
        cout = w.shape[0]
        sw = np.broadcast_to(sw.astype(np.float32).reshape(-1), (cout,))
        bias, float_bias = np.zeros(cout, np.int32), None
        if len(conv.input) > 2 and conv.input[2]:
            bdq = dq_of(conv.input[2])
            b, sb = (const(bdq.input[0]), const(bdq.input[1])) if bdq is not None else (None, None)
            bf = const(conv.input[2])
            if bf is not None and bf.dtype == np.float32 and bf.size == cout:  # a bias the quantizer left float
                float_bias = bf.reshape(-1)
            elif b is not None and b.dtype in (np.uint8, np.int8) and b.size == cout:  # one quantized as activations
                float_bias = dequantized_bias(b, sb, const(bdq.input[2]) if len(bdq.input) > 2 else None)
                if float_bias is None:
                    continue
            elif b is None or sb is None or b.dtype != np.int32 or b.size != cout or \
                    not np.allclose(np.broadcast_to(sb.reshape(-1), (cout,)), np.float32(sx) * sw, rtol=1e-6):
                continue
            else:
                bias = b.reshape(-1)
        after = consumers.get(conv.output[0], [])
        relu = after[0] if len(after) == 1 and graph_nodes[after[0]].op_type == "Relu" else None
        if relu is not None:
            after = consumers.get(graph_nodes[relu].output[0], [])
        if len(after) != 1 or graph_nodes[after[0]].op_type != "QuantizeLinear" or \
                len(graph_nodes[after[0]].input) < 3:
            continue
        q = graph_nodes[after[0]]
        sy, zy = const(q.input[1]), const(q.input[2])
        if sy is None or zy is None or sy.size != 1 or zy.size != 1 or zy.dtype not in (np.uint8, np.int8) or \
                any(a.name != "axis" for a in q.attribute):
            continue
        # a float bias: an int32 part in steps of the sums and the rest in output steps, added after the scale
        # (the qconv kind's bias_rest, graph/quantized_weights.py)
        split = None if float_bias is None else bias_in_sum_steps(float_bias, np.float32(sx) * sw, sy.reshape(()))
        if float_bias is not None and split is None:
            continue
        u = f"__qdq_steps{k}"
        lo = float(zy.reshape(())) if relu is not None else (0.0 if zy.dtype == np.uint8 else -128.0)
        hi = 255.0 if zy.dtype == np.uint8 else 127.0
        if split is not None:
            bias = split[0]
        consts = {"bias": bias.reshape(-1, 1, 1), "scale": (np.float32(sx) * sw / np.float32(sy)).reshape(-1, 1, 1),
                  "zy": np.float32(zy.reshape(())), "lo": np.float32(lo), "hi": np.float32(hi)}
        if split is not None:
            consts["rest"] = split[1].reshape(-1, 1, 1)
        for key, v in consts.items():
            t = numpy_helper.from_array(np.asarray(v), f"{u}_{key}")
            g.initializer.append(t)
            inits[t.name] = t
        conv_int = helper.make_node("ConvInteger", [xdq.input[0], wdq.input[0], xdq.input[2]] +
                                    ([zw_name] if zw is not None else []), [f"{u}_acc"], name=conv.name)
        conv_int.attribute.extend(conv.attribute)
        nodes = [conv_int, helper.make_node("Add", [f"{u}_acc", f"{u}_bias"], [f"{u}_b"]),
                 helper.make_node("Cast", [f"{u}_b"], [f"{u}_f"], to=onnx.TensorProto.FLOAT),
                 helper.make_node("Mul", [f"{u}_f", f"{u}_scale"], [f"{u}_s"])]
        scaled = f"{u}_s"
        if split is not None:
            nodes.append(helper.make_node("Add", [scaled, f"{u}_rest"], [f"{u}_sr"]))
            scaled = f"{u}_sr"
        nodes += _requantized(u, scaled, q.output[0], zy.dtype, q.output[0] in read, stepped)
        dropped |= {k} | ({relu} if relu is not None else set())
        replaced[after[0]] = nodes
    if not replaced:
        return
    new = []
    for i, n in enumerate(graph_nodes):
        if i in dropped:
            continue
        new.extend(replaced.get(i, [n]))
    del g.node[:]
    g.node.extend(new)


def _requantized(u: str, scaled: str, out: str, dtype, rounded: bool, stepped: dict) -> list:
    """`scaled` (S times the scale, float) plus the zero point `{u}_zy`, clamped to [`{u}_lo`, `{u}_hi`] into `out`:
    in steps (recorded in `stepped`), or `rounded` half to even first and cast to `dtype`, as QuantizeLinear and
    QLinearConv round (before the zero point: added after, a value a hair off a midpoint can land on it)."""
    if not rounded:
        stepped[out] = True
        return [helper.make_node("Add", [scaled, f"{u}_zy"], [f"{u}_z"]),
                helper.make_node("Max", [f"{u}_z", f"{u}_lo"], [f"{u}_m"]),
                helper.make_node("Min", [f"{u}_m", f"{u}_hi"], [out])]
    return [helper.make_node("Round", [scaled], [f"{u}_r"]),
            helper.make_node("Add", [f"{u}_r", f"{u}_zy"], [f"{u}_z"]),
            helper.make_node("Max", [f"{u}_z", f"{u}_lo"], [f"{u}_m"]),
            helper.make_node("Min", [f"{u}_m", f"{u}_hi"], [f"{u}_c"]),
            helper.make_node("Cast", [f"{u}_c"], [out], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))]


def _qlinear_in_steps(model: onnx.ModelProto, inits: dict, stepped: dict, read: set) -> list:
    """`model`'s nodes with each QLinearConv (QLinearMatMul, QGemm) of constant weights and scales as ConvInteger
    (MatMulInteger) -> Add(bias) -> Cast -> Mul([alpha *] x_scale * w_scale / y_scale) -> Add(zero point) -> Max ->
    Min: its
    result in steps before rounding (float; recorded in `stepped`). Initializers it needs are added to `model` and
    `inits`."""
    from onnxopt.graph.quantized import expand_qlinear_products

    def expand(k, n, p):
        u = f"__qlinear_steps{k}"
        conv = n.op_type == "QLinearConv"
        cout = p["w"].shape[0 if conv else 1]
        sx = np.float32(p["sx"]) if p["alpha"] == 1 else p["alpha"] * np.float32(p["sx"])  # QGemm's alpha first
        scale = (sx * np.broadcast_to(p["sw"].astype(np.float32).reshape(-1), (cout,)) /
                 np.float32(p["sy"])).astype(np.float32)
        zy = p["zy"] if p["zy"] is not None else np.uint8(0)
        lo, hi = (0.0, 255.0) if zy.dtype == np.uint8 else (-128.0, 127.0)
        consts = {"scale": scale.reshape(-1, 1, 1) if conv else scale, "zy": np.float32(zy), "lo": np.float32(lo),
                  "hi": np.float32(hi)}
        if p["bias"] is not None:
            consts["bias"] = p["bias"].astype(np.int32).reshape((-1, 1, 1) if conv else (-1,))
        gemm = n.op_type == "QGemm"
        if gemm:
            consts["w"] = p["w"]  # [K, N], transposed where transB is set
        for key, v in consts.items():
            t = numpy_helper.from_array(np.asarray(v), f"{u}_{key}")
            model.graph.initializer.append(t)
            inits[t.name] = t
        acc = f"{u}_acc"
        nodes = [helper.make_node("ConvInteger" if conv else "MatMulInteger",
                                  [n.input[0], f"{u}_w" if gemm else n.input[3], n.input[2], n.input[5]], [acc],
                                  name=n.name)]
        if not gemm:
            nodes[-1].attribute.extend(n.attribute)
        if p["bias"] is not None:
            nodes.append(helper.make_node("Add", [acc, f"{u}_bias"], [f"{u}_biased"]))
            acc = f"{u}_biased"
        nodes += [helper.make_node("Cast", [acc], [f"{u}_f"], to=onnx.TensorProto.FLOAT),
                  helper.make_node("Mul", [f"{u}_f", f"{u}_scale"], [f"{u}_s"])]
        return nodes + _requantized(u, f"{u}_s", n.output[0], zy.dtype, n.output[0] in read, stepped)

    return expand_qlinear_products(model, expand)


def _minus_zero(nodes: list, u: str, n: onnx.NodeProto, to: int, weights_axis) -> tuple[str, str]:
    """Cast both operands of an integer product to int32 and subtract their zero points (a weights' zero point per
    channel along `weights_axis`); the input operand then cast to `to`. Appends to `nodes`; returns the two names."""
    names = []
    for side, (x, z) in enumerate(((n.input[0], n.input[2] if len(n.input) > 2 else ""),
                                   (n.input[1], n.input[3] if len(n.input) > 3 else ""))):
        nodes.append(helper.make_node("Cast", [x], [f"{u}_{side}"], to=onnx.TensorProto.INT32))
        name = f"{u}_{side}"
        if z:
            nodes.append(helper.make_node("Cast", [z], [f"{u}_{side}z"], to=onnx.TensorProto.INT32))
            zero = f"{u}_{side}z"
            if side == 1 and weights_axis is not None:  # [C] -> [C, 1, 1, 1]; a scalar stays one
                nodes += [helper.make_node("Constant", [], [f"{u}_zs"],
                                           value=numpy_helper.from_array(np.array([-1, 1, 1, 1], np.int64))),
                          helper.make_node("Reshape", [zero, f"{u}_zs"], [f"{u}_{side}zr"])]
                zero = f"{u}_{side}zr"
            nodes.append(helper.make_node("Sub", [name, zero], [f"{u}_{side}s"]))
            name = f"{u}_{side}s"
        if side == 0 and to != onnx.TensorProto.INT32:
            nodes.append(helper.make_node("Cast", [name], [f"{u}_{side}c"], to=to))
            name = f"{u}_{side}c"
        names.append(name)
    return names[0], names[1]


def _steps(nodes: list, u: str, n: onnx.NodeProto, inits: dict, stepped: dict) -> str | None:
    """A QuantizeLinear with a constant scalar scale and zero point as x / scale + zero point clamped to the
    type's range, in float (appended to `nodes`); None (nothing appended) for any other."""
    # axis says nothing for one scale; saturate, block_size and output_dtype (opset 19+) would
    if len(n.input) < 3 or n.input[1] not in inits or n.input[2] not in inits or \
            any(a.name != "axis" for a in n.attribute):
        return None
    scale, zero = numpy_helper.to_array(inits[n.input[1]]), numpy_helper.to_array(inits[n.input[2]])
    if scale.size != 1 or zero.size != 1 or zero.dtype not in (np.uint8, np.int8):
        return None
    lo, hi = (0.0, 255.0) if zero.dtype == np.uint8 else (-128.0, 127.0)

    def const(name, v):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.float32(v)))
    nodes += [const(f"{u}_s", scale.reshape(())), const(f"{u}_z", zero.reshape(())), const(f"{u}_lo", lo),
              const(f"{u}_hi", hi),
              helper.make_node("Div", [n.input[0], f"{u}_s"], [f"{u}_d"]),
              helper.make_node("Add", [f"{u}_d", f"{u}_z"], [f"{u}_a"]),
              helper.make_node("Clip", [f"{u}_a", f"{u}_lo", f"{u}_hi"], [n.output[0]], name=n.name)]
    stepped[n.output[0]] = True
    return n.output[0]


def runtime_inputs(region: Region, model: onnx.ModelProto) -> list[str]:
    """The region's inputs that are not constants (for compute regions: not weights, biases or their packing)."""
    if region.compute is None:
        carried = {t.name for t in region.initializers}
        return [x for x in dict.fromkeys(region.inputs) if x not in carried]
    consts = {t.name for t in model.graph.initializer} | {t.name for t in region.compute.initializers}
    if model.ir_version >= 4:  # see ElementwiseRule: IR 3 lists every initializer as an input
        consts -= {i.name for i in model.graph.input}
    return [x for x in dict.fromkeys(region.inputs) if x not in consts]


def region_feeds(region: Region, info, bindings, seed, model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for x in runtime_inputs(region, model):
        ti = info[x]
        shape = [d if isinstance(d, int) else int(bindings.get(d, 1)) for d in ti.shape]
        feeds[x] = random_array(shape, ti.dtype, rng)
    return feeds


def kernel_error_bound(region: Region) -> float:
    """The error a compute kernel may show against onnxruntime, as a fraction of its output's largest magnitude: a
    reduction in another order (2e-6), or a Winograd convolution's transforms (fusion/winograd.py, error_bound)."""
    m = region.compute.attrs.winograd if region.compute is not None else None
    return winograd.error_bound(region.compute.attrs.kernel, m) if m else 2e-6


def region_flops(region: Region, feeds, outs) -> float:
    """Multiply-adds (x2) of a compute region's convolution or matmul, or of an int8 GEMM's (integer ops); 0 for
    elementwise regions."""
    c = region.compute
    if region.params.family == "qmatmul" and outs:
        return 2.0 * np.asarray(outs[0]).size * region.params.k
    if region.params.family == "qconv" and outs:
        p = region.params
        return 2.0 * np.asarray(outs[0]).size * p.cin * p.kernel[0] * p.kernel[1]
    if c is None or not outs:
        return 0.0
    out = np.asarray(outs[0])
    macs = conv_macs_per_output(c)
    if macs is not None:
        return 2.0 * out.size * macs
    a = feeds.get(region.inputs[0])
    if a is None:
        return 0.0
    k = a.shape[-2] if c.attrs.trans_a else a.shape[-1]
    return 2.0 * out.size * k


def peak_dtype(region: Region, desc=None, machine=None, target=None) -> str:
    """Which of the machine model's peaks a region's arithmetic is measured against: its kernel's instruction's.
    A kernel with AMX tiles (`desc.matrix_instruction`) is measured against the tile unit's peak where the machine
    model has it (the host has AMX and Linux granted it), else against the vector instruction it runs instead; a
    GEMM with bf16 weights against vdpbf16ps's where the target has it (else it runs float32 FMAs)."""
    from onnxopt.hardware.measure import AMX_PEAKS

    matrix = getattr(desc, "matrix_instruction", "")
    if matrix and machine is not None:  # a bf16 GEMM's tdpbf16ps tiles as the int8 kinds' tdpbusd ones
        from onnxopt.codegen.instructions import MATRIX_INSTRUCTIONS

        ins = next(i for i in MATRIX_INSTRUCTIONS if i.name == matrix)
        name = AMX_PEAKS.get(ins.source_dtypes[0])
        if name in machine.peak_flops:
            return name
    compute = getattr(region, "compute", None)
    if (compute is not None and compute.attrs.b_dtype == "bfloat16" and machine is not None
            and "bfloat16" in machine.peak_flops and (target is None or target.has("avx512bf16"))):
        return "bfloat16"
    return "int8" if region.params.family in ("qmatmul", "qconv") else "float32"


def bytes_moved(region: Region, feeds, outs) -> int:
    return int(sum(v.nbytes for v in feeds.values()) + sum(np.asarray(o).nbytes for o in outs))
