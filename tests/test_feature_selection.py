"""Feature selection from kernel weights (mklscale.feature_selection): the importance rule, the estimators'
feature_importances_ / selected_features_ / feature_ranking, selection stability over subsamples and along the
path, and the pipeline's ``stability = N`` record with its report figure.

The synthetic problem: 10 features, the label depends on features 2 and 7 only (a sine and a square), one
Gaussian width ladder per feature (``families.gaussian(widths, features=[j])``).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

import mklscale
from mklscale.bank import KernelSpec, families
from mklscale.errors import ConfigError, InvalidInputError
from mklscale.feature_selection import all_features_share, importances, ranked, stability, subsample

D, INFORMATIVE = 10, [2, 7]
NAMES = [f"gene{j}" for j in range(D)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("banks")


@pytest.fixture(scope="module")
def planted():
    """X (100 x 10) and labels that depend on features 2 and 7 only."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, D))
    y = np.where(np.sin(2.0 * X[:, 2]) + X[:, 7] ** 2 - 1.0 > 0, "case", "control")
    return X, y


def per_feature(widths=(0.5, 2.0)) -> list[KernelSpec]:
    return [s for j in range(D) for s in families.gaussian(widths, features=[j])]


@pytest.fixture(scope="module")
def fitted(planted, cache):
    X, y = planted
    clf = mklscale.MKLClassifier(kernels=per_feature(), cache_dir=cache)
    return clf.fit(pd.DataFrame(X, columns=NAMES), y)


# ---- the rule ------------------------------------------------------------------------------------------
def test_importance_rule_splits_each_share_among_the_kernels_features():
    features = [(0,), (1, 3), None]
    weights = np.array([2.0, 1.0, 1.0])           # shares 1/2, 1/4, 1/4
    imp = importances(features, weights, 4)
    # feature 0: 1/2 + 1/16; 1 and 3: 1/8 + 1/16; 2: 1/16 (the all-features kernel's 1/4 over 4 features)
    assert imp == pytest.approx([0.5 + 1 / 16, 1 / 8 + 1 / 16, 1 / 16, 1 / 8 + 1 / 16])
    assert imp.sum() == pytest.approx(1.0)
    assert all_features_share(features, weights, 4) == pytest.approx(0.25)
    # two heads are averaged; a head with no kernel adds nothing; negative weights count by magnitude
    two = importances([(0,), (1,)], np.array([[1.0, 0.0], [-1.0, 3.0]]), 2)
    assert two == pytest.approx([(1 + 0.25) / 2, 0.75 / 2])
    assert importances([(0,)], np.array([[0.0], [1.0]]), 3) == pytest.approx([0.5, 0, 0])
    # a kernel listing every column counts as one over all features
    assert all_features_share([(0, 1)], [1.0], 2) == 1.0


def test_ranking_orders_by_importance_then_index_and_drops_zeros():
    assert ranked(np.array([0.1, 0.0, 0.4, 0.1, 0.4])).tolist() == [2, 4, 0, 3]
    assert ranked(np.zeros(3)).size == 0


def test_the_rule_refuses_features_outside_the_data():
    with pytest.raises(InvalidInputError, match="outside the 3 feature"):
        importances([(0, 5)], [1.0], 3)
    with pytest.raises(InvalidInputError, match="one subset per kept kernel"):
        importances([(0,)], [1.0, 2.0], 3)


# ---- estimators --------------------------------------------------------------------------------------------
def test_the_two_informative_features_rank_first_by_name(fitted):
    imp = fitted.feature_importances_
    assert imp.shape == (D,) and np.all(imp >= 0) and imp.sum() == pytest.approx(1.0)
    assert sorted(fitted.selected_features_[:2].tolist()) == INFORMATIVE
    assert list(fitted.selected_features_) == list(np.flatnonzero(imp)[np.argsort(-imp[imp > 0], kind="stable")])
    assert list(fitted.feature_names_in_) == NAMES
    ranking = fitted.feature_ranking()
    assert ranking.name == "importance" and ranking.index.name == "feature"
    assert sorted(ranking.index[:2]) == ["gene2", "gene7"]
    assert ranking.is_monotonic_decreasing and ranking.sum() == pytest.approx(1.0)
    assert list(fitted.feature_ranking(top=1).index) == list(ranking.index[:1])


