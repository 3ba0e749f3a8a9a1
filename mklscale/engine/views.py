"""Views of an engine: the same contract over a subset of its training rows or of its kernels.

- :class:`RowSubsetEngine` restricts every kernel to the principal submatrix K[rows][:, rows]
  (cross-validation folds train on one without rebuilding the bank); of a factor engine, to the
  factor rows L[rows] (K[rows][:, rows] = L[rows] L[rows]^T). u^T K[r, r] u = pad(u)^T K pad(u),
  with pad placing u at ``rows`` and zeros elsewhere, so an all-kernel quad_forms is still one pass
  of the underlying bank. ``lambda_max`` stays the full kernels': by Cauchy interlacing it bounds
  every principal submatrix's, which is all solvers use it for (step sizes, inactivity bounds).
- :class:`KernelSubsetEngine` exposes the kernels ``kernels`` of an engine as kernels 0..p-1.
"""

from __future__ import annotations

import numpy as np

from mklscale.engine import validate
from mklscale.engine.contract import Counters, KernelEngine
from mklscale.errors import InvalidInputError


def _check_engine(engine) -> KernelEngine:
    if not isinstance(engine, KernelEngine):
        raise InvalidInputError(f"a view needs a KernelEngine (Engine, InMemoryEngine or a view); "
                                f"got {type(engine).__name__}")
    return engine


