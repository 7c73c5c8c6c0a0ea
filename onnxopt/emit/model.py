"""Write fused.onnx: each accepted region becomes one node `onnxopt::<Kind>_<hash>`, and the model also carries a
model-local function of the same name whose body is the original subgraph.

An onnxruntime that registers the kernel library runs the native kernel; one that does not inlines the function and
still computes the same tensors. Scalar constants that the kernel inlined are re-created as `Constant` nodes inside
the function body (a function cannot see the graph's initializers).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt import __version__
from onnxopt.graph.order import stable_order
from onnxopt.fusion.layout import blocked_outputs
from onnxopt.fusion.region import Region
from onnxopt.graph.fold import outer_names_of, remove_dead_nodes
from onnxopt.graph.load import ort_loadable_ir

DOMAIN = "onnxopt"
META_LIBRARY = "onnxopt.library"
META_SHA256 = "onnxopt.library_sha256"
META_TARGET = "onnxopt.target"
META_CPU_FLAGS = "onnxopt.cpu_flags"
META_VERSION = "onnxopt.version"
# The precision the fused GEMMs' weights were lowered to ("bf16", "fp16"; absent: float32 throughout), and which
# regions took it (JSON: {"precision", "requested", "kernels", "lowered_regions", "float32_compute_regions"}); the
# loader reports both (runtime/__init__.py, LibraryCheck.precision).
META_PRECISION = "onnxopt.precision"
META_PRECISION_DETAIL = "onnxopt.precision_detail"


def _body_and_constants(region: Region, inits: dict) -> tuple[list, list[str]]:
    """The function body's nodes and the graph initializers it embeds as Constant nodes."""
    # An AFUSION region's epilogues are its parts' (fusion/afusion/siso.py): their constants too.
    programs = [region.program] + [p.program for p in (region.compute.parts if region.compute is not None else [])]
    used_consts = list(dict.fromkeys(c for prog in programs if prog is not None for c in prog.consts if c in inits))
    # Compute regions carry their own body: the original ops, rewritten to read the packed weights.
    # A pool or a copy on blocked tensors: its rewrite for the 5-D form.
    nodes = region.params.fallback_body() or region.nodes
    if region.compute is None:  # the body reads other constants itself (a BatchNormalization, a Resize's scales)
        used_consts += [x for x in dict.fromkeys(x for n in nodes for x in n.input)
                        if x in inits and x not in region.inputs and x not in used_consts]
    return nodes, used_consts


def fallback_key(region: Region, model: onnx.ModelProto) -> str:
    """A digest of the region's whole function body, for its op type: one op type has one function, so two regions
    whose kernels are the same but whose bodies differ (per-node constants, shapes embedded in a copy's body, other
    attributes) must get two op types. DenseNet-BC's uniform BatchNormalizations shared one kernel over 50 widths, and
    YOLOv8's Resize -> Concat copies of two sizes shared one; the first body then failed onnxruntime's shape inference
    for the others, and the model did not load without the library.

    Tensor names are replaced by their positions (inputs, outputs, then the body's own tensors in order of first
    use), and node names are dropped, so the same computation on other tensors is one function."""
    f = _function_for(region, model)
    names: dict[str, str] = {}
    for i, x in enumerate(f.input):
        names[x] = f"i{i}"
    for i, x in enumerate(f.output):
        names.setdefault(x, f"o{i}")
    h = hashlib.sha256()
    for n in f.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = ""
        for a in c.attribute:  # a Constant's tensor carries the name of the tensor it defines
            if a.HasField("t"):
                a.t.name = ""
            for t in a.tensors:
                t.name = ""
        for field in (c.input, c.output):
            for k, x in enumerate(field):
                if x:
                    field[k] = names.setdefault(x, f"t{len(names)}")
        h.update(c.SerializeToString(deterministic=True))
    return h.hexdigest()[:16]


def _function_for(region: Region, model: onnx.ModelProto) -> onnx.FunctionProto:
    inits = {t.name: t for t in model.graph.initializer}
    body = []
    nodes, used_consts = _body_and_constants(region, inits)
    for name in used_consts:
        body.append(helper.make_node("Constant", [], [name], value=inits[name]))
    for n in nodes:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        body.append(m)
    # The default domain, and any other its body's nodes use (com.microsoft's FusedMatMul in an attention chain).
    used = {n.domain for n in body} - {"", "ai.onnx"}
    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx") or o.domain in used]
    # A fused node may read one tensor twice (Conv(x) + x); a function's inputs must have distinct names, and the
    # body reads the first, so later copies get names of their own that nothing reads.
    inputs, seen = [], set()
    for i, x in enumerate(region.inputs):
        inputs.append(x if x not in seen else f"{x}__again{i}")
        seen.add(x)
    return helper.make_function(DOMAIN, region.op_type, inputs, list(region.outputs), body, opsets)


