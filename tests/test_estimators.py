"""MKLClassifier / MKLRegressor as scikit-learn estimators, and the solver registry behind them.

scikit-learn's estimator checks (``parametrize_with_checks``) run in full on three small, fast
configurations (2 Gaussian kernels): the classifier with spicy (logistic loss, so predict_proba
exists), the classifier with the uniform baseline (no predict_proba: exercises ``available_if``) and
the regressor with spicy (square loss). No check is skipped;
``expected_failed_checks`` returns only sample-weight checks. (``check_array_api_input`` skips itself unless
SCIPY_ARRAY_API is set.) The sample-weight checks are expected to fail where the solver refuses
weights (spicy) and, for the uniform baseline, the weights-equal-repeated-rows check (``_expected_failed_checks``
says why).
Every fit of the checks builds its bank in one temporary cache directory, removed at the end.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from mklscale import MKLClassifier, MKLRegressor, datasets
from mklscale.bank import KernelBank, KernelSpec, build_bank, families
from mklscale.errors import InvalidInputError, SpecError
from mklscale.solvers import registry

TWO = {"family": "gaussian", "widths": [1, 2], "features": "all"}
_CHECK_CACHE = tempfile.mkdtemp(prefix="mklscale-estimator-checks-")


@pytest.fixture(scope="module", autouse=True)
def _remove_check_cache():
    yield
    shutil.rmtree(_CHECK_CACHE, ignore_errors=True)


#: the checks that fit with sample_weight / class_weight: spicy (the default solver) refuses per-sample weights
#: (registry.check_sample_weight names the solvers whose final fit takes them), by design
_WEIGHT_CHECKS = ("check_sample_weights_pandas_series", "check_sample_weights_not_an_array",
                  "check_sample_weights_list", "check_all_zero_sample_weights_error", "check_sample_weights_shape",
                  "check_sample_weights_not_overwritten", "check_sample_weight_equivalence_on_dense_data",
                  "check_classifiers_one_label_sample_weights", "check_class_weight_classifiers")


def _expected_failed_checks(estimator) -> dict[str, str]:
    """Only sample weights: spicy refuses them; for the uniform baseline an integer weight is not the same as
    repeating the row, since every kernel is normalised to unit trace over the training rows (a repeated
    row changes the trace, hence the kernel's scale)."""
    if estimator.solver == "spicy":
        return {name: "spicy takes no sample_weight (registry.check_sample_weight)" for name in _WEIGHT_CHECKS}
    return {"check_sample_weight_equivalence_on_dense_data":
            "unit-trace normalisation over the training rows: a repeated row changes every kernel's scale"}


@parametrize_with_checks(
    [MKLClassifier(kernels=TWO, cache_dir=_CHECK_CACHE),
     MKLClassifier(kernels=TWO, solver="uniform", cache_dir=_CHECK_CACHE),
     MKLRegressor(kernels=TWO, cache_dir=_CHECK_CACHE)],
    expected_failed_checks=_expected_failed_checks,
)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# ---- data ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cancer():
    ds = datasets.load("breast_cancer", standardise=False)
    return ds.X[:80, :8], ds.y[:80], ds.X[300:400, :8], ds.y[300:400]


@pytest.fixture(scope="module")
def diabetes():
    ds = datasets.load("diabetes", standardise=False)
    y = (ds.y - ds.y.mean()) / ds.y.std()
    return ds.X[:120], y[:120], ds.X[300:400], y[300:400]


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


# ---- scikit-learn integration ---------------------------------------------------------------------
def test_pipeline_gridsearch_and_clone(cancer, cache):
    X, y, Xt, yt = cancer
    pipe = Pipeline([("scale", StandardScaler()),
                     ("mkl", MKLClassifier(kernels=TWO, solver="uniform", cache_dir=cache))])
    search = GridSearchCV(pipe, {"mkl__C": [0.01, 100.0]}, cv=3).fit(X, y)
    assert search.best_params_ == {"mkl__C": 100.0}  # C = 0.01 barely fits unit-trace kernels
    assert search.score(Xt, yt) > 0.85
    est = search.best_estimator_.named_steps["mkl"]
    twin = clone(est)
    assert twin.get_params() == est.get_params() and not hasattr(twin, "model_")


def test_binary_attributes_and_bank_reuse(cancer, cache):
    X, y, Xt, yt = cancer
    specs = families.gaussian([0.5, 2.0, 5.0]) + families.polynomial([1, 2])
    first = MKLClassifier(kernels=specs, solver="smo", cache_dir=cache).fit(X, y)
    assert first.fit_stats_["kernels_built"] == len(specs)
    second = MKLClassifier(kernels=specs, solver="smo", C=10.0, cache_dir=cache).fit(X, y)
    assert second.fit_stats_["kernels_built"] == 0
    assert second.fit_stats_["bank"] == first.fit_stats_["bank"]
    third = MKLClassifier(kernels=specs, solver="smo", cache_dir=cache).fit(X[:-1], y[:-1])
    assert third.fit_stats_["kernels_built"] == len(specs) and third.fit_stats_["bank"] != first.fit_stats_["bank"]

    assert first.score(Xt, yt) > 0.85
    np.testing.assert_array_equal(first.classes_, [-1.0, 1.0])
    w = first.kernel_weights_
    assert isinstance(w, pd.Series) and list(w.index) == first.selected_kernels_
    np.testing.assert_array_equal(w.to_numpy(), first.result_.weights[first.result_.active])
    assert set(first.fit_stats_) >= {"passes", "bytes_read", "seconds", "bank", "kernels_built"}
    f = first.decision_function(Xt)
    np.testing.assert_array_equal(first.predict(Xt), np.where(f > 0, 1.0, -1.0))
    assert not hasattr(first, "predict_proba")
    with pytest.raises(AttributeError, match="has no attribute 'predict_proba'") as excinfo:
        first.predict_proba(Xt)
    assert "solver='spicy' with loss='logistic'" in str(excinfo.value.__cause__)


def test_cached_bank_of_another_kernel_arithmetic_is_not_reused(cancer, cache, monkeypatch):
    """The bank cache is keyed by the kernel arithmetic version too: after an upgrade that changes
    the stored bytes, a fit builds a bank of its own instead of reusing (or failing to resume) one
    the older version left."""
    from mklscale.bank import _compute

    X, y, _, _ = cancer
    specs = families.gaussian([0.5, 2.0])
    first = MKLClassifier(kernels=specs, solver="uniform", cache_dir=cache).fit(X, y)
    monkeypatch.setattr(_compute, "ARITHMETIC", _compute.ARITHMETIC + 1)
    later = MKLClassifier(kernels=specs, solver="uniform", cache_dir=cache).fit(X, y)
    assert later.fit_stats_["kernels_built"] == len(specs) and later.fit_stats_["bank"] != first.fit_stats_["bank"]
    assert KernelBank.open(later.fit_stats_["bank"]).attrs["arithmetic"] == _compute.ARITHMETIC


def test_multiclass_one_vs_rest_on_iris_with_string_labels(cache):
    ds = datasets.load("iris", standardise=False)
    labels = np.array(["setosa", "versicolor", "virginica"])[ds.y]
    X, Xt, y, yt = train_test_split(ds.X, labels, train_size=90, stratify=labels, random_state=0)
    est = MKLClassifier(kernels=families.gaussian([0.5, 1, 2]) + families.linear(), C=0.01, cache_dir=cache).fit(X, y)
    assert est.score(Xt, yt) > 0.9
    np.testing.assert_array_equal(est.classes_, ["setosa", "versicolor", "virginica"])
    assert isinstance(est.result_, list) and len(est.result_) == 3
    F = est.decision_function(Xt)
    assert F.shape == (len(Xt), 3)
    np.testing.assert_array_equal(est.predict(Xt), est.classes_[F.argmax(axis=1)])
    P = est.predict_proba(Xt)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(P.argmax(axis=1), F.argmax(axis=1))
    W = est.kernel_weights_
    assert isinstance(W, pd.DataFrame) and W.shape == (3, len(est.selected_kernels_))
    assert list(W.index) == list(est.classes_)
    # a label never seen at fit is never predicted; score just counts those rows as wrong
    y_unseen = yt.copy()
    y_unseen[:5] = "unknown"
    assert set(est.predict(Xt)) <= set(est.classes_)
    assert est.score(Xt, y_unseen) == pytest.approx(np.mean(est.predict(Xt) == y_unseen))


def test_regressor_on_diabetes(diabetes, cache):
    X, y, Xt, yt = diabetes
    est = MKLRegressor(kernels="linear", cache_dir=cache).fit(X, y)
    assert len(est.selected_kernels_) < X.shape[1] + 1  # the block-1 penalty drops kernels
    assert est.score(Xt, yt) > 0.3
    assert not hasattr(est, "decision_function") and not hasattr(est, "predict_proba")


# ---- every solver of the registry ----------------------------------------------------------------
SOLVER_PARAMS = {"sgd": {"T": 200}, "citi": {"eta": 1.0}}


def _same_as_the_solver_on_the_bank(est, y01, task):
    """The estimator returns the solver's own solution: the registry's fit on the estimator's bank, with
    the estimator's parameters and targets, gives the same weights, coefficients and objective (a score
    threshold alone would pass a solver that returns the uniform baseline)."""
    import warnings

    from mklscale.bank import KernelBank
    from mklscale.engine import Engine

    y = np.where(y01 == est.classes_[1], 1.0, -1.0) if task == "classification" else np.asarray(y01, float)
    params = dict(est.fit_stats_.get("solver_params", est.model_.info["solver_params"]))
    with Engine(KernelBank.open(est.fit_stats_["bank"]), threads=1) as engine, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct = registry.fit_solver(est.solver, engine, y, task, C=est.C, params=params)
    np.testing.assert_allclose(est.result_.weights, direct.weights, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(est.result_.dual_coef, direct.dual_coef, rtol=1e-9, atol=1e-12)
    assert est.result_.objective == pytest.approx(direct.objective, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("solver", registry.names())
def test_every_registry_solver_classifies(solver, cancer, cache):
    X, y, Xt, yt = cancer
    est = MKLClassifier(kernels=families.gaussian([1, 3, 8]), solver=solver, solver_params=SOLVER_PARAMS.get(solver),
                        cache_dir=cache, random_state=0).fit(X, y)
    assert est.score(Xt, yt) > 0.85
    assert est.model_.heads[0]["solver"] == est.result_.solver
    _same_as_the_solver_on_the_bank(est, y, "classification")


@pytest.mark.parametrize("solver", [n for n in registry.names() if registry.supports(n, "regression")])
def test_every_regression_solver_regresses(solver, diabetes, cache):
    X, y, Xt, yt = diabetes
    est = MKLRegressor(kernels=families.linear() + families.gaussian([2, 8]), solver=solver,
                       solver_params=SOLVER_PARAMS.get(solver), cache_dir=cache, random_state=0).fit(X, y)
    assert est.score(Xt, yt) > 0.3
    _same_as_the_solver_on_the_bank(est, y, "regression")


def test_gcd_two_stage(cancer, cache):
    X, y, Xt, yt = cancer
    est = MKLClassifier(kernels=families.gaussian([1, 3, 8]), solver="gcd", solver_params={"stage": "two"},
                        cache_dir=cache).fit(X, y)
    assert est.result_.solver == "gcd-2s/alignment" and est.score(Xt, yt) > 0.85
    with pytest.raises(InvalidInputError, match="stage='two'"):
        MKLClassifier(kernels=TWO, solver="gcd", solver_params={"criterion": "alignment"}, cache_dir=cache).fit(X, y)


def test_solver_errors(cancer, cache):
    X, y, _, _ = cancer
    with pytest.raises(InvalidInputError, match=r"does not take parameter\(s\) \['nonsense'\].*remove it or use one of"):
        MKLClassifier(kernels=TWO, solver="smo", solver_params={"nonsense": 1}, cache_dir=cache).fit(X, y)
    with pytest.raises(InvalidInputError, match="does not support regression"):
        MKLRegressor(kernels=TWO, solver="smo", cache_dir=cache).fit(X, y)
    with pytest.raises(InvalidInputError, match="unknown solver 'newton'"):
        MKLClassifier(kernels=TWO, solver="newton", cache_dir=cache).fit(X, y)
    with pytest.raises(InvalidInputError, match="does not fit task 'classification'"):
        MKLClassifier(kernels=TWO, solver_params={"loss": "square"}, cache_dir=cache).fit(X, y)
    assert not list(cache.glob("bank-*")), "a bad solver setting must fail before any bank is built"


def test_registry_table():
    assert registry.names() == ["spicy", "citi", "smo", "pfbs", "sgd", "gcd", "uniform", "alignment",
                                "fheuristic", "easymkl"]
    assert registry.supports("fheuristic", "regression") and not registry.supports("easymkl", "regression")
    assert registry.c_parameter("easymkl", "classification") == "lam"
    assert registry.c_parameter("fheuristic", "classification") == "C"
    assert registry.supports("smo", "classification") and not registry.supports("smo", "regression")
    assert registry.c_parameter("pfbs", "regression") == "tau"
    assert registry.c_parameter("gcd", "classification", {"stage": "two"}) == "C"
    assert registry.c_parameter("uniform", "regression") == "lam"
    assert "tau" in registry.accepted_params("pfbs") and "loss" in registry.accepted_params("spicy")
    with pytest.raises(InvalidInputError, match="task must be one of"):
        registry.supports("spicy", "ranking")


def test_registry_C_given_twice(cancer, tmp_path):
    from mklscale.engine import Engine

    X, y, _, _ = cancer
    bank = build_bank(X, families.gaussian([1, 3]), tmp_path / "bank", progress=False)
    with Engine(bank) as eng:
        with pytest.raises(InvalidInputError, match="give only one"):
            registry.fit_solver("pfbs", eng, y, "classification", C=1e-3, params={"tau": 1e-3})
        a = registry.fit_solver("pfbs", eng, y, "classification", params={"tau": 1e-3})
        b = registry.fit_solver("pfbs", eng, y, "classification", C=1e-3)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert a.params["tau"] == 1e-3


# ---- inputs ---------------------------------------------------------------------------------------
def test_input_errors(cancer, cache):
    X, y, Xt, _ = cancer
    with pytest.raises(ValueError, match="class"):
        MKLClassifier(kernels=TWO, cache_dir=cache).fit(X, np.ones(len(X)))
    X_nan = X.copy()
    X_nan[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        MKLClassifier(kernels=TWO, cache_dir=cache).fit(X_nan, y)
    est = MKLClassifier(kernels=TWO, solver="uniform", cache_dir=cache).fit(X, y)
    with pytest.raises(ValueError, match="X has 7 features, but MKLClassifier is expecting 8"):
        est.predict(Xt[:, :7])
    with pytest.raises(SpecError, match="unknown kernel family .rbf.; choose one of auto"):
        MKLClassifier(kernels="rbf", cache_dir=cache).fit(X, y)
    with pytest.raises(SpecError, match="uses feature 9"):
        MKLClassifier(kernels=[KernelSpec.gaussian(1.0, features=[9])], cache_dir=cache).fit(X, y)


def test_kernel_presets():
    resolve_kernels = families.resolve
    assert len(resolve_kernels("simplemkl", 4)) == 27 * 5
    assert len(resolve_kernels("gaussian", 4)) == 24 * 5
    assert len(resolve_kernels("polynomial", 4)) == 3 * 5
    assert len(resolve_kernels("linear", 4)) == 5
    assert resolve_kernels("random_subsets", 4, seed=1) == families.random_subsets(4, 100, seed=1)
    assert resolve_kernels("random_subsets", 4, seed=1) != resolve_kernels("random_subsets", 4, seed=2)
    mixed = resolve_kernels([KernelSpec.linear(), {"family": "gaussian", "widths": [1, 2], "features": "all"},
                             KernelSpec.polynomial(2).to_dict()], 4)
    assert mixed == [KernelSpec.linear(), KernelSpec.gaussian(1), KernelSpec.gaussian(2), KernelSpec.polynomial(2)]


def test_fit_bank_matches_fit(cancer, tmp_path):
    X, y, Xt, _ = cancer
    specs = families.gaussian([1, 3])
    fitted = MKLClassifier(kernels=specs, solver="smo", cache_dir=tmp_path / "cache").fit(X, y)
    on_bank = MKLClassifier(solver="smo").fit_bank(fitted.fit_stats_["bank"], y)
    assert on_bank.n_features_in_ == X.shape[1]
    np.testing.assert_array_equal(on_bank.decision_function(Xt), fitted.decision_function(Xt))
    with pytest.raises(InvalidInputError, match="n = 80 training rows"):
        MKLClassifier(solver="smo").fit_bank(fitted.fit_stats_["bank"], y[:-1])


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, mklscale; print('sklearn' in sys.modules, 'mklscale.estimators' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_dataframe_feature_names_survive_save_and_load(cancer, tmp_path):
    """... and name the kernels' features (kernel_weights_, selected_kernels_), before and after loading."""
    import mklscale

    X, y, Xt, _ = cancer
    cols = [f"f{j}" for j in range(X.shape[1])]
    kernels = [TWO, {"family": "linear", "features": [1, 3]}]
    est = MKLClassifier(kernels=kernels, solver="uniform", cache_dir=tmp_path / "c").fit(pd.DataFrame(X, columns=cols), y)
    np.testing.assert_array_equal(est.feature_names_in_, cols)
    names = ["gaussian(width=1)[all]", "gaussian(width=2)[all]", "linear()[f1,f3]"]
    assert est.selected_kernels_ == names and list(est.kernel_weights_.index) == names
    loaded = mklscale.load(est.save(tmp_path / "m"))
    np.testing.assert_array_equal(loaded.feature_names_in_, cols)
    assert list(loaded.kernel_weights_.index) == names
    np.testing.assert_array_equal(loaded.predict(pd.DataFrame(Xt, columns=cols)), est.predict(pd.DataFrame(Xt, columns=cols)))
    with pytest.raises(ValueError, match="feature names"):
        loaded.predict(pd.DataFrame(Xt, columns=[c.upper() for c in cols]))


def test_clone_shares_the_client_by_reference():
    import threading

    lock = threading.Lock()  # like a distributed.Client, it cannot be deep-copied
    est = MKLClassifier(kernels=TWO, client=lock, solver_params={"tol": 1e-4})
    twin = clone(est)
    assert twin.client is lock
    assert twin.solver_params == est.solver_params and twin.solver_params is not est.solver_params


@pytest.mark.cluster
def test_fit_on_a_distributed_client_matches_threaded(cancer, tmp_path, cluster_client):
    X, y, Xt, _ = cancer
    kw = dict(kernels=families.gaussian([1, 3]) + families.polynomial([2]), solver="smo")
    local = MKLClassifier(cache_dir=tmp_path / "local", **kw).fit(X, y)
    remote = MKLClassifier(cache_dir=tmp_path / "remote", client=cluster_client, **kw).fit(X, y)
    assert remote.fit_stats_["kernels_built"] == 3
    np.testing.assert_array_equal(remote.decision_function(Xt), local.decision_function(Xt))
    assert clone(remote).client is cluster_client


# ---- convergence warnings --------------------------------------------------------------------------
def _only_convergence_warning(record) -> str:
    texts = [str(w.message) for w in record if issubclass(w.category, ConvergenceWarning)]
    assert len(texts) == 1, texts  # one warning per fit, however many heads failed
    return texts[0]


def test_smo_stopped_by_max_steps_warns_naming_solver_gap_and_remedy(cancer, cache):
    X, y, _, _ = cancer
    with pytest.warns(ConvergenceWarning) as record:
        est = MKLClassifier(kernels=TWO, solver="smo", solver_params={"max_steps": 5}, cache_dir=cache).fit(X, y)
    text = _only_convergence_warning(record)
    assert not est.result_.converged and est.fit_stats_["convergence_warning"] == text
    assert "MKLClassifier: solver 'smo' did not converge" in text
    assert f"gap {est.result_.gap:.3g}, stopped by max_steps" in text
    assert "raise max_steps (now 5)" in text and f"change C (it sets smo's C = {est.C_:g})" in text
    assert record[0].filename == __file__  # points at the caller's fit, not inside mklscale


def test_pfbs_stopped_by_max_iter_warns(diabetes, cache):
    X, y, _, _ = diabetes
    with pytest.warns(ConvergenceWarning, match=r"solver 'pfbs' did not converge: relative duality gap") as record:
        MKLRegressor(kernels=TWO, solver="pfbs", solver_params={"max_iter": 10}, cache_dir=cache).fit(X, y)
    text = _only_convergence_warning(record)
    assert "raise max_iter (now 10)" in text and "loosen tol (now 1e-06)" in text and "pfbs's tau = 0.001" in text


def test_defaults_that_did_not_converge_now_converge(cancer, diabetes, cache):
    """smo (C = 100, the paper's OPT_3 test) and pfbs (tau = 1e-3, plain PFBS) used to stop unconverged at
    their defaults on these sets; with C = "auto", smo's gap stopping rule and FISTA they converge."""
    X, y, _, _ = cancer
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        smo = MKLClassifier(solver="smo", cache_dir=cache).fit(X, y)
        X, y, _, _ = diabetes
        pfbs = MKLRegressor(solver="pfbs", cache_dir=cache).fit(X, y)
    assert smo.result_.converged and pfbs.result_.converged


def test_converged_fit_does_not_warn(diabetes, cache):
    X, y, _, _ = diabetes
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = MKLRegressor(kernels=TWO, solver="pfbs", cache_dir=cache).fit(X, y)
    assert est.result_.converged
    assert est.fit_stats_["converged"] and est.fit_stats_["convergence_warning"] is None


def test_one_vs_rest_warns_once_naming_the_classes(cache):
    ds = datasets.load("iris", standardise=False)
    labels = np.array(["setosa", "versicolor", "virginica"])[ds.y]
    with pytest.warns(ConvergenceWarning) as record:
        est = MKLClassifier(kernels=TWO, solver="smo", solver_params={"max_steps": 5},
                            cache_dir=cache).fit(ds.X[::2], labels[::2])
    text = _only_convergence_warning(record)
    failed = [c for c, r in zip(est.classes_, est.result_) if not r.converged]
    assert failed
    for c in failed:
        assert f"class '{c}' (one-vs-rest): relative duality gap" in text
