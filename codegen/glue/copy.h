#ifndef ONNXOPT_COPY_H
#define ONNXOPT_COPY_H
#include "glue.h"

/* A Concat of blocked tensors along their channel blocks, each input first repeated by integer factors along the
   rows and columns (a nearest Resize): copy_exec.c. Inputs and output are [N, C / lanes, H, W, lanes]. Also a
   plain Concat, a Slice, a Split, and a nearest Resize of one NCHW tensor (lanes 1). */
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
  int64_t max_tasks;     /* the schedule: the most tasks a call is split into */
  int64_t inline_floats; /* the schedule: below this many floats written, one thread (waking the pool costs more) */
  int elem;              /* bytes an element: 4 (float32), or 1 (a plain Concat of a quantized model's int8) */
  /* A Split (one input, split_count outputs): each output's length along `axis` (in blocks of the 5-D tensor's
     dims[1] when lanes > 1, axis 1); 0: not a split. */
  int split_count;
  int64_t split[CP_MAX_IN];
} onnxopt_copy_desc;

#endif
