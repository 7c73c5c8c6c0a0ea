/* The attention kind's executor: the leading dims (batch, heads) broadcast between Q, K, V and the mask; one task
   per (leading index, block of query rows), over ORT's pool. A task packs its head's K^T and V in panels (attn_pack)
   (or, where a head is split into several row tasks, every head is packed once first) and calls the kernel on its
   rows, which keeps the scores of one micro-kernel block of rows at a time: its working
   set is K^T and V, L * (d + dv) floats, and MR score rows (the row-kept order, T_L = L, of the data-movement model,
   onnxopt/annotate/data_movement.py; kinds/attention/plan.py reports it), or the same for each of the model's
   blocks of keys (attn_key_blocks). */

typedef struct {
  const onnxopt_attention_desc *d;
  int lead_n;                           /* leading dims */
  int64_t lead[MAX_RANK];               /* their broadcast extents */
  int64_t st[5][MAX_RANK];              /* per tensor (q, k, v, mask, out), the leading dims' strides (0: broadcast) */
  const float *q, *k, *v;
  const char *mask;
  int64_t mask_size, mask_rs, mask_ls;  /* element bytes; row and column strides of the mask (elements) */
  float *out;
  int64_t M, L, d_, dv, rows, blocks, s_rs;
  int64_t key_block;     /* keys a kernel call (attn_key_blocks); L or more: whole rows, one call */
  int64_t q_rs, o_rs;    /* row strides */
  int64_t k_ls, k_ts;    /* strides of K between keys and between head-dim elements, in any layout */
  int64_t v_ls, v_cs;    /* strides of V between keys and between its columns */
  int amx;               /* the 16-bit kernel on AMX tiles runs (desc amx_fn, and the CPU and the OS allow it) */
  int64_t lp, dp, lk, dvp; /* its padded extents (amx.py): L to 64, d to 32, L to 32, dv to 64 */
  int failed;
  float *shared;         /* a head split into several row tasks: every head's panels, packed once (attn_pack_task) */
  size_t k_floats, v_floats; /* a head's packed K^T and V */
} attn_job;

/* K^T in panels of W keys ([d][W] each, keys past L zeros) and V in panels of W columns ([L][W] each, columns past
   dv zeros), the layouts lower.py's micro-kernel reads whole. Runs of W that are contiguous in the source (K^T with
   its keys innermost, V with its columns innermost: the usual layouts) are copied as runs. */
static void attn_pack(const attn_job *j, const float *k, const float *v, float *kp, float *vp, int64_t W) {
  int64_t L = j->L, dd = j->d_, dv = j->dv, kpanels = (L + W - 1) / W, vpanels = (dv + W - 1) / W;
  for (int64_t p = 0; p < kpanels; p++) {
    int64_t n = L - p * W < W ? L - p * W : W;
    float *dst = kp + p * dd * W;
    if (j->k_ls == 1 || n == 1) {
      for (int64_t t = 0; t < dd; t++, dst += W) {
        memcpy(dst, k + p * W * j->k_ls + t * j->k_ts, (size_t)n * sizeof(float));
        if (n < W) memset(dst + n, 0, (size_t)(W - n) * sizeof(float));
      }
    } else {
      for (int64_t c = 0; c < W; c++) {
        const float *src = k + (p * W + c) * j->k_ls;
        for (int64_t t = 0; t < dd; t++) dst[t * W + c] = c < n ? src[t * j->k_ts] : 0.0f;
      }
    }
  }
  for (int64_t p = 0; p < vpanels; p++) {
    int64_t n = dv - p * W < W ? dv - p * W : W;
    float *dst = vp + p * L * W;
    for (int64_t l = 0; l < L; l++, dst += W) {
      const float *src = v + l * j->v_ls + p * W * j->v_cs;
      if (j->v_cs == 1) {
        memcpy(dst, src, (size_t)n * sizeof(float));
      } else {
        for (int64_t c = 0; c < n; c++) dst[c] = src[c * j->v_cs];
      }
      if (n < W) memset(dst + n, 0, (size_t)(W - n) * sizeof(float));
    }
  }
}

