"""The seed papers' benchmark shapes as plain data, and builders of single-op (or two-op chain) ONNX models.

Tables (each a dict from the shape's name to a `ConvShape`, `MatMulShape` or chain):

* `UNIT_CONVS` "U1".."U16": UNIT's Table I, the 16 conv workloads of its ablation (batch 1, padding 0);
  `UNIT_OHW` is the paper's printed output size, which the shapes reproduce.
* `CHIMERA_CONV_CHAINS` "C1".."C8" (Table V) and their member convs `CHIMERA_CONVS` "C1.conv1", "C1.conv2"...
  The paper gives no batch or padding; as Chimera's artifact: batch 1, pads k // 2. With those pads C2 and C5
  give 74 and 57 rows after conv1, not the floor(H / st1) = 73 and 56 of the paper's formula.
* `CHIMERA_GEMM_CHAINS` "G1".."G12" (Table IV): GEMM1 (b,M,K) x (b,K,L), GEMM2 (b,M,L) x (b,L,N); their members
  `CHIMERA_MATMULS` "G1.gemm1", "G1.gemm2"... Operands stay 3-D, batch 1 included.
* `OPTIFX_SUBGRAPHS` "G1".."G7" (Tables 3 and 4: SISO, SIMO and MISO conv patterns) and their member convs
  `OPTIFX_CONVS` "G1.conv1".. (batch 1). Padding is not printed: 0 for G1 (Inception-v3's valid stem conv;
  only pad 0 reproduces the paper's intensity 157.09), 1 for the other 3x3 convs (reproduces G3's 22.93 and
  G4's 3.27). G5's squeeze conv keeps the printed 128 input channels, although only 96 (SqueezeNet's fire2)
  reproduces the printed intensity.
* `HERON_C2D_LADDER` "L1".."L6": Heron's TensorCore C2D shapes (batch 16). The digest gives no padding; pads
  k // 2 here (an assumption). `HERON_TABLE9_CONVS` "C1".."C5": Heron's Table 9 C2D shapes, batch and padding
  as printed.

`ALL_CONVS` / `ALL_MATMULS` hold every member shape under "<table>/<name>" ("unit/U1", "chimera/C1.conv1",
"chimera/G1.gemm1", "optifx/G4.conv1", "heron_ladder/L1", "heron_table9/C1").

Builders (weights as initializers drawn from a normal distribution scaled by 1/sqrt(fan_in); MatMul operands as
graph inputs): `conv_model`, `matmul_model`, `conv_chain_model` (Conv-Relu-Conv), `gemm_chain_model`
(MatMul-[Relu|Softmax]-MatMul) and `optifx_model`. Each takes an optional epilogue (a name or a list of names
from `EPILOGUES`) applied to the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import onnx

from onnxopt.errors import UsageError

from ._graph import FLOAT, GraphBuilder


class ConvShape(NamedTuple):
    """One 2-D convolution: `c_in` x `height` x `width` input, `c_out` filters of `kernel` x `kernel`."""
    name: str
    c_in: int
    height: int
    width: int
    c_out: int
    kernel: int
    stride: int = 1
    pad: int = 0
    groups: int = 1
    batch: int = 1

    @property
    def out_hw(self) -> tuple[int, int]:
        return ((self.height + 2 * self.pad - self.kernel) // self.stride + 1,
                (self.width + 2 * self.pad - self.kernel) // self.stride + 1)

    def input_shape(self, batch: int | None = None) -> list[int]:
        return [self.batch if batch is None else batch, self.c_in, self.height, self.width]

    def weight_shape(self) -> list[int]:
        return [self.c_out, self.c_in // self.groups, self.kernel, self.kernel]

    def output_shape(self, batch: int | None = None) -> list[int]:
        return [self.batch if batch is None else batch, self.c_out, *self.out_hw]

    def flops(self, batch: int | None = None) -> int:
        """2 * N * K * OH * OW * C * R * S / G (multiply-adds counted twice, no bias)."""
        n, k, oh, ow = self.output_shape(batch)
        return 2 * n * k * oh * ow * (self.c_in // self.groups) * self.kernel * self.kernel

    def bytes(self, batch: int | None = None, itemsize: int = 4) -> int:
        """Input + weight + output bytes (OptiFX's Eq. 3 denominator)."""
        return itemsize * sum(int(np.prod(s)) for s in (self.input_shape(batch), self.weight_shape(),
                                                         self.output_shape(batch)))


class MatMulShape(NamedTuple):
    """A batched matrix product (batch, m, k) x (batch, k, n) -> (batch, m, n)."""
    name: str
    batch: int
    m: int
    k: int
    n: int

    def a_shape(self, batch: int | None = None) -> list[int]:
        return [self.batch if batch is None else batch, self.m, self.k]

    def b_shape(self, batch: int | None = None) -> list[int]:
        return [self.batch if batch is None else batch, self.k, self.n]

    def output_shape(self, batch: int | None = None) -> list[int]:
        return [self.batch if batch is None else batch, self.m, self.n]

    def flops(self, batch: int | None = None) -> int:
        return 2 * (self.batch if batch is None else batch) * self.m * self.n * self.k


class ConvChain(NamedTuple):
    """Chimera's conv chain: conv1 (ic -> oc1, k1 x k1, stride st1), conv2 (oc1 -> oc2, k2 x k2, stride st2)."""
    name: str
    ic: int
    h: int
    w: int
    oc1: int
    oc2: int
    st1: int
    st2: int
    k1: int
    k2: int
    batch: int = 1

    @property
    def conv1(self) -> ConvShape:
        return ConvShape(f"{self.name}.conv1", self.ic, self.h, self.w, self.oc1, self.k1, self.st1, self.k1 // 2,
                         batch=self.batch)

    @property
    def conv2(self) -> ConvShape:
        oh, ow = self.conv1.out_hw
        return ConvShape(f"{self.name}.conv2", self.oc1, oh, ow, self.oc2, self.k2, self.st2, self.k2 // 2,
                         batch=self.batch)


class GemmChain(NamedTuple):
    """Chimera's batch GEMM chain: C = A (b,M,K) x B (b,K,L); E = C (b,M,L) x D (b,L,N)."""
    name: str
    batch: int
    m: int
    n: int
    k: int
    l: int

    @property
    def gemm1(self) -> MatMulShape:
        return MatMulShape(f"{self.name}.gemm1", self.batch, self.m, self.k, self.l)

    @property
    def gemm2(self) -> MatMulShape:
        return MatMulShape(f"{self.name}.gemm2", self.batch, self.m, self.l, self.n)


class OptiFXSubgraph(NamedTuple):
    """An OptiFX fusion pattern: SISO conv1 -> conv2; SIMO conv1 -> {conv2, conv3}; MISO {conv1, conv2} -> Add."""
    name: str
    pattern: str  # "SISO", "SIMO" or "MISO"
    convs: tuple[ConvShape, ...]
    intensity: tuple[float, float]  # the paper's FLOP/byte before -> after fusion (Table 4)


# --- UNIT, Table I ------------------------------------------------------------------------------------------------

UNIT_C = (288, 160, 1056, 80, 128, 192, 256, 1024, 128, 576, 96, 1024, 576, 64, 64, 608)
UNIT_IHW = (35, 9, 7, 73, 16, 16, 16, 14, 16, 14, 16, 14, 14, 29, 56, 14)
UNIT_K = (384, 224, 192, 192, 128, 192, 256, 512, 160, 192, 128, 256, 128, 96, 128, 192)
UNIT_RS = (3, 3, 1, 3, 3, 3, 3, 1, 3, 1, 3, 1, 1, 3, 1, 1)
UNIT_STRIDE = (2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1)
UNIT_OHW = (17, 7, 7, 71, 14, 14, 14, 14, 14, 14, 14, 14, 14, 27, 28, 14)

UNIT_CONVS: dict[str, ConvShape] = {
    f"U{i}": ConvShape(f"U{i}", c, hw, hw, k, rs, st, 0)
    for i, (c, hw, k, rs, st) in enumerate(zip(UNIT_C, UNIT_IHW, UNIT_K, UNIT_RS, UNIT_STRIDE), start=1)
}

# --- Chimera, Tables IV and V -------------------------------------------------------------------------------------

CHIMERA_CONV_CHAINS: dict[str, ConvChain] = {c.name: c for c in (
    ConvChain("C1", 64, 112, 112, 192, 128, 2, 1, 3, 1),
    ConvChain("C2", 32, 147, 147, 64, 80, 2, 1, 3, 1),
    ConvChain("C3", 64, 56, 56, 128, 64, 1, 1, 3, 1),
    ConvChain("C4", 128, 28, 28, 256, 128, 1, 1, 3, 1),
    ConvChain("C5", 16, 227, 227, 64, 16, 4, 1, 3, 1),
    ConvChain("C6", 64, 56, 56, 64, 64, 1, 1, 1, 3),
    ConvChain("C7", 64, 56, 56, 64, 64, 1, 1, 1, 1),
    ConvChain("C8", 256, 56, 56, 256, 64, 1, 1, 1, 1),
)}
CHIMERA_CONVS: dict[str, ConvShape] = {
    s.name: s for c in CHIMERA_CONV_CHAINS.values() for s in (c.conv1, c.conv2)
}

CHIMERA_GEMM_CHAINS: dict[str, GemmChain] = {g.name: g for g in (
    GemmChain("G1", 8, 512, 64, 64, 512),
    GemmChain("G2", 12, 512, 64, 64, 512),
    GemmChain("G3", 16, 512, 64, 64, 512),
    GemmChain("G4", 12, 256, 64, 64, 256),
    GemmChain("G5", 16, 256, 64, 64, 256),
    GemmChain("G6", 16, 256, 80, 80, 256),
    GemmChain("G7", 12, 208, 64, 64, 208),
    GemmChain("G8", 16, 208, 64, 64, 208),
    GemmChain("G9", 16, 208, 80, 80, 208),
    GemmChain("G10", 1, 512, 64, 64, 256),
    GemmChain("G11", 1, 768, 64, 64, 384),
    GemmChain("G12", 1, 1024, 64, 64, 512),
)}
CHIMERA_MATMULS: dict[str, MatMulShape] = {
    s.name: s for g in CHIMERA_GEMM_CHAINS.values() for s in (g.gemm1, g.gemm2)
}

# --- OptiFX, Tables 3 and 4 ---------------------------------------------------------------------------------------


def _ofx(name: str, pattern: str, hw: int, ops: Sequence[tuple], intensity: tuple[float, float]) -> OptiFXSubgraph:
    """`ops` as the paper's (C, K, R, stride[, groups[, pad]]); groups 1 and padding R // 2 unless given."""
    convs, h = [], hw
    for i, (c, k, r, st, *rest) in enumerate(ops, start=1):
        groups = rest[0] if rest else 1
        pad = rest[1] if len(rest) > 1 else r // 2
        conv = ConvShape(f"{name}.conv{i}", c, h, h, k, r, st, pad, groups)
        convs.append(conv)
        if pattern == "SISO" or (pattern == "SIMO" and i == 1):
            h = conv.out_hw[0]
    return OptiFXSubgraph(name, pattern, tuple(convs), intensity)


OPTIFX_SUBGRAPHS: dict[str, OptiFXSubgraph] = {g.name: g for g in (
    _ofx("G1", "SISO", 73, [(64, 80, 1, 1), (80, 192, 3, 1, 1, 0)], (157.09, 249.72)),  # Inception-v3 stem
    _ofx("G2", "SISO", 56, [(64, 64, 3, 1), (64, 64, 1, 1)], (118.34, 145.53)),  # "ResNet"
    _ofx("G3", "SISO", 32, [(60, 48, 1, 1), (48, 12, 3, 1)], (22.93, 50.70)),  # DenseNet-BC
    _ofx("G4", "SISO", 56, [(144, 144, 3, 2, 144), (144, 32, 1, 1)], (3.27, 4.82)),  # MobileNetV2, depthwise
    _ofx("G5", "SIMO", 55, [(128, 16, 1, 1), (16, 64, 3, 1), (16, 64, 1, 1)], (21.34, 23.89)),  # SqueezeNet fire
    _ofx("G6", "MISO", 56, [(128, 128, 1, 1), (128, 128, 1, 1)], (31.73, 42.67)),  # NasNet, two 1x1 -> Add
    _ofx("G7", "SIMO", 56, [(16, 16, 3, 2), (16, 32, 1, 1), (16, 32, 3, 1)], (14.99, 27.26)),  # UNet
)}
OPTIFX_CONVS: dict[str, ConvShape] = {c.name: c for g in OPTIFX_SUBGRAPHS.values() for c in g.convs}

# --- Heron --------------------------------------------------------------------------------------------------------

HERON_C2D_LADDER: dict[str, ConvShape] = {s.name: s for s in (
    ConvShape("L1", 64, 56, 56, 64, 3, 1, 1, batch=16),
    ConvShape("L2", 64, 56, 56, 64, 1, 1, 0, batch=16),
    ConvShape("L3", 128, 28, 28, 128, 3, 1, 1, batch=16),
    ConvShape("L4", 128, 28, 28, 256, 1, 2, 0, batch=16),
    ConvShape("L5", 256, 14, 14, 256, 3, 1, 1, batch=16),
    ConvShape("L6", 256, 14, 14, 512, 1, 2, 0, batch=16),
)}
# Table 9 as (B, H, W, CI, CO, R, S, pad, stride).
HERON_TABLE9_CONVS: dict[str, ConvShape] = {
    name: ConvShape(name, ci, h, w, co, r, st, pad, batch=b) for name, (b, h, w, ci, co, r, _s, pad, st) in (
        ("C1", (1, 56, 56, 64, 64, 1, 1, 0, 1)),
        ("C2", (8, 28, 28, 512, 128, 1, 1, 1, 1)),
        ("C3", (16, 14, 14, 1024, 512, 1, 1, 0, 2)),
        ("C4", (32, 7, 7, 512, 512, 3, 3, 0, 1)),
        ("C5", (32, 14, 14, 256, 256, 3, 3, 1, 1)),
    )
}

CONV_TABLES: dict[str, dict[str, ConvShape]] = {
    "unit": UNIT_CONVS, "chimera": CHIMERA_CONVS, "optifx": OPTIFX_CONVS, "heron_ladder": HERON_C2D_LADDER,
    "heron_table9": HERON_TABLE9_CONVS,
}
ALL_CONVS: dict[str, ConvShape] = {f"{t}/{n}": s for t, table in CONV_TABLES.items() for n, s in table.items()}
ALL_MATMULS: dict[str, MatMulShape] = {f"chimera/{n}": s for n, s in CHIMERA_MATMULS.items()}

# --- builders -----------------------------------------------------------------------------------------------------

EPILOGUES = ("relu", "hardswish", "silu", "gelu", "clip6", "leakyrelu", "residual", "se")


def _epilogue_names(epilogue: str | Sequence[str] | None) -> list[str]:
    names = [] if epilogue is None else [epilogue] if isinstance(epilogue, str) else list(epilogue)
    for e in names:
        if e not in EPILOGUES:
            raise UsageError(f"unknown epilogue {e!r}; use one of {', '.join(EPILOGUES)}")
    return names


def _apply_epilogue(g: GraphBuilder, x: str, names: Sequence[str], out_dims: list, channel_axis: int) -> str:
    """`out_dims`: the output's dims (a symbolic batch allowed); `channel_axis`: the axis "se" scales along."""
    for i, e in enumerate(names):
        scope = f"/epilogue.{i}"
        if e == "relu":
            x = g.node("Relu", [x], scope)
        elif e == "hardswish":
            x = g.hardswish(x, scope)
        elif e == "silu":
            x = g.silu(x, scope)
        elif e == "gelu":
            x = g.gelu(x, scope)
        elif e == "clip6":
            x = g.clip(x, 0.0, 6.0, scope)
        elif e == "leakyrelu":
            x = g.node("LeakyRelu", [x], scope, alpha=0.01)
        elif e == "residual":
            r = g.input(f"residual{i or ''}", FLOAT, out_dims)
            x = g.node("Relu", [g.node("Add", [x, r], scope)], scope)
        else:  # "se": a per-channel gate, [N, C, 1, 1] for convs, [b, 1, n] for matmuls
            dims = [d if a in (0, channel_axis) else 1 for a, d in enumerate(out_dims)]
            x = g.node("Mul", [x, g.input(f"scale{i or ''}", FLOAT, dims)], scope)
    return x


def _batch(batch: int | None, default: int) -> int:
    batch = default if batch is None else batch
    if not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    return batch


def _check_conv(shape: ConvShape) -> None:
    if not isinstance(shape, ConvShape):
        raise UsageError(f"expected a ConvShape, not {type(shape).__name__}; see models.conv_shapes.ALL_CONVS")
    if shape.c_in % shape.groups or shape.c_out % shape.groups:
        raise UsageError(f"{shape.name}: channels {shape.c_in} -> {shape.c_out} are not divisible by "
                         f"groups={shape.groups}")
    if min(shape.out_hw) < 1:
        raise UsageError(f"{shape.name}: the output would be empty ({shape.out_hw})")


def _conv(g: GraphBuilder, x: str, s: ConvShape, scope: str, param: str, bias: bool) -> str:
    fan_in = (s.c_in // s.groups) * s.kernel * s.kernel
    inputs = [x, g.weight(f"{param}.weight", g.normal(s.weight_shape(), 1.0 / np.sqrt(fan_in)))]
    if bias:
        inputs.append(g.weight(f"{param}.bias", g.normal((s.c_out,), 0.05)))
    return g.node("Conv", inputs, scope, dilations=[1, 1], group=s.groups, kernel_shape=[s.kernel, s.kernel],
                  pads=[s.pad] * 4, strides=[s.stride, s.stride])


def _finish(g: GraphBuilder, graph_name: str, meta: dict) -> onnx.ModelProto:
    return g.model(graph_name, {"model": "conv_shapes", **meta})


def conv_model(shape: ConvShape, batch: int | None = None, bias: bool = True,
               epilogue: str | Sequence[str] | None = None, seed: int = 0, opset: int = 17,
               dynamic: bool = False) -> onnx.ModelProto:
    """One Conv of `shape`: input `input` [batch, C, H, W] -> `output` [batch, K, OH, OW], then `epilogue`.

    `batch` defaults to the shape's own (1 except Heron's). "residual" adds a graph input `residual` of the
    output's shape (then Relu), "se" multiplies by a graph input `scale` [batch, K, 1, 1]. `dynamic=True`
    makes the batch dimension symbolic ("batch").
    """
    _check_conv(shape)
    batch = _batch(batch, shape.batch)
    names = _epilogue_names(epilogue)
    g = GraphBuilder(opset, seed)
    b_dim = "batch" if dynamic else batch
    x = g.input("input", FLOAT, [b_dim, *shape.input_shape()[1:]])
    out_dims = [b_dim, *shape.output_shape()[1:]]
    h = _conv(g, x, shape, "/conv", "conv", bias)
    h = _apply_epilogue(g, h, names, out_dims, 1)
    g.output(h, "output", FLOAT, out_dims)
    return _finish(g, f"conv_{shape.name}", {"shape": shape.name, "epilogue": "+".join(names), "batch": batch})


def matmul_model(shape: MatMulShape, batch: int | None = None, bias: bool = False,
                 epilogue: str | Sequence[str] | None = None, seed: int = 0, opset: int = 17,
                 dynamic: bool = False) -> onnx.ModelProto:
    """One MatMul of graph inputs `A` [batch, m, k] x `B` [batch, k, n] -> `output` [batch, m, n], then `epilogue`.

    The operands stay 3-D even at batch 1. `bias=True` adds an initializer bias [n] (MatMul + Add, as
    `nn.Linear` exports); "se" multiplies by a graph input `scale` [batch, 1, n].
    """
    if not isinstance(shape, MatMulShape):
        raise UsageError(f"expected a MatMulShape, not {type(shape).__name__}; see models.conv_shapes.ALL_MATMULS")
    batch = _batch(batch, shape.batch)
    names = _epilogue_names(epilogue)
    g = GraphBuilder(opset, seed)
    b_dim = "batch" if dynamic else batch
    a = g.input("A", FLOAT, [b_dim, shape.m, shape.k])
    b = g.input("B", FLOAT, [b_dim, shape.k, shape.n])
    out_dims = [b_dim, shape.m, shape.n]
    h = g.node("MatMul", [a, b], "/matmul")
    if bias:
        h = g.node("Add", [h, g.weight("matmul.bias", g.normal((shape.n,), 0.05))], "/matmul")
    h = _apply_epilogue(g, h, names, out_dims, 2)
    g.output(h, "output", FLOAT, out_dims)
    return _finish(g, f"matmul_{shape.name}", {"shape": shape.name, "epilogue": "+".join(names), "batch": batch})


def conv_chain_model(chain: ConvChain, batch: int | None = None, relu: bool = True, bias: bool = True,
                     epilogue: str | Sequence[str] | None = None, seed: int = 0, opset: int = 17,
                     dynamic: bool = False) -> onnx.ModelProto:
    """Chimera's conv chain: `input` -> Conv1 -> Relu (unless `relu=False`) -> Conv2 [-> epilogue] -> `output`."""
    if not isinstance(chain, ConvChain):
        raise UsageError(f"expected a ConvChain, not {type(chain).__name__}; see CHIMERA_CONV_CHAINS")
    c1, c2 = chain.conv1, chain.conv2
    _check_conv(c1)
    _check_conv(c2)
    batch = _batch(batch, chain.batch)
    names = _epilogue_names(epilogue)
    g = GraphBuilder(opset, seed)
    b_dim = "batch" if dynamic else batch
    x = g.input("input", FLOAT, [b_dim, *c1.input_shape()[1:]])
    out_dims = [b_dim, *c2.output_shape()[1:]]
    h = _conv(g, x, c1, "/conv1", "conv1", bias)
    if relu:
        h = g.node("Relu", [h], "/relu")
    h = _conv(g, h, c2, "/conv2", "conv2", bias)
    h = _apply_epilogue(g, h, names, out_dims, 1)
    g.output(h, "output", FLOAT, out_dims)
    return _finish(g, f"conv_chain_{chain.name}", {"shape": chain.name, "relu": relu, "batch": batch})


def gemm_chain_model(chain: GemmChain, batch: int | None = None, middle: str | None = None, seed: int = 0,
                     opset: int = 17, dynamic: bool = False) -> onnx.ModelProto:
    """Chimera's GEMM chain on graph inputs `A` [b,M,K], `B` [b,K,L], `D` [b,L,N]:
    `output` [b,M,N] = (A @ B) [-> Relu | Softmax(axis=-1)] @ D; `middle` is None, "relu" or "softmax"."""
    if not isinstance(chain, GemmChain):
        raise UsageError(f"expected a GemmChain, not {type(chain).__name__}; see CHIMERA_GEMM_CHAINS")
    if middle not in (None, "relu", "softmax"):
        raise UsageError(f"middle must be None, 'relu' or 'softmax', not {middle!r}")
    batch = _batch(batch, chain.batch)
    g = GraphBuilder(opset, seed)
    b_dim = "batch" if dynamic else batch
    a = g.input("A", FLOAT, [b_dim, chain.m, chain.k])
    b = g.input("B", FLOAT, [b_dim, chain.k, chain.l])
    d = g.input("D", FLOAT, [b_dim, chain.l, chain.n])
    h = g.node("MatMul", [a, b], "/gemm1")
    if middle == "relu":
        h = g.node("Relu", [h], "/relu")
    elif middle == "softmax":
        h = g.node("Softmax", [h], "/softmax", axis=-1)
    h = g.node("MatMul", [h, d], "/gemm2")
    g.output(h, "output", FLOAT, [b_dim, chain.m, chain.n])
    return _finish(g, f"gemm_chain_{chain.name}", {"shape": chain.name, "middle": middle or "", "batch": batch})


def optifx_model(subgraph: OptiFXSubgraph | str, batch: int = 1, bias: bool = True, seed: int = 0, opset: int = 17,
                 dynamic: bool = False) -> onnx.ModelProto:
    """An OptiFX pattern with CBR epilogues (conv + bias + Relu):

    * SISO: `input` -> conv1 -> Relu -> conv2 -> Relu -> `output`;
    * SIMO: `input` -> conv1 -> Relu -> {conv2, conv3} -> Relu each -> Concat -> `output` (a fire module);
    * MISO: `input`, `input2` -> conv1, conv2 -> Add -> Relu -> `output`.
    """
    if isinstance(subgraph, str):
        if subgraph not in OPTIFX_SUBGRAPHS:
            raise UsageError(f"unknown OptiFX sub-graph {subgraph!r}; use one of {', '.join(OPTIFX_SUBGRAPHS)}")
        subgraph = OPTIFX_SUBGRAPHS[subgraph]
    batch = _batch(batch, 1)
    for c in subgraph.convs:
        _check_conv(c)
    g = GraphBuilder(opset, seed)
    b_dim = "batch" if dynamic else batch
    convs = subgraph.convs
    x = g.input("input", FLOAT, [b_dim, *convs[0].input_shape()[1:]])

    def cbr(h, i):
        return g.node("Relu", [_conv(g, h, convs[i], f"/conv{i + 1}", f"conv{i + 1}", bias)], f"/relu{i + 1}")

    if subgraph.pattern == "SISO":
        h = cbr(cbr(x, 0), 1)
        out = convs[1].output_shape()
    elif subgraph.pattern == "SIMO":
        h = cbr(x, 0)
        h = g.node("Concat", [cbr(h, 1), cbr(h, 2)], "", axis=1)
        out = [1, convs[1].c_out + convs[2].c_out, *convs[1].out_hw]
    else:
        x2 = g.input("input2", FLOAT, [b_dim, *convs[1].input_shape()[1:]])
        a = _conv(g, x, convs[0], "/conv1", "conv1", bias)
        b = _conv(g, x2, convs[1], "/conv2", "conv2", bias)
        h = g.node("Relu", [g.node("Add", [a, b], "")], "/relu")
        out = convs[0].output_shape()
    g.output(h, "output", FLOAT, [b_dim, *out[1:]])
    return _finish(g, f"optifx_{subgraph.name}", {"shape": subgraph.name, "pattern": subgraph.pattern,
                                                   "batch": batch})


__all__ = [
    "ALL_CONVS", "ALL_MATMULS", "CHIMERA_CONVS", "CHIMERA_CONV_CHAINS", "CHIMERA_GEMM_CHAINS", "CHIMERA_MATMULS",
    "CONV_TABLES", "EPILOGUES", "HERON_C2D_LADDER", "HERON_TABLE9_CONVS", "OPTIFX_CONVS", "OPTIFX_SUBGRAPHS",
    "UNIT_CONVS", "UNIT_OHW", "ConvChain", "ConvShape", "GemmChain", "MatMulShape", "OptiFXSubgraph",
    "conv_chain_model", "conv_model", "gemm_chain_model", "matmul_model", "optifx_model",
]
