"""Schedule -> loop nest.

The leaf loops, in schedule order, become nested Loops around the compute's store. A reduction needs three
statements per output element: the accumulator's start value, the update (acc = acc op body) and the epilogue.
They share the loops outside the first reduce loop; inside it, the start value and the epilogue get their own copies
of the spatial loops found there, so that for matmul ordered (i, j.outer, k, j.inner) the nest is

    for i: for j.outer:
        for j.inner: C = 0
        for k: for j.inner: C = C + A*B

Each overshoot guard of a non-divisible split (value < extent) is attached to the loop of its innermost variable.
When the value is `c*var + rest` with c > 0 and rest made of outer loops only, the guard becomes a bound that
shortens that loop (no test per iteration, and a vectorized loop just gets a shorter trip count); otherwise it is an
`if` at the top of the loop's body.

The outermost loop is the kernel's range loop: the function runs the iterations [begin, end) of it. When that
loop is a reduce loop (or there are no loops), the nest is wrapped in a loop of extent 1, so a split range still
computes everything exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .affine import linearize
from .expr import Binary, Const, Expr, IterVar, Load, free_vars
from .schedule import PARALLEL, SERIAL, Schedule, ScheduleError
from .stmt import IfThen, Loop, Store, Tensorized, format_stmts
from .te import Tensor, inputs_of, reduction_identity


@dataclass
class LoweredNest:
    output: Tensor
    inputs: list[Tensor]
    root: Loop  # the range loop

    @property
    def buffers(self) -> list[Tensor]:
        """Kernel arguments, in order: the inputs, then the output."""
        return [*self.inputs, self.output]

    @property
    def range_extent(self) -> int:
        return self.root.extent

    @property
    def parallel(self) -> bool:
        return self.root.kind == PARALLEL

    def __str__(self) -> str:
        return format_stmts([self.root])


@dataclass
class ComputeStatements:
    """A compute's statements over its own axes: start value and epilogue are None without a reduction."""

    init: Store | None
    update: Store
    epilogue: Store | None


def _combine(op: str, acc: Expr, value: Expr) -> Expr:
    return acc + value if op == "sum" else Binary(op, acc, value, acc.dtype)


def compute_statements(tensor: Tensor) -> ComputeStatements:
    op = tensor.op
    index = tuple(op.axes)
    if op.reduce is None:
        return ComputeStatements(None, Store(tensor, index, op.body), None)
    acc = Load(tensor, index, tensor.dtype)
    init = Store(tensor, index, reduction_identity(op.reduce.op, op.reduce.dtype))
    update = Store(tensor, index, _combine(op.reduce.op, acc, op.reduce.body))
    epilogue = op.epilogue(acc)
    return ComputeStatements(init, update, Store(tensor, index, epilogue) if epilogue is not None else None)


def lower(schedule: Schedule, inputs: list[Tensor] | None = None) -> LoweredNest:
    op = schedule.op
    order = list(schedule.leaves)
    _check_parallel(schedule, order)
    leaf_values = {axis: schedule.value_of(axis) for axis in (*op.axes, *op.reduce_axes)}
    statements = compute_statements(schedule.tensor)
    guards = schedule.overshoot_guards()

    first_reduce = next((p for p, a in enumerate(order) if a.kind == "reduce"), len(order))
    shared, inner = order[:first_reduce], order[first_reduce:]
    inner_spatial = [a for a in inner if a.kind == "spatial"]
    update = statements.update.substituted(leaf_values)
    nests = [(inner, update)]
    if statements.init is not None:
        nests.insert(0, (inner_spatial, statements.init.substituted(leaf_values)))
    if statements.epilogue is not None:
        nests.append((inner_spatial, statements.epilogue.substituted(leaf_values)))

    body = []
    for loops, store in nests:
        body += _nest(schedule, loops, [store], guards, shared + loops)
    body = _nest(schedule, shared, body, guards, shared)
    if schedule.tensorize_at is not None:
        body = _tensorize(schedule, body, update)
    if len(body) == 1 and isinstance(body[0], Loop) and shared:
        root = body[0]
    else:
        root = Loop(IterVar("range", "int64", 1, "spatial"), SERIAL, body)
    return LoweredNest(schedule.tensor, _argument_order(schedule.tensor, inputs), root)


