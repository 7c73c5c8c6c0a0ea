/* ---- Pools (MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool) with fused epilogues. ----
 *
 * The pool kind's executor (codegen/glue/kinds.py). The generated functions (codegen/pool/kernels.py) do the arithmetic; this
 * file follows onnxruntime's shape rules, makes the average's divisor tables and splits the work over ORT's pool.
 *
 * Windowed pools (NCHW, 2-D). Output sizes, pads and average divisors follow onnxruntime 1.31 (checked against it
 * in tests/codegen/test_pool_kernels.py; older releases may differ in ceil mode):
 * - SAME_UPPER/SAME_LOWER pad (ceil(in / s) - 1) * s + k - in in total, with the undilated kernel, split with C's
 *   truncating division (the head gets the smaller half for SAME_UPPER);
 * - out = (in + pads - d * (k - 1) - 1) / s + 1, truncating; with ceil_mode rounded up, then one less if the last
 *   window would start in the tail padding ((out - 1) * s >= in + head pad);
 * - a window's taps past in + tail pad count for nothing in an average, even inside the image (a negative tail pad);
 *   count_include_pad=1 divides by the taps before that point, count_include_pad=0 by the taps in the image;
 * - max starts from the lowest float, so a window with no tap in the image gives -FLT_MAX, like onnxruntime.
 * The work is a list of units, one band of output rows of one (n, c) plane each; the kernel reads the input in place
 * (masked loads at the image's edges, a shared row of padding above and below it).
 *
 * Global pools (any rank >= 3): one call reduces `lanes` channels of one batch item.
 */

enum { PX_POSITION = 0, PX_CHANNEL = 1, PX_COLUMN = 2, PX_SCALAR = 3 }; /* epilogue input kinds */
/* The descriptor's schedule (codegen/pool/desc.py, the pool kind's space in onnxopt/kinds/builtin.py): at most
   d->max_tasks tasks, and one thread below d->inline_work taps. */
#define POOL_TASK_MIN_WORK 65536.0   /* taps (or elements read) per task, at least */
#define POOL_BAND_BYTES 16384        /* input rows of a band, read once per strip of output columns */

/* Tasks for `work` taps over `units` independent units: one below d->inline_work, else one per
   POOL_TASK_MIN_WORK, at most d->max_tasks and at most one per unit. */
static int64_t pool_task_count(const onnxopt_pool_desc *d, double work, int64_t units) {
  int64_t tasks = work < d->inline_work ? 1 : (int64_t)(work / POOL_TASK_MIN_WORK);
  if (tasks > d->max_tasks) tasks = d->max_tasks;
  if (tasks > units) tasks = units;
  return tasks < 1 ? 1 : tasks;
}

/* POOL_MAX_OUT, POOL_MAX_EXTRA and the kernels' record pool_args: codegen/glue/contract.py, POOL_ARGS. */

typedef struct {
  const onnxopt_pool_desc *d;
  const char *x; /* bytes: float32, or uint8 / int8 for a windowed MaxPool */
  int64_t es;    /* bytes per element */
  int64_t N, C, H, W, He, We, OH, OW, pt, pl, HW;
  int64_t band_rows, bands, units, tasks;
  const void *padrow;
  const float *inv_h, *inv_w;
  char *out[POOL_MAX_OUT];
  const float *extra[POOL_MAX_EXTRA];
  int64_t extra_count[POOL_MAX_EXTRA]; /* elements per batch item */
} pool_job;

static int64_t pool_ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : a / b; }

/* onnxruntime's output size and pads along one axis. */
static int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t dil, int auto_pad, int ceil_mode,
                             int64_t *head, int64_t *tail) {
  if (auto_pad == 1 || auto_pad == 2) {
    int64_t need = (pool_ceil_div(in, s) - 1) * s + k - in;
    *head = auto_pad == 1 ? need / 2 : (need + 1) / 2;
    *tail = need - *head;
  } else if (auto_pad == 3) {
    *head = *tail = 0;
  }
  int64_t num = in + *head + *tail - dil * (k - 1) - 1;
  if (!ceil_mode) return num / s + 1;
  int64_t out = pool_ceil_div(num, s) + 1;
  if ((out - 1) * s >= in + *head) out--;
  return out;
}