def test_importances_follow_the_kept_kernels_weights(fitted):
    """Recomputed by hand from kernel_weights_ (kernel names end in [feature name])."""
    shares = fitted.kernel_weights_.abs() / fitted.kernel_weights_.abs().sum()
    by_feature = shares.groupby([name.split("[")[1].rstrip("]") for name in shares.index]).sum()
    for j, name in enumerate(NAMES):
        assert fitted.feature_importances_[j] == pytest.approx(by_feature.get(name, 0.0))


def test_select_from_model_reads_the_importances_and_a_saved_model_keeps_them(fitted, planted, tmp_path):
    from sklearn.feature_selection import SelectFromModel

    X, _ = planted
    selector = SelectFromModel(fitted, prefit=True, threshold=1e-12)
    assert selector.get_support(indices=True).tolist() == sorted(fitted.selected_features_)
    assert selector.transform(X).shape == (100, fitted.selected_features_.size)
    fitted.save(tmp_path / "model")
    same = mklscale.load(tmp_path / "model")
    assert same.feature_importances_ == pytest.approx(fitted.feature_importances_)
    assert list(same.feature_ranking().index) == list(fitted.feature_ranking().index)


def test_numpy_input_ranks_by_column_index(planted, cache):
    X, y = planted
    clf = mklscale.MKLClassifier(kernels=per_feature(), cache_dir=cache).fit(X, y)
    assert not hasattr(clf, "feature_names_in_")
    assert sorted(clf.feature_ranking().index[:2]) == INFORMATIVE


def test_kernels_over_all_features_select_every_feature_and_say_so(planted, cache):
    X, y = planted
    clf = mklscale.MKLClassifier(kernels=families.gaussian([3.0]), cache_dir=cache).fit(X, y)
    assert clf.feature_importances_ == pytest.approx(np.full(D, 1 / D))
    assert clf.selected_features_.tolist() == list(range(D))
    with pytest.warns(UserWarning, match="every feature ties"):
        clf.feature_ranking()


def test_multiclass_importances_average_the_heads(planted, cache):
    X = planted[0][:, :4]
    y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])              # three classes
    specs = [s for j in range(4) for s in families.gaussian([1.0], features=[j])]
    clf = mklscale.MKLClassifier(kernels=specs, cache_dir=cache).fit(X, y)
    assert clf.model_.n_heads == 3
    W = clf.kernel_weights_.to_numpy()                      # classes x kept kernels
    expected = np.zeros(4)
    for k, spec in enumerate(clf.model_.specs):
        expected[spec.features[0]] += np.mean(np.abs(W[:, k]) / np.abs(W).sum(axis=1))
    assert clf.feature_importances_ == pytest.approx(expected)


def test_precomputed_kernels_have_no_features(planted, cache):
    X, y = planted
    K = np.stack([s.compute(X) for s in per_feature()[:3]])
    clf = mklscale.MKLClassifier(kernels="precomputed", cache_dir=cache).fit(K, y)
    assert not hasattr(clf, "feature_importances_")
    with pytest.raises(AttributeError, match="precomputed Gram matrices.*no input features"):
        clf.feature_importances_
    with pytest.raises(AttributeError, match="no input features"):
        clf.selected_features_
    with pytest.raises(InvalidInputError, match="no input features"):
        mklscale.feature_stability(clf, K, y)


def test_unfitted_estimator_has_no_importances():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        mklscale.MKLClassifier().feature_importances_


