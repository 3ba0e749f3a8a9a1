"""Explicit-SIMD building blocks for the chunk kernels, emitted as LLVM vector IR from numba.

Numba leaves LLVM's SLP vectoriser off and never reassociates a floating-point sum without
``fastmath``, so a float64 dot product or a register-tiled matrix product compiles to scalar
code (4-10x slower here). These two intrinsics spell the vector code out, with a summation order
that is part of their definition rather than the compiler's choice, so results are the same bit
for bit on every CPU whatever its vector width, and whether an input is float32 (widened
exactly to float64) or float64:

``vdot(a, ia, b, ib, length)`` = sum_t a[ia + t] * b[ib + t] over t < length, in 16 lanes:
    lane r accumulates t = r, r + 16, r + 32, ... in order; the lanes are then added pairwise
    (r, r + 8), (r, r + 4), (r, r + 2), (r, r + 1); the tail t >= 16 * (length // 16) is added
    last, in order.

``tile_ukv(A, ia, lda, Ut, iu, ldu, V, iv, ldv, nrows, tj, nv)`` accumulates one strip of
    V = U K: for j < tj and c < 16 nv,
        V[iv + j ldv + c] += sum_{l < nrows} Ut[iu + l ldu + j] * A[ia + l lda + c],
    adding the terms to the value already in V one l at a time, in order. The 2 tj nv vector
    accumulators stay in registers for the whole sweep over the rows. (tj, nv) must be one of
    ``TILE_SHAPES``; anything else does nothing.

Every product is a multiply followed by an add (never a fused multiply-add), exactly as numba
compiles ``s += a * b``, so scalar code written in numba gives the same bits as these. Arrays are
addressed as flat C-contiguous memory; callers guarantee the indices are in bounds.

Numba's on-disk cache of ``kernels.py`` does not notice edits to this file: after changing it,
touch kernels.py (or delete its ``__pycache__/*.nbi``) so the kernels are recompiled.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16
F64 = ir.DoubleType()
V16 = ir.VectorType(F64, LANES)
I32 = ir.IntType(32)

#: (vectors per tile, 16-column groups per tile) combinations tile_ukv implements: at most 16
#: accumulator registers (tj * nv <= 8 pairs of 8-double vectors).
TILE_SHAPES = tuple((tj, nv) for tj in range(1, 9) for nv in (1, 2, 4) if tj * nv <= 8)


def _flat_ptr(context, builder, aryty, ary, index):
    """Pointer to element ``index`` of the flat data of array ``ary``."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(data, [index])


def _load16(context, builder, aryty, ary, index):
    """16 consecutive elements from ``index`` as a <16 x double> (float32 widened exactly)."""
    ptr = _flat_ptr(context, builder, aryty, ary, index)
    elt = context.get_data_type(aryty.dtype)
    vec = builder.load(builder.bitcast(ptr, ir.VectorType(elt, LANES).as_pointer()), align=1)
    return vec if elt == F64 else builder.fpext(vec, V16)


def _load1(context, builder, aryty, ary, index):
    val = builder.load(_flat_ptr(context, builder, aryty, ary, index))
    return val if val.type == F64 else builder.fpext(val, F64)


def _splat(builder, x):
    vec = builder.insert_element(ir.Constant(V16, ir.Undefined), x, ir.Constant(I32, 0))
    return builder.shuffle_vector(vec, ir.Constant(V16, ir.Undefined), ir.Constant(ir.VectorType(I32, LANES), [0] * LANES))


def _hsum16(builder, vec):
    """Pairwise lane sum in the fixed order of the module docstring."""
    width = LANES
    while width > 1:
        half = width // 2
        lo = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, half), list(range(half))))
        hi = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, half), list(range(half, width))))
        vec = builder.fadd(lo, hi)
        width = half
    return builder.extract_element(vec, ir.Constant(I32, 0))


def _is_c_float_array(t) -> bool:
    return isinstance(t, types.Array) and t.layout == "C" and t.dtype in (types.float32, types.float64)


