"""Kernel representations: the one place that knows how a bank's kernels are held.

A bank stores every kernel K_m (n x n, PSD) in one representation; the engine (``Engine``, the
views) and the solver toolkit (``HeldKernels``, the final fit's kernel, the kernel sources of the
greedy and stochastic solvers) ask its :class:`Representation` for every operation that differs
between them, so no solver tests which representation it has. ``of(name)`` gives the object of
``engine.representation`` (``KernelEngine.kernel_representation``):

    Dense  ("dense")   the stored block B_m is K_m itself, (n, n)
    Factor ("factor")  the stored block B_m is L_m, (n, r), with K_m = L_m L_m^T; nothing n x n is
                       formed unless a solver's dense cap allows it (``choose``)

The operations, for a stored block B of kernel K (U (k, n) rows u_j, T (n, n), w a weight):

    tasks                               the module of the pass tasks (``engine/tasks.py`` or
                                        ``engine/factor_tasks.py``): what a Dask task computes
    block_shape(n, rank)                shape of one stored block
    quad(B, U)                          (k,) u_j^T K u_j          driver-side, the bits of the tasks
    matvec(B, U)                        (k, n) K u_j              (the engine's cached kernels)
    frobenius(B, T)                     <K, T>_F
    add_block(Bs, w, acc)               acc += sum_c w_c K_c over one block of kernels of the combine,
                                        acc (n, n) float64 (the tasks' order and bits)
    gram_fixed(S)                       (p, p) <K_a, K_b>_F of a stack, the tasks' summation order
                                        (the engine's cached kernels and the views)
    gram_block(rank)                    kernels per block of the engine's gram_of_kernels tasks
    restrict(S, rows)                   the stored blocks of the principal submatrices K[rows][:, rows]
    traces(S)                           tr K of a stack (numpy; the views)
    subset_frobenius_norms(view)        ||K_m||_F of a RowSubsetEngine's kernels
    subset_combine(engine, w, rows)     (sum_m w_m K_m)[rows][:, rows], any signs
    held_matvecs(chunks, u, first)      K_p u for the held kernels at positions >= first
    held_each_matvec(chunks, A, first)  K_p A[p]
    held_factor(memo, m, B, cap, tol)   L with K ~ L L^T (at most ``cap`` columns, else None): the
                                        stored factor, or a pivoted Cholesky factor of a dense K
                                        (memoised in ``memo`` per kernel id m)
    check_stored_factors(engine)        raise unless the blocks are factors (``combine_factors``)
    refuse_dense(who, what, n)          raise where a solver would form an n x n matrix from the held
                                        kernels the representation keeps low-rank
    blocks_are_factors                  how numba loops read kernel entries of held blocks (SMO-MKL):
                                        K[i, j] = B[i, j] (False) or <B[i], B[j]> (True)
    cached_columns(n, p, budget)        kernel columns worth caching in an SMO step (0: read from B)
    newton_backend(requested)           the back end of the Newton systems (SpicyMKL); refuses one
                                        the representation cannot serve
    working_set_start(default, rank)    how many kernels SpicyMKL's working set starts from:
                                        ``default`` for dense kernels, where a Newton step costs
                                        O(n^3) whatever W holds; fewer on factors
                                        (``Factor.working_set_start``)
    optional_dense(engine, w)           (n, n) sum_m w_m K_m for a step that only helps (SMO-MKL's
                                        start); None where the representation keeps it low-rank
    combined_matvec(engine, w, v)       (sum_m w_m K_m) v, forming only what the representation needs
    one_blas_thread(n, small_n)         whether the driver's algebra of a fit runs on one BLAS thread
    choose(dense, low_rank, dense_fits) ``dense`` where solvers combine these kernels as (n, n)
                                        matrices, else ``low_rank`` (a LowRank F F^T of the factors)
    dense_block(B)                      (n, n) float64 K
    reader(bank)                        what reads stored blocks in the driver (``Engine.blocks``)

A third representation (kernels computed from the features inside each pass, never stored) is one
more subclass: its own ``tasks`` module and block operations; its held blocks and combinations can
be dense, and no solver changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import ModuleType

import numpy as np

from mklscale.engine import computed_tasks, factor_tasks, tasks
from mklscale.engine import factor_kernels as F
from mklscale.engine import kernels as K
from mklscale.engine.reader import KernelReader
from mklscale.errors import InvalidInputError

#: Summed rank of the kernels a working set starts from on a factor bank (``Factor.working_set_start``).
WORKING_SET_START_COLUMNS = 512


def pivoted_cholesky(A: np.ndarray, tol: float, max_rank: int) -> np.ndarray | None:
    """(n, r) float64 L with trace(A - L L^T) <= tol * trace(A) for a PSD A (n, n), by greedy
    diagonal pivoting (Harbrecht, Peters and Schneider 2012): O(n r^2) time, one column of A read
    per step. None once r would exceed ``max_rank``."""
    n = A.shape[0]
    diag = np.diagonal(A).astype(np.float64).copy()
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
        col = A[:, i].astype(np.float64) - L[:, :j] @ L[i, :j]
        L[:, j] = col / np.sqrt(pivot)
        diag -= L[:, j] ** 2
        diag[i] = 0.0
    return L


def _mirror_upper(G: np.ndarray) -> np.ndarray:
    """G with its strict lower triangle set to the upper one's mirror (a symmetric matrix computed
    for b >= a only)."""
    return np.triu(G) + np.triu(G, 1).T


def _stacks(chunks):
    """(first position, chunk) for every chunk of a held set, in held order."""
    start = 0
    for chunk in chunks:
        yield start, chunk
        start += chunk.shape[0]


class Representation(ABC):
    """How a bank holds its kernels (module docstring: the operations)."""

    name: str
    tasks: ModuleType
    blocks_are_factors: bool = False

    def __repr__(self) -> str:
        return f"<{self.name} kernels>"

    def reader(self, bank):
        """What reads the bank's blocks (``KernelReader``'s interface: ``pieces``, ``read_rows``)."""
        return KernelReader(bank)

    # ---- one stored block, driver side ------------------------------------------------------------
    @abstractmethod
    def block_shape(self, n: int, rank: int | None) -> tuple[int, int]:
        """Shape of one stored block."""

    @abstractmethod
    def quad(self, B, U) -> np.ndarray:
        """(k,) u_j^T K u_j for U (k, n), with the pass tasks' kernels (same bits)."""

    @abstractmethod
    def matvec(self, B, U) -> np.ndarray:
        """(k, n) K u_j for U (k, n)."""

    @abstractmethod
    def frobenius(self, B, T) -> float:
        """<K, T>_F for a dense (n, n) T."""

    @abstractmethod
    def add_block(self, blocks, weights, acc) -> None:
        """acc += sum_c weights[c] K_c over the stored blocks of one combine block (acc (n, n) float64),
        in the order and with the bits of the representation's combine task."""

    @abstractmethod
    def gram_fixed(self, S) -> np.ndarray:
        """(p, p) <K_a, K_b>_F of the stack S: the upper triangle computed (the tasks' order and bits),
        mirrored below."""

    @abstractmethod
    def gram_block(self, rank: int | None, default: int, panel_bytes: int) -> int:
        """Kernels per block of gram_of_kernels' tasks."""

    # ---- stacks of stored blocks (the views, numpy) ---------------------------------------------------
    @abstractmethod
    def restrict(self, S, rows) -> np.ndarray:
        """The stored blocks of K[rows][:, rows] for the stack S (c, ...)."""

    @abstractmethod
    def traces(self, S) -> np.ndarray:
        """(c,) tr K of a float64 stack."""

    @abstractmethod
    def subset_frobenius_norms(self, view) -> np.ndarray:
        """(M,) ||K_m[rows][:, rows]||_F of a RowSubsetEngine ``view``."""

    @abstractmethod
    def subset_combine(self, engine, weights, rows) -> np.ndarray:
        """(sum_m w_m K_m)[rows][:, rows] (n_rows, n_rows) float64, w of any sign."""

    # ---- held kernels (toolkit.HeldKernels) -------------------------------------------------------
    @abstractmethod
    def held_matvecs(self, chunks, size: int, n: int, u, first: int) -> np.ndarray:
        """(size - first, n) float64 K_p u for the held kernels at positions >= ``first``."""

    @abstractmethod
    def held_each_matvec(self, chunks, size: int, n: int, A, first: int) -> np.ndarray:
        """(size - first, n) float64 K_p A[p] (A (size, n), indexed by position)."""

    @abstractmethod
    def held_factor(self, memo: dict, kernel: int, B, cap, tol: float) -> np.ndarray | None:
        """(n, r) float64 L with K ~ L L^T and r <= cap, else None."""

    def check_stored_factors(self, engine) -> None:
        """Raise: the stored blocks are no factors L_m (``KernelEngine.combine_factors``)."""
        raise InvalidInputError(f"{type(engine).__name__} stores {self.name} kernels, which have no factors; "
                                "use combine(weights) for the (n, n) combination")

    def refuse_dense(self, who: str, what: str, n: int) -> None:
        """Raise where ``who`` asks the held kernels for an n x n matrix they never form (no-op here)."""

    def cached_columns(self, n: int, p: int, budget: int) -> int:
        """Indices whose kernel columns (p float64 columns of n) an SMO step caches: 0, columns are
        read from the stored blocks."""
        return 0

    def newton_backend(self, requested: str) -> str:
        """The Newton back end to use for ``requested`` (SpicyMKL's ``newton_solver``)."""
        return requested

    def working_set_start(self, default: int, rank: int | None) -> int:
        """How many kernels a working-set solver starts from: ``default``
        (dense kernels: a Newton step costs O(n^3) for the n x n Cholesky whatever W holds)."""
        return int(default)

    # ---- combinations ---------------------------------------------------------------------------------
    @abstractmethod
    def optional_dense(self, engine, weights) -> np.ndarray | None:
        """(n, n) sum_m w_m K_m for a step that only helps (a better start); None: not formed."""

    @abstractmethod
    def combined_matvec(self, engine, weights, v) -> np.ndarray:
        """(sum_m w_m K_m) v (w >= 0)."""

    @abstractmethod
    def one_blas_thread(self, n, small_n: int) -> bool:
        """Whether a fit's driver-side algebra runs with one BLAS thread (``solvers._threads``)."""

    @abstractmethod
    def choose(self, dense, low_rank, dense_fits: bool = False):
        """``dense`` where solvers combine these kernels as (n, n) matrices, else ``low_rank``;
        ``dense_fits``: an (n, n) float64 matrix fits the solvers' dense cap."""

    @abstractmethod
    def dense_block(self, B) -> np.ndarray:
        """(n, n) float64 K of a stored block."""


