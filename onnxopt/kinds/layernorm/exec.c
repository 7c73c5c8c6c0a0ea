/* The layernorm kind's executor: rows split into tasks of at least LAYERNORM_TASK_MIN floats over ORT's pool. */
#define LAYERNORM_TASK_MIN 16384
#define LAYERNORM_MAX_TASKS 256

typedef struct {
  layernorm_rows_fn fn;
  const float *x, *r, *gamma, *beta;
  float *y, *sum;
  int64_t rows, n, per_task;
} layernorm_job;

static void layernorm_task(void *usr, size_t index) {
  const layernorm_job *j = (const layernorm_job *)usr;
  int64_t r0 = (int64_t)index * j->per_task, r1 = r0 + j->per_task;
  if (r1 > j->rows) r1 = j->rows;
  if (r0 >= r1) return;
  int64_t at = r0 * j->n;
  j->fn(j->x + at, j->r ? j->r + at : NULL, j->gamma, j->beta, j->y + at, j->sum ? j->sum + at : NULL, r1 - r0,
        j->n);
}

static OrtStatus *layernorm_input(OrtKernelContext *ctx, int i, int64_t *dims, size_t *rank, const float **data) {
  return glue_input(ctx, i, dims, rank, (const void **)data);
}

static int64_t layernorm_count(const int64_t *dims, size_t rank) {
  int64_t n = 1;
  for (size_t i = 0; i < rank; i++) n *= dims[i];
  return n;
}

static OrtStatus *layernorm_execute(const onnxopt_layernorm_desc *d, OrtKernelContext *ctx) {
  int64_t dims[MAX_RANK], other[MAX_RANK];
  size_t rank, other_rank;
  layernorm_job j;
  memset(&j, 0, sizeof j);
  j.fn = d->rows;
  int i = 0;
  CHECK(layernorm_input(ctx, i++, dims, &rank, &j.x));
  if (rank < 1) return fail(ORT_INVALID_ARGUMENT, "onnxopt: layernorm of a scalar");
  if (d->residual) {
    CHECK(layernorm_input(ctx, i++, other, &other_rank, &j.r));
    if (other_rank != rank || memcmp(other, dims, rank * sizeof(int64_t)))
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: layernorm: the residual's shape differs from the input's");
  }
  j.n = dims[rank - 1];
  j.rows = layernorm_count(dims, rank - 1);
  CHECK(layernorm_input(ctx, i++, other, &other_rank, &j.gamma));
  if (layernorm_count(other, other_rank) != j.n)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: layernorm: the scale is not one value per element of a row");
  if (d->has_bias) {
    CHECK(layernorm_input(ctx, i++, other, &other_rank, &j.beta));
    if (layernorm_count(other, other_rank) != j.n)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: layernorm: the bias is not one value per element of a row");
  }
  OrtValue *out;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, dims, rank, &out));
  CHECK(API(GetTensorMutableData)(out, (void **)&j.y));
  if (d->sum_output) {
    CHECK(API(KernelContext_GetOutput)(ctx, 1, dims, rank, &out));
    CHECK(API(GetTensorMutableData)(out, (void **)&j.sum));
  }
  if (j.rows == 0 || j.n == 0) return NULL;
  int64_t tasks = j.rows * j.n / LAYERNORM_TASK_MIN;
  if (tasks > j.rows) tasks = j.rows;
  if (tasks > LAYERNORM_MAX_TASKS) tasks = LAYERNORM_MAX_TASKS;
  if (tasks <= 1) {
    j.per_task = j.rows;
    layernorm_task(&j, 0);
    return NULL;
  }
  j.per_task = (j.rows + tasks - 1) / tasks;
  return API(KernelContext_ParallelFor)(ctx, layernorm_task, (size_t)((j.rows + j.per_task - 1) / j.per_task), 0,
                                        &j);
}
