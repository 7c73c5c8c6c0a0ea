"""One elementwise region -> one native object and the glue's description of it."""

from __future__ import annotations

from onnxopt.fusion.elementwise_ops import TRANSCENDENTAL
from onnxopt.fusion.region import Region

from ..compile import compile_object, new_module
from ..glue.descs import EwKernelDesc
from ..target import Target
from .lower import lower_program
from .types import ITEMSIZE, ONNX_ENUM

# Waking onnxruntime's pool costs microseconds. A kernel of a few instructions per element streams at memory speed
# on one core and gains from a second only on large tensors; one with exp/erf/tanh per element is compute-bound
# and gains early. Measured on the development machine (BENCHMARKS.md).
PARALLEL_MIN_CHEAP = 1 << 20
PARALLEL_MIN_TRANSCENDENTAL = 1 << 15


def parallel_min(prog) -> int:
    """The kind's default: elements from which a call is split over onnxruntime's pool."""
    costly = any(o.op in TRANSCENDENTAL or (o.op == "Pow" and not float(o.attr("exponent")).is_integer())
                 for o in prog.ops)
    return PARALLEL_MIN_TRANSCENDENTAL if costly else PARALLEL_MIN_CHEAP


def build_elementwise(region: Region, target: Target) -> tuple[bytes, EwKernelDesc, str]:
    """Returns (object code, glue description, LLVM IR text)."""
    prog = region.program
    module = new_module(target, region.op_type)
    p = region.params
    syms = lower_program(module, prog, region.op_type, p.lanes or target.float32_lanes, target.features)
    ir_text = str(module)
    obj = compile_object(ir_text, target)
    return obj, describe(region, syms["variants"], syms["generic"]), ir_text


def describe(region: Region, variants: list[tuple[int, str]], generic: str) -> EwKernelDesc:
    """The glue's description of an elementwise region's kernel, whichever backend wrote its row functions."""
    prog = region.program
    return EwKernelDesc(
        op_type=region.op_type,
        in_types=[ONNX_ENUM[v.dtype] for v in prog.inputs],
        out_types=[ONNX_ENUM[v.dtype] for v in prog.outputs],
        in_sizes=[ITEMSIZE[v.dtype] for v in prog.inputs],
        out_sizes=[ITEMSIZE[v.dtype] for v in prog.outputs],
        out_rank=len(region.shape),
        out_deps=prog.output_dependencies(),
        parallel_min=region.params.parallel_min or parallel_min(prog),
        variants=variants,
        generic=generic,
    )
