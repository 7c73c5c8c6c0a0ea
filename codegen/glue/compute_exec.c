/* ---- Compute ops (convolution, matmul) with fused epilogues: tiles over ORT's thread pool. ----
 *
 * The compute kind's executor (codegen/glue/kinds.py). An op is `items` independent problems (batch x group for a convolution,
 * the broadcast batch of a matmul), each C[M x P] = A[M x K] . B[K x P] followed by the epilogue. The generated
 * tile functions (codegen/compute/tile.py) do the arithmetic; this file only walks shapes and tiles.
 *
 * A convolution whose taps are not a plain 1x1 (kernel > 1, stride, padding) first copies its input into a
 * zero-padded buffer split into stride phases: phase (a, b) holds rows a, a+s, a+2s... and columns b, b+s..., so
 * every tap of every stride reads unit-stride runs and needs no bounds checks. Tiles then cover up to NI output
 * rows of one vector of columns each ("rows mode"); a plain 1x1 reads the input in place, NI vectors of one flat run
 * of pixels ("flat mode"), as a matmul does.
 */

enum { EX_POSITION = 0, EX_CHANNEL = 1, EX_COLUMN = 2, EX_SCALAR = 3 };
#define CT_NV_MAX 4
#define CT_MAX_OUT 4
#define CT_MAX_EXTRA 8
#define CT_TARGET_TASKS 64
#define CT_TASK_MIN_FLOPS 262144.0
/* Below this many FLOPs a kernel runs on the calling thread: waking onnxruntime's pool (its threads sleep between
   ops when spinning is off) and reading the input from the other core's cache cost more than the second core
   saves. The library's tables set it (library.py, INLINE_FLOPS); the optimizer times the chosen plan with a
   larger value too and keeps the faster (pipeline._inline_choice). */
#define CT_INLINE_FLOPS seq_inline_flops()

typedef struct { /* mirrors the slots of codegen/compute/tile.py */
  const float *a;
  int64_t a_ms, a_ks;
  const float *b;
  const int64_t *koff;
  int64_t k, ldc, m0;
  int64_t voff[CT_NV_MAX], coff[CT_NV_MAX], lanes[CT_NV_MAX];
  float *out[CT_MAX_OUT];
  const float *extra[CT_MAX_EXTRA];
} ct_tile;

typedef struct {
  const onnxopt_ct_desc *d;
  int64_t items, groups, M, K, P; /* P: columns per row of C (OH * OW, or N of a matmul) */
  int64_t K_rows;                  /* rows of a packed conv weights block when more than K are stored; 0: K */
  int64_t mblocks, ptiles, ptasks, mtasks;
  int rows_mode;
  int64_t OH, OW, Wph, cseg;
  const float *a, *b;
  int64_t *a_off, *b_off; /* per item, in floats */
  int64_t a_ms, a_ks;
  const int64_t *koff;
  float *out[CT_MAX_OUT];
  const float *extra[CT_MAX_EXTRA];
  int64_t extra_count[CT_MAX_EXTRA]; /* elements per batch item (POSITION/CHANNEL) */
} ct_job;

static void ct_run_task(const ct_job *job, int64_t task) {
  const onnxopt_ct_desc *d = job->d;
  int64_t per_item = job->ptasks * job->mtasks;
  int64_t item = task / per_item, rem = task % per_item;
  int64_t pt = rem / job->mtasks, mt = rem % job->mtasks;
  int64_t t0 = pt * job->ptiles / job->ptasks, t1 = (pt + 1) * job->ptiles / job->ptasks;
  int64_t b0 = mt * job->mblocks / job->mtasks, b1 = (mt + 1) * job->mblocks / job->mtasks;
  int64_t n = item / job->groups, g = item % job->groups;
  int64_t out_off = item * job->M * job->P;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.b = job->b + job->b_off[item];
  t.koff = job->koff;
  t.k = job->K;
  t.ldc = job->P;
  t.a_ms = job->a_ms;
  t.a_ks = job->a_ks;
  for (int o = 0; o < d->sig.n_out; o++) t.out[o] = job->out[o] + out_off;
  for (int e = 0; e < d->n_extra; e++) {
    const float *base = job->extra[e] + (d->extra_nstride[e] ? n * job->extra_count[e] : 0);
    if (d->extra_kind[e] == EX_POSITION) base += g * job->M * job->P;
    else if (d->extra_kind[e] == EX_CHANNEL) base += g * job->M;
    t.extra[e] = base;
  }
  const float *a_item = job->a + job->a_off[item];
  for (int64_t tile = t0; tile < t1; tile++) {
    int nv = 0;
    if (job->rows_mode) {
      int64_t oh0 = (tile / job->cseg) * d->ni, ow0 = (tile % job->cseg) * d->lanes;
      int64_t cols = job->OW - ow0 < d->lanes ? job->OW - ow0 : d->lanes;
      for (int j = 0; j < d->ni && oh0 + j < job->OH; j++, nv++) {
        t.voff[j] = (oh0 + j) * job->Wph + ow0;
        t.coff[j] = (oh0 + j) * job->OW + ow0;
        t.lanes[j] = cols;
      }
    } else {
      int64_t p0 = tile * d->ni * d->lanes;
      for (int j = 0; j < d->ni && p0 + j * d->lanes < job->P; j++, nv++) {
        int64_t left = job->P - (p0 + j * d->lanes);
        t.voff[j] = t.coff[j] = p0 + j * d->lanes;
        t.lanes[j] = left < d->lanes ? left : d->lanes;
      }
    }
    for (int64_t mb = b0; mb < b1; mb++) {
      int64_t m0 = mb * d->mi;
      int64_t mi = job->M - m0 < d->mi ? job->M - m0 : d->mi;
      t.m0 = m0;
      t.a = d->sig.kind == KIND_CONV ? a_item + mb * (job->K_rows ? job->K_rows : job->K) * d->mi
                                     : a_item + m0 * job->a_ms;
      d->tiles[(mi - 1) * d->ni + (nv - 1)]((const int64_t *)&t);
    }
  }
}

static void ct_task(void *usr, size_t index) { ct_run_task((const ct_job *)usr, (int64_t)index); }

/* Split the work into tasks: enough for every thread (and for balance), none too small to pay for itself. */
static void ct_plan(ct_job *job) {
  job->mblocks = (job->M + job->d->mi - 1) / job->d->mi;
  double flops = 2.0 * (double)job->items * (double)job->M * (double)job->P * (double)job->K;
  int64_t want = (int64_t)(flops / CT_TASK_MIN_FLOPS);
  if (want > CT_TARGET_TASKS) want = CT_TARGET_TASKS;
  if (want < 1) want = 1;
  job->ptasks = (want + job->items - 1) / job->items;
  if (job->ptasks > job->ptiles) job->ptasks = job->ptiles;
  if (job->ptasks < 1) job->ptasks = 1;
  job->mtasks = (want + job->items * job->ptasks - 1) / (job->items * job->ptasks);
  if (job->mtasks > job->mblocks) job->mtasks = job->mblocks;
  if (job->mtasks < 1) job->mtasks = 1;
}

static OrtStatus *ct_run(ct_job *job, OrtKernelContext *ctx) {
  ct_plan(job);
  int64_t tasks = job->items * job->ptasks * job->mtasks;
  double flops = 2.0 * (double)job->items * (double)job->M * (double)job->P * (double)job->K;
  if (tasks == 1 || flops < CT_INLINE_FLOPS) {
    job->ptasks = job->mtasks = 1;
    for (int64_t i = 0; i < job->items; i++) ct_run_task(job, i);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, ct_task, (size_t)tasks, 0, job);
}

typedef struct {
  const float *x;
  float *pad;
  int64_t H, W, sh, sw, pt, pl, Hph, Wph;
  int64_t C, L; /* L > 0: x is blocked [N][C / L][H][W][L] */
} ct_pad_job;

/* Where channel `index` (= n * C + c) of the input starts, and the distance between its pixels. */
static const float *ct_channel_src(const float *x, int64_t index, int64_t C, int64_t L, int64_t HW, int64_t *es) {
  if (L == 0) {
    *es = 1;
    return x + index * HW;
  }
  int64_t n = index / C, c = index % C, cb = (C + L - 1) / L;
  *es = L;
  return x + ((n * cb + c / L) * HW) * L + c % L;
}

static void ct_pad_channel(void *usr, size_t index) {
  const ct_pad_job *p = (const ct_pad_job *)usr;
  int64_t es;
  const float *src = ct_channel_src(p->x, (int64_t)index, p->C, p->L, p->H * p->W, &es);
  float *dst = p->pad + (int64_t)index * p->sh * p->sw * p->Hph * p->Wph;
  for (int64_t a = 0; a < p->sh; a++)
    for (int64_t bb = 0; bb < p->sw; bb++)
      for (int64_t r = 0; r < p->Hph; r++, dst += p->Wph) {
        int64_t ih = r * p->sh + a - p->pt;
        if (ih < 0 || ih >= p->H) {
          memset(dst, 0, (size_t)p->Wph * sizeof(float));
          continue;
        }
        const float *row = src + ih * p->W * es;
        if (p->sw == 1 && es == 1) {
          int64_t c0 = p->pl, n = p->W; /* dst[c] = row[c - pl] */
          if (c0 + n > p->Wph) n = p->Wph - c0;
          memset(dst, 0, (size_t)(c0 < p->Wph ? c0 : p->Wph) * sizeof(float));
          if (n > 0) memcpy(dst + c0, row, (size_t)n * sizeof(float));
          if (c0 + (n > 0 ? n : 0) < p->Wph)
            memset(dst + c0 + (n > 0 ? n : 0), 0, (size_t)(p->Wph - c0 - (n > 0 ? n : 0)) * sizeof(float));
        } else {
          for (int64_t c = 0; c < p->Wph; c++) {
            int64_t iw = c * p->sw + bb - p->pl;
            dst[c] = iw >= 0 && iw < p->W ? row[iw * es] : 0.0f;
          }
        }
      }
}

/* im2col: row k = (ic, r, c) of item i holds the tap's input value for every output pixel, zeros for padding. */
typedef struct {
  const float *x;
  float *col;
  int64_t C, H, W, ic_g, groups, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
  int64_t L; /* L > 0: x is blocked */
} ct_col_job;

