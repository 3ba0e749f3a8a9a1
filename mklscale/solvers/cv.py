"""Cross-validation of a solver's regularisation on one bank: the one CV core.

Used by the estimators' ``MKLClassifierCV`` / ``MKLRegressorCV``, by the pipelines' ``C = "auto"`` or
list grids (``mklscale.model_selection``) and by PFBS' own path CV (``paths.cross_validate``).

- **Folds** are row subsets of the same Gram matrices: fold k trains on
  ``RowSubsetEngine(engine, train_rows)`` (principal submatrices, no rebuild; an all-kernel pass of the
  view is one pass of the bank) and is scored on its held-out rows. ``fold_assignment`` deals a seeded
  shuffle round-robin, per class for classification (stratified).
- **A warm-started path per fold**: the grid is solved from the most to the least regularised value
  (``registry.fit_path``), each value starting from the previous solution where the solver warm-starts
  (spicy, pfbs, smo, citi, gcd, the baselines), as glmnet / scikit-learn's ``LassoCV`` do; one-vs-rest
  heads move along the path in lockstep. A fold's path stops once ``patience`` (2) successive values
  do not beat the best so far, that best having improved on the path's first value (``past_peak``):
  past a fold's peak the solves get dearer (less regularised, more kernels, more iterations: on the
  quickstart's data the last four values of a 10-value spicy path cost as much as the first six) and
  can only matter if the score curve rises again. The choice is made among the values every fold
  reached (the others are NaN in the scores); ``patience=None`` solves every value in every fold.
- **Prediction** of held-out rows: f(x_i) = sum_m d_m (K_m pad(c))_i + b for i held out, one
  ``engine.matvecs`` of the zero-padded dual coefficients over the kept kernels (``predict_rows``).
- **Scores**: accuracy of the labels the estimators would predict (sign f, or the argmax of the
  one-vs-rest heads), or R^2 (regression; ``r2_score``, the estimators' ``score``); or one of
  ``SCORINGS``. The best mean over the folds wins; ties go to the more regularised value (``best_index``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from mklscale.engine.views import RowSubsetEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers import registry
from mklscale.solvers.result import MKLResult

DEFAULT_FOLDS = 3
#: values a fold's path goes on without a better held-out score before it stops (None: never)
DEFAULT_PATIENCE = 2


def head_targets(y, classes) -> list[np.ndarray]:
    """The +-1 targets of the binary problems a classifier solves: classes[1] -> +1 (two classes, one
    head), else one head per class, that class against the rest."""
    y = np.asarray(y)
    if len(classes) == 2:
        return [np.where(y == classes[1], 1.0, -1.0)]
    return [np.where(y == c, 1.0, -1.0) for c in classes]


def labels(f: np.ndarray, classes) -> np.ndarray:
    """The labels the estimators predict from decision values f (n,) or (n, heads): classes[f > 0] for
    one head, classes[argmax_k f_k] for one-vs-rest."""
    classes = np.asarray(classes)
    f = np.asarray(f)
    if f.ndim == 1 or f.shape[1] == 1:
        return classes[(f.reshape(-1) > 0).astype(np.int64)]
    return classes[np.argmax(f, axis=1)]


def fold_assignment(y: np.ndarray, folds: int, classification: bool, seed: int) -> np.ndarray:
    """Fold index per row: a seeded shuffle dealt round-robin (per class for classification, so every
    fold keeps the class proportions)."""
    rng = np.random.default_rng(seed)
    y = np.asarray(y)
    fold = np.empty(y.size, dtype=np.int64)
    groups = [np.flatnonzero(y == c) for c in np.unique(y)] if classification else [np.arange(y.size)]
    offset = 0
    for rows in groups:
        rows = rng.permutation(rows)
        fold[rows] = (np.arange(rows.size) + offset) % folds
        offset += rows.size
    return fold


def predict_rows(engine, result: MKLResult, train_rows, rows) -> np.ndarray:
    """f at bank rows ``rows`` for a model trained on ``train_rows`` of the same bank:
    sum_j d_j (K_j pad(c))[rows] + b, one engine.matvecs over the active kernels."""
    padded = np.zeros(int(engine.n))
    padded[np.asarray(train_rows)] = result.dual_coef
    pred = np.full(np.asarray(rows).size, result.bias)
    if result.active.size:
        K_c = np.asarray(engine.matvecs(padded, kernels=result.active))
        pred += result.weights[result.active] @ K_c[:, rows]
    return pred


# ---- scores ---------------------------------------------------------------------------------------
def _accuracy(y, f, classes):
    return float(np.mean(labels(f, classes) == y))


def _balanced_accuracy(y, f, classes):
    from sklearn.metrics import balanced_accuracy_score

    return float(balanced_accuracy_score(y, labels(f, classes)))


def _roc_auc(y, f, classes):
    from sklearn.metrics import roc_auc_score

    f = np.asarray(f)
    if f.ndim == 1 or f.shape[1] == 1:
        return float(roc_auc_score(y == classes[1], f.reshape(-1)))
    return float(np.mean([roc_auc_score(y == c, f[:, k]) for k, c in enumerate(classes)]))


def _r2(y, f, classes):
    from sklearn.metrics import r2_score

    return float(r2_score(y, np.asarray(f).reshape(-1)))


def _neg_mse(y, f, classes):
    return -float(np.mean((np.asarray(f).reshape(-1) - y) ** 2))


def _neg_rmse(y, f, classes):
    return -float(np.sqrt(np.mean((np.asarray(f).reshape(-1) - y) ** 2)))


#: scoring name -> (score(y, f, classes), tasks): greater is better (scikit-learn's convention)
SCORINGS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "accuracy": (_accuracy, ("classification",)),
    "balanced_accuracy": (_balanced_accuracy, ("classification",)),
    "roc_auc": (_roc_auc, ("classification",)),
    "r2": (_r2, ("regression",)),
    "neg_mean_squared_error": (_neg_mse, ("regression",)),
    "neg_root_mean_squared_error": (_neg_rmse, ("regression",)),
}


def check_scoring(scoring: str | None, task: str) -> str:
    """The scoring name (None: accuracy for classification, r2 for regression); others refused."""
    name = ("accuracy" if task == "classification" else "r2") if scoring is None else scoring
    if name not in SCORINGS or task not in SCORINGS[name][1]:
        fits = [k for k, (_, tasks) in SCORINGS.items() if task in tasks]
        raise InvalidInputError(f"scoring {scoring!r} is not available for {task}; use one of {fits} (or None: "
                                f"{fits[0]})")
    return name


def score(y, f, classes, scoring: str) -> float:
    """The score of decision values f (n,) or (n, heads) on targets y (greater is better)."""
    return SCORINGS[scoring][0](np.asarray(y), f, None if classes is None else np.asarray(classes))


def past_peak(path: list[float], patience: int | None) -> bool:
    """Whether a fold's path of held-out scores (most regularised first) may stop: the best score so far
    beats the path's first one (so a flat start, e.g. SVM constants too small to leave the constant
    model, never stops it) and none of the last ``patience`` values beats that best (a plateau at the top
    stops too: ties go to the more regularised value, so a tie further on is never chosen)."""
    if patience is None or len(path) <= patience:
        return False
    best = max(path[:-patience])
    return best > path[0] + 1e-12 and all(s <= best + 1e-12 for s in path[-patience:])


def best_index(mean: np.ndarray, grid, larger_regularises: bool) -> int:
    """Index of the best mean score (NaN: a value some fold did not reach, never chosen); ties (within
    1e-12) go to the more regularised value."""
    mean = np.asarray(mean, dtype=np.float64)
    top = np.flatnonzero(mean >= np.nanmax(mean) - 1e-12)
    values = np.asarray(grid, dtype=np.float64)[top]
    return int(top[np.argmax(values) if larger_regularises else np.argmin(values)])


# ---- the cross-validation ----------------------------------------------------------------------------
@dataclasses.dataclass
class CVScores:
    """Fold scores of a grid: ``scores``, ``unconverged`` and ``fit_seconds`` (the solve alone, without
    scoring) (n_values, folds), the values in the order given (NaN: a value the fold's path did not
    reach); ``fold`` the fold of every row; ``finished`` (folds,) whether each fold's path has run;
    ``seconds`` per fold (NaN for folds taken from ``done``)."""

    grid: list
    scores: np.ndarray
    unconverged: np.ndarray
    fold: np.ndarray
    seconds: np.ndarray
    scoring: str
    finished: np.ndarray
    fit_seconds: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        return self.scores.mean(axis=1)

    @property
    def std(self) -> np.ndarray:
        return self.scores.std(axis=1)


def cross_validate(name: str, engine, y, task: str, grid, params: dict | None = None, classes=None,
                   folds: int = DEFAULT_FOLDS, seed: int = 0, scoring: str | None = None,
                   fold: np.ndarray | None = None, done: CVScores | None = None,
                   on_fold: Callable[[int, CVScores], None] | None = None, sample_weight=None,
                   patience: int | None = DEFAULT_PATIENCE) -> CVScores:
    """k-fold CV of solver ``name``'s regularisation over ``grid`` on ``engine`` (module docstring).

    ``y``: labels (classification, with ``classes`` the sorted labels) or real targets of the engine's
    rows. ``fold``: a fold index per row (default ``fold_assignment(y, folds, ..., seed)``). ``done``:
    the CVScores of a stopped run of the same problem: its ``finished`` folds are kept, not rerun.
    ``on_fold(k, partial)`` runs after each fold (saving state, progress, stopping).
    ``sample_weight`` (n,): each fold fits with its training rows' weights (the scores are unweighted, as
    scikit-learn's GridSearchCV scores them by default). ``patience``: see the module docstring.
    """
    classification = task == "classification"
    scoring = check_scoring(scoring, task)
    y = np.asarray(y)
    heads = head_targets(y, classes) if classification else [np.asarray(y, dtype=np.float64)]
    fold = fold_assignment(y, folds, classification, seed) if fold is None else np.asarray(fold)
    folds = int(fold.max()) + 1
    grid = [float(v) for v in grid]
    partial = CVScores(grid, np.full((len(grid), folds), np.nan), np.zeros((len(grid), folds), dtype=bool), fold,
                       np.full(folds, np.nan), scoring, np.zeros(folds, dtype=bool),
                       np.full((len(grid), folds), np.nan))
    if done is not None:
        keep = np.asarray(done.finished, dtype=bool)
        partial.scores[:, keep] = done.scores[:, keep]
        partial.unconverged[:, keep] = done.unconverged[:, keep]
        partial.fit_seconds[:, keep] = done.fit_seconds[:, keep]
        partial.finished[:] = keep
    scores, unconverged, seconds = partial.scores, partial.unconverged, partial.seconds

    def run_fold(k):
        t0 = time.perf_counter()
        train, test = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        position = {v: i for i, v in enumerate(grid)}
        path: list[float] = []
        solve_started = [t0]

        def scored(value, results):
            """Score the fold at ``value``; True ends its path (``past_peak``)."""
            i = position[float(value)]
            partial.fit_seconds[i, k] = time.perf_counter() - solve_started[0]
            f = np.column_stack([predict_rows(engine, r, train, test) for r in results])
            scores[i, k] = score(y[test], f, classes, scoring)
            unconverged[i, k] = not all(r.converged for r in results)
            path.append(scores[i, k])
            solve_started[0] = time.perf_counter()
            return past_peak(path, patience)

        registry.fit_path(name, RowSubsetEngine(engine, train), [t[train] for t in heads], task, grid, params,
                          stop=scored, sample_weight=None if sample_weight is None else sample_weight[train])
        seconds[k] = time.perf_counter() - t0
        partial.finished[k] = True

    for k in range(folds):
        if not partial.finished[k]:
            run_fold(k)
            if on_fold is not None:
                on_fold(k, partial)
    return partial
