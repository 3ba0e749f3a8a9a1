"""SGD-1s on a real-engine bank and on the polynomial product family (Algorithm 3)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from mklscale.errors import InvalidInputError
from mklscale.solvers import sgd
from mklscale.solvers._final_fit import kernel_ridge
from mklscale.solvers.sources import GaussianFamily, PolynomialFamily
from test_baselines import engine_of, one_stage_optimum, small_grams


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """n x n solves on a shared 2-core machine: one BLAS thread avoids oversubscription (local to these tests)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield



def test_sgd_finite_bank_close_to_optimum(tmp_path):
    """Oracle: J* from cvxpy (Clarabel) on a 6-kernel bank (n = 25, lam = 0.1, nu = 2), seed 3.

    Returned iterate = the suffix average over the second half (default average_from = 0.5).
    Stated tolerances: J(theta_bar) / J* - 1 <= 1% at T = 1000 and <= 0.5% at T = 4000, and the gap
    at T = 4000 is smaller than at T = 1000 (measured: 7.5e-3 and 3.9e-3; over seeds 0..5 at most
    9.2e-3 and 4.3e-3). The full average (average_from = 0, Corollary 4.3's iterate) is much further
    (measured 4.4e-2 at T = 4000): asserted only to be worse than the suffix average. Last iterate
    within 1% at T = 4000.
    """
    grams, _, y = small_grams(n=25, seed=0)
    lam = 0.1
    eng = engine_of(grams, tmp_path)
    J_star, _ = one_stage_optimum(grams, y - y.mean(), lam, nu=2)
    short = sgd.fit(eng, y, lam=lam, nu=2, T=1000, refresh=50, seed=3, tol=None)
    res = sgd.fit(eng, y, lam=lam, nu=2, T=4000, refresh=50, seed=3, tol=None)
    gap_short, gap = short.objective / J_star - 1.0, res.objective / J_star - 1.0
    assert -1e-9 <= gap_short <= 1e-2, gap_short
    assert -1e-9 <= gap <= 5e-3, gap
    assert gap < gap_short                                     # the trend: T -> 4T closes the gap
    assert res.params["averaged_iterates"] == 2000
    full = sgd.fit(eng, y, lam=lam, nu=2, T=4000, refresh=50, seed=3, average_from=0.0, tol=None)
    assert full.params["averaged_iterates"] == 4000
    assert full.objective > res.objective                      # same draws, same last iterate
    assert full.params["objective_last"] == res.params["objective_last"]
    assert J_star <= res.params["objective_last"] <= 1.01 * J_star
    assert np.linalg.norm(res.weights) <= 1 + 1e-12 and np.all(res.weights >= 0)
    # passes (this solve's running total, though `short` ran on the engine first): one per refresh;
    # blocks: one per iteration
    assert res.history[-1]["passes"] == 4000 // 50
    assert res.params["blocks_read"] == 4000
    # the returned model is alpha*(theta_bar)
    K = np.einsum("m,mij->ij", res.weights, grams)
    np.testing.assert_allclose((K + lam * np.eye(len(y))) @ res.dual_coef, y - res.bias, atol=1e-7)
    again = sgd.fit(eng, y, lam=lam, T=200, seed=3)
    assert np.array_equal(again.weights, sgd.fit(eng, y, lam=lam, T=200, seed=3).weights)
    # T runs certify their returned iterate too: the suffix average's Frank-Wolfe gap bounds J - J*
    assert res.converged and 0.0 <= gap * J_star / res.objective <= res.gap


