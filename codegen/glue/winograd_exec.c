/* ---- Winograd convolutions on channel vectors (onnxopt/fusion/winograd.py): F(mh x mw, kh x kw) for 3x3, 5x5,
 * 1xk and kx1 stride-1 kernels. ----
 *
 * Inserted after compute_exec.c. Per call, in one of two task forms (wg_conv picks):
 *  - the input transform: each nh x nw input window (nh = mh + kh - 1, nw = mw + kw - 1) of each input channel
 *    vector becomes nn = nh * nw vectors, stored by position ([nn][CB][tiles][L], tiles row-major over the output).
 *    Windows that cross the border are copied, zero-padded, into a small buffer first (any padding, SAME included);
 *  - the products, per group of NI output channel vectors and block of tiles: for each of the nn positions, that
 *    position's transformed inputs (tiles x C) times the transformed weights (C x NI * L) by the blocked tiles with an
 *    empty epilogue (the tile's pixels are the block's tiles, its k the input channels through a tap table), into a
 *    buffer M [nn][NI][tiles][L] kept by the task; then the output transform of each tile and vector, which runs the
 *    region's epilogue and writes the mh x mw pixels inside the image.
 * One phase (wg_fused_block): a task per (item, block of tiles) transforms its block's inputs into its own buffer
 * and runs every group on it, so the transformed inputs stay in the core's cache and the call wakes the pool once.
 * Two phases (wg_input_row, then wg_product_block): all inputs are transformed into V [N][n^2][CB][T][L] first,
 * then tasks split over groups as well as blocks, for layers with few tiles and many channels (14x14, 7x7), where
 * one phase would leave cores idle. The block of tiles bounds the task's buffers (WG_M_BYTES, so they stay in L2)
 * while every tile of the block reuses each weight vector; the split aims at WG_MIN_TASKS tasks for the thread pool.
 * Inputs and outputs as ct_conv_blocked's: an NCHW input is reordered to blocked first; NCHW outputs
 * (channel_vectors) go through blocked buffers. A grouped convolution (each group's channels whole vectors:
 * fusion/winograd.py group_refusal) runs each group as its own convolution over its own input and output vectors
 * of those buffers: its runs of NI output vectors are numbered across the groups, the weights packed in that order,
 * and every task still transforms each input vector once. */

#define WG_M_BYTES (256 * 1024)
#define WG_MIN_TASKS 8
#define WG_MAX_SIDE 10 /* nh, nw: F(1x4, 1x7) */
#define WG_MAX_NN 36   /* nh * nw: F(4x4, 3x3), F(2x2, 5x5) */

typedef struct { /* mirrors codegen/compute/winograd.py */
  const float *src;
  int64_t src_row;
  float *dst;
  int64_t dst_step;
} wg_in_rec;

typedef struct {
  const float *src;
  int64_t src_step, out_row, rows, cols, lanes;
  float *out[CT_MAX_OUT];
  const float *extra[CT_MAX_EXTRA];
} wg_out_rec;

typedef struct {
  const onnxopt_ct_desc *d;
  int64_t N, C, CB, OC, OCB, H, W, OH, OW, pt, pl; /* C: a group's input channels; CB, OC, OCB: all groups' */
  int64_t CBg, OCg, OCBg;                /* a convolution group's input vectors, output channels and vectors */
  int64_t mh, mw, nh, nw, nn, TH, TW, T; /* tile, window; tiles per column, per row, per item */
  int64_t runs, groups, blocks; /* runs of NI output vectors a convolution group; all groups' runs; tile blocks */
  const float *x;              /* blocked input */
  float *V;
  const float *w;
  int64_t *koff;               /* per input channel: its offset in one position's [CB][T][L] */
  float *out[CT_MAX_OUT];
  const float *extra[CT_MAX_EXTRA];
  int64_t extra_count[CT_MAX_EXTRA];
  int failed; /* a task ran out of memory (set by any thread; reported after the parallel section) */
} wg_job;

