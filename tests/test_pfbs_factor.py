"""PFBS, its paths and cross-validation on factor banks (issue 17), and HeldKernels' factor storage.

PFBS on InMemoryFactorEngine(L) reaches the optimum of the same problem on InMemoryEngine(L L^T)
and the cvxpy oracle of tests/test_pfbs.py; its step's Lipschitz constant comes from F^T F.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from test_pfbs import oracle

from mklscale.engine import InMemoryEngine
from mklscale.engine.memory import InMemoryFactorEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers import paths, pfbs
from mklscale.solvers.pfbs import _lambda_max_of_factor
from mklscale.engine.representation import pivoted_cholesky
from mklscale.solvers.toolkit.lowrank import woodbury_solve
from mklscale.solvers.toolkit.working_set import HeldKernels


def factor_problem(n=50, M=6, r=5, seed=0):
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(M, n, r)) / np.sqrt(n * r)
    y = 3.0 * L[0] @ rng.normal(size=r) + 2.0 * L[1] @ rng.normal(size=r) + 0.05 * rng.normal(size=n)
    return L, np.einsum("mir,mjr->mij", L, L), y


@pytest.fixture(scope="module")
def problem():
    return factor_problem()


@pytest.mark.parametrize("fraction, mu, accelerated", [(0.3, 0.0, False), (0.1, 1e-2, True), (0.05, 1e-3, True)])
def test_factor_engine_matches_dense_and_cvxpy(problem, fraction, mu, accelerated):
    L, K, y = problem
    tau = fraction * pfbs.tau_max(InMemoryEngine(K), y)
    ours = pfbs.fit(InMemoryFactorEngine(L), y, tau, mu, tol=1e-9, accelerated=accelerated)
    dense = pfbs.fit(InMemoryEngine(K), y, tau, mu, tol=1e-9, accelerated=accelerated)
    optimum, _ = oracle(K, y, tau, mu)
    assert ours.converged and dense.converged
    assert ours.objective == pytest.approx(dense.objective, rel=1e-8)
    assert ours.objective == pytest.approx(optimum, rel=1e-6)
    np.testing.assert_allclose(ours.weights, dense.weights, rtol=1e-5, atol=1e-8)
    assert (ours.objective - optimum) / ours.objective <= ours.gap + 1e-8


def test_lipschitz_constant_from_the_factors(problem):
    L, K, _ = problem
    exact = np.linalg.eigvalsh(K.sum(0))[-1]
    F = np.concatenate(list(L), axis=1)
    assert _lambda_max_of_factor(F) == pytest.approx(exact, rel=1e-10)
    assert _lambda_max_of_factor(F) >= exact
    monkey = pfbs.FACTOR_EIG_MAX_R
    try:
        pfbs.FACTOR_EIG_MAX_R = 1                          # Lanczos on F (F^T v)
        assert _lambda_max_of_factor(F) == pytest.approx(exact, rel=1e-7)
    finally:
        pfbs.FACTOR_EIG_MAX_R = monkey


def test_path_and_cross_validation_on_factors(problem):
    L, K, y = problem
    a = paths.path(InMemoryFactorEngine(L), y, n_taus=6, mu=1e-3, tol=1e-8)
    b = paths.path(InMemoryEngine(K), y, n_taus=6, mu=1e-3, tol=1e-8)
    np.testing.assert_allclose(a.taus, b.taus, rtol=1e-12)
    np.testing.assert_allclose(a.weights, b.weights, rtol=1e-5, atol=1e-8)
    ca = paths.cross_validate(InMemoryFactorEngine(L), y, n_taus=5, mus=(1e-3,), folds=3, seed=0)
    cb = paths.cross_validate(InMemoryEngine(K), y, n_taus=5, mus=(1e-3,), folds=3, seed=0)
    np.testing.assert_allclose(ca.errors, cb.errors, rtol=1e-6)
    assert ca.best_tau == pytest.approx(cb.best_tau, rel=1e-12)
    assert {0, 1} <= set(ca.result.active.tolist())


def test_large_factor_bank_without_n_by_n_memory():
    n, r = 20_000, 10
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, 3))
    L = np.stack([np.cos(s * X @ rng.normal(size=(3, r)) + rng.uniform(0, 2 * np.pi, size=r))
                  for s in (0.3, 1.0, 3.0, 0.5, 2.0)]) * np.sqrt(2.0 / r)
    y = X[:, 0]
    engine = InMemoryFactorEngine(L)
    tracemalloc.start()
    start = time.perf_counter()
    res = pfbs.fit(engine, y, 0.1 * pfbs.tau_max(engine, y), 1e-3, accelerated=True, tol=1e-6)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert res.converged and peak < 0.05 * n * n * 8 and seconds < 60.0


# ---- HeldKernels on factors, and the low-rank toolkit ----------------------------------------

def test_held_factor_products_and_memory(problem):
    L, K, _ = problem
    L32 = L.astype(np.float32)
    engine = InMemoryFactorEngine(L32)
    held = HeldKernels(engine)
    held.fetch([4, 1], "remedy")
    held.fetch([2], "remedy")
    assert held.index.tolist() == [4, 1, 2] and held.stack().shape == (3, 50, 5)
    assert held.kernel_nbytes == 50 * 5 * 8        # a factor kernel costs n r itemsize (engine float64)
    K32 = np.einsum("mir,mjr->mij", L32.astype(np.float64), L32.astype(np.float64))[[4, 1, 2]]
    rng = np.random.default_rng(0)
    u, A = rng.normal(size=50), rng.normal(size=(3, 50))
    np.testing.assert_allclose(held.matvecs(u), K32 @ u, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(held.matvecs(u, first=1), (K32 @ u)[1:], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(held.each_matvec(A), np.einsum("mij,mj->mi", K32, A), rtol=1e-12, atol=1e-14)
    F = held.factors(np.array([0, 2]), np.array([2.0, 0.5]))
    np.testing.assert_allclose(F @ F.T, 2.0 * K32[0] + 0.5 * K32[2], rtol=1e-12, atol=1e-14)
    assert held.factors(max_columns=14) is None and held.factors(max_columns=15).shape == (50, 15)
    held.keep(np.array([True, False, True]))
    np.testing.assert_allclose(held.matvecs(u), K32[[0, 2]] @ u, rtol=1e-12, atol=1e-14)
    with pytest.raises(InvalidInputError, match="non-negative"):
        held.factors(weights=np.array([1.0, -1.0]))


def test_dense_held_kernels_factor_by_pivoted_cholesky(problem):
    _, K, _ = problem
    held = HeldKernels(InMemoryEngine(K))
    held.fetch([0, 3], "remedy")
    F = held.factors()
    assert F.shape == (50, 10)
    np.testing.assert_allclose(F @ F.T, K[0] + K[3], atol=1e-9 * np.abs(K[0]).max())
    assert held.factors(max_columns=9) is None
    full = np.eye(6) + 0.1
    assert pivoted_cholesky(full, 1e-10, 3) is None
    Lf = pivoted_cholesky(full, 1e-10, 6)
    np.testing.assert_allclose(Lf @ Lf.T, full, atol=1e-12)


def test_woodbury_solve_is_the_inverse():
    rng = np.random.default_rng(2)
    D, F = rng.uniform(1e-3, 2.0, size=30), rng.normal(size=(30, 7))
    b = rng.normal(size=(30, 2))
    H = np.diag(D) + F @ F.T
    np.testing.assert_allclose(woodbury_solve(D, F, b), np.linalg.solve(H, b), rtol=1e-8)
    np.testing.assert_allclose(woodbury_solve(D, F[:, :0], b[:, 0]), b[:, 0] / D, rtol=1e-14)
