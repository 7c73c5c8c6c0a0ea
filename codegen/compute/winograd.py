"""The two transforms of a Winograd convolution (onnxopt/fusion/winograd.py) as LLVM IR, on channel vectors.

The glue (codegen/glue/winograd_exec.c) runs, per nh x nw input window and channel vector,

    void <set>_win(const int64 *rec)     rec: {src, src_row, dst, dst_step}

which loads the window's nh x nw vectors (src + r * src_row + c * L; the glue passes a zero-padded copy at the
image's border), computes B_h^T d B_w and stores its nh * nw vectors at dst + k * dst_step (k = row * nw + col). The
per-position products are the blocked tiles with an empty epilogue (blocked_tile.py). Then, per tile and output
channel vector,

    void <set>_wout(const int64 *rec)    rec: {src, src_step, out_row, rows, cols, lanes, out[4], extra[8]}

loads the nh * nw product vectors (src + k * src_step), computes A_h^T M A_w, and for each of the mh x mw pixels
inside the
image (r < rows, c < cols) runs the region's epilogue (bias, activation, residual) and stores every output at
out + r * out_row + c * L: the same epilogue inputs as a blocked tile's (CHANNEL vectors at base, POSITION read
like the output, SCALAR broadcast), and the same rule that channels past the real ones (lanes) are stored as zeros.

The matrices' entries are small fractions; a 1 or -1 becomes an add or subtract, a 0 nothing, anything else a
fused multiply-add.
"""

from __future__ import annotations

from llvmlite import ir

from onnxopt.fusion.winograd import axis_matrices

from ..microkernel.outer_product import F32, I64, PTR, lane_mask
from ..vmath.irutil import fma
from ..vmath.isa import set_features
from .blocked_tile import channel_inputs, store_epilogue
from .tile import MAX_EXTRAS, MAX_OUTPUTS, TileSpec, _slot

# The records' 8-byte slots (mirrored in winograd_exec.c).
WIN_SRC, WIN_SRC_ROW, WIN_DST, WIN_DST_STEP = range(4)
WOUT_SRC, WOUT_SRC_STEP, WOUT_OUT_ROW, WOUT_ROWS, WOUT_COLS, WOUT_LANES = range(6)
WOUT_OUT = 6
WOUT_EXTRA = WOUT_OUT + MAX_OUTPUTS
WOUT_SLOTS = WOUT_EXTRA + MAX_EXTRAS


def _combine(b: ir.IRBuilder, row, xs: list[ir.Value], vty) -> ir.Value:
    """sum_j row[j] * xs[j] for constant coefficients."""
    acc = None
    for coef, x in zip(row, xs):
        c = float(coef)
        if c == 0.0:
            continue
        if acc is None:
            acc = x if c == 1.0 else b.fneg(x) if c == -1.0 else b.fmul(ir.Constant(vty, [c] * vty.count), x)
        elif c == 1.0:
            acc = b.fadd(acc, x)
        elif c == -1.0:
            acc = b.fsub(acc, x)
        else:
            acc = fma(b, ir.Constant(vty, [c] * vty.count), x, acc)
    return acc if acc is not None else ir.Constant(vty, [0.0] * vty.count)


def _sandwich(b, left, grid: list[list[ir.Value]], right, vty) -> list[list[ir.Value]]:
    """left . grid . right^T for constant matrices `left` [p x q], `right` [s x t] and a q x t grid of vectors."""
    cols = [[_combine(b, row, [grid[i][j] for i in range(len(grid))], vty) for j in range(len(grid[0]))]
            for row in left]
    return [[_combine(b, row, cols[i], vty) for row in right] for i in range(len(left))]


def _record_function(module: ir.Module, name: str) -> tuple[ir.Function, ir.IRBuilder, ir.Argument]:
    """void name(const int64 *rec): the function, a builder at its entry, and the record."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    fn.args[0].add_attribute("noalias")
    return fn, ir.IRBuilder(fn.append_basic_block("entry")), fn.args[0]


def define_input_transform(module: ir.Module, name: str, kernel, m: int, lanes: int) -> ir.Function:
    (_, _, bth), (_, _, btw) = axis_matrices(kernel, m)
    nh, nw = len(bth), len(btw)
    vty = ir.VectorType(F32, lanes)
    fn, b, t = _record_function(module, name)
    src, src_row = _slot(b, t, WIN_SRC, PTR), _slot(b, t, WIN_SRC_ROW, I64)
    dst, dst_step = _slot(b, t, WIN_DST, PTR), _slot(b, t, WIN_DST_STEP, I64)
    grid = []
    for r in range(nh):
        row_ptr = b.gep(src, [b.mul(src_row, ir.Constant(I64, r))], source_etype=F32)
        grid.append([b.load(b.gep(row_ptr, [ir.Constant(I64, c * lanes)], source_etype=F32), typ=vty, align=4)
                     for c in range(nw)])
    v = _sandwich(b, bth, grid, btw, vty)
    for r in range(nh):
        for c in range(nw):
            at = b.mul(dst_step, ir.Constant(I64, r * nw + c))
            b.store(v[r][c], b.gep(dst, [at], source_etype=F32), align=4)
    b.ret_void()
    return fn


def define_output_transform(module: ir.Module, name: str, kernel, m: int, spec: TileSpec) -> ir.Function:
    (ath, _, _), (atw, _, _) = axis_matrices(kernel, m)
    mh, mw, nh, nw = len(ath), len(atw), len(ath[0]), len(atw[0])
    lanes = spec.tile.lanes
    vty = ir.VectorType(F32, lanes)
    fn, b, t = _record_function(module, name)
    src, step = _slot(b, t, WOUT_SRC, PTR), _slot(b, t, WOUT_SRC_STEP, I64)
    out_row = _slot(b, t, WOUT_OUT_ROW, I64)
    rows, cols = _slot(b, t, WOUT_ROWS, I64), _slot(b, t, WOUT_COLS, I64)
    mask = lane_mask(b, _slot(b, t, WOUT_LANES, I64), lanes)
    prog = spec.epilogue
    outs = [_slot(b, t, WOUT_OUT + k, PTR) for k in range(len(prog.outputs))]
    extras = [_slot(b, t, WOUT_EXTRA + e, PTR) for e in range(len(prog.inputs) - 1)]
    grid = [[b.load(b.gep(src, [b.mul(step, ir.Constant(I64, r * nw + c))], source_etype=F32), typ=vty, align=4)
             for c in range(nw)] for r in range(nh)]
    y = _sandwich(b, ath, grid, atw, vty)
    chan = {e: v[0] for e, v in channel_inputs(b, spec, extras, [ir.Constant(I64, 0)], [mask]).items()}
    for r in range(mh):
        for c in range(mw):
            inside = b.and_(b.icmp_signed(">", rows, ir.Constant(I64, r)), b.icmp_signed(">", cols, ir.Constant(I64, c)))
            with b.if_then(inside, likely=True):
                pos = b.add(b.mul(out_row, ir.Constant(I64, r)), ir.Constant(I64, c * lanes))
                store_epilogue(b, spec, y[r][c], extras, chan, pos, mask, outs)
    b.ret_void()
    return fn


def define_winograd_functions(module: ir.Module, prefix: str, spec: TileSpec, features, kernel,
                              m: int) -> list[list[str]]:
    """The input and output transforms of F(m, kernel) with the region's epilogue; returns [[in, out]]."""
    set_features(module, features)
    names = [f"{prefix}_win", f"{prefix}_wout"]
    define_input_transform(module, names[0], kernel, m, spec.tile.lanes)
    define_output_transform(module, names[1], kernel, m, spec)
    return [names]
