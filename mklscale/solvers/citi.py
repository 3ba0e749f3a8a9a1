"""Citi: elastic-net *constrained* MKL with the hinge loss (Citi et al.), out of core over an engine.

Not to be confused with the elastic-net *penalty* of SpicyMKL (penalties.ElasticNet) or PFBS's
elastic-net regularised square-loss MKL: here the elastic net constrains the kernel weights theta.
Registry name "citi" ("elasticnet" is kept as an alias for older pipelines and model files).

Problem (1)-(2) of the paper, hinge loss, y in {-1, +1}:

    min_{theta in Theta, b, f_k}  (1/2) sum_k ||f_k||^2 / theta_k + C sum_l max(0, 1 - y_l (sum_k f_k(x_l) - b))
    Theta = {theta >= 0 : eta ||theta||_1 + (1 - eta) ||theta||_2^2 <= 1},  eta in [0, 1]   (0/0 = 0)

eta = 1 is the squared block-1 (L1) MKL, the same problem as SMO-MKL's (P) with d_j = 1; eta = 0 is the
squared-L2 ball.

Algorithm 1 (block coordinate descent, §2.2-2.3), with the errata of NOTES-citi.md applied:
  theta <- 1 / s(1)
  repeat
    SVM on G = sum_k theta_k G_k (scikit-learn SVC, precomputed) -> alpha, b
    u_k = (alpha o y)^T G_k (alpha o y) for ALL k                     (7)   one engine pass
    O_up  = 1^T alpha - (1/2) u^T theta                               (8)   [FIX: the printed
    O_low = 1^T alpha - (1/2) u^T theta_chk, theta_chk = SolveElNetLP(u)      Algorithm 1 drops the 1/2]
    stop if O_up / O_low - 1 < tol
    beta = theta o theta o u;  theta <- SolveElNetWSR(beta, theta)      (3)-(4)
Algorithm 2 (WSR, §3.2): x <- sqrt(beta / grad s(x)) (13a) with s the rescaling norm (10); for eta < 0.25
  (13a) is alternated with x <- (x beta / grad s(x))^(1/3) (21) (§3.5); stop when s/g - 1 < eps_WSR (20),
  tested only after a (13a) step (the bound g^2 <= h(x*) behind (20) holds for (13a) images).
Algorithm 3 (LP, §4.1): max u^T theta over Theta; eta = 1 -> e_argmax(u); else the pruning iteration
  with radius r = sqrt(|Zbar| d^2 + 2d + 1), d = eta / (2 - 2 eta) [FIX: printed |Z|; the face
  theta_Z = 0 of the ball (26) has |Zbar| free coordinates].

Factor engines (issue 17): the combination comes from ``_final_fit.combined_kernel`` and the SVM from
``_final_fit.svm_dual``; above the dense cap that is liblinear on the factor F of sum_k theta_k K~_k
(``_svm.fit_linear_svc``), whose model coefficients v (f = K v + b) differ from alpha o y: the primal
P uses u_k = v^T K_k v of the model, O_up and O_low use u_k at alpha o y of the dual feasible alpha it
recovers (a second vector in the same quad_forms pass), so the gap stays a bound on the relative
suboptimality; it cannot fall below liblinear's accuracy (``fit_linear_svc``: measured 2e-6 relative
at n = 2000, 6e-5 at n = 50).

Costs per outer iteration: one ``engine.combine(theta)`` (every kernel, since theta > 0), one SVM,
one ``quad_forms(alpha o y)`` pass for all u_k; WSR and LP are O(M).

Weights never reach exactly zero (theta stays strictly positive from a positive start, §2.2), so
``weights`` is dense; the number of "selected kernels" (theta_k > selection_threshold * max theta) is
reported per iteration in ``history[i]["n_selected"]``. The model is
f = sum_k theta_k G_k (alpha o y) + bias with bias = -b of (1) (libsvm's intercept).

Gap (certificate). ``objective`` P is the primal (1) evaluated at the returned model (theta, alpha o y,
bias): P = (1/2) theta^T u + C sum_l hinge(y_l, f_l), since ||f_k||^2 / theta_k = theta_k u_k (3).
O_low = 1^T alpha - (1/2) max_{theta' in Theta} u^T theta' (8) is the dual of (1)-(2) (§2.3) at the
SVM's alpha, which is dual feasible (0 <= alpha <= C, y^T alpha = 0, kept by libsvm up to rounding),
so O_low <= P* by weak duality. The reported gap is the one relative gap of every solver
(``duality.relative_gap``, docs/design.md):

    gap = (P - max(O_low, 0)) / |P|  >=  (P - P*) / |P|      (P* >= 0: a sum of norms and hinges)

a true bound on the relative suboptimality of the returned model. The
paper's O_up = 1^T alpha - (1/2) u^T theta (8) is the SVM's DUAL value at theta: it equals P only when
the SVM is solved exactly, and with an inexact SVM (large ``svm_tol``) O_up / O_low - 1 can be tiny
while the model is far from optimal; it is kept in ``history[i]["upper"]`` and ``params["upper"]``
but not used to stop. The gap cannot fall below the inner SVM's own duality gap: when it stalls
above ``tol``, tighten ``svm_tol``. The returned theta is always the one the SVM was solved with
(the last WSR update is skipped when max_iter or max_seconds ends the run).
"""

