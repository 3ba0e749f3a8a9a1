"""Numba kernels for building a bank: Gram matrices, their statistics and largest eigenvalue.

Gram matrices and their trace and Frobenius norm are computed by loops written out (no BLAS, no
fastmath, no parallel reductions), so they are bit-identical whichever process, thread count or
BLAS build computes them -- a resumed build must reproduce an uninterrupted one's checksums. The
largest eigenvalue also uses BLAS dot products and LAPACK on the small Lanczos tridiagonal:
deterministic for a given machine and library, as ARPACK was. Every function is ``nogil``, so
Dask's threads run them truly in parallel.

Pairwise bases (``base_row``) sum over features in feature order, features outside and the second
point innermost over a feature-major copy, so the inner loop is contiguous and vectorises without
changing any entry's summation order; (a - b)^2 = (b - a)^2 and ab = ba in floating point, so a
training Gram matrix is computed on its upper triangle and mirrored: exactly symmetric.

Reductions over a matrix (Frobenius norm, K v) accumulate row by row into a length-n float64
vector (``acc += a * row``), which vectorises while every element is still summed in index order.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from mklscale.simd import vdot

#: Which bytes a spec computes to, recorded in every bank build_bank creates. 1: every Gaussian
#: kernel from ``exp_f64``; 2: float32 Gaussian kernels from ``exp_single``; 3: float32 Gaussian
#: kernels from ``exp_f32_scaled``, in float32 arithmetic (float64 banks are computed as in 1 by
#: every version). A build can only resume or repair a bank whose stored kernels it reproduces; a
#: computed bank of any version in ``ARITHMETICS`` is read with its own (``exp_kind``).
ARITHMETIC = 3
ARITHMETICS = (1, 2, 3)
#: How ``_kernel_row`` evaluates a Gaussian: ``exp_f64`` (float64 banks; float32 banks of arithmetic 1),
#: ``exp_single`` (float32, arithmetic 2), ``exp_f32_scaled`` (float32, arithmetic 3)
EXP_F64, EXP_SINGLE, EXP_F32 = 0, 1, 2

SQDIST, DOT = 0, 1  # pairwise bases: ||x - z||^2 and <x, z>
GAUSSIAN, POLYNOMIAL, LINEAR = 0, 1, 2  # families, as in spec.py
NO_NORM, TRACE, DIAG = 0, 1, 2  # normalisations, as in store.NORMALIZATIONS

#: relative residual at which the largest-eigenvalue iteration stops (as ARPACK's tol before)
LAMBDA_TOL = 1e-8
_LANCZOS_STEPS = 48  # Krylov basis size before an explicit restart from the Ritz vector
_LANCZOS_RESTARTS = 40


# ---- pairwise bases ----------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def base_row(Xt, i, Zt, j0, j1, kind, out):
    """out[j - j0] = base(x_i, z_j) for j in [j0, j1), summed over features in feature order.

    kind SQDIST: sum_k (Xt[k, i] - Zt[k, j])^2;  kind DOT: sum_k Xt[k, i] Zt[k, j];
    Xt (d, n) and Zt (d, m) are feature-major float64. Four features per pass over out (one
    load and store of out[j] per four terms, still added one by one in feature order). Operands of
    other shapes (Zt with another number of features, i or j0:j1 outside them, out too short) raise
    ValueError instead of reading out of bounds.
    """
    if (Zt.shape[0] != Xt.shape[0] or i < 0 or i >= Xt.shape[1] or j0 < 0 or j1 < j0 or j1 > Zt.shape[1]
            or out.shape[0] < j1 - j0):
        raise ValueError("base_row: operand shapes disagree (Xt and Zt need the same number of features, "
                         "i and j0:j1 must lie inside them, out must hold j1 - j0 values)")
    L = j1 - j0
    out[:L] = 0.0
    d = Xt.shape[0]
    k = 0
    while k + 4 <= d:
        x0, x1, x2, x3 = Xt[k, i], Xt[k + 1, i], Xt[k + 2, i], Xt[k + 3, i]
        z0, z1, z2, z3 = Zt[k, j0:j1], Zt[k + 1, j0:j1], Zt[k + 2, j0:j1], Zt[k + 3, j0:j1]
        if kind == SQDIST:
            for j in range(L):
                t0, t1, t2, t3 = x0 - z0[j], x1 - z1[j], x2 - z2[j], x3 - z3[j]
                out[j] = out[j] + t0 * t0 + t1 * t1 + t2 * t2 + t3 * t3
        else:
            for j in range(L):
                out[j] = out[j] + x0 * z0[j] + x1 * z1[j] + x2 * z2[j] + x3 * z3[j]
        k += 4
    for kk in range(k, d):
        x = Xt[kk, i]
        z = Zt[kk, j0:j1]
        if kind == SQDIST:
            for j in range(L):
                t = x - z[j]
                out[j] += t * t
        else:
            for j in range(L):
                out[j] += x * z[j]


@numba.njit(cache=True, nogil=True)
def _base_rows(Xt, Zt, kind):
    """B[i, j] = base(x_i, z_j) for all pairs, float64 (n, m)."""
    n, m = Xt.shape[1], Zt.shape[1]
    B = np.empty((n, m), dtype=np.float64)
    for i in range(n):
        base_row(Xt, i, Zt, 0, m, kind, B[i])
    return B


def _feature_major(X: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(X.T, dtype=np.float64)


def sqdist(X: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """D[i, j] = ||X[i] - Z[j]||^2, float64, summed in feature order."""
    return _base_rows(_feature_major(X), _feature_major(Z), SQDIST)


def dot(X: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """G[i, j] = <X[i], Z[j]>, float64, summed in feature order."""
    return _base_rows(_feature_major(X), _feature_major(Z), DOT)


# ---- exp that vectorises -----------------------------------------------------------------------
def exp_kind(dtype, arithmetic: int = ARITHMETIC) -> int:
    """The Gaussian evaluation (EXP_*) of kernels stored as ``dtype`` by arithmetic version ``arithmetic``."""
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"kernel arithmetic version {arithmetic} is not one this mklscale computes "
                         f"({', '.join(map(str, ARITHMETICS))})")
    if np.dtype(dtype) != np.float32 or arithmetic == 1:
        return EXP_F64
    return EXP_SINGLE if arithmetic == 2 else EXP_F32


@intrinsic
def _f64_from_bits(typingctx, bits):
    """The float64 whose IEEE-754 bit pattern is the int64 ``bits`` (an LLVM bitcast)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * _LN2_HI is exact (fdlibm)
