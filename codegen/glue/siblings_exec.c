/* ---- Horizontal fusion: sibling convolutions that read the same input, in one kernel (OptiFX's horizontal
 * fusion on a CPU). ----
 *
 * Included after compute_exec.c (codegen/glue/kinds.py). Each sibling is a channel-vector convolution with its
 * own epilogue, tiles and weights (an Inception module's 1x1 branches, a fire module's 1x1 and 3x3 expands); they
 * share the input tensor. Run apart, each convolution is one parallel loop over onnxruntime's threads, and a small
 * one leaves threads idle at its end while the next waits to start. Here every sibling is made ready first
 * (cb_prepare: outputs, epilogue inputs, tap tables, a padded copy where one is needed), then the tasks of all of
 * them go into a single parallel loop, sibling after sibling, so a thread that finishes its share of one moves on to
 * the next and the input, read by all of them, is fresh in the cache when the next sibling reads it.
 *
 * Op inputs: x, then each sibling's packed weights and epilogue inputs (the weights at `part_input[p]`). Op outputs:
 * each sibling's outputs in turn (the first at `part_output[p]`). */

typedef struct {
  cb_ready *ready;
  int n;
  int64_t first_task[SB_MAX_PART + 1]; /* global task index where each sibling's tasks start */
} sb_job;

static void sb_task(void *usr, size_t index) {
  const sb_job *job = (const sb_job *)usr;
  int64_t t = (int64_t)index;
  int p = 0;
  while (p + 1 < job->n && t >= job->first_task[p + 1]) p++;
  cb_ready_task(&job->ready[p], t - job->first_task[p]);
}

static OrtStatus *sb_compute(const onnxopt_sb_desc *d, OrtKernelContext *ctx) {
  if (d->n_part < 1 || d->n_part > SB_MAX_PART)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a sibling kernel has 1 to 8 convolutions");
  const OrtValue *xv;
  int64_t xd[MAX_RANK];
  size_t xr;
  CHECK(ct_dims(ctx, 0, &xv, xd, &xr));
  cb_ready ready[SB_MAX_PART];
  sb_job job;
  memset(&job, 0, sizeof(job));
  job.ready = ready;
  OrtStatus *st = NULL;
  int made = 0;
  for (; made < d->n_part && !st; made++) {
    const onnxopt_ct_desc *c = d->part[made];
    const OrtValue *wv;
    int64_t wd[MAX_RANK];
    size_t wr;
    st = ct_check_input(c, xd, xr);
    if (!st) st = ct_dims(ctx, (size_t)d->part_input[made], &wv, wd, &wr);
    if (!st) st = cb_prepare(c, ctx, xv, xd, wv, d->part_input[made] + 1, d->part_output[made], &ready[made]);
    if (st) break;
    job.first_task[made + 1] = job.first_task[made] + ready[made].tasks;
  }
  job.n = made;
  if (!st) {
    int64_t tasks = job.first_task[made];
    if (tasks == 1) sb_task(&job, 0);
    else if (tasks > 1) st = API(KernelContext_ParallelFor)(ctx, sb_task, (size_t)tasks, 0, &job);
  }
  for (int p = 0; p < made; p++) st = cb_finish(&ready[p], ctx, st);
  return st;
}
