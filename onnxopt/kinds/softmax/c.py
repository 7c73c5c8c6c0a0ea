"""The kernel as plain C for the C backend: the same functions (rows or columns) and passes as lower.py's LLVM IR."""

from __future__ import annotations

from onnxopt.backends.c import compile_c
from onnxopt.codegen.elementwise.types import ONNX_ENUM

from .desc import SoftmaxKernelDesc


def rows_source(symbol: str, op: str, columns: bool = False) -> str:
    if columns:
        return columns_source(symbol, op)
    if op == "softmax":
        second = "yr[j] = e;\n      s += e;"
        third = "const float inv = 1.0f / s;\n    for (int64_t j = 0; j < n; j++) yr[j] *= inv;"
    else:
        second = "s += e;"
        third = "const float ls = logf(s);\n    for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - m) - ls;"
    return f"""#include "kernel.h"
void {symbol}(const float *restrict x, float *restrict y, int64_t rows, int64_t n, int64_t inner) {{
  (void)inner;
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


def columns_source(symbol: str, op: str) -> str:
    """Column c's element k at x[c + k * inner]; the loops over c are innermost so that they vectorize."""
    if op == "softmax":
        second = "y[c + k * inner] = e;\n        s[c] += e;"
        third = "for (int64_t c = 0; c < count; c++) y[c + k * inner] *= 1.0f / s[c];"
    else:
        second = "s[c] += e;"
        third = "for (int64_t c = 0; c < count; c++) y[c + k * inner] = (x[c + k * inner] - m[c]) - logf(s[c]);"
    return f"""#include "kernel.h"
#define BLOCK 64
static void block(const float *restrict x, float *restrict y, int64_t count, int64_t n, int64_t inner) {{
  float m[BLOCK], s[BLOCK];
  for (int64_t c = 0; c < count; c++) {{ m[c] = -INFINITY; s[c] = 0.0f; }}
  for (int64_t k = 0; k < n; k++)
    for (int64_t c = 0; c < count; c++) m[c] = m[c] > x[c + k * inner] ? m[c] : x[c + k * inner];
  for (int64_t k = 0; k < n; k++)
    for (int64_t c = 0; c < count; c++) {{
        const float e = expf(x[c + k * inner] - m[c]);
        {second}
    }}
  for (int64_t k = 0; k < n; k++) {third}
}}
void {symbol}(const float *restrict x, float *restrict y, int64_t count, int64_t n, int64_t inner) {{
  for (int64_t c = 0; c < count; c += BLOCK)
    block(x + c, y + c, count - c < BLOCK ? count - c : BLOCK, n, inner);
}}
"""


def build(region, target) -> tuple[bytes, SoftmaxKernelDesc, str]:
    p = region.params
    symbol = f"{region.op_type}_{'columns' if p.columns else 'rows'}"
    source = rows_source(symbol, p.op, p.columns)
    desc = SoftmaxKernelDesc(op_type=region.op_type, in_types=[ONNX_ENUM["float32"]],
                             out_types=[ONNX_ENUM["float32"]], axis=p.axis, columns=p.columns,
                             rows=symbol)
    return compile_c(source, target), desc, source
