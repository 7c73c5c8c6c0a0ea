/* ---- AFUSION chains of three convolutions: A -> B -> C in one kernel, two scratch bands per task ----
 *
 * Included after afusion_exec.c (codegen/glue/kinds.py; af_compute calls af_chain_compute when the
 * descriptor's `chain` is set). OptiFX fuses up to three region operators; the two-convolution kernel's band
 * (afusion_exec.c) nests: per band of C's output rows, B computes the rows of its output that C needs into band 2,
 * and A first computes the rows of its output that those B rows need into band 1. Neither intermediate goes to
 * memory; each band recomputes the halo rows its neighbours also compute (for B's rows, C's halo; for A's, B's halo
 * of C's halo). A MobileNetV2 block (1x1 expand -> 3x3 depthwise -> 1x1 project) keeps its two expanded tensors in
 * the core's L2; a ResNet bottleneck (1x1 -> 3x3 -> 1x1) its two narrow ones.
 *
 * Band 2 is [ceil(OC_B / L)][S2][OW_B + plC + prC][L]: band row 0 is B's output row o0 * shC - ptC for a band of C
 * rows starting at o0, rows outside B's output and the padding columns zero, so C runs unpadded over it (as a
 * second convolution of afusion_exec.c). Band 1 is [ceil(OC_A / L)][S1][OW_A + plB + prB][L] for the B rows of the
 * band that exist, band row 0 A's output row jb0 * shB - ptB. Each part may be dense or depthwise; A's and B's
 * epilogue inputs are per channel or scalars (the optimizer checks it), C's may be per pixel (a residual).
 *
 * Op inputs: A's (x, packed weights, epilogue inputs), then B's without the intermediate (packed weights at
 * `second_input[0]`, epilogue inputs after them), then C's (at `second_input[1]`). Op outputs: C's. */

typedef struct {
  const onnxopt_af_desc *d;
  int64_t N, L;
  af_conv a, b, c;
  int64_t pt_b, pt_c;                   /* B's and C's top padding */
  int64_t OH_A, OH_B, OH_C, OW_C, sh_b, sh_c;
  int64_t band_rows, bands;
  int64_t S1, W1, S2, W2; /* band rows and padded widths */
  int64_t pl_b, pl_c;     /* the left padding columns of band 1 and band 2 */
  int64_t band1_floats, band2_floats;
  float *out[CT_MAX_OUT], *user_out[CT_MAX_OUT];
  int failed;
} af_chain_job;

/* Zero the rows of a band that lie outside the producer's output, and the padding columns of the others. */
static void af_chain_clear(float *band, int64_t planes, int64_t S, int64_t Wp, int64_t L, int64_t row_lo,
                           int64_t rows, int64_t produced_rows, int64_t pl, int64_t width) {
  int64_t row = Wp * L;
  for (int64_t g = 0; g < planes; g++) {
    float *p = band + g * S * row;
    for (int64_t r = 0; r < rows; r++) {
      int64_t i = row_lo + r;
      if (i < 0 || i >= produced_rows) {
        memset(p + r * row, 0, (size_t)row * sizeof(float));
      } else {
        memset(p + r * row, 0, (size_t)(pl * L) * sizeof(float));
        memset(p + r * row + (pl + width) * L, 0, (size_t)((Wp - pl - width) * L) * sizeof(float));
      }
    }
  }
}

/* Convolution `cv` (B or C) reads a band whose row 0 is its input's row `row_lo` and whose left padding is the
   convolution's own: a dense one through its padded-row origin, a depthwise one through its window's padding. */
static af_conv af_chain_reader(const af_conv *cv, float *band, int64_t pt, int64_t row_lo) {
  af_conv r = *cv;
  r.x = band;
  if (r.c->groups != 1)
    r.dw.pt = pt + row_lo;
  else
    r.x_row0 = pt + row_lo;
  return r;
}

