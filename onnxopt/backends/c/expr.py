"""Elementwise ops as C expressions on scalars, for the C backend and CUDA C (the same text compiles in both).

Each op's semantics are those of the LLVM lowering (codegen/elementwise/ops.py), which follows onnxruntime's CPU
kernels: NaN stays where the data operand is NaN (Relu, Max, Clip), Round is half to even, a float-to-integer Cast
saturates (NaN gives 0). Integer Add/Sub/Mul/Neg wrap as LLVM's do (computed unsigned: signed overflow is
undefined in C).
"""

from __future__ import annotations

import math

import numpy as np

from onnxopt.fusion.region import EwOp, EwProgram

# The C type of a value in registers and in memory (bool: 0/1 in an int, one byte in memory).
C_TYPE = {"float32": "float", "float64": "double", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
          "uint16": "uint16_t", "int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t",
          "bool": "int"}
C_MEMORY = dict(C_TYPE, bool="uint8_t")
_UNSIGNED = {"int8": "uint8_t", "int16": "uint16_t", "int32": "uint32_t", "int64": "uint64_t"}
_INT_BITS = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32, "int64": 64, "uint64": 64}


def is_float(dt: str) -> bool:
    return dt in ("float32", "float64")


def literal(value, dt: str) -> str:
    """A C constant of type `dt`."""
    if dt == "bool":
        return "1" if value else "0"
    if is_float(dt):
        v = float(np.float32(value)) if dt == "float32" else float(value)
        if math.isnan(v):
            return f"(({C_TYPE[dt]})NAN)"
        if math.isinf(v):
            return f"(({C_TYPE[dt]}){'-' if v < 0 else ''}INFINITY)"
        return f"(({C_TYPE[dt]}){v.hex()})"
    v = int(value)
    if dt.startswith("int") and v == -(1 << (_INT_BITS[dt] - 1)):
        return f"(({C_TYPE[dt]})(-{(1 << (_INT_BITS[dt] - 1)) - 1}LL - 1))"
    return f"(({C_TYPE[dt]}){v}{'ULL' if dt.startswith('u') else 'LL'})"


def _f(dt: str, name: str) -> str:
    """The libm function `name` for float32 (expf) or float64 (exp)."""
    return name + ("f" if dt == "float32" else "")


def _wrap(dt: str, a: str, op: str, b: str) -> str:
    if dt in _UNSIGNED and dt in ("int32", "int64"):  # narrower ones are promoted to int: no overflow
        u = _UNSIGNED[dt]
        return f"(({C_TYPE[dt]})(({u}){a} {op} ({u}){b}))"
    return f"(({C_TYPE[dt]})({a} {op} {b}))"


def _cast(x: str, src: str, dst: str) -> str:
    if src == dst:
        return x
    if dst == "bool":
        return f"({x} != 0)"
    if is_float(src) and not is_float(dst):  # LLVM's fptosi.sat / fptoui.sat
        bits = _INT_BITS[dst]
        if dst.startswith("u"):
            lo, hi, top = "0.0", f"{float(2 ** bits)!r}", f"(({C_TYPE[dst]})UINT{bits}_MAX)"
            low = f"(({C_TYPE[dst]})0)"
        else:
            lo, hi = f"{-float(2 ** (bits - 1))!r}", f"{float(2 ** (bits - 1))!r}"
            top, low = f"(({C_TYPE[dst]})INT{bits}_MAX)", f"(({C_TYPE[dst]})INT{bits}_MIN)"
        return (f"(({x}) != ({x}) ? ({C_TYPE[dst]})0 : (double)({x}) <= {lo} ? {low} : (double)({x}) >= {hi} ? {top}"
                f" : ({C_TYPE[dst]})({x}))")
    return f"(({C_TYPE[dst]})({x}))"


