/* ---- The compute kind's C entry point: a packed-B matmul run without onnxruntime, on threads of the library's
 * own, at a schedule the caller gives. The schedule search (onnxopt/tune/heron) times candidates through it: one
 * compiled library serves every schedule of a register tile (K block, L2 group and the task split are arguments,
 * not code), and no session's overhead sits in the timings. onnxruntime's Compute runs the same job (ct_run) on its
 * own pool. ----
 */
#include <pthread.h>

/* A fixed set of worker threads that sleep between calls: `ct_pool_run` hands them one job's tasks and takes its
   share on the calling thread, as onnxruntime's pool does. */
typedef struct ct_pool {
  pthread_mutex_t mu;
  pthread_cond_t wake, idle;
  int workers, busy, quit;
  unsigned long generation;
  void (*fn)(void *, size_t);
  void *usr;
  size_t total;
  atomic_size_t next;
  pthread_t threads[64];
} ct_pool;

static void ct_pool_drain(ct_pool *p) {
  for (size_t i; (i = atomic_fetch_add(&p->next, 1)) < p->total;) p->fn(p->usr, i);
}

static void *ct_pool_worker(void *arg) {
  ct_pool *p = (ct_pool *)arg;
  unsigned long seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->quit && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
    if (p->quit) break;
    seen = p->generation;
    pthread_mutex_unlock(&p->mu);
    ct_pool_drain(p);
    pthread_mutex_lock(&p->mu);
    if (--p->busy == 0) pthread_cond_signal(&p->idle);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static OrtStatus *ct_pool_run(ct_pool *p, void (*fn)(void *, size_t), size_t total, void *usr) {
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->usr = usr;
  p->total = total;
  atomic_store(&p->next, 0);
  p->busy = p->workers;
  p->generation++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  ct_pool_drain(p);
  pthread_mutex_lock(&p->mu);
  while (p->busy > 0) pthread_cond_wait(&p->idle, &p->mu);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static ct_pool *g_entry_pool;
static pthread_mutex_t g_entry_mu = PTHREAD_MUTEX_INITIALIZER;

/* The pool for `threads` threads (the caller's among them), made on first use and kept; a call with another count
   replaces it. NULL for one thread. */
static ct_pool *ct_entry_pool(int threads) {
  if (threads <= 1) return NULL;
  if (threads > 65) threads = 65;
  if (g_entry_pool && g_entry_pool->workers == threads - 1) return g_entry_pool;
  if (g_entry_pool) {
    ct_pool *old = g_entry_pool;
    pthread_mutex_lock(&old->mu);
    old->quit = 1;
    pthread_cond_broadcast(&old->wake);
    pthread_mutex_unlock(&old->mu);
    for (int i = 0; i < old->workers; i++) pthread_join(old->threads[i], NULL);
    free(old);
    g_entry_pool = NULL;
  }
  ct_pool *p = (ct_pool *)calloc(1, sizeof(ct_pool));
  if (!p) return NULL;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->idle, NULL);
  for (int i = 0; i < threads - 1; i++) {
    if (pthread_create(&p->threads[i], NULL, ct_pool_worker, p) != 0) break;
    p->workers++;
  }
  g_entry_pool = p;
  return p;
}

/* C = A . B with the op's epilogue: op `name` of this library (a float32 matmul whose B is packed in panels), A
 * [items][M][K] row-major, B as the op's input 1 holds it ([ceil(N / panel)][K][panel]), `extras` its epilogue
 * inputs (op inputs 2..) and `outs` its outputs ([items][M][N] each). `schedule`: K a block, panels an L2 group,
 * panel tasks, row tasks (0: the descriptor's, else the glue's formula); NULL: the descriptor's. Returns 0, or 1
 * for an op this entry does not run, 2 for a size it was not built for. */
__attribute__((visibility("default"))) int onnxopt_matmul_entry(const char *name, int64_t items, int64_t M, int64_t K,
                                                                const float *a, const void *b,
                                                                const float *const *extras, float *const *outs,
                                                                const int64_t *schedule, int threads) {
  const onnxopt_ct_desc *d = NULL;
  for (int i = 0; i < onnxopt_n_ops; i++)
    if (ONNXOPT_OPS[i]->kind == KIND_MATMUL && strcmp(ONNXOPT_OPS[i]->name, name) == 0)
      d = (const onnxopt_ct_desc *)ONNXOPT_OPS[i];
  if (!d || !d->packed_b || d->trans_a || d->sig.in_types[1] != 1 || items < 1 || M < 1 || K < 0) return 1;
  if (d->n_extra > CT_MAX_EXTRA || d->sig.n_out > CT_MAX_OUT) return 1;
  int64_t N = d->oc;
  int64_t *offs = (int64_t *)calloc((size_t)items * 2, sizeof(int64_t));
  int64_t *koff = (int64_t *)malloc((size_t)(K > 0 ? K : 1) * sizeof(int64_t));
  if (!offs || !koff) {
    free(offs);
    free(koff);
    return 2;
  }
  ct_job job;
  memset(&job, 0, sizeof(job));
  job.d = d;
  memcpy(job.sched, d->sched, sizeof(job.sched));
  if (schedule)
    for (int s = 0; s < 4; s++)
      if (schedule[s] > 0) job.sched[s] = schedule[s];
  job.items = items;
  job.groups = 1;
  job.M = M;
  job.K = K;
  job.P = N;
  job.a = a;
  job.b = (const float *)b;
  job.a_off = offs;
  job.b_off = offs + items; /* one B for every item */
  for (int64_t i = 0; i < items; i++) offs[i] = i * M * K;
  for (int64_t k = 0; k < K; k++) koff[k] = k * N;
  job.koff = koff;
  job.a_ms = K;
  job.a_ks = 1;
  job.ptiles = (N + d->ni * d->lanes - 1) / (d->ni * d->lanes);
  for (int o = 0; o < d->sig.n_out; o++) job.out[o] = outs[o];
  for (int e = 0; e < d->n_extra; e++) {
    int kind = d->extra_kind[e];
    job.extra[e] = extras[e];
    job.extra_count[e] = kind == EX_POSITION ? M * N : kind == EX_CHANNEL ? M : kind == EX_COLUMN ? N : 1;
  }
  pthread_mutex_lock(&g_entry_mu); /* one pool, one job at a time */
  job.pool = ct_entry_pool(threads);
  ct_run(&job, NULL);
  pthread_mutex_unlock(&g_entry_mu);
  free(koff);
  free(offs);
  return 0;
}