@pytest.mark.parametrize("nu", [2, 1, 3])
def test_sgd_default_stops_at_a_certified_iterate(tmp_path, nu):
    """The default tol: the solver stops at the first refresh whose iterate has relative Frank-Wolfe gap
    <= tol, returns that iterate, and its gap bounds the truth (J* from cvxpy) -- before T."""
    grams, _, y = small_grams(n=25, seed=0)
    lam = 0.1
    eng = engine_of(grams, tmp_path)
    J_star, _ = one_stage_optimum(grams, y - y.mean(), lam, nu=nu)
    res = sgd.fit(eng, y, lam=lam, nu=nu, T=1000, refresh=50, seed=3)
    assert res.converged and res.gap <= sgd.DEFAULT_TOL
    assert res.params["returned_iterate"] == "last" and res.params["blocks_read"] < 1000
    assert res.history[-1]["certified_gap"] == res.gap
    truth = res.objective / J_star - 1.0
    assert -1e-9 <= truth * J_star / res.objective <= res.gap + 1e-12, (truth, res.gap)
    # the returned model is alpha*(theta) of the returned weights
    K = np.einsum("m,mij->ij", res.weights, grams)
    np.testing.assert_allclose((K + lam * np.eye(len(y))) @ res.dual_coef, y - res.bias, atol=1e-7)
    # a tolerance no iterate meets: all T iterations, the average returned, reported unconverged
    tight = sgd.fit(eng, y, lam=lam, nu=nu, T=100, refresh=50, seed=3, tol=1e-12)
    assert not tight.converged and tight.gap > 1e-12 and tight.params["returned_iterate"] == "average"
    assert tight.params["blocks_read"] == 100


def test_projection_onto_nu_ball():
    rng = np.random.default_rng(0)
    v = rng.uniform(0, 1, 6)
    for nu in (1.0, 1.5, 2.0, 3.0):
        p = sgd.project_nonneg_nu_ball(v, nu)
        assert np.sum(p ** nu) == pytest.approx(1.0, abs=1e-8)
        # optimality: no feasible random point is closer
        for _ in range(200):
            z = np.maximum(p + 0.05 * rng.standard_normal(6), 0)
            z = z / max(1.0, np.sum(z ** nu) ** (1 / nu))
            assert np.linalg.norm(z - v) >= np.linalg.norm(p - v) - 1e-9


def test_sgd_nu_other_than_two_on_bank(tmp_path):
    grams, _, y = small_grams(n=20, seed=1)
    res = sgd.fit(engine_of(grams, tmp_path), y, lam=0.1, nu=1, T=300, seed=0)
    assert np.sum(res.weights) <= 1 + 1e-9


