"""Every reported gap bounds the truth (issue 21): on oracle problems, the relative suboptimality of
the RETURNED model, (P(model) - P*) / |P(model)| with P* from cvxpy, is at most the gap the solver
reports, for converged runs and for runs cut short (where a gap that under-reports is most tempting).
P(model) is recomputed here from the returned weights, coefficients and bias, not read from the result.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_baselines import one_stage_optimum, small_grams
from test_pfbs import oracle as pfbs_oracle
from test_pfbs import small_problem

from _dense_engine import DenseEngine
from mklscale.solvers import gcd, pfbs

SLACK = 1e-9     # the oracle's own accuracy, relative


def _check(primal: float, optimum: float, gap: float) -> None:
    assert primal >= optimum * (1 - 1e-7), "the returned model beats the oracle: the oracle is wrong"
    assert (primal - optimum) / abs(primal) <= gap + SLACK, (primal, optimum, gap)


@pytest.mark.parametrize("tau_fraction, mu, max_iter", [(0.3, 1e-3, 20000), (0.1, 0.0, 30), (0.05, 1e-2, 8)])
def test_pfbs_gap_bounds_the_returned_model(tau_fraction, mu, max_iter):
    grams, y = small_problem()
    n = y.size
    tau = tau_fraction * pfbs.tau_max(DenseEngine(grams), y)
    res = pfbs.fit(DenseEngine(grams), y, tau, mu, tol=1e-6, max_iter=max_iter)
    q = np.einsum("i,mij,j->m", res.dual_coef, grams, res.dual_coef)
    norms = res.weights * np.sqrt(np.maximum(q, 0.0))                   # ||f_j|| = d_j ||c||_{K_j}
    F = np.einsum("m,mij,j->i", res.weights, grams, res.dual_coef) + res.bias
    primal = float((F - y) @ (F - y) / n + mu * norms @ norms + 2 * tau * norms.sum())
    assert primal == pytest.approx(res.objective, rel=1e-9)
    _check(primal, pfbs_oracle(grams, y, tau, mu)[0], res.gap)


@pytest.mark.parametrize("lam, max_iter, tol", [(0.1, 400, 1e-6), (0.1, 6, 1e-6), (0.1, 400, 1e-2),
                                                 # a large ridge makes J nearly linear in theta, so the
                                                 # Frank-Wolfe gap is nearly tight: halving it is caught
                                                 (1000.0, 400, 1e-3)])
def test_gcd_one_stage_gap_bounds_the_returned_model(lam, max_iter, tol):
    grams, _, y = small_grams(n=25, seed=1)
    res = gcd.fit_one_stage(DenseEngine(grams), y, lam=lam, max_iter=max_iter, tol=tol)
    t = y - res.bias
    K = np.einsum("m,mij->ij", res.weights, grams) + lam * np.eye(y.size)
    primal = 0.5 * float(t @ np.linalg.solve(K, t))                     # J(theta) of the returned weights
    assert primal == pytest.approx(res.objective, rel=1e-9)
    _check(primal, one_stage_optimum(grams, y - y.mean(), lam, nu=1)[0], res.gap)
