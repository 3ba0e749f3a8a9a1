"""Shared numerical pieces of the Afkanpour solvers (sgd, gcd, baselines): the final fit on a learned
kernel, the one-stage reduced objective with the squared loss, and centred alignment.

Final fit (second stage of two-stage MKL, and of the baselines)
---------------------------------------------------------------
- regression ("kernel ridge with an unpenalised bias"): min_{c, b} ||K c + b 1 - y||^2 + lam c^T K c.
  Stationarity gives the bordered system [[K + lam I, 1], [1^T, 0]] [c; b] = [y; 0]
  (for K = 0 it still gives c = (y - mean(y)) / lam, b = mean(y)). Solved exactly, float64.
- classification: scikit-learn's libsvm ``SVC(kernel="precomputed", C=C)`` through
  ``mklscale.solvers._svm.fit_svc``: dual_coef = alpha o y on the support vectors, bias = intercept,
  so f = K c + b in both cases.

Factor engines (issue 17). ``combined_kernel(engine, weights)`` is the one place that gives the
combination sum_m w_m K_m, in the form the engine's kernel representation chooses
(``Representation.choose``): the (n, n) matrix (``engine.combine``) on a dense engine, or on a factor
engine while ``lowrank.dense_ok(n)`` (the same exact code as on the dense engine of the K~_m); above
that cap a ``lowrank.LowRank`` of ``engine.combine_factors(weights)``. Every function below takes
either: on a LowRank, kernel ridge and the ridge solves use Woodbury (O(n R^2)), the SVM runs on
the features F with liblinear (``_svm.fit_linear_svc``: its bias handling and measured objective
difference are stated there), alignment and the segment search work on F.

One-stage reduced objective (thesis (2.9), (4.7), Prop. 4.2, (4.12)), squared loss, rho_i = 1
------------------------------------------------------------------------------------------------
The thesis leaves open how its "ridge parameter" maps onto the loss scale. Convention used here
(stated once, used by every solver in sgd.py and gcd.py):

    J(w, theta) = (1 / (2 lam)) sum_t (f_w(x_t) - t_t)^2 + (1/2) sum_i ||w_i||^2 / theta_i
    J(theta)    = min_w J(w, theta) = (1/2) t^T (K_theta + lam I)^{-1} t,   K_theta = sum_i theta_i K_i
    alpha*      = (K_theta + lam I)^{-1} t,   f = K_theta alpha*     (= kernel ridge with ridge lam)
    dJ/dtheta_i = -(1/2) alpha*^T K_i alpha*                          (4.12)

with t = y - b the centred targets (b = mean(y) when fit_intercept, else 0): the thesis standardises
y and adds a constant feature instead of a bias; the intercept here is the training mean.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from mklscale.errors import InvalidInputError
from mklscale.solvers import _svm
from mklscale.solvers.toolkit import lowrank
from mklscale.solvers.toolkit.lowrank import LowRank

TASKS = ("regression", "classification")


def combined_kernel(engine, weights) -> np.ndarray | LowRank:
    """sum_m weights[m] K_m (weights >= 0): (n, n) float64, or a LowRank above the dense cap on a
    factor engine (module docstring)."""
    form = engine.kernel_representation.choose(engine.combine, lambda w: LowRank(engine.combine_factors(w)),
                                               dense_fits=lowrank.dense_ok(engine.n))
    return form(weights)


def kernel_ridge(K, y: np.ndarray, lam: float, sample_weight=None) -> tuple[np.ndarray, float]:
    """(c, b) minimising sum_i w_i (K c + b 1 - y)_i^2 + lam c^T K c (bordered system, see module docstring;
    w = ``sample_weight`` > 0, else 1: stationarity gives [[K + lam W^-1, 1], [1^T, 0]] [c; b] = [y; 0])."""
    if isinstance(K, LowRank):
        if sample_weight is not None:
            raise _low_rank_weights()
        return K.kernel_ridge(y, lam)
    n = y.size
    A = np.zeros((n + 1, n + 1))
    A[:n, :n] = K + lam * (np.eye(n) if sample_weight is None else np.diag(1.0 / np.asarray(sample_weight, float)))
    A[:n, n] = 1.0
    A[n, :n] = 1.0
    sol = scipy.linalg.solve(A, np.append(y, 0.0), assume_a="sym")
    return sol[:n], float(sol[n])


def svm(K, y: np.ndarray, C: float, tol: float = 1e-3, sample_weight=None) -> tuple[np.ndarray, float, bool]:
    """(c, b, converged) of libsvm's soft-margin SVM on the precomputed Gram matrix K (liblinear on
    the features of a LowRank)."""
    _, v, intercept, converged = svm_dual(K, y, C, tol, sample_weight)
    return v, intercept, converged


def svm_dual(K, y: np.ndarray, C: float, tol: float, sample_weight=None) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """(alpha, v, intercept, converged) of ``_svm.fit_svc`` (dense K) or ``_svm.fit_linear_svc`` (LowRank)."""
    if isinstance(K, LowRank):
        if sample_weight is not None:
            raise _low_rank_weights()
        return _svm.fit_linear_svc(K.F, y, C, tol)
    return _svm.fit_svc(K, y, C, tol, sample_weight=sample_weight)


def _low_rank_weights() -> InvalidInputError:
    return InvalidInputError("sample_weight is supported by the exact final fits (libsvm's SVM, the bordered kernel "
                             f"ridge) on kernels of up to n x n = {lowrank.DENSE_BYTES_CAP / 8:.3g} float64 entries; "
                             "this factor bank is above that cap: fit without sample_weight or on fewer rows")


def final_fit(K: np.ndarray, y: np.ndarray, task: str, lam: float, C: float, sample_weight=None) -> tuple[np.ndarray, float]:
    """Kernel ridge (task="regression", ridge ``lam``) or SVM (task="classification", ``C``), each sample's
    loss term weighted by ``sample_weight`` (None: 1)."""
    if task == "regression":
        return kernel_ridge(K, y, lam, sample_weight)
    c, b, _ = svm(K, y, C, sample_weight=sample_weight)
    return c, b


def check_task(task: str, y: np.ndarray) -> str:
    if task not in TASKS:
        raise InvalidInputError(f"unknown task {task!r}; choose 'regression' (kernel ridge) or "
                                "'classification' (SVM on labels in {-1, +1})")
    if task == "classification":
        labels = np.unique(y)
        if labels.size != 2 or not np.all(np.isin(labels, (-1.0, 1.0))):
            raise InvalidInputError(f"task='classification' needs labels in {{-1, +1}} with both present; "
                                    f"got values {labels[:5].tolist()}. Map the classes to -1/+1")
    return task


# ---- one-stage reduced objective ------------------------------------------------------------
def ridge_dual(K_theta, t: np.ndarray, lam: float) -> tuple[np.ndarray, float]:
    """(alpha*, J) with alpha* = (K_theta + lam I)^{-1} t and J = (1/2) t^T alpha* (Cholesky; Woodbury
    on a LowRank)."""
    if isinstance(K_theta, LowRank):
        return K_theta.ridge_dual(t, lam)
    A = np.array(K_theta, dtype=np.float64, order="F")     # Fortran order: LAPACK factorises it in place
    A.flat[::A.shape[0] + 1] += lam
    factor = scipy.linalg.cho_factor(A, lower=True, overwrite_a=True, check_finite=False)
    alpha = scipy.linalg.cho_solve(factor, t, check_finite=False)
    return alpha, 0.5 * float(t @ alpha)


def one_stage_objective(K_theta: np.ndarray, t: np.ndarray, lam: float) -> float:
    """J(theta) = (1/2) t^T (K_theta + lam I)^{-1} t."""
    return ridge_dual(K_theta, t, lam)[1]


def exact_segment_search(A: np.ndarray, B: np.ndarray, t: np.ndarray, lam: float) -> tuple[float, float]:
    """argmin over eta in [0, 1] of J(eta) = (1/2) t^T (C(eta))^{-1} t, C(eta) = (1 - eta) A + eta B + lam I,
    exactly (to machine precision in eta).

    J is convex on [0, 1] (C stays positive definite): with E = B - A, alpha = C^{-1} t and C = L L^T,
    J'(eta) = -(1/2) alpha^T E alpha and J''(eta) = alpha^T E C^{-1} E alpha = ||L^{-1} E alpha||^2 >= 0.
    The minimiser is an endpoint where J' does not change sign, else the root of the increasing J', found
    by Newton steps kept inside a shrinking bracket (a bisection step where Newton would leave it), each
    evaluation one Cholesky factorisation of C(eta): about 6 of them, O(n^3 / 3) each. (The eigenvalues
    of L^{-1} E L^{-T} would give J in closed form, but their eigendecomposition costs ~30 Cholesky
    factorisations: 0.27 s of the 0.42 s of one GCD step at n = 1347.) Returns (eta, J(eta)). Two
    LowRank ends: ``lowrank.segment_search`` (the same search on factors).
    """
    if isinstance(A, LowRank):
        return lowrank.segment_search(A.F, B.F, t, lam)
    E = B - A

    def at(eta: float):
        """(J, J', J'') at eta."""
        C = A + eta * E
        C[np.diag_indices_from(C)] += lam
        factor = scipy.linalg.cho_factor(C, lower=True, check_finite=False)
        alpha = scipy.linalg.cho_solve(factor, t, check_finite=False)
        E_alpha = E @ alpha
        w = scipy.linalg.solve_triangular(factor[0], E_alpha, lower=True, check_finite=False)
        return 0.5 * float(t @ alpha), -0.5 * float(alpha @ E_alpha), float(w @ w)

    return lowrank.newton_root_of_increasing(at)


# ---- centred alignment ---------------------------------------------------------------------------
def centre(K: np.ndarray) -> np.ndarray:
    """C_n K C_n with C_n = I - (1/n) 1 1^T."""
    row = K.mean(axis=0)
    return K - row[None, :] - K.mean(axis=1)[:, None] + row.mean()


def centred_alignment(K, y: np.ndarray) -> float:
    """A_c(K, y y^T) = <K_c, y_c y_c^T>_F / (||K_c||_F ||y_c||^2), y_c = y - mean(y) (thesis 2.2.2)."""
    if isinstance(K, LowRank):
        return K.centred_alignment(y)
    Kc = centre(K)
    yc = y - y.mean()
    denom = np.linalg.norm(Kc) * float(yc @ yc)
    return float(yc @ Kc @ yc) / denom if denom > 0 else 0.0
