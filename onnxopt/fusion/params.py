"""The typed parameters of each region kind: a region's kind is the type of its `Region.params`.

Every fusion rule gives its regions one of these. What differs between kinds is asked of the parameters (what goes
into the op type, the lanes of the blocked tensors the kernel reads, the function fallback's nodes, the passthrough
regions a kernel replaces), so the driver, the emitter and the layout pass need not test which kind a region is.
A kind folder of onnxopt/kinds/ subclasses `KindParams` in its params.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np
import onnx


class KindParams:
    """The base of every kind's parameters."""

    family: ClassVar[str] = ""  # "elementwise", "compute", "pool", "copy", "relayout", or a registered kind's name

    def key(self) -> list:
        """What of the parameters changes the kernel: part of the op type's hash."""
        return []

    def op_type_text(self, target_name: str) -> str:
        return "|params" + json.dumps(self.key())

    def tensor_lanes(self) -> int:
        """The lanes of the blocked tensors the kernel reads and writes; 0 when it works on plain ones."""
        return 0

    def blocked_io(self) -> tuple[bool, bool]:
        """A registered kind's: (whether it reads its first input, whether it writes its outputs) in the blocked
        layout of tensor_lanes() (fusion/layout.py)."""
        return False, False

    def fallback_body(self) -> list:
        """The nodes of the function fallback when they are not the region's own ([]: the region's nodes)."""
        return []

    def runs_as_onnxruntime(self) -> tuple:
        """The outputs of the nodes of quantized patterns that the kernel computes as onnxruntime's own ops do (the
        qconv kind's tables, made by running them): the driver lets it take them (driver/outputs.py)."""
        return ()

    def replaced(self) -> list:
        """The passthrough regions this kernel replaces: they come back into the plan if its kernel is rejected."""
        return []


@dataclass
class ElementwiseParams(KindParams):
    """An elementwise program (Region.program is all of it); on blocked tensors (fusion/blocked_elementwise.py)
    it has their lanes and the passthrough regions of its nodes."""

    family: ClassVar[str] = "elementwise"
    blocked_lanes: int = 0
    replaces: list = field(default_factory=list)
    # The schedule (kinds/builtin.py): lanes of the row loop's vectors, and the elements from which a call is split
    # over the pool; 0: the target's lanes, the kind's threshold.
    lanes: int = 0
    parallel_min: int = 0
    # A lone op between two of our kernels (fusion/elementwise.py sequence_bridges): kept so that its onnxruntime
    # node does not end a sequence, so judged in the whole model, not alone. Not part of the op type.
    bridge: bool = False

    def op_type_text(self, target_name: str) -> str:
        # the program's signature is the whole kernel, with its schedule where it is not the default
        return f"|schedule[{self.lanes},{self.parallel_min}]" if self.lanes or self.parallel_min else ""

    def tensor_lanes(self) -> int:
        return self.blocked_lanes

    def replaced(self) -> list:
        return self.replaces


class _Absent(int):
    """The default of a ComputeAttrs field whose readers assume a number when the op has not set it: it reads as
    that number, but the field stays absent (left out of `ComputeAttrs.items()`, so out of the op type) until a rule
    sets it, even to the same number. The dict these fields replaced had no key there, and a region whose rule sets
    in_blocked = 0 (ConvTranspose's, the layout pass's) has another op type than one that leaves it out."""

    __slots__ = ()