/* The input transform of tile (ty, tx) of one channel vector's plane into dst (positions dst_step apart). */
static void wg_input_tile(const wg_job *j, const float *plane, int64_t ty, int64_t tx, float *dst, int64_t dst_step) {
  const onnxopt_ct_desc *d = j->d;
  int64_t L = d->lanes, nh = j->nh, nw = j->nw;
  float win[WG_MAX_NN * 16] __attribute__((aligned(64)));
  wg_in_rec rec;
  rec.dst_step = dst_step;
  rec.dst = dst;
  int64_t ih0 = ty * j->mh - j->pt, iw0 = tx * j->mw - j->pl;
  if (ih0 >= 0 && ih0 + nh <= j->H && iw0 >= 0 && iw0 + nw <= j->W) {
    rec.src = plane + (ih0 * j->W + iw0) * L;
    rec.src_row = j->W * L;
  } else {
    memset(win, 0, sizeof(float) * (size_t)(nh * nw * L));
    int64_t c0 = iw0 < 0 ? -iw0 : 0, c1 = j->W - iw0 < nw ? j->W - iw0 : nw;
    for (int64_t r = 0; r < nh && c1 > c0; r++) {
      int64_t ih = ih0 + r;
      if (ih < 0 || ih >= j->H) continue;
      memcpy(win + (r * nw + c0) * L, plane + (ih * j->W + iw0 + c0) * L, sizeof(float) * (size_t)((c1 - c0) * L));
    }
    rec.src = win;
    rec.src_row = nw * L;
  }
  d->wino_in((const int64_t *)&rec);
}

/* Two-phase form, phase 1: one row of tiles of one input channel vector of one item, into the shared V. */
static void wg_input_row(void *usr, size_t index) {
  const wg_job *j = (const wg_job *)usr;
  int64_t L = j->d->lanes;
  int64_t ty = (int64_t)index % j->TH, rest = (int64_t)index / j->TH, cb = rest % j->CB, item = rest / j->CB;
  const float *plane = j->x + (item * j->CB + cb) * j->H * j->W * L;
  float *vbase = j->V + item * j->nn * j->CB * j->T * L + cb * j->T * L;
  for (int64_t tx = 0; tx < j->TW; tx++)
    wg_input_tile(j, plane, ty, tx, vbase + (ty * j->TW + tx) * L, j->CB * j->T * L);
}

/* The products of tiles [t0, t1) of one item with run g of NI output vectors (of convolution group g / runs), and
 * their output transforms. `v` holds the tiles' transformed inputs as [nn][CB][vt][L] with tile t0 at offset v0
 * (vt: tiles per channel vector), koff each of a group's input channels' offset in one position's [CBg][vt][L]; M
 * the task's product buffer. */
