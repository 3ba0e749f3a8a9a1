"""sample_weight and class_weight: per-row weights of the final fit (libsvm's per-sample C; the weighted kernel
ridge), for the solvers whose final fit takes them, and a clear refusal naming them for the others."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.svm import SVC
from sklearn.utils.class_weight import compute_sample_weight

from mklscale import MKLClassifier, MKLClassifierCV, MKLRegressor, datasets
from mklscale.bank import KernelBank
from mklscale.errors import InvalidInputError
from mklscale.solvers import _final_fit, registry

KERNELS = [{"family": "gaussian", "widths": [4.0], "features": "all"}, {"family": "linear", "features": "all"}]


@pytest.fixture(scope="module")
def cancer():
    ds = datasets.load("breast_cancer", standardise=False)
    return ds.X[::2], ds.y[::2]


def _grams(est):
    bank = KernelBank.open(est.fit_stats_["bank"])
    return np.asarray([bank.kernel(m) for m in range(len(bank))], dtype=np.float64)


def test_uniform_svm_with_sample_weight_is_libsvms(cancer, tmp_path):
    X, y = cancer
    w = np.random.default_rng(0).uniform(0.2, 3.0, size=y.size)
    est = MKLClassifier(kernels=KERNELS, solver="uniform", C=50.0, cache_dir=tmp_path).fit(X, y, sample_weight=w)
    K = _grams(est).mean(axis=0)
    svc = SVC(C=50.0, kernel="precomputed").fit(K, np.where(y == est.classes_[1], 1, -1), sample_weight=w)
    np.testing.assert_allclose(est.result_.dual_coef @ K + est.result_.bias, svc.decision_function(K), atol=1e-6)
    unweighted = MKLClassifier(kernels=KERNELS, solver="uniform", C=50.0, cache_dir=tmp_path).fit(X, y)
    assert not np.allclose(unweighted.result_.dual_coef, est.result_.dual_coef)


def test_class_weight_balanced_is_the_balanced_sample_weight(cancer, tmp_path):
    X, y = cancer
    kw = dict(kernels=KERNELS, solver="alignment", cache_dir=tmp_path)
    balanced = MKLClassifier(class_weight="balanced", **kw).fit(X, y)
    by_hand = MKLClassifier(**kw).fit(X, y, sample_weight=compute_sample_weight("balanced", y))
    np.testing.assert_allclose(balanced.decision_function(X), by_hand.decision_function(X))
    both = MKLClassifier(class_weight={-1.0: 2.0, 1.0: 1.0}, **kw).fit(X, y, sample_weight=np.full(y.size, 0.5))
    once = MKLClassifier(**kw).fit(X, y, sample_weight=np.where(y < 0, 1.0, 0.5))
    np.testing.assert_allclose(both.decision_function(X), once.decision_function(X))
    cv = MKLClassifierCV(class_weight="balanced", Cs=3, **kw).fit(X, y)
    assert cv.C_ in cv.Cs_


def test_weighted_kernel_ridge_solves_the_weighted_problem():
    """The bordered system [[K + lam W^-1, 1], [1^T, 0]] gives the minimiser of
    sum_i w_i (K c + b - y)_i^2 + lam c^T K c: its gradient vanishes."""
    rng = np.random.default_rng(1)
    A = rng.standard_normal((30, 5))
    K, y, w, lam = A @ A.T, rng.standard_normal(30), rng.uniform(0.5, 2.0, 30), 0.3
    c, b = _final_fit.kernel_ridge(K, y, lam, w)
    r = K @ c + b - y
    np.testing.assert_allclose(2 * K @ (w * r) + 2 * lam * K @ c, 0.0, atol=1e-9)
    assert abs(float(np.sum(w * r))) < 1e-9


def test_regressor_weights(tmp_path):
    ds = datasets.load("diabetes", standardise=False)
    w = np.linspace(0.5, 2.0, ds.y.size)
    est = MKLRegressor(kernels=KERNELS, solver="uniform", cache_dir=tmp_path).fit(ds.X, ds.y, sample_weight=w)
    plain = MKLRegressor(kernels=KERNELS, solver="uniform", cache_dir=tmp_path).fit(ds.X, ds.y)
    assert not np.allclose(est.predict(ds.X), plain.predict(ds.X))
    with pytest.raises(InvalidInputError, match="must be > 0 for regression"):
        MKLRegressor(kernels=KERNELS, solver="uniform", cache_dir=tmp_path).fit(ds.X, ds.y,
                                                                                sample_weight=np.r_[0.0, w[1:]])


@pytest.mark.parametrize("solver,params", [("spicy", None), ("smo", None), ("gcd", None), ("easymkl", None)])
def test_solvers_without_a_weighted_final_fit_refuse_by_name(cancer, tmp_path, solver, params):
    X, y = cancer
    with pytest.raises(InvalidInputError, match=r"does not take sample_weight.*\['gcd', 'uniform', 'alignment', "
                                                r"'fheuristic'\]"):
        MKLClassifier(kernels=KERNELS, solver=solver, class_weight="balanced", cache_dir=tmp_path / "c").fit(X, y)
    assert not (tmp_path / "c").exists()          # refused before any bank was built
    assert registry.info("gcd").sample_weights    # gcd with stage='two' takes them
    MKLClassifier(kernels=KERNELS, solver="gcd", solver_params={"stage": "two"}, class_weight="balanced",
                  cache_dir=tmp_path).fit(X, y)
