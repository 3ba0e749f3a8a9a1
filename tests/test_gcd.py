"""GCD-1s (CKL) and GCD-2s (FSAM, Euclidean) on real-engine banks and on continuous families."""

from __future__ import annotations

import numpy as np
import pytest

from mklscale.errors import InvalidInputError
from mklscale.solvers import baselines, gcd
from mklscale.solvers.sources import DirichletFamily, GaussianFamily
from test_baselines import engine_of, one_stage_optimum, small_grams


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """n x n solves on a shared 2-core machine: one BLAS thread avoids oversubscription (local to these tests)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield



@pytest.mark.parametrize("seed", [0, 1])
def test_gcd1s_monotone_and_reaches_cvxpy_optimum(tmp_path, seed):
    grams, _, y = small_grams(n=25, seed=seed)
    lam = 0.1
    res = gcd.fit_one_stage(engine_of(grams, tmp_path), y, lam=lam, max_iter=400, tol=1e-6)
    J = [h["objective"] for h in res.history]
    assert np.all(np.diff(J) <= 1e-12 * abs(J[0]))
    assert res.converged and res.gap <= 1e-6
    J_star, theta_star = one_stage_optimum(grams, y - y.mean(), lam, nu=1)
    assert res.objective == pytest.approx(J_star, rel=1e-5)
    assert res.objective >= J_star - 1e-7 * abs(J_star)
    np.testing.assert_allclose(res.weights, theta_star, atol=2e-3)
    # one quad_forms pass per iteration (plus nothing else over the whole bank)
    assert res.history[-1]["passes"] - res.history[0]["passes"] == len(res.history) - 1
    # the model is f = K_theta alpha* + b
    K = np.einsum("m,mij->ij", res.weights, grams)
    np.testing.assert_allclose((K + lam * np.eye(len(y))) @ res.dual_coef, y - res.bias, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1])
def test_gcd1s_away_steps_converge_faster_to_the_same_optimum(tmp_path, seed):
    """variant="away" (away-step Frank-Wolfe): same problem, same certificate (relative FW gap <= tol).

    Stated: monotone J; converged with relative gap <= 1e-6 and J within 1e-5 (relative) of cvxpy's
    J*; weights within 2e-3 of cvxpy's theta*; still ONE quad_forms pass per iteration; and no more
    iterations than plain Frank-Wolfe (variant="fw") needs for the same tol.
    """
    grams, _, y = small_grams(n=25, seed=seed)
    lam = 0.1
    eng = engine_of(grams, tmp_path)
    fw = gcd.fit_one_stage(eng, y, lam=lam, max_iter=400, tol=1e-6, variant="fw")
    res = gcd.fit_one_stage(eng, y, lam=lam, max_iter=400, tol=1e-6, variant="away")
    J = [h["objective"] for h in res.history]
    assert np.all(np.diff(J) <= 1e-12 * abs(J[0]))
    assert res.converged and res.gap <= 1e-6
    J_star, theta_star = one_stage_optimum(grams, y - y.mean(), lam, nu=1)
    assert res.objective == pytest.approx(J_star, rel=1e-5)
    np.testing.assert_allclose(res.weights, theta_star, atol=2e-3)
    assert np.all(res.weights >= 0) and res.weights.sum() <= 1 + 1e-12
    assert len(res.history) <= len(fw.history), (len(res.history), len(fw.history))
    assert res.history[-1]["passes"] - res.history[0]["passes"] == len(res.history) - 1
    assert {h.get("step") for h in res.history[:-1]} <= {"fw", "away", "drop"}
    assert res.params["variant"] == "away"
    K = np.einsum("m,mij->ij", res.weights, grams)
    np.testing.assert_allclose((K + lam * np.eye(len(y))) @ res.dual_coef, y - res.bias, atol=1e-8)


def test_gcd1s_away_steps_on_a_gaussian_family():
    """Away steps over continuous widths: monotone J, weights a point of Delta_1, J no worse than
    plain Frank-Wolfe after the same number of iterations (12)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (40, 1))
    y = np.sin(3 * X[:, 0]) + np.sin(9 * X[:, 0]) + 0.05 * rng.standard_normal(40)
    fam = GaussianFamily(X, (1e-2, 1e2))
    fw = gcd.fit_one_stage(fam, y, lam=0.05, max_iter=12, tol=1e-9, variant="fw")
    res = gcd.fit_one_stage(fam, y, lam=0.05, max_iter=12, tol=1e-9, variant="away")
    J = [h["objective"] for h in res.history]
    assert np.all(np.diff(J) <= 1e-12 * J[0])
    assert np.all(res.weights > 0) and res.weights.sum() <= 1 + 1e-12
    assert res.objective <= fw.objective * (1 + 1e-9)