static void wg_products(const wg_job *j, int64_t item, int64_t g, int64_t t0, int64_t t1, const float *v, int64_t v0,
                        int64_t vt, const int64_t *koff, float *M) {
  const onnxopt_ct_desc *d = j->d;
  int64_t L = d->lanes, NI = d->ni, MI = d->mi, nn = j->nn, mh = j->mh, mw = j->mw, tb = t1 - t0;
  int64_t cg = g / j->runs, run = g % j->runs; /* convolution group, run of NI vectors in it */
  int nv = (int)(j->OCBg - run * NI < NI ? j->OCBg - run * NI : NI);
  v += cg * j->CBg * vt * L; /* the group's input vectors */
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.koff = koff;
  t.k = j->C;
  t.a_ms = L;
  t.ldc = L;
  for (int jj = 0; jj < nv; jj++) {
    int64_t left = j->OCg - (run * NI + jj) * L;
    t.voff[jj] = jj * L;
    t.lanes[jj] = left < L ? left : L;
  }
  /* A block in near-equal tiles of at most MI (as cb_run_task: a short last tile runs far below the others' rate). */
  int64_t tiles = (tb + MI - 1) / MI;
  for (int64_t xi = 0; xi < nn; xi++) {
    t.b = j->w + (g * nn + xi) * j->C * NI * L;
    t.out[0] = M + xi * NI * tb * L;
    for (int64_t ti = 0, count; ti < tiles; ti += count) { /* tiles of one size in one call */
      int64_t p0 = ti * tb / tiles, mi = (ti + 1) * tb / tiles - p0;
      for (count = 1; ti + count < tiles && (ti + count + 1) * tb / tiles - (ti + count) * tb / tiles == mi;) count++;
      t.count = count;
      t.a = v + xi * j->CB * vt * L + v0 + p0 * L;
      for (int jj = 0; jj < nv; jj++) t.coff[jj] = jj * tb * L + p0 * L;
      d->tiles[(mi - 1) * NI + (nv - 1)]((const int64_t *)&t);
    }
  }
  int64_t plane = j->OH * j->OW * L;
  wg_out_rec o;
  memset(&o, 0, sizeof(o));
  o.src_step = NI * tb * L;
  o.out_row = j->OW * L;
  for (int jj = 0; jj < nv; jj++) {
    int64_t kb = cg * j->OCBg + run * NI + jj; /* the output vector among all groups' */
    o.lanes = t.lanes[jj];
    const float *base[CT_MAX_EXTRA];
    for (int e = 0; e < d->n_extra; e++) {
      base[e] = j->extra[e] + (d->extra_nstride[e] ? item * j->extra_count[e] : 0);
      if (d->extra_kind[e] == EX_CHANNEL) base[e] += kb * L;
      else if (d->extra_kind[e] == EX_POSITION) base[e] += kb * plane;
      o.extra[e] = base[e];
    }
    for (int64_t tt = t0; tt < t1; tt++) {
      int64_t oy = (tt / j->TW) * mh, ox = (tt % j->TW) * mw, pix = (oy * j->OW + ox) * L;
      o.src = M + jj * tb * L + (tt - t0) * L;
      o.rows = j->OH - oy < mh ? j->OH - oy : mh;
      o.cols = j->OW - ox < mw ? j->OW - ox : mw;
      for (int k = 0; k < d->sig.n_out; k++) o.out[k] = j->out[k] + (item * j->OCB + kb) * plane + pix;
      for (int e = 0; e < d->n_extra; e++)
        if (d->extra_kind[e] == EX_POSITION) o.extra[e] = base[e] + pix;
      d->wino_out((const int64_t *)&o);
    }
  }
}

/* Two-phase form, phase 2: one (item, group, block of tiles), reading the shared V. */
static void wg_product_block(void *usr, size_t index) {
  wg_job *j = (wg_job *)usr;
  int64_t L = j->d->lanes, NI = j->d->ni;
  int64_t blk = (int64_t)index % j->blocks, rest = (int64_t)index / j->blocks;
  int64_t g = rest % j->groups, item = rest / j->groups;
  int64_t t0 = blk * j->T / j->blocks, t1 = (blk + 1) * j->T / j->blocks, tb = t1 - t0;
  if (tb <= 0) return;
  float *M = glue_floats((size_t)(j->nn * NI * tb * L));
  if (!M) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  wg_products(j, item, g, t0, t1, j->V + item * j->nn * j->CB * j->T * L, t0 * L, j->T, j->koff, M);
  glue_release(M);
}

/* One-phase form: one (item, block of tiles) transforms its own tiles' inputs into a task buffer, then runs every
 * output group on them. Each tile's input transform runs once, as in the two-phase form, but the transformed tiles
 * stay in the core's cache and the call has one parallel section instead of two. */
