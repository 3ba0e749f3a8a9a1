"""SpicyMKL against an independent oracle: the same convex problem in cvxpy, solved by Clarabel.

Problem (42): sum_i loss(y_i, sum_m K_m alpha_m + b) + sum_m g~_C(||alpha_m||_{K_m}). The oracle
writes K_m = L_m L_m^T (eigendecomposition, no extra ridge) and beta_m = L_m^T alpha_m, so
K_m alpha_m = L_m beta_m and ||alpha_m||_{K_m} = ||beta_m||_2.
"""

from __future__ import annotations

import json
import warnings

import cvxpy as cp
import numpy as np
import pytest
from _dense_engine import DenseEngine

from mklscale.errors import InvalidInputError
from mklscale.solvers import spicy
from mklscale.solvers.losses import make_loss
from mklscale.solvers.penalties import make_penalty
from mklscale.solvers.result import MKLResult

LAM, Q, EPS = 0.5, 1.5, 0.1
LOSSES = ("logistic", "hinge", "square", "eps_insensitive")
PENALTIES = ("l1", "elastic_net", "block_q")
TOL = 1e-8


# ------------------------------------------------------------------------------------------ data

def _normalise(K):
    return K / np.trace(K) + 1e-8 * np.eye(K.shape[0])


def random_psd_bank(n, M, seed):
    rng = np.random.default_rng(seed)
    grams = []
    for _ in range(M):
        A = rng.normal(size=(n, int(rng.integers(2, n))))
        grams.append(_normalise(A @ A.T))
    X = rng.normal(size=(n, 3))
    return np.array(grams), X


def gaussian_bank(n, M, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    sq = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    grams = [_normalise(np.exp(-sq / (2.0 * (0.3 * 2.0**m) ** 2))) for m in range(M)]
    return np.array(grams), X


def targets(X, loss, seed):
    rng = np.random.default_rng(seed)
    if loss in ("logistic", "hinge"):
        return np.where(X[:, 0] + 0.3 * rng.normal(size=X.shape[0]) > 0, 1.0, -1.0)
    return X[:, 0] + 0.1 * rng.normal(size=X.shape[0])


@pytest.fixture(scope="module")
def psd_bank():
    return random_psd_bank(30, 6, seed=0)


@pytest.fixture(scope="module")
def gauss_bank():
    return gaussian_bank(32, 6, seed=2)


# ---------------------------------------------------------------------------------------- oracle

def cvxpy_optimum(grams, y, C, loss, penalty, bias=True, lam=LAM, q=Q, eps=EPS):
    M, n, _ = grams.shape
    factors = []
    for K in grams:
        w, V = np.linalg.eigh(K)
        factors.append(V * np.sqrt(np.maximum(w, 0.0)))
    betas = [cp.Variable(n) for _ in range(M)]
    b = cp.Variable() if bias else 0.0
    f = sum(L @ beta for L, beta in zip(factors, betas)) + b
    if loss == "logistic":
        data = cp.sum(cp.logistic(-cp.multiply(y, f)))
    elif loss == "hinge":
        data = cp.sum(cp.pos(1 - cp.multiply(y, f)))
    elif loss == "square":
        data = 0.5 * cp.sum_squares(y - f)
    else:
        data = cp.sum(cp.pos(cp.abs(f - y) - eps))
    norms = [cp.norm(beta, 2) for beta in betas]
    if penalty == "l1":
        reg = C * sum(norms)
    elif penalty == "elastic_net":
        reg = C * sum((1 - lam) * nb + lam / 2 * cp.sum_squares(beta) for nb, beta in zip(norms, betas))
    else:
        reg = C * sum(cp.power(nb, q) for nb in norms) / q
    problem = cp.Problem(cp.Minimize(data + reg))
    with warnings.catch_warnings():  # at these tolerances Clarabel sometimes stops at "inaccurate"
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11, max_iter=500)
    assert problem.status in ("optimal", "optimal_inaccurate")
    return float(problem.value)


