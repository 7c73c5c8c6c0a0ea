/* A Softmax or LogSoftmax over rows: the dims from `axis` on, flattened (onnxopt/kinds/softmax). */
#ifndef ONNXOPT_SOFTMAX_H
#define ONNXOPT_SOFTMAX_H
/* Included after glue.h (codegen/glue/kinds.py). */

typedef void (*softmax_rows_fn)(const float *x, float *y, int64_t rows, int64_t n);
typedef struct {
  onnxopt_sig sig;
  int axis;
  softmax_rows_fn rows; /* lower.py: `rows` rows of `n` floats each */
} onnxopt_softmax_desc;

#endif