@intrinsic
def vdot(typingctx, a, ia, b, ib, length):
    """sum_t a[ia + t] * b[ib + t], t < length, in float64 with the fixed lane order above."""
    if not (_is_c_float_array(a) and _is_c_float_array(b)):
        return None
    sig = types.float64(a, types.intp, b, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        A, IA, B, IB, N = args
        aty, bty = signature.args[0], signature.args[2]
        intp = context.get_value_type(types.intp)
        acc = cgutils.alloca_once_value(builder, ir.Constant(V16, [0.0] * LANES))
        nblocks = builder.udiv(N, ir.Constant(intp, LANES))
        with cgutils.for_range(builder, nblocks) as loop:
            off = builder.mul(loop.index, ir.Constant(intp, LANES))
            va = _load16(context, builder, aty, A, builder.add(IA, off))
            vb = _load16(context, builder, bty, B, builder.add(IB, off))
            builder.store(builder.fadd(builder.load(acc), builder.fmul(va, vb)), acc)
        total = cgutils.alloca_once_value(builder, _hsum16(builder, builder.load(acc)))
        start = builder.mul(nblocks, ir.Constant(intp, LANES))
        with cgutils.for_range_slice(builder, start, N, ir.Constant(intp, 1), inc=True) as (t, _):
            x = _load1(context, builder, aty, A, builder.add(IA, t))
            y = _load1(context, builder, bty, B, builder.add(IB, t))
            builder.store(builder.fadd(builder.load(total), builder.fmul(x, y)), total)
        return builder.load(total)

    return sig, codegen


def _emit_tile(context, builder, sig, args, tj, nv):
    """The loop of tile_ukv for one (tj, nv): accumulators start from V and end in V."""
    a, ia, lda, ut, iu, ldu, v, iv, ldv, nrows, _, _ = args
    aty, uty, vty = sig.args[0], sig.args[3], sig.args[6]
    intp = context.get_value_type(types.intp)
    vptrs = [[builder.bitcast(_flat_ptr(context, builder, vty, v,
                                        builder.add(iv, builder.add(builder.mul(ir.Constant(intp, j), ldv),
                                                                    ir.Constant(intp, LANES * c)))),
                              V16.as_pointer())
              for c in range(nv)] for j in range(tj)]
    accs = [[cgutils.alloca_once(builder, V16) for _ in range(nv)] for _ in range(tj)]
    for j in range(tj):
        for c in range(nv):
            builder.store(builder.load(vptrs[j][c], align=1), accs[j][c])
    with cgutils.for_range(builder, nrows) as loop:
        l = loop.index
        rbase = builder.add(ia, builder.mul(l, lda))
        rows = [_load16(context, builder, aty, a, builder.add(rbase, ir.Constant(intp, LANES * c))) for c in range(nv)]
        ubase = builder.add(iu, builder.mul(l, ldu))
        for j in range(tj):
            uj = _splat(builder, _load1(context, builder, uty, ut, builder.add(ubase, ir.Constant(intp, j))))
            for c in range(nv):
                builder.store(builder.fadd(builder.load(accs[j][c]), builder.fmul(uj, rows[c])), accs[j][c])
    for j in range(tj):
        for c in range(nv):
            builder.store(builder.load(accs[j][c]), vptrs[j][c], align=1)


@intrinsic
def tile_ukv(typingctx, A, ia, lda, Ut, iu, ldu, V, iv, ldv, nrows, tj, nv):
    """V[j, c] += sum_l Ut[l, j] A[l, c] over a strip of 16 nv columns and tj vectors (see module doc)."""
    if not (_is_c_float_array(A) and _is_c_float_array(Ut) and _is_c_float_array(V) and V.dtype == types.float64):
        return None
    ip = types.intp
    sig = types.void(A, ip, ip, Ut, ip, ip, V, ip, ip, ip, ip, ip)

    def codegen(context, builder, signature, args):
        intp = context.get_value_type(types.intp)
        case = builder.add(builder.mul(args[10], ir.Constant(intp, 8)), args[11])
        end = builder.append_basic_block("tile_ukv.end")
        switch = builder.switch(case, end)
        for tj_, nv_ in TILE_SHAPES:
            block = builder.append_basic_block(f"tile_ukv.{tj_}x{nv_}")
            switch.add_case(ir.Constant(intp, tj_ * 8 + nv_), block)
            builder.position_at_end(block)
            _emit_tile(context, builder, signature, args, tj_, nv_)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen
