"""InMemoryEngine: the engine contract over Gram matrices held in memory as one (M, n, n) array.

For small problems, tests and arrays a user already has; every operation is a numpy einsum over
the float64 stack, so it doubles as the readable statement of what each operation computes. The
counters follow the streaming engine's rules: a call over all kernels (``kernels=None``) is a pass,
and every call adds the bytes the kernels it touches would take in float64.
"""

from __future__ import annotations

import numpy as np

from mklscale.engine import validate
from mklscale.engine.contract import Counters, KernelEngine
from mklscale.errors import InvalidInputError

#: Kernels summed per step in ``combine`` (the order of the additions is part of the result's bits).
COMBINE_CHUNK = 8


class InMemoryEngine(KernelEngine):
    """The engine over ``grams`` of shape (M, n, n) (copied to float64).

    ``stats`` holds passes, bytes_read, quad_form_calls and block_loads (the last two say how a
    solver used the engine; tests read them).
    """

    def __init__(self, grams):
        grams = np.asarray(grams, dtype=np.float64)
        if grams.ndim != 3 or grams.shape[1] != grams.shape[2] or grams.shape[0] < 1:
            raise InvalidInputError(f"grams must have shape (M, n, n) with M >= 1; got {grams.shape}")
        if not np.all(np.isfinite(grams)):
            raise InvalidInputError("grams contain NaN or inf; every kernel value must be finite")
        self._grams = grams
        self.M, self.n = int(grams.shape[0]), int(grams.shape[1])
        self._lambda_max = np.array([np.linalg.eigvalsh(K)[-1] for K in grams], dtype=np.float64)
        self.stats = {"passes": 0, "bytes_read": 0, "quad_form_calls": 0, "block_loads": 0}

    @property
    def lambda_max(self) -> np.ndarray:
        return self._lambda_max.copy()

    @property
    def traces(self) -> np.ndarray:
        return np.trace(self._grams, axis1=1, axis2=2)

    @property
    def frobenius_norms(self) -> np.ndarray:
        return np.sqrt(np.einsum("mij,mij->m", self._grams, self._grams))

    @property
    def block_nbytes(self) -> int:
        return self.n * self.n * 8

    def counters(self) -> Counters:
        return Counters(self.stats["passes"], self.stats["bytes_read"])

    # ---- selection and bookkeeping --------------------------------------------------------------
    def _select(self, kernels) -> np.ndarray:
        """Kernel indices; None (all kernels) counts a pass. Adds the bytes they take."""
        if kernels is None:
            self.stats["passes"] += 1
            idx = np.arange(self.M)
        else:
            idx = validate.kernel_indices(kernels, self.M)
        self.stats["bytes_read"] += int(idx.size) * self.block_nbytes
        return idx

    def _per_kernel(self, U, idx) -> np.ndarray:
        if U.shape != (idx.size, self.n):
            raise InvalidInputError(f"per_kernel U must have shape ({idx.size}, {self.n}); got {U.shape}")
        return U

    def _vectors(self, U) -> np.ndarray:
        U = np.asarray(U, dtype=np.float64)
        if U.ndim not in (1, 2) or U.shape[-1] != self.n:
            raise InvalidInputError(f"U must have shape ({self.n},) or (k, {self.n}); got {U.shape}")
        return U

    # ---- the operations -------------------------------------------------------------------------
    def quad_forms(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        self.stats["quad_form_calls"] += 1
        U = self._vectors(U)
        idx = self._select(kernels)
        grams = self._grams[idx]
        if per_kernel:
            return np.einsum("mi,mij,mj->m", self._per_kernel(U, idx), grams, U)
        if U.ndim == 1:
            return np.einsum("i,mij,j->m", U, grams, U)
        return np.einsum("ki,mij,kj->mk", U, grams, U)

    def matvecs(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        U = self._vectors(U)
        idx = self._select(kernels)
        grams = self._grams[idx]
        if per_kernel:
            return np.einsum("mij,mj->mi", grams, self._per_kernel(U, idx))
        if U.ndim == 1:
            return np.einsum("mij,j->mi", grams, U)
        return np.einsum("mij,kj->mki", grams, U)

    def frobenius(self, T, kernels=None) -> np.ndarray:
        T = validate.square(T, self.n)
        return np.einsum("mij,ij->m", self._grams[self._select(kernels)], T)

    def combine(self, weights) -> np.ndarray:
        w = validate.weights(weights, self.M)
        support = np.flatnonzero(w)
        self.stats["bytes_read"] += int(support.size) * self.block_nbytes
        out = np.zeros((self.n, self.n))
        for start in range(0, support.size, COMBINE_CHUNK):
            idx = support[start:start + COMBINE_CHUNK]
            out += np.einsum("m,mij->ij", w[idx], self._grams[idx])
        return out

    def gram_of_kernels(self, kernels=None) -> np.ndarray:
        idx = np.arange(self.M) if kernels is None else validate.kernel_indices(kernels, self.M)
        self.stats["bytes_read"] += int(np.unique(idx).size) * self.block_nbytes
        grams = self._grams[idx]
        return np.einsum("aij,bij->ab", grams, grams)

    def blocks(self, kernels, keep: bool = True) -> np.ndarray:
        idx = validate.kernel_indices(kernels, self.M)
        self.stats["bytes_read"] += int(idx.size) * self.block_nbytes
        self.stats["block_loads"] += int(idx.size)
        return self._grams[idx].copy()
