"""EasyMKL on the real engine over small zarr banks: weights against a direct numpy computation of
the formula, the margin QP against its KKT conditions and cvxpy, the KOMD final model, passes, bad
inputs, the estimator, and (when the MKLpy peer environment exists) MKLpy's own EasyMKL."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _banks import subset_gaussian_bank

from mklscale.bank import KernelBank
from mklscale.engine import Engine
from mklscale.errors import InvalidInputError
from mklscale.solvers import _final_fit, easymkl, registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def scaled():
    """(grams, y): Gaussian kernels with different scales (mean diagonals 0.5 .. 3), so tracenorm matters."""
    grams, y = subset_gaussian_bank(50, 6, 3)
    return grams * np.linspace(0.5, 3.0, len(grams))[:, None, None], y


def engine_of(grams, path):
    return Engine(KernelBank.from_arrays(grams, path, dtype="float64"), threads=1)


def cvxpy_margin(K, y, lam, ridge):
    """argmin over Gamma of (1 - lam) g^T Y K Y g + ridge ||g||^2 with cvxpy (Clarabel)."""
    import cvxpy as cp
    Q = (1 - lam) * np.outer(y, y) * K + ridge * np.eye(y.size)
    g = cp.Variable(y.size, nonneg=True)
    prob = cp.Problem(cp.Minimize(cp.quad_form(g, cp.psd_wrap(Q))), [cp.sum(g[y > 0]) == 1, cp.sum(g[y < 0]) == 1])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return np.maximum(g.value, 0), float(prob.value)


def numpy_weights(grams, y, gamma, scale):
    """w_m = s_m d_m / sum_j d_j, d_m = s_m (y o gamma)^T K_m (y o gamma) (module docstring, step 3)."""
    u = y * gamma
    d = scale * np.einsum("i,mij,j->m", u, grams, u)
    return scale * d / d.sum()


@pytest.mark.parametrize("tracenorm", [False, True])
@pytest.mark.parametrize("lam", [0.05, 0.5, 1.0])
def test_weights_are_the_formula(scaled, tmp_path, lam, tracenorm):
    grams, y = scaled
    n = y.size
    scale = n / np.trace(grams, axis1=1, axis2=2) if tracenorm else np.ones(len(grams))
    with engine_of(grams, tmp_path / "bank") as eng:
        res = easymkl.fit(eng, y, lam=lam, tracenorm=tracenorm)
    K_s = np.einsum("m,mij->ij", scale, grams)
    # exactly the formula at the QP solution the solver uses (same deterministic libsvm call)
    qp = easymkl.margin_qp(K_s, y, lam, lam, 1e-7)
    np.testing.assert_allclose(res.weights, numpy_weights(grams, y, qp["gamma"], scale), rtol=1e-10, atol=1e-14)
    assert res.objective == pytest.approx(qp["objective"], rel=1e-12)
    # and close to the formula at cvxpy's solution of the QP
    g_ref, f_ref = cvxpy_margin(K_s, y, lam, lam)
    assert res.objective == pytest.approx(f_ref, rel=1e-8)
    np.testing.assert_allclose(res.weights, numpy_weights(grams, y, g_ref, scale), rtol=1e-4)
    assert np.sum(res.weights / scale) == pytest.approx(1.0)  # eta sums to one
    if lam == 1.0:  # centroid distance: gamma uniform on each class
        uniform = np.where(y > 0, 1 / np.sum(y > 0), 1 / np.sum(y < 0))
        np.testing.assert_allclose(qp["gamma"], uniform, rtol=1e-6)
    assert res.converged and res.solver == "easymkl" and res.params["tracenorm"] is tracenorm


def test_tracenorm_is_a_no_op_on_unit_diagonal_kernels(tmp_path):
    grams, y = subset_gaussian_bank(40, 5, 0)
    with engine_of(grams, tmp_path / "bank") as eng:
        a = easymkl.fit(eng, y, tracenorm=True)
        b = easymkl.fit(eng, y, tracenorm=False)
    np.testing.assert_allclose(a.weights, b.weights, rtol=1e-12)
    assert a.weights.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("lam, ridge", [(0.1, 0.1), (0.3, 2.0), (0.9, 1e-3)])
def test_margin_qp_kkt_and_cvxpy(scaled, lam, ridge):
    grams, y = scaled
    K = grams.sum(0)
    qp = easymkl.margin_qp(K, y, lam, ridge, 1e-7)
    g = qp["gamma"]
    pos = y > 0
    assert np.all(g >= 0) and g[pos].sum() == pytest.approx(1, abs=1e-14) and g[~pos].sum() == pytest.approx(1, abs=1e-14)
    Q = (1 - lam) * np.outer(y, y) * K + ridge * np.eye(y.size)
    assert qp["objective"] == pytest.approx(g @ Q @ g, rel=1e-12)
    # KKT: grad_i = 2 (Q g)_i >= nu_c on class c, with equality where g_i > 0 (nu_c = min over the class),
    # to libsvm's accuracy (it holds Q in float32: about 1e-7 relative to the largest gradient)
    grad = 2 * Q @ g
    for cls in (pos, ~pos):
        support = cls & (g > 1e-6)
        np.testing.assert_allclose(grad[support], grad[cls].min(), rtol=0, atol=1e-5 * np.abs(grad).max())
    # the reported gap is the Frank-Wolfe bound, and it bounds the true suboptimality
    g_ref, f_ref = cvxpy_margin(K, y, lam, ridge)
    assert qp["objective"] == pytest.approx(f_ref, rel=1e-8)
    assert (qp["objective"] - f_ref) / qp["objective"] <= qp["gap"] + 1e-12 and qp["gap"] < 1e-4
    np.testing.assert_allclose(g, g_ref, atol=1e-5)


def test_komd_final_model_and_predictions(scaled, tmp_path):
    grams, y = scaled
    tr, te = np.arange(36), np.arange(36, y.size)
    with engine_of(np.ascontiguousarray(grams[:, tr][:, :, tr]), tmp_path / "bank") as eng:
        res = easymkl.fit(eng, y[tr], lam=0.2, komd_lam=0.3)
    K = np.einsum("m,mij->ij", res.weights, grams[:, tr][:, :, tr])
    n_pos = np.sum(y[tr] > 0)
    g, _ = cvxpy_margin(K, y[tr], 0.3, 0.3 * n_pos * (tr.size - n_pos) / tr.size)
    np.testing.assert_allclose(res.dual_coef, y[tr] * g, atol=1e-5)
    b = 0.5 * g @ K @ (y[tr] * g)  # KOMD's midpoint bias, f = K Y g - b
    assert res.bias == pytest.approx(-b, abs=1e-5)
    K_cross = np.einsum("m,mij->ij", res.weights, grams[:, te][:, :, tr])
    f_ref = K_cross @ (y[tr] * g) - b
    f = res.decision_function_from_kernels(grams[:, te][:, :, tr][res.active])
    np.testing.assert_allclose(f, f_ref, atol=1e-5)
    assert np.array_equal(np.sign(f), np.sign(f_ref)) and np.mean(np.sign(f) == y[te]) >= 0.7
    assert res.params["komd_gap"] < 1e-4


def test_svm_learner_is_the_final_fit_svm(scaled, tmp_path):
    grams, y = scaled
    with engine_of(grams, tmp_path / "bank") as eng:
        res = easymkl.fit(eng, y, learner="svm", svm_C=5.0)
        komd = easymkl.fit(eng, y)
    np.testing.assert_array_equal(res.weights, komd.weights)  # the learner changes only the final model
    c, b, _ = _final_fit.svm(np.einsum("m,mij->ij", res.weights, grams), y, 5.0)
    np.testing.assert_allclose(res.dual_coef, c, atol=1e-10)
    assert res.bias == pytest.approx(b, abs=1e-10)


def test_three_passes(scaled, tmp_path):
    """combine (sum kernel) + quad_forms (weights) + combine (final kernel): three reads of the bank."""
    grams, y = scaled
    with engine_of(grams, tmp_path / "bank") as eng:
        res = easymkl.fit(eng, y)
        stats = eng.stats
    assert stats["passes"] == 3 == res.history[-1]["passes"]
    assert [e["op"] for e in stats["log"]] == ["combine", "quad_forms", "combine"]
    assert stats["kernels_read"] == 3 * len(grams)


def test_bad_inputs(scaled, tmp_path):
    grams, y = scaled
    with engine_of(grams, tmp_path / "bank") as eng:
        with pytest.raises(InvalidInputError, match=r"lam must lie in \(0, 1\].*hard-margin"):
            easymkl.fit(eng, y, lam=0.0)
        with pytest.raises(InvalidInputError, match=r"komd_lam must lie in \(0, 1\]"):
            easymkl.fit(eng, y, komd_lam=1.5)
        with pytest.raises(InvalidInputError, match="unknown learner 'ridge'"):
            easymkl.fit(eng, y, learner="ridge")
        with pytest.raises(InvalidInputError, match="tracenorm must be True or False"):
            easymkl.fit(eng, y, tracenorm="yes")
        with pytest.raises(InvalidInputError, match=r"\{-1, \+1\}.*Map the classes"):
            easymkl.fit(eng, (y > 0).astype(float))
        with pytest.raises(InvalidInputError, match="both classes"):
            easymkl.fit(eng, np.ones(y.size))
        with pytest.raises(InvalidInputError, match="y has 3 entries"):
            easymkl.fit(eng, y[:3])
        with pytest.raises(InvalidInputError, match="does not support regression"):
            registry.fit_solver("easymkl", eng, y, "regression")
        assert eng.stats["passes"] == 0  # every refusal comes before the bank is read


def test_zero_kernel_refused_under_tracenorm(tmp_path):
    grams, y = subset_gaussian_bank(30, 3, 1)
    grams[1] = 0.0
    with engine_of(grams, tmp_path / "bank") as eng:
        with pytest.raises(InvalidInputError, match=r"kernel\(s\) \[1\] have trace <= 0.*tracenorm=False"):
            easymkl.fit(eng, y)
        res = easymkl.fit(eng, y, tracenorm=False)
    assert res.weights[1] == 0.0 and res.active.tolist() == [0, 2]


def test_registry_maps_C_to_lam(scaled, tmp_path):
    grams, y = scaled
    with engine_of(grams, tmp_path / "bank") as eng:
        a = registry.fit_solver("easymkl", eng, y, "classification", C=0.3, params={"learner": "svm"})
        b = easymkl.fit(eng, y, lam=0.3, learner="svm")
    np.testing.assert_array_equal(a.weights, b.weights)
    reg = registry.regularisation("easymkl", "classification")
    assert a.params["lam"] == 0.3 and reg.name == "lam" and reg.default == 0.1 and reg.scale_text == "1"


def test_estimator(tmp_path):
    from mklscale import MKLClassifier
    from mklscale.bank import families

    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 4))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] ** 2 > 0.4, "yes", "no")
    est = MKLClassifier(kernels=families.gaussian([0.5, 2, 8]), solver="easymkl", C=0.2,
                        cache_dir=tmp_path / "cache").fit(X[:60], y[:60])
    assert est.result_.solver == "easymkl" and est.result_.params["lam"] == 0.2
    assert est.score(X[60:], y[60:]) >= 0.8
    assert est.result_.weights.sum() == pytest.approx(60, rel=1e-5)  # unit-trace kernels: scale n, sum eta = 1


# ---- MKLpy itself (only where the peer environment of benchmarks/peers exists) ----------------------
MKLPY_PY = Path(os.environ.get("MKLPY_VENV", ROOT / "benchmarks" / "peers" / ".venv")) / "bin" / "python"

PEER = """
import json, sys, numpy as np, torch
from MKLpy.algorithms import EasyMKL, FHeuristic
from sklearn.svm import SVC
z = np.load(sys.argv[1])
KL = [torch.tensor(K) for K in z["Ktr"]]; KT = [torch.tensor(K) for K in z["Kte"]]
Y = torch.tensor(z["y"].astype(np.int64))
out = {}
for lam in (0.1, 0.5):
    m = EasyMKL(lam=lam).fit(KL, Y)
    out[str(lam)] = {"w": m.solution.weights.double().numpy().tolist(),
                     "f": np.asarray(m.decision_function(KT)).ravel().tolist()}
