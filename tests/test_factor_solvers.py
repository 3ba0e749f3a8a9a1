"""Issue 17: the baselines, FHeuristic, EasyMKL, Citi, SGD-1s and GCD (one- and two-stage) on factor
engines (InMemoryFactorEngine, K~_m = L_m L_m^T) solve the same problem as on the dense engine of the
K~_m, through the exact dense code below the dense cap of ``lowrank`` and through the factor code
above it (forced here by setting the cap to 0); the LowRank operations against their dense formulas;
liblinear's SVM on features against libsvm's exact SVM; a large-n smoke test without n x n memory."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from _banks import subset_gaussian_bank
from test_baselines import cvxpy_alignment, one_stage_optimum
from test_citi import elasticnet_oracle

from mklscale.engine.memory import InMemoryEngine, InMemoryFactorEngine
from mklscale.solvers import _final_fit, _svm, baselines, citi, easymkl, fheuristic, gcd, sgd
from mklscale.solvers.toolkit import lowrank
from mklscale.solvers.toolkit.lowrank import LowRank


@pytest.fixture(autouse=True)
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def low_rank_bank(n=50, M=6, r=5, seed=3):
    """(L (M, n, r), grams K~ = L L^T, y labels, y real): the top-r eigen-factors of Gaussian kernels."""
    grams, y = subset_gaussian_bank(n, M, seed)
    L = []
    for K in grams:
        w, V = np.linalg.eigh(K)
        L.append(V[:, -r:] * np.sqrt(np.maximum(w[-r:], 0.0)))
    L = np.stack(L)
    y_reg = 0.5 * y + 0.3 * np.random.default_rng(seed).standard_normal(n)
    return L, np.einsum("mir,mjr->mij", L, L), y, y_reg


@pytest.fixture(scope="module")
def bank():
    return low_rank_bank()


@pytest.fixture(params=["dense-code", "factor-code"])
def path(request, monkeypatch):
    """Which code a factor engine runs: the dense code (below the cap) or the factor code (cap 0)."""
    if request.param == "factor-code":
        monkeypatch.setattr(lowrank, "DENSE_BYTES_CAP", 0)
    return request.param


def svm_primal(grams, res, y, C):
    """(1/2) c^T K c + C sum hinge(y, K c + b) of a final SVM on K = sum_m w_m K_m."""
    K = np.einsum("m,mij->ij", res.weights, grams)
    return 0.5 * res.dual_coef @ K @ res.dual_coef + C * _svm.hinge_sum(y, K @ res.dual_coef + res.bias)


# ---- LowRank ------------------------------------------------------------------------------------------
def test_lowrank_operations_equal_their_dense_formulas():
    rng = np.random.default_rng(0)
    n, R, lam = 40, 7, 0.3
    F, G = rng.standard_normal((n, R)), rng.standard_normal((n, 4))
    K, v, y = F @ F.T, rng.standard_normal(n), rng.standard_normal(n)
    op = LowRank(F)
    np.testing.assert_allclose(op.matvec(v), K @ v, rtol=1e-12)
    assert op.quad(v) == pytest.approx(v @ K @ v, rel=1e-12)
    np.testing.assert_allclose(op.diagonal(), np.diag(K), rtol=1e-12)
    assert op.trace() == pytest.approx(np.trace(K), rel=1e-12)
    assert op.frobenius_norm() == pytest.approx(np.linalg.norm(K), rel=1e-12)
    np.testing.assert_allclose(op.centred().dense(), _final_fit.centre(K), atol=1e-10)
    np.testing.assert_allclose(op.ridge_solve(v, lam), np.linalg.solve(K + lam * np.eye(n), v), rtol=1e-9)
    c, b = op.kernel_ridge(y, lam)
    c0, b0 = _final_fit.kernel_ridge(K, y, lam)
    np.testing.assert_allclose(c, c0, atol=1e-9)
    assert b == pytest.approx(b0, abs=1e-9)
    assert op.centred_alignment(y) == pytest.approx(_final_fit.centred_alignment(K, y), rel=1e-10)
    assert lowrank.frob_inner(F, G) == pytest.approx(np.sum(K * (G @ G.T)), rel=1e-10)
    eta, J = lowrank.segment_search(F, G, y, lam)
    eta0, J0 = _final_fit.exact_segment_search(K, G @ G.T, y, lam)
    assert eta == pytest.approx(eta0, abs=1e-9) and J == pytest.approx(J0, rel=1e-10)
    assert 0.0 < eta < 1.0       # an interior minimiser: the bisection, not an endpoint, was tested
    assert LowRank(np.zeros((n, 0))).ridge_solve(v, lam) == pytest.approx(v / lam)


def test_combined_kernel_is_dense_below_the_cap_and_a_factor_above(bank, monkeypatch):
    L, grams, _, _ = bank
    w = np.array([0.5, 0.0, 1.0, 0.2, 0.0, 0.3])
    expected = np.einsum("m,mij->ij", w, grams)
    assert isinstance(_final_fit.combined_kernel(InMemoryEngine(grams), w), np.ndarray)
    below = _final_fit.combined_kernel(InMemoryFactorEngine(L), w)
    assert isinstance(below, np.ndarray)
    np.testing.assert_allclose(below, expected, atol=1e-12)
    monkeypatch.setattr(lowrank, "DENSE_BYTES_CAP", 8 * 49 * 49)
    assert lowrank.dense_ok(49) and not lowrank.dense_ok(50)
    above = _final_fit.combined_kernel(InMemoryFactorEngine(L), w)
    assert isinstance(above, LowRank) and above.rank == 4 * L.shape[2]     # only the w_m > 0 kernels
    np.testing.assert_allclose(above.dense(), expected, atol=1e-12)


# ---- the final fit: liblinear on features against libsvm ------------------------------------------
def rff_problem(n, M=4, r=8, seed=0):
    """(F, y): random Fourier factors of M Gaussian kernels (summed rank R = M r), labels from X."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = np.where(X[:, 0] * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    Ls = [np.sqrt(2.0 / r) * np.cos(X @ (rng.normal(size=(5, r)) / (0.5 + m)) + rng.uniform(0, 2 * np.pi, r))
          for m in range(M)]
    return np.stack(Ls), y


