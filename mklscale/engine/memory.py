"""The engine contract over kernels held in memory: InMemoryEngine (Gram matrices, one (M, n, n)
array) and InMemoryFactorEngine (factors L_m, one (M, n, r) array, K_m = L_m L_m^T).

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


def _stack(arrays, what: str, square: bool) -> np.ndarray:
    arrays = np.asarray(arrays, dtype=np.float64)
    shape = "(M, n, n)" if square else "(M, n, r)"
    if arrays.ndim != 3 or arrays.shape[0] < 1 or (square and arrays.shape[1] != arrays.shape[2]):
        raise InvalidInputError(f"{what} must have shape {shape} with M >= 1; got {arrays.shape}")
    if not np.all(np.isfinite(arrays)):
        raise InvalidInputError(f"{what} contain NaN or inf; every value must be finite")
    return arrays


class _InMemory(KernelEngine):
    """Selection and counters shared by the in-memory engines (``stats``: passes, bytes_read,
    quad_form_calls and block_loads; the last two say how a solver used the engine, tests read them)."""

    def __init__(self, stored: np.ndarray, lambda_max: np.ndarray):
        self._stored = stored
        self.M, self.n = int(stored.shape[0]), int(stored.shape[1])
        self._lambda_max = lambda_max
        self.stats = {"passes": 0, "bytes_read": 0, "quad_form_calls": 0, "block_loads": 0}

    @property
    def lambda_max(self) -> np.ndarray:
        return self._lambda_max.copy()

    @property
    def block_nbytes(self) -> int:
        return self._stored[0].size * 8

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

    def blocks(self, kernels, keep: bool = True) -> np.ndarray:
        idx = validate.kernel_indices(kernels, self.M)
        self.stats["bytes_read"] += int(idx.size) * self.block_nbytes
        self.stats["block_loads"] += int(idx.size)
        return self._stored[idx].copy()


class InMemoryEngine(_InMemory):
    """The engine over ``grams`` of shape (M, n, n) (copied to float64)."""

    def __init__(self, grams):
        grams = _stack(grams, "grams", square=True)
        super().__init__(grams, np.array([np.linalg.eigvalsh(K)[-1] for K in grams], dtype=np.float64))
        self._grams = grams

    @property
    def traces(self) -> np.ndarray:
        return np.trace(self._grams, axis1=1, axis2=2)

    @property
    def frobenius_norms(self) -> np.ndarray:
        return np.sqrt(np.einsum("mij,mij->m", self._grams, self._grams))

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


class InMemoryFactorEngine(_InMemory):
    """The engine over factors ``factors`` of shape (M, n, r) (copied to float64): K_m = L_m L_m^T.

    u^T K_m u = ||L_m^T u||^2, K_m u = L_m (L_m^T u), <K_m, T>_F = trace(L_m^T T L_m),
    <K_a, K_b>_F = ||L_a^T L_b||_F^2 and lambda_max(K_m) = lambda_max(L_m^T L_m) (r x r)."""

    representation = "factor"

    def __init__(self, factors):
        L = _stack(factors, "factors", square=False)
        super().__init__(L, np.array([np.linalg.eigvalsh(F.T @ F)[-1] for F in L], dtype=np.float64))
        self._L = L

    @property
    def rank(self) -> int:
        return int(self._L.shape[2])

    @property
    def traces(self) -> np.ndarray:
        return np.einsum("mir,mir->m", self._L, self._L)

    @property
    def frobenius_norms(self) -> np.ndarray:
        LtL = np.einsum("mir,mis->mrs", self._L, self._L)
        return np.sqrt(np.einsum("mrs,mrs->m", LtL, LtL))

    def quad_forms(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        self.stats["quad_form_calls"] += 1
        U = self._vectors(U)
        idx = self._select(kernels)
        L = self._L[idx]
        if per_kernel:
            P = np.einsum("mi,mir->mr", self._per_kernel(U, idx), L)
            return np.einsum("mr,mr->m", P, P)
        P = np.einsum("ki,mir->mkr", np.atleast_2d(U), L)
        q = np.einsum("mkr,mkr->mk", P, P)
        return q[:, 0] if U.ndim == 1 else q

    def matvecs(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        U = self._vectors(U)
        idx = self._select(kernels)
        L = self._L[idx]
        if per_kernel:
            P = np.einsum("mi,mir->mr", self._per_kernel(U, idx), L)
            return np.einsum("mir,mr->mi", L, P)
        P = np.einsum("ki,mir->mkr", np.atleast_2d(U), L)
        out = np.einsum("mir,mkr->mki", L, P)
        return out[:, 0] if U.ndim == 1 else out

    def frobenius(self, T, kernels=None) -> np.ndarray:
        T = validate.square(T, self.n)
        L = self._L[self._select(kernels)]
        return np.einsum("mir,ij,mjr->m", L, T, L)

    def combine(self, weights) -> np.ndarray:
        F = self._weighted_factors(weights, signed=True)
        return (F[0] * F[1]) @ F[0].T

    def combine_factors(self, weights) -> np.ndarray:
        return self._weighted_factors(weights, signed=False)

    def _weighted_factors(self, weights, signed: bool):
        """(A, s): A = [|w_m|^(1/2) L_m] over w_m != 0 and s the signs per column (``signed``), or
        A alone, refusing negative weights (a factor of sum w_m K_m needs w >= 0)."""
        w = validate.weights(weights, self.M)
        if not signed and np.any(w < 0):
            raise InvalidInputError("combine_factors needs non-negative weights (sqrt(w_m) L_m); "
                                    "use combine(weights) for signed combinations")
        support = np.flatnonzero(w)
        self.stats["bytes_read"] += int(support.size) * self.block_nbytes
        r = self._L.shape[2]
        A = np.concatenate([np.sqrt(abs(w[m])) * self._L[m] for m in support], axis=1) if support.size \
            else np.zeros((self.n, 0))
        return (A, np.repeat(np.sign(w[support]), r)) if signed else A

    def gram_of_kernels(self, kernels=None) -> np.ndarray:
        idx = np.arange(self.M) if kernels is None else validate.kernel_indices(kernels, self.M)
        self.stats["bytes_read"] += int(np.unique(idx).size) * self.block_nbytes
        L = self._L[idx]
        cross = np.einsum("air,bis->abrs", L, L)
        return np.einsum("abrs,abrs->ab", cross, cross)
