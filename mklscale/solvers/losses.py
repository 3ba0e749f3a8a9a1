"""Losses of SpicyMKL (Suzuki & Tomioka) as plug-in objects (the §4 interface).

Sign convention of the paper: the dual variable rho enters through L*(-rho), with
L*(s) = sup_z s^T z - L(z) the convex conjugate of L(z) = sum_i loss(y_i, z_i). Hence, at a
primal-dual pair, rho_i = -d loss(y_i, f_i)/df_i and f = -grad_rho L*(-rho) (erratum 6 of the note).

Per loss:
  value(y, f)                 sum_i loss(y_i, f_i)
  grad(y, f)                  d loss(y_i, f_i) / d f_i (for other solvers)
  conjugate(y, rho)           h(rho) = L*(-rho) = sum_i loss*(y_i, -rho_i); +inf outside the domain
  conjugate_grad(y, rho)      dh/drho_i on the domain (a subgradient where h has a kink)
  conjugate_hess(y, rho)      d^2 h / drho_i^2 (diagonal), 0 where h is piecewise linear
  dual_bounds(y)              (lo, hi): the closed box that is the domain of h (+-inf if none)
  clip_to_domain(y, rho)      rho clipped into that box (used to evaluate the dual)
  initial_dual(y)             an interior starting point (the reference code's rho = y/2 for
                              classification)
Classification losses need labels in {-1, +1}; they are validated by the solvers.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, xlogy

from mklscale.errors import InvalidInputError


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


class Loss:
    """Interface; see the module docstring."""

    name = "loss"
    is_classification = False
    #: "smooth": h is twice differentiable on an open domain (Newton + line search, §3.3);
    #: "slack": h is piecewise linear with box constraints, handled by the slack augmented
    #: Lagrangian of §3.4.
    conjugate_kind = "smooth"

    def value(self, y, f) -> float:
        raise NotImplementedError

    def grad(self, y, f) -> np.ndarray:
        raise NotImplementedError

    def conjugate(self, y, rho) -> float:
        raise NotImplementedError

    def conjugate_grad(self, y, rho) -> np.ndarray:
        raise NotImplementedError

    def conjugate_hess(self, y, rho) -> np.ndarray:
        raise NotImplementedError

    def dual_bounds(self, y) -> tuple[np.ndarray, np.ndarray]:
        y = _arr(y)
        return np.full_like(y, -np.inf), np.full_like(y, np.inf)

    def clip_to_domain(self, y, rho) -> np.ndarray:
        lo, hi = self.dual_bounds(y)
        return np.clip(_arr(rho), lo, hi)

    def in_domain(self, y, rho) -> bool:
        lo, hi = self.dual_bounds(y)
        rho = _arr(rho)
        return bool(np.all((rho >= lo) & (rho <= hi)))

    def initial_dual(self, y) -> np.ndarray:
        raise NotImplementedError

    def params(self) -> dict:
        return {}


def _class_box(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """0 <= y rho <= 1 for labels in {-1, +1}: rho in [0, 1] (y = +1) or [-1, 0] (y = -1)."""
    return np.minimum(y, 0.0), np.maximum(y, 0.0)


class Logistic(Loss):
    """loss(y, f) = log(1 + exp(-y f)), y in {-1, +1}.

    h(rho) = sum (y rho) log(y rho) + (1 - y rho) log(1 - y rho) on 0 <= y rho <= 1 (16);
    dh/drho = y log(y rho / (1 - y rho)), d2h/drho^2 = 1 / (y rho (1 - y rho)).
    """

    name = "logistic"
    is_classification = True

    def value(self, y, f):
        return float(np.sum(np.logaddexp(0.0, -_arr(y) * _arr(f))))

    def grad(self, y, f):
        y = _arr(y)
        return -y * expit(-y * _arr(f))

    def conjugate(self, y, rho):
        t = _arr(y) * _arr(rho)
        if np.any((t < 0.0) | (t > 1.0)):
            return np.inf
        return float(np.sum(xlogy(t, t) + xlogy(1.0 - t, 1.0 - t)))

    def conjugate_grad(self, y, rho):
        y = _arr(y)
        t = y * _arr(rho)
        with np.errstate(divide="ignore"):
            return y * (np.log(t) - np.log1p(-t))

    def conjugate_hess(self, y, rho):
        t = _arr(y) * _arr(rho)
        with np.errstate(divide="ignore"):
            return 1.0 / (t * (1.0 - t))

    def dual_bounds(self, y):
        return _class_box(_arr(y))

    def initial_dual(self, y):
        return 0.5 * _arr(y)


class Hinge(Loss):
    """loss(y, f) = max(0, 1 - y f), y in {-1, +1}.

    h(rho) = -sum y rho on 0 <= y rho <= 1 (17): linear, so dh = -y, d2h = 0; the box is enforced
    by the slack augmented Lagrangian of §3.4.1.
    """

    name = "hinge"
    is_classification = True
    conjugate_kind = "slack"

    def value(self, y, f):
        return float(np.sum(np.maximum(0.0, 1.0 - _arr(y) * _arr(f))))

    def grad(self, y, f):
        y = _arr(y)
        return -y * (y * _arr(f) < 1.0)

    def conjugate(self, y, rho):
        y, rho = _arr(y), _arr(rho)
        t = y * rho
        if np.any((t < 0.0) | (t > 1.0)):
            return np.inf
        return float(-np.sum(t))

    def conjugate_grad(self, y, rho):
        return -_arr(y) + 0.0 * _arr(rho)

    def conjugate_hess(self, y, rho):
        return np.zeros_like(_arr(rho))

    def dual_bounds(self, y):
        return _class_box(_arr(y))

    def initial_dual(self, y):
        return 0.5 * _arr(y)


class Square(Loss):
    """loss(y, f) = (1/2) (y - f)^2 (the reference code's convention; the paper's text uses
    (y - f)^2, i.e. twice this loss; erratum 9).

    h(rho) = sum -y rho + rho^2 / 2 (no domain restriction); at the optimum rho = y - f.
    """

    name = "square"

    def value(self, y, f):
        return float(0.5 * np.sum((_arr(y) - _arr(f)) ** 2))

    def grad(self, y, f):
        return _arr(f) - _arr(y)

    def conjugate(self, y, rho):
        rho = _arr(rho)
        return float(np.sum(-_arr(y) * rho + 0.5 * rho * rho))

    def conjugate_grad(self, y, rho):
        return _arr(rho) - _arr(y)

    def conjugate_hess(self, y, rho):
        return np.ones_like(_arr(rho))

    def initial_dual(self, y):
        return _arr(y).copy()


class EpsInsensitive(Loss):
    """loss(y, f) = max(0, |f - y| - eps) (§3.4.2).

    loss*(y, s) = y s + eps |s| on |s| <= 1 (34), so h(rho) = sum -y rho + eps |rho| on
    |rho| <= 1: piecewise linear, handled by the constrained-conjugate augmented Lagrangian of
    §3.4.2 (|rho| <= t with an auxiliary t, box |rho| <= 1).
    """

    name = "eps_insensitive"
    conjugate_kind = "slack"

    def __init__(self, eps: float = 0.1):
        eps = float(eps)
        if not (np.isfinite(eps) and eps >= 0.0):
            raise InvalidInputError(f"eps of the eps-insensitive loss must be finite and >= 0; got {eps}; give eps >= 0")
        self.eps = eps

    def value(self, y, f):
        return float(np.sum(np.maximum(0.0, np.abs(_arr(f) - _arr(y)) - self.eps)))

    def grad(self, y, f):
        r = _arr(f) - _arr(y)
        return np.sign(r) * (np.abs(r) > self.eps)

    def conjugate(self, y, rho):
        rho = _arr(rho)
        if np.any(np.abs(rho) > 1.0):
            return np.inf
        return float(np.sum(-_arr(y) * rho + self.eps * np.abs(rho)))

    def conjugate_grad(self, y, rho):
        rho = _arr(rho)
        return -_arr(y) + self.eps * np.sign(rho)

    def conjugate_hess(self, y, rho):
        return np.zeros_like(_arr(rho))

    def dual_bounds(self, y):
        y = _arr(y)
        return np.full_like(y, -1.0), np.full_like(y, 1.0)

    def initial_dual(self, y):
        y = _arr(y)
        return 0.5 * np.sign(y - np.median(y))

    def params(self) -> dict:
        return {"eps": self.eps}


LOSSES = ("logistic", "hinge", "square", "eps_insensitive")


def make_loss(name: str, eps: float = 0.1) -> Loss:
    """Loss object by name: "logistic", "hinge", "square" or "eps_insensitive" (uses eps)."""
    if name == "logistic":
        return Logistic()
    if name == "hinge":
        return Hinge()
    if name == "square":
        return Square()
    if name == "eps_insensitive":
        return EpsInsensitive(eps)
    raise InvalidInputError(f"unknown loss {name!r}; choose one of {LOSSES}")
