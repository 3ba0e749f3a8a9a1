"""Numba kernels for the pairwise bases every kernel family is a function of.

Loops are written out (no BLAS) so a Gram matrix is bit-identical whichever process, thread
count or BLAS build computes it: a resumed build must reproduce an uninterrupted one's checksums.
Every entry is summed over features in feature order; the loops run features outside and the
second point innermost over a feature-major copy, so the inner loop is contiguous and vectorises
without changing any entry's summation order. Training matrices come out exactly symmetric since
(a - b)^2 = (b - a)^2 and ab = ba in floating point; computing only a triangle measured 4x slower
(the moving loop bound defeats vectorisation). ``nogil`` lets Dask's threads run them in parallel.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _sqdist_rows(Xt, Zt):
    """D[i, j] = sum_k (Xt[k, i] - Zt[k, j])^2 over feature-major Xt (d, n), Zt (d, m)."""
    d, n = Xt.shape
    m = Zt.shape[1]
    D = np.zeros((n, m), dtype=np.float64)
    for i in range(n):
        row = D[i]
        for k in range(d):
            x = Xt[k, i]
            z = Zt[k]
            for j in range(m):
                t = x - z[j]
                row[j] += t * t
    return D


@numba.njit(cache=True, nogil=True)
def _dot_rows(Xt, Zt):
    """G[i, j] = sum_k Xt[k, i] Zt[k, j] over feature-major Xt (d, n), Zt (d, m)."""
    d, n = Xt.shape
    m = Zt.shape[1]
    G = np.zeros((n, m), dtype=np.float64)
    for i in range(n):
        row = G[i]
        for k in range(d):
            x = Xt[k, i]
            z = Zt[k]
            for j in range(m):
                row[j] += x * z[j]
    return G


def _feature_major(X: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(X.T, dtype=np.float64)


def sqdist(X: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """D[i, j] = ||X[i] - Z[j]||^2, float64, summed in feature order."""
    return _sqdist_rows(_feature_major(X), _feature_major(Z))


def dot(X: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """G[i, j] = <X[i], Z[j]>, float64, summed in feature order."""
    return _dot_rows(_feature_major(X), _feature_major(Z))
