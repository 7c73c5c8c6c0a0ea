/* ---- Copies of blocked tensors: Concat along the channel blocks, each input optionally repeated (nearest);
 * plain Concats (lanes 0) of float or int8 tensors along any axis; and Slices with unit steps (cp_slice). ----
 *
 * The copy kind's executor (codegen/glue/kinds.py). Inputs k are [N, CB_k, H / fh_k, W / fw_k, L]; the
 * output is [N, sum CB_k, H, W, L]. An output row (n, block, oh) is input k's row oh / fh_k with every pixel (one
 * vector of L channels) written fw_k times: a memcpy when fw_k is 1. Without repeats, the output is each input's
 * contiguous [CB_k, H, W, L] per batch item, copied in equal spans over the threads. onnxruntime runs the same on
 * the 5-D blocked tensors as Concat and Reshape -> Expand -> Reshape (fusion/blocked_passthrough.py), one pass
 * each; here it is one pass over the output (UNet's up-blocks, YOLO's necks, Inception's Concats). A copy slower
 * than onnxruntime's is rejected and the passthrough nodes run instead (fusion/blocked_copy.py).
 */

#define CP_TASK_MIN_FLOATS 16384 /* floats written per task, at least */
/* The descriptor's schedule (codegen/copy/desc.py, the copy kind's space in onnxopt/kinds/builtin.py): at most
   d->max_tasks tasks, and one thread below d->inline_floats floats written. */

typedef struct {
  const onnxopt_copy_desc *d;
  int n_in;
  const uint8_t *in[CP_MAX_IN];
  int64_t cb[CP_MAX_IN], first[CP_MAX_IN]; /* blocks of each input; the output block its first one lands in */
  int64_t N, CB, H, W, L;                  /* in elements of es bytes */
  int64_t es;
  uint8_t *out;
  int64_t rows, tasks;
} cp_job;

/* One pixel vector (of floats: blocked tensors are float32) written `times` times: a fixed-size copy for the usual
   lane counts, which the compiler inlines. */
static void cp_repeat_row(float *dst, const float *src, int64_t w, int64_t times, int64_t L) {
  if (times == 1) {
    if (dst != src) memcpy(dst, src, (size_t)(w * L) * sizeof(float)); /* equal: written in place (a view) */
    return;
  }
  if (L == 1 && times == 2) { /* an NCHW Resize (lanes 1) by 2, the usual factor: a loop the compiler vectorizes */
    for (int64_t i = 0; i < w; i++) {
      dst[2 * i] = src[i];
      dst[2 * i + 1] = src[i];
    }
  } else if (L == 1) {
    for (int64_t i = 0; i < w; i++)
      for (int64_t r = 0; r < times; r++) *dst++ = src[i];
  } else if (L == 16) {
    for (int64_t i = 0; i < w; i++, src += 16)
      for (int64_t r = 0; r < times; r++, dst += 16) memcpy(dst, src, 16 * sizeof(float));
  } else if (L == 8) {
    for (int64_t i = 0; i < w; i++, src += 8)
      for (int64_t r = 0; r < times; r++, dst += 8) memcpy(dst, src, 8 * sizeof(float));
  } else {
    for (int64_t i = 0; i < w; i++, src += L)
      for (int64_t r = 0; r < times; r++, dst += L) memcpy(dst, src, (size_t)L * sizeof(float));
  }
}

static void cp_run_task(void *usr, size_t task) {
  const cp_job *j = (const cp_job *)usr;
  const onnxopt_copy_desc *d = j->d;
  int64_t r0 = (int64_t)task * j->rows / j->tasks, r1 = ((int64_t)task + 1) * j->rows / j->tasks;
  int64_t row_floats = j->W * j->L;
  for (int64_t row = r0; row < r1; row++) {
    int64_t oh = row % j->H, nb = row / j->H, b = nb % j->CB, n = nb / j->CB;
    int k = 0;
    while (k + 1 < j->n_in && b >= j->first[k + 1]) k++;
    float *dst = (float *)j->out + row * row_floats;
    if (oh % d->fh[k] && row > r0) { /* a repeated row: the one this task just wrote */
      memcpy(dst, dst - row_floats, (size_t)row_floats * sizeof(float));
      continue;
    }
    int64_t h = j->H / d->fh[k], w = j->W / d->fw[k];
    const float *src =
        (const float *)j->in[k] + ((n * j->cb[k] + (b - j->first[k])) * h + oh / d->fh[k]) * w * j->L;
    cp_repeat_row(dst, src, w, d->fw[k], j->L);
  }
}

