"""Lower an elementwise program to LLVM IR row kernels.

The C glue walks the broadcast iteration space row by row (the innermost, coalesced dimension) and calls

    void <op>_m<mask>(void **ins, void **outs, int64 n)                         one specialized loop per mask
    void <op>_g(void **ins, void **outs, int64 n, const int64 *inner_strides)   any pattern

`ins[i]`/`outs[j]` point at the row's first element. In a mask, bit i set means input i is contiguous along the
row, clear means it is broadcast (one value for the whole row, loaded once and splatted). The vector loop uses the
target's full register width with one masked iteration for the tail, so every element is read and written once.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.codegen.vmath.irutil import broadcast, masked_load, masked_store
from onnxopt.codegen.vmath.isa import set_features
from onnxopt.fusion.region import EwProgram

from .ops import LOWER
from .types import LLVM_SCALAR, MEMORY_SCALAR, ITEMSIZE, vec

PTR = ir.PointerType()
I64 = ir.IntType(64)
I32 = ir.IntType(32)
VOID = ir.VoidType()


def _to_register(b, v, dtype):
    """Memory form -> register form (bool: i8 -> i1)."""
    if dtype == "bool":
        return b.icmp_unsigned("!=", v, ir.Constant(v.type, [0] * v.type.count) if isinstance(v.type, ir.VectorType)
                               else ir.Constant(v.type, 0))
    return v


def _to_memory(b, v, dtype, lanes):
    if dtype == "bool":
        return b.zext(v, ir.VectorType(ir.IntType(8), lanes))
    return v


def _const_vector(value, dtype, lanes):
    ty = vec(dtype, lanes)
    if dtype in ("float32", "float64"):
        return ir.Constant(ty, [float(value)] * lanes)
    if dtype == "bool":
        return ir.Constant(ty, [1 if value else 0] * lanes)
    return ir.Constant(ty, [int(value)] * lanes)


def emit_body(b: ir.IRBuilder, prog: EwProgram, values: dict[str, ir.Value], lanes: int) -> None:
    """Evaluate the program's ops on vectors; `values` holds the inputs and receives every result."""
    dtypes = {v.name: v.dtype for v in prog.inputs}
    for name, (val, dt) in prog.consts.items():
        values[name] = _const_vector(val, dt, lanes)
        dtypes[name] = dt
    for op in prog.ops:
        args = [values[a] if a else None for a in op.args]
        arg_dts = [dtypes[a] if a else None for a in op.args]
        values[op.out] = LOWER[op.op](b, args, arg_dts, op)
        dtypes[op.out] = op.dtype


def _arg_pointers(b, array_ptr, count):
    return [b.load(b.gep(array_ptr, [ir.Constant(I64, i)], source_etype=PTR), typ=PTR) for i in range(count)]


