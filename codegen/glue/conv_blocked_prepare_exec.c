/* ---- The blocked convolution's preparation: transposed geometry, the padded window, the weights-major order,
 * the ready steps (padding, reorders, depthwise copies) and ct_conv_blocked. Included after conv_blocked_exec.c
 * (codegen/glue/kinds.py). ---- */

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
  float *unpacked; /* float16 pairs unpacked for the float32 tiles (cb_unpack_f16_pairs) */
} cb_ready;

static void cb_ready_task(const cb_ready *r, int64_t task) {
  if (r->depthwise) cb_run_depthwise_task(&r->job, task);
  else if (r->job.amx) cb_run_amx_task(&r->job, task);
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
  free(r->unpacked);
  glue_release(r->scratch);
  r->buf = r->scratch = NULL;
  r->aoff = NULL;
  r->unpacked = NULL;
  return st;
}

/* The dims of 16-bit convolution weights, which are 3-D ([groups of vectors][pair rows][NI * L]). */
static OrtStatus *cb_weight_dims(const OrtValue *wv, int64_t wd[3]) {
  OrtTensorTypeAndShapeInfo *info;
  size_t wr = 0;
  CHECK(API(GetTensorTypeAndShape)(wv, &info));
  OrtStatus *st = API(GetDimensionsCount)(info, &wr);
  if (!st && wr != 3) st = fail(ORT_INVALID_ARGUMENT, "onnxopt: 16-bit convolution weights must be 3-D");
  if (!st) st = API(GetDimensions)(info, wd, 3);
  API(ReleaseTensorTypeAndShapeInfo)(info);
  return st;
}

/* float16 weights in pairs for AMX-FP16 tiles, [G][pairs * taps][width][2] (pairs padded to blocks of 16), as the
   float32 tiles' weights [G][C * taps][width]: where the tiles cannot run (a CPU without AMX-FP16, or a kernel
   that does not grant the tile state), once a call. */
