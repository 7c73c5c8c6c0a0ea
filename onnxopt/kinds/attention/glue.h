/* An attention chain, MatMul -> scale -> mask -> Softmax -> MatMul, as one kernel (onnxopt/kinds/attention). */
#ifndef ONNXOPT_ATTENTION_H
#define ONNXOPT_ATTENTION_H
/* Included after glue.h (codegen/glue/kinds.py). */

/* lower.py: one block of query rows of one (batch, head). */
typedef void (*attention_fn)(const float *q, int64_t q_rs, const float *kp, int64_t kp_ps, const float *vp,
                             int64_t vp_ps, const void *mask, int64_t mask_rs, float *out, int64_t out_rs,
                             int64_t rows, int64_t L, int64_t d, int64_t dv, float *s, int64_t s_rs);
typedef struct {
  onnxopt_sig sig;
  int k_transposed; /* input 1 is K^T [.., d, L]; else K [.., L, d] (either way a task packs K^T in panels) */
  int mask_kind;    /* 0: none; 1: a float mask added to the scores; bool masks: 2 keep where true, 3 fill there */
  int block;        /* the kernel's column block: a score row is padded to a multiple of it; K^T and V panels */
  int rows_block;   /* the micro-kernel's query rows */
  int min_tasks;    /* the schedule: fewer rows a task rather than fewer tasks than this (threads to feed) */
  attention_fn fn;
  /* has_perms: q, k, v and the output are read and written through perm[t] (find.py): logical dim i of tensor t
     is dim perm[t][i] of the tensor in memory (the head split's and merge's Transposes, folded). */
  int has_perms;
  int perm[4][MAX_RANK];
  /* The bf16 kernel on AMX tiles (amx.py), or NULL: run instead of fn where the CPU and the OS allow the tiles
     (matrix_engine.c), on K^T and V packed as bf16 pairs (exec.c attn_pack_bf16). */
  attention_fn amx_fn;
  int amx_f16;      /* amx_fn's tiles take float16 (tdpfp16ps, AMX-FP16), K^T and V packed so; else bfloat16 */
  int amx_min_keys; /* the fewest keys amx_fn runs for: with fewer, fn is faster */
  int middle_softmax; /* a softmax between the products (else none or a Relu: partial products add up) */
  int64_t key_floats; /* fn's K^T, V and scores a key block may take (capacity.py); 0: whole rows */
} onnxopt_attention_desc;

#endif
