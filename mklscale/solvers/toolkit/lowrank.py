"""Low-rank linear algebra of working sets: pivoted Cholesky factors of dense kernels, and solves
with "diagonal plus low rank" matrices (Woodbury), issue 17.

* :func:`pivoted_cholesky`: K ~ L L^T (n x r) with greedy diagonal pivoting (Harbrecht, Peters and
  Schneider 2012), stopped when the trace of the residual K - L L^T (PSD) is <= ``tol`` trace(K);
  O(n r^2) time, reads one column of K per step. Returns None once r would exceed ``max_rank``.
* :func:`woodbury_solve`: x = (D + F F^T)^{-1} b for a positive diagonal D and F (n x R):
  with F~ = D^{-1/2} F, (D + F F^T)^{-1} = D^{-1/2} (I - F~ (I + F~^T F~)^{-1} F~^T) D^{-1/2},
  one R x R Cholesky (O(n R^2 + R^3)), never an n x n matrix. The capacitance I + F~^T F~ has
  eigenvalues >= 1, so the solve is as accurate as the diagonal scaling allows.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg


def pivoted_cholesky(K: np.ndarray, tol: float, max_rank: int) -> np.ndarray | None:
    """(n, r) float64 L with trace(K - L L^T) <= tol * trace(K), or None if r > ``max_rank``."""
    n = K.shape[0]
    diag = np.diagonal(K).astype(np.float64).copy()
    total = float(diag.sum())
    if total <= 0.0:
        return np.zeros((n, 0))
    L = np.zeros((n, min(max_rank, n)))
    for j in range(n):
        if float(np.sum(np.maximum(diag, 0.0))) <= tol * total:
            return L[:, :j].copy()
        if j >= L.shape[1]:
            return None
        i = int(np.argmax(diag))
        pivot = diag[i]
        if pivot <= 0.0:
            return L[:, :j].copy()
        col = K[:, i].astype(np.float64) - L[:, :j] @ L[i, :j]
        L[:, j] = col / np.sqrt(pivot)
        diag -= L[:, j] ** 2
        diag[i] = 0.0
    return L


class Woodbury:
    """(D + F F^T)^{-1} for a positive diagonal D and F (n, R), factored once (module docstring):
    :meth:`solve` costs O(n R) per right-hand side after the O(n R^2 + R^3) set-up."""

    def __init__(self, diag: np.ndarray, F: np.ndarray):
        self.scale = 1.0 / np.sqrt(diag)
        self.Ft = F * self.scale[:, None]
        self.factor = None
        if self.Ft.shape[1]:
            cap = self.Ft.T @ self.Ft
            cap[np.diag_indices_from(cap)] += 1.0
            self.factor = scipy.linalg.cho_factor(cap, check_finite=False)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """(D + F F^T)^{-1} rhs, rhs (n,) or (n, k)."""
        s = self.scale if rhs.ndim == 1 else self.scale[:, None]
        b = rhs * s
        if self.factor is not None:
            b = b - self.Ft @ scipy.linalg.cho_solve(self.factor, self.Ft.T @ b, check_finite=False)
        return b * s


def woodbury_solve(diag: np.ndarray, F: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """(D + F F^T)^{-1} rhs, D = diag(``diag``) > 0, F (n, R), rhs (n,) or (n, k) (module docstring)."""
    return Woodbury(diag, F).solve(rhs)