static void wg_fused_block(void *usr, size_t index) {
  wg_job *j = (wg_job *)usr;
  int64_t L = j->d->lanes, NI = j->d->ni, nn = j->nn;
  int64_t blk = (int64_t)index % j->blocks, item = (int64_t)index / j->blocks;
  int64_t t0 = blk * j->T / j->blocks, t1 = (blk + 1) * j->T / j->blocks, tb = t1 - t0;
  if (tb <= 0) return;
  size_t v_bytes = (size_t)(nn * j->CB * tb * L) * sizeof(float), m_bytes = (size_t)(nn * NI * tb * L) * sizeof(float);
  size_t k_bytes = (size_t)j->C * sizeof(int64_t);
  char *buf = (char *)glue_bytes(v_bytes + m_bytes + k_bytes);
  if (!buf) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  float *v = (float *)buf, *M = (float *)(buf + v_bytes);
  int64_t *koff = (int64_t *)(buf + v_bytes + m_bytes);
  for (int64_t c = 0; c < j->C; c++) koff[c] = (c / L) * tb * L + c % L;
  for (int64_t cb = 0; cb < j->CB; cb++) {
    const float *plane = j->x + (item * j->CB + cb) * j->H * j->W * L;
    for (int64_t tt = t0; tt < t1; tt++)
      wg_input_tile(j, plane, tt / j->TW, tt % j->TW, v + (cb * tb + tt - t0) * L, j->CB * tb * L);
  }
  for (int64_t g = 0; g < j->groups; g++) wg_products(j, item, g, t0, t1, v, 0, tb, koff, M);
  glue_release(buf);
}

static OrtStatus *wg_parallel(OrtKernelContext *ctx, void (*fn)(void *, size_t), int64_t tasks, wg_job *job,
                              double flops) {
  if (tasks <= 1 || flops < CT_INLINE_FLOPS) {
    for (int64_t i = 0; i < tasks; i++) fn(job, (size_t)i);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, fn, (size_t)tasks, 0, job);
}