/* float32 to float16, round to nearest even (IEEE binary16: subnormals kept, overflow to infinity). */
static uint16_t attn_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xFFu, m = x & 0x7FFFFFu;
  if (e == 0xFF) return (uint16_t)(sign | 0x7C00u | (m ? 0x200u : 0)); /* infinity, NaN (quiet) */
  int32_t exp = (int32_t)e - 112;                                        /* the float16 exponent field */
  if (exp >= 31) return (uint16_t)(sign | 0x7C00u);
  if (exp <= 0) { /* a float16 subnormal or zero: the significand with its leading bit, shifted */
    if (exp < -10) return (uint16_t)sign;
    uint32_t full = m | 0x800000u, shift = (uint32_t)(14 - exp), half = full >> shift;
    uint32_t rest = full & ((1u << shift) - 1), mid = 1u << (shift - 1);
    return (uint16_t)(sign | (half + (rest > mid || (rest == mid && (half & 1)))));
  }
  uint32_t half = (uint32_t)exp << 10 | m >> 13, rest = m & 0x1FFFu; /* a carry into the exponent is right */
  return (uint16_t)(sign | (half + (rest > 0x1000u || (rest == 0x1000u && (half & 1)))));
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* attn_f16 16 floats at a time (vcvtps2ph); returns how many it converted. Only on AVX-512 CPUs. */
__attribute__((target("avx512f"))) static int64_t attn_f16_run16(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}
#endif

/* n floats to bfloat16 (float16 where `f16`): 16 at a time on AVX-512 (the 16-bit kernels run only on AMX CPUs),
   the rest one by one. */
static void attn_row16(uint16_t *dst, const float *src, int64_t n, int f16) {
  int64_t i = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  i = f16 ? attn_f16_run16(dst, src, n) : glue_bf16_run16(dst, src, n);
#endif
  for (; i < n; i++) dst[i] = f16 ? attn_f16(src[i]) : glue_bf16(src[i]);
}

#define ATTN_ROW_PAIRS 512 /* values a task converts on its stack at once */

/* dst[i] = h(r0[i * st]) | h(r1[i * st]) << 16 for i < n, h the 16-bit rounding (bfloat16, or float16 where
   `f16`): a pair of rows interleaved, a NULL row giving zeros. Rows of elements apart are gathered first, so each
   is converted 16 values at a time. */
static void attn_pair_rows(uint32_t *dst, const float *r0, const float *r1, int64_t st, int64_t n, int f16) {
  uint16_t lo[ATTN_ROW_PAIRS], hi[ATTN_ROW_PAIRS];
  float gathered[ATTN_ROW_PAIRS];
  for (int64_t c0 = 0; c0 < n; c0 += ATTN_ROW_PAIRS) {
    int64_t m = n - c0 < ATTN_ROW_PAIRS ? n - c0 : ATTN_ROW_PAIRS;
    for (int t = 0; t < 2; t++) {
      const float *row = t ? r1 : r0;
      uint16_t *to = t ? hi : lo;
      if (!row) {
        memset(to, 0, (size_t)m * sizeof(uint16_t));
        continue;
      }
      const float *from = row + c0;
      if (st != 1) {
        for (int64_t i = 0; i < m; i++) gathered[i] = row[(c0 + i) * st];
        from = gathered;
      }
      attn_row16(to, from, m, f16);
    }
    for (int64_t i = 0; i < m; i++) dst[c0 + i] = (uint32_t)lo[i] | (uint32_t)hi[i] << 16;
  }
}

