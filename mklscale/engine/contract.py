"""The engine contract: everything a solver may ask of a kernel bank, and nothing else.

A solver sees the bank only through a :class:`KernelEngine`. Every implementation (the streaming
:class:`~mklscale.engine.core.Engine` over a zarr bank, the :class:`~mklscale.engine.memory.InMemoryEngine`
over arrays, and the views of :mod:`mklscale.engine.views`) subclasses it and passes the same
conformance suite (``tests/test_engine_contract.py``), so a solver never probes for a method or a
keyword. A bank stores its kernels in one of two representations (``representation``):

    "dense"    K_m stored as an (n, n) PSD matrix
    "factor"   K_m = L_m L_m^T stored as its factor L_m (n, r) (a low-rank bank, n in the tens of
               thousands); every operation below means the same on K_m = L_m L_m^T, and costs
               O(n r) per kernel and vector instead of O(n^2)

The operations, with K_m the m-th kernel (n x n, PSD) of M:

    n, M                                    sizes
    lambda_max                              (M,) largest eigenvalue of each K_m (NaN: kernel unavailable)
    traces, frobenius_norms                 (M,) trace(K_m) and ||K_m||_F (no pass where the bank stores them)
    quad_forms(U)                           (M,) u^T K_m u for U (n,); (M, k) for U (k, n): ONE pass
    quad_forms(U, kernels=idx)              the same for the kernels idx
    quad_forms(U, kernels=idx, per_kernel=True)   (len(idx),) u_p^T K_{idx[p]} u_p, U (len(idx), n)
    matvecs(U, kernels=idx)                 (len(idx), n) K_m u; (len(idx), k, n) for U (k, n);
                                            per_kernel=True: row p = K_{idx[p]} U[p]
    frobenius(T, kernels=None)              (M,) <K_m, T>_F for a dense symmetric (n, n) T
    combine(weights)                        (n, n) float64 sum_m w_m K_m, reading only w_m != 0
    gram_of_kernels(kernels=None)           (p, p) <K_i, K_j>_F
    combine_factors(weights)                factor engines: (n, R) float64 F = [sqrt(w_m) L_m]_{w_m > 0}
                                            with F F^T = sum_m w_m K_m (weights >= 0), kernels in index order
    blocks(kernels, keep=True)              the kernels as stored, in their storage dtype, owned by the
                                            caller: (p, n, n) K_m, or (p, n, r) L_m for a factor engine;
                                            keep=False: the engine keeps no copy of its own
    block_nbytes                            bytes of one kernel as ``blocks`` returns it
    representation, rank                    "dense" (rank None) or "factor" (rank r: columns of L_m)
    kernel_representation                   the Representation object of ``representation``
                                            (engine/representation.py): every operation that differs
                                            between representations, for the engine and the solver toolkit
    working_set_budget                      bytes of kernels a solver may hold by default (None: no cap)
    counters()                              Counters(passes, bytes_read) so far: passes are calls that
                                            read every kernel; bytes are kernel bytes read from storage
    close()                                 release what the engine holds (also ``with engine:``)

``kernels=None`` means all M kernels and counts as a pass. Results are float64.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np

from mklscale.engine import representation as _representation
from mklscale.engine import validate
from mklscale.errors import InvalidInputError


class Counters(NamedTuple):
    """Running counters of an engine: full passes over the bank and kernel bytes read."""

    passes: int
    bytes_read: int


class KernelEngine(ABC):
    """Base of every engine (module docstring: the operations a solver may use)."""

    n: int
    M: int
    #: "dense" or "factor" (module docstring).
    representation: str = "dense"

    @property
    def rank(self) -> int | None:
        """Columns r of every stored factor L_m; None for a dense engine."""
        return None

    @property
    def kernel_representation(self) -> _representation.Representation:
        """The :class:`~mklscale.engine.representation.Representation` of ``representation``: solvers
        and the toolkit ask it for what differs between dense and factor kernels, never the name."""
        return _representation.of(self.representation)

    @property
    @abstractmethod
    def lambda_max(self) -> np.ndarray:
        """(M,) float64 largest eigenvalue per kernel; NaN marks a kernel the engine cannot serve."""

    @property
    @abstractmethod
    def traces(self) -> np.ndarray:
        """(M,) float64 trace(K_m)."""

    @property
    @abstractmethod
    def frobenius_norms(self) -> np.ndarray:
        """(M,) float64 ||K_m||_F."""

    @property
    @abstractmethod
    def block_nbytes(self) -> int:
        """Bytes of one kernel as :meth:`blocks` returns it."""

    @property
    def working_set_budget(self) -> int | None:
        """Bytes of kernels a solver may hold in its working set unless told otherwise (None: no cap)."""
        return None

    @abstractmethod
    def quad_forms(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        """u^T K_m u (module docstring)."""

    @abstractmethod
    def matvecs(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        """K_m u (module docstring)."""

    @abstractmethod
    def frobenius(self, T, kernels=None) -> np.ndarray:
        """<K_m, T>_F for a dense (n, n) T."""

    @abstractmethod
    def combine(self, weights) -> np.ndarray:
        """(n, n) float64 sum_m weights[m] K_m over the non-zero weights."""

    def combine_factors(self, weights) -> np.ndarray:
        """(n, R) float64 F with F F^T = sum_m weights[m] K_m: the factors sqrt(w_m) L_m of the
        kernels with w_m > 0, side by side in index order (factor engines only), read through
        ``blocks`` (and any cache behind it)."""
        self.kernel_representation.check_stored_factors(self)
        w = validate.weights(weights, self.M)
        if np.any(w < 0):
            raise InvalidInputError("combine_factors needs non-negative weights (sqrt(w_m) L_m); "
                                    "use combine(weights) for signed combinations")
        support = np.flatnonzero(w)
        if not support.size:
            return np.zeros((self.n, 0))
        L = self.blocks(support)
        return np.concatenate([np.sqrt(w[m]) * L[p].astype(np.float64) for p, m in enumerate(support)], axis=1)

    @abstractmethod
    def gram_of_kernels(self, kernels=None) -> np.ndarray:
        """(p, p) <K_i, K_j>_F over the kernels given (all M for None)."""

    @abstractmethod
    def blocks(self, kernels, keep: bool = True) -> np.ndarray:
        """(p, n, n) the kernels' values (storage dtype), a new array owned by the caller."""

    @abstractmethod
    def counters(self) -> Counters:
        """Passes and bytes read since the engine was created."""

    def close(self) -> None:
        """Release what the engine holds; the base holds nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