static void ct_col_row(void *usr, size_t index) {
  const ct_col_job *p = (const ct_col_job *)usr;
  int64_t K = p->ic_g * p->kh * p->kw;
  int64_t item = (int64_t)index / K, k = (int64_t)index % K;
  int64_t n = item / p->groups, g = item % p->groups;
  int64_t ic = k / (p->kh * p->kw), r = (k / p->kw) % p->kh, c = k % p->kw;
  int64_t es;
  const float *src = ct_channel_src(p->x, n * p->C + g * p->ic_g + ic, p->C, p->L, p->H * p->W, &es);
  float *dst = p->col + (int64_t)index * p->OH * p->OW;
  for (int64_t oh = 0; oh < p->OH; oh++) {
    int64_t ih = oh * p->sh - p->pt + r * p->dh;
    float *row = dst + oh * p->OW;
    if (ih < 0 || ih >= p->H) {
      memset(row, 0, (size_t)p->OW * sizeof(float));
      continue;
    }
    const float *in = src + ih * p->W * es;
    for (int64_t ow = 0; ow < p->OW; ow++) {
      int64_t iw = ow * p->sw - p->pl + c * p->dw;
      row[ow] = iw >= 0 && iw < p->W ? in[iw * es] : 0.0f;
    }
  }
}

static OrtStatus *ct_dims(OrtKernelContext *ctx, size_t i, const OrtValue **v, int64_t *dims, size_t *rank) {
  OrtTensorTypeAndShapeInfo *info;
  CHECK(API(KernelContext_GetInput)(ctx, i, v));
  CHECK(API(GetTensorTypeAndShape)(*v, &info));
  OrtStatus *st = API(GetDimensionsCount)(info, rank);
  if (!st && *rank > MAX_RANK) st = fail(ORT_INVALID_ARGUMENT, "onnxopt: tensor rank above 12");
  if (!st) st = API(GetDimensions)(info, dims, *rank);
  API(ReleaseTensorTypeAndShapeInfo)(info);
  return st;
}

static OrtStatus *ct_check_input(const onnxopt_ct_desc *d, const int64_t *xd, size_t xr);

/* A convolution's op inputs 0 (its input, checked against what the kernel was built for) and 1 (packed weights). */
static OrtStatus *ct_conv_inputs(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const OrtValue **xv, int64_t *xd,
                                 size_t *xr, const OrtValue **wv) {
  int64_t wd[MAX_RANK];
  size_t wr;
  CHECK(ct_dims(ctx, 0, xv, xd, xr));
  CHECK(ct_dims(ctx, 1, wv, wd, &wr));
  return ct_check_input(d, xd, *xr);
}

static int64_t ct_numel(const int64_t *dims, size_t rank) {
  int64_t n = 1;
  for (size_t j = 0; j < rank; j++) n *= dims[j];
  return n;
}

/* Epilogue inputs: pointers, and a check that each has the size the optimizer planned for. `skip`: the epilogue
   input that is not an op input (an AFUSION MISO kernel computes it), -1 for none; its pointer is left NULL. */
static OrtStatus *ct_extras_at(const onnxopt_ct_desc *d, ct_job *job, OrtKernelContext *ctx, int first_input,
                               int64_t batch, int64_t per_item_position, int64_t channels, int64_t columns, int skip) {
  for (int e = 0; e < d->n_extra; e++) {
    int64_t want = 1;
    switch (d->extra_kind[e]) {
      case EX_POSITION: want = per_item_position; break;
      case EX_CHANNEL: want = channels; break;
      case EX_COLUMN: want = columns; break;
      default: want = 1;
    }
    job->extra_count[e] = want;
    if (e == skip) {
      job->extra[e] = NULL;
      continue;
    }
    const OrtValue *v;
    int64_t dims[MAX_RANK];
    size_t rank;
    CHECK(ct_dims(ctx, (size_t)(first_input + e - (skip >= 0 && e > skip)), &v, dims, &rank));
    CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&job->extra[e]));
    int64_t have = ct_numel(dims, rank);
    if (d->extra_nstride[e] != 0) want *= batch;
    if (have != want)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: an input of a fused epilogue has a different size than the "
                                        "kernel was built for; re-run onnxopt with --input-shape for these inputs");
  }
  return NULL;
}

/* A compute op's epilogue inputs are its inputs 2.. (after the input and the weights). */
static OrtStatus *ct_extras(const onnxopt_ct_desc *d, ct_job *job, OrtKernelContext *ctx, int64_t batch,
                            int64_t per_item_position, int64_t channels, int64_t columns) {
  return ct_extras_at(d, job, ctx, 2, batch, per_item_position, channels, columns, -1);
}

static OrtStatus *ct_outputs(const onnxopt_ct_desc *d, ct_job *job, OrtKernelContext *ctx, const int64_t *dims,
                             size_t rank) {
  for (int o = 0; o < d->sig.n_out; o++) {
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, (size_t)o, dims, rank, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&job->out[o]));
  }
  return NULL;
}

static int64_t ct_same_pad(int64_t in, int64_t k, int64_t s, int64_t dil) {
  int64_t out = (in + s - 1) / s, need = (out - 1) * s + (k - 1) * dil + 1 - in;
  return need > 0 ? need : 0;
}

/* Pads (explicit or SAME) and the output size of a convolution on an H x W input. */
static OrtStatus *ct_conv_geometry(const onnxopt_ct_desc *d, int64_t H, int64_t W, int64_t *pt, int64_t *pl,
                                   int64_t *pb, int64_t *pr, int64_t *OH, int64_t *OW) {
  *pt = d->pads[0], *pl = d->pads[1], *pb = d->pads[2], *pr = d->pads[3];
  if (d->auto_pad) {
    int64_t th = ct_same_pad(H, d->kh, d->sh, d->dh), tw = ct_same_pad(W, d->kw, d->sw, d->dw);
    *pt = d->auto_pad == 1 ? th / 2 : th - th / 2;
    *pl = d->auto_pad == 1 ? tw / 2 : tw - tw / 2;
    *pb = th - *pt;
    *pr = tw - *pl;
  }
  if (H + *pt + *pb < (d->kh - 1) * d->dh + 1 || W + *pl + *pr < (d->kw - 1) * d->dw + 1)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the convolution's input is smaller than its kernel");
  *OH = (H + *pt + *pb - ((d->kh - 1) * d->dh + 1)) / d->sh + 1;
  *OW = (W + *pl + *pr - ((d->kw - 1) * d->dw + 1)) / d->sw + 1;
  return NULL;
}

static OrtStatus *ct_check_input(const onnxopt_ct_desc *d, const int64_t *xd, size_t xr) {
  int64_t C = d->ic_g * d->groups;
  if (d->in_blocked) {
    if (xr != 5 || xd[1] != (C + d->lanes - 1) / d->lanes || xd[4] != d->lanes)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: the convolution's input is not in the blocked layout "
                                        "[N, C / lanes, H, W, lanes] the kernel was built for");
  } else if (xr != 4 || xd[1] != C) {
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the convolution's input is not [N, C, H, W] with the channels the "
                                      "kernel was built for");
  }
  return NULL;
}

/* ---- A convolution whose outputs stay in the blocked layout [N][ceil(OC / L)][OH][OW][L] (L = lanes). ----
 *
 * The tiles (codegen/compute/blocked_tile.py) compute MI pixels of one output row times NI vectors of L output
 * channels; the input is read as broadcasts at each tap's offset, so it can be in either layout: blocked (pixels L
 * floats apart) or NCHW (pixels adjacent; a network's first convolution, with 3 channels, reads its image as it is).
 * A padded convolution reads a zero-padded copy in the input's own layout; an unpadded one reads the input in place.
 * Strides and dilations are just offsets: no stride phases here. A 1x1, stride 1, unpadded convolution walks the
 * whole plane as one run of pixels ("flat"), cut into rows of near-equal length, CB_FLAT_ROW pixels at most, for the
 * split over threads (49 pixels: one row; 784: 9 rows of 88, not 8 of 96 and one of 16).
 *
 * A transposed convolution (ConvTranspose) runs on the same tiles, split into output phases. Output rows
 * oh = ph + q * sh receive only the taps r = t * sh + a with a = (ph + pt) mod sh, from input rows
 * q + base(ph) - t * dh: for each phase that is a stride-1 convolution of the input, with its own tap table, its own
 * block of the packed weights ([ceil(OC / (NI * L))][sh][sw][th][tw][IC][NI * L], the kernel zero-padded to
 * th * sh x tw * sw taps; a phase's real taps come first and its K stops at the last one) and its output pixels sw * L floats apart, rows sh * OW * L apart. No multiply-add is
 * spent on the zeros a strided transposed convolution would insert between input pixels. Each phase is a cb_phase;
 * a convolution has one. */
#define CB_FLAT_ROW 96
#define CB_MAX_PHASES 64

typedef struct {
  int64_t rows, row_len, pixels; /* per item: rows of pixels, their length, all pixels (the last row may be short) */
  int64_t in_row, a_ms;          /* floats between input rows and between the row's pixels */
  int64_t out_base, out_row, ldc; /* floats: the output offset of pixel 0, between rows, between pixels */
  const int64_t *aoff;           /* per k: the tap's offset from the pixel's input */
  int64_t w_off;                 /* floats into each group of vectors' weights */
  int64_t K;                     /* the rows up to the phase's last real tap */
} cb_phase;

/* A padded convolution need not copy its whole input into a zero-padded buffer (for an early layer that copy costs
 * as much as a sixth of the convolution): the tiles whose taps stay inside the input read it in place, and only a
 * tile whose window crosses the border copies that window, zero-padded, into a small buffer on its task's stack and
 * reads it there. The window holds, per plane and kernel row, the `span` input pixels under the widest tile:
 * [planes][kh][span][ps]; `koff` gives each tap's offset in it. ct_conv_blocked picks this or the full copy per call
 * (cb_window_pays: a 7x7 output has no interior tile). The window lives on the stack of the thread running the task,
 * CB_WINDOW_MAX_FLOATS at most (64 KB); a larger window means the full copy. */
#define CB_WINDOW_MAX_FLOATS 16384
#define CB_WINDOW_COPY_WEIGHT 4.0

typedef struct {
  int on;
  const int64_t *koff;
  int64_t planes, ps, H, W, kh, dh, sh, sw, pt, pl, span, reach_w; /* reach_w: (kw - 1) * dw */
} cb_window;

static void cb_fill_window(const cb_window *w, float *dst, const float *x_item, int64_t ih0, int64_t iw0) {
  int64_t ps = w->ps, lo = iw0 < 0 ? -iw0 : 0, hi = w->W - iw0 < w->span ? w->W - iw0 : w->span;
  for (int64_t p = 0; p < w->planes; p++)
    for (int64_t r = 0; r < w->kh; r++, dst += w->span * ps) {
      int64_t ih = ih0 + r * w->dh;
      if (ih < 0 || ih >= w->H || hi <= lo) {
        memset(dst, 0, (size_t)(w->span * ps) * sizeof(float));
        continue;
      }
      memset(dst, 0, (size_t)(lo * ps) * sizeof(float));
      memcpy(dst + lo * ps, x_item + ((p * w->H + ih) * w->W + iw0 + lo) * ps, (size_t)((hi - lo) * ps) * sizeof(float));
      memset(dst + hi * ps, 0, (size_t)((w->span - hi) * ps) * sizeof(float));
    }
}

