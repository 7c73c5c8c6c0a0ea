"""Constant folding of the main graph, the way exported models need it.

Exporters leave `Constant` nodes, `Shape` arithmetic on static shapes, `ConstantOfShape` and friends everywhere.
We turn `Constant` nodes into initializers, replace `Shape`/`Size` of statically shaped tensors by their values,
and evaluate every deterministic node whose inputs are all constant, or computed by such nodes, with onnxruntime
itself (one session for all of them, repeated to a fixed point). A tensor's static shape comes from the model's
value_info or, where it has none, from shape inference on the graph folded so far: an export with no value_info
(BERT from the torch exporter) computes its head-merge Reshape's shape from Shape(LayerNorm output), and that
LayerNorm's shape is known only once the position ids' Slice has folded. A folded tensor that would grow the model
(more than 1 MiB and more than twice its inputs, such as a large `ConstantOfShape` or `Tile`) is left as a node, and
so is every node of the same chain computed from it. Initializers that are also graph inputs
can be overridden at run time (IR < 4 models list weights that way), so they are never treated as constants.
Subgraphs of If/Loop/Scan are left as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .large import ANALYSE_LIGHT_BYTES, add_messages, inference_session, light_copy, model_bytes
from .quantized import QUANTIZATION_OPS

NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                    "Bernoulli", "Dropout"}
GROWTH_LIMIT_BYTES = 1 << 20


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def names_used_by_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """Outer-scope names read inside If/Loop/Scan bodies (anywhere below this graph)."""
    used: set[str] = set()

    def visit(g: onnx.GraphProto, outer: bool):
        local = {i.name for i in g.input} | {t.name for t in g.initializer}
        for n in g.node:
            local.update(n.output)
        for n in g.node:
            if outer:
                used.update(x for x in n.input if x and x not in local)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g, True)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        visit(sg, True)

    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                visit(a.g, True)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    visit(sg, True)
    return used


def _cone(names: set[str], graph: onnx.GraphProto) -> set[str]:
    """The given tensors and every tensor they are computed from in this graph."""
    producer = {o: n for n in graph.node for o in n.output if o}
    cone, todo = set(), list(names)
    while todo:
        x = todo.pop()
        if x in cone:
            continue
        cone.add(x)
        if x in producer:
            todo.extend(i for i in producer[x].input if i)
    return cone


def outer_names_of(node: onnx.NodeProto) -> set[str]:
    """Names a node's If/Loop/Scan bodies read from enclosing scopes (they are inputs of the node in effect)."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                names.update(x for x in n.input if x and x not in local)
                names.update(x for x in outer_names_of(n) if x not in local)
    return names


def _constant_node_value(node: onnx.NodeProto):
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), dtype=np.float32)
        if a.name == "value_int":
            return np.array(a.i, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), dtype=np.int64)
    return None  # sparse_value / string values: leave the node alone


def _static_shape(vi_map, name):
    vi = vi_map.get(name)
    if vi is None or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return dims


