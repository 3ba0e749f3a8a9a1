"""PFBS (mklscale.solvers.pfbs / paths) against a cvxpy oracle and its own certificates.

The oracle writes problem (1) in the coordinates beta_j = L_j^T alpha_j with K_j = L_j L_j^T
(L_j = V_j sqrt(Lambda_j) from the eigendecomposition, exact for PSD kernels, no ridge needed):
(1/n)||sum_j L_j beta_j - y||^2 + mu sum_j ||beta_j||^2 + 2 tau sum_j ||beta_j||, since
f_j(X) = K_j alpha_j = L_j beta_j and ||f_j||_H = ||beta_j||.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from _dense_engine import DenseEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers import pfbs
from mklscale.engine import RowSubsetEngine
from mklscale.solvers import paths
from mklscale.solvers.paths import path, tau_grid
from mklscale.solvers.result import MKLResult


# ---- problems ---------------------------------------------------------------------------------

def gaussian_grams(X, feature_sets, widths):
    grams = []
    for feats, width in zip(feature_sets, widths):
        Z = X[:, list(feats)]
        d2 = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)
        K = np.exp(-d2 / (2.0 * width**2))
        grams.append(K / np.trace(K))           # unit trace, as banks are normalised by default
    return np.array(grams)


def small_problem(n=40, M=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 5))
    feats = [tuple(rng.choice(5, size=2, replace=False)) for _ in range(M)]
    grams = gaussian_grams(X, feats, [0.5 + 0.5 * m for m in range(M)])
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    return grams, y


def signal_problem(n=90, M=8, seed=1, classification=False):
    """Kernel j is a Gaussian on feature j alone; y depends on features 0 and 1 only."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, M))
    grams = gaussian_grams(X, [(j,) for j in range(M)], [1.0] * M)
    f = np.sin(2.0 * X[:, 0]) + np.sin(1.5 * X[:, 1])
    if classification:
        return grams, np.where(f >= 0.0, 1.0, -1.0)
    return grams, f + 0.1 * rng.standard_normal(n)


def oracle(grams, y, tau, mu):
    """(optimal value, ||f_j|| per kernel) from cvxpy / Clarabel."""
    n = y.size
    Ls = []
    for K in grams:
        w, V = np.linalg.eigh(K)
        Ls.append(V * np.sqrt(np.maximum(w, 0.0)))
    betas = [cp.Variable(n) for _ in grams]
    F = sum(L @ b for L, b in zip(Ls, betas))
    objective = (cp.sum_squares(F - y) / n + mu * sum(cp.sum_squares(b) for b in betas)
                 + 2.0 * tau * sum(cp.norm(b, 2) for b in betas))
    problem = cp.Problem(cp.Minimize(objective))
    problem.solve(solver="CLARABEL")
    assert problem.status == "optimal"
    return float(problem.value), np.array([np.linalg.norm(b.value) for b in betas])


@pytest.fixture(scope="module")
def problem():
    grams, y = small_problem()
    return grams, y, pfbs.tau_max(DenseEngine(grams), y)


# ---- the oracle -------------------------------------------------------------------------------

CASES = [(0.3, 1e-3), (0.05, 1e-2), (0.1, 0.0), (0.01, 1e-3), (0.6, 0.1)]


@pytest.mark.parametrize("tau_fraction, mu", CASES)
def test_objective_matches_cvxpy(problem, tau_fraction, mu):
    grams, y, tmax = problem
    tau = tau_fraction * tmax
    value, norms = oracle(grams, y, tau, mu)
    for accelerated in (False, True):
        result = pfbs.fit(DenseEngine(grams), y, tau, mu, tol=1e-8, max_iter=100000, accelerated=accelerated)
        assert result.converged and result.gap <= 1e-8
        assert abs(result.objective - value) <= 1e-5 * value, (accelerated, result.objective, value)
        # support: kernels the oracle keeps clearly away from zero are active, and vice versa
        assert set(np.flatnonzero(norms > 1e-3 * norms.max())) <= set(result.active.tolist())
        assert set(result.active.tolist()) <= set(np.flatnonzero(norms > 1e-6 * norms.max()))