@dataclass(slots=True)
class ComputeAttrs:
    """The attributes of a compute region's op (ComputeParams.attrs): what its kernel, its function fallback and the
    passes after fusion read. Each rule sets those of its op; a field it leaves at its default is absent (None, or
    the number readers assume, see `_Absent`) and not part of the op type. An unknown name is a TypeError."""

    # A convolution's and a transposed convolution's (fusion/compute.py, fusion/conv_transpose.py)
    oc: int | None = None  # output channels
    groups: int | None = None
    ic_g: int | None = None  # input channels per group
    kernel: tuple[int, int] | None = None  # (kh, kw)
    strides: tuple[int, int] | None = None
    dilations: tuple[int, int] | None = None
    pads: tuple[int, int, int, int] | None = None  # (top, left, bottom, right); (0, 0, 0, 0) with a SAME auto_pad
    auto_pad: int | None = None  # 0: NOTSET or VALID, 1: SAME_UPPER, 2: SAME_LOWER
    output_padding: tuple[int, int] | None = None  # a transposed convolution's; readers take (0, 0) without one
    # the shape of the packed weights (the region's second input): repacked by the layout pass, the tile search and
    # Winograd
    packed_shape: tuple[int, ...] | None = None
    # A transposed convolution's weights are packed for the default tile: its MI (pixel vectors) or its NI (channel
    # vectors); readers take the tile's own without one
    packed_mi: int | None = None
    packed_ni: int | None = None
    # The blocked layout (fusion/layout.py; AFUSION and sibling regions: their parts'): 1 when the op reads its
    # input, writes its output, or computes on vectors of output channels in it; `block` its lanes
    in_blocked: int = _Absent(0)
    out_blocked: int = _Absent(0)
    channel_vectors: int = _Absent(0)
    block: int = _Absent(0)
    winograd: int = _Absent(0)  # m of the F(m, kernel) tiles the convolution runs as (fusion/winograd.py); 0: none
    # A matmul's (fusion/compute.py): A transposed (a Gemm's transA), and a constant B packed in panels of
    # `packed_b` columns, of which `n` are B's
    trans_a: int = _Absent(0)
    packed_b: int = _Absent(0)
    n: int | None = None
    # the element type the packed B is stored in when lower than the op's (onnxopt/driver/precision.py: "bfloat16",
    # "float16"); None: the op's own
    b_dtype: str | None = None
    # 1 when a convolution's float16 weights are stored in pairs of adjacent input channels, padded to 32, for
    # AMX-FP16 tiles (fusion/layout.py lower_blocked_conv); bfloat16 ones always are
    b_pairs: int = _Absent(0)
    # The type a float32 kernel's weights are stored in within the written file, when narrower ("float16": rounded
    # to float16 values and written once as float16 with a Cast outside the op, which onnxruntime folds back into
    # float32 at session load; fusion/compute.py store_weights_f16, emit/model.py)
    stored_dtype: str | None = None
    # An AFUSION region's (fusion/afusion/): output rows per band; 1 for a chain of three; the index among the
    # second's epilogue inputs of the first's output (MISO; -1: not MISO); the pool's parameters (conv -> pool,
    # conv_pool.pool_params)
    band_rows: int | None = None
    chain: int = _Absent(0)
    miso_extra: int = _Absent(-1)
    pool: dict | None = None
    siblings: int | None = None  # a sibling region's (fusion/siblings.py): how many convolutions
    # A packed-B matmul's schedule as the search chose it (onnxopt/tune/heron): K a block, panels an L2 group, panel
    # tasks, row tasks (0: the glue's formula for that one); None: the glue's formulas
    schedule: tuple[int, int, int, int] | None = None

    def items(self) -> list[tuple[str, object]]:
        """(name, value) of the fields that are set, in field order: the keys and values of the dict they replaced
        (ComputeParams.op_type_text hashes them)."""
        return [(f.name, v) for f in fields(self)
                if (v := getattr(self, f.name)) is not None and not isinstance(v, _Absent)]


@dataclass
class ComputeParams(KindParams):
    """The compute op of a region (fusion/compute.py) and what its kernel and function fallback need."""

    family: ClassVar[str] = "compute"
    op: str  # "conv", "conv_transpose", "matmul", "afusion" or "siblings"
    extra_kinds: list[int] = field(default_factory=list)
    extra_nstride: list[int] = field(default_factory=list)  # 1 when the input has the batch dim, 0 when shared
    attrs: ComputeAttrs = field(default_factory=ComputeAttrs)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    body: list[onnx.NodeProto] = field(default_factory=list)  # the function fallback
    # Constants the original nodes read that are not initializers (ConstantOfShape outputs, left unfolded because
    # they are big): the standalone check of the region needs them as initializers.
    orig_consts: list[onnx.TensorProto] = field(default_factory=list)
    tile: object = None  # a RegisterTile chosen by the tile search (fusion/compute.py retile); None: the default
    # Conv: the weights after BatchNorm folding, [oc, ic_g, kh, kw], for re-packing in another layout.
    weights: np.ndarray | None = None
    # op "afusion": the convolution regions fused into one kernel, producer first (onnxopt/fusion/afusion/siso.py);
    # op "siblings": the convolution regions reading one input (onnxopt/fusion/siblings.py)
    parts: list = field(default_factory=list)
    # The element type of the op's input and output, from the graph (onnxopt/dtypes.py names it)
    dtype: str = "float32"

    def op_type_text(self, target_name: str) -> str:
        text = "|" + json.dumps([self.op, self.extra_kinds, self.extra_nstride,
                                 {k: repr(v) for k, v in sorted(self.attrs.items())}], sort_keys=True)
        if self.dtype != "float32":  # float32's op types stay the ones they were before the field
            text += "|dtype" + self.dtype
        for part in self.parts:  # AFUSION: the fused convolutions' own kernels
            text += "|part" + part.compute_op_type(target_name)
        if self.tile is not None:  # a searched register tile: another kernel, another op type
            text += "|tile" + json.dumps([self.tile.mi, self.tile.ni, self.tile.mii, self.tile.lanes])
        return text

    def tensor_lanes(self) -> int:
        return self.attrs.block

    def fallback_body(self) -> list:
        return self.body


