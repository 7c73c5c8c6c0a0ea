/* The qconv packing's word helpers (exec.c; tests/kinds/test_qconv_words.py builds this header alone and checks
   each variant against numpy): a packed panel is [groups][QC_PANEL pixels][4 bytes], each pixel's 4 k one word:
   their sums, copies and the interleave of 4 rows of bytes into words.
   Needs QC_PANEL (16), <stdint.h> and, on x86-64, <immintrin.h>. */

/* s[t]: the sum of pixel t's bytes over the panel's groups (read signed where `is_signed`). On x86 a word's 4
   bytes are summed in lanes: with AVX-512BW or AVX2, bytes times 1 into pairs (vpmaddubsw: u8 operand first, so s8
   bytes go second) and pairs times 1 into the word (vpmaddwd); with SSE2 (every x86-64) by masks and shifts, s8
   bytes flipped to u8 by + 128 and the 4 x 128 taken off per group. */
__attribute__((unused)) static void qc_asum_scalar(int32_t *s, const uint8_t *p, int64_t groups, int is_signed) {
  for (int t = 0; t < QC_PANEL; t++) s[t] = 0;
  for (int64_t g = 0; g < groups; g++)
    for (int t = 0; t < QC_PANEL; t++) {
      const uint8_t *q = p + g * QC_PANEL * 4 + 4 * t;
      if (is_signed)
        s[t] += (int32_t)(int8_t)q[0] + (int8_t)q[1] + (int8_t)q[2] + (int8_t)q[3];
      else
        s[t] += (int32_t)q[0] + q[1] + q[2] + q[3];
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512bw"))) static void qc_asum_avx512(int32_t *s, const uint8_t *p, int64_t groups,
                                                               int is_signed) {
  const __m512i ones8 = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1);
  __m512i acc = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; g++) {
    __m512i x = _mm512_loadu_si512((const void *)(p + g * QC_PANEL * 4));
    __m512i pairs = is_signed ? _mm512_maddubs_epi16(ones8, x) : _mm512_maddubs_epi16(x, ones8);
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, ones16));
  }
  _mm512_storeu_si512((void *)s, acc);
}

__attribute__((target("avx2"))) static void qc_asum_avx2(int32_t *s, const uint8_t *p, int64_t groups,
                                                         int is_signed) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int64_t g = 0; g < groups; g++)
    for (int h = 0; h < 2; h++) {
      __m256i x = _mm256_loadu_si256((const __m256i *)(p + g * QC_PANEL * 4 + 32 * h));
      __m256i pairs = is_signed ? _mm256_maddubs_epi16(ones8, x) : _mm256_maddubs_epi16(x, ones8);
      acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(pairs, ones16));
    }
  _mm256_storeu_si256((__m256i *)s, acc[0]);
  _mm256_storeu_si256((__m256i *)(s + 8), acc[1]);
}

static void qc_asum_sse2(int32_t *s, const uint8_t *p, int64_t groups, int is_signed) {
  const __m128i bytes = _mm_set1_epi32(0x00ff00ff), halves = _mm_set1_epi32(0xffff);
  const __m128i flip = _mm_set1_epi32(is_signed ? (int)0x80808080u : 0);
  __m128i acc0 = _mm_setzero_si128(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
#define QC_ASUM4(acc, v)                                                                                           \
  do {                                                                                                             \
    __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(q + 16 * (v))), flip);                             \
    __m128i pairs = _mm_add_epi32(_mm_and_si128(x, bytes), _mm_and_si128(_mm_srli_epi32(x, 8), bytes));            \
    acc = _mm_add_epi32(acc, _mm_add_epi32(_mm_and_si128(pairs, halves), _mm_srli_epi32(pairs, 16)));              \
  } while (0)
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t *q = p + g * QC_PANEL * 4;
    QC_ASUM4(acc0, 0);
    QC_ASUM4(acc1, 1);
    QC_ASUM4(acc2, 2);
    QC_ASUM4(acc3, 3);
  }
#undef QC_ASUM4
  __m128i off = _mm_set1_epi32(is_signed ? (int)(4 * 128 * groups) : 0);
  _mm_storeu_si128((__m128i *)s, _mm_sub_epi32(acc0, off));
  _mm_storeu_si128((__m128i *)(s + 4), _mm_sub_epi32(acc1, off));
  _mm_storeu_si128((__m128i *)(s + 8), _mm_sub_epi32(acc2, off));
  _mm_storeu_si128((__m128i *)(s + 12), _mm_sub_epi32(acc3, off));
}
#endif


static void qc_words_asum(int32_t *s, const uint8_t *p, int64_t groups, int is_signed) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx512bw"))
    qc_asum_avx512(s, p, groups, is_signed);
  else if (__builtin_cpu_supports("avx2"))
    qc_asum_avx2(s, p, groups, is_signed);
  else
    qc_asum_sse2(s, p, groups, is_signed);
#else
  qc_asum_scalar(s, p, groups, is_signed);
#endif
}

