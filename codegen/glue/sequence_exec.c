/* ---- Sequences: consecutive fused ops run in one parallel section. ----
 *
 * Included after the other kinds' executors (codegen/glue/kinds.py). With onnxruntime's spinning off (the setting
 * the benchmarks use, and the one a shared server wants), every parallel loop a kernel opens wakes a sleeping pool
 * thread, about 20 us on this machine, while the calling thread works alone. A model of ours opens 25 to 114 loops
 * per inference. A sequence op (emit/sequence.py) stands for a run of our ops with no onnxruntime op between them:
 * it opens one loop, whose first thread in (the driver) runs the ops' ordinary compute functions in order while the
 * others (helpers) stay inside it, take the tasks of each parallel loop the ops open, and wait between loops by
 * spinning, for a few microseconds at a time, the way an OpenMP barrier does.
 *
 * The ops' code is unchanged: it calls the OrtApi through g_api, and g_api is our copy of onnxruntime's table in
 * which the context and tensor functions first check for the sequence's stand-ins (seq_api_table):
 *   - the context is the run's `vctx` member: GetInput and GetOutput map the op's positions to the sequence's own
 *     inputs and outputs, or to tensors that never leave the sequence, kept in buffers of the sequence's arena;
 *   - such a tensor is a seq_value, which also serves as its own TensorTypeAndShapeInfo;
 *   - ParallelFor publishes the loop to the helpers and takes part in it (seq_parallel_for).
 * Anything else is onnxruntime's, and goes to onnxruntime's functions.
 *
 * Deadlock freedom does not depend on how many threads onnxruntime lends: the driver takes tasks of its own loops
 * and waits only for tasks a running thread has claimed; a helper that arrives late (or never) is not waited for. */

/* A tensor that lives only inside the sequence; also its own shape info. */
typedef struct {
  void *data;
  size_t rank;
  int64_t dims[MAX_RANK];
  int bf16; /* kept in bfloat16 for the bf16 GEMMs that read it (seq_slot_value), not in its declared float */
} seq_value;

/* Parts a loop's indices are split into: one per thread of the section, up to this many (threads past it share). */
#define SEQ_PARTS 8

static atomic_ullong g_seq_bf16_tensors; /* onnxopt_sequence_bf16_tensors */

/* One parallel loop of an op in the sequence. Never reused within a run: a helper still holding a finished loop can
   only find its parts empty. Its indices are split into `parts` contiguous parts, one per thread in the section
   when it was published: a thread takes its own part's indices from the front, then the other parts' from their
   backs. Each thread so works through a contiguous run of tasks, as onnxruntime's own ParallelFor gives it: a
   packed GEMM's tasks are ordered panel group by panel group, so a thread keeps its half of the weights in its L2.
   Handing out the indices one by one in turn (each thread every other task) made DistilBERT's bf16 GEMMs at 8 x 128
   tokens 16% slower than the same kernels run through onnxruntime's pool. */
typedef struct {
  void (*fn)(void *, size_t);
  void *usr;
  size_t total;
  atomic_size_t done;
  int parts;
  char pad[28];
  atomic_ullong part[SEQ_PARTS]; /* taken from the part's front (low 32 bits) and from its back (high 32) */
} seq_job;

/* Loops come from a chain of blocks kept in the arena: a block is added when a run opens more loops than the chain
   holds, so a warm run allocates none. */
typedef struct seq_jobs {
  struct seq_jobs *next;
  int cap;
  char pad[64 - sizeof(void *) - sizeof(int)]; /* the loops start on a cache line */
  seq_job job[];
} seq_jobs;

static seq_jobs *seq_jobs_new(int cap) {
  seq_jobs *b = (seq_jobs *)aligned_alloc(64, sizeof(seq_jobs) + (size_t)cap * sizeof(seq_job));
  if (b) {
    b->next = NULL;
    b->cap = cap;
  }
  return b;
}

/* What a run needs besides its stack: the buffers, the stand-in values and the loops. Kept between runs (one per
   sequence op, in onnxopt_seq_arenas) so a warm run allocates nothing; a run that finds it taken by a concurrent run
   of the same op makes its own. */