# ---- stability ----------------------------------------------------------------------------------------------
def test_informative_features_are_selected_in_every_subsample(planted, cache):
    X, y = planted
    est = mklscale.MKLClassifier(kernels=per_feature(), cache_dir=cache)
    st = mklscale.feature_stability(est, pd.DataFrame(X, columns=NAMES), y, n_resamples=6, random_state=1)
    freq = st.frequency
    assert freq.shape == (D,) and np.all((freq >= 0) & (freq <= 1))
    assert st.fits.tolist() == [6] and st.n_resamples == 6 and st.fraction == 0.5
    assert np.all(freq[INFORMATIVE] >= 5 / 6)
    assert freq[INFORMATIVE].min() >= np.delete(freq, INFORMATIVE).max() - 1e-12
    frame = st.to_frame()
    assert sorted(frame.index[:2]) == ["gene2", "gene7"]
    assert list(frame.columns) == ["frequency", "max_frequency", "mean_importance", f"C={st.values[0]:.4g}"]
    assert frame["mean_importance"].sum() == pytest.approx(1.0) and frame["frequency"].is_monotonic_decreasing
    record = st.to_record(importance=np.full(D, 0.1))
    assert record["n_resamples"] == 6 and sorted(record["names"][:2]) == ["gene2", "gene7"]
    assert len(record["frequency_by_value"]) == 1 and record["all_feature_fits"] == [0]
    json.dumps(record)                                       # plain JSON


def test_along_the_path_the_informative_features_enter_first(planted, cache):
    X, y = planted
    est = mklscale.MKLClassifier(kernels=per_feature(), cache_dir=cache)
    st = mklscale.feature_stability(est, X, y, n_resamples=0, Cs=5)
    assert len(st.values) == 5 and st.fits.tolist() == [1] * 5 and st.fraction is None
    by_value = st.frequency_by_value
    assert set(np.unique(by_value)) <= {0.0, 1.0}
    assert by_value[0].sum() == 0                            # C_max: no kernel kept
    first = next(i for i in range(5) if by_value[i].any())   # the first value that keeps kernels
    assert set(np.flatnonzero(by_value[first])) <= set(INFORMATIVE)
    assert sorted(st.to_frame().index[:2]) == INFORMATIVE


def test_subsamples_are_stratified_and_distinct():
    y = np.array([0] * 10 + [1] * 30)
    rows = subsample(y, 0.5, True, np.random.default_rng(0))
    assert np.unique(rows).size == rows.size == 20 and np.sum(y[rows] == 0) == 5
    with pytest.raises(InvalidInputError, match="leaves no row out"):
        subsample(np.array([0, 0, 1, 1, 1]), 0.5, True, np.random.default_rng(0))


@pytest.mark.parametrize("kwargs, fragment", [
    ({"n_resamples": -1}, "n_resamples must be an int >= 0"),
    ({"n_resamples": 2.5}, "n_resamples must be an int >= 0"),
    ({"fraction": 1.0}, "fraction must be a number in \\(0, 1\\)"),
    ({"fraction": "half"}, "fraction must be a number"),
    ({"Cs": []}, "Cs is empty"),
    ({"Cs": [-1.0]}, "not a valid regularisation"),
    ({"Cs": "many"}, "Cs must be None, an int or a list"),
    ({"Cs": 0}, "Cs = 0 must be >= 1"),
])
def test_bad_stability_settings_are_clear_errors(planted, cache, kwargs, fragment):
    X, y = planted
    est = mklscale.MKLClassifier(kernels=per_feature(), cache_dir=cache)
    with pytest.raises(InvalidInputError, match=fragment):
        mklscale.feature_stability(est, X, y, **{"n_resamples": 2, **kwargs})


def test_stability_needs_an_mklscale_estimator(planted):
    from sklearn.svm import SVC

    with pytest.raises(InvalidInputError, match="takes an mklscale estimator"):
        mklscale.feature_stability(SVC(), *planted)


def test_stability_of_a_bank_of_gram_matrices_is_refused(planted):
    with pytest.raises(InvalidInputError, match="no features"):
        stability("spicy", None, [KernelSpec.precomputed("a")], planted[1], "classification", [1.0])


# ---- pipelines and the report ---------------------------------------------------------------------------------
PIPELINE = {
    "name": "fs",
    "dataset": {"name": "breast_cancer", "test_fraction": 0.3, "max_train": 60},
    "bank": {"families": [{"family": "gaussian", "widths": [2.0], "features": "each"},
                          {"family": "gaussian", "widths": [5.0], "features": "all"}]},
    "solver": [{"name": "spicy", "solver": "spicy", "C": 0.05, "loss": "logistic", "stability": 3}],
    "report": {"enabled": True},
}


