/* ---- AFUSION: a convolution and the convolutions reading its output in one kernel, by bands of output rows
 * (OptiFX's AFUSION on a CPU). ----
 *
 * Inserted into ort_glue.c after compute_exec.c by library.py. The first convolution (with its epilogue) computes
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
 * The first convolution's epilogue inputs are per channel or scalars (the optimizer checks it): a per-pixel one would
 * need the band's offsets. */

/* One second convolution: its geometry over the band, weights, epilogue inputs and outputs. */
typedef struct {
  const onnxopt_ct_desc *c;
  const int64_t *aoff;
  int64_t K, OC, OCB, pt, pl, row_shift, col_shift; /* shifts: PT - pt, PL - pl */
  const float *w, *ex[CT_MAX_EXTRA];
  int64_t ex_count[CT_MAX_EXTRA];
  float *out[CT_MAX_OUT], *user_out[CT_MAX_OUT];
  float *scratch; /* NCHW outputs: blocked buffers, reordered at the end */
} af_second;

typedef struct {
  const onnxopt_af_desc *d;
  const onnxopt_ct_desc *c1;
  int64_t N, L;
  /* the first convolution: input (its zero-padded copy when it pads and is not depthwise), geometry, taps */
  const float *x;
  int64_t x_item, ps1, Wp1;
  const int64_t *aoff1;
  int64_t K1, OC1, OCB1, OH1, OW1;
  cb_window dw1; /* a depthwise first convolution reads its blocked input in place (cb_depthwise_row) */
  const float *w1, *ex1[CT_MAX_EXTRA];
  int64_t ex1_count[CT_MAX_EXTRA];
  /* the band */
  int64_t band_rows, bands, S, Wp2, PT, PL, band_floats;
  /* the second convolutions: one output size and stride */
  int n_second;
  af_second second[AF_MAX_SECOND];
  int64_t OH2, OW2, sh2;
  int failed; /* a task could not allocate its band */
} af_job;

/* Rows [i0, i1) of the first convolution's output for item n, all channels, into the band (band row 0 is
   intermediate row i_lo). */
static void af_first_rows(const af_job *j, float *band, int64_t n, int64_t i_lo, int64_t i0, int64_t i1) {
  const onnxopt_ct_desc *d = j->c1;
  int64_t L = j->L, NI = d->ni, MI = d->mi;
  int64_t plane_band = j->S * j->Wp2 * L;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.ldc = L;
  t.out[0] = band;
  if (d->groups != 1) { /* depthwise: one channel vector per tile */
    t.a_ms = d->sw * L;
    int64_t plane_in = j->dw1.H * j->dw1.W * L;
    for (int64_t g = 0; g < j->OCB1; g++) {
      int64_t left = j->OC1 - g * L;
      t.lanes[0] = left < L ? left : L;
      for (int e = 0; e < d->n_extra; e++)
        t.extra[e] = j->ex1[e] + (d->extra_nstride[e] ? n * j->ex1_count[e] : 0) +
                     (d->extra_kind[e] == EX_CHANNEL ? g * L : 0);
      for (int64_t i = i0; i < i1; i++)
        cb_depthwise_row(d, &j->dw1, &t, j->x + n * j->x_item + g * plane_in, j->w1 + g * j->K1 * L, j->aoff1, i,
                         j->OW1, g * plane_band + ((i - i_lo) * j->Wp2 + j->PL) * L);
    }
    return;
  }
  t.koff = j->aoff1;
  t.k = j->K1;
  t.a_ms = d->sw * j->ps1;
  int64_t groups = (j->OCB1 + NI - 1) / NI;
  for (int64_t g = 0; g < groups; g++) {
    int64_t vb = g * NI;
    int nv = (int)(j->OCB1 - vb < NI ? j->OCB1 - vb : NI);
    t.b = j->w1 + g * j->K1 * NI * L;
    for (int v = 0; v < nv; v++) {
      int64_t left = j->OC1 - (vb + v) * L;
      t.voff[v] = v * L;
      t.lanes[v] = left < L ? left : L;
    }
    for (int e = 0; e < d->n_extra; e++)
      t.extra[e] = j->ex1[e] + (d->extra_nstride[e] ? n * j->ex1_count[e] : 0) +
                   (d->extra_kind[e] == EX_CHANNEL ? vb * L : 0);
    for (int64_t i = i0; i < i1; i++) {
      const float *in_r = j->x + n * j->x_item + i * d->sh * j->Wp1 * j->ps1;
      /* near-equal tiles, as cb_run_task */
      for (int64_t ti = 0, tiles = (j->OW1 + MI - 1) / MI; ti < tiles; ti++) {
        int64_t p0 = ti * j->OW1 / tiles, mi = (ti + 1) * j->OW1 / tiles - p0;
        t.a = in_r + p0 * t.a_ms;
        for (int v = 0; v < nv; v++) t.coff[v] = (vb + v) * plane_band + ((i - i_lo) * j->Wp2 + j->PL + p0) * L;
        d->tiles[(mi - 1) * NI + (nv - 1)]((const int64_t *)&t);
      }
    }
  }
}

