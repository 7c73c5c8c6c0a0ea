"""The LSTM and GRU kernels in LLVM IR: two functions each, which exec.c runs.

proj(x, wp, bp, gx, rows, in_size, gx_stride, b0, b1): the input projection of every step at once, a GEMM of the
    T * B rows of X against one direction's packed W, with the bias slots: gx[row][block][slot][unit] for the blocks
    b0 .. b1 (a GRU's fourth slot is its Rbh, copied). A tile is `mr` rows x one block's gates; the blocks run
    outermost, so a block's weights (in_size x gates x 16 floats) stay in L2 while every row chunk reads them.
step(rp, gx, gx_stride, h_prev, h_next, c, rows, hp, hidden, b0, b1): one time step of one direction for the blocks
    b0 .. b1: the recurrent product of h_prev with the packed R on top of gx, then the gates in registers, h written
    to h_next. LSTM (gates i, o, f, c): c = f c + i g, h = o tanh(c), c updated in place. GRU (z, r, h, with
    linear_before_reset): n = tanh(gx_h + r (h_prev R_h + Rbh)), h = n + z (h_prev - n); c unused. h and c are
    `rows` rows of `hp` floats (the hidden units padded to whole blocks).

Every vector is one block of BLOCK float32 units, whatever the target: LLVM splits it into two AVX2 or four NEON
registers. The tiles' rows follow from the target's vector registers (AVX-512: 6 rows in the projection, 4 in a
step; AVX2 and NEON: 1), and a one-row step splits K over two accumulator sets where the registers allow it, so the
four gates' FMA chains do not wait on each other's latency.
"""

from __future__ import annotations

from llvmlite import ir
from onnx import TensorProto

from onnxopt.codegen.compile import compile_object, new_module
from onnxopt.codegen.target import Target
from onnxopt.codegen.vmath.irutil import broadcast, fma, for_range
from onnxopt.codegen.vmath.isa import set_features
from onnxopt.codegen.vmath.sigmoid import vsigmoid
from onnxopt.codegen.vmath.tanh import vtanh

from .desc import RecurrentKernelDesc
from .params import BLOCK, SLOTS

F32 = ir.FloatType()
I64 = ir.IntType(64)
PTR = ir.PointerType()
VEC = ir.VectorType(F32, BLOCK)


def tile_rows(target: Target, gates: int = 4) -> tuple[int, int, int]:
    """(rows of a projection tile, rows of a step tile, K's accumulator sets in a one-row step) for the target's
    vector registers."""
    lanes = target.float32_lanes
    regs = 32 if target.vector_bits >= 512 or target.arch == "aarch64" else 16
    per_row = gates * max(1, BLOCK // lanes)  # registers one row's gate vectors take
    rows = max(1, (regs - per_row - 2) // per_row)  # leaves the weights' vectors and a broadcast
    ksplit = 2 if 3 * per_row + 1 <= regs else 1
    return rows, min(rows, 4), ksplit


def _i(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _at(b, base, index):
    return b.gep(base, [index], source_etype=F32)


def _load(b, base, index):
    return b.load(_at(b, base, index), typ=VEC, align=4)


def _weight_loader(weights: str):
    """load(b, base, index): one block's vector of packed weights as float32, from float32 or from bfloat16 (its bits
    are a float32's upper half: zero-extended and shifted, exactly)."""
    if weights == "float32":
        return _load
    i16, i32 = ir.IntType(16), ir.IntType(32)

    def load(b, base, index):
        bits = b.load(b.gep(base, [index], source_etype=i16), typ=ir.VectorType(i16, BLOCK), align=2)
        wide = b.shl(b.zext(bits, ir.VectorType(i32, BLOCK)), ir.Constant(ir.VectorType(i32, BLOCK), [16] * BLOCK))
        return b.bitcast(wide, VEC)

    return load


def _row_chunks(b, rows, mr, body):
    """body(r0, m) for chunks of mr rows, then for the remaining rows one at a time."""
    full = b.mul(b.sdiv(rows, _i(mr)), _i(mr))
    for_range(b, _i(0), full, _i(mr), lambda r0, _a: body(r0, mr) or [])
    if mr > 1:
        for_range(b, full, rows, _i(1), lambda r0, _a: body(r0, 1) or [])


def define_proj(module: ir.Module, name: str, mr: int, gates: int, weights: str = "float32") -> str:
    wload = _weight_loader(weights)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, PTR] + [I64] * 5), name=name)
    x, wp, bp, gx, rows, in_size, gx_stride, b0, b1 = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    block_floats = b.mul(in_size, _i(gates * BLOCK))  # one block's weights, in elements

    def block(blk, _a):
        w0 = b.mul(blk, block_floats)  # block blk's first weight, in elements
        bias = [_load(b, bp, b.add(b.mul(blk, _i(SLOTS * BLOCK)), _i(g * BLOCK))) for g in range(SLOTS)]

        def tile(r0, m):
            x_rows = [_at(b, x, b.mul(b.add(r0, _i(j)), in_size)) for j in range(m)]

            def k_step(i, acc):
                row = b.add(w0, b.mul(i, _i(gates * BLOCK)))
                w = [wload(b, wp, b.add(row, _i(g * BLOCK))) for g in range(gates)]
                out = []
                for j in range(m):
                    xs = broadcast(b, b.load(_at(b, x_rows[j], i), typ=F32, align=4), BLOCK)
                    out += [fma(b, xs, w[g], acc[j * gates + g]) for g in range(gates)]
                return out

            acc = for_range(b, _i(0), in_size, _i(1), k_step, bias[:gates] * m)
            for j in range(m):
                dst = _at(b, gx, b.add(b.mul(b.add(r0, _i(j)), gx_stride), b.mul(blk, _i(SLOTS * BLOCK))))
                for g in range(SLOTS):  # the slots past the gates: bias only (a GRU's Rbh)
                    b.store(acc[j * gates + g] if g < gates else bias[g], _at(b, dst, _i(g * BLOCK)), align=4)

        _row_chunks(b, rows, mr, tile)
        return []

    for_range(b, b0, b1, _i(1), block)
    b.ret_void()
    return name