@pytest.mark.parametrize("change, fragment", [
    ({"stability": -1}, "must be between 0 (off) and 1000"),
    ({"stability": 0, "stability_fraction": 0.3}, "stability_fraction applies only with stability"),
    ({"stability_fraction": 1.5}, "must be in (0, 1)"),
])
def test_bad_stability_in_a_pipeline_is_a_config_error(change, fragment):
    from mklscale.pipeline import load_pipeline

    spec = json.loads(json.dumps(PIPELINE))
    spec["solver"][0].update(change)
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec)
    assert fragment in str(info.value)


def test_stability_with_gram_matrices_is_a_config_error(tmp_path):
    from mklscale.pipeline import load_pipeline

    spec = {**json.loads(json.dumps(PIPELINE)), "dataset": {"labels": "y.npy"}, "bank": {"grams": "K.npy"}}
    with pytest.raises(ConfigError, match="Gram matrices without features"):
        load_pipeline(spec)


def test_a_pipeline_records_feature_stability_and_the_report_draws_it(tmp_path, cluster_client):
    from matplotlib.image import imread

    from mklscale.pipeline import run_pipeline

    address = {"kind": "address", "address": cluster_client.scheduler.address}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = run_pipeline(PIPELINE, out=tmp_path / "run", cluster=address, quiet=True)
    entry = results["solvers"][0]
    fs = entry["feature_stability"]
    assert fs["n_resamples"] == 3 and fs["fraction"] == 0.5 and fs["fits"] == [3]
    assert fs["values"] == [pytest.approx(entry["params"]["C"])]
    assert all(0 <= f <= 1 for f in fs["frequency"]) and fs["frequency"] == sorted(fs["frequency"], reverse=True)
    names = results["dataset"]["feature_names"]
    assert fs["names"] == [names[j] for j in fs["features"]] and fs["n_features"] == len(names) == 30
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["solvers"][0]["feature_stability"] == fs
    page = (tmp_path / "run" / "report" / "index.html").read_text()
    assert "<h2>Feature selection</h2>" in page and 'src="stability-00-spicy.png"' in page
    assert f"<td>{fs['names'][0]}</td>" in page
    assert ("kept a kernel over all features" in page) == (sum(fs["all_feature_fits"]) > 0)
    pixels = imread(tmp_path / "run" / "report" / "stability-00-spicy.png")[..., :3]
    assert pixels.shape[1] > 600 and (pixels.std(axis=2) > 0.1).mean() > 0.005   # coloured bars drawn


def test_a_resumed_run_keeps_a_finished_solver_only_with_the_same_stability():
    from mklscale.pipeline.fits import _recorded_stability, _requested_stability

    entry = {"stability": 3, "stability_fraction": 0.5}
    assert _requested_stability(entry) == _recorded_stability({"feature_stability": {"n_resamples": 3, "fraction": 0.5}})
    assert _requested_stability({**entry, "stability": 4}) != _recorded_stability(
        {"feature_stability": {"n_resamples": 3, "fraction": 0.5}})
    assert _requested_stability({"stability": 0, "stability_fraction": 0.5}) == _recorded_stability({}) == (0, None)
    assert _recorded_stability({"feature_stability": {"error": "x"}}) == (0, None)


def test_class_weight_reaches_every_refit(planted, cache, monkeypatch):
    from mklscale.solvers import registry

    X, y = planted
    seen = []
    fit_path = registry.fit_path

    def spy(*args, sample_weight=None, **kwargs):
        seen.append(sample_weight)
        return fit_path(*args, sample_weight=sample_weight, **kwargs)

    monkeypatch.setattr(registry, "fit_path", spy)
    est = mklscale.MKLClassifier(kernels=per_feature(), solver="uniform", class_weight="balanced", cache_dir=cache)
    st = mklscale.feature_stability(est, X, y, n_resamples=2)
    assert len(seen) == 2 and all(w is not None and w.size == 50 for w in seen)
    counts = {c: np.sum(y == c) for c in np.unique(y)}
    assert st.fits.tolist() == [2]
    # "balanced" weights of the whole training set (n / (2 n_c)), each subsample taking its rows' weights
    assert np.allclose(sorted(set(np.round(seen[0], 12))), sorted({100 / (2 * n) for n in counts.values()}))