def test_polynomial_sampler_chi_square():
    """Algorithm 3 draws ordered multi-indices with probability q_I = rho_d^-2 a^T K_I a / sum (fixed seed)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (12, 3))
    fam = PolynomialFamily(X, D=2, rho2=[1.0, 2.0, 0.5])
    alpha = rng.standard_normal(12)
    q = fam.brute_force_q(alpha)
    keys = list(q)
    probs = np.array([q[k] for k in keys]) / sum(q.values())
    counts = dict.fromkeys(keys, 0)
    draw_rng = np.random.default_rng(42)
    N = 20000
    for _ in range(N):
        key, K, qk, prob, C = fam.sample(alpha, draw_rng)
        counts[key] += 1
    assert C == pytest.approx(sum(q.values()))
    assert prob == pytest.approx(q[key] / C)
    obs = np.array([counts[k] for k in keys])
    keep = probs * N >= 5
    stat, p = scipy.stats.chisquare(obs[keep], probs[keep] * N * obs[keep].sum() / (probs[keep] * N).sum())
    assert p > 1e-3, (stat, p)
    assert fam.size == 1 + 3 + 9


def test_sgd_polynomial_family_reaches_the_cvxpy_optimum():
    """SGD-1s on a family against the optimum of the same problem (issue 21), not against a baseline.

    The polynomial family with r = 3, D = 2 has 13 ordered multi-indices: the problem over Delta_2 is
    finite and cvxpy solves it exactly (kernels K_I / rho_d^2). Algorithm 3 draws I with s_I = q_I / C, so
    the importance-weighted step (1/2) q_I / s_I is what makes the gradient estimate unbiased. Stated
    (lam = 0.1, T = 4000, seed 0, n = 30): J(theta_bar) / J* - 1 <= 4e-3 (measured 2.0e-3; seeds 1, 2:
    1.7e-3, 2.2e-3). Dropping the 1 / s_I correction (a biased gradient) gives 7.0e-3 (6.6e-3 to 7.0e-3
    over seeds 0-2): it converges to another point.

    The Gaussian and Dirichlet families take nu = 2 only, and over a continuum of widths Delta_2 has no
    optimum (k nearby widths with weight 1/sqrt(k) each have ||theta||_2 = 1 and sum sqrt(k) K: J tends to
    its infimum as k grows), so there the tests state J's progress, not a distance to J*.
    """
    import itertools

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (30, 3))
    y = X[:, 0] * X[:, 1] + 0.5 * X[:, 0] + 0.1 * rng.standard_normal(30)
    fam = PolynomialFamily(X, D=2)
    keys = [k for d in range(3) for k in itertools.product(range(3), repeat=d)]
    assert len(keys) == fam.size == 13
    grams = np.stack([fam.block(k) * fam.weight(k) for k in keys])
    J_star, _ = one_stage_optimum(grams, y - y.mean(), 0.1, nu=2)
    res = sgd.fit(fam, y, lam=0.1, T=4000, seed=0)
    assert J_star * (1 - 1e-7) <= res.objective <= J_star * (1 + 4e-3), (res.objective / J_star - 1)


def test_polynomial_family_scale_r100_D3():
    """The family with r = 100, D = 3 (1 010 101 ordered multi-indices) runs without enumerating it."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (60, 100))
    y = X[:, 0] * X[:, 1] + X[:, 2] ** 3
    fam = PolynomialFamily(X, D=3)
    assert fam.size == 1_010_101
    res = sgd.fit(fam, y, lam=1e-2, T=30, seed=0)
    assert res.n_active >= 1
    assert all(len(k["multi_index"]) <= 3 for k in res.params["kernels"])
    pred = fam.predict(res, X[:5])
    assert pred.shape == (5,) and np.all(np.isfinite(pred))


def polynomial_data(r, n_train=500, n_test=1000, seed=0):
    """x ~ U[-1,1]^r; y = sum of 10 random monomials of degree <= 3 in the first 5 variables (thesis 6.1.3)."""
    rng = np.random.default_rng(seed)
    monomials = [tuple(rng.integers(0, 5, size=int(rng.integers(1, 4)))) for _ in range(10)]
    X = rng.uniform(-1, 1, (n_train + n_test, r))
    y = sum(np.prod(X[:, list(m)], axis=1) for m in monomials)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def uniform_polynomial_mse(fam, Xtr, ytr, Xte, yte, lam):
    c, b = kernel_ridge(fam.uniform_gram(), ytr, lam)
    return float(np.mean((fam.uniform_cross(Xte) @ c + b - yte) ** 2))


@pytest.mark.slow
def test_sgd_polynomial_beats_uniform():
    """Thesis 6.1.3 with r = 50 (train 500 / test 1000, noise-free). At r <= 10 UNIFORM interpolates
    exactly (286 monomials < 500 points), so the comparison is only meaningful for larger r."""
    Xtr, ytr, Xte, yte = polynomial_data(50)
    fam = PolynomialFamily(Xtr, D=3)
    best_uniform = min(uniform_polynomial_mse(fam, Xtr, ytr, Xte, yte, lam) for lam in (1e-3, 1e-1, 1e1))
    res = sgd.fit(fam, ytr, lam=0.1, T=800, seed=0)
    mse = float(np.mean((fam.predict(res, Xte) - yte) ** 2))
    assert mse < best_uniform, (mse, best_uniform)


