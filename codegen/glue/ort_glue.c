/*
 * onnxopt's ONNX Runtime glue: the custom-op tables and RegisterCustomOps for one kernel library.
 *
 * Written from the documented layout of the ORT C API (docs/ort-c-api-layout.md), with no ORT header: the OrtApi is
 * a table of function pointers indexed by position, and positions never change because the C API only appends.
 * We ask for API version 17, the oldest that has KernelContext_ParallelFor, so one library runs on every newer ORT.
 *
 * The per-library part (see library.py) is a file of its own: this file's prelude (up to the @@LIBRARY@@ mark)
 * followed by the kernel declarations, the descriptors, ONNXOPT_OPS[], onnxopt_n_ops and onnxopt_cpu_ok(). The rest
 * of this file, the runtime, is compiled once and shared by every library.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ONNXOPT_API_VERSION 17
#define MAX_RANK 12
#define MAX_ARGS 64
#define CHUNK_MIN_ELEMENTS 16384
#define MAX_CHUNKS 256

typedef void OrtStatus;
typedef void OrtValue;
typedef void OrtKernelContext;
typedef void OrtSessionOptions;
typedef void OrtCustomOpDomain;
typedef void OrtTensorTypeAndShapeInfo;
typedef void *const *OrtApiTable;

typedef struct {
  OrtApiTable (*GetApi)(uint32_t version);
  const char *(*GetVersionString)(void);
} OnnxoptApiBase;

/* Positions in the OrtApi table (docs/ort-c-api-layout.md). */
enum {
  API_CreateStatus = 0,
  API_CreateCustomOpDomain = 26,
  API_CustomOpDomain_Add = 27,
  API_AddCustomOpDomain = 28,
  API_GetTensorMutableData = 51,
  API_GetDimensionsCount = 61,
  API_GetDimensions = 62,
  API_GetTensorTypeAndShape = 65,
  API_KernelContext_GetInput = 90,
  API_KernelContext_GetOutput = 91,
  API_ReleaseStatus = 93,
  API_ReleaseTensorTypeAndShapeInfo = 99,
  API_HasSessionConfigEntry = 237,
  API_GetSessionConfigEntry = 238,
  API_KernelContext_ParallelFor = 274,
};
enum { ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2, ORT_RUNTIME_EXCEPTION = 6 };

typedef OrtStatus *(*CreateStatus_t)(int code, const char *msg);
typedef OrtStatus *(*CreateCustomOpDomain_t)(const char *domain, OrtCustomOpDomain **out);
typedef OrtStatus *(*CustomOpDomain_Add_t)(OrtCustomOpDomain *domain, const void *op);
typedef OrtStatus *(*AddCustomOpDomain_t)(OrtSessionOptions *options, OrtCustomOpDomain *domain);
typedef OrtStatus *(*GetTensorMutableData_t)(OrtValue *value, void **out);
typedef OrtStatus *(*GetDimensionsCount_t)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
typedef OrtStatus *(*GetDimensions_t)(const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n);
typedef OrtStatus *(*GetTensorTypeAndShape_t)(const OrtValue *value, OrtTensorTypeAndShapeInfo **out);
typedef OrtStatus *(*KernelContext_GetInput_t)(const OrtKernelContext *ctx, size_t index, const OrtValue **out);
typedef OrtStatus *(*KernelContext_GetOutput_t)(OrtKernelContext *ctx, size_t index, const int64_t *dims,
                                                size_t ndims, OrtValue **out);
typedef void (*ReleaseTensorTypeAndShapeInfo_t)(OrtTensorTypeAndShapeInfo *info);
typedef void (*ReleaseStatus_t)(OrtStatus *status);
typedef OrtStatus *(*HasSessionConfigEntry_t)(const OrtSessionOptions *options, const char *key, int *out);
typedef OrtStatus *(*GetSessionConfigEntry_t)(const OrtSessionOptions *options, const char *key, char *value,
                                              size_t *size);
typedef OrtStatus *(*KernelContext_ParallelFor_t)(const OrtKernelContext *ctx, void (*fn)(void *, size_t),
                                                  size_t total, size_t num_batch, void *usr_data);

#define API(name) ((name##_t)g_api[API_##name])
#define CHECK(call)                   \
  do {                                \
    OrtStatus *status_ = (call);      \
    if (status_) return status_;      \
  } while (0)

