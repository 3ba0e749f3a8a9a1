"""SMO-MKL on factor engines (issue 17): kernels stored as L_m (n x r), K~_m = L_m L_m^T.

The solver must solve the same problem (P) as on the dense engine of the K~_m: the same optimum
(cvxpy oracle of test_smo on the K~_m), the same model within the solver tolerance, a reported gap
that bounds the true suboptimality, and (full rank) the dense results. The factor steps read rows of
L_m only (no n x n matrix is formed), and their kernel-column cache changes no bit of the result.
"""

from __future__ import annotations

import numpy as np
import pytest
from _banks import subset_gaussian_bank
from _dense_engine import DenseEngine
from test_smo import lanckriet_oracle

from mklscale.engine.memory import InMemoryFactorEngine
from mklscale.runtime.checkpoint import Checkpoint, Preempted, StopAt, stop_on_signals
from mklscale.solvers import _smo_kernels as kern
from mklscale.solvers import smo

C = 1.0


def eigen_factors(grams, rank=None):
    """L_m with L_m L_m^T = K_m (rank None: every eigenvalue > 1e-12 lambda_max, i.e. K~ = K) or the
    top ``rank`` eigenpairs (K~_m the best rank-r approximation); zero columns pad to a common r."""
    n = grams.shape[1]
    factors = []
    for K in grams:
        w, V = np.linalg.eigh(K)
        keep = w > 1e-12 * w[-1]
        if rank is not None:
            keep &= np.arange(n) >= n - rank
        factors.append(V[:, keep] * np.sqrt(w[keep]))
    r = max(F.shape[1] for F in factors)
    out = np.zeros((len(factors), n, r))
    for m, F in enumerate(factors):
        out[m, :, :F.shape[1]] = F
    return out


def grams_of(factors):
    return np.einsum("mir,mjr->mij", factors, factors)


class NoDenseFactorEngine(InMemoryFactorEngine):
    """A factor engine that refuses every call returning an n x n matrix."""

    def combine(self, weights):
        raise AssertionError("SMO-MKL formed sum_m w_m K_m (n x n) on a factor engine")

    def frobenius(self, T, kernels=None):
        raise AssertionError("SMO-MKL asked for an n x n product on a factor engine")


@pytest.fixture(scope="module")
def bank():
    return subset_gaussian_bank(60, 8, seed=1)


@pytest.fixture(scope="module")
def low_rank(bank):
    """(factors r = 12, K~, y, optimum of (P) on the K~)."""
    grams, y = bank
    factors = eigen_factors(grams, rank=12)
    tilde = grams_of(factors)
    return factors, tilde, y, lanckriet_oracle(tilde, y, C)


@pytest.fixture(scope="module")
def low_rank_fits(low_rank):
    factors, tilde, y, _ = low_rank
    return smo.fit(NoDenseFactorEngine(factors), y, C, tol=None), smo.fit(DenseEngine(tilde), y, C, tol=None)


# ------------------------------------------------------------------------------------- pieces