class Dense(Representation):
    """K_m stored as the (n, n) matrix itself."""

    name = "dense"
    tasks = tasks

    def block_shape(self, n, rank):
        return (n, n)

    def quad(self, B, U):
        U = np.ascontiguousarray(U, dtype=np.float64)
        out = np.empty((1, U.shape[0]))
        K.quad_kernels(B[None], U, np.ascontiguousarray(U.T), out, np.zeros(U.shape), np.zeros((8, 16)), False,
                       K.ROW_BLOCK)
        return out[0]

    def matvec(self, B, U):
        out = np.empty(U.shape)
        K.matvec_rows(B, 0, U, out)
        return out

    def frobenius(self, B, T):
        return K.frob_rows(B, 0, T, 0.0)

    def add_block(self, blocks, weights, acc):
        for B, w in zip(blocks, weights):
            K.axpy_rows(B, 0, float(w), acc)

    def gram_fixed(self, S):
        G = np.zeros((S.shape[0], S.shape[0]))
        K.gram_rows(S, S, G, True)
        return _mirror_upper(G)

    def gram_block(self, rank, default, panel_bytes):
        return default

    def restrict(self, S, rows):
        S = np.ascontiguousarray(S)
        out = np.empty((S.shape[0], rows.size, rows.size), dtype=S.dtype)
        K.principal_submatrices(S, np.ascontiguousarray(rows, dtype=np.int64), out)
        return out

    def traces(self, S):
        return np.trace(S, axis1=1, axis2=2)

    def subset_frobenius_norms(self, view):
        return view._per_kernel(lambda sub: np.sqrt(np.einsum("mij,mij->m", sub, sub)))

    def subset_combine(self, engine, weights, rows):
        return self.restrict(np.asarray(engine.combine(weights), dtype=np.float64)[None], rows)[0]

    def held_matvecs(self, chunks, size, n, u, first):
        U = np.ascontiguousarray(u, dtype=np.float64).reshape(1, n)
        out = np.empty((size - first, 1, n))
        for start, chunk in _stacks(chunks):
            stop = start + chunk.shape[0]
            if stop > first:
                lo = max(first, start)
                K.stack_matvec(chunk[lo - start:], U, out[lo - first:stop - first])
        return out[:, 0]

    def held_each_matvec(self, chunks, size, n, A, first):
        A = np.ascontiguousarray(A, dtype=np.float64)
        out = np.empty((size, n))
        for start, chunk in _stacks(chunks):
            stop = start + chunk.shape[0]
            K.each_matvec(chunk, A[start:stop], out[start:stop])
        return out[first:]

    def held_factor(self, memo, kernel, B, cap, tol):
        """Pivoted Cholesky of K to ``tol`` of its trace, computed once per kernel (``memo``: kernel
        id -> (L or None, the rank cap it was tried with))."""
        n = B.shape[0]
        L, tried = memo.get(kernel, (None, -1))
        if L is not None:
            return L if L.shape[1] <= cap else None
        if tried >= min(cap, n):
            return None
        limit = int(min(cap, n))
        L = pivoted_cholesky(B, tol, limit)   # reads columns, widened
        memo[kernel] = (L, limit)
        return L

    def optional_dense(self, engine, weights):
        return engine.combine(weights)

    def combined_matvec(self, engine, weights, v):
        return engine.combine(weights) @ v

    def one_blas_thread(self, n, small_n):
        return isinstance(n, int) and n <= small_n

    def choose(self, dense, low_rank, dense_fits=False):
        return dense

    def dense_block(self, B):
        return np.asarray(B, dtype=np.float64)