_LN2_LO = 1.90821492927058770002e-10
_INV_FACT = tuple(1.0 / float(np.prod(np.arange(1, k + 1, dtype=np.float64))) for k in range(14))


@numba.njit(cache=True, nogil=True, inline="always")
def _reduce_ln2(x):
    """(k, r) with x = k ln2 + r, k = round(x / ln2) as a float, |r| <= ln2 / 2, for x clamped to
    [-708, 709]; ln 2 is split in two so that k * _LN2_HI is exact (fdlibm)."""
    xc = min(max(x, -708.0), 709.0)
    kf = np.floor(xc * _LOG2E + 0.5)
    return kf, (xc - kf * _LN2_HI) - kf * _LN2_LO


@numba.njit(cache=True, nogil=True, inline="always")
def _times_2k(p, kf, x):
    """p * 2^k with 2^k built from its exponent bits; 0 where x < -708 (exp(x) < 3e-308)."""
    y = p * _f64_from_bits((np.int64(kf) + 1023) << 52)
    return y if x >= -708.0 else 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def exp_f64(x):
    """exp(x) for float64 x <= 0 to about 2 ulp, as straight-line arithmetic LLVM vectorises.

    (Without SVML numba calls libm once per element.) x = k ln2 + r with k = round(x / ln2) and
    |r| <= ln2 / 2; exp(r) = sum_{q <= 13} r^q / q! (truncation < 1e-17 relative) and 2^k is built
    from its exponent bits. exp(x) < 3e-308 for x < -708 is returned as 0.
    """
    kf, r = _reduce_ln2(x)
    c = _INV_FACT
    p = c[13]
    p = p * r + c[12]
    p = p * r + c[11]
    p = p * r + c[10]
    p = p * r + c[9]
    p = p * r + c[8]
    p = p * r + c[7]
    p = p * r + c[6]
    p = p * r + c[5]
    p = p * r + c[4]
    p = p * r + c[3]
    p = p * r + c[2]
    p = p * r + c[1]
    p = p * r + c[0]
    return _times_2k(p, kf, x)


@numba.njit(cache=True, nogil=True, inline="always")
def exp_single(x):
    """exp(x) for float64 x <= 0 to 3e-10 relative, for results stored as float32.

    The reduction and scaling of ``exp_f64``, then sum_{q <= 8} r^q / q! by Estrin's scheme (truncation
    |r|^9 / 9! < 2.1e-10 for |r| <= ln2 / 2: a float32 result rounds like the correctly rounded one
    except within 3e-10 of a rounding midpoint, i.e. at most 1 ulp apart). About 30% cheaper per
    entry than ``exp_f64``: shorter, and two independent chains instead of Horner's one.
    """
    kf, r = _reduce_ln2(x)
    c = _INV_FACT
    r2 = r * r
    r4 = r2 * r2
    low = (c[0] + c[1] * r) + (c[2] + c[3] * r) * r2
    high = (c[4] + c[5] * r) + (c[6] + c[7] * r) * r2
    p = low + high * r4 + c[8] * (r4 * r4)
    return _times_2k(p, kf, x)


# ---- float32 exp (arithmetic 3) ----------------------------------------------------------------
_F32 = np.float32
_SHIFT32 = _F32(12582912.0)  # 1.5 * 2^23: y + _SHIFT32 rounds y (|y| < 2^22) to an integer
_SHIFT32_BITS = 0x4B400000  # its bit pattern


