/* ---- The compute kind's entry points: ct_conv (NCHW, blocked, transposed and Winograd paths), ct_matmul and
 * ct_compute. Included after the other compute files (codegen/glue/kinds.py). ---- */

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
  int64_t N = bd[br - 1], k_rows = 0;
  if (d->packed_b) { /* [ceil(N / packed_b)][K][packed_b]: a constant matrix, no batch dims */
    if (br != 3 || bd[2] != d->packed_b || bd[0] != (d->oc + d->packed_b - 1) / d->packed_b)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: packed matmul weights do not match the kernel");
    /* bfloat16 pairs along K: an odd K is stored with a zero row to make the last pair, or K padded with zero
       rows to whole AMX steps of 32 (driver/precision.py); float16 in pairs only for AMX-FP16 tiles, padded so */
    int bf16 = d->sig.in_types[1] == 16 || d->sig.in_types[1] == 4;
    int f16_pairs = d->sig.in_types[1] == 10 && d->amx_groups > 0;
    int64_t stored = bf16 ? K + (K & 1) : K;
    if ((bf16 || f16_pairs) && bd[1] == ((K + 31) & ~(int64_t)31)) stored = bd[1];
    if (bd[1] != stored) return fail(ORT_INVALID_ARGUMENT, "onnxopt: matmul inner dimensions differ");
    k_rows = stored != K ? stored : 0;
    N = d->oc;
    bd[0] = K;
    bd[1] = N;
    br = 2;
  }
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
  memcpy(job.sched, d->sched, sizeof(job.sched));
  CHECK(ct_outputs(d, &job, ctx, od, R));
  job.items = batch;
  job.groups = 1;
  job.M = M;
  job.K = K;
  job.K_rows = k_rows;
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
  for (int64_t k = 0; k < K; k++) koff[k] = k * N; /* unused by packed B */
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
  if (seq_value_bf16(av)) { /* A in bfloat16 (a sequence's, sequence_exec.c): it is the tiles' A as it lies */
    int contiguous = 1;
    for (int64_t i = 0; i < batch; i++) contiguous &= job.a_off[i] == i * M * K;
    if (!d->packed_b || d->trans_a || !d->amx_groups || M % 16 || K % 32 || !contiguous) {
      st = fail(ORT_RUNTIME_EXCEPTION, "onnxopt: a bfloat16 tensor inside a sequence met a matmul that cannot read "
                                       "it; set ONNXOPT_SEQUENCE_BF16=0 and report this model");
      goto done;
    }
    job.a_bf16 = 1;
    job.a16 = (const uint16_t *)job.a;
    job.m16 = M;
  }
  st = ct_run(&job, ctx);
done:
  free(koff);
  free(offs);
  return st;
}

static OrtStatus *ct_compute(const onnxopt_ct_desc *d, OrtKernelContext *ctx) {
  return d->sig.kind == KIND_CONV ? ct_conv(d, ctx) : ct_matmul(d, ctx);
}
