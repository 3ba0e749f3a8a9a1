"""Numba kernels of passes over factor banks: K_m = L_m L_m^T with L_m (n, r) stored (float32 or float64).

Every quantity has one fixed summation order, independent of the task, thread or worker that runs
it and of whether L_m comes from disk (float32, widened exactly: every product is taken in float64,
never float32 x float32) or from the driver's cache, so
factor passes are bit-identical under any scheduling, as dense ones are (``kernels``):

- projection, k vectors U (k, n):   P = U L,  P[j, c] = ((0 + U[j,0] L[0,c]) + U[j,1] L[1,c]) + ...
                                     (rows added in order, one panel after another)
- quad forms:                        q_j = sum_c P[j, c]^2 (c in order)  = ||L^T u_j||^2 = u_j^T K u_j
- matvec:                            (K u_j)_i = sum_c L[i, c] P[j, c] (c in order)
- <K_a, K_b>_F = ||L_a^T L_b||_F^2:  C = L_a^T L_b accumulated over rows in order, then sum C^2
- <K, T>_F = sum_i sum_c L[i, c] (T L)[i, c], (T L)[i, c] = sum_l T[i, l] L[l, c] (l in order)
- weighted sum (combine):            S += A A^T, A = [sqrt(w_m) L_m] over one combine block (one float64
                                     BLAS product, the order the library takes for the block's shapes)

Costs per kernel: O(n r k) for quad forms and matvecs (against O(n^2 k) dense), O(n r^2) per pair
for the Gram of kernels; only ``frobenius`` and ``combine`` produce or read n x n arrays (small n).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mklscale.simd import vdot

_opts = dict(nogil=True, cache=True, error_model="numpy")


@njit(**_opts)
def project(L, r0, U, P):
    """P[j, :] += sum_i U[j, r0 + i] L[i, :] over the rows i of panel L (rows, r), in order."""
    rows, r = L.shape
    for j in range(U.shape[0]):
        for i in range(rows):
            a = U[j, r0 + i]
            for c in range(r):
                P[j, c] += a * L[i, c]


@njit(**_opts)
def sum_squares(P, out):
    """out[j] = sum_c P[j, c]^2: the quad forms once P = U L is complete."""
    for j in range(P.shape[0]):
        s = 0.0
        for c in range(P.shape[1]):
            s += P[j, c] * P[j, c]
        out[j] = s


@njit(**_opts)
def expand(L, r0, P, out):
    """out[j, r0 + i] = sum_c L[i, c] P[j, c]: rows of K u_j = L (L^T u_j) for the panel L."""
    rows, r = L.shape
    for j in range(P.shape[0]):
        for i in range(rows):
            s = 0.0
            for c in range(r):
                s += L[i, c] * P[j, c]
            out[j, r0 + i] = s


@njit(**_opts)
def cross_products(A, B, C, upper):
    """C[a, b] += A[a]^T B[b] ((r, r) each) over the rows of panels A (ca, rows, r) and B (cb, rows, r),
    rows in order; with ``upper`` (same kernels) only b >= a."""
    ca, rows, r = A.shape
    for a in range(ca):
        for b in range(a if upper else 0, B.shape[0]):
            for i in range(rows):
                for c in range(r):
                    x = np.float64(A[a, i, c])
                    for e in range(r):
                        C[a, b, c, e] += x * np.float64(B[b, i, e])


@njit(**_opts)
def frobenius_squares(C, G, upper):
    """G[a, b] = ||C[a, b]||_F^2 (C = L_a^T L_b), entries in order."""
    for a in range(C.shape[0]):
        for b in range(a if upper else 0, C.shape[1]):
            s = 0.0
            for c in range(C.shape[2]):
                for e in range(C.shape[3]):
                    s += C[a, b, c, e] * C[a, b, c, e]
            G[a, b] = s


@njit(**_opts)
def frobenius_with(L, T):
    """<L L^T, T>_F = sum_i sum_c L[i, c] (T L)[i, c] for a dense (n, n) T."""
    n, r = L.shape
    s = 0.0
    t = np.empty(r)
    for i in range(n):
        t[:] = 0.0
        for l in range(n):          # (T L)[i, c] with l in order, for all c at once (vectorises)
            a = T[i, l]
            for c in range(r):
                t[c] += a * L[l, c]
        for c in range(r):
            s += L[i, c] * t[c]
    return s


@njit(**_opts)
def each_matvec(L, A, out):
    """out[m] = L_m (L_m^T a_m) for the factors L (c, n, r) (C-contiguous) and one vector per kernel A (c, n):
    the projection as in ``project`` (rows in order), each entry of the expansion a 16-lane ``vdot``
    (the held kernels' products, on float32 or float64 factors without a widened copy: ~5x the
    float64 einsums at r = 64 and 256)."""
    c, n, r = L.shape
    P = np.empty((1, r))
    for m in range(c):
        P[:] = 0.0
        project(L[m], 0, A[m:m + 1], P)
        for i in range(n):
            out[m, i] = vdot(L, (m * n + i) * r, P, 0, r)


def add_weighted_outer(blocks, weights, out):
    """out += sum_c w_c L_c L_c^T (n, n) over one block of kernels, as one BLAS product of the side-by-side
    float64 factors: A A^T with A = [sqrt(w_c) L_c] (a symmetric rank-k update) when every w_c >= 0, else
    A B^T with B = [sign(w_c) sqrt|w_c| L_c]: n^2 sum_c r_c multiply-adds at the float64 BLAS rate
    (engine.combine of 30 kernels at n = 1000: 2x the per-kernel loop it replaced at rank 64, 2.8x at 256). The
    summation order is the library's for the block's shapes, fixed by the block alone; the driver's
    cached path and the tasks call this with the same block, so their bits agree."""
    scale = np.sqrt(np.abs(np.asarray(weights, dtype=np.float64)))
    A = np.concatenate([s * np.asarray(L, dtype=np.float64) for s, L in zip(scale, blocks)], axis=1)
    if np.all(np.asarray(weights) >= 0):
        out += A @ A.T
    else:
        signs = np.repeat(np.sign(weights), [L.shape[1] for L in blocks])
        out += A @ (A * signs).T