@intrinsic
def _f32_times_2k(typingctx, v, t):
    """v * 2^k in float32 for t = k + 1.5 * 2^23 (float32, k integer in [-150, 0]), as (v * 2^k1) * 2^k2
    with k1 = floor(k / 2), k2 = k - k1, both powers built from their exponent bits (the bits of t are
    those of 1.5 * 2^23 plus k). For v >= 2^-50 the first product is exact, so the result is v * 2^k
    rounded once (into float32's subnormals below 2^-126)."""
    if v != types.float32 or t != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        k = builder.sub(builder.bitcast(args[1], i32), ir.Constant(i32, _SHIFT32_BITS))
        k1 = builder.ashr(k, ir.Constant(i32, 1))
        k2 = builder.sub(k, k1)

        def pow2(e):
            bits = builder.shl(builder.add(e, ir.Constant(i32, 127)), ir.Constant(i32, 23))
            return builder.bitcast(bits, ir.FloatType())

        return builder.fmul(builder.fmul(args[0], pow2(k1)), pow2(k2))

    return types.float32(types.float32, types.float32), codegen


_LOG2E32 = _F32(_LOG2E)
_LN2_HI32 = _F32(0.693359375)  # 355 / 512: k * _LN2_HI32 is exact for |k| <= 150 (Cody and Waite)
_LN2_LO32 = _F32(-2.12194440e-4)  # ln 2 - _LN2_HI32
_EXP_MIN32 = _F32(-103.9721)  # just below ln(2^-150): exp(x) * c rounds to 0 for x below it (c <= 1)
_ONE32 = _F32(1.0)
_ZERO32 = _F32(0.0)
_Q32 = tuple(_F32(c) for c in _INV_FACT[2:8])  # 1 / q!, q = 2..7
_PAD32 = 64  # ``_gaussian_f32`` runs its float32 loop over multiples of this many values
#: float32 Gaussian kernels (arithmetic 3) on at most this many features are computed on whole rows
#: (their exp costs less than mirroring), on more on the upper triangle and mirrored: the same bits
_WHOLE_ROWS_FEATURES = 8


@numba.njit(cache=True, nogil=True, inline="always")
def exp_f32_scaled(xf, xl, c):
    """exp(xf + xl) * c in float32 arithmetic, for x = xf + xl <= 0 split in two float32 (xf = float32(x),
    xl = float32(x - xf): the argument is kept to about 2^-48 relative) and a float32 scale 2^-50 <= c <= 1.

    x = k ln2 + r with k = round(x / ln2) (rounded by adding 1.5 * 2^23) and ln 2 in two parts (the
    first of 9 bits, so xf - k * _LN2_HI32 is exact for |k| <= 150), |r| <= ln2 / 2 (+ |xl|);
    exp(r) = 1 + (r + r^2 Q(r)), Q(r) = sum_{q=2..7} r^(q-2) / q! by Horner (truncation < 5.3e-9
    relative); then (exp(r) * c) * 2^k (``_f32_times_2k``: one more rounding, gradual underflow).
    x < -103.9721 gives 0 (exp(x) * c < 2^-150). Every operation is a float32 IEEE operation with no
    fused multiply-add (numba compiles without fastmath, so LLVM does not contract), so the bits are the
    same on every machine and thread count; as straight-line float32 code it vectorises 16 lanes wide
    on AVX-512, 8 on AVX2. Measured error (``docs/design.md``): within 1.03 ulp of exp(x) * c for c = 1
    and 1.53 ulp for c = 1/500 over every float32 argument in [-103.97, 0], 2.0 ulp for random c.
    """
    xc = max(xf, _EXP_MIN32)
    t = xc * _LOG2E32 + _SHIFT32
    kf = t - _SHIFT32
    r = ((xc - kf * _LN2_HI32) - kf * _LN2_LO32) + xl
    q = _Q32[4] + _Q32[5] * r
    q = _Q32[3] + q * r
    q = _Q32[2] + q * r
    q = _Q32[1] + q * r
    q = _Q32[0] + q * r
    e = _ONE32 + (r + q * (r * r))
    y = _f32_times_2k(e * c, t)
    return y if xf >= _EXP_MIN32 else _ZERO32


@numba.njit(cache=True, nogil=True)
def _gaussian_f32(B, L, a, cf, xf, xl, y, tail):
    """y[j] = exp_f32_scaled(xf[j], xl[j], cf) with xf[j] + xl[j] = a B[j] split in two float32, for
    j < L (float64 B: squared distances; float32 y; xf, xl of at least L + _PAD32, tail of _PAD32).

    The split is written by a loop in float64, then the exp by a loop in float32 only, which LLVM
    vectorises over float32 lanes (a loop mixing float64 would run at float64's lane count), over the
    first L rounded down to _PAD32 values; the last few go through ``tail`` as a zero-padded block of
    _PAD32, so no value goes through a scalar remainder."""
    Lv = L // _PAD32 * _PAD32
    for j in range(L):
        x = a * B[j]
        f = _F32(x)
        xf[j] = f
        xl[j] = _F32(x - np.float64(f))
    for j in range(Lv):
        y[j] = exp_f32_scaled(xf[j], xl[j], cf)
    if Lv < L:
        for j in range(L, Lv + _PAD32):
            xf[j], xl[j] = _ZERO32, _ZERO32
        for j in range(_PAD32):
            tail[j] = exp_f32_scaled(xf[Lv + j], xl[Lv + j], cf)
        for j in range(L - Lv):
            y[Lv + j] = tail[j]