def test_decision_function_and_alphas_proportional_to_residual(problem):
    # near the optimum the iterate's distance is O(sqrt(gap)) (strong convexity 2 mu), so a tight
    # gap is needed to compare functions to 1e-6
    grams, y, tmax = problem
    tau, mu = 0.05 * tmax, 1e-2
    result, coef = pfbs.fit(DenseEngine(grams), y, tau, mu, tol=1e-13, max_iter=100000,
                            accelerated=True, return_coefficients=True)
    assert result.converged
    f_alpha = sum(grams[k] @ a for k, a in zip(coef.kernels, coef.alphas))
    f_model = sum(result.weights[m] * grams[m] @ result.dual_coef for m in result.active) + result.bias
    scale = np.abs(f_alpha).max()
    np.testing.assert_allclose(f_model, f_alpha, rtol=0, atol=1e-6 * scale)
    # KKT: alpha_j* = theta* / (mu + tau/||f_j||) with theta* = (y - F)/n = dual_coef
    np.testing.assert_allclose(result.dual_coef, (y - f_alpha) / y.size, rtol=0, atol=1e-12 * np.abs(y).max())
    for k, a in zip(coef.kernels, coef.alphas):
        norm = np.sqrt(a @ grams[k] @ a)
        if norm > 0:
            expected = norm / (mu * norm + tau)
            assert result.weights[k] == pytest.approx(expected, rel=1e-5)
            np.testing.assert_allclose(a, expected * result.dual_coef, rtol=0, atol=1e-5 * np.abs(a).max())
        else:
            assert result.weights[k] == 0.0


def test_history_records_certificate_and_passes(problem):
    grams, y, tmax = problem
    engine = DenseEngine(grams)
    result = pfbs.fit(engine, y, 0.2 * tmax, 1e-3, tol=1e-7)
    keys = {"primal", "dual", "gap", "n_active", "passes", "bytes_read", "seconds"}
    assert all(keys <= set(entry) for entry in result.history)
    final = result.history[-1]
    assert final["scope"] == "all" and final["gap"] <= 1e-7
    assert final["passes"] == engine.stats["passes"] >= 1
    assert all(e["primal"] >= e["dual"] - 1e-12 * abs(e["primal"]) for e in result.history)
    assert MKLResult.from_dict(result.to_dict()).objective == result.objective


# ---- tau_max, step size, dual ----------------------------------------------------------------

def test_tau_max_gives_exact_zero(problem):
    grams, y, tmax = problem
    assert tmax == pytest.approx(max(np.sqrt(y @ K @ y) for K in grams) / y.size, rel=1e-12)
    for mu in (0.0, 1e-2):
        at = pfbs.fit(DenseEngine(grams), y, tmax, mu, tol=1e-9)
        assert np.all(at.weights == 0.0) and at.active.size == 0 and at.converged
        assert at.objective == pytest.approx(y @ y / y.size) and at.gap <= 1e-12
        below = pfbs.fit(DenseEngine(grams), y, 0.999 * tmax, mu, tol=1e-9, max_iter=100000)
        top = int(np.argmax([y @ K @ y for K in grams]))
        assert below.active.tolist() == [top]