typedef struct {
  const onnxopt_ct_desc *d;
  int64_t N, OC, OCB, groups_of_vectors, OH, OW, K, K_all; /* K: rows per phase block; K_all: per group */
  int64_t item_in;                                         /* input floats per batch item */
  int n_phases;
  cb_phase phase[CB_MAX_PHASES];
  int64_t rows; /* per item, all phases */
  int64_t rtasks, gtasks;
  int weights_major;      /* tasks by group of vectors first (cb_split) */
  cb_window win;
  const float *in, *w;
  float *out[CT_MAX_OUT];
  const float *extra[CT_MAX_EXTRA];
  int64_t extra_count[CT_MAX_EXTRA];
} cb_job;

/* Whether the tile of `mi` pixels whose tap 0 of pixel 0 is input (ih0, iw0) reaches past the input. */
static int cb_window_needed(const cb_window *w, int64_t ih0, int64_t iw0, int64_t mi) {
  return ih0 < 0 || ih0 + (w->kh - 1) * w->dh >= w->H || iw0 < 0 || iw0 + (mi - 1) * w->sw + w->reach_w >= w->W;
}

static void cb_run_task(const cb_job *job, int64_t task) {
  const onnxopt_ct_desc *d = job->d;
  int64_t L = d->lanes, NI = d->ni, MI = d->mi;
  int64_t rt = job->weights_major ? task % job->rtasks : task / job->gtasks;
  int64_t gt = job->weights_major ? task / job->rtasks : task % job->gtasks;
  int64_t all_rows = job->N * job->rows;
  int64_t r0 = rt * all_rows / job->rtasks, r1 = (rt + 1) * all_rows / job->rtasks;
  int64_t g0 = gt * job->groups_of_vectors / job->gtasks, g1 = (gt + 1) * job->groups_of_vectors / job->gtasks;
  int64_t plane_out = job->OH * job->OW * L, item_out = job->OCB * plane_out;
  const cb_window *w = &job->win;
  float window[w->on ? CB_WINDOW_MAX_FLOATS : 1] __attribute__((aligned(64)));
  ct_tile t;
  memset(&t, 0, sizeof(t));
  for (int64_t g = g0; g < g1; g++) {
    int64_t vb = g * NI; /* first channel vector of this group */
    int nv = (int)(job->OCB - vb < NI ? job->OCB - vb : NI);
    const float *wg = job->w + g * job->K_all * NI * L;
    for (int j = 0; j < nv; j++) {
      int64_t left = job->OC - (vb + j) * L;
      t.voff[j] = j * L;
      t.lanes[j] = left < L ? left : L;
    }
    for (int64_t rr = r0; rr < r1; rr++) {
      int64_t n = rr / job->rows, r = rr % job->rows;
      const cb_phase *ph = job->phase;
      while (r >= ph->rows) r -= (ph++)->rows;
      int64_t len = ph->pixels - r * ph->row_len;
      if (len > ph->row_len) len = ph->row_len;
      t.koff = ph->aoff;
      t.k = ph->K;
      t.b = wg + ph->w_off;
      t.a_ms = ph->a_ms;
      t.ldc = ph->ldc;
      for (int o = 0; o < d->sig.n_out; o++) t.out[o] = job->out[o] + n * item_out;
      for (int e = 0; e < d->n_extra; e++) {
        const float *base = job->extra[e] + (d->extra_nstride[e] ? n * job->extra_count[e] : 0);
        if (d->extra_kind[e] == EX_CHANNEL) base += vb * L;
        t.extra[e] = base;
      }
      const float *in_r = job->in + n * job->item_in + r * ph->in_row;
      int64_t out_r = ph->out_base + r * ph->out_row;
      /* The row in tiles of near-equal size (7 pixels: 4 + 3, not 6 + 1): a short last tile loads the weight
         vectors for few broadcasts and runs far below the others' rate. Consecutive tiles of one size that read
         the input in place go to one call (the COUNT slot, blocked_tile.py). */
      int64_t tiles = (len + MI - 1) / MI;
      for (int64_t ti = 0, count; ti < tiles; ti += count) {
        int64_t p0 = ti * len / tiles, mi = (ti + 1) * len / tiles - p0;
        count = 1;
        t.a = in_r + p0 * ph->a_ms;
        int in_place = 1;
        if (w->on) { /* a convolution: rows are output rows, pixels output columns */
          int64_t ih0 = r * w->sh - w->pt, iw0 = p0 * w->sw - w->pl;
          const float *x_item = job->in + n * job->item_in;
          if (cb_window_needed(w, ih0, iw0, mi)) {
            cb_fill_window(w, window, x_item, ih0, iw0);
            t.koff = w->koff;
            t.a = window;
            in_place = 0;
          } else {
            t.koff = ph->aoff;
            t.a = x_item + (ih0 * w->W + iw0) * w->ps;
          }
        }
        while (in_place && ti + count < tiles && (ti + count + 1) * len / tiles - (ti + count) * len / tiles == mi &&
               !(w->on && cb_window_needed(w, r * w->sh - w->pt, (p0 + count * mi) * w->sw - w->pl, mi)))
          count++;
        t.m0 = count;
        for (int j = 0; j < nv; j++) t.coff[j] = (vb + j) * plane_out + out_r + p0 * ph->ldc;
        d->tiles[(mi - 1) * d->ni + (nv - 1)]((const int64_t *)&t);
      }
    }
  }
}


/* A depthwise convolution reads its blocked input in place whatever its padding, one channel vector per tile
   (codegen/microkernel/depthwise.py): a tile's kernel rows above or below the image are left out (its tap table,
   weights and K start at the first row inside), and a tile that crosses the left or right border runs the tile's
   bounded variant, told which input columns exist. No padded copy, no windows: for a depthwise convolution either
   would cost about as much as its arithmetic. The tap table is (r * dh * W + c * dw) * L, row r's taps from the
   pixel under tap (r, 0). */
/* The tiles of one output row of a depthwise convolution (or, with the ROWS slots set, of a band of rows): `row_in`
   is the input under tap (first kernel row, 0) of the row's pixel 0, pixel p goes to coff_row + p * L. A tile's
   pixel 0 may lie left of the row when the tile starts in the padding, where the bounded tile reads nothing. */
static void cb_depthwise_tiles(const onnxopt_ct_desc *d, const cb_window *w, ct_tile *t, const float *row_in,
                               int64_t OW, int64_t coff_row) {
  int64_t L = d->lanes, MI = d->mi;
  int64_t tiles = (OW + MI - 1) / MI;
  for (int64_t ti = 0; ti < tiles; ti++) {
    int64_t p0 = ti * OW / tiles, mi = (ti + 1) * OW / tiles - p0;
    int64_t iw0 = p0 * w->sw - w->pl;
    int border = iw0 < 0 || iw0 + (mi - 1) * w->sw + w->reach_w >= w->W;
    t->a = row_in + iw0 * L;
    t->a_ks = -iw0;     /* LO: the first input column that exists, from the tile's pixel 0 */
    t->m0 = w->W - iw0; /* HI: one past the last */
    t->coff[0] = coff_row + p0 * L;
    d->tiles[(mi - 1) * 2 + border]((const int64_t *)t);
  }
}

/* One output row `oh` of one channel vector of a depthwise convolution, all its pixels: `in_plane` is the vector's
   input plane, `wg` its filters, `tab` the tap table; `t` carries the outputs, extras, ldc (L) and a_ms (sw * L).
   Pixel p goes to coff_row + p * L. Also used by AFUSION (afusion_exec.c), which writes rows into a scratch band. */
static void cb_depthwise_row(const onnxopt_ct_desc *d, const cb_window *w, ct_tile *t, const float *in_plane,
                             const float *wg, const int64_t *tab, int64_t oh, int64_t OW, int64_t coff_row) {
  int64_t L = d->lanes, kw = d->kw;
  int64_t ih0 = oh * w->sh - w->pt;
  int64_t kr0 = ih0 < 0 ? (-ih0 + w->dh - 1) / w->dh : 0;               /* first kernel row inside */
  int64_t kr1 = w->H - ih0 > 0 ? (w->H - ih0 + w->dh - 1) / w->dh : 0; /* one past the last */
  if (kr1 > w->kh) kr1 = w->kh;
  t->k = kr1 > kr0 ? (kr1 - kr0) * kw : 0;
  t->koff = tab;
  t->b = wg + kr0 * kw * L;
  /* The tile's pixel 0 under tap (kr0, 0); may lie left of the row when the tile starts in the padding, where
     the bounded tile reads nothing. */
  cb_depthwise_tiles(d, w, t, in_plane + ((ih0 + kr0 * w->dh) * w->W) * L, OW, coff_row);
}

/* Output rows [oh0, oh1) of one channel vector, as cb_depthwise_row, the first at coff0 and each out_row floats
   below the one before. The rows whose kernel rows all lie inside the input share the tap table, the weights and
   K: per column of tiles, one call computes all of them (the tile's ROWS slots, blocked_tile.py). */
static void cb_depthwise_rows(const onnxopt_ct_desc *d, const cb_window *w, ct_tile *t, const float *in_plane,
                              const float *wg, const int64_t *tab, int64_t oh0, int64_t oh1, int64_t OW,
                              int64_t coff0, int64_t out_row) {
  int64_t L = d->lanes, kw = d->kw;
  /* Rows lo <= oh < hi read kernel rows 0..kh-1 all inside: oh * sh >= pt and oh * sh - pt + (kh - 1) * dh < H. */
  int64_t lo = (w->pt + w->sh - 1) / w->sh, last = w->H - 1 + w->pt - (w->kh - 1) * w->dh;
  int64_t hi = last < 0 ? 0 : last / w->sh + 1;
  if (lo < oh0) lo = oh0;
  if (hi > oh1) hi = oh1;
  if (hi - lo < 2) lo = hi = oh1; /* no band worth a call of its own */
  for (int64_t oh = oh0; oh < lo; oh++)
    cb_depthwise_row(d, w, t, in_plane, wg, tab, oh, OW, coff0 + (oh - oh0) * out_row);
  if (hi > lo) {
    t->k = w->kh * kw;
    t->koff = tab;
    t->b = wg;
    t->voff[1] = hi - lo;
    t->voff[2] = w->sh * w->W * L;
    t->voff[3] = out_row;
    cb_depthwise_tiles(d, w, t, in_plane + ((lo * w->sh - w->pt) * w->W) * L, OW, coff0 + (lo - oh0) * out_row);
    t->voff[1] = t->voff[2] = t->voff[3] = 0;
  }
  for (int64_t oh = hi > lo ? hi : oh1; oh < oh1; oh++)
    cb_depthwise_row(d, w, t, in_plane, wg, tab, oh, OW, coff0 + (oh - oh0) * out_row);
}