/* The OrtCustomOp struct: a uint32 version, then 25 function pointers (208 bytes on LP64). */
typedef struct OnnxoptCustomOp OnnxoptCustomOp;
struct OnnxoptCustomOp {
  uint32_t version;
  void *(*CreateKernel)(const OnnxoptCustomOp *op, const void *api, const void *info);
  const char *(*GetName)(const OnnxoptCustomOp *op);
  const char *(*GetExecutionProviderType)(const OnnxoptCustomOp *op);
  int (*GetInputType)(const OnnxoptCustomOp *op, size_t index);
  size_t (*GetInputTypeCount)(const OnnxoptCustomOp *op);
  int (*GetOutputType)(const OnnxoptCustomOp *op, size_t index);
  size_t (*GetOutputTypeCount)(const OnnxoptCustomOp *op);
  void (*KernelCompute)(void *kernel, OrtKernelContext *ctx);
  void (*KernelDestroy)(void *kernel);
  int (*GetInputCharacteristic)(const OnnxoptCustomOp *op, size_t index);
  int (*GetOutputCharacteristic)(const OnnxoptCustomOp *op, size_t index);
  int (*GetInputMemoryType)(const OnnxoptCustomOp *op, size_t index);
  int (*GetVariadicInputMinArity)(const OnnxoptCustomOp *op);
  int (*GetVariadicInputHomogeneity)(const OnnxoptCustomOp *op);
  int (*GetVariadicOutputMinArity)(const OnnxoptCustomOp *op);
  int (*GetVariadicOutputHomogeneity)(const OnnxoptCustomOp *op);
  OrtStatus *(*CreateKernelV2)(const OnnxoptCustomOp *op, const void *api, const void *info, void **kernel);
  OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *ctx);
  OrtStatus *(*InferOutputShapeFn)(const OnnxoptCustomOp *op, void *ctx);
  int (*GetStartVersion)(const OnnxoptCustomOp *op);
  int (*GetEndVersion)(const OnnxoptCustomOp *op);
  void *GetMayInplace, *ReleaseMayInplace, *GetAliasMap, *ReleaseAliasMap;
};

typedef void (*row_fn)(void **ins, void **outs, int64_t n);
typedef void (*generic_fn)(void **ins, void **outs, int64_t n, const int64_t *inner_strides);

/* What every fused op type declares to ORT; the first member of each kind's descriptor. */
enum { KIND_ELEMENTWISE = 0, KIND_CONV = 1, KIND_MATMUL = 2, KIND_POOL = 3, KIND_AFUSION = 4, KIND_SIBLINGS = 5,
       KIND_COPY = 6, KIND_SEQUENCE = 7 };
typedef struct {
  const char *name;
  int kind;
  int n_in, n_out;
  const int *in_types, *out_types; /* ONNXTensorElementDataType */
} onnxopt_sig;

/* One fused op type of kind Elementwise. */
typedef struct {
  onnxopt_sig sig;
  int out_rank;
  const int *in_sizes, *out_sizes;    /* bytes per element */
  int n_variants;
  const uint32_t *variant_masks;
  const row_fn *variants;
  generic_fn generic;
  const uint32_t *out_deps; /* per output: bitmask of the inputs it depends on */
  int64_t parallel_min;     /* below this many elements one thread is faster than a dispatch to the pool */
} onnxopt_ew_desc;

/* A convolution or matmul with its fused epilogue (compute_exec.c runs it). */
typedef void (*tile_fn)(const int64_t *tile);
typedef struct {
  onnxopt_sig sig;
  int mi, ni, lanes;            /* the micro-kernel's register tile */
  const tile_fn *tiles;         /* [mi - 1][nv - 1] */
  int n_extra;                  /* epilogue inputs after the accumulator: op inputs 2.. */
  const int *extra_kind;        /* POSITION, CHANNEL, COLUMN, SCALAR (tile.py) */
  const int64_t *extra_nstride; /* elements between batch items, 0 when shared by the batch */
  /* Conv: weights packed [groups][ceil(oc_g / mi)][ic_g * kh * kw][mi] (op input 1). */
  int64_t oc, groups, kh, kw, sh, sw, dh, dw, pads[4]; /* pads: top, left, bottom, right */
  int auto_pad;                 /* 0 explicit/VALID, 1 SAME_UPPER, 2 SAME_LOWER */
  int64_t ic_g;
  /* MatMul/Gemm: A row-major, or transposed (Gemm transA). */
  int trans_a;
  /* Conv layouts: the input, and the outputs with their per-pixel epilogue inputs, in the blocked layout
     [N][C / lanes][H][W][lanes] (compute_exec.c, ct_conv_blocked). A blocked output has weights packed
     [ceil(oc / (ni * lanes))][ic_g * kh * kw][ni * lanes]. */
  int in_blocked, out_blocked;
  int channel_vectors; /* the blocked kernel (vectors of output channels) even though the outputs are NCHW */
  /* ConvTranspose (always on the blocked kernel): op input 0 is [N, IC, H, W] (ic_g = IC), weights packed
     [ceil(oc / (ni * lanes))][sh][sw][ceil(kh / sh)][ceil(kw / sw)][IC][ni * lanes], or with few output
     channels (channel_vectors 0) [sh][sw][ceil(oc / mi)][ceil(kh / sh)][ceil(kw / sw)][IC][mi] (compute_exec.c). */
  int transposed;
  int64_t out_pad[2]; /* output_padding: rows, columns */
  /* Winograd F(m x m, 3 x 3) (winograd_exec.c), m > 0: `tiles` are the per-position products (empty epilogue),
     weights packed [ceil(oc / (ni * lanes))][(m + 2)^2][ic][ni * lanes]; the transforms (codegen/compute/winograd.py)
     run the epilogue. */
  int wino_m;
  tile_fn wino_in, wino_out;
} onnxopt_ct_desc;