@numba.njit(cache=True, nogil=True)
def _gaussian_f32_scaled_split(L, s, cf, xf, xl, y, tail):
    """``_gaussian_f32`` for a second kernel on the same base whose a is 2^m times the first's (m >= 0,
    s = 2^m): xf, xl hold the first kernel's split (padded as ``_gaussian_f32`` leaves them) and
    s xf, s xl are exactly this kernel's (float64 a b and its float32 roundings scale by 2^m exactly,
    except where x is below 2^-101 or beyond float32's range, and there exp_f32_scaled gives c or 0
    from either), so y is the same bits, without the split's loop."""
    Lv = L // _PAD32 * _PAD32
    for j in range(Lv):
        y[j] = exp_f32_scaled(s * xf[j], s * xl[j], cf)
    if Lv < L:
        for j in range(_PAD32):
            tail[j] = exp_f32_scaled(s * xf[Lv + j], s * xl[Lv + j], cf)
        for j in range(L - Lv):
            y[Lv + j] = tail[j]


@numba.njit(cache=True, nogil=True)
def _power_of_two_ratios(a):
    """(g0, s): g0 the kernel of smallest |a|, s[g] = a[g] / a[g0] as float32 where that is exactly 2^m,
    0 <= m <= 100 (0 elsewhere): kernels whose exp arguments are those of g0 scaled exactly."""
    G = a.shape[0]
    g0 = 0
    for g in range(G):
        if abs(a[g]) < abs(a[g0]):
            g0 = g
    s = np.zeros(G, dtype=np.float32)
    for g in range(G):
        pw = 1.0
        for _m in range(101):
            if a[g0] * pw == a[g]:
                s[g] = _F32(pw)
                break
            pw *= 2.0
    return g0, s


@numba.njit(cache=True, nogil=True)
def _ladder_order(a):
    """(g0, s, order): ``_power_of_two_ratios`` and the order in which a tile's float32 Gaussians are
    computed: g0 first (its split is the one a width ladder scales), then the kernels on its ladder
    (s > 0: ``_gaussian_f32_scaled_split``), then the widths off it (each its own split)."""
    G = a.shape[0]
    g0, ratio = _power_of_two_ratios(a)
    order = np.empty(G, dtype=np.int64)
    if G == 0:
        return g0, ratio, order
    order[0], at = g0, 1
    for ladder in (True, False):
        for g in range(G):
            if g != g0 and (ratio[g] > 0) == ladder:
                order[at] = g
                at += 1
    return g0, ratio, order


@numba.njit(cache=True, nogil=True)
def _gaussian_tiles(how, kind, fams, scales):
    """Whether a group's kernels are float32 Gaussians computed by tiles (EXP_F32 on squared
    distances); ValueError when such a group holds another family or a kernel whose scales are not 1."""
    tiles = how == EXP_F32 and kind == SQDIST and fams.shape[0] > 0
    for g in range(fams.shape[0]):
        if tiles and (fams[g] != GAUSSIAN or np.any(scales[g] != 1.0)):
            raise ValueError("EXP_F32 tiles hold Gaussian kernels (unit diagonal) only")
    return tiles


@numba.njit(cache=True, nogil=True)
def _kernel_row(src, fam, a, p, ci, r, dst, how):
    """dst[j] = f(src[j]) * ci * r[j] with the family map f (formulas in spec.py):

    GAUSSIAN f(b) = exp(a b), a = -1 / (2 s^2), on squared distances, evaluated as ``how`` says
    (``exp_kind``): EXP_F64 ``exp_f64``; EXP_SINGLE ``exp_single`` (dst float32); EXP_F32 kernels are
    computed by tiles (``_fill_grams``), not here;
    POLYNOMIAL f(b) = (b + a)^p, a = offset, on inner products; LINEAR f(b) = b.
    ci * r[j] is the normalisation (trace: 1 / tr K and 1; diag: 1 / sqrt(K_ii K_jj) as r_i r_j).
    dst may be float32: the cast rounds to nearest, as ndarray.astype. dst and r shorter than src, or
    a Gaussian row with EXP_F32, raise ValueError.
    """
    L = src.shape[0]
    if dst.shape[0] < L or r.shape[0] < L:
        raise ValueError("_kernel_row: dst and r must be at least as long as src")
    if fam == GAUSSIAN and how == EXP_F32:
        raise ValueError("_kernel_row: EXP_F32 Gaussian kernels are computed by tiles (_fill_grams)")
    elif fam == GAUSSIAN and how == EXP_SINGLE:
        for j in range(L):
            dst[j] = exp_single(a * src[j]) * ci * r[j]
    elif fam == GAUSSIAN:
        for j in range(L):
            dst[j] = exp_f64(a * src[j]) * ci * r[j]
    elif fam == POLYNOMIAL:
        for j in range(L):
            dst[j] = (src[j] + a) ** p * ci * r[j]
    else:
        for j in range(L):
            dst[j] = src[j] * ci * r[j]


@numba.njit(cache=True, nogil=True)
def _base_diag(Xt, kind):
    """b[i] = base(x_i, x_i), summed in feature order exactly as base_row sums it (0 for SQDIST)."""
    b = np.zeros(Xt.shape[1])
    for k in range(Xt.shape[0]):
        x = Xt[k]
        if kind == SQDIST:
            for i in range(x.shape[0]):
                t = x[i] - x[i]
                b[i] += t * t
        else:
            for i in range(x.shape[0]):
                b[i] += x[i] * x[i]
    return b