@pytest.mark.parametrize("C", [1.0, 10.0, 100.0])
def test_liblinear_on_features_is_within_the_stated_bound_of_libsvm(C):
    """_svm.fit_linear_svc's docstring: P(liblinear, bias refitted) / P(libsvm) - 1 <= 1e-4 at n = 2000
    (measured 2e-6), the returned model f = K v + b with F^T v = w, and alpha dual feasible with a dual
    value below P* (so a certificate built on it is valid)."""
    L, y = rff_problem(2000)
    F = np.concatenate(list(L / 2.0), axis=1)
    K = F @ F.T
    _, v0, b0, _ = _svm.fit_svc(K, y, C, 1e-6)
    alpha, v, b, _ = _svm.fit_linear_svc(F, y, C, 1e-6)

    def P(c, bias):
        return 0.5 * c @ K @ c + C * _svm.hinge_sum(y, K @ c + bias)

    exact, approx = P(v0, b0), P(v, b)
    assert exact * (1 - 1e-6) <= approx <= exact * (1 + 1e-4)       # libsvm itself stops at tol 1e-6
    assert np.all((alpha >= 0) & (alpha <= C)) and abs(alpha @ y) <= 1e-9 * C * y.size
    dual = alpha.sum() - 0.5 * (alpha * y) @ K @ (alpha * y)
    assert dual <= exact * (1 + 1e-9) and dual >= exact * (1 - 1e-3)


# ---- the solvers: factor engine = dense engine of the K~_m ----------------------------------------
@pytest.mark.parametrize("solver", [baselines.uniform, baselines.alignment, fheuristic.fit])
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_baselines_and_fheuristic(bank, path, solver, task):
    L, grams, y_cls, y_reg = bank
    y = y_cls if task == "classification" else y_reg
    dense = solver(InMemoryEngine(grams), y, task=task, lam=0.1, C=10.0)
    fact = solver(InMemoryFactorEngine(L), y, task=task, lam=0.1, C=10.0)
    np.testing.assert_allclose(fact.weights, dense.weights, atol=1e-12)
    assert fact.objective == pytest.approx(dense.objective, rel=1e-10)      # the centred alignment
    if task == "regression":
        np.testing.assert_allclose(fact.dual_coef, dense.dual_coef, atol=1e-8)
        assert fact.bias == pytest.approx(dense.bias, abs=1e-8)
    else:    # libsvm (tol 1e-3) or liblinear: the same SVM problem to the solvers' tolerance
        assert svm_primal(grams, fact, y, 10.0) == pytest.approx(svm_primal(grams, dense, y, 10.0), rel=2e-3)