static void cb_run_depthwise_task(const cb_job *job, int64_t task) {
  const onnxopt_ct_desc *d = job->d;
  const cb_window *w = &job->win; /* geometry only: H, W, strides, pads */
  int64_t L = d->lanes;
  int64_t rt = task / job->gtasks, gt = task % job->gtasks;
  int64_t all_rows = job->N * job->OH;
  int64_t r0 = rt * all_rows / job->rtasks, r1 = (rt + 1) * all_rows / job->rtasks;
  int64_t g0 = gt * job->OCB / job->gtasks, g1 = (gt + 1) * job->OCB / job->gtasks;
  int64_t plane_out = job->OH * job->OW * L, item_out = job->OCB * plane_out, plane_in = w->H * w->W * L;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.ldc = L;
  t.a_ms = d->sw * L;
  for (int64_t g = g0; g < g1; g++) {
    int64_t left = job->OC - g * L;
    t.lanes[0] = left < L ? left : L;
    const float *wg = job->w + g * job->K * L;
    for (int64_t rr = r0, next; rr < r1; rr = next) { /* the task's rows of one item at a time */
      int64_t n = rr / job->OH, oh = rr % job->OH;
      next = (n + 1) * job->OH < r1 ? (n + 1) * job->OH : r1;
      for (int o = 0; o < d->sig.n_out; o++) t.out[o] = job->out[o] + n * item_out;
      for (int e = 0; e < d->n_extra; e++) {
        const float *base = job->extra[e] + (d->extra_nstride[e] ? n * job->extra_count[e] : 0);
        if (d->extra_kind[e] == EX_CHANNEL) base += g * L;
        t.extra[e] = base;
      }
      cb_depthwise_rows(d, w, &t, job->in + n * job->item_in + g * plane_in, wg, job->phase[0].aoff, oh,
                        oh + (next - rr), job->OW, g * plane_out + oh * job->OW * L, job->OW * L);
    }
  }
}


/* The input, zero-padded, in its own layout: one task per padded row of one plane (a channel, or a vector of
   channels when blocked); a row is Wp pixels of ps floats. */
typedef struct {
  const float *x;
  float *buf;
  int64_t ps, H, W, Hp, Wp, pt, pl;
} cb_copy_job;

static void cb_copy_row(void *usr, size_t index) {
  const cb_copy_job *p = (const cb_copy_job *)usr;
  int64_t ps = p->ps, hp = (int64_t)index % p->Hp, plane = (int64_t)index / p->Hp, h = hp - p->pt;
  float *dst = p->buf + (int64_t)index * p->Wp * ps;
  if (h < 0 || h >= p->H) {
    memset(dst, 0, (size_t)(p->Wp * ps) * sizeof(float));
    return;
  }
  memset(dst, 0, (size_t)(p->pl * ps) * sizeof(float));
  memset(dst + (p->pl + p->W) * ps, 0, (size_t)((p->Wp - p->pl - p->W) * ps) * sizeof(float));
  memcpy(dst + p->pl * ps, p->x + (plane * p->H + h) * p->W * ps, (size_t)(p->W * ps) * sizeof(float));
}

/* NCHW <-> blocked for the kernel that computes in the blocked layout but takes and gives NCHW tensors. One task
   per run of CB_REORDER_RUN pixels of one vector of channels, pixel by pixel: the blocked side is read (written) as
   one stream and the L planes as L streams; on AVX-512, 16 pixels at a time through a register transpose. (One task
   per plane, striding through the blocked buffer L floats at a time, went over the whole buffer once per channel: a
   16-channel depthwise 3x3 /2 to 56x56 with NCHW output took 59-63 us with it, 39-40 now.) */
#define CB_REORDER_RUN 1024
typedef struct {
  float *nchw, *blocked;
  int64_t C, L, HW, runs; /* runs per plane */
  int to_nchw;
} cb_reorder_job;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CB_HAVE_TRANSPOSE16 1
/* 16 pixels x 16 channels -> 16 channels x 16 pixels in registers: pairs interleaved, then quads, then 128-bit
   lanes twice. After the second step u[4g + j] holds, in its 128-bit lane q, channel 4q + j of pixels 4g..4g+3. */
__attribute__((target("avx512f"))) static void cb_transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int k = 0; k < 8; k++) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int g = 0; g < 4; g++) {
    __m512 *a = t + 4 * g, *o = u + 4 * g;
    o[0] = _mm512_shuffle_ps(a[0], a[2], 0x44);
    o[1] = _mm512_shuffle_ps(a[0], a[2], 0xEE);
    o[2] = _mm512_shuffle_ps(a[1], a[3], 0x44);
    o[3] = _mm512_shuffle_ps(a[1], a[3], 0xEE);
  }
  for (int j = 0; j < 4; j++) {
    __m512 v = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), w = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);
    __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88), w2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_f32x4(v, v2, 0x88);      /* channel j */
    r[4 + j] = _mm512_shuffle_f32x4(w, w2, 0x88);  /* channel 4 + j */
    r[8 + j] = _mm512_shuffle_f32x4(v, v2, 0xDD);  /* channel 8 + j */
    r[12 + j] = _mm512_shuffle_f32x4(w, w2, 0xDD); /* channel 12 + j */
  }
}

/* Blocked (16 lanes) -> NCHW for pixels [i0, i1) of one channel vector, 16 pixels at a time; returns where it
   stopped (the scalar loop does the rest). Only 16-lane blocked tensors exist on AVX-512 targets. */
__attribute__((target("avx512f"))) static int64_t cb_to_nchw16(const float *vec, float *planes, int64_t HW,
                                                               int64_t lanes, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    __m512 r[16];
    for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_ps(vec + (i + k) * 16);
    cb_transpose16(r);
    for (int64_t l = 0; l < lanes; l++) _mm512_storeu_ps(planes + l * HW + i, r[l]);
  }
  return i;
}

/* NCHW -> blocked (16 lanes), the same transpose the other way: 16 pixels of each of `lanes` planes (the planes
   past them, padding channels, read as zeros) become 16 pixel vectors. The scalar loop read 16 planes a float at a
   time: NASNet's 7x7 /2 depthwise convolutions reading a 32x111x111 NCHW tensor spent most of their time in it. */
__attribute__((target("avx512f"))) static int64_t cb_from_nchw16(float *vec, const float *planes, int64_t HW,
                                                                 int64_t lanes, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    __m512 r[16];
    for (int64_t l = 0; l < 16; l++) r[l] = l < lanes ? _mm512_loadu_ps(planes + l * HW + i) : _mm512_setzero_ps();
    cb_transpose16(r);
    for (int k = 0; k < 16; k++) _mm512_storeu_ps(vec + (i + k) * 16, r[k]);
  }
  return i;
}
#endif

static void cb_reorder_run(void *usr, size_t index) {
  const cb_reorder_job *p = (const cb_reorder_job *)usr;
  int64_t L = p->L, cb = (p->C + L - 1) / L;
  int64_t run = (int64_t)index % p->runs, v = (int64_t)index / p->runs; /* v: item * cb + vector */
  int64_t n = v / cb, c0 = v % cb * L, lanes = p->C - c0 < L ? p->C - c0 : L;
  int64_t i0 = run * CB_REORDER_RUN, i1 = i0 + CB_REORDER_RUN < p->HW ? i0 + CB_REORDER_RUN : p->HW;
  float *vec = p->blocked + v * p->HW * L;
  float *planes = p->nchw + (n * p->C + c0) * p->HW;
  if (p->to_nchw) {
#ifdef CB_HAVE_TRANSPOSE16
    if (L == 16) i0 = cb_to_nchw16(vec, planes, p->HW, lanes, i0, i1);
#endif
    for (int64_t i = i0; i < i1; i++)
      for (int64_t l = 0; l < lanes; l++) planes[l * p->HW + i] = vec[i * L + l];
  } else { /* padding channels must be zero */
#ifdef CB_HAVE_TRANSPOSE16
    if (L == 16) i0 = cb_from_nchw16(vec, planes, p->HW, lanes, i0, i1);
#endif
    for (int64_t i = i0; i < i1; i++) {
      int64_t l = 0;
      for (; l < lanes; l++) vec[i * L + l] = planes[l * p->HW + i];
      for (; l < L; l++) vec[i * L + l] = 0.0f;
    }
  }
}

static OrtStatus *cb_reorder(OrtKernelContext *ctx, float *nchw, float *blocked, int64_t N, int64_t C, int64_t L,
                             int64_t HW, int to_nchw) {
  int64_t runs = (HW + CB_REORDER_RUN - 1) / CB_REORDER_RUN, tasks = N * ((C + L - 1) / L) * runs;
  cb_reorder_job j = {nchw, blocked, C, L, HW, runs, to_nchw};
  if (N * ((C + L - 1) / L) * L * HW < (1 << 16)) { /* the blocked side's size: one lane of 16 read is still read */
    for (int64_t i = 0; i < tasks; i++) cb_reorder_run(&j, (size_t)i);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, cb_reorder_run, (size_t)tasks, 0, &j);
}

/* One axis of a transposed convolution, output phase ph (outputs ph, ph + s, ...): the block a of kernel taps it
   uses (taps a, a + s, ...) and the input index its first tap reads for output ph itself; tap t reads dil * t
   before it. ONNX pads are never negative, so ph + pad - a * dil >= 0 and the division is exact. */
/* A channel-vector convolution with NCHW outputs computes into blocked buffers, reordered at the end (cb_reorder),
   and reads its per-pixel epilogue inputs blocked: they are reordered first. Allocates those buffers in one
   `*scratch` (the caller frees it) and points `out` and the POSITION `extra` at them. Nothing when out_blocked. */
static OrtStatus *cb_blocked_scratch(const onnxopt_ct_desc *d, OrtKernelContext *ctx, int64_t N, int64_t pixels,
                                     int64_t block_size, float **out, const float **extra, int64_t *extra_count,
                                     float **scratch, int skip) {
  *scratch = NULL;
  if (d->out_blocked) return NULL;
  int n_pos = 0;
  for (int e = 0; e < d->n_extra; e++) n_pos += d->extra_kind[e] == EX_POSITION && e != skip;
  *scratch = glue_floats((size_t)((d->sig.n_out + n_pos) * N * block_size));
  if (!*scratch) return fail(ORT_FAIL, "onnxopt: out of memory for the convolution's blocked outputs");
  float *next = *scratch;
  for (int o = 0; o < d->sig.n_out; o++, next += N * block_size) out[o] = next;
  for (int e = 0; e < d->n_extra; e++) {
    if (d->extra_kind[e] != EX_POSITION || e == skip) continue;
    int64_t items = d->extra_nstride[e] ? N : 1;
    OrtStatus *rs = cb_reorder(ctx, (float *)extra[e], next, items, d->oc, d->lanes, pixels, 0);
    if (rs) {
      glue_release(*scratch);
      *scratch = NULL;
      return rs;
    }
    extra[e] = next;
    extra_count[e] = block_size;
    next += N * block_size;
  }
  return NULL;
}

