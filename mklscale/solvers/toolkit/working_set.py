"""HeldKernels: the kernels a solver holds in the driver (its working set), behind their operations.

A working-set solver reads a few kernels once (``engine.blocks(idx, keep=False)``: the engine keeps
no second copy) and runs its inner iterations on them. The kernels stay exactly as the engine
stores them (float32 from a float32 bank: half the memory of float64 copies), one copy each: every
``fetch`` appends its stack as a chunk (concatenating would briefly hold W twice), ``keep`` compacts
the chunks in place, and every product widens the entries exactly and accumulates in float64, so
the results are those of the float64 kernels. Solvers never see the arrays, only the operations
below, and every operation that depends on how the kernels are stored is the engine's kernel
representation's (``engine.kernel_representation``, ``engine/representation.py``):

- dense: the chunks hold K_m (c, n, n); :meth:`factors` factors each held kernel once by pivoted
  Cholesky (cached per kernel) and answers None when the summed rank exceeds ``max_columns``.
- factor (issue 17): the chunks hold L_m (c, n, r) with K_m = L_m L_m^T, every product goes through
  them, K_m u = L_m (L_m^T u) (O(n r) per kernel); nothing n x n is ever formed: :meth:`add_weighted`
  and :meth:`total` refuse, and :meth:`factors` gives the stored factors.

:meth:`factors` gives the stacked F = [sqrt(w_1) L_1, ...] (n x R) for the low-rank solves of the
inner loops (Woodbury, R x R eigenproblems); :meth:`with_sum` hands a solver the sum of the held
kernels in the form the representation combines them (an (n, n) matrix, or the stacked factors).
A kernel costs ``engine.block_nbytes`` bytes whatever the representation: one memory rule.

The memory rule, the same for every solver: ``budget`` (bytes; the solver's ``working_set_bytes``,
else the engine's ``working_set_budget``, None = no cap) bounds how many kernels a solver chooses
to hold (:meth:`capacity`); and :meth:`fetch` refuses, with the solver's remedy in the message, any
set that would not fit in 90% of the memory the machine has available.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mklscale.engine.contract import KernelEngine
from mklscale.engine.kernels import axpy_rows
from mklscale.errors import InvalidInputError

#: Share of the available memory a working set may take.
MEMORY_SHARE = 0.9
#: Relative trace left out by the pivoted Cholesky factors of dense kernels (:meth:`HeldKernels.factors`).
DENSE_FACTOR_TOL = 1e-10


@njit(nogil=True, cache=True)
def _stack_axpy(B, sel, weights, out):
    """out += sum_p weights[p] K_{sel[p]} over kernels of B (c, n, n), accumulated in float64."""
    for p in range(sel.shape[0]):
        axpy_rows(B[sel[p]], 0, weights[p], out)


class HeldKernels:
    """The working set's kernels: ``index`` (kernel ids, in held order) and their values.

    engine : where the kernels are read from. budget_bytes : the working-set budget (module
    docstring; None: the engine's ``working_set_budget``). name : the solver, for messages.
    """

    def __init__(self, engine: KernelEngine, budget_bytes: int | None = None, name: str = "the solver"):
        self.engine, self.name = engine, name
        self.n = int(engine.n)
        self.budget = budget_bytes if budget_bytes is not None else engine.working_set_budget
        self.index = np.zeros(0, dtype=np.int64)
        self.chunks: list[np.ndarray] = []    # stacks of stored blocks ((c, n, n) or (c, n, r)), in held order
        self.rep = engine.kernel_representation
        self._dense_factors: dict[int, tuple[np.ndarray | None, int]] = {}  # id -> (L or None, rank cap)

    @property
    def size(self) -> int:
        return int(self.index.size)

    @property
    def nbytes(self) -> int:
        """Bytes of the kernels held."""
        return sum(c.nbytes for c in self.chunks)

    @property
    def kernel_nbytes(self) -> int:
        return int(self.engine.block_nbytes)

    def capacity(self) -> int | float:
        """How many kernels the budget allows (inf without a budget)."""
        return np.inf if self.budget is None else self.budget // max(1, self.kernel_nbytes)

    # ---- what is held ---------------------------------------------------------------------------
    def fetch(self, idx, remedy: str) -> np.ndarray:
        """Read and hold the kernels ``idx`` not held yet (one ``engine.blocks`` call), as the last
        of ``chunks`` (so a caller may compute on just the new ones); returns the ids actually added.
        ``remedy`` ends the message of a set too large for memory."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        idx = idx[~np.isin(idx, self.index)]
        if idx.size:
            self._check_memory(idx.size, remedy)
            self.append(idx, self.engine.blocks(idx, keep=False))
        return idx

    def append(self, idx, blocks: np.ndarray) -> None:
        """Hold ``blocks`` (len(idx), n, n), already read, as the kernels ``idx``."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.size:
            self.chunks.append(np.ascontiguousarray(blocks))
            self.index = np.concatenate([self.index, idx])

    def _check_memory(self, count: int, remedy: str) -> None:
        import psutil

        per = self.kernel_nbytes
        available = psutil.virtual_memory().available
        if count * per > MEMORY_SHARE * available:
            total = self.size + count
            raise InvalidInputError(
                f"the {self.name} working set would hold {total} kernels ({total * per / 1e9:.3g} GB: "
                f"{self.size} held, {count} to add) and this machine has {available / 1e9:.3g} GB of memory "
                f"available; {remedy}")

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the kernels where ``mask`` is True. Each chunk is compacted in place (kept
        kernels moved to its front, then the array shrunk), so no second copy of them is made."""
        start, chunks = 0, []
        for chunk in self.chunks:
            part = mask[start:start + chunk.shape[0]]
            start += chunk.shape[0]
            kept = np.flatnonzero(part)
            if kept.size == part.size:
                chunks.append(chunk)
            elif kept.size:
                for dst, src in enumerate(kept.tolist()):   # src >= dst: never overwrites a kept one
                    if src != dst:
                        chunk[dst] = chunk[src]
                try:
                    chunk.resize((kept.size,) + chunk.shape[1:], refcheck=False)  # frees the tail
                except ValueError:  # does not own its data (or is read-only): keep a compact copy
                    chunk = chunk[:kept.size].copy()
                chunks.append(chunk)
        self.chunks = chunks
        self.index = self.index[mask]
        for kernel in set(self._dense_factors) - set(self.index.tolist()):
            del self._dense_factors[kernel]

    def reorder(self, order: np.ndarray) -> None:
        """Hold the kernels in the order ``order`` (positions), e.g. sorted by kernel id."""
        self.chunks = [np.ascontiguousarray(self.stack()[order])] if self.size else []
        self.index = self.index[order]

    def stack(self) -> np.ndarray:
        """The held kernels as one (size, n, n) array in held order (factor engine: the factors,
        (size, n, r)), for inner loops that index kernel entries themselves (SMO-MKL's numba SMO
        steps, which widen each entry to float64). The chunks are merged once (one transient
        copy, as a concatenation), then this is free."""
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        if self.chunks:
            return self.chunks[0]
        return np.empty((0,) + self.rep.block_shape(self.n, self.engine.rank))

    # ---- operations -----------------------------------------------------------------------------
    def matvecs(self, u: np.ndarray, first: int = 0) -> np.ndarray:
        """(size - first, n) float64 K_p u for the held kernels at positions >= ``first``."""
        return self.rep.held_matvecs(self.chunks, self.size, self.n, u, first)

    def each_matvec(self, A: np.ndarray, first: int = 0) -> np.ndarray:
        """(size - first, n) float64 K_p A[p]: every held kernel (at positions >= ``first``) times
        its own vector (A indexed by position, (size, n))."""
        return self.rep.held_each_matvec(self.chunks, self.size, self.n, A, first)

    def factor_list(self, sel=None, max_columns: int | None = None) -> list[np.ndarray] | None:
        """[L_p for p in sel] (n, r_p) float64 with K_p ~ L_p L_p^T (the representation's
        ``held_factor``: stored factors, or pivoted Cholesky factors to DENSE_FACTOR_TOL of the trace,
        computed once per kernel); None when sum_p r_p would exceed ``max_columns``."""
        sel = np.arange(self.size) if sel is None else np.asarray(sel, dtype=np.int64)
        cap = np.inf if max_columns is None else int(max_columns)
        parts, used = [], 0
        for p in sel.tolist():
            L = self.rep.held_factor(self._dense_factors, int(self.index[p]), self._block(p), cap - used,
                                     DENSE_FACTOR_TOL)
            if L is None:
                return None
            used += L.shape[1]
            parts.append(L)
        return parts

    def factors(self, sel=None, weights=None, max_columns: int | None = None) -> np.ndarray | None:
        """F = [sqrt(w_1) L_{sel[1]}, ...] (n, R) float64 with K_p ~ L_p L_p^T (:meth:`factor_list`), for
        the held kernels at positions ``sel`` (None: all) and weights w >= 0 (None: ones); None when R
        would exceed ``max_columns`` (then use the dense kernels)."""
        sel = np.arange(self.size) if sel is None else np.asarray(sel, dtype=np.int64)
        w = np.ones(sel.size) if weights is None else np.asarray(weights, dtype=np.float64)
        if np.any(w < 0.0):
            raise InvalidInputError("HeldKernels.factors needs non-negative weights (columns sqrt(w_p) L_p)")
        parts = self.factor_list(sel, max_columns)
        if parts is None:
            return None
        if not parts:
            return np.zeros((self.n, 0))
        return np.concatenate([np.sqrt(wp) * L for wp, L in zip(w, parts)], axis=1)

    def with_sum(self, dense, low_rank):
        """``dense(S)`` with S the (n, n) float64 sum of the held kernels, or ``low_rank(F)`` with
        F F^T that sum (F = :meth:`factors`), as the representation combines its kernels (it
        chooses; the caller writes both)."""
        return self.rep.choose(lambda: dense(self.total()), lambda: low_rank(self.factors()))()

    def _block(self, position: int) -> np.ndarray:
        """The stored block at ``position`` (a view: K_p, or L_p on factor storage)."""
        start = 0
        for chunk in self.chunks:
            if position < start + chunk.shape[0]:
                return chunk[position - start]
            start += chunk.shape[0]
        raise IndexError(position)

    def _stacks(self):
        """(first position, chunk) for every chunk, in held order."""
        start = 0
        for chunk in self.chunks:
            yield start, chunk
            start += chunk.shape[0]

    def add_weighted(self, sel: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
        """out += sum_p weights[p] K_{sel[p]} (sel: ascending positions; out (n, n) float64)."""
        self.rep.refuse_dense(self.name, "add_weighted", self.n)
        sel = np.asarray(sel, dtype=np.int64)
        weights = np.asarray(weights, dtype=np.float64)
        for start, chunk in self._stacks():
            stop = start + chunk.shape[0]
            lo, hi = np.searchsorted(sel, [start, stop])
            if hi > lo:
                _stack_axpy(chunk, sel[lo:hi] - start, weights[lo:hi], out)

    def total(self) -> np.ndarray:
        """(n, n) float64 sum of the held kernels."""
        self.rep.refuse_dense(self.name, "total", self.n)
        S = np.zeros((self.n, self.n))
        for chunk in self.chunks:
            S += chunk.sum(axis=0, dtype=np.float64)
        return S
