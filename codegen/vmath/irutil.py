"""Small helpers for writing vector math in llvmlite IR: splatted constants, fma, min/max, bit casts."""

from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)


def lanes(v: ir.Value) -> int:
    return v.type.count


def splat(ty: ir.VectorType, value) -> ir.Constant:
    return ir.Constant(ty, [value] * ty.count)


def fconst(like: ir.Value, value: float) -> ir.Constant:
    return splat(like.type, float(value))


def intrinsic(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    """Call an overloaded LLVM intrinsic such as llvm.fma.v16f32."""
    module = b.module
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, fnty, name=name)
    return b.call(fn, args)


def broadcast(b: ir.IRBuilder, scalar: ir.Value, lanes: int) -> ir.Value:
    """A runtime scalar in every lane (insertelement + zero shuffle: what LLVM turns into vbroadcast)."""
    vty = ir.VectorType(scalar.type, lanes)
    first = b.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(I32, 0))
    return b.shuffle_vector(first, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def masked_load(b: ir.IRBuilder, ptr: ir.Value, vty: ir.VectorType, mask: ir.Value, align: int) -> ir.Value:
    """Load the lanes whose mask bit is set; the others read as zero and touch no memory."""
    zeros = ir.Constant(vty, [ir.Constant(vty.element, 0)] * vty.count)
    return intrinsic(b, f"llvm.masked.load.{suffix(vty)}.p0", vty, [ptr, ir.Constant(I32, align), mask, zeros])


def masked_store(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, mask: ir.Value, align: int) -> None:
    name = f"llvm.masked.store.{suffix(value.type)}.p0"
    fnty = ir.FunctionType(ir.VoidType(), [value.type, ir.PointerType(), I32, mask.type])
    fn = b.module.globals.get(name) or ir.Function(b.module, fnty, name=name)
    b.call(fn, [value, ptr, ir.Constant(I32, align), mask])


def suffix(ty: ir.Type) -> str:
    """LLVM's type suffix for overloaded intrinsics: v16f32, f32, v8f64, v16i32..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{suffix(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    raise TypeError(ty)


def fma(b, x, y, z):
    return intrinsic(b, f"llvm.fma.{suffix(x.type)}", x.type, [x, y, z])


def polyval(b, x, coeffs):
    """Horner: coeffs[0] + x*(coeffs[1] + x*(...)), evaluated with fused multiply-adds."""
    acc = fconst(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = fma(b, acc, x, fconst(x, c))
    return acc


def fabs(b, x):
    return intrinsic(b, f"llvm.fabs.{suffix(x.type)}", x.type, [x])


def unary(b, name, x):
    return intrinsic(b, f"llvm.{name}.{suffix(x.type)}", x.type, [x])


def fmin(b, x, y):
    """min(x, y) that returns x when x is NaN (so NaN inputs propagate when x is the data)."""
    return b.select(b.fcmp_ordered(">", x, y), y, x)


def fmax(b, x, y):
    return b.select(b.fcmp_ordered("<", x, y), y, x)


def int_vec(like: ir.Value, width: int = 32) -> ir.VectorType:
    return ir.VectorType(ir.IntType(width), lanes(like))


def is_nan(b, x):
    return b.fcmp_unordered("uno", x, x)


def while_loop(b, start, cond, step, body, carried=()):
    """while cond(i): body(i, values) -> new values; i += step. Returns (i, values) at the exit."""
    fn = b.function
    pre = b.block
    head = fn.append_basic_block("loop.head")
    body_bb = fn.append_basic_block("loop.body")
    exit_bb = fn.append_basic_block("loop.exit")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(start.type)
    i.add_incoming(start, pre)
    phis = []
    for v in carried:
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        phis.append(p)
    b.cbranch(cond(i), body_bb, exit_bb)
    b.position_at_end(body_bb)
    new = body(i, list(phis)) or []
    i.add_incoming(b.add(i, step), b.block)
    for p, v in zip(phis, new):
        p.add_incoming(v, b.block)
    b.branch(head)
    b.position_at_end(exit_bb)
    return i, list(phis)


def for_range(b, start, stop, step, body, carried=()):
    """for i in range(start, stop, step): values = body(i, values). Returns the values at the exit."""
    return while_loop(b, start, lambda i: b.icmp_signed("<", i, stop), step, body, carried)[1]


def when(b, cond, then, carried=()):
    """values = then(values) when cond, else unchanged (a row's masked tail only where it has one: masked loads and
    stores cost more than plain ones, and most rows are a whole number of vectors)."""
    pre = b.block
    then_bb = b.function.append_basic_block("tail")
    done = b.function.append_basic_block("tail.done")
    b.cbranch(cond, then_bb, done)
    b.position_at_end(then_bb)
    new = then(list(carried)) or []
    then_end = b.block
    b.branch(done)
    b.position_at_end(done)
    out = []
    for v, w in zip(carried, new):
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        p.add_incoming(w, then_end)
        out.append(p)
    return out


def reduce_lanes(b, v, combine):
    """The lanes of v combined pairwise, halves at a time (log2(lanes) steps instead of lanes - 1)."""
    n = v.type.count
    while n > 1:
        half = n // 2
        lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half))))
        hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half, n))))
        v, n = combine(b, lo, hi), half
    return b.extract_element(v, ir.Constant(I32, 0))


def record_function(module: ir.Module, name: str):
    """A `void name(const int64 *record)` function, as the int8 tiles are (their records are C structs of 8-byte
    slots, glue.h): (its builder at the entry, slot(i, type) that loads slot i of the record)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()]), name=name)
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    record = fn.args[0]
    i64 = ir.IntType(64)

    def slot(i: int, ty=i64):
        return b.load(b.gep(record, [ir.Constant(i64, i)], source_etype=i64), typ=ty)

    return b, slot
