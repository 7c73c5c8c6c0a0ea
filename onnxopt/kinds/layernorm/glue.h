/* LayerNormalization over the last axis, with the residual Add before it (onnxopt/kinds/layernorm). */
#ifndef ONNXOPT_LAYERNORM_H
#define ONNXOPT_LAYERNORM_H
/* Included after glue.h (codegen/glue/kinds.py). */

/* lower.py: `rows` rows of `n` floats; r (the residual), beta and sum are read or written only where the kernel
   has them. */
typedef void (*layernorm_rows_fn)(const float *x, const float *r, const float *gamma, const float *beta, float *y,
                                  float *sum, int64_t rows, int64_t n);
typedef struct {
  onnxopt_sig sig;
  int residual;   /* inputs x, r, gamma[, beta]: the row is x + r */
  int sum_output; /* output 1 is x + r */
  int has_bias;
  layernorm_rows_fn rows;
} onnxopt_layernorm_desc;

#endif