static void cbt_axis(int64_t ph, int64_t s, int64_t dil, int64_t pad, int64_t *a, int64_t *base) {
  *a = s == 1 ? 0 : (ph + pad) % s;
  *base = (ph + pad - *a * dil) / s;
}

/* The input range every phase of one axis reads, as the padded copy's leading border and length. */
static void cbt_border(int64_t in, int64_t out, int64_t s, int64_t taps, int64_t dil, int64_t pad, int64_t *begin,
                       int64_t *padded) {
  int64_t lo = 0, hi = in;
  for (int64_t ph = 0; ph < s && ph < out; ph++) {
    int64_t a, base, q = (out - ph + s - 1) / s;
    cbt_axis(ph, s, dil, pad, &a, &base);
    if (base - (taps - 1) * dil < lo) lo = base - (taps - 1) * dil;
    if (q + base > hi) hi = q + base;
  }
  *begin = -lo;
  *padded = hi - lo;
}

/* The weights rows a transposed convolution's phase block (a, b) needs: its rows are (t, u, ic) and its real taps
   t < ceil((kh - a) / sh), u < ceil((kw - b) / sw) come first, so it stops after the last real one. */
static int64_t ct_phase_rows(const onnxopt_ct_desc *d, int64_t a, int64_t b, int64_t tw, int64_t C) {
  int64_t rh = d->kh > a ? (d->kh - a + d->sh - 1) / d->sh : 0, rw = d->kw > b ? (d->kw - b + d->sw - 1) / d->sw : 0;
  return rh && rw ? ((rh - 1) * tw + rw) * C : 0;
}

/* The output size of a transposed convolution and its taps per phase (the kernel padded to a multiple of the
   stride). */
static OrtStatus *ct_transposed_geometry(const onnxopt_ct_desc *d, int64_t H, int64_t W, int64_t *OH, int64_t *OW,
                                         int64_t *th, int64_t *tw) {
  *OH = (H - 1) * d->sh - d->pads[0] - d->pads[2] + (d->kh - 1) * d->dh + 1 + d->out_pad[0];
  *OW = (W - 1) * d->sw - d->pads[1] - d->pads[3] + (d->kw - 1) * d->dw + 1 + d->out_pad[1];
  if (H < 1 || W < 1 || *OH < 1 || *OW < 1)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the transposed convolution's output would be empty");
  if (d->sh * d->sw > CB_MAX_PHASES)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: transposed convolution strides above 64 phases");
  *th = (d->kh + d->sh - 1) / d->sh;
  *tw = (d->kw + d->sw - 1) / d->sw;
  return NULL;
}

/* Whether the convolution's padded taps are better served by border windows than by a padded copy of the input:
   fills `w` (but its table) and says yes when the border tiles copy fewer floats than CB_WINDOW_COPY_WEIGHT times
   what the full copy would.
   ONNXOPT_CONV_BORDER=window or =copy in the environment forces one way (tests run both on every shape; A/B timing). */
static int cb_window_pays(const onnxopt_ct_desc *d, cb_window *w, int64_t N, int64_t planes, int64_t ps, int64_t H,
                          int64_t W, int64_t OH, int64_t OW, int64_t Hp, int64_t Wp, int64_t pt, int64_t pl,
                          int64_t groups) {
  int64_t MI = d->mi;
  w->planes = planes, w->ps = ps, w->H = H, w->W = W, w->kh = d->kh, w->dh = d->dh, w->sh = d->sh, w->sw = d->sw;
  w->pt = pt, w->pl = pl, w->reach_w = (d->kw - 1) * d->dw;
  w->span = (MI - 1) * d->sw + w->reach_w + 1;
  int64_t floats = planes * d->kh * w->span * ps;
  if (floats > CB_WINDOW_MAX_FLOATS || OW == 0) return 0;
  const char *force = getenv("ONNXOPT_CONV_BORDER");
  if (force && !strcmp(force, "window")) return 1;
  if (force && !strcmp(force, "copy")) return 0;
  /* Tiles per row as cb_run_task splits them; those that cross the left or right border. */
  int64_t tiles = (OW + MI - 1) / MI, edge_tiles = 0, edge_rows = 0;
  for (int64_t ti = 0; ti < tiles; ti++) {
    int64_t p0 = ti * OW / tiles, mi = (ti + 1) * OW / tiles - p0, iw0 = p0 * d->sw - pl;
    edge_tiles += iw0 < 0 || iw0 + (mi - 1) * d->sw + w->reach_w >= W;
  }
  for (int64_t oh = 0; oh < OH; oh++) {
    int64_t ih0 = oh * d->sh - pt;
    edge_rows += ih0 < 0 || ih0 + (d->kh - 1) * d->dh >= H;
  }
  /* A window is copied within L1/L2 right before its tile reads it; the full copy goes through memory, in its own
     pass over the threads, into a buffer malloc'd per call. Measured (benchmarks/conv_border.py), windows win up to
     about 4x the floats: 64 channels at 20x20 copy 2.2x the floats and ran 1.02-1.14x faster, 32 at 40x40 1.23x
     and 1.06-1.07x; 256 at 14x14 (11x) ran 0.95-0.97x. */
  double window_copy = (double)N * groups * (edge_rows * tiles + (OH - edge_rows) * edge_tiles) * floats;
  return window_copy < CB_WINDOW_COPY_WEIGHT * (double)N * planes * Hp * Wp * ps;
}

/* When a convolution's weights outweigh its input and output (deep layers at 14x14 and 7x7: ResNet-50's last
   stage holds 9.4 MB of 3x3 weights for 0.1 MB of output), tasks go by group of output vectors first. Split by rows
   first, every task reads all the weights it multiplies, and the rows' tasks read the whole layer's weights from L3
   once per row: 7 x 9.4 MB there. */
#define CB_WMAJOR_TASKS 8

static int cb_weights_major(const cb_job *job, int64_t NI, int64_t L) {
  const char *force = getenv("ONNXOPT_WMAJOR");
  if (force && *force) return atoi(force);
  double weights = (double)job->groups_of_vectors * job->K_all * NI * L;
  double acts = (double)job->N * (job->item_in + job->OCB * job->OH * job->OW * L);
  return weights > acts;
}

/* Splits a blocked convolution's `rows` (all items) x `groups` (of channel vectors) into tasks of at least
   CT_TASK_MIN_FLOPS, CT_TARGET_TASKS at most, rows first (groups first when job->weights_major); one task below
   CT_INLINE_FLOPS. Returns the task count. */
static int64_t cb_split(cb_job *job, double flops, int64_t rows, int64_t groups) {
  int64_t want = (int64_t)(flops / CT_TASK_MIN_FLOPS);
  if (want > CT_TARGET_TASKS) want = CT_TARGET_TASKS;
  if (want < 1 || flops < CT_INLINE_FLOPS) want = 1;
  if (job->weights_major && want > 1) {
    /* Each group's weights are read by as few tasks as keep CB_WMAJOR_TASKS tasks in all, and the tasks that
       share them are numbered together (cb_run_task), so they run close in time. */
    job->gtasks = want < groups ? want : groups;
    job->rtasks = (CB_WMAJOR_TASKS + job->gtasks - 1) / job->gtasks;
    if (job->rtasks > rows) job->rtasks = rows;
    if (job->rtasks < 1) job->rtasks = 1;
    return job->rtasks * job->gtasks;
  }
  job->rtasks = want < rows ? want : rows;
  job->gtasks = (want + job->rtasks - 1) / job->rtasks;
  if (job->gtasks > groups) job->gtasks = groups;
  return job->rtasks * job->gtasks;
}

/* A blocked convolution made ready to run (cb_prepare): its job, its task count (0: nothing to do) and the buffers
   it owns until cb_finish. A horizontal kernel (siblings_exec.c) runs several of them in one parallel loop. */
typedef struct {
  cb_job job;
  int depthwise;
  int64_t tasks;
  float *buf, *scratch;
  float *user_out[CT_MAX_OUT];
  int64_t *aoff;
} cb_ready;

static void cb_ready_task(const cb_ready *r, int64_t task) {
  if (r->depthwise) cb_run_depthwise_task(&r->job, task);
  else cb_run_task(&r->job, task);
}

static void cb_ready_run(void *usr, size_t index) { cb_ready_task((const cb_ready *)usr, (int64_t)index); }

/* Converts the blocked buffers of NCHW outputs (when there are) and frees what cb_prepare allocated; returns `st`
   or the conversion's failure. */
static OrtStatus *cb_finish(cb_ready *r, OrtKernelContext *ctx, OrtStatus *st) {
  const onnxopt_ct_desc *d = r->job.d;
  for (int o = 0; !st && r->scratch && r->tasks && o < d->sig.n_out; o++)
    st = cb_reorder(ctx, r->user_out[o], r->job.out[o], r->job.N, d->oc, d->lanes, r->job.OH * r->job.OW, 1);
  glue_release(r->buf);
  free(r->aoff);
  glue_release(r->scratch);
  r->buf = r->scratch = NULL;
  r->aoff = NULL;
  return st;
}

/* The rest of cb_prepare for a depthwise convolution (cb_run_depthwise_task). */
static OrtStatus *cb_prepare_depthwise(cb_ready *r, const onnxopt_ct_desc *d, const float *x, int64_t H, int64_t W,
                                       int64_t pt, int64_t pl) {
  cb_job *job = &r->job;
  int64_t L = d->lanes;
  cb_window *w = &job->win;
  w->H = H, w->W = W, w->kh = d->kh, w->dh = d->dh, w->sh = d->sh, w->sw = d->sw, w->pt = pt, w->pl = pl;
  w->reach_w = (d->kw - 1) * d->dw;
  job->in = x;
  job->item_in = job->OCB * H * W * L;
  int64_t *tab = (int64_t *)malloc((size_t)(d->kh * d->kw) * sizeof(int64_t));
  if (!tab) return fail(ORT_FAIL, "onnxopt: out of memory");
  r->aoff = tab;
  for (int64_t rr = 0; rr < d->kh; rr++)
    for (int64_t c = 0; c < d->kw; c++) tab[rr * d->kw + c] = (rr * d->dh * W + c * d->dw) * L;
  job->phase[0].aoff = tab;
  r->tasks = cb_split(job, 2.0 * (double)job->N * job->OH * job->OW * (double)(job->OCB * L) * (double)job->K,
                      job->N * job->OH, job->OCB);
  return NULL;
}

/* Makes a channel-vector convolution ready to run on input `xv` (dims `xd`) with packed weights `wv`: its epilogue
   inputs are op inputs `in_extra`.., its outputs op outputs `out0`... On failure nothing is left allocated. */
/* A convolution kernel's outputs out0 .. out0 + n_out - 1: blocked [N, OC/L, OH, OW, L] or NCHW [N, OC, OH, OW], as
 * the description says. `user` and `out` both get each one's data (a kernel may point `out` at scratch later). */