typedef struct {
  int n_buffers, n_slots;
  size_t *cap;
  void **buf;
  seq_value *vals;
  void **slot_val; /* the OrtValue (onnxruntime's or a seq_value) each slot holds in this run */
  seq_jobs *jobs;
  double *step_s; /* ONNXOPT_SEQUENCE_PROFILE: seconds per step summed over `runs` runs (NULL when off) */
  long runs;
} seq_arena;

struct seq_run {
  int vctx; /* its address is the context the steps are given */
  OrtKernelContext *ctx;
  const onnxopt_seq_desc *d;
  const onnxopt_seq_step *step; /* the one running */
  seq_arena *a;
  seq_jobs *block; /* where the run's next loop goes */
  int in_block;
  int serial; /* ONNXOPT_SEQUENCE_SECTION=0: each loop goes to onnxruntime's pool (for A/B timings) */
  int views;  /* ONNXOPT_SEQUENCE_VIEWS=0: no Concat inputs written in place (for A/B timings) */
  int profile; /* ONNXOPT_SEQUENCE_PROFILE=FILE: the driver times each step (seq_profile_write) */
  int bf16;    /* ONNXOPT_SEQUENCE_BF16=0: every tensor in its declared type (for A/B timings and tests) */
  _Atomic(seq_job *) cur;
  atomic_int entered, end;
  atomic_uint gen;     /* bumped at every loop published and at the end: what a sleeping helper waits on */
  atomic_int sleepers; /* helpers asleep on gen (seq_help) */
  atomic_int driver_cpu; /* where the driver last published a loop */
  OrtStatus *status;
};

/* Waits between kernels and for a loop's last tasks are a few to a few hundred microseconds (the driver finishing
   its last task of a large convolution), so a waiting thread spins with pause, SEQ_SPINS rounds for a helper before
   it sleeps on a futex until the driver publishes the next loop (the driver only ever waits for tasks a running
   thread holds, and yields after SEQ_DRIVER_SPINS rounds). A helper on the driver's CPU sleeps at once: when another
   process takes the other core, both threads share one CPU, and a spinning helper holds the CPU the driver needs.
   NASNet-A's compute-blocked plan, sections against separate sections (same process, one timing each):
     spins, then sleep       one CPU   two CPUs
     512                     1.01x     1.16x
     4096                    0.84x     1.25x
     4096, same-CPU check    0.99-1.05x 1.15-1.26x
   (spinning only, yielding every 16384 rounds: 0.74x on one CPU). */
#if defined(__x86_64__)
#include <cpuid.h>
#define SEQ_SPINS 4096
static int seq_has_rdtscp = -1; /* CPUID 0x80000001 EDX bit 27; the glue is built for any x86-64 */

/* The CPU this thread runs on, from RDTSCP's TSC_AUX (Linux puts the CPU number in its low 12 bits); -1 where
   unknown. */
static int seq_cpu(void) {
  if (seq_has_rdtscp < 0) {
    unsigned a, b, c, d;
    seq_has_rdtscp = __get_cpuid(0x80000001u, &a, &b, &c, &d) && (d >> 27 & 1u);
  }
  if (!seq_has_rdtscp) return -1;
  unsigned aux;
  __builtin_ia32_rdtscp(&aux);
  return (int)(aux & 0xfff);
}
#else
#define SEQ_SPINS 512
static int seq_cpu(void) { return -1; }
#endif

#define SEQ_DRIVER_SPINS 512 /* the driver's wait for claimed tasks: they are running, or their thread is not */

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
long syscall(long number, ...); /* <unistd.h> hides it under -std=c11 */

static void seq_sleep(atomic_uint *word, unsigned seen) {
  syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void seq_wake(atomic_uint *word) { syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0); }
#else
static void seq_sleep(atomic_uint *word, unsigned seen) {
  (void)word;
  (void)seen;
  sched_yield();
}

static void seq_wake(atomic_uint *word) { (void)word; }
#endif

/* The driver: a new loop, or the end. */
static void seq_signal(seq_run *r) {
  atomic_store_explicit(&r->driver_cpu, seq_cpu(), memory_order_relaxed);
  atomic_fetch_add_explicit(&r->gen, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&r->sleepers, memory_order_seq_cst)) seq_wake(&r->gen);
}

