"""The kernel in LLVM IR, in one of two forms, each reduction in three passes as onnxruntime's MLAS does:

softmax:      m = max(row); y = exp(x - m) and s = sum(y); y *= 1 / s
log_softmax:  m = max(row); s = sum(exp(x - m));       y = (x - m) - log(s)

rows(x, y, count, n, inner): `count` rows of n contiguous floats (the innermost axis, or opset 1-12's trailing
dims); the vectors run along a row and are reduced across lanes at its end.
columns(x, y, count, n, inner): `count` adjacent columns of an axis that is not the innermost (YOLOv8's DFL head
reduces axis 1 of [1, 16, 4, 8400]): element k of column c is x[c + k * inner]. The vectors run across columns, so
the three passes are lane-wise and need no transpose (onnxruntime transposes such an axis to the end and back).

Vectors of the target's float32 lanes; a tail runs the same code under a lane mask, so any length is one code path.
Maxima as x86's maxps computes them (x when x > y), the choice onnxruntime's kernels make.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.exp import vexp_nonpositive
from onnxopt.codegen.vmath.irutil import broadcast, for_range as _loop, masked_load, masked_store
from onnxopt.codegen.vmath.irutil import reduce_lanes as _reduce, when as _when
from onnxopt.codegen.vmath.log import vlog
from onnxopt.dtypes import dtype

from .desc import SoftmaxKernelDesc

F32 = ir.FloatType()  # the kernel's element type: it is written for float32 (build() checks the params' dtype)
I64 = ir.IntType(64)
I32 = ir.IntType(32)
PTR = ir.PointerType()


def _vmax(b, x, y):
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def _begin(module: ir.Module, name: str, lanes: int, vectorized: int):
    """The function f(x, y, count, n, inner), its builder, and the split of argument `vectorized` into whole vectors
    and a masked tail: (args, builder, vector type, step, whole part, remainder, tail mask)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, I64]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    length = fn.args[vectorized]
    step = ir.Constant(I64, lanes)
    full = b.mul(b.sdiv(length, step), step)
    rem = b.sub(length, full)
    iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    tail = b.icmp_signed("<", iota, broadcast(b, rem, lanes))
    return fn.args, b, ir.VectorType(F32, lanes), step, full, rem, tail


def define_rows(module: ir.Module, name: str, op: str, lanes: int) -> str:
    (x, y, rows, n, _inner), b, vty, step, full, rem, tail = _begin(module, name, lanes, 3)  # along each row
    minus_inf = ir.Constant(vty, [float("-inf")] * lanes)
    zeros = ir.Constant(vty, [0.0] * lanes)

    def at(base, j):
        return b.gep(base, [j], source_etype=F32)

    def load(p):
        return b.load(p, typ=vty, align=4)

    def row(r, _):
        xr = at(x, b.mul(r, n))
        yr = at(y, b.mul(r, n))
        (vm,) = _loop(b, ir.Constant(I64, 0), full, step, lambda j, a: [_vmax(b, a[0], load(at(xr, j)))], [minus_inf])
        has_tail = b.icmp_signed("!=", rem, ir.Constant(I64, 0))
        (vm,) = _when(b, has_tail, lambda a: [_vmax(b, a[0], b.select(tail, masked_load(b, at(xr, full), vty, tail, 4),
                                                                       minus_inf))], [vm])
        m = _reduce(b, vm, _vmax)
        mv = broadcast(b, m, lanes)

        def exp_sum(j, a, masked=False):
            v = masked_load(b, at(xr, j), vty, tail, 4) if masked else load(at(xr, j))
            e = vexp_nonpositive(b, b.fsub(v, mv))  # v - max <= 0
            if op == "softmax":
                if masked:
                    masked_store(b, e, at(yr, j), tail, 4)
                else:
                    b.store(e, at(yr, j), align=4)
            return [b.fadd(a[0], b.select(tail, e, zeros) if masked else e)]

        (vs,) = _loop(b, ir.Constant(I64, 0), full, step, exp_sum, [zeros])
        (vs,) = _when(b, has_tail, lambda a: exp_sum(full, a, masked=True), [vs])
        s = _reduce(b, vs, lambda bb, p, q: bb.fadd(p, q))
        if op == "softmax":
            inv = broadcast(b, b.fdiv(ir.Constant(F32, 1.0), s), lanes)

            def scale(j, _a, masked=False):
                if masked:
                    masked_store(b, b.fmul(masked_load(b, at(yr, j), vty, tail, 4), inv), at(yr, j), tail, 4)
                else:
                    b.store(b.fmul(load(at(yr, j)), inv), at(yr, j), align=4)
                return []

            _loop(b, ir.Constant(I64, 0), full, step, scale)
            _when(b, has_tail, lambda a: scale(full, a, masked=True))
        else:
            ls = vlog(b, broadcast(b, s, lanes))

            def shift(j, _a, masked=False):
                v = masked_load(b, at(xr, j), vty, tail, 4) if masked else load(at(xr, j))
                out = b.fsub(b.fsub(v, mv), ls)
                if masked:
                    masked_store(b, out, at(yr, j), tail, 4)
                else:
                    b.store(out, at(yr, j), align=4)
                return []

            _loop(b, ir.Constant(I64, 0), full, step, shift)
            _when(b, has_tail, lambda a: shift(full, a, masked=True))
        return []

    _loop(b, ir.Constant(I64, 0), rows, ir.Constant(I64, 1), row)
    b.ret_void()
    return name


