"""UNIFORM and AMKL (alignment) baselines on the real engine; AMKL against cvxpy's (2.11)."""

from __future__ import annotations

import numpy as np
import pytest
from _banks import centred_alignment_terms, widths_and_linear_bank

from mklscale.errors import InvalidInputError
from mklscale.solvers import baselines
from mklscale.solvers._final_fit import centred_alignment, kernel_ridge

from mklscale.bank import KernelBank
from mklscale.engine import Engine


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """n x n solves on a shared 2-core machine: one BLAS thread avoids oversubscription (local to these tests)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield



def small_grams(n=30, seed=0):
    return widths_and_linear_bank(n, seed)


def engine_of(grams, tmp_path, name="b"):
    return Engine(KernelBank.from_arrays(grams, tmp_path / name, dtype="float64"))


def one_stage_optimum(grams, t, lam, nu):
    """min over Delta_nu of (1/2) t^T (sum theta_i K_i + lam I)^{-1} t with cvxpy (matrix_frac, Clarabel).
    Shared with test_gcd.py and test_sgd.py."""
    import cvxpy as cp
    th = cp.Variable(len(grams), nonneg=True)
    Kt = sum(th[i] * grams[i] for i in range(len(grams))) + lam * np.eye(len(t))
    cons = [cp.sum(th) <= 1] if nu == 1 else [cp.pnorm(th, nu) <= 1]
    prob = cp.Problem(cp.Minimize(0.5 * cp.matrix_frac(t, Kt)), cons)
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return float(prob.value), np.maximum(th.value, 0)


def cvxpy_alignment(grams, y):
    """(2.11) on centred kernels: min -b^T theta s.t. theta^T M theta <= 1, theta >= 0 (Clarabel)."""
    import cvxpy as cp
    yc, b, F = centred_alignment_terms(grams, y)
    theta = cp.Variable(len(grams), nonneg=True)
    prob = cp.Problem(cp.Minimize(-b @ theta), [cp.sum_squares(F @ theta) <= 1])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    th = np.maximum(theta.value, 0)
    return th, float(b @ th) / float(yc @ yc)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alignment_matches_cvxpy(tmp_path, seed):
    grams, _, y = small_grams(seed=seed)
    if seed == 2:
        y = np.sign(y - np.median(y))
        y[y == 0] = 1.0
    res = baselines.alignment(engine_of(grams, tmp_path), y, lam=0.1)
    th_ref, align_ref = cvxpy_alignment(grams, y)
    assert res.params["alignment"] == pytest.approx(align_ref, abs=1e-6)
    assert res.params["qp_alignment"] == pytest.approx(align_ref, abs=1e-6)
    # compare directions: both scaled to theta^T M theta = 1 -> compare normalised to sum one
    np.testing.assert_allclose(res.weights, th_ref / th_ref.sum(), atol=1e-4)
    assert res.gap < 1e-8
    assert res.weights.sum() == pytest.approx(1.0)
    # the learned kernel is at least as aligned as every single kernel and the uniform one
    singles = [centred_alignment(K, y) for K in grams]
    assert res.params["alignment"] >= max(singles) - 1e-9
    assert res.params["alignment"] >= centred_alignment(grams.mean(0), y) - 1e-9


def test_uniform_weights_and_kernel_ridge(tmp_path):
    grams, _, y = small_grams()
    eng = engine_of(grams, tmp_path)
    res = baselines.uniform(eng, y, lam=0.5)
    np.testing.assert_allclose(res.weights, np.full(len(grams), 1 / len(grams)))
    K = grams.mean(0)
    c, b = kernel_ridge(K, y, 0.5)
    np.testing.assert_allclose(res.dual_coef, c, atol=1e-10)
    # joint optimality of (c, b): gradient of ||Kc + b - y||^2 + lam c^T K c vanishes
    r = K @ c + b - y
    np.testing.assert_allclose(K @ (2 * r + 2 * 0.5 * c), 0, atol=1e-8)
    assert abs(r.sum()) < 1e-8
    assert res.params["task"] == "regression"
    assert res.objective == pytest.approx(centred_alignment(K, y))


def test_classification_uses_svm(tmp_path):
    grams, X, _ = small_grams(n=40, seed=3)
    y = np.where(X[:, 0] + 0.3 * X[:, 1] > 0, 1.0, -1.0)
    res = baselines.alignment(engine_of(grams, tmp_path), y, C=10.0)
    assert res.params["task"] == "classification"
    K = np.einsum("m,mij->ij", res.weights, grams)
    f = K @ res.dual_coef + res.bias
    assert np.mean(np.sign(f) == y) >= 0.9


def test_bad_labels(tmp_path):
    grams, _, y = small_grams()
    eng = engine_of(grams, tmp_path)
    y = y.copy()
    y[3] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        baselines.alignment(eng, y)
    with pytest.raises(InvalidInputError, match="lam"):
        baselines.uniform(eng, np.ones(len(y)), lam=0.0)
    with pytest.raises(InvalidInputError, match="-1, \\+1"):
        baselines.uniform(eng, np.arange(len(y), dtype=float), task="classification")