static size_t seq_elem_bytes(int onnx_type) {
  switch (onnx_type) {
    case 2: case 3: case 9: return 1;   /* uint8, int8, bool */
    case 4: case 5: case 10: case 16: return 2; /* uint16, int16, float16, bfloat16 */
    case 7: case 11: case 13: case 14: return 8; /* int64, double, uint64, complex64 */
    case 15: return 16;                 /* complex128 */
    default: return 4;                  /* float, int32, uint32 */
  }
}

static void seq_arena_free(seq_arena *a) {
  if (!a) return;
  free(a->step_s);
  for (int b = 0; b < a->n_buffers; b++) free(a->buf[b]);
  for (seq_jobs *j = a->jobs, *next; j; j = next) {
    next = j->next;
    free(j);
  }
  free(a);
}

static seq_arena *seq_arena_new(const onnxopt_seq_desc *d) {
  size_t bytes = sizeof(seq_arena) + (size_t)d->n_buffers * (sizeof(size_t) + sizeof(void *)) +
                 (size_t)d->n_slots * (sizeof(seq_value) + sizeof(void *));
  char *p = (char *)calloc(1, bytes);
  if (!p) return NULL;
  seq_arena *a = (seq_arena *)p;
  p += sizeof(seq_arena);
  a->n_buffers = d->n_buffers;
  a->n_slots = d->n_slots;
  a->cap = (size_t *)p;
  p += (size_t)d->n_buffers * sizeof(size_t);
  a->buf = (void **)p;
  p += (size_t)d->n_buffers * sizeof(void *);
  a->vals = (seq_value *)p;
  p += (size_t)d->n_slots * sizeof(seq_value);
  a->slot_val = (void **)p;
  a->jobs = seq_jobs_new(16); /* doubled block by block as the first run needs: every multi-step test grows it */
  if (!a->jobs) {
    free(a);
    return NULL;
  }
  return a;
}

/* ---- ONNXOPT_SEQUENCE_PROFILE=FILE: where a sequence's time goes ----
 * onnxruntime's profiler sees a sequence as one node. With the variable set, the driver reads the clock around each
 * step: a step's ParallelFor returns when all its tasks are done, so that is the step's latency as the run sees it,
 * waits for the slowest thread included. When the library is unloaded (session end or process exit), one line per
 * step is appended to FILE: sequence op type, step index, step op type, runs, mean microseconds (tab-separated;
 * benchmarks/sequence_profile.py reads it). Runs of one op made concurrently keep their own arenas, and the times
 * of an arena dropped then are lost: profile one run at a time. The clock costs about 50 ns a step. */
#include <stdio.h>
#include <time.h>

static double seq_now(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC); /* C11; -std=c11 hides clock_gettime */
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void seq_profile_write(void) {
  const char *path = getenv("ONNXOPT_SEQUENCE_PROFILE");
  if (!path || !path[0]) return;
  FILE *f = NULL;
  for (int i = 0; i < onnxopt_n_seqs; i++) {
    const seq_arena *a = (const seq_arena *)onnxopt_seq_arenas[i];
    if (!a || !a->step_s || a->runs <= 0) continue;
    const onnxopt_seq_desc *d = NULL;
    for (int k = 0; k < onnxopt_n_ops && !d; k++) {
      const onnxopt_sig *sig = ONNXOPT_OPS[k];
      if (sig->kind == KIND_SEQUENCE && ((const onnxopt_seq_desc *)sig)->arena == i) d = (const onnxopt_seq_desc *)sig;
    }
    if (!d) continue;
    if (!f && !(f = fopen(path, "a"))) return;
    for (int s = 0; s < d->n_steps; s++)
      fprintf(f, "%s\t%d\t%s\t%ld\t%.3f\n", d->sig.name, s, d->steps[s].op->name, a->runs,
              1e6 * a->step_s[s] / (double)a->runs);
  }
  if (f) fclose(f);
}

/* dlclose: the arenas go with the library. */
__attribute__((destructor)) static void seq_free_arenas(void) {
  seq_profile_write();
  for (int i = 0; i < onnxopt_n_seqs; i++) {
    seq_arena_free((seq_arena *)onnxopt_seq_arenas[i]);
    onnxopt_seq_arenas[i] = NULL;
  }
}

/* ---- The section ---- */

