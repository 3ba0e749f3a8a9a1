"""MKLClassifierCV / MKLRegressorCV and the one CV core (mklscale.solvers.cv): the regularisation chosen by
k-fold cross-validation on one bank, each fold a warm-started path over the grid, then refitted at C_."""

from __future__ import annotations

import numpy as np
import pytest
from _dense_engine import DenseEngine
from sklearn.base import clone
from sklearn.model_selection import KFold, ShuffleSplit, StratifiedKFold

import mklscale
from mklscale import MKLClassifier, MKLClassifierCV, MKLRegressor, MKLRegressorCV, datasets
from mklscale.engine import InMemoryEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers import cv, registry

KERNELS = [{"family": "gaussian", "widths": [2.0, 8.0], "features": "all"}, {"family": "linear", "features": "each"}]


@pytest.fixture(scope="module")
def cancer():
    ds = datasets.load("breast_cancer", standardise=False)
    return ds.X[::3], ds.y[::3]           # 190 rows, 30 features


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def spicy_cv(cancer, cache):
    X, y = cancer
    return MKLClassifierCV(kernels=KERNELS, Cs=6, cv=3, random_state=1, cache_dir=cache).fit(X, y)


def test_the_choice_is_the_best_mean_fold_score_and_the_model_is_the_refit_at_it(spicy_cv, cancer, cache):
    X, y = cancer
    est, res = spicy_cv, spicy_cv.cv_results_
    assert est.Cs_.size == 6 and np.all(np.diff(est.Cs_) < 0)          # from C_max down: most regularised first
    folds = np.column_stack([res[f"split{k}_test_score"] for k in range(3)])
    np.testing.assert_allclose(res["mean_test_score"], folds.mean(axis=1))
    np.testing.assert_allclose(res["std_test_score"], folds.std(axis=1))
    best = int(np.flatnonzero(res["mean_test_score"] == np.nanmax(res["mean_test_score"]))[0])   # ties: larger C
    assert est.C_ == est.Cs_[best] == res["param_C"][est.best_index_] and est.best_score_ == res["mean_test_score"][best]
    assert res["rank_test_score"][best] == 1
    plain = MKLClassifier(kernels=KERNELS, C=est.C_, random_state=1, cache_dir=cache).fit(X, y)
    np.testing.assert_allclose(est.decision_function(X), plain.decision_function(X), atol=1e-8)
    assert est.fit_stats_["C"] == est.C_ and plain.fit_stats_["kernels_built"] == 0    # one bank for CV and refit
    assert plain.fit_stats_["bank"] == est.fit_stats_["bank"]


def test_fold_scores_are_those_of_fits_on_the_fold_rows(cancer, cache):
    """Every fold score of the CV core equals a cold fit on the principal submatrices of the fold's training
    rows (an in-memory engine), scored on its held-out rows (uniform: no warm start, exact)."""
    X, y = cancer
    est = MKLClassifierCV(kernels=KERNELS, solver="uniform", Cs=[1.0, 30.0, 1000.0], cv=3, random_state=2,
                          cache_dir=cache).fit(X, y)
    bank = mklscale.bank.KernelBank.open(est.fit_stats_["bank"])
    grams = np.asarray([bank.kernel(m) for m in range(len(bank))], dtype=np.float64)
    labels = np.where(y == est.classes_[1], 1.0, -1.0)
    fold = cv.fold_assignment(y, 3, True, 2)
    for i, C in enumerate(est.Cs_):
        for k in range(3):
            tr, te = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
            r = registry.fit_solver("uniform", InMemoryEngine(grams[:, tr][:, :, tr]), labels[tr], "classification", C=C)
            f = np.einsum("m,mij,j->i", r.weights, grams[:, te][:, :, tr], r.dual_coef) + r.bias
            assert est.cv_results_[f"split{k}_test_score"][i] == pytest.approx(np.mean((f > 0) == (labels[te] > 0)))


