"""SpicyMKL's problem on factor banks by primal block coordinate descent (``method="bcd"``, issue 32).

Every loss and penalty it takes reaches the cvxpy oracle of tests/test_spicy.py and the dense
engine's proximal SpicyMKL on the same kernels; the returned model's objective is the primal at
that model; the gap bounds the true suboptimality, also when cut short; W grows over rounds from one
kernel; Newton steps on the nonzero blocks cut the epochs on coupled kernels; a full-rank factor
gives the dense result; warm starts solve the same problem; a real
float32 factor bank agrees with the proximal method; what it cannot solve is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_spicy import LAM, cvxpy_optimum, gaussian_bank, primal_from_model, targets
from test_spicy_factor import factor_bank

from mklscale.engine import InMemoryEngine, representation
from mklscale.engine.memory import InMemoryFactorEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers import bcd as bcd_module
from mklscale.solvers import spicy
from mklscale.solvers.registry import fit_solver

TOL = 1e-10
EPOCHS = 5000


@pytest.fixture(scope="module")
def bank():
    return factor_bank()


def bcd(L, y, C, **kwargs):
    return spicy.fit(InMemoryFactorEngine(L), y, C, method="bcd", **({"tol": TOL, "max_outer": EPOCHS} | kwargs))


@pytest.mark.parametrize("bias", (True, False))
@pytest.mark.parametrize("penalty", ("l1", "elastic_net"))
@pytest.mark.parametrize("loss", ("logistic", "square"))
def test_reaches_cvxpy_and_the_dense_proximal_method(bank, loss, penalty, bias):
    L, K, X = bank
    y = targets(X, loss, 1)
    ours = bcd(L, y, 0.1, loss=loss, penalty=penalty, lam=LAM, bias=bias)
    dense = spicy.fit(InMemoryEngine(K), y, 0.1, loss=loss, penalty=penalty, lam=LAM, bias=bias, tol=TOL,
                      max_outer=300)
    optimum = cvxpy_optimum(K, y, 0.1, loss, penalty, bias)
    assert ours.converged and ours.solver == "spicy/bcd"
    assert ours.objective == pytest.approx(optimum, rel=1e-6)
    assert ours.objective == pytest.approx(dense.objective, rel=1e-6)
    np.testing.assert_allclose(ours.weights, dense.weights, atol=1e-4 * max(1.0, dense.weights.max()))
    # the objective is the primal of the returned model, and the gap bounds the truth
    assert ours.objective == pytest.approx(primal_from_model(ours, K, y, 0.1, loss, penalty), rel=1e-10)
    assert (ours.objective - optimum) / abs(ours.objective) <= max(ours.gap, 0.0) + 1e-9
    if not bias:
        assert ours.bias == 0.0


@pytest.mark.parametrize("C", (0.01, 0.1))
@pytest.mark.parametrize("bias", (True, False))
@pytest.mark.parametrize("penalty", ("l1", "elastic_net"))
def test_the_hinge_through_its_smoothing_reaches_cvxpy_and_the_proximal_method(bank, penalty, bias, C):
    """The hinge by block descent on its smoothing h_mu, mu cut by 10 at a time while the smoothing
    accounts for the gap: the true hinge problem's optimum (cvxpy, the dense proximal method) to the
    tolerance, with a gap that bounds the truth; mu falls and only falls."""
    L, K, X = bank
    y = targets(X, "hinge", 1)
    ours = bcd(L, y, C, loss="hinge", penalty=penalty, lam=LAM, bias=bias, tol=1e-6)
    dense = spicy.fit(InMemoryEngine(K), y, C, loss="hinge", penalty=penalty, lam=LAM, bias=bias, tol=TOL,
                      max_outer=300)
    optimum = cvxpy_optimum(K, y, C, "hinge", penalty, bias)
    assert ours.converged and ours.gap <= 1e-6
    assert 0.0 <= (ours.objective - optimum) / abs(ours.objective) <= ours.gap + 1e-9
    assert ours.objective == pytest.approx(dense.objective, rel=1e-6)
    assert ours.objective == pytest.approx(primal_from_model(ours, K, y, C, "hinge", penalty), rel=1e-10)
    mu = [h["smoothing"] for h in ours.history]
    assert mu[0] == bcd_module.SMOOTHING_START and mu[-1] < 1e-3 and np.all(np.diff(mu) <= 0.0)


def coupled_bank(n=200, M=12, r=8, seed=0):
    """Random Fourier features of the same 5 inputs: strongly overlapping kernels, whose blocks are
    coupled (block descent alone crawls there)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 5))
    L = np.stack([np.cos(X @ rng.standard_normal((5, r)) + rng.uniform(0.0, 2 * np.pi, r)) for _ in range(M)])
    return L, np.sign(X[:, 0] + 0.3 * X[:, 1] ** 2 - 0.2)