def test_step_is_the_lipschitz_constant_and_paper_rule_can_diverge():
    # L of the smooth part in the H metric = (2/n) lambda_max(sum_j K_j) + 2 mu: check it on the
    # explicit Hessian in beta coordinates, and that the solver's step is 1/L.
    grams, y = small_problem(n=20, M=30, seed=3)
    grams = 0.9 * grams[:1] + 0.1 * grams           # 30 nearly identical kernels
    n, mu = y.size, 1e-3
    B = np.hstack([np.linalg.eigh(K)[1] * np.sqrt(np.maximum(np.linalg.eigh(K)[0], 0)) for K in grams])
    L = np.linalg.eigvalsh((2.0 / n) * B.T @ B + 2.0 * mu * np.eye(B.shape[1]))[-1]
    engine = DenseEngine(grams)
    result = pfbs.fit(engine, y, 0.0, mu, tol=1e-8, working_set="all", accelerated=True, max_iter=100000)
    sigma = result.history[0]["sigma"]
    assert sigma == pytest.approx(L / 2.0, rel=1e-6) and result.converged
    paper_sigma = 0.5 * engine.lambda_max.max() + mu
    assert paper_sigma < L / 4.0                    # below the divergence threshold of FB
    # the printed rule, unguarded, diverges (tau = 0 makes the step linear) ...
    ws = pfbs._WorkingSet(engine)
    ws.add(np.arange(grams.shape[0]))
    x, Kx = ws.alphas, ws.K_alphas
    for _ in range(200):
        x, Kx, _, _ = pfbs._forward_backward(ws, x, Kx, y, 0.0, mu, paper_sigma)
    assert np.abs(Kx.sum(axis=0)).max() > 1e6 * np.abs(y).max()
    # ... and step="paper" is guarded to the Lipschitz value
    guarded = pfbs.fit(DenseEngine(grams), y, 0.0, mu, tol=1e-8, working_set="all", step="paper",
                       accelerated=True, max_iter=100000)
    assert guarded.converged and guarded.objective == pytest.approx(result.objective, rel=1e-7)
    # one kernel: the paper's sigma is valid (lambda/2 >= lambda/n), just n/2 times too cautious
    single = DenseEngine(grams[:1])
    r1 = pfbs.fit(single, y, 0.0, mu, tol=1e-3, working_set="all", step="paper", max_iter=50)
    assert r1.history[0]["sigma"] == pytest.approx(0.5 * single.lambda_max[0] + mu)


@pytest.mark.parametrize("mu", [0.0, 1e-2])
def test_dual_scaling_is_the_exact_maximiser(mu):
    rng = np.random.default_rng(5)
    n = 30
    y = rng.standard_normal(n)
    residual = -y + 0.3 * rng.standard_normal(n)
    kkt = np.abs(rng.standard_normal(12)) * 0.05
    tau = 0.03
    value, s = pfbs.dual_value(residual, y, kkt, tau, mu)

    def D(s):
        theta = -s * residual / n
        if mu == 0.0:
            return -np.inf if np.any(s * kkt > tau * (1 + 1e-12)) else 2 * theta @ y - n * theta @ theta
        return 2 * theta @ y - n * theta @ theta - np.sum(np.maximum(s * kkt - tau, 0.0) ** 2) / mu

    grid = np.linspace(0.0, 3.0 * max(s, 1.0), 30001)
    best = max(D(t) for t in grid)
    assert value == pytest.approx(D(s), rel=1e-12, abs=1e-15)
    assert value >= best - 1e-12 * abs(best)


# ---- working set and certification ------------------------------------------------------------

def test_working_set_matches_full_solve_and_readds_violators():
    grams, y = signal_problem(n=60, M=8)
    tmax = pfbs.tau_max(DenseEngine(grams), y)
    tau, mu = 0.1 * tmax, 1e-3
    full_engine = DenseEngine(grams)
    full = pfbs.fit(full_engine, y, tau, mu, tol=1e-9, working_set="all", accelerated=True, max_iter=100000)
    assert full_engine.stats["passes"] == 0
    assert {0, 1} <= set(full.active.tolist())
    auto = pfbs.fit(DenseEngine(grams), y, tau, mu, tol=1e-9, accelerated=True, max_iter=100000)
    assert auto.objective == pytest.approx(full.objective, rel=1e-8)
    np.testing.assert_allclose(auto.weights, full.weights, rtol=1e-4, atol=1e-6 * full.weights.max())
    # start without kernel 0, which the solution needs: certification must bring it back
    start = [m for m in range(8) if m != 0]
    engine = DenseEngine(grams)
    missing = pfbs.fit(engine, y, tau, mu, tol=1e-9, working_set=start, accelerated=True, max_iter=100000)
    certs = [e for e in missing.history if e["scope"] == "all"]
    assert certs[0]["violators"] >= 1 and certs[0]["full_pass"]
    assert 0 in missing.active and missing.converged
    assert missing.objective == pytest.approx(full.objective, rel=1e-8)


