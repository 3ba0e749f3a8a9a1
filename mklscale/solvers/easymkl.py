"""EasyMKL (Aiolli & Donini 2015, "EasyMKL: a scalable multiple kernel learning algorithm",
Neurocomputing), as MKLpy 0.6 implements it (``MKLpy/algorithms/EasyMKL.py``, ``komd.py``), binary
classification only (the estimators run one head per class for more classes).

Notation: y in {-1, +1}^n, Y = diag(y), P / N the positive / negative examples, and

    Gamma = {gamma in R^n : gamma >= 0, sum_{i in P} gamma_i = 1, sum_{i in N} gamma_i = 1}

(a probability distribution on each class). Steps, each one engine operation over the bank:

1. the scaled sum kernel  K_s = sum_m s_m K_m  (one ``combine`` pass), s_m = 1 / (tr(K_m) / n) with
   ``tracenorm`` (each kernel scaled to mean diagonal 1, as the authors' reference code does), else
   s_m = 1 (MKLpy: kernels as given; on unit-diagonal kernels the two are the same);
2. the margin QP on K_s (the paper's relaxed min-max problem, with the max over ||eta||_2 = 1 bounded
   by the sum kernel):

       gamma* = argmin_{gamma in Gamma} (1 - lam) gamma^T Y K_s Y gamma + lam ||gamma||^2

   lam in (0, 1]: lam -> 0 maximises the distance between the convex hulls of the two classes,
   lam = 1 the distance between the class centroids;
3. one ``quad_forms`` pass with u = Y gamma*:  d_m = s_m u^T K_m u  (>= 0 for PSD kernels) and the
   weights of the scaled kernels  eta = d / sum_m d_m  (||eta||_1 = 1, MKLpy's and the authors'
   normalisation; the paper's max over ||eta||_2 = 1 gives d / ||d||_2, the same direction: only the
   scale of the final kernel differs);
4. the final model on  K_eta = sum_m eta_m s_m K_m  (one ``combine`` pass); the returned
   ``weights`` are those of the stored kernels, w_m = eta_m s_m (= eta with tracenorm off):

   - learner="komd" (MKLpy's default learner, ``KOMD(lam=0.1)``): the same margin QP on K_eta with
     KOMD's regularisation  (1 - lam_k) g^T Y K_eta Y g + lam_k (|P| |N| / n) ||g||^2  over Gamma,
     decision f(x) = sum_i y_i g_i k_eta(x, x_i) - b with the midpoint bias
     b = (1/2) g^T K_eta Y g (half the sum of the projections of the two class points on w);
     returned as dual_coef = y o g, bias = -b;
   - learner="svm": libsvm's SVC(C=svm_C) on K_eta (``_final_fit.svm``).

So EasyMKL reads the bank three times (two passes for the weights, one for the final kernel; the
last one reads only the kernels with non-zero weight).

The margin QP is solved with libsvm (``_svm.fit_svc``), as MKLpy does for lam > 0.01: with
A = (1 - lam) K + lam I (positive definite for lam > 0) and Q = Y A Y, the hard-margin SVM dual
max 1^T a - (1/2) a^T Q a, a >= 0, y^T a = 0 has the solution a* = t gamma* with
t = 2 / (gamma*^T Q gamma*): every feasible a != 0 is t g with g in Gamma (both classes carry the same
mass t), and the best t for a given g is 2 / (g^T Q g). Since gamma^T Q gamma >= lam ||gamma||^2 >=
lam (1/|P| + 1/|N|) on Gamma, a_i <= t <= 2 / (lam (1/|P| + 1/|N|)), so an SVM constant ten times
that bound never binds and the SVM is the hard-margin one. gamma is a* normalised per class (exactly
in Gamma). Certificate: for the convex f(g) = g^T Q g over the product of simplices the Frank-Wolfe
gap  grad^T g - sum_{c in {P, N}} min_{i in c} grad_i,  grad = 2 Q g,  bounds f(g) - f(gamma*) from
above; ``gap`` is that bound relative to f(g).

Factor engines (issue 17): the combined kernels come from ``_final_fit.combined_kernel``; above the
dense cap they are factors K = F F^T and both margin QPs (EasyMKL's and KOMD's) are solved through
their dual in the R columns of F (``_margin_qp_low_rank``: scipy L-BFGS-B, the same Frank-Wolfe
certificate), the SVM learner by liblinear on F (``_svm.fit_linear_svc``).

Differences from MKLpy 0.6 (all documented choices, not approximations):
- ``tracenorm`` (default True) scales each kernel to mean diagonal 1 as the authors' code does;
  MKLpy uses the kernels as given. On unit-diagonal banks (``normalize="diag"``, MKLpy's
  ``kernel_normalization``) both give the same weights; with the estimators' unit-trace banks the
  scaling keeps lam meaning what it means on unit-diagonal kernels. tracenorm=False is MKLpy exactly.
- lam = 0 is refused (MKLpy then calls cvxopt on the possibly singular hard-margin problem); use a
  small lam such as 1e-3.
- MKLpy predicts the positive class for f >= 0; the estimators here for f > 0 (ties only).
"""