@pytest.mark.parametrize("solver,params", [("spicy", {}), ("smo", {}), ("pfbs", {}), ("citi", {"tol": 1e-4}),
                                           ("gcd", {})])
def test_a_warm_started_path_reaches_every_cold_optimum(solver, params):
    """Along a path (registry.fit_path) each solve starts from the previous solution; each result is
    certified to the solver's tolerance and its objective is that of a cold solve to within both gaps."""
    from _banks import subset_gaussian_bank

    grams, y = subset_gaussian_bank(50, 8, seed=4)
    grams /= np.trace(grams, axis1=1, axis2=2)[:, None, None]
    task = "classification" if solver != "gcd" else "regression"
    engine = DenseEngine(grams)
    grid, _ = registry.regularisation(solver, task, params).grid(engine, [y], task, params, 5)
    warm = registry.fit_path(solver, engine, y, task, grid, params)
    for value, w in zip(grid, warm):
        cold = registry.fit_solver(solver, engine, y, task, C=value, params=params)
        assert w.converged and cold.converged
        assert abs(w.objective - cold.objective) <= (w.gap + cold.gap) * abs(cold.objective) + 1e-9


def test_one_vs_rest_and_regression(cache):
    iris = datasets.load("iris", standardise=False)
    est = MKLClassifierCV(kernels="auto", Cs=4, cv=3, cache_dir=cache).fit(iris.X, iris.y)
    assert len(est.result_) == 3 and est.best_score_ > 0.9 and est.C_ in est.Cs_
    diabetes = datasets.load("diabetes", standardise=False)
    reg = MKLRegressorCV(kernels="auto", Cs=5, cache_dir=cache).fit(diabetes.X, diabetes.y)
    assert reg.cv_results_["scoring"] == "r2" and 0.3 < reg.best_score_ < 0.7
    neg = MKLRegressorCV(kernels="auto", Cs=5, scoring="neg_mean_squared_error", cache_dir=cache).fit(diabetes.X,
                                                                                                     diabetes.y)
    assert neg.best_score_ < 0


def test_splitters_and_grids(cancer, cache):
    X, y = cancer
    kw = dict(kernels=KERNELS, solver="uniform", cache_dir=cache)
    a = MKLClassifierCV(cv=StratifiedKFold(3, shuffle=True, random_state=0), Cs=3, **kw).fit(X, y)
    b = MKLClassifierCV(cv=StratifiedKFold(3, shuffle=True, random_state=0), Cs=3, **kw).fit(X, y)
    np.testing.assert_array_equal(a.cv_results_["mean_test_score"], b.cv_results_["mean_test_score"])
    assert MKLClassifierCV(cv=KFold(4), Cs=[10.0, 100.0], **kw).fit(X, y).Cs_.tolist() == [10.0, 100.0]
    auto = MKLClassifierCV(Cs="auto", **kw).fit(X, y)          # one value: "auto" scored by CV
    assert auto.Cs_.size == 1 and auto.C_ == pytest.approx(MKLClassifier(**kw).fit(X, y).C_)
    with pytest.raises(InvalidInputError, match="two test folds|partition"):
        MKLClassifierCV(cv=ShuffleSplit(3, test_size=0.5, random_state=0), **kw).fit(X, y)
    with pytest.raises(InvalidInputError, match="not a valid regularisation"):
        MKLClassifierCV(Cs=[1.0, -2.0], **kw).fit(X, y)
    with pytest.raises(InvalidInputError, match="cv = 200 folds"):
        MKLClassifierCV(cv=200, **kw).fit(X, y)
    with pytest.raises(InvalidInputError, match="scoring"):
        MKLClassifierCV(scoring="r2", **kw).fit(X, y)


def test_sklearn_protocol_and_model_files(spicy_cv, cancer, tmp_path):
    X, y = cancer
    params = clone(spicy_cv).get_params()
    assert params["Cs"] == 6 and params["cv"] == 3 and "C" not in params
    spicy_cv.save(tmp_path / "model")
    loaded = mklscale.load(tmp_path / "model")
    assert type(loaded) is MKLClassifierCV
    np.testing.assert_allclose(loaded.decision_function(X), spicy_cv.decision_function(X))


