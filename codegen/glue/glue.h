#ifndef ONNXOPT_GLUE_H
#define ONNXOPT_GLUE_H
/*
 * onnxopt's ONNX Runtime glue: the custom-op tables and RegisterCustomOps for one kernel library.
 *
 * Written from the documented layout of the ORT C API (docs/ort-c-api-layout.md), with no ORT header: the OrtApi is
 * a table of function pointers indexed by position, and positions never change because the C API only appends.
 * We ask for API version 17, the oldest that has KernelContext_ParallelFor, so one library runs on every newer ORT.
 *
 * This header is what every part of the glue reads: the API positions, the OrtCustomOp layout and onnxopt_sig, the
 * first member of every kind's descriptor. Each kind declares its descriptor in a header of its own and runs in an
 * executor file of its own; codegen/glue/kinds.py lists them and writes the KIND_ ids and the dispatch.
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

/* A loop the compiler writes once per x86 vector width and picks when the library loads; one plain copy on
   other architectures (aarch64's NEON is their baseline). */
#if defined(__x86_64__)
#define X86_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define X86_CLONES
#endif
/* gcc vectorizes loops at -O3 only (the glue is built -O2): for the few plain loops that convert whole planes. */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORIZE __attribute__((optimize("tree-vectorize")))
#else
#define VECTORIZE
#endif

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

/* What every fused op type declares to ORT; the first member of each kind's descriptor. `kind` is one of the
   KIND_ ids that codegen/glue/kinds.py writes: it picks the executor. */
typedef struct {
  const char *name;
  int kind;
  int n_in, n_out;
  const int *in_types, *out_types; /* ONNXTensorElementDataType */
} onnxopt_sig;

#endif
