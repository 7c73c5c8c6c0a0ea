/* ---- AFUSION: a convolution and the convolutions reading its output in one kernel, by bands of output rows
 * (OptiFX's AFUSION on a CPU). ----
 *
 * Included after compute_exec.c (codegen/glue/kinds.py). The first convolution (with its epilogue) computes
 * the rows of its output that a band of the second convolutions' output rows needs, all its channels, into a
 * scratch band on the task's heap that stays in L1/L2; each second convolution (with its epilogue) reads the band
 * and writes its output rows. The intermediate tensor never goes to memory. With one second convolution this is
 * OptiFX's SISO pattern; with several (a SqueezeNet fire module's 1x1 and 3x3 expands) SIMO, whose band is the union
 * of the tiles each second needs. Bands overlap by the halo rows, which both neighbours compute (OptiFX recomputes
 * halos instead of exchanging them; a band spans the whole width, so only rows are recomputed). Tiles are the
 * channel-vector tiles of codegen/compute/blocked_tile.py (depthwise first convolutions:
 * codegen/microkernel/depthwise.py).
 *
 * The band is blocked, [ceil(OC1 / L)][S][Wp2][L]. The second convolutions share their output size and strides; PT,
 * PL, PR are the largest of their top, left and right paddings. Band row 0 is intermediate row o0 * sh - PT for a band
 * starting at output row o0, so S = max over the seconds of (band_rows - 1) * sh + (kh - 1) * dh + 1 + PT - pt rows;
 * Wp2 = OW1 + PL + PR columns, the padding as zero columns (and rows outside the intermediate as zero rows), so each
 * second convolution runs unpadded over the band, shifted by PT - pt rows and PL - pl columns.
 *
 * Op inputs: the first convolution's (x, packed weights, epilogue inputs), then each second's without the
 * intermediate (packed weights at `second_input[b]`, epilogue inputs after them). Op outputs: each second's in turn.
 * A second convolution may be depthwise (1x1 expand -> 3x3 depthwise): it reads the band one channel vector at a
 * time, with the depthwise tiles of a blocked depthwise convolution.
 * The first convolution's epilogue inputs are per channel or scalars (the optimizer checks it): a per-pixel one would
 * need the band's offsets.
 *
 * MISO (`miso_extra` >= 0): two convolutions on their own inputs whose outputs meet in the second's epilogue (an Add
 * of the first's output: a ResNet downsample block's shortcut, NASNet's G6). Per band of output rows, the first
 * writes its rows into the output itself and the second reads them there as that epilogue input and overwrites them:
 * a tile reads a position before it writes it, and bands are disjoint, so in place is safe, and the first's output
 * never goes to memory as a tensor of its own. Op inputs: the first's, then the second's (x2 at `second_input[0]`,
 * packed weights, epilogue inputs without the first's output).
 *
 * conv -> pool (`pool_op` > 0, no second convolution): a MaxPool or AveragePool reads the band (ResNet's and
 * SqueezeNet's stem, UNet's encoder). The band holds the conv rows that band_rows pool output rows need, without
 * padding columns: the pool skips what falls outside the conv's output (MaxPool's padding is -inf, not zero). In the
 * blocked band each lane is a channel, so a window is L independent maxima or sums. */



/* A convolution computed by rows from an input: the first one (over the graph's input), or either MISO part. */
typedef struct {
  const onnxopt_ct_desc *c;
  const float *x; /* the input, or its zero-padded / blocked copy, or the band (a second convolution) */
  int64_t x_item, ps, Wp;
  int64_t x_row0; /* the padded input row at x's first row: 0, or where a band starts (dense convolutions only) */
  const int64_t *aoff;
  int64_t K, OC, OCB, OH, OW;
  cb_window dw; /* a depthwise convolution reads its blocked input in place (cb_depthwise_row) */
  const float *w, *ex[CT_MAX_EXTRA];
  int64_t ex_count[CT_MAX_EXTRA];
} af_conv;

/* Convolution `cv`'s epilogue inputs, op inputs `at`.. (ct_extras_at: `item_out` floats per batch item of a per-pixel
   one, `skip` the one that is not an op input, or -1). */
static OrtStatus *af_extras(af_conv *cv, const onnxopt_ct_desc *c, OrtKernelContext *ctx, int at, int64_t N,
                            int64_t item_out, int skip) {
  ct_job e;
  memset(&e, 0, sizeof(e));
  CHECK(ct_extras_at(c, &e, ctx, at, N, item_out, c->oc, 0, skip));
  memcpy(cv->ex, e.extra, sizeof(cv->ex));
  memcpy(cv->ex_count, e.extra_count, sizeof(cv->ex_count));
  return NULL;
}

/* Where rows go: element (channel block g, row i, column p) at base[o] + g * plane + (i - row0) * row + (col0 + p) * L:
   the band (an intermediate with the seconds' padding) or an output tensor of the item. */