/* The 16-bit kernel's B operands, rounded to bfloat16 (float16 where amx_f16) in the tiles' pair layouts (amx.py):
   K^T as [dp / 2][lp] pairs of head-dim elements (zeros past d and L), V as [lk / 2][dvp] pairs of keys (zeros past
   L and dv), each pair one uint32 (the lower element in the low half). Rows are converted 16 values at a time: K's
   rows of head-dim elements (K [L][d], the usual layout), then spread over the pair rows; K^T's rows of keys and V's
   rows of columns as pairs of rows interleaved (attn_pair_rows). Element by element it took a quarter of the op. */
static void attn_pack16(const attn_job *j, const float *k, const float *v, uint32_t *kp, uint32_t *vp) {
  int64_t L = j->L, dd = j->d_, dv = j->dv, pairs = j->dp / 2;
  int f16 = j->d->amx_f16;
  if (j->k_ts == 1 && pairs <= ATTN_ROW_PAIRS / 2) {
    uint32_t row[ATTN_ROW_PAIRS / 2];
    memset(row, 0, sizeof row);
    for (int64_t l = 0; l < L; l++) {
      attn_row16((uint16_t *)row, k + l * j->k_ls, dd, f16);
      for (int64_t t2 = 0; t2 < pairs; t2++) kp[t2 * j->lp + l] = row[t2];
    }
  } else {
    for (int64_t t2 = 0; t2 < pairs; t2++)
      attn_pair_rows(kp + t2 * j->lp, 2 * t2 < dd ? k + 2 * t2 * j->k_ts : NULL,
                     2 * t2 + 1 < dd ? k + (2 * t2 + 1) * j->k_ts : NULL, j->k_ls, L, f16);
  }
  for (int64_t t2 = 0; t2 < pairs; t2++) memset(kp + t2 * j->lp + L, 0, (size_t)(j->lp - L) * sizeof(uint32_t));
  for (int64_t l2 = 0; l2 < j->lk / 2; l2++) {
    uint32_t *dst = vp + l2 * j->dvp;
    int64_t l = 2 * l2;
    attn_pair_rows(dst, l < L ? v + l * j->v_ls : NULL, l + 1 < L ? v + (l + 1) * j->v_ls : NULL, j->v_cs, dv,
                   f16);
    memset(dst + dv, 0, (size_t)(j->dvp - dv) * sizeof(uint32_t));
  }
}

/* Floats of the 16-bit kernel's scratch (amx.py): scores [16][lp], q16 [16][dp] and p16 [16][lp] 16-bit values,
   o [16][dvp]. */
static size_t attn_amx_scratch(const attn_job *j) { return (size_t)(16 * j->lp + 8 * j->dp + 8 * j->lp + 16 * j->dvp); }

/* The offsets of leading index li in q, k, v, the mask and the output. */
static void attn_offsets(const attn_job *j, int64_t li, int64_t off[5]) {
  int64_t rest = li;
  for (int t = 0; t < 5; t++) off[t] = 0;
  for (int i = j->lead_n - 1; i >= 0; i--) {
    int64_t x = rest % j->lead[i];
    rest /= j->lead[i];
    for (int t = 0; t < 5; t++) off[t] += x * j->st[t][i];
  }
}

/* Head li's K^T and V, packed as the kernel reads them, at kp and vp. */
static void attn_pack_head(const attn_job *j, int64_t li, float *kp, float *vp) {
  int64_t off[5];
  attn_offsets(j, li, off);
  if (j->amx)
    attn_pack16(j, j->k + off[1], j->v + off[2], (uint32_t *)kp, (uint32_t *)vp);
  else
    attn_pack(j, j->k + off[1], j->v + off[2], kp, vp, j->d->block);
}

/* With a head split into several row tasks, its panels are packed once, here, not once a task: a head of one batch
   (Chimera's G10-G12, 1 x 512..1024 rows) ran 8 tasks that each packed all of K^T and V. */
static void attn_pack_task(void *usr, size_t index) {
  attn_job *j = (attn_job *)usr;
  float *kp = j->shared + index * (j->k_floats + j->v_floats);
  attn_pack_head(j, (int64_t)index, kp, kp + j->k_floats);
}

