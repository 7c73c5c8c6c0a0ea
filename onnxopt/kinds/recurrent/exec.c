/* The recurrent kind's executor: an LSTM or a GRU in two phases over ORT's pool.

   1. The input projection of all T steps at once (proj): in the steps' own tasks (below), or where one thread
      runs the steps, split into tasks of runs of blocks first.
   2. The steps. Each direction is a chain of T dependent steps, and its steps are independent of the other
      direction's, so with two directions each task runs one direction's whole sequence: no synchronization
      between steps. A single direction whose R is larger than RECURRENT_SHARE_BYTES is shared by several tasks
      in one parallel section (recurrent_shared_task): its blocks in groups, each task taking its own group of
      every step first, then whatever group no one has taken, then waiting until the step's groups are done (the
      next step needs all of h). A task waits only for groups a running task holds, so tasks that start late, or
      never alongside the others (a pool of one thread), leave the work to the rest and nothing deadlocks; where
      they do run together, each core keeps its part of R in its own L2. A small R runs on one thread.

   The onnxruntime API gives a kernel no thread count, so the split does not depend on one: two directions use two
   threads in phase 2 however many the session has.

   h and c live in the call's buffer, rows of the hidden units padded to whole blocks (hp floats), the padding zero
   (its packed weights and bias are zero, so its units stay zero). Y, Y_h and Y_c are copied out of it. */
/* R of a single direction above this: its steps shared by tasks. Against one thread a step (and, above 1 MiB, one
   parallel section a step), both on 2 threads of a Zen 4, interleaved: gru_kws's GRU of 128 units (R 192 KiB)
   1.21x, silero's LSTM of 128 1.20x, an LSTM of 256 1.59x, of 512 1.37x; a GRU of 64 (48 KiB) 0.94-1.03x. */
#define RECURRENT_SHARE_BYTES ((int64_t)128 << 10)
#define RECURRENT_GROUP_BYTES ((int64_t)512 << 10) /* R per group of blocks, at most 8 groups, at least 2 */
#define RECURRENT_SPINS 4096 /* pause rounds before a waiting task yields its CPU (it may share one) */
#define RECURRENT_MAX_TASKS 64
#define RECURRENT_INLINE_FLOPS 2e5 /* below: phase 1 on the calling thread */

typedef struct {
  const onnxopt_recurrent_desc *d;
  const float *x, *bp;
  const char *wp, *rp;       /* the packed weights: weight_bytes each */
  float *gx, *h, *c;         /* gx [T * B][D][NB][4 slots][16]; h [D][2][B][hp]; c [D][B][hp] (an LSTM's) */
  float *y;                  /* Y [T][D][B][H] or NULL */
  int64_t steps, batch, nb, hp, groups, per_group;
  int *claims, *done;        /* a shared direction: [T + 1][groups] taken flags and [T + 1] groups finished */
  int own_proj;              /* two directions: each direction's task runs its own phase 1 */
} recurrent_job;

static int64_t rec_gx_stride(const recurrent_job *j) { return (int64_t)j->d->directions * j->nb * RECURRENT_SLOTS; }
static float *rec_h(const recurrent_job *j, int dir, int which) {
  return j->h + ((int64_t)dir * 2 + which) * j->batch * j->hp;
}
static float *rec_c(const recurrent_job *j, int dir) { return j->c + (int64_t)dir * j->batch * j->hp; }
static int rec_backward(const recurrent_job *j, int dir) { return dir == 1 || j->d->reverse; }

/* Phase 1 for direction dir's blocks b0 .. b1. */
static void rec_proj(const recurrent_job *j, int dir, int64_t b0, int64_t b1) {
  const onnxopt_recurrent_desc *d = j->d;
  d->proj(j->x, j->wp + (int64_t)dir * j->nb * d->input_size * d->gates * RECURRENT_BLOCK * d->weight_bytes,
          j->bp + (int64_t)dir * j->nb * RECURRENT_SLOTS, j->gx + (int64_t)dir * j->nb * RECURRENT_SLOTS,
          j->steps * j->batch, d->input_size, rec_gx_stride(j), b0, b1);
}