@pytest.mark.parametrize("loss", ("logistic", "square"))
def test_newton_steps_on_the_nonzero_blocks_cut_the_epochs_on_coupled_kernels(loss, monkeypatch):
    """The Newton-CG step on the nonzero blocks (every ANDERSON_DEPTH epochs once they stay the same)
    reaches the same optimum as block descent alone in several times fewer epochs, and the history
    says which epochs ended with one."""
    L, y = coupled_bank()
    with_newton = spicy.fit(InMemoryFactorEngine(L), y, 0.03, loss=loss, method="bcd", tol=1e-8, max_outer=EPOCHS)
    monkeypatch.setattr(bcd_module.BlockDescent, "_newton_step", lambda self: False)
    alone = spicy.fit(InMemoryFactorEngine(L), y, 0.03, loss=loss, method="bcd", tol=1e-8, max_outer=EPOCHS)
    assert with_newton.converged and alone.converged
    assert with_newton.objective == pytest.approx(alone.objective, rel=1e-7)
    taken = [h["iteration"] for h in with_newton.history if h["newton_step"]]
    assert taken and all(epoch % bcd_module.ANDERSON_DEPTH == 0 for epoch in taken)
    assert not any(h["newton_step"] for h in alone.history)
    assert 3 * len(with_newton.history) < len(alone.history)


def test_full_rank_factor_gives_the_dense_result():
    grams, X = gaussian_bank(32, 6, seed=2)
    w, V = np.linalg.eigh(grams)
    L = V * np.sqrt(np.maximum(w, 0.0))[:, None, :]              # r = n: K = L L^T up to rounding
    y = targets(X, "logistic", 1)
    ours = bcd(L, y, 0.05)
    dense = spicy.fit(InMemoryEngine(grams), y, 0.05, tol=TOL, max_outer=300)
    assert ours.converged and ours.objective == pytest.approx(dense.objective, rel=1e-7)
    np.testing.assert_allclose(ours.weights, dense.weights, atol=1e-5)
    np.testing.assert_array_equal(ours.active, dense.active)


@pytest.mark.parametrize("loss", ("logistic", "square"))
def test_working_set_grows_from_one_kernel(loss, monkeypatch):
    """From a first W of one kernel, rounds of certification add the violators until the optimum."""
    monkeypatch.setattr(representation, "WORKING_SET_START_COLUMNS", 4)
    L, K, X = factor_bank(n=40, M=10, r=4, seed=3)
    y = targets(X, loss, 1)
    ours = bcd(L, y, 0.05, loss=loss)
    optimum = cvxpy_optimum(K, y, 0.05, loss, "l1")
    assert ours.history[0]["working_set"] == 1 and ours.history[-1]["working_set"] > 1
    assert ours.converged and ours.active.size >= 2
    assert ours.objective == pytest.approx(optimum, rel=1e-6)
    assert (ours.objective - optimum) / abs(ours.objective) <= max(ours.gap, 0.0) + 1e-9


def test_a_full_working_set_drops_its_zero_blocks(monkeypatch):
    """With room for 4 kernels, W drops its blocks at v = 0 to take in new violators and still reaches
    the optimum while the active kernels fit (4 of 6 held without a cap); with 7 active it stops with
    the working-set error."""
    monkeypatch.setattr(representation, "WORKING_SET_START_COLUMNS", 4)
    L, K, X = factor_bank(n=40, M=10, r=4, seed=3)
    y = targets(X, "logistic", 1)
    room = 4 * 40 * 4 * 8
    roomy = bcd(L, y, 0.3)
    assert roomy.active.size == 4 and max(h["working_set"] for h in roomy.history) > 4
    tight = bcd(L, y, 0.3, working_set_bytes=room)
    assert max(h["working_set"] for h in tight.history) <= 4
    assert tight.converged and tight.objective == pytest.approx(roomy.objective, rel=1e-9)
    with pytest.raises(InvalidInputError, match="working set is full"):
        bcd(L, y, 0.2, working_set_bytes=room)