def test_factor_pieces_match_the_dense_entries(low_rank):
    """H_l from rows of L_l, the cached columns L_l L_l[i] and the exact cache z_l = K~_l D(y) alpha
    equal the dense values of K~_l = L_l L_l^T."""
    factors, tilde, y, _ = low_rank
    rng = np.random.default_rng(0)
    alpha = rng.random(y.size) * C
    p, n = factors.shape[:2]
    Zf, qf, Zd, qd = np.empty((p, n)), np.empty(p), np.empty((p, n)), np.empty(p)
    kern.refresh_cache(factors, True, y, alpha, Zf, qf)
    kern.refresh_cache(tilde, False, y, alpha, Zd, qd)
    np.testing.assert_allclose(Zf, Zd, rtol=1e-12, atol=1e-12 * np.abs(Zd).max())
    np.testing.assert_allclose(qf, qd, rtol=1e-12)
    P = np.empty((p, factors.shape[2]))
    kern._projections(factors, y, alpha, P)
    delta_f, curv_f, delta_d, curv_d = np.empty(p), np.empty(p), np.empty(p), np.empty(p)
    kern._pair_terms(factors, Zf, P, True, 3, 17, delta_f, curv_f)
    kern._pair_terms(tilde, Zd, P[:0], False, 3, 17, delta_d, curv_d)
    np.testing.assert_allclose(curv_f, curv_d, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(delta_f, delta_d, rtol=1e-10, atol=1e-12 * np.abs(Zd).max())
    cols, slot_of = np.empty((3, p, n)), np.full(n, -1, dtype=np.int64)
    owner, stamp = np.full(3, -1, dtype=np.int64), np.zeros(3, dtype=np.int64)
    have = np.zeros((3, p), dtype=np.bool_)
    live = np.ones(p)
    # two misses, two hits, one hit and one miss (the free slot), then a miss evicting the least recent (9)
    for clock, (i, j) in enumerate(((5, 9), (9, 5), (5, 40), (7, 5)), start=1):
        si, sj = kern._cached_columns(factors, i, j, live, cols, have, slot_of, owner, stamp, clock)
        assert si != sj and have[si].all() and have[sj].all()
        np.testing.assert_allclose(cols[si], tilde[:, :, i], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cols[sj], tilde[:, :, j], rtol=1e-12, atol=1e-14)
    assert slot_of[9] == -1 and min(slot_of[5], slot_of[40], slot_of[7]) >= 0
    live[::2] = 0.0   # only the kernels with eta_l != 0 get columns
    si, sj = kern._cached_columns(factors, 11, 12, live, cols, have, slot_of, owner, stamp, 9)
    np.testing.assert_array_equal(have[si], live != 0)
    np.testing.assert_allclose(cols[si, 1::2], tilde[1::2, :, 11], rtol=1e-12, atol=1e-14)


def test_one_and_two_column_misses_give_the_same_bits():
    """A column does not depend on whether the other column of the step was missing too."""
    rng = np.random.default_rng(1)
    for r in (13, 64):
        for dtype in (np.float64, np.float32):
            L = rng.standard_normal((200, r)).astype(dtype)
            x1, x2 = rng.standard_normal(r), rng.standard_normal(r)
            one, two = np.empty((2, 200)), np.empty((2, 200))
            kern._factor_column(L, x1, one[0])
            kern._factor_column(L, x2, one[1])
            kern._factor_columns2(L, x1, x2, two[0], two[1])
            np.testing.assert_array_equal(one, two)
            np.testing.assert_allclose(one, np.stack([L @ x1, L @ x2]), rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------------- solver

def test_full_rank_factors_give_the_dense_solution(bank):
    """L_m L_m^T = K_m (all eigenpairs): the factor run reaches the dense optimum and model."""
    grams, y = bank
    factors = eigen_factors(grams)
    tilde = grams_of(factors)
    dense = smo.fit(DenseEngine(grams), y, C, tol=None)
    res = smo.fit(NoDenseFactorEngine(factors), y, C, tol=None)
    oracle = lanckriet_oracle(tilde, y, C)
    assert res.converged and dense.converged
    assert res.objective == pytest.approx(dense.objective, rel=1e-4)
    assert res.objective == pytest.approx(oracle, rel=1e-4)
    np.testing.assert_allclose(res.weights, dense.weights, atol=2e-3)
    np.testing.assert_array_equal(res.active, dense.active)
    assert res.params["passes"] == 3   # start (ranking), early check, certificate


def test_low_rank_factors_match_the_dense_engine_of_their_kernels(low_rank, low_rank_fits):
    factors, tilde, y, oracle = low_rank
    res, dense = low_rank_fits
    assert res.converged and res.params["status"] == "converged"
    assert res.objective == pytest.approx(oracle, rel=1e-4)
    assert res.objective == pytest.approx(dense.objective, rel=1e-4)
    np.testing.assert_allclose(res.weights, dense.weights, atol=2e-3)
    np.testing.assert_array_equal(res.active, dense.active)
    assert np.sum(res.weights) == pytest.approx(1.0, abs=1e-9)
    alpha = res.dual_coef * y
    assert np.all((alpha >= 0) & (alpha <= C)) and abs(alpha @ y) < 1e-10
    # the returned model reproduces its objective on the K~: f = sum_j w_j K~_j c + b
    q = np.einsum("i,mij,j->m", res.dual_coef, tilde, res.dual_coef)
    f = np.einsum("m,mij,j->i", res.weights, tilde, res.dual_coef) + res.bias
    assert smo.primal_value(res.weights, q, np.ones(len(q)), y, C, f) == pytest.approx(res.objective, rel=1e-10)


def test_reported_gap_bounds_the_truth_on_factors(low_rank, low_rank_fits):
    """gap >= (P - P*) / P and D <= P* <= P, converged and cut short (max_steps)."""
    factors, tilde, y, oracle = low_rank
    short = smo.fit(NoDenseFactorEngine(factors), y, C, max_steps=300)
    assert not short.converged and short.params["status"] == "max_steps"
    for res in (low_rank_fits[0], short):
        assert res.params["dual"] <= oracle * (1 + 1e-7) <= res.objective * (1 + 2e-7)
        assert res.gap >= (res.objective - oracle) / res.objective - 1e-7
    assert short.gap > low_rank_fits[0].gap


def test_column_cache_size_changes_no_bit(low_rank, low_rank_fits, monkeypatch):
    """Two cached indices (every step refills a column) give the same bits as the default cache."""
    factors, _, y, _ = low_rank
    monkeypatch.setattr(smo, "COLUMN_CACHE_BYTES", 0)
    res = smo.fit(NoDenseFactorEngine(factors), y, C, tol=None)
    ref = low_rank_fits[0]
    np.testing.assert_array_equal(res.weights, ref.weights)
    np.testing.assert_array_equal(res.dual_coef, ref.dual_coef)
    assert res.objective == ref.objective and res.bias == ref.bias


def test_factor_working_set_holds_factors_and_readds_violators(low_rank):
    """One kernel held at first: the certification passes find the others; held blocks are (p, n, r)."""
    factors, tilde, y, oracle = low_rank
    engine = NoDenseFactorEngine(factors)
    shapes = []
    blocks = engine.blocks

    def recording_blocks(kernels, keep=True):
        out = blocks(kernels, keep)
        shapes.append(out.shape)
        return out

    engine.blocks = recording_blocks
    res = smo.fit(engine, y, C, max_working_set=1, tol=None)
    assert res.converged and sum(h["n_violators"] for h in res.history) >= 1
    assert res.objective == pytest.approx(oracle, rel=1e-4)
    assert shapes and all(s[1:] == factors.shape[1:] for s in shapes)


def test_per_kernel_d_on_factors(low_rank):
    factors, tilde, y, _ = low_rank
    d = np.linspace(0.8, 1.3, factors.shape[0])
    res = smo.fit(NoDenseFactorEngine(factors), y, C, d=d, tol=None)
    assert res.converged
    assert res.objective == pytest.approx(lanckriet_oracle(tilde, y, C, d), rel=1e-4)
    assert np.sum(d * d * res.weights) == pytest.approx(1.0, abs=1e-9)


def test_no_stage_returns_the_uniform_start(low_rank):
    """max_stages = 0 on factors: alpha = 0, uniform weights, f0 from combine_factors (no n x n)."""
    factors, tilde, y, _ = low_rank
    res = smo.fit(NoDenseFactorEngine(factors), y, C, max_stages=1, kappa_min=0.9, tol=None)
    assert res.params["status"] == "kappa_min" and not res.converged
    np.testing.assert_allclose(res.weights, 1.0 / factors.shape[0])
    assert np.all(res.dual_coef == 0.0) and res.params["dual"] == 0.0


class Float32FactorEngine(InMemoryFactorEngine):
    """Factors stored in float32, as a factor bank stores them: blocks come back in float32."""

    def blocks(self, kernels, keep=True):
        return super().blocks(kernels, keep).astype(np.float32)


def test_float32_factors_are_widened_exactly(low_rank):
    """Held float32 factors give the bits of the float64 run on the same (float32-rounded) values:
    every entry is widened before any arithmetic."""
    factors, _, y, _ = low_rank
    rounded = factors.astype(np.float32).astype(np.float64)
    res32 = smo.fit(Float32FactorEngine(rounded), y, C, tol=None)
    res64 = smo.fit(InMemoryFactorEngine(rounded), y, C, tol=None)
    np.testing.assert_array_equal(res32.weights, res64.weights)
    np.testing.assert_array_equal(res32.dual_coef, res64.dual_coef)
    assert res32.objective == res64.objective and res32.converged


def test_factor_resume_is_bit_identical_across_readded_kernels(low_rank, tmp_path):
    factors, _, y, _ = low_rank

    def fit(checkpoint=None):
        return smo.fit(InMemoryFactorEngine(factors), y, C, max_working_set=3, drop_after=1, tol=1e-6,
                       checkpoint=checkpoint)

    reference = fit()
    readded = [i for i, h in enumerate(reference.history) if h["n_violators"] > 0]
    assert readded and readded[0] + 1 < len(reference.history) - 1
    for stop in (readded[0], readded[0] + 1):
        path, fp = tmp_path / f"smo{stop}.npz", {"case": f"factor{stop}"}
        with stop_on_signals(), pytest.raises(Preempted):
            fit(StopAt(path, fp, every_s=None, stop_at=stop))
        resumed = fit(Checkpoint(path, fp, every_s=None))
        np.testing.assert_array_equal(resumed.weights, reference.weights)
        np.testing.assert_array_equal(resumed.dual_coef, reference.dual_coef)
        assert resumed.bias == reference.bias and resumed.objective == reference.objective
        assert resumed.params["passes"] == reference.params["passes"]
        assert [h["kappa"] for h in resumed.history] == [h["kappa"] for h in reference.history]
        assert sum(bool(h.get("resumed")) for h in resumed.history) == 1
