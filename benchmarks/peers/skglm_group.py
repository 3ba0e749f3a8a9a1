"""skglm (Bertrand, Klopfenstein, Massias et al., https://contrib.scikit-learn.org/skglm) as a peer on
factor banks (issue 32): SpicyMKL's problem on K~_m = L_m L_m^T is a group lasso over Phi = [L_1 ... L_M].

Ours (``solvers/spicy.py``, block-1 penalty) on a factor bank, f = sum_m L_m v_m + b:

    P(v, b) = sum_i loss(y_i, f_i) + C sum_m ||v_m||,      loss = log(1 + exp(-y f)) or (1/2)(y - f)^2

skglm's datafits are means over the n samples (``LogisticGroup``: (1/n) sum_i log(1 + exp(-y_i (Phi w)_i)),
``QuadraticGroup``: (1/(2n)) ||y - Phi w||^2) and ``WeightedGroupL2`` is alpha sum_g weights_g ||w_g||, so
with groups of the r columns of each L_m, weights 1 and alpha = C / n, skglm's objective is P / n, and the
intercept (``fit_intercept=True``, unpenalised, the last coefficient) is our b. :func:`objective` evaluates P
at skglm's solution in our units (tests/test_skglm_peer.py: both reach the same optimum).

Solvers: ``GroupProxNewton`` (logistic; working sets of groups, proximal Newton with coordinate descent on
the quadratic model) and ``GroupBCD`` (square loss: block coordinate descent with working sets); skglm's
tol is its own stopping criterion (the largest distance of a group's gradient to its subdifferential,
in the averaged units), not a duality gap.
"""

from __future__ import annotations

import numpy as np


def group_design(L: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Phi (n, M r) float64, grp_ptr, grp_indices) for factors L (M, n, r): group m = the columns of L_m."""
    M, n, r = L.shape
    Phi = np.ascontiguousarray(np.transpose(L, (1, 0, 2)).reshape(n, M * r), dtype=np.float64)
    grp_ptr = np.arange(0, M * r + 1, r, dtype=np.int32)
    return Phi, grp_ptr, np.arange(M * r, dtype=np.int32)


def make_solver(loss: str, tol: float, max_iter: int | None = None, verbose: int = 0):
    """GroupProxNewton (logistic) or GroupBCD (square), with an unpenalised intercept; ``verbose`` as
    skglm's (2: its objective at every inner step too, which ``skglm_run.py`` follows)."""
    from skglm.solvers import GroupBCD, GroupProxNewton

    if loss == "logistic":
        return GroupProxNewton(tol=tol, fit_intercept=True, max_iter=max_iter or 50, verbose=verbose)
    if loss == "square":
        return GroupBCD(tol=tol, fit_intercept=True, max_iter=max_iter or 1000, max_epochs=10_000,
                        verbose=verbose)
    raise ValueError(f"no skglm peer for loss {loss!r} (logistic, square)")


def solve(Phi, grp_ptr, grp_indices, y, C: float, loss: str, tol: float = 1e-6, max_iter: int | None = None,
          verbose: int = 0):
    """(v (M r,), b): skglm's solution of P (module docstring) for our C (alpha = C / n)."""
    from skglm.datafits import LogisticGroup, QuadraticGroup
    from skglm.penalties import WeightedGroupL2

    n = Phi.shape[0]
    n_groups = grp_ptr.size - 1
    datafit = (LogisticGroup if loss == "logistic" else QuadraticGroup)(grp_ptr, grp_indices)
    penalty = WeightedGroupL2(alpha=C / n, weights=np.ones(n_groups), grp_ptr=grp_ptr, grp_indices=grp_indices)
    w = make_solver(loss, tol, max_iter, verbose).solve(Phi, np.asarray(y, dtype=np.float64), datafit, penalty)[0]
    return w[:-1], float(w[-1])


def objective(Phi, grp_ptr, v, b, y, C: float, loss: str) -> float:
    """P(v, b) in our units (module docstring)."""
    f = Phi @ v + b
    data = float(np.sum(np.logaddexp(0.0, -y * f))) if loss == "logistic" else 0.5 * float(np.sum((y - f) ** 2))
    return data + C * float(sum(np.linalg.norm(v[a:z]) for a, z in zip(grp_ptr[:-1], grp_ptr[1:])))


def active_groups(grp_ptr, v) -> int:
    """Groups with a non-zero block (kernels in skglm's model)."""
    return int(sum(np.any(v[a:z] != 0.0) for a, z in zip(grp_ptr[:-1], grp_ptr[1:])))
