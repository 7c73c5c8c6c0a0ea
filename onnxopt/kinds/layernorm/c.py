"""The row kernel as plain C for the C backend: the same function and three passes as lower.py's LLVM IR."""

from __future__ import annotations

from onnxopt.backends.c import compile_c
from onnxopt.backends.c.expr import literal
from onnxopt.codegen.elementwise.types import ONNX_ENUM

from .desc import LayerNormKernelDesc


def rows_source(symbol: str, p) -> str:
    if p.residual:
        keep = "sum + r * n" if p.sum_output else "yr"
        first = (f"float *vr = {keep};\n    const float *rr = r + off;\n"
                 "    #pragma omp simd reduction(+:acc)\n"
                 "    for (int64_t j = 0; j < n; j++) { const float v = xr[j] + rr[j]; vr[j] = v; acc += v; }")
    else:
        first = ("const float *vr = xr;\n    #pragma omp simd reduction(+:acc)\n"
                 "    for (int64_t j = 0; j < n; j++) acc += xr[j];")
    bias = " + beta[j]" if p.has_bias else ""
    return f"""#include "kernel.h"
void {symbol}(const float *x, const float *r, const float *gamma, const float *beta, float *y, float *sum,
              int64_t rows, int64_t n) {{
  const float inv_n = 1.0f / (float)n;
  (void)r; (void)beta; (void)sum;
  for (int64_t ri = 0; ri < rows; ri++) {{
    const int64_t off = ri * n;
    const float *xr = x + off;
    float *yr = y + off;
    float acc = 0.0f;
    {first}
    const float mean = acc * inv_n;
    float var = 0.0f;
    #pragma omp simd reduction(+:var)
    for (int64_t j = 0; j < n; j++) {{ const float d = vr[j] - mean; var += d * d; }}
    const float rstd = 1.0f / sqrtf(var * inv_n + {literal(p.epsilon, "float32")});
    for (int64_t j = 0; j < n; j++) yr[j] = (vr[j] - mean) * rstd * gamma[j]{bias};
  }}
}}
"""


def build(region, target) -> tuple[bytes, LayerNormKernelDesc, str]:
    p = region.params
    symbol = f"{region.op_type}_rows"
    source = rows_source(symbol, p)
    f32 = ONNX_ENUM["float32"]
    desc = LayerNormKernelDesc(op_type=region.op_type, in_types=[f32] * len(region.inputs),
                               out_types=[f32] * len(region.outputs), residual=p.residual, sum_output=p.sum_output,
                               has_bias=p.has_bias, rows=symbol)
    return compile_c(source, target), desc, source
