"""Shared pieces of the SVM-based MKL solvers (Citi elastic-net MKL, SMO-MKL).

- ``fit_svc``: scikit-learn's libsvm ``SVC(kernel="precomputed")`` on a combined Gram matrix, returned
  in the papers' notation. libsvm solves min (1/2) v^T K v - 1^T alpha, 0 <= alpha <= C, y^T alpha = 0,
  with v = alpha o y; ``dual_coef_`` holds v on the support vectors and the decision function is
  f = K v + intercept_ (so the bias of Citi's (1), which enters with a minus sign, is -intercept_).
- ``fit_linear_svc``: the same SVM on features F (K = F F^T, a combined factor kernel too large to
  materialise, ``lowrank``) with liblinear (module docstring of that function: the bias, measured).
- ``hinge_sum``, ``optimal_bias``: sum_i max(0, 1 - y_i (f0_i + b)) and its exact minimiser in b.
- ``check_engine``, ``probe_vectors``, ``check_quad_forms``: the engine checks plus the cheap PSD test
  of the solvers (lambda_max < 0, then quadratic forms of the solver's vectors and seeded probes).
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.optimize
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import SVC, LinearSVC

from mklscale.errors import InvalidInputError
from mklscale.solvers import _validation as check

#: A quadratic form below -PSD_RTOL * max(lambda_max(K), 1) * ||u||^2 proves K is not PSD: the tolerance
#: of the bank's own import check (KernelBank.from_arrays, psd_tol), far above the float32 storage
#: rounding of a valid kernel (its spectral norm is about sqrt(n) * 6e-8 * max |K_ij|).
PSD_RTOL = 1e-6
#: Seeded random probe vectors added to the first all-kernel pass of a solver.
N_PROBES = 3



def fit_svc(K: np.ndarray, y: np.ndarray, C: float, tol: float, max_iter: int = -1, sample_weight=None):
    """SVM on the precomputed Gram matrix K; ``sample_weight`` w scales each hinge term (libsvm's per-sample
    C_i = C w_i, scikit-learn's ``SVC.fit(..., sample_weight)``).

    Returns (alpha, v, intercept, converged): alpha (n,) in [0, C w] with y^T alpha = 0, v = alpha o y,
    f = K v + intercept the decision values, and whether libsvm met its tolerance ``tol`` (libsvm
    stops when max_{I_low} y_i grad_i - min_{I_up} y_i grad_i <= tol, i.e. OPT_6 with 2 eps = tol).
    """
    svc = SVC(C=C, kernel="precomputed", tol=tol, shrinking=True, max_iter=max_iter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        svc.fit(K, y, sample_weight=sample_weight)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    # classes_ is sorted ([-1, 1]) and scikit-learn orients dual_coef_/intercept_ so that f > 0
    # means classes_[1] = +1: dual_coef_ is y_l alpha_l on the support vectors.
    v = np.zeros(y.size)
    v[svc.support_] = svc.dual_coef_[0]
    alpha = np.clip(v * y, 0.0, C if sample_weight is None else C * np.asarray(sample_weight, dtype=np.float64))
    return alpha, alpha * y, float(svc.intercept_[0]), converged


def fit_linear_svc(F: np.ndarray, y: np.ndarray, C: float, tol: float, max_iter: int = 100_000):
    """SVM on the features F (n, R), K = F F^T, through liblinear (scikit-learn ``LinearSVC``, dual
    coordinate descent, hinge loss): the problem of ``fit_svc`` on K, except for the bias.

    Bias. liblinear appends a constant feature (``intercept_scaling`` s) and so regularises the
    bias: it solves min (1/2)||w||^2 + b^2 / (2 s^2) + C sum hinge. Evaluated in the exact objective
    P(w, b) = (1/2)||w||^2 + C sum hinge (unregularised bias), its solution is at most b*^2 / (2 s^2)
    (+ liblinear's own tolerance) above P*, b* the exact bias. The bias is then refitted exactly for the
    returned w (``optimal_bias``: argmin_b of the hinge sum), which can only lower P. Larger s makes the
    penalty smaller but liblinear's dual worse conditioned, so s = 1 and s = 10 are both solved and the
    lower exact P kept (INTERCEPT_SCALINGS). Measured on n = 2000, R = 32 (random Fourier factors,
    ``tests/test_factor_solvers.py``): P / P_SVC - 1 = 2e-6 with s = 1 and the refit for C in
    {1, 10, 100}, against 4e-4 .. 1 with s = 100 (liblinear not converging in 1e5 epochs); the test bounds
    it by 1e-4. On n = 50 (P ~ 180, b ~ 0.9) s = 1 leaves P 5e-4 above P* and s = 10 6e-5: the penalty
    b*^2 / 2 matters only where P is small, i.e. at small n, where the solvers use libsvm anyway.

    Returns (alpha, v, intercept, converged) as ``fit_svc``: f = K v + intercept with v the
    minimum-norm solution of F^T v = w (so f = F w + intercept on the training points and on any point
    whose cross kernel is k(x, X) = l(x)^T F^T); alpha a dual feasible point (0 <= alpha <= C,
    y^T alpha = 0) recovered from the margins (``feasible_dual``), which certificates use: in general
    v != alpha o y.
    """
    best = None
    for scaling in INTERCEPT_SCALINGS:
        svc = LinearSVC(C=C, loss="hinge", dual=True, tol=tol, max_iter=max_iter, intercept_scaling=scaling,
                        random_state=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            svc.fit(F, y)
        w = svc.coef_[0].astype(np.float64)
        f0 = F @ w
        intercept = optimal_bias(f0, y)
        primal = 0.5 * float(w @ w) + C * hinge_sum(y, f0 + intercept)
        if best is None or primal < best[0]:
            converged = not any(issubclass(x.category, ConvergenceWarning) for x in caught)
            best = (primal, w, f0, intercept, converged)
    _, w, f0, intercept, converged = best
    v = np.linalg.lstsq(F.T, w, rcond=None)[0]
    alpha = feasible_dual(F, y, w, f0 + intercept, C)
    return alpha, v, intercept, converged


#: liblinear's bias feature values s tried by ``fit_linear_svc`` (the best exact primal is kept)
INTERCEPT_SCALINGS = (1.0, 10.0)


#: |y_i f_i - 1| <= MARGIN_TOL marks a point on the margin when a dual point is recovered from a primal one
MARGIN_TOL = 1e-3


def feasible_dual(F: np.ndarray, y: np.ndarray, w: np.ndarray, f: np.ndarray, C: float) -> np.ndarray:
    """A dual feasible alpha (0 <= alpha <= C, y^T alpha = 0) of the SVM on K = F F^T near the dual
    optimum matching the primal point (w, f = F w + b).

    KKT: alpha_i = C where y_i f_i < 1, 0 where y_i f_i > 1 (up to MARGIN_TOL); on the margin, alpha
    solves F^T (alpha o y) = w and y^T alpha = 0 in least squares within [0, C] (scipy
    ``lsq_linear``; at most R + 1 points lie on the margin generically). Exact feasibility: the class
    with the larger sum is scaled down. Any feasible alpha gives a valid lower bound; near the optimum
    a tight one.
    """
    m = y * f
    alpha = np.where(m < 1.0 - MARGIN_TOL, C, 0.0)
    free = np.flatnonzero(np.abs(m - 1.0) <= MARGIN_TOL)
    if free.size:
        A = np.vstack([F[free].T * y[free], y[free][None, :]])
        rhs = np.append(w - F.T @ (alpha * y), -float(alpha @ y))
        alpha[free] = scipy.optimize.lsq_linear(A, rhs, bounds=(0.0, C)).x
    pos, neg = float(alpha[y > 0].sum()), float(alpha[y < 0].sum())
    if pos > neg:
        alpha[y > 0] *= neg / pos
    elif neg > pos:
        alpha[y < 0] *= pos / neg
    return alpha


def hinge_sum(y: np.ndarray, f: np.ndarray) -> float:
    """sum_i max(0, 1 - y_i f_i)."""
    return float(np.sum(np.maximum(0.0, 1.0 - y * f)))


def optimal_bias(f0: np.ndarray, y: np.ndarray) -> float:
    """argmin_b sum_i max(0, 1 - y_i (f0_i + b)), exactly.

    The function is convex and piecewise linear with breakpoints b_i = y_i - f0_i; its slope at b is
    #{y_i = -1, b > b_i} - #{y_i = +1, b < b_i}, so a minimiser is the first breakpoint (in sorted order)
    where the slope to its right becomes >= 0.
    """
    breaks = y - f0
    order = np.argsort(breaks, kind="stable")
    b_sorted, y_sorted = breaks[order], y[order]
    n_pos = int(np.sum(y > 0))
    # slope just right of b_sorted[k]: negatives at or left of k minus positives strictly right of k
    neg_left = np.cumsum(y_sorted < 0)
    pos_left = np.cumsum(y_sorted > 0)
    slope_right = neg_left - (n_pos - pos_left)
    k = int(np.argmax(slope_right >= 0))
    return float(b_sorted[k])


def check_engine(engine) -> tuple[int, int, np.ndarray]:
    """(n, M, lambda_max) of the engine; a kernel with lambda_max < 0 is negative definite: named."""
    lam = np.asarray(check.require_engine(engine).lambda_max, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(lam < 0.0)
    if bad.size:
        raise InvalidInputError(
            f"kernel(s) {bad[:10].tolist()} of the bank are not positive semidefinite: largest eigenvalue "
            f"{lam[bad][:10].tolist()} < 0. MKL needs PSD Gram matrices; rebuild those kernels from a valid "
            "kernel function")
    return check.check_engine(engine)


def probe_vectors(n: int, seed: int = 0) -> np.ndarray:
    """(N_PROBES, n) seeded standard normal vectors for the PSD probe."""
    return np.random.default_rng(seed).standard_normal((N_PROBES, n))


def check_quad_forms(values: np.ndarray, vectors: np.ndarray, lambda_max: np.ndarray,
                     kernels: np.ndarray | None = None) -> None:
    """Raise InvalidInputError naming the kernels whose quadratic forms prove they are not PSD.

    ``values`` is (p,) or (p, k): u_j^T K_m u_j for the kernels ``kernels`` (all M when None) and the
    k rows of ``vectors``. A PSD kernel has u^T K u >= 0 for every u, so a value below
    -PSD_RTOL * max(lambda_max, 1) * ||u||^2 is a proof. The test is one-sided: it can only catch
    kernels whose negative part shows up on the vectors a solver actually uses (its own iterates and
    the seeded probes), never prove that a kernel is PSD. Banks imported with
    ``KernelBank.from_arrays`` are eigen-checked at import; Gaussian, polynomial and linear specs are
    PSD by construction.
    """
    values = np.asarray(values, dtype=np.float64)
    values = values.reshape(values.shape[0], -1)
    vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float64))
    kernels = np.arange(values.shape[0]) if kernels is None else np.asarray(kernels, dtype=np.int64)
    scale = np.maximum(np.asarray(lambda_max, dtype=np.float64)[kernels], 1.0)
    floor = -PSD_RTOL * scale[:, None] * np.sum(vectors ** 2, axis=1)[None, :]
    bad = np.flatnonzero(np.any((values < floor) | ~np.isfinite(values), axis=1))
    if bad.size:
        worst = kernels[bad]
        raise InvalidInputError(
            f"kernel(s) {worst[:10].tolist()} of the bank are not positive semidefinite: u^T K u = "
            f"{np.min(values[bad], axis=1)[:10].tolist()} < 0 for some vector u (or NaN/inf). MKL needs PSD "
            "Gram matrices; rebuild those kernels from a valid kernel function, or clip their negative "
            "eigenvalues before building the bank")
