#ifndef ONNXOPT_SEQUENCE_H
#define ONNXOPT_SEQUENCE_H
#include "glue.h"

/* A run of ops executed in one parallel section (sequence_exec.c). One step: an op of the library, with where its
   inputs come from and where its outputs go. */
typedef struct {
  const onnxopt_sig *op;
  int n_in, n_out;
  const int *in;  /* >= 0: the sequence's input; < 0: the tensor of slot -1 - in */
  const int *out; /* the slot of each output */
} onnxopt_seq_step;

typedef struct {
  onnxopt_sig sig;
  int n_steps;
  const onnxopt_seq_step *steps;
  int n_slots;            /* one per tensor a step writes */
  const int *slot_output; /* the sequence's output a slot is, or -1: kept in buffer slot_buffer[slot] */
  const int *slot_buffer; /* slots whose lives do not overlap share a buffer (emit/sequence.py) */
  int n_buffers;
  int arena; /* its index in onnxopt_seq_arenas */
  /* Per slot: the Concat output slot it is written inside (a view), or -1; along which axis, at which offset, how
     many positions, of the whole's how many (emit/sequence.py, SlotView). */
  const int *view_whole, *view_axis;
  const int64_t *view_offset, *view_units, *view_total;
  /* Per slot: 1 where a bf16 GEMM on AMX tiles writes it and only bf16 GEMMs on AMX tiles read it, as their A
     (emit/sequence.py): kept in bfloat16 where the tiles run (seq_slot_value). */
  const int *slot_bf16;
} onnxopt_seq_desc;

#endif
