"""The Python/C contract declared once (codegen/glue/contract.py): the generated structs compile and their layout
asserts hold, a Python layout that disagrees with the compiler's does not compile, initializers refuse missing and
unknown members, and the slot indices the lowerings use are what the C side sees."""

import shutil
import subprocess

import pytest
from llvmlite import ir

from onnxopt.codegen.glue import contract as c
from onnxopt.codegen.glue import kinds
from onnxopt.codegen.glue.contract import (CT_DESC, CT_TILE, GLUE, POOL_ARGS, Alias, ArgBlock, Contract,
                                           ContractError, Field, Limit, Struct, cstr)

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror"]


def _compile(tmp_path, source: str, cc: str = "cc", run: bool = False) -> subprocess.CompletedProcess:
    src = tmp_path / "probe.c"
    src.write_text(source)
    out = tmp_path / ("probe" if run else "probe.o")
    r = subprocess.run([cc, *FLAGS, *([] if run else ["-c"]), str(src), "-o", str(out)], capture_output=True,
                       text=True)
    if r.returncode == 0 and run:
        return subprocess.run([str(out)], capture_output=True, text=True, check=True)
    return r


def _contracts():
    found = [kinds.kind_contract(k.folder) for k in kinds.glue_kinds()]
    return [GLUE] + [x for x in found if x is not None and x is not GLUE]


def test_every_kind_folder_with_a_contract_is_found():
    names = {x.name for x in _contracts()}
    assert {"onnxopt/kinds/qmatmul/desc.py", "onnxopt/kinds/qconv/desc.py"} <= names


@needs_cc
def test_generated_structs_compile_and_their_layout_asserts_hold(tmp_path):
    """Every contract's typedefs, enums and asserts, as the translation units hold them, before the kinds' headers."""
    r = _compile(tmp_path, kinds.headers_source())
    assert r.returncode == 0, r.stderr
    text = kinds.headers_source()
    for x in _contracts():
        assert x.c_text() in text
    assert text.count("_Static_assert(offsetof(") >= sum(len(s.offsets) for s in (CT_DESC, CT_TILE, POOL_ARGS))


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="needs the aarch64 cross compiler")
def test_layout_asserts_hold_on_aarch64(tmp_path):
    r = _compile(tmp_path, kinds.headers_source(), cc="aarch64-linux-gnu-gcc")
    assert r.returncode == 0, r.stderr


@needs_cc
def test_a_wrong_python_layout_fails_to_compile_with_the_asserts_message(tmp_path):
    # A struct written by hand in C, mirrored in Python with a member of the wrong type.
    hand = "#include <stddef.h>\n#include <stdint.h>\ntypedef struct { int64_t a; int64_t b; int c; } probe_t;\n"
    right = Struct("probe_t", [Field("a", "int64_t"), Field("b", "int64_t"), Field("c", "int")], emit=False)
    wrong = Struct("probe_t", [Field("a", "int64_t"), Field("b", "int"), Field("c", "int")], emit=False)
    assert _compile(tmp_path, hand + right.c_text()).returncode == 0
    r = _compile(tmp_path, hand + wrong.c_text())
    assert r.returncode != 0
    assert "probe_t.c is not at byte 12 as codegen/glue/contract.py lays it out" in r.stderr
    assert "sizeof(probe_t) is not the 16 bytes" in r.stderr
    # A generated struct whose Python offsets were tampered with.
    block = ArgBlock("probe_block", [Field("p", "const float *"), Field("n", "int64_t", 2)], prefix="PB_")
    block.offsets["n"] = 16
    r = _compile(tmp_path, "#include <stddef.h>\n#include <stdint.h>\n" + block.c_text())
    assert r.returncode != 0 and "probe_block.n is not at byte 16" in r.stderr


def test_layout_follows_the_lp64_rules():
    s = Struct("mixed", [Field("a", "char"), Field("b", "int64_t"), Field("c", "int"), Field("d", "float", 3),
                         Field("e", "const void *"), Field("f", "uint8_t")])
    assert s.offsets == {"a": 0, "b": 8, "c": 16, "d": 20, "e": 32, "f": 40}
    assert (s.size, s.align) == (48, 8)
    inner = Struct("inner", [Field("x", "int"), Field("y", "char")])
    outer = Struct("outer", [Field("c", "char"), Field("i", inner, 2), Field("z", "short")])
    assert (inner.size, inner.align) == (8, 4)
    assert outer.offsets == {"c": 0, "i": 4, "z": 20} and outer.size == 24
    assert CT_DESC.offset("sig") == 0 and CT_DESC.offset("mi") == 40  # after glue.h's 40-byte onnxopt_sig
    with pytest.raises(ContractError, match="unknown C type"):
        Struct("bad", [Field("x", "my_type")])
    with pytest.raises(ContractError, match="twice"):
        Struct("bad", [Field("x", "int"), Field("x", "int")])
    with pytest.raises(ContractError, match="8 bytes"):
        ArgBlock("bad", [Field("x", "int")], prefix="B_")
    with pytest.raises(ContractError, match="no slot"):
        ArgBlock("bad", [Field("x", "int64_t", 2)], prefix="B_", aliases=[Alias("y", "x", 2)])


