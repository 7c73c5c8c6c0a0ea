/* ---- Compute ops (convolution, matmul) with fused epilogues: the job, its tiles over ORT's thread pool, and the
 * helpers every path shares (inputs, epilogue inputs, outputs, geometry). The paths follow in conv_blocked_exec.c,
 * conv_blocked_prepare_exec.c, conv_transpose_exec.c and conv_exec.c (the entry points). ----
 *
 * An op is `items` independent problems (batch x group for a convolution,
 * the broadcast batch of a matmul), each C[M x P] = A[M x K] . B[K x P] followed by the epilogue. The generated
 * tile functions (codegen/compute/tile.py) do the arithmetic; this file only walks shapes and tiles.
 *
 * A convolution whose taps are not a plain 1x1 (kernel > 1, stride, padding) first copies its input into a
 * zero-padded buffer split into stride phases: phase (a, b) holds rows a, a+s, a+2s... and columns b, b+s..., so
 * every tap of every stride reads unit-stride runs and needs no bounds checks. Tiles then cover up to NI output
 * rows of one vector of columns each ("rows mode"); a plain 1x1 reads the input in place, NI vectors of one flat run
 * of pixels ("flat mode"), as a matmul does.
 */

enum { EX_POSITION = 0, EX_CHANNEL = 1, EX_COLUMN = 2, EX_SCALAR = 3 };
/* CT_NV_MAX, CT_MAX_OUT, CT_MAX_EXTRA and the tile's record ct_tile (the slots the generated tiles read):
   codegen/glue/contract.py, CT_TILE. */
#define CT_TARGET_TASKS 64
#define CT_TASK_MIN_FLOPS 262144.0
#define CT_PACKED_TASKS 16
/* Below this many FLOPs a kernel runs on the calling thread: waking onnxruntime's pool (its threads sleep between
   ops when spinning is off) and reading the input from the other core's cache cost more than the second core
   saves. The library's tables set it (library.py, INLINE_FLOPS); the optimizer times the chosen plan with a
   larger value too and keeps the faster (driver/decision.py, _inline_choice). */
#define CT_INLINE_FLOPS seq_inline_flops()

static int seq_value_bf16(const void *v); /* sequence_exec.c: a tensor of a sequence's own kept in bfloat16 */

typedef struct {
  const onnxopt_ct_desc *d;
  int64_t items, groups, M, K, P; /* P: columns per row of C (OH * OW, or N of a matmul) */
  int64_t K_rows;                  /* rows of a packed conv weights block, or of a bfloat16 B panel (K rounded up
                                      to pairs), when more than K are stored; 0: K */
  int64_t mblocks, ptiles, ptasks, mtasks;
  int64_t block; /* rows a row block: the register tile's mi, or 16 x amx_groups where the AMX tiles run */
  int amx;       /* a bfloat16 packed B on AMX tiles (codegen/compute/amx_tile.py): ct_amx */
  const uint16_t *a16; /* on AMX tiles: A's whole-16 rows rounded to bfloat16 once for the op (ct_round_a), [items]
                          [m16][K rounded up to 32]; NULL: each task rounds its own rows */
  int64_t m16;
  int a_bf16; /* A is a sequence's bfloat16 tensor (seq_value_bf16): a16 is A itself, nothing to round */
  int out16;  /* the one output is a sequence's bfloat16 tensor: the AMX tiles write it so (amx_tiles16) */
  int failed; /* set by a task that could not write such an output (ct_run returns the error) */
  int rows_mode;
  int64_t OH, OW, Wph, cseg;
  const float *a, *b;
  int64_t *a_off, *b_off; /* per item, in floats */
  int64_t a_ms, a_ks;
  const int64_t *koff;
  float *out[CT_MAX_OUT];
  const float *extra[CT_MAX_EXTRA];
  int64_t extra_count[CT_MAX_EXTRA]; /* elements per batch item (POSITION/CHANNEL) */
  /* a packed-B matmul's schedule (the descriptor's `sched`, or the C entry point's): K a block, panels an L2 group,
     panel tasks, row tasks; 0: the formulas below */
  int64_t sched[4];
  struct ct_pool *pool; /* the C entry point's threads (entry_exec.c); NULL: onnxruntime's pool through the context */
} ct_job;

static OrtStatus *ct_pool_run(struct ct_pool *pool, void (*fn)(void *, size_t), size_t total, void *usr);

/* The job's tasks on onnxruntime's thread pool, or on the C entry point's own threads. */
static OrtStatus *ct_parallel(const ct_job *job, OrtKernelContext *ctx, void (*fn)(void *, size_t), size_t total) {
  if (job->pool) return ct_pool_run(job->pool, fn, total, (void *)job);
  if (!ctx) { /* the C entry point on one thread */
    for (size_t i = 0; i < total; i++) fn((void *)job, i);
    return NULL;
  }
  return API(KernelContext_ParallelFor)(ctx, fn, total, 0, (void *)job);
}

