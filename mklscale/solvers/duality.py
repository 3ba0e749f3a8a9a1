"""Duality of the loss + block-norm problems: primal value, feasible dual points, and the one
relative gap every solver reports.

Problem (42) of SpicyMKL (its dual (48)), with a loss L and a penalty g~_C from losses.py and
penalties.py:

Primal  P(alpha, b) = L(sum_m K_m alpha_m + b 1) + sum_m g~_C(||alpha_m||_{K_m}).
Dual    D(rho)      = -L*(-rho) - sum_m g~_C*(||rho||_{K_m}),   1^T rho = 0 when there is a bias.

Weak duality P >= P* >= D holds for every (alpha, b) and every dual-feasible rho, once D is
evaluated over ALL M kernels; every objective of mklscale's problems is a sum of non-negative
losses and penalties, so P* >= 0 too. The relative gap of every solver is

    gap = (P - max(D, 0)) / max(|P|, ZERO_OBJECTIVE)      (relative_gap)

so ``tol`` means the same everywhere: a returned model with gap <= tol is within tol of the optimum
relative to its own objective, (P - P*) / |P| <= gap, whatever the scale of C or of the targets.
Only objectives below ZERO_OBJECTIVE = 1e-12 (an optimum that is zero up to rounding, e.g. every
target inside the eps-tube) are measured absolutely: (P - P*) <= 1e-12 gap there.

Feasible point from an iterate rho (§6.1 of the paper, made exact): project rho onto
{1^T rho = 0} intersected with the domain box of L*(-.) (for an unbounded domain this is
centring), then, for penalties whose conjugate is an indicator (block 1-norm, elastic net with
lam = 0), scale by min(1, threshold / max_m ||rho||_{K_m}); scaling keeps the box (it contains 0)
and the sum. The reference code clips the logistic argument after centring, which breaks
1^T rho = 0; the projection here keeps both exactly.
"""

from __future__ import annotations

import numpy as np

from mklscale.solvers.losses import Loss, Square
from mklscale.solvers.penalties import ElasticNet, Penalty


def project_dual(loss: Loss, y: np.ndarray, rho: np.ndarray, bias: bool) -> np.ndarray:
    """Euclidean projection of rho onto dom(L*(-.)) (and onto 1^T rho = 0 when ``bias``)."""
    lo, hi = loss.dual_bounds(y)
    if not bias:
        return np.clip(rho, lo, hi)
    if not (np.any(np.isfinite(lo)) or np.any(np.isfinite(hi))):
        return rho - rho.mean()
    # sum(clip(rho - tau, lo, hi)) is continuous and non-increasing in tau: bisection.
    tau_lo, tau_hi = float(np.min(rho - hi)), float(np.max(rho - lo))
    for _ in range(200):
        tau = 0.5 * (tau_lo + tau_hi)
        if np.sum(np.clip(rho - tau, lo, hi)) > 0.0:
            tau_lo = tau
        else:
            tau_hi = tau
        if tau_hi - tau_lo <= 1e-16 * max(1.0, abs(tau)):
            break
    out = np.clip(rho - 0.5 * (tau_lo + tau_hi), lo, hi)
    free = (out > lo) & (out < hi)
    if np.any(free):  # remove the rounding residual of the sum on the unclipped entries
        out[free] -= out.sum() / np.count_nonzero(free)
        out = np.clip(out, lo, hi)
    return out


def indicator_conjugate(penalty: Penalty) -> bool:
    """True when g~_C* is the indicator of [0, threshold] (dual feasibility needs scaling)."""
    return not penalty.smooth_conjugate