/* 1 / (the taps of each output position along one axis that an average divides by); 0 where there are none. */
static void pool_inverse_counts(float *inv, int64_t out, int64_t k, int64_t s, int64_t dil, int64_t head,
                                int64_t in, int64_t tail, int include_pad) {
  int64_t end = in + tail, valid = in < end ? in : end;
  for (int64_t o = 0; o < out; o++) {
    int64_t cnt = 0;
    for (int64_t t = 0; t < k; t++) {
      int64_t p = o * s - head + t * dil;
      if (include_pad ? p < end : (p >= 0 && p < valid)) cnt++;
    }
    inv[o] = cnt ? 1.0f / (float)cnt : 0.0f;
  }
}

static void pool_set_extras(const pool_job *j, pool_args *a, int64_t n, int64_t pos_off, int64_t chan_off) {
  const onnxopt_pool_desc *d = j->d;
  for (int e = 0; e < d->n_extra; e++) {
    const float *base = j->extra[e] + (d->extra_nstride[e] ? n * j->extra_count[e] : 0);
    if (d->extra_kind[e] == PX_POSITION) base += pos_off;
    else if (d->extra_kind[e] == PX_CHANNEL) base += chan_off;
    a->extra[e] = base;
  }
}

static void pool_window_units(const pool_job *j, int64_t u0, int64_t u1) {
  const onnxopt_pool_desc *d = j->d;
  for (int64_t u = u0; u < u1; u++) {
    int64_t plane = u / j->bands, band = u % j->bands;
    int64_t n = plane / j->C, c = plane % j->C;
    int64_t oh0 = band * j->band_rows;
    pool_args a;
    memset(&a, 0, sizeof(a));
    a.src = j->x + plane * j->H * j->W * j->es;
    a.stride = j->W;
    a.ow = j->OW;
    a.n = j->OH - oh0 < j->band_rows ? j->OH - oh0 : j->band_rows;
    a.inv_h = j->inv_h ? j->inv_h + oh0 : NULL;
    a.inv_w = j->inv_w;
    a.vw = j->We;
    a.pl = j->pl;
    a.row0 = oh0 * d->sh - j->pt;
    a.vh = j->He;
    a.padrow = j->padrow;
    int64_t off = plane * j->OH * j->OW + oh0 * j->OW;
    for (int o = 0; o < d->sig.n_out; o++) a.out[o] = j->out[o] + off * j->es;
    pool_set_extras(j, &a, n, c * j->OH * j->OW + oh0 * j->OW, c);
    d->rows((const int64_t *)&a);
  }
}

static void pool_global_units(const pool_job *j, int64_t u0, int64_t u1) {
  const onnxopt_pool_desc *d = j->d;
  int64_t groups = (j->C + d->lanes - 1) / d->lanes;
  for (int64_t u = u0; u < u1; u++) {
    int64_t n = u / groups, c0 = (u % groups) * d->lanes;
    pool_args a;
    memset(&a, 0, sizeof(a));
    a.src = j->x + (n * j->C + c0) * j->HW * j->es;
    a.stride = j->HW;
    a.n = j->C - c0 < d->lanes ? j->C - c0 : d->lanes;
    for (int o = 0; o < d->sig.n_out; o++) a.out[o] = j->out[o] + (n * j->C + c0) * j->es;
    pool_set_extras(j, &a, n, c0, c0);
    d->global((const int64_t *)&a);
  }
}

static void pool_task(void *usr, size_t index) {
  const pool_job *j = (const pool_job *)usr;
  int64_t u0 = (int64_t)index * j->units / j->tasks, u1 = ((int64_t)index + 1) * j->units / j->tasks;
  if (j->d->global)
    pool_global_units(j, u0, u1);
  else
    pool_window_units(j, u0, u1);
}

/* ---- Windowed pools on blocked tensors [N, C / L, H, W, L] (a blocked chain's MaxPool or AveragePool). ----
 * Each lane is a channel, so a window is L independent maxima or sums over whole vectors: no masks, no transposes.
 * onnxruntime would run the chain's pool as its generic 3-D pool with a window of 1 over the lanes (the passthrough
 * form, which stays the function fallback), 2.7x its NCHWc pool's time on Inception-v3's 3x3 averages. Shapes,
 * pads and divisors as above (the same helpers). The rest of the glue is built for the baseline ISA, so the row
 * loop is compiled for AVX-512, AVX2 and the baseline and picked when the library loads (target_clones). */