/* Bytes per element of a packed B: its op input's element type (1 float, 16 bfloat16, 4 bfloat16's bits as uint16
   before opset 13, 10 float16). The 16-bit forms (onnxopt/driver/precision.py) are laid out with the same element
   offsets as float32's; bfloat16 in pairs along K, so its K blocks stay even. */
static int64_t ct_packed_b_size(const onnxopt_ct_desc *d) {
  int t = d->sig.in_types[1];
  return t == 16 || t == 10 || t == 4 ? 2 : (int64_t)sizeof(float);
}

/* K per block of a packed-B matmul: one panel's block of B, KC x (ni * lanes) elements, fits L1 (16 KiB); the
   partial sums wait in a per-task buffer between blocks. */
static int64_t ct_packed_kc(const ct_job *job, int64_t K) {
  const onnxopt_ct_desc *d = job->d;
  int64_t esize = ct_packed_b_size(d);
  if (job->sched[0] > 0) { /* the searched K block; a 16-bit B's in whole pairs */
    int64_t kc = esize == 2 ? (job->sched[0] + 1) & ~(int64_t)1 : job->sched[0];
    return kc < K ? kc : K;
  }
  int64_t kc = 16384 / (d->packed_b * esize);
  if (esize == 2) kc &= ~(int64_t)31; /* whole bfloat16 pairs, and whole AMX steps of 32 */
  if (kc < 128) kc = 128;
  return K <= kc + kc / 2 ? K : kc;
}

/* Panels per group: the group's blocks of B (about 128 KiB) stay in L2 while a row block of A (mi rows x KC) stays
   in L1 and meets every panel of the group, so A streams from memory once per group rather than once per panel
   (GotoBLAS's order; at 512 tokens A is larger than L2). */
static int64_t ct_packed_group(const ct_job *job, int64_t K) {
  const onnxopt_ct_desc *d = job->d;
  if (job->sched[1] > 0) return job->sched[1];
  int64_t kc = ct_packed_kc(job, K);
  int64_t block = (kc > 0 ? kc : 1) * d->packed_b * ct_packed_b_size(d);
  int64_t g = 131072 / block;
  return g < 1 ? 1 : g;
}

/* Whether a bfloat16 packed B runs on the AMX tiles: the library has them, the CPU has AMX-BF16 and the OS granted
   the tile state (matrix_engine.c), and the panels are stored in whole tile steps of 32 K (for a target with
   AMX-BF16 the packing pads them so: driver/precision.py), so no tile load reads past the weights. */
static int ct_amx(const ct_job *job) {
  const onnxopt_ct_desc *d = job->d;
  int64_t KB = job->K_rows ? job->K_rows : job->K;
  int unit = d->sig.in_types[1] == 10 ? AMX_FP16 : AMX_BF16; /* float16 weights: tdpfp16ps, else tdpbf16ps */
  return d->packed_b && d->amx_groups > 0 && KB % 32 == 0 && amx_ok(unit);
}

/* Scratch of the calling thread kept from call to call, one per use (CT_SCRATCH_*): a fresh buffer per task (hundreds
   of KB: an mmap) page-faults on first touch every run, which cost a bf16 GEMM at BERT's sizes a fifth of its time.
   Each grows to the largest the thread has needed and lives as long as the thread (onnxruntime's pool threads live
   as long as its environment). NULL when memory is short: the callers then do without. */
enum { CT_SCRATCH_SUMS = 0, CT_SCRATCH_A16 = 1, CT_SCRATCH_A16_OP = 2, CT_SCRATCHES = 3 };
static _Thread_local void *ct_scratch_buf[CT_SCRATCHES];
static _Thread_local size_t ct_scratch_cap[CT_SCRATCHES];

