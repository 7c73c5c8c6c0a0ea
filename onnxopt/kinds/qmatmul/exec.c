/* The qmatmul kind's executor: A's rows (every leading dim flattened) x B's panels, split into tasks over ORT's
   pool with the least traffic (each task reads its rows of A once and its panels once; as compute_exec.c's packed
   GEMM), each task calling the tile per (panel, block of rows). */
#define QM_TASK_MIN_OPS 262144.0

typedef struct {
  const onnxopt_qmatmul_desc *d;
  qm_tile proto;
  const int32_t *fix_offsets, *fix_entries;
  const float *qscale;  /* QUANT: per column, padded to whole panels */
  const int32_t *qbias; /* QUANT with a bias: likewise */
  const int32_t *dvec;  /* has_asum: 128 - zw per column, likewise */
  int64_t rows, panels, mblocks, ptasks, mtasks;
  int64_t wide;   /* panels a task's unit of columns: wide_panels where the wide tiles run, else 1 */
  int64_t groups; /* those units: the panels in groups of `wide` */
  int64_t block; /* rows a block: 16 x amx_groups on AMX, else mr */
  int amx;       /* the AMX tiles run: the library has them and the CPU and the OS allow them (matrix_engine.c) */
} qm_job;

static void qm_task(void *usr, size_t index) {
  const qm_job *j = (const qm_job *)usr;
  const onnxopt_qmatmul_desc *d = j->d;
  int64_t pt = (int64_t)index / j->mtasks, mt = (int64_t)index % j->mtasks;
  int64_t p0 = pt * j->groups / j->ptasks * j->wide, p1 = (pt + 1) * j->groups / j->ptasks * j->wide;
  if (p1 > j->panels) p1 = j->panels;
  int64_t b0 = mt * j->mblocks / j->mtasks, b1 = (mt + 1) * j->mblocks / j->mtasks;
  int64_t r0 = b0 * j->block, r1 = b1 * j->block < j->rows ? b1 * j->block : j->rows;
  int64_t wide = j->wide;
  qm_tile t = j->proto;
  const int8_t *b = t.b;
  const int32_t *colsum = t.colsum;
  for (int64_t p = p0; p < p1;) {
    int64_t np = p + wide <= p1 ? wide : 1;
    t.b = b + p * d->k * d->panel;
    t.colsum = colsum + p * d->panel;
    if (j->qscale) t.qscale = j->qscale + p * d->panel;
    if (j->qbias) t.qbias = j->qbias + p * d->panel;
    if (j->dvec) t.dvec = j->dvec + p * d->panel;
    t.n0 = p * d->panel;
    t.ncols = d->n - t.n0 < np * d->panel ? d->n - t.n0 : np * d->panel;
    if (j->fix_offsets) {
      t.fix = j->fix_entries + 3 * (int64_t)j->fix_offsets[p];
      t.nfix = j->fix_offsets[p + np] - j->fix_offsets[p];
      t.fix_offsets = j->fix_offsets + p;
    }
    if (np > 1) {
      /* the rows in tiles of nearly equal height (32 rows: 6, 6, 5, 5, 5, 5 rather than five of 6 and one of 2,
         whose 8 accumulators keep too few dot products in flight) */
      int64_t count = (r1 - r0 + d->wide_rows - 1) / d->wide_rows;
      for (int64_t i = 0, m = r0; i < count; i++) {
        int64_t n = (r1 - r0) / count + (i < (r1 - r0) % count);
        t.m0 = m;
        d->wide[n - 1]((const int64_t *)&t);
        m += n;
      }
      p += np;
      continue;
    }
    for (int64_t mb = b0; mb < b1; mb++) {
      t.m0 = mb * j->block;
      int64_t mi = j->rows - t.m0 < j->block ? j->rows - t.m0 : j->block;
      if (j->amx && mi >= 16) { /* whole groups of 16 rows on AMX, the rest on the dot-product tiles */
        int64_t g = mi / 16;
        d->amx_tiles[g - 1]((const int64_t *)&t);
        t.m0 += 16 * g;
        mi -= 16 * g;
      }
      while (mi > 0) {
        int64_t n = mi < d->mr ? mi : d->mr;
        d->tiles[n - 1]((const int64_t *)&t);
        t.m0 += n;
        mi -= n;
      }
    }
    p++;
  }
}

/* Panels x row blocks in tasks (runtime.c grid_split): A is read once per panel range, B once per row range. */
static void qm_plan(qm_job *j) {
  double ops = 2.0 * (double)j->rows * (double)j->d->n * (double)j->d->k;
  grid_split(ops, QM_TASK_MIN_OPS, j->d->tasks, j->groups, j->mblocks, (double)j->rows, (double)j->d->n, &j->ptasks,
             &j->mtasks);
}

