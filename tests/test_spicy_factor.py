"""SpicyMKL on factor banks (issue 17): K~_m = L_m L_m^T stored as L_m (InMemoryFactorEngine).

The proximal and one-step methods (on factors "auto" takes the primal block descent for the smooth
losses, ``method="bcd"``, tests/test_spicy_bcd.py). Every loss and penalty reaches the optimum of the
same problem on the dense engine of the K~_m
(InMemoryEngine(L L^T)) and the cvxpy oracle of tests/test_spicy.py; a full-rank factor (L from
eigh of K) gives the dense result; the reported gap bounds the true suboptimality; the Woodbury
back end of the Newton system agrees with the dense Cholesky; nothing n x n is allocated.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from test_spicy import EPS, LAM, LOSSES, PENALTIES, Q, cvxpy_optimum, gaussian_bank, targets

from mklscale.engine import InMemoryEngine, representation
from mklscale.engine.representation import DENSE, FACTOR
from mklscale.engine.memory import InMemoryFactorEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers import spicy
from mklscale.solvers._spicy_inner import InnerProblem, KernelTerm, solve_newton_system
from mklscale.solvers._spicy_loss_terms import make_loss_term
from mklscale.solvers.losses import make_loss
from mklscale.solvers.penalties import make_penalty
from mklscale.solvers.toolkit import lowrank
from mklscale.solvers.toolkit.lowrank import BlockWoodbury
from mklscale.solvers.toolkit.working_set import HeldKernels

TOL = 1e-8


def factor_bank(n=30, M=6, r=4, seed=0):
    """(L (M, n, r), K~ = L L^T, X): random factors of mixed scales, unit-trace kernels."""
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(M, n, r)) * rng.uniform(0.3, 3.0, size=(M, 1, r))
    L /= np.sqrt(np.einsum("mir,mir->m", L, L))[:, None, None]
    return L, np.einsum("mir,mjr->mij", L, L), rng.normal(size=(n, 3))


@pytest.fixture(scope="module")
def bank():
    return factor_bank()


def fit_both(L, K, y, **kwargs):
    """(factor, dense) results; the factor fit runs the method the dense fit chose (on factors "auto"
    takes method="bcd" for smooth losses, tested in tests/test_spicy_bcd.py)."""
    params = dict(lam=LAM, q=Q, eps=EPS, tol=TOL, max_outer=300) | kwargs
    dense = spicy.fit(InMemoryEngine(K), y, **params)
    return spicy.fit(InMemoryFactorEngine(L), y, **(params | {"method": dense.params["method"]})), dense


@pytest.mark.parametrize("penalty", PENALTIES)
@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_and_penalty_matches_dense_and_cvxpy(bank, loss, penalty):
    L, K, X = bank
    y = targets(X, loss, 1)
    ours, dense = fit_both(L, K, y, C=0.1, loss=loss, penalty=penalty)
    optimum = cvxpy_optimum(K, y, 0.1, loss, penalty)
    assert ours.converged and dense.converged
    assert ours.objective == pytest.approx(dense.objective, rel=1e-7)
    assert ours.objective == pytest.approx(optimum, rel=1e-6)
    np.testing.assert_allclose(ours.weights, dense.weights, atol=1e-4 * max(1.0, dense.weights.max()))
    # the reported gap bounds the true relative suboptimality (cvxpy solves to ~1e-11)
    assert (ours.objective - optimum) / abs(ours.objective) <= max(ours.gap, 0.0) + 1e-9


@pytest.mark.parametrize("loss", ("logistic", "square", "hinge"))
def test_without_bias_and_one_step_match_dense(bank, loss):
    L, K, X = bank
    y = targets(X, loss, 2)
    for kwargs in ({"bias": False, "penalty": "l1"}, {"penalty": "elastic_net", "method": "one_step"},
                   {"penalty": "elastic_net", "method": "proximal"}):
        ours, dense = fit_both(L, K, y, C=0.1, loss=loss, **kwargs)
        assert ours.converged and ours.objective == pytest.approx(dense.objective, rel=1e-7), kwargs
        assert ours.objective == pytest.approx(
            cvxpy_optimum(K, y, 0.1, loss, kwargs["penalty"], kwargs.get("bias", True)), rel=1e-6)


@pytest.mark.parametrize("loss", ("logistic", "hinge"))
def test_full_rank_factor_gives_the_dense_result(loss):
    grams, X = gaussian_bank(32, 6, seed=2)
    w, V = np.linalg.eigh(grams)
    L = V * np.sqrt(np.maximum(w, 0.0))[:, None, :]              # r = n: K = L L^T up to rounding
    y = targets(X, loss, 1)
    ours = spicy.fit(InMemoryFactorEngine(L), y, 0.05, loss=loss, tol=TOL, max_outer=300, method="proximal")
    dense = spicy.fit(InMemoryEngine(grams), y, 0.05, loss=loss, tol=TOL, max_outer=300)
    assert ours.converged and ours.objective == pytest.approx(dense.objective, rel=1e-7)
    np.testing.assert_allclose(ours.weights, dense.weights, atol=1e-5)
    np.testing.assert_array_equal(ours.active, dense.active)


@pytest.mark.parametrize("newton_solver", ("auto", "cg"))
def test_full_rank_factor_through_the_block_solves_gives_the_dense_result(newton_solver, monkeypatch):
    """As above with the n x n path closed (lowrank.DENSE_BYTES_CAP = 0): R > n columns go through
    BlockWoodbury ("auto") or CG on its capacitance ("cg"), and still give the dense result."""
    monkeypatch.setattr(lowrank, "DENSE_BYTES_CAP", 0)
    grams, X = gaussian_bank(32, 6, seed=2)
    w, V = np.linalg.eigh(grams)
    L = V * np.sqrt(np.maximum(w, 0.0))[:, None, :]
    y = targets(X, "logistic", 1)
    ours = spicy.fit(InMemoryFactorEngine(L), y, 0.05, tol=TOL, max_outer=300, newton_solver=newton_solver,
                     method="proximal")
    dense = spicy.fit(InMemoryEngine(grams), y, 0.05, tol=TOL, max_outer=300)
    assert ours.converged and ours.objective == pytest.approx(dense.objective, rel=1e-7)
    np.testing.assert_allclose(ours.weights, dense.weights, atol=1e-5)


def test_factor_working_sets_start_small():
    """Factor banks start W from WORKING_SET_START_COLUMNS / r kernels (issue 32), dense ones from the default."""
    assert DENSE.working_set_start(32, None) == 32
    assert FACTOR.working_set_start(32, 64) == representation.WORKING_SET_START_COLUMNS // 64
    assert FACTOR.working_set_start(32, 4) == 32 and FACTOR.working_set_start(32, 10_000) == 1


@pytest.mark.parametrize("loss", ("logistic", "square", "hinge"))
def test_small_first_working_set_matches_dense_and_cvxpy(loss, monkeypatch):
    """With the start lowered to one kernel, W grows from its violators (several rounds, several
    kernels active) to the optimum of the dense engine and of cvxpy, and the gap bounds the truth."""
    monkeypatch.setattr(representation, "WORKING_SET_START_COLUMNS", 4)
    L, K, X = factor_bank(n=40, M=10, r=4, seed=3)
    y = targets(X, loss, 1)
    ours, dense = fit_both(L, K, y, C=0.05, loss=loss, penalty="l1")
    optimum = cvxpy_optimum(K, y, 0.05, loss, "l1")
    assert ours.history[0]["working_set"] == 1 and ours.history[-1]["working_set"] > 1
    assert dense.history[0]["working_set"] > 1
    assert ours.converged and ours.active.size >= 2
    assert ours.objective == pytest.approx(dense.objective, rel=1e-7)
    assert ours.objective == pytest.approx(optimum, rel=1e-6)
    assert (ours.objective - optimum) / abs(ours.objective) <= max(ours.gap, 0.0) + 1e-9


def test_cut_short_gap_still_bounds_the_suboptimality(bank):
    """Stopped after a few outer iterations, the gap is large but still an upper bound."""
    L, K, X = bank
    y = targets(X, "logistic", 3)
    optimum = cvxpy_optimum(K, y, 0.1, "logistic", "l1")
    for max_outer in (1, 2, 4):
        res = spicy.fit(InMemoryFactorEngine(L), y, 0.1, loss="logistic", tol=1e-12, max_outer=max_outer,
                        method="proximal")
        assert (res.objective - optimum) / abs(res.objective) <= res.gap + 1e-12


# ---- the Newton system ----------------------------------------------------------------------

def _system(engine, seed, loss="logistic", bias_mode="al", tau=np.inf):
    """A Newton system of a random inner problem state on ``engine`` (all kernels held)."""
    rng = np.random.default_rng(seed)
    n, M = engine.n, engine.M
    y = np.where(rng.normal(size=n) > 0, 1.0, -1.0)
    kernels = KernelTerm(HeldKernels(engine), make_penalty("l1", LAM, Q), 0.01, "proximal")
    kernels.add(np.arange(M), 10.0, "remedy")
    kernels.gamma = rng.uniform(1.0, 100.0, size=M)
    rho = 0.5 * y * rng.uniform(0.1, 0.9, size=n) if loss == "logistic" else rng.normal(size=n)
    problem = InnerProblem(make_loss_term(make_loss(loss, EPS), y), kernels, bias_mode, 0.3, 2.0,
                           rho.copy(), tau)
    point = problem.evaluate(rho, kernels.matvec(rho))
    system = problem.hessian(point)
    assert system.on.size > 0
    return system, kernels, rng.normal(size=(n, 2))


@pytest.mark.parametrize("loss, bias_mode, tau", [("logistic", "al", np.inf), ("logistic", "equality", np.inf),
                                                  ("hinge", "none", 10.0), ("square", "al", 100.0)])
def test_woodbury_agrees_with_dense_cholesky(bank, loss, bias_mode, tau):
    L, K, _ = bank
    dense_sys, dense_k, rhs = _system(InMemoryEngine(K), 5, loss, bias_mode, tau)
    factor_sys, factor_k, _ = _system(InMemoryFactorEngine(L), 5, loss, bias_mode, tau)
    H = dense_sys.dense(dense_k)
    x_chol = solve_newton_system(dense_sys, dense_k, rhs, "cholesky")
    np.testing.assert_allclose(H @ x_chol, rhs, atol=1e-8 * np.abs(rhs).max() * np.abs(H).max())
    D, F = factor_sys.low_rank(factor_k)
    np.testing.assert_allclose(np.diag(D) + F @ F.T, H, atol=1e-12 * np.abs(H).max())
    for system, kernels, backend in ((factor_sys, factor_k, "auto"), (dense_sys, dense_k, "woodbury"),
                                     (dense_sys, dense_k, "cg")):
        x = solve_newton_system(system, kernels, rhs, backend)
        np.testing.assert_allclose(x, x_chol, rtol=1e-7, atol=1e-9 * np.abs(x_chol).max())


def test_block_woodbury_is_the_formed_woodbury():
    """BlockWoodbury (F = [L_j S_j] never formed; float32 blocks widened as they are scaled) solves
    (D + F F^T) x = b as the dense solve of the formed matrix does."""
    rng = np.random.default_rng(4)
    n = 50
    blocks = [rng.normal(size=(n, 5)).astype(np.float32), rng.normal(size=(n, 3)), np.ones((n, 1))]
    sigma, coef = [1.5, 0.7, 2.0], [-0.1, 0.3, 0.0]
    zs = [rng.normal(size=5), rng.normal(size=3), np.zeros(1)]
    D = rng.uniform(0.5, 2.0, size=n)
    F = np.concatenate([np.asarray(L, dtype=np.float64) @ (s * np.eye(L.shape[1]) + c * np.outer(z, z))
                        for L, s, c, z in zip(blocks, sigma, coef, zs)], axis=1)
    H = np.diag(D) + F @ F.T
    rhs = rng.normal(size=(n, 2))
    solver = BlockWoodbury(D, blocks, sigma, coef, zs)
    np.testing.assert_allclose(solver.solve(rhs), np.linalg.solve(H, rhs), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(solver.solve(rhs[:, 0]), np.linalg.solve(H, rhs[:, 0]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(BlockWoodbury(D, [], [], [], []).solve(rhs), rhs / D[:, None], rtol=1e-15)
    # block-Jacobi CG on the capacitance, never formed: the same solution to its tolerance
    lazy = BlockWoodbury(D, blocks, sigma, coef, zs, factorise=False)
    assert lazy.cho is None
    x = lazy.capacitance_cg(rhs, 1e-12, 200)
    np.testing.assert_allclose(x, np.linalg.solve(H, rhs), rtol=1e-9, atol=1e-11)
    assert lazy.cho is None
    assert lazy.capacitance_cg(rhs, 1e-14, 1) is None       # not there in one step
    np.testing.assert_allclose(lazy.factorise().solve(rhs), np.linalg.solve(H, rhs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss", LOSSES)
def test_capacitance_cg_newton_reaches_the_dense_and_cvxpy_optimum(bank, loss):
    """newton_solver="cg" on factors: inexact Newton steps by CG on the Woodbury capacitance reach the
    optimum of the dense engine and of cvxpy, and the gap bounds the truth."""
    L, K, X = bank
    y = targets(X, loss, 1)
    ours, dense = fit_both(L, K, y, C=0.1, loss=loss, penalty="l1", newton_solver="cg")
    optimum = cvxpy_optimum(K, y, 0.1, loss, "l1")
    assert ours.converged and ours.objective == pytest.approx(dense.objective, rel=1e-7)
    assert ours.objective == pytest.approx(optimum, rel=1e-6)
    assert (ours.objective - optimum) / abs(ours.objective) <= max(ours.gap, 0.0) + 1e-9


def test_capacitance_cg_is_only_asked_for(bank, monkeypatch):
    """On factors, "auto" and "woodbury" factorise the capacitance; "cg" runs CG on it, to the same solution."""
    L, _, _ = bank
    system, kernels, rhs = _system(InMemoryFactorEngine(L), 7)
    calls = []
    original = BlockWoodbury.capacitance_cg
    monkeypatch.setattr(BlockWoodbury, "capacitance_cg", lambda self, *a: calls.append(1) or original(self, *a))
    exact = solve_newton_system(system, kernels, rhs, "woodbury")
    np.testing.assert_array_equal(solve_newton_system(system, kernels, rhs, "auto"), exact)
    assert not calls
    x = solve_newton_system(system, kernels, rhs, "cg", forcing=1e-12)
    assert calls
    np.testing.assert_allclose(x, exact, rtol=1e-8, atol=1e-10 * np.abs(exact).max())


def test_newton_cg_is_inexact_newton_with_the_forcing_tolerance(bank, monkeypatch):
    """CG stops at the relative residual ``forcing`` (a loose one gives a close, not equal,
    direction that is still a descent direction); without convergence it falls back to Cholesky."""
    from mklscale.solvers import _spicy_inner

    _, K, _ = bank
    system, kernels, rhs = _system(InMemoryEngine(K), 7)
    H = system.dense(kernels)
    g = rhs[:, 0]
    for forcing in (1e-2, 1e-6, 1e-12):
        x = solve_newton_system(system, kernels, g, "cg", forcing)
        assert np.linalg.norm(H @ x - g) <= forcing * np.linalg.norm(g) * (1 + 1e-9)
        assert g @ x > 0.0                                  # -x is a descent direction for gradient g
    monkeypatch.setattr(_spicy_inner, "CG_MAX_SHARE", 0.0)   # 10 steps: not enough at 1e-14
    np.testing.assert_allclose(solve_newton_system(system, kernels, g, "cg", 1e-14),
                               solve_newton_system(system, kernels, g, "cholesky"), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("loss", ("logistic", "hinge", "square"))
def test_every_dense_back_end_reaches_the_same_optimum(loss):
    grams, X = gaussian_bank(32, 6, seed=2)
    y = targets(X, loss, 1)
    results = {b: spicy.fit(InMemoryEngine(grams), y, 0.05, loss=loss, tol=TOL, max_outer=300, newton_solver=b)
               for b in ("cholesky", "cg", "woodbury", "auto")}
    for backend, res in results.items():
        assert res.converged, backend
        assert res.objective == pytest.approx(results["cholesky"].objective, rel=1e-7), backend
        np.testing.assert_allclose(res.weights, results["cholesky"].weights, atol=1e-5)
    with pytest.raises(InvalidInputError, match="cholesky.*factor"):
        spicy.fit(InMemoryFactorEngine(np.linalg.eigh(grams)[1][:, :, :3]), y, 0.05, loss=loss,
                  newton_solver="cholesky")


def test_dense_kernels_of_low_rank_use_woodbury_from_the_threshold(monkeypatch):
    """On a dense engine with n >= LOW_RANK_MIN_N and low-rank kernels, "auto" takes Woodbury on
    pivoted Cholesky factors (never forms H) and reaches the Cholesky solution; full-rank kernels
    fall back to Cholesky."""
    from mklscale.solvers import _spicy_inner

    L, K, _ = factor_bank(n=40, M=3, r=3, seed=4)
    monkeypatch.setattr(_spicy_inner, "LOW_RANK_MIN_N", 40)
    system, kernels, rhs = _system(InMemoryEngine(K), 6)
    x_chol = solve_newton_system(system, kernels, rhs, "cholesky")
    monkeypatch.setattr(type(system), "dense", lambda *a: pytest.fail("formed the n x n Hessian"))
    x = solve_newton_system(system, kernels, rhs, "auto")
    np.testing.assert_allclose(x, x_chol, rtol=1e-7, atol=1e-9 * np.abs(x_chol).max())
    assert sum(F.shape[1] for F, _ in kernels.held._dense_factors.values()) == 9
    monkeypatch.undo()
    monkeypatch.setattr(_spicy_inner, "LOW_RANK_MIN_N", 40)
    full, _ = gaussian_bank(40, 3, seed=1)
    system, kernels, rhs = _system(InMemoryEngine(full), 6)
    assert system.low_rank(kernels, max_columns=20) is None


# ---- no n x n -------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ("auto", "proximal"))
@pytest.mark.parametrize("loss", ("logistic", "square"))
def test_large_factor_bank_fits_fast_in_little_memory(loss, method):
    """n = 20,000, r = 10, M = 5: an n x n float64 matrix would take 3.2 GB; the fit stays far below."""
    n, r = 20_000, 10
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    L = np.stack([np.cos(s * X @ rng.normal(size=(3, r)) + rng.uniform(0, 2 * np.pi, size=r))
                  for s in (0.3, 1.0, 3.0, 0.5, 2.0)]) * np.sqrt(2.0 / r)
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0) if loss == "logistic" else X[:, 0]
    engine = InMemoryFactorEngine(L)
    tracemalloc.start()
    start = time.perf_counter()
    res = spicy.fit(engine, y, 1.0, loss=loss, tol=1e-6, method=method)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert res.converged and res.gap <= 1e-6
    assert peak < 0.05 * n * n * 8, f"peak {peak / 1e6:.0f} MB"
    assert seconds < 60.0


def test_n_by_n_operations_are_refused_on_factors(bank):
    L, _, _ = bank
    held = HeldKernels(InMemoryFactorEngine(L), name="SpicyMKL")
    held.fetch([0, 1], "remedy")
    with pytest.raises(InvalidInputError, match="n x n matrix.*factors"):
        held.total()
    with pytest.raises(InvalidInputError, match="n x n matrix"):
        held.add_weighted(np.array([0]), np.array([1.0]), np.zeros((30, 30)))
