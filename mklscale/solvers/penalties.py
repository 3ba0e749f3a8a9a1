"""Block-norm penalties of SpicyMKL §4 (Suzuki & Tomioka), as plug-in objects.

Problem (42): sum_i loss(y_i, f_i) + sum_m g~_C(||alpha_m||_{K_m}) with g~_C(x) = C g(x^2) convex
in x >= 0. Every method works elementwise on float64 arrays of x = ||alpha_m||_K >= 0 (primal
side) or y = ||rho||_K >= 0 (dual side) and takes the scale C explicitly, because the solver calls
them with gamma*C (note erratum 5: the subscript in (47) is gamma C).

Per penalty (the §4 plug-in list):
  value(x, C)                 g~_C(x)
  prox(v, C)                  argmin_{x >= 0} g~_C(x) + (x - v)^2 / 2          (§4.2)
  prox_derivative(v, C)       d prox / dv
  conjugate(y, C)             g~_C*(y) = sup_{x >= 0} x y - g~_C(x)             (45)
  conjugate_derivative, conjugate_second_derivative                      (§4.3, used by ElastMKL)
  ghat(y, C)                  Moreau envelope of g~_C*: min_{y'} g~_C*(y') + (y' - y)^2 / 2  (47);
                              by Moreau's identity ghat'(y) = prox(y, C)
  weight(x)                   kernel weight d = 1 / (2 g'(x^2)) (Table 3), 0 where x = 0
  threshold(C)                kernels with ||rho||_K <= threshold have alpha_m = 0 (0: no sparsity)

With d = weight(||alpha_m*||) every optimal alpha_m* equals d_m rho*/C (see spicy.py), which is why
``weight`` has no C: x / g~_C'(x) = d / C.
"""

from __future__ import annotations

import numpy as np

from mklscale.errors import InvalidInputError


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


class Penalty:
    """Interface; see the module docstring for the formulas each method implements."""

    name = "penalty"
    #: True when g~_C* is twice differentiable, so the one-step method of §4.3 applies.
    smooth_conjugate = False

    def value(self, x, C):
        raise NotImplementedError

    def prox(self, v, C):
        raise NotImplementedError

    def prox_derivative(self, v, C):
        raise NotImplementedError

    def conjugate(self, y, C):
        raise NotImplementedError

    def conjugate_derivative(self, y, C):
        raise NotImplementedError

    def conjugate_second_derivative(self, y, C):
        raise NotImplementedError

    def ghat(self, y, C):
        raise NotImplementedError

    def weight(self, x):
        raise NotImplementedError

    def threshold(self, C) -> float:
        raise NotImplementedError

    def params(self) -> dict:
        return {}


class L1(Penalty):
    """Block 1-norm, g~(x) = x (g(x) = sqrt(x), problem (4)/(7)).

    prox(v) = (v - C)_+ (soft threshold (13)); g~_C* is the indicator of [0, C] (21);
    ghat(y) = (y - C)_+^2 / 2 (the squared prox norm of (22), with the erratum-2 factor 1/2);
    weight d = x (Table 3: h(d) = d).
    """

    name = "l1"

    def value(self, x, C):
        return C * _arr(x)

    def prox(self, v, C):
        return np.maximum(_arr(v) - C, 0.0)

    def prox_derivative(self, v, C):
        return (_arr(v) > C).astype(np.float64)

    def conjugate(self, y, C):
        return np.where(_arr(y) <= C, 0.0, np.inf)

    def conjugate_derivative(self, y, C):
        return np.where(_arr(y) <= C, 0.0, np.inf)

    def conjugate_second_derivative(self, y, C):
        return np.where(_arr(y) <= C, 0.0, np.inf)

    def ghat(self, y, C):
        return 0.5 * np.maximum(_arr(y) - C, 0.0) ** 2

    def weight(self, x):
        return _arr(x).copy()

    def threshold(self, C) -> float:
        return float(C)


class ElasticNet(Penalty):
    """Elastic net, g~(x) = (1 - lam) x + lam x^2 / 2 (problem (43), §4.2, §4.3.1).

    prox(v) = (v - C(1-lam))_+ / (1 + C lam);
    g~_C*(y) = (y - C(1-lam))_+^2 / (2 C lam) (46); ghat(y) = (y - C(1-lam))_+^2 / (2 (1 + C lam));
    weight d = x / (1 - lam + lam x) (§4.1). lam = 0 is the block 1-norm, lam = 1 gives uniform
    weights (d = 1 for every kernel in the model).
    """

    name = "elastic_net"

    def __init__(self, lam: float = 0.5):
        lam = float(lam)
        if not (0.0 <= lam <= 1.0):
            raise InvalidInputError(f"elastic net mixing lam must lie in [0, 1]; got {lam}; give lam in [0, 1] "
                                        "(0: block-1, 1: pure squared block norms)")
        self.lam = lam
        self.smooth_conjugate = lam > 0.0

    def _kink(self, C):
        return C * (1.0 - self.lam)

    def value(self, x, C):
        x = _arr(x)
        return C * ((1.0 - self.lam) * x + 0.5 * self.lam * x * x)

    def prox(self, v, C):
        return np.maximum(_arr(v) - self._kink(C), 0.0) / (1.0 + C * self.lam)

    def prox_derivative(self, v, C):
        return (_arr(v) > self._kink(C)).astype(np.float64) / (1.0 + C * self.lam)

    def conjugate(self, y, C):
        excess = np.maximum(_arr(y) - self._kink(C), 0.0)
        if self.lam == 0.0:
            return np.where(excess > 0.0, np.inf, 0.0)
        return excess**2 / (2.0 * C * self.lam)

    def conjugate_derivative(self, y, C):
        excess = np.maximum(_arr(y) - self._kink(C), 0.0)
        if self.lam == 0.0:
            return np.where(excess > 0.0, np.inf, 0.0)
        return excess / (C * self.lam)

    def conjugate_second_derivative(self, y, C):
        above = _arr(y) > self._kink(C)
        if self.lam == 0.0:
            return np.where(above, np.inf, 0.0)
        return above.astype(np.float64) / (C * self.lam)

    def ghat(self, y, C):
        return np.maximum(_arr(y) - self._kink(C), 0.0) ** 2 / (2.0 * (1.0 + C * self.lam))

    def weight(self, x):
        x = _arr(x)
        out = np.zeros_like(x)
        pos = x > 0.0
        out[pos] = x[pos] / (1.0 - self.lam + self.lam * x[pos])
        return out

    def threshold(self, C) -> float:
        return float(self._kink(C))

    def params(self) -> dict:
        return {"lam": self.lam}