/* A convolution and the convolutions that read its output (one: SISO; more: SIMO), fused by bands of output rows
   (afusion_exec.c): the first's output stays in a scratch band. */
#define AF_MAX_SECOND 4
typedef struct {
  onnxopt_sig sig;
  const onnxopt_ct_desc *first; /* the parts' sigs name nothing: only this op is registered */
  int n_second;
  const onnxopt_ct_desc *second[AF_MAX_SECOND];
  int second_input[AF_MAX_SECOND]; /* op input index of each second convolution's packed weights */
  int64_t band_rows;               /* output rows of the second convolutions per band */
  int miso_extra; /* MISO: the second's epilogue input that is the first's output (not an op input); else -1 */
  /* conv -> pool (n_second 0): pool_op 1 MaxPool, 2 AveragePool (0: the seconds are convolutions). Pads: top, left,
     bottom, right; the output is blocked. */
  int pool_op, pool_ceil, pool_include_pad;
  int64_t pool_k[2], pool_s[2], pool_d[2], pool_pads[4];
  int chain; /* a chain of three (afusion_chain_exec.c): second[0] reads the first's output, second[1] reads its */
} onnxopt_af_desc;

/* Sibling convolutions reading the same input (op input 0), run as one kernel (siblings_exec.c): horizontal fusion. */
#define SB_MAX_PART 8
typedef struct {
  onnxopt_sig sig;
  int n_part;
  const onnxopt_ct_desc *part[SB_MAX_PART]; /* the parts' sigs name nothing: only this op is registered */
  int part_input[SB_MAX_PART];              /* op input index of each sibling's packed weights */
  int part_output[SB_MAX_PART];             /* op output index of each sibling's first output */
} onnxopt_sb_desc;

/* MaxPool / AveragePool (2-D) or GlobalMaxPool / GlobalAveragePool with a fused epilogue (pool_exec.c runs it). */
enum { POOL_MAX = 0, POOL_AVG = 1, POOL_GMAX = 2, POOL_GAVG = 3 };
typedef void (*pool_fn)(const int64_t *args);
typedef struct {
  onnxopt_sig sig;
  int op, lanes;
  pool_fn rows;                 /* windowed: a band of output rows of one plane (codegen/pool/kernels.py) */
  pool_fn global;               /* global: up to `lanes` channels */
  int64_t kh, kw, sh, sw, dh, dw, pads[4]; /* pads: top, left, bottom, right */
  int auto_pad;                 /* 0 explicit, 1 SAME_UPPER, 2 SAME_LOWER, 3 VALID */
  int ceil_mode, count_include_pad;
  int rank;                     /* of the input: 4 for windowed pools, >= 3 for global ones */
  int n_extra;                  /* epilogue inputs: op inputs 1.. */
  const int *extra_kind;        /* POSITION, CHANNEL, COLUMN (unused), SCALAR */
  const int64_t *extra_nstride; /* 1: has the batch dim, 0: shared by the batch */
  int blocked;                  /* lanes of a blocked input [N, C / L, H, W, L], or 0 */
  int64_t exit_channels;        /* a blocked global pool that writes NCHW [N, C, 1, 1]: C; 0 writes it blocked */
} onnxopt_pool_desc;

/* A Concat of blocked tensors along their channel blocks, each input first repeated by integer factors along the
   rows and columns (a nearest Resize): copy_exec.c. Inputs and output are [N, C / lanes, H, W, lanes]. */
#define CP_MAX_IN 16
typedef struct {
  onnxopt_sig sig;
  int lanes;                            /* 0: a plain Concat of float tensors along `axis` */
  int64_t fh[CP_MAX_IN], fw[CP_MAX_IN]; /* per input: rows and columns repeated */
  int axis;
  /* A Slice (lanes 0, one input): the input's planned dims and the box [start, end) per axis, all of rank
     slice_rank (0: not a slice). */
  int slice_rank;
  int64_t slice_dims[MAX_RANK], slice_start[MAX_RANK], slice_end[MAX_RANK];
} onnxopt_copy_desc;

