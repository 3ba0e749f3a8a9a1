"""The SpicyMKL inner problem over a working set of kernels, and its damped Newton method.

Objective, minimised over rho (n,):

    phi(rho) = loss_term(rho) + sum_{m in W} psi_m(n_m) + bias_term(rho) [+ prox_term(rho)],
    n_m = ||alpha_m + gamma_m rho||_{K_m}.

* proximal mode (SpicyMKL, (25)/(47)): psi_m(n) = ghat(n; gamma_m C) / gamma_m, the Moreau
  envelope of the conjugate penalty at scale gamma_m C (erratum 5), so psi' = prox(n; gamma_m C)/gamma_m
  and psi'' = prox'(n; gamma_m C)/gamma_m;
* conjugate mode (one-step ElastMKL, §4.3): alpha_m = 0, gamma_m = 1 and psi_m = g~_C*.

Chain rule with w_m = K_m (alpha_m + gamma_m rho):
    grad  = sum_m psi'(n_m) gamma_m w_m / n_m                       ((26) with prox/n in place of 1-q)
    Hess  = sum_m gamma_m^2 [ psi'/n K_m + (psi'' - psi'/n) w_m w_m^T / n^2 ]          ((27), (50))
Only kernels with psi' > 0 or psi'' > 0 enter (Remark 1).

Bias: "al" adds (1/(2 gamma_b)) (b + gamma_b 1^T rho)^2 (proximal step on b, (12)); "equality"
keeps 1^T rho = 0 exactly (Newton on the KKT system; the paper's §4.3 uses a penalty
C_b (1^T rho)^2 with C_b = 1e5 instead); "none" has no bias. With a finite ``tau`` the term
||rho - center||^2 / (2 tau) is added (proximal method of multipliers, used for the
piecewise-linear conjugates of hinge and eps-insensitive; see spicy.py).

Line search (§3.5.1 + [CODE]): Armijo with constant 0.1 and halving from the largest step that
keeps rho in the open domain of the loss conjugate. Along rho + c d the norms are
n_m(c)^2 = n_m^2 + 2 c gamma_m d^T w_m + c^2 gamma_m^2 d^T K_m d from cached products, so
backtracking needs no new kernel products; after the step K_m rho is updated as K_m rho + c K_m d.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.linalg
from mklscale.solvers.penalties import Penalty
from mklscale.solvers.toolkit.working_set import HeldKernels


class KernelTerm:
    """sum_{m in W} psi_m(||alpha_m + gamma_m rho||_{K_m}) over the working set W, whose kernels
    are the solver's :class:`~mklscale.solvers.toolkit.working_set.HeldKernels` ``held``."""

    def __init__(self, held: HeldKernels, penalty: Penalty, C: float, mode: str):
        if mode not in ("proximal", "conjugate"):
            raise ValueError(mode)
        self.held = held
        self.penalty, self.C, self.mode, self.n = penalty, float(C), mode, held.n
        n = self.n
        self.alpha = np.zeros((0, n))
        self.K_alpha = np.zeros((0, n))
        self.alpha_K_alpha = np.zeros(0)
        self.gamma = np.zeros(0)

    @property
    def size(self) -> int:
        return self.gamma.size

    def add(self, idx: np.ndarray, gamma: float, remedy: str) -> None:
        """Hold the kernels ``idx`` (read from the engine) with alpha_m = 0 and the given gamma."""
        k, n = self.held.fetch(idx, remedy).size, self.n
        if k == 0:
            return
        self.alpha = np.concatenate([self.alpha, np.zeros((k, n))])
        self.K_alpha = np.concatenate([self.K_alpha, np.zeros((k, n))])
        self.alpha_K_alpha = np.concatenate([self.alpha_K_alpha, np.zeros(k)])
        self.gamma = np.concatenate([self.gamma, np.full(k, 1.0 if self.mode == "conjugate" else gamma)])

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the working-set kernels where ``mask`` is True (compacted in place)."""
        self.held.keep(mask)
        self.alpha, self.K_alpha = self.alpha[mask], self.K_alpha[mask]
        self.alpha_K_alpha, self.gamma = self.alpha_K_alpha[mask], self.gamma[mask]

    def psi(self, norms: np.ndarray):
        """(psi, psi', psi'') at the norms n_m, one entry per working-set kernel."""
        if self.mode == "conjugate":
            p = self.penalty
            return (p.conjugate(norms, self.C), p.conjugate_derivative(norms, self.C),
                    p.conjugate_second_derivative(norms, self.C))
        scale = self.gamma * self.C
        return (self.penalty.ghat(norms, scale) / self.gamma, self.penalty.prox(norms, scale) / self.gamma,
                self.penalty.prox_derivative(norms, scale) / self.gamma)

    def matvec(self, u: np.ndarray, first: int = 0) -> np.ndarray:
        """K_m u for the working-set kernels at positions >= ``first``, (w - first, n) float64."""
        return self.held.matvecs(u, first)

    def add_weighted(self, sel: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
        """out += sum_p weights[p] K_{sel[p]} (sel: ascending positions in W; out (n, n) float64)."""
        self.held.add_weighted(sel, weights, out)


@dataclasses.dataclass
class Point:
    """rho and everything the objective, gradient and Hessian need there."""

    rho: np.ndarray
    K_rho: np.ndarray        # (w, n) K_m rho
    norms: np.ndarray        # (w,) n_m = ||alpha_m + gamma_m rho||_{K_m}
    w: np.ndarray            # (w, n) K_m (alpha_m + gamma_m rho)
    value: float
    grad: np.ndarray
    psi1: np.ndarray         # psi'(n_m)
    psi2: np.ndarray         # psi''(n_m)


@dataclasses.dataclass
class Direction:
    d: np.ndarray
    K_d: np.ndarray
    d_K_d: np.ndarray
    d_w: np.ndarray
    slope: float             # grad^T d


class InnerProblem:
    """phi(rho) on the working set; see the module docstring."""

    def __init__(self, loss_term, kernels: KernelTerm, bias_mode: str, b: float = 0.0, gamma_b: float = 1.0,
                 center: np.ndarray | None = None, tau: float = np.inf):
        if bias_mode not in ("al", "equality", "none"):
            raise ValueError(bias_mode)
        self.loss_term, self.kernels, self.bias_mode = loss_term, kernels, bias_mode
        self.b, self.gamma_b = float(b), float(gamma_b)
        self.center, self.tau = center, float(tau)

    # -- pieces -----------------------------------------------------------------------------
    def _norms_sq(self, rho_K_rho, rho_K_alpha):
        k = self.kernels
        return k.alpha_K_alpha + 2.0 * k.gamma * rho_K_alpha + k.gamma**2 * rho_K_rho

    def _extra_value(self, rho):
        """Bias term (proximal step on b) and the proximal term on rho (when tau < inf)."""
        out = 0.0
        if self.bias_mode == "al":
            out += (self.b + self.gamma_b * rho.sum()) ** 2 / (2.0 * self.gamma_b)
        if np.isfinite(self.tau):
            out += float(np.sum((rho - self.center) ** 2)) / (2.0 * self.tau)
        return out

    def _value_from(self, rho, norms):
        psi = self.kernels.psi(norms)[0]
        return self.loss_term.value(rho) + float(np.sum(psi)) + self._extra_value(rho)

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self, rho: np.ndarray, K_rho: np.ndarray) -> Point:
        k = self.kernels
        norms = np.sqrt(np.maximum(self._norms_sq(np.einsum("mi,i->m", K_rho, rho), k.K_alpha @ rho), 0.0))
        w = k.K_alpha + k.gamma[:, None] * K_rho
        psi, psi1, psi2 = k.psi(norms)
        grad = self.loss_term.grad(rho).copy()
        on = norms > 0.0
        if np.any(on):
            grad += (psi1[on] * k.gamma[on] / norms[on]) @ w[on]
        if self.bias_mode == "al":
            grad += self.b + self.gamma_b * rho.sum()
        if np.isfinite(self.tau):
            grad += (rho - self.center) / self.tau
        value = self.loss_term.value(rho) + float(np.sum(psi)) + self._extra_value(rho)
        return Point(rho, K_rho, norms, w, value, grad, psi1, psi2)

    def kkt_gradient(self, p: Point) -> np.ndarray:
        """The gradient without the proximal term on rho (that term vanishes at convergence)."""
        if np.isfinite(self.tau):
            return p.grad - (p.rho - self.center) / self.tau
        return p.grad

    def hessian(self, p: Point) -> np.ndarray:
        k = self.kernels
        H = np.diag(self.loss_term.hess_diag(p.rho))
        if self.bias_mode == "al":
            H += self.gamma_b
        if np.isfinite(self.tau):
            H[np.diag_indices_from(H)] += 1.0 / self.tau
        on = np.flatnonzero((p.norms > 0.0) & ((p.psi1 > 0.0) | (p.psi2 > 0.0)))
        if on.size:
            g2, nrm = k.gamma[on] ** 2, p.norms[on]
            scale = g2 * p.psi1[on] / nrm
            k.add_weighted(on, scale, H)
            rank_one = g2 * (p.psi2[on] - p.psi1[on] / nrm) / nrm**2
            H += p.w[on].T @ (rank_one[:, None] * p.w[on])
        return H

    def direction(self, p: Point, d: np.ndarray) -> Direction:
        K_d = self.kernels.matvec(d)
        return Direction(d, K_d, np.einsum("mi,i->m", K_d, d), p.w @ d, float(p.grad @ d))

    def value_along(self, p: Point, s: Direction, c: float) -> float:
        g = self.kernels.gamma
        norms_sq = p.norms**2 + 2.0 * c * g * s.d_w + c * c * g**2 * s.d_K_d
        return self._value_from(p.rho + c * s.d, np.sqrt(np.maximum(norms_sq, 0.0)))

    def advance(self, p: Point, s: Direction, c: float) -> Point:
        return self.evaluate(p.rho + c * s.d, p.K_rho + c * s.K_d)


def _solve_newton_system(H: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve H x = rhs (rhs (n,) or (n, k)) for a symmetric PSD H, adding jitter if needed."""
    scale = max(float(np.max(np.abs(np.diag(H)))), 1e-300)
    for jitter in (0.0, 1e-12, 1e-10, 1e-8, 1e-6):
        try:
            factor = scipy.linalg.cho_factor(H + jitter * scale * np.eye(H.shape[0]), check_finite=False)
            x = scipy.linalg.cho_solve(factor, rhs, check_finite=False)
            if np.all(np.isfinite(x)):
                return x
        except np.linalg.LinAlgError:
            continue
    return np.linalg.lstsq(H, rhs, rcond=None)[0]


@dataclasses.dataclass
class NewtonReport:
    iterations: int
    converged: bool


def newton(problem: InnerProblem, point: Point, max_iter: int, gtol: float = 1e-10) -> tuple[Point, NewtonReport]:
    """Damped Newton on phi with Armijo backtracking ([CODE]: constant 0.1, halving).

    Converged when ||grad phi||_inf <= gtol * (1 + ||grad of the loss term||_inf). The gradient of
    the inner objective is the residual of the primal-dual link f = -grad L*(-rho) at the next
    primal iterate (sum_m K_m alpha_m^{t+1} + b^{t+1} 1 - f(rho)), so this tolerance is in the
    units of the decision values; a step-size rule would not be, because the outer update
    multiplies errors in rho by gamma. The Armijo test allows an increase at the rounding level
    of phi (with large gamma the predicted decrease of a correct Newton step can be below it); a
    failed line search or a step below rounding level stops (no progress possible in floating
    point).
    """
    equality = problem.bias_mode == "equality"
    n = point.rho.size

    def small_gradient(p):
        g = p.grad - p.grad.mean() if equality else p.grad
        scale = 1.0 + float(np.max(np.abs(problem.loss_term.grad(p.rho))))
        return float(np.max(np.abs(g))) <= gtol * scale

    if small_gradient(point):
        return point, NewtonReport(0, True)
    for it in range(1, max_iter + 1):
        H = problem.hessian(point)
        g = point.grad
        if equality:
            x = _solve_newton_system(H, np.column_stack([g, np.ones(n)]))
            d = -(x[:, 0] - (x[:, 0].sum() / x[:, 1].sum()) * x[:, 1])
            d -= d.mean()  # stay exactly on 1^T rho = const
        else:
            d = -_solve_newton_system(H, g)
        if not np.all(np.isfinite(d)) or g @ d > 0.0:
            d = -(g - g.mean()) if equality else -g
        s = problem.direction(point, d)
        c = min(1.0, 0.99 * problem.loss_term.max_step(point.rho, d))
        slack = 1e-13 * (1.0 + abs(point.value))
        accepted = False
        for _ in range(60):
            if problem.value_along(point, s, c) <= point.value + 0.1 * c * s.slope + slack:
                accepted = True
                break
            c *= 0.5
        if not accepted:
            return point, NewtonReport(it, False)
        point = problem.advance(point, s, c)
        if small_gradient(point):
            return point, NewtonReport(it, True)
        if c * float(np.max(np.abs(d))) <= 1e-15 * (1.0 + float(np.max(np.abs(point.rho)))):
            return point, NewtonReport(it, False)
    return point, NewtonReport(max_iter, False)