def test_sgd_gaussian_family_runs():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (40, 2))
    y = np.sin(2 * X[:, 0])
    res = sgd.fit(GaussianFamily(X, (1e-2, 1e2)), y, lam=0.1, T=20, seed=0)
    assert res.objective < 0.5 * float((y - y.mean()) @ (y - y.mean())) / 0.1
    assert all(1e-2 <= k["widths"][0] <= 1e2 for k in res.params["kernels"])


def gp_data_1d(width=0.3, n=60, n_test=300, noise=0.1, seed=0):
    """x ~ U[-1, 1]; f ~ GP(0, exp(-(x - x')^2 / width^2)) (the family's width convention); y = f + noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n + n_test)
    K = np.exp(-(x[:, None] - x[None, :]) ** 2 / width ** 2)
    f = np.linalg.cholesky(K + 1e-8 * np.eye(x.size)) @ rng.standard_normal(x.size)
    y = f + noise * rng.standard_normal(x.size)
    return x[:n], y[:n], x[n:], f[n:]


def test_sgd_gaussian_1d_reaches_best_grid_width():
    """SGD-1s over continuous widths (Algorithm 4, 1-D) on data drawn from a GP with width 0.3.

    Reference: the best SINGLE width on a fine grid (401 log-spaced widths in [1e-2, 1e2], theta = 1,
    a feasible point of Delta_2): J_grid = min_sigma J(e_sigma) (measured: width 0.166, J = 4.54).
    Stated tolerances (lam = 0.1, seed 0): J(theta_bar) <= 1.05 J_grid at T = 300 (measured 0.45 J_grid:
    Delta_2 over a continuum holds sums of many nearby widths, i.e. a larger kernel, so SGD goes below
    every single width), and J at T = 300 below J at T = 100 (measured 1.29 J_grid). Test MSE against
    the noise-free f: at most 3x that of the best grid width (measured 0.0107 vs 0.0050) and at most
    1/10 of that of badly chosen widths 0.01 and 3 (measured 0.20 and 0.22).
    """
    from mklscale.solvers._final_fit import one_stage_objective

    xtr, ytr, xte, fte = gp_data_1d()
    lam = 0.1
    fam = GaussianFamily(xtr, (1e-2, 1e2))
    t = ytr - ytr.mean()
    grid = np.geomspace(1e-2, 1e2, 401)
    J_grid = [one_stage_objective(fam.block((w,)), t, lam) for w in grid]
    best = grid[int(np.argmin(J_grid))]

    def width_mse(w):
        c, b = kernel_ridge(fam.block((w,)), ytr, lam)
        return float(np.mean((fam.cross(xte, [(w,)])[0] @ c + b - fte) ** 2))

    short = sgd.fit(fam, ytr, lam=lam, T=100, seed=0)
    res = sgd.fit(fam, ytr, lam=lam, T=300, seed=0)
    assert res.objective <= 1.05 * min(J_grid), (res.objective, min(J_grid))
    assert res.objective < short.objective
    # the averaged kernel is what the model uses: alpha* of sum_i w_i K_i
    K = sum(w * fam.block(k) for w, k in zip(res.weights, fam.keys_of(res)))
    assert one_stage_objective(K, t, lam) == pytest.approx(res.objective, rel=1e-9)
    mse = float(np.mean((fam.predict(res, xte) - fte) ** 2))
    assert mse <= 3.0 * width_mse(best), (mse, width_mse(best))
    assert mse <= 0.1 * min(width_mse(0.01), width_mse(3.0)), mse
    widths = np.array([k["widths"][0] for k in res.params["kernels"]])
    assert np.all((widths >= 1e-2) & (widths <= 1e2))


def test_sgd_gaussian_per_feature_ignores_irrelevant_features():
    """Per-feature widths (Algorithm 4, coordinate by coordinate): y = sin(3 x_0) + noise, features 1, 2
    irrelevant (x ~ U[-1, 1]^3, n = 50, lam = 0.1, T = 60, seed 0, widths in [1e-2, 1e2]).

    Stated tolerance: the weight-averaged log-width (weights of the learned combination) of each
    irrelevant feature is at least 10x that of feature 0 (measured: 0.55 vs 43 and 17), i.e. their
    factors exp(-(x_i - x'_i)^2 / sigma_i^2) are nearly constant, and the training fit explains
    >= 90% of the variance.
    """
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (50, 3))
    y = np.sin(3 * X[:, 0]) + 0.05 * rng.standard_normal(50)
    fam = GaussianFamily(X, (1e-2, 1e2), per_feature=True)
    res = sgd.fit(fam, y, lam=0.1, T=60, seed=0)
    W = np.array([k["widths"] for k in res.params["kernels"]])
    assert W.shape[1] == 3
    w = res.weights / res.weights.sum()
    geo = np.exp(w @ np.log(W))
    assert geo[1] >= 10 * geo[0] and geo[2] >= 10 * geo[0], geo
    resid = fam.predict(res, X) - y
    assert np.mean(resid ** 2) <= 0.1 * np.var(y)


def test_bad_input(tmp_path):
    grams, _, y = small_grams(n=20)
    eng = engine_of(grams, tmp_path)
    with pytest.raises(InvalidInputError, match="nu"):
        sgd.fit(eng, y, nu=0.5)
    with pytest.raises(InvalidInputError, match="T"):
        sgd.fit(eng, y, T=0)
    with pytest.raises(InvalidInputError, match="average_from"):
        sgd.fit(eng, y, T=10, average_from=1.0)
    with pytest.raises(InvalidInputError, match="D"):
        PolynomialFamily(np.ones((5, 2)), D=0)
    with pytest.raises(InvalidInputError, match="r >= 1|r = 0"):
        PolynomialFamily(np.ones((5, 0)), D=2)
    bad = y.copy()
    bad[1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        sgd.fit(eng, bad)


@pytest.mark.parametrize("nu", [2, 1.5])
@pytest.mark.parametrize("value", [2.0, 0.1])
def test_sgd_constant_target_is_the_intercept_only_model(tmp_path, nu, value):
    """Issue 16, defect 5: a constant y made every q_i = 0 and the sampling distribution a scalar
    (TypeError for y = 2.0), or, when y - mean(y) was rounding noise (y = 0.1), SGD fitted the noise
    (weights up to 0.16). The optimum of the stated problem is then theta = 0 (J = 0 on all of
    Delta_nu). Stated: weights exactly 0, bias = the constant, f = b, converged, objective and gap 0."""
    grams, _, _ = small_grams(n=30, seed=0)
    y = np.full(30, value)
    res = sgd.fit(engine_of(grams, tmp_path), y, lam=0.1, nu=nu, T=50, seed=0)
    assert np.array_equal(res.weights, np.zeros(len(grams))) and res.active.size == 0
    assert res.bias == value and res.converged
    assert res.objective == 0.0 and res.gap == 0.0
    np.testing.assert_array_equal(res.decision_function_from_kernels(grams[res.active, :5, :]), np.full(5, value))


def test_sgd_constant_kernels_stop_at_theta_zero(tmp_path):
    """Defect 5, constant kernels with a centred target: q_i = c (1^T t)^2 / lam^2 = 0 up to rounding, J is
    constant on Delta_nu (nu = 2 gave a LinAlgError). Stated: weights 0, J = J(0) = t^T t / (2 lam),
    converged, relative gap of theta = 0 at most ZERO_GRADIENT_RTOL."""
    n = 30
    _, _, y = small_grams(n=n, seed=0)
    const = np.stack([np.full((n, n), 2.0), np.ones((n, n))])
    for nu in (2, 1.5):
        res = sgd.fit(engine_of(const, tmp_path, f"c{nu}"), y, lam=0.1, nu=nu, T=50, seed=0)
        t = y - y.mean()
        assert np.array_equal(res.weights, np.zeros(2)) and res.converged
        assert res.objective == pytest.approx(0.5 * float(t @ t) / 0.1, rel=1e-12)
        assert 0.0 <= res.gap <= sgd.ZERO_GRADIENT_RTOL


def test_sgd_regressor_constant_target(tmp_path):
    """Defect 5 through MKLRegressor(solver="sgd"): a constant target gives the intercept-only model."""
    from mklscale import MKLRegressor

    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 3))
    est = MKLRegressor(kernels={"family": "gaussian", "widths": [1, 2], "features": "all"}, solver="sgd",
                       cache_dir=tmp_path).fit(X, np.full(30, 2.0))
    assert np.array_equal(est.result_.weights, np.zeros_like(est.result_.weights)) and est.result_.converged
    np.testing.assert_array_equal(est.predict(rng.standard_normal((4, 3))), np.full(4, 2.0))


def _projection_by_scipy(v, nu):
    """Independent projection onto {theta >= 0, ||theta||_nu <= 1}: the KKT system theta_i + mu
    theta_i^(nu-1) = v_i, sum theta_i^nu = 1 solved with scipy's brentq (xtol 1e-300, rtol 4 eps) for each
    theta_i(mu) inside an outer brentq on mu (no Newton steps, no shared code)."""
    import scipy.optimize

    v = np.maximum(v, 0.0)
    if np.sum(v ** nu) <= 1.0:
        return v

    tight = {"xtol": 1e-300, "rtol": 4 * np.finfo(float).eps, "maxiter": 2000}

    def theta(mu):
        return np.array([0.0 if vi == 0 else scipy.optimize.brentq(lambda x: x + mu * x ** (nu - 1) - vi, 0.0, vi,
                                                                    **tight) for vi in v])

    hi = 1.0
    while np.sum(theta(hi) ** nu) > 1.0:
        hi *= 2.0
    mu = scipy.optimize.brentq(lambda m: np.sum(theta(m) ** nu) - 1.0, 0.0, hi, **tight)
    return theta(mu)


def test_projection_general_nu_matches_an_independent_solver():
    """Issue 16, defect 6: nu outside {1, 2, inf} used a nested bisection (80 x 80 sweeps, 14-18 ms per
    call for 8 kernels). The projection is now one safeguarded Newton root in mu with monotone Newton for
    each theta_i(mu). Stated: on 60 random inputs (3-12 kernels, scales 1e-2..1e2, some zeros, nu in
    {1.01, 1.25, 1.5, 3, 7.5, 40}) it agrees with scipy's nested brentq to 1e-12 (absolute, theta <= 1),
    lies on the sphere (sum theta^nu = 1 to 1e-13) and needs at most 20 evaluations of theta(mu) and 40
    Newton steps per kernel and evaluation (measured at most 13 and ~8; the bisection did 80+ x 80)."""
    rng = np.random.default_rng(7)
    for i in range(60):
        nu = (1.01, 1.25, 1.5, 3.0, 7.5, 40.0)[i % 6]
        m = int(rng.integers(3, 13))
        v = rng.uniform(0, 1, m) * 10 ** rng.uniform(-2, 2)
        if i % 4 == 0:
            v[rng.random(m) < 0.3] = 0.0
        v[0] = max(v[0], 1.5)                               # outside the ball: the root is needed
        info = {}
        p = sgd.project_nonneg_nu_ball(v, nu, info=info)
        ref = _projection_by_scipy(v, nu)
        np.testing.assert_allclose(p, ref, rtol=0, atol=1e-12, err_msg=f"nu={nu}, v={v!r}")
        assert np.sum(p ** nu) == pytest.approx(1.0, abs=1e-13)
        assert np.all(p >= 0) and np.all(p[v == 0] == 0)
        assert 1 <= info["evaluations"] <= 20, info
        assert info["newton_steps"] <= 40 * m * info["evaluations"], info
