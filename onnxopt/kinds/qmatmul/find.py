"""Which int8 matmuls become an int8 GEMM kernel, and why the others do not.

The form is the one onnxruntime's `quantize_dynamic` writes for a transformer's projections and FFN (and what
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
from onnxopt.fusion.region import EwProgram, Region, Value

from .params import PANEL, QMatMulParams

_ONNX = ("", "ai.onnx")
MAX_EXTRAS = 8  # glue.h QM_MAX_EXTRA
MAX_OUTPUTS = 4  # glue.h QM_MAX_OUT


def pack(w: np.ndarray) -> dict[str, np.ndarray]:
    """B [K, N] s8 for the kernel: "packed" [ceil(N / PANEL)][K / 4][PANEL][4] int8 (zero-padded, pairs split so
    none saturates), "colsum" int32 [ceil(N / PANEL) * PANEL] (of the original B), the corrections per panel
    ("fix_offsets" int32 [panels + 1], "fix_entries" int32 [count, 3]: k, column within the panel, residual) and the
    same corrections for the fallback's ScatterND ("fix_index" int64 [count, 2]: k, n; "fix_update" int32)."""
    k, n = w.shape
    pn = -(-n // PANEL)
    padded = np.zeros((k, pn * PANEL), np.int8)
    padded[:, :n] = w
    packed = np.ascontiguousarray(padded.reshape(k // 4, 4, pn, PANEL).transpose(2, 0, 3, 1))
    safe, where, residual = split_pairs(packed)
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
    def __init__(self, model):
        super().__init__(model, mi=4)
        # Nodes the epilogue must leave to onnxruntime: those of a quantized pattern (graph/quantized.py) other than
        # an integer product's rescaling. A GELU that feeds the next DynamicQuantizeLinear, run by our vector math,
        # would round differently by an ulp and move values across quantization steps there.
        left = quantized_nodes(model.graph) - integer_product_units(model.graph)
        self.protected = {k for k, n in enumerate(self.index.nodes) if n.output and n.output[0] in left}

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


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
    rule = None
    regions = []
    for i, node in enumerate(model.graph.node):
        if node.op_type != "MatMulInteger" or node.domain not in _ONNX or i in claimed:
            continue
        rule = rule or _Rule(model)
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
    tables = pack(w)
    uid = node.output[0]
    names = {key: f"{uid}__q{key}" for key in tables}
    has_fix = len(tables["fix_update"]) > 0
    if not has_fix:
        for key in ("fix_offsets", "fix_entries", "fix_index", "fix_update"):
            del names[key]
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