/* Without repeats: run `task` of the per-(item, input) contiguous pieces, cut into j->tasks equal spans of the
   output. */
static void cp_run_span(void *usr, size_t task) {
  const cp_job *j = (const cp_job *)usr;
  int64_t plane = j->H * j->W * j->L, item = j->CB * plane, total = j->N * item;
  int64_t o0 = (int64_t)task * total / j->tasks, o1 = ((int64_t)task + 1) * total / j->tasks;
  while (o0 < o1) {
    int64_t n = o0 / item, off = o0 % item, b = off / plane;
    int k = 0;
    while (k + 1 < j->n_in && b >= j->first[k + 1]) k++;
    int64_t piece_end = (j->first[k] + j->cb[k]) * plane; /* end of input k's part of item n */
    int64_t len = piece_end - off < o1 - o0 ? piece_end - off : o1 - o0;
    const uint8_t *src = j->in[k] + (n * j->cb[k] * plane + (off - j->first[k] * plane)) * j->es;
    uint8_t *dst = j->out + o0 * j->es;
    if (src != dst) memcpy(dst, src, (size_t)(len * j->es)); /* else written in place */
    o0 += len;
  }
}

/* The split into tasks and the run, once the job's sizes are set. */
static OrtStatus *cp_run(cp_job *j, OrtKernelContext *ctx) {
  j->rows = j->N * j->CB * j->H;
  if (j->rows == 0 || j->W == 0) return NULL;
  int64_t total = j->rows * j->W * j->L;
  j->tasks = total / CP_TASK_MIN_FLOATS;
  if (j->tasks > j->d->max_tasks) j->tasks = j->d->max_tasks;
  if (j->tasks > j->rows) j->tasks = j->rows;
  if (j->tasks < 1) j->tasks = 1;
  int repeats = 0;
  for (int k = 0; k < j->n_in; k++) repeats |= j->d->fh[k] != 1 || j->d->fw[k] != 1;
  void (*run)(void *, size_t) = repeats ? cp_run_task : cp_run_span;
  if (total < j->d->inline_floats || j->tasks == 1) {
    j->tasks = 1;
    run(j, 0);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, run, (size_t)j->tasks, 0, j);
}

/* A plain Concat along d->axis: the blocked copy without repeats, with N the product of the dims before the axis,
   a "block" one index along it, and a "row" (W, with H = L = 1) everything after it. */
static OrtStatus *cp_plain(const onnxopt_copy_desc *d, OrtKernelContext *ctx, cp_job *j) {
  int64_t od[MAX_RANK];
  size_t orank = 0;
  for (int k = 0; k < j->n_in; k++) {
    const OrtValue *v;
    int64_t dims[MAX_RANK];
    size_t rank;
    CHECK(ct_dims(ctx, (size_t)k, &v, dims, &rank));
    if ((size_t)d->axis >= rank) return fail(ORT_INVALID_ARGUMENT, "onnxopt: a Concat's input has no such axis");
    if (k == 0) {
      orank = rank;
      memcpy(od, dims, rank * sizeof(int64_t));
      od[d->axis] = 0;
    } else {
      int same = rank == orank;
      for (size_t a = 0; same && a < rank; a++) same = (int)a == d->axis || dims[a] == od[a];
      if (!same) return fail(ORT_INVALID_ARGUMENT, "onnxopt: a Concat's inputs differ off the axis");
    }
    j->cb[k] = dims[d->axis];
    j->first[k] = od[d->axis];
    od[d->axis] += dims[d->axis];
    CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&j->in[k]));
  }
  j->N = 1;
  j->W = 1;
  for (int a = 0; a < d->axis; a++) j->N *= od[a];
  for (size_t a = (size_t)d->axis + 1; a < orank; a++) j->W *= od[a];
  j->CB = od[d->axis];
  j->H = 1;
  j->L = 1;
  OrtValue *ov;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, od, orank, &ov));
  CHECK(API(GetTensorMutableData)(ov, (void **)&j->out));
  return cp_run(j, ctx);
}

