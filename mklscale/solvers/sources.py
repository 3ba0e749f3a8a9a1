"""Kernel sources for the Afkanpour solvers (sgd.py, gcd.py): where the kernels K_i come from.

Three kinds, one small interface (``key`` identifies a kernel; it is an int for a finite bank and a
tuple for a family):

    n                         number of training points
    finite                    True for a bank (keys are 0..M-1 and MKLResult.weights has length M)
    block(key)                (n, n) training Gram matrix of one kernel
    argmax_frobenius(A)       (key, value): the kernel maximising <A, K_key>_F (A symmetric (n, n)),
                              the greedy step of GCD (A = alpha alpha^T for (5.3)/(5.4), A = the
                              centred F' for (5.6), A = K*_c - K for Algorithm 8)
    describe(key)             JSON-safe description of a kernel
    cross(X_new, keys)        (len(keys), n_new, n) cross kernels K_key(X_new, X_train)

``FiniteBank(engine)`` answers through the engine only (a full pass for argmax: ``quad_forms`` when
A = alpha alpha^T, ``frobenius`` otherwise; ``blocks`` for single kernels). ``block`` gives the
(n, n) kernel whatever the engine stores (a factor engine's L L^T, below the dense cap of
``lowrank``) and ``factor`` the stored factor L of a factor engine. ``choose(dense, low_rank)``
returns the one of its two arguments that fits how the solvers combine this source's kernels: the
engine's kernel representation chooses (``low_rank`` on a factor engine above the dense cap: the
solvers then work on factors and never form an (n, n) matrix, issue 17); a family always chooses
``dense``. The families never materialise their index set:

- ``PolynomialFamily`` (thesis 4.2.1): all ordered multi-indices (r_1..r_d), 0 <= d <= D, over r
  base kernels, kernel prod_i K_{r_i} (Hadamard), weight rho_d by degree; |I| = sum_d r^d
  (1 010 101 for r = 100, D = 3). ``sample`` is Algorithm 3 (exact draw from q).
- ``GaussianFamily`` (4.2.2): k_sigma(x, x') = exp(-||x - x'||^2 / sigma^2) (the thesis' width, i.e.
  the bank's KernelSpec.gaussian(width=sigma / sqrt(2))), or per feature
  exp(-sum_i (x_i - x'_i)^2 / sigma_i^2); sigma in [lower, upper]. ``sample`` is Algorithm 4.
- ``DirichletFamily`` (Chapter 3): k_sigma(x, x') = 1 + 2 cos(sigma ||x - x'||), frequency sigma in
  [lower, upper] (1-D inputs: then it is PSD).

How results over families use MKLResult: the solvers return an ordinary ``MKLResult`` whose
``weights`` index the SELECTED kernels only (in order of first selection), with
``params["kernels"]`` = [source.describe(key) ...] in the same order (JSON-safe, so to_dict /
from_dict keep it). ``source.keys_of(result)`` turns the descriptions back into keys and
``source.predict(result, X_new)`` computes only those cross kernels and calls
``result.decision_function_from_kernels``.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
import scipy.stats

from mklscale.engine.contract import KernelEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers.toolkit.lowrank import dense_ok
from mklscale.solvers._validation import check_engine

#: restarts of the 1-D width search (thesis 6.1.5 / 6.2: 10^{-3..5}), clipped to the interval
WIDTH_RESTARTS = tuple(10.0 ** k for k in range(-3, 6))


# ---- finite bank -----------------------------------------------------------------------------------
class FiniteBank:
    """A finite kernel bank behind an engine; keys are kernel indices 0..M-1."""

    finite = True

    def __init__(self, engine):
        self.n, self.M, _ = check_engine(engine)
        self.engine = engine

    def choose(self, dense, low_rank):
        """``low_rank`` where the solvers work on ``factor(key)`` (a factor engine above the dense cap
        of ``lowrank``), else ``dense`` (module docstring)."""
        return self.engine.kernel_representation.choose(dense, low_rank, dense_fits=dense_ok(self.n))

    def block(self, key) -> np.ndarray:
        """(n, n) float64 K_key (L L^T on a factor engine)."""
        return self.engine.kernel_representation.dense_block(self.engine.blocks([int(key)])[0])

    def factor(self, key) -> np.ndarray:
        """(n, r) float64 L_key with K~_key = L_key L_key^T (factor engines only)."""
        return np.asarray(self.engine.blocks([int(key)])[0], dtype=np.float64)

    def quad_forms(self, alpha) -> np.ndarray:
        """(M,) alpha^T K_m alpha, one pass."""
        return np.asarray(self.engine.quad_forms(alpha), dtype=np.float64)

    def frobenius(self, A) -> np.ndarray:
        """(M,) <K_m, A>_F, one pass."""
        return np.asarray(self.engine.frobenius(A), dtype=np.float64)

    def argmax_frobenius(self, A, alpha=None):
        values = self.quad_forms(alpha) if alpha is not None else self.frobenius(A)
        key = int(np.argmax(values))
        return key, float(values[key]), values

    def describe(self, key) -> dict:
        return {"index": int(key)}

    def key_from(self, desc) -> int:
        """The key of ``describe(key)`` (as the families have; solver checkpoints store descriptions)."""
        return int(desc["index"])

    def cross(self, X_new, keys):
        raise InvalidInputError("cross kernels of a bank come from the bank: bank.cross(X_new, kernels=result.active)")


def as_source(source):
    """An engine becomes a FiniteBank; sources pass through."""
    if isinstance(source, (FiniteBank, PolynomialFamily, ContinuousFamily)):
        return source
    if isinstance(source, KernelEngine):
        return FiniteBank(source)
    raise InvalidInputError(f"expected an engine or a kernel source (FiniteBank, PolynomialFamily, GaussianFamily, "
                            f"DirichletFamily); got {type(source).__name__}")


class _FamilyPredict:
    #: families compute their kernels in the driver: no engine, so no passes or bytes read
    engine = None

    def choose(self, dense, low_rank):
        """``dense``: a family's kernels are (n, n) matrices computed in the driver."""
        return dense

    def keys_of(self, result) -> list:
        return [self.key_from(d) for d in result.params["kernels"]]

    def predict(self, result, X_new) -> np.ndarray:
        keys = self.keys_of(result)
        active = [keys[i] for i in result.active]
        return result.decision_function_from_kernels(self.cross(X_new, active))