typedef struct {
  float *base[CT_MAX_OUT];
  int64_t plane, row, row0, col0;
} af_dest;

/* Rows [i0, i1) of convolution cv's output for item n, all channels, into dst. */
static void af_conv_rows(const af_conv *cv, int64_t L, int64_t n, int64_t i0, int64_t i1, const af_dest *dst) {
  const onnxopt_ct_desc *d = cv->c;
  int64_t NI = d->ni, MI = d->mi;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.ldc = L;
  for (int o = 0; o < d->sig.n_out; o++) t.out[o] = dst->base[o];
  if (d->groups != 1) { /* depthwise: one channel vector per tile */
    t.a_ms = d->sw * L;
    int64_t plane_in = cv->dw.H * cv->dw.W * L;
    for (int64_t g = 0; g < cv->OCB; g++) {
      int64_t left = cv->OC - g * L;
      t.lanes[0] = left < L ? left : L;
      for (int e = 0; e < d->n_extra; e++)
        t.extra[e] = cv->ex[e] + (d->extra_nstride[e] ? n * cv->ex_count[e] : 0) +
                     (d->extra_kind[e] == EX_CHANNEL ? g * L : 0);
      cb_depthwise_rows(d, &cv->dw, &t, cv->x + n * cv->x_item + g * plane_in, cv->w + g * cv->K * L, cv->aoff, i0,
                        i1, cv->OW, g * dst->plane + (i0 - dst->row0) * dst->row + dst->col0 * L, dst->row);
    }
    return;
  }
  t.koff = cv->aoff;
  t.k = cv->K;
  t.a_ms = d->sw * cv->ps;
  int64_t groups = (cv->OCB + NI - 1) / NI;
  for (int64_t g = 0; g < groups; g++) {
    int64_t vb = g * NI;
    int nv = (int)(cv->OCB - vb < NI ? cv->OCB - vb : NI);
    t.b = cv->w + g * cv->K * NI * L;
    for (int v = 0; v < nv; v++) {
      int64_t left = cv->OC - (vb + v) * L;
      t.voff[v] = v * L;
      t.lanes[v] = left < L ? left : L;
    }
    for (int e = 0; e < d->n_extra; e++)
      t.extra[e] = cv->ex[e] + (d->extra_nstride[e] ? n * cv->ex_count[e] : 0) +
                   (d->extra_kind[e] == EX_CHANNEL ? vb * L : 0);
    for (int64_t i = i0; i < i1; i++) {
      const float *in_r = cv->x + n * cv->x_item + (i * d->sh - cv->x_row0) * cv->Wp * cv->ps;
      /* near-equal tiles, as cb_run_task, those of one size in one call */
      for (int64_t ti = 0, tiles = (cv->OW + MI - 1) / MI, count; ti < tiles; ti += count) {
        int64_t p0 = ti * cv->OW / tiles, mi = (ti + 1) * cv->OW / tiles - p0;
        for (count = 1; ti + count < tiles && (ti + count + 1) * cv->OW / tiles - (ti + count) * cv->OW / tiles == mi;)
          count++;
        t.count = count;
        t.a = in_r + p0 * t.a_ms;
        for (int v = 0; v < nv; v++)
          t.coff[v] = (vb + v) * dst->plane + (i - dst->row0) * dst->row + (dst->col0 + p0) * L;
        d->tiles[(mi - 1) * NI + (nv - 1)]((const int64_t *)&t);
      }
    }
  }
}

/* Input x [N][C][H][W] (or blocked) of convolution c: geometry, tap offsets (into `tab`, K entries) and, where the
   kernel needs it, a copy (*copy, the caller frees it): zero-padded for a dense convolution, blocked for a depthwise
   one on an NCHW input. */