/* A Slice with unit steps (fusion/blocked_copy.py, plain_slices): the box [start, end) of a tensor with the
   planned dims, copied as runs along the last axis, the runs split over the threads. Its point is less the copy
   than where it runs: an onnxruntime Slice between two of our kernels ends a sequence (NASNet-A's crops after its
   factorized reductions' convolutions). */
typedef struct {
  const onnxopt_copy_desc *d;
  const float *in;
  float *out;
  int64_t runs, run, tasks;
  int64_t in_stride[MAX_RANK], out_dims[MAX_RANK];
} cp_slice_job;

static void cp_slice_task(void *usr, size_t task) {
  const cp_slice_job *j = (const cp_slice_job *)usr;
  const onnxopt_copy_desc *d = j->d;
  int r = d->slice_rank;
  int64_t r0 = (int64_t)task * j->runs / j->tasks, r1 = ((int64_t)task + 1) * j->runs / j->tasks;
  for (int64_t q = r0; q < r1; q++) { /* run q: the output index of every axis but the last, row-major */
    int64_t rest = q, off = d->slice_start[r - 1];
    for (int a = r - 2; a >= 0; a--) {
      off += (rest % j->out_dims[a] + d->slice_start[a]) * j->in_stride[a];
      rest /= j->out_dims[a];
    }
    float *dst = j->out + q * j->run;
    if (dst != j->in + off) memcpy(dst, j->in + off, (size_t)j->run * sizeof(float));
  }
}

static OrtStatus *cp_slice(const onnxopt_copy_desc *d, OrtKernelContext *ctx) {
  const OrtValue *v;
  int64_t dims[MAX_RANK];
  size_t rank;
  CHECK(ct_dims(ctx, 0, &v, dims, &rank));
  int same = (int)rank == d->slice_rank;
  for (size_t a = 0; same && a < rank; a++) same = dims[a] == d->slice_dims[a];
  if (!same)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a Slice's input has other dims than the ones it was built for; "
                                      "re-run onnxopt with --input-shape for them, or with --skip-fusion copy");
  cp_slice_job j;
  memset(&j, 0, sizeof(j));
  j.d = d;
  int64_t s = 1, total = 1;
  for (int a = d->slice_rank - 1; a >= 0; a--) {
    j.in_stride[a] = s;
    s *= dims[a];
    j.out_dims[a] = d->slice_end[a] - d->slice_start[a];
    total *= j.out_dims[a];
  }
  OrtValue *ov;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, j.out_dims, rank, &ov));
  CHECK(API(GetTensorMutableData)(ov, (void **)&j.out));
  if (total == 0) return NULL;
  CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&j.in));
  j.run = j.out_dims[d->slice_rank - 1];
  j.runs = total / j.run;
  j.tasks = total / CP_TASK_MIN_FLOATS;
  if (j.tasks > d->max_tasks) j.tasks = d->max_tasks;
  if (j.tasks > j.runs) j.tasks = j.runs;
  if (total < d->inline_floats || j.tasks < 2) {
    j.tasks = 1;
    cp_slice_task(&j, 0);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, cp_slice_task, (size_t)j.tasks, 0, &j);
}

/* A Split along d->axis (fusion/blocked_copy.py split_copies, plain_splits): output k is the input's part
   [first_k, first_k + split_k) along the axis. With N the product of the dims before the axis and `inner` that of
   those after it, the input is N items of (sum split_k) x inner elements, and each output's part of an item is one
   contiguous run: the runs are cut into equal spans of the input over the threads (cp_run_span in reverse). */
typedef struct {
  const onnxopt_copy_desc *d;
  const uint8_t *in;
  uint8_t *out[CP_MAX_IN];
  int64_t first[CP_MAX_IN + 1]; /* along the axis; first[count] = the axis' length */
  int64_t N, inner, es, tasks;
} cp_split_job;

static void cp_split_task(void *usr, size_t task) {
  const cp_split_job *j = (const cp_split_job *)usr;
  int count = j->d->split_count;
  int64_t item = j->first[count] * j->inner, total = j->N * item;
  int64_t o0 = (int64_t)task * total / j->tasks, o1 = ((int64_t)task + 1) * total / j->tasks;
  while (o0 < o1) {
    int64_t n = o0 / item, a = (o0 % item) / j->inner;
    int k = 0;
    while (k + 1 < count && a >= j->first[k + 1]) k++;
    int64_t part = (j->first[k + 1] - j->first[k]) * j->inner, at = o0 % item - j->first[k] * j->inner;
    int64_t len = part - at < o1 - o0 ? part - at : o1 - o0;
    uint8_t *dst = j->out[k] + (n * part + at) * j->es;
    const uint8_t *src = j->in + o0 * j->es;
    if (dst != src) memcpy(dst, src, (size_t)(len * j->es)); /* else a view of the input (in place) */
    o0 += len;
  }
}