def test_alignment_on_factors_matches_cvxpy(bank, path):
    L, grams, _, y = bank
    res = baselines.alignment(InMemoryFactorEngine(L), y, lam=0.1)
    th, align = cvxpy_alignment(grams, y)
    assert res.params["alignment"] == pytest.approx(align, abs=1e-6)
    np.testing.assert_allclose(res.weights, th / th.sum(), atol=1e-4)


def test_full_rank_factors_equal_the_dense_bank(path):
    """L_m = the full eigen-factor of K_m (r = n): the factor engine is the dense bank itself."""
    grams, y = subset_gaussian_bank(30, 4, seed=5)
    L = []
    for K in grams:
        w, V = np.linalg.eigh(K)
        L.append(V * np.sqrt(np.maximum(w, 0.0)))
    fact, dense = InMemoryFactorEngine(np.stack(L)), InMemoryEngine(grams)
    y_reg = y + 0.2 * np.random.default_rng(0).standard_normal(y.size)
    a = gcd.fit_one_stage(fact, y_reg, lam=0.1, variant="away", tol=1e-8, max_iter=200)
    b = gcd.fit_one_stage(dense, y_reg, lam=0.1, variant="away", tol=1e-8, max_iter=200)
    np.testing.assert_allclose(a.weights, b.weights, atol=1e-7)
    assert a.objective == pytest.approx(b.objective, rel=1e-9)
    a = baselines.alignment(fact, y_reg, task="regression", lam=0.1)
    b = baselines.alignment(dense, y_reg, task="regression", lam=0.1)
    np.testing.assert_allclose(a.weights, b.weights, atol=1e-9)
    np.testing.assert_allclose(a.dual_coef, b.dual_coef, atol=1e-7)
    a, b = citi.fit(fact, y, 10.0, 0.5), citi.fit(dense, y, 10.0, 0.5)
    assert a.converged and b.converged
    assert a.objective == pytest.approx(b.objective, rel=1e-3)


@pytest.mark.parametrize("learner", ["komd", "svm"])
@pytest.mark.parametrize("lam", [0.05, 0.5, 1.0])
def test_easymkl(bank, path, learner, lam):
    """Factor code: both margin QPs through the R-variable dual; objective within 1e-8, weights 1e-5."""
    L, grams, y, _ = bank
    dense = easymkl.fit(InMemoryEngine(grams), y, lam=lam, learner=learner)
    fact = easymkl.fit(InMemoryFactorEngine(L), y, lam=lam, learner=learner)
    assert fact.objective == pytest.approx(dense.objective, rel=1e-8)
    np.testing.assert_allclose(fact.weights, dense.weights, rtol=1e-5, atol=1e-8)
    assert fact.gap <= 1e-3      # the Frank-Wolfe bound is loose (measured up to 1.5e-4 at objective error 1e-12)
    if learner == "komd":
        # libsvm stops at its tolerance: the R-variable dual may land lower (measured 2e-7 relative)
        assert fact.params["komd_objective"] == pytest.approx(dense.params["komd_objective"], rel=1e-6)
        K = np.einsum("m,mij->ij", fact.weights, grams)
        f_fact = K @ fact.dual_coef + fact.bias
        f_dense = np.einsum("m,mij->ij", dense.weights, grams) @ dense.dual_coef + dense.bias
        np.testing.assert_allclose(f_fact, f_dense, atol=1e-4 * np.abs(f_dense).max())
    else:
        assert svm_primal(grams, fact, y, 1.0) == pytest.approx(svm_primal(grams, dense, y, 1.0), rel=2e-3)


@pytest.mark.parametrize("eta", [0.1, 0.5, 1.0])
def test_citi_reaches_the_oracle_and_its_gap_bounds_the_truth(bank, path, eta):
    L, grams, y, _ = bank
    C, tol = 10.0, 1e-4
    res = citi.fit(InMemoryFactorEngine(L), y, C, eta, tol=tol, max_iter=60)
    dense = citi.fit(InMemoryEngine(grams), y, C, eta, tol=tol, max_iter=60)
    opt = elasticnet_oracle(grams, y, C, eta)
    f = np.einsum("m,mij,j->i", res.weights, grams, res.dual_coef) + res.bias
    u = np.einsum("i,mij,j->m", res.dual_coef, grams, res.dual_coef)
    primal = citi.primal_objective(res.weights, u, y, C, f)
    assert primal == pytest.approx(res.objective, rel=1e-9)
    assert res.params["lower"] <= opt * (1 + 1e-7)                       # a true lower bound
    assert (primal - opt) / primal <= res.gap + 1e-9                     # the gap bounds the truth
    if path == "dense-code":
        assert res.converged and res.gap < tol
        assert res.objective == pytest.approx(dense.objective, rel=2 * tol)
        np.testing.assert_allclose(res.weights, dense.weights, atol=5e-3 * dense.weights.max())
    else:
        # liblinear's regularised bias (b^2 / (2 s^2), _svm.fit_linear_svc) against P ~ 180 at n = 50:
        # measured P 6e-5 above P* (s = 10 kept), converged at gap 7.7e-5 (eta = 0.1)
        assert res.gap < 1e-3
        assert res.objective == pytest.approx(opt, rel=5e-4)
        np.testing.assert_allclose(res.weights, dense.weights, atol=2e-2 * dense.weights.max())