static void af_chain_task(void *usr, size_t index) {
  af_chain_job *j = (af_chain_job *)usr;
  int64_t n = (int64_t)index / j->bands, b = (int64_t)index % j->bands, L = j->L;
  int64_t o0 = b * j->band_rows, o1 = o0 + j->band_rows < j->OH_C ? o0 + j->band_rows : j->OH_C;
  const onnxopt_ct_desc *cc = j->c.c, *cbd = j->b.c;
  /* B's rows that C's rows [o0, o1) read (with C's padding), and those of them that exist */
  int64_t j_lo = o0 * j->sh_c - j->pt_c, j_hi = (o1 - 1) * j->sh_c - j->pt_c + (cc->kh - 1) * cc->dh + 1;
  int64_t jb0 = j_lo > 0 ? j_lo : 0, jb1 = j_hi < j->OH_B ? j_hi : j->OH_B;
  float *band1 = af_band((size_t)(j->band1_floats + j->band2_floats));
  if (!band1) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  float *band2 = band1 + j->band1_floats;
  af_chain_clear(band2, j->b.OCB, j->S2, j->W2, L, j_lo, j_hi - j_lo, j->OH_B, j->pl_c, j->b.OW);
  if (jb1 > jb0) {
    /* A's rows that B's rows [jb0, jb1) read */
    int64_t i_lo = jb0 * j->sh_b - j->pt_b, i_hi = (jb1 - 1) * j->sh_b - j->pt_b + (cbd->kh - 1) * cbd->dh + 1;
    int64_t i0 = i_lo > 0 ? i_lo : 0, i1 = i_hi < j->OH_A ? i_hi : j->OH_A;
    af_chain_clear(band1, j->a.OCB, j->S1, j->W1, L, i_lo, i_hi - i_lo, j->OH_A, j->pl_b, j->a.OW);
    af_dest d1 = {{band1}, j->S1 * j->W1 * L, j->W1 * L, i_lo, j->pl_b};
    if (i1 > i0) af_conv_rows(&j->a, L, n, i0, i1, &d1);
    af_conv bv = af_chain_reader(&j->b, band1, j->pt_b, i_lo);
    af_dest d2 = {{band2}, j->S2 * j->W2 * L, j->W2 * L, j_lo, j->pl_c};
    af_conv_rows(&bv, L, n, jb0, jb1, &d2);
  }
  af_conv cv = af_chain_reader(&j->c, band2, j->pt_c, j_lo);
  int64_t plane_out = j->OH_C * j->OW_C * L;
  af_dest out = {{NULL}, plane_out, j->OW_C * L, 0, 0};
  for (int o = 0; o < cc->sig.n_out; o++) out.base[o] = j->out[o] + n * j->c.OCB * plane_out;
  af_conv_rows(&cv, L, n, o0, o1, &out);
}

/* A reader's tap table within its band (S rows of Wp columns a channel plane), and a depthwise reader's window. */
static void af_chain_taps(af_conv *cv, int64_t *tab, int64_t S, int64_t Wp, int64_t L) {
  const onnxopt_ct_desc *c = cv->c;
  cv->K = c->ic_g * c->kh * c->kw;
  cv->aoff = tab;
  cv->ps = L, cv->Wp = Wp, cv->x_item = 0;
  for (int64_t ic = 0; ic < c->ic_g; ic++)
    for (int64_t r = 0; r < c->kh; r++)
      for (int64_t q = 0; q < c->kw; q++)
        tab[(ic * c->kh + r) * c->kw + q] = ((ic / L) * S * Wp + r * c->dh * Wp + q * c->dw) * L + ic % L;
  if (c->groups != 1) { /* the band holds the padding (its left columns are the reader's own left padding, so the
                           window's is 0; the top one is set per band): no tile reaches outside it */
    cb_window *w = &cv->dw;
    w->H = S, w->W = Wp, w->kh = c->kh, w->dh = c->dh, w->sh = c->sh, w->sw = c->sw;
    w->pt = 0, w->pl = 0, w->reach_w = (c->kw - 1) * c->dw;
  }
}

/* B or C: geometry on its input's size, packed weights and epilogue inputs (from op input `at`). */
static OrtStatus *af_chain_part(af_conv *cv, const onnxopt_ct_desc *c, OrtKernelContext *ctx, int at, int64_t N,
                                int64_t H, int64_t W, int64_t L, int64_t *pt, int64_t *pl, int64_t *pr,
                                int64_t item_out) {
  const OrtValue *wv;
  int64_t wd[MAX_RANK], pb;
  size_t wr;
  cv->c = c;
  CHECK(ct_conv_geometry(c, H, W, pt, pl, &pb, pr, &cv->OH, &cv->OW));
  cv->OC = c->oc, cv->OCB = (c->oc + L - 1) / L;
  CHECK(ct_dims(ctx, (size_t)at, &wv, wd, &wr));
  CHECK(API(GetTensorMutableData)((OrtValue *)wv, (void **)&cv->w));
  return af_extras(cv, c, ctx, at + 1, N, item_out, -1);
}

