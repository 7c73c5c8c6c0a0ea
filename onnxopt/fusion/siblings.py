"""Horizontal fusion (OptiFX §3, part 4 of the fusion kinds): sibling convolution regions that read the same input,
run as one kernel.

An Inception module's branches start with 1x1 convolutions of one input; a ResNet stage's first block reads its
input with the block's 1x1 and the shortcut's 1x1; a SqueezeNet fire's expands read the squeeze output. Run apart,
each is one parallel loop over the threads: a small one leaves threads idle at its end, and each reads the shared
input from memory again. The sibling kernel (codegen/glue/siblings_exec.c) makes every sibling ready, then runs all
their tasks in a single parallel loop, one sibling after the other, so the threads stay busy across them and the
input is fresh in the cache for the next. Each sibling keeps its own tiles, weights and epilogue: kernel sizes,
strides, output channels and elementwise chains may all differ.

The fused region's inputs are the shared input, then each sibling's other inputs (packed weights, epilogue inputs);
its outputs are each sibling's in turn; its function fallback is the siblings' fallbacks one after the other, so the
model is correct without the library. `sibling_reason` says why a group cannot be fused.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxopt.codegen.glue.kinds import c_define
from onnxopt.graph.order import stable_order

from .afusion.siso import _distinct_names, channel_vector_parts, conv_part_reason
from .compute import ComputeParams
from .params import ComputeAttrs
from .region import EwProgram, Region

MAX_SIBLINGS = c_define("siblings.h", "SB_MAX_PART")


@dataclass
class Siblings:
    """Conv regions of a plan that read the same input and may run as one kernel."""

    regions: list[Region]

    @property
    def node_names(self) -> list[str]:
        return [x for r in self.regions for x in r.node_names]

    @property
    def convs(self) -> list[str]:
        """The convolutions' node names (each region's first node), as the search names its candidates' ROPs."""
        return [r.node_names[0] for r in self.regions]


def sibling_reason(regions: list[Region], lanes: int, shape_of=None) -> str | None:
    """None when `regions` (conv regions of one plan) can run as one sibling kernel, else why not."""
    if lanes < 8:
        return "the sibling kernel runs on the channel-vector kernel, which needs 8 or more lanes"
    if not 2 <= len(regions) <= MAX_SIBLINGS:
        return f"horizontal fusion takes 2 to {MAX_SIBLINGS} convolutions, not {len(regions)}"
    if len({id(r) for r in regions}) != len(regions):
        return "a convolution is listed twice"
    for r in regions:
        why = conv_part_reason(r, "sibling", depthwise=True)
        if why:
            return why
    inputs = {r.inputs[0] for r in regions}
    if len(inputs) != 1:
        return f"the convolutions read different inputs ({', '.join(sorted(inputs))}); siblings share one"
    layouts = {bool(r.compute.attrs.in_blocked) for r in regions}
    if len(layouts) > 1:
        return "the convolutions read their input in different layouts (blocked and NCHW)"
    made = {o for r in regions for o in r.outputs}
    for r in regions:
        if made & set(r.inputs[1:]):
            return "one sibling's epilogue reads another sibling's output"
    if shape_of is not None:
        sizes = set()
        for r in regions:
            s = shape_of(r.outputs[0])
            if s is None or not all(isinstance(d, int) for d in s):
                return "the shapes are not static"
            sizes.add(tuple(s[2:]))
        if len(sizes) > 1:
            return f"the siblings' outputs differ in size ({sorted(sizes)})"
    return None


def fuse_siblings(regions: list[Region], lanes: int, ni: int, opset: int) -> Region:
    """The sibling region of `regions` (check `sibling_reason` first): inputs the shared input, then each sibling's
    others; outputs each sibling's."""
    parts = channel_vector_parts(regions, lanes, ni, opset)
    body = list(parts[0].compute.body)
    for b, p in enumerate(parts[1:]):
        # Blocked inputs: every sibling's fallback converts the shared input to NCHW under the same name.
        body += _distinct_names(p.compute.body, body, f"__sibling{b + 1}")
    compute = ComputeParams(
        op="siblings",
        attrs=ComputeAttrs(in_blocked=int(parts[0].compute.attrs.in_blocked), block=lanes, siblings=len(parts)),
        initializers=[t for p in parts for t in p.compute.initializers],
        body=body,
        orig_consts=[t for p in parts for t in p.compute.orig_consts],
        parts=parts,
    )
    fused = Region(label="siblings", nodes=[nd for p in parts for nd in p.nodes],
                   inputs=[parts[0].inputs[0]] + [x for p in parts for x in p.inputs[1:]],
                   outputs=[o for p in parts for o in p.outputs],
                   program=EwProgram(inputs=[], consts={}, ops=[], outputs=[]),  # the parts carry the epilogues
                   shape=list(parts[0].shape), params=compute)
    if regions[0].op_type_key:
        fused.compute_op_type(regions[0].op_type_key)
    return fused


