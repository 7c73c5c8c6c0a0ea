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
  int64_t rows;                              /* output rows a task */
} ctt_interleave_job;

/* Two phases' rows side by side (a stride of 2 across): dst[2c] = a[c], dst[2c + 1] = b[c], in vectors (the scalar
   loop was most of a 24 -> 1 2x2 / 2 transposed convolution to 320 x 320, PP-OCR det's last layer). */
VECTORIZE X86_CLONES static void ctt_zip2(float *restrict dst, const float *restrict a, const float *restrict b,
                                          int64_t n) {
  for (int64_t c = 0; c < n; c++) {
    dst[2 * c] = a[c];
    dst[2 * c + 1] = b[c];
  }
}

/* Rows [r0, r0 + rows) of one output plane (task: plane * row blocks + block): each row gathers its sw phases. */
static void ctt_interleave_rows(void *usr, size_t index) {
  const ctt_interleave_job *p = (const ctt_interleave_job *)usr;
  int64_t blocks = (p->OH + p->rows - 1) / p->rows;
  int64_t plane = (int64_t)index / blocks, r0 = (int64_t)index % blocks * p->rows; /* plane: n * OC + oc */
  int64_t r1 = r0 + p->rows < p->OH ? r0 + p->rows : p->OH;
  int64_t n = plane / p->OC, oc = plane % p->OC;
  for (int o = 0; o < p->n_out; o++) {
    float *dst = p->out[o] + plane * p->OH * p->OW;
    for (int64_t oh = r0; oh < r1; oh++) {
      int64_t ph = oh % p->sh, q = oh / p->sh;
      float *row = dst + oh * p->OW;
      const float *src[CB_MAX_PHASES];
      int64_t sw = p->sw < p->OW ? p->sw : p->OW;
      for (int64_t pw = 0; pw < sw; pw++) {
        int64_t i = ph * p->sw + pw;
        src[pw] = p->scratch[o] + p->phase_off[i] + n * p->nstr[i] + (oc * p->qh[i] + q) * p->qw[i];
      }
      int64_t done = 0;
      if (p->sw == 2 && sw == 2) { /* a stride of 2: the pairs both phases have, in vectors */
        int64_t w0 = p->qw[ph * p->sw], w1 = p->qw[ph * p->sw + 1];
        done = w0 < w1 ? w0 : w1;
        ctt_zip2(row, src[0], src[1], done);
      }
      for (int64_t pw = 0; pw < sw; pw++)
        for (int64_t c = done; c < p->qw[ph * p->sw + pw]; c++) row[pw + c * p->sw] = src[pw][c];
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
    /* tasks of about 16 K floats, so that one plane (a one-channel output) is shared by the threads too */
    int64_t rows = OW > 0 && OW < (1 << 14) ? (1 << 14) / OW : 1;
    ctt_interleave_job ij = {scr, base.out, d->sig.n_out, d->oc, OH, OW, d->sh, d->sw, phase_off, nstr, qh, qw, rows};
    int64_t tasks = N * d->oc * ((OH + rows - 1) / rows);
    if (N * d->oc * OH * OW < (1 << 16)) {
      for (int64_t i = 0; i < tasks; i++) ctt_interleave_rows(&ij, (size_t)i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, ctt_interleave_rows, (size_t)tasks, 0, &ij);
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