def expression(op: EwOp, args: list[str], dts: list[str]) -> str:
    """The C expression of `op` applied to the argument expressions `args` (of dtypes `dts`)."""
    dt = dts[0] if dts else op.dtype
    t = C_TYPE.get(dt, "float")
    x = args[0] if args else None

    def k(v):
        return literal(v, dt)

    def lt(a, b):
        return f"({a} < {b})"

    def max2(a, b):
        return f"({a} < {b} ? {b} : {a})"

    def min2(a, b):
        return f"({a} > {b} ? {b} : {a})"

    def clamp01(y):
        return min2(max2(y, k(0)), k(1))

    def softplus(a):
        return f"({max2(a, k(0))} + {_f(dt, 'log')}({k(1)} + {_f(dt, 'exp')}(-{_f(dt, 'fabs')}({a}))))"

    name = op.op
    if name in ("Add", "Sub", "Mul"):
        sym = {"Add": "+", "Sub": "-", "Mul": "*"}[name]
        return f"(({t})({args[0]} {sym} {args[1]}))" if is_float(dt) else _wrap(dt, args[0], sym, args[1])
    if name == "Div":
        return f"(({t})({args[0]} / {args[1]}))"
    if name == "Neg":
        return f"(-{x})" if is_float(dt) else _wrap(dt, k(0), "-", x)
    if name == "Abs":
        if is_float(dt):
            return f"{_f(dt, 'fabs')}({x})"
        return x if dt.startswith("u") or dt == "bool" else f"({x} < 0 ? {_wrap(dt, k(0), '-', x)} : {x})"
    if name == "Sign":
        r = f"({x} > 0 ? {k(1)} : {x} < 0 ? {k(-1)} : {k(0)})"
        return f"({x} != {x} ? {x} : {r})" if is_float(dt) else r
    if name == "Relu":
        return f"({lt(x, k(0))} ? {k(0)} : {x})"
    if name == "LeakyRelu":
        return f"({lt(x, k(0))} ? {x} * {k(op.attr('alpha', 0.01))} : {x})"
    if name == "Elu":
        a = op.attr("alpha", 1.0)
        return f"({lt(x, k(0))} ? {k(a)} * ({_f(dt, 'exp')}({x}) - {k(1)}) : {x})"
    if name == "Celu":
        a = op.attr("alpha", 1.0)
        return f"({lt(x, k(0))} ? {k(a)} * ({_f(dt, 'exp')}({x} / {k(a)}) - {k(1)}) : {x})"
    if name == "Selu":
        a = op.attr("alpha", 1.67326319217681884765625)
        g = op.attr("gamma", 1.05070102214813232421875)
        return f"({k(g)} * ({x} <= {k(0)} ? {k(a)} * ({_f(dt, 'exp')}({x}) - {k(1)}) : {x}))"
    if name == "ThresholdedRelu":
        return f"({x} > {k(op.attr('alpha', 1.0))} ? {x} : {k(0)})"
    if name == "HardSigmoid":
        return clamp01(f"({x} * {k(op.attr('alpha', 0.2))} + {k(op.attr('beta', 0.5))})")
    if name == "HardSwish":
        return f"({x} * {clamp01(f'({x} * {k(1.0 / 6.0)} + {k(0.5)})')})"
    if name == "Sigmoid":
        return f"({k(1)} / ({k(1)} + {_f(dt, 'exp')}(-{x})))"
    if name in ("Tanh", "Erf", "Exp", "Log", "Sqrt", "Floor", "Ceil"):
        return f"{_f(dt, name.lower())}({x})"
    if name == "Round":  # half to even: rint in the default rounding mode
        return f"{_f(dt, 'rint')}({x})"
    if name == "Softplus":
        return softplus(x)
    if name == "Softsign":
        return f"({x} / ({k(1)} + {_f(dt, 'fabs')}({x})))"
    if name == "Mish":
        return f"({x} * {_f(dt, 'tanh')}({softplus(x)}))"
    if name == "Gelu":
        if op.attr("approximate", "none") == "tanh":
            inner = f"({k(math.sqrt(2.0 / math.pi))} * ({x} + {k(0.044715)} * {x} * {x} * {x}))"
            return f"({x} * {k(0.5)} * ({k(1)} + {_f(dt, 'tanh')}({inner})))"
        return f"({x} * {k(0.5)} * ({k(1)} + {_f(dt, 'erf')}({x} * {k(1.0 / math.sqrt(2.0))})))"
    if name == "Reciprocal":
        return f"({k(1)} / {x})"
    if name == "Pow":
        e = float(op.attr("exponent"))
        if e == 2.0:
            return f"({x} * {x})"
        return f"{_f(dt, 'pow')}({x}, {k(e)})"
    if name == "Clip":
        r = x
        if len(args) > 1 and args[1]:
            r = f"({lt(r, args[1])} ? {args[1]} : {r})"
        if len(args) > 2 and args[2]:
            r = f"({lt(args[2], r)} ? {args[2]} : {r})"
        return r
    if name in ("Min", "Max"):
        acc = args[0]
        for a in args[1:]:
            acc = max2(acc, a) if name == "Max" else min2(acc, a)
        return acc
    if name == "Identity":
        return x
    if name == "Where":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if name == "Cast":
        return _cast(x, dt, op.dtype)
    if name in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        sym = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}[name]
        return f"({args[0]} {sym} {args[1]})"
    if name == "DequantizeLinear":  # (x - zero point) * scale: the difference is exact
        return f"((float)((int32_t){x} - (int32_t){args[2]}) * {args[1]})"
    if name == "QuantizeLinear":  # x / scale rounded half to even, plus the zero point, saturated; NaN: the least
        lo, hi = (-128, 127) if op.dtype == "int8" else (0, 255)
        q = f"(rintf({x} / {args[1]}) + (float){args[2]})"
        return f"(({C_TYPE[op.dtype]})(!({q} >= {lo}.0f) ? {lo}.0f : ({q} > {hi}.0f ? {hi}.0f : {q})))"
    if name == "Not":
        return f"(!{x})"
    if name in ("And", "Or", "Xor"):
        sym = {"And": "&&", "Or": "||", "Xor": "^"}[name]
        return f"(({args[0]}) {sym} ({args[1]}))"
    raise NotImplementedError(f"no C expression for the elementwise op {name}")