static OrtStatus *af_conv_setup(af_conv *cv, const onnxopt_ct_desc *c, OrtKernelContext *ctx, const float *x,
                                const float *w, int64_t N, int64_t H, int64_t W, int64_t L, int64_t *tab, float **copy) {
  int64_t pt, pl, pb, pr;
  *copy = NULL;
  cv->c = c, cv->w = w;
  CHECK(ct_conv_geometry(c, H, W, &pt, &pl, &pb, &pr, &cv->OH, &cv->OW));
  cv->OC = c->oc, cv->OCB = (c->oc + L - 1) / L;
  cv->aoff = tab;
  int64_t C = c->ic_g * c->groups;
  if (c->groups != 1) { /* depthwise: a blocked input is read in place; an NCHW one is reordered first */
    if (!c->in_blocked) {
      *copy = glue_floats((size_t)(N * cv->OCB * H * W * L));
      if (!*copy) return fail(ORT_FAIL, "onnxopt: out of memory for the blocked input");
      CHECK(cb_reorder(ctx, (float *)x, *copy, N, C, L, H * W, 0));
      x = *copy;
    }
    cb_window *win = &cv->dw;
    win->H = H, win->W = W, win->kh = c->kh, win->dh = c->dh, win->sh = c->sh, win->sw = c->sw, win->pt = pt;
    win->pl = pl, win->reach_w = (c->kw - 1) * c->dw;
    cv->K = c->kh * c->kw;
    for (int64_t r = 0; r < c->kh; r++)
      for (int64_t q = 0; q < c->kw; q++) tab[r * c->kw + q] = (r * c->dh * W + q * c->dw) * L;
    cv->x = x;
    cv->x_item = cv->OCB * H * W * L;
    return NULL;
  }
  int64_t planes = c->in_blocked ? (C + L - 1) / L : C, ps = c->in_blocked ? L : 1;
  int64_t Hp = H + pt + pb, Wp = W + pl + pr;
  cv->ps = ps, cv->Wp = Wp;
  cv->x_item = planes * Hp * Wp * ps;
  cv->K = C * c->kh * c->kw;
  for (int64_t ic = 0; ic < C; ic++)
    for (int64_t r = 0; r < c->kh; r++)
      for (int64_t q = 0; q < c->kw; q++) {
        int64_t y = r * c->dh, xx = q * c->dw;
        tab[(ic * c->kh + r) * c->kw + q] =
            c->in_blocked ? ((ic / L) * Hp * Wp + y * Wp + xx) * L + ic % L : ic * Hp * Wp + y * Wp + xx;
      }
  cv->x = x;
  if (Hp == H && Wp == W) return NULL;
  /* the zero-padded input (cb_copy_row) */
  *copy = glue_floats((size_t)(N * cv->x_item));
  if (!*copy) return fail(ORT_FAIL, "onnxopt: out of memory for the padded input");
  cb_copy_job cj = {x, *copy, ps, H, W, Hp, Wp, pt, pl};
  int64_t rows = N * planes * Hp;
  if (N * cv->x_item < (1 << 16)) {
    for (int64_t i = 0; i < rows; i++) cb_copy_row(&cj, (size_t)i);
  } else {
    CHECK(API(KernelContext_ParallelFor)(ctx, cb_copy_row, (size_t)rows, 0, &cj));
  }
  cv->x = *copy;
  return NULL;
}

/* One second convolution: a convolution over the band (its x, row origin and width are the band's), its padding,
   and its outputs. */
typedef struct {
  af_conv conv;
  int64_t pt, pl, col_shift; /* col_shift: PL - pl */
  float *out[CT_MAX_OUT], *user_out[CT_MAX_OUT];
  float *scratch; /* NCHW outputs: blocked buffers, reordered at the end */
} af_second;

typedef struct {
  const onnxopt_af_desc *d;
  int64_t N, L;
  af_conv first;
  /* the band */
  int64_t band_rows, bands, S, Wp2, PT, PL, band_floats;
  /* the second convolutions: one output size and stride */
  int n_second;
  af_second second[AF_MAX_SECOND];
  int64_t OH2, OW2, sh2;
  int failed; /* a task could not allocate its band */
} af_job;

/* The band buffer of the calling thread, kept from call to call: a fresh one per task (hundreds of KB: an mmap)
   page-faults on first touch every time. It grows to the largest band the thread has run and lives as long as the
   thread (onnxruntime's pool threads live as long as the session's environment). */
static _Thread_local float *af_band_buf;
static _Thread_local size_t af_band_cap;

static float *af_band(size_t floats) {
  if (floats > af_band_cap) {
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
    float *p = (float *)aligned_alloc(64, bytes);
    if (!p) return NULL;
    free(af_band_buf);
    af_band_buf = p;
    af_band_cap = bytes / sizeof(float);
  }
  return af_band_buf;
}

/* One band of one batch item: the first convolution's rows (zero rows where the band reaches into the seconds'
   padding), then each second's. */
