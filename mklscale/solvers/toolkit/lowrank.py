"""Low-rank linear algebra of the solvers (issue 17): kernels and Newton systems held as factors.

Working sets and Newton systems (SpicyMKL, PFBS):

* low-rank factors of dense held kernels: ``engine.representation.pivoted_cholesky`` (K ~ L L^T with
  greedy diagonal pivoting, asked through ``HeldKernels.factors``).
* :func:`woodbury_solve`: x = (D + F F^T)^{-1} b for a positive diagonal D and F (n x R):
  with F~ = D^{-1/2} F, (D + F F^T)^{-1} = D^{-1/2} (I - F~ (I + F~^T F~)^{-1} F~^T) D^{-1/2},
  one R x R Cholesky (O(n R^2 + R^3)), never an n x n matrix. The capacitance I + F~^T F~ has
  eigenvalues >= 1, so the solve is as accurate as the diagonal scaling allows.
  :class:`BlockWoodbury`: the same for F = [L_j S_j] given by its blocks (SpicyMKL's Newton
  systems: S_j = sigma_j I + c_j z_j z_j^T), F never formed; or block-Jacobi CG on the capacitance
  (``capacitance_cg``, O(n R) a step), the capacitance then never formed either.

Combined kernels (the final fit, EasyMKL, Citi, SGD, GCD): :class:`LowRank`, a combined kernel held
as its factor, K = F F^T with F (n, R) float64. On a factor engine the combination sum_m w_m K~_m of kernels K~_m = L_m L_m^T (w >= 0) is
K = F F^T with F = [sqrt(w_m) L_m] (``engine.combine_factors``), R the summed rank. Every operation
the solvers' driver-side algebra needs is written on F, never forming the (n, n) matrix:

    matvec / quad                K v = F (F^T v),  v^T K v = ||F^T v||^2              O(n R)
    diagonal, trace              diag(K)_i = ||F_i||^2,  tr K = ||F||_F^2              O(n R)
    ridge solves (Woodbury)      (K + lam I)^{-1} b = (b - F (lam I_R + F^T F)^{-1} F^T b) / lam
                                 one Cholesky of the (R, R) matrix                     O(n R^2)
    centring                     H K H = F_c F_c^T,  F_c = H F = F - 1 mean(F)        O(n R)
    Frobenius products           <F F^T, G G^T>_F = ||F^T G||_F^2                      O(n R R')
    centred alignment            A_c(K, y y^T) = ||F_c^T y_c||^2 / (||F_c^T F_c||_F ||y_c||^2)

``dense_ok(n)``: the solvers keep their exact dense code (an (n, n) float64 matrix) while that
matrix fits in DENSE_BYTES_CAP bytes (1 GiB: n <= 11585); above it they use this module. So small
problems on factor engines run the same dense code as on the dense engine of the K~_m, and the
factor paths are exercised in tests by lowering the cap.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg


class Woodbury:
    """(D + F F^T)^{-1} for a positive diagonal D and F (n, R), factorised once (module docstring):
    :meth:`solve` costs O(n R) per right-hand side after the O(n R^2 + R^3) set-up."""

    def __init__(self, diag: np.ndarray, F: np.ndarray):
        self.scale = 1.0 / np.sqrt(diag)
        self.Ft = F * self.scale[:, None]
        self.cho = None     # Cholesky of the capacitance I + F~^T F~
        if self.Ft.shape[1]:
            cap = self.Ft.T @ self.Ft
            cap[np.diag_indices_from(cap)] += 1.0
            self.cho = scipy.linalg.cho_factor(cap, check_finite=False)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """(D + F F^T)^{-1} rhs, rhs (n,) or (n, k)."""
        s = self.scale if rhs.ndim == 1 else self.scale[:, None]
        b = rhs * s
        if self.cho is not None:
            b = b - self.Ft @ scipy.linalg.cho_solve(self.cho, self.Ft.T @ b, check_finite=False)
        return b * s


class BlockWoodbury:
    """(D + F F^T)^{-1} for F = [L_1 S_1, ..., L_k S_k] given by its blocks, never formed: L_j (n, r_j)
    (any float dtype: float32 stored factors are widened as they are scaled, into one (n, R) float64
    array) and S_j = sigma_j I + c_j z_j z_j^T (z_j (r_j,); symmetric), the square roots of the SpicyMKL
    kernels' Newton blocks (``_spicy_inner.NewtonSystem``). With L~ = D^{-1/2} [L_1 ... L_k] and
    S = blockdiag(S_j):

        capacitance  I + S (L~^T L~) S             one syrk, n R^2 (half of L~^T L~'s product), then
                                                    O(R^2) per block to apply S on both sides
        solve        x = D^{-1/2} (b~ - L~ S cap^{-1} S L~^T b~),  b~ = D^{-1/2} b          O(n R)

    The same numbers as :class:`Woodbury` on the formed F = L S, without the (n, R) products L_j S_j
    (issue 32: forming F took a third of the Newton time on a factor bank at n = 10,000)."""

    def __init__(self, diag: np.ndarray, blocks, sigma, coef, z, factorise: bool = True):
        self.scale = 1.0 / np.sqrt(diag)
        n = self.scale.size
        widths = [int(B.shape[1]) for B in blocks]
        self.bounds = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        self.sigma = np.asarray(sigma, dtype=np.float64)
        self.coef = np.asarray(coef, dtype=np.float64)
        self.z = [np.asarray(v, dtype=np.float64) for v in z]
        # one contiguous copy, then scaled in place (writing each block scaled into its column slice of
        # the (n, R) array is a strided, mixed-dtype write: 2.5x slower at n = 50,000, R = 512)
        self.Lt = np.concatenate(blocks, axis=1, dtype=np.float64) if blocks else np.zeros((n, 0))
        self.Lt *= self.scale[:, None]
        self.cho = None     # Cholesky of the capacitance I + S L~^T L~ S
        if factorise:
            self.factorise()

    def capacitance_cg(self, rhs: np.ndarray, forcing: float, max_iter: int) -> np.ndarray | None:
        """(D + F F^T)^{-1} rhs (rhs (n,) or (n, k)) by conjugate gradients on the capacitance system
        cap y = S L~^T b~ (cap = I + S L~^T L~ S, eigenvalues >= 1), x = D^{-1/2} (b~ - L~ S y): each step
        one product with L~ and one with L~^T, 4 n R flops, instead of the n R^2 of forming cap. Block-Jacobi
        preconditioner: per kernel the r_j x r_j Cholesky of I + S_j L~_j^T L~_j S_j (n R r_j flops in all;
        exact when the kernels' scaled factors are mutually orthogonal). Stopped when the residual of the
        system itself, ||(D + F F^T) x - rhs|| = ||D^{1/2} L~ S r|| (r the capacitance residual), is at most
        ``forcing`` ||rhs|| (the capacitance residual alone can be small while x, scaled by D^{-1/2}, is
        not: hinge's D ~ 1/tau); every iterate gives a descent direction x (g^T x >= the exact Newton decrement, CG
        minimising over a Krylov space). None when a column needs more than ``max_iter`` steps.
        (Build with ``factorise=False``: the capacitance is then never formed.)"""
        bounds = list(zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist()))
        pre = []
        for j, (a, b) in enumerate(bounds):
            Lj = self.Lt[:, a:b]
            G = Lj.T @ Lj
            G = self._apply_S_block(j, self._apply_S_block(j, G).T)
            G[np.diag_indices_from(G)] += 1.0
            pre.append(scipy.linalg.cho_factor(G, check_finite=False))

        def precondition(u):
            out = np.empty_like(u)
            for (a, b), f in zip(bounds, pre):
                out[a:b] = scipy.linalg.cho_solve(f, u[a:b], check_finite=False)
            return out

        def cap(u):
            return u + self._apply_S(self.Lt.T @ (self.Lt @ self._apply_S(u)))

        B = (rhs * (self.scale if rhs.ndim == 1 else self.scale[:, None])).reshape(rhs.shape[0], -1)
        unscaled = 1.0 / self.scale                                   # D^{1/2}
        X = np.empty_like(B)
        for col in range(B.shape[1]):
            b = B[:, col]
            c = self._apply_S(self.Lt.T @ b)
            y, r = np.zeros_like(c), c.copy()
            zr = precondition(r)
            p, rz = zr.copy(), float(r @ zr)
            goal = forcing * float(np.linalg.norm(b * unscaled))          # ||H x - rhs|| <= forcing ||rhs||
            target = forcing * float(np.linalg.norm(c))
            done = False
            for _ in range(max_iter):
                if float(np.linalg.norm(r)) <= target:
                    # the residual of H x = rhs is D^{1/2} L~ S r (r the capacitance residual)
                    true = float(np.linalg.norm(unscaled * (self.Lt @ self._apply_S(r))))
                    if true <= goal:
                        done = True
                        break
                    target *= 0.5 * goal / true
                q = cap(p)
                step = rz / float(p @ q)
                y += step * p
                r -= step * q
                zr = precondition(r)
                rz, rz_old = float(r @ zr), rz
                p = zr + (rz / rz_old) * p
            if not done:
                return None
            X[:, col] = (b - self.Lt @ self._apply_S(y)) * self.scale
        return X.reshape(rhs.shape)

    def _apply_S_block(self, j: int, X: np.ndarray) -> np.ndarray:
        """S_j X for one block (X (r_j,) or (r_j, k))."""
        out = self.sigma[j] * X
        if self.coef[j] != 0.0:
            out = out + self.coef[j] * np.multiply.outer(self.z[j], self.z[j] @ X)
        return out

    def _apply_S(self, X: np.ndarray) -> np.ndarray:
        """S X for X (R,) or (R, k), block by block: sigma_j X_j + c_j z_j (z_j^T X_j)."""
        out = np.empty_like(X)
        for j, (a, b) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            Xj = X[a:b]
            out[a:b] = self.sigma[j] * Xj
            if self.coef[j] != 0.0:
                out[a:b] += self.coef[j] * np.multiply.outer(self.z[j], self.z[j] @ Xj)
        return out

    def factorise(self) -> "BlockWoodbury":
        """The capacitance's Cholesky, if not made at construction (``factorise=False``)."""
        if self.cho is None and self.bounds[-1]:
            cap = self.Lt.T @ self.Lt
            cap = self._apply_S(self._apply_S(cap).T)
            cap[np.diag_indices_from(cap)] += 1.0
            self.cho = scipy.linalg.cho_factor(cap, check_finite=False)
        return self

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """(D + F F^T)^{-1} rhs, rhs (n,) or (n, k) (the capacitance factorised)."""
        s = self.scale if rhs.ndim == 1 else self.scale[:, None]
        b = rhs * s
        if self.cho is not None:
            u = self._apply_S(scipy.linalg.cho_solve(self.cho, self._apply_S(self.Lt.T @ b), check_finite=False))
            b = b - self.Lt @ u
        return b * s


def woodbury_solve(diag: np.ndarray, F: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """(D + F F^T)^{-1} rhs, D = diag(``diag``) > 0, F (n, R), rhs (n,) or (n, k) (module docstring)."""
    return Woodbury(diag, F).solve(rhs)


#: Largest (n, n) float64 matrix the solvers materialise on a factor engine (bytes).
DENSE_BYTES_CAP = 1 << 30


def dense_ok(n: int) -> bool:
    """True when an (n, n) float64 matrix fits in DENSE_BYTES_CAP (read at call time)."""
    return 8 * int(n) * int(n) <= DENSE_BYTES_CAP


def frob_inner(F: np.ndarray, G: np.ndarray) -> float:
    """<F F^T, G G^T>_F = ||F^T G||_F^2."""
    P = F.T @ G
    return float(np.sum(P * P))


class LowRank:
    """K = F F^T for F (n, R) (module docstring). Immutable; the (R, R) Gram F^T F is cached."""

    def __init__(self, F: np.ndarray):
        F = np.asarray(F, dtype=np.float64)
        if F.ndim != 2:
            raise ValueError(f"a factor must be (n, R); got shape {F.shape}")
        self.F = F
        self.n, self.rank = F.shape
        self._gram = None

    @property
    def gram(self) -> np.ndarray:
        """(R, R) F^T F."""
        if self._gram is None:
            self._gram = self.F.T @ self.F
        return self._gram

    # ---- products ------------------------------------------------------------------------------
    def matvec(self, v: np.ndarray) -> np.ndarray:
        """K v (v (n,) or (n, k))."""
        return self.F @ (self.F.T @ v)

    __matmul__ = matvec

    def quad(self, v: np.ndarray) -> float:
        """v^T K v = ||F^T v||^2."""
        p = self.F.T @ v
        return float(p @ p)

    def diagonal(self) -> np.ndarray:
        return np.einsum("ir,ir->i", self.F, self.F)

    def trace(self) -> float:
        return float(np.sum(self.F * self.F))

    def frobenius_norm(self) -> float:
        """||K||_F = ||F^T F||_F."""
        return float(np.linalg.norm(self.gram))

    def dense(self) -> np.ndarray:
        """The (n, n) matrix (tests and small n only)."""
        return self.F @ self.F.T

    def centred(self) -> LowRank:
        """H K H = F_c F_c^T, F_c = F - mean of the rows."""
        return LowRank(self.F - self.F.mean(axis=0, keepdims=True))

    # ---- ridge solves ----------------------------------------------------------------------------
    def ridge_solve(self, B: np.ndarray, lam: float) -> np.ndarray:
        """(K + lam I)^{-1} B by Woodbury: (B - F (lam I_R + F^T F)^{-1} F^T B) / lam (lam > 0)."""
        if self.rank == 0:
            return B / lam
        S = self.gram + lam * np.eye(self.rank)
        factor = scipy.linalg.cho_factor(S, lower=True, check_finite=False)
        return (B - self.F @ scipy.linalg.cho_solve(factor, self.F.T @ B, check_finite=False)) / lam

    def ridge_dual(self, t: np.ndarray, lam: float) -> tuple[np.ndarray, float]:
        """(alpha*, J): alpha* = (K + lam I)^{-1} t, J = (1/2) t^T alpha* (``_final_fit.ridge_dual``)."""
        alpha = self.ridge_solve(t, lam)
        return alpha, 0.5 * float(t @ alpha)

    def kernel_ridge(self, y: np.ndarray, lam: float) -> tuple[np.ndarray, float]:
        """(c, b) minimising ||K c + b 1 - y||^2 + lam c^T K c: c = (K + lam I)^{-1} (y - b 1) with
        1^T c = 0, so b = 1^T A^{-1} y / 1^T A^{-1} 1 (A = K + lam I; the bordered system of
        ``_final_fit.kernel_ridge`` solved by elimination)."""
        Z = self.ridge_solve(np.column_stack([y, np.ones(self.n)]), lam)
        b = float(Z[:, 0].sum() / Z[:, 1].sum())
        return Z[:, 0] - b * Z[:, 1], b

    # ---- alignment -------------------------------------------------------------------------------
    def centred_alignment(self, y: np.ndarray) -> float:
        """A_c(K, y y^T) = y_c^T K_c y_c / (||K_c||_F ||y_c||^2) (``_final_fit.centred_alignment``)."""
        Kc = self.centred()
        yc = y - y.mean()
        denom = Kc.frobenius_norm() * float(yc @ yc)
        return Kc.quad(yc) / denom if denom > 0 else 0.0


def weighted_factor(factors: dict, weights: dict, n: int) -> np.ndarray:
    """(n, R) [sqrt(w_k) L_k] over the keys with w_k > 0 (in the order of ``weights``); ``factors`` maps
    key -> L_k (n, r). F F^T = sum_k w_k L_k L_k^T ((n, 0) when no weight is positive)."""
    cols = [np.sqrt(w) * factors[k] for k, w in weights.items() if w > 0.0]
    return np.concatenate(cols, axis=1) if cols else np.zeros((n, 0))


def segment_search(FA: np.ndarray, FB: np.ndarray, t: np.ndarray, lam: float) -> tuple[float, float]:
    """argmin over eta in [0, 1] of J(eta) = (1/2) t^T ((1 - eta) A + eta B + lam I)^{-1} t for
    A = FA FA^T, B = FB FB^T, in the R-space of F = [FA, FB] (``_final_fit.exact_segment_search`` on
    factors). With D(eta) = diag((1 - eta) 1, eta 1), G = F^T F, z = F^T t and
    S = lam I + D^{1/2} G D^{1/2}: (F D F^T + lam I)^{-1} t = (t - F D^{1/2} S^{-1} D^{1/2} z) / lam, and
    J'(eta) = -(1/2) (||FB^T alpha||^2 - ||FA^T alpha||^2) increases with eta (J convex); its root is
    found by bisection to 1e-15 as in the dense search. O(n R^2) once, then O(R^3) per evaluation.
    Returns (eta, J(eta))."""
    F = np.concatenate([FA, FB], axis=1)
    RA = FA.shape[1]
    G = F.T @ F
    z = F.T @ t
    tt = float(t @ t)
    R = F.shape[1]

    def state(eta):
        d = np.concatenate([np.full(RA, 1.0 - eta), np.full(R - RA, eta)])
        s = np.sqrt(d)
        S = lam * np.eye(R) + s[:, None] * G * s[None, :]
        w = s * np.linalg.solve(S, s * z)        # F^T alpha = (z - G w) / lam, t^T alpha = (tt - z^T w) / lam
        return (z - G @ w) / lam, 0.5 * (tt - float(z @ w)) / lam

    def slope(eta):
        p, _ = state(eta)
        return -0.5 * (float(p[RA:] @ p[RA:]) - float(p[:RA] @ p[:RA]))

    return root_of_increasing(slope, lambda eta: state(eta)[1])


def newton_root_of_increasing(at, tol: float = 1e-15, max_steps: int = 100) -> tuple[float, float]:
    """(eta, J(eta)) at the minimiser over [0, 1] of a convex J, from ``at(eta) = (J, J', J'')``: an endpoint
    where J' does not change sign, else the root of J' by safeguarded Newton: the bracket [lo, hi] with
    J'(lo) < 0 < J'(hi) shrinks at every evaluation, and a Newton step that would leave it (or J'' = 0)
    is replaced by the bisection step. Stops when the bracket is narrower than ``tol``, the Newton step is
    below ``tol``, or |J'| has fallen below 1e-13 of |J'(0)| (Newton converges quadratically: the next step
    would move eta by ~1e-13 of the first step, below what the float64 J can resolve)."""
    J1, d1, _ = at(1.0)
    if d1 <= 0.0:
        return 1.0, J1
    J0, d0, h0 = at(0.0)
    if d0 >= 0.0:
        return 0.0, J0
    lo, hi = 0.0, 1.0
    eta, J, d, h = 0.0, J0, d0, h0
    for _ in range(max_steps):
        step = -d / h if h > 0.0 else np.inf
        nxt = eta + step
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        J, d, h = at(nxt)
        if abs(nxt - eta) <= tol or abs(d) <= 1e-13 * abs(d0):
            return nxt, J
        eta = nxt
        if d < 0.0:
            lo = eta
        else:
            hi = eta
        if hi - lo <= tol:
            break
    return eta, J


def root_of_increasing(slope, value) -> tuple[float, float]:
    """(eta, value(eta)) at the minimiser over [0, 1] of a convex J with derivative ``slope``
    (increasing): an endpoint where the slope does not change sign, else its root by bisection to 1e-15.
    The line search of both segment searches (dense and on factors)."""
    if slope(1.0) <= 0.0:
        return 1.0, value(1.0)
    if slope(0.0) >= 0.0:
        return 0.0, value(0.0)
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if slope(mid) < 0.0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15:
            break
    eta = 0.5 * (lo + hi)
    return eta, value(eta)
