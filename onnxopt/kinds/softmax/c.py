"""The row kernel as plain C for the C backend: the same function and passes as lower.py's LLVM IR."""

from __future__ import annotations

from onnxopt.backends.c import compile_c
from onnxopt.codegen.elementwise.types import ONNX_ENUM

from .desc import SoftmaxKernelDesc


def rows_source(symbol: str, op: str) -> str:
    if op == "softmax":
        second = "yr[j] = e;\n      s += e;"
        third = "const float inv = 1.0f / s;\n    for (int64_t j = 0; j < n; j++) yr[j] *= inv;"
    else:
        second = "s += e;"
        third = "const float ls = logf(s);\n    for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - m) - ls;"
    return f"""#include "kernel.h"
void {symbol}(const float *restrict x, float *restrict y, int64_t rows, int64_t n) {{
  for (int64_t r = 0; r < rows; r++) {{
    const float *xr = x + r * n;
    float *yr = y + r * n;
    float m = -INFINITY;
    #pragma omp simd reduction(max:m)
    for (int64_t j = 0; j < n; j++) m = m > xr[j] ? m : xr[j];
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < n; j++) {{
      const float e = expf(xr[j] - m);
      {second}
    }}
    {third}
  }}
}}
"""


def build(region, target) -> tuple[bytes, SoftmaxKernelDesc, str]:
    p = region.params
    symbol = f"{region.op_type}_rows"
    source = rows_source(symbol, p.op)
    desc = SoftmaxKernelDesc(op_type=region.op_type, in_types=[ONNX_ENUM["float32"]],
                             out_types=[ONNX_ENUM["float32"]], axis=p.axis, rows=symbol)
    return compile_c(source, target), desc, source
