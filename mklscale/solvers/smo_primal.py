"""SMO-MKL's problem (P) in the primal, through SpicyMKL's hinge problem (``smo.fit(..., method="primal")``;
issue 32: the hinge at n = 500,000).

Why: an SMO step moves two points and costs O(n r) per active kernel on factors; a stage needs of the order of
n steps or more, so SMO-MKL costs >= n^2 r (n = 10,000, M = 20: 188 s, 1.1e6 steps; extrapolated to
n = 500,000: days). The primal block descent (``bcd.py``) costs O(n r) a block and epoch.

The equivalence (d_j = 1). (P) is min_w (1/2) Omega(w)^2 + C L(w), Omega = sum_j ||w_j||, L the hinge sum
(the bias free); SpicyMKL's hinge problem (42) at lam is min_w L(w) + lam Omega(w). The optimality condition of
(P), 0 in Omega(w) dOmega(w) + C dL(w), divided by C is that of (42) at lam = Omega(w) / C. So (P) at C is
solved by the solution w(lam*) of (42) at the root lam* of

    phi(lam) = lam C - Omega(w(lam)),

increasing in lam (Omega(w(lam)) does not increase with lam; the regularisation paths of the squared and the
plain block 1-norm are the same, Bach, Lanckriet & Jordan 2004, §2). The root is searched on log lam: each
phi is one SpicyMKL hinge fit (``method="bcd"`` on factor banks), warm-started from the nearest lam fitted;
the next lam is the fixed point Omega(w(lam)) / C until the root is bracketed, then the secant of
g = log(lam C / Omega) through the bracket's ends (Illinois), kept a tenth of the bracket inside it.
The hinge is piecewise linear, so (42) can have a whole segment of solutions at one lam and Omega(w(lam))
jumps there (seen on 60 points); once the bracket is narrower than SEGMENT_WIDTH, the segment between its
ends' models is searched as well (``_on_segment``).

Cost: one fit per step of the search, each as cheap as the hinge fit at its lam: at a moderate C
(n = 500,000, M = 100, C = 100: lam* ~ 24) three fits, 88 s. A large C puts lam* far down the path, where
the hinge fits themselves are slow (n = 50,000, M = 50, C = n, the registry's default: the second fit, at
lam = 0.008 = 1.5e-4 lam_1, unfinished after 300 s; SMO-MKL's first stage too).

Certificate: SMO-MKL's own weak duality. A fit's dual point rho (1^T rho = 0, a = y rho in [0, 1]) gives the
feasible alpha = s a, 0 <= s <= C, and D(alpha) = s e^T a - (s^2 / 2) max_j q_j(a) (``smo.dual_value``
with d = 1; written out here, as the primal, since smo.py imports this module),
q_j(a) = rho^T K_j rho over all M kernels (one quad_forms pass), largest at s = min(C, e^T a / max_j q_j).
The primal is (P) at the fit's model f0 = sum_j d_j K_j c (``smo.primal_value`` with d = 1, the bias the exact
minimiser of the hinge sum). The run stops when (P - D) / P <= tol; a fit whose root error is below its own
precision (|log(lam C / Omega)| below the gap) is solved again at a tenth of its tolerance.

Returned model in SMO-MKL's form: weights w_j = d_j / sum_k d_k (sum_j w_j = 1) and dual_coef (sum_k d_k) c,
so f = sum_j w_j K_j dual_coef + b is the fit's function; history per fit (lam, omega, log(lam C / omega),
primal, dual, gap, the fit's gap, epochs and tolerance).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar

from mklscale.solvers import _svm, spicy
from mklscale.solvers.duality import relative_gap
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog

#: SpicyMKL fits at most, per solve
MAX_FITS = 40
#: the first fit's tolerance relative to the run's
INNER_TOL_SHARE = 0.25
#: the bracket's width (in log lam) below which the segment between its ends' models is searched too
SEGMENT_WIDTH = 0.05
SEGMENT_XATOL = 1e-9


def _certificate(engine, y: np.ndarray, C: float, e: np.ndarray, rho: np.ndarray, q: np.ndarray | None = None,
                 f0: np.ndarray | None = None) -> dict:
    """(P) at the model f0 = sum_j e_j K_j rho (||w_j|| = e_j sqrt(q_j), q_j = rho^T K_j rho over all M
    kernels: one pass unless given) and SMO-MKL's dual at the best feasible multiple of rho (module
    docstring): {"omega", "primal", "dual", "gap", "bias", "q"}."""
    if q is None:
        q = np.maximum(np.asarray(engine.quad_forms(rho), dtype=np.float64), 0.0)
    a = np.clip(y * rho, 0.0, 1.0)
    top = float(q.max())
    s = C if top <= 0.0 else min(C, float(a.sum()) / top)
    dual = s * float(a.sum()) - 0.5 * s * s * top          # D(s a) = e^T (s a) - (1/2) max_j q_j(s a)
    if f0 is None:
        active = np.flatnonzero(e > 0.0)
        f0 = e[active] @ np.asarray(engine.matvecs(rho, kernels=active), dtype=np.float64) if active.size \
            else np.zeros(y.size)
    bias = _svm.optimal_bias(f0, y)
    omega = float(e @ np.sqrt(q))
    primal = 0.5 * omega * omega + C * _svm.hinge_sum(y, f0 + bias)
    return {"omega": omega, "primal": primal, "dual": dual, "gap": relative_gap(primal, dual), "bias": bias, "q": q}


def _on_segment(engine, y: np.ndarray, C: float, ends: list) -> tuple[np.ndarray, np.ndarray, dict]:
    """(e, rho, certificate) of the best model on the segment between the fits at the bracket's ends.

    At a lam where (42) has many solutions (the hinge is piecewise linear, so Omega(w(lam)) can jump), the
    root of phi lies inside that jump: the ends' models, both solutions of (42) there, with the dual point
    rho they share (the one of the larger SMO dual is taken), span solutions whose Omega runs between the
    ends'. (P) is convex along e_theta = theta e_1 + (1 - theta) e_2 (f and Omega are linear in e), so
    scipy's bounded scalar minimiser (Brent) finds its minimiser on theta in [0, 1] to SEGMENT_XATOL (one
    product per end's kernel, then O(n log n) a value: the exact bias)."""
    (e1, rho1, c1), (e2, rho2, c2) = ends
    rho, q = (rho1, c1["q"]) if c1["dual"] >= c2["dual"] else (rho2, c2["q"])
    union = np.flatnonzero((e1 > 0.0) | (e2 > 0.0))
    G = np.asarray(engine.matvecs(rho, kernels=union), dtype=np.float64) if union.size else np.zeros((0, y.size))

    def at(theta: float) -> tuple[np.ndarray, dict]:
        e = theta * e1 + (1.0 - theta) * e2
        return e, _certificate(engine, y, C, e, rho, q=q, f0=e[union] @ G)

    theta = minimize_scalar(lambda t: at(t)[1]["primal"], bounds=(0.0, 1.0), method="bounded",
                            options={"xatol": SEGMENT_XATOL}).x
    e, cert = at(float(theta))
    return e, rho, cert


