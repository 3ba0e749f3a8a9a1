"""Numba chunk kernels: fold a row panel of one kernel into float64 results.

A panel is rows r0..r1-1 of a kernel K (an (r1 - r0, n) C-contiguous array, float32 or float64).
Every quantity below is defined with one fixed summation order that does not depend on how the
rows are split into panels, on which task or thread runs it, or on whether K arrives as float32
from disk or float64 from the driver's cache (float32 -> float64 is exact). That is what makes
passes bit-identical under any scheduling. With ``vdot`` the 16-lane dot product of ``simd``:

- quad forms, k vectors U (k, n):    V = U K accumulated over rows l in order,
                                     V[j, i] = (((0 + U[j,0] K[0,i]) + U[j,1] K[1,i]) + ...),
                                     q_j = vdot(U[j], V[j])  = u_j^T K u_j
- matvec:                            (K u)_i = vdot(K[i], u)
- Frobenius product <K, T>_F:        s = (((0 + vdot(K[0], T[0])) + vdot(K[1], T[1])) + ...)
- weighted sum (combine):            S[i, l] += w K[i, l], kernels in the order given
- kernel alignment <K_a, K_b>_F:     as the Frobenius product with T = K_b

All functions are ``nogil`` (Dask threads run them in parallel) and single-threaded (Dask already
parallelises across tasks).
"""

from __future__ import annotations

from numba import njit

from mklscale.simd import tile_ukv, vdot

#: Rows per sub-panel in the quad-form sweep of a panel in L2 (just copied there by the reader):
#: the sub-panel (<= 128 rows) stays in L2 while every 16-column strip of it is swept for all vectors.
ROW_BLOCK = 128
#: The same straight from memory (a mapped bank): few enough rows that the strips' interleaved row
#: streams stay within what the hardware prefetchers follow (measured: 2x the 128-row sweep at k = 16).
MAPPED_ROW_BLOCK = 16

_opts = dict(nogil=True, cache=True, error_model="numpy")


@njit(**_opts)
def _strip_groups(tj):
    """16-column groups per tile for tj vectors (measured best; tj * groups <= 8)."""
    if tj == 1:
        return 4
    if tj <= 4:
        return 2
    return 1


@njit(**_opts)
def quad_accumulate(P, l0, Ut, V, S, row_block):
    """V[j, :] += sum_{l < rows} Ut[l0 + l, j] * P[l, :], adding rows one at a time, in order.

    P (rows, n) panel holding rows l0.. of a kernel; Ut (n, k) = U^T; V (k, n) float64
    accumulators (zero before the first panel of a kernel); S (8, 16) float64 scratch;
    row_block: rows per sub-panel (ROW_BLOCK or MAPPED_ROW_BLOCK; the sums do not depend on it).
    """
    r, n = P.shape
    k = Ut.shape[1]
    if n < 16:
        for l in range(r):
            for j in range(k):
                a = Ut[l0 + l, j]
                for i in range(n):
                    V[j, i] += a * P[l, i]
        return
    for b0 in range(0, r, row_block):
        rb = min(row_block, r - b0)
        j0 = 0
        while j0 < k:
            tj = min(8, k - j0)
            nv = _strip_groups(tj)
            urow = (l0 + b0) * k + j0
            i0 = 0
            while i0 + 16 * nv <= n:
                tile_ukv(P, b0 * n + i0, n, Ut, urow, k, V, j0 * n + i0, n, rb, tj, nv)
                i0 += 16 * nv
            while i0 + 16 <= n:
                tile_ukv(P, b0 * n + i0, n, Ut, urow, k, V, j0 * n + i0, n, rb, tj, 1)
                i0 += 16
            if i0 < n:
                # last n - i0 (< 16) columns: sweep the 16 columns ending at n into scratch, keep the tail
                for j in range(tj):
                    for c in range(16):
                        S[j, c] = V[j0 + j, n - 16 + c]
                tile_ukv(P, b0 * n + n - 16, n, Ut, urow, k, S, 0, 16, rb, tj, 1)
                for j in range(tj):
                    for c in range(16 - (n - i0), 16):
                        V[j0 + j, n - 16 + c] = S[j, c]
            j0 += tj