/* The keys in blocks of key_block (the data-movement model's T_L, plan.py key_block): one kernel call a block, so
   a block's K^T and V panels stay in the core's cache for all of the task's rows instead of streaming from the
   next level for each micro-kernel block of rows. A block's output goes to scratch and is merged into `out`: a
   plain chain's partial products add up; a softmax's block outputs are each normalized by their own row max and
   sum (kept after the scores by the kernel), so they merge as the online softmax does, the earlier ones rescaled
   by exp(old max - new max). A block whose row is masked everywhere (max -inf) adds nothing; a row masked
   everywhere in every block gives what the whole-row kernel gives: zeros with nan_guard, else NaN. */
static void attn_key_blocks(const attn_job *j, const float *q, const float *kp, int64_t kp_ps, const float *vp,
                            int64_t vp_ps, const char *mask, int64_t mask_rs, float *out, int64_t rows, float *s,
                            int64_t s_rs) {
  const onnxopt_attention_desc *d = j->d;
  int64_t L = j->L, dv = j->dv, W = d->block, TL = j->key_block;
  int softmax = d->middle_softmax;
  float *stats = s + d->rows_block * s_rs, *part = stats + 2 * rows;
  float *run = part + rows * dv; /* the running max and sum a row: after the block's output */
  for (int64_t l0 = 0; l0 < L; l0 += TL) {
    int64_t n = L - l0 < TL ? L - l0 : TL;
    const char *m = mask ? mask + l0 * j->mask_size : NULL; /* a column a key (L > 1: broadcast ones expanded) */
    float *dst = l0 == 0 ? out : part;
    int64_t dst_rs = l0 == 0 ? j->o_rs : dv;
    d->fn(q, j->q_rs, kp + l0 / W * kp_ps, kp_ps, vp + l0 * W, vp_ps, m, mask_rs, dst, dst_rs, rows, n, j->d_, dv,
          s, s_rs);
    for (int64_t r = 0; r < rows; r++) {
      float *o = out + r * j->o_rs, *p = part + r * dv;
      if (!softmax) {
        if (l0) for (int64_t c = 0; c < dv; c++) o[c] += p[c];
        continue;
      }
      float bmax = stats[2 * r], bsum = stats[2 * r + 1];
      if (l0 == 0) {
        run[2 * r] = bmax;
        run[2 * r + 1] = bsum;
        continue;
      }
      if (bmax == -INFINITY) continue; /* this block's keys are all masked for the row */
      float rmax = run[2 * r], rsum = run[2 * r + 1];
      if (rmax == -INFINITY) { /* every earlier block was masked: this block's output is the row's so far */
        memcpy(o, p, (size_t)dv * sizeof(float));
        run[2 * r] = bmax;
        run[2 * r + 1] = bsum;
        continue;
      }
      float mx = rmax > bmax ? rmax : bmax;
      float a = rsum * expf(rmax - mx), b = bsum * expf(bmax - mx), inv = 1.0f / (a + b);
      a *= inv;
      b *= inv;
      for (int64_t c = 0; c < dv; c++) o[c] = a * o[c] + b * p[c];
      run[2 * r] = mx;
      run[2 * r + 1] = (rsum * expf(rmax - mx)) + (bsum * expf(bmax - mx));
    }
  }
}