/* o[t] = s[t * step] ^ flip for t < n <= QC_PANEL, never reading past s[(n - 1) * step]: with AVX-512F one vector
   (steps 1 and 2; a partial run through masks), else SSE2 4 words at a time (every x86-64), else a word at a time. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) static void qc_copy_words_avx512(uint32_t *o, const uint32_t *s, int n,
                                                                    int64_t step, uint32_t flip) {
  const __m512i f = _mm512_set1_epi32((int)flip);
  if (n <= 0) return;
  __mmask16 m = (__mmask16)((1u << n) - 1);
  if (step == 1) {
    if (n == 16)
      _mm512_storeu_si512((void *)o, _mm512_xor_si512(_mm512_loadu_si512((const void *)s), f));
    else
      _mm512_mask_storeu_epi32(o, m, _mm512_xor_si512(_mm512_maskz_loadu_epi32(m, s), f));
    return;
  }
  int reads = 2 * n - 1; /* step 2: words 0 .. 2n - 2, the even ones kept */
  __mmask16 m0 = (__mmask16)(reads >= 16 ? 0xffffu : (1u << reads) - 1);
  __mmask16 m1 = (__mmask16)(reads > 16 ? (1u << (reads - 16)) - 1 : 0u);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  __m512i x = _mm512_permutex2var_epi32(_mm512_maskz_loadu_epi32(m0, s), even, _mm512_maskz_loadu_epi32(m1, s + 16));
  _mm512_mask_storeu_epi32(o, m, _mm512_xor_si512(x, f));
}
#endif

static void qc_copy_words(uint32_t *restrict o, const uint32_t *restrict s, int n, int64_t step, uint32_t flip) {
  int t = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if ((step == 1 || step == 2) && __builtin_cpu_supports("avx512f")) {
    qc_copy_words_avx512(o, s, n, step, flip);
    return;
  }
  const __m128i f = _mm_set1_epi32((int)flip);
  if (step == 1)
    for (; t + 4 <= n; t += 4)
      _mm_storeu_si128((__m128i *)(o + t), _mm_xor_si128(_mm_loadu_si128((const __m128i *)(s + t)), f));
  else if (step == 2)
    for (; t + 5 <= n; t += 4) { /* words 2t .. 2t + 7 read, the even ones kept */
      __m128 lo = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)(s + 2 * t)));
      __m128 hi = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)(s + 2 * t + 4)));
      __m128i even = _mm_castps_si128(_mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
      _mm_storeu_si128((__m128i *)(o + t), _mm_xor_si128(even, f));
    }
#endif
  for (; t < n; t++) o[t] = s[t * step] ^ flip;
}

/* out[t] = the 4 bytes of pixel t from 4 rows of 16: with AVX-512 VBMI one byte permute of the 4 rows side by side,
   else a fixed trip count and no aliasing, which the compiler vectorizes (SSE2's unpacks). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512vbmi,avx512bw"))) static void qc_interleave_vbmi(uint32_t *out, const uint8_t *r0,
                                                                             const uint8_t *r1, const uint8_t *r2,
                                                                             const uint8_t *r3) {
  /* byte 4t + q of the output is byte t of row q, which sits at 16q + t in the four rows' vector */
  const __m512i order = _mm512_set_epi8(63, 47, 31, 15, 62, 46, 30, 14, 61, 45, 29, 13, 60, 44, 28, 12, 59, 43, 27,
                                        11, 58, 42, 26, 10, 57, 41, 25, 9, 56, 40, 24, 8, 55, 39, 23, 7, 54, 38, 22, 6,
                                        53, 37, 21, 5, 52, 36, 20, 4, 51, 35, 19, 3, 50, 34, 18, 2, 49, 33, 17, 1, 48,
                                        32, 16, 0);
  __m512i rows = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)r0));
  rows = _mm512_inserti32x4(rows, _mm_loadu_si128((const __m128i *)r1), 1);
  rows = _mm512_inserti32x4(rows, _mm_loadu_si128((const __m128i *)r2), 2);
  rows = _mm512_inserti32x4(rows, _mm_loadu_si128((const __m128i *)r3), 3);
  _mm512_storeu_si512((void *)out, _mm512_permutexvar_epi8(order, rows));
}
#endif

static void qc_interleave_plain(uint32_t *restrict out, const uint8_t *restrict r0, const uint8_t *restrict r1,
                                const uint8_t *restrict r2, const uint8_t *restrict r3) {
  for (int t = 0; t < QC_PANEL; t++)
    out[t] = (uint32_t)r0[t] | (uint32_t)r1[t] << 8 | (uint32_t)r2[t] << 16 | (uint32_t)r3[t] << 24;
}

static void qc_interleave(uint32_t *restrict out, const uint8_t *restrict r0, const uint8_t *restrict r1,
                          const uint8_t *restrict r2, const uint8_t *restrict r3) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx512vbmi")) {
    qc_interleave_vbmi(out, r0, r1, r2, r3);
    return;
  }
#endif
  qc_interleave_plain(out, r0, r1, r2, r3);
}