/* Output rows [o0, o1) of second convolution `br` for item n, all its channels, from the band. */
static void af_second_rows(const af_job *j, const af_second *br, const float *band, int64_t n, int64_t i_lo,
                           int64_t o0, int64_t o1) {
  const onnxopt_ct_desc *d = br->c;
  int64_t L = j->L, NI = d->ni, MI = d->mi;
  int64_t plane_out = j->OH2 * j->OW2 * L, item_out = br->OCB * plane_out;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.ldc = L;
  t.koff = br->aoff;
  t.k = br->K;
  t.a_ms = d->sw * L;
  for (int o = 0; o < d->sig.n_out; o++) t.out[o] = br->out[o] + n * item_out;
  int64_t groups = (br->OCB + NI - 1) / NI;
  for (int64_t g = 0; g < groups; g++) {
    int64_t vb = g * NI;
    int nv = (int)(br->OCB - vb < NI ? br->OCB - vb : NI);
    t.b = br->w + g * br->K * NI * L;
    for (int v = 0; v < nv; v++) {
      int64_t left = br->OC - (vb + v) * L;
      t.voff[v] = v * L;
      t.lanes[v] = left < L ? left : L;
    }
    for (int e = 0; e < d->n_extra; e++)
      t.extra[e] = br->ex[e] + (d->extra_nstride[e] ? n * br->ex_count[e] : 0) +
                   (d->extra_kind[e] == EX_CHANNEL ? vb * L : 0);
    for (int64_t oh = o0; oh < o1; oh++) {
      /* its padded input row oh * sh is intermediate row oh * sh - pt; its padded column 0 is band column PL - pl */
      const float *in_r = band + ((oh * d->sh - br->pt - i_lo) * j->Wp2 + br->col_shift) * L;
      for (int64_t ti = 0, tiles = (j->OW2 + MI - 1) / MI; ti < tiles; ti++) {
        int64_t p0 = ti * j->OW2 / tiles, mi = (ti + 1) * j->OW2 / tiles - p0;
        t.a = in_r + p0 * t.a_ms;
        for (int v = 0; v < nv; v++) t.coff[v] = (vb + v) * plane_out + (oh * j->OW2 + p0) * L;
        d->tiles[(mi - 1) * NI + (nv - 1)]((const int64_t *)&t);
      }
    }
  }
}

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
    const onnxopt_ct_desc *c = j->second[s].c;
    int64_t hi = (o1 - 1) * j->sh2 - j->second[s].pt + (c->kh - 1) * c->dh + 1;
    if (hi > i_hi) i_hi = hi;
  }
  int64_t i0 = i_lo > 0 ? i_lo : 0, i1 = i_hi < j->OH1 ? i_hi : j->OH1;
  float *band = af_band((size_t)j->band_floats);
  if (!band) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  int64_t row = j->Wp2 * L, plane_band = j->S * row;
  for (int64_t g = 0; g < j->OCB1; g++) {
    float *p = band + g * plane_band;
    for (int64_t r = 0; r < i_hi - i_lo; r++) {
      int64_t i = i_lo + r;
      if (i < 0 || i >= j->OH1) {
        memset(p + r * row, 0, (size_t)row * sizeof(float));
      } else { /* the seconds' left and right padding */
        memset(p + r * row, 0, (size_t)(j->PL * L) * sizeof(float));
        memset(p + r * row + (j->PL + j->OW1) * L, 0, (size_t)((j->Wp2 - j->PL - j->OW1) * L) * sizeof(float));
      }
    }
  }
  if (i1 > i0) af_first_rows(j, band, n, i_lo, i0, i1);
  for (int s = 0; s < j->n_second; s++) af_second_rows(j, &j->second[s], band, n, i_lo, o0, o1);
}

