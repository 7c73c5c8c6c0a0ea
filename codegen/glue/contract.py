"""The contract between the Python code generators and the C glue, declared once, here, in Python.

Python writes C descriptors (library.py, the kinds' desc.py) and reads argument records by 8-byte slot (the tile
functions in LLVM IR); the C glue reads the descriptors and fills the records by member name. Both sides come from
one declaration of each struct:

- `Struct`: a C struct's members (C types, arrays, comments), from which come its `typedef struct { ... } name;`,
  `_Static_assert(offsetof(name, member) == N, ...)` lines with the offsets computed here by the LP64 rules of
  x86-64 and aarch64 (so the compiler checks that Python's layout and its own agree), and designated initializers
  from Python values (`initializer`), where a missing or unknown member is a Python error, not a silent misorder.
  With `emit=False` the struct is written by hand in a header (glue.h's `onnxopt_sig`) and only the asserts are
  generated: Python's mirror of it is checked.
- `ArgBlock`: a struct of 8-byte slots (pointers and int64) that a generated function reads as `const int64_t *`:
  the slot indices as Python constants (`index`, `gep_index` for `b.gep(record, [...])`) and as a C enum, and
  `Alias`es: other names for a slot (an anonymous union in C), where a kind of tile reads a slot its own way.
- `Limit`: a `#define NAME value` that both sides size arrays by.
- `FnType`: a function-pointer typedef that the structs use.

A `Contract` is an ordered list of these; its `c_text()` is what codegen/glue/kinds.py writes into the translation
units before the kinds' headers (the built-in kinds' `GLUE` below, then each kind folder's `CONTRACT` of its
desc.py before its glue.h). `python -m onnxopt.codegen.glue.contract` prints the built-in part.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

POINTER_BYTES = 8  # LP64: x86-64 and aarch64 Linux
_SCALARS = {"char": 1, "signed char": 1, "unsigned char": 1, "int8_t": 1, "uint8_t": 1, "short": 2, "int16_t": 2,
            "uint16_t": 2, "int": 4, "unsigned": 4, "unsigned int": 4, "int32_t": 4, "uint32_t": 4, "float": 4,
            "long": 8, "unsigned long": 8, "int64_t": 8, "uint64_t": 8, "size_t": 8, "ptrdiff_t": 8, "double": 8}
_FLOATS = {"float", "double"}
_MISSING = object()


class ContractError(ValueError):
    """A declaration that cannot be laid out, or an initializer that does not fit its struct."""


def cstr(text: str) -> str:
    """`text` as a C string literal (an initializer's plain str is a C expression: a symbol, an enum name)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode())
    return '"' + "".join(out) + '"'


@dataclass(frozen=True)
class Limit:
    """`#define NAME value`: a bound both sides size arrays by."""

    name: str
    value: int
    comment: str = ""

    def c_text(self) -> str:
        return f"#define {self.name} {int(self.value)}" + (f" /* {self.comment} */" if self.comment else "") + "\n"


@dataclass(frozen=True)
class FnType:
    """`typedef <returns> (*name)(<params>);`, a pointer (8 bytes) as a member."""

    name: str
    returns: str
    params: str
    comment: str = ""

    def c_text(self) -> str:
        note = f" /* {self.comment} */" if self.comment else ""
        return f"typedef {self.returns} (*{self.name})({self.params});{note}\n"


@dataclass(frozen=True)
class Field:
    """One member: `ctype` is a C type's text ("const float *", "int64_t") or a Struct or FnType declared here;
    `count` makes it an array (a number or a Limit, which C sees by name). `partial`: an array initializer may give
    fewer values than `count` (C zeros the rest); otherwise it gives exactly `count`. `default`: the value an
    initializer that omits the member gets (none: omitting it is an error)."""

    name: str
    ctype: object
    count: int | Limit | None = None
    comment: str = ""
    default: object = _MISSING
    partial: bool = False

    @property
    def length(self) -> int | None:
        return None if self.count is None else int(self.count.value if isinstance(self.count, Limit) else self.count)


def _base_type(ctype: str) -> str:
    return " ".join(w for w in ctype.replace("*", " * ").split() if w not in ("const", "volatile"))


def type_layout(ctype) -> tuple[int, int]:
    """(size, alignment) of a member's type under LP64."""
    if isinstance(ctype, Struct):
        return ctype.size, ctype.align
    if isinstance(ctype, FnType):
        return POINTER_BYTES, POINTER_BYTES
    if not isinstance(ctype, str):
        raise ContractError(f"a member's type is C text, a Struct or an FnType, not {ctype!r}")
    base = _base_type(ctype)
    if "*" in base:
        return POINTER_BYTES, POINTER_BYTES
    if base not in _SCALARS:
        raise ContractError(f"unknown C type {ctype!r}: declare it as a Struct or FnType, or use a pointer")
    return _SCALARS[base], _SCALARS[base]


def _is_pointer(ctype) -> bool:
    return isinstance(ctype, FnType) or (isinstance(ctype, str) and "*" in ctype)


def _declarator(ctype, name: str, count=None) -> str:
    if isinstance(ctype, (Struct, FnType)):
        text = f"{ctype.name} {name}"
    elif ctype.rstrip().endswith("*"):
        text = f"{ctype.rstrip()}{name}"
    else:
        text = f"{ctype} {name}"
    if count is not None:
        text += f"[{count.name if isinstance(count, Limit) else int(count)}]"
    return text


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _comment(text: str) -> str:
    return f" /* {text} */" if text else ""


class Struct:
    """A C struct (see the module's docstring)."""

    def __init__(self, name: str, fields: Sequence[Field], comment: str = "", emit: bool = True):
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise ContractError(f"{name!r} is not a C name")
        self.name, self.fields, self.comment, self.emit = name, tuple(fields), comment, emit
        self.offsets: dict[str, int] = {}
        at, align = 0, 1
        for f in self.fields:
            if f.name in self.offsets:
                raise ContractError(f"{name} declares {f.name} twice")
            if f.length is not None and f.length < 1:
                raise ContractError(f"{name}.{f.name}: an array of {f.length}")
            size, a = type_layout(f.ctype)
            at = _round_up(at, a)
            self.offsets[f.name] = at
            at += size * (f.length or 1)
            align = max(align, a)
        self.align = align
        self.size = _round_up(at, align)
        self._by_name = {f.name: f for f in self.fields}

    def offset(self, member: str) -> int:
        return self.offsets[member]

    # ---- C text ----

    def _member_lines(self) -> list[str]:
        return [f"  {_declarator(f.ctype, f.name, f.count)};{_comment(f.comment)}" for f in self.fields]

    def typedef(self) -> str:
        return f"typedef struct {{{_comment(self.comment)}\n" + "\n".join(self._member_lines()) + f"\n}} {self.name};\n"

    def _checked_members(self) -> dict[str, int]:
        return dict(self.offsets)

    def asserts(self) -> str:
        lines = [f'_Static_assert(sizeof({self.name}) == {self.size}, "sizeof({self.name}) is not the {self.size} '
                 f'bytes of codegen/glue/contract.py");']
        for member, off in self._checked_members().items():
            lines.append(f'_Static_assert(offsetof({self.name}, {member}) == {off}, "{self.name}.{member} is not at '
                         f'byte {off} as codegen/glue/contract.py lays it out");')
        return "\n".join(lines) + "\n"

    def c_text(self) -> str:
        return (self.typedef() if self.emit else "") + self.asserts()

    # ---- initializers ----

    def initializer(self, values: Mapping) -> str:
        """`{.member = value, ...}` in declaration order. Values: int, bool or float for numbers; a str is a C
        expression (a symbol, an enum name; `cstr` for a string literal); None is NULL (pointers only); a list or
        tuple for an array; a Mapping for a Struct member."""
        if not isinstance(values, Mapping):
            raise ContractError(f"{self.name}'s initializer is a mapping of its members, not {type(values).__name__}")
        unknown = [k for k in values if k not in self._by_name]
        if unknown:
            raise ContractError(f"{self.name} has no member {', '.join(map(str, unknown))}")
        parts = []
        for f in self.fields:
            if f.name in values:
                v = values[f.name]
            elif f.default is not _MISSING:
                v = f.default
            else:
                raise ContractError(f"{self.name}'s initializer misses {f.name}")
            parts.append(f".{f.name} = {self._value(f, v, f'{self.name}.{f.name}')}")
        return "{" + ", ".join(parts) + "}"

    def _value(self, f: Field, v, where: str) -> str:
        if f.length is None:
            return _scalar(f.ctype, v, where)
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
            raise ContractError(f"{where} is an array of {f.length}: give a list, not {v!r}")
        if len(v) > f.length or (not f.partial and len(v) != f.length):
            raise ContractError(f"{where} takes {'at most ' if f.partial else ''}{f.length} values, not {len(v)}")
        return "{" + (", ".join(_scalar(f.ctype, x, f"{where}[{i}]") for i, x in enumerate(v)) or "0") + "}"


def _scalar(ctype, v, where: str) -> str:
    if isinstance(ctype, Struct):
        if isinstance(v, str):  # an initializer written elsewhere (a kind's c_signature)
            return v
        return ctype.initializer(v)
    if isinstance(v, str):
        if not v.strip():
            raise ContractError(f"{where}: an empty C expression")
        return v
    if v is None:
        if not _is_pointer(ctype):
            raise ContractError(f"{where} is not a pointer: None (NULL) does not fit it")
        return "NULL"
    if isinstance(v, bool):
        v = int(v)
    if _is_pointer(ctype):
        if v == 0:
            return "NULL"
        raise ContractError(f"{where} is a pointer: give a C expression or None, not {v!r}")
    is_float = _base_type(ctype) in _FLOATS
    if isinstance(v, float):
        if not is_float:
            raise ContractError(f"{where} is an integer, not {v!r}")
        return repr(v)
    if hasattr(v, "__index__"):
        return str(int(v))
    raise ContractError(f"{where}: {v!r} is not a C value")


@dataclass(frozen=True)
class Alias:
    """Another name for slot `index` of the array slot `of` (or for the scalar slot `of`): where a kind of tile
    reads the slot its own way. C sees it as a member of an anonymous union."""

    name: str
    of: str
    index: int = 0
    ctype: str = "int64_t"
    comment: str = ""


class ArgBlock(Struct):
    """A record of 8-byte slots that generated code reads as `const int64_t *` (see the module's docstring). Its C
    enum names slot `x` `<prefix>X` and the count `<prefix without its last _>S` (CT_SLOT_ -> CT_SLOTS)."""

    def __init__(self, name: str, slots: Sequence[Field], prefix: str, aliases: Sequence[Alias] = (),
                 comment: str = ""):
        super().__init__(name, slots, comment)
        for f in self.fields:
            if type_layout(f.ctype) != (8, 8):
                raise ContractError(f"{name}.{f.name}: a slot is 8 bytes (a pointer or int64_t), not {f.ctype!r}")
        self.prefix, self.aliases = prefix, tuple(aliases)
        self.indices = {f.name: self.offsets[f.name] // 8 for f in self.fields}
        self.lengths = {f.name: f.length or 1 for f in self.fields}
        for a in self.aliases:
            if a.name in self.indices:
                raise ContractError(f"{name}: {a.name} is declared twice")
            if a.of not in self._by_name or not 0 <= a.index < self.lengths[a.of]:
                raise ContractError(f"{name}: alias {a.name} of {a.of}[{a.index}], which is no slot")
            if type_layout(a.ctype) != (8, 8):
                raise ContractError(f"{name}.{a.name}: a slot is 8 bytes, not {a.ctype!r}")
            self.indices[a.name] = self.indices[a.of] + a.index
            self.lengths[a.name] = 1
        self.n_slots = self.size // 8
        self.total_name = prefix.rstrip("_") + "S"
        names = [self.enum_name(n) for n in self.indices] + [self.total_name]
        if len(set(names)) != len(names):
            raise ContractError(f"{name}: two slots share an enum name ({names})")

    def index(self, name: str, j: int = 0) -> int:
        """The slot of `name` (element j of an array slot): what the lowering passes to b.gep(record, [...])."""
        if name not in self.indices:
            raise ContractError(f"{self.name} has no slot {name}")
        if not 0 <= j < self.lengths[name]:
            raise ContractError(f"{self.name}.{name} has {self.lengths[name]} slots, not an element {j}")
        return self.indices[name] + j

    def gep_index(self, name: str, j: int = 0):
        """The LLVM index (an i64 constant) of slot `name`[j]: b.gep(record, [block.gep_index(...)],
        source_etype=I64)."""
        from llvmlite import ir

        return ir.Constant(ir.IntType(64), self.index(name, j))

    def load(self, b, record, name: str, ty=None, j: int = 0):
        """Load slot `name`[j] of `record` (an LLVM pointer) as `ty` (i64 by default) with the builder `b`."""
        from llvmlite import ir

        i64 = ir.IntType(64)
        return b.load(b.gep(record, [self.gep_index(name, j)], source_etype=i64), typ=ty or i64)

    def enum_name(self, name: str) -> str:
        return self.prefix + name.upper()

    def python_constants(self) -> dict[str, int]:
        """SLOT_<NAME> -> index, for every slot and alias."""
        return {f"SLOT_{n.upper()}": i for n, i in self.indices.items()}

    def _member_lines(self) -> list[str]:
        lines = []
        for f in self.fields:
            own = [a for a in self.aliases if a.of == f.name]
            decl = f"{_declarator(f.ctype, f.name, f.count)};{_comment(f.comment)}"
            if not own:
                lines.append("  " + decl)
                continue
            lines += ["  union {", "    " + decl]
            lines += [f"    {_declarator(a.ctype, a.name)};{_comment(a.comment)}" for a in own if a.index == 0]
            # The others in runs of rising index, one anonymous struct each, padded up to their slot.
            run, runs = [], []
            for a in sorted((a for a in own if a.index > 0), key=lambda a: a.index):
                if run and a.index == run[-1].index:
                    runs.append(run)
                    run = []
                run.append(a)
            if run:
                runs.append(run)
            for r, run in enumerate(runs):
                lines.append("    struct {")
                at = 0
                for a in run:
                    if a.index > at:
                        lines.append(f"      int64_t {f.name}_pad{r}_{at}_[{a.index - at}];")
                    lines.append(f"      {_declarator(a.ctype, a.name)};{_comment(a.comment)}")
                    at = a.index + 1
                lines.append("    };")
            lines.append("  };")
        return lines

    def _checked_members(self) -> dict[str, int]:
        return {**self.offsets, **{a.name: 8 * self.indices[a.name] for a in self.aliases}}

    def c_enum(self) -> str:
        items = [f"{self.enum_name(n)} = {i}" for n, i in self.indices.items()] + [f"{self.total_name} = "
                                                                                  f"{self.n_slots}"]
        return f"enum {{ /* {self.name}'s slots */\n  " + ",\n  ".join(items) + "\n};\n"

    def c_text(self) -> str:
        return self.typedef() + self.c_enum() + self.asserts()


class Contract:
    """An ordered list of Limits, FnTypes and Structs: what one part of the glue declares."""

    def __init__(self, name: str, items: Sequence, comment: str = ""):
        self.name, self.items, self.comment = name, tuple(items), comment
        names = [i.name for i in self.items]
        if len(set(names)) != len(names):
            raise ContractError(f"contract {name} declares a name twice: {names}")

    def limits(self) -> dict[str, int]:
        return {i.name: int(i.value) for i in self.items if isinstance(i, Limit)}

    def c_text(self) -> str:
        head = f"/* ---- generated from {self.name} (codegen/glue/contract.py): do not edit ---- */\n"
        return head + "".join(i.c_text() for i in self.items) + f"/* ---- end of {self.name} ---- */\n"


# ---- the built-in kinds' contract ------------------------------------------------------------------------------

# glue.h's signature, the first member of every descriptor: written there by hand, checked here.
ONNXOPT_SIG = Struct("onnxopt_sig", [
    Field("name", "const char *"),
    Field("kind", "int"),
    Field("n_in", "int"),
    Field("n_out", "int"),
    Field("in_types", "const int *"),
    Field("out_types", "const int *"),
], emit=False)

CT_NV_MAX = Limit("CT_NV_MAX", 4, "vectors of a compute tile (its register tile's ni)")
CT_MAX_OUT = Limit("CT_MAX_OUT", 4, "outputs of a compute op's epilogue")
CT_MAX_EXTRA = Limit("CT_MAX_EXTRA", 8, "epilogue inputs of a compute op besides the accumulator")

TILE_FN = FnType("tile_fn", "void", "const int64_t *tile", "a compute tile (codegen/compute/tile.py): a ct_tile")

# A convolution or matmul with its fused epilogue (compute_exec.c runs it; library.py _compute_source writes it).
CT_DESC = Struct("onnxopt_ct_desc", [
    Field("sig", ONNXOPT_SIG),
    Field("mi", "int", comment="the micro-kernel's register tile"),
    Field("ni", "int"),
    Field("lanes", "int"),
    Field("tiles", "const tile_fn *", comment="[mi - 1][nv - 1]"),
    Field("n_extra", "int", comment="epilogue inputs after the accumulator: op inputs 2.."),
    Field("extra_kind", "const int *", comment="POSITION, CHANNEL, COLUMN, SCALAR (tile.py)"),
    Field("extra_nstride", "const int64_t *", comment="elements between batch items, 0 when shared by the batch"),
    Field("oc", "int64_t", comment="Conv: weights packed [groups][ceil(oc_g / mi)][ic_g * kh * kw][mi] (op input 1)"),
    Field("groups", "int64_t"),
    Field("kh", "int64_t"),
    Field("kw", "int64_t"),
    Field("sh", "int64_t"),
    Field("sw", "int64_t"),
    Field("dh", "int64_t"),
    Field("dw", "int64_t"),
    Field("pads", "int64_t", 4, "top, left, bottom, right"),
    Field("auto_pad", "int", comment="0 explicit/VALID, 1 SAME_UPPER, 2 SAME_LOWER"),
    Field("ic_g", "int64_t"),
    Field("trans_a", "int", comment="MatMul/Gemm: A row-major, or transposed (Gemm transA)"),
    Field("packed_b", "int", comment="> 0: B is constant and packed in panels [ceil(N / packed_b)][K][packed_b], "
                                     "zero-padded, N in `oc` (op input 1 is the packed tensor)"),
    Field("in_blocked", "int", comment="Conv layouts: the input, and the outputs with their per-pixel epilogue "
                                       "inputs, in the blocked layout [N][C / lanes][H][W][lanes] (compute_exec.c, "
                                       "ct_conv_blocked)"),
    Field("out_blocked", "int", comment="a blocked output has weights packed [ceil(oc / (ni * lanes))]"
                                        "[ic_g * kh * kw][ni * lanes]"),
    Field("channel_vectors", "int", comment="the blocked kernel (vectors of output channels) even though the "
                                            "outputs are NCHW"),
    Field("transposed", "int", comment="ConvTranspose (always on the blocked kernel): op input 0 is [N, IC, H, W] "
                                       "(ic_g = IC), weights packed [ceil(oc / (ni * lanes))][sh][sw][ceil(kh / sh)]"
                                       "[ceil(kw / sw)][IC][ni * lanes], or with few output channels "
                                       "(channel_vectors 0) [sh][sw][ceil(oc / mi)][ceil(kh / sh)][ceil(kw / sw)]"
                                       "[IC][mi] (compute_exec.c)"),
    Field("out_pad", "int64_t", 2, "output_padding: rows, columns"),
    Field("wino_m", "int", comment="Winograd F(m x m, 3 x 3) (winograd_exec.c), m > 0: `tiles` are the "
                                   "per-position products (empty epilogue), weights packed [ceil(oc / (ni * lanes))]"
                                   "[(m + 2)^2][ic][ni * lanes]; the transforms (codegen/compute/winograd.py) run "
                                   "the epilogue"),
    Field("wino_in", TILE_FN),
    Field("wino_out", TILE_FN),
    Field("amx_groups", "int", comment="a bfloat16 packed-B matmul's AMX tiles (codegen/compute/amx_tile.py): the "
                                       "most groups of 16 rows a call takes (0: none)"),
    Field("amx_tiles", "const tile_fn *", comment="[groups - 1][nv - 1], run only where the CPU and the OS allow "
                                                  "them (matrix_engine.c)"),
    Field("amx_round", TILE_FN, comment="A's rows into the tiles' bfloat16 copy (ct_tile a16), once per row block "
                                        "and K block, not once per panel"),
    Field("amx_tiles16", "const tile_fn *", comment="as amx_tiles, writing the one output in bfloat16 (NULL: none), "
                                                    "for a sequence's bf16 tensor (sequence_exec.c)"),
    Field("sched", "int64_t", 4, "a packed-B matmul's schedule as the search chose it (onnxopt/tune/heron): K a "
                                 "block, panels an L2 group, panel tasks, row tasks; 0: the glue's own formula",
          default=[0, 0, 0, 0]),
], comment="a convolution or matmul with its fused epilogue (compute_exec.c)")

# The compute tile's record (codegen/compute/tile.py and blocked_tile.py read it; compute_exec.c and the other
# executors fill it).
CT_TILE = ArgBlock("ct_tile", [
    Field("a", "const float *"),
    Field("a_ms", "int64_t"),
    Field("a_ks", "int64_t"),
    Field("b", "const float *"),
    Field("koff", "const int64_t *"),
    Field("k", "int64_t"),
    Field("ldc", "int64_t"),
    Field("m0", "int64_t"),
    Field("voff", "int64_t", CT_NV_MAX),
    Field("coff", "int64_t", CT_NV_MAX),
    Field("lanes", "int64_t", CT_NV_MAX),
    Field("out", "float *", CT_MAX_OUT),
    Field("extra", "const float *", CT_MAX_EXTRA),
    Field("acc", "float *", comment="packed B: the tile's partial sums over the K blocks before this one, "
                                    "[mi][ni * lanes]"),
    Field("phase", "int64_t", comment="packed B: bit 1, continue the sums in acc, and bit 0, store them there "
                                      "(not the last block)"),
    Field("a16", "const uint16_t *", comment="a bfloat16 packed B on AMX tiles: A's rows in bfloat16, [rows][K "
                                             "rounded up to 32], zero-padded (codegen/compute/amx_tile.py)"),
    Field("a16_rows", "int64_t", comment="the rows amx_round writes there"),
    Field("a16_rs", "int64_t", comment="on AMX tiles: elements between A's bfloat16 rows (K rounded up to 32); the "
                                       "call's K (k) may be one block of it"),
], prefix="CT_SLOT_", aliases=[
    Alias("lo", "a_ks", comment="a depthwise border tile: the first input column that exists (blocked_tile.py)"),
    Alias("hi", "m0", comment="a depthwise border tile: one past the last"),
    Alias("count", "m0", comment="a blocked convolution tile: tiles of mi pixels side by side, one call (0: one)"),
    Alias("dw_rows", "voff", 1, comment="a depthwise tile (nv = 1): rows one call computes (0: one)"),
    Alias("dw_a_row", "voff", 2, comment="floats between those rows in the input"),
    Alias("dw_c_row", "voff", 3, comment="and in the outputs"),
    Alias("geometry", "koff", ctype="const int64_t *", comment="a bfloat16 convolution on AMX tiles: its geometry "
                                                              "table (codegen/compute/amx_conv_tile.py)"),
    Alias("pos", "acc", ctype="const int64_t *", comment="a bfloat16 convolution on AMX tiles: each pixel's output "
                                                         "offset"),
], comment="a compute tile's record (codegen/compute/tile.py, blocked_tile.py)")

POOL_MAX_OUT = Limit("POOL_MAX_OUT", 4, "outputs of a pool's epilogue")
POOL_MAX_EXTRA = Limit("POOL_MAX_EXTRA", 8, "epilogue inputs of a pool")

# A pool kernel's record (codegen/pool/kernels.py reads it, pool_exec.c fills it).
POOL_ARGS = ArgBlock("pool_args", [
    Field("src", "const void *", comment="windowed: the plane; global: the call's first channel (float32, or "
                                         "uint8 / int8 for a windowed MaxPool)"),
    Field("stride", "int64_t", comment="windowed: elements between input rows (W); global: H * W"),
    Field("ow", "int64_t", comment="windowed: output width"),
    Field("n", "int64_t", comment="windowed: output rows in the band; global: channels in the call"),
    Field("inv_h", "const float *"),
    Field("inv_w", "const float *"),
    Field("out", "void *", POOL_MAX_OUT),
    Field("extra", "const float *", POOL_MAX_EXTRA),
    Field("vw", "int64_t", comment="windowed: valid width"),
    Field("pl", "int64_t", comment="windowed: left pad"),
    Field("row0", "int64_t", comment="windowed: input row of the band's first row"),
    Field("vh", "int64_t", comment="windowed: valid height"),
    Field("padrow", "const void *", comment="windowed: vw elements of padding, read for rows outside [0, vh)"),
], prefix="POOL_SLOT_", comment="a pool kernel's record (codegen/pool/kernels.py)")

GLUE = Contract("the built-in kinds", [CT_NV_MAX, CT_MAX_OUT, CT_MAX_EXTRA, TILE_FN, ONNXOPT_SIG, CT_DESC, CT_TILE,
                                       POOL_MAX_OUT, POOL_MAX_EXTRA, POOL_ARGS])


if __name__ == "__main__":
    print(GLUE.c_text(), end="")