def _argument_order(output: Tensor, inputs: list[Tensor] | None) -> list[Tensor]:
    needed = inputs_of(output)
    if inputs is None:
        return needed
    missing = [t.name for t in needed if not any(t is given for given in inputs)]
    if missing:
        raise ScheduleError(f"{output.name} reads {', '.join(missing)}, which the given inputs do not list")
    return list(inputs)


def _check_parallel(schedule: Schedule, order: list[IterVar]) -> None:
    for axis, kind in schedule.kinds.items():
        if kind == PARALLEL and order[0] is not axis:
            raise ScheduleError(f"parallel {axis.name}: the parallel loop must be the outermost one "
                                f"(order: {', '.join(a.name for a in order)})")


def _nest(schedule, loops: list[IterVar], body: list, guards, enclosing: list[IterVar]) -> list:
    """Wrap `body` in `loops` (outermost first), attaching each guard at the loop of its innermost variable."""
    position = {v: p for p, v in enumerate(enclosing)}
    for var in reversed(loops):
        bounds, conditions = [], []
        for value, extent in guards:
            used = free_vars(value)
            if not used <= position.keys() or max(used, key=position.__getitem__) is not var:
                continue
            bound = _bound_from_guard(value, extent, var)
            if bound is not None:
                bounds.append(bound)
            else:
                conditions.append(value < extent)
        if conditions:
            cond = conditions[0]
            for c in conditions[1:]:
                cond = cond & c
            body = [IfThen(cond, body)]
        body = [Loop(var, schedule.kind_of(var), body, bounds)]
    return body


def _bound_from_guard(value: Expr, extent: int, var: IterVar) -> Expr | None:
    """value < extent as var < bound, when value = c*var + rest with c > 0: bound = ceil((extent - rest) / c)."""
    form = linearize(value)
    coef = form.coefficient(var)
    if coef is None or coef <= 0:
        return None
    remaining = Const(extent, "int64") - form.without(var).to_expr()
    return remaining if coef == 1 else (remaining + (coef - 1)) // coef


def _tensorize(schedule: Schedule, body: list, update: Store) -> list:
    from .tensorize import bind_intrinsic

    axis, intrinsic = schedule.tensorize_at
    found = []

    def rewrite(stmts: list) -> list:
        out = []
        for s in stmts:
            if isinstance(s, Loop) and s.var is axis:
                chain = _perfect_chain(s)
                if chain is not None and chain[1] is update:
                    loops, store = chain
                    operands = bind_intrinsic(intrinsic, loops, store)
                    found.append(s)
                    out.append(Tensorized(intrinsic, operands, loops, [s]))
                    continue
            if isinstance(s, Loop):
                s = Loop(s.var, s.kind, rewrite(s.body), s.bounds)
            elif isinstance(s, IfThen):
                s = IfThen(s.cond, rewrite(s.body))
            out.append(s)
        return out

    body = rewrite(body)
    if not found:
        raise ScheduleError(f"tensorize {axis.name}: the loop must enclose only the update statement, without "
                            "guards (with a reduction, put it inside the reduce loops)")
    return body


def _perfect_chain(loop: Loop) -> tuple[list[Loop], Store] | None:
    """The loops of a perfect nest down to its single store, or None."""
    loops = [loop]
    while True:
        body = loops[-1].body
        if len(body) != 1:
            return None
        if isinstance(body[0], Store):
            return loops, body[0]
        if not isinstance(body[0], Loop):
            return None
        loops.append(body[0])