def _ct_values(**over):
    sig = {"name": cstr("Conv_1"), "kind": "KIND_CONV", "n_in": 2, "n_out": 1, "in_types": "ins", "out_types": "outs"}
    values = {f.name: 0 for f in CT_DESC.fields}
    values.update(sig=sig, tiles="tiles", extra_kind=None, extra_nstride=None, pads=[1, 2, 3, 4], out_pad=[0, 1],
                  wino_in=None, wino_out=None, amx_tiles=None, amx_round=None, sched=[0, 0, 0, 0])
    values.update(over)
    return values


def test_an_initializer_names_every_member_and_refuses_missing_or_unknown_ones():
    text = CT_DESC.initializer(_ct_values(mi=4, groups=2))
    assert text.startswith('{.sig = {.name = "Conv_1", .kind = KIND_CONV, .n_in = 2, .n_out = 1, .in_types = ins, '
                           '.out_types = outs}, .mi = 4, ')
    assert ".pads = {1, 2, 3, 4}" in text and ".groups = 2" in text
    assert text.endswith(".wino_out = NULL, .amx_groups = 0, .amx_tiles = NULL, .amx_round = NULL, "
                         ".amx_tiles16 = NULL, .sched = {0, 0, 0, 0}}")
    missing = _ct_values()
    del missing["ic_g"]
    with pytest.raises(ContractError, match="misses ic_g"):
        CT_DESC.initializer(missing)
    with pytest.raises(ContractError, match="no member padz"):
        CT_DESC.initializer(_ct_values(padz=[0, 0, 0, 0]))
    with pytest.raises(ContractError, match="misses out_types"):
        CT_DESC.initializer(_ct_values(sig={"name": cstr("x"), "kind": 0, "n_in": 0, "n_out": 0, "in_types": None}))
    with pytest.raises(ContractError, match="takes 4 values, not 3"):
        CT_DESC.initializer(_ct_values(pads=[0, 0, 0]))
    with pytest.raises(ContractError, match="not a pointer"):
        CT_DESC.initializer(_ct_values(mi=None))
    with pytest.raises(ContractError, match="is an integer"):
        CT_DESC.initializer(_ct_values(oc=1.5))
    s = Struct("p", [Field("n", "int"), Field("v", "int", Limit("P_MAX", 4), partial=True), Field("d", "int", default=7)])
    assert s.initializer({"n": True, "v": []}) == "{.n = 1, .v = {0}, .d = 7}"
    assert cstr('a"b\\c\n') == '"a\\"b\\\\c\\012"'


@needs_cc
def test_an_initializer_sets_the_members_it_names(tmp_path):
    """The generated descriptor, compiled and read back member by member."""
    init = CT_DESC.initializer(_ct_values(mi=6, ni=2, lanes=16, oc=64, kh=3, kw=5, sh=2, dw=3, pads=[1, 2, 3, 4],
                                          auto_pad=1, ic_g=32, packed_b=48, transposed=1, out_pad=[5, 6], wino_m=4))
    src = kinds.headers_source() + (
        "#include <stdio.h>\nstatic const int ins[] = {1, 1}, outs[] = {1};\nstatic const tile_fn tiles[] = {NULL};\n"
        f"static const onnxopt_ct_desc d = {init};\n"
        'int main(void) {\n  printf("%s %d %d %d %d %d %ld %ld %ld %ld %ld %ld %ld %ld %ld %d %ld %d %d %ld %ld %d\\n", '
        "d.sig.name, d.sig.kind, d.sig.n_in, d.mi, d.ni, d.lanes, (long)d.oc, (long)d.kh, (long)d.kw, (long)d.sh, "
        "(long)d.dw, (long)d.pads[0], (long)d.pads[1], (long)d.pads[2], (long)d.pads[3], d.auto_pad, (long)d.ic_g, "
        "d.packed_b, d.transposed, (long)d.out_pad[0], (long)d.out_pad[1], d.wino_m);\n  return 0;\n}\n")
    out = _compile(tmp_path, src, run=True)
    assert out.stdout.split() == ["Conv_1", str(kinds.kind_ids()["KIND_CONV"]), "2", "6", "2", "16", "64", "3", "5",
                                  "2", "3", "1", "2", "3", "4", "1", "32", "48", "1", "5", "6", "4"]


def _slot_blocks():
    """Each record, with the Python constants its lowering reads it by (module, its names -> the slot names)."""
    from onnxopt.codegen.compute import amx_tile, blocked_tile, tile
    from onnxopt.codegen.pool import kernels
    from onnxopt.kinds.qconv import desc as qc_desc
    from onnxopt.kinds.qconv import lower as qc_lower
    from onnxopt.kinds.qmatmul import desc as qm_desc
    from onnxopt.kinds.qmatmul import lower as qm_lower

    return [(CT_TILE, [tile, blocked_tile, amx_tile]), (POOL_ARGS, [kernels]), (qm_desc.QM_TILE, [qm_lower]),
            (qc_desc.QC_TILE, [qc_lower])]


