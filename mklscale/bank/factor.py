"""Factor banks: each kernel stored as L_m (n x r) with K~_m = L_m L_m^T (issue 17).

Both methods store, per kernel m, landmark rows P_m of the standardised training set (indices) and
an r x r transform T_m, and every factor row is

    L_m(x) = k_m(x, X[P_m]) T_m                                    (``factor_rows``)

for training rows (the build), the bank's ``cross_factor`` and model prediction alike.

- Nystrom (Williams & Seeger 2001; Drineas & Mahoney 2005): r landmarks Z, chosen by k-means++
  seeding (D^2 sampling, Arthur & Vassilvitskii 2007) on the kernel's own feature subset,
  uniformly without replacement, or by ridge leverage scores ("rls": recursive RLS-Nystrom, Musco &
  Musco 2017, ``_rls_landmarks``), all from ``np.random.default_rng([seed, m])`` (reproducible and
  resumable per kernel). W = k(Z, Z) = U diag(lam) U^T; eigenvalues <= eig_cutoff * max lam are
  dropped, T = U diag(lam^-1/2) (pseudo-inverse square root), so K~ = C W^+ C^T with C = k(X, Z).
- Pivoted (incomplete) Cholesky (Fine & Scheinberg 2001; Bach & Jordan 2005): greedy pivots on the
  residual diagonal, computed from kernel columns only, until the residual trace is <= tol * tr K
  or r pivots; with L[P, :] lower triangular, K(X, X[P]) = L L[P, :]^T, so T = L[P, :]^-T.

Normalisation applies to K~: "trace" scales T by 1 / ||L||_F (unit trace, norm_factor =
1 / tr K~ before scaling), "diag" scales every row of L to unit norm (also for new points),
None leaves it. ``approx_error`` = (tr K - tr K~) / tr K before normalisation: the exact trace
norm of K - K~ >= 0, in O(n r) from diag K (the family) and the row norms of L.

Every loop that produces stored values has a fixed summation order (numba, no BLAS), so a kernel's
factor bytes are the same in any process or thread: resumed and distributed builds reproduce the
checksums. Eigen- and triangular solves are r x r LAPACK calls, deterministic on a machine; the
statistics use BLAS for L^T L. Cost per kernel: O(n r d_m) for the kernel values and k-means++,
O(n r^2) for L = C T (twice with "trace", to fold the scale into T exactly); never n x n.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numba
import numpy as np

from mklscale.bank import _compute
from mklscale.bank.spec import KernelSpec
from mklscale.errors import InvalidInputError

METHODS = ("nystrom", "cholesky")
LANDMARK_RULES = ("kmeans++", "uniform", "rls")
#: Nystrom keeps eigenvalues of W above this fraction of the largest (recorded in the bank).
EIG_CUTOFF = 1e-10


@dataclass(frozen=True)
class FactorSettings:
    """How a factor bank is built (``attrs["factor"]``, with ``attrs["rank"]``). Its field defaults are
    the only spelling of the factor defaults: ``build_bank``, the CLI and the pipelines read them here."""

    rank: int
    method: str = "nystrom"
    landmarks: str = "kmeans++"
    tol: float = 1e-6
    seed: int = 0
    eig_cutoff: float = EIG_CUTOFF

    def to_attrs(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "rank"}

    @classmethod
    def from_attrs(cls, rank: int, attrs: dict) -> FactorSettings:
        return cls(rank=int(rank), **attrs)


#: warn when a factor bank's kernel has a relative trace error (tr K - tr K~) / tr K above this
MAX_ERROR = 0.05


def settings(rank, method, landmarks, tol, seed, n: int) -> FactorSettings:
    """Checked ``FactorSettings`` for data of n rows; InvalidInputError says what to change."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= rank <= n:
        raise InvalidInputError(f"rank must be an integer in 1..n = 1..{n} (columns of each factor L_m), got {rank!r}; "
                                "use rank=None for a dense bank")
    if method not in METHODS:
        raise InvalidInputError(f"unknown factor method {method!r}; choose one of {', '.join(METHODS)}")
    if landmarks not in LANDMARK_RULES:
        raise InvalidInputError(f"unknown landmarks rule {landmarks!r}; choose one of {', '.join(LANDMARK_RULES)}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating, np.integer)) \
            or not math.isfinite(tol) or tol <= 0:
        raise InvalidInputError(f"tol must be a positive number (relative residual trace of the pivoted Cholesky), "
                                f"got {tol!r}; e.g. tol=1e-6")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidInputError(f"seed must be a non-negative integer, got {seed!r}")
    return FactorSettings(int(rank), method, landmarks, float(tol), int(seed))


def kernel_params(spec: KernelSpec) -> tuple[int, float, int]:
    """(family code, a, p) of ``_compute._kernel_row``: Gaussian a = -1 / (2 s^2); polynomial
    a = offset, p = degree; linear none."""
    if spec.family == "gaussian":
        w = float(spec.param("width"))
        return _compute.GAUSSIAN, -1.0 / (2.0 * w * w), 0
    if spec.family == "polynomial":
        return _compute.POLYNOMIAL, float(spec.param("offset")), int(spec.param("degree"))
    return _compute.LINEAR, 0.0, 0


def _kind(spec: KernelSpec) -> int:
    return _compute.SQDIST if spec.base_key[0] == "sqdist" else _compute.DOT


def _columns(spec: KernelSpec, Xs: np.ndarray) -> np.ndarray:
    """Feature-major (d_m, n) float64 copy of the kernel's feature subset."""
    spec.check_features(Xs.shape[1])
    cols = slice(None) if spec.features is None else list(spec.features)
    return _compute._feature_major(Xs[:, cols])


# ---- numba kernels --------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def _cross_cols(Xt, Zt, kind, fam, a, p, Ct):
    """Ct[j, i] = k(x_i, z_j) (unnormalised, float64) with the build's arithmetic (``base_row``,
    ``_kernel_row`` with ``exp_f64``), one landmark at a time over all points (long inner loops);
    base(z, x) = base(x, z) bit for bit, so this is k(X, Z) transposed. Operands of other shapes raise
    ValueError (``base_row`` checks the features)."""
    m, n = Zt.shape[1], Xt.shape[1]
    if Ct.shape[0] != m or Ct.shape[1] != n:
        raise ValueError("_cross_cols: Ct must have shape (landmarks, points)")
    ones = np.ones(n)
    buf = np.empty(n)
    for j in range(m):
        _compute.base_row(Zt, j, Xt, 0, n, kind, buf)
        _compute._kernel_row(buf, fam, a, p, 1.0, ones, Ct[j], _compute.EXP_F64)


@numba.njit(cache=True, nogil=True)
def _apply(Ct, T, row_normalise, out):
    """out[i, :] = sum_q Ct[q, i] T[q, :], q in order (then scaled to unit norm if row_normalise;
    zero rows stay zero). Accumulated in a local row, which vectorises. Operands of other shapes (T with
    fewer than k rows, out not (n, r)) raise ValueError."""
    k, n = Ct.shape
    r = T.shape[1]
    if T.shape[0] < k or out.shape[0] != n or out.shape[1] != r:
        raise ValueError("_apply: T must have a row per landmark and out the shape (points, rank)")
    acc = np.empty(r)
    for i in range(n):
        acc[:] = 0.0
        for q in range(k):
            c = Ct[q, i]
            for j in range(r):
                acc[j] += c * T[q, j]
        if row_normalise:
            s = 0.0
            for j in range(r):
                s += acc[j] * acc[j]
            if s > 1e-300:
                inv = 1.0 / np.sqrt(s)
                for j in range(r):
                    acc[j] *= inv
        out[i, :] = acc


@numba.njit(cache=True, nogil=True)
def _row_sq_sum(L):
    """sum_ij L_ij^2 (= tr L L^T), rows in order."""
    s = 0.0
    for i in range(L.shape[0]):
        for j in range(L.shape[1]):
            s += L[i, j] * L[i, j]
    return s


@numba.njit(cache=True, nogil=True)
def _sum(v):
    s = 0.0
    for i in range(v.shape[0]):
        s += v[i]
    return s


@numba.njit(cache=True, nogil=True)
def _kdiag(Xt, kind, fam, a, p):
    """k(x_i, x_i) of the unnormalised kernel, as the dense build's normalisers compute it."""
    n = Xt.shape[1]
    out = np.empty(n)
    _compute._kernel_row(_compute._base_diag(Xt, kind), fam, a, p, 1.0, np.ones(n), out, _compute.EXP_F64)
    return out


@numba.njit(cache=True, nogil=True)
def _kmeanspp(Xt, u):
    """k-means++ seeding: len(u) distinct rows, the first uniform, each next one with probability
    proportional to its squared distance D^2 to the nearest chosen row (cumulative sums in order;
    u are the uniforms in [0, 1) drawn up front). When every remaining D^2 is 0 (duplicate rows),
    the next row is uniform among those not chosen yet. O(n r d)."""
    n = Xt.shape[1]
    r = u.shape[0]
    D = np.full(n, np.inf)
    chosen = np.zeros(n, dtype=np.bool_)
    out = np.empty(r, dtype=np.int64)
    buf = np.empty(n)
    c = min(int(u[0] * n), n - 1)
    for t in range(r):
        if t > 0:
            total = 0.0
            for i in range(n):
                if not chosen[i]:
                    total += D[i]
            c = -1
            if total > 0.0:
                target = u[t] * total
                acc = 0.0
                last = -1
                for i in range(n):
                    if not chosen[i] and D[i] > 0.0:
                        acc += D[i]
                        last = i
                        if acc > target:
                            c = i
                            break
                if c < 0:
                    c = last
            else:
                k = min(int(u[t] * (n - t)), n - t - 1)
                for i in range(n):
                    if not chosen[i]:
                        if k == 0:
                            c = i
                            break
                        k -= 1
        out[t] = c
        chosen[c] = True
        _compute.base_row(Xt, c, Xt, 0, n, _compute.SQDIST, buf)
        for i in range(n):
            if buf[i] < D[i]:
                D[i] = buf[i]
        D[c] = 0.0
    return out


@numba.njit(cache=True, nogil=True)
def _pivoted_cholesky(Xt, kind, fam, a, p, kdiag, rmax, stop):
    """Greedy pivoted incomplete Cholesky from kernel columns: (Gt (k, n), pivots (k,)) with
    G = Gt^T, K(X, X[P]) = G G[P, :]^T and G[P, :] lower triangular; stops at k = rmax or once the
    residual trace sum_i (K - G G^T)_ii <= stop. Pivot: the largest residual diagonal (first on
    ties). Column k: (K[:, j] - sum_{q<k} G[:, q] G[j, q]) / sqrt(d_j), q in order (vectorised
    over the rows: G is held column by column)."""
    n = Xt.shape[1]
    Gt = np.zeros((rmax, n))
    d = kdiag.copy()
    piv = np.full(rmax, -1, dtype=np.int64)
    buf = np.empty(n)
    col = np.empty(n)
    ones = np.ones(n)
    k = 0
    while k < rmax:
        s = 0.0
        j = 0
        for i in range(n):
            if d[i] > 0.0:
                s += d[i]
            if d[i] > d[j]:
                j = i
        if s <= stop or d[j] <= 0.0:
            break
        piv[k] = j
        _compute.base_row(Xt, j, Xt, 0, n, kind, buf)
        _compute._kernel_row(buf, fam, a, p, 1.0, ones, col, _compute.EXP_F64)
        for q in range(k):
            gjq = Gt[q, j]
            g_q = Gt[q]
            for i in range(n):
                col[i] -= g_q[i] * gjq
        inv = 1.0 / np.sqrt(d[j])
        g_k = Gt[k]
        for i in range(n):
            g_k[i] = col[i] * inv
        for q in range(k):
            g_k[piv[q]] = 0.0  # exactly lower triangular on the pivots
        g_k[j] = np.sqrt(d[j])
        for i in range(n):
            d[i] -= g_k[i] * g_k[i]
        for q in range(k + 1):
            d[piv[q]] = 0.0
        k += 1
    return Gt[:k].copy(), piv[:k].copy()


# ---- one kernel ----------------------------------------------------------------------------------
def factor_rows(spec: KernelSpec, Xs_new: np.ndarray, Z: np.ndarray, transform: np.ndarray,
                row_normalise: bool) -> np.ndarray:
    """L_m(x) = k_m(x, Z) T_m for each standardised row x of ``Xs_new``: (n_new, r) float64.

    Z: the landmark rows (k, d) of the standardised training set; ``transform`` (r, r) as stored
    (its first k rows are used; normalisation "trace" is folded in); ``row_normalise``: the bank's
    "diag" rule, every row scaled to unit norm. The one formula of the build, ``cross_factor``
    and prediction.
    """
    Xs_new = np.asarray(Xs_new, dtype=np.float64)
    Z = np.asarray(Z, dtype=np.float64)
    Ct = _cross(spec, _columns(spec, Xs_new), _columns(spec, Z))
    return _transformed(Ct, np.asarray(transform, dtype=np.float64)[: Z.shape[0]], row_normalise)


def _cross(spec: KernelSpec, Xt: np.ndarray, Zt: np.ndarray) -> np.ndarray:
    """k(X, Z)^T: (k, n) float64 for feature-major Xt (d, n), Zt (d, k)."""
    fam, a, p = kernel_params(spec)
    Ct = np.empty((Zt.shape[1], Xt.shape[1]))
    _cross_cols(Xt, Zt, _kind(spec), fam, a, p, Ct)
    return Ct


def _transformed(Ct: np.ndarray, T: np.ndarray, row_normalise: bool) -> np.ndarray:
    out = np.empty((Ct.shape[1], T.shape[1]))
    _apply(Ct, np.ascontiguousarray(T), bool(row_normalise), out)
    return out


@dataclass
class KernelFactor:
    """One kernel's factor as the build stores it (before the cast to the bank's dtype)."""

    L: np.ndarray            # (n, r) float64, normalised
    landmarks: np.ndarray    # (r,) int64, -1 padded
    transform: np.ndarray    # (r, r) float64, normalisation folded in
    rank: int                # r_m: nonzero columns of L
    norm_factor: float
    approx_error: float
    exact_trace: float


def build_factor(spec: KernelSpec, Xs: np.ndarray, m: int, st: FactorSettings, normalize: str | None) -> KernelFactor:
    """Kernel m's factor on the standardised training set Xs (formulas in the module docstring)."""
    Xt = _columns(spec, Xs)
    n, r = Xt.shape[1], st.rank
    fam, a, p = kernel_params(spec)
    kind = _kind(spec)
    kdiag = _kdiag(Xt, kind, fam, a, p)
    exact = float(_sum(kdiag))
    if st.method == "nystrom":
        idx = _landmarks(spec, Xt, kdiag, m, st)
        C = _cross(spec, Xt, np.ascontiguousarray(Xt[:, idx]))
        T, rank = _nystrom_transform(C[:, idx], st.eig_cutoff, r)  # W = k(Z, Z), exactly symmetric
    else:
        Gt, idx = _pivoted_cholesky(Xt, kind, fam, a, p, kdiag, r, st.tol * exact)
        rank = len(idx)
        T = np.zeros((r, r))
        if rank:
            import scipy.linalg

            T[:rank, :rank] = scipy.linalg.solve_triangular(Gt[:, idx].T, np.eye(rank), lower=True).T
        C = _cross(spec, Xt, np.ascontiguousarray(Xt[:, idx]))
    T_used = T[: len(idx)]
    L = _transformed(C, T_used, False)
    approx = float(_row_sq_sum(L))  # tr K~ before normalisation
    norm_factor = 1.0
    if normalize == "trace" and approx > 0:
        norm_factor = 1.0 / approx
        T = T * np.sqrt(norm_factor)
        L = _transformed(C, T[: len(idx)], False)
    elif normalize == "diag":
        L = _transformed(C, T_used, True)
    landmarks = np.full(r, -1, dtype=np.int64)
    landmarks[: len(idx)] = idx
    return KernelFactor(L, landmarks, T, int(rank), norm_factor,
                        (exact - approx) / exact if exact > 0 else 0.0, exact)


def _landmarks(spec: KernelSpec, Xt: np.ndarray, kdiag: np.ndarray, m: int, st: FactorSettings) -> np.ndarray:
    rng = np.random.default_rng([st.seed, m])
    n = Xt.shape[1]
    if st.landmarks == "uniform":
        return np.sort(rng.choice(n, size=st.rank, replace=False)).astype(np.int64)
    if st.landmarks == "rls":
        return _rls_landmarks(spec, Xt, kdiag, st.rank, rng)
    return _kmeanspp(Xt, rng.random(st.rank))


def _rls_landmarks(spec: KernelSpec, Xt: np.ndarray, kdiag: np.ndarray, s: int, rng) -> np.ndarray:
    """s landmarks sampled by approximate lambda-ridge leverage scores, recursive RLS-Nystrom (Musco &
    Musco 2017, Algorithm 2, as their reference code runs it): over nested uniform halves of a random
    permutation, from the smallest up, the landmarks S of the level below (with weights w) give every
    point of the level its score

        l_i = (1 / lam) (k_ii - k_iS (K_SS + lam W^-2)^-1 k_Si),   W = diag(w),
        lam = (sum_j w_j^2 k_jj - sum of the top k eigenvalues of W K_SS W) / k,  k = ceil(s / (4 log s))

    (lam: the ridge at which the effective dimension is about k); intermediate levels keep each point
    with probability min(1, log(s) l_i) (weights 1 / sqrt(p_i)); the top level draws exactly s distinct
    points with probabilities proportional to min(1, l_i). Kernel values k(., .) are the unnormalised
    kernel's (normalisation rescales lam and K alike). Cost O(n s^2) per level, log2(n / s) levels."""
    n = Xt.shape[1]
    if s >= n:
        return np.arange(n, dtype=np.int64)
    oversample = math.log(max(s, 2))
    k = math.ceil(s / (4.0 * oversample))
    sizes = [n]
    while sizes[-1] > s:                      # ceil(log2(n / s)) levels of uniform halves
        sizes.append(math.ceil(sizes[-1] / 2))
    perm = rng.permutation(n)
    samp = np.arange(sizes[-1])               # positions in perm of the current landmarks
    weights = np.ones(samp.size)
    for level in range(len(sizes) - 2, -1, -1):
        current = perm[: sizes[level]]
        KS = _cross(spec, np.ascontiguousarray(Xt[:, current]), np.ascontiguousarray(Xt[:, perm[samp]])).T
        SKS = KS[samp]
        if k >= samp.size:
            lam = 1e-5 * max(float(np.max(kdiag)), 1e-300)
        else:
            top = np.linalg.eigvalsh(weights[:, None] * SKS * weights[None, :])[-k:]
            lam = max((float(np.sum(np.diag(SKS) * weights ** 2)) - float(np.sum(np.abs(top)))) / k,
                      1e-10 * float(np.max(kdiag)))
        A = SKS + np.diag(lam / weights ** 2)
        quad = np.einsum("ij,ji->i", KS, np.linalg.solve(A, KS.T))
        scores = np.maximum(kdiag[current] - quad, 0.0) / lam
        if level > 0:
            levs = np.minimum(1.0, oversample * scores)
            samp = np.flatnonzero(rng.random(current.size) < levs)
            if samp.size == 0:                # (rare) nothing kept: a uniform sample of s points
                levs = np.full(current.size, s / current.size)
                samp = np.sort(rng.choice(current.size, size=s, replace=False))
            weights = np.sqrt(1.0 / levs[samp])
        else:
            p = np.minimum(1.0, scores)
            positive = np.flatnonzero(p > 0.0)
            if positive.size >= s:
                samp = rng.choice(current.size, size=s, replace=False, p=p / p.sum())
            else:                             # fewer points with a positive score than s: all, then uniform
                rest = np.setdiff1d(np.arange(current.size), positive)
                samp = np.concatenate([positive, rng.choice(rest, size=s - positive.size, replace=False)])
    return np.sort(perm[samp]).astype(np.int64)


def _nystrom_transform(W: np.ndarray, eig_cutoff: float, r: int) -> tuple[np.ndarray, int]:
    """(T, r_m): T (r, r) = U diag(lam^-1/2) over the eigenvalues of W above eig_cutoff * max,
    largest first, zero columns after."""
    lam, U = np.linalg.eigh(W)
    lam, U = lam[::-1], U[:, ::-1]
    keep = lam > eig_cutoff * lam[0] if lam[0] > 0 else np.zeros(lam.shape, dtype=bool)
    k = int(keep.sum())
    T = np.zeros((W.shape[0], r))
    T[:, :k] = U[:, :k] / np.sqrt(lam[:k])
    return T, k


def factor_stats(L: np.ndarray) -> tuple[float, float, float]:
    """(trace, Frobenius norm, largest eigenvalue) of K~ = L L^T for the stored L, from the r x r
    G = L^T L: tr K~ = tr G, ||K~||_F = ||G||_F, lambda_max(K~) = lambda_max(G), raised by
    8 r eps ||G||_F so that it stays an upper bound (safe screening, step sizes)."""
    L64 = np.asarray(L, dtype=np.float64)
    G = L64.T @ L64  # BLAS: statistics only, the stored bytes never depend on it
    fro = float(np.sqrt(_row_sq_sum(G)))
    lam = float(np.linalg.eigvalsh(G)[-1]) if G.size else 0.0
    return float(np.trace(G)), fro, max(0.0, lam) + 8.0 * max(1, G.shape[0]) * 2.220446049250313e-16 * fro