from __future__ import annotations


import numpy as np

from mklscale.errors import InvalidInputError
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers import _final_fit, _svm, duality
from mklscale.solvers.toolkit.lowrank import LowRank
from mklscale.solvers import _validation as check
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog

#: Below this eta, update (21) is alternated with (13a) (§3.5).
ALTERNATE_BELOW_ETA = 0.25


# ---------------------------------------------------------------------------------- §3: WSR

def rescaling_norm(x: np.ndarray, eta: float) -> float:
    """s(x) = (eta/2) ||x||_1 + sqrt((eta^2/4) ||x||_1^2 + (1 - eta) ||x||_2^2)  (10), x >= 0."""
    n1 = float(np.sum(x))
    return 0.5 * eta * n1 + float(np.sqrt((0.5 * eta * n1) ** 2 + (1.0 - eta) * float(np.dot(x, x))))


def _grad_rescaling_norm(x: np.ndarray, eta: float) -> np.ndarray:
    """q = grad s(x) = eta/2 + ((eta/2)^2 ||x||_1 + (1 - eta) x) / r  (13b), r the square root in (10)."""
    n1 = float(np.sum(x))
    r = float(np.sqrt((0.5 * eta * n1) ** 2 + (1.0 - eta) * float(np.dot(x, x))))
    return 0.5 * eta + ((0.5 * eta) ** 2 * n1 + (1.0 - eta) * x) / r


def solve_wsr(beta, theta0, eta: float, tol: float = 1e-8, max_iter: int = 1000) -> tuple[np.ndarray, int]:
    """Algorithm 2: argmin_{theta in Theta} sum_k beta_k / theta_k for beta >= 0, from theta0 > 0.

    Kernels with beta_k = 0 (f_k = 0, e.g. underflow) get theta_k = 0 and are left out of g.
    Returns (theta, iterations) with theta on the boundary of Theta (eta ||theta||_1 +
    (1 - eta) ||theta||_2^2 = 1).
    """
    beta = np.asarray(beta, dtype=np.float64)
    x = np.where(beta > 0.0, np.asarray(theta0, dtype=np.float64), 0.0)
    pos = beta > 0.0
    if not np.any(pos):
        raise InvalidInputError("every kernel has ||f_k|| = 0 (all u_k = 0): the kernels are zero on the "
                                "support vectors; check the bank")
    if np.any(x[pos] <= 0.0):
        x[pos] = 1.0  # (13a) only needs x > 0 on the support of beta
    alternate = eta < ALTERNATE_BELOW_ETA
    last_was_13a = False
    iterations = 0
    for m in range(1, max_iter + 1):
        iterations = m
        s = rescaling_norm(x, eta)
        g = float(np.sum(beta[pos] / x[pos]))
        if m > 1 and last_was_13a and s / g - 1.0 < tol:
            break
        q = _grad_rescaling_norm(x, eta)
        if alternate and m % 2 == 1:
            x[pos] = np.cbrt(x[pos] * beta[pos] / q[pos])      # (21)
            last_was_13a = False
        else:
            x[pos] = np.sqrt(beta[pos] / q[pos])               # (13a)
            last_was_13a = True
    return x / rescaling_norm(x, eta), iterations


# ----------------------------------------------------------------------------------- §4: LP

def solve_lp(u, eta: float) -> np.ndarray:
    """Algorithm 3: argmax_{theta in Theta} u^T theta for u >= 0, u != 0 (exact, at most M rounds)."""
    u = np.asarray(u, dtype=np.float64)
    if not np.any(u > 0.0):
        raise InvalidInputError("the elastic-net LP needs some u_k > 0; every kernel gives u_k = 0")
    if eta == 1.0:
        theta = np.zeros(u.size)
        theta[int(np.argmax(u))] = 1.0
        return theta
    d = eta / (2.0 - 2.0 * eta)
    free = np.ones(u.size, dtype=bool)       # Zbar
    theta = np.zeros(u.size)
    while True:
        radius = np.sqrt(np.count_nonzero(free) * d * d + 2.0 * d + 1.0)   # [FIX] |Zbar|
        theta[:] = 0.0
        theta[free] = radius * u[free] / np.linalg.norm(u[free]) - d
        negative = theta < 0.0
        if not np.any(negative):
            return theta
        theta[negative] = 0.0
        free &= ~negative