static void attn_task(void *usr, size_t index) {
  attn_job *j = (attn_job *)usr;
  const onnxopt_attention_desc *d = j->d;
  int64_t li = (int64_t)index / j->blocks, r0 = ((int64_t)index % j->blocks) * j->rows;
  int64_t rows = j->M - r0 < j->rows ? j->M - r0 : j->rows;
  int64_t off[5];
  attn_offsets(j, li, off);
  int64_t L = j->L, W = d->block;
  int64_t kp_ps = j->d_ * W, vp_ps = L * W;
  int64_t s_rs = j->key_block < L ? j->key_block : j->s_rs; /* a score row: the keys of one call */
  /* the scores of one block of rows at a time, then each row's max and sum (lower.py); with key blocks, a
     block's output rows */
  size_t s_floats = (size_t)(d->rows_block * s_rs + 2 * rows);
  if (j->key_block < L) s_floats += (size_t)(rows * (j->dv + 2)); /* and the running max and sum a row */
  if (j->amx) { /* the pairs (one float's room each) and the 16-bit kernel's scratch */
    kp_ps = j->lp;
    vp_ps = j->dvp;
    s_floats = attn_amx_scratch(j);
  }
  size_t panels = j->shared ? 0 : j->k_floats + j->v_floats; /* this task's own packing */
  int expand_mask = d->mask_kind && j->mask_ls == 0 && L > 1;
  size_t scratch = s_floats + panels + (expand_mask ? (size_t)(j->mask_rs ? rows : 1) * L : 0);
  float *s = glue_floats(scratch ? scratch : 1);
  if (!s) {
    j->failed = 1;
    return;
  }
  float *kp = j->shared ? j->shared + (size_t)li * (j->k_floats + j->v_floats) : s + s_floats;
  float *vp = kp + j->k_floats;
  if (!j->shared) attn_pack_head(j, li, kp, vp);
  const char *mask = NULL;
  int64_t mask_rs = 0;
  if (d->mask_kind) {
    mask = j->mask + (off[3] + r0 * j->mask_rs) * j->mask_size;
    mask_rs = j->mask_rs;
    if (expand_mask) { /* a mask broadcast along the keys: its rows written out (floats or bytes) */
      char *e = (char *)(s + s_floats + panels);
      int64_t n_rows = j->mask_rs ? rows : 1;
      for (int64_t r = 0; r < n_rows; r++)
        for (int64_t l = 0; l < L; l++)
          memcpy(e + (r * L + l) * j->mask_size, mask + r * j->mask_rs * j->mask_size, (size_t)j->mask_size);
      mask = e;
      mask_rs = j->mask_rs ? L : 0;
    }
  }
  const float *q = j->q + off[0] + r0 * j->q_rs;
  float *out = j->out + off[4] + r0 * j->o_rs;
  if (j->key_block < L) {
    attn_key_blocks(j, q, kp, kp_ps, vp, vp_ps, mask, mask_rs, out, rows, s, s_rs);
  } else {
    int tiles = j->amx ? amx_tiles_configure() : 0; /* the bf16 kernel's tiles are named registers (amx.py) */
    (j->amx ? d->amx_fn : d->fn)(q, j->q_rs, kp, kp_ps, vp, vp_ps, mask, mask_rs, out, j->o_rs, rows, L, j->d_,
                                 j->dv, s, s_rs);
    amx_tiles_release(tiles);
  }
  glue_release(s);
}