@numba.njit(cache=True, nogil=True)
def _base_tile(Xt, I, I1, J0, kind, B):
    """B[(i - I) W + j - J0] = base(x_i, x_j) for the rows i in [I, I1) and the columns j in [J0, n)
    (W = n - J0), bit for bit as ``base_row`` sums it: 0.0 plus one feature after the other in feature
    order (its groups of four add in that order too; 0.0 + v, kept, turns -0.0 into 0.0 as there), one
    loop over a row per feature and no call per row (whole rows of few features in ``_fill_grams``,
    J0 = 0; a tile's band from its first row's column on in ``_quad_grams``, J0 = I)."""
    d, n = Xt.shape
    W = n - J0
    for i in range(I, I1):
        out = B[(i - I) * W:(i - I + 1) * W]
        if d == 0:
            out[:] = 0.0
        for k in range(d):
            x = Xt[k, i]
            row = Xt[k, J0:]
            if k == 0 and kind == SQDIST:
                for j in range(W):
                    t = x - row[j]
                    out[j] = 0.0 + t * t
            elif k == 0:
                for j in range(W):
                    out[j] = 0.0 + x * row[j]
            elif kind == SQDIST:
                for j in range(W):
                    t = x - row[j]
                    out[j] += t * t
            else:
                for j in range(W):
                    out[j] += x * row[j]


@numba.njit(cache=True, nogil=True)
def _normalisers(Xt, kind, fams, a, p, norm):
    """Per-kernel factor (trace: 1 / tr K, 1 when tr K <= 0) and per-point scales r (diag:
    1 / sqrt(K_ii), 1 where K_ii <= 1e-300) of the unnormalised training kernels, from their
    diagonals alone (bit-identical to the diagonal of the full sweep)."""
    n, G = Xt.shape[1], fams.shape[0]
    bdiag = _base_diag(Xt, kind)
    ones = np.ones(n)
    kdiag = np.empty(n)
    factors = np.ones(G)
    scales = np.ones((G, n))
    for g in range(G):
        _kernel_row(bdiag, fams[g], a[g], p[g], 1.0, ones, kdiag, EXP_F64)
        if norm == TRACE:
            tr = 0.0
            for i in range(n):
                tr += kdiag[i]
            if tr > 0:
                factors[g] = 1.0 / tr
        elif norm == DIAG:
            for i in range(n):
                scales[g, i] = 1.0 / np.sqrt(kdiag[i]) if kdiag[i] > 1e-300 else 1.0
    return factors, scales


_TILE = 32  # rows per block of the sweep, and the side of the tiles it mirrors


@numba.njit(cache=True, nogil=True)
def _mirror_rows(A, I, I1):
    """A[j, i] = A[i, j] for rows i in [I, I1) and j > i: the diagonal tile element by element,
    the tiles to its right as copies A[J, I] = A[I, J]^T. Run right after those rows are
    computed, the source rows are still in cache."""
    n = A.shape[0]
    for i in range(I, I1):
        for j in range(i + 1, I1):
            A[j, i] = A[i, j]
    for J in range(I1, n, _TILE):
        J1 = min(J + _TILE, n)
        A[J:J1, I:I1] = A[I:I1, J:J1].T