static OrtStatus *ct_conv_outputs(const onnxopt_ct_desc *d, OrtKernelContext *ctx, size_t out0, int64_t N, int64_t OH,
                                  int64_t OW, float **user, float **out) {
  int64_t L = d->lanes, odims[5] = {N, (d->oc + L - 1) / L, OH, OW, L}, nchw_dims[4] = {N, d->oc, OH, OW};
  for (int o = 0; o < d->sig.n_out; o++) {
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, out0 + (size_t)o, d->out_blocked ? odims : nchw_dims,
                                       d->out_blocked ? 5 : 4, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&user[o]));
    out[o] = user[o];
  }
  return NULL;
}

static OrtStatus *cb_prepare(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const OrtValue *xv, const int64_t *xd,
                             const OrtValue *wv, int in_extra, int out0, cb_ready *r) {
  memset(r, 0, sizeof(*r));
  /* A depthwise convolution (one input channel per group, one output channel per input channel) runs on the
     depthwise tiles (one channel vector each: d->ni is 1): its K is the taps only, and each channel vector reads
     its own input vector. */
  int depthwise = d->groups != 1;
  if (depthwise && (d->ic_g != 1 || d->groups != d->oc || d->transposed))
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a channel-vector convolution with groups must be depthwise (one "
                                      "input and one output channel per group)");
  r->depthwise = depthwise;
  int64_t L = d->lanes, N = xd[0], C = d->ic_g, H = xd[2], W = xd[3];
  int64_t pt, pl, pb, pr, OH, OW;
  int64_t th = d->kh, tw = d->kw; /* taps per phase */
  if (d->transposed) {
    pt = d->pads[0], pl = d->pads[1], pb = d->pads[2], pr = d->pads[3];
    CHECK(ct_transposed_geometry(d, H, W, &OH, &OW, &th, &tw));
  } else {
    CHECK(ct_conv_geometry(d, H, W, &pt, &pl, &pb, &pr, &OH, &OW));
  }
  cb_job *job = &r->job;
  job->d = d;
  job->N = N;
  job->OC = d->oc;
  job->OCB = (d->oc + L - 1) / L;
  job->groups_of_vectors = (job->OCB + d->ni - 1) / d->ni;
  job->OH = OH;
  job->OW = OW;
  job->K = C * th * tw;
  job->n_phases = d->transposed ? (int)(d->sh * d->sw) : 1;
  job->K_all = job->K * job->n_phases;
  int64_t C_in = C * d->groups;
  int64_t planes = d->in_blocked ? (C_in + L - 1) / L : C_in; /* per batch item */
  int64_t ps = d->in_blocked ? L : 1;
  int64_t block_size = job->OCB * OH * OW * L; /* per item */
  CHECK(ct_conv_outputs(d, ctx, (size_t)out0, N, OH, OW, r->user_out, job->out));
  /* Reuses the NCHW kernels' check: per-pixel inputs come in the outputs' layout. */
  ct_job sizes;
  memset(&sizes, 0, sizeof(sizes));
  CHECK(ct_extras_at(d, &sizes, ctx, in_extra, N, d->out_blocked ? block_size : d->oc * OH * OW, d->oc, 0, -1));
  memcpy(job->extra, sizes.extra, sizeof(job->extra));
  memcpy(job->extra_count, sizes.extra_count, sizeof(job->extra_count));
  if (N == 0 || OH * OW == 0) return NULL; /* tasks 0 */
  /* The padded copy: a convolution's pads; for a transposed one, the rows and columns its phases read around the
     input. */
  int64_t Pt = pt, Pl = pl, Hp = H + pt + pb, Wp = W + pl + pr;
  if (d->transposed) {
    cbt_border(H, OH, d->sh, th, d->dh, pt, &Pt, &Hp);
    cbt_border(W, OW, d->sw, tw, d->dw, pl, &Pl, &Wp);
  }
  int padded = Pt || Pl || Hp != H || Wp != W;
  /* NCHW outputs: the tiles write blocked buffers, converted at the end; NCHW residuals are converted first. */
  CHECK(cb_blocked_scratch(d, ctx, N, OH * OW, block_size, job->out, job->extra, job->extra_count, &r->scratch, -1));
  const float *x;
  OrtStatus *st = API(GetTensorMutableData)((OrtValue *)xv, (void **)&x);
  if (!st) st = API(GetTensorMutableData)((OrtValue *)wv, (void **)&job->w);
  if (!st && depthwise && !d->in_blocked) {
    /* An NCHW input (a depthwise convolution whose producer writes NCHW): its tiles read channel vectors, so it is
       reordered to blocked first, one pass over it (what onnxruntime's NCHWc depthwise convolution does too). */
    r->buf = glue_floats((size_t)(N * job->OCB * H * W * L));
    st = r->buf ? cb_reorder(ctx, (float *)x, r->buf, N, C_in, L, H * W, 0)
                : fail(ORT_FAIL, "onnxopt: out of memory for the blocked input");
    x = r->buf;
  }
  if (!st && depthwise) st = cb_prepare_depthwise(r, d, x, H, W, pt, pl);
  if (st || depthwise) goto done;
  job->win.on = !d->transposed && padded &&
                cb_window_pays(d, &job->win, N, planes, ps, H, W, OH, OW, Hp, Wp, pt, pl, job->groups_of_vectors);
  if (job->win.on) { /* the tables address the input itself */
    Hp = H;
    Wp = W;
  }
  job->item_in = planes * Hp * Wp * ps;
  int64_t *aoff = (int64_t *)malloc((size_t)(job->K_all + (job->win.on ? job->K : 0) + 1) * sizeof(int64_t));
  r->aoff = aoff;
  if (!aoff) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  if (!padded || job->win.on) {
    job->in = x;
  } else {
    int64_t total = N * job->item_in;
    r->buf = glue_floats((size_t)total);
    if (!r->buf) {
      st = fail(ORT_FAIL, "onnxopt: out of memory for the blocked input");
      goto done;
    }
    cb_copy_job cj = {x, r->buf, ps, H, W, Hp, Wp, Pt, Pl};
    int64_t rows = N * planes * Hp;
    if (total < (1 << 16)) {
      for (int64_t i = 0; i < rows; i++) cb_copy_row(&cj, (size_t)i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, cb_copy_row, (size_t)rows, 0, &cj);
      if (st) goto done;
    }
    job->in = r->buf;
  }
  for (int64_t ph = 0, i = 0; ph < (d->transposed ? d->sh : 1); ph++)
    for (int64_t pw = 0; pw < (d->transposed ? d->sw : 1); pw++, i++) {
      cb_phase *p = &job->phase[i];
      int64_t *tab = aoff + i * job->K;
      int64_t ah = 0, aw = 0, bh = 0, bw = 0; /* tap blocks, input index of tap 0 (in the padded copy) */
      int64_t step_h = d->dh, step_w = d->dw;
      if (d->transposed) {
        cbt_axis(ph, d->sh, d->dh, pt, &ah, &bh);
        cbt_axis(pw, d->sw, d->dw, pl, &aw, &bw);
        bh += Pt;
        bw += Pl;
        step_h = -d->dh; /* tap t reads dil * t rows before tap 0 */
        step_w = -d->dw;
        p->row_len = OW > pw ? (OW - pw + d->sw - 1) / d->sw : 0;
        p->rows = OH > ph && p->row_len ? (OH - ph + d->sh - 1) / d->sh : 0;
        p->pixels = p->rows * p->row_len;
        p->in_row = Wp * ps;
        p->a_ms = ps;
        p->out_base = (ph * OW + pw) * L;
        p->out_row = d->sh * OW * L;
        p->ldc = d->sw * L;
        p->w_off = (ah * d->sw + aw) * job->K * d->ni * L;
        p->K = ct_phase_rows(d, ah, aw, tw, C);
      } else {
        int flat = d->kh == 1 && d->kw == 1 && d->sh == 1 && d->sw == 1 && !padded;
        p->pixels = OH * OW;
        int64_t flat_rows = (p->pixels + CB_FLAT_ROW - 1) / CB_FLAT_ROW; /* of near-equal length */
        p->row_len = flat ? (p->pixels + flat_rows - 1) / flat_rows : OW;
        p->rows = (p->pixels + p->row_len - 1) / p->row_len;
        p->in_row = flat ? p->row_len * ps : d->sh * Wp * ps;
        p->a_ms = flat ? ps : d->sw * ps;
        p->out_base = 0;
        p->out_row = p->row_len * L;
        p->ldc = L;
        p->w_off = 0;
        p->K = job->K;
      }
      /* k = (r, c, ic) for a transposed convolution (its packing), (ic, r, c) for a convolution. */
      for (int64_t ic = 0; ic < C; ic++)
        for (int64_t rr = 0; rr < th; rr++)
          for (int64_t c = 0; c < tw; c++) {
            int64_t y = bh + rr * step_h, xx = bw + c * step_w;
            int64_t k = d->transposed ? (rr * tw + c) * C + ic : (ic * th + rr) * tw + c;
            tab[k] = d->in_blocked ? ((ic / L) * Hp * Wp + y * Wp + xx) * L + ic % L : ic * Hp * Wp + y * Wp + xx;
          }
      p->aoff = tab;
      job->rows += p->rows;
    }
  if (job->win.on) {
    int64_t *tab = aoff + job->K_all, span = job->win.span;
    for (int64_t ic = 0; ic < C; ic++)
      for (int64_t rr = 0; rr < th; rr++)
        for (int64_t c = 0; c < tw; c++)
          tab[(ic * th + rr) * tw + c] = d->in_blocked ? (((ic / L) * th + rr) * span + c * d->dw) * L + ic % L
                                                       : (ic * th + rr) * span + c * d->dw;
    job->win.koff = tab;
  }
  /* The tiles compute whole vectors of output channels: the work is OCB * L channels' worth, not oc's (UNet's
     16 -> 1 output head counted 0.4 MFLOP, ran inline on one thread, and took 0.37 ms). */
  job->weights_major = cb_weights_major(job, d->ni, L);
  r->tasks = cb_split(job, 2.0 * (double)N * (double)OH * OW * (double)(job->OCB * L) * (double)job->K_all /
                               job->n_phases,
                      N * job->rows, job->groups_of_vectors);
done:
  if (st) {
    r->tasks = 0;
    cb_finish(r, ctx, NULL);
  }
  return st;
}

static OrtStatus *ct_conv_blocked(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const OrtValue *xv,
                                  const int64_t *xd, const OrtValue *wv) {
  cb_ready r;
  CHECK(cb_prepare(d, ctx, xv, xd, wv, 2, 0, &r));
  OrtStatus *st = NULL;
  if (r.tasks == 1) cb_ready_task(&r, 0);
  else if (r.tasks > 1) st = API(KernelContext_ParallelFor)(ctx, cb_ready_run, (size_t)r.tasks, 0, &r);
  return cb_finish(&r, ctx, st);
}