def dual_value(loss: Loss, penalty: Penalty, y: np.ndarray, C: float, rho: np.ndarray,
               norms: np.ndarray) -> tuple[float, float]:
    """(D, scale): the dual value at scale * rho, where ``norms`` are ||rho||_{K_m} for every
    kernel that can contribute (kernels left out must be proven to have norm <= threshold)."""
    scale = 1.0
    if indicator_conjugate(penalty):
        top = float(np.max(norms)) if norms.size else 0.0
        thr = penalty.threshold(C)
        if top > thr:
            scale = thr / top
        penalty_part = 0.0  # feasible by construction
    else:
        penalty_part = float(np.sum(penalty.conjugate(norms, C)))
    return -loss.conjugate(y, scale * rho) - penalty_part, scale


def scaled_dual(loss: Loss, penalty: Penalty, y: np.ndarray, C: float, rho: np.ndarray,
                norms: np.ndarray) -> tuple[float, float]:
    """(max_{s >= 0} D(s rho), the maximiser s) for the square loss and the elastic-net penalty.

    The best dual point along the ray of rho: with a = y.rho, b = ||rho||^2, r_m = ||rho||_{K_m}
    (``norms``; upper bounds in place of exact values give a smaller, still valid, dual value),
    k = C (1 - lam) and c = C lam,

        D(s rho) = s a - s^2 b / 2 - sum_m (s r_m - k)_+^2 / (2 c)          (c > 0)
        D(s rho) = s a - s^2 b / 2,   s r_m <= k for all m                   (c = 0: block 1-norm)

    a concave piecewise quadratic in s, maximised exactly: its derivative is decreasing and
    piecewise linear with kinks at s = k / r_m, so the root lies on the piece found by counting the
    kinks with a positive slope (PFBS's certificate, pfbs.py "Dual and duality gap").
    """
    if not isinstance(loss, Square) or not isinstance(penalty, ElasticNet):
        raise TypeError(f"scaled_dual needs the square loss and the elastic-net penalty; got {loss.name}, {penalty.name}")
    a, b = float(y @ rho), float(rho @ rho)
    if a <= 0.0 or b <= 0.0:
        return 0.0, 0.0
    k, c = penalty.threshold(C), C * penalty.lam
    r = norms[norms > 0.0]
    if c == 0.0:
        s = a / b
        if r.size:
            s = min(s, k / float(r.max()))
        return s * a - 0.5 * b * s * s, s
    r = np.sort(r)[::-1]                      # kinks k / r ascending
    kinks = k / r
    s1 = np.concatenate(([0.0], np.cumsum(r)))
    s2 = np.concatenate(([0.0], np.cumsum(r * r)))
    slope_at_kinks = a - b * kinks - (kinks * s2[:-1] - k * s1[:-1]) / c
    j = int(np.count_nonzero(slope_at_kinks > 0.0))
    s = (a + k * s1[j] / c) / (b + s2[j] / c)
    excess = np.maximum(s * norms - k, 0.0)
    return float(s * a - 0.5 * b * s * s - excess @ excess / (2.0 * c)), float(s)


def primal_value(loss: Loss, penalty: Penalty, y: np.ndarray, C: float, f: np.ndarray,
                 block_norms: np.ndarray) -> float:
    """L(f) + sum_m g~_C(||alpha_m||_{K_m}) with f the training decision values."""
    return loss.value(y, f) + float(np.sum(penalty.value(block_norms, C)))


#: Objectives below this are zero up to rounding; their gap is absolute (module docstring).
ZERO_OBJECTIVE = 1e-12


def relative_gap(primal: float, dual: float) -> float:
    """(P - max(D, 0)) / max(|P|, ZERO_OBJECTIVE) (module docstring): an upper bound on the relative
    suboptimality (P - P*) / |P| of the primal point whenever D is the value of a dual-feasible
    point (P* >= 0 makes 0 a lower bound too). SpicyMKL §6.1 divides by |P| as well; mklscale once
    used max(|P|, 1), an absolute gap for objectives below 1, which let a small-C fit stop 13-26%
    above its optimum."""
    return (primal - max(dual, 0.0)) / max(abs(primal), ZERO_OBJECTIVE)