static void af_task(void *usr, size_t index) {
  af_job *j = (af_job *)usr;
  int64_t n = (int64_t)index / j->bands, b = (int64_t)index % j->bands, L = j->L;
  int64_t o0 = b * j->band_rows, o1 = o0 + j->band_rows < j->OH2 ? o0 + j->band_rows : j->OH2;
  int64_t i_lo = o0 * j->sh2 - j->PT, i_hi = i_lo;
  for (int s = 0; s < j->n_second; s++) { /* the union of the rows the seconds read */
    const onnxopt_ct_desc *c = j->second[s].conv.c;
    int64_t hi = (o1 - 1) * j->sh2 - j->second[s].pt + (c->kh - 1) * c->dh + 1;
    if (hi > i_hi) i_hi = hi;
  }
  int64_t OH1 = j->first.OH, OW1 = j->first.OW;
  int64_t i0 = i_lo > 0 ? i_lo : 0, i1 = i_hi < OH1 ? i_hi : OH1;
  float *band = af_band((size_t)j->band_floats);
  if (!band) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  int64_t row = j->Wp2 * L, plane_band = j->S * row;
  for (int64_t g = 0; g < j->first.OCB; g++) {
    float *p = band + g * plane_band;
    for (int64_t r = 0; r < i_hi - i_lo; r++) {
      int64_t i = i_lo + r;
      if (i < 0 || i >= OH1) {
        memset(p + r * row, 0, (size_t)row * sizeof(float));
      } else { /* the seconds' left and right padding */
        memset(p + r * row, 0, (size_t)(j->PL * L) * sizeof(float));
        memset(p + r * row + (j->PL + OW1) * L, 0, (size_t)((j->Wp2 - j->PL - OW1) * L) * sizeof(float));
      }
    }
  }
  af_dest dst = {{band}, plane_band, row, i_lo, j->PL};
  if (i1 > i0) af_conv_rows(&j->first, L, n, i0, i1, &dst);
  int64_t plane_out = j->OH2 * j->OW2 * L;
  for (int s = 0; s < j->n_second; s++) {
    const af_second *br = &j->second[s];
    /* its padded input row r is intermediate row r - pt, band row r - pt - i_lo; its padded column 0 is band column
       PL - pl */
    af_conv cv = br->conv;
    if (cv.c->groups != 1) { /* depthwise: the window's padded row 0 is band row pt + i_lo (see af_compute) */
      cv.x = band;
      cv.dw.pt = br->pt + i_lo;
    } else {
      cv.x = band + br->col_shift * L;
      cv.x_row0 = br->pt + i_lo;
    }
    af_dest out = {{NULL}, plane_out, j->OW2 * L, 0, 0};
    for (int o = 0; o < cv.c->sig.n_out; o++) out.base[o] = br->out[o] + n * cv.OCB * plane_out;
    af_conv_rows(&cv, L, n, o0, o1, &out);
  }
}

static OrtStatus *af_miso_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx);

static OrtStatus *af_pool_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx);

static OrtStatus *af_chain_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx);