class BlockQ(Penalty):
    """Block q-norm, g~(x) = x^q / q, q > 1 (g(x) = x^{q/2}/q, §4.3.2).

    prox(v) = the root x in [0, v] of C x^{q-1} + x = v (no closed form; monotone Newton to
    machine precision); prox' = 1 / (1 + C (q-1) x^{q-2});
    g~_C*(y) = C^{1-r} y^r / r with r = q/(q-1);
    ghat(y) = y^2/2 - env_{g~_C}(y) = p (y - p/2) - p (y - p)/q with p = prox(y) (Moreau).
    weight d = x^{2-q} (Table 3 with the erratum p = q/(2-q)). For q > 2, g is convex, so the
    Tikhonov form (44) no longer holds, but alpha_m = d_m rho/C stays exact.
    No kernel is ever out of the model (threshold 0).
    """

    name = "block_q"
    smooth_conjugate = True

    def __init__(self, q: float = 1.5):
        q = float(q)
        if not (np.isfinite(q) and q > 1.0):
            raise InvalidInputError(f"block q-norm needs a finite q > 1; got {q} (q = 1 is the "
                                    "block 1-norm: use penalty='l1')")
        self.q = q
        self.r = q / (q - 1.0)

    def value(self, x, C):
        return C * _arr(x) ** self.q / self.q

    def prox(self, v, C):
        # Newton from the right on a convex increasing equation converges monotonically:
        # in x when q >= 2 (C x^{q-1} + x convex), in u = x^{q-1} when q < 2 (C u + u^{1/(q-1)}).
        v = np.maximum(_arr(v), 0.0)
        x = np.minimum(v, (v / C) ** (1.0 / (self.q - 1.0)))
        pos = x > 0.0
        if self.q >= 2.0:
            for _ in range(100):
                f = C * x[pos] ** (self.q - 1.0) + x[pos] - v[pos]
                step = f / (C * (self.q - 1.0) * x[pos] ** (self.q - 2.0) + 1.0)
                x[pos] = np.maximum(x[pos] - step, 0.0)
                if np.all(np.abs(step) <= 1e-15 * x[pos]):
                    break
        else:
            e = 1.0 / (self.q - 1.0)
            u = x[pos] ** (self.q - 1.0)
            for _ in range(100):
                f = C * u + u**e - v[pos]
                step = f / (C + e * u ** (e - 1.0))
                u = np.maximum(u - step, 0.0)
                if np.all(np.abs(step) <= 1e-15 * u):
                    break
            x[pos] = u**e
        return x

    def prox_derivative(self, v, C):
        x = self.prox(v, C)
        out = np.empty_like(x)
        pos = x > 0.0
        out[pos] = 1.0 / (1.0 + C * (self.q - 1.0) * x[pos] ** (self.q - 2.0))
        # the limit x -> 0 of the same formula
        if self.q < 2.0:
            out[~pos] = 0.0
        elif self.q == 2.0:
            out[~pos] = 1.0 / (1.0 + C)
        else:
            out[~pos] = 1.0
        return out

    def conjugate(self, y, C):
        return C ** (1.0 - self.r) * np.maximum(_arr(y), 0.0) ** self.r / self.r

    def conjugate_derivative(self, y, C):
        return C ** (1.0 - self.r) * np.maximum(_arr(y), 0.0) ** (self.r - 1.0)

    def conjugate_second_derivative(self, y, C):
        y = np.maximum(_arr(y), 0.0)
        with np.errstate(divide="ignore"):
            return C ** (1.0 - self.r) * (self.r - 1.0) * y ** (self.r - 2.0)

    def ghat(self, y, C):
        y = np.maximum(_arr(y), 0.0)
        p = self.prox(y, C)
        return p * ((y - 0.5 * p) - (y - p) / self.q)

    def weight(self, x):
        x = _arr(x)
        out = np.zeros_like(x)
        pos = x > 0.0
        out[pos] = x[pos] ** (2.0 - self.q)
        return out

    def threshold(self, C) -> float:
        return 0.0

    def params(self) -> dict:
        return {"q": self.q}


PENALTIES = ("l1", "elastic_net", "block_q")


def make_penalty(name: str, lam: float = 0.5, q: float = 1.5) -> Penalty:
    """Penalty object by name: "l1", "elastic_net" (uses lam) or "block_q" (uses q)."""
    if name == "l1":
        return L1()
    if name == "elastic_net":
        return ElasticNet(lam)
    if name == "block_q":
        return BlockQ(q)
    raise InvalidInputError(f"unknown penalty {name!r}; choose one of {PENALTIES}")
