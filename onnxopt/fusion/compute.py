"""Fusion rule: a convolution or matmul together with everything elementwise after it, up to the next compute op.

    Conv [-> BatchNormalization] -> Add(bias) -> Relu / Clip / hardswish / SiLU / GELU ... -> Add(residual) -> Mul(se)

becomes one kernel: the micro-kernel computes the output tile in registers and the epilogue program applies the
chain before the tile is stored, so the intermediate tensors never reach memory.

What the rule decides at optimize time:
- a BatchNormalization right after a Conv (inference form, constant parameters) is folded into the weights and bias;
- the weights are packed for the micro-kernel ([groups][ceil(oc_g / MI)][ic_g * kh * kw][MI], zero rows to pad) and
  stored in the model as an initializer; the function fallback unpacks them with Transpose/Reshape/Slice, so the
  model computes the same tensor with or without the library;
- each other epilogue input is classified by its shape against the output (POSITION, CHANNEL, COLUMN, SCALAR);
  one-element constants written by hand (0, 1, 3, 6) are folded into the code, learned ones are SCALAR inputs so
  that layers differing only in them share their compiled code;
- every value of the region used outside it (or a graph output) is written; at most MAX_OUTPUTS.
Gemm's alpha and beta are folded into constant B and C; transB needs a constant B (it is transposed at optimize
time), transA is handled by the kernel's strides.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import conv_transpose
from .elementwise import ElementwiseRule, _attr
from .params import ComputeAttrs, ComputeParams
from .region import EwOp, EwProgram, Region, Value

MAX_OUTPUTS = 4
MAX_EXTRAS = 8
POSITION, CHANNEL, COLUMN, SCALAR = 0, 1, 2, 3
ACC = "__acc"
# The epilogue ops whose learned one-element constants are read at run time (ComputeRule._lifted_scalars): one
# multiply or add costs the same with a broadcast register as with an immediate vector.
LIFTED_OPS = ("Add", "Sub", "Mul", "Div")


def _few_digits(value: float) -> bool:
    """A constant written by hand rather than learned: a multiple of 1/64 no larger than 1024 in magnitude."""
    v = float(value)
    return abs(v) <= 1024 and (v * 64).is_integer()


def conv_macs_per_output(params: ComputeParams) -> float | None:
    """Multiply-adds per output element of a convolution or transposed convolution region (whose taps each reach
    1 / (sh * sw) of the output pixels); None for a matmul."""
    if params.op == "afusion":  # per element of the first second's output; the halo recomputation is not counted
        first, seconds = params.parts[0].compute, [p.compute for p in params.parts[1:]]
        pool = params.attrs.pool
        if pool is not None:  # conv -> pool: the conv's MACs over the pool's output (the window's adds are free)
            return conv_macs_per_output(first) * pool["strides"][0] * pool["strides"][1]
        ref = seconds[0].attrs
        # each output pixel of the seconds needs ~stride^2 pixels of the first's output (MISO: one)
        per_first = 1 if params.attrs.miso_extra >= 0 else ref.strides[0] * ref.strides[1]
        per_pixel = sum(conv_macs_per_output(c) * c.attrs.oc for c in seconds) \
            + conv_macs_per_output(first) * first.attrs.oc / per_first
        return per_pixel / ref.oc
    if params.op == "siblings":  # per element of the first sibling's output (the siblings share its size)
        return sum(conv_macs_per_output(p.compute) * p.compute.attrs.oc for p in params.parts) \
            / params.parts[0].compute.attrs.oc
    if params.op not in ("conv", "conv_transpose"):
        return None
    kh, kw = params.attrs.kernel
    per = 1 if params.op == "conv" else params.attrs.strides[0] * params.attrs.strides[1]
    return params.attrs.ic_g * kh * kw / per


class ComputeRule:
    kind_names = {"conv": "Conv", "conv_transpose": "ConvTranspose", "matmul": "MatMul"}
    _ops = {"Conv": "conv", "ConvTranspose": "conv_transpose", "MatMul": "matmul", "Gemm": "matmul"}

    def __init__(self, model: onnx.ModelProto, mi: int, grouped: bool = True,
                 blocked: tuple[int, int] | None = None, panel: int = 0):
        self.grouped = grouped  # also grouped and depthwise convolutions
        # (lanes, NI) of the target's channel-vector kernel, which ConvTranspose runs on; None: no ConvTranspose.
        self.blocked = blocked
        self.ew = ElementwiseRule(model, min_ops=1)
        self.model = model
        self.index = self.ew.index
        self.mi = mi
        # Columns per panel of a constant matmul B packed for the target's mask-free tile; 0: B stays as it is.
        self.panel = panel
        self.inits = self.ew.inits
        self.materialized: dict[str, np.ndarray] = {}

    # ---- the compute node ----
    def _const(self, name):
        """The value of a constant tensor: an initializer, or a ConstantOfShape of a constant shape (the form the
        onnx model zoo's `light` graphs and some exporters give weights, which constant folding leaves alone
        because they are big)."""
        t = self.inits.get(name)
        if t is not None:
            return numpy_helper.to_array(t)
        if name in self.materialized:
            return self.materialized[name]
        p = self.index.producer.get(name)
        if p is None or self.index.nodes[p].op_type != "ConstantOfShape" or self.index.nodes[p].domain not in ("",
                                                                                                           "ai.onnx"):
            return None
        node = self.index.nodes[p]
        shape = self.inits.get(node.input[0]) if node.input else None
        if shape is None:
            return None
        value = _attr(node, "value", None)
        fill = numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)
        arr = np.full(tuple(int(d) for d in numpy_helper.to_array(shape)), fill)
        self.materialized[name] = arr
        return arr

    def admits(self, node) -> str | None:
        if node.domain not in ("", "ai.onnx"):
            return "custom domain"
        if node.op_type not in self._ops:
            return "not a compute op"
        if node.op_type in ("Conv", "ConvTranspose") and self.ew.opset < 9:
            # The fallback unpacks the weights with int64 Constant shapes, which Constant accepts from opset 9.
            return "opset below 9"
        if any(self.ew.dtype_of(x) != "float32" for x in node.input if x):
            return "not float32"
        out_shape = self.ew.shape_of(node.output[0])
        if out_shape is None:
            return "output shape unknown"
        if node.op_type in ("Conv", "ConvTranspose"):
            why = self.conv_operands_reason(node)
            if why is not None:
                return why
        if node.op_type == "ConvTranspose":
            return conv_transpose.admit_reason(self, node)
        if node.op_type == "Conv":
            if not self.grouped and int(_attr(node, "group", 1)) != 1:
                return "grouped convolution (left to onnxruntime in this plan)"
            if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID", b"SAME_UPPER", b"SAME_LOWER"):
                return "unknown auto_pad"
        else:
            sa, sb = self.ew.shape_of(node.input[0]), self.ew.shape_of(node.input[1])
            if sa is None or sb is None or len(sa) < 2 or len(sb) < 2:
                return "operands are not matrices (rank >= 2)"
            if node.op_type == "Gemm":
                c = node.input[2] if len(node.input) > 2 and node.input[2] else None
                if _attr(node, "transB", 0) and self._const(node.input[1]) is None:
                    return "Gemm transB with a runtime B"
                if _attr(node, "alpha", 1.0) != 1.0 and self._const(node.input[1]) is None:
                    return "Gemm alpha with a runtime B"
                if c and _attr(node, "beta", 1.0) != 1.0 and self._const(c) is None:
                    return "Gemm beta with a runtime C"
        return None

    def conv_operands_reason(self, node) -> str | None:
        """What a convolution or transposed convolution needs of its operands: constant 4-D weights, a constant
        bias, an [N, C, H, W] input with a known C."""
        w = self._const(node.input[1])
        if w is None or w.ndim != 4:
            return "not a 2-D convolution with constant weights"
        if len(node.input) > 2 and node.input[2] and self._const(node.input[2]) is None:
            return "bias is not constant"
        xs = self.ew.shape_of(node.input[0])
        if xs is None or len(xs) != 4 or not isinstance(xs[1], int):
            return "input is not [N, C, H, W] with a known C"
        return conv_geometry_reason(node, w.shape, xs[1], self.ew.shape_of(node.output[0]))

    # ---- growth ----
    def find_regions(self, claimed: set[int], rejected: list[dict] | None = None) -> list[Region]:
        regions = []
        for i, node in enumerate(self.index.nodes):
            if i in claimed:
                continue
            why = self.admits(node)
            if why is not None:
                if rejected is not None and node.op_type in self._ops and node.domain in ("", "ai.onnx"):
                    rejected.append({"nodes": [node.name or node.output[0]], "reason": f"{node.op_type}: {why}"})
                continue
            try:
                r = self._region_from(i, claimed)
            except _Reject as e:
                if rejected is not None:
                    rejected.append({"nodes": [node.name or node.output[0]], "reason": str(e)})
                continue
            claimed.update(r[1])
            regions.append(r[0])
        return regions

    def _epilogue_kind(self, x: str, out_shape: tuple, op: str) -> int | None:
        """How an epilogue input broadcasts against the output: POSITION, CHANNEL, COLUMN, SCALAR or None."""
        s = self.ew.shape_of(x)
        if s is None or self.ew.dtype_of(x) != "float32":
            return None
        r = len(out_shape)
        if len(s) > r:
            return None
        full = (1,) * (r - len(s)) + tuple(s)
        out = tuple(out_shape)
        if full == out:
            return POSITION
        if all(d == 1 for d in full):
            return SCALAR
        # Batch items: dim 0 of a convolution, everything before the last two dims of a matmul. An input laid out
        # like one item and shared by all of them is POSITION too; one that broadcasts over part of the batch is
        # not supported (the chain stops before it).
        batch = 1 if op == "conv" else r - 2
        if batch > 0 and full[batch:] == out[batch:]:
            return POSITION if all(d == 1 for d in full[:batch]) else None
        if any(d != 1 and d != o for d, o in zip(full[:batch], out[:batch])):
            return None
        if op == "conv":
            if full[1] == out_shape[1] and all(d == 1 for d in full[2:]) and full[0] in (1, out_shape[0]):
                return CHANNEL
        else:
            if full[-1] == out[-1] and all(d == 1 for d in full[:-1]):
                return COLUMN
            if full[-1] == 1 and full[-2] == out[-2] and all(d == 1 for d in full[:-2]):
                return CHANNEL
        return None

    def _region_from(self, i: int, claimed: set[int]):
        idx = self.index
        node = idx.nodes[i]
        # How epilogue inputs broadcast: a transposed convolution's output is NCHW like a convolution's.
        op = "matmul" if self._ops[node.op_type] == "matmul" else "conv"
        out_shape = self.ew.shape_of(node.output[0])
        members = [i]
        values = {node.output[0]}
        extras: list[str] = []
        kinds: list[int] = []
        bn = None
        # A BatchNormalization that only this conv feeds folds into it.
        cons = idx.consumers.get(node.output[0], [])
        if op == "conv" and len(cons) == 1 and cons[0] not in claimed and node.output[0] not in idx.graph_outputs:
            c = idx.nodes[cons[0]]
            if (c.op_type == "BatchNormalization" and len(c.output) == 1 and c.domain in ("", "ai.onnx")
                    and all(self._const(x) is not None for x in c.input[1:5])):
                bn = c
                members.append(cons[0])
                values = {c.output[0]}
        self.grow_epilogue(i, claimed, members, values, extras, kinds, out_shape, op, MAX_EXTRAS - 1)
        group = set(members)
        outputs = [o for m in sorted(members) for o in idx.nodes[m].output if idx.is_used_outside(o, group)]
        if not outputs:
            raise _Reject("no output is used")
        if len(outputs) > MAX_OUTPUTS:
            raise _Reject(f"more than {MAX_OUTPUTS} outputs")
        return self._build(node, bn, sorted(members), extras, kinds, outputs, out_shape), group

    def grow_epilogue(self, i: int, claimed: set[int], members: list[int], values: set[str], extras: list[str],
                      kinds: list[int], out_shape, op: str, max_extras: int) -> None:
        """Add to `members` (in place) every elementwise consumer of the region's values that keeps the output shape
        and whose other inputs broadcast as POSITION/CHANNEL/COLUMN/SCALAR (appended to `extras`/`kinds`, at most
        `max_extras`), as long as the group does not leave and re-enter itself. Shared with PoolRule."""
        idx = self.index
        changed = True
        while changed:
            changed = False
            for v in sorted(values):
                for c in idx.consumers.get(v, []):
                    if c in members or c in claimed or c < i:
                        continue
                    cn = idx.nodes[c]
                    if self.ew.admits(cn) is not None or self.ew.shape_of(cn.output[0]) != out_shape:
                        continue
                    if self.ew.dtype_of(cn.output[0]) != "float32":
                        continue
                    new_extras = []
                    ok = True
                    for x in cn.input:
                        if not x or x in values or x in extras or self.ew.scalar_const(x) is not None:
                            continue
                        k = self._epilogue_kind(x, out_shape, op)
                        if k is None:
                            ok = False
                            break
                        new_extras.append((x, k))
                    if not ok or len(extras) + len(new_extras) > max_extras:
                        continue
                    if idx.escapes_and_returns(set(members) | {c}):
                        continue
                    members.append(c)
                    values.add(cn.output[0])
                    for x, k in new_extras:
                        extras.append(x)
                        kinds.append(k)
                    changed = True

    # ---- the region ----
    def _build(self, node, bn, members, extras, kinds, outputs, out_shape) -> Region:
        idx = self.index
        ew_nodes = [idx.nodes[m] for m in members if idx.nodes[m] is not node and idx.nodes[m] is not bn]
        consts: dict = {}
        ops: list[EwOp] = []
        # The element type of the op's input (admits() takes float32 only, the one type the kernels are built for)
        params = ComputeParams(self._ops[node.op_type], dtype=self.ew.dtype_of(node.input[0]))
        dt = params.dtype
        head_out = (bn or node).output[0]
        uid = node.output[0]
        inputs: list[str]
        body: list[onnx.NodeProto] = []
        pre_extras: list[tuple[str, int]] = []
        if params.op in ("conv", "conv_transpose"):
            build = self._conv if params.op == "conv" else partial(conv_transpose.build, self,
                                                                   has_position_input=POSITION in kinds)
            inputs, head_body, bias_name = build(node, bn, params, head_out, uid)
            body += head_body
            if bias_name:
                pre_extras.append((bias_name, CHANNEL))
                ops.append(EwOp("Add", (ACC, bias_name), head_out, dt))
        else:
            inputs, head_body, c_name, c_kind = self._matmul(node, params, head_out, uid, out_shape)
            body += head_body
            if c_name:
                pre_extras.append((c_name, c_kind))
                ops.append(EwOp("Add", (ACC, c_name), head_out, dt))
        if not ops:
            ops.append(EwOp("Identity", (ACC,), head_out, dt))
        for n in ew_nodes:
            ops.append(self.ew._to_op(n, consts))
            m = onnx.NodeProto()
            m.CopyFrom(n)
            body.append(m)
        all_extras = pre_extras + list(zip(extras, kinds))
        if len(all_extras) > MAX_EXTRAS:
            raise _Reject("too many epilogue inputs")
        all_extras += self._lifted_scalars(ops, consts, len(all_extras))
        params.extra_kinds = [k for _, k in all_extras]
        # A bias or Gemm's C never has a batch dimension.
        params.extra_nstride = [0] * len(pre_extras) + [self._nstride(x, k, out_shape, params.op)
                                                        for x, k in zip(extras, kinds)]
        params.extra_nstride += [0] * (len(all_extras) - len(params.extra_nstride))  # the lifted scalars
        params.body = body
        used = {x for m in members for x in idx.nodes[m].input}
        params.orig_consts = [numpy_helper.from_array(self.materialized[x], x) for x in sorted(used)
                              if x in self.materialized]
        prog = EwProgram(inputs=[Value(ACC, dt)] + [Value(x, dt) for x, _ in all_extras],
                         consts=consts, ops=ops, outputs=[Value(o, dt) for o in outputs])
        kind = self.kind_names[params.op]
        region = Region(kind, [idx.nodes[m] for m in members], inputs + [x for x, _ in all_extras], outputs, prog,
                        list(out_shape))
        region.params = params
        return region

    def _lifted_scalars(self, ops: list[EwOp], consts: dict, taken: int) -> list[tuple[str, int]]:
        """The learned one-element constants of the epilogue's arithmetic (PP-LCNet's per-layer scale and bias after
        every convolution), as SCALAR inputs read at run time rather than folded into the code, while MAX_EXTRAS
        allows: layers that differ only in them then share one compiled tile set (PP-OCRv4 det compiled 99 sets, 67
        s of its 65 s optimize time on two cores, for 35 distinct ones). Constants with few binary digits (0, 1, 3,
        6, 0.5) stay in the code, where LLVM may fold them; a runtime scalar costs one broadcast load a row."""
        lifted: list[tuple[str, int]] = []
        for op in ops:
            if op.op not in LIFTED_OPS:
                continue
            for x in op.args:
                c = consts.get(x)
                if c is None or c[1] != "float32" or _few_digits(c[0]) or x not in self.ew.inits:
                    continue
                if taken + len(lifted) >= MAX_EXTRAS:
                    return lifted
                del consts[x]
                lifted.append((x, SCALAR))
        return lifted

    def _nstride(self, x, kind, out_shape, op) -> int:
        s = self.ew.shape_of(x)
        r = len(out_shape)
        full = (1,) * (r - len(s)) + tuple(s)
        if kind in (SCALAR, COLUMN):
            return 0
        if op == "matmul":
            # Batch items are everything before the last two dims.
            batch_dims = full[:-2]
            if all(d == 1 for d in batch_dims):
                return 0
            if tuple(batch_dims) != tuple(out_shape[:-2]):
                raise _Reject("an epilogue input broadcasts over part of the batch")
            return 1
        return 0 if full[0] == 1 else 1

    def _conv(self, node, bn, params, head_out, uid):
        w = self._const(node.input[1]).astype(np.float32)
        bias = self._const(node.input[2]).astype(np.float32) if len(node.input) > 2 and node.input[2] else None
        oc, icg, kh, kw = w.shape
        if bn is not None:
            scale, b_bn, mean, var = (self._const(x).astype(np.float64) for x in bn.input[1:5])
            eps = float(_attr(bn, "epsilon", 1e-5))
            s = scale / np.sqrt(var + eps)
            w = (w.astype(np.float64) * s[:, None, None, None]).astype(np.float32)
            b0 = bias.astype(np.float64) if bias is not None else np.zeros(oc)
            bias = ((b0 - mean) * s + b_bn).astype(np.float32)
        params.weights = w
        groups = int(_attr(node, "group", 1))
        ocg = oc // groups
        mb = -(-ocg // self.mi)
        k = icg * kh * kw
        padded = np.zeros((groups, mb * self.mi, k), np.float32)
        padded[:, :ocg, :] = w.reshape(groups, ocg, k)
        packed = np.ascontiguousarray(padded.reshape(groups, mb, self.mi, k).transpose(0, 1, 3, 2))
        wname = f"{uid}__packed_w"
        params.initializers.append(numpy_helper.from_array(packed, wname))
        bname = None
        if bias is not None:
            bname = f"{uid}__bias"
            params.initializers.append(numpy_helper.from_array(bias, bname))
        strides = list(_attr(node, "strides", [1, 1]))
        dil = list(_attr(node, "dilations", [1, 1]))
        pads = list(_attr(node, "pads", [0, 0, 0, 0]))
        auto = _attr(node, "auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        params.attrs = ComputeAttrs(oc=oc, groups=groups, kernel=(kh, kw), strides=tuple(strides), dilations=tuple(dil),
                                    pads=(pads[0], pads[1], pads[2], pads[3]) if auto in ("NOTSET", "VALID")
                                    else (0, 0, 0, 0),
                                    auto_pad={"SAME_UPPER": 1, "SAME_LOWER": 2}.get(auto, 0), ic_g=icg,
                                    packed_shape=packed.shape)
        # The fallback: unpack the weights, then the original convolution (BatchNorm already folded in).
        def const(name, arr):
            return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, np.int64),
                                                                                          name))
        u = f"{uid}__unpack"
        body = [
            helper.make_node("Transpose", [wname], [f"{u}_t"], perm=[0, 1, 3, 2]),
            const(f"{u}_s1", [groups, mb * self.mi, k]),
            helper.make_node("Reshape", [f"{u}_t", f"{u}_s1"], [f"{u}_r"]),
            *((const(f"{u}_starts", [0]), const(f"{u}_ends", [ocg]), const(f"{u}_axes", [1]),
               helper.make_node("Slice", [f"{u}_r", f"{u}_starts", f"{u}_ends", f"{u}_axes"], [f"{u}_sl"]))
              if self.ew.opset >= 10 else  # Slice took attributes before opset 10
              (helper.make_node("Slice", [f"{u}_r"], [f"{u}_sl"], starts=[0], ends=[ocg], axes=[1]),)),
            const(f"{u}_s2", [oc, icg, kh, kw]),
            helper.make_node("Reshape", [f"{u}_sl", f"{u}_s2"], [f"{u}_w"]),
        ]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        conv_in = [node.input[0], f"{u}_w"] + ([bname] if bname else [])
        body.append(helper.make_node("Conv", conv_in, [head_out], name=node.name, **attrs))
        return [node.input[0], wname], body, bname

    def _matmul(self, node, params, head_out, uid, out_shape):
        trans_a = 0
        c_name, c_kind = None, None
        if node.op_type == "MatMul":
            params.attrs = ComputeAttrs(trans_a=0)
            packed = self._packed_b(node.input[1], node.input[0], params, uid, head_out, node.name)
            if packed is not None:
                return *packed, None, None
            m = onnx.NodeProto()
            m.CopyFrom(node)
            return [node.input[0], node.input[1]], [m], None, None
        alpha = float(_attr(node, "alpha", 1.0))
        beta = float(_attr(node, "beta", 1.0))
        trans_a = int(_attr(node, "transA", 0))
        trans_b = int(_attr(node, "transB", 0))
        b_name = node.input[1]
        b = self._const(b_name)
        if b is not None and (trans_b or alpha != 1.0):
            b = (b.T if trans_b else b).astype(np.float32) * np.float32(alpha)
            b_name = f"{uid}__b"
            params.initializers.append(numpy_helper.from_array(np.ascontiguousarray(b), b_name))
        c = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if c is not None:
            cv = self._const(c)
            if cv is not None and beta != 1.0:
                c_name = f"{uid}__c"
                params.initializers.append(numpy_helper.from_array((cv * np.float32(beta)).astype(np.float32),
                                                                   c_name))
            else:
                c_name = c
            c_kind = self._epilogue_kind(c, out_shape, "matmul")
            if c_kind is None:
                raise _Reject("Gemm's C does not broadcast as a row, a column or the whole output")
        params.attrs = ComputeAttrs(trans_a=trans_a)
        if not trans_a:
            packed = self._packed_b(b_name, node.input[0], params, uid, head_out, node.name, b, c_name)
            if packed is not None:
                return *packed, c_name, c_kind
        gemm_in = [node.input[0], b_name] + ([c_name] if c_name else [])
        body = [helper.make_node("Gemm", gemm_in, [head_out], name=node.name, transA=trans_a)]
        # The epilogue adds C itself; the Gemm node's inputs are only A and B.
        return [node.input[0], b_name], body, c_name, c_kind


    def _packed_b(self, b_name, a_name, params, uid, head_out, node_name, value=None, gemm_c=None):
        """A constant 2-D B packed in zero-padded panels for the micro-kernel, [ceil(N / P)][K][P] (P = `panel`
        columns: whole vectors, so the kernel's loads need no masks and read one contiguous run per k), with the
        fallback that unpacks it and multiplies (a Gemm adding `gemm_c` where a Gemm's C is given); None when B is
        not such a constant or packing is off."""
        if not self.panel:
            return None
        b = value if value is not None else self._const(b_name)
        if b is None or b.ndim != 2 or self.ew.dtype_of(b_name) not in ("float32", None):
            return None
        k, n = b.shape
        p = self.panel
        pn = -(-n // p)
        padded = np.zeros((k, pn * p), np.float32)
        padded[:, :n] = b
        packed = np.ascontiguousarray(padded.reshape(k, pn, p).transpose(1, 0, 2))
        wname = f"{uid}__packed_b"
        params.initializers.append(numpy_helper.from_array(packed, wname))
        params.attrs.packed_b, params.attrs.n = p, n
        u = f"{uid}__unpack"

        def const(name, arr):
            return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, np.int64),
                                                                                          name))
        body = [helper.make_node("Transpose", [wname], [f"{u}_t"], perm=[1, 0, 2]),
                const(f"{u}_s", [k, pn * p]),
                helper.make_node("Reshape", [f"{u}_t", f"{u}_s"], [f"{u}_r"])]
        full = f"{u}_r"
        if pn * p != n:
            full = f"{u}_b"
            if self.ew.opset >= 10:
                body += [const(f"{u}_starts", [0]), const(f"{u}_ends", [n]), const(f"{u}_axes", [1]),
                         helper.make_node("Slice", [f"{u}_r", f"{u}_starts", f"{u}_ends", f"{u}_axes"], [full])]
            else:  # Slice took attributes before opset 10
                body.append(helper.make_node("Slice", [f"{u}_r"], [full], starts=[0], ends=[n], axes=[1]))
        if gemm_c:
            body.append(helper.make_node("Gemm", [a_name, full, gemm_c], [head_out], name=node_name))
        else:
            body.append(helper.make_node("MatMul", [a_name, full], [head_out], name=node_name))
        return [a_name, wname], body


def conv_geometry_reason(node, w_shape, in_channels: int, out_shape) -> str | None:
    """What makes a convolution's attributes or weights inconsistent (onnxruntime loads such a model and fails only
    when it runs it): a group that does not divide the channels, kernel_shape unlike the weights, strides or
    dilations below 1, negative pads, an output with no positions. None when they are consistent."""
    groups = int(_attr(node, "group", 1))
    if groups < 1:
        return f"group {groups} is not a positive number"
    oc, icg = (w_shape[0], w_shape[1]) if node.op_type == "Conv" else (w_shape[1] * groups, w_shape[0] // groups)
    if w_shape[0] % groups or in_channels != icg * groups or oc % groups:
        return f"group {groups} does not fit {in_channels} input channels and weights {list(w_shape)}"
    ks = _attr(node, "kernel_shape", None)
    if ks is not None and list(ks) != list(w_shape[2:]):
        return f"kernel_shape {list(ks)} differs from the weights' {list(w_shape[2:])}"
    if any(s < 1 for s in _attr(node, "strides", [1, 1])) or any(d < 1 for d in _attr(node, "dilations", [1, 1])):
        return "strides and dilations must be 1 or more"
    if any(p < 0 for p in _attr(node, "pads", [0, 0, 0, 0])) or any(p < 0 for p in _attr(node, "output_padding", [])):
        return "negative pads"
    if out_shape is not None and any(isinstance(d, int) and d <= 0 for d in out_shape):
        return f"the output shape {list(out_shape)} has no positions"
    return None


class _Reject(Exception):
    pass


def pack_weights(w: np.ndarray, groups: int, mi: int) -> np.ndarray:
    """Conv weights [oc, ic_g, kh, kw] -> the micro-kernel's [groups][ceil(oc_g / mi)][ic_g * kh * kw][mi], rows
    past oc_g zero (what ComputeRule._conv stores)."""
    oc = np.shape(w)[0]
    w = np.asarray(w, np.float32).reshape(groups, oc // groups, -1)
    _, ocg, k = w.shape
    mb = -(-ocg // mi)
    padded = np.zeros((groups, mb * mi, k), np.float32)
    padded[:, :ocg, :] = w
    return np.ascontiguousarray(padded.reshape(groups, mb, mi, k).transpose(0, 1, 3, 2))


def apply_tile(region: Region, tile) -> Region:
    """Give a compute region's kernel another register tile, in place: a convolution's weights are repacked for
    the tile's MI (they are packed [groups][ceil(oc_g / MI)][K][MI]) and the function fallback's unpack shape is
    rebuilt to match; a matmul reads A through strides and needs nothing else. The op type is recomputed (the tile
    is part of it). Returns the region."""
    from dataclasses import replace

    c = region.compute
    if c is None:
        raise ValueError("only compute regions have a register tile")
    new = replace(c, tile=tile, attrs=replace(c.attrs), initializers=list(c.initializers), body=list(c.body))
    if c.op == "conv":
        if c.attrs.in_blocked or c.attrs.out_blocked:
            raise ValueError("a blocked-layout convolution has its own tile")
        wname = region.inputs[1]
        old = next((t for t in c.initializers if t.name == wname), None)
        if old is None or not wname.endswith("__packed_w"):
            raise ValueError(f"no packed weights {wname} in the region")
        packed = numpy_helper.to_array(old)  # [groups, mb, k, mi0]
        groups, mb0, k, mi0 = packed.shape
        ocg = c.attrs.oc // groups
        w = packed.transpose(0, 1, 3, 2).reshape(groups, mb0 * mi0, k)[:, :ocg, :].reshape(groups * ocg, k)
        repacked = pack_weights(w, groups, tile.mi)
        new.initializers = [numpy_helper.from_array(repacked, wname) if t.name == wname else t
                            for t in c.initializers]
        new.attrs.packed_shape = repacked.shape
        # The fallback reshapes the transposed packed weights to [groups, mb * MI, k] before slicing oc_g rows.
        s1 = wname[:-len("__packed_w")] + "__unpack_s1"
        shape = numpy_helper.from_array(np.asarray([groups, repacked.shape[1] * tile.mi, k], np.int64), s1)
        hits = [i for i, n in enumerate(c.body) if n.op_type == "Constant" and list(n.output) == [s1]]
        if len(hits) != 1:
            raise ValueError(f"the fallback has no unpack shape {s1}")
        new.body[hits[0]] = helper.make_node("Constant", [], [s1], value=shape)
    elif c.attrs.packed_b and tile.ni * tile.lanes != c.attrs.packed_b:
        _repack_panels(region, new, tile.ni * tile.lanes)
    region.params = new
    region.compute_op_type(region.op_type_key)
    return region


def _repack_panels(region: Region, new, panel: int) -> None:
    """A packed-B matmul's float32 panels [ceil(N / P)][K][P] repacked for panels of `panel` columns (another
    register tile's NI), with the function fallback's unpack shape to match (ComputeRule._packed_b)."""
    c = region.compute
    if c.attrs.b_dtype is not None or c.attrs.stored_dtype is not None:
        raise ValueError("only float32 panels are repacked for another register tile")
    wname = region.inputs[1]
    old = next((t for t in c.initializers if t.name == wname), None)
    if old is None or not wname.endswith("__packed_b"):
        raise ValueError(f"no packed B {wname} in the region")
    packed = numpy_helper.to_array(old)
    pn0, k, p0 = packed.shape
    n = int(c.attrs.n)
    b = packed.transpose(1, 0, 2).reshape(k, pn0 * p0)[:, :n]
    pn = -(-n // panel)
    padded = np.zeros((k, pn * panel), np.float32)
    padded[:, :n] = b
    repacked = np.ascontiguousarray(padded.reshape(k, pn, panel).transpose(1, 0, 2))
    new.initializers = [numpy_helper.from_array(repacked, wname) if t.name == wname else t for t in c.initializers]
    new.attrs.packed_b = panel
    s_name = wname[:-len("__packed_b")] + "__unpack_s"
    hits = [i for i, nd in enumerate(c.body) if nd.op_type == "Constant" and list(nd.output) == [s_name]]
    if len(hits) != 1:
        raise ValueError(f"the fallback has no unpack shape {s_name}")
    shape = numpy_helper.from_array(np.asarray([k, pn * panel], np.int64), s_name)
    new.body[hits[0]] = helper.make_node("Constant", [], [s_name], value=shape)
    u = s_name[:-len("_s")]
    if pn * panel != n and not any(nd.op_type == "Slice" for nd in new.body):  # the padding is new: cut it off
        def const(name, arr):
            return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, np.int64),
                                                                                          name))
        at = next(i for i, nd in enumerate(new.body) if list(nd.output) == [f"{u}_r"]) + 1
        new.body[at:at] = [const(f"{u}_starts", [0]), const(f"{u}_ends", [n]), const(f"{u}_axes", [1]),
                           helper.make_node("Slice", [f"{u}_r", f"{u}_starts", f"{u}_ends", f"{u}_axes"], [f"{u}_b"])]
        for i, nd in enumerate(new.body):
            if nd.op_type in ("MatMul", "Gemm") and f"{u}_r" in nd.input:
                nd2 = onnx.NodeProto()
                nd2.CopyFrom(nd)
                nd2.input[list(nd.input).index(f"{u}_r")] = f"{u}_b"
                new.body[i] = nd2


def retile(region: Region, tile) -> Region:
    """A copy of a compute region whose kernel uses `tile` (see apply_tile); the region itself is unchanged."""
    from dataclasses import replace

    return apply_tile(replace(region, measured={}, rejected=None), tile)


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even (vcvtneps2bf16's rounding)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bfloat16_values(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 and widened back (what the bfloat16 kernels multiply)."""
    return (bfloat16_bits(x).astype(np.uint32) << 16).view(np.float32)


def in_pairs(packed: np.ndarray, k_step: int = 2) -> np.ndarray:
    """Packed float32 panels [pn][K][P] in pairs along K, [pn][K2/2][P][2]: the two k of a pair side by side in each
    column (vdpbf16ps's operand, and AMX's B tile rows), K2 = K rounded up to a multiple of `k_step` (2, or an AMX
    step of 32) with zero rows."""
    pn, k, p = packed.shape
    if k % k_step:
        pad = k_step - k % k_step
        packed = np.concatenate([packed, np.zeros((pn, pad, p), packed.dtype)], axis=1)
        k += pad
    return np.ascontiguousarray(packed.reshape(pn, k // 2, 2, p).transpose(0, 1, 3, 2))


def bfloat16_pairs(packed: np.ndarray, k_step: int = 2) -> np.ndarray:
    """Packed float32 panels [pn][K][P] as the bfloat16 tiles read them: bit patterns [pn][K2/2][P][2] (in_pairs)."""
    return bfloat16_bits(in_pairs(packed, k_step))


def bfloat16_weights(name: str, bits: np.ndarray, dims, opset: int, out: str):
    """A bfloat16 initializer `name` holding `bits` (uint16 bit patterns) under `dims`, and the function fallback's
    nodes that read it as float32 into `out`. From opset 13 it is a BFLOAT16 tensor and one Cast. Before, Cast has no
    bfloat16, so it is stored as UINT16 (the same bits: the glue takes either type) and decoded by arithmetic exact
    for every finite bfloat16: sign, 8-bit exponent e and 7-bit mantissa m as (m + 128 [e > 0]) * 2^(max(e, 1) - 134).
    """
    if opset >= 13:
        return (helper.make_tensor(name, onnx.TensorProto.BFLOAT16, dims, bits.tobytes(), raw=True),
                [helper.make_node("Cast", [name], [out], to=onnx.TensorProto.FLOAT)])
    tensor = numpy_helper.from_array(np.ascontiguousarray(bits, np.uint16).reshape(dims), name)
    u = f"{name}__decode"

    def f32(label, value):
        return helper.make_node("Constant", [], [f"{u}_{label}"],
                                value=numpy_helper.from_array(np.asarray(value, np.float32), f"{u}_{label}"))
    n = helper.make_node
    nodes = [f32("c2", 2.0 ** -15), f32("c32k", 32768.0), f32("c7", 2.0 ** -7), f32("c128", 128.0),
             f32("one", 1.0), f32("two", 2.0), f32("c134", 134.0),
             n("Cast", [name], [f"{u}_f"], to=onnx.TensorProto.FLOAT),
             n("Mul", [f"{u}_f", f"{u}_c2"], [f"{u}_s0"]), n("Floor", [f"{u}_s0"], [f"{u}_sign"]),  # 0 or 1
             n("Mul", [f"{u}_sign", f"{u}_c32k"], [f"{u}_s1"]), n("Sub", [f"{u}_f", f"{u}_s1"], [f"{u}_r"]),
             n("Mul", [f"{u}_r", f"{u}_c7"], [f"{u}_e0"]), n("Floor", [f"{u}_e0"], [f"{u}_e"]),
             n("Mul", [f"{u}_e", f"{u}_c128"], [f"{u}_e1"]), n("Sub", [f"{u}_r", f"{u}_e1"], [f"{u}_m"]),
             n("Min", [f"{u}_e", f"{u}_one"], [f"{u}_normal"]), n("Mul", [f"{u}_normal", f"{u}_c128"], [f"{u}_h"]),
             n("Add", [f"{u}_m", f"{u}_h"], [f"{u}_mant"]), n("Max", [f"{u}_e", f"{u}_one"], [f"{u}_e2"]),
             n("Sub", [f"{u}_e2", f"{u}_c134"], [f"{u}_x"]), n("Pow", [f"{u}_two", f"{u}_x"], [f"{u}_p"]),
             n("Mul", [f"{u}_mant", f"{u}_p"], [f"{u}_abs"]),
             n("Mul", [f"{u}_sign", f"{u}_two"], [f"{u}_s2"]), n("Sub", [f"{u}_one", f"{u}_s2"], [f"{u}_sgn"]),
             n("Mul", [f"{u}_abs", f"{u}_sgn"], [out])]
    return tensor, nodes


FLOAT16_MAX = 65504.0


def store_weights_f16(region: Region) -> str | None:
    """Keep a convolution's or packed-B matmul's float32 kernel but store its weights (op input 1) as float16
    (`--precision fp16` where the target's kernels have no float16 instruction), in place: they are rounded to
    float16 values now, so the checks and timings of the build see what the written file holds, and emit/model.py
    writes them once as float16 with a Cast outside the op, which onnxruntime's constant folding turns back into
    float32 when a session loads the model. The file's weights halve and the kernel runs at the float32 rate:
    widening float16 inside the kernels' loops cost FMA throughput (on a Sapphire Rapids: YOLOv8n 0.78x of float32,
    MiniLM's GEMMs 0.87-0.99x of onnxruntime's, so none was kept). Returns why the weights stay float32 (a weight
    past float16's 65504 among them), or None when stored so."""
    c = region.compute
    if c is None or not (c.op == "conv" or (c.op == "matmul" and c.attrs.packed_b)):
        return "float32 (fp16 storage takes convolutions and matmuls with packed constant weights)"
    if c.attrs.b_dtype is not None or c.attrs.stored_dtype is not None:
        return None if "float16" in (c.attrs.b_dtype, c.attrs.stored_dtype) else \
            f"its weights are already stored as {c.attrs.b_dtype}"
    name = region.inputs[1] if len(region.inputs) > 1 else None
    init = next((t for t in c.initializers if t.name == name), None)
    if init is None or init.data_type != onnx.TensorProto.FLOAT:
        return "no float32 weights of its own in the region"
    w = numpy_helper.to_array(init)
    if not np.all(np.isfinite(w)):
        return "the weights have values that are not finite"
    big = float(np.max(np.abs(w))) if w.size else 0.0
    if big > FLOAT16_MAX:
        return f"{c.op}: float32 (a weight of magnitude {big:.4g} is past float16's 65504)"
    rounded = w.astype(np.float16).astype(np.float32)
    c.initializers = [numpy_helper.from_array(rounded, name) if t.name == name else t for t in c.initializers]
    c.attrs.stored_dtype = "float16"
    return None


def lower_packed_b(region: Region, b_dtype: str, opset: int, k_step: int = 2) -> str | None:
    """Store a matmul region's packed constant B as `b_dtype` ("bfloat16" or "float16") for the low-precision
    packed-B tiles (codegen/microkernel/outer_product.py), in place; the function fallback casts it back to float32
    first, so the weights are stored once. Returns why the region keeps float32 weights, or None when lowered.

    bfloat16 is stored in pairs along K, [ceil(N / P)][K2/2][P][2] under the shape [ceil(N / P)][K2][P], K2 = K
    rounded up to a multiple of `k_step` with zero rows (vdpbf16ps multiplies a pair per lane; AMX tiles take 32 K
    a step: driver/precision.py; the glue reads K2 from the shape); float16 only for AMX-FP16 tiles (`k_step` an
    AMX step), in pairs as bfloat16 is, and only when every weight is within float16's range."""
    c = region.compute
    if c is None or c.op in ("conv", "conv_transpose", "afusion", "siblings"):
        return "conv: float32, bf16 not lowered yet"
    if c.op != "matmul" or not c.attrs.packed_b:
        return "B is not a constant matrix packed for the kernel"
    if c.attrs.b_dtype is not None:
        return None if c.attrs.b_dtype == b_dtype else f"B is already stored as {c.attrs.b_dtype}"
    if opset < 11:
        return f"opset {opset}: the fallback's decoding of {b_dtype} needs opset 11"
    wname = next((t.name for t in c.initializers if t.name.endswith("__packed_b")), None)
    if wname is None:
        return "no packed B in the region"
    packed = numpy_helper.to_array(next(t for t in c.initializers if t.name == wname))
    pn, k, p = packed.shape
    if not np.all(np.isfinite(packed)):
        return "B has values that are not finite"
    if b_dtype not in ("bfloat16", "float16"):
        raise ValueError(f"no low-precision B as {b_dtype}")
    if b_dtype == "float16" and k_step <= 2:  # outside AMX-FP16 tiles float16 is only stored (store_weights_f16)
        return "float16 weights are read only by AMX-FP16 tiles"
    if b_dtype == "float16":
        big = float(np.max(np.abs(packed))) if packed.size else 0.0
        if big > FLOAT16_MAX:
            return f"a weight of magnitude {big:.4g} is past float16's 65504"
    u = f"{wname}__cast"
    k2 = -(-k // k_step) * k_step
    if b_dtype == "bfloat16":
        tensor, body = bfloat16_weights(wname, bfloat16_pairs(packed, k_step), (pn, k2, p), opset, f"{u}_f")
    else:
        tensor = numpy_helper.from_array(in_pairs(packed, k_step).astype(np.float16).reshape(pn, k2, p), wname)
        body = [helper.make_node("Cast", [wname], [f"{u}_f"], to=onnx.TensorProto.FLOAT)]

    def const(name, arr):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, np.int64), name))
    body += [const(f"{u}_s4", [pn, k2 // 2, p, 2]),
             helper.make_node("Reshape", [f"{u}_f", f"{u}_s4"], [f"{u}_r4"]),
             helper.make_node("Transpose", [f"{u}_r4"], [f"{u}_t"], perm=[0, 1, 3, 2]),
             const(f"{u}_s3", [pn, k2, p]),
             helper.make_node("Reshape", [f"{u}_t", f"{u}_s3"], [f"{u}_w"])]
    unpacked = f"{u}_w"
    if k2 != k:  # the padding's zero rows
        body += [const(f"{u}_starts", [0]), const(f"{u}_ends", [k]), const(f"{u}_axes", [1]),
                 helper.make_node("Slice", [unpacked, f"{u}_starts", f"{u}_ends", f"{u}_axes"], [f"{u}_k"])]
        unpacked = f"{u}_k"
    for node in c.body:
        for i, x in enumerate(node.input):
            if x == wname:
                node.input[i] = unpacked
    c.body[:0] = body
    c.initializers = [tensor if t.name == wname else t for t in c.initializers]
    c.attrs.b_dtype = b_dtype
    return None