def _define_row_kernel(module: ir.Module, prog: EwProgram, name: str, mask: int, lanes: int) -> None:
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, I64]), name=name)
    fn.args[0].add_attribute("noalias")
    fn.args[1].add_attribute("noalias")
    ins_arr, outs_arr, n = fn.args
    entry = fn.append_basic_block("entry")
    cond_bb = fn.append_basic_block("vector.cond")
    body_bb = fn.append_basic_block("vector.body")
    tail_check = fn.append_basic_block("tail.check")
    tail_bb = fn.append_basic_block("tail")
    exit_bb = fn.append_basic_block("exit")

    b = ir.IRBuilder(entry)
    in_ptrs = _arg_pointers(b, ins_arr, len(prog.inputs))
    out_ptrs = _arg_pointers(b, outs_arr, len(prog.outputs))
    # Broadcast inputs: one load per row, hoisted out of the loop.
    splats = {}
    for i, v in enumerate(prog.inputs):
        if not (mask >> i) & 1:
            s = b.load(in_ptrs[i], typ=MEMORY_SCALAR[v.dtype], align=ITEMSIZE[v.dtype])
            splats[v.name] = _to_register(b, broadcast(b, s, lanes), v.dtype)
    b.branch(cond_bb)

    b.position_at_end(cond_bb)
    i = b.phi(I64, name="i")
    i.add_incoming(ir.Constant(I64, 0), entry)
    has_full = b.icmp_signed("<=", b.add(i, ir.Constant(I64, lanes)), n)
    b.cbranch(has_full, body_bb, tail_check)

    def load_inputs(bb_builder, idx, tail_mask):
        values = dict(splats)
        for k, v in enumerate(prog.inputs):
            if v.name in values:
                continue
            mty = ir.VectorType(MEMORY_SCALAR[v.dtype], lanes)
            p = bb_builder.gep(in_ptrs[k], [idx], source_etype=MEMORY_SCALAR[v.dtype])
            raw = (bb_builder.load(p, typ=mty, align=ITEMSIZE[v.dtype]) if tail_mask is None
                   else masked_load(bb_builder, p, mty, tail_mask, ITEMSIZE[v.dtype]))
            values[v.name] = _to_register(bb_builder, raw, v.dtype)
        return values

    def store_outputs(bb_builder, values, idx, tail_mask):
        for k, v in enumerate(prog.outputs):
            val = _to_memory(bb_builder, values[v.name], v.dtype, lanes)
            p = bb_builder.gep(out_ptrs[k], [idx], source_etype=MEMORY_SCALAR[v.dtype])
            if tail_mask is None:
                bb_builder.store(val, p, align=ITEMSIZE[v.dtype])
            else:
                masked_store(bb_builder, val, p, tail_mask, ITEMSIZE[v.dtype])

    b.position_at_end(body_bb)
    values = load_inputs(b, i, None)
    emit_body(b, prog, values, lanes)
    store_outputs(b, values, i, None)
    i_next = b.add(i, ir.Constant(I64, lanes))
    i.add_incoming(i_next, body_bb)
    b.branch(cond_bb)

    b.position_at_end(tail_check)
    b.cbranch(b.icmp_signed("<", i, n), tail_bb, exit_bb)

    b.position_at_end(tail_bb)
    remaining = b.trunc(b.sub(n, i), I32)
    lane_ids = ir.Constant(ir.VectorType(I32, lanes), list(range(lanes)))
    tail_mask = b.icmp_signed("<", lane_ids, broadcast(b, remaining, lanes))
    values = load_inputs(b, i, tail_mask)
    emit_body(b, prog, values, lanes)
    store_outputs(b, values, i, tail_mask)
    b.branch(exit_bb)

    b.position_at_end(exit_bb)
    b.ret_void()


def _define_generic_kernel(module: ir.Module, prog: EwProgram, name: str) -> None:
    """Scalar loop with explicit inner strides (in elements): handles any broadcast pattern."""
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, I64, PTR]), name=name)
    ins_arr, outs_arr, n, strides = fn.args
    entry = fn.append_basic_block("entry")
    cond_bb = fn.append_basic_block("cond")
    body_bb = fn.append_basic_block("body")
    exit_bb = fn.append_basic_block("exit")
    b = ir.IRBuilder(entry)
    in_ptrs = _arg_pointers(b, ins_arr, len(prog.inputs))
    out_ptrs = _arg_pointers(b, outs_arr, len(prog.outputs))
    st = [b.load(b.gep(strides, [ir.Constant(I64, k)], source_etype=I64), typ=I64) for k in range(len(prog.inputs))]
    b.branch(cond_bb)
    b.position_at_end(cond_bb)
    i = b.phi(I64, name="i")
    i.add_incoming(ir.Constant(I64, 0), entry)
    b.cbranch(b.icmp_signed("<", i, n), body_bb, exit_bb)
    b.position_at_end(body_bb)
    values = {}
    for k, v in enumerate(prog.inputs):
        mty = ir.VectorType(MEMORY_SCALAR[v.dtype], 1)
        p = b.gep(in_ptrs[k], [b.mul(i, st[k])], source_etype=MEMORY_SCALAR[v.dtype])
        values[v.name] = _to_register(b, b.load(p, typ=mty, align=ITEMSIZE[v.dtype]), v.dtype)
    emit_body(b, prog, values, 1)
    for k, v in enumerate(prog.outputs):
        p = b.gep(out_ptrs[k], [i], source_etype=MEMORY_SCALAR[v.dtype])
        b.store(_to_memory(b, values[v.name], v.dtype, 1), p, align=ITEMSIZE[v.dtype])
    i.add_incoming(b.add(i, ir.Constant(I64, 1)), body_bb)
    b.branch(cond_bb)
    b.position_at_end(exit_bb)
    b.ret_void()


def lower_program(module: ir.Module, prog: EwProgram, symbol: str, lanes: int, features=()) -> dict:
    """Add the kernels of one region to `module`; returns their symbol names for the glue."""
    set_features(module, features)
    variants = []
    for mask in sorted(set(prog.masks)):
        name = f"{symbol}_m{mask}"
        _define_row_kernel(module, prog, name, mask, lanes)
        variants.append((mask, name))
    generic = f"{symbol}_g"
    _define_generic_kernel(module, prog, generic)
    return {"variants": variants, "generic": generic}


__all__ = ["lower_program", "emit_body", "LLVM_SCALAR"]