def define_step(module: ir.Module, name: str, mr: int, ksplit: int, cell: str, weights: str = "float32") -> str:
    gates = 4 if cell == "lstm" else 3
    wload = _weight_loader(weights)
    # the slots of gx each accumulator starts from: an LSTM's four gates; a GRU's z, r and Rbh (its h gate's input
    # part, slot 2, joins after the reset gate scales the recurrent part)
    starts = [0, 1, 2, 3] if cell == "lstm" else [0, 1, 3]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, PTR, PTR, PTR] + [I64] * 5), name=name)
    rp, gx, gx_stride, h_prev, h_next, c, rows, hp, hidden, b0, b1 = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    block_floats = b.mul(hidden, _i(gates * BLOCK))

    def block(blk, _a):
        r0_blk = b.mul(blk, block_floats)  # block blk's first weight, in elements
        unit = b.mul(blk, _i(BLOCK))

        def tile(r0, m):
            sets = ksplit if m == 1 else 1
            h_rows = [_at(b, h_prev, b.mul(b.add(r0, _i(j)), hp)) for j in range(m)]
            g_rows = [_at(b, gx, b.add(b.mul(b.add(r0, _i(j)), gx_stride), b.mul(blk, _i(SLOTS * BLOCK))))
                      for j in range(m)]
            init = [_load(b, g_rows[j], _i(slot * BLOCK)) for j in range(m) for slot in starts]
            zero = ir.Constant(VEC, [0.0] * BLOCK)
            init += [zero] * (gates * (sets - 1))

            def k_step(k, acc, s=0):
                row = b.mul(k, _i(gates * BLOCK))
                w = [wload(b, rp, b.add(r0_blk, b.add(row, _i(g * BLOCK)))) for g in range(gates)]
                out = list(acc)
                for j in range(m):
                    hs = broadcast(b, b.load(_at(b, h_rows[j], k), typ=F32, align=4), BLOCK)
                    for g in range(gates):
                        slot = (j + s) * gates + g
                        out[slot] = fma(b, hs, w[g], acc[slot])
                return out

            if sets == 1:
                acc = for_range(b, _i(0), hidden, _i(1), k_step, init)
            else:  # K in pairs over two accumulator sets, then the odd K's last step on the first set
                pairs = b.mul(b.sdiv(hidden, _i(2)), _i(2))
                acc = for_range(b, _i(0), pairs, _i(2),
                                lambda k, a: k_step(b.add(k, _i(1)), k_step(k, a, 0), 1), init)
                acc = for_range(b, pairs, hidden, _i(1), k_step, acc)
                acc = [b.fadd(acc[g], acc[gates + g]) for g in range(gates)]
            for j in range(m):
                at = b.add(b.mul(b.add(r0, _i(j)), hp), unit)
                if cell == "lstm":
                    i_g, o_g, f_g, c_g = acc[j * gates:(j + 1) * gates]
                    c_old = _load(b, c, at)
                    c_new = fma(b, vsigmoid(b, f_g), c_old, b.fmul(vsigmoid(b, i_g), vtanh(b, c_g)))
                    b.store(c_new, _at(b, c, at), align=4)
                    b.store(b.fmul(vsigmoid(b, o_g), vtanh(b, c_new)), _at(b, h_next, at), align=4)
                else:
                    z_g, r_g, hr = acc[j * gates:(j + 1) * gates]
                    n = vtanh(b, fma(b, vsigmoid(b, r_g), hr, _load(b, g_rows[j], _i(2 * BLOCK))))
                    h_new = fma(b, vsigmoid(b, z_g), b.fsub(_load(b, h_prev, at), n), n)
                    b.store(h_new, _at(b, h_next, at), align=4)

        _row_chunks(b, rows, mr, tile)
        return []

    for_range(b, b0, b1, _i(1), block)
    b.ret_void()
    return name


def build(region, target: Target) -> tuple[bytes, RecurrentKernelDesc, str]:
    """Returns (object code, the glue's description, LLVM IR text)."""
    p = region.params
    module = new_module(target, region.op_type)
    set_features(module, target.features)
    proj_rows, step_rows, ksplit = tile_rows(target, p.gates)
    proj = define_proj(module, f"{region.op_type}_proj", proj_rows, p.gates, p.weights)
    step = define_step(module, f"{region.op_type}_step", step_rows, ksplit, p.cell, p.weights)
    ir_text = str(module)
    obj = compile_object(ir_text, target, vectorize=False)
    n_in = 4 + int(p.has_h0) + int(p.has_c0)
    in_types = [TensorProto.FLOAT] * n_in
    in_types[1] = in_types[2] = p.weight_type  # FLOAT, or the bfloat16 weights' BFLOAT16 (UINT16 before opset 13)
    desc = RecurrentKernelDesc(op_type=region.op_type, in_types=in_types,
                               out_types=[TensorProto.FLOAT] * sum(p.outputs), params=p, proj=proj, step=step)
    return obj, desc, ir_text