typedef struct {
  const onnxopt_pool_desc *d;
  const float *x;
  float *y;
  int64_t H, W, OH, OW, pt, pl, He, We, rows, tasks;
  const float *inv_h, *inv_w;
} pool_blocked_job;

#define POOL_BLOCKED_U 4 /* interior outputs computed together: independent accumulators hide the add latency */

/* Output positions [q, q + U) of output row o, all of whose taps along the width are inside the input: U
 * accumulators per vector, the rows' bounds checked once per row. */
static inline __attribute__((always_inline)) void pool_blocked_span_l(const pool_blocked_job *j, const float *xp,
                                                                       float *yp, int64_t o, int64_t q, const int L,
                                                                       const int U) {
  const onnxopt_pool_desc *d = j->d;
  int is_max = d->op == POOL_MAX;
  int64_t hl = is_max ? j->H : j->He, r0 = o * d->sh - j->pt;
  float acc[POOL_BLOCKED_U][16];
#pragma GCC unroll 4
  for (int u = 0; u < U; u++)
    for (int l = 0; l < L; l++) acc[u][l] = is_max ? -3.402823466e+38f : 0.0f;
  for (int64_t a = 0; a < d->kh; a++) {
    int64_t r = r0 + a * d->dh;
    if (r < 0 || r >= hl) continue;
    const float *xr = xp + (r * j->W + q * d->sw - j->pl) * L;
    for (int64_t b = 0; b < d->kw; b++) {
      const float *v = xr + b * d->dw * L;
      if (is_max) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++)
          for (int l = 0; l < L; l++) acc[u][l] = v[u * d->sw * L + l] > acc[u][l] ? v[u * d->sw * L + l] : acc[u][l];
      } else {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++)
          for (int l = 0; l < L; l++) acc[u][l] += v[u * d->sw * L + l];
      }
    }
  }
#pragma GCC unroll 4
  for (int u = 0; u < U; u++) {
    float *dst = yp + (q + u) * L;
    float inv = is_max ? 1.0f : j->inv_h[o] * j->inv_w[q + u];
    for (int l = 0; l < L; l++) dst[l] = is_max ? acc[u][l] : acc[u][l] * inv;
  }
}

/* Output row `row` (over N * C / L * OH) for L lanes; inlined into each clone with L a constant. */
static inline __attribute__((always_inline)) void pool_blocked_row_l(const pool_blocked_job *j, int64_t row,
                                                                      const int L) {
  const onnxopt_pool_desc *d = j->d;
  int64_t plane = row / j->OH, o = row % j->OH;
  const float *xp = j->x + plane * j->H * j->W * L;
  float *yp = j->y + (plane * j->OH + o) * j->OW * L;
  int is_max = d->op == POOL_MAX;
  int64_t hl = is_max ? j->H : j->He, wl = is_max ? j->W : j->We; /* taps past these count for nothing */
  int64_t r0 = o * d->sh - j->pt;
  /* Outputs [q_lo, q_hi) have every tap along the width inside [0, wl). */
  int64_t q_lo = (j->pl + d->sw - 1) / d->sw, last = wl - 1 - (d->kw - 1) * d->dw + j->pl;
  int64_t q_hi = last < 0 ? 0 : last / d->sw + 1;
  if (q_hi > j->OW) q_hi = j->OW;
  if (q_lo > q_hi) q_lo = q_hi;
  float acc[16];
  for (int64_t q = 0; q < j->OW; q++) {
    if (q == q_lo) { /* the interior, U outputs at a time */
      for (; q + POOL_BLOCKED_U <= q_hi; q += POOL_BLOCKED_U) pool_blocked_span_l(j, xp, yp, o, q, L, POOL_BLOCKED_U);
      for (; q < q_hi; q++) pool_blocked_span_l(j, xp, yp, o, q, L, 1);
      if (q >= j->OW) break;
    }
    int64_t c0 = q * d->sw - j->pl;
    for (int l = 0; l < L; l++) acc[l] = is_max ? -3.402823466e+38f : 0.0f;
    for (int64_t a = 0; a < d->kh; a++) {
      int64_t r = r0 + a * d->dh;
      if (r < 0 || r >= hl) continue;
      const float *xr = xp + r * j->W * L;
      for (int64_t b = 0; b < d->kw; b++) {
        int64_t c = c0 + b * d->dw;
        if (c < 0 || c >= wl) continue;
        const float *v = xr + c * L;
        if (is_max) {
          for (int l = 0; l < L; l++) acc[l] = v[l] > acc[l] ? v[l] : acc[l];
        } else {
          for (int l = 0; l < L; l++) acc[l] += v[l];
        }
      }
    }
    float *dst = yp + q * L;
    if (is_max) {
      for (int l = 0; l < L; l++) dst[l] = acc[l];
    } else {
      float inv = j->inv_h[o] * j->inv_w[q];
      for (int l = 0; l < L; l++) dst[l] = acc[l] * inv;
    }
  }
}

