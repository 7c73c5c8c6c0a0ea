/* ---- Elementwise ops: the elementwise kind's executor (codegen/glue/kinds.py). ---- */
/* Broadcast, coalesce, split into chunks of rows. */

typedef struct {
  const onnxopt_ew_desc *d;
  int nd;                        /* coalesced rank, >= 1 */
  int64_t dims[MAX_RANK];        /* coalesced output dims; dims[nd-1] is the row length */
  int64_t strides[MAX_ARGS][MAX_RANK]; /* per input, in elements (0: broadcast) */
  int64_t inner[MAX_ARGS];       /* per input, stride along the row (0 or 1) */
  char *in_base[MAX_ARGS];
  char *out_base[MAX_ARGS];
  int64_t total, chunk;
  row_fn row;                    /* NULL: use generic */
} ew_job;

static void ew_run_range(const ew_job *job, int64_t e0, int64_t e1) {
  const onnxopt_ew_desc *d = job->d;
  const int64_t L = job->dims[job->nd - 1];
  void *ins[MAX_ARGS], *outs[MAX_ARGS];
  int64_t e = e0;
  while (e < e1) {
    int64_t row = e / L, col = e % L;
    int64_t n = L - col;
    if (n > e1 - e) n = e1 - e;
    for (int i = 0; i < d->sig.n_in; i++) {
      int64_t off = 0, r = row;
      for (int j = job->nd - 2; j >= 0; j--) {
        off += (r % job->dims[j]) * job->strides[i][j];
        r /= job->dims[j];
      }
      off += col * job->inner[i];
      ins[i] = job->in_base[i] + off * d->in_sizes[i];
    }
    for (int k = 0; k < d->sig.n_out; k++) outs[k] = job->out_base[k] + e * d->out_sizes[k];
    if (job->row)
      job->row(ins, outs, n);
    else
      d->generic(ins, outs, n, job->inner);
    e += n;
  }
}

static void ew_chunk(void *usr, size_t index) {
  const ew_job *job = (const ew_job *)usr;
  int64_t e0 = (int64_t)index * job->chunk;
  int64_t e1 = e0 + job->chunk;
  if (e1 > job->total) e1 = job->total;
  ew_run_range(job, e0, e1);
}