from __future__ import annotations


import numpy as np
import scipy.optimize

from mklscale.errors import InvalidInputError
from mklscale.solvers import _final_fit, _svm
from mklscale.solvers import _validation as check
from mklscale.solvers.toolkit.lowrank import LowRank
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog

LEARNERS = ("komd", "svm")
#: The hard-margin SVM's C is this factor times the bound on its dual variables (module docstring).
C_BOUND_FACTOR = 10.0


def margin_qp(K, y: np.ndarray, lam: float, ridge: float, tol: float) -> dict:
    """gamma* = argmin_{gamma in Gamma} (1 - lam) gamma^T Y K Y gamma + ridge ||gamma||^2 (libsvm; on a
    ``LowRank`` K the dual in R variables, ``_margin_qp_low_rank``).

    ``ridge`` > 0 (lam for EasyMKL, lam_k |P| |N| / n for KOMD). Returns gamma, the objective
    f(gamma), the relative Frank-Wolfe gap and whether libsvm met ``tol`` (module docstring).
    """
    if isinstance(K, LowRank):
        return _margin_qp_low_rank(K.F, y, lam, ridge, tol)
    pos = y > 0
    A = (1.0 - lam) * K
    A[np.diag_indices_from(A)] += ridge
    bound = 2.0 / (ridge * (1.0 / pos.sum() + 1.0 / (~pos).sum()))
    alpha, _, _, converged = _svm.fit_svc(A, y, C_BOUND_FACTOR * bound, tol)
    gamma = np.zeros(y.size)
    for cls in (pos, ~pos):
        mass = alpha[cls].sum()
        if not mass > 0:
            raise InvalidInputError("the EasyMKL margin QP returned no support vector of one class: the "
                                    "combined kernel is not usable (NaN/inf or all zero); check the bank")
        gamma[cls] = alpha[cls] / mass
    u = y * gamma
    grad = 2.0 * y * (A @ u)
    f = 0.5 * float(gamma @ grad)
    fw = 2.0 * f - float(grad[pos].min()) - float(grad[~pos].min())
    return {"gamma": gamma, "objective": f, "gap": max(fw, 0.0) / f if f > 0 else 0.0, "converged": converged}


def _fw_record(gamma: np.ndarray, grad: np.ndarray, pos: np.ndarray, converged: bool) -> dict:
    """The QP record: f(gamma) = (1/2) gamma^T grad (grad = 2 Q gamma) and its relative Frank-Wolfe gap."""
    f = 0.5 * float(gamma @ grad)
    fw = 2.0 * f - float(grad[pos].min()) - float(grad[~pos].min())
    return {"gamma": gamma, "objective": f, "gap": max(fw, 0.0) / f if f > 0 else 0.0, "converged": converged}


def _project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of v onto {g >= 0, sum g = 1} (sorting rule)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.flatnonzero(u - css / np.arange(1, u.size + 1) > 0)[-1]
    return np.maximum(v - css[k] / (k + 1), 0.0)