def test_the_lowerings_read_the_generated_slots():
    for block, modules in _slot_blocks():
        consts = block.python_constants()
        for m in modules:
            used = {n: getattr(m, n) for n in dir(m) if n.startswith("SLOT_") and n in consts}
            assert used and all(consts[n] == v for n, v in used.items()), (block.name, m.__name__)
    from onnxopt.codegen.compute import tile

    assert tile.SLOTS == CT_TILE.n_slots == 37 and tile.SLOT_PHASE == 33
    assert (tile.NV_MAX, tile.MAX_OUTPUTS, tile.MAX_EXTRAS) == (c.CT_NV_MAX.value, c.CT_MAX_OUT.value,
                                                               c.CT_MAX_EXTRA.value)
    from onnxopt.fusion import compute as rule

    assert (rule.MAX_OUTPUTS, rule.MAX_EXTRAS) == (tile.MAX_OUTPUTS, tile.MAX_EXTRAS)  # fusion/compute.py's own
    from onnxopt.kinds.qmatmul import desc as qm_desc
    from onnxopt.kinds.qmatmul import find as qm_find

    assert (qm_find.MAX_OUTPUTS, qm_find.MAX_EXTRAS) == (qm_desc.QM_MAX_OUT.value, qm_desc.QM_MAX_EXTRA.value)


@needs_cc
def test_the_slot_constants_are_what_the_c_side_sees(tmp_path):
    """A program that prints, per record, each slot's enum value and offsetof / 8 of its member."""
    blocks = [b for b, _ in _slot_blocks()]
    lines = []
    for b in blocks:
        for name in b.indices:
            lines.append(f'  printf("%s %s %ld %ld\\n", "{b.name}", "{name}", (long){b.enum_name(name)}, '
                         f"(long)(offsetof({b.name}, {name}) / 8));")
        lines.append(f'  printf("%s * %ld %ld\\n", "{b.name}", (long){b.total_name}, (long)(sizeof({b.name}) / 8));')
    src = kinds.headers_source() + "#include <stdio.h>\nint main(void) {\n" + "\n".join(lines) + "\n  return 0;\n}\n"
    out = _compile(tmp_path, src, run=True).stdout.split("\n")
    seen = {}
    for line in filter(None, out):
        block, name, enum, offset = line.split()
        assert enum == offset, line
        seen[(block, name)] = int(enum)
    for b in blocks:
        assert seen[(b.name, "*")] == b.n_slots
        for name in b.indices:
            assert seen[(b.name, name)] == b.index(name)


def test_gep_index_is_the_slot_as_an_i64_constant():
    i64 = ir.IntType(64)
    assert CT_TILE.gep_index("voff", 2) == ir.Constant(i64, CT_TILE.index("voff") + 2)
    assert CT_TILE.index("dw_rows") == CT_TILE.index("voff", 1)
    with pytest.raises(ContractError):
        CT_TILE.index("voff", c.CT_NV_MAX.value)
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(i64, [ir.PointerType()]), name="f")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(CT_TILE.load(b, fn.args[0], "phase"))
    assert f"i64 {CT_TILE.index('phase')}" in str(module)


def test_limits_come_from_the_contracts_and_c_define_still_reads_headers():
    assert kinds.c_define("compute.h", "CT_MAX_EXTRA") == c.CT_MAX_EXTRA.value
    assert kinds.c_define("pool.h", "POOL_MAX_OUT") == c.POOL_MAX_OUT.value
    from onnxopt.kinds.qconv import find as qc_find
    from onnxopt.kinds.qconv import desc as qc_desc

    assert (qc_find.MAX_EXTRAS, qc_find.MAX_OUTPUTS, qc_find.IMPLICIT_MAX_TAPS) == (
        qc_desc.QC_MAX_EXTRA.value, qc_desc.QC_MAX_OUT.value, qc_desc.QC_MAX_TAPS.value)
    assert kinds.c_define("siblings.h", "SB_MAX_PART") > 0  # still a #define in siblings.h
    with pytest.raises(KeyError):
        kinds.c_define("glue.h", "NO_SUCH_LIMIT")


def test_the_runtime_source_holds_the_generated_text(monkeypatch):
    """The runtime object's cache key hashes the unit's text, so a changed declaration rebuilds it."""
    from onnxopt.codegen.glue import library

    before = library.runtime_source()
    for x in _contracts():
        assert x.c_text() in before
    changed = Contract(GLUE.name, [Limit("CT_NV_MAX", 5) if i is c.CT_NV_MAX else i for i in GLUE.items])
    monkeypatch.setattr(kinds, "GLUE", changed)
    assert library.runtime_source() != before
