"""The loss part of the SpicyMKL inner objective, as a function of the dual variable rho.

Smooth conjugates (logistic, square) enter as h(rho) = L*(-rho) itself (§3.3). Piecewise-linear
conjugates with box domains (hinge, eps-insensitive) enter through the slack augmented Lagrangian
of §3.4: the linear part of h plus, for each constraint c_j(rho) >= 0 with multiplier mu_j >= 0
and per-sample penalty gamma_j,

    (1 / (2 gamma_j)) * max(0, mu_j - gamma_j c_j(rho))^2,        mu_j <- max(0, mu_j - gamma_j c_j)

(the standard augmented Lagrangian for ">= 0" constraints; this matches the updates (30)-(31).
Eq. (33)/(40) mixes the "<= 0" form of (33) with the ">= 0" update of (30); we use ">= 0"
throughout). Every term exposes value / grad / hess_diag (a generalised Hessian where the
objective is only once differentiable) and max_step (how far rho may move along d while staying
in an open domain).
"""

from __future__ import annotations

import numpy as np

from mklscale.solvers.losses import Loss


class SmoothLossTerm:
    """h(rho) = L*(-rho) for a loss with a twice-differentiable conjugate (logistic, square)."""

    has_multipliers = False

    def __init__(self, loss: Loss, y: np.ndarray):
        self.loss, self.y = loss, y
        self.lo, self.hi = loss.dual_bounds(y)

    def value(self, rho):
        return self.loss.conjugate(self.y, rho)

    def grad(self, rho):
        return self.loss.conjugate_grad(self.y, rho)

    def hess_diag(self, rho):
        return self.loss.conjugate_hess(self.y, rho)

    def max_step(self, rho, d):
        """Largest c with lo < rho + c d < hi (the open domain): the logistic gradient is
        unbounded at the boundary, so the Newton iterate must stay strictly inside (§3.3)."""
        limits = [np.inf]
        up, down = d > 0, d < 0
        if np.any(up):
            limits.append(np.min((self.hi[up] - rho[up]) / d[up]))
        if np.any(down):
            limits.append(np.min((self.lo[down] - rho[down]) / d[down]))
        return float(min(limits))

    def update_multipliers(self, rho):
        return np.zeros(0)

    def grow_gammas(self, violations, ck, factor, cap):
        pass


class _LinearConstraints:
    """Per-sample constraints c_j(rho) = offset_j + slope_j * rho >= 0 with multipliers."""

    def __init__(self, offsets, slopes, gamma0):
        self.offsets = np.asarray(offsets, dtype=np.float64)          # (J, n)
        self.slopes = np.asarray(slopes, dtype=np.float64)            # (J, n)
        self.mu = np.zeros_like(self.offsets)
        self.gamma = np.full_like(self.offsets, float(gamma0))

    def _excess(self, rho):
        return np.maximum(self.mu - self.gamma * (self.offsets + self.slopes * rho), 0.0)

    def value(self, rho):
        return float(np.sum(self._excess(rho) ** 2 / (2.0 * self.gamma)))

    def grad(self, rho):
        return -np.sum(self.slopes * self._excess(rho), axis=0)

    def hess_diag(self, rho):
        active = self.mu - self.gamma * (self.offsets + self.slopes * rho) > 0.0
        return np.sum(self.gamma * self.slopes**2 * active, axis=0)

    def update(self, rho):
        """mu <- max(0, mu - gamma c(rho)); returns |min(c, mu_old / gamma)| (complementarity)."""
        c = self.offsets + self.slopes * rho
        violation = np.abs(np.minimum(c, self.mu / self.gamma))
        self.mu = self._excess(rho)
        return violation


def _grow(gamma, violations, ck, factor, cap):
    """[CODE] schedule: blocks whose violation exceeds ck/2 get gamma *= factor, others += factor
    (in place, capped at ``cap``)."""
    slow = violations > 0.5 * ck
    gamma[slow] *= factor
    gamma[~slow] += factor
    np.minimum(gamma, cap, out=gamma)


class HingeSlackTerm:
    """Hinge loss through the slack augmented Lagrangian of §3.4.1.

    h0(rho) = -sum y rho, constraints 1 - y rho >= 0 (multiplier xi) and y rho >= 0 (multiplier
    zeta), each with a per-sample gamma ([CODE]: initial 10, xi = zeta = 0).
    """

    has_multipliers = True

    def __init__(self, y: np.ndarray, gamma0: float = 10.0):
        self.y = y
        self.box = _LinearConstraints([np.ones_like(y), np.zeros_like(y)], [-y, y], gamma0)

    def value(self, rho):
        return float(-self.y @ rho) + self.box.value(rho)

    def grad(self, rho):
        return -self.y + self.box.grad(rho)

    def hess_diag(self, rho):
        return self.box.hess_diag(rho)

    def max_step(self, rho, d):
        return np.inf

    def update_multipliers(self, rho):
        return self.box.update(rho).reshape(-1)

    def grow_gammas(self, violations, ck, factor, cap):
        _grow(self.box.gamma.reshape(-1), violations, ck, factor, cap)