/* A run of ops executed in one parallel section (sequence_exec.c). One step: an op of the library, with where its
   inputs come from and where its outputs go. */
typedef struct {
  const onnxopt_sig *op;
  int n_in, n_out;
  const int *in;  /* >= 0: the sequence's input; < 0: the tensor of slot -1 - in */
  const int *out; /* the slot of each output */
} onnxopt_seq_step;

typedef struct {
  onnxopt_sig sig;
  int n_steps;
  const onnxopt_seq_step *steps;
  int n_slots;            /* one per tensor a step writes */
  const int *slot_output; /* the sequence's output a slot is, or -1: kept in buffer slot_buffer[slot] */
  const int *slot_buffer; /* slots whose lives do not overlap share a buffer (emit/sequence.py) */
  int n_buffers;
  int arena; /* its index in onnxopt_seq_arenas */
  /* Per slot: the Concat output slot it is written inside (a view), or -1; along which axis, at which offset, how
     many positions, of the whole's how many (emit/sequence.py, SlotView). */
  const int *view_whole, *view_axis;
  const int64_t *view_offset, *view_units, *view_total;
} onnxopt_seq_desc;

typedef struct {
  OnnxoptCustomOp base; /* first, so an OnnxoptCustomOp* is also an onnxopt_op* */
  const onnxopt_sig *desc;
} onnxopt_op;

/* ---- The per-library part is inserted here by the generator. ---- */
/*@@LIBRARY@@*/

static OrtApiTable g_api; /* what the executors call: onnxruntime's table with sequence_exec.c's stand-ins */
static OrtApiTable g_ort;  /* onnxruntime's own entries */
static void *g_ort_copy[API_KernelContext_ParallelFor + 1];

/* The run of a sequence op (sequence_exec.c) whose driver this thread is, or NULL. */
typedef struct seq_run seq_run;
static _Thread_local seq_run *tl_seq;
static double seq_inline_flops(void); /* CT_INLINE_FLOPS: lower inside a sequence, whose helpers are awake */

/* ---- Elementwise execution: broadcast, coalesce, split into chunks of rows. ---- */

typedef struct {
  const onnxopt_ew_desc *d;
  int nd;                        /* coalesced rank, >= 1 */
  int64_t dims[MAX_RANK];        /* coalesced output dims; dims[nd-1] is the row length */
  int64_t strides[MAX_ARGS][MAX_RANK]; /* per input, in elements (0: broadcast) */
  int64_t inner[MAX_ARGS];       /* per input, stride along the row (0 or 1) */
  char *in_base[MAX_ARGS];
  char *out_base[MAX_ARGS];
  int64_t total, chunk;
  row_fn row;                    /* NULL: use generic */
} ew_job;

static void ew_run_range(const ew_job *job, int64_t e0, int64_t e1) {
  const onnxopt_ew_desc *d = job->d;
  const int64_t L = job->dims[job->nd - 1];
  void *ins[MAX_ARGS], *outs[MAX_ARGS];
  int64_t e = e0;
  while (e < e1) {
    int64_t row = e / L, col = e % L;
    int64_t n = L - col;
    if (n > e1 - e) n = e1 - e;
    for (int i = 0; i < d->sig.n_in; i++) {
      int64_t off = 0, r = row;
      for (int j = job->nd - 2; j >= 0; j--) {
        off += (r % job->dims[j]) * job->strides[i][j];
        r /= job->dims[j];
      }
      off += col * job->inner[i];
      ins[i] = job->in_base[i] + off * d->in_sizes[i];
    }
    for (int k = 0; k < d->sig.n_out; k++) outs[k] = job->out_base[k] + e * d->out_sizes[k];
    if (job->row)
      job->row(ins, outs, n);
    else
      d->generic(ins, outs, n, job->inner);
    e += n;
  }
}

static void ew_chunk(void *usr, size_t index) {
  const ew_job *job = (const ew_job *)usr;
  int64_t e0 = (int64_t)index * job->chunk;
  int64_t e1 = e0 + job->chunk;
  if (e1 > job->total) e1 = job->total;
  ew_run_range(job, e0, e1);
}

static OrtStatus *fail(int code, const char *msg) { return API(CreateStatus)(code, msg); }

