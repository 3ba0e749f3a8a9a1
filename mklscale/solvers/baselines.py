"""Baselines of the Afkanpour thesis experiments (Table 6.1): UNIFORM and AMKL (alignment-based
two-stage MKL of Cortes et al. 2010, thesis Section 2.2.2), each followed by the same final fit.

UNIFORM: weights 1/M on every kernel of the bank (one ``engine.combine`` over all kernels).

AMKL: maximise the centred alignment (2.10) over theta >= 0 through the convex problem (2.12)

    min_{mu >= 0} -b^T mu + mu^T M mu,   theta* = mu* / sqrt(mu*^T M mu*)   (solves (2.11) for any C)

with the centred quantities (K_c = H K H, H = I - (1/n) 1 1^T, y_c = H y, ideal kernel y y^T):

    b_i  = <K_{i,c}, (y y^T)_c>_F = y_c^T K_i y_c                     one ``quad_forms`` pass
    M_ij = <H K_i H, H K_j H>_F = <K_i, H K_j H>_F                     (H idempotent, trace cyclic)
         = <K_i, K_j>_F - (2/n) r_i^T r_j + (1/n^2) s_i s_j,  r_i = K_i 1,  s_i = 1^T K_i 1

i.e. ``gram_of_kernels`` minus a rank-2 correction from the row sums (``matvecs`` of the ones
vector). Kernels with b_i <= 0 are left out exactly: M_ij >= 0 (trace of a product of PSD matrices),
so setting mu_i = 0 never increases the objective. The QP is solved as non-negative least squares
(scipy ``nnls``): with M = L^T L (eigen-factor, zero eigenvalues dropped, b lies in range(M)) and
L^T d = b / 2, -b^T mu + mu^T M mu = ||L mu - d||^2 - ||d||^2.

Weights are scaled to sum to one (alignment is scale invariant; the final fit is not, and this
keeps the learned kernel on the scale of UNIFORM's). Final fit (``_final_fit``): kernel ridge with an
unpenalised bias for regression (ridge ``lam``), libsvm SVC(kernel="precomputed", C) for
classification. The achieved centred alignment of the learned kernel is stored in
``params["alignment"]`` and in the history.

Factor engines (issue 17): every step above is an engine operation that a factor engine serves in
O(n r^2) per kernel (b_i = ||L_i^T y_c||^2, <K_i, K_j>_F = ||L_i^T L_j||_F^2, row sums L_i (L_i^T 1));
the learned kernel comes from ``_final_fit.combined_kernel`` (a factor above the dense cap), so no
(n, n) matrix is formed there.
"""

from __future__ import annotations


import numpy as np
import scipy.optimize

from mklscale.errors import InvalidInputError
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers import _final_fit
from mklscale.solvers._validation import check_engine, check_positive, check_targets
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog


def resolve_task(task: str, y) -> tuple[str, np.ndarray, int]:
    """("regression" | "classification", y float64) — task="auto" means classification when y holds exactly the labels -1 and +1."""
    y_arr = np.asarray(y, dtype=np.float64) if not isinstance(y, np.ndarray) else y.astype(np.float64)
    if task == "auto":
        finite = y_arr[np.isfinite(y_arr)]
        labels = np.unique(finite)
        task = "classification" if labels.size == 2 and np.all(labels == (-1.0, 1.0)) else "regression"
    return task, y_arr


def _prepare(engine, y, task):
    n, M, _ = check_engine(engine)
    task, y = resolve_task(task, y)
    y = check_targets(y, n, classification=False, loss_name="squared")
    _final_fit.check_task(task, y)
    return n, M, task, y


def _finish(engine, weights, y, task, lam, C, solver, params, log: RunLog, history_extra, objective=None, gap=0.0,
            sample_weight=None):
    K = _final_fit.combined_kernel(engine, weights)
    c, b = _final_fit.final_fit(K, y, task, lam, C, sample_weight)
    align = _final_fit.centred_alignment(K, y)
    log.record({"alignment": align, "n_active": int(np.count_nonzero(weights)), **history_extra})
    return MKLResult(weights=weights, dual_coef=c, bias=b, active=np.flatnonzero(weights),
                     objective=align if objective is None else objective, gap=gap, history=log.history,
                     converged=True, solver=solver,
                     params={"task": task, "lam": lam, "C": C, "alignment": align, **params})


@single_blas_thread_for_small_n
def uniform(engine, y, task: str = "auto", lam: float = 1.0, C: float = 1.0, sample_weight=None) -> MKLResult:
    """UNIFORM: weights 1/M, then kernel ridge (regression, ridge ``lam``) or SVM (classification, ``C``).

    ``objective`` and ``params["alignment"]`` hold the centred alignment of the uniform kernel; gap 0.
    """
    n, M, task, y = _prepare(engine, y, task)
    log = RunLog(engine, "baseline")
    lam = check_positive("lam", lam)
    C = check_positive("C", C)
    weights = np.full(M, 1.0 / M)
    return _finish(engine, weights, y, task, lam, C, "uniform", {}, log, {}, sample_weight=sample_weight)