static OrtStatus *ew_compute(const onnxopt_ew_desc *d, OrtKernelContext *ctx) {
  ew_job job;
  int64_t in_dims[MAX_ARGS][MAX_RANK];
  size_t in_rank[MAX_ARGS];
  if (d->sig.n_in > MAX_ARGS || d->sig.n_out > MAX_ARGS) return fail(ORT_FAIL, "onnxopt: too many arguments");
  memset(&job, 0, sizeof(job));
  job.d = d;
  size_t R = (size_t)d->out_rank;
  for (int i = 0; i < d->sig.n_in; i++) {
    const OrtValue *v;
    OrtTensorTypeAndShapeInfo *info;
    CHECK(API(KernelContext_GetInput)(ctx, (size_t)i, &v));
    CHECK(API(GetTensorTypeAndShape)(v, &info));
    OrtStatus *st = API(GetDimensionsCount)(info, &in_rank[i]);
    if (!st && in_rank[i] > MAX_RANK) st = fail(ORT_INVALID_ARGUMENT, "onnxopt: tensor rank above 12");
    if (!st) st = API(GetDimensions)(info, in_dims[i], in_rank[i]);
    API(ReleaseTensorTypeAndShapeInfo)(info);
    if (st) return st;
    CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&job.in_base[i]));
    if (in_rank[i] > R) R = in_rank[i];
  }
  if (R > MAX_RANK) return fail(ORT_INVALID_ARGUMENT, "onnxopt: tensor rank above 12");

  /* numpy broadcasting of the inputs (scalars folded into the code only add leading 1s, covered by out_rank). */
  int64_t out[MAX_RANK];
  for (size_t j = 0; j < R; j++) {
    int64_t o = 1;
    for (int i = 0; i < d->sig.n_in; i++) {
      size_t lead = R - in_rank[i];
      int64_t dim = j >= lead ? in_dims[i][j - lead] : 1;
      if (dim == 1) continue;
      if (o == 1)
        o = dim;
      else if (o != dim)
        return fail(ORT_INVALID_ARGUMENT, "onnxopt: input shapes cannot be broadcast together");
    }
    out[j] = o;
  }
  /* Every output is written with the full iteration shape. The optimizer proved that statically, sometimes by
     assuming two symbolic dims equal; if these inputs break the assumption, say so instead of computing garbage. */
  for (int k = 0; k < d->sig.n_out; k++) {
    for (size_t j = 0; j < R; j++) {
      int64_t o = 1;
      for (int i = 0; i < d->sig.n_in; i++) {
        if (!((d->out_deps[k] >> i) & 1u)) continue;
        size_t lead = R - in_rank[i];
        int64_t dim = j >= lead ? in_dims[i][j - lead] : 1;
        if (dim != 1) o = dim;
      }
      if (o != out[j])
        return fail(ORT_INVALID_ARGUMENT, "onnxopt: these input shapes give a fused output a different shape than "
                                          "the kernel was built for; re-run onnxopt with --input-shape for them, "
                                          "or with --skip-fusion elementwise");
    }
  }
  int64_t total = 1;
  for (size_t j = 0; j < R; j++) total *= out[j];
  for (int k = 0; k < d->sig.n_out; k++) {
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, (size_t)k, out, R, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&job.out_base[k]));
  }
  if (total == 0) return NULL;

  /* Per-input strides in elements over the output's dims (0 where the input is broadcast). */
  int64_t st[MAX_ARGS][MAX_RANK];
  for (int i = 0; i < d->sig.n_in; i++) {
    size_t lead = R - in_rank[i];
    int64_t s = 1;
    for (size_t jj = R; jj-- > 0;) {
      int64_t dim = jj >= lead ? in_dims[i][jj - lead] : 1;
      st[i][jj] = dim == 1 ? 0 : s;
      s *= dim;
    }
  }
  /* Drop size-1 dims, then merge neighbours wherever every input is contiguous across them. */
  int nd = 0;
  for (size_t j = 0; j < R; j++) {
    if (out[j] == 1) continue;
    job.dims[nd] = out[j];
    for (int i = 0; i < d->sig.n_in; i++) job.strides[i][nd] = st[i][j];
    nd++;
  }
  if (nd == 0) {
    nd = 1;
    job.dims[0] = 1;
    for (int i = 0; i < d->sig.n_in; i++) job.strides[i][0] = 0;
  }
  int m = nd - 1; /* merge from the innermost dim outwards into a compacted list */
  int64_t cd[MAX_RANK], cs[MAX_ARGS][MAX_RANK];
  int nc = 0;
  cd[0] = job.dims[m];
  for (int i = 0; i < d->sig.n_in; i++) cs[i][0] = job.strides[i][m];
  nc = 1;
  for (int j = m - 1; j >= 0; j--) {
    int mergeable = 1;
    for (int i = 0; i < d->sig.n_in; i++)
      if (job.strides[i][j] != cs[i][nc - 1] * cd[nc - 1]) mergeable = 0;
    if (mergeable) {
      cd[nc - 1] *= job.dims[j];
    } else {
      cd[nc] = job.dims[j];
      for (int i = 0; i < d->sig.n_in; i++) cs[i][nc] = job.strides[i][j];
      nc++;
    }
  }
  job.nd = nc;
  for (int j = 0; j < nc; j++) {
    job.dims[j] = cd[nc - 1 - j];
    for (int i = 0; i < d->sig.n_in; i++) job.strides[i][j] = cs[i][nc - 1 - j];
  }
  uint32_t mask = 0;
  for (int i = 0; i < d->sig.n_in; i++) {
    job.inner[i] = job.strides[i][nc - 1];
    if (job.inner[i] != 0) mask |= 1u << i;
  }
  job.row = NULL;
  for (int v = 0; v < d->n_variants; v++)
    if (d->variant_masks[v] == mask) job.row = d->variants[v];
  job.total = total;

  if (total < d->parallel_min) {
    ew_run_range(&job, 0, total);
    return NULL;
  }
  int64_t chunk = total / MAX_CHUNKS;
  if (chunk < CHUNK_MIN_ELEMENTS) chunk = CHUNK_MIN_ELEMENTS;
  chunk = (chunk + 63) & ~(int64_t)63; /* whole cache lines per chunk */
  job.chunk = chunk;
  size_t n_chunks = (size_t)((total + chunk - 1) / chunk);
  return API(KernelContext_ParallelFor)(ctx, ew_chunk, n_chunks, 0, &job);
}