def _margin_qp_low_rank(F: np.ndarray, y: np.ndarray, lam: float, ridge: float, tol: float) -> dict:
    """The margin QP on K = F F^T (F (n, R)) through its dual in R variables.

    With B = F^T Y and (1 - lam) ||B g||^2 = max_p 2 p^T B g - ||p||^2 / (1 - lam):
        min_{g in Gamma} (1 - lam) ||B g||^2 + ridge ||g||^2
      = max_p phi(p),  phi(p) = -||p||^2 / (1 - lam) + min_{g in Gamma} (ridge ||g||^2 + 2 p^T B g),
    the inner minimiser g(p) = Proj_Gamma(-B^T p / ridge) (a simplex projection per class). phi is
    concave with gradient -2 p / (1 - lam) + 2 B g(p) (Lipschitz: the inner problem is strongly convex),
    maximised by scipy's L-BFGS-B; gamma = g(p*) is exactly in Gamma. Certificate: the smaller of the
    Frank-Wolfe gap of the libsvm route and the duality gap (f(gamma) - phi(p*)) / f(gamma) (phi(p) <=
    f* for every p), both upper bounds on the relative suboptimality; the Frank-Wolfe one is loose here
    (measured 0.15 at n = 20,000 where the duality gap is tiny). O(n R) per evaluation; no (n, n) matrix. lam = 1: gamma is
    uniform on each class (the QP is ridge ||g||^2 alone). ``converged``: L-BFGS-B reports success
    (``tol`` is libsvm's and unused here; the gap says how far gamma is from gamma*). Measured on
    n = 80, R = 20 (tests/test_factor_solvers.py): objective equal to the libsvm route's to 3e-12
    relative, weights to 3e-7.
    """
    pos = y > 0
    classes = (np.flatnonzero(pos), np.flatnonzero(~pos))

    def g_of(p):
        v = -(y * (F @ p)) / ridge
        g = np.empty_like(v)
        for idx in classes:
            g[idx] = _project_simplex(v[idx])
        return g

    if lam < 1.0:
        def negphi(p):
            g = g_of(p)
            Bg = F.T @ (y * g)
            val = -float(p @ p) / (1.0 - lam) + ridge * float(g @ g) + 2.0 * float(p @ Bg)
            return -val, -(-2.0 * p / (1.0 - lam) + 2.0 * Bg)

        res = scipy.optimize.minimize(negphi, np.zeros(F.shape[1]), jac=True, method="L-BFGS-B",
                                      options={"maxiter": 10_000, "ftol": 1e-15, "gtol": 1e-12})
        gamma, lower = g_of(res.x), -float(res.fun)
    else:
        gamma, lower = np.where(pos, 1.0 / pos.sum(), 1.0 / (~pos).sum()), None
    u = y * gamma
    grad = 2.0 * y * ((1.0 - lam) * (F @ (F.T @ u)) + ridge * u)
    record = _fw_record(gamma, grad, pos, bool(lam == 1.0 or res.success))
    if lower is not None and record["objective"] > 0:    # weak duality: phi(p) <= f(gamma*)
        record["gap"] = min(record["gap"], max(record["objective"] - lower, 0.0) / record["objective"])
    return record


def komd(K: np.ndarray, y: np.ndarray, lam: float, tol: float) -> tuple[np.ndarray, float, dict]:
    """MKLpy's KOMD on the precomputed K: (dual_coef y o g, bias -b, QP record); see the module docstring."""
    n_pos = int(np.sum(y > 0))
    qp = margin_qp(K, y, lam, lam * n_pos * (y.size - n_pos) / y.size, tol)
    v = y * qp["gamma"]
    b = 0.5 * float(qp["gamma"] @ (K @ v))
    return v, -b, qp