def constraint_value(theta, eta: float) -> float:
    """eta ||theta||_1 + (1 - eta) ||theta||_2^2 (<= 1 on Theta)."""
    theta = np.asarray(theta, dtype=np.float64)
    return float(eta * np.sum(theta) + (1.0 - eta) * np.dot(theta, theta))


# ----------------------------------------------------------------------------- Algorithm 1

def primal_objective(theta, u, y, C: float, f: np.ndarray) -> float:
    """(1) at f_k = theta_k G_k (alpha o y): (1/2) sum_k theta_k u_k + C sum_l hinge(y_l, f_l), f the
    decision values sum_k f_k + intercept (||f_k||^2 / theta_k = theta_k u_k)."""
    return 0.5 * float(np.dot(theta, u)) + C * _svm.hinge_sum(y, f)


@single_blas_thread_for_small_n
def fit(engine, y, C, eta, tol: float = 1e-4, max_iter: int = 200, wsr_tol: float = 1e-10,
        wsr_max_iter: int = 10_000, svm_tol: float = 1e-6, selection_threshold: float = 1e-3,
        max_seconds: float | None = None, seed: int = 0, verbose: bool = False, init=None) -> MKLResult:
    """Solve the elastic-net constrained MKL problem (1)-(2) by Algorithm 1 (see the module docstring).

    Parameters
    ----------
    engine : mklscale engine (n, M, lambda_max, quad_forms, blocks, stats; combine if available).
    y : (n,) labels in {-1, +1}, both present.
    C : SVM constant > 0.
    eta : elastic-net mix in [0, 1] (1: L1 / simplex, 0: squared L2 ball).
    tol : eps_MKL, stop when the relative gap (P - max(O_low, 0)) / |P| < tol (P the primal (1) at the
        model, O_low the dual lower bound (8); module docstring, "Gap").
    max_iter : outer iterations.
    wsr_tol, wsr_max_iter : eps_WSR and the iteration limit of Algorithm 2.
    svm_tol : libsvm stopping tolerance of the inner SVM (the gap cannot get below the SVM's own gap).
    selection_threshold : theta_k > selection_threshold * max(theta) counts as "selected".
    max_seconds : optional wall-time budget; the run ends (not converged) after the outer iteration
        that exceeds it, returning the model of that iteration.
    seed : seed of the PSD probe vectors of the first pass.
    init : None or the MKLResult of this problem at another C (the previous point of a path): Algorithm 1
        starts from its theta (in Theta whatever C is; mixed 9 : 1 with the uniform start, ``_warm_theta``)
        instead of the uniform 1 / s(1).

    Returns
    -------
    MKLResult with weights theta (dense: the method gives no exact zeros), dual_coef alpha o y and
    bias b such that f = sum_k theta_k K_k (alpha o y) + b; objective P (1) at that model and
    gap = (P - max(O_low, 0)) / |P| >= (P - P*) / |P|; history per outer iteration with primal,
    upper (the paper's O_up), dual (O_low), gap, n_active, n_selected, passes, bytes_read, seconds,
    wsr_iterations, svm_converged.
    """
    n, M, lambda_max = _svm.check_engine(engine)
    y = check.check_targets(y, n, classification=True, loss_name="hinge")
    C = check.check_positive("C", C)
    eta = _check_eta(eta)
    tol = check.check_positive("tol", tol)
    max_iter = check.check_count("max_iter", max_iter)
    wsr_tol = check.check_positive("wsr_tol", wsr_tol)
    wsr_max_iter = check.check_count("wsr_max_iter", wsr_max_iter)
    svm_tol = check.check_positive("svm_tol", svm_tol)
    selection_threshold = check.check_positive("selection_threshold", selection_threshold, allow_zero=True)
    max_seconds = None if max_seconds is None else check.check_positive("max_seconds", max_seconds)
    params = {"C": C, "eta": eta, "tol": tol, "max_iter": max_iter, "wsr_tol": wsr_tol,
              "wsr_max_iter": wsr_max_iter, "svm_tol": svm_tol, "selection_threshold": selection_threshold,
              "max_seconds": max_seconds, "seed": seed}

    theta = np.ones(M) / rescaling_norm(np.ones(M), eta) if init is None else _warm_theta(init, M, eta)
    probes = _svm.probe_vectors(n, seed)
    log = RunLog(engine, "citi", verbose, not_monotone="each iteration refits the SVM at the new kernel weights "
                 "theta (the WSR step), and the gap of these alternating steps is not monotone")
    converged = False
    for iteration in range(1, max_iter + 1):
        K = _final_fit.combined_kernel(engine, theta)
        alpha, v, intercept, svm_ok = _final_fit.svm_dual(K, y, C, svm_tol)
        f = K @ v + intercept
        factor = isinstance(K, LowRank)
        del K
        u, u_dual = _all_quad_forms(engine, v, alpha * y if factor else None,
                                    probes if iteration == 1 else None, lambda_max)
        upper = float(np.sum(alpha)) - 0.5 * float(np.dot(u_dual, theta))
        lower = float(np.sum(alpha)) - 0.5 * float(np.dot(u_dual, solve_lp(u_dual, eta)))
        primal = primal_objective(theta, u, y, C, f)
        gap = duality.relative_gap(primal, lower)   # P(model) vs O_low: module docstring, "Gap"
        stop = gap < tol
        last = iteration == max_iter or (max_seconds is not None and log.totals()["seconds"] > max_seconds)
        wsr_iterations = 0
        if not stop and not last:
            new_theta, wsr_iterations = solve_wsr(theta * theta * u, theta, eta, wsr_tol, wsr_max_iter)
        entry = log.record({
            "iteration": iteration, "primal": primal, "upper": upper, "dual": lower, "gap": gap,
            "n_active": int(np.count_nonzero(theta)),
            "n_selected": int(np.count_nonzero(theta > selection_threshold * np.max(theta))),
            "wsr_iterations": wsr_iterations, "svm_converged": svm_ok,
        })
        log.explain("O_up, O_low", "the SVM's dual value at the current kernel weights, and the dual lower bound "
                    "over all weights in the constraint set (the gap compares the primal P with O_low)")
        log.explain("selected", f"kernels whose weight exceeds selection_threshold = {selection_threshold:g} x the "
                    "largest weight / kernels in the bank")
        log.say(f"it {iteration:3d}  P {primal:.8g}  O_up {upper:.8g}  O_low {lower:.8g}  gap {gap:.3e}  "
                f"selected {entry['n_selected']}/{M}", gap=gap)
        if stop:
            converged = True
            break
        if last:
            break
        theta = new_theta
    history = log.history
    status = "converged" if converged else ("max_iter" if len(history) == max_iter else "max_seconds")
    params.update({"status": status, "iterations": len(history), "n_selected": history[-1]["n_selected"],
                   **log.totals(), "upper": upper, "lower": lower})
    return MKLResult(weights=theta, dual_coef=v, bias=intercept, active=np.flatnonzero(theta),
                     objective=primal, gap=gap, history=history, converged=converged,
                     solver="citi_elasticnet", params=params)