static OrtStatus *af_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx) {
  const onnxopt_ct_desc *c1 = ad->first;
  const OrtValue *xv, *w1v;
  int64_t xd[MAX_RANK], wd[MAX_RANK];
  size_t xr, wr;
  CHECK(ct_dims(ctx, 0, &xv, xd, &xr));
  CHECK(ct_dims(ctx, 1, &w1v, wd, &wr));
  CHECK(ct_check_input(c1, xd, xr));
  af_job j;
  memset(&j, 0, sizeof(j));
  j.d = ad, j.c1 = c1, j.n_second = ad->n_second;
  int64_t L = c1->lanes, N = xd[0], H = xd[2], W = xd[3];
  j.N = N, j.L = L;
  int64_t pt1, pl1, pb1, pr1, PR = 0;
  CHECK(ct_conv_geometry(c1, H, W, &pt1, &pl1, &pb1, &pr1, &j.OH1, &j.OW1));
  j.OC1 = c1->oc, j.OCB1 = (c1->oc + L - 1) / L;
  int out_base = 0;
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    const onnxopt_ct_desc *c = ad->second[s];
    int64_t pb, pr, oh, ow;
    br->c = c;
    CHECK(ct_conv_geometry(c, j.OH1, j.OW1, &br->pt, &br->pl, &pb, &pr, &oh, &ow));
    if (s == 0) {
      j.OH2 = oh, j.OW2 = ow, j.sh2 = c->sh;
    } else if (oh != j.OH2 || ow != j.OW2 || c->sh != j.sh2) {
      return fail(ORT_FAIL, "onnxopt: the fused convolutions' outputs differ in size; re-run onnxopt");
    }
    if (br->pt > j.PT) j.PT = br->pt;
    if (br->pl > j.PL) j.PL = br->pl;
    if (pr > PR) PR = pr;
    br->OC = c->oc, br->OCB = (c->oc + L - 1) / L;
    const OrtValue *wv;
    CHECK(ct_dims(ctx, (size_t)ad->second_input[s], &wv, wd, &wr));
    CHECK(API(GetTensorMutableData)((OrtValue *)wv, (void **)&br->w));
    int64_t odims[5] = {N, br->OCB, oh, ow, L}, nchw_dims[4] = {N, c->oc, oh, ow};
    for (int o = 0; o < c->sig.n_out; o++) {
      OrtValue *ov;
      CHECK(API(KernelContext_GetOutput)(ctx, (size_t)(out_base + o), c->out_blocked ? odims : nchw_dims,
                                         c->out_blocked ? 5 : 4, &ov));
      CHECK(API(GetTensorMutableData)(ov, (void **)&br->user_out[o]));
      br->out[o] = br->user_out[o];
    }
    out_base += c->sig.n_out;
    ct_job e;
    memset(&e, 0, sizeof(e));
    CHECK(ct_extras_at(c, &e, ctx, ad->second_input[s] + 1, N,
                       c->out_blocked ? br->OCB * oh * ow * L : c->oc * oh * ow, c->oc, 0));
    memcpy(br->ex, e.extra, sizeof(br->ex));
    memcpy(br->ex_count, e.extra_count, sizeof(br->ex_count));
  }
  for (int s = 0; s < j.n_second; s++)
    j.second[s].row_shift = j.PT - j.second[s].pt, j.second[s].col_shift = j.PL - j.second[s].pl;
  ct_job e1;
  memset(&e1, 0, sizeof(e1));
  CHECK(ct_extras_at(c1, &e1, ctx, 2, N, 0, c1->oc, 0));
  memcpy(j.ex1, e1.extra, sizeof(j.ex1));
  memcpy(j.ex1_count, e1.extra_count, sizeof(j.ex1_count));
  if (N == 0 || j.OH2 * j.OW2 == 0) return NULL;
  OrtStatus *st = NULL;
  float *padded = NULL; /* the first convolution's input, zero-padded or blocked, when it needs a copy */
  int64_t *tabs = NULL;
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    if ((st = cb_blocked_scratch(br->c, ctx, N, j.OH2 * j.OW2, br->OCB * j.OH2 * j.OW2 * L, br->out, br->ex,
                                 br->ex_count, &br->scratch)))
      goto done;
  }
  const float *x;
  if ((st = API(GetTensorMutableData)((OrtValue *)xv, (void **)&x))) goto done;
  if ((st = API(GetTensorMutableData)((OrtValue *)w1v, (void **)&j.w1))) goto done;
  int64_t C1 = c1->ic_g * c1->groups, taps = c1->ic_g * c1->kh * c1->kw;
  for (int s = 0; s < j.n_second; s++) taps += ad->second[s]->ic_g * ad->second[s]->kh * ad->second[s]->kw;
  tabs = (int64_t *)malloc((size_t)taps * sizeof(int64_t));
  if (!tabs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  /* The band: the rows of the intermediate that band_rows output rows need, columns with the seconds' padding. */
  j.band_rows = ad->band_rows < 1 ? 1 : ad->band_rows > j.OH2 ? j.OH2 : ad->band_rows;
  j.bands = (j.OH2 + j.band_rows - 1) / j.band_rows;
  j.Wp2 = j.OW1 + j.PL + PR;
  int64_t *tab = tabs;
  double flops = 0;
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    const onnxopt_ct_desc *c = br->c;
    int64_t rows = (j.band_rows - 1) * c->sh + (c->kh - 1) * c->dh + 1 + br->row_shift;
    if (rows > j.S) j.S = rows;
    br->K = c->ic_g * c->kh * c->kw;
    br->aoff = tab;
    tab += br->K;
    flops += 2.0 * (double)N * j.OH2 * j.OW2 * (double)c->oc * (double)br->K;
  }
  for (int s = 0; s < j.n_second; s++) { /* tap offsets within the band: channel block, row, column */
    const onnxopt_ct_desc *c = j.second[s].c;
    int64_t *t = (int64_t *)j.second[s].aoff;
    for (int64_t ic = 0; ic < c->ic_g; ic++)
      for (int64_t r = 0; r < c->kh; r++)
        for (int64_t q = 0; q < c->kw; q++)
          t[(ic * c->kh + r) * c->kw + q] = ((ic / L) * j.S * j.Wp2 + r * c->dh * j.Wp2 + q * c->dw) * L + ic % L;
  }
  j.band_floats = j.OCB1 * j.S * j.Wp2 * L;
  int64_t *tab1 = tab;
  if (c1->groups != 1) { /* depthwise: a blocked input is read in place; an NCHW one is reordered first */
    if (!c1->in_blocked) {
      padded = (float *)malloc((size_t)(N * j.OCB1 * H * W * L) * sizeof(float));
      if (!padded) {
        st = fail(ORT_FAIL, "onnxopt: out of memory for the blocked input");
        goto done;
      }
      if ((st = cb_reorder(ctx, (float *)x, padded, N, C1, L, H * W, 0))) goto done;
      x = padded;
    }
    cb_window *w = &j.dw1;
    w->H = H, w->W = W, w->kh = c1->kh, w->dh = c1->dh, w->sh = c1->sh, w->sw = c1->sw, w->pt = pt1, w->pl = pl1;
    w->reach_w = (c1->kw - 1) * c1->dw;
    j.K1 = c1->kh * c1->kw;
    for (int64_t r = 0; r < c1->kh; r++)
      for (int64_t c = 0; c < c1->kw; c++) tab1[r * c1->kw + c] = (r * c1->dh * W + c * c1->dw) * L;
    j.x = x;
    j.x_item = j.OCB1 * H * W * L;
  } else {
    int64_t planes = c1->in_blocked ? (C1 + L - 1) / L : C1, ps = c1->in_blocked ? L : 1;
    int64_t Hp = H + pt1 + pb1, Wp = W + pl1 + pr1;
    j.ps1 = ps, j.Wp1 = Wp;
    j.x_item = planes * Hp * Wp * ps;
    j.K1 = C1 * c1->kh * c1->kw;
    for (int64_t ic = 0; ic < C1; ic++)
      for (int64_t r = 0; r < c1->kh; r++)
        for (int64_t c = 0; c < c1->kw; c++) {
          int64_t y = r * c1->dh, xx = c * c1->dw;
          tab1[(ic * c1->kh + r) * c1->kw + c] =
              c1->in_blocked ? ((ic / L) * Hp * Wp + y * Wp + xx) * L + ic % L : ic * Hp * Wp + y * Wp + xx;
        }
    if (Hp != H || Wp != W) { /* the first convolution's zero-padded input (cb_copy_row) */
      padded = (float *)malloc((size_t)(N * j.x_item) * sizeof(float));
      if (!padded) {
        st = fail(ORT_FAIL, "onnxopt: out of memory for the padded input");
        goto done;
      }
      cb_copy_job cj = {x, padded, ps, H, W, Hp, Wp, pt1, pl1};
      int64_t rows = N * planes * Hp;
      if (N * j.x_item < (1 << 16)) {
        for (int64_t i = 0; i < rows; i++) cb_copy_row(&cj, (size_t)i);
      } else if ((st = API(KernelContext_ParallelFor)(ctx, cb_copy_row, (size_t)rows, 0, &cj))) {
        goto done;
      }
      j.x = padded;
    } else {
      j.x = x;
    }
  }
  j.aoff1 = tab1;
  int64_t tasks = N * j.bands;
  if (tasks == 1 || flops < CT_INLINE_FLOPS) {
    for (int64_t t = 0; t < tasks; t++) af_task(&j, (size_t)t);
  } else {
    st = API(KernelContext_ParallelFor)(ctx, af_task, (size_t)tasks, 0, &j);
  }
  if (!st && j.failed) st = fail(ORT_FAIL, "onnxopt: out of memory for a fused convolution's band");
  for (int s = 0; s < j.n_second; s++) {
    af_second *br = &j.second[s];
    for (int o = 0; !st && br->scratch && o < br->c->sig.n_out; o++)
      st = cb_reorder(ctx, br->user_out[o], br->out[o], N, br->OC, L, j.OH2 * j.OW2, 1);
  }
done:
  free(padded);
  free(tabs);
  for (int s = 0; s < j.n_second; s++) free(j.second[s].scratch);
  return st;
}