/* An index of part `p` of loop `j`, from its front or its back; -1 when the part is empty. */
static int64_t seq_take(seq_job *j, int p, int back) {
  size_t lo = j->total * (size_t)p / (size_t)j->parts, n = j->total * (size_t)(p + 1) / (size_t)j->parts - lo;
  unsigned long long st = atomic_load_explicit(&j->part[p], memory_order_relaxed), next;
  size_t i;
  do {
    size_t front = (size_t)(st & 0xffffffffu), taken = (size_t)(st >> 32);
    if (front + taken >= n) return -1;
    i = back ? lo + n - 1 - taken : lo + front;
    next = st + (back ? 1ull << 32 : 1ull);
  } while (!atomic_compare_exchange_weak_explicit(&j->part[p], &st, next, memory_order_relaxed,
                                                  memory_order_relaxed));
  return (int64_t)i;
}

/* Thread `who` (0: the driver) runs loop `j`'s indices: its own part's from the front, then what is left of the
   others' from their backs. A thread that came in after the loop was published has no part of its own. */
static void seq_work(seq_job *j, int who) {
  int own = who < j->parts;
  for (int k = 0; k < j->parts; k++) {
    int p = (who + k) % j->parts;
    for (int64_t i; (i = seq_take(j, p, !(own && k == 0))) >= 0;) {
      j->fn(j->usr, (size_t)i);
      atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
    }
  }
}

static void seq_help(seq_run *r, int who) {
  seq_job *last = NULL;
  unsigned spins = 0;
  for (;;) {
    unsigned gen = atomic_load_explicit(&r->gen, memory_order_seq_cst); /* before looking: a later loop bumps it */
    seq_job *j = atomic_load_explicit(&r->cur, memory_order_acquire);
    if (j && j != last) {
      seq_work(j, who);
      last = j;
      spins = 0;
      continue;
    }
    if (atomic_load_explicit(&r->end, memory_order_acquire)) return;
    if (spins < SEQ_SPINS) {
      spins++;
      glue_cpu_relax();
      if (spins % 64 || seq_cpu() < 0 || seq_cpu() != atomic_load_explicit(&r->driver_cpu, memory_order_relaxed))
        continue;
    }
    /* Sleep until the next loop or the end. The driver bumps gen, then looks for sleepers; a helper counts itself,
       then looks at gen: one of the two sees the other. */
    atomic_fetch_add_explicit(&r->sleepers, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&r->gen, memory_order_seq_cst) == gen) seq_sleep(&r->gen, gen);
    atomic_fetch_sub_explicit(&r->sleepers, 1, memory_order_seq_cst);
    spins = 0;
  }
}

/* A step's ParallelFor. */
static OrtStatus *seq_parallel_for(seq_run *r, void (*fn)(void *, size_t), size_t total, void *usr) {
  if (r->serial) return ((KernelContext_ParallelFor_t)g_ort[API_KernelContext_ParallelFor])(r->ctx, fn, total, 0, usr);
  if (total == 0) return NULL;
  if (total == 1) {
    fn(usr, 0);
    return NULL;
  }
  if (r->in_block == r->block->cap) { /* the chain's next block, made the first time a run needs it */
    if (!r->block->next) r->block->next = seq_jobs_new(2 * r->block->cap);
    if (!r->block->next) return fail(ORT_FAIL, "onnxopt: out of memory in a sequence of kernels");
    r->block = r->block->next;
    r->in_block = 0;
  }
  seq_job *j = &r->block->job[r->in_block++];
  j->fn = fn;
  j->usr = usr;
  j->total = total;
  int in = atomic_load_explicit(&r->entered, memory_order_acquire); /* the threads in the section now */
  j->parts = in < 1 ? 1 : in > SEQ_PARTS ? SEQ_PARTS : in;
  if ((size_t)j->parts > total) j->parts = (int)total;
  for (int p = 0; p < j->parts; p++) atomic_store_explicit(&j->part[p], 0, memory_order_relaxed);
  atomic_store_explicit(&j->done, 0, memory_order_relaxed);
  atomic_store_explicit(&r->cur, j, memory_order_release);
  seq_signal(r);
  seq_work(j, 0);
  unsigned spins = 0;
  while (atomic_load_explicit(&j->done, memory_order_acquire) < total) glue_pause(&spins, SEQ_DRIVER_SPINS);
  return NULL;
}

static OrtStatus *onnxopt_execute(const onnxopt_sig *sig, OrtKernelContext *ctx);

