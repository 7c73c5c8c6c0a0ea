"""The QDQ GlobalAveragePool's kernel in LLVM IR: sums(x, out, planes, hw), each plane's hw int8 values summed
exactly into an int32 (zero- or sign-extended, 16 lanes at a time, the plane's tail one by one). The requantization
of the N x C sums is the glue's (exec.c): too few values to be worth vectors."""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.irutil import for_range, reduce_lanes
from onnxopt.dtypes import dtype

from .desc import QGapKernelDesc

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
LANES = 16


def define_sums(module: ir.Module, name: str, signed: bool) -> str:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]), name=name)
    x, out, planes, hw = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    widen = b.sext if signed else b.zext
    bty, ity = ir.VectorType(I8, LANES), ir.VectorType(I32, LANES)
    step = ir.Constant(I64, LANES)
    full = b.mul(b.sdiv(hw, step), step)

    def plane(p, _):
        base = b.gep(x, [b.mul(p, hw)], source_etype=I8)
        (acc,) = for_range(b, ir.Constant(I64, 0), full, step, lambda i, a: [b.add(a[0], widen(
            b.load(b.gep(base, [i], source_etype=I8), typ=bty, align=1), ity))], [ir.Constant(ity, [0] * LANES)])
        total = reduce_lanes(b, acc, lambda bb, u, v: bb.add(u, v))
        (total,) = for_range(b, full, hw, ir.Constant(I64, 1), lambda i, a: [b.add(a[0], widen(
            b.load(b.gep(base, [i], source_etype=I8), typ=I8), I32))], [total])
        b.store(total, b.gep(out, [p], source_etype=I32))
        return []

    for_range(b, ir.Constant(I64, 0), planes, ir.Constant(I64, 1), plane)
    b.ret_void()
    return name


def build(region, target: Target) -> tuple[bytes, QGapKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    module = new_module(target, region.op_type)
    sym = define_sums(module, f"{region.op_type}_sums", signed=p.dtype == "int8")
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    elem = dtype(p.dtype).onnx
    desc = QGapKernelDesc(op_type=region.op_type, in_types=[elem], out_types=[elem], sums=sym, x_scale=p.x_scale,
                          x_zero=p.x_zero, y_scale=p.y_scale, y_zero=p.y_zero, signed=p.dtype == "int8")
    return obj, desc, ir_text
