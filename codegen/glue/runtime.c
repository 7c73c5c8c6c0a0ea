/* The runtime every library shares: the call buffers, the fallbacks' helpers. The executors of the kinds
   follow it in the runtime's translation unit (codegen/glue/kinds.py writes it), then register.c. */
typedef struct {
  OnnxoptCustomOp base; /* first, so an OnnxoptCustomOp* is also an onnxopt_op* */
  const onnxopt_sig *desc;
  unsigned long long calls; /* Compute calls of this op in this process (onnxopt_compute_counts) */
} onnxopt_op;

/* The per-library tables (library.py, library_source) that this runtime reads. */
extern const onnxopt_sig *const ONNXOPT_OPS[];
extern void *onnxopt_seq_arenas[];
extern const int onnxopt_n_seqs;
extern const int onnxopt_n_ops;
extern const double onnxopt_inline_flops;
extern const char onnxopt_execution_provider[]; /* the target's (codegen/target.py, execution_provider) */
int onnxopt_cpu_ok(void);

static OrtApiTable g_api; /* what the executors call: onnxruntime's table with sequence_exec.c's stand-ins */
static OrtApiTable g_ort;  /* onnxruntime's own entries */
static void *g_ort_copy[API_KernelContext_ParallelFor + 1];

/* The run of a sequence op (sequence_exec.c) whose driver this thread is, or NULL. */
typedef struct seq_run seq_run;
static _Thread_local seq_run *tl_seq;
static double seq_inline_flops(void); /* CT_INLINE_FLOPS: lower inside a sequence, whose helpers are awake */

static OrtStatus *fail(int code, const char *msg) { return API(CreateStatus)(code, msg); }

/* A GEMM's tasks (the int8 kinds'): `ops` of work on a grid of na column panels x nb row blocks, split into
   *ta x *tb tasks, at least ops / min_ops of them (max_tasks at most, as the grid allows: a single row splits its
   panels), with the least traffic: each of the *ta panel ranges reads `per_a` (the rows' data) and each of the *tb
   row ranges reads `per_b` (the panels' data). */
static void grid_split(double ops, double min_ops, int64_t max_tasks, int64_t na, int64_t nb, double per_a,
                       double per_b, int64_t *ta, int64_t *tb) {
  int64_t want = (int64_t)(ops / min_ops);
  if (want > max_tasks) want = max_tasks;
  if (want < 1) want = 1;
  if (want > na * nb) want = na * nb;
  *ta = na < want ? na : want;
  *tb = 1;
  double best = -1.0;
  for (int64_t a = 1; a <= na; a++) {
    int64_t b = (want + a - 1) / a;
    if (b > nb) continue; /* too few tasks this way */
    double cost = per_a * (double)a + per_b * (double)b;
    if (best < 0.0 || cost < best) {
      best = cost;
      *ta = a;
      *tb = b;
    }
    if (b == 1) break;
  }
}

/* float32 to bfloat16, round to nearest even (as vcvtneps2bf16 and the offline packing round). */
static inline uint16_t glue_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays a (quiet) NaN */
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* A float16's value (exact in float32: subnormals, infinities and NaNs included). */
static inline float glue_f16_value(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, u;
  if (e == 0x1Fu) {
    u = sign | 0x7F800000u | (m << 13);
  } else if (e) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else { /* zero or a subnormal: m * 2^-24 */
    float f = (float)m * 0x1p-24f;
    memcpy(&u, &f, sizeof(u));
    u |= sign;
  }
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* glue_bf16 16 floats at a time on AVX-512 integer lanes, for as many whole vectors as n holds; returns how many it
   converted. Only for kernels that run on AVX-512 CPUs. */
__attribute__((target("avx512f"))) static int64_t glue_bf16_run16(uint16_t *dst, const float *src, int64_t n) {
  const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), inf = _mm512_set1_epi32(0x7F800000);
  const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), quiet = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absmask), inf);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), quiet));
    _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
  }
  return i;
}
#endif

/* Input i of a call: its dims (at most MAX_RANK), its rank and its data (the kinds' executors). */
static OrtStatus *glue_input(OrtKernelContext *ctx, int i, int64_t *dims, size_t *rank, const void **data) {
  const OrtValue *in;
  OrtTensorTypeAndShapeInfo *info;
  CHECK(API(KernelContext_GetInput)(ctx, i, &in));
  CHECK(API(GetTensorTypeAndShape)(in, &info));
  OrtStatus *st = API(GetDimensionsCount)(info, rank);
  if (!st && *rank > MAX_RANK) st = fail(ORT_INVALID_ARGUMENT, "onnxopt: an input of rank above MAX_RANK");
  if (!st) st = API(GetDimensions)(info, dims, *rank);
  API(ReleaseTensorTypeAndShapeInfo)(info);
  if (!st) st = API(GetTensorMutableData)((OrtValue *)in, (void **)data);
  return st;
}

/* Buffers for one call (padded copies, blocked scratch, Winograd products), 64-byte aligned, released with
   glue_release. The library keeps the last GLUE_CACHE_SLOTS released ones for the next calls, so a run's kernels
   take over each other's buffers instead of a fresh malloc per call. With the same kernels (one library linked
   with either glue), NASNet-A ran 1.10x faster, ResNet-50 1.02x, UNet-16 1.04x. A warm session page-faulted no
   more without the cache than with it (0 minor faults a run in both), so the gain is not the mmap of fresh blocks;
   the likeliest cause (not measured) is that a reused block is still in cache.
   One cache for the process, under a spin lock (a few slots scanned; calls and Winograd tasks take it once each):
   a cache per thread leaked with every session, whose pool threads exit with it (1.8 MB a session on UNet-16).
   It holds GLUE_CACHE_BYTES at most and is freed when the library is unloaded. */