static void recurrent_proj_task(void *usr, size_t index) {
  const recurrent_job *j = (const recurrent_job *)usr;
  int dir = (int)(index / (size_t)j->groups);
  int64_t b0 = (int64_t)(index % (size_t)j->groups) * j->per_group, b1 = b0 + j->per_group;
  if (b1 > j->nb) b1 = j->nb;
  if (b0 < b1) rec_proj(j, dir, b0, b1);
}

/* Step s of direction dir for blocks b0 .. b1: h[s % 2] -> h[(s + 1) % 2]. A serpentine schedule runs odd steps'
   blocks from the last: R streams through L2 (a bidirectional LSTM of 512 units reads 4 MB a direction a step),
   and the blocks a step read last are what L2 still holds when the next step starts. */
static void rec_step(const recurrent_job *j, int dir, int64_t s, int64_t b0, int64_t b1) {
  const onnxopt_recurrent_desc *d = j->d;
  int64_t t = rec_backward(j, dir) ? j->steps - 1 - s : s;
  int64_t stride = rec_gx_stride(j);
  const char *rp = j->rp + (int64_t)dir * j->nb * d->hidden * d->gates * RECURRENT_BLOCK * d->weight_bytes;
  const float *gx = j->gx + t * j->batch * stride + (int64_t)dir * j->nb * RECURRENT_SLOTS;
  const float *h_prev = rec_h(j, dir, (int)(s % 2));
  float *h_next = rec_h(j, dir, (int)((s + 1) % 2)), *c = rec_c(j, dir);
  if (!d->serpentine || s % 2 == 0) {
    d->step(rp, gx, stride, h_prev, h_next, c, j->batch, j->hp, d->hidden, b0, b1);
    return;
  }
  for (int64_t b = b1 - 1; b >= b0; b--)
    d->step(rp, gx, stride, h_prev, h_next, c, j->batch, j->hp, d->hidden, b, b + 1);
}

/* Y[t][dir] for the hidden units of blocks b0 .. b1 (all of them: 0 .. nb), from the h step s wrote. */
static void rec_emit(const recurrent_job *j, int dir, int64_t s, int64_t b0, int64_t b1) {
  const onnxopt_recurrent_desc *d = j->d;
  int64_t u0 = b0 * RECURRENT_BLOCK, u1 = b1 * RECURRENT_BLOCK < d->hidden ? b1 * RECURRENT_BLOCK : d->hidden;
  if (!j->y || u0 >= u1) return;
  int64_t t = rec_backward(j, dir) ? j->steps - 1 - s : s;
  const float *h = rec_h(j, dir, (int)((s + 1) % 2));
  for (int64_t r = 0; r < j->batch; r++)
    memcpy(j->y + ((t * d->directions + dir) * j->batch + r) * d->hidden + u0, h + r * j->hp + u0,
           (size_t)(u1 - u0) * sizeof(float));
}

/* One direction's whole sequence, its projection first where `own_proj` (two directions: each task projects what
   it then reads, in one parallel section). */
static void recurrent_direction_task(void *usr, size_t index) {
  const recurrent_job *j = (const recurrent_job *)usr;
  if (j->own_proj) rec_proj(j, (int)index, 0, j->nb);
  for (int64_t s = 0; s < j->steps; s++) {
    rec_step(j, (int)index, s, 0, j->nb);
    rec_emit(j, (int)index, s, 0, j->nb);
  }
}

/* One task of a shared direction (see the top), phase 1 included as step -1 (the group's blocks' projection, so
   a task meets the gx it wrote, and the call wakes the pool once): every step, its own group first, then any group
   not yet taken; then it waits for the step's groups to finish. The release of `done` publishes the group's gx or
   h to the next step. */
