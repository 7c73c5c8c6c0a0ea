/* The softmax kind's executor: tasks of at least SOFTMAX_TASK_MIN floats over ORT's pool. Rows go whole to a task;
   columns are cut into runs of whole vectors (SOFTMAX_COLUMN_STEP), so an outer slice with one long run of columns
   (YOLOv8's [1, 16, 4, 2100] at axis 1) still spreads over the threads. */
#define SOFTMAX_TASK_MIN 16384
#define SOFTMAX_MAX_TASKS 256
#define SOFTMAX_COLUMN_STEP 64

typedef struct {
  softmax_rows_fn fn;
  const float *x;
  float *y;
  int64_t rows, n, per_task;          /* rows: whole rows of n floats */
  int64_t outer, inner, pieces, cols; /* columns: outer slices of n x inner, each in `pieces` runs of `cols` */
} softmax_job;

static void softmax_task(void *usr, size_t index) {
  const softmax_job *j = (const softmax_job *)usr;
  int64_t r0 = (int64_t)index * j->per_task, r1 = r0 + j->per_task;
  if (r1 > j->rows) r1 = j->rows;
  if (r0 < r1) j->fn(j->x + r0 * j->n, j->y + r0 * j->n, r1 - r0, j->n, 1);
}

/* Task `index` runs `per_task` consecutive (outer slice, run of columns) pairs. */
static void softmax_columns_task(void *usr, size_t index) {
  const softmax_job *j = (const softmax_job *)usr;
  int64_t t0 = (int64_t)index * j->per_task, t1 = t0 + j->per_task, total = j->outer * j->pieces;
  if (t1 > total) t1 = total;
  for (int64_t t = t0; t < t1; t++) {
    int64_t o = t / j->pieces, c0 = (t % j->pieces) * j->cols, count = j->inner - c0;
    if (count > j->cols) count = j->cols;
    int64_t at = o * j->n * j->inner + c0;
    j->fn(j->x + at, j->y + at, count, j->n, j->inner);
  }
}

static int64_t softmax_tasks(int64_t floats, int64_t most) {
  int64_t tasks = floats / SOFTMAX_TASK_MIN;
  if (tasks > most) tasks = most;
  if (tasks > SOFTMAX_MAX_TASKS) tasks = SOFTMAX_MAX_TASKS;
  return tasks < 1 ? 1 : tasks;
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
  j.inner = 1;
  for (size_t i = 0; i < rank; i++) {
    if ((int)i < d->axis) j.rows *= dims[i];
    else if ((int)i == d->axis || !d->columns) j.n *= dims[i];
    else j.inner *= dims[i];
  }
  OrtValue *out;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, dims, rank, &out));
  CHECK(API(GetTensorMutableData)((OrtValue *)in, (void **)&j.x));
  CHECK(API(GetTensorMutableData)(out, (void **)&j.y));
  if (j.rows == 0 || j.n == 0 || j.inner == 0) return NULL;
  if (d->columns) {
    j.outer = j.rows;
    int64_t runs = (j.inner + SOFTMAX_COLUMN_STEP - 1) / SOFTMAX_COLUMN_STEP;
    int64_t tasks = softmax_tasks(j.outer * j.n * j.inner, j.outer * runs);
    /* as many runs a slice as the tasks need beyond one slice each, in whole steps */
    j.pieces = (tasks + j.outer - 1) / j.outer;
    if (j.pieces > runs) j.pieces = runs;
    j.cols = ((runs + j.pieces - 1) / j.pieces) * SOFTMAX_COLUMN_STEP;
    j.pieces = (j.inner + j.cols - 1) / j.cols;
    int64_t total = j.outer * j.pieces;
    j.per_task = (total + tasks - 1) / tasks;
    size_t count = (size_t)((total + j.per_task - 1) / j.per_task);
    if (count <= 1) {
      softmax_columns_task(&j, 0);
      return NULL;
    }
    return API(KernelContext_ParallelFor)(ctx, softmax_columns_task, count, 0, &j);
  }
  int64_t tasks = softmax_tasks(j.rows * j.n, j.rows);
  if (tasks <= 1) {
    j.fn(j.x, j.y, j.rows, j.n, 1);
    return NULL;
  }
  j.per_task = (j.rows + tasks - 1) / tasks;
  return API(KernelContext_ParallelFor)(ctx, softmax_task, (size_t)((j.rows + j.per_task - 1) / j.per_task), 0, &j);
}
