"""The row kernel in LLVM IR: rows(x, r, gamma, beta, y, sum, rows, n), each row of n floats in three passes over
memory that stays in L1 (a transformer's row is 1-4 KiB):

    v = x (+ r), written to `sum` (or to y) where the kernel has a residual; mean = sum(v) / n
    var = sum((v - mean)^2) / n                                  two passes: no cancellation of E[v^2] - mean^2
    y = (v - mean) * (1 / sqrt(var + epsilon)) * gamma (+ beta)

Vectors of the target's float32 lanes; the row's tail runs the same code under a lane mask.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.irutil import broadcast, for_range, intrinsic, masked_load, masked_store, reduce_lanes
from onnxopt.codegen.vmath.irutil import when
from onnxopt.dtypes import dtype

from .desc import LayerNormKernelDesc

F32 = ir.FloatType()  # the kernel's element type: it is written for float32 (build() checks the params' dtype)
I64 = ir.IntType(64)
PTR = ir.PointerType()


def define_rows(module: ir.Module, name: str, params, lanes: int) -> str:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, PTR, PTR, PTR, I64, I64]), name=name)
    x, r, gamma, beta, y, sum_out, rows, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vty = ir.VectorType(F32, lanes)
    step = ir.Constant(I64, lanes)
    zero_i = ir.Constant(I64, 0)
    full = b.mul(b.sdiv(n, step), step)
    rem = b.sub(n, full)
    has_tail = b.icmp_signed("!=", rem, zero_i)
    iota = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
    tail = b.icmp_signed("<", iota, broadcast(b, rem, lanes))
    zeros = ir.Constant(vty, [0.0] * lanes)
    inv_n = b.fdiv(ir.Constant(F32, 1.0), b.sitofp(n, F32))

    def at(base, j):
        return b.gep(base, [j], source_etype=F32)

    def load(p, masked):
        return masked_load(b, p, vty, tail, 4) if masked else b.load(p, typ=vty, align=4)

    def store(v, p, masked):
        if masked:
            masked_store(b, v, p, tail, 4)
        else:
            b.store(v, p, align=4)

    def add(bb, p, q):
        return bb.fadd(p, q)

    def pass_over(body, acc=None):
        """body(j, masked, acc) over the row's whole vectors, then its masked tail; returns the reduced acc."""
        carried = [acc] if acc is not None else []
        out = for_range(b, zero_i, full, step, lambda j, a: body(j, False, a), carried)
        out = when(b, has_tail, lambda a: body(full, True, a), out)
        return reduce_lanes(b, out[0], add) if acc is not None else None

    def row(ri, _):
        off = b.mul(ri, n)
        xr, yr = at(x, off), at(y, off)
        if params.residual:
            vr = at(sum_out, off) if params.sum_output else yr  # v is kept here for the next passes
            rr = at(r, off)

            def first(j, masked, a):
                v = b.fadd(load(at(xr, j), masked), load(at(rr, j), masked))
                store(v, at(vr, j), masked)
                return [b.fadd(a[0], b.select(tail, v, zeros) if masked else v)]
        else:
            vr = xr

            def first(j, masked, a):
                v = load(at(xr, j), masked)
                return [b.fadd(a[0], b.select(tail, v, zeros) if masked else v)]

        mean = broadcast(b, b.fmul(pass_over(first, zeros), inv_n), lanes)

        def deviation(j, masked, a):
            dv = b.fsub(load(at(vr, j), masked), mean)
            sq = b.fmul(dv, dv)
            return [b.fadd(a[0], b.select(tail, sq, zeros) if masked else sq)]

        var = b.fmul(pass_over(deviation, zeros), inv_n)
        std = intrinsic(b, "llvm.sqrt.f32", F32, [b.fadd(var, ir.Constant(F32, params.epsilon))])
        rstd = broadcast(b, b.fdiv(ir.Constant(F32, 1.0), std), lanes)

        def normalize(j, masked, _a):
            v = b.fmul(b.fmul(b.fsub(load(at(vr, j), masked), mean), rstd), load(at(gamma, j), masked))
            if params.has_bias:
                v = b.fadd(v, load(at(beta, j), masked))
            store(v, at(yr, j), masked)
            return []

        pass_over(normalize)
        return []

    for_range(b, zero_i, rows, ir.Constant(I64, 1), row)
    b.ret_void()
    return name


def build(region, target: Target) -> tuple[bytes, LayerNormKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    elem = dtype(p.dtype)
    if elem.memory != F32:
        raise ValueError(f"the layernorm row kernel is written for float32 rows, not {elem.name}")
    module = new_module(target, region.op_type)
    sym = define_rows(module, f"{region.op_type}_rows", p, p.lanes or target.float32_lanes)
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    desc = LayerNormKernelDesc(op_type=region.op_type, in_types=[elem.onnx] * len(region.inputs),
                               out_types=[elem.onnx] * len(region.outputs), residual=p.residual,
                               sum_output=p.sum_output, has_bias=p.has_bias, rows=sym)
    return obj, desc, ir_text
