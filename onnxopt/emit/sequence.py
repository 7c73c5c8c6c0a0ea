"""Sequences: each run of the library's ops with no onnxruntime op between them becomes one node, which runs them in
a single parallel section (codegen/glue/sequence_exec.c).

Why: with onnxruntime's spinning off, each parallel loop a kernel opens first wakes a sleeping pool thread, about
20 us here, while the calling thread works alone; a network of ours opens 25 to 114 of them per inference. Inside a
sequence the helper threads stay in the section between the ops.

The nodes are first put in a topological order that keeps to the same side (ours or onnxruntime's) as long as
something there is ready, so the runs are as long as the dependencies allow; a contiguous run of a topological order
is convex, so replacing it by one node keeps the graph acyclic. Tensors that only the run reads never leave it: they
live in buffers of the sequence's own, shared by tensors whose lives do not overlap. The sequence's function
fallback calls the ops' own functions in order.

Concat inputs written in place: a Concat (our copy op, codegen/glue/copy_exec.c) of tensors that one item of the
batch holds contiguously along the axis (blocked tensors [1, C / L, H, W, L] along their blocks; plain ones whose
dims before the axis are all 1) has each input inside its output, one after the other. When an input is a tensor of
the sequence's own, written earlier in the run, its producer writes it straight into its place in the Concat's
output (a "view", `_concat_views`), and the copy finds it there and skips it. A fire module's or an Inception
module's Concat then copies nothing: those copies were 2-6% of SqueezeNet's, NASNet-A's and Inception-v3's time.
The sizes come from shape inference through the ops' functions; the glue checks each producer's actual dims against
them and writes into a buffer of its own (the copy then copies) when they differ.
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass

import onnx
from onnx import helper

from onnxopt.codegen.copy.desc import CopyKernelDesc
from onnxopt.codegen.glue.descs import CtKernelDesc, SeqKernelDesc
from onnxopt.graph.fold import outer_names_of

MIN_STEPS = 2  # a run of one op gains nothing


def _grouped_order(nodes: list[onnx.NodeProto], ours: list[bool]) -> list[int]:
    """A topological order that stays on the current side (ours / onnxruntime's) while it has a ready node, taking
    the earliest ready one of that side; else the earliest of the other."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    users: dict[int, list[int]] = {}
    waiting = []
    for i, n in enumerate(nodes):
        deps = {producer[x] for x in [*n.input, *outer_names_of(n)] if x in producer and producer[x] != i}
        waiting.append(len(deps))
        for p in deps:
            users.setdefault(p, []).append(i)
    ready: tuple[list[int], list[int]] = ([], [])  # onnxruntime's, ours
    for i, w in enumerate(waiting):
        if w == 0:
            heapq.heappush(ready[ours[i]], i)
    order: list[int] = []
    side = ours[0] if nodes else False
    while ready[0] or ready[1]:
        if not ready[side]:
            side = not side
        i = heapq.heappop(ready[side])
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready[ours[u]], u)
    if len(order) != len(nodes):
        raise RuntimeError("the fused graph has a cycle; this is a bug in the region legality check")
    return order