OPS = ("Add", "Sub", "Mul", "Div", "Neg", "Abs", "Sign", "Relu", "LeakyRelu", "Elu", "Celu", "Selu",
       "ThresholdedRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Floor", "Ceil",
       "Round", "Softplus", "Softsign", "Mish", "Gelu", "Reciprocal", "Pow", "Clip", "Min", "Max", "Identity",
       "Where", "Cast", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
       "DequantizeLinear", "QuantizeLinear")


def body(prog: EwProgram, read) -> tuple[list[str], dict[str, str]]:
    """The statements that evaluate `prog` on scalars; `read(i)` is the C expression of input i. Returns (the
    statements, the C variable of each program value)."""
    var: dict[str, str] = {}
    dts: dict[str, str] = {}
    lines = []
    for i, v in enumerate(prog.inputs):
        var[v.name] = f"a{i}"
        dts[v.name] = v.dtype
        value = read(i)
        lines.append(f"const {C_TYPE[v.dtype]} a{i} = {f'({value} != 0)' if v.dtype == 'bool' else value};")
    for j, (name, (value, dt)) in enumerate(prog.consts.items()):
        var[name] = f"c{j}"
        dts[name] = dt
        lines.append(f"const {C_TYPE[dt]} c{j} = {literal(value, dt)};")
        lines.append(f"(void)c{j};")  # a constant an op reads as an attribute (Pow's exponent) is not used
    for j, op in enumerate(prog.ops):
        args = [var[a] if a else "" for a in op.args]
        arg_dts = [dts[a] for a in op.args if a]
        lines.append(f"const {C_TYPE[op.dtype]} t{j} = {expression(op, args, arg_dts)};")
        var[op.out] = f"t{j}"
        dts[op.out] = op.dtype
    return lines, var
