"""Which int8 matmuls become an int8 GEMM kernel, and why the others do not.

The static forms, QDQ units DequantizeLinear(A u8) -> MatMul or Gemm(DequantizeLinear(B s8 constant), a Gemm's
DequantizeLinear(bias int32)) -> [Relu] -> QuantizeLinear and the QOperator format's QLinearMatMul and QGemm, run
whole with QLinearMatMul's (QGemm's) requantization per column (QUANT: lower.py), the int32 bias added first.
The dynamic form is the one onnxruntime's `quantize_dynamic` writes for a transformer's projections and FFN (and what
`MatMulIntegerToFloat` fuses in onnxruntime):

    MatMulInteger(A u8 [.., M, K], B s8 [K, N] constant, a_zero_point u8 scalar, b_zero_point 0)
      -> Cast(to float) -> Mul(scale) -> Add(bias) -> ...   (scale: A's dynamic scale times B's, a scalar)

A comes from a DynamicQuantizeLinear that onnxruntime runs (it feeds Q, K and V's projections alike). The kernel
takes the Cast and every elementwise op after it that the compute kind's epilogue would take (bias, GELU, the
residual Add), so the int32 sums never reach memory. B is packed offline in panels of 16 columns and groups of 4
along K, [ceil(N / 16)][K / 4][16][4], the layout in which one load gives a dot-product instruction its b[4i + j]
(codegen/instructions). Pairs of weights whose 16-bit sums could saturate AVX2's vpmaddubsw are split
(avx2_u8s8.split_pairs): the packed B holds the safe part and a per-panel list of exact corrections (k, column,
residual) holds the rest, which the kernel adds after its K loop. The column sums of the original B are stored
beside it, for A's zero point: sum (a - za) w = sum a w - za colsum(w). The function fallback rebuilds B (Transpose,
Reshape, Slice, plus a ScatterND of the residuals) and runs the original nodes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.codegen.instructions.avx2_u8s8 import split_pairs
from onnxopt.fusion.compute import ComputeRule
from onnxopt.graph.quantized import integer_product_units, quantized_nodes
from onnxopt.graph.quantized_weights import signed_weights
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value

from .lower import splits_weight_pairs
from .params import PANEL, QUANT, QMatMulParams

_ONNX = ("", "ai.onnx")
_MS = "com.microsoft"
MAX_EXTRAS = 8  # glue.h QM_MAX_EXTRA
MAX_OUTPUTS = 4  # glue.h QM_MAX_OUT


def pack(w: np.ndarray, split: bool = True) -> dict[str, np.ndarray]:
    """B [K, N] s8 for the kernel: "packed" [ceil(N / PANEL)][K / 4][PANEL][4] int8 (zero-padded, pairs split so
    none saturates), "colsum" int32 [ceil(N / PANEL) * PANEL] (of the original B), the corrections per panel
    ("fix_offsets" int32 [panels + 1], "fix_entries" int32 [count, 3]: k, column within the panel, residual) and the
    same corrections for the fallback's ScatterND ("fix_index" int64 [count, 2]: k, n; "fix_update" int32)."""
    k, n = w.shape
    pn = -(-n // PANEL)
    padded = np.zeros((k, pn * PANEL), np.int8)
    padded[:, :n] = w
    packed = np.ascontiguousarray(padded.reshape(k // 4, 4, pn, PANEL).transpose(2, 0, 3, 1))
    safe, where, residual = split_pairs(packed, split)
    p, rest = np.divmod(where, (k // 4) * PANEL * 4)
    g, rest = np.divmod(rest, PANEL * 4)
    col, j = np.divmod(rest, 4)
    kk, nn = g * 4 + j, p * PANEL + col
    order = np.lexsort((col, kk, p))
    entries = np.stack([kk, col, residual], axis=1)[order].astype(np.int32)
    offsets = np.searchsorted(p[order], np.arange(pn + 1)).astype(np.int32)
    return {"packed": safe, "colsum": padded.astype(np.int32).sum(axis=0).astype(np.int32),
            "fix_offsets": offsets, "fix_entries": entries.reshape(-1, 3),
            "fix_index": np.stack([kk, nn], axis=1)[order].astype(np.int64).reshape(-1, 2),
            "fix_update": residual[order].astype(np.int32)}


def _unpack_body(names: dict, k: int, n: int, out: str, opset: int) -> list[onnx.NodeProto]:
    """Nodes that rebuild B [K, N] s8 from its packed form and its corrections (the function fallback's)."""
    pn = -(-n // PANEL)

    def const(name, arr, dtype=np.int64):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, dtype), name))

    safe = f"{out}_safe" if "fix_index" in names else out
    body = [helper.make_node("Transpose", [names["packed"]], [f"{out}_t"], perm=[1, 3, 0, 2]),  # [K/4][4][P][16]
            const(f"{out}_s", [k, pn * PANEL]),
            helper.make_node("Reshape", [f"{out}_t", f"{out}_s"], [f"{out}_r" if pn * PANEL != n else safe])]
    if pn * PANEL != n:
        if opset >= 10:
            body += [const(f"{out}_b", [0]), const(f"{out}_e", [n]), const(f"{out}_a", [1]),
                     helper.make_node("Slice", [f"{out}_r", f"{out}_b", f"{out}_e", f"{out}_a"], [safe])]
        else:
            body.append(helper.make_node("Slice", [f"{out}_r"], [safe], starts=[0], ends=[n], axes=[1]))
    if "fix_index" in names:  # B = safe + the residuals, in int32 (ScatterND and Add), back to s8
        body += [helper.make_node("Cast", [safe], [f"{out}_s32"], to=onnx.TensorProto.INT32),
                 helper.make_node("Sub", [f"{out}_s32", f"{out}_s32"], [f"{out}_zeros"]),
                 helper.make_node("ScatterND", [f"{out}_zeros", names["fix_index"], names["fix_update"]],
                                  [f"{out}_fix"]),
                 helper.make_node("Add", [f"{out}_s32", f"{out}_fix"], [f"{out}_w32"]),
                 helper.make_node("Cast", [f"{out}_w32"], [out], to=onnx.TensorProto.INT8)]
    return body


class _Rule(ComputeRule):
    def __init__(self, model, split: bool = True):
        super().__init__(model, mi=4)
        self.split = split  # pack B with its saturating pairs split (the target's instruction saturates)
        # Nodes the epilogue must leave to onnxruntime: those of a quantized pattern (graph/quantized.py) other than
        # an integer product's rescaling. A GELU that feeds the next DynamicQuantizeLinear, run by our vector math,
        # would round differently by an ulp and move values across quantization steps there.
        left = quantized_nodes(model.graph) - integer_product_units(model.graph)
        self.protected = {k for k, n in enumerate(self.index.nodes) if n.output and n.output[0] in left}

    def producer(self, name):
        i = self.index.producer.get(name)
        return (i, self.index.nodes[i]) if i is not None else (None, None)

    def refusal(self, i: int) -> str | None:
        node = self.index.nodes[i]
        a, b = node.input[0], node.input[1]
        if self.ew.dtype_of(a) != "uint8":
            return f"its A is {self.ew.dtype_of(a)}; the int8 kernels take u8 activations (the quantizer's default)"
        w = self._const(b)
        if w is None or w.dtype != np.int8 or w.ndim != 2:
            return "its B is not a constant s8 matrix"
        if w.shape[0] % 4:
            return f"K = {w.shape[0]} is not a multiple of 4 (the dot-product instructions sum 4 products)"
        if len(node.input) > 3 and node.input[3]:
            zb = self._const(node.input[3])
            if zb is None or np.any(zb != 0):
                return "B's zero point is not a constant 0"
        if len(node.input) > 2 and node.input[2]:
            za = node.input[2]
            shape = self.ew.shape_of(za)
            if self.ew.dtype_of(za) != "uint8" or shape is None or int(np.prod(shape or [1])) != 1:
                return "A's zero point is not one u8 value"
        ashape = self.ew.shape_of(a)
        if ashape is None or len(ashape) < 2:
            return "A's rank is unknown or below 2"
        cons = self.index.consumers.get(node.output[0], [])
        if len(cons) != 1 or node.output[0] in self.index.graph_outputs:
            return "its int32 result is read by more than a Cast to float"
        cast = self.index.nodes[cons[0]]
        if cast.op_type != "Cast" or cast.domain not in _ONNX or self.ew.dtype_of(cast.output[0]) != "float32":
            return "its int32 result is not cast to float"
        return None


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None,
                 target=None) -> list[Region]:
    """`target`: B's pairs are split only where its instruction saturates (lower.py splits_weight_pairs)."""
    rule = None
    regions = []
    split = splits_weight_pairs(target)
    for i, node in enumerate(model.graph.node):
        static = {"QLinearMatMul": _qlinear_region, "MatMul": _qdq_region, "Gemm": _qdq_region}.get(node.op_type) \
            if node.domain in _ONNX else (_qgemm_region if node.op_type == "QGemm" and node.domain == _MS else None)
        if static is not None and i not in claimed:
            rule = rule or _Rule(model, split)
            found = static(rule, i, claimed)
            if found is None:  # a float MatMul
                continue
            if isinstance(found, str):
                if rejected is not None:
                    rejected.append({"nodes": [node.name or node.output[0]], "reason": f"{node.op_type}: {found}"})
                continue
            regions.append(found)
            claimed.update(_members(rule, found))
            continue
        if node.op_type != "MatMulInteger" or node.domain not in _ONNX or i in claimed:
            continue
        rule = rule or _Rule(model, split)
        why = rule.refusal(i)
        if why is None:
            cast_i = rule.index.consumers[node.output[0]][0]
            if cast_i in claimed:
                why = "its Cast is fused elsewhere"
        if why is not None:
            if rejected is not None:
                rejected.append({"nodes": [node.name or node.output[0]], "reason": f"MatMulInteger: {why}"})
            continue
        region = _region(rule, i, cast_i, claimed)
        if isinstance(region, str):
            if rejected is not None:
                rejected.append({"nodes": [node.name or node.output[0]], "reason": f"MatMulInteger: {region}"})
            continue
        regions.append(region)
    return regions


def _region(rule: _Rule, i: int, cast_i: int, claimed: set[int]) -> Region | str:
    idx = rule.index
    node, cast = idx.nodes[i], idx.nodes[cast_i]
    out_shape = rule.ew.shape_of(cast.output[0])
    members, values, extras, kinds = [i, cast_i], {cast.output[0]}, [], []
    rule.grow_epilogue(i, claimed | rule.protected, members, values, extras, kinds, out_shape, "matmul", MAX_EXTRAS)
    group = set(members)
    outputs = [o for m in sorted(members) if m != i for o in idx.nodes[m].output if idx.is_used_outside(o, group)]
    if not outputs:
        return "no output is used"
    if len(outputs) > MAX_OUTPUTS:
        return f"more than {MAX_OUTPUTS} outputs"
    w = rule._const(node.input[1])
    k, n = w.shape
    uid = node.output[0]
    tables, names, has_fix = _tables(w, uid, rule.split)
    has_azp = len(node.input) > 2 and bool(node.input[2])
    consts: dict = {}
    ops = [rule.ew._to_op(idx.nodes[m], consts) for m in sorted(members) if m != i]
    program = EwProgram(inputs=[Value(node.output[0], "int32")] + [Value(x, "float32") for x in extras],
                        consts=consts, ops=ops, outputs=[Value(o, "float32") for o in outputs])
    unpacked = f"{uid}__unpacked_b"
    mm = onnx.NodeProto()
    mm.CopyFrom(node)
    mm.input[1] = unpacked
    body = _unpack_body(names, k, n, unpacked, rule.ew.opset) + [mm]
    for m in sorted(members):
        if m != i:
            c = onnx.NodeProto()
            c.CopyFrom(idx.nodes[m])
            body.append(c)
    params = QMatMulParams(k=k, n=n, has_azp=has_azp, extra_kinds=tuple(kinds), has_fix=has_fix, body=tuple(body))
    inputs = [node.input[0]] + ([node.input[2]] if has_azp else []) + list(names.values()) + extras
    region = Region("qmatmul", [idx.nodes[m] for m in sorted(members)], inputs, outputs, program, list(out_shape),
                    params=params)
    region.initializers = [numpy_helper.from_array(tables[key], name) for key, name in names.items()]
    claimed.update(members)
    return region


def _tables(w: np.ndarray, uid: str, split: bool = True) -> tuple[dict, dict, bool]:
    """(B's packed tables, their initializer names, whether it has corrections): names only for the corrections'
    tables where there are any."""
    tables = pack(w, split)
    names = {key: f"{uid}__q{key}" for key in tables}
    has_fix = len(tables["fix_update"]) > 0
    if not has_fix:
        for key in ("fix_offsets", "fix_entries", "fix_index", "fix_update"):
            del names[key]
    return tables, names, has_fix


def _members(rule, region) -> set[int]:
    """The node indices of `region`'s nodes."""
    ids = {id(n) for n in region.nodes}
    return {k for k, n in enumerate(rule.index.nodes) if id(n) in ids}


def _scalar(rule, name, dtype=None):
    v = rule._const(name) if name else None
    if v is None or v.size != 1 or (dtype is not None and v.dtype != dtype):
        return None
    return v.reshape(())


def _quant_region(rule, i: int, members: list, a: str, za: str | None, w, sw, sa, sy, zy, out: str,
                  fallback, bias=None, relu: bool = False, alpha: float = 1.0, row_term=None) -> Region | str:
    """The QUANT region of a quantized matmul (a QLinearMatMul, a QGemm or a QDQ unit): B [K, N] packed, the scales
    per column (alpha * a_scale * b_scale / y_scale, in float32 and in that order, as onnxruntime computes
    QLinearMatMul's and QGemm's) made, and `bias` (int32 [N], or None) padded to whole panels; `fallback(the rebuilt
    B's name)` gives the function body's nodes after B is rebuilt. `row_term`: (128 - zw per column, the body's zero
    point) for u8 B stored as B - 128 (has_asum), or None."""
    idx = rule.index
    node = idx.nodes[i]
    k, n = w.shape
    if k % 4:
        return f"K = {k} is not a multiple of 4 (the dot-product instructions sum 4 products)"
    ashape = rule.ew.shape_of(a)
    out_shape = rule.ew.shape_of(out)
    if ashape is None or len(ashape) < 2 or out_shape is None:
        return "A's or the output's shape is unknown, or A's rank is below 2"
    uid = node.output[0]
    tables, names, has_fix = _tables(w, uid, rule.split)
    pn = -(-n // PANEL)
    scale = np.zeros(pn * PANEL, np.float32)
    sa = np.float32(sa) if alpha == 1.0 else np.float32(alpha) * np.float32(sa)
    scale[:n] = (sa * np.broadcast_to(sw.reshape(-1), (n,)).astype(np.float32) / np.float32(sy)).astype(np.float32)
    names["qscale"] = f"{uid}__qscale"
    tables["qscale"] = scale
    if bias is not None:
        names["qbias"] = f"{uid}__qbias"
        tables["qbias"] = np.zeros(pn * PANEL, np.int32)
        tables["qbias"][:n] = bias
    if row_term is not None:
        names["dvec"], names["body_zero"] = f"{uid}__qdvec", f"{uid}__qbody_zero"
        tables["dvec"] = np.zeros(pn * PANEL, np.int32)
        tables["dvec"][:n] = row_term[0]
        tables["body_zero"] = row_term[1]
    out_dtype = "int8" if zy.dtype == np.int8 else "uint8"
    # Not lowered (QUANT's epilogue is lower.py's requantization); it names the output in the op type's signature.
    program = EwProgram(inputs=[Value(uid, "int32")], consts={}, ops=[EwOp("Cast", (uid,), out, out_dtype)],
                        outputs=[Value(out, out_dtype)])
    unpacked = f"{uid}__unpacked_b"
    body = _unpack_body(names, k, n, unpacked, rule.ew.opset) + fallback(unpacked)
    params = QMatMulParams(k=k, n=n, has_azp=za is not None, extra_kinds=(), has_fix=has_fix, mode=QUANT,
                           out_signed=zy.dtype == np.int8, out_zero=int(zy), has_bias=bias is not None,
                           relu=relu, has_asum=row_term is not None, body=tuple(body))
    inputs = [a] + ([za] if za is not None else []) + list(names.values())
    region = Region("qmatmul", [idx.nodes[m] for m in sorted(members)], inputs, [out], program, list(out_shape),
                    params=params)
    region.initializers = [numpy_helper.from_array(tables[key], name) for key, name in names.items()]
    return region


def _qlinear_region(rule, i: int, claimed: set[int]) -> Region | str:
    """QLinearMatMul (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point), B constant s8."""
    node = rule.index.nodes[i]
    a = node.input[0]
    za = _scalar(rule, node.input[2]) if node.input[2] else None
    act = str(za.dtype) if za is not None else rule.ew.dtype_of(a)
    if act != "uint8":
        return f"its A is {act}; the int8 kernels take u8 activations (the quantizer's default)"
    sa, sy = _scalar(rule, node.input[1], np.float32), _scalar(rule, node.input[6], np.float32)
    zy = _scalar(rule, node.input[7]) if len(node.input) > 7 and node.input[7] else np.uint8(0)
    w, sw = rule._const(node.input[3]), rule._const(node.input[4])
    zw = rule._const(node.input[5]) if node.input[5] else None
    if sa is None or sy is None or zy is None or zy.dtype not in (np.uint8, np.int8) or \
            (node.input[2] and za is None):
        return "its scales or zero points are not constant scalars"
    if w is None or w.dtype != np.int8 or w.ndim != 2 or sw is None or sw.dtype != np.float32 or \
            sw.size not in (1, w.shape[1]):
        return "its B is not a constant s8 matrix with a scale per tensor or per column"
    if zw is not None and np.any(zw != 0):
        return "B's zero point is not 0"

    def fallback(unpacked):
        mm = onnx.NodeProto()
        mm.CopyFrom(node)
        mm.input[3] = unpacked
        return [mm]

    return _quant_region(rule, i, [i], a, node.input[2] or None, w, sw, sa, sy, zy, node.output[0], fallback)


def _qgemm_region(rule, i: int, claimed: set[int]) -> Region | str:
    """com.microsoft QGemm (a, a_scale, a_zero_point, b, b_scale, b_zero_point, C, y_scale, y_zero_point), the
    quantizer's QOperator form of a Gemm: B constant s8, C int32 per column, a quantized output."""
    node = rule.index.nodes[i]
    ins = list(node.input) + [""] * (9 - len(node.input))
    if not ins[7]:
        return "its output is float (no y_scale)"
    if _attr(node, "transA", 0):
        return "it transposes A"
    a = ins[0]
    za = _scalar(rule, ins[2]) if ins[2] else None
    act = str(za.dtype) if za is not None else rule.ew.dtype_of(a)
    if act != "uint8":
        return f"its A is {act}; the int8 kernels take u8 activations (the quantizer's default)"
    sa, sy = _scalar(rule, ins[1], np.float32), _scalar(rule, ins[7], np.float32)
    zy = _scalar(rule, ins[8]) if ins[8] else np.uint8(0)
    if sa is None or sy is None or zy is None or zy.dtype not in (np.uint8, np.int8) or (ins[2] and za is None):
        return "its scales or zero points are not constant scalars"
    w, sw = rule._const(ins[3]), rule._const(ins[4])
    zw = rule._const(ins[5]) if ins[5] else None
    if w is None or w.dtype != np.int8 or w.ndim != 2 or sw is None or sw.dtype != np.float32:
        return "its B is not a constant s8 matrix"
    transb = bool(_attr(node, "transB", 0))
    w = np.ascontiguousarray(w.T) if transb else w
    if sw.size not in (1, w.shape[1]):
        return "its B's scale is not per tensor or per column"
    if zw is not None and np.any(zw != 0):
        return "B's zero point is not 0"
    bias = None
    if ins[6]:
        c = rule._const(ins[6])
        if c is None or c.dtype != np.int32 or c.size not in (1, w.shape[1]) or \
                (c.ndim == 2 and c.shape[0] != 1 and c.size > 1):
            return "its C is not a constant int32 row"
        bias = np.broadcast_to(c.reshape(-1), (w.shape[1],))

    def fallback(unpacked):
        mm = onnx.NodeProto()
        mm.CopyFrom(node)
        mm.input[3] = unpacked
        _set_attr(mm, "transB", 0)  # the rebuilt B is [K, N]
        return [mm]

    return _quant_region(rule, i, [i], a, ins[2] or None, w, sw, sa, sy, zy, node.output[0], fallback, bias=bias,
                         alpha=float(_attr(node, "alpha", 1.0)))


def _qdq_region(rule, i: int, claimed: set[int]) -> Region | str:
    """DequantizeLinear(A u8) -> MatMul or Gemm(DequantizeLinear(B constant s8, or u8 with a zero point where
    B - zw fits in s8; per tensor or per column), and a Gemm's DequantizeLinear(bias int32 of scale a_scale *
    b_scale)) -> [Relu] -> QuantizeLinear(u8 or s8), run whole."""
    idx = rule.index
    node = idx.nodes[i]
    gemm = node.op_type == "Gemm"
    a_i, a_dq = rule.producer(node.input[0])
    b_i, b_dq = rule.producer(node.input[1])
    if a_dq is None or b_dq is None or a_dq.op_type != "DequantizeLinear" or b_dq.op_type != "DequantizeLinear":
        return None  # a float MatMul or Gemm: the compute rule's
    has_c = gemm and len(node.input) > 2 and bool(node.input[2])
    if gemm and (_attr(node, "transA", 0) or _attr(node, "alpha", 1.0) != 1.0 or
                 (has_c and _attr(node, "beta", 1.0) != 1.0)):
        return "its Gemm transposes A or scales by alpha or beta (the quantizer writes neither)"
    transb = gemm and bool(_attr(node, "transB", 0))
    a = a_dq.input[0]
    za = _scalar(rule, a_dq.input[2]) if len(a_dq.input) > 2 and a_dq.input[2] else None
    act = str(za.dtype) if za is not None else rule.ew.dtype_of(a)
    if act != "uint8":
        return f"its A is {act}; the int8 kernels take u8 activations (the quantizer's default)"
    sa = _scalar(rule, a_dq.input[1], np.float32)
    w, sw = rule._const(b_dq.input[0]), rule._const(b_dq.input[1])
    zw = rule._const(b_dq.input[2]) if len(b_dq.input) > 2 and b_dq.input[2] else None
    if sa is None or (len(a_dq.input) > 2 and a_dq.input[2] and za is None):
        return "A's scale or zero point is not a constant scalar"
    # a per-column scale runs along N: axis 1 of B [K, N], axis 0 of a transposed B [N, K]
    n_axes = (0, -2) if transb else (1, -1)
    if w is None or w.dtype not in (np.int8, np.uint8) or w.ndim != 2 or sw is None or sw.dtype != np.float32 or \
            sw.size not in (1, w.shape[n_axes[0]]) or \
            (sw.size > 1 and int(_attr(b_dq, "axis", 1)) not in n_axes):
        return "its B is not a constant u8 or s8 matrix with a scale per tensor or per column"
    if zw is not None and (zw.dtype != w.dtype or zw.size != sw.size):
        return "B's zero point is not of its type, one per scale"
    w = np.ascontiguousarray(w.T) if transb else w
    # u8 B (or s8 with a zero point, as the quantizer writes a Constant weight it quantized as an activation): the
    # kernel takes s8 B - zw where every difference fits in s8 (exact), else s8 B - 128 (B - 0 for s8) and its tile
    # adds (128 - zw) x the row's sum of (a - za) (exact too; the qconv kind's row term); the function body then
    # dequantizes the stored B with zero point zw - 128
    zw = np.zeros((), w.dtype) if zw is None else zw
    w, _, shifted = signed_weights(w, zw, axis=1)
    row_term = None
    if w.dtype != np.int8 or np.any(np.asarray(zw) != 0) and not shifted:
        shift = 128 if w.dtype == np.uint8 else 0
        cols = np.broadcast_to(np.asarray(zw, np.int32).reshape(-1), (w.shape[1],))
        row_term = (shift - cols).astype(np.int32)
        body_zero = (np.asarray(zw, np.int32) - shift).astype(np.int8)
        w = (w.astype(np.int32) - shift).astype(np.int8)
    members = [i, a_i, b_i]
    bias = None
    if has_c:
        c_i, c_dq = rule.producer(node.input[2])
        c = rule._const(c_dq.input[0]) if c_dq is not None and c_dq.op_type == "DequantizeLinear" else None
        sc = rule._const(c_dq.input[1]) if c is not None else None
        zc = rule._const(c_dq.input[2]) if c is not None and len(c_dq.input) > 2 and c_dq.input[2] else None
        want = np.float32(sa) * np.broadcast_to(sw.reshape(-1), (w.shape[1],)).astype(np.float32)
        if c is None or c.dtype != np.int32 or c.size != w.shape[1] or sc is None or \
                sc.size not in (1, w.shape[1]) or (zc is not None and np.any(zc != 0)) or \
                not np.allclose(np.broadcast_to(sc.reshape(-1), want.shape), want, rtol=1e-6):
            return "its bias is not the quantizer's int32 (a DequantizeLinear of scale a_scale * b_scale)"
        bias = c.reshape(-1)
        members.append(c_i)
    cons = idx.consumers.get(node.output[0], [])
    relu = len(cons) == 1 and idx.nodes[cons[0]].op_type == "Relu" and node.output[0] not in idx.graph_outputs
    if relu:
        members.append(cons[0])
        last = idx.nodes[cons[0]].output[0]
        cons = idx.consumers.get(last, [])
    else:
        last = node.output[0]
    if len(cons) != 1 or last in idx.graph_outputs or idx.nodes[cons[0]].op_type != "QuantizeLinear":
        return "its result does not go to one QuantizeLinear alone"
    q_i = cons[0]
    q = idx.nodes[q_i]
    sy = _scalar(rule, q.input[1], np.float32)
    zy = _scalar(rule, q.input[2]) if len(q.input) > 2 and q.input[2] else np.uint8(0)
    if sy is None or zy is None or zy.dtype not in (np.uint8, np.int8):
        return "its output's scale or zero point is not a constant u8 or s8 scalar"
    if any(at.name in ("saturate", "block_size", "output_dtype") for at in q.attribute):
        return "its QuantizeLinear has attributes of opset 19 and later"
    for m in members[1:3] + members[3:4] * has_c:
        if len(idx.consumers.get(idx.nodes[m].output[0], [])) != 1:
            return "a DequantizeLinear of it feeds another node too"
    members.append(q_i)
    if any(m in claimed for m in members):
        return "part of it is fused elsewhere"

    def fallback(unpacked):
        bdq = onnx.NodeProto()
        bdq.CopyFrom(b_dq)
        body = []
        if transb:  # the rebuilt B is [K, N]; the Gemm reads it as it was, [N, K]
            body.append(helper.make_node("Transpose", [unpacked], [f"{unpacked}_nk"], perm=[1, 0]))
            unpacked = f"{unpacked}_nk"
        bdq.input[0] = unpacked
        if shifted:  # the rebuilt B is s8 B - zw: its zero point is 0
            del bdq.input[2:]
        elif row_term is not None:  # the rebuilt B is s8 B - 128: its zero point zw - 128
            bdq.input[2] = f"{node.output[0]}__qbody_zero"
        body.append(bdq)
        for m in sorted(members):
            if m != b_i:
                c = onnx.NodeProto()
                c.CopyFrom(idx.nodes[m])
                body.append(c)
        return body

    za_name = a_dq.input[2] if len(a_dq.input) > 2 and a_dq.input[2] else None
    return _quant_region(rule, i, members, a, za_name, w, sw, sa, sy, zy, q.output[0], fallback, bias=bias,
                         relu=relu, row_term=None if row_term is None else (row_term, body_zero))


def _attr(node, name, default):
    for at in node.attribute:
        if at.name == name:
            return helper.get_attribute_value(at)
    return default


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for k, at in enumerate(node.attribute):
        if at.name == name:
            del node.attribute[k]
            break
    node.attribute.append(helper.make_attribute(name, value))