static void recurrent_shared_task(void *usr, size_t index) {
  const recurrent_job *j = (const recurrent_job *)usr;
  int64_t G = j->groups;
  for (int64_t s = -1; s < j->steps; s++) {
    int *claim = j->claims + (s + 1) * G;
    for (int64_t k = 0; k < G; k++) {
      int64_t g = ((int64_t)index + k) % G;
      if (__atomic_load_n(&claim[g], __ATOMIC_RELAXED) || __atomic_exchange_n(&claim[g], 1, __ATOMIC_ACQUIRE))
        continue;
      int64_t b0 = g * j->per_group, b1 = b0 + j->per_group < j->nb ? b0 + j->per_group : j->nb;
      if (s < 0) {
        rec_proj(j, 0, b0, b1);
      } else {
        rec_step(j, 0, s, b0, b1);
        rec_emit(j, 0, s, b0, b1);
      }
      __atomic_add_fetch(&j->done[s + 1], 1, __ATOMIC_RELEASE);
    }
    unsigned spins = 0;
    while (__atomic_load_n(&j->done[s + 1], __ATOMIC_ACQUIRE) < G) glue_pause(&spins, RECURRENT_SPINS);
  }
}

/* Copies a [D][B][H] input into rows of hp floats (zeros where it is absent). */
static void rec_load_state(const recurrent_job *j, const float *src, float *(*at)(const recurrent_job *, int)) {
  const onnxopt_recurrent_desc *d = j->d;
  for (int dir = 0; dir < d->directions; dir++) {
    float *dst = at(j, dir);
    memset(dst, 0, (size_t)(j->batch * j->hp) * sizeof(float));
    if (src)
      for (int64_t r = 0; r < j->batch; r++)
        memcpy(dst + r * j->hp, src + ((int64_t)dir * j->batch + r) * d->hidden, (size_t)d->hidden * sizeof(float));
  }
}
static float *rec_h_first(const recurrent_job *j, int dir) { return rec_h(j, dir, 0); }

/* Writes a [D][B][H] output from rows of hp floats. */
static void rec_store_state(const recurrent_job *j, float *dst, float *(*at)(const recurrent_job *, int)) {
  const onnxopt_recurrent_desc *d = j->d;
  for (int dir = 0; dir < d->directions; dir++)
    for (int64_t r = 0; r < j->batch; r++)
      memcpy(dst + ((int64_t)dir * j->batch + r) * d->hidden, at(j, dir) + r * j->hp,
             (size_t)d->hidden * sizeof(float));
}
static float *rec_h_last(const recurrent_job *j, int dir) { return rec_h(j, dir, (int)(j->steps % 2)); }