def define_columns(module: ir.Module, name: str, op: str, lanes: int) -> str:
    (x, y, count, n, inner), b, vty, step, full, rem, tail = _begin(module, name, lanes, 2)  # across the columns
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)

    def block(c, masked):
        """Columns c .. c + lanes: the three passes down the axis, element k at k * inner."""
        def at(base, k):
            return b.gep(base, [b.add(c, b.mul(k, inner))], source_etype=F32)

        def load(base, k):
            return masked_load(b, at(base, k), vty, tail, 4) if masked else b.load(at(base, k), typ=vty, align=4)

        def store(v, base, k):
            if masked:
                masked_store(b, v, at(base, k), tail, 4)
            else:
                b.store(v, at(base, k), align=4)

        (m,) = _loop(b, zero, n, one, lambda k, a: [_vmax(b, a[0], load(x, k))],
                     [ir.Constant(vty, [float("-inf")] * lanes)])

        def exp_sum(k, a):
            e = vexp_nonpositive(b, b.fsub(load(x, k), m))  # x - max <= 0
            if op == "softmax":
                store(e, y, k)
            return [b.fadd(a[0], e)]

        (s,) = _loop(b, zero, n, one, exp_sum, [ir.Constant(vty, [0.0] * lanes)])
        if op == "softmax":
            inv = b.fdiv(ir.Constant(vty, [1.0] * lanes), s)
            _loop(b, zero, n, one, lambda k, _a: store(b.fmul(load(y, k), inv), y, k) or [])
        else:
            ls = vlog(b, s)
            _loop(b, zero, n, one, lambda k, _a: store(b.fsub(b.fsub(load(x, k), m), ls), y, k) or [])
        return []

    _loop(b, zero, full, step, lambda c, _a: block(c, False))
    _when(b, b.icmp_signed("!=", rem, zero), lambda _a: block(full, True))
    b.ret_void()
    return name


def build(region, target: Target) -> tuple[bytes, SoftmaxKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    elem = dtype(p.dtype)
    if elem.memory != F32:
        raise ValueError(f"the softmax row kernel is written for float32 rows, not {elem.name}")
    module = new_module(target, region.op_type)
    form, define = ("columns", define_columns) if p.columns else ("rows", define_rows)
    sym = define(module, f"{region.op_type}_{form}", p.op, p.lanes or target.float32_lanes)
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    desc = SoftmaxKernelDesc(op_type=region.op_type, in_types=[elem.onnx], out_types=[elem.onnx], axis=p.axis,
                             columns=p.columns, rows=sym)
    return obj, desc, ir_text
