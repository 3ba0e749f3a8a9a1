"""The tau path, K-fold cross-validation over (tau, mu) and the path plot for PFBS.

(The software modules rls_dual_mkl / paramsel_homkl / plot_mkl_L1path of Liu §2; the paper's
continuation section is headings only, so the grid below is ours.)

Path: tau_max = max_j sqrt(y^T K_j y) / n is the smallest tau with alpha = 0 optimal for problem (1)
as scaled in ``pfbs`` (KKT: alpha = 0 iff ||y||_{K_j} / n <= tau for all j; verified in the tests).
The default grid is geometric from tau_max down to eps * tau_max. Each tau starts from the previous
solution (warm start) with the same held blocks, working set and last full-pass norms, so a tau
usually costs one certification pass.

Cross-validation is the one CV core (``mklscale.solvers.cv``) run over the whole grid for each mu:
folds are row subsets of the same Gram matrices, each fold's path starts every tau from the previous
solution (``registry.fit_path``: ``pfbs.fit(init=...)``, a fresh working set from the previous model's
kernels; keeping one ``PFBSSolver`` across the taus, as :func:`path` does, made the CV estimators'
PFBS paths twice as slow: its held blocks only grow), and held-out rows are predicted with one
engine.matvecs of the zero-padded dual coefficients over the active kernels.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from mklscale.errors import InvalidInputError
from mklscale.solvers import _validation as check
from mklscale.solvers import cv
from mklscale.solvers.pfbs import PFBSSolver, tau_max
from mklscale.solvers.result import MKLResult

TASKS = ("regression", "classification")
#: mu scales like (kernel eigenvalue) / n; these suit unit-trace kernels (the bank's default
#: normalisation): the ridge n * mu then ranges from well below to near the top eigenvalues.
DEFAULT_MUS = (1e-5, 1e-4, 1e-3)


# ---- the path ---------------------------------------------------------------------------------

@dataclasses.dataclass
class PFBSPath:
    """Solutions of problem (1) over a decreasing tau grid at one mu.

    taus (k,), weights (k, M) (row i = results[i].weights), active (list of index arrays),
    objectives, gaps (k,), iterations and passes (k,) per tau, seconds (k,) wall time per tau,
    converged (k,) bool, results (the MKLResults), tau_max (None when the grid was given).
    """

    taus: np.ndarray
    mu: float
    weights: np.ndarray
    active: list
    objectives: np.ndarray
    gaps: np.ndarray
    iterations: np.ndarray
    passes: np.ndarray
    seconds: np.ndarray
    converged: np.ndarray
    results: list
    tau_max: float | None = None
    warm_start: bool = True
    accelerated: bool = False

    @property
    def total_iterations(self) -> int:
        return int(self.iterations.sum())

    @property
    def total_passes(self) -> int:
        return int(self.passes.sum())


def tau_grid(tau_max: float, n_taus: int = 20, eps: float = 1e-3) -> np.ndarray:
    """n_taus values from tau_max down to eps * tau_max, evenly spaced in log."""
    tau_max = check.check_positive("tau_max", tau_max)
    n_taus = check.check_count("n_taus", n_taus)
    eps = check.check_positive("eps", eps)
    if eps >= 1.0:
        raise InvalidInputError(f"eps must be in (0, 1) (the grid ends at eps * tau_max); got {eps}")
    return np.geomspace(tau_max, eps * tau_max, n_taus)


def _check_taus(taus) -> np.ndarray:
    try:
        taus = np.asarray(taus, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise InvalidInputError("taus must be a 1-D sequence of numbers") from None
    if taus.size == 0 or not np.all(np.isfinite(taus)) or np.any(taus < 0.0):
        raise InvalidInputError(f"taus must be a non-empty list of finite values >= 0; got {taus.tolist()[:10]}")
    if np.any(np.diff(taus) >= 0.0):
        raise InvalidInputError("taus must be strictly decreasing (a path runs from tau_max down, "
                                f"warm-starting each value from the previous one); got {taus.tolist()[:10]}")
    return taus


def path(engine, y, taus=None, n_taus: int = 20, mu: float = 1e-4, eps: float = 1e-3, tol: float = 1e-6,
         max_iter: int = 20000, accelerated: bool = True, center: bool = False, warm_start: bool = True,
         step: str = "lipschitz", working_set=None, verbose: bool = False) -> PFBSPath:
    """Solve problem (1) for every tau of a decreasing grid (default: :func:`tau_grid` from
    tau_max = max_j sqrt(y^T K_j y)/n, n_taus values down to eps * tau_max) at fixed mu.

    ``warm_start=False`` starts every tau from alpha = 0 with a fresh working set (for comparison).
    Other arguments as in :func:`mklscale.solvers.pfbs.fit`; ``tol`` and ``max_iter`` apply per tau.
    """
    options = dict(center=center, step=step, working_set=working_set, accelerated=accelerated, tol=tol,
                   max_iter=max_iter, verbose=verbose)
    solver = PFBSSolver(engine, y, mu, **options)
    if not isinstance(warm_start, (bool, np.bool_)):
        raise InvalidInputError(f"warm_start must be True or False; got {warm_start!r}")
    tmax = None
    if taus is None:
        # this pass is at the residual of alpha = 0, so the first solve reuses it
        tmax = float(solver.screen.full_pass(-solver.y).max()) / solver.n
        if tmax <= 0.0:
            raise InvalidInputError("tau_max = 0: y is orthogonal to every kernel (y^T K_j y = 0 for all "
                                    "j; after centring, if center=True); there is nothing to fit")
        taus = tau_grid(tmax, n_taus, eps)
    else:
        taus = _check_taus(taus)
    results, seconds = [], []
    for tau in taus:
        if not warm_start:
            solver = PFBSSolver(engine, y, mu, **options)
        t0 = time.perf_counter()
        results.append(solver.solve(float(tau)))
        seconds.append(time.perf_counter() - t0)
    return PFBSPath(
        taus=taus, mu=float(mu),
        weights=np.array([r.weights for r in results]),
        active=[r.active.copy() for r in results],
        objectives=np.array([r.objective for r in results]),
        gaps=np.array([r.gap for r in results]),
        iterations=np.array([r.params["iterations"] for r in results], dtype=np.int64),
        passes=np.array([r.history[-1]["passes"] if r.history else 0 for r in results], dtype=np.int64),
        seconds=np.array(seconds),
        converged=np.array([r.converged for r in results]),
        results=results, tau_max=tmax, warm_start=bool(warm_start), accelerated=bool(accelerated))


# ---- cross-validation -------------------------------------------------------------------------

@dataclasses.dataclass
class CrossValidation:
    """K-fold CV of PFBS over (mu, tau).

    errors, errors_std (n_mus, n_taus): mean and standard deviation over folds of the metric
    (RMSE for regression, accuracy for classification); fold_errors (n_mus, n_taus, folds);
    best_tau, best_mu: the selection; result: the refit on all rows at (best_tau, best_mu);
    fold_of_row (n,): the fold each row was held out in.
    """

    taus: np.ndarray
    mus: np.ndarray
    errors: np.ndarray
    errors_std: np.ndarray
    fold_errors: np.ndarray
    metric: str
    best_tau: float
    best_mu: float
    result: MKLResult
    fold_of_row: np.ndarray
    seconds: float


#: the labels of a +-1 classification problem, as the CV core takes them (the sign of f predicts)
CLASSES = np.array([-1.0, 1.0])


def cross_validate(engine, y, taus=None, mus=DEFAULT_MUS, folds: int = 5, task: str = "regression",
                   seed: int = 0, n_taus: int = 20, eps: float = 1e-3, center: bool = False,
                   accelerated: bool = True, tol: float = 1e-5, max_iter: int = 20000,
                   step: str = "lipschitz", verbose: bool = False) -> CrossValidation:
    """K-fold CV of PFBS over the grid mus x taus, then a refit on all rows.

    The one CV core (``cv.cross_validate``, every value of the grid): folds are row subsets of the same
    Gram matrices (no rebuild), each trains a warm-started path and scores the held-out rows by RMSE
    ("regression") or accuracy of the predicted labels, +1 where f > 0 ("classification", targets in
    {-1, +1}; folds stratified by class). The
    default tau grid comes from tau_max of ALL rows and is shared by every fold (values above a
    fold's own tau_max give the zero model there). The best cell minimises mean RMSE / maximises
    mean accuracy; ties go to the larger tau (sparser), then to the earlier mu. The refit follows
    the same grid down to best_tau, warm-started, on the whole engine.
    """
    t0 = time.perf_counter()
    check.check_choice("task", task, TASKS)
    classification = task == "classification"
    n, _, _ = check.check_engine(engine)
    y = check.check_targets(y, n, classification, "square (classification)" if classification else "square")
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or not 2 <= folds <= n:
        raise InvalidInputError(f"folds must be an integer with 2 <= folds <= n = {n}; got {folds!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidInputError(f"seed must be an integer >= 0; got {seed!r}")
    mus = np.asarray(mus, dtype=np.float64).reshape(-1)
    if mus.size == 0 or not np.all(np.isfinite(mus)) or np.any(mus < 0.0):
        raise InvalidInputError(f"mus must be a non-empty list of finite values >= 0; got {mus.tolist()}")
    if taus is None:
        taus = tau_grid(tau_max(engine, y, center), n_taus, eps)
    else:
        taus = _check_taus(taus)
    fold_of_row = cv.fold_assignment(y, int(folds), classification, int(seed))
    options = dict(tol=tol, max_iter=max_iter, accelerated=accelerated, center=center, step=step)
    fold_errors = np.empty((mus.size, taus.size, int(folds)))
    for i, mu in enumerate(mus):  # the one CV core, over the whole grid (no early stop: the curve is shown)
        scores = cv.cross_validate("pfbs", engine, y, task, taus, {**options, "mu": float(mu)},
                                   classes=CLASSES if classification else None, fold=fold_of_row,
                                   scoring="accuracy" if classification else "neg_root_mean_squared_error",
                                   patience=None)
        fold_errors[i] = scores.scores if classification else -scores.scores
        if verbose:
            for k in range(int(folds)):
                print(f"cv mu={mu:g} fold {k}: {fold_errors[i, :, k].round(4).tolist()}")
    errors, errors_std = fold_errors.mean(axis=2), fold_errors.std(axis=2)
    ranking = -errors.T if classification else errors.T          # (n_taus, n_mus): larger tau first
    best_tau_idx, best_mu_idx = np.unravel_index(int(np.argmin(ranking)), ranking.shape)
    refit = path(engine, y, mu=float(mus[best_mu_idx]), taus=taus[: best_tau_idx + 1], **options)
    return CrossValidation(taus=taus, mus=mus, errors=errors, errors_std=errors_std, fold_errors=fold_errors,
                           metric="accuracy" if classification else "rmse",
                           best_tau=float(taus[best_tau_idx]), best_mu=float(mus[best_mu_idx]),
                           result=refit.results[-1], fold_of_row=fold_of_row,
                           seconds=time.perf_counter() - t0)


# ---- plot -------------------------------------------------------------------------------------

def plot_path(pfbs_path: PFBSPath, ax=None, names=None, max_legend: int = 12):
    """Kernel weight d_m versus tau (log x) for every kernel active somewhere on the path.

    Needs matplotlib; returns the Axes. ``names`` optionally labels the M kernels.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot_path needs matplotlib, which is not installed; install it "
                          "(pip install matplotlib) or plot PFBSPath.weights yourself") from None
    if not isinstance(pfbs_path, PFBSPath):
        raise InvalidInputError(f"plot_path takes a PFBSPath (from pfbs.path); got {type(pfbs_path).__name__}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    taus, weights = pfbs_path.taus, pfbs_path.weights
    shown = np.flatnonzero((weights > 0.0).any(axis=0))
    for m in shown:
        label = names[m] if names is not None else f"kernel {m}"
        ax.plot(taus, weights[:, m], marker=".", linewidth=1.2, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("tau (group-L1 weight)")
    ax.set_ylabel("kernel weight d_m")
    ax.set_title(f"PFBS path, mu = {pfbs_path.mu:g}: {shown.size} of {weights.shape[1]} kernels ever active")
    if 0 < shown.size <= max_legend:
        ax.legend(fontsize="small", loc="best")
    ax.grid(True, which="both", alpha=0.3)
    return ax
