#ifndef ONNXOPT_AFUSION_H
#define ONNXOPT_AFUSION_H
#include "glue.h"
#include "compute.h"

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

#endif