def primal_from_model(result, grams, y, C, loss, penalty, lam=LAM, q=Q, eps=EPS):
    """P at alpha_m = weights[m] * dual_coef, through the result's decision function."""
    f = result.decision_function_from_kernels(grams[result.active])
    norms = result.weights * np.sqrt(np.einsum("i,mij,j->m", result.dual_coef, grams, result.dual_coef))
    return make_loss(loss, eps).value(y, f) + float(np.sum(make_penalty(penalty, lam, q).value(norms, C)))


def check_against_oracle(grams, y, C, loss, penalty, bias=True, **kwargs):
    engine = DenseEngine(grams)
    result = spicy.fit(engine, y, C, loss=loss, penalty=penalty, lam=LAM, q=Q, eps=EPS, bias=bias, tol=TOL,
                       max_outer=300, **kwargs)
    optimum = cvxpy_optimum(grams, y, C, loss, penalty, bias)
    assert result.converged and (0.0 <= result.gap <= TOL * 1.0001 or abs(result.gap) < 1e-12)
    assert result.objective == pytest.approx(optimum, rel=1e-6)
    assert primal_from_model(result, grams, y, C, loss, penalty) == pytest.approx(result.objective, rel=1e-9)
    if not bias:
        assert result.bias == 0.0
    assert result.history[-1]["passes"] == engine.stats["passes"]
    return result


# ------------------------------------------------------------------------------- oracle agreement

@pytest.mark.parametrize("penalty", PENALTIES)
@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_and_penalty_matches_cvxpy(psd_bank, loss, penalty):
    grams, X = psd_bank
    check_against_oracle(grams, targets(X, loss, 1), 0.1, loss, penalty)


@pytest.mark.parametrize("penalty", PENALTIES)
@pytest.mark.parametrize("loss", ("logistic", "square", "hinge"))
def test_without_bias_matches_cvxpy(psd_bank, loss, penalty):
    grams, X = psd_bank
    check_against_oracle(grams, targets(X, loss, 2), 0.05, loss, penalty, bias=False)


@pytest.mark.parametrize("loss", LOSSES)
def test_gaussian_bank_block1_matches_cvxpy(gauss_bank, loss):
    grams, X = gauss_bank
    for C in (0.02, 1.0):
        check_against_oracle(grams, targets(X, loss, 3), C, loss, "l1")


@pytest.mark.parametrize("penalty", ("elastic_net", "block_q"))
@pytest.mark.parametrize("loss", LOSSES)
def test_proximal_and_one_step_agree_for_smooth_dual_penalties(gauss_bank, loss, penalty):
    grams, X = gauss_bank
    y = targets(X, loss, 4)
    one = check_against_oracle(grams, y, 0.3, loss, penalty, method="one_step")
    prox = spicy.fit(DenseEngine(grams), y, 0.3, loss=loss, penalty=penalty, tol=TOL, method="proximal")
    assert one.solver == "spicy/one_step" and prox.solver == "spicy/proximal"
    assert prox.objective == pytest.approx(one.objective, rel=1e-7)
    if loss in ("logistic", "square"):
        assert len(one.history) == 1  # ElastMKL: one Newton solve, no outer iterations


@pytest.mark.parametrize("loss", ("hinge", "eps_insensitive", "square"))
def test_default_tol_is_relative_whatever_the_scale_of_the_objective(psd_bank, loss):
    """At C = 1e-4 the objective is far below 1; a certificate relative to max(|P|, 1) (the old rule)
    let these fits stop 13-26% above the optimum while reporting converged. The reported gap must
    bound the true relative suboptimality of the returned model (issue 16, defect 3)."""
    grams, X = psd_bank
    y = targets(X, loss, 1)
    C = 1e-4
    result = spicy.fit(DenseEngine(grams), y, C, loss=loss, penalty="l1", eps=EPS)
    optimum = cvxpy_optimum(grams, y, C, loss, "l1")
    primal = primal_from_model(result, grams, y, C, loss, "l1")
    assert result.converged and result.gap <= 1e-3
    assert (primal - optimum) / abs(primal) <= result.gap + 1e-9