# ---- polynomial product family -------------------------------------------------------------------
class LinearBase:
    """r = d base kernels k_j(x, x') = x_j x'_j (one per column, thesis 6.1.2-6.1.4): rank one each."""

    def __init__(self, X):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] == 0:
            raise InvalidInputError(f"X must be (n, r) with r >= 1 base features; got shape {X.shape} "
                                    "(r = 0 base kernels: nothing to combine)")
        if not np.all(np.isfinite(X)):
            raise InvalidInputError("X contains NaN or inf")
        self.X = X
        self.n, self.r = X.shape

    def sum(self) -> np.ndarray:
        return self.X @ self.X.T

    def traces_with(self, A) -> np.ndarray:
        """(r,) <A, K_j>_F = x_j^T A x_j."""
        return np.einsum("ij,ij->j", A @ self.X, self.X)

    def hadamard(self, A, j) -> np.ndarray:
        x = self.X[:, j]
        return A * np.outer(x, x)

    def product(self, z) -> np.ndarray:
        f = np.prod(self.X[:, list(z)], axis=1) if len(z) else np.ones(self.n)
        return np.outer(f, f)

    def cross_product(self, X_new, z) -> np.ndarray:
        X_new = np.asarray(X_new, dtype=np.float64)
        if X_new.ndim != 2 or X_new.shape[1] != self.r:
            raise InvalidInputError(f"X_new must be (n_new, {self.r}); got {X_new.shape}")
        fn = np.prod(X_new[:, list(z)], axis=1) if len(z) else np.ones(X_new.shape[0])
        ft = np.prod(self.X[:, list(z)], axis=1) if len(z) else np.ones(self.n)
        return np.outer(fn, ft)


class GramBase:
    """r dense base Gram matrices (r, n, n), optional cross Grams (r, n_new, n) for prediction."""

    def __init__(self, grams, cross_grams=None):
        grams = np.asarray(grams, dtype=np.float64)
        if grams.ndim != 3 or grams.shape[0] == 0 or grams.shape[1] != grams.shape[2]:
            raise InvalidInputError(f"grams must be (r, n, n) with r >= 1; got shape {grams.shape}")
        self.grams = grams
        self.r, self.n = grams.shape[0], grams.shape[1]
        self.cross_grams = None if cross_grams is None else np.asarray(cross_grams, dtype=np.float64)

    def sum(self):
        return self.grams.sum(axis=0)

    def traces_with(self, A):
        return np.einsum("ij,mij->m", A, self.grams)

    def hadamard(self, A, j):
        return A * self.grams[j]

    def product(self, z):
        out = np.ones((self.n, self.n))
        for j in z:
            out = out * self.grams[j]
        return out

    def cross_product(self, X_new, z):
        if self.cross_grams is None:
            raise InvalidInputError("GramBase has no cross_grams; pass them to predict")
        out = np.ones(self.cross_grams.shape[1:])
        for j in z:
            out = out * self.cross_grams[j]
        return out