def test_cut_short_gap_still_bounds_the_suboptimality(bank):
    L, K, X = bank
    y = targets(X, "logistic", 3)
    optimum = cvxpy_optimum(K, y, 0.1, "logistic", "l1")
    for epochs in (1, 2, 4):
        res = spicy.fit(InMemoryFactorEngine(L), y, 0.1, method="bcd", tol=1e-12, max_outer=epochs)
        assert not res.converged
        assert (res.objective - optimum) / abs(res.objective) <= res.gap + 1e-12


def test_warm_start_from_another_C_solves_the_same_problem(bank):
    L, K, X = bank
    y = targets(X, "logistic", 1)
    engine = InMemoryFactorEngine(L)

    def fit(tol, init=None):
        return spicy.fit(engine, y, 0.05, method="bcd", tol=tol, max_outer=EPOCHS, init=init)

    previous = bcd(L, y, 0.1)
    cold, warm = fit(TOL), fit(TOL, previous)
    assert warm.converged and warm.objective == pytest.approx(cold.objective, rel=1e-12)
    # it starts closer: at a path's usual tolerance it needs fewer epochs (12 against 18 here)
    assert len(fit(1e-3, previous).history) < len(fit(1e-3).history)


def test_a_float32_factor_bank_agrees_with_the_proximal_method(tmp_path):
    """A real zarr factor bank (Nystrom, float32) through the registry: bcd and the proximal method
    reach the same objective, and the weights agree."""
    from mklscale.bank import build_bank, families
    from mklscale.datasets import load
    from mklscale.engine import Engine

    ds = load("ringnorm", n_samples=400, seed=0)
    bank = build_bank(ds.X, families.random_subsets(ds.X.shape[1], 12, seed=0), tmp_path / "bank", rank=16,
                      progress=False, max_error=1.0)
    y = np.asarray(ds.y, dtype=np.float64)
    with Engine(bank) as engine:
        params = {"loss": "logistic", "tol": 1e-7, "max_outer": EPOCHS}
        ours = fit_solver("spicy", engine, y, "classification", C=0.5, params=params | {"method": "bcd"})
        prox = fit_solver("spicy", engine, y, "classification", C=0.5, params=params)
    assert ours.converged and prox.converged and ours.active.size >= 2
    assert ours.objective == pytest.approx(prox.objective, rel=1e-6)
    np.testing.assert_allclose(ours.weights, prox.weights, atol=1e-3 * prox.weights.max())


def test_the_square_losss_newton_steps_through_the_gram_reach_the_same_optimum(bank, monkeypatch):
    """With the Gram of W's centred factors (GRAM_MIN_COLUMNS lowered so that it is used at this size) the
    square loss's Newton steps reach cvxpy's optimum, as the products over the factors do, with Newton
    steps taken; with a bias and without."""
    from mklscale.solvers import _factor_gram

    L, K, X = bank
    y = targets(X, "square", 1)
    updates = []
    update = _factor_gram.CentredGram.update
    monkeypatch.setattr(_factor_gram.CentredGram, "update", lambda self, *a: updates.append(1) or update(self, *a))
    for bias in (True, False):
        over_factors = bcd(L, y, 0.05, loss="square", bias=bias)
        assert not updates
        monkeypatch.setattr(bcd_module, "GRAM_MIN_COLUMNS", 1)
        through_gram = bcd(L, y, 0.05, loss="square", bias=bias)
        monkeypatch.setattr(bcd_module, "GRAM_MIN_COLUMNS", 10**9)
        assert updates
        updates.clear()
        optimum = cvxpy_optimum(K, y, 0.05, "square", "l1", bias)
        assert through_gram.converged and any(h["newton_step"] for h in through_gram.history)
        assert through_gram.objective == pytest.approx(optimum, rel=1e-6)
        assert through_gram.objective == pytest.approx(over_factors.objective, rel=1e-9)
        assert (through_gram.objective - optimum) / abs(through_gram.objective) <= through_gram.gap + 1e-9


