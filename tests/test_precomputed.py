"""kernels="precomputed": your own Gram matrices, as MKLpy users bring them (fit(KL, y); predict(KL_test)).

Round trips through a list, an (M, n, n) array and a memory-mapped .npy; models saved from them predict from
test kernels; the same kernels given as features (a bank the estimators build) give the same model."""

from __future__ import annotations

import numpy as np
import pytest

import mklscale
from mklscale import MKLClassifier, MKLClassifierCV, MKLRegressor, datasets
from mklscale.bank import KernelBank, families
from mklscale.errors import InvalidInputError

SPECS = [{"family": "gaussian", "widths": [3.0, 10.0], "features": "all"}, {"family": "linear", "features": "all"}]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Raw Gram matrices of the estimators' own kernels on breast_cancer (train x train, test x train)."""
    ds = datasets.load("breast_cancer", standardise=False)
    X, y = ds.X[::2], ds.y[::2]
    tr, te = np.arange(0, 200), np.arange(200, X.shape[0])
    X = (X - X[tr].mean(axis=0)) / X[tr].std(axis=0)   # as the bank standardises its training rows
    specs = families.resolve(SPECS, X.shape[1])
    K = np.stack([s.compute(X[tr], X[tr]) for s in specs])
    Kt = np.stack([s.compute(X[te], X[tr]) for s in specs])
    return X, y, tr, te, specs, K, Kt, tmp_path_factory.mktemp("cache")


def test_list_array_and_memmap_give_the_same_model(data, tmp_path):
    X, y, tr, te, specs, K, Kt, cache = data
    kw = dict(kernels="precomputed", solver="spicy", cache_dir=cache)
    from_array = MKLClassifier(**kw).fit(K, y[tr])
    from_list = MKLClassifier(**kw).fit(list(K), y[tr])
    np.save(tmp_path / "K.npy", K)
    mapped = np.load(tmp_path / "K.npy", mmap_mode="r")
    from_map = MKLClassifier(**kw).fit(mapped, y[tr])
    for other in (from_list, from_map):
        np.testing.assert_array_equal(other.decision_function(Kt), from_array.decision_function(Kt))
    assert from_map.fit_stats_["kernels_built"] == 0        # the same bytes: the cached bank is reused
    assert 0.9 < from_array.score(Kt, y[te]) <= 1.0 and not hasattr(from_array, "n_features_in_")


def test_same_model_as_the_feature_bank(data):
    """Gram matrices equal to the kernels of a feature bank give the model fitted on the features (to the
    float32 storage of both banks)."""
    X, y, tr, te, specs, K, Kt, cache = data
    pre = MKLClassifier(kernels="precomputed", C=0.05, cache_dir=cache).fit(K, y[tr])
    feat = MKLClassifier(kernels=specs, C=0.05, cache_dir=cache).fit(X[tr], y[tr])
    np.testing.assert_allclose(pre.decision_function(Kt), feat.decision_function(X[te]), atol=1e-4)
    np.testing.assert_allclose(pre.result_.weights, feat.result_.weights, atol=1e-4)


def test_saved_models_predict_from_test_kernels(data, tmp_path):
    X, y, tr, te, specs, K, Kt, cache = data
    for est in (MKLClassifier(kernels="precomputed", cache_dir=cache),
                MKLClassifierCV(kernels="precomputed", Cs=3, cache_dir=cache)):
        est.fit(K, y[tr]).save(tmp_path / type(est).__name__)
        loaded = mklscale.load(tmp_path / type(est).__name__)
        np.testing.assert_array_equal(loaded.predict(Kt), est.predict(Kt))
        kept = loaded.model_.bank_kernels                   # the kept kernels alone also predict
        np.testing.assert_allclose(loaded.decision_function(Kt[kept]), est.decision_function(Kt))


def test_regression_on_precomputed_kernels(tmp_path):
    ds = datasets.load("diabetes")
    specs = families.resolve("linear", ds.X.shape[1])[:3]
    K = np.stack([s.compute(ds.X, ds.X) for s in specs])
    est = MKLRegressor(kernels="precomputed", cache_dir=tmp_path).fit(K, ds.y)
    assert est.score(K, ds.y) > 0.2


def test_bad_input_says_what_to_pass(data):
    X, y, tr, te, specs, K, Kt, cache = data
    kw = dict(kernels="precomputed", cache_dir=cache)
    with pytest.raises(InvalidInputError, match="pass the Gram matrices.*got \\(200, 30\\).*from_arrays"):
        MKLClassifier(**kw).fit(X[tr], y[tr])
    with pytest.raises(InvalidInputError, match="200 x 200 and y has 199"):
        MKLClassifier(**kw).fit(K, y[tr][:-1])
    with pytest.raises(InvalidInputError, match="different shapes"):
        MKLClassifier(**kw).fit([K[0], K[1][:-1, :-1]], y[tr])
    with pytest.raises(InvalidInputError, match="normalize='diag'"):
        MKLClassifier(normalize="diag", **kw).fit(K, y[tr])
    with pytest.raises(InvalidInputError, match="not positive semidefinite"):
        MKLClassifier(**kw).fit(np.stack([K[0], -K[1]]), y[tr])
    fitted = MKLClassifier(**kw).fit(K, y[tr])
    with pytest.raises(InvalidInputError, match="K_cross must have shape"):
        fitted.predict(Kt[:, :, :-1])
    with pytest.raises(InvalidInputError, match="pass the Gram matrices"):
        fitted.predict(X[te])