static void *ct_scratch(int which, size_t bytes) {
  if (bytes > ct_scratch_cap[which]) {
    bytes = (bytes + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
    void *p = aligned_alloc(64, bytes);
    if (!p) return NULL;
    free(ct_scratch_buf[which]);
    ct_scratch_buf[which] = p;
    ct_scratch_cap[which] = bytes;
  }
  return ct_scratch_buf[which];
}

/* The columns of packed panel `tile` into the tile record; returns its vectors. */
static int ct_panel_columns(const ct_job *job, ct_tile *t, int64_t tile) {
  const onnxopt_ct_desc *d = job->d;
  int nv = 0;
  int64_t p0 = tile * d->packed_b;
  for (int j = 0; j < d->ni && p0 + j * d->lanes < job->P; j++, nv++) {
    int64_t left = job->P - (p0 + j * d->lanes);
    t->voff[j] = j * d->lanes;
    t->coff[j] = p0 + j * d->lanes;
    t->lanes[j] = left < d->lanes ? left : d->lanes;
  }
  return nv;
}

static void ct_run_packed(const ct_job *job, ct_tile *t, const float *a_item, int64_t t0, int64_t t1, int64_t b0,
                          int64_t b1) {
  const onnxopt_ct_desc *d = job->d;
  int64_t K = job->K, NRF = d->packed_b, kc = ct_packed_kc(job, K), group = ct_packed_group(job, K);
  int64_t esize = ct_packed_b_size(d), KB = job->K_rows ? job->K_rows : K; /* rows stored per panel */
  int64_t nkb = K > 0 ? (K + kc - 1) / kc : 1; /* K = 0: one empty block, so the epilogue still runs on zeros */
  int64_t block = job->block;
  float *sums = NULL;
  if (nkb > 1) {
    sums = (float *)ct_scratch(CT_SCRATCH_SUMS, (size_t)((t1 - t0) * (b1 - b0) * block * NRF) * sizeof(float));
    if (!sums) { /* one block over the whole K needs no buffer */
      kc = K;
      nkb = 1;
    }
  }
  for (int64_t kb = 0; kb < nkb; kb++) {
    int64_t k0 = kb * kc;
    t->k = K - k0 < kc ? K - k0 : kc;
    t->phase = nkb == 1 ? 0 : (kb > 0 ? 2 : 0) | (kb < nkb - 1 ? 1 : 0);
    for (int64_t g0 = t0; g0 < t1; g0 += group) {
      int64_t g1 = g0 + group < t1 ? g0 + group : t1;
      for (int64_t mb = b0; mb < b1; mb++) {
        int64_t m0 = mb * block;
        int64_t mi = job->M - m0 < block ? job->M - m0 : block;
        for (int64_t tile = g0; tile < g1; tile++) {
          int nv = ct_panel_columns(job, t, tile);
          t->b = (const float *)((const char *)job->b + (tile * KB * NRF + k0 * NRF) * esize);
          float *acc = sums ? sums + ((tile - t0) * (b1 - b0) + (mb - b0)) * block * NRF : NULL;
          t->m0 = m0;
          t->a = a_item + m0 * job->a_ms + k0;
          t->acc = acc;
          d->tiles[(mi - 1) * d->ni + (nv - 1)]((const int64_t *)t);
        }
      }
    }
  }
}

/* Rows of A a bfloat16 copy holds at once on the AMX path: it stays in L2 (2 MiB a core on Sapphire Rapids) beside
   one B panel while every panel of the task meets it. */
#define CT_AMX_A16_BYTES (1 << 20)

/* K a block on the AMX tiles: a row block's bfloat16 A (32 x 256 x 2 = 16 KiB) stays in L1 while it meets every
   panel of the task, whose B block (32 KiB) streams from L2; with the whole K in one call, A and B both came from L2
   at every panel (a tile step waits on its loads). The sums wait between blocks in a per-thread buffer. */
#define CT_AMX_KC 256

/* A bfloat16 packed B on AMX tiles (codegen/compute/amx_tile.py). The rows of A are rounded to bfloat16 once: for
   the whole op beforehand where several tasks share rows (job->a16, ct_round_a), else by the task, a chunk of rows at
   a time (CT_AMX_A16_BYTES). Then, K block by K block, each row block of the chunk meets every panel of the task.
   Rows below a whole 16 go to the register tiles, over the whole K. */
static void ct_run_amx(const ct_job *job, ct_tile *t, int64_t item, const float *a_item, int64_t t0, int64_t t1,
                       int64_t b0, int64_t b1) {
  const onnxopt_ct_desc *d = job->d;
  int64_t K = job->K, NRF = d->packed_b, KB = job->K_rows ? job->K_rows : K, block = job->block;
  int64_t kp = (K + 31) & ~(int64_t)31, kp1 = kp > 0 ? kp : 32;
  int64_t r_begin = b0 * block, r_end = b1 * block < job->M ? b1 * block : job->M;
  const uint16_t *shared = job->a16 ? job->a16 + item * job->m16 * kp : NULL;
  int64_t chunk = shared ? r_end - r_begin : CT_AMX_A16_BYTES / (2 * kp1) / block * block;
  if (chunk < block) chunk = block;
  if (chunk > r_end - r_begin) chunk = r_end - r_begin;
  uint16_t *a16 = shared ? NULL : (uint16_t *)ct_scratch(CT_SCRATCH_A16, (size_t)(chunk * kp1) * sizeof(uint16_t));
  /* one panel: no A block meets several panels, so the whole K (the blocks would only add the sums' round trips) */
  int64_t nkb = kp <= CT_AMX_KC * 4 / 3 || t1 - t0 < 2 ? 1 : (kp + CT_AMX_KC - 1) / CT_AMX_KC;
  int64_t kc = (kp / nkb + 31) & ~(int64_t)31; /* nearly equal blocks of whole tile steps */
  nkb = kp > 0 ? (kp + kc - 1) / kc : 1;
  float *partial = NULL;
  if (nkb > 1) {
    size_t slots = (size_t)((chunk + block - 1) / block * (t1 - t0));
    partial = (float *)ct_scratch(CT_SCRATCH_SUMS, slots * (size_t)(block * NRF) * sizeof(float));
    if (!partial) { /* no buffer: the whole K in one block */
      nkb = 1;
      kc = kp;
    }
  }
  t->a16_rs = kp;
  int configured = amx_tiles_configure();
  for (int64_t r0 = r_begin; r0 < r_end; r0 += chunk) {
    int64_t r1 = r0 + chunk < r_end ? r0 + chunk : r_end;
    int64_t whole; /* rows on the tiles; no buffer: all on the register tiles */
    const uint16_t *rows16 = a16;
    if (shared) {
      whole = (r1 < job->m16 ? r1 : job->m16) - r0;
      if (whole < 0) whole = 0;
      rows16 = shared + r0 * kp;
    } else {
      whole = a16 ? (r1 - r0) / 16 * 16 : 0;
      if (whole) {
        t->k = K;
        t->a = a_item + r0 * job->a_ms;
        t->a16 = a16;
        t->a16_rows = whole;
        d->amx_round((const int64_t *)t);
      }
    }
    for (int64_t kb = 0; whole && kb < nkb; kb++) {
      int64_t k0 = kb * kc;
      t->k = kp - k0 < kc ? kp - k0 : kc;
      t->phase = (kb > 0 ? 2 : 0) | (kb < nkb - 1 ? 1 : 0);
      for (int64_t r = r0; r < r0 + whole; r += block) {
        int64_t g = (r0 + whole - r) / 16, rows = 16 * (g < d->amx_groups ? g : d->amx_groups);
        for (int64_t tile = t0; tile < t1; tile++) {
          int nv = ct_panel_columns(job, t, tile);
          t->b = (const float *)((const char *)job->b + (tile * KB + k0) * NRF * 2);
          t->m0 = r;
          t->a16 = rows16 + (r - r0) * kp + k0;
          t->acc = partial ? partial + ((r - r0) / block * (t1 - t0) + (tile - t0)) * block * NRF : NULL;
          (job->out16 ? d->amx_tiles16 : d->amx_tiles)[(rows / 16 - 1) * d->ni + (nv - 1)]((const int64_t *)t);
        }
      }
    }
    t->k = K;
    t->phase = 0;
    t->acc = NULL;
    t->a16 = NULL;
    if (job->out16 && whole < r1 - r0) { /* the register tiles write float32: a bfloat16 output cannot take them */
      __atomic_store_n(&((ct_job *)job)->failed, 1, __ATOMIC_RELAXED);
      break;
    }
    for (int64_t tile = t0; whole < r1 - r0 && tile < t1; tile++) {
      int nv = ct_panel_columns(job, t, tile);
      t->b = (const float *)((const char *)job->b + tile * KB * NRF * 2);
      for (int64_t r = r0 + whole; r < r1; r += d->mi) {
        int64_t rows = r1 - r < d->mi ? r1 - r : d->mi;
        t->m0 = r;
        t->a = a_item + r * job->a_ms;
        d->tiles[(rows - 1) * d->ni + (nv - 1)]((const int64_t *)t);
      }
    }
  }
  amx_tiles_release(configured);
}

/* Rows a task of ct_round_a rounds. */
#define CT_ROUND_ROWS 16

static void ct_round_task(void *usr, size_t index) {
  const ct_job *job = (const ct_job *)usr;
  int64_t per_item = job->m16 / CT_ROUND_ROWS, item = (int64_t)index / per_item;
  int64_t r0 = (int64_t)index % per_item * CT_ROUND_ROWS, kp = (job->K + 31) & ~(int64_t)31;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.a = job->a + job->a_off[item] + r0 * job->a_ms;
  t.a_ms = job->a_ms;
  t.k = job->K;
  t.a16 = job->a16 + (item * job->m16 + r0) * kp;
  t.a16_rows = CT_ROUND_ROWS;
  job->d->amx_round((const int64_t *)&t);
}

/* On AMX tiles with the panels split over several tasks, every task would round the same rows of A to bfloat16
   (at BERT's sizes, rounding A took a fifth of the GEMM): round them once for the op, in parallel, into a buffer
   the tasks share. Without the buffer (memory short) the tasks round their own. */
static OrtStatus *ct_round_a(ct_job *job, OrtKernelContext *ctx) {
  if (job->a_bf16) return NULL; /* A is bfloat16 already (ct_matmul) */
  int64_t kp = (job->K + 31) & ~(int64_t)31;
  job->m16 = job->M / 16 * 16;
  if (!job->amx || job->ptasks < 2 || job->m16 == 0 || kp == 0) return NULL;
  uint16_t *a16 = (uint16_t *)ct_scratch(CT_SCRATCH_A16_OP, (size_t)(job->items * job->m16 * kp) * sizeof(uint16_t));
  if (!a16) return NULL;
  job->a16 = a16;
  size_t tasks = (size_t)(job->items * (job->m16 / CT_ROUND_ROWS));
  return ct_parallel(job, ctx, ct_round_task, tasks);
}

static void ct_run_task(const ct_job *job, int64_t task) {
  const onnxopt_ct_desc *d = job->d;
  int64_t per_item = job->ptasks * job->mtasks;
  int64_t item = task / per_item, rem = task % per_item;
  int64_t pt = rem / job->mtasks, mt = rem % job->mtasks;
  int64_t t0 = pt * job->ptiles / job->ptasks, t1 = (pt + 1) * job->ptiles / job->ptasks;
  int64_t b0 = mt * job->mblocks / job->mtasks, b1 = (mt + 1) * job->mblocks / job->mtasks;
  int64_t n = item / job->groups, g = item % job->groups;
  int64_t out_off = item * job->M * job->P;
  ct_tile t;
  memset(&t, 0, sizeof(t));
  t.b = job->b + job->b_off[item];
  t.koff = job->koff;
  t.k = job->K;
  t.ldc = job->P;
  t.a_ms = job->a_ms;
  t.a_ks = job->a_ks;
  for (int o = 0; o < d->sig.n_out; o++) /* in elements: a bfloat16 output's are 2 bytes */
    t.out[o] = job->out16 ? (float *)((uint16_t *)job->out[o] + out_off) : job->out[o] + out_off;
  for (int e = 0; e < d->n_extra; e++) {
    const float *base = job->extra[e] + (d->extra_nstride[e] ? n * job->extra_count[e] : 0);
    if (d->extra_kind[e] == EX_POSITION) base += g * job->M * job->P;
    else if (d->extra_kind[e] == EX_CHANNEL) base += g * job->M;
    t.extra[e] = base;
  }
  const float *a_item = job->a + job->a_off[item];
  if (job->amx) {
    ct_run_amx(job, &t, item, a_item, t0, t1, b0, b1);
    return;
  }
  if (d->packed_b) {
    ct_run_packed(job, &t, a_item, t0, t1, b0, b1);
    return;
  }
  for (int64_t tile = t0; tile < t1; tile++) {
    int nv = 0;
    if (job->rows_mode) {
      int64_t oh0 = (tile / job->cseg) * d->ni, ow0 = (tile % job->cseg) * d->lanes;
      int64_t cols = job->OW - ow0 < d->lanes ? job->OW - ow0 : d->lanes;
      for (int j = 0; j < d->ni && oh0 + j < job->OH; j++, nv++) {
        t.voff[j] = (oh0 + j) * job->Wph + ow0;
        t.coff[j] = (oh0 + j) * job->OW + ow0;
        t.lanes[j] = cols;
      }
    } else {
      int64_t p0 = tile * d->ni * d->lanes;
      for (int j = 0; j < d->ni && p0 + j * d->lanes < job->P; j++, nv++) {
        int64_t left = job->P - (p0 + j * d->lanes);
        t.voff[j] = t.coff[j] = p0 + j * d->lanes;
        t.lanes[j] = left < d->lanes ? left : d->lanes;
      }
    }
    for (int64_t mb = b0; mb < b1; mb++) {
      int64_t m0 = mb * d->mi;
      int64_t mi = job->M - m0 < d->mi ? job->M - m0 : d->mi;
      t.m0 = m0;
      t.a = d->sig.kind == KIND_CONV ? a_item + mb * (job->K_rows ? job->K_rows : job->K) * d->mi
                                     : a_item + m0 * job->a_ms;
      d->tiles[(mi - 1) * d->ni + (nv - 1)]((const int64_t *)&t);
    }
  }
}

static void ct_task(void *usr, size_t index) { ct_run_task((const ct_job *)usr, (int64_t)index); }

/* A packed-B matmul's split: panels x row blocks into about `want` tasks per item (CT_PACKED_TASKS at most, enough
   for balance) with the least traffic from memory. A task reads its rows of A once and its panels of B once (a K
   block of its rows and a group of panel blocks stay in L2 meanwhile), so A is read ptasks times and B mtasks
   times: many panel tasks when B is large (the FFN's second GEMM at few tokens), more row tasks when A is. */
static void ct_plan_packed(ct_job *job, int64_t want) {
  if (job->sched[2] > 0 || job->sched[3] > 0) { /* the searched split: panel tasks x row tasks per item */
    int64_t pt = job->sched[2] > 0 ? job->sched[2] : 1, mt = job->sched[3] > 0 ? job->sched[3] : 1;
    job->ptasks = pt < job->ptiles ? pt : job->ptiles;
    job->mtasks = mt < job->mblocks ? mt : job->mblocks;
    return;
  }
  double a_bytes = (double)job->M * (double)job->K, b_bytes = (double)job->P * (double)job->K, best = -1.0;
  if (want > CT_PACKED_TASKS) want = CT_PACKED_TASKS;
  want = (want + job->items - 1) / job->items;
  if (want > job->ptiles * job->mblocks) want = job->ptiles * job->mblocks;
  job->ptasks = job->ptiles < want ? job->ptiles : want;
  job->mtasks = 1;
  for (int64_t pt = 1; pt <= job->ptiles; pt++) {
    int64_t mt = (want + pt - 1) / pt;
    if (mt > job->mblocks) continue; /* too few tasks this way: a single token's GEMV splits its panels */
    double cost = a_bytes * (double)pt + b_bytes * (double)mt;
    if (best < 0.0 || cost < best) {
      best = cost;
      job->ptasks = pt;
      job->mtasks = mt;
    }
    if (pt * mt >= want && mt == 1) break; /* more panel tasks only add traffic */
  }
}

/* Split the work into tasks: enough for every thread (and for balance), none too small to pay for itself. */
static void ct_plan(ct_job *job) {
  job->amx = ct_amx(job);
  job->block = job->amx ? 16 * (int64_t)job->d->amx_groups : job->d->mi;
  job->mblocks = (job->M + job->block - 1) / job->block;
  double flops = 2.0 * (double)job->items * (double)job->M * (double)job->P * (double)job->K;
  int64_t want = (int64_t)(flops / CT_TASK_MIN_FLOPS);
  if (want > CT_TARGET_TASKS) want = CT_TARGET_TASKS;
  if (want < 1) want = 1;
  if (job->d->packed_b) {
    ct_plan_packed(job, want);
    return;
  }
  job->ptasks = (want + job->items - 1) / job->items;
  if (job->ptasks > job->ptiles) job->ptasks = job->ptiles;
  if (job->ptasks < 1) job->ptasks = 1;
  job->mtasks = (want + job->items * job->ptasks - 1) / (job->items * job->ptasks);
  if (job->mtasks > job->mblocks) job->mtasks = job->mblocks;
  if (job->mtasks < 1) job->mtasks = 1;
}

static OrtStatus *ct_run(ct_job *job, OrtKernelContext *ctx) {
  ct_plan(job);
  if ((job->a_bf16 || job->out16) && !job->amx) /* the sequence keeps such tensors only where the tiles run */
    return fail(ORT_RUNTIME_EXCEPTION, "onnxopt: a bfloat16 tensor inside a sequence met a kernel not on its AMX "
                                       "tiles; set ONNXOPT_SEQUENCE_BF16=0 and report this model");
  int64_t tasks = job->items * job->ptasks * job->mtasks;
  double flops = 2.0 * (double)job->items * (double)job->M * (double)job->P * (double)job->K;
  OrtStatus *st = NULL;
  if (tasks == 1 || flops < CT_INLINE_FLOPS) {
    job->ptasks = job->mtasks = 1;
    for (int64_t i = 0; i < job->items; i++) ct_run_task(job, i);
  } else {
    st = ct_round_a(job, ctx);
    if (!st) st = ct_parallel(job, ctx, ct_task, (size_t)tasks);
  }
  if (!st && job->failed)
    st = fail(ORT_FAIL, "onnxopt: out of memory for a bfloat16 GEMM's rows inside a sequence; set "
                        "ONNXOPT_SEQUENCE_BF16=0");
  return st;
}

typedef struct {
  const float *x;
  float *pad;
  int64_t H, W, sh, sw, pt, pl, Hph, Wph;
  int64_t C, L; /* L > 0: x is blocked [N][C / L][H][W][L] */
} ct_pad_job;

/* Where channel `index` (= n * C + c) of the input starts, and the distance between its pixels. */
static const float *ct_channel_src(const float *x, int64_t index, int64_t C, int64_t L, int64_t HW, int64_t *es) {
  if (L == 0) {
    *es = 1;
    return x + index * HW;
  }
  int64_t n = index / C, c = index % C, cb = (C + L - 1) / L;
  *es = L;
  return x + ((n * cb + c / L) * HW) * L + c % L;
}

static void ct_pad_channel(void *usr, size_t index) {
  const ct_pad_job *p = (const ct_pad_job *)usr;
  int64_t es;
  const float *src = ct_channel_src(p->x, (int64_t)index, p->C, p->L, p->H * p->W, &es);
  float *dst = p->pad + (int64_t)index * p->sh * p->sw * p->Hph * p->Wph;
  for (int64_t a = 0; a < p->sh; a++)
    for (int64_t bb = 0; bb < p->sw; bb++)
      for (int64_t r = 0; r < p->Hph; r++, dst += p->Wph) {
        int64_t ih = r * p->sh + a - p->pt;
        if (ih < 0 || ih >= p->H) {
          memset(dst, 0, (size_t)p->Wph * sizeof(float));
          continue;
        }
        const float *row = src + ih * p->W * es;
        if (p->sw == 1 && es == 1) {
          int64_t c0 = p->pl, n = p->W; /* dst[c] = row[c - pl] */
          if (c0 + n > p->Wph) n = p->Wph - c0;
          memset(dst, 0, (size_t)(c0 < p->Wph ? c0 : p->Wph) * sizeof(float));
          if (n > 0) memcpy(dst + c0, row, (size_t)n * sizeof(float));
          if (c0 + (n > 0 ? n : 0) < p->Wph)
            memset(dst + c0 + (n > 0 ? n : 0), 0, (size_t)(p->Wph - c0 - (n > 0 ? n : 0)) * sizeof(float));
        } else {
          for (int64_t c = 0; c < p->Wph; c++) {
            int64_t iw = c * p->sw + bb - p->pl;
            dst[c] = iw >= 0 && iw < p->W ? row[iw * es] : 0.0f;
          }
        }
      }
}

/* im2col: row k = (ic, r, c) of item i holds the tap's input value for every output pixel, zeros for padding. */
typedef struct {
  const float *x;
  float *col;
  int64_t C, H, W, ic_g, groups, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
  int64_t L; /* L > 0: x is blocked */
} ct_col_job;

static void ct_col_row(void *usr, size_t index) {
  const ct_col_job *p = (const ct_col_job *)usr;
  int64_t K = p->ic_g * p->kh * p->kw;
  int64_t item = (int64_t)index / K, k = (int64_t)index % K;
  int64_t n = item / p->groups, g = item % p->groups;
  int64_t ic = k / (p->kh * p->kw), r = (k / p->kw) % p->kh, c = k % p->kw;
  int64_t es;
  const float *src = ct_channel_src(p->x, n * p->C + g * p->ic_g + ic, p->C, p->L, p->H * p->W, &es);
  float *dst = p->col + (int64_t)index * p->OH * p->OW;
  for (int64_t oh = 0; oh < p->OH; oh++) {
    int64_t ih = oh * p->sh - p->pt + r * p->dh;
    float *row = dst + oh * p->OW;
    if (ih < 0 || ih >= p->H) {
      memset(row, 0, (size_t)p->OW * sizeof(float));
      continue;
    }
    const float *in = src + ih * p->W * es;
    for (int64_t ow = 0; ow < p->OW; ow++) {
      int64_t iw = ow * p->sw - p->pl + c * p->dw;
      row[ow] = iw >= 0 && iw < p->W ? in[iw * es] : 0.0f;
    }
  }
}

static OrtStatus *ct_dims(OrtKernelContext *ctx, size_t i, const OrtValue **v, int64_t *dims, size_t *rank) {
  OrtTensorTypeAndShapeInfo *info;
  CHECK(API(KernelContext_GetInput)(ctx, i, v));
  CHECK(API(GetTensorTypeAndShape)(*v, &info));
  OrtStatus *st = API(GetDimensionsCount)(info, rank);
  if (!st && *rank > MAX_RANK) st = fail(ORT_INVALID_ARGUMENT, "onnxopt: tensor rank above 12");
  if (!st) st = API(GetDimensions)(info, dims, *rank);
  API(ReleaseTensorTypeAndShapeInfo)(info);
  return st;
}

static OrtStatus *ct_check_input(const onnxopt_ct_desc *d, const int64_t *xd, size_t xr);

/* A convolution's op inputs 0 (its input, checked against what the kernel was built for) and 1 (packed weights). */
static OrtStatus *ct_conv_inputs(const onnxopt_ct_desc *d, OrtKernelContext *ctx, const OrtValue **xv, int64_t *xd,
                                 size_t *xr, const OrtValue **wv) {
  int64_t wd[MAX_RANK];
  size_t wr;
  CHECK(ct_dims(ctx, 0, xv, xd, xr));
  CHECK(ct_dims(ctx, 1, wv, wd, &wr));
  return ct_check_input(d, xd, *xr);
}

static int64_t ct_numel(const int64_t *dims, size_t rank) {
  int64_t n = 1;
  for (size_t j = 0; j < rank; j++) n *= dims[j];
  return n;
}

/* Epilogue inputs: pointers, and a check that each has the size the optimizer planned for. `skip`: the epilogue
   input that is not an op input (an AFUSION MISO kernel computes it), -1 for none; its pointer is left NULL. */
static OrtStatus *ct_extras_at(const onnxopt_ct_desc *d, ct_job *job, OrtKernelContext *ctx, int first_input,
                               int64_t batch, int64_t per_item_position, int64_t channels, int64_t columns, int skip) {
  for (int e = 0; e < d->n_extra; e++) {
    int64_t want = 1;
    switch (d->extra_kind[e]) {
      case EX_POSITION: want = per_item_position; break;
      case EX_CHANNEL: want = channels; break;
      case EX_COLUMN: want = columns; break;
      default: want = 1;
    }
    job->extra_count[e] = want;
    if (e == skip) {
      job->extra[e] = NULL;
      continue;
    }
    const OrtValue *v;
    int64_t dims[MAX_RANK];
    size_t rank;
    CHECK(ct_dims(ctx, (size_t)(first_input + e - (skip >= 0 && e > skip)), &v, dims, &rank));
    CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&job->extra[e]));
    int64_t have = ct_numel(dims, rank);
    if (d->extra_nstride[e] != 0) want *= batch;
    if (have != want)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: an input of a fused epilogue has a different size than the "
                                        "kernel was built for; re-run onnxopt with --input-shape for these inputs");
  }
  return NULL;
}

