#ifndef ONNXOPT_SIBLINGS_H
#define ONNXOPT_SIBLINGS_H
#include "glue.h"
#include "compute.h"

/* Sibling convolutions reading the same input (op input 0), run as one kernel (siblings_exec.c): horizontal fusion. */
#define SB_MAX_PART 8
typedef struct {
  onnxopt_sig sig;
  int n_part;
  const onnxopt_ct_desc *part[SB_MAX_PART]; /* the parts' sigs name nothing: only this op is registered */
  int part_input[SB_MAX_PART];              /* op input index of each sibling's packed weights */
  int part_output[SB_MAX_PART];             /* op output index of each sibling's first output */
} onnxopt_sb_desc;

#endif