def _inferred_value_info(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Shape inference's value_info for `model` as it is now (a light copy of a big one); the model is unchanged."""
    analysed = light_copy(model) if model_bytes(model) > ANALYSE_LIGHT_BYTES else model
    try:
        inferred = onnx.shape_inference.infer_shapes(analysed, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes only help folding
        return {}
    return {v.name: v for v in inferred.graph.value_info}


def fold_constants(model: onnx.ModelProto, max_rounds: int = 16) -> int:
    """Fold in place; returns the number of nodes removed."""
    import onnxruntime as ort

    graph = model.graph
    before = len(graph.node)
    overridable = {i.name for i in graph.input}
    consts: dict[str, np.ndarray] = {}
    for t in graph.initializer:
        if t.name not in overridable and t.data_type != onnx.TensorProto.STRING:
            consts[t.name] = None  # value read lazily
    protected = {o.name for o in graph.output}
    default_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)

    # A constant If condition makes onnxruntime inline the branch at load time, and branches built for dynamic
    # shapes can then fail its shape inference; leave conditions as they are (ORT folds them when it can).
    if_conditions = _cone({n.input[0] for n in graph.node if n.op_type == "If" and n.input}, graph)
    new_inits: list[onnx.TensorProto] = []
    for _ in range(max_rounds):
        vi_map = {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
        if any(n.op_type in ("Shape", "Size") and n.input[0] not in consts and _static_shape(vi_map, n.input[0]) is None
               for n in graph.node):
            vi_map = {**_inferred_value_info(model), **vi_map}
        folded: dict[str, np.ndarray] = {}
        to_eval = []
        evaluated: set[str] = set()  # outputs of this round's evaluated nodes: a chain folds in one session
        for n in graph.node:
            if n.domain not in ("", "ai.onnx") or _has_subgraph(n) or n.op_type in NONDETERMINISTIC \
                    or n.op_type in QUANTIZATION_OPS:  # int8 weights stay int8 for onnxruntime's QDQ kernels
                continue
            if any(o in if_conditions for o in n.output):
                continue
            if n.op_type == "Constant":
                v = _constant_node_value(n)
                if v is not None:
                    folded[n.output[0]] = v
                continue
            if n.op_type in ("Shape", "Size") and n.input[0] not in consts:
                shape = _static_shape(vi_map, n.input[0])
                if shape is not None:
                    if n.op_type == "Size":
                        folded[n.output[0]] = np.array(int(np.prod(shape)), dtype=np.int64)
                    else:
                        start = next((a.i for a in n.attribute if a.name == "start"), 0)
                        end = next((a.i for a in n.attribute if a.name == "end"), None)
                        folded[n.output[0]] = np.array(shape[start:end], dtype=np.int64)
                    continue
            if all((not x) or x in consts or x in evaluated for x in n.input) and any(n.input):
                to_eval.append(n)
                evaluated.update(o for o in n.output if o)
        if to_eval:
            folded.update(_evaluate(model, to_eval, consts, default_opset, ort))
        if not folded:
            break
        keep_nodes = []
        for n in graph.node:
            outs = [o for o in n.output if o]
            if outs and all(o in folded for o in outs):
                continue
            keep_nodes.append(n)
        del graph.node[:]
        graph.node.extend(keep_nodes)
        for name, value in folded.items():
            new_inits.append(numpy_helper.from_array(np.asarray(value), name))
            consts[name] = value
        add_messages(graph.initializer, new_inits)
        new_inits = []
    remove_dead_nodes(model, protected)
    return before - len(graph.node)


def _evaluate(model, nodes, consts, opset, ort) -> dict[str, np.ndarray]:
    """Run the constant nodes in one onnxruntime session; skip the ones that would grow the model."""
    init_by_name = {t.name: t for t in model.graph.initializer}
    needed = {x for n in nodes for x in n.input if x}
    produced = {o for n in nodes for o in n.output}
    inits = [init_by_name[x] for x in needed if x in init_by_name and x not in produced]
    outputs = [o for n in nodes for o in n.output if o]
    g = helper.make_graph(list(nodes), "fold", [], [helper.make_empty_tensor_value_info(o) for o in outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[o for o in model.opset_import])
    m.ir_version = min(model.ir_version if model.ir_version >= 7 else 7, 10)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:  # constants are evaluated on the host whatever the target: the CPU provider
        sess = inference_session(m, so, ["CPUExecutionProvider"])
        result = dict(zip(outputs, sess.run(outputs, {})))
    except Exception:  # noqa: BLE001 - find the nodes ORT cannot evaluate: one by one, the rest still fold
        if len(nodes) == 1:
            return {}
        result = {}
        for n in nodes:
            known = dict(consts)
            known.update(result)
            if not all((not x) or (x in known) for x in n.input):
                continue
            part = _evaluate_one(model, n, known, result, init_by_name, ort, so)
            result.update(part)
    out: dict[str, np.ndarray] = {}
    for n in nodes:  # in graph order: a node computed from one that stays a node stays a node too
        in_bytes = sum(_nbytes(init_by_name.get(x), result.get(x)) for x in n.input if x)
        ok = all(x in out for x in n.input if x and x in produced)
        for o in n.output:
            if not o:
                continue
            v = result.get(o)
            if v is None:  # ORT could not evaluate this node: it stays a node
                ok = False
            elif not isinstance(v, np.ndarray) or v.dtype == object:
                ok = False
            elif v.nbytes > GROWTH_LIMIT_BYTES and v.nbytes > 2 * in_bytes:
                ok = False
        if ok:
            for o in n.output:
                if o:
                    out[o] = result[o]
    return out


def _evaluate_one(model, n, known, computed, init_by_name, ort, so) -> dict:
    inits = []
    for x in n.input:
        if not x:
            continue
        if x in computed:
            inits.append(numpy_helper.from_array(np.asarray(computed[x]), x))
        elif x in init_by_name:
            inits.append(init_by_name[x])
    outs = [o for o in n.output if o]
    g = helper.make_graph([n], "fold1", [], [helper.make_empty_tensor_value_info(o) for o in outs], initializer=inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = min(model.ir_version if model.ir_version >= 7 else 7, 10)
    try:
        sess = inference_session(m, so, ["CPUExecutionProvider"])
        return dict(zip(outs, sess.run(outs, {})))
    except Exception:  # noqa: BLE001 - this node stays a node
        return {}


def _nbytes(init, value) -> int:
    if value is not None:
        return int(np.asarray(value).nbytes)
    if init is None:
        return 0
    n = int(np.prod(init.dims)) if init.dims else 1
    return n * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize


def remove_dead_nodes(model: onnx.ModelProto, protected: set[str] | None = None) -> None:
    graph = model.graph
    live = {o.name for o in graph.output} | (protected or set()) | names_used_by_subgraphs(graph)
    keep = []
    for n in reversed(graph.node):
        if any(o in live for o in n.output if o) or (n.domain not in ("", "ai.onnx") and not n.output):
            keep.append(n)
            live.update(x for x in n.input if x)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    used = live | {i.name for i in graph.input}
    inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    add_messages(graph.initializer, inits)


def replace_nodes(graph: onnx.GraphProto, nodes: list, gone: set[str]) -> None:
    """The graph's nodes become `nodes` (in that order); the value_info of the tensors in `gone`, which no node
    produces any more, is dropped with them."""
    del graph.node[:]
    graph.node.extend(nodes)
    infos = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(infos)