@single_blas_thread_for_small_n
def fit(engine, y, lam: float = 0.1, learner: str = "komd", komd_lam: float = 0.1, svm_C: float = 1.0,
        tracenorm: bool = True, tol: float = 1e-7) -> MKLResult:
    """EasyMKL weights, then the final KOMD (default) or SVM on the combined kernel (module docstring).

    ``objective`` = (1 - lam) gamma^T Y K_s Y gamma + lam ||gamma||^2 at the returned gamma; ``gap`` its
    relative Frank-Wolfe bound; ``converged`` whether both libsvm solves met ``tol``. ``params`` holds
    the settings and the final KOMD QP's objective and gap.
    Engine work: combine (all kernels), quad_forms (one vector), combine (kernels with eta_m > 0).
    """
    n, M, _ = _svm.check_engine(engine)
    log = RunLog(engine, "easymkl")
    y = check.check_targets(y, n, classification=True, loss_name="EasyMKL margin")
    lam = _unit_interval("lam", lam)
    learner = check.check_choice("learner", learner, LEARNERS)
    komd_lam = _unit_interval("komd_lam", komd_lam)
    svm_C = check.check_positive("svm_C", svm_C)
    tol = check.check_positive("tol", tol)
    if not isinstance(tracenorm, (bool, np.bool_)):
        raise InvalidInputError(f"tracenorm must be True or False; got {tracenorm!r}")

    scale = np.ones(M)
    if tracenorm:
        trace = engine.traces
        if not np.all(np.isfinite(trace) & (trace > 0)):
            bad = np.flatnonzero(~(np.isfinite(trace) & (trace > 0)))
            raise InvalidInputError(f"kernel(s) {bad[:10].tolist()} have trace <= 0 (zero kernels) or NaN, so "
                                    "tracenorm cannot scale them; drop them from the bank or pass tracenorm=False")
        scale = n / trace
    K_s = _final_fit.combined_kernel(engine, scale)
    qp = margin_qp(K_s, y, lam, lam, tol)
    del K_s
    u = y * qp["gamma"]
    d = scale * np.asarray(engine.quad_forms(u), dtype=np.float64)
    _svm.check_quad_forms(d / scale, u, np.asarray(engine.lambda_max, dtype=np.float64))
    d = np.maximum(d, 0.0)  # float32 rounding of a PSD kernel can give -1e-9; such a kernel gets weight 0
    if not d.sum() > 0:
        raise InvalidInputError("every kernel has u^T K_m u = 0 at the EasyMKL solution (u = Y gamma): the kernels "
                                "do not separate the classes at all; check the bank and the labels")
    eta = d / d.sum()
    weights = eta * scale
    K = _final_fit.combined_kernel(engine, weights)
    extra = {}
    if learner == "komd":
        coef, bias, final = komd(K, y, komd_lam, tol)
        converged = qp["converged"] and final["converged"]
        extra = {"komd_objective": final["objective"], "komd_gap": final["gap"]}
    else:
        coef, bias, converged = _final_fit.svm(K, y, svm_C)
        converged = qp["converged"] and converged
    log.record({"objective": qp["objective"], "gap": qp["gap"], "n_active": int(np.count_nonzero(weights)), **extra})
    return MKLResult(weights=weights, dual_coef=coef, bias=bias, active=np.flatnonzero(weights),
                     objective=qp["objective"], gap=qp["gap"], history=log.history, converged=bool(converged),
                     solver="easymkl",
                     params={"task": "classification", "lam": lam, "learner": learner, "komd_lam": komd_lam,
                             "svm_C": svm_C, "tracenorm": bool(tracenorm), "tol": tol, **extra})


def _unit_interval(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a number in (0, 1]; got {value!r}") from None
    if not (np.isfinite(value) and 0.0 < value <= 1.0):
        hint = " (lam = 0 is the hard-margin problem, unbounded when the classes overlap: use e.g. 1e-3)" \
            if value == 0.0 else ""
        raise InvalidInputError(f"{name} must lie in (0, 1]; got {value}{hint}. EasyMKL/KOMD weigh the margin "
                                f"term by 1 - {name} and ||gamma||^2 by {name}")
    return value