/* ---- A transposed convolution with few output channels: pixel vectors, by output phase. ----
 *
 * With few output channels the channel-vector kernel leaves lanes idle (one channel: 1 of 16) and its NCHW output
 * goes through a blocked buffer 16 times the size. Here each output phase (see ct_conv_blocked) is an ordinary NCHW
 * convolution job: the packed weights of the phase ([sh][sw][ceil(OC / MI)][th * tw * IC][MI]) times vectors of
 * the phase's output pixels, read from the input (in place when the phase is a plain 1x1 of it, as in a 2x2 / 2
 * kernel; else from one zero-bordered copy shared by all phases) through the phase's tap table. Each phase writes
 * its own dense block [N][OC][Qh][Qw] of a scratch buffer, epilogue applied; one last pass interleaves the phases
 * into the output. Per-pixel epilogue inputs are not supported here (the optimizer uses channel vectors then). */
typedef struct {
  float *const *scratch; /* per output */
  float *const *out;
  int n_out;
  int64_t OC, OH, OW, sh, sw;
  const int64_t *phase_off, *nstr, *qh, *qw; /* per phase: floats into the scratch, between items, rows, columns */
} ctt_interleave_job;

static void ctt_interleave_plane(void *usr, size_t index) {
  const ctt_interleave_job *p = (const ctt_interleave_job *)usr;
  int64_t plane = (int64_t)index; /* n * OC + oc */
  for (int o = 0; o < p->n_out; o++) {
    float *dst = p->out[o] + plane * p->OH * p->OW;
    for (int64_t oh = 0; oh < p->OH; oh++) {
      int64_t ph = oh % p->sh, q = oh / p->sh;
      float *row = dst + oh * p->OW;
      for (int64_t pw = 0; pw < p->sw && pw < p->OW; pw++) {
        int64_t i = ph * p->sw + pw, w = p->qw[i];
        int64_t n = plane / p->OC, oc = plane % p->OC;
        const float *src = p->scratch[o] + p->phase_off[i] + n * p->nstr[i] + (oc * p->qh[i] + q) * w;
        for (int64_t c = 0; c < w; c++) row[pw + c * p->sw] = src[c];
      }
    }
  }
}

/* A kernel as large as its stride, without pads: every phase is a 1x1 of the whole input, so the phases are merged
   into the rows of one matrix product (rows (phase, oc), weights packed [ceil(sh * sw * OC / MI)][IC][MI]) that
   reads the input once. The per-channel epilogue inputs are repeated per phase to match the rows. The optimizer
   packs the weights this way under the same condition (onnxopt/fusion/conv_transpose.py, phases_merged). */
static int ctt_phases_merged(const onnxopt_ct_desc *d) {
  return d->kh == d->sh && d->kw == d->sw && !d->pads[0] && !d->pads[1] && !d->pads[2] && !d->pads[3] &&
         !d->out_pad[0] && !d->out_pad[1];
}

static OrtStatus *ctt_run_merged(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const ct_job *base, const float *x,
                                 const float *w, float *scratch, int64_t *koff, int64_t *offs, float **chan, int64_t N,
                                 int64_t C, int64_t HW) {
  int64_t n_ph = d->sh * d->sw, total = N * n_ph * d->oc * HW, rep = 0;
  ct_job job = *base;
  job.items = N;
  job.groups = 1;
  job.M = n_ph * d->oc;
  job.K = C;
  job.P = HW;
  job.a = w;
  job.b = x;
  job.a_off = offs;
  job.b_off = offs + N;
  for (int64_t n = 0; n < N; n++) {
    offs[n] = 0;
    offs[N + n] = n * C * HW;
  }
  for (int64_t k = 0; k < C; k++) koff[k] = k * HW;
  job.koff = koff;
  for (int o = 0; o < d->sig.n_out; o++) job.out[o] = scratch + o * total;
  for (int e = 0; e < d->n_extra; e++)
    if (d->extra_kind[e] == EX_CHANNEL) rep += (d->extra_nstride[e] ? N : 1) * n_ph * d->oc;
  if (rep) {
    float *next = *chan = glue_floats((size_t)rep);
    if (!next) return fail(ORT_FAIL, "onnxopt: out of memory");
    for (int e = 0; e < d->n_extra; e++) {
      if (d->extra_kind[e] != EX_CHANNEL) continue;
      int64_t items = d->extra_nstride[e] ? N : 1;
      float *start = next;
      for (int64_t n = 0; n < items; n++)
        for (int64_t i = 0; i < n_ph; i++, next += d->oc)
          memcpy(next, base->extra[e] + n * d->oc, (size_t)d->oc * sizeof(float));
      job.extra[e] = start;
      job.extra_count[e] = n_ph * d->oc;
    }
  }
  job.ptiles = (HW + d->ni * d->lanes - 1) / (d->ni * d->lanes);
  return ct_run(&job, ctx);
}