def stable_toposort(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Kahn's algorithm that keeps the given order wherever dependencies allow."""
    producer = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = i
    deps = [set() for _ in nodes]
    for i, n in enumerate(nodes):
        for x in [*n.input, *outer_names_of(n)]:
            p = producer.get(x)
            if p is not None and p != i:
                deps[i].add(p)
    order = stable_order(deps)
    if order is None:
        raise RuntimeError("fusion produced a cycle; this is a bug in the region legality check")
    return [nodes[i] for i in order]




def _stored_as_float16(g: onnx.GraphProto, t: onnx.TensorProto) -> onnx.NodeProto:
    """Weights a float32 kernel reads, already rounded to float16 values (driver/precision.py, `--precision fp16`),
    as a float16 initializer (exact) and the Cast that gives the kernel `t`: onnxruntime folds it into a float32
    constant when a session loads the model, so the file holds them once, in half the bytes."""
    half = f"{t.name}__float16"
    g.initializer.add().CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), half))
    return helper.make_node("Cast", [half], [t.name], name=f"{t.name}__widen", to=onnx.TensorProto.FLOAT)


def build_fused_model(model: onnx.ModelProto, regions: list[Region], library_file: str | None, sha256: str | None,
                      target: dict, cpu_flags: list[str], constants: onnx.ModelProto | None = None,
                      precision: dict | None = None) -> onnx.ModelProto:
    """`model` with the regions fused. `constants`: the model whose initializers the function bodies embed, when
    `model` is a light copy whose large weights are only declared (graph/large.py, SharedWeights); default `model`.
    `precision`: what the weights were lowered to (META_PRECISION's "precision", with its detail), or None."""
    constants = model if constants is None else constants
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    replaced = {}
    for r in regions:
        for n in r.nodes:
            replaced[id_of(n)] = r
    new_nodes = []
    emitted = set()
    for n in model.graph.node:
        r = replaced.get(id_of(n))
        if r is None:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            new_nodes.append(m)
        elif r.relayout is not None:  # the node rewritten for blocked tensors (fusion/blocked_passthrough.py)
            for m in r.relayout:
                c = onnx.NodeProto()
                c.CopyFrom(m)
                new_nodes.append(c)
        elif id(r) not in emitted:
            emitted.add(id(r))
            # Named after the first original node it replaces, so profiles of the fused model read like the original's.
            first = r.nodes[0].name if r.nodes and r.nodes[0].name else r.op_type
            new_nodes.append(helper.make_node(r.op_type, list(r.inputs), list(r.outputs),
                                              name=f"{first}__onnxopt{len(emitted)}", domain=DOMAIN))
    del g.node[:]
    g.node.extend(stable_toposort(new_nodes))
    # Tensors that fused convolutions pass in the blocked layout no longer have the shapes the model declared.
    blocked = {o for r in regions for o in blocked_outputs(r)}
    keep = [v for v in g.value_info if v.name not in blocked]
    del g.value_info[:]
    g.value_info.extend(keep)
    have = {t.name for t in g.initializer}
    casts = []
    for r in regions:
        stored16 = r.compute is not None and r.compute.attrs.stored_dtype == "float16"
        for t in r.carried_initializers:
            if t.name in have:
                continue
            have.add(t.name)
            if stored16 and t.name == r.inputs[1]:
                casts.append(_stored_as_float16(g, t))
            else:
                g.initializer.add().CopyFrom(t)  # append serializes, which fails past 2 GB
    if casts:  # they read initializers only: first in the graph
        nodes = casts + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    funcs, keys = {}, {}
    for r in regions:
        if r.relayout is None:
            funcs.setdefault(r.op_type, _function_for(r, constants))
            key = fallback_key(r, constants)
            if keys.setdefault(r.op_type, key) != key:
                raise RuntimeError(f"two regions of op type {r.op_type} embed different constants in their function "
                                   "fallbacks; this is a bug in the op type's key (Region.fallback_key)")
    out.functions.extend(funcs.values())
    if funcs and not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    remove_dead_nodes(out)
    ort_loadable_ir(out, needs_functions=bool(regions))  # also fixes IR 3 models that gained initializers
    meta = {p.key: p.value for p in out.metadata_props}
    if regions and library_file:
        meta[META_LIBRARY] = library_file
        meta[META_SHA256] = sha256 or ""
        meta[META_TARGET] = json.dumps(target, sort_keys=True)
        meta[META_CPU_FLAGS] = ",".join(cpu_flags)
    meta[META_VERSION] = __version__
    if precision is not None:
        meta[META_PRECISION] = precision["precision"]
        meta[META_PRECISION_DETAIL] = json.dumps(precision, sort_keys=True)
    del out.metadata_props[:]
    for k, v in meta.items():
        out.metadata_props.add(key=k, value=v)
    return out


def set_library_sha256(model: onnx.ModelProto, sha256: str) -> None:
    """Record the linked library's hash (it is linked after the model is built: the sequences come from the model)."""
    for p in model.metadata_props:
        if p.key == META_SHA256:
            p.value = sha256
            return
    model.metadata_props.add(key=META_SHA256, value=sha256)


def set_library_name(model: onnx.ModelProto, name: str | None) -> None:
    """Name the model's kernel library (a bare file name beside the model), or with None name none: a model held
    in memory names no file (Result.save names the one it writes)."""
    keep = [(p.key, p.value) for p in model.metadata_props if p.key != META_LIBRARY]
    del model.metadata_props[:]
    if name is not None:
        keep.insert(0, (META_LIBRARY, name))
    for k, v in keep:
        model.metadata_props.add(key=k, value=v)


def id_of(node: onnx.NodeProto) -> tuple:
    """Nodes are identified by their outputs (unique in a valid graph)."""
    return tuple(node.output)