/* Buffers for one call (padded copies, blocked scratch, Winograd products), 64-byte aligned, released with
   glue_release. The library keeps the last GLUE_CACHE_SLOTS released ones for the next calls, so a run's kernels
   take over each other's buffers instead of a fresh malloc per call. With the same kernels (one library linked
   with either glue), NASNet-A ran 1.10x faster, ResNet-50 1.02x, UNet-16 1.04x. A warm session page-faulted no
   more without the cache than with it (0 minor faults a run in both), so the gain is not the mmap of fresh blocks;
   the likeliest cause (not measured) is that a reused block is still in cache.
   One cache for the process, under a spin lock (a few slots scanned; calls and Winograd tasks take it once each):
   a cache per thread leaked with every session, whose pool threads exit with it (1.8 MB a session on UNet-16).
   It holds GLUE_CACHE_BYTES at most and is freed when the library is unloaded. */
#define GLUE_CACHE_SLOTS 16
#define GLUE_CACHE_BYTES ((size_t)64 << 20) /* larger ones are freed: one large batch must not pin them */
#define GLUE_HEADER 64 /* keeps the block's capacity; the caller's pointer stays 64-byte aligned */

static void *glue_cache[GLUE_CACHE_SLOTS];
static size_t glue_cached_bytes;
static atomic_flag glue_lock = ATOMIC_FLAG_INIT;
static int64_t glue_fresh; /* buffers allocated so far (not taken from the cache), for onnxopt_fresh_buffers */

/* How many call buffers the library has allocated rather than reused: a warm session's count stays put. */
__attribute__((visibility("default"))) int64_t onnxopt_fresh_buffers(void) {
  return __atomic_load_n(&glue_fresh, __ATOMIC_RELAXED);
}

/* The library's CT_INLINE_FLOPS (compute_exec.c), for the tests and for tools that inspect a library. */
__attribute__((visibility("default"))) double onnxopt_inline_threshold(void) { return onnxopt_inline_flops; }

static void glue_acquire(void) {
  while (atomic_flag_test_and_set_explicit(&glue_lock, memory_order_acquire)) {
  }
}

static void glue_unlock(void) { atomic_flag_clear_explicit(&glue_lock, memory_order_release); }

static size_t glue_capacity(const void *block) { return *(const size_t *)block; }

static void *glue_bytes(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  char *block = NULL;
  glue_acquire();
  int best = -1;
  for (int i = 0; i < GLUE_CACHE_SLOTS; i++) /* the smallest cached block that is large enough */
    if (glue_cache[i] && glue_capacity(glue_cache[i]) >= bytes &&
        (best < 0 || glue_capacity(glue_cache[i]) < glue_capacity(glue_cache[best])))
      best = i;
  if (best >= 0) {
    block = (char *)glue_cache[best];
    glue_cache[best] = NULL;
    glue_cached_bytes -= glue_capacity(block);
  }
  glue_unlock();
  if (!block) {
    block = (char *)aligned_alloc(64, bytes + GLUE_HEADER);
    if (!block) return NULL;
    __atomic_add_fetch(&glue_fresh, 1, __ATOMIC_RELAXED);
    *(size_t *)block = bytes;
  }
  return block + GLUE_HEADER;
}

static float *glue_floats(size_t floats) { return (float *)glue_bytes(floats * sizeof(float)); }

static void glue_release(void *p) {
  if (!p) return;
  char *block = (char *)p - GLUE_HEADER;
  size_t cap = glue_capacity(block);
  if (cap > GLUE_CACHE_BYTES) {
    free(block);
    return;
  }
  void *drop[GLUE_CACHE_SLOTS + 1]; /* freed after the lock is let go */
  int n_drop = 0;
  glue_acquire();
  int slot = -1;
  for (int i = 0; i < GLUE_CACHE_SLOTS && slot < 0; i++)
    if (!glue_cache[i]) slot = i;
  if (slot < 0) { /* full: the block replaces the smallest cached one, if it is larger */
    for (int i = 0; i < GLUE_CACHE_SLOTS; i++)
      if (slot < 0 || glue_capacity(glue_cache[i]) < glue_capacity(glue_cache[slot])) slot = i;
    if (glue_capacity(glue_cache[slot]) >= cap) slot = -1;
  }
  if (slot < 0) {
    drop[n_drop++] = block;
  } else {
    if (glue_cache[slot]) {
      glue_cached_bytes -= glue_capacity(glue_cache[slot]);
      drop[n_drop++] = glue_cache[slot];
      glue_cache[slot] = NULL;
    }
    while (glue_cached_bytes + cap > GLUE_CACHE_BYTES) { /* over the budget: drop the largest others first */
      int big = -1;
      for (int i = 0; i < GLUE_CACHE_SLOTS; i++)
        if (glue_cache[i] && (big < 0 || glue_capacity(glue_cache[i]) > glue_capacity(glue_cache[big]))) big = i;
      glue_cached_bytes -= glue_capacity(glue_cache[big]);
      drop[n_drop++] = glue_cache[big];
      glue_cache[big] = NULL;
    }
    glue_cache[slot] = block;
    glue_cached_bytes += cap;
  }
  glue_unlock();
  for (int i = 0; i < n_drop; i++) free(drop[i]);
}

