"""Checking that an optimized model (or one fused kernel) computes what the original computes.

Random inputs are drawn per dtype (floats ~ N(0, 2^2) so activations see both sides of their kinks, integers in
[0, 2) so indices stay valid (even a two-entry token-type table), booleans fair coins); symbolic dims take the values of `bindings` (default 1).
Floating outputs must satisfy |a - b| <= atol + rtol * |b| + stol * max|b| over the finite values (max|b| the largest
finite one), with NaN exactly where the reference has NaN and inf where it has an inf of the same sign; others must be
equal. The last term is float rounding: a value that comes out near zero from terms that cancel carries the
rounding error of those terms, which scales with the output's largest magnitude, not with its own (a random-weight
ResNet-50's logits reach 1600, and one near 3 differs by 4e-3 when only the summation order changes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxopt.errors import InputError, UsageError

DEFAULT_RTOL = {"float32": 1e-3, "float64": 1e-7, "float16": 1e-2}
DEFAULT_ATOL = {"float32": 1e-4, "float64": 1e-9, "float16": 1e-3}
DEFAULT_STOL = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-3}  # about 80 float32 epsilons of the largest |b|
KERNEL_RTOL = {"float32": 1e-5, "float64": 1e-12}
KERNEL_ATOL = {"float32": 1e-5, "float64": 1e-12}


@dataclass
class Tolerance:
    rtol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RTOL))
    atol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ATOL))
    stol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STOL))  # a fraction of the largest |b|

    @classmethod
    def parse(cls, rtol: list[str] | float | None, atol: list[str] | float | None,
              stol: list[str] | float | None = None) -> Tolerance:
        """`--rtol 1e-4` (every float dtype) or `--rtol float32:1e-4` (one dtype), repeatable."""
        t = cls()
        for values, table, flag in ((rtol, t.rtol, "--rtol"), (atol, t.atol, "--atol"), (stol, t.stol, "--scale-tol")):
            if values is None:
                continue
            if isinstance(values, (int, float, str)):  # one value; a str iterated would give its characters
                values = [str(values)]
            for v in values:
                dt, sep, num = str(v).rpartition(":")
                try:
                    x = float(num)
                except ValueError:
                    raise UsageError(f"{flag} {v}: give a number, or dtype:number such as float32:1e-4") from None
                if not math.isfinite(x) or x < 0:
                    raise UsageError(f"{flag} {v}: give a finite number, 0 or more")
                if sep:
                    table[dt] = x
                else:
                    for k in list(table):
                        table[k] = x
        return t


# A model whose GEMM weights were lowered to bfloat16 or float16 (--precision, onnxopt/driver/precision.py) against
# its float32 original: 2% of the value, plus 1% of the output's largest magnitude, plus float32's absolute floor.
LOW_PRECISION_TOLERANCE = Tolerance({"float32": 0.02}, {"float32": 1e-4}, {"float32": 0.01})


def _shape(vi: onnx.ValueInfoProto, bindings: dict[str, int]) -> list[int]:
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:  # exporters write -1 for a dynamic dim
            dims.append(d.dim_value)
        else:
            dims.append(int(bindings.get(d.dim_param, 1)))
    return dims


# Random data for a check is made in memory: past this many elements (4 GiB of float32) a shape is a mistake.
MAX_RANDOM_ELEMENTS = 1 << 30


def random_array(shape, dtype: str, rng: np.random.Generator) -> np.ndarray:
    shape = [int(d) for d in shape]
    if any(d < 0 for d in shape):
        raise InputError(f"a tensor of shape {shape} has a negative dim: the model's shapes are invalid (an input "
                         "declared with -1, or a convolution whose window does not fit); fix the model, or give its "
                         "inputs' shapes with --input-shape")
    if math.prod(shape) > MAX_RANDOM_ELEMENTS:
        raise InputError(f"a tensor of shape {shape} is too large to check ({math.prod(shape):,} elements): give "
                         "the inputs' real shapes with --input-shape, or real inputs with --check-input")
    dt = np.dtype(dtype)
    if dt == np.float32:  # drawn in float32: a region check's inputs took 8 ms each in float64
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= 2.0
        return out
    if dt.kind == "f":
        return np.asarray(rng.standard_normal(shape) * 2.0, dtype=dt)
    if dt.kind in "iu":
        return np.asarray(rng.integers(0, 2, size=shape), dtype=dt)
    if dt.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    raise UsageError(f"cannot make random inputs of dtype {dtype}: give real ones with --check-input name:file.npy")


def make_inputs(model: onnx.ModelProto, bindings: dict[str, int] | None = None, seed: int = 0,
                given: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue  # IR < 4 style: weights listed as inputs keep their initializer values
        if given and vi.name in given:
            feeds[vi.name] = given[vi.name]
            continue
        if not vi.type.HasField("tensor_type"):
            raise UsageError(f"input {vi.name} is not a tensor: give it with --check-input {vi.name}:file.npy")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name
        feeds[vi.name] = random_array(_shape(vi, bindings or {}), dtype, rng)
    return feeds


def check_given_inputs(model: onnx.ModelProto, given: dict[str, np.ndarray]) -> None:
    """--check-input arrays must name real inputs and fit their dtype, rank and fixed dims."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    for name, arr in given.items():
        if name not in inputs:
            raise UsageError(f"--check-input names '{name}', but the model's inputs are: {', '.join(inputs)}")
        tt = inputs[name].type.tensor_type
        if not inputs[name].type.HasField("tensor_type"):
            continue
        want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if arr.dtype != want:
            raise UsageError(f"--check-input {name}: the file holds {arr.dtype}, the input is {want}; save it as "
                             f"{want} (np.save(path, a.astype('{want}')))")
        if tt.HasField("shape"):
            dims = list(tt.shape.dim)
            if len(dims) != arr.ndim:
                raise UsageError(f"--check-input {name}: the array has rank {arr.ndim} {list(arr.shape)}, the input "
                                 f"has rank {len(dims)}")
            for i, (d, n) in enumerate(zip(dims, arr.shape)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != n:  # -1: dynamic (Paddle)
                    raise UsageError(f"--check-input {name}: dim {i} is {n}, the model fixes it at {d.dim_value}")


def finite_scale(arrays) -> float:
    """The largest finite magnitude of `arrays` (0.0 if none): the scale of a tolerance, which an output that
    overflowed (inf) or a NaN must not make infinite (an infinite tolerance passes any answer)."""
    scale = 0.0
    for x in arrays:
        x = np.asarray(x)
        if x.dtype.kind == "f" and x.size:
            finite = x[np.isfinite(x)]
            if finite.size:
                scale = max(scale, float(np.max(np.abs(finite.astype(np.float64)))))
    return scale


@dataclass
class OutputDiff:
    name: str
    ok: bool
    max_abs: float
    max_rel: float
    detail: str = ""


def compare(names, expected, actual, tol: Tolerance) -> list[OutputDiff]:
    diffs = []
    for name, a, b in zip(names, expected, actual):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind == "f" and b.dtype.kind in "iu" and a.shape == b.shape:
            diffs.append(_compare_steps(name, a, b))
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            diffs.append(OutputDiff(name, False, float("inf"), float("inf"),
                                    f"shape/dtype {b.shape} {b.dtype} != expected {a.shape} {a.dtype}"))
            continue
        if a.dtype.kind == "f":
            dt = a.dtype.name
            scale = finite_scale([a])
            rtol = tol.rtol.get(dt, 1e-3)
            atol = tol.atol.get(dt, 1e-4) + tol.stol.get(dt, 0.0) * scale
            if not (math.isfinite(rtol) and math.isfinite(atol)):
                # A tolerance made from an overflowed output (a scale or spread of inf or NaN) would pass any
                # answer: judge by the dtype's default check instead, scaled by the finite values only.
                rtol = DEFAULT_RTOL.get(dt, 1e-3)
                atol = DEFAULT_ATOL.get(dt, 1e-4) + DEFAULT_STOL.get(dt, 0.0) * scale
            with np.errstate(all="ignore"):
                # inf matches only an inf of the same sign, NaN only a NaN (as allclose with equal_nan)
                ok = bool(np.allclose(b, a, rtol=rtol, atol=atol, equal_nan=True))
                special = int(np.count_nonzero((np.isnan(a) != np.isnan(b))
                                               | ((np.isinf(a) | np.isinf(b)) & (a != b))))
                finite = np.isfinite(a) & np.isfinite(b)
                err = np.abs(a[finite].astype(np.float64) - b[finite].astype(np.float64))
                max_abs = float(err.max()) if err.size else 0.0
                rel = err / np.maximum(np.abs(a[finite].astype(np.float64)), 1e-30)
                max_rel = float(rel.max()) if rel.size else 0.0
            detail = f"({special} of {a.size} values inf or NaN where the other is not, or inf of the other sign)" \
                if special else ""
            diffs.append(OutputDiff(name, ok, max_abs, max_rel, detail))
        else:
            ok = bool(np.array_equal(a, b))
            diffs.append(OutputDiff(name, ok, 0.0 if ok else float("nan"), 0.0 if ok else float("nan")))
    return diffs


# How close to the midpoint between two quantization steps a reference may lie for either step to be right: the
# reference is a float computation (a convolution of dequantized values), rounded at 1e-7 of its terms' magnitudes.
STEP_BAND = 0.01


def _compare_steps(name: str, steps: np.ndarray, got: np.ndarray) -> OutputDiff:
    """A quantized output against its value in quantization steps before rounding (measure.exact_integer_reference:
    x / scale + zero point, clamped to the type's range): it must be the nearest step, or either neighbour where the
    reference lies within STEP_BAND of the midpoint."""
    err = np.abs(got.astype(np.float64) - steps.astype(np.float64))
    worst = float(err.max(initial=0.0))
    off = int(np.count_nonzero(err > 0.5))
    ok = bool(worst <= 0.5 + STEP_BAND)
    return OutputDiff(name, ok, worst, 0.0, f"(in quantization steps; {off} of {err.size} one step off at a midpoint)"
                      if off and ok else "(in quantization steps)" if not ok else "")


def load_check_inputs(specs: list[str] | None) -> dict[str, np.ndarray]:
    out = {}
    for spec in specs or []:
        name, sep, path = spec.partition(":")
        if not sep:
            raise UsageError(f"--check-input {spec}: write it as name:file.npy")
        try:
            out[name] = np.asarray(np.load(path, allow_pickle=False))
        except (OSError, ValueError, EOFError) as e:
            raise UsageError(f"--check-input {spec}: cannot read {path} as .npy ({e})") from None
        if not isinstance(out[name], np.ndarray) or out[name].dtype.kind not in "biuf":
            raise UsageError(f"--check-input {spec}: {path} must hold one numeric or boolean array (.npy)")
    return out
