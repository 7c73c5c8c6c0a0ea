"""A loop-nest IR with schedule primitives, lowered to LLVM IR: the schedule space that tuners search.

    from onnxopt.codegen import loopnest as ln

    A = ln.placeholder((M, K), "A")
    B = ln.placeholder((K, N), "B")
    k = ln.reduce_axis(K, "k")
    C = ln.compute((M, N), lambda i, j: ln.sum(A[i, k] * B[k, j], axis=k), name="C")

    s = ln.Schedule(C)
    i, j = s.axes
    jo, ji = s.split(j, 16)
    s.reorder(i, jo, k, ji)
    s.vectorize(ji)
    s.parallel(i)
    kernel = ln.build(s, target)          # kernel.ir: LLVM IR text; kernel.object_code(): native object
    ln.JitFunction(kernel)(a, b, c)       # run it here, on numpy arrays

Pieces: `te` (placeholders, compute, reductions), `schedule` (split, reorder, fuse, vectorize, unroll, parallel,
tensorize), `lower` (schedule -> loop nest), `codegen` (loop nest -> LLVM IR), `tensorize` (tensor intrinsics),
`build` and `jit`. No primitive changes what is computed; see `schedule` for when results are bit-identical.

Calling convention of a generated kernel
----------------------------------------
    void name(ptr buf_0, ..., ptr buf_n, int64 begin, int64 end)

* Buffers: the placeholders the compute reads, in creation order (or the `inputs` order given to `build`), then
  the output. Each is a dense row-major array of its tensor's dtype (float32 or int32), aligned to its element
  size. The output must not overlap any input (the pointers are `noalias`); inputs may overlap each other.
* Range: the function runs the iterations [begin, end) of its outermost loop, the range loop, clamped to
  [0, range_extent) (`Kernel.range_extent`). Calling it on [0, range_extent) computes the whole output; calls on
  disjoint ranges write disjoint parts of the output and read nothing another range writes, so they can run on
  different threads in any order, and together they compute exactly what one call does. `Kernel.parallel` says
  that the schedule marked that loop parallel: the caller (the C glue, through onnxruntime's thread pool) is meant
  to split it. When the outermost loop is a reduce loop, the range loop is a loop of extent 1 around the nest.
"""

from .build import Kernel, build, emit_function
from .expr import (
    Expr,
    IterVar,
    all_of,
    any_of,
    cast,
    equal,
    exp,
    if_then_else,
    maximum,
    minimum,
    not_equal,
    sqrt,
)
from .jit import JitFunction
from .lower import LoweredNest, lower
from .schedule import MAX_UNROLL, Schedule, ScheduleError
from .te import Tensor, compute, placeholder, reduce_axis, reduce_max, reduce_min, sum
from .tensorize import Operand, TensorIntrinsic, row_fma_f32

__all__ = [
    "MAX_UNROLL",
    "Expr",
    "IterVar",
    "JitFunction",
    "Kernel",
    "LoweredNest",
    "Operand",
    "Schedule",
    "ScheduleError",
    "Tensor",
    "TensorIntrinsic",
    "all_of",
    "any_of",
    "build",
    "cast",
    "compute",
    "emit_function",
    "equal",
    "exp",
    "if_then_else",
    "lower",
    "maximum",
    "minimum",
    "not_equal",
    "placeholder",
    "reduce_axis",
    "reduce_max",
    "reduce_min",
    "row_fma_f32",
    "sqrt",
    "sum",
]