static float *cb_unpack_f16_pairs(const uint16_t *w, int64_t G, int64_t pairs, int64_t C, int64_t taps,
                                  int64_t width) {
  float *out = (float *)malloc((size_t)(G * C * taps * width) * sizeof(float));
  if (!out) return NULL;
  for (int64_t g = 0; g < G; g++)
    for (int64_t ic = 0; ic < C; ic++)
      for (int64_t t = 0; t < taps; t++) {
        const uint16_t *from = w + (((g * pairs + ic / 2) * taps + t) * width) * 2 + ic % 2;
        float *to = out + ((g * C + ic) * taps + t) * width;
        for (int64_t col = 0; col < width; col++) to[col] = glue_f16_value(from[col * 2]);
      }
  return out;
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

/* The rest of cb_prepare for a bfloat16 convolution on AMX tiles (cb_run_amx_task): the input copied into blocks of
   32 channels (cb_copy32_row; `blocks` of them an item), the geometry table, the rows and the split. The copy has
   slack after its end for the reads of the last calls' pixels past their rows, which are computed and dropped. */
#define CB_AMX_ROW 128 /* virtual pixels a row of a stride-1 convolution's walk: 4 calls of 32 */
static OrtStatus *cb_prepare_amx(cb_ready *r, const onnxopt_ct_desc *d, OrtKernelContext *ctx, const float *x,
                                 int64_t blocks, int64_t H, int64_t W, int64_t Hp, int64_t Wp, int64_t pt,
                                 int64_t pl, int f16) {
  cb_job *job = &r->job;
  int64_t N = job->N, NI = d->ni, taps = d->kh * d->kw, C = d->ic_g;
  job->amx = 1;
  job->amx_Wp = Wp;
  job->amx_item = blocks * Hp * Wp * 32;
  int64_t slack = (32 * d->sw + (d->kw - 1) * d->dw + Wp + 32) * 32;
  int64_t total = N * job->amx_item + slack;
  uint16_t *copy = (uint16_t *)glue_floats((size_t)(total + 1) / 2);
  if (!copy) return fail(ORT_FAIL, "onnxopt: out of memory for the bfloat16 input");
  r->buf = (float *)copy;
  cb_copy32_job cj = {x, copy, C, H, W, Hp, Wp, pt, pl, blocks, d->in_blocked, f16};
  int64_t rows = N * blocks * Hp;
  if (N * job->amx_item < (1 << 16)) {
    for (int64_t i = 0; i < rows; i++) cb_copy32_row(&cj, (size_t)i);
  } else {
    CHECK(API(KernelContext_ParallelFor)(ctx, cb_copy32_row, (size_t)rows, 0, &cj));
  }
  job->in32 = copy;
  int64_t g[CB_AMX_GEOMETRY] = {Hp * Wp * 64, d->dh * Wp * 64, d->dw * 64, blocks, d->kh, d->kw,
                                16 * taps * NI * 64, d->kw * NI * 64, NI * 64, taps * NI * 64};
  memcpy(job->amx_geometry, g, sizeof(g));
  if (d->sh == 1 && d->sw == 1) {
    job->amx_row = CB_AMX_ROW;
    job->rows = ((job->OH - 1) * Wp + job->OW + CB_AMX_ROW - 1) / CB_AMX_ROW;
  } else {
    job->rows = job->OH;
  }
  job->weights_major = cb_weights_major(job, NI, d->lanes);
  r->tasks = cb_split(job, 2.0 * (double)N * (double)job->OH * job->OW * (double)(job->OCB * d->lanes) *
                               (double)(blocks * 32 * taps), N * job->rows, job->groups_of_vectors);
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
  /* bfloat16 weights (onnxopt/driver/precision.py, fusion/layout.py lower_blocked_conv): pairs of adjacent input
     channels, [groups][ceil(C / 2) * kh * kw][ni * lanes][2]; the tiles (vdpbf16ps) read a bfloat16 copy of the
     input, blocked (an NCHW input is blocked by the copy), where a pair is one 32-bit broadcast. */
  int bf16 = d->sig.in_types[1] == 16 || d->sig.in_types[1] == 4; /* bfloat16, or its bits as uint16 (opset < 13) */
  if (bf16 && (d->transposed || L != 16 || d->groups != 1))
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: bfloat16 convolution weights need a one-group, 16-lane kernel");
  /* float16 weights: pairs for AMX-FP16 tiles (`--precision fp16`), which the library carries (d->amx_groups) */
  int f16 = d->sig.in_types[1] == 10;
  if (f16 && (d->transposed || d->groups != 1 || L != 16 || d->amx_groups <= 0))
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: float16 convolution weights need a one-group kernel with AMX tiles");
  int blocked_in = d->in_blocked || bf16;
  int64_t planes = blocked_in ? (C_in + L - 1) / L : C_in; /* per batch item */
  int64_t ps = blocked_in ? L : 1;
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
  int64_t wd[3];
  if (bf16 || f16) {
    st = cb_weight_dims(wv, wd);
    if (st) goto done;
  }
  if (bf16) {
    job->K = job->K_all = (C + 1) / 2 * th * tw;
    /* pairs of input channels a tap, as stored: ceil(C / 2), or padded to whole blocks of 32 channels (16 pairs)
       where the target has AMX-BF16 */
    int64_t pairs = wd[1] / 2 / (th * tw);
    if (pairs < (C + 1) / 2 || wd[2] != d->ni * L || wd[0] < job->groups_of_vectors) {
      st = fail(ORT_INVALID_ARGUMENT, "onnxopt: the bfloat16 convolution weights have the wrong shape");
      goto done;
    }
    job->w_group = pairs * th * tw * d->ni * L;
    if (d->amx_groups > 0 && pairs % 16 == 0 && amx_ok(AMX_BF16)) {
      st = cb_prepare_amx(r, d, ctx, x, pairs / 16, H, W, Hp, Wp, pt, pl, 0);
      goto done;
    }
  }
  if (f16) {
    /* pairs of input channels a tap, padded to blocks of 32 channels */
    int64_t taps = th * tw, pairs = wd[1] / 2 / taps;
    if (wd[0] < job->groups_of_vectors || wd[2] != d->ni * L || pairs % 16 || pairs * 2 < C ||
        pairs * 2 * taps != wd[1]) {
      st = fail(ORT_INVALID_ARGUMENT, "onnxopt: the float16 convolution weights have the wrong shape");
      goto done;
    }
    if (amx_ok(AMX_FP16)) {
      job->w_group = pairs * taps * d->ni * L; /* pairs, 4 bytes each */
      st = cb_prepare_amx(r, d, ctx, x, pairs / 16, H, W, Hp, Wp, pt, pl, 1);
      goto done;
    }
    r->unpacked = cb_unpack_f16_pairs((const uint16_t *)(const void *)job->w, wd[0], pairs, C, taps, wd[2]);
    if (!r->unpacked) {
      st = fail(ORT_FAIL, "onnxopt: out of memory for the float32 weights");
      goto done;
    }
    job->w = r->unpacked;
  }
  job->win.on = !bf16 && !d->transposed && padded &&
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
  if (bf16) {
    int64_t total = N * job->item_in, rows = N * planes * Hp;
    uint16_t *copy = (uint16_t *)glue_floats((size_t)(total + 1) / 2);
    r->buf = (float *)copy;
    if (!copy) {
      st = fail(ORT_FAIL, "onnxopt: out of memory for the bfloat16 input");
      goto done;
    }
    cb_copy16_job cj = {x, copy, ps, H, W, Hp, Wp, Pt, Pl, d->in_blocked ? 0 : C_in};
    if (total < (1 << 16)) {
      for (int64_t i = 0; i < rows; i++) cb_copy16_row(&cj, (size_t)i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, cb_copy16_row, (size_t)rows, 0, &cj);
      if (st) goto done;
    }
    job->in16 = copy;
  } else if (!padded || job->win.on) {
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
      /* k = (r, c, ic) for a transposed convolution (its packing), (ic, r, c) for a convolution; in bfloat16,
         pair kk = (ic / 2, r, c), its tap's offset that of the pair's even channel. */
      for (int64_t ic = 0; bf16 && ic < C; ic += 2)
        for (int64_t rr = 0; rr < th; rr++)
          for (int64_t c = 0; c < tw; c++)
            tab[(ic / 2 * th + rr) * tw + c] = ((ic / L) * Hp * Wp + (rr * step_h) * Wp + c * step_w) * L + ic % L;
      for (int64_t ic = 0; !bf16 && ic < C; ic++)
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
                               job->n_phases * (bf16 ? 2 : 1),
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
