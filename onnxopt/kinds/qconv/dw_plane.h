/* The depthwise executor's planes (exec.c qc_depthwise; tests/kinds/test_qconv_words.py builds this header alone
   and checks both paths against numpy): a channel's plane padded with the zero point and written as float. Needs
   <stdint.h> and, on x86-64, <immintrin.h>. */

/* One plane padded as float: each row converted 16 bytes at a time where the input has them (a row's last chunk
   reads past it, into the next row or plane, and writes past it, into the row's right padding: wp >= pl + w rounded
   up to 16, so never into the next row), then padded. gcc widens bytes to float lane by lane or 4 at a time, so the
   AVX-512 path is written with intrinsics (3 instructions for 16 bytes), taken where the CPU has it. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QC_HAS_AVX512_ROWS 1
static int qc_dw_avx512(void) { return __builtin_cpu_supports("avx512f"); }
__attribute__((target("avx512f"))) static void qc_dw_fill16(float *out, int64_t n, float za) {
  __m512 v = _mm512_set1_ps(za);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_storeu_ps(out + c, v);
  if (c < n) _mm512_mask_storeu_ps(out + c, (__mmask16)((1u << (n - c)) - 1), v);
}

__attribute__((target("avx512f"))) static void qc_dw_row16(float *out, const uint8_t *in, int64_t w, int is_signed) {
  for (int64_t c = 0; c < w; c += 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(in + c));
    __m512i x = is_signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
    _mm512_storeu_ps(out + c, _mm512_cvtepi32_ps(x));
  }
}
#else
static int qc_dw_avx512(void) { return 0; }
#endif

static void qc_dw_fill(float *out, int64_t n, float za, int avx512) {
#ifdef QC_HAS_AVX512_ROWS
  if (avx512) {
    qc_dw_fill16(out, n, za);
    return;
  }
#endif
  for (int64_t c = 0; c < n; c++) out[c] = za;
}

static void qc_dw_plane(float *restrict out, const uint8_t *restrict in, const uint8_t *end, int64_t h, int64_t w,
                        int64_t hp, int64_t wp, int64_t pt, int64_t pl, float za, int is_signed, int avx512) {
  for (int64_t y = 0; y < hp; y++) {
    float *restrict row = out + y * wp;
    int64_t iy = y - pt;
    if (iy < 0 || iy >= h) {
      qc_dw_fill(row, wp, za, avx512);
      continue;
    }
    const uint8_t *restrict src = in + iy * w;
    for (int64_t c = 0; c < pl; c++) row[c] = za;
#ifdef QC_HAS_AVX512_ROWS
    if (avx512 && src + (w + 15) / 16 * 16 <= end)
      qc_dw_row16(row + pl, src, w, is_signed);
    else
#endif
      for (int64_t c = 0; c < w; c++) row[pl + c] = is_signed ? (float)(int8_t)src[c] : (float)src[c];
    qc_dw_fill(row + pl + w, wp - pl - w, za, avx512);
  }
}

