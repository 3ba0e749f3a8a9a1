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
    """Averaged iterate within 5% of J* at T = 4000 (O(1/sqrt(T)) theory); last iterate within 1%."""
    grams, _, y = small_grams(n=25, seed=0)
    lam = 0.1
    eng = engine_of(grams, tmp_path)
    res = sgd.fit(eng, y, lam=lam, nu=2, T=4000, refresh=50, seed=3)
    J_star, _ = one_stage_optimum(grams, y - y.mean(), lam, nu=2)
    assert J_star <= res.objective <= 1.05 * J_star
    assert J_star <= res.params["objective_last"] <= 1.01 * J_star
    assert np.linalg.norm(res.weights) <= 1 + 1e-12 and np.all(res.weights >= 0)
    # passes: one per refresh; blocks: one per iteration
    assert res.history[-1]["passes"] == 4000 // 50
    assert res.params["blocks_read"] == 4000
    # the returned model is alpha*(theta_bar)
    K = np.einsum("m,mij->ij", res.weights, grams)
    np.testing.assert_allclose((K + lam * np.eye(len(y))) @ res.dual_coef, y - res.bias, atol=1e-7)
    again = sgd.fit(eng, y, lam=lam, T=200, seed=3)
    assert np.array_equal(again.weights, sgd.fit(eng, y, lam=lam, T=200, seed=3).weights)


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


def test_bad_input(tmp_path):
    grams, _, y = small_grams(n=20)
    eng = engine_of(grams, tmp_path)
    with pytest.raises(InvalidInputError, match="nu"):
        sgd.fit(eng, y, nu=0.5)
    with pytest.raises(InvalidInputError, match="T"):
        sgd.fit(eng, y, T=0)
    with pytest.raises(InvalidInputError, match="D"):
        PolynomialFamily(np.ones((5, 2)), D=0)
    with pytest.raises(InvalidInputError, match="r >= 1|r = 0"):
        PolynomialFamily(np.ones((5, 0)), D=2)
    bad = y.copy()
    bad[1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        sgd.fit(eng, bad)