/* CT_INLINE_FLOPS inside a section: splitting a kernel costs a few atomic operations there, not a wake-up, so only
   tiny kernels stay on the driver. On NASNet-A's compute-blocked plan (time per inference, one interleaved timing)
   the library's 1 MFLOP gave 6.90 ms, 256 KFLOP 6.73, 64 KFLOP 6.68 and 0 6.69. */
#define SEQ_INLINE_FLOPS 65536.0

static double seq_inline_flops(void) { return tl_seq && !tl_seq->serial ? SEQ_INLINE_FLOPS : onnxopt_inline_flops; }

static void seq_drive(seq_run *r) {
  seq_run *outer = tl_seq;
  tl_seq = r;
  double t = r->profile ? seq_now() : 0.0;
  for (int s = 0; s < r->d->n_steps && !r->status; s++) {
    r->step = &r->d->steps[s];
    r->status = onnxopt_execute(r->step->op, (OrtKernelContext *)&r->vctx); /* the kinds' dispatch */
    if (r->profile) {
      double now = seq_now();
      r->a->step_s[s] += now - t;
      t = now;
    }
  }
  if (r->profile && !r->status) r->a->runs++;
  tl_seq = outer;
}

static void seq_section(void *usr, size_t index) {
  (void)index;
  seq_run *r = (seq_run *)usr;
  int who = atomic_fetch_add_explicit(&r->entered, 1, memory_order_acq_rel);
  if (who == 0) {
    seq_drive(r);
    atomic_store_explicit(&r->end, 1, memory_order_release);
    seq_signal(r);
  } else {
    seq_help(r, who);
  }
}

/* Loop indices the section asks for: more than any pool has threads; the ones past the threads return at once. */
#define SEQ_SECTION_SPAN 64

static OrtStatus *seq_compute(const onnxopt_seq_desc *d, OrtKernelContext *ctx) {
  seq_arena *a = (seq_arena *)__atomic_exchange_n(&onnxopt_seq_arenas[d->arena], NULL, __ATOMIC_ACQ_REL);
  if (!a) a = seq_arena_new(d);
  if (!a) return fail(ORT_FAIL, "onnxopt: out of memory starting a sequence of kernels");
  seq_run r;
  memset(&r, 0, sizeof(r));
  r.ctx = ctx;
  r.d = d;
  r.a = a;
  r.block = a->jobs;
  const char *env = getenv("ONNXOPT_SEQUENCE_SECTION");
  r.serial = env && env[0] == '0';
  const char *views = getenv("ONNXOPT_SEQUENCE_VIEWS");
  r.views = !(views && views[0] == '0');
  const char *bf16 = getenv("ONNXOPT_SEQUENCE_BF16");
  r.bf16 = !(bf16 && bf16[0] == '0');
  const char *profile = getenv("ONNXOPT_SEQUENCE_PROFILE");
  if (profile && profile[0] && !a->step_s) a->step_s = (double *)calloc((size_t)d->n_steps, sizeof(double));
  r.profile = profile && profile[0] && a->step_s;
  memset(a->slot_val, 0, (size_t)d->n_slots * sizeof(void *));
  atomic_init(&r.cur, NULL);
  atomic_init(&r.entered, 0);
  atomic_init(&r.end, 0);
  atomic_init(&r.gen, 0);
  atomic_init(&r.sleepers, 0);
  atomic_init(&r.driver_cpu, -1);
  OrtStatus *st = NULL;
  if (r.serial)
    seq_drive(&r);
  else
    st = ((KernelContext_ParallelFor_t)g_ort[API_KernelContext_ParallelFor])(ctx, seq_section, SEQ_SECTION_SPAN, 0,
                                                                             &r);
  if (!st) st = r.status;
  seq_arena *old = (seq_arena *)__atomic_exchange_n(&onnxopt_seq_arenas[d->arena], a, __ATOMIC_ACQ_REL);
  seq_arena_free(old); /* a concurrent run's, put back first */
  return st;
}

/* ---- The OrtApi as the steps see it ---- */

static int seq_is_ctx(const void *ctx) { return tl_seq && ctx == (const void *)&tl_seq->vctx; }

