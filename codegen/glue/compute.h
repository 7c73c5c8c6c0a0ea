#ifndef ONNXOPT_COMPUTE_H
#define ONNXOPT_COMPUTE_H
#include "glue.h"

/* A convolution or matmul with its fused epilogue (compute_exec.c runs it): its descriptor onnxopt_ct_desc, the
   tile_fn type, the tile's record ct_tile and its limits CT_NV_MAX, CT_MAX_OUT, CT_MAX_EXTRA are declared in
   codegen/glue/contract.py (CT_DESC, TILE_FN, CT_TILE), whose generated C the translation units hold before this
   header (codegen/glue/kinds.py). */

#endif
