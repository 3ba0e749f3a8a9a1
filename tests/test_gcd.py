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


def test_gcd1s_gaussian_family_reaches_the_fine_grid_optimum_within_its_gap():
    """GCD-1s over continuous widths against an optimum (issue 21), not against the best single width.

    Over Delta_1 the continuous problem is well posed and a fine grid approaches it from above:
    J*_family <= J*_grid. The grid (60 log-spaced widths over the family's interval [0.05, 20]) is solved
    to a certified relative gap of 1e-10 as a finite bank (away steps; that certificate is checked
    against cvxpy in test_certificates.py). Stated (n = 40, lam = 0.05, 40 away-step iterations):
    J_family <= (1 + 1e-3) J*_grid (measured 1.1e-4 above it) and, as J_family - gap <= J*_family <=
    J*_grid, (J_family - J*_grid) / J_family <= the reported relative gap (measured 2.3e-3).
    """
    from _dense_engine import DenseEngine

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (40, 1))
    y = np.sin(3 * X[:, 0]) + np.sin(9 * X[:, 0]) + 0.05 * rng.standard_normal(40)
    fam = GaussianFamily(X, (0.05, 20.0))
    grams = np.stack([fam.block((w,)) for w in np.geomspace(0.05, 20.0, 60)])
    grid = gcd.fit_one_stage(DenseEngine(grams), y, lam=0.05, max_iter=2000, tol=1e-10, variant="away")
    assert grid.converged
    res = gcd.fit_one_stage(fam, y, lam=0.05, max_iter=40, tol=1e-6, variant="away")
    assert res.objective <= grid.objective * (1 + 1e-3), (res.objective / grid.objective - 1)
    assert (res.objective - grid.objective) / res.objective <= res.gap


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


def _cone_alignment_optimum(grams, y):
    """The stated problem of Algorithm 8 with beta=None, solved independently (cvxpy, Clarabel, tight
    tolerances): min_{mu >= 0} ||sum_i mu_i K_{i,c} - y_c y_c^T||_F^2 = mu^T M mu - 2 b^T mu + const
    (M_ij = <K_{i,c}, K_{j,c}>, b_i = y_c^T K_i y_c); returns mu* / sum(mu*) (the solver's normalisation)."""
    import cvxpy as cp
    from _banks import centred_alignment_terms

    _, b, F = centred_alignment_terms(grams, y)
    mu = cp.Variable(len(grams), nonneg=True)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(F @ mu) - 2 * b @ mu))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    mu_star = np.maximum(mu.value, 0)
    return mu_star / mu_star.sum()


def test_gcd2s_euclidean_reaches_the_optimum_and_converged_means_gap_within_tol(tmp_path):
    """Issue 16, defect 4: Algorithm 8 stopped as soon as max_i <K_i, K*_c - K> <= 0 and said converged
    with its own relative gap at 5.4e-3 (this 6-kernel bank, n = 25, seed 1) and weights 0.13 away from the optimum.
    There the Frank-Wolfe vertex is theta = 0 (shrink K); the solver now takes that step and stops only at
    gap <= tol. Stated: with max_iter = 1000 and tol = 1e-6 it converges (measured: 677 iterations) with
    gap <= tol, weights within 2e-4 of cvxpy's solution of the same problem (measured 4e-5) and J
    non-increasing; with max_iter = 50 (measured gap 1.7e-4) converged is False and the gap is > tol."""
    grams, _, y = small_grams(n=25, seed=1)
    eng = engine_of(grams, tmp_path)
    ref = _cone_alignment_optimum(grams, y)
    res = gcd.fit_two_stage(eng, y, criterion="euclidean", lam=0.1, max_iter=1000, tol=1e-6)
    assert res.converged and res.gap <= 1e-6, (res.converged, res.gap)
    np.testing.assert_allclose(res.weights, ref, atol=2e-4)
    J = [h["objective"] for h in res.history]
    assert np.all(np.diff(J) <= 1e-12 * J[0])
    short = gcd.fit_two_stage(eng, y, criterion="euclidean", lam=0.1, max_iter=50, tol=1e-6)
    assert not short.converged and short.gap > 1e-6, (short.converged, short.gap)


def test_gcd2s_euclidean_converged_only_within_tol_on_a_gaussian_bank(tmp_path):
    """Defect 4 on a 12-kernel Gaussian bank (n = 40): main reported converged at iteration 10 with
    relative gap 1.6e-3 and weights 0.13 from the optimum. Stated: converged == (gap <= tol) for
    max_iter 10, 50 and tol 1e-6, 1e-2; more iterations bring the weights closer to cvxpy's (measured
    max |w - w*| 0.067 at 50, 0.034 at 300)."""
    from _banks import subset_gaussian_bank

    grams, y = subset_gaussian_bank(40, 12, 3)
    eng = engine_of(grams, tmp_path)
    for max_iter in (10, 50):
        for tol in (1e-6, 1e-2):
            res = gcd.fit_two_stage(eng, y, criterion="euclidean", max_iter=max_iter, tol=tol)
            assert res.converged == (res.gap <= tol), (max_iter, tol, res.converged, res.gap)
    ref = _cone_alignment_optimum(grams, y)
    err50 = np.abs(gcd.fit_two_stage(eng, y, criterion="euclidean", max_iter=50).weights - ref).max()
    err300 = np.abs(gcd.fit_two_stage(eng, y, criterion="euclidean", max_iter=300).weights - ref).max()
    assert err300 < err50 < 0.1, (err50, err300)


@pytest.mark.parametrize("criterion", ["alignment", "euclidean"])
def test_gcd2s_constant_kernels_are_named(tmp_path, criterion):
    """Issue 16, defect 8: a bank of constant kernels (K = c 1 1^T, centred norm 0) gave "T contains 1600
    NaN/inf value(s)" (alignment) or a ZeroDivisionError (euclidean). Stated: an InvalidInputError that
    says the selected kernel is constant, lists the constant kernels and says what to do; a bank where a
    constant kernel sits among informative ones still fits (the constant kernel gets weight 0)."""
    n = 40
    grams, _, y = small_grams(n=n, seed=0)
    const = np.stack([np.full((n, n), 2.0), np.ones((n, n))])
    with pytest.raises(InvalidInputError) as err:
        gcd.fit_two_stage(engine_of(const, tmp_path, "c"), y, criterion=criterion)
    msg = str(err.value)
    assert "constant over the training points" in msg and "C_n K C_n is zero" in msg
    assert "2 of the 2 kernels are constant (indices 0, 1)" in msg
    assert "Remove the constant kernels" in msg and "stage='one'" in msg
    mixed = grams.copy()
    mixed[2] = 3.0
    res = gcd.fit_two_stage(engine_of(mixed, tmp_path, "m"), y, criterion=criterion, max_iter=100)
    assert res.weights[2] == 0.0 and np.all(np.isfinite(res.weights)) and res.weights.sum() > 0