@numba.njit(cache=True, nogil=True)
def _fill_grams(Xt, kind, fams, a, p, norm, out, how):
    """out[g] = normalised K_g(X, X) for kernels g sharing one base on feature-major Xt (d, n).

    One sweep over the upper triangle, _TILE rows at a time: each row of the base is computed
    once and mapped, scaled and cast into every kernel of the group (``_kernel_row``), then the block
    of rows is mirrored into the lower triangle (exact symmetry). Returns the normalisation factors.
    float32 kernels of arithmetic 3 (``how`` EXP_F32) take two shortcuts that give the same bits:
    - Gaussian kernels are computed a tile of rows at a time from one array of its base values:
      ``_gaussian_f32`` over it (long float32 loops), K_ij = exp_f32_scaled(a b_ij, float32(1 / tr K)
      or 1) (a Gaussian's diagonal is 1, so its scales r are 1);
    - on at most _WHOLE_ROWS_FEATURES features, with every scale r 1 (no diag normalisation, or
      Gaussians), whole rows are computed in place and nothing is mirrored: b_ij = b_ji bit for bit
      and the scale is the same for every row, so K_ji = K_ij (computing the lower triangle costs
      less than mirroring it when the base is cheap); there a Gaussian whose a is 2^m times that of the
      group's smallest |a| (a width ladder of factors of 2 or 4, as per_feature's 0.5 1 2) scales that
      kernel's split argument (``_gaussian_f32_scaled_split``: the same bits);
    otherwise the tile's rows from its first column on, copied into place, then mirrored.
    Operands of other shapes (out not (G, n, n), a or p not one entry per kernel) raise ValueError.
    """
    n, G = Xt.shape[1], fams.shape[0]
    if out.shape[0] != G or out.shape[1] != n or out.shape[2] != n or a.shape[0] != G or p.shape[0] != G:
        raise ValueError("_fill_grams: out must have shape (kernels, n, n) and a, p one entry per kernel")
    factors, scales = _normalisers(Xt, kind, fams, a, p, norm)
    tiles = _gaussian_tiles(how, kind, fams, scales)
    whole = how == EXP_F32 and Xt.shape[0] <= _WHOLE_ROWS_FEATURES and np.all(scales == 1.0)
    buf = np.empty(n)
    B = np.empty(_TILE * n if tiles or whole else 0)
    xf = np.empty(_TILE * n + _PAD32 if tiles else 0, dtype=np.float32)
    xl, y = np.empty_like(xf), np.empty_like(xf)
    tail = np.empty(_PAD32, dtype=np.float32)
    flat = out.reshape(G, n * n)
    g0, ratio, order = _ladder_order(a)
    for I in range(0, n, _TILE):
        I1 = min(I + _TILE, n)
        if whole:
            _base_tile(Xt, I, I1, 0, kind, B)
            if tiles:
                L = (I1 - I) * n
                for g in order:
                    if g != g0 and ratio[g] > 0:
                        _gaussian_f32_scaled_split(L, ratio[g], _F32(factors[g]), xf, xl, flat[g, I * n:I1 * n], tail)
                    else:
                        _gaussian_f32(B, L, a[g], _F32(factors[g]), xf, xl, flat[g, I * n:I1 * n], tail)
                continue
            for g in range(G):
                for i in range(I, I1):
                    _kernel_row(B[(i - I) * n:(i - I + 1) * n], fams[g], a[g], p[g], factors[g] * scales[g, i],
                                scales[g], out[g, i], how)
            continue
        if tiles:
            W = n - I
            for i in range(I, I1):
                base_row(Xt, i, Xt, I, n, kind, B[(i - I) * W:(i - I + 1) * W])
            for g in range(G):
                _gaussian_f32(B, (I1 - I) * W, a[g], _F32(factors[g]), xf, xl, y, tail)
                for i in range(I, I1):
                    out[g, i, I:] = y[(i - I) * W:(i - I + 1) * W]
        else:
            for i in range(I, I1):
                base_row(Xt, i, Xt, i, n, kind, buf)
                for g in range(G):
                    ci = factors[g] * scales[g, i]
                    _kernel_row(buf[:n - i], fams[g], a[g], p[g], ci, scales[g, i:], out[g, i, i:], how)
        for g in range(G):
            _mirror_rows(out[g], I, I1)
    return factors


def fill_grams(Xsub: np.ndarray, kind: int, params: np.ndarray, norm: int, out: np.ndarray,
               arithmetic: int = ARITHMETIC) -> np.ndarray:
    """Fill out (G, n, n) with the normalised training kernels of G specs sharing one base.

    Xsub: (n, d) features already restricted to the specs' subset; params: (G, 3) rows
    (family, a, p) as in ``_kernel_row``; norm: NO_NORM, TRACE (K / tr K) or DIAG
    (K_ij / sqrt(K_ii K_jj)). Returns each kernel's normalisation factor (1 unless TRACE).
    A float32 ``out`` gets the Gaussian values of arithmetic version ``arithmetic`` (``ARITHMETIC``,
    ``exp_kind``).
    """
    if not out.flags.c_contiguous:
        raise ValueError("fill_grams: out must be C-contiguous")
    return _fill_grams(_feature_major(Xsub), kind, params[:, 0].astype(np.int64), params[:, 1].copy(),
                       params[:, 2].astype(np.int64), norm, out, exp_kind(out.dtype, arithmetic))


# ---- quad forms computed on the fly (a computed bank's passes) ---------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _fold_upper_row(y, off, i, U, c0, k, q):
    """q[c] += u_i (K_ii u_i + 2 vdot(K[i, i+1:], u[i+1:])) for k vectors u (rows c0.. of U (., n)),
    row i's upper part K[i, i:] being the 1-D y's values from ``off`` (``simd.vdot``: 16 lanes, a
    fixed order)."""
    n = U.shape[1]
    kii = np.float64(y[off])
    for c in range(k):
        ui = U[c0 + c, i]
        q[c] += ui * (kii * ui + 2.0 * vdot(y, off + 1, U, (c0 + c) * n + i + 1, n - i - 1))


@numba.njit(cache=True, nogil=True)
def quad_upper(Kb, U, each, q):
    """q[g, c] = u_c^T K_g u_c of whole symmetric kernels Kb (G, n, n) (C-contiguous) from their upper
    triangles, u^T K u = sum_i u_i (K_ii u_i + 2 sum_{j>i} K_ij u_j) with rows added in order, bit for
    bit as ``_quad_grams`` computing the kernels on the fly (a computed bank's pass over kernels it
    has just checked). ``each``: kernel g with vector U[g] only, into q[g, 0]."""
    G, n = Kb.shape[0], Kb.shape[1]
    k = 1 if each else U.shape[0]
    flat = Kb.reshape(G * n * n)
    for g in range(G):
        q[g, :] = 0.0
        for i in range(n):
            _fold_upper_row(flat, (g * n + i) * n + i, i, U, g if each else 0, k, q[g])


