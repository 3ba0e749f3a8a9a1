"""Offline datasets and seeded synthetic generators. Nothing is ever downloaded.

Two kinds of dataset are available through :func:`load`:

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

__all__ = ["Dataset", "available", "load", "ringnorm", "twonorm", "waveform"]

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
    "twonorm": (twonorm, _GENERATED_KW),
    "ringnorm": (ringnorm, _GENERATED_KW),
    "waveform": (waveform, _GENERATED_KW),
    "waveform_multiclass": (_waveform_multiclass, _GENERATED_KW),
}


def available() -> list[str]:
    """Sorted names accepted by :func:`load`."""
    return sorted(_REGISTRY)


def load(name: str, **kwargs: Any) -> Dataset:
    """Load a bundled dataset or draw a generated one by name (see the module docstring).

    Generated datasets accept ``n_samples`` (>= 2), ``n_features`` (>= 1; waveform >= 21), ``seed``
    (int >= 0) and ``standardise``; bundled datasets accept only ``standardise``. Anything else,
    and any unknown name, raises :class:`~mklscale.errors.InvalidInputError`.
    """
    if name not in _REGISTRY:
        raise InvalidInputError(
            f"unknown dataset {name!r}; choose one of the available datasets: {', '.join(available())} "
            "(offline only; for your own data pass the arrays, or .npy files with --features/--labels)"
        )
    factory, accepted = _REGISTRY[name]
    for key in kwargs:
        if key in accepted:
            continue
        if key in _SIZE_KW:
            raise InvalidInputError(
                f"dataset {name!r} does not accept keyword {key!r}: bundled datasets have fixed "
                f"size and content; remove it (only {sorted(accepted)} may be given)"
            )
        raise InvalidInputError(
            f"dataset {name!r} does not accept keyword {key!r}; remove it (accepted: {sorted(accepted)})"
        )
    return factory(**kwargs)