static OrtStatus *wg_conv(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const OrtValue *xv, const int64_t *xd,
                          const OrtValue *wv) {
  wg_job job;
  memset(&job, 0, sizeof(job));
  job.d = d;
  /* The tile spans m pixels along each axis the kernel spans (fusion/winograd.py, tile_shape). */
  job.mh = d->kh > 1 ? d->wino_m : 1, job.mw = d->kw > 1 ? d->wino_m : 1;
  job.nh = job.mh + d->kh - 1, job.nw = job.mw + d->kw - 1, job.nn = job.nh * job.nw;
  int64_t G = d->groups < 1 ? 1 : d->groups, L = d->lanes;
  if ((G > 1 && (d->ic_g % L || (d->oc / G) % L || d->oc % G || d->in_blocked || d->out_blocked)) || d->sh != 1 ||
      d->sw != 1 || d->dh != 1 || d->dw != 1 || d->wino_m < 1 || job.nh > WG_MAX_SIDE || job.nw > WG_MAX_SIDE ||
      job.nn > WG_MAX_NN || L > 16)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a Winograd kernel is for stride-1 convolutions whose groups are "
                                      "whole channel vectors and whose transformed tile has at most 36 positions");
  int64_t N = xd[0], H = xd[2], W = xd[3], pb, pr;
  job.N = N, job.C = d->ic_g, job.CBg = (d->ic_g + L - 1) / L, job.CB = G * job.CBg;
  job.OC = d->oc, job.OCg = d->oc / G, job.OCBg = (job.OCg + L - 1) / L, job.OCB = G * job.OCBg;
  job.H = H, job.W = W;
  CHECK(ct_conv_geometry(d, H, W, &job.pt, &job.pl, &pb, &pr, &job.OH, &job.OW));
  job.TH = (job.OH + job.mh - 1) / job.mh, job.TW = (job.OW + job.mw - 1) / job.mw, job.T = job.TH * job.TW;
  job.runs = (job.OCBg + d->ni - 1) / d->ni, job.groups = G * job.runs;
  int64_t block_size = job.OCB * job.OH * job.OW * L, pixels = job.OH * job.OW;
  float *user_out[CT_MAX_OUT];
  CHECK(ct_conv_outputs(d, ctx, 0, N, job.OH, job.OW, user_out, job.out));
  ct_job sizes;
  memset(&sizes, 0, sizeof(sizes));
  CHECK(ct_extras_at(d, &sizes, ctx, 2, N, d->out_blocked ? block_size : d->oc * pixels, d->oc, 0, -1));
  memcpy(job.extra, sizes.extra, sizeof(job.extra));
  memcpy(job.extra_count, sizes.extra_count, sizeof(job.extra_count));
  if (N == 0 || pixels == 0) return NULL;
  float *scratch = NULL, *in_buf = NULL;
  CHECK(cb_blocked_scratch(d, ctx, N, pixels, block_size, job.out, job.extra, job.extra_count, &scratch, -1));
  OrtStatus *st = API(GetTensorMutableData)((OrtValue *)xv, (void **)&job.x);
  if (!st) st = API(GetTensorMutableData)((OrtValue *)wv, (void **)&job.w);
  if (!st && !d->in_blocked) { /* an NCHW input: reordered to channel vectors first */
    in_buf = glue_floats((size_t)(N * job.CB * H * W * L));
    st = in_buf ? cb_reorder(ctx, (float *)job.x, in_buf, N, G * job.C, L, H * W, 0)
                : fail(ORT_FAIL, "onnxopt: out of memory for the blocked input");
    job.x = in_buf;
  }
  double flops = 2.0 * (double)N * job.T * job.nn * (double)job.C * (double)job.OCB * L;
  /* One-phase when blocks of tiles whose transformed inputs and products fit WG_M_BYTES, of at least MI tiles each,
   * still give the pool WG_MIN_TASKS tasks; else (few tiles, many channels) the two-phase form, whose tasks also
   * split the output groups. */
  int64_t one_tile = job.nn * (job.CB + d->ni) * L * (int64_t)sizeof(float), most = (job.T + d->mi - 1) / d->mi;
  int64_t one_blocks = (job.T * one_tile + WG_M_BYTES - 1) / WG_M_BYTES, want = (WG_MIN_TASKS + N - 1) / N;
  if (one_blocks < want) one_blocks = want;
  if (one_blocks > most) one_blocks = most;
  int one_phase = N * one_blocks >= WG_MIN_TASKS || flops < CT_INLINE_FLOPS;
  if (!st && one_phase) {
    job.blocks = one_blocks < 1 ? 1 : one_blocks;
    st = wg_parallel(ctx, wg_fused_block, N * job.blocks, &job, flops);
  } else if (!st) {
    job.V = glue_floats((size_t)(N * job.nn * job.CB * job.T * L));
    job.koff = (int64_t *)malloc((size_t)job.C * sizeof(int64_t));
    if (!job.V || !job.koff) st = fail(ORT_FAIL, "onnxopt: out of memory for a Winograd convolution");
    if (!st) {
      for (int64_t c = 0; c < job.C; c++) job.koff[c] = (c / L) * job.T * L + c % L;
      st = wg_parallel(ctx, wg_input_row, N * job.CB * job.TH, &job, flops);
    }
    if (!st) {
      /* Tile blocks: M within WG_M_BYTES, and enough tasks for the pool, but no block under MI tiles. */
      int64_t cap = WG_M_BYTES / (job.nn * d->ni * L * (int64_t)sizeof(float));
      if (cap < 1) cap = 1;
      int64_t blocks = (job.T + cap - 1) / cap, per = (WG_MIN_TASKS + N * job.groups - 1) / (N * job.groups);
      if (blocks < per) blocks = per < most ? per : most;
      job.blocks = blocks < 1 ? 1 : blocks;
      st = wg_parallel(ctx, wg_product_block, N * job.groups * job.blocks, &job, flops);
    }
  }
  if (!st && job.failed) st = fail(ORT_FAIL, "onnxopt: out of memory for a Winograd convolution's products");
  for (int o = 0; !st && scratch && o < d->sig.n_out; o++)
    st = cb_reorder(ctx, user_out[o], job.out[o], N, d->oc, L, pixels, 1);
  glue_release(job.V);
  free(job.koff);
  glue_release(in_buf);
  glue_release(scratch);
  return st;
}
