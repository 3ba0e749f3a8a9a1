"""Numba kernels for the pairwise bases every kernel family is a function of.

Loops are written out (no BLAS) so a Gram matrix is bit-identical whichever process, thread
count or BLAS build computes it: a resumed build must reproduce an uninterrupted one's checksums.
``nogil`` lets Dask's threads run them in parallel.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def sqdist(X, Z):
    """D[i, j] = ||X[i] - Z[j]||^2, float64, exact summation in feature order."""
    n, d = X.shape
    m = Z.shape[0]
    D = np.empty((n, m), dtype=np.float64)
    for i in range(n):
        for j in range(m):
            s = 0.0
            for k in range(d):
                t = X[i, k] - Z[j, k]
                s += t * t
            D[i, j] = s
    return D


@numba.njit(cache=True, nogil=True)
def dot(X, Z):
    """G[i, j] = <X[i], Z[j]>, float64, summation in feature order."""
    n, d = X.shape
    m = Z.shape[0]
    G = np.empty((n, m), dtype=np.float64)
    for i in range(n):
        for j in range(m):
            s = 0.0
            for k in range(d):
                s += X[i, k] * Z[j, k]
            G[i, j] = s
    return G


@numba.njit(cache=True, nogil=True)
def sqdist_sym(X):
    """sqdist(X, X), computing the upper triangle once and mirroring it (same sums, same order)."""
    n, d = X.shape
    D = np.empty((n, n), dtype=np.float64)
    for i in range(n):
        D[i, i] = 0.0
        for j in range(i + 1, n):
            s = 0.0
            for k in range(d):
                t = X[i, k] - X[j, k]
                s += t * t
            D[i, j] = s
            D[j, i] = s
    return D


@numba.njit(cache=True, nogil=True)
def dot_sym(X):
    """dot(X, X) through the upper triangle, mirrored."""
    n, d = X.shape
    G = np.empty((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(i, n):
            s = 0.0
            for k in range(d):
                s += X[i, k] * X[j, k]
            G[i, j] = s
            G[j, i] = s
    return G