static OrtStatus *attention_execute(const onnxopt_attention_desc *d, OrtKernelContext *ctx) {
  int64_t dims[4][MAX_RANK];
  size_t rank[4] = {0, 0, 0, 0};
  const void *data[4] = {NULL, NULL, NULL, NULL};
  int n_in = d->mask_kind ? 4 : 3;
  for (int i = 0; i < n_in; i++) {
    OrtStatus *st = glue_input(ctx, i, dims[i], &rank[i], &data[i]);
    if (st) return st;
  }
  size_t R = rank[0];
  if (R < 2 || rank[1] != R || rank[2] != R || (d->mask_kind && rank[3] > R))
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: attention inputs of ranks its kernel was not built for");
  attn_job j;
  memset(&j, 0, sizeof j);
  j.d = d;
  /* q, k, v as the chain sees them: logical dim i is dim perm[i] of the tensor in memory */
  int64_t ld[3][MAX_RANK], ls[3][MAX_RANK];
  for (int t = 0; t < 3; t++) {
    int64_t ms[MAX_RANK], stride = 1;
    for (size_t i = R; i-- > 0;) {
      ms[i] = stride;
      stride *= dims[t][i];
    }
    for (size_t i = 0; i < R; i++) {
      int p = d->has_perms ? d->perm[t][i] : (int)i;
      ld[t][i] = dims[t][p];
      ls[t][i] = ms[p];
    }
  }
  j.M = ld[0][R - 2];
  j.d_ = ld[0][R - 1];
  j.L = d->k_transposed ? ld[1][R - 1] : ld[1][R - 2];
  int64_t kd = d->k_transposed ? ld[1][R - 2] : ld[1][R - 1];
  j.dv = ld[2][R - 1];
  if (kd != j.d_ || ld[2][R - 2] != j.L)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: attention: the queries', keys' and values' dims do not agree");
  j.q_rs = ls[0][R - 2];
  j.k_ls = d->k_transposed ? ls[1][R - 1] : ls[1][R - 2];
  j.k_ts = d->k_transposed ? ls[1][R - 2] : ls[1][R - 1];
  j.v_ls = ls[2][R - 2];
  j.v_cs = ls[2][R - 1];
  if (ls[0][R - 1] != 1 && j.d_ > 1)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: attention: the queries' head dim is not innermost in memory");
  /* leading dims: broadcast between q, k, v and the mask (right-aligned) */
  j.lead_n = (int)R - 2;
  int64_t mdims[MAX_RANK];
  for (size_t i = 0; i < R; i++) mdims[i] = 1;
  if (d->mask_kind)
    for (size_t i = 0; i < rank[3]; i++) mdims[R - rank[3] + i] = dims[3][i];
  int64_t mM = mdims[R - 2], mL = mdims[R - 1];
  if ((mM != 1 && mM != j.M) || (mL != 1 && mL != j.L))
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: attention: the mask does not broadcast to the scores");
  for (int t = 0; t < 3; t++)
    for (int i = 0; i < j.lead_n; i++) j.st[t][i] = ld[t][i] == 1 ? 0 : ls[t][i];
  int64_t stride = mM * mL;
  for (int i = j.lead_n - 1; i >= 0; i--) {
    j.st[3][i] = mdims[i] == 1 ? 0 : stride;
    stride *= mdims[i];
  }
  for (int i = 0; i < j.lead_n; i++) {
    int64_t n = 1;
    for (int t = 0; t < 4; t++) {
      int64_t x = t == 3 ? mdims[i] : ld[t][i];
      if (x != 1) {
        if (n != 1 && x != n) return fail(ORT_INVALID_ARGUMENT, "onnxopt: attention: leading dims do not broadcast");
        n = x;
      }
    }
    j.lead[i] = n;
  }
  j.mask_size = d->mask_kind >= 2 ? 1 : 4;
  j.mask_rs = mM == 1 ? 0 : mL;
  j.mask_ls = mL == 1 ? 0 : 1;
  j.q = (const float *)data[0];
  j.k = (const float *)data[1];
  j.v = (const float *)data[2];
  j.mask = (const char *)data[3];
  int64_t logical[MAX_RANK], out_dims[MAX_RANK], lead_total = 1;
  for (int i = 0; i < j.lead_n; i++) {
    logical[i] = j.lead[i];
    lead_total *= j.lead[i];
  }
  logical[R - 2] = j.M;
  logical[R - 1] = j.dv;
  /* the output in memory: logical dim i is its dim perm[3][i] (the head merge's Transpose, folded) */
  for (size_t i = 0; i < R; i++) out_dims[d->has_perms ? d->perm[3][i] : (int)i] = logical[i];
  int64_t os[MAX_RANK], ostride = 1;
  for (size_t i = R; i-- > 0;) {
    os[i] = ostride;
    ostride *= out_dims[i];
  }
  for (int i = 0; i < j.lead_n; i++) j.st[4][i] = os[d->has_perms ? d->perm[3][i] : i];
  j.o_rs = os[d->has_perms ? d->perm[3][R - 2] : (int)R - 2];
  OrtValue *out;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, out_dims, R, &out));
  CHECK(API(GetTensorMutableData)(out, (void **)&j.out));
  if (lead_total == 0 || j.M == 0 || j.dv == 0) return NULL;
  j.s_rs = (j.L + d->block - 1) / d->block * d->block;
  if (j.s_rs == 0) j.s_rs = d->block;
  j.amx = d->amx_fn && j.L >= d->amx_min_keys && amx_ok(d->amx_f16 ? AMX_FP16 : AMX_BF16);
  if (j.amx) {
    j.lp = (j.L + 63) / 64 * 64;
    j.dp = (j.d_ + 31) / 32 * 32;
    j.lk = (j.L + 31) / 32 * 32;
    j.dvp = (j.dv + 63) / 64 * 64;
    j.s_rs = j.lp;
  }
  /* rows a task: all of a (batch, head)'s rows unless that leaves fewer tasks than threads to feed, in whole
     micro-kernel blocks (16 rows on the tiles); a task packs its head's K^T and V once, so fewer rows a task cost
     more packing */
  int64_t mr = j.amx ? 16 : d->rows_block, rows = j.M;
  int64_t want_blocks = (d->min_tasks + lead_total - 1) / lead_total;
  if (want_blocks > 1) {
    rows = (j.M + want_blocks - 1) / want_blocks;
    if (rows >= mr) rows = (rows + mr - 1) / mr * mr;
  }
  if (j.amx && rows < mr) rows = mr; /* a tile block computes 16 rows however few of them are kept */
  if (rows > j.M) rows = j.M;
  j.rows = rows;
  j.blocks = (j.M + rows - 1) / rows;
  /* keys a call: all of them unless a task's K^T and V panels and score rows, (d + dv + rows_block) floats a key,
     are more than key_floats (the share of a core's cache the data-movement model gives them, capacity.py) and a task
     has more than one micro-kernel block of rows to reuse them: then the most whole panels that fit, balanced
     over the blocks (plan.py key_block, the same rule, which the model's DV picks) */
  j.key_block = j.L;
  if (!j.amx && d->key_floats > 0 && j.rows > d->rows_block) {
    int64_t W = d->block, per_key = j.d_ + j.dv + d->rows_block;
    if (j.L * per_key > d->key_floats) {
      int64_t tl = d->key_floats / per_key / W * W; /* 0: not even one panel fits, blocks would not help */
      if (tl > 0) {
        int64_t nb = (j.L + tl - 1) / tl;
        tl = ((j.L + nb - 1) / nb + W - 1) / W * W;
        if (tl < j.L) j.key_block = tl;
      }
    }
  }
  int64_t W = d->block;
  j.k_floats = j.amx ? (size_t)(j.dp / 2 * j.lp) : (size_t)((j.L + W - 1) / W * j.d_ * W);
  j.v_floats = j.amx ? (size_t)(j.lk / 2 * j.dvp) : (size_t)((j.dv + W - 1) / W * j.L * W);
  if (j.blocks > 1) { /* every head's panels once, then the row tasks read them */
    j.shared = glue_floats((size_t)lead_total * (j.k_floats + j.v_floats) + 1);
    if (!j.shared) return fail(ORT_FAIL, "onnxopt: attention: out of memory for the packed keys and values");
    if (lead_total == 1) {
      attn_pack_task(&j, 0);
    } else {
      OrtStatus *st = API(KernelContext_ParallelFor)(ctx, attn_pack_task, (size_t)lead_total, 0, &j);
      if (st) {
        glue_release(j.shared);
        return st;
      }
    }
  }
  size_t tasks = (size_t)(lead_total * j.blocks);
  OrtStatus *st = NULL;
  if (tasks == 1)
    attn_task(&j, 0);
  else
    st = API(KernelContext_ParallelFor)(ctx, attn_task, tasks, 0, &j);
  glue_release(j.shared);
  if (st) return st;
  return j.failed ? fail(ORT_FAIL, "onnxopt: attention: out of memory for a task's scratch") : NULL;
}