/* A compute op's epilogue inputs are its inputs 2.. (after the input and the weights). */
static OrtStatus *ct_extras(const onnxopt_ct_desc *d, ct_job *job, OrtKernelContext *ctx, int64_t batch,
                            int64_t per_item_position, int64_t channels, int64_t columns) {
  return ct_extras_at(d, job, ctx, 2, batch, per_item_position, channels, columns, -1);
}

static OrtStatus *ct_outputs(const onnxopt_ct_desc *d, ct_job *job, OrtKernelContext *ctx, const int64_t *dims,
                             size_t rank) {
  for (int o = 0; o < d->sig.n_out; o++) {
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, (size_t)o, dims, rank, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&job->out[o]));
    if (seq_value_bf16(ov)) { /* the sequence keeps it in bfloat16: only the AMX tiles' bf16 variants write it */
      if (d->sig.n_out != 1 || !d->amx_tiles16)
        return fail(ORT_RUNTIME_EXCEPTION, "onnxopt: a kernel without bfloat16 outputs was given one inside a "
                                           "sequence; set ONNXOPT_SEQUENCE_BF16=0 and report this model");
      job->out16 = 1;
    }
  }
  return NULL;
}

static int64_t ct_same_pad(int64_t in, int64_t k, int64_t s, int64_t dil) {
  int64_t out = (in + s - 1) / s, need = (out - 1) * s + (k - 1) * dil + 1 - in;
  return need > 0 ? need : 0;
}

