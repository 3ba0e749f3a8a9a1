"""The SpicyMKL inner problem over a working set of kernels, and its damped Newton method.

Objective, minimised over rho (n,):

    phi(rho) = loss_term(rho) + sum_{m in W} psi_m(n_m) + bias_term(rho) [+ prox_term(rho)],
    n_m = ||alpha_m + gamma_m rho||_{K_m}.

* proximal mode (SpicyMKL, (25)/(47)): psi_m(n) = ghat(n; gamma_m C) / gamma_m, the Moreau
  envelope of the conjugate penalty at scale gamma_m C (erratum 5), so psi' = prox(n; gamma_m C)/gamma_m
  and psi'' = prox'(n; gamma_m C)/gamma_m;
* conjugate mode (one-step ElastMKL, §4.3): alpha_m = 0, gamma_m = 1 and psi_m = g~_C*.

Chain rule with w_m = K_m (alpha_m + gamma_m rho):
    grad  = sum_m psi'(n_m) gamma_m w_m / n_m                       ((26) with prox/n in place of 1-q)
    Hess  = sum_m gamma_m^2 [ psi'/n K_m + (psi'' - psi'/n) w_m w_m^T / n^2 ]          ((27), (50))
Only kernels with psi' > 0 or psi'' > 0 enter (Remark 1).

Bias: "al" adds (1/(2 gamma_b)) (b + gamma_b 1^T rho)^2 (proximal step on b, (12)); "equality"
keeps 1^T rho = 0 exactly (Newton on the KKT system; the paper's §4.3 uses a penalty
C_b (1^T rho)^2 with C_b = 1e5 instead); "none" has no bias. With a finite ``tau`` the term
||rho - center||^2 / (2 tau) is added (proximal method of multipliers, used for the
piecewise-linear conjugates of hinge and eps-insensitive; see spicy.py).

Newton systems (issue 17; :class:`NewtonSystem`, :func:`solve_newton_system`): the Hessian is kept
in parts, D + gamma_b 1 1^T + sum_m L_m G_m L_m^T, and solved by the dense Cholesky (dense kernels),
Woodbury on the stacked factors (factor kernels; dense kernels of small summed rank through
pivoted Cholesky factors) or Jacobi-preconditioned CG on the formed H (dense kernels, ``newton_solver="cg"``).

Line search (§3.5.1 + [CODE]): Armijo with constant 0.1 and halving from the largest step that
keeps rho in the open domain of the loss conjugate. Along rho + c d the norms are
n_m(c)^2 = n_m^2 + 2 c gamma_m d^T w_m + c^2 gamma_m^2 d^T K_m d from cached products, so
backtracking needs no new kernel products; after the step K_m rho is updated as K_m rho + c K_m d.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.linalg
from mklscale.solvers.toolkit.lowrank import dense_ok
from mklscale.solvers.penalties import Penalty
from mklscale.solvers.toolkit.lowrank import BlockWoodbury
from mklscale.solvers.toolkit.working_set import HeldKernels


class KernelTerm:
    """sum_{m in W} psi_m(||alpha_m + gamma_m rho||_{K_m}) over the working set W, whose kernels
    are the solver's :class:`~mklscale.solvers.toolkit.working_set.HeldKernels` ``held``."""

    def __init__(self, held: HeldKernels, penalty: Penalty, C: float, mode: str):
        if mode not in ("proximal", "conjugate"):
            raise ValueError(mode)
        self.held = held
        self.penalty, self.C, self.mode, self.n = penalty, float(C), mode, held.n
        n = self.n
        self.alpha = np.zeros((0, n))
        self.K_alpha = np.zeros((0, n))
        self.alpha_K_alpha = np.zeros(0)
        self.gamma = np.zeros(0)

    @property
    def size(self) -> int:
        return self.gamma.size

    def add(self, idx: np.ndarray, gamma: float, remedy: str) -> None:
        """Hold the kernels ``idx`` (read from the engine) with alpha_m = 0 and the given gamma."""
        k, n = self.held.fetch(idx, remedy).size, self.n
        if k == 0:
            return
        self.alpha = np.concatenate([self.alpha, np.zeros((k, n))])
        self.K_alpha = np.concatenate([self.K_alpha, np.zeros((k, n))])
        self.alpha_K_alpha = np.concatenate([self.alpha_K_alpha, np.zeros(k)])
        self.gamma = np.concatenate([self.gamma, np.full(k, 1.0 if self.mode == "conjugate" else gamma)])

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the working-set kernels where ``mask`` is True (compacted in place)."""
        self.held.keep(mask)
        self.alpha, self.K_alpha = self.alpha[mask], self.K_alpha[mask]
        self.alpha_K_alpha, self.gamma = self.alpha_K_alpha[mask], self.gamma[mask]

    def psi(self, norms: np.ndarray):
        """(psi, psi', psi'') at the norms n_m, one entry per working-set kernel."""
        if self.mode == "conjugate":
            p = self.penalty
            return (p.conjugate(norms, self.C), p.conjugate_derivative(norms, self.C),
                    p.conjugate_second_derivative(norms, self.C))
        scale = self.gamma * self.C
        return (self.penalty.ghat(norms, scale) / self.gamma, self.penalty.prox(norms, scale) / self.gamma,
                self.penalty.prox_derivative(norms, scale) / self.gamma)

    def matvec(self, u: np.ndarray, first: int = 0) -> np.ndarray:
        """K_m u for the working-set kernels at positions >= ``first``, (w - first, n) float64."""
        return self.held.matvecs(u, first)

    def add_weighted(self, sel: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
        """out += sum_p weights[p] K_{sel[p]} (sel: ascending positions in W; out (n, n) float64)."""
        self.held.add_weighted(sel, weights, out)


@dataclasses.dataclass
class Point:
    """rho and everything the objective, gradient and Hessian need there."""

    rho: np.ndarray
    K_rho: np.ndarray        # (w, n) K_m rho
    norms: np.ndarray        # (w,) n_m = ||alpha_m + gamma_m rho||_{K_m}
    w: np.ndarray            # (w, n) K_m (alpha_m + gamma_m rho)
    value: float
    grad: np.ndarray
    psi1: np.ndarray         # psi'(n_m)
    psi2: np.ndarray         # psi''(n_m)


@dataclasses.dataclass
class Direction:
    d: np.ndarray
    K_d: np.ndarray
    d_K_d: np.ndarray
    d_w: np.ndarray
    slope: float             # grad^T d


class InnerProblem:
    """phi(rho) on the working set; see the module docstring."""

    def __init__(self, loss_term, kernels: KernelTerm, bias_mode: str, b: float = 0.0, gamma_b: float = 1.0,
                 center: np.ndarray | None = None, tau: float = np.inf):
        if bias_mode not in ("al", "equality", "none"):
            raise ValueError(bias_mode)
        self.loss_term, self.kernels, self.bias_mode = loss_term, kernels, bias_mode
        self.b, self.gamma_b = float(b), float(gamma_b)
        self.center, self.tau = center, float(tau)

    # -- pieces -----------------------------------------------------------------------------
    def _norms_sq(self, rho_K_rho, rho_K_alpha):
        k = self.kernels
        return k.alpha_K_alpha + 2.0 * k.gamma * rho_K_alpha + k.gamma**2 * rho_K_rho

    def _extra_value(self, rho):
        """Bias term (proximal step on b) and the proximal term on rho (when tau < inf)."""
        out = 0.0
        if self.bias_mode == "al":
            out += (self.b + self.gamma_b * rho.sum()) ** 2 / (2.0 * self.gamma_b)
        if np.isfinite(self.tau):
            out += float(np.sum((rho - self.center) ** 2)) / (2.0 * self.tau)
        return out

    def _value_from(self, rho, norms):
        psi = self.kernels.psi(norms)[0]
        return self.loss_term.value(rho) + float(np.sum(psi)) + self._extra_value(rho)

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self, rho: np.ndarray, K_rho: np.ndarray) -> Point:
        k = self.kernels
        norms = np.sqrt(np.maximum(self._norms_sq(np.einsum("mi,i->m", K_rho, rho), k.K_alpha @ rho), 0.0))
        w = k.K_alpha + k.gamma[:, None] * K_rho
        psi, psi1, psi2 = k.psi(norms)
        grad = self.loss_term.grad(rho).copy()
        on = norms > 0.0
        if np.any(on):
            grad += (psi1[on] * k.gamma[on] / norms[on]) @ w[on]
        if self.bias_mode == "al":
            grad += self.b + self.gamma_b * rho.sum()
        if np.isfinite(self.tau):
            grad += (rho - self.center) / self.tau
        value = self.loss_term.value(rho) + float(np.sum(psi)) + self._extra_value(rho)
        return Point(rho, K_rho, norms, w, value, grad, psi1, psi2)

    def kkt_gradient(self, p: Point) -> np.ndarray:
        """The gradient without the proximal term on rho (that term vanishes at convergence)."""
        if np.isfinite(self.tau):
            return p.grad - (p.rho - self.center) / self.tau
        return p.grad

    def hessian(self, p: Point) -> "NewtonSystem":
        """The Newton matrix at p, kept in parts (:class:`NewtonSystem`) so that it can be solved
        densely or as diagonal plus low rank."""
        k = self.kernels
        prox = 1.0 / self.tau if np.isfinite(self.tau) else 0.0
        on = np.flatnonzero((p.norms > 0.0) & ((p.psi1 > 0.0) | (p.psi2 > 0.0)))
        g2, nrm = k.gamma[on] ** 2, p.norms[on]
        scale = g2 * p.psi1[on] / nrm
        rank_one = g2 * (p.psi2[on] - p.psi1[on] / nrm) / nrm**2
        a = k.alpha[on] + k.gamma[on, None] * p.rho
        return NewtonSystem(self.loss_term.hess_diag(p.rho), self.gamma_b if self.bias_mode == "al" else 0.0,
                            prox, on, scale, rank_one, p.w[on], a)

    def direction(self, p: Point, d: np.ndarray) -> Direction:
        K_d = self.kernels.matvec(d)
        return Direction(d, K_d, np.einsum("mi,i->m", K_d, d), p.w @ d, float(p.grad @ d))

    def value_along(self, p: Point, s: Direction, c: float) -> float:
        g = self.kernels.gamma
        norms_sq = p.norms**2 + 2.0 * c * g * s.d_w + c * c * g**2 * s.d_K_d
        return self._value_from(p.rho + c * s.d, np.sqrt(np.maximum(norms_sq, 0.0)))

    def advance(self, p: Point, s: Direction, c: float) -> Point:
        return self.evaluate(p.rho + c * s.d, p.K_rho + c * s.K_d)


@dataclasses.dataclass
class NewtonSystem:
    """The Newton matrix of phi ((27), (50)), in parts:

        H = diag(loss_diag + prox) + bias 1 1^T + sum_{j} [scale_j K_{on_j} + rank_one_j w_j w_j^T],

    w_j = K_{on_j} a_j with a_j = alpha_m + gamma_m rho. With K = L L^T and z = L^T a (so w = L z,
    ||z|| = n_m) each kernel's part is L G L^T, G = scale I + rank_one z z^T, PSD with eigenvalues
    gamma^2 psi'/n_m (orthogonal to z) and gamma^2 psi'' (along z): H = D + F F^T with
    F = [sqrt(bias) 1, L_j G_j^{1/2}, ...], the form the Woodbury back end solves.
    """

    loss_diag: np.ndarray
    bias: float              # gamma_b for the "al" bias term, else 0
    prox: float              # 1/tau, else 0
    on: np.ndarray           # positions in W of the kernels that enter
    scale: np.ndarray
    rank_one: np.ndarray
    w: np.ndarray            # (len(on), n)
    a: np.ndarray            # (len(on), n)

    def dense(self, kernels: KernelTerm, rank_one: bool = True) -> np.ndarray:
        """H as an (n, n) array (dense kernels); ``rank_one=False`` leaves out the terms
        rank_one_j w_j w_j^T (applied as products by the CG back end)."""
        H = np.diag(self.loss_diag)
        if self.bias:
            H += self.bias
        if self.prox:
            H[np.diag_indices_from(H)] += self.prox
        if self.on.size:
            kernels.add_weighted(self.on, self.scale, H)
            if rank_one:
                H += self.w.T @ (self.rank_one[:, None] * self.w)
        return H

    def blocks(self, kernels: KernelTerm, max_columns: int | None = None):
        """(D, [L_j], sigma, coef, [z_j]) with H = diag(D) + sum_j L_j S_j^2 L_j^T, S_j = sigma_j I +
        coef_j z_j z_j^T (class docstring: sigma_j = sqrt(scale_j), S_j has sqrt(gamma^2 psi'') along z_j),
        the bias as one more block (the column 1, sigma = sqrt(bias)); None when the kernels' factors have
        more than ``max_columns`` columns in all (dense kernels, see HeldKernels.factors). D is floored
        at 1e-14 max(D) (a positive diagonal for the Woodbury scaling)."""
        n = self.loss_diag.size
        bias_cols = 1 if self.bias else 0
        cap = None if max_columns is None else max_columns - bias_cols
        Ls, sigma, coef, zs = [], [], [], []
        if self.on.size:
            stored = kernels.held.factor_list(self.on, max_columns=cap)
            if stored is None:
                return None
            for L, s, r1, a in zip(stored, self.scale, self.rank_one, self.a):
                z = L.T @ a
                zz = float(z @ z)
                along = max(s + r1 * zz, 0.0)                 # = gamma^2 psi'' (exactly, up to rounding)
                Ls.append(L)
                sigma.append(np.sqrt(s))
                coef.append((np.sqrt(along) - np.sqrt(s)) / zz if zz > 0.0 else 0.0)
                zs.append(z)
        if self.bias:
            Ls.append(np.ones((n, 1)))
            sigma.append(np.sqrt(self.bias))
            coef.append(0.0)
            zs.append(np.zeros(1))
        D = self.loss_diag + self.prox
        return np.maximum(D, 1e-14 * max(float(np.max(D, initial=0.0)), 1e-300)), Ls, sigma, coef, zs

    def low_rank(self, kernels: KernelTerm, max_columns: int | None = None):
        """(D, F) with H = diag(D) + F F^T, F = [L_j S_j] formed (n, R) (:meth:`blocks`), or None."""
        parts = self.blocks(kernels, max_columns)
        return None if parts is None else self.formed(parts)

    @staticmethod
    def formed(parts):
        """(D, F) from the parts of :meth:`blocks`."""
        D, Ls, sigma, coef, zs = parts
        cols = [sg * L + (np.outer(L @ z, c * z) if c else 0.0) for L, sg, c, z in zip(Ls, sigma, coef, zs)]
        return D, (np.concatenate(cols, axis=1) if cols else np.zeros((D.size, 0)))

    def woodbury(self, kernels: KernelTerm, max_columns: int | None = None):
        """H^{-1} as a ``lowrank.BlockWoodbury`` on :meth:`blocks` (F never formed), or None."""
        parts = self.blocks(kernels, max_columns)
        return None if parts is None else BlockWoodbury(*parts)


#: Newton back ends: "auto" (Woodbury on factor kernels; on dense kernels with n >= LOW_RANK_MIN_N
#: Woodbury when their summed rank is small, else Newton-CG; below, the dense Cholesky), "cholesky",
#: "woodbury", "cg" (Jacobi-preconditioned conjugate gradients on the formed matrix).
NEWTON_BACKENDS = ("auto", "cholesky", "woodbury", "cg")
#: Newton-CG: the most CG steps, as a share of n, before falling back to the dense Cholesky (each
#: step is one n x n product, 2 n^2 flops; the Cholesky costs n^3/3).
CG_MAX_SHARE = 0.05
#: Factor kernels, newton_solver="cg": block-Jacobi CG on the Woodbury capacitance
#: (``BlockWoodbury.capacitance_cg``: 4 n R flops a step against the n R^2 of forming the capacitance),
#: stopped at the inexact-Newton forcing tolerance, at most max(CAPACITANCE_CG_MIN_STEPS, (R - r) / 8)
#: steps (then it costs less than the factorisation), else the factorised Woodbury solve. Not "auto"'s
#: choice (issue 32, ringnorm n = 10,000, M = 200, r = 64, C = 0.05, 60 kernels active, R up to 4096,
#: loaded 2-core machine: 273 s with CG from R = 1024 on, 273 s with Woodbury throughout; CG faster
#: from R ~ 3000, slower below): the preconditioner ignores the kernels' overlap (overlapping Gaussian
#: kernels on shared features), so CG needs many steps; a stronger one would make it pay.
CAPACITANCE_CG_MIN_STEPS = 20
#: Dense kernels are factorised (pivoted Cholesky) for the Woodbury solve only from this n on: below
#: it the n x n Cholesky costs less than factoring, and results stay those of the dense path.
LOW_RANK_MIN_N = 512
#: ... and only while the summed rank R stays below this share of n and LOW_RANK_MAX_COLUMNS (else
#: Newton-CG: the pivoted Cholesky of a near full-rank kernel would cost more than it saves).
LOW_RANK_SHARE = 0.5
LOW_RANK_MAX_COLUMNS = 256


def solve_newton_system(system: NewtonSystem, kernels: KernelTerm, rhs: np.ndarray,
                        backend: str = "auto", forcing: float = 1e-12) -> np.ndarray:
    """Solve H x = rhs (rhs (n,) or (n, k)) for the Newton matrix ``system`` (PSD).

    Back ends: the dense Cholesky of H (also for factor kernels whose summed rank R exceeds n, while
    an n x n matrix fits in ``lowrank.DENSE_BYTES_CAP``) (n^3/3 flops, n x n memory; jitter if needed), or Woodbury
    on H = D + F F^T (``toolkit.lowrank.BlockWoodbury`` on F = [L_j S_j] given by its blocks, never
    formed: one R x R Cholesky, O(n R^2), R the summed rank of the active kernels; "cg" on factor
    kernels: block-Jacobi CG on its capacitance, ``BlockWoodbury.capacitance_cg``). Factor kernels
    always use Woodbury (H is never formed); dense kernels use it under "auto" when n >= LOW_RANK_MIN_N
    and their pivoted Cholesky factors have
    R < min(LOW_RANK_SHARE n, LOW_RANK_MAX_COLUMNS) columns in all, else "cg". "cg" (dense kernels):
    H without its rank-one terms is formed as for the Cholesky (k n^2), then Jacobi-preconditioned
    conjugate gradients (one n x n product a step, 2 n^2 flops, instead of the n^3/3 of the
    factorisation; the rank-one terms as products), stopped at the relative residual ``forcing``
    (inexact Newton: min(1e-2, ||grad||), so the last steps are exact to 1e-12); the Cholesky of
    the same H when CG does not get there in CG_MAX_SHARE n steps. Every back end gives a descent
    direction, and the line search and the stopping test use exact gradients, so the solution is
    that of the Cholesky back end within the inner tolerance (bench_spicy_newton.py).
    """
    n = system.loss_diag.size
    requested = backend
    backend = kernels.held.rep.newton_backend(backend)    # factor kernels: Woodbury, H never formed
    if backend == "woodbury":
        parts = system.blocks(kernels)
        R = sum(L.shape[1] for L in parts[1])
        if R > n and dense_ok(n):
            # more factor columns than rows: the n x n system is the smaller one (n^2 R + n^3/3 flops
            # against n R^2 + R^3/3; at n = 2000, r = 256 with ~20 kernels on: 40x fewer)
            D, F = system.formed(parts)
            H = F @ F.T
            H[np.diag_indices_from(H)] += D
            return _cholesky_solve(H, rhs)
        solver = BlockWoodbury(*parts, factorise=False)
        if requested == "cg":
            widest = max((L.shape[1] for L in parts[1]), default=0)
            x = solver.capacitance_cg(rhs, forcing, max(CAPACITANCE_CG_MIN_STEPS, (R - widest) // 8))
            if x is not None:
                return x
        return solver.factorise().solve(rhs)
    if backend == "auto" and n >= LOW_RANK_MIN_N:
        solver = system.woodbury(kernels, max_columns=int(min(LOW_RANK_SHARE * n, LOW_RANK_MAX_COLUMNS)))
        if solver is not None:
            return solver.solve(rhs)
        backend = "cg"
    if backend == "cg":
        H0 = system.dense(kernels, rank_one=False)
        x = _cg_solve(system, H0, rhs, forcing)
        if x is not None:
            return x
        H0 += system.w.T @ (system.rank_one[:, None] * system.w)
        return _cholesky_solve(H0, rhs)
    return _cholesky_solve(system.dense(kernels), rhs)


def _cg_solve(system: NewtonSystem, H0: np.ndarray, rhs: np.ndarray, forcing: float) -> np.ndarray | None:
    """Jacobi-preconditioned CG on H x = rhs, H = H0 + sum_j rank_one_j w_j w_j^T (products
    H0 p + W^T (rank_one * W p)), column by column, to the relative residual ``forcing``; None when
    a column does not get there in CG_MAX_SHARE n steps."""
    W, c = system.w, system.rank_one
    inv_diag = 1.0 / np.maximum(np.diag(H0) + c @ W**2, 1e-300)
    B = rhs.reshape(rhs.shape[0], -1)
    X = np.empty_like(B)
    max_iter = max(10, int(CG_MAX_SHARE * H0.shape[0]))
    for j in range(B.shape[1]):
        b = B[:, j]
        x, r = np.zeros_like(b), b.copy()
        z = inv_diag * r
        p, rz, target = z.copy(), float(r @ z), forcing * float(np.linalg.norm(b))
        for _ in range(max_iter):
            if float(np.linalg.norm(r)) <= target:
                break
            Hp = H0 @ p + (c * (W @ p)) @ W
            step = rz / float(p @ Hp)
            x += step * p
            r -= step * Hp
            z = inv_diag * r
            rz, rz_old = float(r @ z), rz
            p = z + (rz / rz_old) * p
        else:
            if float(np.linalg.norm(r)) > target:
                return None
        X[:, j] = x
    return X.reshape(rhs.shape)


def _cholesky_solve(H: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve H x = rhs (rhs (n,) or (n, k)) for a symmetric PSD H, adding jitter if needed."""
    scale = max(float(np.max(np.abs(np.diag(H)))), 1e-300)
    for jitter in (0.0, 1e-12, 1e-10, 1e-8, 1e-6):
        try:
            factor = scipy.linalg.cho_factor(H + jitter * scale * np.eye(H.shape[0]), check_finite=False)
            x = scipy.linalg.cho_solve(factor, rhs, check_finite=False)
            if np.all(np.isfinite(x)):
                return x
        except np.linalg.LinAlgError:
            continue
    return np.linalg.lstsq(H, rhs, rcond=None)[0]


@dataclasses.dataclass
class NewtonReport:
    iterations: int
    converged: bool


def newton(problem: InnerProblem, point: Point, max_iter: int, gtol: float = 1e-10,
           backend: str = "auto") -> tuple[Point, NewtonReport]:
    """Damped Newton on phi with Armijo backtracking ([CODE]: constant 0.1, halving).

    Converged when ||grad phi||_inf <= gtol * (1 + ||grad of the loss term||_inf). The gradient of
    the inner objective is the residual of the primal-dual link f = -grad L*(-rho) at the next
    primal iterate (sum_m K_m alpha_m^{t+1} + b^{t+1} 1 - f(rho)), so this tolerance is in the
    units of the decision values; a step-size rule would not be, because the outer update
    multiplies errors in rho by gamma. The Armijo test allows an increase at the rounding level
    of phi (with large gamma the predicted decrease of a correct Newton step can be below it); a
    failed line search or a step below rounding level stops (no progress possible in floating
    point).
    """
    equality = problem.bias_mode == "equality"
    n = point.rho.size

    def small_gradient(p):
        g = p.grad - p.grad.mean() if equality else p.grad
        scale = 1.0 + float(np.max(np.abs(problem.loss_term.grad(p.rho))))
        return float(np.max(np.abs(g))) <= gtol * scale

    if small_gradient(point):
        return point, NewtonReport(0, True)
    for it in range(1, max_iter + 1):
        H = problem.hessian(point)
        g = point.grad
        forcing = min(1e-2, max(1e-12, float(np.linalg.norm(g))))   # inexact Newton (CG back end only)
        if equality:
            x = solve_newton_system(H, problem.kernels, np.column_stack([g, np.ones(n)]), backend, forcing)
            d = -(x[:, 0] - (x[:, 0].sum() / x[:, 1].sum()) * x[:, 1])
            d -= d.mean()  # stay exactly on 1^T rho = const
        else:
            d = -solve_newton_system(H, problem.kernels, g, backend, forcing)
        if not np.all(np.isfinite(d)) or g @ d > 0.0:
            d = -(g - g.mean()) if equality else -g
        s = problem.direction(point, d)
        c = min(1.0, 0.99 * problem.loss_term.max_step(point.rho, d))
        slack = 1e-13 * (1.0 + abs(point.value))
        accepted = False
        for _ in range(60):
            if problem.value_along(point, s, c) <= point.value + 0.1 * c * s.slope + slack:
                accepted = True
                break
            c *= 0.5
        if not accepted:
            return point, NewtonReport(it, False)
        point = problem.advance(point, s, c)
        if small_gradient(point):
            return point, NewtonReport(it, True)
        if c * float(np.max(np.abs(d))) <= 1e-15 * (1.0 + float(np.max(np.abs(point.rho)))):
            return point, NewtonReport(it, False)
    return point, NewtonReport(max_iter, False)