class PolynomialFamily(_FamilyPredict):
    """Products of base kernels up to degree D (thesis 4.2.1); keys are ordered multi-indices (tuples).

    ``base``: an (n, r) feature matrix (linear base kernel per column) or a ``LinearBase``/``GramBase``.
    ``rho2``: (D + 1,) the squared weights rho_d^2 by degree (default all ones).
    """

    finite = False

    def __init__(self, base, D: int, rho2=None):
        if isinstance(D, bool) or not isinstance(D, (int, np.integer)) or D < 1:
            raise InvalidInputError(f"D (maximum degree) must be an integer >= 1; got {D!r}")
        self.base = base if isinstance(base, (LinearBase, GramBase)) else LinearBase(base)
        if self.base.r < 1:
            raise InvalidInputError("the polynomial family needs r >= 1 base kernels; got r = 0")
        self.D = int(D)
        self.rho2 = np.ones(self.D + 1) if rho2 is None else np.asarray(rho2, dtype=np.float64).reshape(-1)
        if self.rho2.size != self.D + 1 or not np.all(self.rho2 > 0) or not np.all(np.isfinite(self.rho2)):
            raise InvalidInputError(f"rho2 must hold D + 1 = {self.D + 1} positive finite values; got {self.rho2}")
        self.n, self.r = self.base.n, self.base.r
        S = self.base.sum()
        self.S_powers = [np.ones((self.n, self.n))]
        for _ in range(self.D):
            self.S_powers.append(self.S_powers[-1] * S)

    @property
    def size(self) -> int:
        """|I| = sum_{d=0}^D r^d ordered multi-indices."""
        return sum(self.r ** d for d in range(self.D + 1))

    def weight(self, key) -> float:
        """1 / rho_d^2 for a key of degree d."""
        return 1.0 / self.rho2[len(key)]

    def block(self, key) -> np.ndarray:
        return self.base.product(key)

    def degree_masses(self, alpha) -> np.ndarray:
        """delta(d) = rho_d^{-2} <alpha alpha^T, S^{o d}>, d = 0..D (Algorithm 3 line 7)."""
        return np.array([alpha @ P @ alpha for P in self.S_powers]) / self.rho2

    def sample(self, alpha, rng):
        """Algorithm 3: one multi-index drawn from q_I ∝ rho_d^{-2} alpha^T K_I alpha (exactly).

        Returns (key, K_key, q_key, prob, C) with q_key = rho_d^{-2} alpha^T K_key alpha, prob = q_key / sum delta
        its probability and C = sum_d delta(d) = sum_I q_I (the gradient's l1 norm is C / 2).
        """
        delta = np.maximum(self.degree_masses(alpha), 0.0)
        C = float(delta.sum())
        d = int(rng.choice(self.D + 1, p=delta / C))
        M = np.outer(alpha, alpha)
        z = []
        for i in range(1, d + 1):
            w = np.maximum(self.base.traces_with(M * self.S_powers[d - i]), 0.0)
            j = int(rng.choice(self.r, p=w / w.sum()))
            z.append(j)
            M = self.base.hadamard(M, j)
        key = tuple(z)
        K = self.block(key)
        q = float(alpha @ K @ alpha) / self.rho2[d]
        return key, K, q, q / C, C

    def brute_force_q(self, alpha) -> dict:
        """{key: q_key} over the whole (small!) index set — for tests only."""
        import itertools

        out = {}
        for d in range(self.D + 1):
            for key in itertools.product(range(self.r), repeat=d):
                out[key] = float(alpha @ self.block(key) @ alpha) / self.rho2[d]
        return out

    def uniform_gram(self) -> np.ndarray:
        """sum over the whole index set with unit weights / rho_d^2 = sum_d rho_d^{-2} S^{o d} (UNIFORM)."""
        return sum(P / w for P, w in zip(self.S_powers, self.rho2))

    def uniform_cross(self, X_new) -> np.ndarray:
        if not isinstance(self.base, LinearBase):
            raise InvalidInputError("uniform_cross needs a LinearBase")
        S = np.asarray(X_new, dtype=np.float64) @ self.base.X.T
        return sum((S ** d) / self.rho2[d] for d in range(self.D + 1))

    def describe(self, key) -> dict:
        return {"multi_index": [int(j) for j in key]}

    def key_from(self, desc) -> tuple:
        return tuple(int(j) for j in desc["multi_index"])

    def cross(self, X_new, keys) -> np.ndarray:
        return np.stack([self.base.cross_product(X_new, k) for k in keys])