m = FHeuristic(learner=SVC(C=10.0)).fit(KL, Y)
out["fheuristic"] = {"w": m.solution.weights.double().numpy().tolist(),
                     "f": np.asarray(m.decision_function(KT)).ravel().tolist()}
print(json.dumps(out))
"""


@pytest.mark.skipif(not MKLPY_PY.exists(), reason="no MKLpy environment (bash benchmarks/peers/setup_mklpy_venv.sh)")
def test_weights_match_mklpy(scaled, tmp_path):
    """MKLpy 0.6 on the same kernels (not unit-diagonal: tracenorm=False is MKLpy's convention): the
    weights agree to MKLpy's float32 weight vector, and so do the decision values on held-out rows
    (MKLpy's KOMD uses cvxopt, ours libsvm)."""
    from mklscale.solvers import fheuristic

    grams, y = scaled
    tr, te = np.arange(36), np.arange(36, y.size)
    Ktr, Kte = np.ascontiguousarray(grams[:, tr][:, :, tr]), np.ascontiguousarray(grams[:, te][:, :, tr])
    np.savez(tmp_path / "k.npz", Ktr=Ktr, Kte=Kte, y=y[tr])
    run = subprocess.run([str(MKLPY_PY), "-c", PEER, str(tmp_path / "k.npz")], capture_output=True, text=True,
                         timeout=300, check=True)
    peer = json.loads(run.stdout.strip().splitlines()[-1])
    with engine_of(Ktr, tmp_path / "bank") as eng:
        for lam in (0.1, 0.5):
            res = easymkl.fit(eng, y[tr], lam=lam, tracenorm=False)
            np.testing.assert_allclose(res.weights, peer[str(lam)]["w"], rtol=1e-5, atol=1e-7)
            f = res.decision_function_from_kernels(Kte[res.active])
            np.testing.assert_allclose(f, peer[str(lam)]["f"], atol=1e-4)
        res = fheuristic.fit(eng, y[tr], C=10.0)
    np.testing.assert_allclose(res.weights, peer["fheuristic"]["w"], rtol=1e-5, atol=1e-7)
    f = res.decision_function_from_kernels(Kte[res.active])
    np.testing.assert_allclose(f, peer["fheuristic"]["f"], atol=1e-2)  # libsvm tol 1e-3 on both sides
