#ifndef ONNXOPT_POOL_H
#define ONNXOPT_POOL_H
#include "glue.h"

/* MaxPool / AveragePool (2-D) or GlobalMaxPool / GlobalAveragePool with a fused epilogue (pool_exec.c runs it). */
enum { POOL_MAX = 0, POOL_AVG = 1, POOL_GMAX = 2, POOL_GAVG = 3 };
enum { POOL_F32 = 0, POOL_U8 = 1, POOL_S8 = 2 }; /* the element type: uint8 and int8 for a windowed MaxPool only */
typedef void (*pool_fn)(const int64_t *args);
typedef struct {
  onnxopt_sig sig;
  int op, lanes;
  int elem;                     /* POOL_F32, POOL_U8 or POOL_S8 */
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
  int64_t max_tasks;            /* the schedule: the most tasks a call is split into */
  double inline_work;           /* the schedule: below this many taps, one thread (waking the pool costs more) */
} onnxopt_pool_desc;

#endif