def _warm_theta(init, M: int, eta: float) -> np.ndarray:
    """theta of a previous solution mixed with the uniform start (9 : 1), scaled onto the boundary
    s(theta) = 1 of Theta. The updates (3)-(4) are multiplicative, so a weight the previous C drove to
    ~0 would take many iterations to come back if this C needs it: measured on wine (19 kernels, 10 C
    values) the pure previous theta stalled at gap 0.019 after 200 iterations at one value, where the
    cold start took 50; the mix converges at every value."""
    theta = np.asarray(init.weights, dtype=np.float64)
    if theta.shape != (M,) or not np.all(np.isfinite(theta)) or np.any(theta < 0.0) or not np.any(theta > 0.0):
        raise InvalidInputError(f"init must be a Citi result on this bank (M = {M} non-negative weights); got "
                                f"{theta.size} weights")
    uniform = np.ones(M) / rescaling_norm(np.ones(M), eta)
    theta = 0.9 * theta / rescaling_norm(theta, eta) + 0.1 * uniform
    return theta / rescaling_norm(theta, eta)


def _check_eta(eta) -> float:
    try:
        eta = float(eta)
    except (TypeError, ValueError):
        raise InvalidInputError(f"eta must be a number in [0, 1]; got {eta!r}") from None
    if not (0.0 <= eta <= 1.0):
        raise InvalidInputError(f"eta must lie in [0, 1] (1: L1 constraint, 0: squared L2 ball); got {eta}")
    return eta


def _all_quad_forms(engine, v: np.ndarray, dual_v, probes, lambda_max: np.ndarray):
    """(u, u_dual): u_k = v^T K_k v for all kernels in ONE pass (with the PSD probes on the first call),
    checked; u_dual the same for ``dual_v`` = alpha o y when the SVM's model coefficients v are not
    alpha o y (liblinear on factors), else u itself."""
    rows = [v] + ([] if dual_v is None else [dual_v]) + ([] if probes is None else [probes])
    U = v if len(rows) == 1 else np.vstack(rows)
    values = np.asarray(engine.quad_forms(U), dtype=np.float64)
    _svm.check_quad_forms(values, U, lambda_max)
    values = values.reshape(values.shape[0], -1)
    u = np.maximum(values[:, 0], 0.0)
    return u, (u if dual_v is None else np.maximum(values[:, 1], 0.0))