X86_CLONES static void pool_blocked_rows(
    const pool_blocked_job *j, int64_t r0, int64_t r1) {
  if (j->d->blocked == 16) {
    for (int64_t r = r0; r < r1; r++) pool_blocked_row_l(j, r, 16);
  } else {
    for (int64_t r = r0; r < r1; r++) pool_blocked_row_l(j, r, 8);
  }
}

static void pool_blocked_task(void *usr, size_t index) {
  const pool_blocked_job *j = (const pool_blocked_job *)usr;
  int64_t t = (int64_t)index;
  pool_blocked_rows(j, t * j->rows / j->tasks, (t + 1) * j->rows / j->tasks);
}

/* Global pools on blocked tensors: one unit is the L channels of one block of one batch item, a vector summed (or
   maxed) over H * W with four accumulators (the add latency), then scaled by 1 / (H * W). The output is blocked
   [N, C / L, 1, 1, L] (padding channels stay zero: their sum and their maximum are zero), or, for a chain's exit
   (a classifier's pool), NCHW [N, C, 1, 1] without the padding channels: onnxruntime's ReduceMean over the 5-D form
   and the reorder after it took 72-149 us of MobileNetV2, ResNet-50, Inception-v3 and SqueezeNet, and ended their
   sequences. */
static inline __attribute__((always_inline)) void pool_blocked_global_l(const pool_blocked_job *j, int64_t unit,
                                                                        const int L, const int is_max) {
  const onnxopt_pool_desc *d = j->d;
  int64_t hw = j->H * j->W;
  const float *x = j->x + unit * hw * L;
  float acc[4][16];
  for (int u = 0; u < 4; u++)
    for (int l = 0; l < L; l++) acc[u][l] = is_max ? -3.402823466e+38f : 0.0f;
  int64_t p = 0;
  for (; p + 4 <= hw; p += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
      const float *v = x + (p + u) * L;
      if (is_max) {
        for (int l = 0; l < L; l++) acc[u][l] = v[l] > acc[u][l] ? v[l] : acc[u][l];
      } else {
        for (int l = 0; l < L; l++) acc[u][l] += v[l];
      }
    }
  }
  for (; p < hw; p++) {
    const float *v = x + p * L;
    if (is_max) {
      for (int l = 0; l < L; l++) acc[0][l] = v[l] > acc[0][l] ? v[l] : acc[0][l];
    } else {
      for (int l = 0; l < L; l++) acc[0][l] += v[l];
    }
  }
  float r[16];
  float inv = hw > 0 ? 1.0f / (float)hw : 0.0f;
  for (int l = 0; l < L; l++) {
    float a = is_max ? (acc[0][l] > acc[1][l] ? acc[0][l] : acc[1][l]) : acc[0][l] + acc[1][l];
    float b = is_max ? (acc[2][l] > acc[3][l] ? acc[2][l] : acc[3][l]) : acc[2][l] + acc[3][l];
    r[l] = is_max ? (a > b ? a : b) : (a + b) * inv;
  }
  if (d->exit_channels) { /* NCHW: unit = n * CB + cb writes channels cb * L .. of item n that exist */
    int64_t n = unit / j->OH, c0 = unit % j->OH * L, C = d->exit_channels;
    float *y = j->y + n * C + c0;
    for (int l = 0; l < L && c0 + l < C; l++) y[l] = r[l];
  } else {
    for (int l = 0; l < L; l++) j->y[unit * L + l] = r[l];
  }
}