static OrtStatus *af_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx) {
  if (ad->chain) return af_chain_compute(ad, ctx);
  if (ad->miso_extra >= 0) return af_miso_compute(ad, ctx);
  if (ad->pool_op) return af_pool_compute(ad, ctx);
  const onnxopt_ct_desc *c1 = ad->first;
  const OrtValue *xv, *w1v;
  int64_t xd[MAX_RANK], wd[MAX_RANK];
  size_t xr, wr;
  CHECK(ct_conv_inputs(c1, ctx, &xv, xd, &xr, &w1v));
  af_job j;
  memset(&j, 0, sizeof(j));
  j.d = ad, j.n_second = ad->n_second;
  int64_t L = c1->lanes, N = xd[0], H = xd[2], W = xd[3];
  j.N = N, j.L = L;
  int64_t pt1, pl1, pb1, pr1, OH1, OW1, PR = 0;
  CHECK(ct_conv_geometry(c1, H, W, &pt1, &pl1, &pb1, &pr1, &OH1, &OW1));
  int out_base = 0;
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    const onnxopt_ct_desc *c = ad->second[s];
    int64_t pb, pr, oh, ow;
    br->conv.c = c;
    CHECK(ct_conv_geometry(c, OH1, OW1, &br->pt, &br->pl, &pb, &pr, &oh, &ow));
    if (s == 0) {
      j.OH2 = oh, j.OW2 = ow, j.sh2 = c->sh;
    } else if (oh != j.OH2 || ow != j.OW2 || c->sh != j.sh2) {
      return fail(ORT_FAIL, "onnxopt: the fused convolutions' outputs differ in size; re-run onnxopt");
    }
    if (br->pt > j.PT) j.PT = br->pt;
    if (br->pl > j.PL) j.PL = br->pl;
    if (pr > PR) PR = pr;
    br->conv.OC = c->oc, br->conv.OCB = (c->oc + L - 1) / L;
    const OrtValue *wv;
    CHECK(ct_dims(ctx, (size_t)ad->second_input[s], &wv, wd, &wr));
    CHECK(API(GetTensorMutableData)((OrtValue *)wv, (void **)&br->conv.w));
    CHECK(ct_conv_outputs(c, ctx, (size_t)out_base, N, oh, ow, br->user_out, br->out));
    out_base += c->sig.n_out;
    CHECK(af_extras(&br->conv, c, ctx, ad->second_input[s] + 1, N,
                    c->out_blocked ? br->conv.OCB * oh * ow * L : c->oc * oh * ow, -1));
  }
  for (int s = 0; s < j.n_second; s++) j.second[s].col_shift = j.PL - j.second[s].pl;
  CHECK(af_extras(&j.first, c1, ctx, 2, N, 0, -1));
  if (N == 0 || j.OH2 * j.OW2 == 0) return NULL;
  OrtStatus *st = NULL;
  float *copy = NULL; /* the first convolution's input, zero-padded or blocked, when it needs a copy */
  int64_t *tabs = NULL;
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    if ((st = cb_blocked_scratch(br->conv.c, ctx, N, j.OH2 * j.OW2, br->conv.OCB * j.OH2 * j.OW2 * L, br->out, br->conv.ex,
                                 br->conv.ex_count, &br->scratch, -1)))
      goto done;
  }
  const float *x, *w1;
  if ((st = API(GetTensorMutableData)((OrtValue *)xv, (void **)&x))) goto done;
  if ((st = API(GetTensorMutableData)((OrtValue *)w1v, (void **)&w1))) goto done;
  int64_t taps = c1->ic_g * c1->groups * c1->kh * c1->kw;
  for (int s = 0; s < j.n_second; s++) taps += ad->second[s]->ic_g * ad->second[s]->kh * ad->second[s]->kw;
  tabs = (int64_t *)malloc((size_t)taps * sizeof(int64_t));
  if (!tabs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  /* The band: the rows of the intermediate that band_rows output rows need, columns with the seconds' padding. */
  j.band_rows = ad->band_rows < 1 ? 1 : ad->band_rows > j.OH2 ? j.OH2 : ad->band_rows;
  j.bands = (j.OH2 + j.band_rows - 1) / j.band_rows;
  j.Wp2 = OW1 + j.PL + PR;
  for (int s = 0; s < j.n_second; s++) { /* each reads the blocked band: L floats a pixel, Wp2 pixels a row */
    af_conv *cv = &j.second[s].conv;
    cv->OH = j.OH2, cv->OW = j.OW2, cv->ps = L, cv->Wp = j.Wp2, cv->x_item = 0;
  }
  int64_t *tab = tabs;
  double flops = 0;
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    const onnxopt_ct_desc *c = br->conv.c;
    int64_t rows = (j.band_rows - 1) * c->sh + (c->kh - 1) * c->dh + 1 + j.PT - br->pt;
    if (rows > j.S) j.S = rows;
    br->conv.K = c->ic_g * c->kh * c->kw;
    br->conv.aoff = tab;
    tab += br->conv.K;
    flops += 2.0 * (double)N * j.OH2 * j.OW2 * (double)c->oc * (double)br->conv.K;
  }
  for (int s = 0; s < j.n_second; s++) {
    /* A depthwise second reads the band in place, one channel vector at a time (cb_depthwise_row): its window is
       the band (S rows of Wp2 columns, the padding already in it as zeros), its top padding set per band in af_task
       (output row o reads band row o * sh - pt - i_lo) and its left padding negative (tile column p reads band
       column p * sw + PL - pl). No tile reaches past the band, so none takes the bounded variant. */
    const onnxopt_ct_desc *c = j.second[s].conv.c;
    if (c->groups == 1) continue;
    cb_window *win = &j.second[s].conv.dw;
    win->H = j.S, win->W = j.Wp2, win->kh = c->kh, win->dh = c->dh, win->sh = c->sh, win->sw = c->sw;
    win->pt = 0, win->pl = j.second[s].pl - j.PL, win->reach_w = (c->kw - 1) * c->dw;
  }
  for (int s = 0; s < j.n_second; s++) { /* tap offsets within the band: channel block, row, column (a depthwise
                                            second: ic_g = 1, so row and column from its channel vector's plane) */
    const onnxopt_ct_desc *c = j.second[s].conv.c;
    int64_t *t = (int64_t *)j.second[s].conv.aoff;
    for (int64_t ic = 0; ic < c->ic_g; ic++)
      for (int64_t r = 0; r < c->kh; r++)
        for (int64_t q = 0; q < c->kw; q++)
          t[(ic * c->kh + r) * c->kw + q] = ((ic / L) * j.S * j.Wp2 + r * c->dh * j.Wp2 + q * c->dw) * L + ic % L;
  }
  j.band_floats = (c1->oc + L - 1) / L * j.S * j.Wp2 * L;
  if ((st = af_conv_setup(&j.first, c1, ctx, x, w1, N, H, W, L, tab, &copy))) goto done;
  int64_t tasks = N * j.bands;
  if (tasks == 1 || flops < CT_INLINE_FLOPS) {
    for (int64_t t = 0; t < tasks; t++) af_task(&j, (size_t)t);
  } else {
    st = API(KernelContext_ParallelFor)(ctx, af_task, (size_t)tasks, 0, &j);
  }
  if (!st && j.failed) st = fail(ORT_FAIL, "onnxopt: out of memory for a fused convolution's band");
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    for (int o = 0; !st && br->scratch && o < br->conv.c->sig.n_out; o++)
      st = cb_reorder(ctx, br->user_out[o], br->out[o], N, br->conv.OC, L, j.OH2 * j.OW2, 1);
  }