def test_history_counts_passes_of_this_solve_only(psd_bank):
    """Three fits on one engine report the same passes per iteration, not 1, 2, 3 (defect 1)."""
    grams, X = psd_bank
    y = targets(X, "logistic", 0)
    engine = DenseEngine(grams)
    runs = [spicy.fit(engine, y, 0.05, loss="logistic", tol=1e-6) for _ in range(3)]
    assert [r.history[0]["passes"] for r in runs] == [runs[0].history[0]["passes"]] * 3
    for r in runs:
        assert all(np.diff([h["passes"] for h in r.history]) >= 0)
        assert all(np.diff([h["seconds"] for h in r.history]) >= 0)


def test_zero_optimum_is_certified(psd_bank):
    """Every target inside the eps-tube: P* = 0, so the gap is absolute below |P| = 1."""
    grams, X = psd_bank
    y = 0.01 * X[:, 0]
    for penalty in PENALTIES:
        result = spicy.fit(DenseEngine(grams), y, 0.1, loss="eps_insensitive", penalty=penalty, eps=0.5, tol=1e-8)
        assert result.converged and 0.0 <= result.objective <= 1e-8
        if penalty != "block_q":
            assert result.active.size == 0


# ------------------------------------------------------------------ the returned model (d, c, b)

@pytest.mark.parametrize("loss,penalty", [("logistic", "l1"), ("hinge", "l1"), ("square", "elastic_net"),
                                          ("eps_insensitive", "block_q"), ("logistic", "elastic_net")])
def test_model_reproduces_the_solvers_own_alpha(psd_bank, loss, penalty):
    """alpha_m* = d_m rho*/C: the decision function of (weights, dual_coef, bias) equals
    sum_m K_m alpha_m + b of the proximal iterates, and the Table-3 weights of ||alpha_m||."""
    grams, X = psd_bank
    y = targets(X, loss, 5)
    solver = spicy._build(DenseEngine(grams), y, 0.1, loss, penalty, LAM, Q, EPS, True, 1e-12, 300, 50,
                          None, "proximal", False)
    result = solver.run()
    assert result.converged
    f_alpha = solver.kernels.K_alpha.sum(axis=0) + solver.b
    f_model = result.decision_function_from_kernels(grams[result.active])
    # the iterates are within ~sqrt(gap) of the optimum for the strongly convex elastic net
    assert np.max(np.abs(f_model - f_alpha)) <= 2e-6 * np.max(np.abs(f_alpha))
    assert result.bias == solver.b
    alpha_norms = np.zeros(grams.shape[0])
    alpha_norms[solver.index] = np.sqrt(solver.kernels.alpha_K_alpha)
    table3 = make_penalty(penalty, LAM, Q).weight(alpha_norms)
    np.testing.assert_allclose(result.weights, table3, rtol=1e-5, atol=1e-8 * table3.max())


def test_block1_selects_the_informative_kernels():
    """8 single-feature Gaussian kernels, y depends on features 0 and 1 only."""
    n, M = 40, 8
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, M))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] > 0, 1.0, -1.0)
    grams = np.array([_normalise(np.exp(-((X[:, m, None] - X[None, :, m]) ** 2) / 2.0)) for m in range(M)])
    for loss in ("logistic", "hinge"):
        sparse = spicy.fit(DenseEngine(grams), y, 0.5, loss=loss, tol=1e-6)
        assert sparse.converged and set(sparse.active.tolist()) == {0, 1}
        assert np.all(sparse.weights[2:] == 0.0)
        dense = spicy.fit(DenseEngine(grams), y, 0.01, loss=loss, tol=1e-6)
        assert dense.active.size > sparse.active.size


def test_elastic_net_tends_to_uniform_weights(gauss_bank):
    grams, X = gauss_bank
    y = targets(X, "logistic", 6)
    spreads = []
    for lam in (0.2, 0.9, 0.99):
        w = spicy.fit(DenseEngine(grams), y, 0.1, loss="logistic", penalty="elastic_net", lam=lam, tol=1e-8).weights
        spreads.append(w.max() / w.min() if w.min() > 0 else np.inf)
    assert spreads[0] > spreads[1] > spreads[2] and spreads[2] < 1.05
    w = spicy.fit(DenseEngine(grams), y, 0.1, loss="logistic", penalty="elastic_net", lam=1.0, tol=1e-8).weights
    np.testing.assert_allclose(w, np.ones_like(w), rtol=1e-12)


# ----------------------------------------------------------------------------------- out of core