def sibling_groups(plan: list[Region], lanes: int, shape_of=None, nodes=()) -> tuple[list[Siblings], list[dict]]:
    """(every group of two or more conv regions of `plan` reading one input that can run as one kernel, refusals
    with reasons). A group is all the conv regions reading that input; the search picks subsets. `nodes`: the
    graph's nodes, for the cycle check through those the plan leaves to onnxruntime."""
    readers: dict[str, list[Region]] = {}
    for r in plan:
        if r.compute is not None and r.compute.op == "conv":
            readers.setdefault(r.inputs[0], []).append(r)
    groups, refused = [], []
    for regions in readers.values():
        if len(regions) < 2:
            continue
        why = sibling_reason(regions[:MAX_SIBLINGS], lanes, shape_of)
        if why is None and _reaches(plan, regions, nodes):
            why = "one sibling's result leads into another; fusing them would make a cycle"
        if why is not None:
            refused.append({"nodes": [x for r in regions for x in r.node_names], "reason": f"horizontal: {why}"})
            continue
        groups.append(Siblings(regions[:MAX_SIBLINGS]))
    return groups, refused


def _reaches(plan: list[Region], members: list[Region], nodes=()) -> bool:
    """Whether a path leads from one member's outputs to another member through the plan's other regions or the
    graph's `nodes` that no region holds (onnxruntime's own: a Pad, a Concat kept NCHW; a path through one of them
    closes a cycle just the same)."""
    ids = {id(r) for r in members}
    readers: dict[str, list] = {}
    held = {id(n) for r in plan for n in r.nodes}
    for r in [*plan, *(n for n in nodes if id(n) not in held)]:
        for x in (r.inputs if isinstance(r, Region) else r.input):
            readers.setdefault(x, []).append(r)
    for start in members:
        seen, todo = set(), list(start.outputs)
        while todo:
            t = todo.pop()
            for r in readers.get(t, ()):
                if id(r) in ids and r is not start:
                    return True
                if id(r) not in seen and id(r) not in ids:
                    seen.add(id(r))
                    todo.extend(r.outputs if isinstance(r, Region) else r.output)
    return False


def apply_siblings(plan: list[Region], chosen: list[Siblings], lanes: int, ni: int, opset: int,
                   made: dict | None = None) -> list[Region]:
    """The plan with each chosen group replaced by its sibling region, then put back in an order where every region
    comes after what it reads (a sibling's reader may have stood between two members). `made` (node names ->
    region) keeps the regions made, as afusion.plan.apply_pairs does."""
    made = {} if made is None else made
    first = {id(g.regions[0]): g for g in chosen}
    members = {id(r) for g in chosen for r in g.regions}
    out = []
    for r in plan:
        g = first.get(id(r))
        if g is not None:
            key = tuple(g.node_names)
            if key not in made:
                made[key] = fuse_siblings(g.regions, lanes, ni, opset)
            out.append(made[key])
        elif id(r) not in members:
            out.append(r)
    return topological(out)


def topological(plan: list[Region]) -> list[Region]:
    """`plan` reordered so that every region comes after the regions whose outputs it reads, otherwise in its order
    (Kahn's algorithm taking the earliest ready region)."""
    producer = {o: i for i, r in enumerate(plan) for o in r.outputs}
    needs = [{producer[x] for x in r.inputs if x in producer and producer[x] != i} for i, r in enumerate(plan)]
    order = stable_order(needs)
    if order is None:
        raise ValueError("the plan has a cycle: a fused group reads what it writes through other regions")
    return [plan[i] for i in order]