class Factor(Representation):
    """K_m = L_m L_m^T stored as L_m (n, r): u^T K u = ||L^T u||^2, K u = L (L^T u),
    <K, T>_F = tr(L^T T L), <K_a, K_b>_F = ||L_a^T L_b||_F^2, all O(n r) per kernel and vector
    (O(n^2 r) for T); the held kernels' products go through L, and their n x n sums are refused."""

    name = "factor"
    tasks = factor_tasks
    blocks_are_factors = True

    def block_shape(self, n, rank):
        return (n, int(rank))

    def quad(self, B, U):
        return factor_tasks.local_quad(B, U)

    def matvec(self, B, U):
        return factor_tasks.local_matvec(B, U)

    def frobenius(self, B, T):
        return F.frobenius_with(B, T)

    def add_block(self, blocks, weights, acc):
        F.add_weighted_outer(blocks, weights, acc)

    def gram_fixed(self, S):
        p, r = S.shape[0], S.shape[2]
        C = np.zeros((p, p, r, r))
        F.cross_products(S, S, C, True)
        G = np.zeros((p, p))
        F.frobenius_squares(C, G, True)
        return _mirror_upper(G)

    def gram_block(self, rank, default, panel_bytes):
        """As many kernels as keep a task's (block x block) r x r products L_a^T L_b within
        ``panel_bytes``."""
        r = int(rank)
        return int(max(1, min(default, np.sqrt(panel_bytes / (r * r * 8)))))

    def restrict(self, S, rows):
        return S[:, rows]

    def traces(self, S):
        return np.einsum("mir,mir->m", S, S)

    def subset_frobenius_norms(self, view):
        return np.sqrt(np.diag(view.gram_of_kernels()))

    def subset_combine(self, engine, weights, rows):
        """F_+ F_+^T - F_- F_-^T with F_+- the factors of the positive and negative parts of w."""
        pos = engine.combine_factors(np.maximum(weights, 0))[rows]
        neg = engine.combine_factors(np.maximum(-weights, 0))[rows]
        return pos @ pos.T - neg @ neg.T

    def held_matvecs(self, chunks, size, n, u, first):
        return self.held_each_matvec(chunks, size, n, np.broadcast_to(np.asarray(u, dtype=np.float64), (size, n)),
                                     first)

    def held_each_matvec(self, chunks, size, n, A, first):
        out = np.empty((size - first, n))
        for start, chunk in _stacks(chunks):
            stop = start + chunk.shape[0]
            if stop > first:
                lo = max(first, start)
                F.each_matvec(np.ascontiguousarray(chunk[lo - start:]), A[lo:stop], out[lo - first:stop - first])
        return out

    def held_factor(self, memo, kernel, B, cap, tol):
        """The stored factor, widened (nothing memoised: it is already held)."""
        return B.astype(np.float64) if B.shape[1] <= cap else None

    def check_stored_factors(self, engine):
        """The stored blocks are the factors: nothing to refuse."""

    def refuse_dense(self, who, what, n):
        raise InvalidInputError(
            f"{who} asked HeldKernels.{what} for an n x n matrix ({n} x {n}) from factor "
            f"kernels (K_m = L_m L_m^T); use factors() / matvecs() instead, which never form it")

    def cached_columns(self, n, p, budget):
        """Columns L L[i] cost O(n r) each: keep min(n, max(2, budget / (8 p n))) of them."""
        return int(min(n, max(2, budget // (8 * p * n))))

    def newton_backend(self, requested):
        """Woodbury on the factors whatever was asked, except "cholesky", which is refused: it would
        form the n x n Newton matrices."""
        if requested == "cholesky":
            raise InvalidInputError("newton_solver='cholesky' would form n x n Newton matrices from a factor bank; "
                                    "use 'auto' or 'woodbury' (the Woodbury solve on the factors)")
        return "woodbury"

    def working_set_start(self, default, rank):
        """min(default, max(1, WORKING_SET_START_COLUMNS // r)) kernels: 8 at r = 64. A Newton step on
        factors costs O(n R^2) with R = r x (kernels that enter), and the proximal method's first outer
        steps have every kernel of W in its Newton systems (alpha_m + gamma_m rho stays above the
        threshold while gamma_m is small), while a pass over a factor bank costs O(n r M) (issue 32:
        ringnorm n = 10,000, M = 50, r = 64, C = 0.6, 5 kernels active: 35.2 s starting from 32 kernels,
        of which 34.4 s in Newton systems of up to R = 2048 columns, against 6.2 s from 8 and 3.3 s
        from 4; M = 200, C = 0.2, 15 active: 60 s / 17.7 s / 26 s: from 4, more rounds)."""
        return int(min(default, max(1, WORKING_SET_START_COLUMNS // max(1, int(rank or 1)))))

    def optional_dense(self, engine, weights):
        return None

    def combined_matvec(self, engine, weights, v):
        """F (F^T v) with F = [sqrt(w_m) L_m], F F^T = sum_m w_m K_m, never formed."""
        Fw = engine.combine_factors(weights)
        return Fw @ (Fw.T @ v)

    def one_blas_thread(self, n, small_n):
        """Always: the algebra is O(n R^2) on tall, thin matrices, where threads gain little and
        oversubscription costs much."""
        return True

    def choose(self, dense, low_rank, dense_fits=False):
        return dense if dense_fits else low_rank

    def dense_block(self, B):
        L = np.asarray(B, dtype=np.float64)
        return L @ L.T


class Computed(Dense):
    """K_m computed from the bank's features inside every pass, never stored (issue 31): the blocks
    are the dense (n, n) kernels, computed by ``computed_tasks.ComputedReader`` wherever a stored
    bank's are read, so every operation on them is ``Dense``'s."""

    name = "computed"
    tasks = computed_tasks

    def reader(self, bank):
        return computed_tasks.ComputedReader(bank)


DENSE, FACTOR, COMPUTED = Dense(), Factor(), Computed()
_BY_NAME = {r.name: r for r in (DENSE, FACTOR, COMPUTED)}


def of(name: str) -> Representation:
    """The representation called ``name`` (a bank's ``representation`` attribute)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidInputError(f"unknown kernel representation {name!r}; known: {sorted(_BY_NAME)}") from None