@pytest.fixture(scope="module")
def wide_bank():
    """40 points, 60 Gaussian kernels on random feature subsets with random widths (IDA style)."""
    return ida_style_bank(40, 60)


def ida_style_bank(n: int, M: int):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(n, 6))
    y = np.where(X[:, 0] + X[:, 1] ** 2 - 1 + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    grams = []
    for _ in range(M):
        feats = rng.choice(6, size=int(rng.integers(1, 3)), replace=False)
        sigma2 = 5 * rng.chisquare(1) + 0.1
        sq = ((X[:, None, feats] - X[None, :, feats]) ** 2).sum(-1)
        grams.append(_normalise(np.exp(-sq / (2 * sigma2))))
    return np.array(grams), y


@pytest.mark.parametrize("loss", ("logistic", "hinge"))
def test_working_set_matches_full_solve_with_few_passes(wide_bank, loss):
    grams, y = wide_bank
    C = 0.05
    engine = DenseEngine(grams)
    result = spicy.fit(engine, y, C, loss=loss, tol=1e-6)
    full = spicy.fit(DenseEngine(grams), y, C, loss=loss, tol=1e-6, working_set="all")
    assert result.converged and full.converged
    assert result.objective == pytest.approx(full.objective, rel=2e-6)
    assert engine.stats["block_loads"] < grams.shape[0]  # never held the whole bank
    assert engine.stats["passes"] <= 6
    passes = [h["passes"] for h in result.history]
    assert passes == sorted(passes) and passes[-1] == engine.stats["passes"]
    assert result.history[-1]["certified"]
    # the certificate covers every kernel: no kernel outside the model violates ||rho||_K <= C
    rho = result.dual_coef * C
    rho = rho - rho.mean()
    norms = np.sqrt(np.einsum("i,mij,j->m", rho, grams, rho))
    assert np.all(norms[result.weights == 0] <= C * (1 + 1e-4))
    if loss == "logistic":
        assert result.objective == pytest.approx(cvxpy_optimum(grams, y, C, loss, "l1"), rel=1e-5)


def test_inactivity_bound_saves_passes(wide_bank):
    """Kernels with a small lambda_max are proven inactive by
    ||rho||_K <= ||rho_ref||_K + sqrt(lambda_max) ||rho - rho_ref||: after the first pass the
    certificate over all kernels needs no further pass."""
    grams, y = wide_bank
    grams = np.concatenate([grams[:10], 1e-4 * grams[10:]])
    engine = DenseEngine(grams)
    result = spicy.fit(engine, y, 0.05, loss="logistic", tol=1e-8, working_set=range(10))
    assert result.converged and engine.stats["passes"] == 1  # the initial pass only
    assert engine.stats["block_loads"] <= 10 and set(result.active.tolist()) <= set(range(10))
    full = spicy.fit(DenseEngine(grams), y, 0.05, loss="logistic", tol=1e-8, working_set="all")
    assert result.objective == pytest.approx(full.objective, rel=1e-7)


class _EngineWithUnfinishedKernels(DenseEngine):
    """Like an engine over a bank opened with allow_incomplete: NaN for the unfinished kernels."""

    def __init__(self, grams, unfinished):
        super().__init__(grams)
        self.unfinished = np.asarray(unfinished)
        self._lambda_max[self.unfinished] = np.nan

    def quad_forms(self, U, kernels=None, per_kernel=False):
        out = super().quad_forms(U, kernels, per_kernel)
        if kernels is None:
            out[self.unfinished] = np.nan
        return out

    def blocks(self, idx, keep=True):
        assert not set(np.asarray(idx).tolist()) & set(self.unfinished.tolist()), "asked for an unfinished kernel"
        return super().blocks(idx, keep)


def test_unfinished_kernels_are_left_out(wide_bank):
    grams, y = wide_bank
    unfinished = [0, 4]
    keep = np.setdiff1d(np.arange(grams.shape[0]), unfinished)
    result = spicy.fit(_EngineWithUnfinishedKernels(grams, unfinished), y, 0.05, loss="logistic", tol=1e-8)
    reference = spicy.fit(DenseEngine(grams[keep]), y, 0.05, loss="logistic", tol=1e-8)
    assert result.converged and np.all(result.weights[unfinished] == 0.0)
    assert result.objective == pytest.approx(reference.objective, rel=1e-7)
    np.testing.assert_allclose(result.weights[keep], reference.weights, rtol=1e-4, atol=1e-6)


def test_result_roundtrip_and_decision_function(psd_bank):
    grams, X = psd_bank
    y = targets(X, "logistic", 8)
    result = spicy.fit(DenseEngine(grams), y, 0.1, loss="logistic", tol=1e-6)
    payload = json.dumps(result.to_dict())
    back = MKLResult.from_dict(json.loads(payload))
    np.testing.assert_array_equal(back.weights, result.weights)
    np.testing.assert_array_equal(back.dual_coef, result.dual_coef)
    np.testing.assert_array_equal(back.active, result.active)
    assert back.bias == result.bias and back.objective == result.objective and back.gap == result.gap
    assert back.history == result.history and back.params == result.params
    assert back.params["loss"] == "logistic" and back.solver == "spicy/proximal"
    # new points: cross kernels of the active kernels only
    K_cross = grams[result.active][:, :5, :]
    expected = sum(result.weights[m] * grams[m][:5] @ result.dual_coef for m in result.active) + result.bias
    np.testing.assert_allclose(back.decision_function_from_kernels(K_cross), expected, rtol=1e-12)
    with pytest.raises(InvalidInputError, match="active"):
        result.decision_function_from_kernels(np.concatenate([K_cross, K_cross[:1]]))
    for key in ("primal", "dual", "gap", "n_active", "passes", "bytes_read", "seconds"):
        assert key in result.history[-1]
    with pytest.raises(InvalidInputError, match="keys"):
        MKLResult.from_dict({"weights": []})
    inf_result = MKLResult(weights=[0.0, 1.0], dual_coef=[1.0], bias=0.0, active=[1], objective=1.0, gap=np.inf)
    assert MKLResult.from_dict(json.loads(json.dumps(inf_result.to_dict()))).gap == np.inf


# ------------------------------------------------------------------------------------- bad input

def test_dense_engine_api(psd_bank):
    grams, _ = psd_bank
    engine = DenseEngine(grams)
    u = np.arange(grams.shape[1], dtype=float)
    U = np.vstack([u, -u, u + 1])
    np.testing.assert_allclose(engine.quad_forms(u), [u @ K @ u for K in grams])
    assert engine.quad_forms(U).shape == (grams.shape[0], 3) and engine.stats["passes"] == 2
    idx = [4, 1]
    np.testing.assert_allclose(engine.quad_forms(U[:2], kernels=idx, per_kernel=True),
                               [U[0] @ grams[4] @ U[0], U[1] @ grams[1] @ U[1]])
    np.testing.assert_allclose(engine.matvecs(u, kernels=idx), grams[idx] @ u)
    assert engine.blocks(idx).shape == (2,) + grams.shape[1:] and engine.stats["passes"] == 2
    np.testing.assert_allclose(engine.lambda_max, [np.linalg.eigvalsh(K)[-1] for K in grams])


@pytest.mark.parametrize("kwargs,message", [
    ({"y": "zero_one"}, "-1, \\+1"),
    ({"y": "one_class"}, "both classes"),
    ({"y": "three_classes"}, "-1, \\+1"),
    ({"y": "one_class", "loss": "hinge"}, "both classes"),
    ({"y": "short"}, "n = 30"),
    ({"y": "nan", "loss": "square"}, "NaN"),
    ({"C": 0.0}, "C must be"),
    ({"C": -1.0}, "C must be"),
    ({"C": float("nan")}, "C must be"),
    ({"penalty": "elastic_net", "lam": 1.5}, "lam"),
    ({"penalty": "elastic_net", "lam": -0.1}, "lam"),
    ({"penalty": "block_q", "q": 1.0}, "q"),
    ({"penalty": "block_q", "q": 0.5}, "q"),
    ({"loss": "huber"}, "unknown loss"),
    ({"penalty": "lasso"}, "unknown penalty"),
    ({"method": "one_step"}, "one_step"),
    ({"method": "newton"}, "unknown method"),
    ({"tol": 0.0}, "tol"),
    ({"max_outer": 0}, "max_outer"),
    ({"working_set": [0, 99]}, "working_set"),
])
def test_bad_input_is_rejected(psd_bank, kwargs, message):
    grams, X = psd_bank
    n = grams.shape[1]
    labels = np.where(X[:, 0] > 0, 1.0, -1.0)
    y = {
        "zero_one": (labels + 1) / 2,
        "one_class": np.ones(n),
        "three_classes": np.arange(n) % 3 - 1.0,
        "short": labels[:-1],
        "nan": np.where(np.arange(n) == 3, np.nan, X[:, 0]),
    }.get(kwargs.pop("y", None), labels)
    args = {"C": 0.1, "loss": "logistic", **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        spicy.fit(DenseEngine(grams), y, **args)


# ---- on the real engine over a zarr bank ------------------------------------------------------------
@pytest.mark.parametrize("loss", ("logistic", "hinge"))
def test_real_engine_gives_the_dense_engine_result(wide_bank, loss, tmp_path):
    from mklscale.bank import KernelBank
    from mklscale.engine import Engine

    grams, y = wide_bank
    bank = KernelBank.from_arrays(grams, tmp_path / "bank", dtype="float64", chunk_mb=0.02, shard_mb=0.1)
    assert bank.n_shards > 1
    with Engine(bank, cache_bytes="64MB") as engine:
        real = spicy.fit(engine, y, 0.05, loss=loss, tol=1e-6)
        passes = engine.stats["passes"]
    dense = spicy.fit(DenseEngine(grams), y, 0.05, loss=loss, tol=1e-6)
    assert real.converged and passes == dense.history[-1]["passes"] <= 6
    np.testing.assert_array_equal(real.active, dense.active)
    assert real.objective == pytest.approx(dense.objective, rel=1e-9)
    np.testing.assert_allclose(real.weights, dense.weights, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("loss, penalty", [("hinge", "l1"), ("logistic", "elastic_net")])
def test_working_set_holds_each_kernel_once(loss, penalty, tmp_path):
    """Memory held for the W working-set kernels on a float32 bank: one float32 copy each (the
    solver's), none in the engine cache, products still in float64 (same optimum as the float64
    DenseEngine up to the float32 rounding of the bank). tracemalloc counts numpy's buffers, so a
    regression to a second copy (cache, concatenation, float64 conversion) adds >= W * one. n = 160
    so that the kernels (W * one >= 1.6 MB) dwarf what other threads (the session's Dask client)
    allocate meanwhile, which tracemalloc counts too."""
    import tracemalloc

    from mklscale.bank import KernelBank
    from mklscale.engine import Engine

    grams, y = ida_style_bank(160, 60)
    n = grams.shape[1]
    one = n * n * 4
    bank = KernelBank.from_arrays(grams, tmp_path / "bank", chunk_mb=0.2, shard_mb=1.0)
    with Engine(bank, threads=1) as engine:
        spicy.fit(engine, y, 0.05, loss=loss, penalty=penalty, tol=1e-6)  # compile outside the measurement
    with Engine(bank, threads=1) as engine:
        engine.quad_forms(np.ones(n))
        solver = spicy._build(engine, y, 0.05, loss, penalty, LAM, Q, EPS, True, 1e-6, 500, 50, None, "auto", False)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        result = solver.run()
        held, peak = (v - base for v in tracemalloc.get_traced_memory())
        tracemalloc.stop()
        W = solver.index.size
        assert result.converged and W >= 16
        assert all(c.dtype == np.float32 for c in solver.kernels.held.chunks) and solver.kernels.held.nbytes == W * one
        assert engine.cache.nbytes == 0 and len(engine.cache) == 0
        assert held < 1.6 * W * one, f"{held / (W * one):.2f} copies of the working set held"
        assert peak < 3.5 * W * one, f"peak {peak / (W * one):.2f} working sets"
    dense = spicy.fit(DenseEngine(grams), y, 0.05, loss=loss, penalty=penalty, tol=1e-6)
    assert result.objective == pytest.approx(dense.objective, rel=1e-6)


def test_working_set_byte_budget(wide_bank):
    """working_set_bytes caps W: a budget that holds the active kernels but not the usual initial
    32 gives the same optimum (violators join as room allows); one too small for the active set
    stops with a message saying what is needed."""
    grams, y = wide_bank
    one = grams.shape[1] ** 2 * 8  # DenseEngine blocks are float64
    free = spicy.fit(DenseEngine(grams), y, 0.05, loss="logistic", tol=1e-6)
    assert free.history[-1]["working_set"] > 12 and free.active.size < 12
    capped = spicy.fit(DenseEngine(grams), y, 0.05, loss="logistic", tol=1e-6, working_set_bytes=12 * one)
    assert capped.converged and max(h["working_set"] for h in capped.history) <= 12
    assert capped.params["working_set_bytes"] == 12 * one
    assert capped.objective == pytest.approx(free.objective, rel=1e-6)
    with pytest.raises(InvalidInputError, match="working set is full.*working_set_bytes"):
        spicy.fit(DenseEngine(grams), y, 0.05, loss="logistic", tol=1e-6, working_set_bytes=2 * one)
    with pytest.raises(InvalidInputError, match="working_set_bytes"):
        spicy.fit(DenseEngine(grams), y, 0.05, loss="logistic", working_set_bytes="lots")


@pytest.mark.parametrize("loss", ("logistic", "hinge"))
def test_one_step_working_set_grows_faster(loss, monkeypatch):
    """ElastMKL (one_step) keeps most kernels active, so its working set quadruples per round
    (GROWTH) instead of doubling: fewer certification passes, the same optimum."""
    rng = np.random.default_rng(11)
    n, M = 24, 400
    X = rng.normal(size=(n, 6))
    y = np.where(X[:, 0] + X[:, 1] ** 2 - 1 + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    grams = []
    for _ in range(M):
        feats = rng.choice(6, size=int(rng.integers(1, 4)), replace=False)
        sq = ((X[:, None, feats] - X[None, :, feats]) ** 2).sum(-1)
        grams.append(_normalise(np.exp(-sq / (2 * (5 * rng.chisquare(1) + 0.1)))))
    grams = np.array(grams)
    runs = {}
    for growth in (1, 3):
        monkeypatch.setitem(spicy.GROWTH, "one_step", growth)
        engine = DenseEngine(grams)
        runs[growth] = (spicy.fit(engine, y, 0.05, loss=loss, penalty="elastic_net", lam=LAM, tol=1e-6),
                        engine.stats["passes"])
    (doubling, passes_doubling), (quadrupling, passes) = runs[1], runs[3]
    assert quadrupling.converged and quadrupling.params["method"] == "one_step"
    assert quadrupling.active.size > M // 4  # the regime the rule is for
    assert passes < passes_doubling if loss == "logistic" else passes <= passes_doubling
    assert quadrupling.objective == pytest.approx(doubling.objective, rel=1e-6)


def test_uci_protocol_on_breast_cancer(tmp_path):
    """SpicyMKL §6.1 on breast_cancer: the 27 (d + 1) = 837-kernel SimpleMKL bank, unit trace,
    80/20 split, block 1-norm at C = 0.5, relative gap 0.01 (the paper's Table 4 averages 2 - 8
    outer iterations at C = 0.5 on its UCI sets; benchmarks/bench_spicy.py --uci records all C)."""
    from mklscale.bank import build_bank, families
    from mklscale.datasets import load
    from mklscale.engine import Engine

    ds = load("breast_cancer")
    order = np.random.default_rng(0).permutation(len(ds.y))
    tr, te = order[:455], order[455:]
    bank = build_bank(ds.X[tr], families.simplemkl(ds.X.shape[1]), tmp_path / "uci", progress=False)
    assert len(bank) == 837
    with Engine(bank) as engine:
        for loss in ("logistic", "hinge"):
            res = spicy.fit(engine, ds.y[tr], 0.5, loss=loss, tol=0.01)
            assert res.converged and res.gap <= 0.01
            assert len(res.history) <= 40 and 0 < len(res.active) < 100
            Kc = bank.cross(ds.X[te], kernels=res.active)
            accuracy = np.mean(np.sign(res.decision_function_from_kernels(Kc)) == ds.y[te])
            assert accuracy >= 0.93, (loss, accuracy)