class EpsSlackTerm:
    """eps-insensitive loss through the constrained conjugate of §3.4.2.

    h(rho) = sum -y rho + eps |rho| on |rho| <= 1 is written with an auxiliary t (paper: rho~):
    h0(rho, t) = sum -y rho + eps t subject to 1 - rho >= 0, 1 + rho >= 0, t - rho >= 0,
    t + rho >= 0 (|rho| = min{t : t >= rho, t >= -rho}). The augmented Lagrangian is minimised over
    t in closed form for each sample (it is piecewise quadratic in t), which leaves a C^1 function
    of rho with a piecewise-constant generalised Hessian: with a3 = rho + mu3/g3, a4 = -rho + mu4/g4,
    the minimiser is t = (g3 a3 + g4 a4 - eps)/(g3 + g4) when that is <= min(a3, a4) (both
    constraints active, curvature 4 g3 g4/(g3 + g4)), else t = a_j - eps/g_j for the larger a_j
    (curvature 0, gradient +-eps: the |rho| kink).
    """

    has_multipliers = True

    def __init__(self, y: np.ndarray, eps: float, gamma0: float = 10.0):
        self.y, self.eps = y, float(eps)
        ones = np.ones_like(y)
        self.box = _LinearConstraints([ones, ones], [-ones, ones], gamma0)
        self.mu_abs = np.zeros((2, y.size))
        self.gamma_abs = np.full((2, y.size), float(gamma0))

    def _abs_parts(self, rho):
        g3, g4 = self.gamma_abs
        a3 = rho + self.mu_abs[0] / g3
        a4 = -rho + self.mu_abs[1] / g4
        t_both = (g3 * a3 + g4 * a4 - self.eps) / (g3 + g4)
        both = t_both <= np.minimum(a3, a4)
        t_single = np.where(a3 >= a4, a3 - self.eps / g3, a4 - self.eps / g4)
        t = np.where(both, t_both, t_single)
        return t, np.maximum(a3 - t, 0.0), np.maximum(a4 - t, 0.0), both

    def value(self, rho):
        g3, g4 = self.gamma_abs
        t, e3, e4, _ = self._abs_parts(rho)
        abs_part = np.sum(self.eps * t + 0.5 * g3 * e3**2 + 0.5 * g4 * e4**2)
        return float(-self.y @ rho) + float(abs_part) + self.box.value(rho)

    def grad(self, rho):
        g3, g4 = self.gamma_abs
        _, e3, e4, _ = self._abs_parts(rho)
        return -self.y + g3 * e3 - g4 * e4 + self.box.grad(rho)

    def hess_diag(self, rho):
        g3, g4 = self.gamma_abs
        _, _, _, both = self._abs_parts(rho)
        return self.box.hess_diag(rho) + both * (4.0 * g3 * g4 / (g3 + g4))

    def max_step(self, rho, d):
        return np.inf

    def update_multipliers(self, rho):
        g3, g4 = self.gamma_abs
        t, e3, e4, _ = self._abs_parts(rho)
        c_abs = np.stack([t - rho, t + rho])
        violation_abs = np.abs(np.minimum(c_abs, self.mu_abs / self.gamma_abs))
        self.mu_abs = np.stack([g3 * e3, g4 * e4])
        return np.concatenate([self.box.update(rho).reshape(-1), violation_abs.reshape(-1)])

    def grow_gammas(self, violations, ck, factor, cap):
        n_box = self.box.gamma.size
        _grow(self.box.gamma.reshape(-1), violations[:n_box], ck, factor, cap)
        _grow(self.gamma_abs.reshape(-1), violations[n_box:], ck, factor, cap)


def make_loss_term(loss: Loss, y: np.ndarray, gamma0: float = 10.0):
    if loss.conjugate_kind == "smooth":
        return SmoothLossTerm(loss, y)
    if loss.name == "hinge":
        return HingeSlackTerm(y, gamma0)
    if loss.name == "eps_insensitive":
        return EpsSlackTerm(y, loss.eps, gamma0)
    raise NotImplementedError(f"no SpicyMKL inner term for loss {loss.name!r}")
