"""A BERT encoder laid out as Hugging Face `BertModel` exports through `torch.onnx.export`.

* Inputs: `input_ids` int64 [batch, sequence], `attention_mask` (int64 [batch, sequence] turned into an
  additive mask with Unsqueeze, Cast, Sub(1, m), Mul(finfo.min) as HF does; or a float additive mask
  [batch, 1, 1, sequence] with `mask="float"`; or none with `mask="none"`), `token_type_ids` int64
  [batch, sequence] (unless `token_types=False`). Dims are symbolic ("batch", "sequence") with `dynamic=True`.
* Embeddings: Gather(word) + Gather(token type) + Gather(position, ids sliced to the sequence length from
  Shape), then LayerNorm.
* LayerNorm decomposed: ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma)
  -> Add(beta).
* Self-attention: MatMul + Add bias, Reshape [0, 0, heads, head_dim] + Transpose, MatMul Q K^T, Div by
  sqrt(head_dim), Add mask, Softmax, MatMul V, Transpose + Reshape [0, 0, hidden], MatMul + Add, residual
  Add, LayerNorm.
* FFN: MatMul + Add, GELU as `x * 0.5 * (1 + Erf(x / sqrt 2))` (Div, Erf, Add, Mul, Mul), MatMul + Add,
  residual Add, LayerNorm.
* Outputs: `last_hidden_state` [batch, sequence, hidden], and `pooler_output` [batch, hidden] (first token
  -> MatMul + Add -> Tanh) unless `pooler=False`.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, INT64, GraphBuilder

SIZES = {
    "tiny": dict(layers=2, hidden=128, heads=4, intermediate=512, vocab=1024, max_position=512),
    "bench": dict(layers=4, hidden=256, heads=4, intermediate=1024, vocab=8192, max_position=512),
    "base": dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, max_position=512),
}
MASKS = ("int", "float", "none")
LN_EPS = 1e-12


def _layer_norm(g: GraphBuilder, x: str, hidden: int, scope: str, param: str) -> str:
    mean = g.reduce_mean(x, [-1], scope)
    d = g.node("Sub", [x, mean], scope)
    p = g.node("Pow", [d, g.const(2.0)], scope)
    var = g.reduce_mean(p, [-1], scope)
    v = g.node("Add", [var, g.const(LN_EPS)], scope)
    s = g.node("Sqrt", [v], scope)
    n = g.node("Div", [d, s], scope)
    gamma = g.weight(f"{param}.weight", 1.0 + g.normal((hidden,), 0.02))
    beta = g.weight(f"{param}.bias", g.normal((hidden,), 0.02))
    m = g.node("Mul", [n, gamma], scope)
    return g.node("Add", [m, beta], scope)


def _linear(g: GraphBuilder, x: str, c_in: int, c_out: int, scope: str, param: str) -> str:
    """`nn.Linear` on a 3-D tensor: MatMul with the transposed weight + Add bias."""
    w = g.weight(f"onnx::MatMul_{param}", g.normal((c_in, c_out), 0.02))
    b = g.weight(f"{param}.bias", g.normal((c_out,), 0.02))
    h = g.node("MatMul", [x, w], scope)
    return g.node("Add", [b, h], scope)


def _layer(g: GraphBuilder, x: str, mask: str | None, i: int, hidden: int, heads: int, inter: int) -> str:
    scope, param = f"/encoder/layer.{i}", f"encoder.layer.{i}"
    hd = hidden // heads
    att, patt = f"{scope}/attention/self", f"{param}.attention.self"

    def heads_view(t: str, perm: list[int]) -> str:
        t = g.reshape(t, [0, 0, heads, hd], att)
        return g.node("Transpose", [t], att, perm=perm)

    q = heads_view(_linear(g, x, hidden, hidden, f"{att}/query", f"{patt}.query"), [0, 2, 1, 3])
    k = heads_view(_linear(g, x, hidden, hidden, f"{att}/key", f"{patt}.key"), [0, 2, 3, 1])
    v = heads_view(_linear(g, x, hidden, hidden, f"{att}/value", f"{patt}.value"), [0, 2, 1, 3])
    s = g.node("MatMul", [q, k], att)
    s = g.node("Div", [s, g.const(float(np.sqrt(hd)))], att)
    if mask is not None:
        s = g.node("Add", [s, mask], att)
    p = g.node("Softmax", [s], att, axis=-1)
    c = g.node("MatMul", [p, v], att)
    c = g.node("Transpose", [c], att, perm=[0, 2, 1, 3])
    c = g.reshape(c, [0, 0, hidden], att)
    so, pso = f"{scope}/attention/output", f"{param}.attention.output"
    h = _linear(g, c, hidden, hidden, f"{so}/dense", f"{pso}.dense")
    h = g.node("Add", [h, x], so)
    a = _layer_norm(g, h, hidden, f"{so}/LayerNorm", f"{pso}.LayerNorm")
    h = _linear(g, a, hidden, inter, f"{scope}/intermediate/dense", f"{param}.intermediate.dense")
    h = g.gelu(h, f"{scope}/intermediate/intermediate_act_fn")
    o, po = f"{scope}/output", f"{param}.output"
    h = _linear(g, h, inter, hidden, f"{o}/dense", f"{po}.dense")
    h = g.node("Add", [h, a], o)
    return _layer_norm(g, h, hidden, f"{o}/LayerNorm", f"{po}.LayerNorm")


def build(batch: int = 1, seq_len: int = 128, *, size: str = "tiny", layers: int | None = None,
          hidden: int | None = None, heads: int | None = None, intermediate: int | None = None,
          vocab: int | None = None, max_position: int | None = None, mask: str = "int",
          token_types: bool = True, pooler: bool = True, dynamic: bool = True, opset: int = 17, seed: int = 0,
          constants: str = "initializer") -> onnx.ModelProto:
    """BERT encoder (see the module doc). `size` picks a preset ("tiny" default: 2 layers, hidden 128,
    4 heads, FFN 512; "bench": 4 layers, hidden 256; "base": BERT-base); explicit arguments override it.

    With `dynamic=True` (default) batch and sequence are symbolic and `batch`/`seq_len` are only the
    suggested feed shape (recorded in the metadata); with `dynamic=False` they are fixed in the inputs.
    """
    if size not in SIZES:
        raise UsageError(f"unknown BERT size {size!r}; use one of {sorted(SIZES)}")
    if mask not in MASKS:
        raise UsageError(f"unknown attention mask kind {mask!r}; use one of {list(MASKS)}")
    cfg = dict(SIZES[size])
    for key, val in dict(layers=layers, hidden=hidden, heads=heads, intermediate=intermediate, vocab=vocab,
                         max_position=max_position).items():
        if val is not None:
            if not isinstance(val, int) or val < 1:
                raise UsageError(f"{key} must be a positive integer, not {val!r}")
            cfg[key] = val
    L, H, nh, F, V, P = (cfg[k] for k in ("layers", "hidden", "heads", "intermediate", "vocab", "max_position"))
    if H % nh:
        raise UsageError(f"hidden ({H}) must be a multiple of heads ({nh})")
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(seq_len, int) or not 1 <= seq_len <= P:
        raise UsageError(f"seq_len must be an integer from 1 to max_position ({P}), not {seq_len!r}")

    g = GraphBuilder(opset, seed, constants)
    b_dim, s_dim = ("batch", "sequence") if dynamic else (batch, seq_len)
    ids = g.input("input_ids", INT64, [b_dim, s_dim])
    ext_mask = None
    if mask == "int":
        am = g.input("attention_mask", INT64, [b_dim, s_dim])
        m = g.unsqueeze(am, [1], "")
        m = g.unsqueeze(m, [2], "")
        m = g.node("Cast", [m], "", to=onnx.TensorProto.FLOAT)
        m = g.node("Sub", [g.const(1.0), m], "")
        ext_mask = g.node("Mul", [m, g.const(float(np.finfo(np.float32).min))], "")
    elif mask == "float":
        ext_mask = g.input("attention_mask", FLOAT, [b_dim, 1, 1, s_dim])
    tt = g.input("token_type_ids", INT64, [b_dim, s_dim]) if token_types else None

    e, pe = "/embeddings", "embeddings"
    word = g.weight(f"{pe}.word_embeddings.weight", g.normal((V, H), 0.02))
    h = g.node("Gather", [word, ids], f"{e}/word_embeddings")
    if tt is not None:
        tte = g.weight(f"{pe}.token_type_embeddings.weight", g.normal((2, H), 0.02))
        h = g.node("Add", [h, g.node("Gather", [tte, tt], f"{e}/token_type_embeddings")], e)
    # position_ids = self.position_ids[:, :seq_length] -> Shape, Gather, Unsqueeze, Slice of the buffer
    pos_buf = g.weight(f"{pe}.position_ids", np.arange(P, dtype=np.int64)[None])
    shape = g.node("Shape", [ids], e)
    seq = g.node("Gather", [shape, g.const(1, np.int64)], e, axis=0)
    seq = g.unsqueeze(seq, [0], e)
    pos_ids = g.node("Slice", [pos_buf, g.const([0], np.int64), seq, g.const([1], np.int64),
                               g.const([1], np.int64)], e)
    pos = g.weight(f"{pe}.position_embeddings.weight", g.normal((P, H), 0.02))
    h = g.node("Add", [h, g.node("Gather", [pos, pos_ids], f"{e}/position_embeddings")], e)
    h = _layer_norm(g, h, H, f"{e}/LayerNorm", f"{pe}.LayerNorm")

    for i in range(L):
        h = _layer(g, h, ext_mask, i, H, nh, F)
    h = g.output(h, "last_hidden_state", FLOAT, [b_dim, s_dim, H])
    if pooler:
        first = g.node("Gather", [h, g.const(0, np.int64)], "/pooler", axis=1)
        w = g.weight("onnx::MatMul_pooler.dense", g.normal((H, H), 0.02))
        b = g.weight("pooler.dense.bias", g.normal((H,), 0.02))
        p = g.node("Add", [b, g.node("MatMul", [first, w], "/pooler/dense")], "/pooler/dense")
        p = g.node("Tanh", [p], "/pooler/activation")
        g.output(p, "pooler_output", FLOAT, [b_dim, H])
    return g.model("bert", {
        "model": "bert", "size": size, "layers": L, "hidden": H, "heads": nh, "intermediate": F, "vocab": V,
        "max_position": P, "mask": mask, "batch": batch, "seq_len": seq_len,
    })