X86_CLONES static void pool_blocked_globals(
    const pool_blocked_job *j, int64_t u0, int64_t u1) {
  /* L and the op as constants: each of the four loops below is its own vector loop */
  int is_max = j->d->op == POOL_GMAX;
  if (j->d->blocked == 16) {
    for (int64_t u = u0; u < u1; u++)
      is_max ? pool_blocked_global_l(j, u, 16, 1) : pool_blocked_global_l(j, u, 16, 0);
  } else {
    for (int64_t u = u0; u < u1; u++)
      is_max ? pool_blocked_global_l(j, u, 8, 1) : pool_blocked_global_l(j, u, 8, 0);
  }
}

static void pool_blocked_global_task(void *usr, size_t index) {
  const pool_blocked_job *j = (const pool_blocked_job *)usr;
  int64_t t = (int64_t)index;
  pool_blocked_globals(j, t * j->rows / j->tasks, (t + 1) * j->rows / j->tasks);
}

static OrtStatus *pool_blocked_global_compute(const onnxopt_pool_desc *d, OrtKernelContext *ctx) {
  const OrtValue *xv;
  int64_t xd[MAX_RANK];
  size_t xr;
  CHECK(ct_dims(ctx, 0, &xv, xd, &xr));
  int64_t L = d->blocked, C = d->exit_channels;
  if (xr != 5 || xd[4] != L || (L != 8 && L != 16) || d->n_extra || d->sig.n_out != 1 || C > xd[1] * L ||
      (C && C <= (xd[1] - 1) * L))
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a blocked global pool reads [N, C / L, H, W, L] with L = 8 or 16 "
                                      "(and, writing NCHW, C / L rounded up blocks) and has no epilogue; re-run "
                                      "onnxopt");
  pool_blocked_job j;
  memset(&j, 0, sizeof(j));
  j.d = d;
  j.H = xd[2], j.W = xd[3];
  int64_t od[5] = {xd[0], C ? C : xd[1], 1, 1, L};
  OrtValue *ov;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, od, C ? 4 : 5, &ov));
  CHECK(API(GetTensorMutableData)(ov, (void **)&j.y));
  j.rows = xd[0] * xd[1]; /* units: one block of one item */
  j.OH = xd[1];           /* here: the blocks per item */
  if (j.rows == 0) return NULL;
  CHECK(API(GetTensorMutableData)((OrtValue *)xv, (void **)&j.x));
  double work = (double)j.rows * (double)(j.H * j.W) * (double)L;
  j.tasks = pool_task_count(d, work, j.rows);
  if (j.tasks == 1) {
    pool_blocked_globals(&j, 0, j.rows);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, pool_blocked_global_task, (size_t)j.tasks, 0, &j);
}