static int seq_is_value(const void *v) {
  if (!tl_seq) return 0;
  const seq_value *vals = tl_seq->a->vals;
  return (const char *)v >= (const char *)vals && (const char *)v < (const char *)(vals + tl_seq->d->n_slots);
}

static OrtStatus *seq_GetInput(const OrtKernelContext *ctx, size_t index, const OrtValue **out) {
  if (!seq_is_ctx(ctx)) return ((KernelContext_GetInput_t)g_ort[API_KernelContext_GetInput])(ctx, index, out);
  seq_run *r = tl_seq;
  if (index >= (size_t)r->step->n_in) return fail(ORT_INVALID_ARGUMENT, "onnxopt: sequence step input out of range");
  int src = r->step->in[index];
  if (src >= 0) return ((KernelContext_GetInput_t)g_ort[API_KernelContext_GetInput])(r->ctx, (size_t)src, out);
  *out = r->a->slot_val[-1 - src];
  if (!*out) return fail(ORT_RUNTIME_EXCEPTION, "onnxopt: a sequence step read a tensor no earlier step wrote");
  return NULL;
}

static OrtStatus *seq_GetTensorMutableData(OrtValue *value, void **out);
static OrtStatus *seq_GetTensorTypeAndShape(const OrtValue *value, OrtTensorTypeAndShapeInfo **out);
static OrtStatus *seq_GetDimensionsCount(const OrtTensorTypeAndShapeInfo *info, size_t *out);
static OrtStatus *seq_GetDimensions(const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n);
static void seq_ReleaseTensorTypeAndShapeInfo(OrtTensorTypeAndShapeInfo *info);

/* Whether tensor `v` (onnxruntime's or a seq_value) has exactly `dims`. */
static OrtStatus *seq_has_dims(const OrtValue *v, const int64_t *dims, size_t ndims, int *same) {
  OrtTensorTypeAndShapeInfo *info;
  size_t rank = 0;
  int64_t have[MAX_RANK];
  CHECK(seq_GetTensorTypeAndShape(v, &info));
  OrtStatus *st = seq_GetDimensionsCount(info, &rank);
  if (!st && rank == ndims) st = seq_GetDimensions(info, have, rank);
  seq_ReleaseTensorTypeAndShapeInfo(info);
  *same = !st && rank == ndims && !memcmp(have, dims, ndims * sizeof(int64_t));
  return st;
}

static OrtStatus *seq_slot_value(seq_run *r, int slot, size_t elem, const int64_t *dims, size_t ndims, OrtValue **out,
                                 int depth);

/* Concats nested in Concats (a DenseNet block: each layer's Concat is an input of the next one's) make their
   outputs one inside the other, whole first; past this depth a Concat's output gets a buffer and is copied. */
#define SEQ_VIEW_DEPTH 64

/* A view: slot written inside its Concat's output slot (emit/sequence.py), when this run's dims are the ones the
   plan placed it for and its part of the output is contiguous (dims before the axis all 1). Sets *made to 0 where
   the slot gets a buffer of its own instead (the copy then copies it). */
static OrtStatus *seq_view(seq_run *r, int slot, size_t elem, const int64_t *dims, size_t ndims, OrtValue **out,
                           int depth, int *made) {
  const onnxopt_seq_desc *d = r->d;
  int whole = d->view_whole[slot], axis = d->view_axis[slot];
  *made = 0;
  if (depth > SEQ_VIEW_DEPTH || (size_t)axis >= ndims || dims[axis] != d->view_units[slot]) return NULL;
  for (int k = 0; k < axis; k++)
    if (dims[k] != 1) return NULL;
  int64_t wd[MAX_RANK];
  memcpy(wd, dims, ndims * sizeof(int64_t));
  wd[axis] = d->view_total[slot];
  OrtValue *wv = (OrtValue *)r->a->slot_val[whole];
  if (wv) { /* made by an earlier view: the same dims, or no view */
    int same;
    CHECK(seq_has_dims(wv, wd, ndims, &same));
    if (!same) return NULL;
  } else {
    CHECK(seq_slot_value(r, whole, elem, wd, ndims, &wv, depth + 1));
  }
  char *base;
  CHECK(seq_GetTensorMutableData(wv, (void **)&base));
  size_t inner = elem;
  for (size_t k = (size_t)axis + 1; k < ndims; k++) inner *= (size_t)dims[k];
  seq_value *v = &r->a->vals[slot];
  v->data = base + (size_t)d->view_offset[slot] * inner;
  v->bf16 = 0;
  v->rank = ndims;
  memcpy(v->dims, dims, ndims * sizeof(int64_t));
  r->a->slot_val[slot] = v;
  *out = (OrtValue *)v;
  *made = 1;
  return NULL;
}