static OrtStatus *af_chain_compute(const onnxopt_af_desc *ad, OrtKernelContext *ctx) {
  if (ad->n_second != 2) return fail(ORT_FAIL, "onnxopt: an AFUSION chain has three convolutions; re-run onnxopt");
  const onnxopt_ct_desc *ca = ad->first, *cbd = ad->second[0], *cc = ad->second[1];
  const OrtValue *xv, *wav;
  int64_t xd[MAX_RANK];
  size_t xr;
  CHECK(ct_conv_inputs(ca, ctx, &xv, xd, &xr, &wav));
  af_chain_job j;
  memset(&j, 0, sizeof(j));
  j.d = ad;
  int64_t L = ca->lanes, N = xd[0], H = xd[2], W = xd[3];
  j.N = N, j.L = L;
  int64_t p[4];
  CHECK(ct_conv_geometry(ca, H, W, &p[0], &p[1], &p[2], &p[3], &j.OH_A, &j.a.OW));
  int64_t pr_b, pr_c;
  CHECK(af_chain_part(&j.b, cbd, ctx, ad->second_input[0], N, j.OH_A, j.a.OW, L, &j.pt_b, &j.pl_b, &pr_b, 0));
  j.OH_B = j.b.OH;
  /* C's item size for a per-pixel epilogue input (a residual): blocked or NCHW as its output */
  int64_t oh_c, ow_c, pb_c;
  CHECK(ct_conv_geometry(cc, j.OH_B, j.b.OW, &p[0], &p[1], &pb_c, &p[3], &oh_c, &ow_c));
  int64_t ocb_c = (cc->oc + L - 1) / L;
  int64_t item_c = cc->out_blocked ? ocb_c * oh_c * ow_c * L : cc->oc * oh_c * ow_c;
  CHECK(af_chain_part(&j.c, cc, ctx, ad->second_input[1], N, j.OH_B, j.b.OW, L, &j.pt_c, &j.pl_c, &pr_c, item_c));
  j.OH_C = j.c.OH, j.OW_C = j.c.OW, j.sh_b = cbd->sh, j.sh_c = cc->sh;
  CHECK(ct_conv_outputs(cc, ctx, 0, N, j.OH_C, j.OW_C, j.user_out, j.out));
  CHECK(af_extras(&j.a, ca, ctx, 2, N, 0, -1));
  if (N == 0 || j.OH_C * j.OW_C == 0) return NULL;
  OrtStatus *st = NULL;
  float *scratch = NULL, *copy = NULL;
  int64_t *tabs = NULL;
  if ((st = cb_blocked_scratch(cc, ctx, N, j.OH_C * j.OW_C, j.c.OCB * j.OH_C * j.OW_C * L, j.out, j.c.ex,
                               j.c.ex_count, &scratch, -1)))
    goto done;
  const float *x, *wa;
  if ((st = API(GetTensorMutableData)((OrtValue *)xv, (void **)&x))) goto done;
  if ((st = API(GetTensorMutableData)((OrtValue *)wav, (void **)&wa))) goto done;
  int64_t ka = ca->ic_g * ca->groups * ca->kh * ca->kw, kb = cbd->ic_g * cbd->kh * cbd->kw;
  int64_t kc = cc->ic_g * cc->kh * cc->kw;
  tabs = (int64_t *)malloc((size_t)(ka + kb + kc) * sizeof(int64_t));
  if (!tabs) {
    st = fail(ORT_FAIL, "onnxopt: out of memory");
    goto done;
  }
  j.band_rows = ad->band_rows < 1 ? 1 : ad->band_rows > j.OH_C ? j.OH_C : ad->band_rows;
  j.bands = (j.OH_C + j.band_rows - 1) / j.band_rows;
  j.S2 = (j.band_rows - 1) * cc->sh + (cc->kh - 1) * cc->dh + 1;
  j.W2 = j.b.OW + j.pl_c + pr_c;
  j.S1 = (j.S2 - 1) * cbd->sh + (cbd->kh - 1) * cbd->dh + 1;
  j.W1 = j.a.OW + j.pl_b + pr_b;
  j.band1_floats = (ca->oc + L - 1) / L * j.S1 * j.W1 * L;
  j.band2_floats = j.b.OCB * j.S2 * j.W2 * L;
  af_chain_taps(&j.b, tabs + ka, j.S1, j.W1, L);
  af_chain_taps(&j.c, tabs + ka + kb, j.S2, j.W2, L);
  j.b.OH = j.OH_B, j.c.OH = j.OH_C;
  if ((st = af_conv_setup(&j.a, ca, ctx, x, wa, N, H, W, L, tabs, &copy))) goto done;
  double flops = 2.0 * (double)N * (double)(j.OH_A * j.a.OW * ca->oc * ca->ic_g * ca->kh * ca->kw +
                                            j.OH_B * j.b.OW * cbd->oc * kb + j.OH_C * j.OW_C * cc->oc * kc);
  int64_t tasks = N * j.bands;
  if (tasks == 1 || flops < CT_INLINE_FLOPS) {
    for (int64_t t = 0; t < tasks; t++) af_chain_task(&j, (size_t)t);
  } else {
    st = API(KernelContext_ParallelFor)(ctx, af_chain_task, (size_t)tasks, 0, &j);
  }
  if (!st && j.failed) st = fail(ORT_FAIL, "onnxopt: out of memory for a fused convolution chain's bands");
  for (int o = 0; !st && scratch && o < cc->sig.n_out; o++)
    st = cb_reorder(ctx, j.user_out[o], j.out[o], N, cc->oc, L, j.OH_C * j.OW_C, 1);
done:
  glue_release(copy);
  free(tabs);
  glue_release(scratch);
  return st;
}