@dataclass
class PoolParams(KindParams):
    """The pool op of a region (fusion/pool.py) and its attributes (all in the op type's hash)."""

    family: ClassVar[str] = "pool"
    op: str  # "max", "avg", "gmax", "gavg"
    attrs: dict = field(default_factory=dict)
    extra_kinds: list[int] = field(default_factory=list)
    extra_nstride: list[int] = field(default_factory=list)
    # A pool on blocked tensors (attrs["blocked"] = lanes): its function fallback, the pool rewritten for the 5-D
    # form (fusion/blocked_passthrough.py), instead of the original node.
    body: list = field(default_factory=list)
    dtype: str = "float32"  # the element type of the pooled tensor, from the graph
    # The schedule (the pool kind's space, kinds/builtin.py): the most tasks a call is split into, and the taps
    # below which it runs on one thread; 0: the defaults (codegen/pool/desc.py)
    max_tasks: int = 0
    inline_work: float = 0.0

    def key(self) -> list:
        key = [self.op, self.extra_kinds, self.extra_nstride, {k: repr(v) for k, v in sorted(self.attrs.items())}]
        key = key if self.dtype == "float32" else key + [self.dtype]  # float32's op types as before the field
        return key + ([self.max_tasks, repr(self.inline_work)] if self.max_tasks or self.inline_work else [])

    def op_type_text(self, target_name: str) -> str:
        return "|pool" + json.dumps(self.key(), sort_keys=True)

    def tensor_lanes(self) -> int:
        return self.attrs.get("blocked", 0)

    def fallback_body(self) -> list:
        return self.body


@dataclass
class CopyParams(KindParams):
    """A Concat, nearest Resize, Slice or Split run as a copy kernel (fusion/blocked_copy.py)."""

    family: ClassVar[str] = "copy"
    lanes: int  # of the blocked tensors; 0: a plain Concat along `axis`; 1: a Resize of NCHW (4-D) tensors
    factors: list[tuple[int, int]]  # per op input: rows and columns each pixel is repeated
    body: list = field(default_factory=list)  # the function fallback: the passthrough forms, in graph order
    fallback: list = field(default_factory=list)  # the passthrough regions this kernel replaces
    axis: int = 1  # a plain Concat's (>= 0)
    # a Slice (plain_slices): the input's dims, and the box's start and end per axis
    slice: tuple[list[int], list[int], list[int]] | None = None
    # The schedule (the copy kind's space, kinds/builtin.py): the most tasks a call is split into, and the floats
    # written below which it runs on one thread; 0: the defaults (codegen/copy/desc.py)
    max_tasks: int = 0
    inline_floats: int = 0
    dtype: str = "float32"  # a plain Concat's element type: float32, or a quantized model's uint8 / int8
    # a Split (split_copies, plain_splits): each output's length along `axis` (blocks of `lanes` channels when
    # blocked), in output order
    split: list[int] | None = None

    def key(self) -> list:
        return [self.lanes, [list(f) for f in self.factors]] + ([] if self.lanes else [self.axis]) + \
            ([[list(v) for v in self.slice]] if self.slice else []) + \
            ([["split", *self.split]] if self.split else []) + \
            ([self.max_tasks, self.inline_floats] if self.max_tasks or self.inline_floats else []) + \
            ([self.dtype] if self.dtype != "float32" else [])  # float32's op types as before the field

    def op_type_text(self, target_name: str) -> str:
        return "|copy" + json.dumps(self.key())

    def tensor_lanes(self) -> int:
        return self.lanes if self.lanes > 1 else 0  # one lane: a Resize of plain NCHW tensors

    def fallback_body(self) -> list:
        return self.body

    def replaced(self) -> list:
        return self.fallback


@dataclass
class RelayoutParams(KindParams):
    """No kernel: the node rewritten as onnxruntime nodes that run on blocked tensors (fusion/blocked_passthrough.py).
    `exit`: the node leaves the blocked layout (its output is plain)."""

    family: ClassVar[str] = "relayout"
    nodes: list
    exit: bool = False

    def tensor_lanes(self) -> int:
        return 0