@numba.njit(cache=True, nogil=True)
def _quad_grams(Xt, kind, fams, a, p, norm, how, U, each, y, q):
    """q[g, c] = u_c^T K_g u_c for kernels g sharing one base, each K_g computed tile by tile on its
    upper triangle with the values ``_fill_grams`` stores (the same functions on the same bases) and
    folded at once (``_fold_upper_row``), never held whole: half the kernel evaluations of a stored
    kernel's n^2 values and no n x n buffer. y: a scratch of the bank's dtype, at least
    _TILE n + _PAD32 long (the kernel values of a tile of rows). ``each`` as in ``quad_upper``."""
    n, G = Xt.shape[1], fams.shape[0]
    if G == 0:
        return
    if a.shape[0] != G or p.shape[0] != G or q.shape[0] != G or y.shape[0] < _TILE * n + _PAD32:
        raise ValueError("_quad_grams: a, p, q need one entry per kernel and y _TILE n + _PAD32 values")
    factors, scales = _normalisers(Xt, kind, fams, a, p, norm)
    tiles = _gaussian_tiles(how, kind, fams, scales)
    k = 1 if each else U.shape[0]
    q[:, :] = 0.0
    B = np.empty(_TILE * n)
    xf = np.empty(_TILE * n + _PAD32 if tiles else 0, dtype=np.float32)
    xl = np.empty_like(xf)
    tail = np.empty(_PAD32, dtype=np.float32)
    g0, ratio, order = _ladder_order(a)
    for I in range(0, n, _TILE):
        I1, W = min(I + _TILE, n), n - I
        _base_tile(Xt, I, I1, I, kind, B)  # the tile's rows from column I on: row i's upper part from (i - I)
        if tiles:
            L = (I1 - I) * W
            for g in order:
                if g != g0 and ratio[g] > 0:
                    _gaussian_f32_scaled_split(L, ratio[g], _F32(factors[g]), xf, xl, y, tail)
                else:
                    _gaussian_f32(B, L, a[g], _F32(factors[g]), xf, xl, y, tail)
                for i in range(I, I1):
                    _fold_upper_row(y, (i - I) * W + (i - I), i, U, g if each else 0, k, q[g])
        else:
            for i in range(I, I1):
                row = B[(i - I) * W + (i - I):(i - I + 1) * W]
                for g in range(G):
                    _kernel_row(row, fams[g], a[g], p[g], factors[g] * scales[g, i], scales[g, i:], y, how)
                    _fold_upper_row(y, 0, i, U, g if each else 0, k, q[g])


def quad_grams(Xsub: np.ndarray, kind: int, params: np.ndarray, norm: int, U: np.ndarray, each: bool,
               dtype, arithmetic: int = ARITHMETIC) -> np.ndarray:
    """Quad forms of the normalised training kernels of G specs sharing one base (arguments as
    ``fill_grams``; kernels of ``dtype`` with arithmetic ``arithmetic``) with the vectors U (k, n),
    computed on the fly (``_quad_grams``): (G, k), or (G, 1) with ``each`` (U (G, n): one per kernel)."""
    G, n = params.shape[0], Xsub.shape[0]
    q = np.empty((G, 1 if each else U.shape[0]))
    y = np.empty(_TILE * n + _PAD32, dtype=dtype)
    _quad_grams(_feature_major(Xsub), kind, params[:, 0].astype(np.int64), params[:, 1].copy(),
                params[:, 2].astype(np.int64), norm, exp_kind(np.dtype(dtype), arithmetic),
                np.ascontiguousarray(U, dtype=np.float64), bool(each), y, q)
    return q


# ---- statistics of a stored matrix -------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def trace_fro_colabs(K):
    """(sum_i K_ii, sqrt(sum_ij K_ij^2), c) with c_j = sum_i |K_ij|, float64, in one pass over K.

    max_j c_j is Gershgorin's bound (on columns): every eigenvalue of K is <= it. Squares and
    absolute values accumulate row by row into per-column sums.
    """
    n, m = K.shape
    sq = np.zeros(m)
    ab = np.zeros(m)
    tr = 0.0
    for i in range(n):
        row = K[i]
        tr += np.float64(row[i])
        for j in range(m):
            v = np.float64(row[j])
            sq[j] += v * v
            ab[j] += abs(v)
    s = 0.0
    for j in range(m):
        s += sq[j]
    return tr, np.sqrt(s), ab


@numba.njit(cache=True, nogil=True)
def _symv(K, v, w):
    """w = K v for symmetric K, as w = sum_j v_j K[j, :] (K^T v), in float64."""
    w[:] = 0.0
    for j in range(K.shape[0]):
        vj = v[j]
        row = K[j]
        for i in range(K.shape[1]):
            w[i] += vj * np.float64(row[i])


@numba.njit(cache=True, nogil=True)
def _orthogonalise(w, V, k):
    """w -= V[:k]^T (V[:k] w), twice (classical Gram-Schmidt with reorthogonalisation)."""
    for _ in range(2):
        for q in range(k):
            c = 0.0
            for i in range(w.shape[0]):
                c += V[q, i] * w[i]
            for i in range(w.shape[0]):
                w[i] -= c * V[q, i]