def test_gcd2s_euclidean_equals_amkl_and_decreases(tmp_path):
    grams, _, y = small_grams(n=25, seed=0)
    eng = engine_of(grams, tmp_path)
    res = gcd.fit_two_stage(eng, y, criterion="euclidean", lam=0.1, max_iter=300)
    ref = baselines.alignment(eng, y, lam=0.1)
    J = [h["objective"] for h in res.history]
    assert np.all(np.diff(J) <= 1e-12 * J[0])
    assert res.params["alignment"] == pytest.approx(ref.params["alignment"], abs=1e-6)
    np.testing.assert_allclose(res.weights, ref.weights, atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_gcd2s_alignment_fsam(tmp_path, seed):
    grams, _, y = small_grams(n=25, seed=seed)
    eng = engine_of(grams, tmp_path)
    res = gcd.fit_two_stage(eng, y, criterion="alignment", lam=0.1)
    ref = baselines.alignment(eng, y, lam=0.1)
    F = [h["alignment"] for h in res.history]
    assert np.all(np.diff(F) >= -1e-12)                             # Prop. 5.4 never decreases F
    assert all(0.0 <= h["eta"] <= 1.0 for h in res.history)        # eta_max = 1
    assert res.converged
    if seed == 0:
        assert len(res.history) < 10                                # thesis: < 10 iterations
    assert res.params["alignment"] <= ref.params["alignment"] + 1e-9   # AMKL is the global maximum
    assert res.params["alignment"] >= ref.params["alignment"] - 1e-2
    assert res.params["alignment"] == pytest.approx(F[-1], abs=1e-9)


def test_gcd1s_gaussian_family_widths():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (60, 2))
    y = np.sin(3 * X[:, 0]) + 0.05 * rng.standard_normal(60)
    fam = GaussianFamily(X, (1e-2, 1e2))
    res = gcd.fit_one_stage(fam, y, lam=0.05, max_iter=15, tol=1e-3)
    J = [h["objective"] for h in res.history]
    assert np.all(np.diff(J) <= 1e-12 * J[0])
    widths = [k["widths"][0] for k in res.params["kernels"]]
    assert all(1e-2 <= w <= 1e2 for w in widths)
    # prediction through the family's cross kernels reproduces the training fit
    f_train = fam.predict(res, X)
    K = sum(w * fam.block(k) for w, k in zip(res.weights, fam.keys_of(res)))
    np.testing.assert_allclose(f_train, K @ res.dual_coef + res.bias, atol=1e-8)
    # the greedy width beats a fixed grid of widths at the same alpha (continuous search)
    a = (y - y.mean()) / 0.05
    s, v = fam.argmax_1d(np.outer(a, a))
    grid = max(float(a @ fam.block((w,)) @ a) for w in np.geomspace(1e-2, 1e2, 9))
    assert v >= grid - 1e-9


def test_gcd2s_per_feature_regularised():
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (50, 3))
    y = np.sign(X[:, 0] + 0.2 * rng.standard_normal(50))
    fam = GaussianFamily(X, (1e-2, 1e2), per_feature=True)
    res = gcd.fit_two_stage(fam, y, criterion="alignment", C=1.0, reg=1e-3, max_iter=5)
    assert res.params["task"] == "classification"
    assert all(len(k["widths"]) == 3 for k in res.params["kernels"])
    one_d = gcd.fit_two_stage(GaussianFamily(X, (1e-2, 1e2)), y, criterion="alignment", max_iter=5)
    # feature 0 is the only informative one: per-feature search reaches at least the 1-D alignment
    assert res.params["alignment"] >= one_d.params["alignment"] - 1e-6


@pytest.mark.slow
def test_dirichlet_toy_recovers_frequencies():
    rng = np.random.default_rng(0)
    x = rng.uniform(-10, 10, 500)
    y = np.sign(np.sin(np.sqrt(2) * x) + np.sin(np.sqrt(12) * x) + np.sin(np.sqrt(60) * x))
    fam = DirichletFamily(x, (0.05, 20.0), n_restarts=400)
    res = gcd.fit_two_stage(fam, y, criterion="alignment", C=10.0, max_iter=10)
    found = np.array([k["frequencies"][0] for k in res.params["kernels"]])
    for target in np.sqrt([2.0, 12.0, 60.0]):
        assert np.min(np.abs(found - target)) < 0.05 * target, (found, target)


def test_bad_input(tmp_path):
    grams, _, y = small_grams()
    eng = engine_of(grams, tmp_path)
    bad = y.copy()
    bad[0] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        gcd.fit_one_stage(eng, bad)
    with pytest.raises(InvalidInputError, match="variant"):
        gcd.fit_one_stage(eng, y, variant="pairwise")
    with pytest.raises(InvalidInputError, match="criterion"):
        gcd.fit_two_stage(eng, y, criterion="cosine")
    with pytest.raises(InvalidInputError, match="lower < upper"):
        GaussianFamily(np.ones((5, 1)), (2.0, 1.0))
    with pytest.raises(InvalidInputError, match="positive"):
        GaussianFamily(np.ones((5, 1)), (0.0, 1.0))