/* The tensor of `slot` with `dims` (elements of `elem` bytes), made at its first request in the run: a sequence
   output (onnxruntime's), a view inside a Concat's output, or a buffer of the sequence's own. A Concat's output that
   views made first is returned as it is when asked for again with the same dims. */
static OrtStatus *seq_slot_value(seq_run *r, int slot, size_t elem, const int64_t *dims, size_t ndims, OrtValue **out,
                                 int depth) {
  const onnxopt_seq_desc *d = r->d;
  seq_arena *a = r->a;
  if (ndims > MAX_RANK) return fail(ORT_INVALID_ARGUMENT, "onnxopt: tensor rank above 12");
  if (a->slot_val[slot]) { /* a Concat's output, made by the views of its inputs */
    int same;
    CHECK(seq_has_dims((const OrtValue *)a->slot_val[slot], dims, ndims, &same));
    if (!same)
      return fail(ORT_RUNTIME_EXCEPTION, "onnxopt: a Concat's output inside a sequence changed size between its "
                                         "inputs and itself; set ONNXOPT_SEQUENCE_VIEWS=0 and report this model");
    *out = (OrtValue *)a->slot_val[slot];
    return NULL;
  }
  if (r->views && d->view_whole[slot] >= 0) {
    int made;
    CHECK(seq_view(r, slot, elem, dims, ndims, out, depth, &made));
    if (made) return NULL;
  }
  if (d->slot_output[slot] >= 0) {
    CHECK(((KernelContext_GetOutput_t)g_ort[API_KernelContext_GetOutput])(r->ctx, (size_t)d->slot_output[slot], dims,
                                                                          ndims, out));
    a->slot_val[slot] = *out;
    return NULL;
  }
  /* A bf16 GEMM's output that only bf16 GEMMs read as A: kept in bfloat16 where the tiles run, so the writer
     rounds it in its epilogue and the readers' tiles read it as it lies, as each reader would have rounded it
     (vcvtneps2bf16) and bit for bit the same. It must be their tiles' A as it is: rows in whole tiles (16 a
     matrix) and K in whole tile steps (32). */
  int bf16 = r->bf16 && d->slot_bf16[slot] && ndims >= 2 && dims[ndims - 1] > 0 && dims[ndims - 1] % 32 == 0 &&
             dims[ndims - 2] > 0 && dims[ndims - 2] % 16 == 0 && amx_ok(AMX_BF16);
  if (bf16) {
    elem = 2;
    atomic_fetch_add_explicit(&g_seq_bf16_tensors, 1, memory_order_relaxed);
  }
  size_t bytes = elem;
  for (size_t k = 0; k < ndims; k++) bytes *= (size_t)(dims[k] > 0 ? dims[k] : 0);
  bytes = (bytes + 63) / 64 * 64;
  int b = d->slot_buffer[slot];
  if (a->cap[b] < bytes || !a->buf[b]) { /* the first run, or larger inputs than the last */
    free(a->buf[b]);
    a->buf[b] = aligned_alloc(64, bytes ? bytes : 64);
    a->cap[b] = a->buf[b] ? bytes : 0;
    if (!a->buf[b]) return fail(ORT_FAIL, "onnxopt: out of memory for a tensor inside a sequence of kernels");
  }
  seq_value *v = &a->vals[slot];
  v->data = a->buf[b];
  v->bf16 = bf16;
  v->rank = ndims;
  memcpy(v->dims, dims, ndims * sizeof(int64_t));
  a->slot_val[slot] = v;
  *out = (OrtValue *)v;
  return NULL;
}

static OrtStatus *seq_GetOutput(OrtKernelContext *ctx, size_t index, const int64_t *dims, size_t ndims,
                                OrtValue **out) {
  if (!seq_is_ctx(ctx))
    return ((KernelContext_GetOutput_t)g_ort[API_KernelContext_GetOutput])(ctx, index, dims, ndims, out);
  seq_run *r = tl_seq;
  if (index >= (size_t)r->step->n_out) return fail(ORT_INVALID_ARGUMENT, "onnxopt: sequence step output out of range");
  return seq_slot_value(r, r->step->out[index], seq_elem_bytes(r->step->op->out_types[index]), dims, ndims, out, 0);
}