/* The call's tasks: the row blocks (AMX's where it runs) and the grid of panels x blocks (qm_plan), on ORT's pool. */
static OrtStatus *qm_run(qm_job *j, OrtKernelContext *ctx) {
  const onnxopt_qmatmul_desc *d = j->d;
  j->panels = (d->n + d->panel - 1) / d->panel;
  j->amx = d->amx_groups > 0 && amx_ok(AMX_INT8);
  j->block = j->amx ? 16 * (int64_t)d->amx_groups : d->mr;
  /* the wide tiles (lower.py wide_shape) take wide_panels panels at once, so tasks get whole groups of them; not
     with AMX, whose blocks are one panel wide */
  j->wide = d->wide_panels > 0 && !j->amx ? d->wide_panels : 1;
  j->groups = (j->panels + j->wide - 1) / j->wide;
  j->mblocks = (j->rows + j->block - 1) / j->block;
  qm_plan(j);
  int64_t tasks = j->ptasks * j->mtasks;
  if (tasks == 1) {
    qm_task(j, 0);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, qm_task, (size_t)tasks, 0, j);
}

static OrtStatus *qmatmul_execute(const onnxopt_qmatmul_desc *d, OrtKernelContext *ctx) {
  int64_t dims[MAX_RANK], other[MAX_RANK];
  size_t rank, other_rank;
  const void *data;
  qm_job j;
  memset(&j, 0, sizeof j);
  j.d = d;
  int in = 0;
  CHECK(glue_input(ctx, in++, dims, &rank, &data));
  if (rank < 2 || dims[rank - 1] != d->k)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: qmatmul: A's last dim is not the K the kernel was built for");
  j.proto.a = (const uint8_t *)data;
  j.proto.a_rs = d->k;
  j.rows = 1;
  for (size_t i = 0; i + 1 < rank; i++) j.rows *= dims[i];
  if (d->has_azp) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.azp = *(const uint8_t *)data;
  }
  CHECK(glue_input(ctx, in++, other, &other_rank, &data));
  j.proto.b = (const int8_t *)data;
  CHECK(glue_input(ctx, in++, other, &other_rank, &data));
  j.proto.colsum = (const int32_t *)data;
  if (d->has_fix) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.fix_offsets = (const int32_t *)data;
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.fix_entries = (const int32_t *)data;
    in += 2; /* the fallback's ScatterND tables */
  }
  if (d->mode == 1) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.qscale = (const float *)data;
    if (d->has_bias) {
      CHECK(glue_input(ctx, in++, other, &other_rank, &data));
      j.qbias = (const int32_t *)data;
    }
    if (d->has_asum) {
      CHECK(glue_input(ctx, in++, other, &other_rank, &data));
      j.dvec = (const int32_t *)data;
      in++; /* the fallback's zero point */
    }
  }
  j.proto.k4 = d->k / 4;
  j.proto.ldc = d->n;
  for (int e = 0; e < d->n_extra; e++) {
    CHECK(glue_input(ctx, in++, other, &other_rank, &data));
    j.proto.extra[e] = (const float *)data;
    int64_t count = 1;
    for (size_t i = 0; i < other_rank; i++) count *= other[i];
    int kind = d->extra_kind[e];
    int64_t per_row = kind == 0 ? d->n : 1; /* POSITION: a row of N; CHANNEL: one value a row */
    if (kind == 0 || kind == 1) {
      if (count == 0 || count % per_row || (j.rows % (count / per_row)))
        return fail(ORT_INVALID_ARGUMENT, "onnxopt: qmatmul: an epilogue input does not broadcast over the rows");
      j.proto.extra_rows[e] = count / per_row;
    } else {
      j.proto.extra_rows[e] = 1;
    }
  }
  dims[rank - 1] = d->n;
  for (int o = 0; o < d->sig.n_out; o++) {
    OrtValue *out;
    CHECK(API(KernelContext_GetOutput)(ctx, o, dims, rank, &out));
    CHECK(API(GetTensorMutableData)(out, (void **)&j.proto.out[o]));
  }
  if (j.rows == 0 || d->n == 0) return NULL;
  int32_t *asum = NULL;
  if (d->has_asum) { /* each row's sum of a - za, for the tiles' row term: one pass over A */
    asum = (int32_t *)malloc((size_t)j.rows * sizeof(int32_t));
    if (!asum) return fail(ORT_FAIL, "onnxopt: qmatmul: out of memory for the row sums");
    for (int64_t r = 0; r < j.rows; r++) {
      const uint8_t *row = j.proto.a + r * j.proto.a_rs;
      int32_t sum = 0;
      for (int64_t k = 0; k < d->k; k++) sum += row[k];
      asum[r] = sum - (int32_t)d->k * (int32_t)j.proto.azp;
    }
    j.proto.asum = asum;
  }
  OrtStatus *status = qm_run(&j, ctx);
  free(asum);
  return status;
}