/* dlclose (onnxruntime unloads the library with the last session options that registered it): the cached blocks
   go with it. */
__attribute__((destructor)) static void glue_free_cache(void) {
  for (int i = 0; i < GLUE_CACHE_SLOTS; i++) {
    free(glue_cache[i]);
    glue_cache[i] = NULL;
  }
  glue_cached_bytes = 0;
}

static OrtStatus *ew_compute(const onnxopt_ew_desc *d, OrtKernelContext *ctx) {
  ew_job job;
  int64_t in_dims[MAX_ARGS][MAX_RANK];
  size_t in_rank[MAX_ARGS];
  if (d->sig.n_in > MAX_ARGS || d->sig.n_out > MAX_ARGS) return fail(ORT_FAIL, "onnxopt: too many arguments");
  memset(&job, 0, sizeof(job));
  job.d = d;
  size_t R = (size_t)d->out_rank;
  for (int i = 0; i < d->sig.n_in; i++) {
    const OrtValue *v;
    OrtTensorTypeAndShapeInfo *info;
    CHECK(API(KernelContext_GetInput)(ctx, (size_t)i, &v));
    CHECK(API(GetTensorTypeAndShape)(v, &info));
    OrtStatus *st = API(GetDimensionsCount)(info, &in_rank[i]);
    if (!st && in_rank[i] > MAX_RANK) st = fail(ORT_INVALID_ARGUMENT, "onnxopt: tensor rank above 12");
    if (!st) st = API(GetDimensions)(info, in_dims[i], in_rank[i]);
    API(ReleaseTensorTypeAndShapeInfo)(info);
    if (st) return st;
    CHECK(API(GetTensorMutableData)((OrtValue *)v, (void **)&job.in_base[i]));
    if (in_rank[i] > R) R = in_rank[i];
  }
  if (R > MAX_RANK) return fail(ORT_INVALID_ARGUMENT, "onnxopt: tensor rank above 12");

  /* numpy broadcasting of the inputs (scalars folded into the code only add leading 1s, covered by out_rank). */
  int64_t out[MAX_RANK];
  for (size_t j = 0; j < R; j++) {
    int64_t o = 1;
    for (int i = 0; i < d->sig.n_in; i++) {
      size_t lead = R - in_rank[i];
      int64_t dim = j >= lead ? in_dims[i][j - lead] : 1;
      if (dim == 1) continue;
      if (o == 1)
        o = dim;
      else if (o != dim)
        return fail(ORT_INVALID_ARGUMENT, "onnxopt: input shapes cannot be broadcast together");
    }
    out[j] = o;
  }
  /* Every output is written with the full iteration shape. The optimizer proved that statically, sometimes by
     assuming two symbolic dims equal; if these inputs break the assumption, say so instead of computing garbage. */
  for (int k = 0; k < d->sig.n_out; k++) {
    for (size_t j = 0; j < R; j++) {
      int64_t o = 1;
      for (int i = 0; i < d->sig.n_in; i++) {
        if (!((d->out_deps[k] >> i) & 1u)) continue;
        size_t lead = R - in_rank[i];
        int64_t dim = j >= lead ? in_dims[i][j - lead] : 1;
        if (dim != 1) o = dim;
      }
      if (o != out[j])
        return fail(ORT_INVALID_ARGUMENT, "onnxopt: these input shapes give a fused output a different shape than "
                                          "the kernel was built for; re-run onnxopt with --input-shape for them, "
                                          "or with --skip-fusion elementwise");
    }
  }
  int64_t total = 1;
  for (size_t j = 0; j < R; j++) total *= out[j];
  for (int k = 0; k < d->sig.n_out; k++) {
    OrtValue *ov;
    CHECK(API(KernelContext_GetOutput)(ctx, (size_t)k, out, R, &ov));
    CHECK(API(GetTensorMutableData)(ov, (void **)&job.out_base[k]));
  }
  if (total == 0) return NULL;

  /* Per-input strides in elements over the output's dims (0 where the input is broadcast). */
  int64_t st[MAX_ARGS][MAX_RANK];
  for (int i = 0; i < d->sig.n_in; i++) {
    size_t lead = R - in_rank[i];
    int64_t s = 1;
    for (size_t jj = R; jj-- > 0;) {
      int64_t dim = jj >= lead ? in_dims[i][jj - lead] : 1;
      st[i][jj] = dim == 1 ? 0 : s;
      s *= dim;
    }
  }
  /* Drop size-1 dims, then merge neighbours wherever every input is contiguous across them. */
  int nd = 0;
  for (size_t j = 0; j < R; j++) {
    if (out[j] == 1) continue;
    job.dims[nd] = out[j];
    for (int i = 0; i < d->sig.n_in; i++) job.strides[i][nd] = st[i][j];
    nd++;
  }
  if (nd == 0) {
    nd = 1;
    job.dims[0] = 1;
    for (int i = 0; i < d->sig.n_in; i++) job.strides[i][0] = 0;
  }
  int m = nd - 1; /* merge from the innermost dim outwards into a compacted list */
  int64_t cd[MAX_RANK], cs[MAX_ARGS][MAX_RANK];
  int nc = 0;
  cd[0] = job.dims[m];
  for (int i = 0; i < d->sig.n_in; i++) cs[i][0] = job.strides[i][m];
  nc = 1;
  for (int j = m - 1; j >= 0; j--) {
    int mergeable = 1;
    for (int i = 0; i < d->sig.n_in; i++)
      if (job.strides[i][j] != cs[i][nc - 1] * cd[nc - 1]) mergeable = 0;
    if (mergeable) {
      cd[nc - 1] *= job.dims[j];
    } else {
      cd[nc] = job.dims[j];
      for (int i = 0; i < d->sig.n_in; i++) cs[i][nc] = job.strides[i][j];
      nc++;
    }
  }
  job.nd = nc;
  for (int j = 0; j < nc; j++) {
    job.dims[j] = cd[nc - 1 - j];
    for (int i = 0; i < d->sig.n_in; i++) job.strides[i][j] = cs[i][nc - 1 - j];
  }
  uint32_t mask = 0;
  for (int i = 0; i < d->sig.n_in; i++) {
    job.inner[i] = job.strides[i][nc - 1];
    if (job.inner[i] != 0) mask |= 1u << i;
  }
  job.row = NULL;
  for (int v = 0; v < d->n_variants; v++)
    if (d->variant_masks[v] == mask) job.row = d->variants[v];
  job.total = total;

  if (total < d->parallel_min) {
    ew_run_range(&job, 0, total);
    return NULL;
  }
  int64_t chunk = total / MAX_CHUNKS;
  if (chunk < CHUNK_MIN_ELEMENTS) chunk = CHUNK_MIN_ELEMENTS;
  chunk = (chunk + 63) & ~(int64_t)63; /* whole cache lines per chunk */
  job.chunk = chunk;
  size_t n_chunks = (size_t)((total + chunk - 1) / chunk);
  return API(KernelContext_ParallelFor)(ctx, ew_chunk, n_chunks, 0, &job);
}