def _buffers(lives: list[tuple[int, int]]) -> list[int]:
    """A buffer per slot such that slots sharing one never live at once; `lives` are (first, last) steps,
    inclusive, in the order the slots are written."""
    free_after: list[int] = []  # per buffer: the last step its current slot is read
    out = []
    for first, last in lives:
        b = next((k for k, end in enumerate(free_after) if end < first), None)
        if b is None:
            b = len(free_after)
            free_after.append(last)
        else:
            free_after[b] = last
        out.append(b)
    return out


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor name -> its dims, for the tensors whose dims shape inference (through the ops' functions) fixes."""
    g = model.graph
    # Inferred on a copy whose weights are only declared: the weights are what makes a model large, and copying
    # them took Inception-v3's inference 0.64 s for every plan the pipeline times.
    have = {x.name for x in g.input}
    declared = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer
                if t.name not in have]
    light = helper.make_model(helper.make_graph(list(g.node), g.name, [*g.input, *declared], list(g.output),
                                                value_info=list(g.value_info)),
                              opset_imports=list(model.opset_import), functions=list(model.functions),
                              ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception:  # noqa: BLE001 - no sizes, no views: the copies run as before
        return {}
    out = {}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        t = v.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[v.name] = [d.dim_value for d in t.shape.dim]
    return out


@dataclass(frozen=True)
class SlotView:
    """A slot written in place inside a Concat's output slot `whole`: `units` positions along `axis` starting at
    `offset`, of the whole's `total`."""

    whole: int
    axis: int
    offset: int
    units: int
    total: int


def _concat_views(step_nodes: list, descs: dict, slot_of: dict, slot_output: list, shapes: dict) -> dict[int, SlotView]:
    """The slots written in place in their Concat's output (see the module's docstring): an input of one of our
    copy ops without repeats, written earlier in the run into a slot of the sequence's own (not one of its outputs),
    read once by that Concat, and sized by shape inference, as every input and the output are."""
    views: dict[int, SlotView] = {}
    for n in step_nodes:
        d = descs[n.op_type]
        if not isinstance(d, CopyKernelDesc) or len(n.output) != 1 or d.slice:  # a Slice's copy is no Concat
            continue
        axis = 1 if d.lanes else d.axis
        dims = [shapes.get(x) for x in n.input]
        out = shapes.get(n.output[0])
        if out is None or any(s is None or len(s) <= axis for s in dims) or len(out) <= axis:
            continue
        if any(v != 1 for v in out[:axis]):
            continue  # a batch item's part is not contiguous
        if sum(s[axis] for s in dims) != out[axis]:
            continue
        offset = 0
        for k, x in enumerate(n.input):
            units = dims[k][axis]
            slot = slot_of.get(x)
            if (slot is not None and slot_output[slot] < 0 and slot not in views and list(n.input).count(x) == 1
                    and tuple(d.factors[k]) == (1, 1) and slot != slot_of.get(n.output[0])):
                views[slot] = SlotView(slot_of[n.output[0]], axis, offset, units, out[axis])
            offset += units
    return views


def _bf16_gemm(d) -> bool:
    """A matmul on bf16 AMX tiles reading A as it lies (packed weights, A not transposed)."""
    return (isinstance(d, CtKernelDesc) and d.kind == "matmul" and bool(d.packed_b) and not d.trans_a
            and d.matrix_instruction == "tdpbf16ps" and bool(d.amx_tiles))


def _bf16_slots(steps: list, descs: dict, slot_output: list[int], slot_view: list) -> list[int]:
    """Per slot, 1 where the glue may keep the tensor in bfloat16 (sequence_exec.c `seq_slot_value`): a tensor of
    the sequence's own that a bf16 GEMM on AMX tiles writes as its one output (and has tiles writing bfloat16 for:
    `amx_tiles16`) and that only such GEMMs read, as their A. Each reader rounds its A to bfloat16 before its tiles
    anyway: the writer's epilogue now does it once, and the float32 copy (twice the bytes written and read, and the
    readers' rounding passes) is never made. An FFN's first GEMM (with its GELU) feeding the second is the case."""
    writer, readers = {}, {}
    for op, refs, outs in steps:
        for slot in outs:
            writer[slot] = op
        for k, ref in enumerate(refs):
            if ref < 0:
                readers.setdefault(-1 - ref, []).append((op, k))
    flags = []
    for slot, out in enumerate(slot_output):
        w = descs.get(writer.get(slot))
        ok = (out < 0 and (slot >= len(slot_view) or slot_view[slot] is None) and _bf16_gemm(w)
              and bool(w.amx_tiles16) and len(w.out_types) == 1 and slot in readers
              and all(k == 0 and _bf16_gemm(descs.get(op)) for op, k in readers[slot]))
        flags.append(int(ok))
    return flags


def make_sequences(model: onnx.ModelProto, descs: dict, domain: str) -> tuple[onnx.ModelProto, list[SeqKernelDesc]]:
    """Replace each run of at least MIN_STEPS library ops (`descs`: op type -> its kernel description, with
    in_types and out_types) by one sequence node; returns the new model and the sequences' descriptions."""
    g = model.graph
    nodes = list(g.node)
    ours = [n.domain == domain and n.op_type in descs and all(n.input) for n in nodes]
    if sum(ours) < MIN_STEPS:
        return model, []
    order = _grouped_order(nodes, ours)
    runs, cur = [], []
    for i in order:
        if ours[i]:
            cur.append(i)
        else:
            runs.append(cur)
            cur = []
    runs.append(cur)
    runs = [r for r in runs if len(r) >= MIN_STEPS]
    if not runs:
        return model, []

    outside_readers: dict[str, int] = {}
    for n in nodes:
        for x in [*n.input, *outer_names_of(n)]:
            outside_readers[x] = outside_readers.get(x, 0) + 1
    graph_outputs = {o.name for o in g.output}
    shapes = _static_shapes(model) if any(isinstance(d, CopyKernelDesc) for d in descs.values()) else {}

    replaced: dict[int, onnx.NodeProto | None] = {}
    seq_descs: list[SeqKernelDesc] = []
    functions = []
    dropped_names: set[str] = set()
    for number, run in enumerate(runs, 1):
        members = [nodes[i] for i in run]
        inside_reads: dict[str, int] = {}
        for n in members:
            for x in n.input:
                inside_reads[x] = inside_reads.get(x, 0) + 1
        slot_of: dict[str, int] = {}
        inputs: list[str] = []
        in_types: list[int] = []
        steps = []
        lives: list[list[int]] = []
        outputs: list[str] = []
        out_types: list[int] = []
        slot_output: list[int] = []
        for s, n in enumerate(members):
            d = descs[n.op_type]
            refs = []
            for k, x in enumerate(n.input):
                if x in slot_of:
                    refs.append(-1 - slot_of[x])
                    lives[slot_of[x]][1] = s
                else:
                    if x not in inputs:
                        inputs.append(x)
                        in_types.append(d.in_types[k])
                    refs.append(inputs.index(x))
            outs = []
            for k, y in enumerate(n.output):
                slot = len(lives)
                lives.append([s, s])
                if y:
                    slot_of[y] = slot
                # Read outside the run (by a node or as a graph output): the sequence's own output.
                if y and (y in graph_outputs or outside_readers.get(y, 0) > inside_reads.get(y, 0)):
                    slot_output.append(len(outputs))
                    outputs.append(y)
                    out_types.append(d.out_types[k])
                else:
                    slot_output.append(-1)
                    if y:
                        dropped_names.add(y)
                outs.append(slot)
            steps.append((n.op_type, refs, outs))
        views = _concat_views(members, descs, slot_of, slot_output, shapes)
        # A Concat's output holds its views' data: it lives from the first view's write to the last read of either
        # (views are made in step order, so a nested Concat's whole is extended after its own views).
        for slot in sorted(views, key=lambda v: lives[v][0]):
            w = views[slot].whole
            lives[w] = [min(lives[w][0], lives[slot][0]), max(lives[w][1], lives[slot][1])]
        internal = sorted((k for k, o in enumerate(slot_output) if o < 0), key=lambda k: (lives[k][0], k))
        shared = _buffers([tuple(lives[k]) for k in internal])
        slot_buffer = [-1] * len(lives)
        for k, b in zip(internal, shared):
            slot_buffer[k] = b
        slot_view = [views.get(k) for k in range(len(lives))]
        slot_bf16 = _bf16_slots(steps, descs, slot_output, slot_view)
        key = repr((steps, slot_output, slot_buffer, in_types, out_types, slot_view, slot_bf16)).encode()
        op_type = f"Sequence_{hashlib.sha256(key).hexdigest()[:16]}"
        if all(k.op_type != op_type for k in seq_descs):  # the same ops, wired the same way: one op type
            seq_descs.append(SeqKernelDesc(op_type, in_types, out_types, steps, slot_output, slot_buffer,
                                           slot_view, slot_bf16))
        first = members[0].name or members[0].op_type
        node = helper.make_node(op_type, inputs, outputs, name=f"{first}__sequence{number}", domain=domain)
        replaced[run[0]] = node
        for i in run[1:]:
            replaced[i] = None
        if all(f.name != op_type for f in functions):
            body = []
            for n in members:
                m = onnx.NodeProto()
                m.CopyFrom(n)
                body.append(m)
            functions.append(helper.make_function(domain, op_type, inputs, outputs, body, list(model.opset_import)))

    out = onnx.ModelProto()
    out.CopyFrom(model)
    new_nodes = []
    for i in order:
        if i in replaced:
            if replaced[i] is not None:
                new_nodes.append(replaced[i])
        else:
            new_nodes.append(nodes[i])
    del out.graph.node[:]
    out.graph.node.extend(new_nodes)
    keep = [v for v in out.graph.value_info if v.name not in dropped_names]
    del out.graph.value_info[:]
    out.graph.value_info.extend(keep)
    have = {f.name for f in out.functions}
    out.functions.extend(f for f in functions if f.name not in have)
    return out, seq_descs


def is_sequence(op_type: str) -> bool:
    return op_type.startswith("Sequence_")


def sequence_steps(model: onnx.ModelProto, domain: str = "onnxopt") -> dict[str, list[str]]:
    """Op type of each sequence in the model -> the op types of its steps, in order (from its function)."""
    return {f.name: [n.op_type for n in f.node] for f in model.functions
            if f.domain == domain and is_sequence(f.name)}


def expand_sequences(model: onnx.ModelProto, domain: str = "onnxopt") -> onnx.ModelProto:
    """The model with each sequence node replaced by the ops it runs (its function's body, which reads and writes
    the graph's own tensor names): one node per fused region again, for tools that look at single kernels. The
    library runs the result as well, one kernel per op."""
    bodies = {f.name: f for f in model.functions if f.domain == domain and is_sequence(f.name)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for n in model.graph.node:
        f = bodies.get(n.op_type) if n.domain == domain else None
        if f is None:
            nodes.append(n)
            continue
        rename = dict(zip(f.input, n.input)) | dict(zip(f.output, n.output))
        for m in f.node:
            c = onnx.NodeProto()
            c.CopyFrom(m)
            c.input[:] = [rename.get(x, x) for x in m.input]
            c.output[:] = [rename.get(y, y) for y in m.output]
            nodes.append(c)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    keep = [f for f in out.functions if f.name not in bodies]
    del out.functions[:]
    out.functions.extend(keep)
    return out


def ran_in_sequences(model: onnx.ModelProto, ran: set) -> set[str]:
    """The op types that ran inside the sequences named in `ran` (op types from an onnxruntime profile)."""
    return {step for q, steps in sequence_steps(model).items() if q in ran for step in steps}