def test_the_registry_rows_say_what_C_means():
    """One place per solver: name, direction, bounds, scale; c_names follows from the rows."""
    assert registry.c_names("gcd") == ("lam", "C") and registry.c_names("uniform") == ("C", "lam")
    assert registry.c_names("pfbs") == ("tau",) and registry.c_names("easymkl") == ("lam",)
    spicy = registry.regularisation("spicy", "classification")
    assert spicy.larger_regularises and spicy.scale_text == "C_max" and spicy.check(0.0, "spicy")
    svm = registry.regularisation("smo", "classification")
    assert not svm.larger_regularises and svm.order([1.0, 100.0, 10.0]) == [1.0, 10.0, 100.0]
    tau = registry.regularisation("pfbs", "regression")
    assert tau.zero_ok and tau.check(0.0, "pfbs") is None and tau.order([0.1, 0.01, 1.0]) == [1.0, 0.1, 0.01]
    assert registry.regularisation("gcd", "classification", {"stage": "two"}).name == "C"
    assert registry.regularisation("gcd", "classification").name == "lam"


def test_a_path_stops_past_its_peak_not_on_a_flat_start():
    assert not cv.past_peak([0.5, 0.5, 0.5, 0.5, 0.5], 2)          # the constant models' plateau goes on
    assert cv.past_peak([0.5, 0.8, 0.9, 0.9, 0.9], 2)              # a plateau at the top stops too
    assert cv.past_peak([0.5, 0.8, 0.9, 0.88, 0.87], 2)            # two values below the best: stop
    assert not cv.past_peak([0.5, 0.8, 0.9, 0.88, 0.91], 2)
    assert not cv.past_peak([0.5, 0.8, 0.9, 0.88, 0.87], None)     # patience=None: every value


def test_every_fold_scores_the_values_before_its_peak_and_the_choice_is_among_those_all_reached(cancer, cache):
    X, y = cancer
    est = MKLClassifierCV(kernels=KERNELS, Cs=10, cv=3, random_state=1, cache_dir=cache).fit(X, y)
    folds = np.column_stack([est.cv_results_[f"split{k}_test_score"] for k in range(3)])
    reached = np.isfinite(folds)
    assert reached[0].all() and np.all(np.diff(reached.astype(int), axis=0) <= 0)   # a prefix of the grid per fold
    assert np.isfinite(est.cv_results_["mean_test_score"][est.best_index_])
    full = MKLClassifierCV(kernels=KERNELS, Cs=10, cv=3, random_state=1, cache_dir=cache)
    full_scores = cv.cross_validate("spicy", *_engine_and_y(full, X, y), est.Cs_, {}, est.classes_, patience=None,
                                    fold=cv.fold_assignment(y, 3, True, 1))
    np.testing.assert_array_equal(folds[reached], full_scores.scores[reached])   # the same warm path, stopped
    # fit times: one per solve a path made, within its fold's time; scikit-learn's means over the folds
    timed = np.isfinite(full_scores.fit_seconds)
    np.testing.assert_array_equal(timed, np.isfinite(full_scores.scores))
    assert np.all(full_scores.fit_seconds[timed] > 0)
    assert np.all(np.nansum(full_scores.fit_seconds, axis=0) <= full_scores.seconds)
    mean_fit = est.cv_results_["mean_fit_time"]
    np.testing.assert_array_equal(np.isfinite(mean_fit), reached.any(axis=1))
    assert np.all(mean_fit[reached.any(axis=1)] > 0) and np.all(est.cv_results_["std_fit_time"][reached.any(axis=1)] >= 0)


def _engine_and_y(est, X, y):
    from mklscale.engine import Engine

    fitted = est.fit(X, y)
    engine = Engine(fitted.fit_stats_["bank"])
    return engine, y, "classification"