def test_one_matvec_per_working_kernel_per_iteration(problem, monkeypatch):
    grams, y, tmax = problem
    calls = []
    original = pfbs._WorkingSet.matvecs

    def counting(self, u):
        calls.append(self.size)
        return original(self, u)

    monkeypatch.setattr(pfbs._WorkingSet, "matvecs", counting)
    for accelerated in (False, True):
        calls.clear()
        result = pfbs.fit(DenseEngine(grams), y, 0.1 * tmax, 1e-3, tol=1e-8, working_set="all",
                          accelerated=accelerated, max_iter=100000)
        iterations = result.params["iterations"]
        certifications = sum(e["scope"] == "all" for e in result.history)
        # one stacked matvec (one per held kernel) per iteration, one per certification and one
        # for the returned model
        assert len(calls) == iterations + certifications + 1
        assert set(calls) == {grams.shape[0]}


def test_fista_needs_fewer_iterations(problem):
    grams, y, tmax = problem
    plain = pfbs.fit(DenseEngine(grams), y, 0.1 * tmax, 0.0, tol=1e-7, max_iter=100000, accelerated=False)
    fista = pfbs.fit(DenseEngine(grams), y, 0.1 * tmax, 0.0, tol=1e-7, max_iter=100000)      # the default
    assert fista.params["iterations"] < plain.params["iterations"] / 3
    assert fista.objective == pytest.approx(plain.objective, rel=1e-6)
    assert fista.solver == "pfbs/fista" and plain.solver == "pfbs"


# ---- path -------------------------------------------------------------------------------------

def test_path_continuous_and_warm_start_saves_iterations(problem):
    grams, y, tmax = problem
    warm = path(DenseEngine(grams), y, n_taus=12, mu=1e-3, eps=1e-2, tol=1e-9)
    cold = path(DenseEngine(grams), y, n_taus=12, mu=1e-3, eps=1e-2, tol=1e-9, warm_start=False)
    assert warm.tau_max == pytest.approx(tmax) and warm.taus[0] == pytest.approx(tmax)
    assert np.all(warm.converged) and np.all(cold.converged)
    assert np.all(warm.weights[0] == 0.0)
    np.testing.assert_allclose(warm.objectives, cold.objectives, rtol=1e-6)
    assert np.all(np.diff(warm.objectives) < 0)        # P*(tau) increases with tau
    assert warm.total_iterations < cold.total_iterations
    # continuity: halving the log-spacing of the grid roughly halves the largest weight jump
    fine = path(DenseEngine(grams), y, taus=tau_grid(tmax, 23, 1e-2), mu=1e-3, tol=1e-9)
    coarse_jump = np.abs(np.diff(warm.weights, axis=0)).max()
    fine_jump = np.abs(np.diff(fine.weights, axis=0)).max()
    assert fine_jump < 0.7 * coarse_jump
    np.testing.assert_allclose(fine.weights[::2], warm.weights, rtol=1e-3, atol=1e-4 * warm.weights.max())


