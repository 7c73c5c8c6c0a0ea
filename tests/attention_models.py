"""Attention chains in the forms exporters write, for the tests of fusion/attention.py and kinds/attention."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def attention_model(form: str, b, h, m, lq, d: int, mask: str, guard: bool, opset: int = 18, dv: int | None = None,
                    kv_heads=None, split_heads: bool = False):
    """Q, K, V as graph inputs ([b, h, m, d], [b, kv_heads, lq, d], [b, kv_heads, lq, dv]) and an attention chain
    in `form`: "sdpa" (sqrt scale on Q and on K^T, K^T a Transpose of K made outside the chain's reach), "bert"
    (Div of the scores, K^T by a Transpose the chain owns), "fused" (com.microsoft FusedMatMul transB=1 alpha),
    "unscaled". `mask`: "none", "add" (an additive mask input [b, 1, 1, lq]), "causal" (an additive [1, 1, m, lq]
    constant; m and lq numbers), "select" (Where(keep, scores, -1e4), keep a bool input [b, 1, m, lq]), "fill"
    (masked_fill: Where(masked, finfo.min, scores), masked a bool input [b, 1, m, lq]). Dims may be names
    (symbolic). `split_heads`: Q, K and V come in token-major, [b, m, h, d] (as a projection's Reshape gives them),
    through the head split's Transposes (K^T of the sdpa form in one Transpose [0, 2, 3, 1]), and the output goes
    back through the merge's Transpose to [b, m, h, dv]."""
    dv = d if dv is None else dv
    kv_heads = h if kv_heads is None else kv_heads
    scale = 1.0 / np.sqrt(d)
    nodes, inits = [], []
    ins = [helper.make_tensor_value_info("q", F, [b, h, m, d]),
           helper.make_tensor_value_info("k", F, [b, kv_heads, lq, d]),
           helper.make_tensor_value_info("v", F, [b, kv_heads, lq, dv])]
    if split_heads:
        ins = [helper.make_tensor_value_info("q_tokens", F, [b, m, h, d]),
               helper.make_tensor_value_info("k_tokens", F, [b, lq, kv_heads, d]),
               helper.make_tensor_value_info("v_tokens", F, [b, lq, kv_heads, dv])]
        nodes += [helper.make_node("Transpose", ["q_tokens"], ["q"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", ["v_tokens"], ["v"], perm=[0, 2, 1, 3])]
        if form != "sdpa":
            nodes.append(helper.make_node("Transpose", ["k_tokens"], ["k"], perm=[0, 2, 1, 3]))
    if form == "sdpa" and split_heads:
        inits.append(_const("s", np.sqrt(scale)))
        nodes += [helper.make_node("Transpose", ["k_tokens"], ["kt2"], perm=[0, 2, 3, 1]),
                  helper.make_node("Mul", ["q", "s"], ["qs"]), helper.make_node("Mul", ["kt2", "s"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    elif form == "sdpa":
        inits.append(_const("s", np.sqrt(scale)))
        nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                  helper.make_node("Identity", ["kt"], ["kt2"]),  # K^T computed outside the chain's reach
                  helper.make_node("Mul", ["q", "s"], ["qs"]), helper.make_node("Mul", ["kt2", "s"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    elif form == "bert":
        inits.append(_const("sq", np.sqrt(d)))
        nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", ["q", "kt"], ["raw"]), helper.make_node("Div", ["raw", "sq"], ["scores"])]
    elif form == "fused":
        nodes.append(helper.make_node("FusedMatMul", ["q", "k"], ["scores"], domain="com.microsoft", transB=1,
                                      alpha=float(scale)))
    else:
        nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", ["q", "kt"], ["scores"])]
    logits = "scores"
    if mask == "add":
        ins.append(helper.make_tensor_value_info("mask", F, [b, 1, 1, lq]))
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["logits"]))
        logits = "logits"
    elif mask == "causal":
        causal = np.where(np.tril(np.ones((m, lq), bool), k=lq - m), 0.0, -np.inf).astype(np.float32)
        inits.append(numpy_helper.from_array(causal.reshape(1, 1, m, lq), "causal"))
        nodes.append(helper.make_node("Add", ["causal", "scores"], ["logits"]))
        logits = "logits"
    elif mask == "select":
        ins.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [b, 1, m, lq]))
        inits.append(_const("fill", -1e4))
        nodes.append(helper.make_node("Where", ["keep", "scores", "fill"], ["logits"]))
        logits = "logits"
    elif mask == "fill":
        ins.append(helper.make_tensor_value_info("masked", TensorProto.BOOL, [b, 1, m, lq]))
        inits.append(_const("fill", np.finfo(np.float32).min))
        nodes.append(helper.make_node("Where", ["masked", "fill", "scores"], ["logits"]))
        logits = "logits"
    nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1 if opset >= 13 else 3))
    probs = "probs"
    if guard:
        inits.append(_const("zero", 0.0))
        nodes += [helper.make_node("IsNaN", ["probs"], ["nan"]),
                  helper.make_node("Where", ["nan", "zero", "probs"], ["guarded"])]
        probs = "guarded"
    nodes.append(helper.make_node("MatMul", [probs, "v"], ["heads" if split_heads else "out"]))
    if split_heads:
        nodes.append(helper.make_node("Transpose", ["heads"], ["out"], perm=[0, 2, 1, 3]))
    graph = helper.make_graph(nodes, "attention", ins, [helper.make_tensor_value_info("out", F, None)], inits)
    if form == "fused":  # onnx's shape inference does not know com.microsoft ops; onnxruntime's would type it
        graph.value_info.append(helper.make_tensor_value_info("scores", F, None))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if form == "fused" else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def feeds_for(model, seed=0):
    """Random inputs of the model's (numeric) dims: masks keep about three keys in four."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name == "keep":
            out[i.name] = rng.random(dims) > 0.3
        elif i.name == "masked":
            out[i.name] = rng.random(dims) < 0.3
        elif i.name == "mask":
            out[i.name] = np.where(rng.random(dims) > 0.25, 0.0, np.finfo(np.float32).min).astype(np.float32)
        else:
            out[i.name] = rng.standard_normal(dims).astype(np.float32)
    return out
