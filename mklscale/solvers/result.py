"""The result every MKL solver returns.

A model is (weights d, dual coefficients c, bias b) with the training decision function

    f = sum_m d_m K_m c + b,

i.e. the per-kernel coefficient vectors of problem (7)/(42) of SpicyMKL are alpha_m = d_m c.
``weights`` has one entry per kernel of the bank with exact zeros for kernels out of the model;
``active`` lists the kernels with non-zero weight, in increasing order, which is also the order of
the cross kernels ``decision_function_from_kernels`` expects.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from mklscale.errors import InvalidInputError

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def json_safe(value: Any) -> Any:
    """Numbers, strings, lists and dicts only; non-finite floats become "inf"/"-inf"/"nan"."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in an MKLResult dict")


def _float_from_json(value: Any) -> float:
    if isinstance(value, str):
        return _NON_FINITE[value]
    return float(value)


def _restore_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _restore_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_floats(v) for v in value]
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    return value


@dataclasses.dataclass
class MKLResult:
    """Kernel weights, dual coefficients, bias and the convergence record of one solver run.

    Attributes
    ----------
    weights : (M,) float64, exact zeros for kernels out of the model.
    dual_coef : (n,) float64, the shared vector c in f = sum_m weights[m] K_m c + bias.
    bias : float.
    active : (k,) int64, ``flatnonzero(weights)``.
    objective : primal value of the problem the solver states, evaluated at the returned model.
    gap : final relative duality gap, certified over all M kernels (each solver states its
        normalisation; SpicyMKL: (primal - dual) / max(|primal|, 1)).
    history : one dict per outer iteration (primal, dual, gap, n_active, passes, bytes_read,
        seconds, and solver-specific extras).
    converged : whether the stopping rule was met.
    solver : name of the algorithm.
    params : the parameters of the run (JSON-safe values).
    warm_state : what the solver hands the next value of a path besides the model (SpicyMKL: the
        proximity parameters it reached); not part of the model, never saved.
    """

    weights: np.ndarray
    dual_coef: np.ndarray
    bias: float
    active: np.ndarray
    objective: float
    gap: float
    history: list = dataclasses.field(default_factory=list)
    converged: bool = False
    solver: str = ""
    params: dict = dataclasses.field(default_factory=dict)
    warm_state: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.weights = np.asarray(self.weights, dtype=np.float64).reshape(-1)
        self.dual_coef = np.asarray(self.dual_coef, dtype=np.float64).reshape(-1)
        self.active = np.asarray(self.active, dtype=np.int64).reshape(-1)
        self.bias = float(self.bias)
        self.objective = float(self.objective)
        self.gap = float(self.gap)
        self.converged = bool(self.converged)
        if not np.array_equal(self.active, np.flatnonzero(self.weights)):
            raise InvalidInputError("MKLResult.active must equal flatnonzero(weights) (sorted indices "
                                    "of the kernels with non-zero weight)")

    @property
    def n_active(self) -> int:
        return int(self.active.size)

    def decision_function_from_kernels(self, K_cross) -> np.ndarray:
        """f(x_new) = sum_j weights[active[j]] K_cross[j] @ dual_coef + bias.

        ``K_cross`` has shape (len(active), n_new, n): the cross kernels k_m(X_new, X_train) of the
        ACTIVE kernels, in the order of ``active``.
        """
        K_cross = np.asarray(K_cross, dtype=np.float64)
        n = self.dual_coef.size
        if K_cross.ndim != 3 or K_cross.shape[0] != self.active.size or K_cross.shape[2] != n:
            raise InvalidInputError(
                f"K_cross must have shape (len(active)={self.active.size}, n_new, n={n}); got "
                f"{K_cross.shape}. Pass the cross kernels of the active kernels only, in the "
                "order of result.active.")
        if not np.all(np.isfinite(K_cross)):
            raise InvalidInputError("K_cross contains NaN or inf")
        combined = np.einsum("m,mij->ij", self.weights[self.active], K_cross)
        return combined @ self.dual_coef + self.bias

    def to_dict(self) -> dict:
        """A JSON-safe dict (arrays as lists, non-finite floats as strings); see :meth:`from_dict`."""
        return {
            "weights": json_safe(self.weights),
            "dual_coef": json_safe(self.dual_coef),
            "bias": json_safe(self.bias),
            "active": json_safe(self.active),
            "objective": json_safe(self.objective),
            "gap": json_safe(self.gap),
            "history": json_safe(self.history),
            "converged": self.converged,
            "solver": self.solver,
            "params": json_safe(self.params),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "MKLResult":
        """Inverse of :meth:`to_dict`; unknown or missing keys are errors."""
        expected = {f.name for f in dataclasses.fields(cls)} - {"warm_state"}  # never saved
        if not isinstance(data, dict) or set(data) != expected:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise InvalidInputError(f"an MKLResult dict needs exactly the keys {sorted(expected)}; got {got}")
        return cls(
            weights=np.array([_float_from_json(v) for v in data["weights"]], dtype=np.float64),
            dual_coef=np.array([_float_from_json(v) for v in data["dual_coef"]], dtype=np.float64),
            bias=_float_from_json(data["bias"]),
            active=np.array(data["active"], dtype=np.int64),
            objective=_float_from_json(data["objective"]),
            gap=_float_from_json(data["gap"]),
            history=_restore_floats(data["history"]),
            converged=bool(data["converged"]),
            solver=str(data["solver"]),
            params=_restore_floats(data["params"]),
        )
