"""The glue's descriptions of the built-in kinds' op types (elementwise, compute, AFUSION, siblings, sequences): what
the builders return and library.py writes as C tables. The pool and copy kinds keep theirs in their own folders."""

from __future__ import annotations

from dataclasses import dataclass, field

from .kinds import c_define


@dataclass
class EwKernelDesc:
    """What the glue needs to know of one elementwise op type."""

    op_type: str
    in_types: list[int]
    out_types: list[int]
    in_sizes: list[int]
    out_sizes: list[int]
    out_rank: int
    out_deps: list[int]  # per output, a bitmask of the inputs it depends on
    parallel_min: int  # elements from which the work is split over onnxruntime's thread pool
    variants: list[tuple[int, str]]  # (mask, symbol)
    generic: str


@dataclass
class CtKernelDesc:
    """What the glue needs to know of one compute op type (a convolution or a matmul with its epilogue)."""

    op_type: str
    kind: str  # "conv", "conv_transpose" or "matmul"
    in_types: list[int]
    out_types: list[int]
    mi: int
    ni: int
    lanes: int
    tiles: list[list[str]]  # [mi - 1][nv - 1] symbol names
    extra_kinds: list[int]
    extra_nstride: list[int]
    oc: int = 0
    groups: int = 1
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    auto_pad: int = 0  # 0 explicit, 1 SAME_UPPER, 2 SAME_LOWER
    ic_g: int = 0
    trans_a: int = 0
    packed_b: int = 0  # matmul: B constant, packed [ceil(N / packed_b)][K][packed_b] (N is `oc`)
    in_blocked: int = 0  # conv input in the blocked layout [N, C/L, H, W, L] (L = lanes)
    out_blocked: int = 0  # conv outputs (and per-pixel epilogue inputs) blocked; weights packed [C/(NI*L)][K][NI*L]
    channel_vectors: int = 0  # the blocked kernel writing NCHW outputs (through a blocked buffer); weights as above
    transposed: int = 0  # ConvTranspose, on the blocked kernel, by output phases (compute_exec.c)
    output_padding: tuple[int, int] = (0, 0)
    # Winograd F(m x m, 3 x 3) (winograd_exec.c): m, and the transforms' symbols; `tiles` are then the per-position
    # products' (empty epilogue), weights packed [C/(NI*L)][(m+2)^2][IC][NI*L]
    winograd: int = 0
    wino_in: str = ""
    wino_out: str = ""
    # A bfloat16 packed-B matmul on AMX tiles (codegen/compute/amx_tile.py): [groups - 1][nv - 1] symbols, run by
    # the glue where the CPU and the OS allow them (matrix_engine.c), else the register tiles
    amx_tiles: list[list[str]] = field(default_factory=list)
    amx_round: str = ""  # A's rows into the tiles' bfloat16 copy, once per row block and K block
    amx_tiles16: list[list[str]] = field(default_factory=list)  # as amx_tiles, writing bfloat16 (sequence_exec.c)
    matrix_instruction: str = ""  # what the AMX tiles run on ("" for none)
    amx_emulated: bool = False  # the tiles were built as plain code (tile_program.emulating: tests)
    # a packed-B matmul's searched schedule (onnxopt/tune/heron): K a block, panels an L2 group, panel tasks, row
    # tasks; 0 leaves one to the glue's formula (compute_exec.c)
    schedule: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def uses_amx(self) -> bool:
        return bool(self.amx_tiles)


@dataclass
class AfKernelDesc:
    """A convolution and the convolutions reading its output (one: SISO, more: SIMO), or two convolutions whose
    outputs meet in the second's epilogue (MISO), fused by bands of output rows (AFUSION, afusion_exec.c): each part
    is described as a compute op (only the fused op is registered), plus where each second's inputs start (MISO: its
    input x) and the band height."""

    op_type: str
    in_types: list[int]
    out_types: list[int]
    first: CtKernelDesc
    seconds: list[CtKernelDesc]
    second_inputs: list[int]  # op input index of each second convolution's packed weights
    band_rows: int  # output rows of the second convolutions per band
    miso_extra: int = -1  # MISO: the second's epilogue input that is the first's output (not an op input)
    chain: int = 0  # a chain of three (afusion_chain_exec.c): seconds[0] reads the first, seconds[1] reads it
    # conv -> pool (no seconds): {"op": "max"|"avg", "kernel", "strides", "dilations": [h, w], "pads": [t, l, b, r],
    # "ceil_mode", "count_include_pad"}
    pool: dict | None = None


@dataclass
class SbKernelDesc:
    """Sibling convolutions reading the same input, run as one kernel (horizontal fusion, siblings_exec.c): each
    sibling is described as a compute op (only the fused op is registered), plus where its inputs and outputs
    start among the op's."""

    op_type: str
    in_types: list[int]
    out_types: list[int]
    parts: list[CtKernelDesc]
    part_inputs: list[int]  # op input index of each sibling's packed weights (its epilogue inputs follow)
    part_outputs: list[int]  # op output index of each sibling's first output


SB_MAX_PART = c_define("siblings.h", "SB_MAX_PART")


@dataclass
class SeqKernelDesc:
    """A run of the library's ops executed in one parallel section (sequence_exec.c, onnxopt/emit/sequence.py).
    A step is (op type, input refs, output slots): a ref >= 0 is the sequence's input, -1 - s reads slot s. Every
    tensor a step writes is a slot; `slot_output` is the sequence output it is, or -1, and then it lives in buffer
    `slot_buffer[s]` of the sequence's own, unless `slot_view[s]` places it inside a Concat's output
    (emit/sequence.py, SlotView)."""

    op_type: str
    in_types: list[int]
    out_types: list[int]
    steps: list[tuple[str, list[int], list[int]]]
    slot_output: list[int]
    slot_buffer: list[int]
    slot_view: list = field(default_factory=list)  # per slot: a SlotView or None (none when empty)
    slot_bf16: list = field(default_factory=list)  # per slot: 1 where it may be kept in bfloat16 (none when empty)


AF_MAX_SECOND = c_define("afusion.h", "AF_MAX_SECOND")
