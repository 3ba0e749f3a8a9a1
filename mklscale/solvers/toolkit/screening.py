"""Screening: which kernels can be proven inactive without reading them.

Working-set solvers need the dual norms ||u||_{K_m} = sqrt(u^T K_m u) of one vector u (SpicyMKL:
the projected dual rho~; PFBS: the residual) over all M kernels, compared with a threshold. One
engine pass gives them exactly (:meth:`Screening.full_pass`). For a later vector u', the triangle
inequality in the K_m semi-norm and ||K_m^{1/2}||_2 = sqrt(lambda_max(K_m)) give

    ||u'||_{K_m} <= ||u||_{K_m} + sqrt(lambda_max(K_m)) ||u' - u||_2            (docs/design.md)

so every kernel whose bound is below the threshold is inactive at u' without a pass
(:meth:`Screening.upper_bounds`). Kernels with NaN lambda_max or a NaN quadratic form (unfinished
kernels of a bank opened with allow_incomplete) are unavailable: their norm is 0, they are never
held, and certificates cover the available kernels.
"""

from __future__ import annotations

import numpy as np

from mklscale.engine.contract import KernelEngine


class Screening:
    """Exact norms from the last full pass and the bound above for any later vector."""

    def __init__(self, engine: KernelEngine, lambda_max: np.ndarray):
        self.engine = engine
        lambda_max = np.asarray(lambda_max, dtype=np.float64)
        self.available = ~np.isnan(lambda_max)
        self.sqrt_lambda = np.sqrt(np.where(self.available, lambda_max, 0.0))
        self.ref_vector: np.ndarray | None = None
        self.ref_norms: np.ndarray | None = None

    def full_pass(self, u: np.ndarray) -> np.ndarray:
        """(M,) ||u||_{K_m} for every kernel: one engine pass, kept as the bound's reference."""
        q = np.asarray(self.engine.quad_forms(u), dtype=np.float64)
        self.available &= ~np.isnan(q)
        norms = np.sqrt(np.maximum(np.where(self.available, q, 0.0), 0.0))
        self.ref_vector, self.ref_norms = u.copy(), norms
        return norms.copy()

    def norms(self, u: np.ndarray) -> np.ndarray:
        """Exact norms: the last pass's when u is its vector, else a new pass."""
        if self.ref_vector is not None and np.array_equal(u, self.ref_vector):
            return self.ref_norms.copy()
        return self.full_pass(u)

    def upper_bounds(self, u: np.ndarray, kernels: np.ndarray | None = None) -> np.ndarray | None:
        """Bounds on ||u||_{K_m} for ``kernels`` (all for None); None before the first pass."""
        if self.ref_vector is None:
            return None
        shift = float(np.linalg.norm(u - self.ref_vector))
        if kernels is None:
            return self.ref_norms + self.sqrt_lambda * shift
        return self.ref_norms[kernels] + self.sqrt_lambda[kernels] * shift

    def certify(self, u: np.ndarray, held: np.ndarray, held_norms: np.ndarray, threshold: float):
        """(norms, violators) for a certificate at u over every available kernel: ``norms`` are
        ``held_norms`` (the kernels ``held``, computed by the solver) followed by the exact norms of
        the kernels outside ``held`` that the bound cannot prove below ``threshold`` (one pass; none
        when the bound proves them all), ``violators`` those of them above it, largest first."""
        outside = np.setdiff1d(np.flatnonzero(self.available), held)
        if outside.size == 0 or np.all(self.upper_bounds(u, outside) <= threshold):
            return held_norms, outside[:0]
        norms = self.full_pass(u)
        outside = outside[self.available[outside]]
        above = outside[norms[outside] > threshold]
        return np.concatenate([held_norms, norms[outside]]), above[np.argsort(-norms[above], kind="stable")]

    def state(self) -> dict:
        """What a checkpoint keeps: the available mask and the last pass (if any)."""
        state = {"available": self.available}
        if self.ref_vector is not None:
            state.update(ref_vector=self.ref_vector, ref_norms=self.ref_norms)
        return state

    def restore(self, state: dict) -> None:
        if "available" in state:
            self.available = np.asarray(state["available"]).astype(bool)
        if "ref_vector" in state:
            self.ref_vector, self.ref_norms = state["ref_vector"], state["ref_norms"]