def test_the_gram_is_the_centred_factors_gram_whatever_steps_w_grew_in():
    """CentredGram extended in uneven steps holds L~_W^T L~_W, the same bits as one built at once; cut to
    the blocks W keeps, the same bits as one built on them; times(S, A) is L~_A^T L~_A S."""
    from mklscale.solvers import _factor_gram

    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal((30, 4)).astype(np.float32) + 3.0 for _ in range(7)]
    mu = np.array([b.mean(axis=0, dtype=np.float64) for b in blocks])
    grown, at_once = _factor_gram.CentredGram(4), _factor_gram.CentredGram(4)
    for k in (1, 2, 5, 7):
        grown.update(blocks[:k], mu[:k])
    at_once.update(blocks, mu)
    centred = np.concatenate([b - m for b, m in zip(blocks, mu)], axis=1)
    np.testing.assert_allclose(grown.G, centred.T @ centred, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(grown.G, at_once.G)
    A = np.array([1, 4, 6])
    LA = centred[:, np.concatenate([np.arange(4 * a, 4 * a + 4) for a in A])]
    S = rng.standard_normal((3, 4))
    np.testing.assert_allclose(grown.times(S, A), (LA.T @ (LA @ S.ravel())).reshape(3, 4), rtol=1e-4, atol=1e-3)
    kept = np.array([True, False, True, True, False, True, True])
    grown.keep(kept)
    on_kept = _factor_gram.CentredGram(4)
    on_kept.update([b for b, k in zip(blocks, kept) if k], mu[kept])
    assert grown.blocks == 5
    np.testing.assert_array_equal(grown.G, on_kept.G)


@pytest.mark.parametrize("loss, tol", (("logistic", TOL), ("hinge", 1e-6), ("square", TOL)))
def test_a_resumed_run_gives_the_same_bits(bank, tmp_path, loss, tol, monkeypatch):
    """Interrupted after the checkpoint of an epoch past the first Anderson extrapolation and W's
    growth, then run again from the file: the uninterrupted run's result, bit for bit (the first
    Newton step, at epoch 15, needs the nonzero blocks' pattern and since when it holds, from epoch 9;
    the hinge's mu, curvature floor and Newton cadence are state too)."""
    from test_factor_solvers import _stopped_then_resumed

    from mklscale.runtime.checkpoint import Checkpoint

    L, K, X = factor_bank(n=40, M=10, r=4, seed=3)
    y = targets(X, loss, 1)
    monkeypatch.setattr(bcd_module, "GRAM_MIN_COLUMNS", 1)   # the square loss's Newton steps through W's Gram

    def fit(checkpoint=None):
        return spicy.fit(InMemoryFactorEngine(L), y, 0.05, loss=loss, method="bcd", tol=tol, max_outer=EPOCHS,
                         working_set=[0], checkpoint=checkpoint)

    full = fit()
    assert len(full.history) > 12 and full.history[-1]["working_set"] > 1
    ck = Checkpoint(tmp_path / "ck.npz", {"case": "bcd"}, every_s=None, every_iter=1)
    resumed = _stopped_then_resumed(fit, ck, stop_at=12)
    np.testing.assert_array_equal(resumed.weights, full.weights)
    np.testing.assert_array_equal(resumed.dual_coef, full.dual_coef)
    assert resumed.objective == full.objective and resumed.gap == full.gap
    assert [h["primal"] for h in resumed.history] == [h["primal"] for h in full.history]


def test_auto_takes_it_on_factor_banks_for_its_losses(bank):
    L, K, X = bank
    for loss, method in (("logistic", "bcd"), ("square", "bcd"), ("hinge", "bcd"),
                         ("eps_insensitive", "proximal")):
        y = targets(X, loss, 1)
        assert spicy.fit(InMemoryFactorEngine(L), y, 0.1, loss=loss, max_outer=3).params["method"] == method
        assert spicy.fit(InMemoryEngine(K), y, 0.1, loss=loss, max_outer=3).params["method"] == "proximal"
    y = targets(X, "logistic", 1)
    assert spicy.fit(InMemoryFactorEngine(L), y, 0.1, penalty="block_q", max_outer=3).params["method"] == "one_step"
    assert spicy.fit(InMemoryFactorEngine(L), y, 0.1).params["max_outer"] == spicy.MAX_OUTER["bcd"]


def test_what_it_cannot_solve_is_refused(bank):
    L, K, X = bank
    y = targets(X, "logistic", 1)
    with pytest.raises(InvalidInputError, match="factor banks"):
        spicy.fit(InMemoryEngine(K), y, 0.1, method="bcd")
    with pytest.raises(InvalidInputError, match="solves the logistic, square, hinge losses"):
        spicy.fit(InMemoryFactorEngine(L), targets(X, "square", 1), 0.1, loss="eps_insensitive", method="bcd")
    with pytest.raises(InvalidInputError, match="block 1-norm and the elastic net"):
        spicy.fit(InMemoryFactorEngine(L), y, 0.1, penalty="block_q", method="bcd")