class _Bracket:
    """The root search on x = log lam for g(x) = log(lam C / Omega(w(lam))), increasing (module docstring):
    regula falsi between the ends seen with g < 0 and g > 0, Illinois-modified (an end kept twice in a row
    has its g halved, so the search does not stall on one side); before both ends exist, the fixed point
    lam = Omega / C (lam / 10 while every kernel is out: Omega = 0)."""

    def __init__(self):
        self.below = self.above = None      # [x, g, the model there]
        self._last = None                   # the side updated last

    def add(self, lam: float, g: float, model) -> None:
        side = "below" if g < 0.0 else "above"
        if self._last == side:              # the other end was kept twice: Illinois
            other = self.above if side == "below" else self.below
            if other is not None and math.isfinite(other[1]):
                other[1] *= 0.5
        setattr(self, side, [math.log(lam), g, model])
        self._last = side

    @property
    def width(self) -> float:
        return math.inf if self.below is None or self.above is None else self.above[0] - self.below[0]

    def next(self, lam: float, omega: float, C: float) -> float:
        if self.below is None or self.above is None:
            return omega / C if omega > 0.0 else 0.1 * lam
        (x0, g0, _), (x1, g1, _) = self.below, self.above
        x = x0 - g0 * (x1 - x0) / (g1 - g0) if math.isfinite(g1) else 0.5 * (x0 + x1)
        margin = 0.1 * (x1 - x0)                # at least a tenth of the bracket goes each time
        return math.exp(min(max(x, x0 + margin), x1 - margin))


