"""An in-memory stand-in for the mklscale engine, for solver tests.

It implements exactly the engine API the solvers use (the real engine in ``mklscale.engine``
has the same method names) over a dense (M, n, n) float64 array:

    n, M, lambda_max (M,)
    quad_forms(U)                               all kernels, ONE pass: (M,) for U (n,), (M, k) for U (k, n)
    quad_forms(U, kernels=idx)                  a subset, same shapes with len(idx) rows
    quad_forms(U, kernels=idx, per_kernel=True) U (len(idx), n): u_j^T K_{idx[j]} u_j
    matvecs(U, kernels=idx)                     (len(idx), n) K_m u for U (n,); (len(idx), k, n) for
                                                U (k, n); per_kernel=True: row j = K_{idx[j]} U[j]
    blocks(idx)                                 (len(idx), n, n) copies of the kernels
    stats                                       {"passes", "bytes_read", "quad_form_calls", "block_loads"}

kernels=None means all M kernels. "passes" counts the calls that read every kernel (all-kernel
quad_forms, as in the brief; all-kernel matvecs read the whole bank too and are counted the same
way); every call adds the bytes it would have read from a float64 bank to "bytes_read".
"""

from __future__ import annotations

import numpy as np


class DenseEngine:
    """Engine API over in-memory Gram matrices ``grams`` of shape (M, n, n)."""

    def __init__(self, grams):
        grams = np.asarray(grams, dtype=np.float64)
        if grams.ndim != 3 or grams.shape[1] != grams.shape[2]:
            raise ValueError(f"grams must have shape (M, n, n), got {grams.shape}")
        self._grams = grams
        self.M, self.n = grams.shape[0], grams.shape[1]
        self.lambda_max = np.array([np.linalg.eigvalsh(K)[-1] for K in grams], dtype=np.float64)
        self.stats = {"passes": 0, "bytes_read": 0, "quad_form_calls": 0, "block_loads": 0}

    def _kernel_bytes(self, count: int) -> int:
        return int(count) * self.n * self.n * 8

    def _indices(self, kernels) -> np.ndarray:
        idx = np.asarray(kernels, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.M):
            raise IndexError(f"kernel indices out of range [0, {self.M})")
        return idx

    def _select(self, kernels) -> np.ndarray:
        if kernels is None:
            self.stats["passes"] += 1
            return np.arange(self.M)
        return self._indices(kernels)

    def _check_per_kernel(self, U, idx) -> None:
        if U.shape != (idx.size, self.n):
            raise ValueError(f"per_kernel U must have shape ({idx.size}, {self.n}), got {U.shape}")

    def quad_forms(self, U, kernels=None, per_kernel=False):
        U = np.asarray(U, dtype=np.float64)
        self.stats["quad_form_calls"] += 1
        idx = self._select(kernels)
        self.stats["bytes_read"] += self._kernel_bytes(idx.size)
        grams = self._grams[idx]
        if per_kernel:
            self._check_per_kernel(U, idx)
            return np.einsum("mi,mij,mj->m", U, grams, U)
        if U.ndim == 1:
            if U.shape[0] != self.n:
                raise ValueError(f"u must have length {self.n}, got {U.shape[0]}")
            return np.einsum("i,mij,j->m", U, grams, U)
        if U.ndim != 2 or U.shape[1] != self.n:
            raise ValueError(f"U must have shape (k, {self.n}), got {U.shape}")
        return np.einsum("ki,mij,kj->mk", U, grams, U)

    def matvecs(self, U, kernels=None, per_kernel=False):
        U = np.asarray(U, dtype=np.float64)
        idx = self._select(kernels)
        self.stats["bytes_read"] += self._kernel_bytes(idx.size)
        grams = self._grams[idx]
        if per_kernel:
            self._check_per_kernel(U, idx)
            return np.einsum("mij,mj->mi", grams, U)
        if U.ndim == 1:
            return np.einsum("mij,j->mi", grams, U)
        return np.einsum("mij,kj->mki", grams, U)

    def blocks(self, idx):
        idx = self._indices(idx)
        self.stats["bytes_read"] += self._kernel_bytes(idx.size)
        self.stats["block_loads"] += int(idx.size)
        return self._grams[idx].copy()