/*@@COMPUTE@@*/

/*@@POOL@@*/

/*@@SEQUENCE@@*/

/* ---- OrtCustomOp callbacks ---- */

static const onnxopt_sig *desc_of(const OnnxoptCustomOp *op) { return ((const onnxopt_op *)op)->desc; }
static const char *op_name(const OnnxoptCustomOp *op) { return desc_of(op)->name; }
static const char *op_ep(const OnnxoptCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int op_in_type(const OnnxoptCustomOp *op, size_t i) { return desc_of(op)->in_types[i]; }
static size_t op_in_count(const OnnxoptCustomOp *op) { return (size_t)desc_of(op)->n_in; }
static int op_out_type(const OnnxoptCustomOp *op, size_t i) { return desc_of(op)->out_types[i]; }
static size_t op_out_count(const OnnxoptCustomOp *op) { return (size_t)desc_of(op)->n_out; }
static int op_required(const OnnxoptCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int op_mem_default(const OnnxoptCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int op_one(const OnnxoptCustomOp *op) { (void)op; return 1; }
static void *op_create_v1(const OnnxoptCustomOp *op, const void *api, const void *info) {
  (void)api; (void)info;
  return (void *)desc_of(op);
}
static OrtStatus *op_create(const OnnxoptCustomOp *op, const void *api, const void *info, void **kernel) {
  (void)api; (void)info;
  *kernel = (void *)desc_of(op);
  return NULL;
}
static void op_compute_v1(void *kernel, OrtKernelContext *ctx) { (void)kernel; (void)ctx; }
static OrtStatus *op_compute(void *kernel, OrtKernelContext *ctx) {
  const onnxopt_sig *sig = (const onnxopt_sig *)kernel;
  if (sig->kind == KIND_ELEMENTWISE) return ew_compute((const onnxopt_ew_desc *)kernel, ctx);
  if (sig->kind == KIND_POOL) return pool_compute((const onnxopt_pool_desc *)kernel, ctx);
  if (sig->kind == KIND_AFUSION) return af_compute((const onnxopt_af_desc *)kernel, ctx);
  if (sig->kind == KIND_SIBLINGS) return sb_compute((const onnxopt_sb_desc *)kernel, ctx);
  if (sig->kind == KIND_COPY) return cp_compute((const onnxopt_copy_desc *)kernel, ctx);
  if (sig->kind == KIND_SEQUENCE) return seq_compute((const onnxopt_seq_desc *)kernel, ctx);
  return ct_compute((const onnxopt_ct_desc *)kernel, ctx);
}
static void op_destroy(void *kernel) { (void)kernel; }

static onnxopt_op *g_ops; /* onnxopt_n_ops of them, filled once and shared by every session that registers us */

/* The ops a session asks for, as ",name,name," in the session config entry REGISTER_OPS_ENTRY, or NULL: then all.
 * Registering an op costs onnxruntime about 30 us a session (its schema and kernel entries), and the pipeline makes
 * hundreds of one-kernel sessions on a library of hundreds of kernels (NASNet-A's checks: 8 ms a session).
 * onnxruntime caps a config value at 8192 characters; a longer list is not set, and every op is registered. */
#define REGISTER_OPS_ENTRY "onnxopt.register_ops"
#define REGISTER_OPS_MAX 8192
static char *ops_asked(const OrtSessionOptions *options) {
  int has = 0;
  OrtStatus *st = API(HasSessionConfigEntry)(options, REGISTER_OPS_ENTRY, &has);
  if (st) API(ReleaseStatus)(st);
  if (st || !has) return NULL;
  size_t size = REGISTER_OPS_MAX + 1;
  char *list = (char *)malloc(size);
  if (!list) return NULL;
  st = API(GetSessionConfigEntry)(options, REGISTER_OPS_ENTRY, list, &size);
  if (st) { /* unreadable: register everything, as without the entry */
    API(ReleaseStatus)(st);
    free(list);
    return NULL;
  }
  return list;
}

static int op_asked(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = strstr(list, name); p; p = strstr(p + 1, name))
    if (p > list && p[-1] == ',' && p[n] == ',') return 1;
  return 0;
}

__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(OrtSessionOptions *options,
                                                                     const OnnxoptApiBase *base) {
  OrtApiTable ort = base->GetApi(ONNXOPT_API_VERSION);
  if (!ort) return NULL; /* ORT older than 1.17: nothing registered, the function bodies run */
  g_api = seq_api_table(ort);
  if (!onnxopt_cpu_ok()) return NULL; /* this CPU lacks an instruction the kernels use: same fallback */
  OrtCustomOpDomain *domain;
  CHECK(API(CreateCustomOpDomain)("onnxopt", &domain));
  if (!g_ops) {
    onnxopt_op *ops = (onnxopt_op *)calloc((size_t)(onnxopt_n_ops > 0 ? onnxopt_n_ops : 1), sizeof(onnxopt_op));
    if (!ops) return API(CreateStatus)(1, "onnxopt: out of memory registering the custom ops");
    for (int i = 0; i < onnxopt_n_ops; i++) {
      onnxopt_op *o = &ops[i];
      o->desc = ONNXOPT_OPS[i];
      o->base.version = ONNXOPT_API_VERSION;
      o->base.CreateKernel = op_create_v1;
      o->base.GetName = op_name;
      o->base.GetExecutionProviderType = op_ep;
      o->base.GetInputType = op_in_type;
      o->base.GetInputTypeCount = op_in_count;
      o->base.GetOutputType = op_out_type;
      o->base.GetOutputTypeCount = op_out_count;
      o->base.KernelCompute = op_compute_v1;
      o->base.KernelDestroy = op_destroy;
      o->base.GetInputCharacteristic = op_required;
      o->base.GetOutputCharacteristic = op_required;
      o->base.GetInputMemoryType = op_mem_default;
      o->base.GetVariadicInputMinArity = op_one;
      o->base.GetVariadicInputHomogeneity = op_one;
      o->base.GetVariadicOutputMinArity = op_one;
      o->base.GetVariadicOutputHomogeneity = op_one;
      o->base.CreateKernelV2 = op_create;
      o->base.KernelComputeV2 = op_compute;
    }
    g_ops = ops;
  }
  char *asked = ops_asked(options);
  for (int i = 0; i < onnxopt_n_ops; i++) {
    if (asked && !op_asked(asked, g_ops[i].desc->name)) continue;
    OrtStatus *st = API(CustomOpDomain_Add)(domain, &g_ops[i].base);
    if (st) {
      free(asked);
      return st;
    }
  }
  free(asked);
  return API(AddCustomOpDomain)(options, domain);
}
