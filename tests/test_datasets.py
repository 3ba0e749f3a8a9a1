"""Tests for mklscale.datasets: shapes, conventions, determinism and the generators' definitions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from mklscale.datasets import Dataset, _standardise, available, load, ringnorm, twonorm, waveform
from mklscale.errors import InvalidInputError

EXPECTED = {
    # name: (task, n, d, n_classes or None)
    "breast_cancer": ("binary", 569, 30, 2),
    "wine": ("binary", 178, 13, 2),
    "digits": ("binary", 1797, 64, 2),
    "digits_multiclass": ("multiclass", 1797, 64, 10),
    "iris": ("multiclass", 150, 4, 3),
    "iris_binary": ("binary", 150, 4, 2),
    "diabetes": ("regression", 442, 10, None),
    "liver": ("binary", 345, 6, 2),
    "pima": ("binary", 768, 8, 2),
    "ionosphere": ("binary", 351, 33, 2),
    "sonar": ("binary", 208, 60, 2),
    "twonorm": ("binary", 1000, 20, 2),
    "ringnorm": ("binary", 1000, 20, 2),
    "waveform": ("binary", 1000, 21, 2),
    "waveform_multiclass": ("multiclass", 1000, 21, 3),
    "additive": ("binary", 600, 50, 2),
}


@pytest.fixture(scope="module")
def all_datasets() -> dict[str, Dataset]:
    return {name: load(name) for name in available()}


def test_available_is_sorted_and_complete():
    names = available()
    assert names == sorted(names)
    assert set(names) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shape_task_and_dtypes(all_datasets, name):
    ds = all_datasets[name]
    task, n, d, n_classes = EXPECTED[name]
    assert isinstance(ds, Dataset)
    assert ds.name == name
    assert ds.task == task
    assert ds.X.shape == (n, d) and ds.X.dtype == np.float64
    assert ds.y.shape == (n,)
    assert len(ds.feature_names) == d and all(isinstance(f, str) for f in ds.feature_names)
    assert isinstance(ds.description, str) and ds.description and "\n" not in ds.description
    assert np.isfinite(ds.X).all() and np.isfinite(ds.y).all()
    if task == "binary":
        assert ds.y.dtype == np.float64
        assert set(np.unique(ds.y).tolist()) == {-1.0, 1.0}
    elif task == "multiclass":
        assert ds.y.dtype == np.int64
        assert np.unique(ds.y).tolist() == list(range(n_classes))
    else:
        assert ds.y.dtype == np.float64
        assert len(np.unique(ds.y)) > 50


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_standardised_columns(all_datasets, name):
    X = all_datasets[name].X
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-10)
    std = X.std(axis=0)
    constant = std < 0.5
    np.testing.assert_allclose(std[~constant], 1.0, rtol=1e-10)
    assert (X[:, constant] == 0.0).all()


def test_digits_constant_pixels_become_zero_not_nan():
    raw = load("digits", standardise=False).X
    ds = load("digits")
    constant = raw.std(axis=0) == 0
    assert constant.any()  # pixel_0_0 is blank in every image
    assert (ds.X[:, constant] == 0.0).all()


def test_standardise_helper_handles_constant_columns():
    X = np.column_stack([np.full(7, 0.1), np.arange(7.0), np.zeros(7)])
    Z = _standardise(X)
    assert np.isfinite(Z).all()
    assert (Z[:, 0] == 0).all() and (Z[:, 2] == 0).all()
    assert Z[:, 1].mean() == pytest.approx(0.0, abs=1e-12)
    assert Z[:, 1].std() == pytest.approx(1.0)


def test_label_conventions_follow_sources():
    from sklearn.datasets import load_breast_cancer, load_digits, load_iris, load_wine

    np.testing.assert_array_equal(load("breast_cancer").y,
                                  np.where(load_breast_cancer().target == 1, 1.0, -1.0))
    np.testing.assert_array_equal(load("wine").y, np.where(load_wine().target == 0, 1.0, -1.0))
    digits = load_digits().target
    np.testing.assert_array_equal(load("digits").y, np.where(digits % 2 == 0, 1.0, -1.0))
    np.testing.assert_array_equal(load("digits_multiclass").y, digits)
    np.testing.assert_array_equal(load("iris_binary").y,
                                  np.where(load_iris().target == 0, 1.0, -1.0))


def test_regression_target_not_standardised():
    y = load("diabetes").y
    assert y.mean() > 100 and y.std() > 50  # disease progression in original units


def test_standardise_false_returns_raw_features():
    from sklearn.datasets import load_wine

    np.testing.assert_array_equal(load("wine", standardise=False).X, load_wine().data)


@pytest.mark.parametrize("name", ["twonorm", "ringnorm", "waveform", "waveform_multiclass"])
def test_generators_deterministic_by_seed(name):
    a = load(name, n_samples=200, seed=3)
    b = load(name, n_samples=200, seed=3)
    c = load(name, n_samples=200, seed=4)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X)
    assert not np.array_equal(a.y, c.y)


def test_generator_sizes_and_default_seed():
    ds = load("ringnorm", n_samples=50, n_features=5, seed=1)
    assert ds.X.shape == (50, 5)
    assert load("twonorm", n_samples=30, n_features=3).X.shape == (30, 3)
    np.testing.assert_array_equal(twonorm().X, load("twonorm", seed=0).X)
    assert waveform(n_samples=40, n_features=40).X.shape == (40, 40)


def test_binary_generators_roughly_balanced():
    for f in (twonorm, ringnorm):
        y = f(n_samples=4000, seed=11).y
        assert abs((y > 0).mean() - 0.5) < 0.04


def test_twonorm_class_conditional_moments():
    ds = twonorm(n_samples=4000, seed=5, standardise=False)
    a = 2 / np.sqrt(20)
    pos, neg = ds.X[ds.y > 0], ds.X[ds.y < 0]
    assert pos.mean() == pytest.approx(a, abs=0.03)
    assert neg.mean() == pytest.approx(-a, abs=0.03)
    np.testing.assert_allclose(pos.mean(axis=0), a, atol=0.12)
    np.testing.assert_allclose(neg.mean(axis=0), -a, atol=0.12)
    np.testing.assert_allclose(pos.var(axis=0).mean(), 1.0, atol=0.06)
    np.testing.assert_allclose(neg.var(axis=0).mean(), 1.0, atol=0.06)


def test_ringnorm_class_conditional_moments():
    ds = ringnorm(n_samples=4000, seed=6, standardise=False)
    a = 1 / np.sqrt(20)
    pos, neg = ds.X[ds.y > 0], ds.X[ds.y < 0]
    assert pos.mean() == pytest.approx(0.0, abs=0.03)
    assert neg.mean() == pytest.approx(a, abs=0.03)
    np.testing.assert_allclose(pos.var(axis=0), 4.0, rtol=0.15)
    np.testing.assert_allclose(pos.var(axis=0).mean(), 4.0, rtol=0.04)
    np.testing.assert_allclose(neg.var(axis=0).mean(), 1.0, rtol=0.05)
    # off-diagonal covariance is zero (independent coordinates)
    off = np.cov(pos, rowvar=False)[~np.eye(20, dtype=bool)]
    assert np.abs(off).max() < 0.5


def test_general_dimension_scaling():
    d = 5
    tn = twonorm(n_samples=4000, n_features=d, seed=2, standardise=False)
    assert tn.X[tn.y > 0].mean() == pytest.approx(2 / np.sqrt(d), abs=0.05)
    rn = ringnorm(n_samples=4000, n_features=d, seed=2, standardise=False)
    assert rn.X[rn.y < 0].mean() == pytest.approx(1 / np.sqrt(d), abs=0.05)


def test_waveform_class_means_match_breiman_bases():
    i = np.arange(1, 22)
    h1 = np.maximum(6 - np.abs(i - 7), 0)
    h2 = np.maximum(6 - np.abs(i - 15), 0)
    h3 = np.maximum(6 - np.abs(i - 11), 0)
    expected = [(h1 + h2) / 2, (h1 + h3) / 2, (h2 + h3) / 2]  # E[u] = 1/2
    ds = waveform(n_samples=3000, seed=7, standardise=False, multiclass=True)
    for k in range(3):
        np.testing.assert_allclose(ds.X[ds.y == k].mean(axis=0), expected[k], atol=0.3)
        assert abs((ds.y == k).mean() - 1 / 3) < 0.04
    # binary task: same features, class 0 -> +1, classes 1 and 2 -> -1
    binary = waveform(n_samples=3000, seed=7, standardise=False)
    np.testing.assert_array_equal(binary.X, ds.X)
    np.testing.assert_array_equal(binary.y, np.where(ds.y == 0, 1.0, -1.0))


def test_waveform_extra_features_are_noise():
    ds = waveform(n_samples=3000, n_features=40, seed=8, standardise=False)
    noise = ds.X[:, 21:]
    np.testing.assert_allclose(noise.mean(axis=0), 0.0, atol=0.1)
    np.testing.assert_allclose(noise.var(axis=0), 1.0, rtol=0.1)


def test_twonorm_nearest_mean_baseline_accuracy():
    ds = load("twonorm", n_samples=2000, seed=9)
    Xtr, ytr, Xte, yte = ds.X[:1000], ds.y[:1000], ds.X[1000:], ds.y[1000:]
    mu_pos, mu_neg = Xtr[ytr > 0].mean(axis=0), Xtr[ytr < 0].mean(axis=0)
    d_pos = ((Xte - mu_pos) ** 2).sum(axis=1)
    d_neg = ((Xte - mu_neg) ** 2).sum(axis=1)
    pred = np.where(d_pos < d_neg, 1.0, -1.0)
    assert (pred == yte).mean() > 0.9


def test_ringnorm_is_not_linearly_separable_but_variance_separates():
    # a sanity check of the "ring": the norm of x separates the classes well, the mean does not
    ds = ringnorm(n_samples=2000, seed=10, standardise=False)
    r2 = (ds.X ** 2).sum(axis=1)
    pred = np.where(r2 > np.median(r2), 1.0, -1.0)
    assert (pred == ds.y).mean() > 0.9


def test_dataset_is_frozen():
    ds = load("iris")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# bad inputs


def test_unknown_name_lists_available():
    with pytest.raises(InvalidInputError, match="available") as info:
        load("no_such_dataset")
    for name in available():
        assert name in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("key", ["n_samples", "n_features", "seed"])
def test_bundled_rejects_size_keywords(key):
    with pytest.raises(InvalidInputError, match=f"{key}.*fixed size"):
        load("breast_cancer", **{key: 10})


def test_unknown_keyword_is_named():
    with pytest.raises(InvalidInputError, match="'noise'"):
        load("twonorm", noise=0.1)
    with pytest.raises(InvalidInputError, match="'multiclass'"):
        load("waveform", multiclass=True)


@pytest.mark.parametrize(
    "name, kwargs, fragment",
    [
        ("twonorm", {"n_samples": 1}, "n_samples must be >= 2"),
        ("ringnorm", {"n_samples": 0}, "n_samples must be >= 2"),
        ("waveform", {"n_samples": -5}, "n_samples must be >= 2"),
        ("twonorm", {"n_features": 0}, "n_features must be >= 1"),
        ("ringnorm", {"n_features": -1}, "n_features must be >= 1"),
        ("waveform", {"n_features": 20}, "n_features must be >= 21"),
        ("twonorm", {"n_samples": 10.5}, "n_samples must be an integer"),
        ("ringnorm", {"n_samples": True}, "n_samples must be an integer"),
        ("twonorm", {"seed": -1}, "seed must be >= 0"),
        ("twonorm", {"seed": "abc"}, "seed must be an integer"),
    ],
)
def test_bad_generator_arguments(name, kwargs, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        load(name, **kwargs)


def test_generator_functions_validate_directly():
    with pytest.raises(InvalidInputError, match="n_samples"):
        twonorm(n_samples=1)
    with pytest.raises(InvalidInputError, match="n_features"):
        ringnorm(n_features=0)


# ---------------------------------------------------------------------------------------------
# the SimpleMKL / SpicyMKL UCI sets shipped in mklscale/data (copied from KEEL)

#: name: (rows labelled +1, rows labelled -1) as the UCI descriptions give them
UCI_CLASSES = {"liver": (145, 200), "pima": (268, 500), "ionosphere": (225, 126), "sonar": (111, 97)}


@pytest.mark.parametrize("name", sorted(UCI_CLASSES))
def test_uci_sets_have_the_uci_row_and_class_counts(name):
    ds = load(name)
    positive, negative = UCI_CLASSES[name]
    assert ds.task == "binary" and ds.y.dtype == np.float64
    assert set(np.unique(ds.y).tolist()) == {-1.0, 1.0}
    assert (int((ds.y > 0).sum()), int((ds.y < 0).sum())) == (positive, negative)
    assert ds.n_samples == positive + negative


@pytest.mark.parametrize("name", sorted(UCI_CLASSES))
def test_uci_sets_standardised_by_default_raw_on_request(name):
    raw = load(name, standardise=False)
    ds = load(name)
    np.testing.assert_array_equal(ds.y, raw.y)
    np.testing.assert_allclose(ds.X, _standardise(raw.X))
    assert not np.allclose(raw.X.mean(axis=0), 0.0)
    assert (raw.X.std(axis=0) > 0).all()      # no constant column (KEEL dropped ionosphere's)


def test_uci_feature_names_and_raw_values_follow_the_sources():
    liver = load("liver", standardise=False)
    assert liver.feature_names == ("mcv", "alkphos", "sgpt", "sgot", "gammagt", "drinks")
    np.testing.assert_array_equal(liver.X[0], [85, 92, 45, 27, 31, 0])   # UCI bupa.data's first row
    assert liver.y[0] == 1.0                                             # its selector is 1
    pima = load("pima", standardise=False)
    assert pima.feature_names[:2] == ("pregnancies", "glucose") and pima.feature_names[-1] == "age"
    # zeros stand for missing values, as in UCI's file (the counts of the UCI description)
    zeros = dict(zip(pima.feature_names, (pima.X == 0).sum(axis=0).tolist()))
    assert [zeros[k] for k in ("glucose", "blood_pressure", "skin_thickness", "insulin", "bmi")] == [5, 35, 227, 374, 11]
    iono = load("ionosphere", standardise=False)
    assert iono.feature_names[:3] == ("a1", "a3", "a4") and iono.feature_names[-1] == "a34"  # UCI's a2 dropped
    assert set(np.unique(iono.X[:, 0]).tolist()) == {0.0, 1.0}
    sonar = load("sonar", standardise=False)
    assert sonar.feature_names == tuple(f"band{i}" for i in range(1, 61))
    np.testing.assert_array_equal(sonar.X[0, :3], [0.02, 0.037, 0.043])  # UCI's 0.0200, 0.0371, 0.0428 rounded
    assert sonar.y[0] == -1.0                                             # a rock
    assert ((sonar.X >= 0) & (sonar.X <= 1)).all()


def test_uci_files_are_package_data():
    """The four files ship inside the package (pyproject's package-data pattern matches them)."""
    import tomllib
    from importlib.resources import files

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["mklscale"]
    shipped = {p.name for pattern in patterns for p in (root / "mklscale").glob(pattern)}
    assert {f"{name}.csv.gz" for name in UCI_CLASSES} <= shipped
    for name in UCI_CLASSES:
        assert files("mklscale").joinpath("data", f"{name}.csv.gz").is_file()


def test_uci_sets_refuse_size_keywords():
    with pytest.raises(InvalidInputError, match="n_samples.*fixed size"):
        load("sonar", n_samples=10)


def test_additive_labels_follow_the_informative_features_only():
    """additive: the label is a function of the first n_informative columns plus label noise; balanced
    classes; seeded; the noise columns carry no signal (a logistic fit on them alone is at chance)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    from mklscale.datasets import _ADDITIVE_EFFECTS, additive

    ds = additive(n_samples=4000, noise=0.0, seed=3, standardise=False)
    f = sum(_ADDITIVE_EFFECTS[j](ds.X[:, j]) for j in range(5))
    np.testing.assert_array_equal(ds.y, np.where(f - np.median(f) > 0, 1.0, -1.0))
    assert abs(float(np.mean(ds.y > 0)) - 0.5) < 0.01
    assert ds.feature_names[:6] == ("signal0", "signal1", "signal2", "signal3", "signal4", "noise0")
    noise_only = cross_val_score(LogisticRegression(), ds.X[:, 5:], ds.y, cv=3).mean()
    assert abs(noise_only - 0.5) < 0.05
    np.testing.assert_array_equal(additive(seed=1).X, additive(seed=1).X)
    with pytest.raises(InvalidInputError, match="n_informative = 9 exceeds n_features = 8"):
        additive(n_features=8, n_informative=9)
    with pytest.raises(InvalidInputError, match="noise must be a number >= 0"):
        additive(noise=-1.0)
