#ifndef ONNXOPT_ELEMENTWISE_H
#define ONNXOPT_ELEMENTWISE_H
#include "glue.h"

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

#endif
