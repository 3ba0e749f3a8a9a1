"""SGD-1s: projected stochastic gradient for one-stage MKL with importance-sampled kernels
(Afkanpour thesis Chapter 4, Algorithm 2; NOTES-afkanpour.md §2).

Problem (2.9)/(4.7) with the squared loss, written with the convention of ``_final_fit``:

    min_{theta in Delta_nu} J(theta) = (1/2) t^T (K_theta + lam I)^{-1} t,   K_theta = sum_i theta_i K_i / rho_i^2,
    Delta_nu = {theta >= 0, ||theta||_nu <= 1},  alpha* = (K_theta + lam I)^{-1} t,  t = y - b,
    g_i = dJ/dtheta_i = -(1/2) alpha*^T K_i alpha* / rho_i^2  (4.12)   (all <= 0)

Iteration k (Algorithm 2, Psi = (1/2)||x||^2, theta^0 = 0):
  1. alpha* from a Cholesky solve with the driver-side K_theta (kept up to date incrementally);
  2. draw I ~ s_{k-1} and form g^ = (g_I / s_I) e_I (4.14), unbiased whenever s > 0 where g != 0;
  3. theta <- Proj_{Delta_nu}(theta - eta g^), i.e. theta_I += eta (1/2) q_I / s_I, q_I = alpha*^T K_I alpha*/rho_I^2
     (the printed "g^ = C e_I" drops the minus sign: the update INCREASES theta_I; the 1/2 of (4.12),
     dropped in (4.18)/Algorithm 3, is kept here — it only rescales the step);
     for nu = 2 the projection of a non-negative vector is theta / max(1, ||theta||_2) (a scaling, O(1)
     with a lazy global factor); other nu (finite banks only) use the exact Euclidean projection onto
     {theta >= 0, ||theta||_nu <= 1} (a 1-D Newton root, ``project_nonneg_nu_ball``) and rebuild K_theta with engine.combine.

Sampling distributions s:
- finite bank: s = (1 - mix) q^ref / sum q^ref + mix / M, with q^ref from ONE quad_forms pass at the
  latest refresh (every ``refresh`` iterations). s is fixed before each draw, so the estimate stays
  unbiased; between refreshes an iteration reads ONE sampled kernel (engine.blocks).
- PolynomialFamily: Algorithm 3 draws exactly from q (s = q) without enumerating the index set.
- Gaussian/Dirichlet families: Algorithm 4 (truncated normal around sigma*), s = its density
  (thesis 4.2.2; no variance bound is proven there). Coordinates are point masses at the drawn widths.

Step size: ``step`` a number = the constant eta of Algorithm 2 (the thesis' experiments use 1/sqrt(T)
on their scale). step="auto" (default) = eta0 / (C_ref sqrt(T)) with C_ref = ||grad J||_1 at the
latest refresh (finite bank; for the polynomial family the exact C of the current draw, for
continuous families an exponentially weighted mean, weights (1 - 1/C_WINDOW)^age with C_WINDOW = 20,
of the unbiased estimates (1/2) q / s of the previous draws). A plain mean over ALL previous draws
(used before) is dominated by the early draws, where alpha* = (K_theta + lam I)^{-1} t is large
because K_theta is still small: the step then shrinks as the solver progresses. Measured on the
1-D problem of tests/test_sgd.py (n = 60, lam = 0.1, seed 0): J(theta_bar) / J(best single width)
at T = 300 went from 1.3 (all-draws mean; T = 400) to 0.45 (window 20). With
s = q every step then adds exactly eta0 / sqrt(T) to one coordinate: the step is invariant to the
scale of y, lam and the kernels. (Corollary 4.3's eta = 1/sqrt(B T), B = C^2/2 max q/s, is the same
rule with a fixed C; using the latest C is an F_{k-1}-measurable adaptive choice outside its proof.)

Returned model: the averaged iterate by default, or the last one (``iterate="last"``); the other is
summarised in ``params``. The average is a SUFFIX average: theta_bar = (1/(T - T0)) sum_{k=T0+1}^T
theta^{(k-1)}, T0 = floor(average_from * T), default average_from = 0.5 (the second half;
average_from = 0 is the full average (1/T) sum_{k=1}^T theta^{(k-1)} of Corollary 4.3). The suffix
average keeps the O(1/sqrt(T)) guarantee for convex J (Rakhlin, Shamir & Sridharan 2012, "Making
gradient descent optimal ...", and Shamir & Zhang 2013 for the constant-step case) and drops the
transient from theta^0 = 0, which dominates the full average at moderate T: on the 6-kernel bank of
tests/test_sgd.py (n = 25, lam = 0.1, seed 3) J(theta_bar)/J* - 1 is 4.4e-2 (full) vs 3.9e-3
(second half) at T = 4000, and 7.5e-3 -> 3.9e-3 -> 1.4e-3 at T = 1000, 4000, 16000 for the suffix
average (measured once, not a guarantee; the test states its own tolerances).
``params["averaged_iterates"]`` = T - T0.
Stopping (finite banks): every refresh's pass gives q at the current iterate theta^(k-1), so its
Frank-Wolfe gap G(theta) = (1/2)(||q||_{nu*} - q^T theta) >= J(theta) - J* (J convex; ``certified_gap``)
costs nothing more. The solver stops at the first refresh (k > 1) with G / J(theta) <= ``tol`` (default
DEFAULT_TOL) and returns that iterate, certified (``params["returned_iterate"] = "last"``); otherwise it
runs all T iterations, returns ``iterate``'s model and certifies it with one more pass (``gap``;
``converged`` = gap <= tol, always True for tol=None). Families have no full gradient: gap NaN, T draws.

Zero gradient: if every q_i = alpha*^T K_i alpha* / rho_i^2 vanishes at theta^0 = 0 (a constant target,
for which t = 0 exactly, or kernels whose range t is orthogonal to, e.g. constant kernels with a centred t),
J is constant on Delta_nu (q_i = t^T K_i t / lam^2 does not depend on theta) and theta = 0 is optimal: the
Frank-Wolfe gap of theta = 0, max_{theta in Delta_nu} <-grad J(0), theta> = (1/2)||q||_{nu*}
(1/nu + 1/nu* = 1), bounds J(0) - J*; when it is <= ZERO_GRADIENT_RTOL J(0) (finite banks; families: t = 0)
the solver stops at iteration 1 with the intercept-only model f = b (weights 0, converged, ``gap`` = that
relative gap) instead of sampling from an all-zero distribution. f = K_theta alpha*(theta) + b: weights = theta / rho^2, dual_coef = alpha*, bias = b. For
families, weights index the selected kernels in ``params["kernels"]`` (see ``sources``); polynomial
multi-indices that are permutations of each other (the same kernel) are merged there.

Factor engines (issue 17): below the dense cap of ``lowrank`` the kernels are squared factors and
everything above holds. Above it K_theta is a factor (``_FactorIterate``: [sqrt(theta_i / rho_i^2) L_i]
over the sampled kernels, formed from theta each iteration), alpha* comes from a Woodbury solve
(O(n R^2), R = r x the number of sampled kernels), q_I = ||L_I^T alpha*||^2; same draws, same problem.

Checkpoints (``fit(..., checkpoint=Checkpoint(...))``, mklscale.runtime.checkpoint): ``checkpoint.step``
runs before every iteration (cheap; it writes only when due or on SIGTERM/SIGINT). The state
(``_Loop.state``) is: the iterate theta (keys as ``source.describe`` dicts in selection order, u, the
lazy scale, 1/rho^2 per key), K_theta and the running sum of K_theta of the averaged iterate (two
driver (n, n) matrices: exact copies, since recomputing them from theta changes their rounding), the
lazy averaging sums (the count of averaged iterates; iterations k <= T0 add nothing), the sampling distribution and C of the latest refresh, the running C estimate
of continuous families, the random generator's state, blocks read, the history and the time / pass
counters. A resumed run draws the same kernels and is bit-identical; its first new history entry has
``"resumed": True``. The caller's fingerprint must identify the source (bank), y, lam, seed and every
other parameter.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from mklscale.engine.kernels import axpy_rows
from mklscale.errors import InvalidInputError
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers import _final_fit
from mklscale.solvers.toolkit.lowrank import LowRank, weighted_factor
from mklscale.solvers._validation import check_count, check_positive, check_targets
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog
from mklscale.solvers.sources import PolynomialFamily, as_source


#: continuous families: C of the step is an exponentially weighted mean of the previous estimates
#: (1/2) q / s with weights (1 - 1/C_WINDOW)^age (an effective window of ~20 draws; module docstring)
C_WINDOW = 20.0

#: the default stopping tolerance: the relative Frank-Wolfe gap (J(theta) - J* <= gap) the current iterate
#: must certify at a refresh. The constant step eta0 / (C sqrt(T)) leaves the iterates on a noise floor of
#: 1-4 % relative gap, reached by about iteration 350 of T = 1000 on every shipped dataset (benchmarks:
#: the defaults table); 5 % stops there instead of drawing the remaining ~650 kernels for nothing.
DEFAULT_TOL = 0.05

#: theta^0 = 0 is returned as optimal when its Frank-Wolfe gap (1/2)||q||_{nu*} (module docstring) is at
#: most this share of J(0): then J(0) - J* <= ZERO_GRADIENT_RTOL J(0) (constant target or kernels)
ZERO_GRADIENT_RTOL = 1e-12


def project_nonneg_nu_ball(v: np.ndarray, nu: float, info: dict | None = None) -> np.ndarray:
    """Euclidean projection of v onto {theta >= 0, ||theta||_nu <= 1} (nu >= 1, or inf), exact to rounding.

    Clip at 0 (the projection of v and of max(v, 0) coincide on the orthant); if ||v||_nu <= 1 that is the
    answer. Otherwise: nu = inf: min(v, 1); nu = 2: v / ||v||_2; nu = 1: (v - tau)_+ with sum 1 (sorting
    rule); any other nu: the KKT conditions of min (1/2)||theta - v||^2 s.t. sum theta_i^nu <= 1 are
    theta_i + mu theta_i^(nu-1) = v_i (mu = nu x the multiplier; theta_i in [0, v_i]) and
    sum_i theta_i(mu)^nu = 1, a 1-D root in mu with phi(mu) = sum theta_i(mu)^nu - 1 decreasing. It is found
    by safeguarded Newton on log S(mu), S = phi + 1, against log mu inside the bracket [max(v_max - 1, 0),
    (v_max - m^(-1/nu)) m^((nu-1)/nu)] (m = #{v_i > 0}; ``_project_general``), each theta_i(mu) by monotone
    Newton (``_theta_of_mu``); typically 4-8 evaluations of theta(mu) (a nested bisection took 80 x 80).
    ``info``: a dict, filled with {"evaluations", "newton_steps"} of that search (0 on the other paths).
    """
    v = np.maximum(np.asarray(v, dtype=np.float64), 0.0)
    if info is not None:
        info.update(evaluations=0, newton_steps=0)
    if math.isinf(nu):
        return np.minimum(v, 1.0)
    if np.sum(v ** nu) <= 1.0:
        return v
    if nu == 2.0:
        return v / np.linalg.norm(v)
    if nu == 1.0:  # theta = (v - tau)_+ with sum = 1 (sorting rule)
        u = np.sort(v)[::-1]
        css = np.cumsum(u)
        k = np.nonzero(u - (css - 1.0) / np.arange(1, u.size + 1) > 0)[0][-1]
        return np.maximum(v - (css[k] - 1.0) / (k + 1), 0.0)
    theta, evaluations, steps = _project_general(np.ascontiguousarray(v), float(nu))
    if info is not None:
        info.update(evaluations=int(evaluations), newton_steps=int(steps))
    return theta


@njit(cache=True)
def _theta_of_mu(v, mu, p, theta):
    """theta_i(mu) in [0, v_i] solving theta_i + mu theta_i^p = v_i (p = nu - 1 > 0), in place; returns
    the Newton steps taken. p >= 1: Newton on theta (h(theta) = theta + mu theta^p - v convex increasing)
    from min(v_i, (v_i / mu)^(1/p)) >= root: the iterates decrease monotonically to the root; p < 1: the
    same on w = theta^p (h(w) = w^(1/p) + mu w - v convex increasing in w) from min(v_i^p, v_i / mu).
    Stops when an iterate no longer decreases (the root to rounding)."""
    steps = 0
    for i in range(v.size):
        vi = v[i]
        if vi <= 0.0:
            theta[i] = 0.0
            continue
        if mu == 0.0:
            theta[i] = vi
            continue
        if p >= 1.0:
            x = min(vi, (vi / mu) ** (1.0 / p))          # both bound the root from above
            for _ in range(2000):
                steps += 1
                xp1 = x ** (p - 1.0)
                h = x + mu * xp1 * x - vi
                if h <= 0.0:
                    break
                x_new = x - h / (1.0 + mu * p * xp1)
                if not x_new < x:
                    break
                x = x_new if x_new > 0.0 else 0.5 * x
            theta[i] = x
        else:
            q = 1.0 / p
            w = min(vi ** p, vi / mu)
            for _ in range(2000):
                steps += 1
                wq1 = w ** (q - 1.0)
                h = wq1 * w + mu * w - vi
                if h <= 0.0:
                    break
                w_new = w - h / (q * wq1 + mu)
                if not w_new < w:
                    break
                w = w_new if w_new > 0.0 else 0.5 * w
            theta[i] = w ** q
    return steps


@njit(cache=True)
def _project_general(v, nu):
    """Projection for 1 < nu < inf, ||v||_nu > 1 (v >= 0): (theta, evaluations of theta(mu), Newton steps).

    Root of phi(mu) = S(mu) - 1, S = sum_i theta_i(mu)^nu (decreasing in mu), by Newton on log S against
    log mu (dS/dmu = -sum_i nu theta_i^(p+1) / (theta_i^(1-p) + mu p), from d theta_i / d mu =
    -theta_i^p / (1 + mu p theta_i^(p-1))), kept inside a bracket [lo, hi] with phi(lo) >= 0 >= phi(hi) and
    replaced by bisection when it leaves it; stops when the Newton step is below rounding."""
    p = nu - 1.0
    theta = np.empty_like(v)
    steps = 0
    # bracket (j = argmax v, m = #{v_i > 0}): at mu = v_j - 1 theta_j = 1, so phi >= 0; at
    # mu = (v_j - m^{-1/nu}) m^{p/nu} theta_j = m^{-1/nu} >= every theta_i, so phi <= 0
    vj = np.max(v)
    m = np.sum(v > 0.0)
    lo = max(vj - 1.0, 0.0)
    hi = max(vj - m ** (-1.0 / nu), 0.0) * m ** (p / nu)
    mu = math.sqrt(lo * hi) if lo > 0.0 else 0.5 * hi
    evals = 0
    for _ in range(200):
        evals += 1
        steps += _theta_of_mu(v, mu, p, theta)
        S = np.sum(theta ** nu)
        phi = S - 1.0
        if phi > 0.0:
            lo = mu
        else:
            hi = mu
        if phi == 0.0:
            break
        dphi = 0.0
        for i in range(v.size):
            t = theta[i]
            if t > 0.0:
                dphi -= nu * t ** p * t / (t ** (1.0 - p) + mu * p)
        # Newton on log S as a function of log mu (far better scaled than S(mu))
        mu_new = mu * math.exp(-math.log(S) * S / (mu * dphi)) if dphi < 0.0 else 0.5 * (lo + hi)
        if abs(mu_new - mu) <= 4e-16 * mu or hi - lo <= 4e-16 * hi:
            break                                   # Newton converged (to rounding) or bracket closed
        if not (lo < mu_new < hi):
            mu_new = 0.5 * (lo + hi)
        mu = mu_new
    return theta, evals, steps


class _Iterate:
    """theta over sampled keys with a lazy global scale (theta_i = scale * u_i), K_theta, and the running
    sums for the averaged iterate; K_theta an (n, n) matrix (``src.choose`` picks this class or
    ``_FactorIterate``)."""

    def __init__(self, src, n: int | None = None):
        self.src = src
        n = src.n if n is None else n
        self.u: dict = {}
        self.kw: dict = {}            # 1 / rho_i^2 of each key
        self.scale = 1.0
        self.sumsq_u = 0.0
        self.K = np.zeros((n, n))
        self.K_sum = np.zeros((n, n))
        self.acc: dict = {}           # sum over past iterations of theta_i, lazily: acc_i + u_i (G - G_last_i)
        self.last_G: dict = {}
        self.G = 0.0                  # sum of past scales
        self.count = 0

    def theta(self, key) -> float:
        return self.scale * self.u.get(key, 0.0)

    def draw(self, key, alpha) -> tuple[np.ndarray, float]:
        """(K_key as this iterate adds it, q = alpha^T K_key alpha) of a sampled kernel of a finite bank."""
        K_key = self.src.block(key)
        return K_key, float(alpha @ K_key @ alpha)

    def combined(self, w_full: np.ndarray):
        """K_theta for the weights ``w_full`` (M,) (the general-nu projection's new theta)."""
        return self.src.engine.combine(w_full)

    def accumulate(self) -> None:
        """Add the current iterate to the running sums (called once per iteration, before the update)."""
        self.K_sum += self.K
        self.G += self.scale
        self.count += 1

    def _settle(self, key) -> None:
        if key in self.u:
            self.acc[key] = self.acc.get(key, 0.0) + self.u[key] * (self.G - self.last_G[key])
        self.last_G[key] = self.G

    def increase(self, key, amount: float, K_key: np.ndarray, weight: float) -> None:
        self._settle(key)
        old = self.u.get(key, 0.0)
        new = old + amount / self.scale
        self.u[key] = new
        self.kw[key] = weight
        self.sumsq_u += new * new - old * old
        self._add(key, amount * weight, K_key)

    def _add(self, key, coefficient: float, K_key: np.ndarray) -> None:
        axpy_rows(K_key, 0, coefficient, self.K)     # K += coefficient K_key in place (the same bits)

    def kernel(self):
        """K_theta of the current iterate."""
        return self.K

    def average_kernel(self):
        """K_theta of the averaged iterate (the current one when nothing was averaged)."""
        return self.K_sum / self.count if self.count else self.K

    def project_nu2(self) -> None:
        norm = self.scale * math.sqrt(max(self.sumsq_u, 0.0))
        if norm > 1.0:
            self.scale /= norm
            self.K /= norm
        if self.scale < 1e-4:
            self._renormalise()

    def _renormalise(self) -> None:
        """Fold the global scale into u (it shrinks geometrically): keeps G - G_last free of cancellation."""
        for k in list(self.u):
            self._settle(k)
        for k in self.u:
            self.u[k] *= self.scale
            self.last_G[k] = 0.0
        self.sumsq_u = float(sum(v * v for v in self.u.values()))
        self.scale, self.G = 1.0, 0.0

    def set_theta(self, keys, values, K_new) -> None:
        """Replace theta (general-nu projection): settle the sums first."""
        for k in list(self.u):
            self._settle(k)
        self.scale, self.G = 1.0, 0.0
        for k, v in zip(keys, values):
            self.u[k] = float(v)
            self.last_G[k] = 0.0
        self.sumsq_u = float(np.sum(np.square(values)))
        self.K = K_new

    def averaged(self) -> dict:
        for k in list(self.u):
            self._settle(k)
        return {k: self.acc.get(k, 0.0) / self.count for k in self.u}

    def last(self) -> dict:
        return {k: self.scale * v for k, v in self.u.items()}

    def state(self, src) -> dict:
        """theta (keys as ``src.describe`` dicts, in insertion order: sums over them keep their order),
        the lazy scale and averaging sums, K_theta and its running sum (exact copies)."""
        keys = list(self.u)
        return {"keys": [src.describe(k) for k in keys], "u": np.array([self.u[k] for k in keys]),
                "kw": np.array([self.kw[k] for k in keys]), "last_G": np.array([self.last_G[k] for k in keys]),
                "acc": np.array([self.acc.get(k, 0.0) for k in keys]),
                "has_acc": np.array([k in self.acc for k in keys], dtype=bool),
                "scale": self.scale, "sumsq_u": self.sumsq_u, "G": self.G, "count": self.count,
                "K": self.K, "K_sum": self.K_sum}

    def restore(self, state: dict, src) -> None:
        """Set everything from :meth:`state`'s dict."""
        keys = [src.key_from(d) for d in state["keys"]]
        self.u = dict(zip(keys, state["u"].tolist()))
        self.kw = dict(zip(keys, state["kw"].tolist()))
        self.last_G = dict(zip(keys, state["last_G"].tolist()))
        self.acc = {k: v for k, v, has in zip(keys, state["acc"].tolist(), state["has_acc"]) if has}
        self.scale, self.sumsq_u, self.G = float(state["scale"]), float(state["sumsq_u"]), float(state["G"])
        self.count, self.K, self.K_sum = int(state["count"]), state["K"], state["K_sum"]


class _FactorIterate(_Iterate):
    """The iterate on a factor engine above the dense cap (issue 17): theta as in ``_Iterate``, K_theta
    never stored but formed from theta as a ``LowRank`` of [sqrt(theta_i / rho_i^2) L_i] over the sampled
    kernels (their factors are kept, n x r each); the averaged K_theta is that of the averaged weights
    (K_sum / count = sum_i theta_bar_i K_i / rho_i^2 exactly in exact arithmetic). A checkpoint holds
    theta only (K and K_sum are empty) and the factors are read again on resume."""

    def __init__(self, src):
        super().__init__(src, 0)
        self.factors: dict = {}

    def draw(self, key, alpha) -> tuple[np.ndarray, float]:
        """(L_key, q = ||L_key^T alpha||^2)."""
        L = self.src.factor(key)
        return L, float(np.sum((L.T @ alpha) ** 2))

    def combined(self, w_full: np.ndarray) -> None:
        """None: K_theta is formed from theta when needed (``kernel``)."""
        return None

    def _add(self, key, coefficient: float, K_key: np.ndarray) -> None:
        self.factors[key] = K_key

    def accumulate(self) -> None:
        self.G += self.scale
        self.count += 1

    def kernel(self) -> LowRank:
        return LowRank(weighted_factor(self.factors, {k: self.scale * u * self.kw[k] for k, u in self.u.items()},
                                       self.src.n))

    def average_kernel(self) -> LowRank:
        if not self.count:
            return self.kernel()
        avg = self.averaged()
        return LowRank(weighted_factor(self.factors, {k: v * self.kw[k] for k, v in avg.items()}, self.src.n))

    def restore(self, state: dict, src) -> None:
        super().restore(state, src)
        self.factors = {k: src.factor(k) for k in self.u}


class _Loop:
    """Everything Algorithm 2's loop carries besides theta: the iterate, the sampling reference,
    counters and the history (what a checkpoint holds, with the generator's state)."""

    def __init__(self, src, verbose: bool):
        self.src = src
        self.log = RunLog(src.engine, "sgd-1s", verbose)
        self.it = src.choose(_Iterate, _FactorIterate)(src)
        self.blocks_read = 0
        self.s_ref = self.C_ref = None
        self.C_est_sum, self.C_est_count = 0.0, 0

    @property
    def history(self) -> list[dict]:
        return self.log.history

    def record(self, entry: dict, line: str | None = None) -> None:
        self.log.record(entry, line)

    def state(self, rng) -> dict:
        return {**self.it.state(self.src), "blocks_read": self.blocks_read,
                "C_ref": self.C_ref, "C_est_sum": self.C_est_sum, "C_est_count": self.C_est_count,
                "rng": rng.bit_generator.state, **({"s_ref": self.s_ref} if self.s_ref is not None else {}),
                **self.log.state()}

    def restore(self, state: dict, rng) -> int:
        """Continue from :meth:`state`'s dict; returns the next iteration."""
        self.it.restore(state, self.src)
        self.log.restore(state)
        self.blocks_read = int(state["blocks_read"])
        self.s_ref, self.C_ref = state.get("s_ref"), state["C_ref"]
        self.C_est_sum, self.C_est_count = float(state["C_est_sum"]), float(state["C_est_count"])
        rng.bit_generator.state = state["rng"]
        return int(state["iteration"]) + 1


@single_blas_thread_for_small_n
def fit(source, y, lam: float = 1.0, nu: float = 2, T: int = 1000, step="auto", seed: int = 0,
        refresh: int = 50, mix: float = 0.1, eta0: float = 1.0, iterate: str = "average",
        fit_intercept: bool = True, record_every: int | None = None, verbose: bool = False,
        checkpoint=None, average_from: float = 0.5, tol: float | None = DEFAULT_TOL) -> MKLResult:
    """SGD-1s (Algorithm 2) on a finite bank (an engine), a PolynomialFamily or a Gaussian/Dirichlet family.

    See the module docstring for the problem, the sampling, the step rule and the returned model.
    ``checkpoint``: None or a :class:`mklscale.runtime.checkpoint.Checkpoint`; resume from its state if
    it holds one, save it before each iteration when due and on SIGTERM/SIGINT (module docstring; the
    caller clears it after storing the result).
    ``tol``: on a finite bank, stop at the first refresh where the current iterate's relative Frank-Wolfe
    gap is <= tol and return that iterate (``certified_gap``); None runs all T iterations.
    """
    src = as_source(source)
    lam = check_positive("lam", lam)
    try:
        nu = float(nu)
    except (TypeError, ValueError):
        raise InvalidInputError(f"nu must be a number >= 1; got {nu!r}") from None
    if not nu >= 1.0:
        raise InvalidInputError(f"nu must be >= 1 (Delta_nu = {{theta >= 0, ||theta||_nu <= 1}}, nu = p/(2-p)); got {nu}")
    if nu != 2.0 and not src.finite:
        raise InvalidInputError("families support nu = 2 only (the projection is then a scaling); use nu=2")
    T = check_count("T", T)
    refresh = check_count("refresh", refresh)
    if not (0.0 < float(mix) <= 1.0):
        raise InvalidInputError(f"mix (uniform share of the sampling distribution) must be in (0, 1]; got {mix}")
    mix = float(mix)
    if step != "auto":
        step = check_positive("step", step)
    eta0 = check_positive("eta0", eta0)
    try:
        average_from = float(average_from)
    except (TypeError, ValueError):
        raise InvalidInputError(f"average_from must be a number in [0, 1); got {average_from!r}") from None
    if not 0.0 <= average_from < 1.0:
        raise InvalidInputError(f"average_from (share of the first iterates left out of the average) must be in "
                                f"[0, 1); got {average_from}")
    if tol is not None:
        tol = check_positive("tol", tol)
    if iterate not in ("average", "last"):
        raise InvalidInputError(f"iterate must be 'average' or 'last'; got {iterate!r}")
    y = check_targets(y, src.n, classification=False, loss_name="squared")
    bias = float(y.mean()) if fit_intercept else 0.0
    t = y - bias
    if fit_intercept and np.ptp(y) == 0.0:      # constant target: t = 0 exactly (y - mean(y) can be rounding)
        bias, t = float(y[0]), np.zeros_like(y)
    rng = np.random.default_rng(seed)
    record_every = record_every or max(1, T // 200)
    burn_in = int(math.floor(average_from * T))      # theta^(k-1) enters the average iff k > burn_in

    loop = _Loop(src, verbose)
    state = loop.it
    saved = checkpoint.load() if checkpoint is not None else None
    first = 1 if saved is None else loop.restore(saved, rng)
    J = 0.5 * float(t @ t) / lam
    stationary = None                   # the relative gap of theta^0 = 0 when it is optimal (zero gradient)
    certified = None                    # (k, relative gap) when the current iterate met ``tol`` at a refresh
    for k in range(first, T + 1):
        if checkpoint is not None:
            checkpoint.step(k - 1, lambda: loop.state(rng))
        alpha, J = _final_fit.ridge_dual(state.kernel(), t, lam)
        if k > burn_in:
            state.accumulate()
        if src.finite:
            if loop.s_ref is None or (k - 1) % refresh == 0:
                q_all = np.maximum(src.quad_forms(alpha), 0.0)
                if k == 1 and _flat_at_zero(q_all, nu, J):
                    stationary = _gap_at_zero(q_all, nu) / J if J > 0 else 0.0
                elif tol is not None and k > 1:
                    gap = certified_gap(q_all, _theta_vector(src, state.last(), state.kw), nu) / J
                    if gap <= tol:
                        certified = (k, gap)
                loop.C_ref = 0.5 * float(q_all.sum())
                share = q_all / q_all.sum() if q_all.sum() > 0 else np.full(src.M, 1.0 / src.M)
                loop.s_ref = (1.0 - mix) * share + mix / src.M
            if stationary is not None or certified is not None:
                break
            key = int(rng.choice(src.M, p=loop.s_ref))
            K_key, q = state.draw(key, alpha)
            loop.blocks_read += 1
            prob, weight = float(loop.s_ref[key]), 1.0
            C_step = loop.C_ref
        elif k == 1 and not np.any(alpha):     # t = 0: every q_i = 0 and J = 0 on all of Delta_nu
            stationary = 0.0
            break
        elif isinstance(src, PolynomialFamily):
            key, K_key, q, prob, C_sum = src.sample(alpha, rng)
            weight, C_step = src.weight(key), 0.5 * C_sum
        else:
            key, K_key, q, prob, _ = src.sample(alpha, rng)
            weight = 1.0
            # C of the step: a running mean of the previous unbiased estimates (1/2) q / s, over the last
            # C_WINDOW draws only (a sum with a lazy window would need the old draws: exponential weights)
            C_step = loop.C_est_sum / loop.C_est_count if loop.C_est_count else 0.5 * q / prob
            decay = 1.0 - 1.0 / C_WINDOW
            loop.C_est_sum = decay * loop.C_est_sum + 0.5 * q / prob
            loop.C_est_count = decay * loop.C_est_count + 1.0
        eta = eta0 / (max(C_step, np.finfo(float).tiny) * math.sqrt(T)) if step == "auto" else step
        state.increase(key, eta * 0.5 * q / prob, K_key, weight)
        if nu == 2.0:
            state.project_nu2()
        else:
            keys = list(state.u)
            proj = project_nonneg_nu_ball([state.theta(kk) for kk in keys], nu)
            w_full = np.zeros(src.M)
            w_full[keys] = proj
            state.set_theta(keys, proj, state.combined(w_full))
        if k % record_every == 0 or k == T:
            loop.log.explain("C", "the gradient scale of the step (step=\"auto\": eta = eta0 / (C sqrt(T)), module "
                             "docstring); J, the objective at the current weights, need not fall from one line to the "
                             "next (stochastic steps)")
            loop.record({"iteration": k, "objective": J, "eta": eta, "C": C_step, "kernel": src.describe(key),
                         "n_active": len(state.u), "blocks_read": loop.blocks_read},
                        f"it {k:6d} J={J:.8g} C={C_step:.4g} active={len(state.u)}")

    if stationary is not None:
        # grad J(0) = -(1/2) q = 0 (to ZERO_GRADIENT_RTOL): theta^0 = 0 is optimal, f = b (intercept only)
        loop.record({"iteration": 1, "objective": J, "eta": 0.0, "C": 0.0, "kernel": None, "n_active": 0,
                     "blocks_read": 0, "stationary": True},
                    f"it      1 J={J:.8g}: zero gradient at theta = 0 (relative gap {stationary:.3g}), stopped")
    last = state.last()
    if certified is not None:
        # the iterate of this iteration carries the certificate: return it (alpha and J are its own)
        k_stop, gap = certified
        chosen, alpha_out, J_out, returned = last, alpha, J, "last"
        J_avg, J_last = float("nan"), J
        loop.record({"iteration": k_stop, "objective": J, "eta": 0.0, "C": loop.C_ref, "kernel": None,
                     "n_active": len(state.u), "blocks_read": loop.blocks_read, "certified_gap": gap},
                    f"it {k_stop:6d} J={J:.8g}: relative Frank-Wolfe gap {gap:.3g} <= tol {tol:g}, stopped")
    else:
        avg = state.averaged() if state.count else {}
        alpha_avg, J_avg = _final_fit.ridge_dual(state.average_kernel(), t, lam)
        alpha_last, J_last = _final_fit.ridge_dual(state.kernel(), t, lam)
        use_average = iterate == "average" and state.count
        chosen, alpha_out, J_out, returned = ((avg, alpha_avg, J_avg, "average") if use_average
                                              else (last, alpha_last, J_last, "last"))
        if stationary is not None:
            gap = stationary
        elif src.finite:        # one more pass: the returned iterate's own certificate
            q_out = np.maximum(src.quad_forms(alpha_out), 0.0)
            gap = certified_gap(q_out, _theta_vector(src, chosen, state.kw), nu) / J_out if J_out > 0 else 0.0
        else:
            gap = float("nan")
    weights, extra = _result_weights(src, chosen, state.kw)
    params = {"lam": lam, "nu": nu, "T": T, "step": step, "eta0": eta0, "seed": seed, "refresh": refresh, "mix": mix,
              "iterate": iterate, "returned_iterate": returned, "tol": tol, "average_from": average_from,
              "averaged_iterates": state.count, "fit_intercept": fit_intercept, "objective_average": J_avg,
              "objective_last": J_last, "blocks_read": loop.blocks_read, **extra}
    converged = tol is None or not gap > tol       # families (no full gradient, gap NaN) run their T draws
    return MKLResult(weights=weights, dual_coef=alpha_out, bias=bias, active=np.flatnonzero(weights),
                     objective=J_out, gap=gap, history=loop.history, converged=converged, solver="sgd-1s",
                     params=params)


def certified_gap(q: np.ndarray, theta: np.ndarray, nu: float) -> float:
    """Frank-Wolfe gap of theta: <grad J(theta), theta> - min_{s in Delta_nu} <grad J(theta), s>
    = (1/2)(||q||_{nu*} - q^T theta), grad J = -(1/2) q (q_i = alpha*^T K_i alpha* / rho_i^2 >= 0 at theta's
    alpha*). J is convex on Delta_nu, so J(theta) - J* <= this gap (the bound the solver reports)."""
    return max(_gap_at_zero(q, nu) - 0.5 * float(q @ theta), 0.0)


def _theta_vector(src, theta: dict, kw: dict) -> np.ndarray:
    """theta of a finite bank as a dense (M,) vector in the coordinates of ``src.quad_forms``."""
    return _result_weights(src, theta, kw)[0]


def _gap_at_zero(q: np.ndarray, nu: float) -> float:
    """Frank-Wolfe gap of theta = 0: max_{theta in Delta_nu} <-grad J(0), theta> = (1/2)||q||_{nu*},
    1/nu + 1/nu* = 1 (q >= 0), an upper bound on J(0) - J* since J is convex."""
    dual = math.inf if nu == 1.0 else (1.0 if math.isinf(nu) else nu / (nu - 1.0))
    return 0.5 * float(np.linalg.norm(q, ord=dual)) if dual in (1.0, math.inf) else \
        0.5 * float(np.sum(q ** dual) ** (1.0 / dual))


def _flat_at_zero(q: np.ndarray, nu: float, J0: float) -> bool:
    """True when theta^0 = 0 is optimal to ZERO_GRADIENT_RTOL: every q_i = alpha*^T K_i alpha* vanishes
    (t = 0, or t orthogonal to the range of every kernel, e.g. constant kernels and a centred t)."""
    return _gap_at_zero(q, nu) <= ZERO_GRADIENT_RTOL * J0


def _result_weights(src, theta: dict, kw: dict):
    if src.finite:
        w = np.zeros(src.M)
        for k, v in theta.items():
            w[k] = v * kw[k]
        return w, {}
    merged: dict = {}
    for k, v in theta.items():
        canon = tuple(sorted(k)) if isinstance(src, PolynomialFamily) else k
        merged[canon] = merged.get(canon, 0.0) + v * kw[k]
    keys = [k for k, v in merged.items() if v != 0.0]
    return (np.array([merged[k] for k in keys], dtype=np.float64),
            {"kernels": [src.describe(k) for k in keys]})
