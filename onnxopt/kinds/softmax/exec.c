/* The softmax kind's executor: rows split into tasks of at least SOFTMAX_TASK_MIN floats over ORT's pool. */
#define SOFTMAX_TASK_MIN 16384
#define SOFTMAX_MAX_TASKS 256

typedef struct {
  softmax_rows_fn fn;
  const float *x;
  float *y;
  int64_t rows, n, per_task;
} softmax_job;

static void softmax_task(void *usr, size_t index) {
  const softmax_job *j = (const softmax_job *)usr;
  int64_t r0 = (int64_t)index * j->per_task, r1 = r0 + j->per_task;
  if (r1 > j->rows) r1 = j->rows;
  if (r0 < r1) j->fn(j->x + r0 * j->n, j->y + r0 * j->n, r1 - r0, j->n);
}

static OrtStatus *softmax_execute(const onnxopt_softmax_desc *d, OrtKernelContext *ctx) {
  const OrtValue *in;
  OrtTensorTypeAndShapeInfo *info;
  size_t rank;
  int64_t dims[MAX_RANK];
  CHECK(API(KernelContext_GetInput)(ctx, 0, &in));
  CHECK(API(GetTensorTypeAndShape)(in, &info));
  OrtStatus *st = API(GetDimensionsCount)(info, &rank);
  if (!st && (rank > MAX_RANK || (int)rank <= d->axis)) {
    API(ReleaseTensorTypeAndShapeInfo)(info);
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a softmax input of a rank its kernel was not built for");
  }
  if (!st) st = API(GetDimensions)(info, dims, rank);
  API(ReleaseTensorTypeAndShapeInfo)(info);
  if (st) return st;
  softmax_job j;
  j.fn = d->rows;
  j.rows = 1;
  j.n = 1;
  for (size_t i = 0; i < rank; i++) {
    if ((int)i < d->axis) j.rows *= dims[i];
    else j.n *= dims[i];
  }
  OrtValue *out;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, dims, rank, &out));
  CHECK(API(GetTensorMutableData)((OrtValue *)in, (void **)&j.x));
  CHECK(API(GetTensorMutableData)(out, (void **)&j.y));
  if (j.rows == 0 || j.n == 0) return NULL;
  int64_t tasks = j.rows * j.n / SOFTMAX_TASK_MIN;
  if (tasks > j.rows) tasks = j.rows;
  if (tasks > SOFTMAX_MAX_TASKS) tasks = SOFTMAX_MAX_TASKS;
  if (tasks <= 1) {
    j.fn(j.x, j.y, j.rows, j.n);
    return NULL;
  }
  j.per_task = (j.rows + tasks - 1) / tasks;
  return API(KernelContext_ParallelFor)(ctx, softmax_task, (size_t)((j.rows + j.per_task - 1) / j.per_task), 0, &j);
}
