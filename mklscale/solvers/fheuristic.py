"""FHeuristic: kernel weights proportional to each kernel's alignment with the ideal kernel y y^T
(Qiu & Lane 2009, "A framework for multiple kernel support vector regression and its applications to
siRNA efficacy prediction", IEEE/ACM TCBB 6(2); MKLpy 0.6 ``algorithms/HeuristicMKL.py``,
``FHeuristic``), followed by the final fit of the baselines.

    A(K_m, y y^T) = <K_m, y y^T>_F / (||K_m||_F ||y y^T||_F) = y^T K_m y / (||K_m||_F ||y||^2)
    w_m = A_m / sum_j A_j

The alignment is the uncentred one (MKLpy's ``metrics.alignment_yy``; the AMKL baseline uses the
centred one). y^T K_m y comes from one ``quad_forms`` pass; ||K_m||_F from the bank's metadata (no
pass; an in-memory engine computes it from its kernels); the final kernel sum_m w_m K_m from one
``combine`` pass: two passes in all. For PSD kernels y^T K_m y >= 0, so w >= 0; an alignment at
rounding level (below ALIGNMENT_FLOOR = 1e-12, or slightly negative) is set to 0 (weight 0).

Tasks. Classification (y in {-1, +1}, ||y||^2 = n) as in MKLpy, and regression with real y (Qiu &
Lane's setting; MKLpy accepts classification only). Final fit (``baselines``/``_final_fit``): libsvm
SVC(C) for classification (MKLpy's default learner is SVC(C=1000); the registry's default C is
the baselines' 100), kernel ridge with an unpenalised bias (ridge ``lam``) for regression where Qiu &
Lane fit an SVR. If no kernel is aligned with y at all (every y^T K_m y = 0) the weights fall back to
uniform, as the alignment baseline does, and ``params["fallback"]`` says so.
"""

from __future__ import annotations


import numpy as np

from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers._validation import check_positive
from mklscale.solvers.baselines import _finish, _prepare
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog


#: Alignments below this count as 0: the rounding level of the float64 sums behind y^T K_m y, which
#: leave a kernel exactly orthogonal to y with a value of order 1e-16 instead of 0.
ALIGNMENT_FLOOR = 1e-12


def kernel_alignments(engine, y: np.ndarray) -> np.ndarray:
    """(M,) A(K_m, y y^T) = y^T K_m y / (||K_m||_F ||y||^2), 0 below ALIGNMENT_FLOOR or for a zero
    kernel; one quad_forms pass."""
    q = np.asarray(engine.quad_forms(y), dtype=np.float64)
    fro = engine.frobenius_norms
    denom = fro * float(y @ y)
    align = np.divide(q, denom, out=np.zeros_like(q), where=denom > 0)
    return np.where(align > ALIGNMENT_FLOOR, align, 0.0)


@single_blas_thread_for_small_n
def fit(engine, y, task: str = "auto", lam: float = 1.0, C: float = 1.0, sample_weight=None) -> MKLResult:
    """FHeuristic weights (module docstring), then SVM (classification, ``C``) or kernel ridge (``lam``).

    ``objective`` and ``params["alignment"]`` hold the centred alignment of the learned kernel (as the
    baselines report); ``params["max_kernel_alignment"]`` = max_m A(K_m, y y^T). Gap 0 (no optimisation).
    """
    n, M, task, y = _prepare(engine, y, task)
    log = RunLog(engine, "fheuristic")
    lam = check_positive("lam", lam)
    C = check_positive("C", C)
    align = kernel_alignments(engine, y)
    fallback = not align.sum() > 0
    weights = np.full(M, 1.0 / M) if fallback else align / align.sum()
    return _finish(engine, weights, y, task, lam, C, "fheuristic",
                   {"fallback": bool(fallback), "max_kernel_alignment": float(align.max())}, log, {},
                   sample_weight=sample_weight)