# ---- continuous families ------------------------------------------------------------------------------
def check_interval(interval, what="widths") -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise InvalidInputError(f"the {what} interval must be two numbers (lower, upper); got {interval!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi <= 0:
        raise InvalidInputError(f"the {what} interval must have finite positive ends; got ({lo}, {hi})")
    if lo >= hi:
        raise InvalidInputError(f"the {what} interval needs lower < upper; got ({lo}, {hi})")
    return lo, hi


class ContinuousFamily(_FamilyPredict):
    """Kernels k_sigma indexed by a parameter in a box; subclasses give the kernel and its restarts.

    Keys are tuples of floats (length 1, or one per feature for ``per_feature``).
    """

    finite = False
    per_feature = False

    def __init__(self, X, interval, log_scale: bool):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2 or X.shape[1] == 0 or X.shape[0] < 2:
            raise InvalidInputError(f"X must be (n, d) with n >= 2, d >= 1; got shape {X.shape}")
        if not np.all(np.isfinite(X)):
            raise InvalidInputError("X contains NaN or inf")
        self.X = X
        self.n, self.d = X.shape
        self.lower, self.upper = check_interval(interval, self.param_name)
        self.log_scale = log_scale

    # subclasses: kernel_of(key, X_a, X_b), _restarts()
    def block(self, key) -> np.ndarray:
        return self.kernel_of(key, self.X, self.X)

    def cross(self, X_new, keys) -> np.ndarray:
        X_new = np.asarray(X_new, dtype=np.float64)
        if X_new.ndim == 1:
            X_new = X_new[:, None]
        return np.stack([self.kernel_of(k, X_new, self.X) for k in keys])

    def describe(self, key) -> dict:
        return {self.param_name: [float(v) for v in key]}

    def key_from(self, desc) -> tuple:
        return tuple(float(v) for v in desc[self.param_name])

    # ---- 1-D search with restarts (thesis 5.2 (5.4), 5.3 (5.6), 6.1.5: Matlab fmincon; here L-BFGS-B)
    def _to_u(self, s):
        return np.log(s) if self.log_scale else s

    def _from_u(self, u):
        return np.exp(u) if self.log_scale else u

    def argmax_1d(self, A) -> tuple[float, float]:
        """argmax over sigma in [lower, upper] of <A, K_sigma> (one shared sigma): the best of the
        local optima started from every restart point."""
        lo_u, hi_u = self._to_u(self.lower), self._to_u(self.upper)
        best = (-np.inf, None)
        for s0 in self._restarts():
            res = scipy.optimize.minimize(lambda u: -self._frob1(A, self._from_u(u[0])), [self._to_u(s0)],
                                          method="L-BFGS-B", bounds=[(lo_u, hi_u)])
            val = -float(res.fun)
            if val > best[0]:
                best = (val, float(self._from_u(res.x[0])))
        return best[1], best[0]

    def _frob1(self, A, s) -> float:
        return float(np.sum(A * self.kernel_of((s,) * (self.d if self.per_feature else 1), self.X, self.X)))

    def argmax_frobenius(self, A, alpha=None, reg: float = 0.0):
        """(key, <A, K_key>, None). 1-D: restarts; per-feature: one L-BFGS-B run started from the 1-D
        optimum (thesis 5.3 / 6.2), maximising <A, K_sigma> - reg ||sigma - mean(sigma)||^2."""
        if alpha is not None:
            A = np.outer(alpha, alpha)
        s1, v1 = self.argmax_1d(A)
        if not self.per_feature:
            return (s1,), v1, None
        key, val = self._argmax_per_feature(A, s1, reg)
        return key, val, None

    def sample(self, alpha, rng):
        """Algorithm 4 (per-feature) / the 1-D truncated-normal sampler of 4.2.2.

        For each coordinate in turn: sigma* = argmax tr(M K_sigma) (1-D search), draw sigma_i from the
        normal with mean sigma* and sd ``sigma*`` (the thesis' heuristic variance sigma*^2) truncated
        to [lower, upper]; M <- M o K_{sigma_i}; P <- P * density. Returns (key, K, q, density, None),
        q = alpha^T K alpha.
        """
        M = np.outer(alpha, alpha)
        coords = self.d if self.per_feature else 1
        sig, P = [], 1.0
        for i in range(coords):
            fam_i = self._coordinate_family(i)
            s_star, _ = fam_i.argmax_1d(M)
            sd = s_star
            a, b = (self.lower - s_star) / sd, (self.upper - s_star) / sd
            s_i = float(scipy.stats.truncnorm.rvs(a, b, loc=s_star, scale=sd, random_state=rng))
            P *= float(scipy.stats.truncnorm.pdf(s_i, a, b, loc=s_star, scale=sd))
            sig.append(s_i)
            M = M * fam_i.block((s_i,))
        key = tuple(sig)
        K = self.block(key)
        return key, K, float(alpha @ K @ alpha), P, None

    def _coordinate_family(self, i):
        raise NotImplementedError


class GaussianFamily(ContinuousFamily):
    """k_sigma(x, x') = exp(-||x - x'||^2 / sigma^2) (thesis (4.19)); ``per_feature=True``:
    exp(-sum_i (x_i - x'_i)^2 / sigma_i^2) ((4.20)). Interval default [1e-4, 1e4] (thesis 6.1.5)."""

    param_name = "widths"

    def __init__(self, X, interval=(1e-4, 1e4), per_feature: bool = False):
        super().__init__(X, interval, log_scale=True)
        self.per_feature = bool(per_feature)
        self._sq = (self.X[:, None, :] - self.X[None, :, :]) ** 2     # (n, n, d) per-feature squared distances
        self._D = self._sq.sum(axis=2)

    def kernel_of(self, key, Xa, Xb) -> np.ndarray:
        s = np.asarray(key, dtype=np.float64)
        if Xa is self.X and Xb is self.X:
            if s.size == 1:
                return np.exp(-self._D / s[0] ** 2)
            return np.exp(-(self._sq @ (1.0 / s ** 2)))
        sq = (Xa[:, None, :] - Xb[None, :, :]) ** 2
        return np.exp(-(sq @ (np.full(self.d, 1.0 / s[0] ** 2) if s.size == 1 else 1.0 / s ** 2)))

    def _restarts(self):
        pts = [s for s in WIDTH_RESTARTS if self.lower <= s <= self.upper]
        return pts or [math.sqrt(self.lower * self.upper)]

    def _argmax_per_feature(self, A, s1, reg):
        lo, hi = math.log(self.lower), math.log(self.upper)
        Aw = A[:, :, None] * self._sq     # (n, n, d)

        def negobj(u):
            s = np.exp(u)
            K = np.exp(-(self._sq @ (1.0 / s ** 2)))
            val = float(np.sum(A * K)) - reg * float(np.sum((s - s.mean()) ** 2))
            # d/du_i exp(-sum_j D_j / s_j^2) = K * 2 D_i / s_i^2 ;  d/du_i of the penalty: 2 reg s_i (s_i - mean)
            grad = 2.0 * np.einsum("ijk,ij->k", Aw, K) / s ** 2 - reg * 2.0 * s * (s - s.mean())
            return -val, -grad

        res = scipy.optimize.minimize(negobj, np.full(self.d, math.log(s1)), jac=True, method="L-BFGS-B",
                                      bounds=[(lo, hi)] * self.d)
        s = np.exp(res.x)
        return tuple(float(v) for v in s), float(np.sum(A * self.block(tuple(s))))

    def _coordinate_family(self, i):
        return GaussianFamily(self.X[:, [i]], (self.lower, self.upper))


class DirichletFamily(ContinuousFamily):
    """k_sigma(x, x') = 1 + 2 cos(sigma ||x - x'||) (thesis Ch. 3), frequency sigma in [lower, upper].

    The 1-D search restarts from a grid of ``n_restarts`` frequencies (the objective oscillates in sigma).
    """

    param_name = "frequencies"

    def __init__(self, X, interval=(0.05, 20.0), n_restarts: int = 200):
        super().__init__(X, interval, log_scale=False)
        self._dist = np.sqrt(((self.X[:, None, :] - self.X[None, :, :]) ** 2).sum(axis=2))
        self.n_restarts = int(n_restarts)

    def kernel_of(self, key, Xa, Xb) -> np.ndarray:
        s = float(key[0])
        dist = self._dist if (Xa is self.X and Xb is self.X) else np.sqrt(((Xa[:, None, :] - Xb[None, :, :]) ** 2).sum(axis=2))
        return 1.0 + 2.0 * np.cos(s * dist)

    def _restarts(self):
        grid = np.linspace(self.lower, self.upper, self.n_restarts)
        vals = [self._frob1(self._A, s) for s in grid] if hasattr(self, "_A") else None
        return grid if vals is None else grid[np.argsort(vals)[-5:]]

    def argmax_1d(self, A):
        self._A = A  # restarts: the 5 best grid frequencies, each refined locally
        try:
            return super().argmax_1d(A)
        finally:
            del self._A