@pytest.mark.parametrize("nu", [2, 1, 1.5])
def test_sgd(bank, path, nu):
    L, grams, _, y = bank
    dense = sgd.fit(InMemoryEngine(grams), y, lam=0.1, nu=nu, T=200, seed=1)
    fact = sgd.fit(InMemoryFactorEngine(L), y, lam=0.1, nu=nu, T=200, seed=1)
    np.testing.assert_allclose(fact.weights, dense.weights, atol=1e-10)     # the same draws
    assert fact.objective == pytest.approx(dense.objective, rel=1e-10)
    np.testing.assert_allclose(fact.dual_coef, dense.dual_coef, atol=1e-8)
    assert fact.params["objective_last"] == pytest.approx(dense.params["objective_last"], rel=1e-10)


def _stopped_then_resumed(fit, ck, stop_at: int):
    """fit(ck) interrupted right after the checkpoint step of iteration ``stop_at``, then fit(ck) again
    (resuming from the checkpoint); returns the resumed result."""

    class Stop(Exception):
        pass

    real_step = ck.step

    def step(it, get_state):
        real_step(it, get_state)
        if it == stop_at:
            raise Stop
    ck.step = step
    with pytest.raises(Stop):
        fit(ck)
    ck.step = real_step
    return fit(ck)


def test_sgd_checkpoint_resume_on_factors(bank, path, tmp_path):
    from mklscale.runtime.checkpoint import Checkpoint

    L, _, _, y = bank

    def fit(checkpoint=None):
        return sgd.fit(InMemoryFactorEngine(L), y, lam=0.1, T=60, seed=2, checkpoint=checkpoint)

    full = fit()
    resumed = _stopped_then_resumed(fit, Checkpoint(tmp_path / "ck.npz", {"case": "sgd"}, every_s=None, every_iter=1),
                                    stop_at=30)
    np.testing.assert_allclose(resumed.weights, full.weights, atol=1e-12)
    assert resumed.objective == pytest.approx(full.objective, rel=1e-12)


@pytest.mark.parametrize("variant", ["fw", "away"])
def test_gcd_one_stage_reaches_cvxpy_and_the_gap_bounds_it(bank, path, variant):
    L, grams, _, y = bank
    lam = 0.1
    dense = gcd.fit_one_stage(InMemoryEngine(grams), y, lam=lam, variant=variant, max_iter=300, tol=1e-6)
    fact = gcd.fit_one_stage(InMemoryFactorEngine(L), y, lam=lam, variant=variant, max_iter=300, tol=1e-6)
    np.testing.assert_allclose(fact.weights, dense.weights, atol=1e-8)
    assert fact.objective == pytest.approx(dense.objective, rel=1e-10)
    assert fact.converged == dense.converged
    J_star, _ = one_stage_optimum(grams, y - y.mean(), lam, nu=1)
    assert J_star * (1 - 1e-7) <= fact.objective <= J_star / (1 - fact.gap) + 1e-9     # gap bounds the truth