static OrtStatus *pool_blocked_compute(const onnxopt_pool_desc *d, OrtKernelContext *ctx) {
  if (d->op == POOL_GMAX || d->op == POOL_GAVG) return pool_blocked_global_compute(d, ctx);
  const OrtValue *xv;
  int64_t xd[MAX_RANK];
  size_t xr;
  CHECK(ct_dims(ctx, 0, &xv, xd, &xr));
  int64_t L = d->blocked;
  if (xr != 5 || xd[4] != L || (L != 8 && L != 16) || d->n_extra || d->sig.n_out != 1)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a blocked pool reads [N, C / L, H, W, L] with L = 8 or 16 and has "
                                      "no epilogue; re-run onnxopt");
  pool_blocked_job j;
  memset(&j, 0, sizeof(j));
  j.d = d;
  j.H = xd[2], j.W = xd[3];
  int64_t pt = d->pads[0], pl = d->pads[1], pb = d->pads[2], pr = d->pads[3];
  j.OH = pool_out_size(j.H, d->kh, d->sh, d->dh, d->auto_pad, d->ceil_mode, &pt, &pb);
  j.OW = pool_out_size(j.W, d->kw, d->sw, d->dw, d->auto_pad, d->ceil_mode, &pl, &pr);
  if (j.OH < 0 || j.OW < 0) return fail(ORT_INVALID_ARGUMENT, "onnxopt: the pool's input is smaller than its window");
  j.pt = pt, j.pl = pl;
  j.He = d->op == POOL_AVG && pb < 0 ? j.H + pb : j.H;
  j.We = d->op == POOL_AVG && pr < 0 ? j.W + pr : j.W;
  int64_t od[5] = {xd[0], xd[1], j.OH, j.OW, L};
  OrtValue *ov;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, od, 5, &ov));
  CHECK(API(GetTensorMutableData)(ov, (void **)&j.y));
  j.rows = xd[0] * xd[1] * j.OH;
  if (j.rows == 0 || j.OW == 0) return NULL;
  CHECK(API(GetTensorMutableData)((OrtValue *)xv, (void **)&j.x));
  float *inv = NULL;
  if (d->op == POOL_AVG) {
    inv = (float *)malloc((size_t)(j.OH + j.OW) * sizeof(float));
    if (!inv) return fail(ORT_FAIL, "onnxopt: out of memory");
    pool_inverse_counts(inv, j.OH, d->kh, d->sh, d->dh, pt, j.H, pb, d->count_include_pad);
    pool_inverse_counts(inv + j.OH, j.OW, d->kw, d->sw, d->dw, pl, j.W, pr, d->count_include_pad);
    j.inv_h = inv, j.inv_w = inv + j.OH;
  }
  double work = (double)j.rows * (double)j.OW * (double)(d->kh * d->kw) * (double)L;
  j.tasks = pool_task_count(d, work, j.rows);
  OrtStatus *st = NULL;
  if (j.tasks == 1)
    pool_blocked_rows(&j, 0, j.rows);
  else
    st = API(KernelContext_ParallelFor)(ctx, pool_blocked_task, (size_t)j.tasks, 0, &j);
  free(inv);
  return st;
}

