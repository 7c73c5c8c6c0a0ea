/* A Softmax or LogSoftmax over rows: the dims from `axis` on, flattened (onnxopt/kinds/softmax). */
#ifndef ONNXOPT_SOFTMAX_H
#define ONNXOPT_SOFTMAX_H
/* Included after glue.h (codegen/glue/kinds.py). */

/* lower.py: `count` rows of n floats each (inner unused), or `count` adjacent columns of n floats `inner` apart */
typedef void (*softmax_rows_fn)(const float *x, float *y, int64_t count, int64_t n, int64_t inner);
typedef struct {
  onnxopt_sig sig;
  int axis;
  int columns; /* 1: reduce dims[axis] alone; the dims after it are columns */
  softmax_rows_fn rows;
} onnxopt_softmax_desc;

#endif