done:
  glue_release(copy);
  free(tabs);
  for (int s = 0; s < j.n_second; s++) glue_release(j.second[s].scratch);
  return st;
}

/* MISO: both convolutions by bands of output rows, the first into the output, the second over it in place. */
typedef struct {
  af_conv a, b; /* a: the first, whose output is b's epilogue input `miso_extra`; b: the second */
  int64_t L, OH, OW, band_rows, bands, item_out;
  float *out[CT_MAX_OUT]; /* blocked: the op's outputs, or scratch reordered to NCHW at the end */
} af_miso_job;

static void af_miso_task(void *usr, size_t index) {
  const af_miso_job *j = (const af_miso_job *)usr;
  int64_t n = (int64_t)index / j->bands, b = (int64_t)index % j->bands;
  int64_t o0 = b * j->band_rows, o1 = o0 + j->band_rows < j->OH ? o0 + j->band_rows : j->OH;
  af_dest dst = {{NULL}, j->OH * j->OW * j->L, j->OW * j->L, 0, 0};
  dst.base[0] = j->out[0] + n * j->item_out; /* the first's rows: where the second's output will be */
  af_conv_rows(&j->a, j->L, n, o0, o1, &dst);
  for (int o = 0; o < j->b.c->sig.n_out; o++) dst.base[o] = j->out[o] + n * j->item_out;
  af_conv_rows(&j->b, j->L, n, o0, o1, &dst);
}