#define GLUE_CACHE_SLOTS 16
#define GLUE_CACHE_BYTES ((size_t)64 << 20) /* larger ones are freed: one large batch must not pin them */
#define GLUE_HEADER 64 /* keeps the block's capacity; the caller's pointer stays 64-byte aligned */

static void *glue_cache[GLUE_CACHE_SLOTS];
static size_t glue_cached_bytes;
static atomic_flag glue_lock = ATOMIC_FLAG_INIT;
static int64_t glue_fresh; /* buffers allocated so far (not taken from the cache), for onnxopt_fresh_buffers */

/* How many call buffers the library has allocated rather than reused: a warm session's count stays put. */
__attribute__((visibility("default"))) int64_t onnxopt_fresh_buffers(void) {
  return __atomic_load_n(&glue_fresh, __ATOMIC_RELAXED);
}

/* The library's CT_INLINE_FLOPS (compute_exec.c), for the tests and for tools that inspect a library. */
__attribute__((visibility("default"))) double onnxopt_inline_threshold(void) { return onnxopt_inline_flops; }

static void glue_acquire(void) {
  while (atomic_flag_test_and_set_explicit(&glue_lock, memory_order_acquire)) {
  }
}

static void glue_unlock(void) { atomic_flag_clear_explicit(&glue_lock, memory_order_release); }

static size_t glue_capacity(const void *block) { return *(const size_t *)block; }

static void *glue_bytes(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  char *block = NULL;
  glue_acquire();
  int best = -1;
  for (int i = 0; i < GLUE_CACHE_SLOTS; i++) /* the smallest cached block that is large enough */
    if (glue_cache[i] && glue_capacity(glue_cache[i]) >= bytes &&
        (best < 0 || glue_capacity(glue_cache[i]) < glue_capacity(glue_cache[best])))
      best = i;
  if (best >= 0) {
    block = (char *)glue_cache[best];
    glue_cache[best] = NULL;
    glue_cached_bytes -= glue_capacity(block);
  }
  glue_unlock();
  if (!block) {
    block = (char *)aligned_alloc(64, bytes + GLUE_HEADER);
    if (!block) return NULL;
    __atomic_add_fetch(&glue_fresh, 1, __ATOMIC_RELAXED);
    *(size_t *)block = bytes;
  }
  return block + GLUE_HEADER;
}

static float *glue_floats(size_t floats) { return (float *)glue_bytes(floats * sizeof(float)); }

int sched_yield(void); /* <sched.h> hides it under -std=c11 */

/* One round of a spin wait: the CPU told this thread is waiting (pause, yield), for the executors that wait on a
   running thread's work (sequence_exec.c, the recurrent kind's shared steps). */
static void glue_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* A wait on work another thread holds: `limit` rounds of glue_cpu_relax, then a yield each round (it may share
   this thread's CPU). */
static void glue_pause(unsigned *spins, unsigned limit) {
  if (*spins < limit) {
    ++*spins;
    glue_cpu_relax();
    return;
  }
  sched_yield();
}

static void glue_release(void *p) {
  if (!p) return;
  char *block = (char *)p - GLUE_HEADER;
  size_t cap = glue_capacity(block);
  if (cap > GLUE_CACHE_BYTES) {
    free(block);
    return;
  }
  void *drop[GLUE_CACHE_SLOTS + 1]; /* freed after the lock is let go */
  int n_drop = 0;
  glue_acquire();
  int slot = -1;
  for (int i = 0; i < GLUE_CACHE_SLOTS && slot < 0; i++)
    if (!glue_cache[i]) slot = i;
  if (slot < 0) { /* full: the block replaces the smallest cached one, if it is larger */
    for (int i = 0; i < GLUE_CACHE_SLOTS; i++)
      if (slot < 0 || glue_capacity(glue_cache[i]) < glue_capacity(glue_cache[slot])) slot = i;
    if (glue_capacity(glue_cache[slot]) >= cap) slot = -1;
  }
  if (slot < 0) {
    drop[n_drop++] = block;
  } else {
    if (glue_cache[slot]) {
      glue_cached_bytes -= glue_capacity(glue_cache[slot]);
      drop[n_drop++] = glue_cache[slot];
      glue_cache[slot] = NULL;
    }
    while (glue_cached_bytes + cap > GLUE_CACHE_BYTES) { /* over the budget: drop the largest others first */
      int big = -1;
      for (int i = 0; i < GLUE_CACHE_SLOTS; i++)
        if (glue_cache[i] && (big < 0 || glue_capacity(glue_cache[i]) > glue_capacity(glue_cache[big]))) big = i;
      glue_cached_bytes -= glue_capacity(glue_cache[big]);
      drop[n_drop++] = glue_cache[big];
      glue_cache[big] = NULL;
    }
    glue_cache[slot] = block;
    glue_cached_bytes += cap;
  }
  glue_unlock();
  for (int i = 0; i < n_drop; i++) free(drop[i]);
}

/* dlclose (onnxruntime unloads the library with the last session options that registered it): the cached blocks
   go with it. */
__attribute__((destructor)) static void glue_free_cache(void) {
  for (int i = 0; i < GLUE_CACHE_SLOTS; i++) {
    free(glue_cache[i]);
    glue_cache[i] = NULL;
  }
  glue_cached_bytes = 0;
}