def centred_kernel_gram(engine, idx: np.ndarray) -> np.ndarray:
    """(p, p) <H K_i H, H K_j H>_F for the kernels ``idx`` (see the module docstring)."""
    n = engine.n
    G = np.asarray(engine.gram_of_kernels(idx), dtype=np.float64)
    R = np.asarray(engine.matvecs(np.ones(n), kernels=idx), dtype=np.float64).reshape(idx.size, n)
    s = R.sum(axis=1)
    Mc = G - (2.0 / n) * (R @ R.T) + np.outer(s, s) / n**2
    return 0.5 * (Mc + Mc.T)


def alignment_qp(b: np.ndarray, Mc: np.ndarray) -> tuple[np.ndarray, float]:
    """mu* of min_{mu >= 0} -b^T mu + mu^T Mc mu by NNLS; returns (mu*, KKT residual).

    The residual is max(max_i (-grad_i)_+, max_i |mu_i grad_i|) / max(||b||_inf, tiny), grad = 2 Mc mu - b.
    """
    w, V = np.linalg.eigh(Mc)
    keep = w > max(w[-1], 0.0) * 1e-13
    L = np.sqrt(w[keep])[:, None] * V[:, keep].T
    d = (V[:, keep].T @ b) / (2.0 * np.sqrt(w[keep]))
    mu, _ = scipy.optimize.nnls(L, d, maxiter=50 * max(b.size, 10))
    grad = 2.0 * Mc @ mu - b
    scale = max(float(np.max(np.abs(b))), np.finfo(float).tiny)
    kkt = max(float(np.max(np.maximum(-grad, 0.0))), float(np.max(np.abs(mu * grad)))) / scale
    return mu, kkt


@single_blas_thread_for_small_n
def alignment(engine, y, task: str = "auto", lam: float = 1.0, C: float = 1.0, sample_weight=None) -> MKLResult:
    """AMKL: maximise centred alignment by the QP (2.12) (module docstring), then the final fit.

    ``objective`` = achieved centred alignment A_c(sum_m w_m K_m, y y^T); ``gap`` = the QP's relative
    KKT residual (0 at an exact optimum). Engine work: one quad_forms pass, row sums and
    <K_i, K_j> of the kernels with positive b_i, one combine over the selected kernels.
    """
    n, M, task, y = _prepare(engine, y, task)
    log = RunLog(engine, "baseline")
    lam = check_positive("lam", lam)
    C = check_positive("C", C)
    yc = y - y.mean()
    b_all = np.asarray(engine.quad_forms(yc), dtype=np.float64)
    candidates = np.flatnonzero(b_all > 0)
    weights = np.zeros(M)
    kkt = 0.0
    if candidates.size:
        Mc = centred_kernel_gram(engine, candidates)
        mu, kkt = alignment_qp(b_all[candidates], Mc)
        if mu.sum() > 0:
            weights[candidates] = mu / mu.sum()
    else:  # no kernel is positively aligned: fall back to uniform weights
        weights[:] = 1.0 / M
    qp_alignment = _qp_alignment(b_all, weights, candidates, Mc if candidates.size else None, yc)
    return _finish(engine, weights, y, task, lam, C, "alignment",
                   {"n_candidates": int(candidates.size), "qp_alignment": qp_alignment}, log,
                   {"kkt_residual": kkt}, gap=kkt, sample_weight=sample_weight)


def refit(engine, y, task: str, lam: float, C: float, init: MKLResult, sample_weight=None) -> MKLResult:
    """The final fit at another ``C`` / ``lam`` on the kernel weights of ``init``, a result of the same weighting
    rule (uniform, alignment, fheuristic) on this engine and targets: those weights do not depend on C or lam,
    so a path over the final fit's constant computes them once (``registry.fit_path``)."""
    n, M, task, y = _prepare(engine, y, task)
    if np.shape(init.weights) != (M,):
        raise InvalidInputError(f"init has {np.size(init.weights)} weights; it must be a result on this bank (M = {M})")
    log = RunLog(engine, "baseline")
    kept = {k: v for k, v in init.params.items() if k not in ("task", "lam", "C", "alignment")}
    objective = None if init.solver in ("uniform", "alignment", "fheuristic") else init.objective
    return _finish(engine, np.asarray(init.weights, dtype=np.float64), y, task, check_positive("lam", lam),
                   check_positive("C", C), init.solver, kept, log, {"refit": True}, objective=objective,
                   gap=init.gap, sample_weight=sample_weight)


def _qp_alignment(b_all, weights, candidates, Mc, yc) -> float:
    """Alignment from the QP quantities: b^T w / (sqrt(w^T Mc w) ||y_c||^2) (checks the combine route)."""
    if Mc is None:
        return float("nan")
    w = weights[candidates]
    denom = np.sqrt(max(float(w @ Mc @ w), 0.0)) * float(yc @ yc)
    return float(b_all[candidates] @ w) / denom if denom > 0 else 0.0