/* Tensors the sequences of this process kept in bfloat16 (seq_slot_value), one per slot per run: what
   onnxopt.runtime.bf16_tensors reads, so a test or a user sees that the path ran. */
__attribute__((visibility("default"))) unsigned long long onnxopt_sequence_bf16_tensors(void) {
  return atomic_load_explicit(&g_seq_bf16_tensors, memory_order_relaxed);
}

/* Whether `v` is a tensor of a sequence's own kept in bfloat16 (seq_slot_value): its readers and writer, bf16
   GEMMs on AMX tiles, then read and write it so (compute_exec.c). */
static int seq_value_bf16(const void *v) { return seq_is_value(v) && ((const seq_value *)v)->bf16; }

static OrtStatus *seq_GetTensorMutableData(OrtValue *value, void **out) {
  if (!seq_is_value(value)) return ((GetTensorMutableData_t)g_ort[API_GetTensorMutableData])(value, out);
  *out = ((seq_value *)value)->data;
  return NULL;
}

static OrtStatus *seq_GetTensorTypeAndShape(const OrtValue *value, OrtTensorTypeAndShapeInfo **out) {
  if (!seq_is_value(value)) return ((GetTensorTypeAndShape_t)g_ort[API_GetTensorTypeAndShape])(value, out);
  *out = (OrtTensorTypeAndShapeInfo *)value;
  return NULL;
}

static OrtStatus *seq_GetDimensionsCount(const OrtTensorTypeAndShapeInfo *info, size_t *out) {
  if (!seq_is_value(info)) return ((GetDimensionsCount_t)g_ort[API_GetDimensionsCount])(info, out);
  *out = ((const seq_value *)info)->rank;
  return NULL;
}

static OrtStatus *seq_GetDimensions(const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n) {
  if (!seq_is_value(info)) return ((GetDimensions_t)g_ort[API_GetDimensions])(info, dims, n);
  const seq_value *v = (const seq_value *)info;
  memcpy(dims, v->dims, (n < v->rank ? n : v->rank) * sizeof(int64_t));
  return NULL;
}

static void seq_ReleaseTensorTypeAndShapeInfo(OrtTensorTypeAndShapeInfo *info) {
  if (!seq_is_value(info)) ((ReleaseTensorTypeAndShapeInfo_t)g_ort[API_ReleaseTensorTypeAndShapeInfo])(info);
}

static OrtStatus *seq_ParallelFor(const OrtKernelContext *ctx, void (*fn)(void *, size_t), size_t total,
                                  size_t num_batch, void *usr) {
  if (!seq_is_ctx(ctx))
    return ((KernelContext_ParallelFor_t)g_ort[API_KernelContext_ParallelFor])(ctx, fn, total, num_batch, usr);
  return seq_parallel_for(tl_seq, fn, total, usr);
}

/* g_api for the steps: onnxruntime's table up to the last entry we use, with the context and tensor entries ours. */
static OrtApiTable seq_api_table(OrtApiTable ort) {
  static void *table[API_KernelContext_ParallelFor + 1];
  if (!g_ort) {
    memcpy(table, ort, sizeof(table));
    memcpy(g_ort_copy, ort, sizeof(g_ort_copy));
    table[API_KernelContext_GetInput] = (void *)seq_GetInput;
    table[API_KernelContext_GetOutput] = (void *)seq_GetOutput;
    table[API_GetTensorMutableData] = (void *)seq_GetTensorMutableData;
    table[API_GetTensorTypeAndShape] = (void *)seq_GetTensorTypeAndShape;
    table[API_GetDimensionsCount] = (void *)seq_GetDimensionsCount;
    table[API_GetDimensions] = (void *)seq_GetDimensions;
    table[API_ReleaseTensorTypeAndShapeInfo] = (void *)seq_ReleaseTensorTypeAndShapeInfo;
    table[API_KernelContext_ParallelFor] = (void *)seq_ParallelFor;
    g_ort = (OrtApiTable)g_ort_copy;
  }
  return (OrtApiTable)table;
}