/* Pads (explicit or SAME) and the output size of a convolution on an H x W input. */
static OrtStatus *ct_conv_geometry(const onnxopt_ct_desc *d, int64_t H, int64_t W, int64_t *pt, int64_t *pl,
                                   int64_t *pb, int64_t *pr, int64_t *OH, int64_t *OW) {
  *pt = d->pads[0], *pl = d->pads[1], *pb = d->pads[2], *pr = d->pads[3];
  if (d->auto_pad) {
    int64_t th = ct_same_pad(H, d->kh, d->sh, d->dh), tw = ct_same_pad(W, d->kw, d->sw, d->dw);
    *pt = d->auto_pad == 1 ? th / 2 : th - th / 2;
    *pl = d->auto_pad == 1 ? tw / 2 : tw - tw / 2;
    *pb = th - *pt;
    *pr = tw - *pl;
  }
  if (H + *pt + *pb < (d->kh - 1) * d->dh + 1 || W + *pl + *pr < (d->kw - 1) * d->dw + 1)
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the convolution's input is smaller than its kernel");
  *OH = (H + *pt + *pb - ((d->kh - 1) * d->dh + 1)) / d->sh + 1;
  *OW = (W + *pl + *pr - ((d->kw - 1) * d->dw + 1)) / d->sw + 1;
  return NULL;
}

static OrtStatus *ct_check_input(const onnxopt_ct_desc *d, const int64_t *xd, size_t xr) {
  int64_t C = d->ic_g * d->groups;
  if (d->in_blocked) {
    if (xr != 5 || xd[1] != (C + d->lanes - 1) / d->lanes || xd[4] != d->lanes)
      return fail(ORT_INVALID_ARGUMENT, "onnxopt: the convolution's input is not in the blocked layout "
                                        "[N, C / lanes, H, W, lanes] the kernel was built for");
  } else if (xr != 4 || xd[1] != C) {
    return fail(ORT_INVALID_ARGUMENT, "onnxopt: the convolution's input is not [N, C, H, W] with the channels the "
                                      "kernel was built for");
  }
  return NULL;
}
