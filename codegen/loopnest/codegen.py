"""Loop nest -> one LLVM function `void name(ptr buf..., i64 begin, i64 end)`.

Scalar code is straightforward: a counted loop per Loop, a branch per IfThen, a load/compute/store per Store. A
`select` whose sides read memory becomes a branch, so a padded read that is out of bounds never happens.

A vectorized loop runs `lanes` iterations at a time. Its body is evaluated with vectors: an access whose row-major
offset moves by 1 per iteration is one vector load/store, an access that does not move is a scalar load splatted,
the loop variable itself is base + <0, 1, ...>. Whatever is left after the full vectors runs once with a lane mask
(masked loads and stores), and a condition that depends on the loop variable (padding) narrows the mask, so every
element is read and written exactly as often as in the scalar loop. Any other access (a stride, a reduction along
the loop) keeps the loop scalar; `vectorize_blocker` says why and the reason is kept in the kernel's notes.

Floating-point arithmetic is emitted without fast-math flags: no reassociation, no contraction of a*b+c into an
FMA, so every schedule of a compute rounds the same way. Vector math (exp) uses the portable path for every width.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llvmlite import ir

from ..vmath.exp import vexp
from ..vmath.irutil import broadcast, intrinsic, masked_load, masked_store, suffix
from .affine import Affine, flat_offset
from .expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    IterVar,
    Load,
    Logical,
    Not,
    Select,
    Var,
    children,
    depends_on,
    free_vars,
    has_load,
    loads,
)
from .lower import LoweredNest
from .schedule import UNROLLED, VECTORIZED
from .stmt import IfThen, Loop, Store, Tensorized
from .tensorize import Operand

I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
PTR = ir.PointerType()
VOID = ir.VoidType()
LLVM_TYPE = {"float32": F32, "int32": I32, "int64": I64, "bool": I1}
ALIGN = 4  # float32 and int32 elements


def llvm_type(dtype: str, lanes: int | None = None) -> ir.Type:
    return LLVM_TYPE[dtype] if lanes is None else ir.VectorType(LLVM_TYPE[dtype], lanes)


@dataclass(frozen=True)
class VectorLoop:
    """The vectorized loop being emitted: its variable takes base + 0 .. base + lanes-1 in the active lanes."""

    var: IterVar
    base: ir.Value  # i64, the first lane's iteration
    lanes: int
    mask: ir.Value | None  # <lanes x i1>; None = all lanes active


def vectorize_blocker(loop: Loop) -> str | None:
    """Why `loop` cannot run as vectors, or None when it can."""
    var = loop.var

    def stride(tensor, indices):
        return flat_offset(tensor, indices).coefficient(var)

    def reads(e: Expr) -> str | None:
        for ld in loads(e):
            s = stride(ld.tensor, ld.indices)
            if s not in (0, 1):
                what = "a non-affine index" if s is None else f"stride {s}"
                return f"{ld.tensor.name} is read with {what} along {var.name}"
        return None

    def statements(body: list) -> str | None:
        for s in body:
            if isinstance(s, Store):
                st = stride(s.tensor, s.indices)
                if st == 0:
                    return f"every iteration updates the same element of {s.tensor.name} (a reduction along {var.name})"
                if st != 1:
                    what = "a non-affine index" if st is None else f"stride {st}"
                    return f"{s.tensor.name} is written with {what} along {var.name}"
                why = reads(s.value)
            elif isinstance(s, IfThen):
                why = reads(s.cond) or statements(s.body)
            elif isinstance(s, Loop):
                if s.kind == VECTORIZED:
                    return f"it encloses the vectorized loop {s.var.name}"
                if any(var in free_vars(b) for b in s.bounds):
                    return f"the trip count of {s.var.name} depends on {var.name}"
                why = statements(s.body)
            else:
                return "it encloses a tensorized nest"
            if why:
                return why
        return None

    return statements(loop.body)


class FunctionEmitter:
    def __init__(self, module: ir.Module, nest: LoweredNest, name: str, lanes: int):
        buffers = nest.buffers
        self.nest = nest
        self.lanes = lanes
        self.notes: list[str] = []
        self.fn = ir.Function(module, ir.FunctionType(VOID, [PTR] * len(buffers) + [I64, I64]), name=name)
        for arg, tensor in zip(self.fn.args, buffers):
            arg.name = tensor.name
            arg.add_attribute("noalias")  # the output never overlaps an input (the calling convention says so)
        self.fn.args[-2].name, self.fn.args[-1].name = "begin", "end"
        self.pointers = dict(zip(buffers, self.fn.args))
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))

    def emit(self) -> ir.Function:
        begin, end = self.fn.args[-2:]
        self.loop(self.nest.root, {}, None, start=begin, stop=end)
        self.b.ret_void()
        return self.fn

    # -----------------------------------------------------------------------------------------------------------
    # Statements

    def statements(self, stmts: list, env: dict, vec: VectorLoop | None) -> None:
        for s in stmts:
            if isinstance(s, Loop):
                self.loop(s, env, vec)
            elif isinstance(s, IfThen):
                self.if_then(s, env, vec)
            elif isinstance(s, Store):
                self.store(s, env, vec)
            elif isinstance(s, Tensorized):
                self.tensorized(s, env)
            else:
                raise TypeError(f"unknown statement {s!r}")

    def loop(self, lp: Loop, env: dict, vec: VectorLoop | None, start=None, stop=None) -> None:
        """`start`/`stop` restrict the range loop to the caller's [begin, end)."""
        static = start is None and stop is None and not lp.bounds
        begin = ir.Constant(I64, 0) if start is None else self.smax(start, ir.Constant(I64, 0))
        end = ir.Constant(I64, lp.extent)
        for bound in lp.bounds:
            end = self.smin(end, self.scalar(bound, env))
        if stop is not None:
            end = self.smin(end, stop)
        if lp.kind == UNROLLED:
            self.unrolled_loop(lp, env, vec, None if static else (begin, end))
            return
        if lp.kind == VECTORIZED and vec is None:
            blocker = vectorize_blocker(lp)
            if blocker is None:
                self.vector_loop(lp, env, begin, end, static)
                return
            note = f"{lp.var.name}: scalar loop, {blocker}"
            if note not in self.notes:  # unrolled copies and the start-value nest repeat a loop
                self.notes.append(note)
        self.counted_loop(begin, end, 1, lambda i: self.statements(lp.body, {**env, lp.var: i}, vec), lp.var.name)

    def counted_loop(self, begin: ir.Value, end: ir.Value, step: int, body, name: str) -> ir.Value:
        """for (i = begin; i < end; i += step) body(i); returns i's value after the loop."""
        b = self.b
        before = b.block
        head = b.append_basic_block(f"{name}.head")
        inside = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=name)
        i.add_incoming(begin, before)
        b.cbranch(b.icmp_signed("<", i, end), inside, done)
        b.position_at_end(inside)
        body(i)
        i.add_incoming(b.add(i, ir.Constant(I64, step)), b.block)
        b.branch(head)
        b.position_at_end(done)
        return i

    def unrolled_loop(self, lp: Loop, env: dict, vec, dynamic_range) -> None:
        for k in range(lp.extent):
            value = ir.Constant(I64, k)
            if dynamic_range is None:
                self.statements(lp.body, {**env, lp.var: value}, vec)
                continue
            begin, end = dynamic_range
            inside = self.b.and_(self.b.icmp_signed("<=", begin, value), self.b.icmp_signed("<", value, end))
            with self.b.if_then(inside):
                self.statements(lp.body, {**env, lp.var: value}, vec)

    def vector_loop(self, lp: Loop, env: dict, begin, end, static: bool) -> None:
        lanes = min(self.lanes, lp.extent)

        def body(base, mask=None):
            self.statements(lp.body, env, VectorLoop(lp.var, base, lanes, mask))

        if static:
            full = lp.extent - lp.extent % lanes
            if full:
                self.counted_loop(begin, ir.Constant(I64, full), lanes, body, lp.var.name)
            if lp.extent % lanes:
                body(ir.Constant(I64, full), ir.Constant(ir.VectorType(I1, lanes),
                                                         [k < lp.extent % lanes for k in range(lanes)]))
            return
        b = self.b
        count = self.smax(b.sub(end, begin), ir.Constant(I64, 0))
        full_end = b.add(begin, b.sub(count, b.urem(count, ir.Constant(I64, lanes))))
        after = self.counted_loop(begin, full_end, lanes, body, lp.var.name)
        with b.if_then(b.icmp_signed("<", after, end)):
            left = self.splat(b.sub(end, after), lanes)
            body(after, b.icmp_signed("<", self.iota(lanes), left))

    def if_then(self, s: IfThen, env: dict, vec: VectorLoop | None) -> None:
        if vec is None or not depends_on(s.cond, vec.var):
            with self.b.if_then(self.scalar(s.cond, env)):
                self.statements(s.body, env, vec)
            return
        cond = self.vector(s.cond, env, vec)
        self.statements(s.body, env, replace(vec, mask=self.and_mask(vec.mask, cond)))

    def store(self, s: Store, env: dict, vec: VectorLoop | None) -> None:
        offset = flat_offset(s.tensor, s.indices)
        if vec is None:
            value = self.scalar(s.value, env)
            self.b.store(value, self.address(s.tensor, offset, env), align=ALIGN)
            return
        value = self.vector(s.value, env, vec)
        ptr = self.address(s.tensor, offset, {**env, vec.var: vec.base})
        if vec.mask is None:
            self.b.store(value, ptr, align=ALIGN)
        else:
            masked_store(self.b, value, ptr, vec.mask, ALIGN)

    def tensorized(self, s: Tensorized, env: dict) -> None:
        def use_intrinsic():
            operands = {name: Operand(self.address(op.tensor, op.origin, env), op.strides, op.tensor.dtype)
                        for name, op in s.operands.items()}
            s.intrinsic.emit(self.b, operands)

        full_tile = None
        for lp in s.loops:
            for bound in lp.bounds:
                fits = self.b.icmp_signed(">=", self.scalar(bound, env), ir.Constant(I64, lp.extent))
                full_tile = fits if full_tile is None else self.b.and_(full_tile, fits)
        if full_tile is None:
            use_intrinsic()
            return
        with self.b.if_else(full_tile) as (then, otherwise):
            with then:
                use_intrinsic()
            with otherwise:
                self.statements(s.fallback, env, None)

    # -----------------------------------------------------------------------------------------------------------
    # Expressions

    def address(self, tensor, offset: Affine, env: dict) -> ir.Value:
        return self.b.gep(self.pointers[tensor], [self.affine(offset, env)], source_etype=LLVM_TYPE[tensor.dtype])

    def affine(self, form: Affine, env: dict) -> ir.Value:
        total = None
        for atom, coef, _ in form.terms.values():
            value = self.scalar(atom, env)
            if value.type != I64:
                value = self.b.sext(value, I64)
            term = value if coef == 1 else self.b.mul(value, ir.Constant(I64, coef))
            total = term if total is None else self.b.add(total, term)
        if total is None:
            return ir.Constant(I64, form.const)
        return self.b.add(total, ir.Constant(I64, form.const)) if form.const else total

    def scalar(self, e: Expr, env: dict) -> ir.Value:
        if isinstance(e, Const):
            return ir.Constant(llvm_type(e.dtype), e.value)
        if isinstance(e, Var):
            return env[e]
        if isinstance(e, Load):
            ptr = self.address(e.tensor, flat_offset(e.tensor, e.indices), env)
            return self.b.load(ptr, typ=llvm_type(e.dtype), align=ALIGN)
        if isinstance(e, Select) and (has_load(e.a) or has_load(e.b)):
            return self.branching_select(e, env)
        return self.apply(e, [self.scalar(c, env) for c in children(e)], None)

    def branching_select(self, e: Select, env: dict) -> ir.Value:
        """cond ? a : b evaluating only the chosen side (it may read out of bounds otherwise)."""
        with self.b.if_else(self.scalar(e.cond, env)) as (then, otherwise):
            with then:
                a = self.scalar(e.a, env)
                a_block = self.b.block
            with otherwise:
                c = self.scalar(e.b, env)
                c_block = self.b.block
        phi = self.b.phi(a.type)
        phi.add_incoming(a, a_block)
        phi.add_incoming(c, c_block)
        return phi

    def vector(self, e: Expr, env: dict, vec: VectorLoop) -> ir.Value:
        if not depends_on(e, vec.var) and (vec.mask is None or not has_load(e)):
            return self.splat(self.scalar(e, env), vec.lanes)  # the same in every lane
        if isinstance(e, Var):
            return self.b.add(self.splat(vec.base, vec.lanes), self.iota(vec.lanes))
        if isinstance(e, Load):
            return self.vector_load(e, env, vec)
        if isinstance(e, Select) and (has_load(e.a) or has_load(e.b)):
            cond = self.vector(e.cond, env, vec)
            a = self.vector(e.a, env, replace(vec, mask=self.and_mask(vec.mask, cond)))
            c = self.vector(e.b, env, replace(vec, mask=self.and_mask(vec.mask, self.logical_not(cond))))
            return self.b.select(cond, a, c)
        return self.apply(e, [self.vector(c, env, vec) for c in children(e)], vec.mask)

    def vector_load(self, e: Load, env: dict, vec: VectorLoop) -> ir.Value:
        form = flat_offset(e.tensor, e.indices)
        stride = form.coefficient(vec.var)
        vty = llvm_type(e.dtype, vec.lanes)
        if stride == 1:
            ptr = self.address(e.tensor, form, {**env, vec.var: vec.base})
            return self.b.load(ptr, typ=vty, align=ALIGN) if vec.mask is None else self.masked_load(ptr, vty, vec.mask)
        assert stride == 0, "vectorize_blocker lets only contiguous and invariant reads through"
        ptr = self.address(e.tensor, form, env)
        if vec.mask is None:
            return self.splat(self.b.load(ptr, typ=llvm_type(e.dtype), align=ALIGN), vec.lanes)
        # Read the one element only if some lane is active: the mask may come from a padding condition.
        any_lane = intrinsic(self.b, f"llvm.vector.reduce.or.{suffix(vec.mask.type)}", I1, [vec.mask])
        one_lane = self.b.insert_element(ir.Constant(ir.VectorType(I1, 1), ir.Undefined), any_lane,
                                         ir.Constant(I32, 0))
        value = self.masked_load(ptr, llvm_type(e.dtype, 1), one_lane)
        return self.splat(self.b.extract_element(value, ir.Constant(I32, 0)), vec.lanes)

    def masked_load(self, ptr, vty: ir.VectorType, mask) -> ir.Value:
        return masked_load(self.b, ptr, vty, mask, ALIGN)  # inactive lanes read as 0

    def apply(self, e: Expr, args: list, mask) -> ir.Value:
        """One operation on already evaluated operands (scalars or vectors alike)."""
        b = self.b
        if isinstance(e, Binary):
            return self.arithmetic(e.op, e.a.dtype, args[0], args[1], mask)
        if isinstance(e, Compare):
            if e.a.dtype == "float32":
                # != is true for NaN operands, the others false, as in numpy.
                return (b.fcmp_unordered if e.op == "!=" else b.fcmp_ordered)(e.op, args[0], args[1])
            return b.icmp_signed(e.op, args[0], args[1])
        if isinstance(e, Logical):
            return b.and_(*args) if e.op == "and" else b.or_(*args)
        if isinstance(e, Not):
            return self.logical_not(args[0])
        if isinstance(e, Select):
            return b.select(*args)
        if isinstance(e, Cast):
            return self.convert(args[0], e.a.dtype, e.dtype)
        if isinstance(e, Call):
            return self.math_call(e.fn, args[0])
        raise TypeError(f"cannot emit {type(e).__name__}")

    def arithmetic(self, op: str, dtype: str, x, y, mask) -> ir.Value:
        b = self.b
        if dtype == "float32":
            simple = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}
            if op in simple:
                return simple[op](x, y)
            # llvm.maximum/minimum return NaN when either operand is NaN (numpy.maximum does too).
            return intrinsic(b, f"llvm.{'maximum' if op == 'max' else 'minimum'}.{suffix(x.type)}", x.type, [x, y])
        simple = {"add": b.add, "sub": b.sub, "mul": b.mul}
        if op in simple:
            return simple[op](x, y)
        if op in ("max", "min"):
            return intrinsic(b, f"llvm.s{op}.{suffix(x.type)}", x.type, [x, y])
        if mask is not None:
            # Inactive lanes hold anything, 0 included: divide them by 1 rather than trap.
            y = b.select(mask, y, self.constant_like(y, 1))
        return self.floor_divmod(op, x, y)

    def floor_divmod(self, op: str, x, y) -> ir.Value:
        """Floor division / modulo (numpy's // and %) from LLVM's truncating sdiv/srem."""
        b = self.b
        zero = self.constant_like(x, 0)
        quotient, remainder = b.sdiv(x, y), b.srem(x, y)
        # Truncation rounded up when the remainder is non-zero and its sign differs from the divisor's.
        rounded_up = b.and_(b.icmp_signed("!=", remainder, zero), b.icmp_signed("<", b.xor(remainder, y), zero))
        if op == "floordiv":
            return b.sub(quotient, b.zext(rounded_up, x.type))
        return b.add(remainder, b.select(rounded_up, y, zero))

    def convert(self, value, source: str, target: str) -> ir.Value:
        b = self.b
        lanes = value.type.count if isinstance(value.type, ir.VectorType) else None
        ty = llvm_type(target, lanes)
        if source == target:
            return value
        if source == "bool":
            return b.uitofp(value, ty) if target == "float32" else b.zext(value, ty)
        if source == "float32":
            return b.fptosi(value, ty)
        if target == "float32":
            return b.sitofp(value, ty)
        return b.sext(value, ty) if LLVM_TYPE[target].width > LLVM_TYPE[source].width else b.trunc(value, ty)

    def math_call(self, fn: str, x) -> ir.Value:
        if fn == "sqrt":
            return intrinsic(self.b, f"llvm.sqrt.{suffix(x.type)}", x.type, [x])
        if isinstance(x.type, ir.VectorType):
            return vexp(self.b, x)
        # The vector exp works on vectors only: run it on a 1-lane vector.
        one = self.b.insert_element(ir.Constant(ir.VectorType(F32, 1), ir.Undefined), x, ir.Constant(I32, 0))
        return self.b.extract_element(vexp(self.b, one), ir.Constant(I32, 0))

    # -----------------------------------------------------------------------------------------------------------
    # Small helpers

    def splat(self, scalar: ir.Value, lanes: int) -> ir.Value:
        return broadcast(self.b, scalar, lanes)

    @staticmethod
    def iota(lanes: int) -> ir.Constant:
        return ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))

    @staticmethod
    def constant_like(value: ir.Value, number) -> ir.Constant:
        if isinstance(value.type, ir.VectorType):
            return ir.Constant(value.type, [ir.Constant(value.type.element, number)] * value.type.count)
        return ir.Constant(value.type, number)

    def logical_not(self, cond) -> ir.Value:
        return self.b.xor(cond, self.constant_like(cond, 1))

    def and_mask(self, mask, cond) -> ir.Value:
        return cond if mask is None else self.b.and_(mask, cond)

    def smin(self, x, y) -> ir.Value:
        return intrinsic(self.b, "llvm.smin.i64", I64, [x, y])

    def smax(self, x, y) -> ir.Value:
        return intrinsic(self.b, "llvm.smax.i64", I64, [x, y])
