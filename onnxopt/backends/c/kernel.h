/* What every C-backend kernel includes (onnxopt/backends/c): libm, fixed-width integers, and an exp the compiler can
   vectorize. glibc's expf is a call per element, which keeps a loop scalar (softmax rows ran 10x slower than the LLVM
   kernels); this one is branch-free arithmetic: exp(x) = 2^n * exp(r), n = rint(x / ln 2), r = x - n ln 2 in two
   parts (Cody and Waite), exp(r) by Cephes' degree-6 polynomial (under 2 ulp), 2^n applied in two factors so that
   results down to the denormals come out right. Overflow gives inf, -inf gives 0, NaN stays NaN. */
#ifndef ONNXOPT_C_KERNEL_H
#define ONNXOPT_C_KERNEL_H
#include <math.h>
#include <stdint.h>

static inline float onnxopt_pow2i(int32_t n) { /* 2^n for n in [-126, 127] */
  union { int32_t i; float f; } u;
  u.i = (n + 127) << 23;
  return u.f;
}

static inline float onnxopt_expf(float x) {
  const float hi = 88.72283935546875f, lo = -103.97208404541015625f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  xc = x == x ? xc : 0.0f; /* NaN: any finite value here, NaN chosen below */
  const float n = rintf(xc * 1.44269502162933349609375f);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t ni = (int32_t)n, n1 = ni / 2;
  float y = p * onnxopt_pow2i(n1) * onnxopt_pow2i(ni - n1);
  y = x > hi ? INFINITY : y;
  y = x < lo ? 0.0f : y;
  return x == x ? y : x;
}
#define expf onnxopt_expf

#endif