static OrtStatus *af_miso_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx) {
  const onnxopt_ct_desc *ca = ad->first, *cb = ad->second[0];
  const OrtValue *xav, *wav, *xbv, *wbv;
  int64_t xa[MAX_RANK], xb[MAX_RANK], wd[MAX_RANK];
  size_t ra, rb, wr;
  int xb_at = ad->second_input[0];
  CHECK(ct_dims(ctx, 0, &xav, xa, &ra));
  CHECK(ct_dims(ctx, 1, &wav, wd, &wr));
  CHECK(ct_dims(ctx, (size_t)xb_at, &xbv, xb, &rb));
  CHECK(ct_dims(ctx, (size_t)xb_at + 1, &wbv, wd, &wr));
  CHECK(ct_check_input(ca, xa, ra));
  CHECK(ct_check_input(cb, xb, rb));
  af_miso_job j;
  memset(&j, 0, sizeof(j));
  int64_t L = ca->lanes, N = xa[0];
  int64_t p[4], OHa, OWa;
  if (xb[0] != N) return fail(ORT_INVALID_ARGUMENT, "onnxopt: the fused convolutions' inputs differ in batch size");
  CHECK(ct_conv_geometry(ca, xa[2], xa[3], &p[0], &p[1], &p[2], &p[3], &OHa, &OWa));
  CHECK(ct_conv_geometry(cb, xb[2], xb[3], &p[0], &p[1], &p[2], &p[3], &j.OH, &j.OW));
  if (OHa != j.OH || OWa != j.OW || ca->oc != cb->oc)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the fused convolutions' outputs differ in size; re-run onnxopt");
  j.L = L;
  int64_t OCB = (cb->oc + L - 1) / L;
  j.item_out = OCB * j.OH * j.OW * L;
  float *user_out[CT_MAX_OUT];
  CHECK(ct_conv_outputs(cb, ctx, 0, N, j.OH, j.OW, user_out, j.out));
  CHECK(af_extras(&j.a, ca, ctx, 2, N, 0, -1));
  CHECK(af_extras(&j.b, cb, ctx, xb_at + 2, N, cb->out_blocked ? j.item_out : cb->oc * j.OH * j.OW, ad->miso_extra));
  if (N == 0 || j.OH * j.OW == 0) return NULL;
  OrtStatus *st = NULL;
  float *scratch = NULL, *copy_a = NULL, *copy_b = NULL;
  int64_t *tabs = NULL;
  if ((st = cb_blocked_scratch(cb, ctx, N, j.OH * j.OW, j.item_out, j.out, j.b.ex, j.b.ex_count, &scratch,
                               ad->miso_extra)))
    goto done;
  /* the first's output, read in place: the blocked output the second writes (the tiles read a position, then write
     it) */
  j.b.ex[ad->miso_extra] = j.out[0];
  j.b.ex_count[ad->miso_extra] = j.item_out;
  const float *x, *w;
  int64_t ka = ca->ic_g * ca->groups * ca->kh * ca->kw, kb = cb->ic_g * cb->groups * cb->kh * cb->kw;
  tabs = (int64_t *)malloc((size_t)(ka + kb) * sizeof(int64_t));
  if (!tabs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  if ((st = API(GetTensorMutableData)((OrtValue *)xav, (void **)&x))) goto done;
  if ((st = API(GetTensorMutableData)((OrtValue *)wav, (void **)&w))) goto done;
  if ((st = af_conv_setup(&j.a, ca, ctx, x, w, N, xa[2], xa[3], L, tabs, &copy_a))) goto done;
  if ((st = API(GetTensorMutableData)((OrtValue *)xbv, (void **)&x))) goto done;
  if ((st = API(GetTensorMutableData)((OrtValue *)wbv, (void **)&w))) goto done;
  if ((st = af_conv_setup(&j.b, cb, ctx, x, w, N, xb[2], xb[3], L, tabs + ka, &copy_b))) goto done;
  j.band_rows = ad->band_rows < 1 ? 1 : ad->band_rows > j.OH ? j.OH : ad->band_rows;
  j.bands = (j.OH + j.band_rows - 1) / j.band_rows;
  int64_t tasks = N * j.bands;
  double flops = 2.0 * (double)N * j.OH * j.OW * (double)cb->oc * (double)(j.a.K + j.b.K);
  if (tasks == 1 || flops < CT_INLINE_FLOPS) {
    for (int64_t t = 0; t < tasks; t++) af_miso_task(&j, (size_t)t);
  } else {
    st = API(KernelContext_ParallelFor)(ctx, af_miso_task, (size_t)tasks, 0, &j);
  }
  for (int o = 0; !st && scratch && o < cb->sig.n_out; o++)
    st = cb_reorder(ctx, user_out[o], j.out[o], N, cb->oc, L, j.OH * j.OW, 1);
done:
  glue_release(copy_a);
  glue_release(copy_b);
  free(tabs);
  glue_release(scratch);
  return st;
}

/* conv -> pool: per band of pool output rows, the conv rows it needs into the band, then the pool from the band. */
typedef struct {
  const onnxopt_af_desc *d;
  af_conv first;
  int64_t L, OH1, OW1, OH2, OW2, band_rows, bands, S, band_floats, item_out;
  float *out; /* blocked [N][OCB][OH2][OW2][L] */
  int failed;
} af_pool_job;

/* Pool output rows [o0, o1) of item n from the band, whose row 0 is conv output row i_lo. */
static void af_pool_rows(const af_pool_job *j, const float *band, int64_t i_lo, int64_t n, int64_t o0, int64_t o1) {
  const onnxopt_af_desc *d = j->d;
  int64_t L = j->L, kh = d->pool_k[0], kw = d->pool_k[1], sh = d->pool_s[0], sw = d->pool_s[1];
  int64_t dh = d->pool_d[0], dw = d->pool_d[1], pt = d->pool_pads[0], pl = d->pool_pads[1];
  /* AveragePool counting the padding counts the window clipped to the padded input (onnxruntime's rule) */
  int64_t end_h = j->OH1 + d->pool_pads[2], end_w = j->OW1 + d->pool_pads[3];
  int is_max = d->pool_op == 1;
  int64_t row = j->OW1 * L, plane_band = j->S * row, plane_out = j->OH2 * j->OW2 * L;
  float acc[64];
  for (int64_t g = 0; g < j->first.OCB; g++) {
    const float *bg = band + g * plane_band;
    float *og = j->out + n * j->item_out + g * plane_out;
    for (int64_t o = o0; o < o1; o++) {
      int64_t r0 = o * sh - pt;
      for (int64_t q = 0; q < j->OW2; q++) {
        int64_t c0 = q * sw - pl, count = 0;
        for (int64_t l = 0; l < L; l++) acc[l] = is_max ? -INFINITY : 0.0f;
        for (int64_t a = 0; a < kh; a++) {
          int64_t r = r0 + a * dh;
          if (r < 0 || r >= j->OH1) continue;
          const float *br = bg + (r - i_lo) * row;
          for (int64_t b = 0; b < kw; b++) {
            int64_t c = c0 + b * dw;
            if (c < 0 || c >= j->OW1) continue;
            const float *v = br + c * L;
            count++;
            if (is_max) {
              for (int64_t l = 0; l < L; l++) acc[l] = v[l] > acc[l] ? v[l] : acc[l];
            } else {
              for (int64_t l = 0; l < L; l++) acc[l] += v[l];
            }
          }
        }
        float *dst = og + (o * j->OW2 + q) * L;
        if (is_max) {
          for (int64_t l = 0; l < L; l++) dst[l] = acc[l];
        } else {
          int64_t div = count;
          if (d->pool_include_pad) {
            int64_t he = r0 + kh < end_h ? r0 + kh : end_h, we = c0 + kw < end_w ? c0 + kw : end_w;
            div = (he - r0) * (we - c0);
          }
          float inv = div > 0 ? 1.0f / (float)div : 0.0f;
          for (int64_t l = 0; l < L; l++) dst[l] = acc[l] * inv;
        }
      }
    }
  }
}

static void af_pool_task(void *usr, size_t index) {
  af_pool_job *j = (af_pool_job *)usr;
  const onnxopt_af_desc *d = j->d;
  int64_t n = (int64_t)index / j->bands, b = (int64_t)index % j->bands, L = j->L;
  int64_t o0 = b * j->band_rows, o1 = o0 + j->band_rows < j->OH2 ? o0 + j->band_rows : j->OH2;
  int64_t i_lo = o0 * d->pool_s[0] - d->pool_pads[0];
  int64_t i_hi = (o1 - 1) * d->pool_s[0] - d->pool_pads[0] + (d->pool_k[0] - 1) * d->pool_d[0] + 1;
  int64_t i0 = i_lo > 0 ? i_lo : 0, i1 = i_hi < j->OH1 ? i_hi : j->OH1;
  float *band = af_band((size_t)j->band_floats);
  if (!band) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  af_dest dst = {{band}, j->S * j->OW1 * L, j->OW1 * L, i_lo, 0};
  if (i1 > i0) af_conv_rows(&j->first, L, n, i0, i1, &dst);
  af_pool_rows(j, band, i_lo, n, o0, o1);
}

/* One spatial dimension of the pool's output (onnxruntime's rule for ceil_mode: a last window starting in the end
   padding is dropped); -1 when the window does not fit. */
static int64_t af_pool_extent(int64_t in, int64_t k, int64_t s, int64_t dil, int64_t p0, int64_t p1, int ceil_mode) {
  int64_t span = in + p0 + p1 - ((k - 1) * dil + 1);
  if (span < 0) return -1;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p0) out--;
  return out;
}

