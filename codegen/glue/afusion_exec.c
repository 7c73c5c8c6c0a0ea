/* ---- AFUSION: two convolutions in one kernel, by bands of output rows (OptiFX's AFUSION on a CPU). ----
 *
 * Inserted into ort_glue.c after compute_exec.c by library.py. The first convolution (with its epilogue) computes
 * the rows of its output that a band of the second convolution's output rows needs, all its channels, into a
 * scratch band on the task's heap that stays in L1/L2; the second convolution (with its epilogue) reads the band
 * and writes its output rows. The intermediate tensor never goes to memory. Bands overlap by
 * (kh2 - 1) * dh2 + 1 - sh2 rows, which both neighbours compute (OptiFX recomputes halos instead of exchanging them;
 * a band spans the whole width, so only rows are recomputed). Tiles are the channel-vector tiles of
 * codegen/compute/blocked_tile.py (depthwise first convolutions: codegen/microkernel/depthwise.py).
 *
 * The band is blocked, [ceil(OC1 / L)][S][Wp2][L]: S = (band_rows - 1) * sh2 + (kh2 - 1) * dh2 + 1 rows of the
 * intermediate, Wp2 = OW1 + pl2 + pr2 columns with the second convolution's left and right padding as zero columns,
 * and its top and bottom padding as zero rows, so the second convolution runs unpadded over the band.
 *
 * Op inputs: the first convolution's (x, packed weights, epilogue inputs), then the second's without the
 * intermediate (packed weights at `second_input`, epilogue inputs after them). The first convolution's epilogue
 * inputs are per channel or scalars (the optimizer checks it): a per-pixel one would need the band's offsets. */

typedef struct {
  const onnxopt_af_desc *d;
  const onnxopt_ct_desc *c1, *c2;
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
  int64_t band_rows, bands, S, Wp2, pt2, pl2, band_floats;
  /* the second convolution */
  const int64_t *aoff2;
  int64_t K2, OC2, OCB2, OH2, OW2;
  const float *w2, *ex2[CT_MAX_EXTRA];
  int64_t ex2_count[CT_MAX_EXTRA];
  float *out[CT_MAX_OUT];
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
                         j->OW1, g * plane_band + ((i - i_lo) * j->Wp2 + j->pl2) * L);
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
        for (int v = 0; v < nv; v++) t.coff[v] = (vb + v) * plane_band + ((i - i_lo) * j->Wp2 + j->pl2 + p0) * L;
        d->tiles[(mi - 1) * NI + (nv - 1)]((const int64_t *)&t);
      }
    }
  }
}

/* Output rows [o0, o1) of the second convolution for item n, all channels, from the band. */
static void af_second_rows(const af_job *j, const float *band, int64_t n, int64_t i_lo, int64_t o0, int64_t o1) {
  const onnxopt_ct_desc *d = j->c2;
  int64_t L = j->L, NI = d->ni, MI = d->mi;
  int64_t plane_out = j->OH2 * j->OW2 * L, item_out = j->OCB2 * plane_out;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.ldc = L;
  t.koff = j->aoff2;
  t.k = j->K2;
  t.a_ms = d->sw * L;
  for (int o = 0; o < d->sig.n_out; o++) t.out[o] = j->out[o] + n * item_out;
  int64_t groups = (j->OCB2 + NI - 1) / NI;
  for (int64_t g = 0; g < groups; g++) {
    int64_t vb = g * NI;
    int nv = (int)(j->OCB2 - vb < NI ? j->OCB2 - vb : NI);
    t.b = j->w2 + g * j->K2 * NI * L;
    for (int v = 0; v < nv; v++) {
      int64_t left = j->OC2 - (vb + v) * L;
      t.voff[v] = v * L;
      t.lanes[v] = left < L ? left : L;
    }
    for (int e = 0; e < d->n_extra; e++)
      t.extra[e] = j->ex2[e] + (d->extra_nstride[e] ? n * j->ex2_count[e] : 0) +
                   (d->extra_kind[e] == EX_CHANNEL ? vb * L : 0);
    for (int64_t oh = o0; oh < o1; oh++) {
      const float *in_r = band + (oh * d->sh - j->pt2 - i_lo) * j->Wp2 * L;
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

/* One band of one batch item: the first convolution's rows (zero rows where the band reaches into the second's
   padding), then the second's. */
static void af_task(void *usr, size_t index) {
  af_job *j = (af_job *)usr;
  const onnxopt_ct_desc *c2 = j->c2;
  int64_t n = (int64_t)index / j->bands, b = (int64_t)index % j->bands, L = j->L;
  int64_t o0 = b * j->band_rows, o1 = o0 + j->band_rows < j->OH2 ? o0 + j->band_rows : j->OH2;
  int64_t i_lo = o0 * c2->sh - j->pt2, i_hi = (o1 - 1) * c2->sh - j->pt2 + (c2->kh - 1) * c2->dh + 1;
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
      } else { /* the second convolution's left and right padding */
        memset(p + r * row, 0, (size_t)(j->pl2 * L) * sizeof(float));
        memset(p + r * row + (j->pl2 + j->OW1) * L, 0, (size_t)((j->Wp2 - j->pl2 - j->OW1) * L) * sizeof(float));
      }
    }
  }
  if (i1 > i0) af_first_rows(j, band, n, i_lo, i0, i1);
  af_second_rows(j, band, n, i_lo, o0, o1);
}