class RowSubsetEngine(KernelEngine):
    """``engine`` restricted to the training rows ``rows`` (at least 2 distinct indices)."""

    def __init__(self, engine, rows):
        self.engine = _check_engine(engine)
        full_n = int(engine.n)
        rows = np.asarray(rows).reshape(-1)
        if rows.size and not np.issubdtype(rows.dtype, np.integer):
            raise InvalidInputError(f"rows must be integer indices; got dtype {rows.dtype}")
        rows = rows.astype(np.int64)
        if rows.size < 2 or rows.min() < 0 or rows.max() >= full_n or np.unique(rows).size != rows.size:
            raise InvalidInputError(f"rows must be at least 2 distinct indices in [0, {full_n}); got "
                                    f"{rows.size} indices")
        self.rows, self.full_n = rows, full_n
        self.n, self.M = int(rows.size), int(engine.M)
        self.representation = engine.representation

    @property
    def rank(self) -> int | None:
        return self.engine.rank

    @property
    def lambda_max(self) -> np.ndarray:
        return self.engine.lambda_max

    @property
    def traces(self) -> np.ndarray:
        return self._per_kernel(self.kernel_representation.traces)

    @property
    def frobenius_norms(self) -> np.ndarray:
        return self.kernel_representation.subset_frobenius_norms(self)

    def _per_kernel(self, stat, chunk: int = 8) -> np.ndarray:
        """stat of every kernel's principal submatrix, ``chunk`` kernels read at a time."""
        out = np.empty(self.M)
        for start in range(0, self.M, chunk):
            idx = np.arange(start, min(start + chunk, self.M))
            out[idx] = stat(np.asarray(self.blocks(idx, keep=False), dtype=np.float64))
        return out

    @property
    def block_nbytes(self) -> int:
        rep = self.kernel_representation
        itemsize = self.engine.block_nbytes // int(np.prod(rep.block_shape(self.full_n, self.rank)))
        return int(np.prod(rep.block_shape(self.n, self.rank))) * itemsize

    @property
    def working_set_budget(self) -> int | None:
        return self.engine.working_set_budget

    @property
    def stats(self) -> dict:
        return self.engine.stats

    def counters(self) -> Counters:
        return self.engine.counters()

    def _pad(self, U) -> np.ndarray:
        U = np.asarray(U, dtype=np.float64)
        if U.shape[-1] != self.n:
            raise InvalidInputError(f"vectors must have length n={self.n}; got shape {U.shape}")
        out = np.zeros(U.shape[:-1] + (self.full_n,))
        out[..., self.rows] = U
        return out

    def quad_forms(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        return self.engine.quad_forms(self._pad(U), kernels=kernels, per_kernel=per_kernel)

    def matvecs(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        out = self.engine.matvecs(self._pad(U), kernels=kernels, per_kernel=per_kernel)
        return np.asarray(out)[..., self.rows]

    def frobenius(self, T, kernels=None) -> np.ndarray:
        T = validate.square(T, self.n)
        padded = np.zeros((self.full_n, self.full_n))
        padded[self.rows[:, None], self.rows[None, :]] = T
        return self.engine.frobenius(padded, kernels=kernels)

    def combine(self, weights) -> np.ndarray:
        w = validate.weights(weights, self.M)
        return self.kernel_representation.subset_combine(self.engine, w, self.rows)

    def combine_factors(self, weights) -> np.ndarray:
        return self.engine.combine_factors(weights)[self.rows]

    def gram_of_kernels(self, kernels=None) -> np.ndarray:
        idx = np.arange(self.M) if kernels is None else validate.kernel_indices(kernels, self.M)
        return self.kernel_representation.gram_fixed(np.asarray(self.blocks(idx, keep=False)))

    def blocks(self, kernels, keep: bool = True) -> np.ndarray:
        return self.kernel_representation.restrict(np.asarray(self.engine.blocks(kernels, keep=keep)), self.rows)


class KernelSubsetEngine(KernelEngine):
    """The kernels ``kernels`` (distinct indices) of ``engine``, renumbered 0..p-1.

    A call over all of the view's kernels counts as a pass of the view (the underlying engine sees
    a read of those kernels only); bytes are the underlying engine's.
    """

    def __init__(self, engine, kernels):
        self.engine = _check_engine(engine)
        idx = validate.kernel_indices(kernels, int(engine.M))
        if idx.size < 1 or np.unique(idx).size != idx.size:
            raise InvalidInputError(f"kernels must be at least one distinct index in [0, {engine.M}); "
                                    f"got {idx.size} indices")
        self.kernels = idx
        self.n, self.M = int(engine.n), int(idx.size)
        self.representation = engine.representation
        self._passes = 0

    @property
    def rank(self) -> int | None:
        return self.engine.rank

    @property
    def lambda_max(self) -> np.ndarray:
        return self.engine.lambda_max[self.kernels]

    @property
    def traces(self) -> np.ndarray:
        return self.engine.traces[self.kernels]

    @property
    def frobenius_norms(self) -> np.ndarray:
        return self.engine.frobenius_norms[self.kernels]

    @property
    def block_nbytes(self) -> int:
        return self.engine.block_nbytes

    @property
    def working_set_budget(self) -> int | None:
        return self.engine.working_set_budget

    def counters(self) -> Counters:
        return Counters(self._passes, self.engine.counters().bytes_read)

    def _map(self, kernels) -> np.ndarray:
        if kernels is None:
            self._passes += 1
            return self.kernels
        return self.kernels[validate.kernel_indices(kernels, self.M)]

    def quad_forms(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        return self.engine.quad_forms(U, kernels=self._map(kernels), per_kernel=per_kernel)

    def matvecs(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        return self.engine.matvecs(U, kernels=self._map(kernels), per_kernel=per_kernel)

    def frobenius(self, T, kernels=None) -> np.ndarray:
        return self.engine.frobenius(T, kernels=self._map(kernels))

    def _full_weights(self, weights) -> np.ndarray:
        full = np.zeros(self.engine.M)
        full[self.kernels] = validate.weights(weights, self.M)
        return full

    def combine(self, weights) -> np.ndarray:
        return self.engine.combine(self._full_weights(weights))

    def combine_factors(self, weights) -> np.ndarray:
        """Factors in the underlying engine's index order (F F^T does not depend on the order)."""
        return self.engine.combine_factors(self._full_weights(weights))

    def gram_of_kernels(self, kernels=None) -> np.ndarray:
        idx = self.kernels if kernels is None else self.kernels[validate.kernel_indices(kernels, self.M)]
        return self.engine.gram_of_kernels(idx)

    def blocks(self, kernels, keep: bool = True) -> np.ndarray:
        return self.engine.blocks(self.kernels[validate.kernel_indices(kernels, self.M)], keep=keep)