static OrtStatus *ct_conv_transposed_pixels(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const OrtValue *xv,
                                            const int64_t *xd, const OrtValue *wv) {
  int64_t N = xd[0], C = d->ic_g, H = xd[2], W = xd[3];
  int64_t OH, OW, th, tw;
  CHECK(ct_transposed_geometry(d, H, W, &OH, &OW, &th, &tw));
  for (int e = 0; e < d->n_extra; e++)
    if (d->extra_kind[e] == EX_POSITION)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: a pixel-vector transposed convolution takes no per-pixel input");
  int64_t odims[4] = {N, d->oc, OH, OW};
  ct_job base;
  memset(&base, 0, sizeof(base));
  base.d = d;
  CHECK(ct_outputs(d, &base, ctx, odims, 4));
  CHECK(ct_extras(d, &base, ctx, N, d->oc * OH * OW, d->oc, 0));
  if (N == 0) return NULL;
  int64_t n_ph = d->sh * d->sw, K = C * th * tw, mb = (d->oc + d->mi - 1) / d->mi;
  int64_t Pt, Pl, Hp, Wp;
  cbt_border(H, OH, d->sh, th, d->dh, d->pads[0], &Pt, &Hp);
  cbt_border(W, OW, d->sw, tw, d->dw, d->pads[1], &Pl, &Wp);
  int padded = Pt || Pl || Hp != H || Wp != W;
  /* Scratch: per phase [N][OC][Qh][Qw], phases one after the other; merged, [N][phase][OC][H][W]. */
  int merged = ctt_phases_merged(d);
  int64_t phase_off[CB_MAX_PHASES], nstr[CB_MAX_PHASES], qh[CB_MAX_PHASES], qw[CB_MAX_PHASES], total = 0;
  for (int64_t i = 0; i < n_ph; i++) {
    int64_t ph = i / d->sw, pw = i % d->sw;
    qh[i] = OH > ph ? (OH - ph + d->sh - 1) / d->sh : 0;
    qw[i] = OW > pw ? (OW - pw + d->sw - 1) / d->sw : 0;
    phase_off[i] = merged ? i * d->oc * H * W : total;
    nstr[i] = merged ? n_ph * d->oc * H * W : d->oc * qh[i] * qw[i];
    total += N * d->oc * qh[i] * qw[i];
  }
  const float *x, *w;
  CHECK(API(GetTensorMutableData)((OrtValue *)xv, (void **)&x));
  CHECK(API(GetTensorMutableData)((OrtValue *)wv, (void **)&w));
  float *scratch = glue_floats((size_t)(total * d->sig.n_out));
  int64_t *koff = (int64_t *)malloc((size_t)(K > 0 ? K : 1) * sizeof(int64_t));
  int64_t *offs = (int64_t *)malloc((size_t)N * 2 * sizeof(int64_t));
  float *pad = NULL, *chan = NULL;
  OrtStatus *st = NULL;
  if (!scratch || !koff || !offs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  if (merged) {
    st = ctt_run_merged(d, ctx, &base, x, w, scratch, koff, offs, &chan, N, C, H * W);
    goto interleave;
  }
  const float *in = x;
  if (padded) {
    pad = glue_floats((size_t)(N * C * Hp * Wp));
    if (!pad) {
      st = fail(ORT_FAIL, "onnxopt: out of memory for the padded input");
      goto done;
    }
    ct_pad_job pj = {x, pad, H, W, 1, 1, Pt, Pl, Hp, Wp, C, 0};
    if (N * C * Hp * Wp < (1 << 16)) {
      for (int64_t i = 0; i < N * C; i++) ct_pad_channel(&pj, (size_t)i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, ct_pad_channel, (size_t)(N * C), 0, &pj);
      if (st) goto done;
    }
    in = pad;
  }
  for (int64_t i = 0; i < n_ph && !st; i++) {
    if (qh[i] == 0 || qw[i] == 0) continue;
    int64_t ah, aw, bh, bw;
    cbt_axis(i / d->sw, d->sh, d->dh, d->pads[0], &ah, &bh);
    cbt_axis(i % d->sw, d->sw, d->dw, d->pads[1], &aw, &bw);
    bh += Pt;
    bw += Pl;
    ct_job job = base;
    job.items = N;
    job.groups = 1;
    job.M = d->oc;
    job.K = ct_phase_rows(d, ah, aw, tw, C);
    job.K_rows = K;
    job.P = qh[i] * qw[i];
    job.OH = qh[i];
    job.OW = qw[i];
    job.a = w + (ah * d->sw + aw) * mb * d->mi * K;
    job.b = in;
    job.a_off = offs;
    job.b_off = offs + N;
    for (int64_t n = 0; n < N; n++) {
      offs[n] = 0;
      offs[N + n] = n * C * Hp * Wp;
    }
    for (int o = 0; o < d->sig.n_out; o++) job.out[o] = scratch + o * total + phase_off[i];
    /* One tap reading the input pixel for pixel: the phase is a 1x1 over the whole plane. */
    int flat = th == 1 && tw == 1 && bh == 0 && bw == 0 && qh[i] == Hp && qw[i] == Wp;
    for (int64_t r = 0, k = 0; r < th; r++)
      for (int64_t c = 0; c < tw; c++)
        for (int64_t ic = 0; ic < C; ic++, k++) koff[k] = ic * Hp * Wp + (bh - r * d->dh) * Wp + bw - c * d->dw;
    job.koff = koff;
    if (flat) {
      job.ptiles = (job.P + d->ni * d->lanes - 1) / (d->ni * d->lanes);
    } else {
      job.rows_mode = 1;
      job.Wph = Wp;
      job.cseg = (qw[i] + d->lanes - 1) / d->lanes;
      job.ptiles = (qh[i] + d->ni - 1) / d->ni * job.cseg;
    }
    st = ct_run(&job, ctx);
  }
interleave:
  if (!st) {
    float *scr[CT_MAX_OUT];
    for (int o = 0; o < d->sig.n_out; o++) scr[o] = scratch + o * total;
    ctt_interleave_job ij = {scr, base.out, d->sig.n_out, d->oc, OH, OW, d->sh, d->sw, phase_off, nstr, qh, qw};
    if (N * d->oc * OH * OW < (1 << 16)) {
      for (int64_t i = 0; i < N * d->oc; i++) ctt_interleave_plane(&ij, (size_t)i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, ctt_interleave_plane, (size_t)(N * d->oc), 0, &ij);
    }
  }
done:
  glue_release(pad);
  glue_release(chan);
  free(koff);
  free(offs);
  glue_release(scratch);
  return st;
}

static OrtStatus *wg_conv(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const OrtValue *xv, const int64_t *xd,
                          const OrtValue *wv); /* winograd_exec.c */

static OrtStatus *ct_conv(const onnxopt_ct_desc *d, OrtKernelContext *ctx) {
  const OrtValue *xv, *wv;
  int64_t xd[MAX_RANK];
  size_t xr;
  CHECK(ct_conv_inputs(d, ctx, &xv, xd, &xr, &wv));
  if (d->wino_m) return wg_conv(d, ctx, xv, xd, wv);
  if (d->transposed && !d->channel_vectors) return ct_conv_transposed_pixels(d, ctx, xv, xd, wv);
  if (d->out_blocked || d->channel_vectors || d->transposed) return ct_conv_blocked(d, ctx, xv, xd, wv);
  int64_t L = d->in_blocked ? d->lanes : 0;
  ct_job job;
  memset(&job, 0, sizeof(job));
  job.d = d;
  int64_t N = xd[0], C = d->ic_g * d->groups, H = xd[2], W = xd[3];
  int64_t pt, pl, pb, pr, OH, OW;
  CHECK(ct_conv_geometry(d, H, W, &pt, &pl, &pb, &pr, &OH, &OW));
  int64_t odims[4] = {N, d->oc, OH, OW};
  CHECK(ct_outputs(d, &job, ctx, odims, 4));
  job.items = N * d->groups;
  job.groups = d->groups;
  job.M = d->oc / d->groups;
  job.K = d->ic_g * d->kh * d->kw;
  job.P = OH * OW;
  job.OH = OH;
  job.OW = OW;
  CHECK(ct_extras(d, &job, ctx, N, d->oc * OH * OW, d->oc, OH * OW));
  if (N == 0 || OH * OW == 0) return NULL;
  const float *x;
  CHECK(API(GetTensorMutableData)((OrtValue *)xv, (void **)&x));
  CHECK(API(GetTensorMutableData)((OrtValue *)wv, (void **)&job.a));
  /* A blocked input is never read in place: the padded copy (or im2col) turns it into planes. */
  int flat = !L && d->kh == 1 && d->kw == 1 && d->sh == 1 && d->sw == 1 && pt == 0 && pl == 0 && pb == 0 && pr == 0;
  int64_t *koff = (int64_t *)malloc((size_t)job.K * sizeof(int64_t));
  int64_t *offs = (int64_t *)malloc((size_t)job.items * 2 * sizeof(int64_t));
  float *pad = NULL;
  OrtStatus *st = NULL;
  if (!koff || !offs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  job.a_off = offs;
  job.b_off = offs + job.items;
  int64_t mpad = (job.M + d->mi - 1) / d->mi * d->mi;
  int64_t plane;
  /* Rows mode fills OW / (vectors per row * lanes) of each vector; a flat run of all OH * OW pixels fills almost
     all of them. For small images (7x7, 17x17 outputs) that difference is large, and materializing the columns
     (im2col) costs less than the idle lanes; for big images rows mode avoids the big buffer. */
  int64_t lanes_rows = (OW + d->lanes - 1) / d->lanes * d->lanes;
  int64_t lanes_flat = (job.P + d->lanes - 1) / d->lanes * d->lanes;
  double eff_rows = (double)OW / (double)lanes_rows, eff_flat = (double)job.P / (double)lanes_flat;
  int use_col = !flat && eff_flat - eff_rows > 0.08 && (double)job.items * job.K * job.P * 4.0 <= 32.0 * 1048576.0;
  if (use_col) {
    plane = 0;
    pad = glue_floats((size_t)(job.items * job.K * job.P));
    if (!pad) {
      st = fail(ORT_FAIL, "onnxopt: out of memory for the convolution's columns");
      goto done;
    }
    ct_col_job cj = {x, pad, C, H, W, d->ic_g, d->groups, d->kh, d->kw, d->sh, d->sw, d->dh, d->dw, pt, pl, OH, OW, L};
    if (job.items * job.K * job.P < (1 << 16)) {
      for (int64_t i = 0; i < job.items * job.K; i++) ct_col_row(&cj, (size_t)i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, ct_col_row, (size_t)(job.items * job.K), 0, &cj);
      if (st) goto done;
    }
    for (int64_t k = 0; k < job.K; k++) koff[k] = k * job.P;
    job.b = pad;
    job.ptiles = (job.P + d->ni * d->lanes - 1) / (d->ni * d->lanes);
  } else if (flat) {
    plane = H * W;
    for (int64_t k = 0; k < job.K; k++) koff[k] = k * plane;
    job.b = x;
    job.ptiles = (job.P + d->ni * d->lanes - 1) / (d->ni * d->lanes);
  } else {
    int64_t Hph = (H + pt + pb + d->sh - 1) / d->sh, Wph = (W + pl + pr + d->sw - 1) / d->sw;
    int64_t phase = Hph * Wph;
    plane = d->sh * d->sw * phase;
    pad = glue_floats((size_t)(N * C * plane));
    if (!pad) {
      st = fail(ORT_FAIL, "onnxopt: out of memory for the padded input");
      goto done;
    }
    ct_pad_job pj = {x, pad, H, W, d->sh, d->sw, pt, pl, Hph, Wph, C, L};
    if (N * C * plane < (1 << 16)) {
      for (int64_t i = 0; i < N * C; i++) ct_pad_channel(&pj, (size_t)i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, ct_pad_channel, (size_t)(N * C), 0, &pj);
      if (st) goto done;
    }
    int64_t k = 0;
    for (int64_t ic = 0; ic < d->ic_g; ic++)
      for (int64_t r = 0; r < d->kh; r++)
        for (int64_t c = 0; c < d->kw; c++, k++) {
          int64_t y = r * d->dh, xx = c * d->dw;
          koff[k] = ic * plane + ((y % d->sh) * d->sw + xx % d->sw) * phase + (y / d->sh) * Wph + xx / d->sw;
        }
    job.b = pad;
    job.rows_mode = 1;
    job.Wph = Wph;
    job.cseg = (OW + d->lanes - 1) / d->lanes;
    job.ptiles = (OH + d->ni - 1) / d->ni * job.cseg;
  }
  for (int64_t i = 0; i < job.items; i++) {
    job.a_off[i] = (i % d->groups) * mpad * job.K;
    job.b_off[i] = use_col ? i * job.K * job.P : i * d->ic_g * plane;
  }
  job.koff = koff;
  st = ct_run(&job, ctx);
done:
  glue_release(pad);
  free(koff);
  free(offs);
  return st;
}

static OrtStatus *ct_matmul(const onnxopt_ct_desc *d, OrtKernelContext *ctx) {
  const OrtValue *av, *bv;
  int64_t ad[MAX_RANK], bd[MAX_RANK];
  size_t ar, br;
  CHECK(ct_dims(ctx, 0, &av, ad, &ar));
  CHECK(ct_dims(ctx, 1, &bv, bd, &br));
  if (ar < 2 || br < 2) return fail(ORT_INVALID_ARGUMENT, "onnxopt: matmul operands must have rank 2 or more");
  int64_t M = d->trans_a ? ad[ar - 1] : ad[ar - 2], K = d->trans_a ? ad[ar - 2] : ad[ar - 1];
  int64_t N = bd[br - 1];
  if (bd[br - 2] != K) return fail(ORT_INVALID_ARGUMENT, "onnxopt: matmul inner dimensions differ");
  size_t R = ar > br ? ar : br;
  int64_t od[MAX_RANK];
  int64_t batch = 1;
  for (size_t j = 0; j + 2 < R; j++) {
    int64_t x = j + ar >= R ? ad[j + ar - R] : 1, y = j + br >= R ? bd[j + br - R] : 1;
    if (x != y && x != 1 && y != 1) return fail(ORT_INVALID_ARGUMENT, "onnxopt: matmul batch dims cannot broadcast");
    od[j] = x > y ? x : y;
    if (x == 0 || y == 0) od[j] = 0;
    batch *= od[j];
  }
  od[R - 2] = M;
  od[R - 1] = N;
  ct_job job;
  memset(&job, 0, sizeof(job));
  job.d = d;
  CHECK(ct_outputs(d, &job, ctx, od, R));
  job.items = batch;
  job.groups = 1;
  job.M = M;
  job.K = K;
  job.P = N;
  CHECK(ct_extras(d, &job, ctx, batch, M * N, M, N));
  if (batch == 0 || M == 0 || N == 0) return NULL;
  CHECK(API(GetTensorMutableData)((OrtValue *)av, (void **)&job.a));
  CHECK(API(GetTensorMutableData)((OrtValue *)bv, (void **)&job.b));
  if (K == 0) {
    /* An empty sum: the epilogue still runs, on zeros, through a zero-length K loop. */
  }
  int64_t *koff = (int64_t *)malloc((size_t)(K > 0 ? K : 1) * sizeof(int64_t));
  int64_t *offs = (int64_t *)malloc((size_t)batch * 2 * sizeof(int64_t));
  OrtStatus *st = NULL;
  if (!koff || !offs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  for (int64_t k = 0; k < K; k++) koff[k] = k * N;
  job.a_off = offs;
  job.b_off = offs + batch;
  for (int64_t i = 0; i < batch; i++) { /* broadcast batch index -> each operand's matrix */
    int64_t r = i, oa = 0, ob = 0, sa = M * K, sb = K * N;
    for (size_t j = R - 2; j-- > 0;) {
      int64_t idx = r % od[j];
      r /= od[j];
      int64_t x = j + ar >= R ? ad[j + ar - R] : 1, y = j + br >= R ? bd[j + br - R] : 1;
      if (x != 1) oa += idx * sa;
      if (y != 1) ob += idx * sb;
      sa *= x;
      sb *= y;
    }
    job.a_off[i] = oa;
    job.b_off[i] = ob;
  }
  job.a_ms = d->trans_a ? 1 : K;
  job.a_ks = d->trans_a ? M : 1;
  job.koff = koff;
  job.ptiles = (N + d->ni * d->lanes - 1) / (d->ni * d->lanes);
  st = ct_run(&job, ctx);
done:
  free(koff);
  free(offs);
  return st;
}

static OrtStatus *ct_compute(const onnxopt_ct_desc *d, OrtKernelContext *ctx) {
  return d->sig.kind == KIND_CONV ? ct_conv(d, ctx) : ct_matmul(d, ctx);
}
