"""Feature selection from kernel weights: importances, rankings and selection stability.

A fitted MKL model keeps a few kernels k_m, each on a feature subset F_m (``KernelSpec.features``; None
means all d features). What a feature contributes is read off the weights of the kernels that use it.

**Importance** (:func:`importances`). For head h (one for binary classification and regression, one per
class for one-vs-rest) with kept weights w_{h,m}, the share of kernel m is

    s_{h,m} = |w_{h,m}| / sum_k |w_{h,k}|

and the importance of feature j is the shares of the kernels that use it, each split evenly among its
features, averaged over the H heads:

    importance_j = (1/H) sum_h sum_{m : j in F_m} s_{h,m} / |F_m|        (F_m = all d features when None)

So importances are >= 0 and sum to 1 (a head that keeps no kernel adds 0, so then to less). A
per-feature kernel (F_m = {j}) gives its whole share to j; a kernel over all features gives s/d to every
feature: it adds the same amount to each, so it never changes the order of the features, but it makes
every feature's importance non-zero, i.e. every feature *selected* (the model does use them all). To
select features, use banks of kernels on feature subsets (per-feature families, ``random_subsets``).
:func:`all_features_share` is the part of the total that such kernels carry.

**Selected features** (:func:`ranked`): the features with non-zero importance, the most important first
(ties by column index).

**Stability** (:func:`stability`): how often each feature is selected when the model is refitted
- on random subsamples of the training rows (stability selection, Meinshausen and Buehlmann 2010: each
  subsample draws ``fraction`` (default 0.5) of every class's rows without replacement; the rows of a
  bank's row view are distinct, so resampling with replacement is not offered), each at the given
  values of the regularisation (a warm-started path, ``registry.fit_path``). Each value is taken
  relative to the problem's scale (``Regularisation.scale``: spicy's C_max, n / mean trace for SVM
  constants, ...): on a subsample the fit is at value x scale(subsample) / scale(all rows), the same
  point of its own path (a loss summed over half the rows at the same C would give a sparser model);
- or, with ``n_resamples = 0``, along the path over the values on all training rows (one fit per value).

All fits run on ONE bank: a subsample is a row view of it (``RowSubsetEngine``), nothing is rebuilt.
The frequency of feature j is (fits that select j) / (fits); per value and over all values. Features are
listed by frequency, ties by their importance averaged over the fits (along a path, a feature that enters
early has the higher frequency).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from mklscale.engine.views import RowSubsetEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers import registry
from mklscale.solvers.cv import head_targets

#: the most features a results.json stability record lists (the most often selected first)
MAX_RECORDED = 1000


# ---- importances ---------------------------------------------------------------------------------
def _subset_sizes(features: Sequence, n_features: int) -> np.ndarray:
    """|F_m| per kernel (d for None), checking every index against ``n_features``."""
    sizes = np.empty(len(features), dtype=np.int64)
    for m, f in enumerate(features):
        if f is None:
            sizes[m] = n_features
            continue
        if len(f) == 0 or min(f) < 0 or max(f) >= n_features:
            raise InvalidInputError(f"kernel {m} uses features {tuple(f)}, outside the {n_features} feature(s) of the "
                                    "data; give the kernels' feature subsets of this data")
        sizes[m] = len(f)
    return sizes


def shares(weights) -> np.ndarray:
    """(H, k) shares s_{h,m} = |w_{h,m}| / sum_k |w_{h,k}| of (H, k) or (k,) weights (a zero row stays 0)."""
    W = np.abs(np.atleast_2d(np.asarray(weights, dtype=np.float64)))
    if not np.all(np.isfinite(W)):
        raise InvalidInputError("kernel weights must be finite to rank features; the fit did not finish cleanly")
    totals = W.sum(axis=1, keepdims=True)
    return np.divide(W, totals, out=np.zeros_like(W), where=totals > 0)


def importances(features: Sequence, weights, n_features: int) -> np.ndarray:
    """(d,) importance_j = (1/H) sum_h sum_{m: j in F_m} s_{h,m} / |F_m| (module docstring).

    ``features``: the k kept kernels' feature subsets (tuples of column indices, None = all features);
    ``weights``: their (H, k) weights per head, or (k,) for one head; ``n_features``: d.
    """
    if not isinstance(n_features, (int, np.integer)) or n_features < 1:
        raise InvalidInputError(f"n_features must be a positive int; got {n_features!r}")
    S = shares(weights)
    if S.shape[1] != len(features):
        raise InvalidInputError(f"{S.shape[1]} kernel weights per head but {len(features)} feature subsets; give "
                                "one subset per kept kernel")
    sizes = _subset_sizes(features, int(n_features))
    per_kernel = S.mean(axis=0) / sizes                    # each kernel's mean share, split among its features
    out = np.zeros(int(n_features))
    for m, f in enumerate(features):
        if per_kernel[m] == 0.0:
            continue
        if f is None:
            out += per_kernel[m]
        else:
            out[list(f)] += per_kernel[m]
    return out


def all_features_share(features: Sequence, weights, n_features: int) -> float:
    """The part of the importances' total carried by kernels over all d features (None, or every column):
    it is spread evenly, ``all_features_share / d`` on every feature."""
    S = shares(weights)
    sizes = _subset_sizes(features, int(n_features))
    return float(S.mean(axis=0)[sizes == n_features].sum())


def ranked(importance: np.ndarray) -> np.ndarray:
    """Indices of the features with non-zero importance, the most important first (ties: lower index first)."""
    importance = np.asarray(importance, dtype=np.float64)
    nonzero = np.flatnonzero(importance > 0)
    return nonzero[np.lexsort((nonzero, -importance[nonzero]))]


def names_of(n_features: int, feature_names=None) -> list:
    """Each feature's name: ``feature_names`` (a DataFrame's columns) where given, else its column index."""
    if feature_names is None:
        return list(range(int(n_features)))
    names = list(feature_names)
    if len(names) != n_features:
        raise InvalidInputError(f"{len(names)} feature names for {n_features} features; give one name per column")
    return names


# ---- stability -------------------------------------------------------------------------------------
@dataclasses.dataclass
class FeatureStability:
    """How often each feature was selected (non-zero importance) over refits (module docstring).

    values : the regularisation values, from the most to the least regularised (``parameter`` names it).
    counts : (n_values, d) fits at each value that selected each feature; fits : (n_values,) fits per value.
    all_feature_fits : (n_values,) fits that kept a kernel over all features (those select every feature).
    importance_sums : (n_values, d) the features' importances summed over the fits at each value.
    n_resamples : subsamples (0: one fit per value on all rows, "along the path"); fraction : of each class's rows.
    """

    values: list[float]
    parameter: str
    counts: np.ndarray
    fits: np.ndarray
    all_feature_fits: np.ndarray
    importance_sums: np.ndarray
    n_resamples: int
    fraction: float | None
    seed: int
    feature_names: list
    seconds: float = 0.0

    @property
    def n_features(self) -> int:
        return int(self.counts.shape[1])

    @property
    def frequency_by_value(self) -> np.ndarray:
        """(n_values, d): the fraction of the fits at each value that selected each feature."""
        return self.counts / np.maximum(self.fits, 1)[:, None]

    @property
    def frequency(self) -> np.ndarray:
        """(d,): the fraction of all fits (every subsample at every value) that selected each feature."""
        return self.counts.sum(axis=0) / max(int(self.fits.sum()), 1)

    @property
    def max_frequency(self) -> np.ndarray:
        """(d,): the largest frequency over the values (stability selection's score, Meinshausen-Buehlmann)."""
        return self.frequency_by_value.max(axis=0)

    @property
    def mean_importance(self) -> np.ndarray:
        """(d,): the features' importance averaged over all fits (0 in the fits that did not select them)."""
        return self.importance_sums.sum(axis=0) / max(int(self.fits.sum()), 1)

    def order(self) -> np.ndarray:
        """Every feature index, the most often selected first; ties by the mean importance, then the index."""
        d = np.arange(self.n_features)
        return np.lexsort((d, -self.mean_importance, -self.frequency))

    def to_frame(self):
        """A pandas DataFrame indexed by feature (its name, or column index), the most often selected first:
        ``frequency``, ``max_frequency``, ``mean_importance`` and one column per value (``<parameter>=<value>``:
        the frequency at that value)."""
        import pandas as pd

        order = self.order()
        columns = {"frequency": self.frequency[order], "max_frequency": self.max_frequency[order],
                   "mean_importance": self.mean_importance[order]}
        for i, v in enumerate(self.values):
            columns[f"{self.parameter}={v:.4g}"] = self.frequency_by_value[i, order]
        index = pd.Index([self.feature_names[j] for j in order], name="feature")
        return pd.DataFrame(columns, index=index)

    def to_record(self, importance: np.ndarray | None = None, top: int = MAX_RECORDED) -> dict:
        """The results.json record (``mklscale.results``): the ``top`` most often selected features that
        were selected at least once (their indices, names, frequency, per-value frequency and, with
        ``importance``, their importance in the model fitted on all rows), and the counts behind them."""
        order = self.order()
        order = order[self.frequency[order] > 0][:top]
        return {
            "parameter": self.parameter, "values": [float(v) for v in self.values],
            "n_resamples": int(self.n_resamples), "fraction": self.fraction, "seed": int(self.seed),
            "fits": [int(f) for f in self.fits], "all_feature_fits": [int(f) for f in self.all_feature_fits],
            "n_features": self.n_features, "n_selected": int(np.count_nonzero(self.frequency > 0)),
            "features": [int(j) for j in order], "names": [str(self.feature_names[j]) for j in order],
            "frequency": [float(self.frequency[j]) for j in order],
            "mean_importance": [float(self.mean_importance[j]) for j in order],
            "frequency_by_value": [[float(self.frequency_by_value[i, j]) for j in order]
                                   for i in range(len(self.values))],
            "importance": None if importance is None else [float(importance[j]) for j in order],
            "seconds": float(self.seconds),
        }


def subsample(y, fraction: float, classification: bool, rng: np.random.Generator) -> np.ndarray:
    """Sorted row indices: ``round(fraction * n_c)`` (at least 2) of every class's n_c rows (classification),
    or of all rows, drawn without replacement."""
    y = np.asarray(y)
    groups = [np.flatnonzero(y == c) for c in np.unique(y)] if classification else [np.arange(y.size)]
    rows = []
    for g in groups:
        take = max(2, int(round(fraction * g.size)))
        if take >= g.size:
            what = "class" if classification else "data"
            raise InvalidInputError(f"fraction={fraction:g} of a {what} with {g.size} rows leaves no row out (a "
                                    "subsample takes at least 2 rows of each class); use a smaller fraction or more "
                                    "rows")
        rows.append(rng.choice(g, size=take, replace=False))
    return np.sort(np.concatenate(rows))


def check_settings(n_resamples, fraction) -> None:
    """``n_resamples`` an int >= 0 and ``fraction`` in (0, 1), or InvalidInputError saying so."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 0:
        raise InvalidInputError(f"n_resamples must be an int >= 0 (0: along the path on all rows); got {n_resamples!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)) or not 0 < fraction < 1:
        raise InvalidInputError(f"fraction must be a number in (0, 1), the share of the rows each subsample draws "
                                f"(0.5: stability selection's half samples); got {fraction!r}")


def stability(name: str, engine, specs: Sequence, y, task: str, values, params: dict | None = None, classes=None,
              n_features: int | None = None, n_resamples: int = 20, fraction: float = 0.5, seed: int = 0,
              feature_names=None, sample_weight=None) -> FeatureStability:
    """Selection frequency of every feature over refits of solver ``name`` on ``engine`` (module docstring).

    ``specs``: the bank's KernelSpecs (all M of them); ``y``: labels (with the sorted ``classes``) or real
    targets of the engine's rows; ``values``: the regularisation values (any order: each path runs from
    the most to the least regularised); ``params``: the solver's other parameters; ``n_features``: d
    (default: from the specs' largest index); ``sample_weight``: (n,) per-row weights of the solver's fit
    (a subsample's fits take its rows' weights), for the solvers that take them.
    """
    check_settings(n_resamples, fraction)
    features = [s.features for s in specs]
    if any(s.family == "precomputed" for s in specs):
        raise InvalidInputError("the bank holds imported Gram matrices (kernels='precomputed'): its kernels have no "
                                "features, so no feature is selected; stability needs a bank built from features")
    if n_features is None:
        n_features = 1 + max((max(f) for f in features if f is not None), default=-1)
        if any(f is None for f in features) or n_features < 1:
            raise InvalidInputError("n_features is needed when a kernel uses all features; give the data's d")
    classification = task == "classification"
    y = np.asarray(y)
    heads = head_targets(y, classes) if classification else [np.asarray(y, dtype=np.float64)]
    reg = registry.regularisation(name, task, registry.check_params(name, params, task))
    values = reg.order(values)
    if not values:
        raise InvalidInputError("no regularisation value to fit at; give at least one")
    d, t0 = int(n_features), time.perf_counter()
    counts = np.zeros((len(values), d), dtype=np.int64)
    fits = np.zeros(len(values), dtype=np.int64)
    wide = np.zeros(len(values), dtype=np.int64)
    importance_sums = np.zeros((len(values), d))
    rng = np.random.default_rng(seed)
    draws = [None] if n_resamples == 0 else [subsample(y, float(fraction), classification, rng)
                                              for _ in range(int(n_resamples))]
    full_scale = None if n_resamples == 0 else float(reg.scale(engine, heads, task, dict(params or {})))
    for rows in draws:
        view = engine if rows is None else RowSubsetEngine(engine, rows)
        targets = heads if rows is None else [h[rows] for h in heads]
        at = values
        if rows is not None:      # the same point of the subsample's own path (module docstring)
            at = [v * float(reg.scale(view, targets, task, dict(params or {}))) / full_scale for v in values]
        weights = None if sample_weight is None else np.asarray(sample_weight)[slice(None) if rows is None else rows]
        path = registry.fit_path(name, view, targets, task, at, params, sample_weight=weights)
        for i, results in enumerate(path):
            active = np.unique(np.concatenate([r.active for r in results])).astype(np.int64)
            weights = np.array([r.weights[active] for r in results])
            kept = [features[m] for m in active]
            imp = importances(kept, weights, d) if active.size else np.zeros(d)
            counts[i] += imp > 0
            importance_sums[i] += imp
            fits[i] += 1
            wide[i] += any(f is None or len(f) == d for f in kept)
    return FeatureStability(values=[float(v) for v in values], parameter=reg.name, counts=counts, fits=fits,
                            all_feature_fits=wide, importance_sums=importance_sums, n_resamples=int(n_resamples),
                            fraction=None if n_resamples == 0 else float(fraction), seed=int(seed),
                            feature_names=names_of(d, feature_names), seconds=time.perf_counter() - t0)