@njit(**_opts)
def quad_stream(P, l0, Ut, V):
    """The same sums as ``quad_accumulate``, bit for bit (row l's terms are added to every column
    in order of l), but sweeping P once, row after row, over all columns. For a panel read
    straight from memory (the mapped reader): a front-to-back sweep is what the hardware
    prefetchers stream at full bandwidth, where the register tiles re-read a 128-row block strip by
    strip, at memory latency unless a copy has just put it in L2. Best for few vectors (V's k rows
    are loaded and stored once per row of P)."""
    r, n = P.shape
    for l in range(r):
        for j in range(Ut.shape[1]):
            a = Ut[l0 + l, j]
            for i in range(n):
                V[j, i] += a * P[l, i]


@njit(**_opts)
def quad_finish(U, V, out):
    """out[j] = vdot(U[j], V[j]) = u_j^T K u_j once V = U K is complete."""
    k, n = U.shape
    for j in range(k):
        out[j] = vdot(U, j * n, V, j * n, n)


@njit(**_opts)
def quad_kernels(Kb, U, Ut, out, V, S, stream, row_block):
    """Quad forms of whole kernels Kb (c, n, n) with the same k vectors: out (c, k); ``stream``
    sweeps with ``quad_stream`` instead of ``quad_accumulate(..., row_block)`` (same bits)."""
    for c in range(Kb.shape[0]):
        V[:] = 0.0
        if stream:
            quad_stream(Kb[c], 0, Ut, V)
        else:
            quad_accumulate(Kb[c], 0, Ut, V, S, row_block)
        quad_finish(U, V, out[c])


@njit(**_opts)
def matvec_rows(P, r0, U, out):
    """out[j, r0 + i] = vdot(P[i], U[j]) = (K u_j)_{r0 + i} for the rows of panel P."""
    r, n = P.shape
    for i in range(r):
        for j in range(U.shape[0]):
            out[j, r0 + i] = vdot(P, i * n, U, j * n, n)


@njit(**_opts)
def frob_rows(P, r0, T, s):
    """s + sum_i vdot(P[i], T[r0 + i]), rows added in order: <K, T>_F accumulated over a panel."""
    r, n = P.shape
    for i in range(r):
        s += vdot(P, i * n, T, (r0 + i) * n, n)
    return s


@njit(**_opts)
def axpy_rows(P, r0, w, out):
    """out[r0 + i, :] += w * P[i, :] (combine: one kernel's weighted rows)."""
    r, n = P.shape
    for i in range(r):
        for l in range(n):
            out[r0 + i, l] += w * P[i, l]


@njit(**_opts)
def gram_rows(A, B, G, upper):
    """G[a, b] += sum_i vdot(A[a, i], B[b, i]) over the panel rows i, in order.

    A (ca, rows, n) and B (cb, rows, n) hold the same rows of two sets of kernels. With
    ``upper`` (A and B are the same set) only b >= a is computed.
    """
    ca, r, n = A.shape
    cb = B.shape[0]
    for a in range(ca):
        for b in range(a if upper else 0, cb):
            s = G[a, b]
            for i in range(r):
                s += vdot(A, (a * r + i) * n, B, (b * r + i) * n, n)
            G[a, b] = s


@njit(**_opts)
def principal_submatrices(S, rows, out):
    """out[a] = S[a][rows][:, rows] for a stack S (c, n, n): a row-subset view's kernels (CV folds);
    one gather pass, ~5x numpy's two takes."""
    p = rows.size
    for a in range(S.shape[0]):
        for i in range(p):
            src = S[a, rows[i]]
            dst = out[a, i]
            for j in range(p):
                dst[j] = src[rows[j]]


@njit(**_opts)
def stack_matvec(B, U, out):
    """out[m, j] = K_m u_j for the kernels B (c, n, n) and vectors U (k, n): out (c, k, n) float64,
    each entry a float64 dot product (``matvec_rows``; a float32 B is widened exactly)."""
    for m in range(B.shape[0]):
        matvec_rows(B[m], 0, U, out[m])


@njit(**_opts)
def each_matvec(B, A, out):
    """out[m] = K_m a_m for the kernels B (c, n, n) and one vector per kernel A (c, n)."""
    for m in range(B.shape[0]):
        matvec_rows(B[m], 0, A[m:m + 1], out[m:m + 1])