def fit(engine, y: np.ndarray, C: float, tol: float, verbose: bool = False, max_fits: int = MAX_FITS) -> MKLResult:
    """(P) at C with d_j = 1 (module docstring); ``y`` checked labels in {-1, +1}."""
    log = RunLog(engine, "smo/primal", verbose, not_monotone="each fit solves SpicyMKL's hinge problem at another "
                 "lam; the gap is that of (P) at C")
    lam, inner_tol = 0.5 * spicy.c_max(engine, y, loss="hinge"), INNER_TOL_SHARE * tol
    fits: dict[float, MKLResult] = {}
    bracket, best = _Bracket(), None
    for k in range(1, max_fits + 1):
        init = fits[min(fits, key=lambda x: abs(math.log(x / lam)))] if fits else None
        res = fits[lam] = spicy.fit(engine, y, lam, loss="hinge", tol=inner_tol, init=init)
        model = (res.weights / lam, lam * np.asarray(res.dual_coef, dtype=np.float64))   # (e, rho)
        cert = _certificate(engine, y, C, *model)
        g = math.log(lam * C / cert["omega"]) if cert["omega"] > 0.0 else math.inf
        log.record({"iteration": k, "lam": lam, "omega": cert["omega"], "log_lam_C_over_omega": g,
                    "primal": cert["primal"], "dual": cert["dual"], "gap": cert["gap"], "fit_gap": float(res.gap),
                    "fit_epochs": len(res.history), "fit_tol": inner_tol, "n_active": int(res.active.size)},
                   f"fit {k:2d} lam {lam:.8g} omega {cert['omega']:.8g} log(lam C / omega) {g:+.2e} "
                   f"primal {cert['primal']:.10g} dual {cert['dual']:.10g} gap {cert['gap']:.3e} "
                   f"active {res.active.size} (fit: gap {res.gap:.1e}, {len(res.history)} epochs)", gap=cert["gap"])
        candidates = [(*model, cert)]
        bracket.add(lam, g, candidates[0])
        if bracket.width < SEGMENT_WIDTH:
            candidates.append(_on_segment(engine, y, C, [bracket.below[2], bracket.above[2]]))
            log.say(f"the segment between the models at lam {math.exp(bracket.below[0]):.8g} and "
                    f"{math.exp(bracket.above[0]):.8g}: primal {candidates[1][2]['primal']:.10g} gap "
                    f"{candidates[1][2]['gap']:.3e}")
        for candidate in candidates:
            if best is None or candidate[2]["gap"] < best[2]["gap"]:
                best = candidate
        if best[2]["gap"] <= tol:
            break
        if (abs(g) < cert["gap"] and res.converged) or bracket.width < 1e-12:
            inner_tol *= 0.1                    # the root is found to the fit's precision: the same lam, tighter
            continue
        lam = bracket.next(lam, cert["omega"], C)
    e, rho, cert = best
    total = float(e.sum())
    weights = e / total if total > 0.0 else e
    converged = cert["gap"] <= tol
    totals = log.totals()
    return MKLResult(weights=weights, dual_coef=total * rho, bias=cert["bias"], active=np.flatnonzero(weights),
                     objective=cert["primal"], gap=cert["gap"], history=log.history, converged=converged,
                     solver="smo/primal", params={"status": "converged" if converged else "max_fits",
                                                  "dual": cert["dual"], "fits": len(fits),
                                                  "passes": totals["passes"], "bytes_read": totals["bytes_read"]})