@pytest.mark.parametrize("criterion", ["alignment", "euclidean"])
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_gcd_two_stage(bank, path, criterion, task):
    L, grams, y_cls, y_reg = bank
    y = y_cls if task == "classification" else y_reg
    kw = dict(criterion=criterion, task=task, lam=0.1, C=10.0, max_iter=400)
    dense = gcd.fit_two_stage(InMemoryEngine(grams), y, **kw)
    fact = gcd.fit_two_stage(InMemoryFactorEngine(L), y, **kw)
    if criterion == "alignment":      # FSAM: a few greedy steps, the same to rounding
        assert fact.converged == dense.converged
        np.testing.assert_allclose(fact.weights, dense.weights, atol=1e-10)
        assert fact.objective == pytest.approx(dense.objective, rel=1e-10)    # the centred alignment
    else:    # Frank-Wolfe, sublinear: rounding moves the path, not the certified point
        _, align = cvxpy_alignment(grams, y)                                  # (2.12) up to scale
        for res in (fact, dense):
            assert res.objective == pytest.approx(align, rel=1e-3)     # not converged in 400 steps (gap 3e-5)
        np.testing.assert_allclose(fact.weights, dense.weights, atol=2e-3)
        assert fact.gap <= max(10 * dense.gap, 1e-5)


def test_gcd_two_stage_names_constant_kernels_on_factors(bank, monkeypatch):
    from mklscale.errors import InvalidInputError

    monkeypatch.setattr(lowrank, "DENSE_BYTES_CAP", 0)
    L, _, y, _ = bank
    const = np.zeros_like(L[:2])
    const[:, :, 0] = 3.0                                                   # K = 9 * 1 1^T: constant
    with pytest.raises(InvalidInputError, match=r"constant.*indices 0, 1"):
        gcd.fit_two_stage(InMemoryFactorEngine(const), y, criterion="alignment")


# ---- large n ------------------------------------------------------------------------------------------
def test_large_n_runs_in_seconds_without_n_by_n_memory():
    """n = 20,000, r = 8, M = 4 (an n x n float64 matrix: 3.2 GB): every solver runs on the factors with a
    traced peak below 100 MB, in seconds."""
    n = 20_000
    L, y = rff_problem(n)
    y_reg = y + 0.3 * np.random.default_rng(1).standard_normal(n)
    engine = InMemoryFactorEngine(L)
    runs = {
        "uniform/svm": lambda: baselines.uniform(engine, y, task="classification", C=1.0),
        "uniform/ridge": lambda: baselines.uniform(engine, y_reg, task="regression", lam=0.1),
        "alignment": lambda: baselines.alignment(engine, y, task="classification", C=1.0),
        "fheuristic": lambda: fheuristic.fit(engine, y_reg, task="regression", lam=0.1),
        "easymkl": lambda: easymkl.fit(engine, y, lam=0.1),
        "citi": lambda: citi.fit(engine, y, 1.0, 0.5, max_iter=3),
        "sgd": lambda: sgd.fit(engine, y_reg, lam=0.1, T=30),
        "gcd-1s": lambda: gcd.fit_one_stage(engine, y_reg, lam=0.1, max_iter=10),
        "gcd-2s/alignment": lambda: gcd.fit_two_stage(engine, y, criterion="alignment", C=1.0, max_iter=5),
        "gcd-2s/euclidean": lambda: gcd.fit_two_stage(engine, y_reg, criterion="euclidean", lam=0.1, max_iter=5),
    }
    tracemalloc.start()
    try:
        for name, run in runs.items():
            tracemalloc.reset_peak()
            start = time.perf_counter()
            res = run()
            seconds = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < 100e6, (name, peak)
            assert seconds < 30.0, (name, seconds)
            assert np.all(np.isfinite(res.dual_coef)) and res.dual_coef.shape == (n,), name
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("stage", ["one", "alignment", "euclidean"])
def test_gcd_checkpoint_resume_on_factors(bank, path, tmp_path, stage):
    """A GCD run stopped mid-way and resumed from its checkpoint on a factor engine ends where the run
    without a stop ends (the factor code stores the weights only and re-reads the factors)."""
    from mklscale.runtime.checkpoint import Checkpoint

    L, _, _, y = bank

    def fit(checkpoint=None):
        engine = InMemoryFactorEngine(L)
        if stage == "one":
            return gcd.fit_one_stage(engine, y, lam=0.1, max_iter=12, variant="away", checkpoint=checkpoint)
        return gcd.fit_two_stage(engine, y, criterion=stage, lam=0.1, max_iter=12, delta=0.0,
                                 checkpoint=checkpoint)

    full = fit()
    resumed = _stopped_then_resumed(fit, Checkpoint(tmp_path / "ck.npz", {"case": stage}, every_s=None, every_iter=1),
                                    stop_at=2)
    assert len(resumed.history) == len(full.history)
    np.testing.assert_allclose(resumed.weights, full.weights, atol=1e-12)
    assert resumed.objective == pytest.approx(full.objective, rel=1e-12)