@numba.njit(cache=True, nogil=True)
def _probe(n, seed):
    """A fixed positive pseudo-random vector (golden-ratio sequence); seed picks the sequence."""
    v = np.empty(n)
    for i in range(n):
        t = (i + 1) * 0.6180339887498949 + seed * 0.7548776662466927
        v[i] = 1.0 + (t - np.floor(t))
    return v


@numba.njit(cache=True, nogil=True)
def _top_ritz(alpha, beta, k):
    """Largest eigenvalue and its unit eigenvector of the k x k Lanczos tridiagonal T."""
    T = np.zeros((k, k))
    for q in range(k):
        T[q, q] = alpha[q]
        if q + 1 < k:
            T[q, q + 1] = beta[q]
            T[q + 1, q] = beta[q]
    vals, vecs = np.linalg.eigh(T)
    return vals[k - 1], vecs[:, k - 1].copy()


@numba.njit(cache=True, nogil=True)
def _lanczos_cycle(K, v, tol, upper):
    """Up to _LANCZOS_STEPS Lanczos steps on symmetric K from unit v, fully reorthogonalised.

    After step k the top Ritz pair (theta, y = V_k s) of the tridiagonal T_k has the residual
    ||K y - theta y|| = beta_k |s_k| (exact up to rounding with full reorthogonalisation); the
    cycle stops once that is <= tol * theta, or once the known bound ``upper`` >= lambda_max is
    itself within a factor (1 + tol) of theta. A Krylov space that becomes invariant (beta ~ 0) is
    the whole space when k = n (residual 0); otherwise the basis continues from a fixed probe
    orthogonal to it (T becomes block diagonal) and the residual counts as unknown (inf): the
    rest of the space is unexplored. The convergence test runs after every step up to 8, then every
    4th (the eigensolve of T_k, O(k^3), cost more than the matrix products for slowly converging K).
    Returns (theta, residual, y).
    """
    n = K.shape[0]
    m = min(n, _LANCZOS_STEPS)
    V = np.zeros((m, n))
    alpha = np.zeros(m)
    beta = np.zeros(m)
    V[0] = v
    w = np.empty(n)
    theta, res, s, k = 0.0, np.inf, np.ones(1), 1
    for j in range(m):
        _symv(K, V[j], w)
        alpha[j] = np.dot(V[j], w)
        _orthogonalise(w, V, j + 1)
        b = np.sqrt(np.dot(w, w))
        invariant = b <= 1e-12 * (abs(alpha[j]) + (beta[j - 1] if j > 0 else 0.0))
        k = j + 1
        if k <= 8 or k % 4 == 0 or k == m or invariant:  # eigh costs O(k^3): test less often as k grows
            theta, s = _top_ritz(alpha, beta, k)
            res = np.inf if invariant and k < n else b * abs(s[j])
            if res <= tol * theta or theta * (1.0 + tol) >= upper or k == m:
                break
        if invariant:  # continue from a probe orthogonal to the basis; beta[j] stays 0
            w = _probe(n, k)
            _orthogonalise(w, V, k)
            b = np.sqrt(np.dot(w, w))
        else:
            beta[j] = b
        V[k] = w / b
    y = np.zeros(n)
    for q in range(k):
        y += s[q] * V[q]
    return theta, res, y / np.sqrt(np.dot(y, y))


@numba.njit(cache=True, nogil=True)
def lambda_max(K, tol, colabs):
    """An upper bound on the largest eigenvalue of symmetric K (n x n, float32 or float64), within
    a factor (1 + tol) of it: min(G, theta + ||K y - theta y|| + 8 n eps theta) for the top
    Lanczos Ritz pair (theta, y), G = max_j colabs_j Gershgorin's bound (colabs_j = sum_i |K_ij|,
    from ``trace_fro_colabs``).

    theta <= lambda_max (a Rayleigh quotient), and some eigenvalue lies within the residual
    ||K y - theta y|| of theta; Lanczos starts from colabs (= K 1 for nonnegative K: a positive
    vector one power step from 1, which overlaps the Perron vector), so that eigenvalue is the
    largest one: the value is >= lambda_max and exceeds it by at most tol * theta (plus rounding).
    The iteration stops there, or once G <= (1 + tol) theta (e.g. K ~ c I, where Lanczos finds
    only invariant subspaces), restarting from y every _LANCZOS_STEPS steps; after
    _LANCZOS_RESTARTS restarts the best bound reached is returned. Exact to rounding for
    n <= _LANCZOS_STEPS.
    """
    n = K.shape[0]
    upper = colabs.max()
    if upper == 0.0:
        return 0.0  # K = 0
    y = colabs + upper * 1e-3 * _probe(n, 0)  # positive even where a column is 0
    y /= np.sqrt(np.dot(y, y))
    bound = upper
    for _ in range(_LANCZOS_RESTARTS):
        theta, res, y = _lanczos_cycle(K, y, tol, upper)
        bound = min(bound, theta + res + 8.0 * n * 2.220446049250313e-16 * abs(theta))
        if res <= tol * theta or theta * (1.0 + tol) >= upper:
            break
    return bound