static OrtStatus *recurrent_execute(const onnxopt_recurrent_desc *d, OrtKernelContext *ctx) {
  int64_t dims[MAX_RANK];
  size_t rank;
  const void *data;
  recurrent_job j;
  memset(&j, 0, sizeof(j));
  j.d = d;
  CHECK(glue_input(ctx, 0, dims, &rank, &data));
  if (rank != 3 || dims[2] != d->input_size)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: a recurrent input X that is not [T, B, input_size]");
  j.x = (const float *)data;
  j.steps = dims[0];
  j.batch = dims[1];
  const float *state_in[2] = {NULL, NULL};
  const void **tables[3] = {(const void **)&j.wp, (const void **)&j.rp, (const void **)&j.bp};
  for (int i = 0; i < 3; i++) {
    CHECK(glue_input(ctx, 1 + i, dims, &rank, &data));
    *tables[i] = data;
  }
  int next = 4;
  for (int k = 0; k < 2; k++) {
    if (!(k == 0 ? d->has_h0 : d->has_c0)) continue;
    CHECK(glue_input(ctx, next++, dims, &rank, &data));
    if (rank != 3 || dims[0] != d->directions || dims[1] != j.batch || dims[2] != d->hidden)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: a recurrent initial state that is not [directions, B, hidden]");
    state_in[k] = (const float *)data;
  }
  j.nb = (d->hidden + RECURRENT_BLOCK - 1) / RECURRENT_BLOCK;
  j.hp = j.nb * RECURRENT_BLOCK;

  OrtValue *out;
  float *outs[3] = {NULL, NULL, NULL};
  int slot = 0;
  if (d->out_y) {
    int64_t ydims[4] = {j.steps, d->directions, j.batch, d->hidden};
    CHECK(API(KernelContext_GetOutput)(ctx, slot++, ydims, 4, &out));
    CHECK(API(GetTensorMutableData)(out, (void **)&outs[0]));
  }
  for (int k = 1; k < 3; k++) {
    if (!(k == 1 ? d->out_yh : d->out_yc)) continue;
    int64_t sdims[3] = {d->directions, j.batch, d->hidden};
    CHECK(API(KernelContext_GetOutput)(ctx, slot++, sdims, 3, &out));
    CHECK(API(GetTensorMutableData)(out, (void **)&outs[k]));
  }
  j.y = outs[0];
  if (j.batch == 0) return NULL;

  int64_t gx_floats = j.steps * j.batch * rec_gx_stride(&j);
  int64_t state_floats = (int64_t)d->directions * j.batch * j.hp;
  /* phase 2's groups where one direction is shared (the top) */
  int64_t r_bytes = j.nb * (int64_t)d->hidden * d->gates * RECURRENT_BLOCK * d->weight_bytes;
  int64_t share_groups = 0;
  if (d->directions == 1 && r_bytes > RECURRENT_SHARE_BYTES && j.nb > 1) {
    share_groups = r_bytes / RECURRENT_GROUP_BYTES;
    share_groups = share_groups < 2 ? 2 : share_groups > 8 ? 8 : share_groups;
    if (share_groups > j.nb) share_groups = j.nb;
  }
  /* claims and done, ints in float slots: the steps and phase 1 */
  int64_t flag_ints = share_groups ? (j.steps + 1) * (share_groups + 1) : 0;
  float *buf = glue_floats((size_t)(gx_floats + 3 * state_floats + flag_ints));
  if (!buf) return fail(ORT_FAIL, "onnxopt: out of memory for a recurrent kernel's buffers");
  j.gx = buf;
  j.h = buf + gx_floats;
  j.c = j.h + 2 * state_floats;
  if (flag_ints) {
    j.claims = (int *)(void *)(j.c + state_floats);
    j.done = j.claims + (j.steps + 1) * share_groups;
    memset(j.claims, 0, (size_t)flag_ints * sizeof(int));
  }
  rec_load_state(&j, state_in[0], rec_h_first);
  rec_load_state(&j, state_in[1], rec_c);

  OrtStatus *st = NULL;
  if (j.steps > 0 && share_groups) { /* both phases in one parallel section */
    j.per_group = (j.nb + share_groups - 1) / share_groups;
    j.groups = (j.nb + j.per_group - 1) / j.per_group; /* <= share_groups: the flags allocated suffice */
    st = API(KernelContext_ParallelFor)(ctx, recurrent_shared_task, (size_t)j.groups, 0, &j);
  } else if (j.steps > 0 && d->directions == 2) { /* both phases in one parallel section, a task a direction */
    j.own_proj = 1;
    st = API(KernelContext_ParallelFor)(ctx, recurrent_direction_task, 2, 0, &j);
  } else if (j.steps > 0) {
    /* phase 1: (direction, run of blocks) tasks */
    j.groups = RECURRENT_MAX_TASKS / d->directions;
    if (j.groups > j.nb) j.groups = j.nb;
    j.per_group = (j.nb + j.groups - 1) / j.groups;
    j.groups = (j.nb + j.per_group - 1) / j.per_group;
    double flops = 2.0 * d->gates * (double)(j.steps * j.batch) * d->input_size * d->hidden * d->directions;
    size_t tasks = (size_t)(d->directions * j.groups);
    if (flops < RECURRENT_INLINE_FLOPS || tasks == 1) {
      for (size_t i = 0; i < tasks; i++) recurrent_proj_task(&j, i);
    } else {
      st = API(KernelContext_ParallelFor)(ctx, recurrent_proj_task, tasks, 0, &j);
    }
    if (!st) recurrent_direction_task(&j, 0); /* phase 2: one direction, on this thread */
  }
  if (!st && outs[1]) rec_store_state(&j, outs[1], rec_h_last);
  if (!st && outs[2]) rec_store_state(&j, outs[2], rec_c);
  glue_release(buf);
  return st;
}