static OrtStatus *cp_split(const onnxopt_copy_desc *d, OrtKernelContext *ctx) {
  const OrtValue *v;
  int64_t dims[MAX_RANK];
  size_t rank;
  CHECK(ct_dims(ctx, 0, &v, dims, &rank));
  if ((size_t)d->axis >= rank) return fail(ORT_INVALID_ARGUMENT, "onnxopt: a Split's input has no such axis");
  cp_split_job j;
  memset(&j, 0, sizeof(j));
  j.d = d;
  j.es = d->elem;
  for (int k = 0; k < d->split_count; k++) j.first[k + 1] = j.first[k] + d->split[k];
  if (j.first[d->split_count] != dims[d->axis])
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a Split's input has another length along its axis than the one it "
                                      "was built for; re-run onnxopt with --input-shape for it, or with "
                                      "--skip-fusion copy");
  j.N = 1;
  j.inner = 1;
  for (int a = 0; a < d->axis; a++) j.N *= dims[a];
  for (size_t a = (size_t)d->axis + 1; a < rank; a++) j.inner *= dims[a];
  CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&j.in));
  for (int k = 0; k < d->split_count; k++) {
    int64_t od[MAX_RANK];
    memcpy(od, dims, rank * sizeof(int64_t));
    od[d->axis] = d->split[k];
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, (size_t)k, od, rank, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&j.out[k]));
  }
  int64_t total = j.N * j.first[d->split_count] * j.inner;
  if (total == 0) return NULL;
  j.tasks = total * j.es / 4 / CP_TASK_MIN_FLOATS;
  if (j.tasks > d->max_tasks) j.tasks = d->max_tasks;
  if (total * j.es / 4 < d->inline_floats || j.tasks < 2) {
    j.tasks = 1;
    cp_split_task(&j, 0);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, cp_split_task, (size_t)j.tasks, 0, &j);
}

static OrtStatus *cp_compute(const onnxopt_copy_desc *d, OrtKernelContext *ctx) {
  if (d->slice_rank) return cp_slice(d, ctx);
  if (d->split_count) return cp_split(d, ctx);
  cp_job j;
  memset(&j, 0, sizeof(j));
  j.d = d;
  j.n_in = d->sig.n_in;
  j.L = d->lanes;
  j.es = d->elem;
  if (j.n_in < 1 || j.n_in > CP_MAX_IN) return fail(ORT_INVALID_ARGUMENT, "onnxopt: a copy op has 1 to 16 inputs");
  if (d->lanes == 0) return cp_plain(d, ctx, &j);
  size_t out_rank = 5; /* lanes 1: NCHW tensors, read as [N, C, H, W, 1] */
  for (int k = 0; k < j.n_in; k++) {
    const OrtValue *v;
    int64_t dims[MAX_RANK];
    size_t rank;
    CHECK(ct_dims(ctx, (size_t)k, &v, dims, &rank));
    int nchw = j.L == 1 && rank == 4;
    if (nchw) {
      dims[4] = 1;
      out_rank = 4;
    }
    if ((rank != 5 && !nchw) || dims[4] != j.L)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: a blocked copy's input is not [N, C / L, H, W, L]");
    int64_t H = dims[2] * d->fh[k], W = dims[3] * d->fw[k];
    if (k == 0) {
      j.N = dims[0];
      j.H = H;
      j.W = W;
    } else if (dims[0] != j.N || H != j.H || W != j.W) {
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: a blocked copy's inputs do not give one output size");
    }
    j.cb[k] = dims[1];
    j.first[k] = j.CB;
    j.CB += dims[1];
    CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&j.in[k]));
  }
  int64_t od[5] = {j.N, j.CB, j.H, j.W, j.L};
  OrtValue *ov;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, od, out_rank, &ov));
  CHECK(API(GetTensorMutableData)(ov, (void **)&j.out));
  return cp_run(&j, ctx);
}
