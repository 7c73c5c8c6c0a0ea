/* The QDQ GlobalAveragePool's executor: each plane's exact sum (lower.py), planes split over ORT's pool when there
   is enough to read, then each requantized as onnxruntime's QLinearGlobalAveragePool does:
   y = round((sum - zx * hw) * (sx / (sy * hw))) + zy, rounded half to even, saturated to the type. */
#include <math.h>
#define QGAP_TASK_MIN_BYTES 262144

typedef struct {
  const onnxopt_qgap_desc *d;
  const char *x;
  int32_t *sums;
  int64_t planes, hw, per_task;
} qgap_job;

static void qgap_task(void *usr, size_t index) {
  const qgap_job *j = (const qgap_job *)usr;
  int64_t p0 = (int64_t)index * j->per_task, p1 = p0 + j->per_task;
  if (p1 > j->planes) p1 = j->planes;
  if (p0 < p1) j->d->sums(j->x + p0 * j->hw, j->sums + p0, p1 - p0, j->hw);
}

static OrtStatus *qgap_execute(const onnxopt_qgap_desc *d, OrtKernelContext *ctx) {
  int64_t dims[MAX_RANK];
  size_t rank;
  const void *x;
  CHECK(glue_input(ctx, 0, dims, &rank, &x));
  if (rank < 3) return fail(ORT_INVALID_ARGUMENT, "onnxopt: a GlobalAveragePool input of rank below 3");
  qgap_job j;
  j.d = d;
  j.x = (const char *)x;
  j.planes = dims[0] * dims[1];
  j.hw = 1;
  for (size_t i = 2; i < rank; i++) {
    j.hw *= dims[i];
    dims[i] = 1;
  }
  OrtValue *out;
  void *y;
  CHECK(API(KernelContext_GetOutput)(ctx, 0, dims, rank, &out));
  CHECK(API(GetTensorMutableData)(out, &y));
  if (j.planes == 0) return NULL;
  j.sums = (int32_t *)malloc((size_t)j.planes * sizeof(int32_t));
  if (!j.sums) return fail(ORT_FAIL, "onnxopt: qgap: out of memory");
  OrtStatus *st = NULL;
  int64_t tasks = j.planes * j.hw / QGAP_TASK_MIN_BYTES;
  if (tasks > j.planes) tasks = j.planes;
  if (tasks <= 1) {
    d->sums(j.x, j.sums, j.planes, j.hw);
  } else {
    j.per_task = (j.planes + tasks - 1) / tasks;
    st = API(KernelContext_ParallelFor)(ctx, qgap_task, (size_t)((j.planes + j.per_task - 1) / j.per_task), 0, &j);
  }
  if (!st) {
    float scale = d->x_scale / (d->y_scale * (float)j.hw);
    int lo = d->is_signed ? -128 : 0, hi = d->is_signed ? 127 : 255;
    for (int64_t p = 0; p < j.planes; p++) {
      /* the hw = 0 plane (an empty spatial dim) sums to nothing: its mean is taken as zero */
      float v = j.hw ? (float)((int64_t)j.sums[p] - (int64_t)d->x_zero * j.hw) * scale : 0.0f;
      float r = nearbyintf(v) + (float)d->y_zero; /* the default rounding mode: half to even */
      int q = r < (float)lo ? lo : r > (float)hi ? hi : (int)r;
      if (d->is_signed) ((int8_t *)y)[p] = (int8_t)q;
      else ((uint8_t *)y)[p] = (uint8_t)q;
    }
  }
  free(j.sums);
  return st;
}