static OrtStatus *af_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx) {
  const onnxopt_ct_desc *c1 = ad->first, *c2 = ad->second;
  const OrtValue *xv, *w1v, *w2v;
  int64_t xd[MAX_RANK], wd[MAX_RANK];
  size_t xr, wr;
  CHECK(ct_dims(ctx, 0, &xv, xd, &xr));
  CHECK(ct_dims(ctx, 1, &w1v, wd, &wr));
  CHECK(ct_dims(ctx, (size_t)ad->second_input, &w2v, wd, &wr));
  CHECK(ct_check_input(c1, xd, xr));
  af_job j;
  memset(&j, 0, sizeof(j));
  j.d = ad, j.c1 = c1, j.c2 = c2;
  int64_t L = c1->lanes, N = xd[0], H = xd[2], W = xd[3];
  j.N = N, j.L = L;
  int64_t pt1, pl1, pb1, pr1, pb2, pr2;
  CHECK(ct_conv_geometry(c1, H, W, &pt1, &pl1, &pb1, &pr1, &j.OH1, &j.OW1));
  CHECK(ct_conv_geometry(c2, j.OH1, j.OW1, &j.pt2, &j.pl2, &pb2, &pr2, &j.OH2, &j.OW2));
  j.OC1 = c1->oc, j.OCB1 = (c1->oc + L - 1) / L;
  j.OC2 = c2->oc, j.OCB2 = (c2->oc + L - 1) / L;
  int64_t odims[5] = {N, j.OCB2, j.OH2, j.OW2, L}, nchw_dims[4] = {N, c2->oc, j.OH2, j.OW2};
  float *user_out[CT_MAX_OUT];
  for (int o = 0; o < c2->sig.n_out; o++) {
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, (size_t)o, c2->out_blocked ? odims : nchw_dims,
                                       c2->out_blocked ? 5 : 4, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&user_out[o]));
    j.out[o] = user_out[o];
  }
  int64_t block2 = j.OCB2 * j.OH2 * j.OW2 * L; /* per item */
  ct_job e1, e2;
  memset(&e1, 0, sizeof(e1));
  memset(&e2, 0, sizeof(e2));
  CHECK(ct_extras_at(c1, &e1, ctx, 2, N, 0, c1->oc, 0));
  CHECK(ct_extras_at(c2, &e2, ctx, ad->second_input + 1, N, c2->out_blocked ? block2 : c2->oc * j.OH2 * j.OW2,
                     c2->oc, 0));
  memcpy(j.ex1, e1.extra, sizeof(j.ex1));
  memcpy(j.ex1_count, e1.extra_count, sizeof(j.ex1_count));
  memcpy(j.ex2, e2.extra, sizeof(j.ex2));
  memcpy(j.ex2_count, e2.extra_count, sizeof(j.ex2_count));
  if (N == 0 || j.OH2 * j.OW2 == 0) return NULL;
  float *scratch = NULL; /* NCHW outputs: blocked buffers, reordered at the end */
  CHECK(cb_blocked_scratch(c2, ctx, N, j.OH2 * j.OW2, block2, j.out, j.ex2, j.ex2_count, &scratch));
  const float *x;
  CHECK(API(GetTensorMutableData)((OrtValue *)xv, (void **)&x));
  CHECK(API(GetTensorMutableData)((OrtValue *)w1v, (void **)&j.w1));
  CHECK(API(GetTensorMutableData)((OrtValue *)w2v, (void **)&j.w2));
  OrtStatus *st = NULL;
  float *padded = NULL; /* the first convolution's input, zero-padded or blocked, when it needs a copy */
  int64_t C1 = c1->ic_g * c1->groups, ic2 = c2->ic_g;
  int64_t *tabs = (int64_t *)malloc((size_t)(c1->ic_g * c1->kh * c1->kw + ic2 * c2->kh * c2->kw) * sizeof(int64_t));
  if (!tabs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  /* The band: rows of the intermediate for band_rows output rows, columns with the second's padding. */
  j.band_rows = ad->band_rows < 1 ? 1 : ad->band_rows > j.OH2 ? j.OH2 : ad->band_rows;
  j.bands = (j.OH2 + j.band_rows - 1) / j.band_rows;
  j.S = (j.band_rows - 1) * c2->sh + (c2->kh - 1) * c2->dh + 1;
  j.Wp2 = j.OW1 + j.pl2 + pr2;
  j.band_floats = j.OCB1 * j.S * j.Wp2 * L;
  j.K2 = ic2 * c2->kh * c2->kw;
  for (int64_t ic = 0; ic < ic2; ic++)
    for (int64_t r = 0; r < c2->kh; r++)
      for (int64_t c = 0; c < c2->kw; c++)
        tabs[(ic * c2->kh + r) * c2->kw + c] = ((ic / L) * j.S * j.Wp2 + r * c2->dh * j.Wp2 + c * c2->dw) * L + ic % L;
  j.aoff2 = tabs;
  int64_t *tab1 = tabs + j.K2;
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
  double flops = 2.0 * (double)N * j.OH2 * j.OW2 * (double)c2->oc * (double)j.K2;
  if (tasks == 1 || flops < CT_INLINE_FLOPS) {
    for (int64_t t = 0; t < tasks; t++) af_task(&j, (size_t)t);
  } else {
    st = API(KernelContext_ParallelFor)(ctx, af_task, (size_t)tasks, 0, &j);
  }
  if (!st && j.failed) st = fail(ORT_FAIL, "onnxopt: out of memory for a fused convolution's band");
  for (int o = 0; !st && scratch && o < c2->sig.n_out; o++)
    st = cb_reorder(ctx, user_out[o], j.out[o], N, c2->oc, L, j.OH2 * j.OW2, 1);
done:
  free(padded);
  free(tabs);
  free(scratch);
  return st;
}