def test_plot_path(problem, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    grams, y, _ = problem
    p = path(DenseEngine(grams), y, n_taus=6, mu=1e-3, eps=1e-2, accelerated=True)
    ax = paths.plot_path(p)
    assert ax.get_xscale() == "log" and len(ax.lines) == int((p.weights > 0).any(axis=0).sum())
    ax.figure.savefig(tmp_path / "path.png")
    assert (tmp_path / "path.png").stat().st_size > 1000


# ---- cross-validation and the subset engine ---------------------------------------------------

def test_subset_engine_is_the_principal_submatrix():
    grams, y = small_problem(n=30, M=4)
    rows = np.array([0, 3, 4, 7, 9, 10, 15, 16, 20, 21, 22, 28])
    sub, dense = RowSubsetEngine(DenseEngine(grams), rows), DenseEngine(grams[:, rows][:, :, rows])
    u = np.random.default_rng(0).standard_normal(rows.size)
    np.testing.assert_allclose(sub.quad_forms(u), dense.quad_forms(u), rtol=1e-12)
    np.testing.assert_allclose(sub.quad_forms(np.stack([u, 2 * u])), dense.quad_forms(np.stack([u, 2 * u])), rtol=1e-12)
    np.testing.assert_allclose(sub.quad_forms(np.stack([u, u]), kernels=[1, 3], per_kernel=True),
                               dense.quad_forms(np.stack([u, u]), kernels=[1, 3], per_kernel=True), rtol=1e-12)
    np.testing.assert_allclose(sub.matvecs(u, kernels=[2, 0]), dense.matvecs(u, kernels=[2, 0]), rtol=1e-12)
    np.testing.assert_array_equal(sub.blocks([3, 1]), dense.blocks([3, 1]))
    assert np.all(sub.lambda_max >= dense.lambda_max - 1e-12)   # interlacing
    a = pfbs.fit(sub, y[rows], 0.01, 1e-2, tol=1e-9, accelerated=True)
    b = pfbs.fit(dense, y[rows], 0.01, 1e-2, tol=1e-9, accelerated=True)
    assert a.objective == pytest.approx(b.objective, rel=1e-9)


def test_cross_validation_finds_the_signal_kernels():
    grams, y = signal_problem(n=90, M=8)
    cv = paths.cross_validate(DenseEngine(grams), y, n_taus=10, eps=1e-3, mus=(1e-5, 1e-4), folds=3,
                             center=True, seed=0)
    assert cv.errors.shape == (2, 10) and cv.metric == "rmse"
    best = (list(cv.mus).index(cv.best_mu), list(cv.taus).index(cv.best_tau))
    assert cv.errors[best] == cv.errors.min()
    assert cv.taus[-1] < cv.best_tau < cv.taus[0]            # an interior tau: neither null nor dense
    assert cv.errors[best] < 0.3 * cv.errors[:, 0].min()       # far better than the zero model
    weights = cv.result.weights
    assert {0, 1} <= set(cv.result.active.tolist())
    assert min(weights[0], weights[1]) > 10.0 * np.delete(weights, [0, 1]).max()
    assert cv.result.params["tau"] == cv.best_tau and cv.result.params["mu"] == cv.best_mu
    assert cv.result.converged


def test_cross_validation_classification():
    grams, y = signal_problem(n=80, M=6, classification=True, seed=2)
    cv = paths.cross_validate(DenseEngine(grams), y, n_taus=6, eps=1e-2, mus=(1e-4,), folds=4,
                             task="classification", center=True)
    assert cv.metric == "accuracy" and cv.errors.max() == cv.errors[0, list(cv.taus).index(cv.best_tau)]
    assert cv.errors.max() >= 0.8
    for k in range(4):   # stratified folds keep both classes on each side
        assert set(np.unique(y[cv.fold_of_row == k])) == {-1.0, 1.0}


# ---- the real engine ------------------------------------------------------------------------

def test_real_engine_gives_the_same_solution(problem, tmp_path):
    engine_module = pytest.importorskip("mklscale.engine")
    from mklscale.bank import KernelBank

    grams, y, tmax = problem
    bank = KernelBank.from_arrays(grams, tmp_path / "bank", dtype="float64")
    with engine_module.Engine(bank) as engine:
        real = pfbs.fit(engine, y, 0.1 * tmax, 1e-3, tol=1e-9, accelerated=True)
        real_path = path(engine, y, n_taus=5, mu=1e-3, eps=1e-2, accelerated=True, tol=1e-8)
        assert engine.stats["passes"] >= real.history[-1]["passes"] >= 1
    dense = pfbs.fit(DenseEngine(grams), y, 0.1 * tmax, 1e-3, tol=1e-9, accelerated=True)
    dense_path = path(DenseEngine(grams), y, n_taus=5, mu=1e-3, eps=1e-2, accelerated=True, tol=1e-8)
    assert real.objective == pytest.approx(dense.objective, rel=1e-10)
    np.testing.assert_allclose(real.weights, dense.weights, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(real_path.objectives, dense_path.objectives, rtol=1e-10)
    np.testing.assert_array_equal(real_path.passes, dense_path.passes)


# ---- bad input ----------------------------------------------------------------------------------

def test_bad_input_raises_clear_errors(problem):
    grams, y, tmax = problem
    engine = DenseEngine(grams)
    with pytest.raises(InvalidInputError, match="tau must be finite and >= 0"):
        pfbs.fit(engine, y, -0.1, 1e-3)
    with pytest.raises(InvalidInputError, match="mu must be finite and >= 0"):
        pfbs.fit(engine, y, 0.1, -1e-3)
    with pytest.raises(InvalidInputError, match="give tau > 0 or mu > 0"):
        pfbs.fit(engine, y, 0.0, 0.0)
    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        pfbs.fit(engine, bad, 0.1, 1e-3)
    with pytest.raises(InvalidInputError, match="training points"):
        pfbs.fit(engine, y[:-1], 0.1, 1e-3)
    with pytest.raises(InvalidInputError, match="strictly decreasing"):
        path(engine, y, taus=[0.01, 0.02, 0.005], mu=1e-3)
    with pytest.raises(InvalidInputError, match=">= 0"):
        path(engine, y, taus=[0.02, -0.01], mu=1e-3)
    with pytest.raises(InvalidInputError, match="folds"):
        paths.cross_validate(engine, y, folds=y.size + 1)
    with pytest.raises(InvalidInputError, match="folds"):
        paths.cross_validate(engine, y, folds=1)
    with pytest.raises(InvalidInputError, match=r"\{-1, \+1\}"):
        paths.cross_validate(engine, y, task="classification")
    with pytest.raises(InvalidInputError, match="step"):
        pfbs.fit(engine, y, 0.1, 1e-3, step="huge")
    with pytest.raises(InvalidInputError, match="init"):
        pfbs.fit(engine, y, 0.1, 1e-3, init=np.zeros(3))


def test_working_set_that_cannot_fit_in_memory_is_refused_with_the_remedy():
    grams, y = small_problem(n=20, M=30, seed=3)
    # 10 TB a kernel: more than any machine running this has available
    engine = type("HugeKernelsEngine", (DenseEngine,), {"block_nbytes": 10**13})(grams)
    with pytest.raises(InvalidInputError, match=r"larger tau.*SpicyMKL"):
        pfbs.fit(engine, y, 0.1 * pfbs.tau_max(engine, y), 1e-3, tol=1e-6)


def test_working_set_holds_the_storage_dtype_without_copies(tmp_path):
    """A float32 bank's kernels are held as float32 (half of float64) and products still match
    float64 ones to float64 rounding."""
    from mklscale.bank import KernelBank
    from mklscale.engine import Engine

    grams, y = small_problem(n=30, M=12, seed=5)
    engine = Engine(KernelBank.from_arrays(grams, tmp_path / "b", dtype="float32"))
    ws = pfbs._WorkingSet(engine)
    ws.add([3, 1])
    ws.add([7])
    assert [c.dtype for c in ws.held.chunks] == [np.float32] * 2 and ws.held.nbytes == 3 * 30 * 30 * 4
    K = grams.astype(np.float32).astype(np.float64)[[3, 1, 7]]
    u = np.random.default_rng(0).normal(size=30)
    np.testing.assert_allclose(ws.matvecs(u), K @ u, rtol=1e-13, atol=1e-13)
    ws.alphas = np.random.default_rng(1).normal(size=(3, 30))
    ws.refresh()
    np.testing.assert_allclose(ws.K_alphas, np.einsum("kij,kj->ki", K, ws.alphas), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mu", (0.0, 1e-3))
def test_pfbs_and_spicy_solve_the_same_problem(mu):
    """PFBS's problem (1) is SpicyMKL's (42) with the square loss and the elastic-net penalty,
    C = n (tau + mu), lam = mu / (tau + mu), no bias, objective scaled by 2/n (pfbs.plugins)."""
    from mklscale.solvers import spicy

    grams, y = small_problem(n=30, M=8, seed=2)
    n = y.size
    tau = 0.2 * pfbs.tau_max(DenseEngine(grams), y)
    ours = pfbs.fit(DenseEngine(grams), y, tau, mu, tol=1e-8, center=False, accelerated=True)
    _, penalty, C = pfbs.plugins(n, tau, mu)
    other = spicy.fit(DenseEngine(grams), y, C, loss="square", penalty="elastic_net", lam=penalty.lam, bias=False,
                      tol=1e-10)
    assert ours.converged and other.converged
    assert ours.objective == pytest.approx(2.0 / n * other.objective, rel=1e-6)
    np.testing.assert_array_equal(ours.active, other.active)
    alphas = lambda r: r.weights[:, None] * r.dual_coef[None, :]  # noqa: E731
    F = lambda r: np.einsum("mij,mj->i", grams, alphas(r))  # noqa: E731
    # F is unique (strictly convex loss); a relative gap g leaves ||F - F*||^2 <= n g P: ~1e-4 here
    np.testing.assert_allclose(F(ours), F(other), atol=2e-4)