static OrtStatus *pool_compute(const onnxopt_pool_desc *d, OrtKernelContext *ctx) {
  if (d->blocked) return pool_blocked_compute(d, ctx);
  const OrtValue *xv;
  int64_t xd[MAX_RANK];
  size_t xr;
  CHECK(ct_dims(ctx, 0, &xv, xd, &xr));
  int global = d->global != NULL;
  if ((int)xr != d->rank || xr < 3)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the pool's input does not have the rank the kernel was built for");
  pool_job j;
  memset(&j, 0, sizeof(j));
  j.d = d;
  j.es = d->elem == POOL_F32 ? 4 : 1;
  j.N = xd[0];
  j.C = xd[1];
  int64_t od[MAX_RANK];
  od[0] = j.N;
  od[1] = j.C;
  if (global) {
    j.HW = 1;
    for (size_t k = 2; k < xr; k++) {
      j.HW *= xd[k];
      od[k] = 1;
    }
    if (j.HW == 0 && j.N * j.C > 0)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: a global pool over an empty image");
  } else {
    j.H = xd[2];
    j.W = xd[3];
    if (j.W > ((int64_t)1 << 30)) /* the kernels compute column indices in 32 bits */
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: the pool's input is wider than 2^30");
    int64_t pt = d->pads[0], pl = d->pads[1], pb = d->pads[2], pr = d->pads[3];
    j.OH = pool_out_size(j.H, d->kh, d->sh, d->dh, d->auto_pad, d->ceil_mode, &pt, &pb);
    j.OW = pool_out_size(j.W, d->kw, d->sw, d->dw, d->auto_pad, d->ceil_mode, &pl, &pr);
    if (j.OH < 0 || j.OW < 0) return fail(ORT_INVALID_ARGUMENT, "onnxopt: the pool's input is smaller than its window");
    j.pt = pt;
    j.pl = pl;
    /* An average ignores taps past the tail pad, even inside the image (a negative tail pad): read them as padding. */
    j.He = d->op == POOL_AVG && pb < 0 ? j.H + pb : j.H;
    j.We = d->op == POOL_AVG && pr < 0 ? j.W + pr : j.W;
    od[2] = j.OH;
    od[3] = j.OW;
  }
  for (int o = 0; o < d->sig.n_out; o++) {
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, (size_t)o, od, xr, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&j.out[o]));
  }
  int64_t per_item = global ? j.C : j.C * j.OH * j.OW;
  for (int e = 0; e < d->n_extra; e++) {
    const OrtValue *v;
    int64_t dims[MAX_RANK];
    size_t rank;
    CHECK(ct_dims(ctx, (size_t)(1 + e), &v, dims, &rank));
    CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&j.extra[e]));
    int64_t have = 1, want = d->extra_kind[e] == PX_POSITION ? per_item : d->extra_kind[e] == PX_CHANNEL ? j.C : 1;
    for (size_t k = 0; k < rank; k++) have *= dims[k];
    j.extra_count[e] = want;
    if (d->extra_nstride[e]) want *= j.N;
    if (have != want)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: an input of a fused epilogue has a different size than the "
                                        "kernel was built for; re-run onnxopt with --input-shape for these inputs");
  }
  if (j.N * j.C == 0 || (!global && j.OH * j.OW == 0)) return NULL;
  CHECK(API(GetTensorMutableData)((OrtValue *)xv, (void **)&j.x));

  double work;
  int64_t planes = j.N * j.C;
  if (global) {
    j.units = j.N * ((j.C + d->lanes - 1) / d->lanes);
    work = (double)planes * (double)j.HW;
  } else {
    work = (double)planes * ((double)j.OH * (double)j.OW * (double)(d->kh * d->kw) + (double)(j.H * j.W));
    /* Bands of output rows: enough units for the threads when there are few planes, and few enough input rows
       that the strips after the first one of a band read them from L1. */
    double want = work / POOL_TASK_MIN_WORK;
    if (want > (double)d->max_tasks) want = (double)d->max_tasks;
    int64_t bands = work < d->inline_work ? 1 : (int64_t)(want / (double)planes + 0.999);
    int64_t fit = (POOL_BAND_BYTES / (j.W * j.es + 1) - (d->kh - 1) * d->dh) / d->sh;
    if (fit < 4) fit = 4;
    if (bands < (j.OH + fit - 1) / fit) bands = (j.OH + fit - 1) / fit;
    if (bands < 1) bands = 1;
    if (bands > j.OH) bands = j.OH;
    j.band_rows = (j.OH + bands - 1) / bands;
    j.bands = (j.OH + j.band_rows - 1) / j.band_rows;
    j.units = planes * j.bands;
  }
  j.tasks = pool_task_count(d, work, j.units);
  if (global) {
    if (j.tasks == 1) {
      pool_global_units(&j, 0, j.units);
      return NULL;
    }
    return API(KernelContext_ParallelFor)(ctx, pool_task, (size_t)j.tasks, 0, &j);
  }

  OrtStatus *st = NULL;
  void *padrow = malloc((size_t)(j.W + 1) * (size_t)j.es);
  float *inv = d->op == POOL_AVG ? (float *)malloc((size_t)(j.OH + j.OW) * sizeof(float)) : NULL;
  if (!padrow || (d->op == POOL_AVG && !inv)) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  if (d->elem == POOL_F32) {
    float pad = d->op == POOL_MAX ? -3.402823466e+38f : 0.0f;
    for (int64_t i = 0; i <= j.W; i++) ((float *)padrow)[i] = pad;
  } else { /* a MaxPool's padding: the type's least value, as onnxruntime's integer MaxPool starts from */
    memset(padrow, d->elem == POOL_S8 ? 0x80 : 0, (size_t)(j.W + 1));
  }
  j.padrow = padrow;
  if (inv) {
    int64_t pt = d->pads[0], pl = d->pads[1], pb = d->pads[2], pr = d->pads[3];
    pool_out_size(j.H, d->kh, d->sh, d->dh, d->auto_pad, d->ceil_mode, &pt, &pb);
    pool_out_size(j.W, d->kw, d->sw, d->dw, d->auto_pad, d->ceil_mode, &pl, &pr);
    pool_inverse_counts(inv, j.OH, d->kh, d->sh, d->dh, pt, j.H, pb, d->count_include_pad);
    pool_inverse_counts(inv + j.OH, j.OW, d->kw, d->sw, d->dw, pl, j.W, pr, d->count_include_pad);
    j.inv_h = inv;
    j.inv_w = inv + j.OH;
  }
  if (j.tasks == 1)
    pool_window_units(&j, 0, j.units);
  else
    st = API(KernelContext_ParallelFor)(ctx, pool_task, (size_t)j.tasks, 0, &j);
done:
  free(padrow);
  free(inv);
  return st;
}