static OrtStatus *af_pool_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx) {
  const onnxopt_ct_desc *c1 = ad->first;
  const OrtValue *xv, *w1v;
  int64_t xd[MAX_RANK];
  size_t xr;
  CHECK(ct_conv_inputs(c1, ctx, &xv, xd, &xr, &w1v));
  af_pool_job j;
  memset(&j, 0, sizeof(j));
  j.d = ad;
  int64_t L = c1->lanes, N = xd[0], H = xd[2], W = xd[3], p[4];
  j.L = L;
  CHECK(ct_conv_geometry(c1, H, W, &p[0], &p[1], &p[2], &p[3], &j.OH1, &j.OW1));
  j.OH2 = af_pool_extent(j.OH1, ad->pool_k[0], ad->pool_s[0], ad->pool_d[0], ad->pool_pads[0], ad->pool_pads[2],
                         ad->pool_ceil);
  j.OW2 = af_pool_extent(j.OW1, ad->pool_k[1], ad->pool_s[1], ad->pool_d[1], ad->pool_pads[1], ad->pool_pads[3],
                         ad->pool_ceil);
  if (j.OH2 < 0 || j.OW2 < 0)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the pool's window is larger than its padded input");
  int64_t OCB = (c1->oc + L - 1) / L;
  j.item_out = OCB * j.OH2 * j.OW2 * L;
  int64_t odims[5] = {N, OCB, j.OH2, j.OW2, L};
  OrtValue *ov;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, odims, 5, &ov));
  CHECK(API(GetTensorMutableData)(ov, (void **)&j.out));
  CHECK(af_extras(&j.first, c1, ctx, 2, N, 0, -1));
  if (N == 0 || j.OH2 * j.OW2 == 0) return NULL;
  const float *x, *w1;
  CHECK(API(GetTensorMutableData)((OrtValue *)xv, (void **)&x));
  CHECK(API(GetTensorMutableData)((OrtValue *)w1v, (void **)&w1));
  j.band_rows = ad->band_rows < 1 ? 1 : ad->band_rows > j.OH2 ? j.OH2 : ad->band_rows;
  j.bands = (j.OH2 + j.band_rows - 1) / j.band_rows;
  j.S = (j.band_rows - 1) * ad->pool_s[0] + (ad->pool_k[0] - 1) * ad->pool_d[0] + 1;
  j.band_floats = OCB * j.S * j.OW1 * L;
  int64_t *tab = (int64_t *)malloc((size_t)(c1->ic_g * c1->groups * c1->kh * c1->kw) * sizeof(int64_t));
  if (!tab) return fail(ORT_FAIL, "onnxopt: out of memory");
  float *copy = NULL;
  OrtStatus *st = af_conv_setup(&j.first, c1, ctx, x, w1, N, H, W, L, tab, &copy);
  if (!st) {
    int64_t tasks = N * j.bands;
    double flops = 2.0 * (double)N * j.OH1 * j.OW1 * (double)c1->oc * (double)j.first.K;
    if (tasks == 1 || flops < CT_INLINE_FLOPS) {
      for (int64_t t = 0; t < tasks; t++) af_pool_task(&j, (size_t)t);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, af_pool_task, (size_t)tasks, 0, &j);
    }
    if (!st && j.failed) st = fail(ORT_FAIL, "onnxopt: out of memory for a fused convolution's band");
  }
  glue_release(copy);
  free(tab);
  return st;
}
