/* ---- OrtCustomOp callbacks ---- */

static const onnxopt_sig *desc_of(const OnnxoptCustomOp *op) { return ((const onnxopt_op *)op)->desc; }
static const char *op_name(const OnnxoptCustomOp *op) { return desc_of(op)->name; }
static const char *op_ep(const OnnxoptCustomOp *op) { (void)op; return onnxopt_execution_provider; }
static int op_in_type(const OnnxoptCustomOp *op, size_t i) { return desc_of(op)->in_types[i]; }
static size_t op_in_count(const OnnxoptCustomOp *op) { return (size_t)desc_of(op)->n_in; }
static int op_out_type(const OnnxoptCustomOp *op, size_t i) { return desc_of(op)->out_types[i]; }
static size_t op_out_count(const OnnxoptCustomOp *op) { return (size_t)desc_of(op)->n_out; }
static int op_required(const OnnxoptCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int op_mem_default(const OnnxoptCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int op_one(const OnnxoptCustomOp *op) { (void)op; return 1; }
/* The kernel is the onnxopt_op itself (its desc and its call counter), from either creator: onnxruntime calls the
   first one its version has and may pair it with KernelComputeV2. */
static void *op_create_v1(const OnnxoptCustomOp *op, const void *api, const void *info) {
  (void)api; (void)info;
  return (void *)op;
}
static OrtStatus *op_create(const OnnxoptCustomOp *op, const void *api, const void *info, void **kernel) {
  (void)api; (void)info;
  *kernel = (void *)op;
  return NULL;
}
static void op_compute_v1(void *kernel, OrtKernelContext *ctx) { (void)kernel; (void)ctx; }
static OrtStatus *op_compute(void *kernel, OrtKernelContext *ctx) {
  onnxopt_op *o = (onnxopt_op *)kernel;
  /* Counted so that a user (and onnxopt's own checks) can see that the kernels ran, not only that the answers match:
     one relaxed atomic add a call, nothing next to a kernel's run. */
  __atomic_fetch_add(&o->calls, 1ULL, __ATOMIC_RELAXED);
  return onnxopt_execute(o->desc, ctx); /* the kinds' dispatch (codegen/glue/kinds.py) */
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
  amx_request(); /* before any kernel runs: the AMX tiles need the OS's permission (matrix_engine.c) */
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
    __atomic_store_n(&g_ops, ops, __ATOMIC_RELEASE);
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


/* The Compute calls each op has had in this process, for onnxopt.runtime.kernel_calls: fills up to `cap` entries of
 * names and counts and returns the number of ops. Ops no session registered yet count 0. */
__attribute__((visibility("default"))) int onnxopt_compute_counts(const char **names, unsigned long long *counts,
                                                                  int cap) {
  onnxopt_op *ops = __atomic_load_n(&g_ops, __ATOMIC_ACQUIRE);
  for (int i = 0; i < onnxopt_n_ops && i < cap; i++) {
    names[i] = ONNXOPT_OPS[i]->name;
    counts[i] = ops ? __atomic_load_n(&ops[i].calls, __ATOMIC_RELAXED) : 0;
  }
  return onnxopt_n_ops;
}
