"""PFBS for elastic-net MKL with the square loss (Liu, "rls_dual_mkl"; NOTES-pfbs-smo.md part 1).

Problem (1) of the paper (§1.1), in the representer form f_j = alpha_j^T k_j(.), ||f_j|| =
||alpha_j||_{K_j} = sqrt(alpha_j^T K_j alpha_j), F = sum_j K_j alpha_j (training values):

    P(alpha) = (1/n) ||F - y||^2 + mu sum_j ||f_j||^2 + 2 tau sum_j ||f_j||,      tau, mu >= 0.

Forward-backward step (§1.2, Algorithm 1, block form of §1.3.1), step 1/(2 sigma) in the norm of
H = H_1 + ... + H_M; one global residual eps = F - y:

    alpha0_j = (1 - mu/sigma) alpha_j - eps / (n sigma)
    alpha_j  <- alpha0_j (||alpha0_j||_{K_j} - tau/sigma)_+ / ||alpha0_j||_{K_j}     (block soft threshold)

The printed projection radius 1/(tau/sigma) is a misprint (erratum in the note): tau/sigma is the
prox of step * 2 tau ||.|| with step 1/(2 sigma). Caching identity (note): with g_j = K_j alpha_j,
K_j alpha0_j = (1 - mu/sigma) g_j - K_j eps / (n sigma) and K_j alpha_j = c_j K_j alpha0_j after the
threshold, so one matvec K_j eps per working-set kernel per iteration gives everything, including
||alpha0_j||_{K_j}^2 = alpha0_j . K_j alpha0_j and the dual norms ||eps||_{K_j}^2 = eps . K_j eps.

Step size (§1.3.2), checked against the Lipschitz constant of THIS scaling
---------------------------------------------------------------------------
In the H metric the smooth part S = (1/n)||F - y||^2 + mu sum_j ||f_j||^2 has gradient
(2/n) A^* eps + 2 mu f (coefficients (2/n) eps + 2 mu alpha_j per block) and Lipschitz constant
L = (2/n) lambda_max(sum_j K_j) + 2 mu, since A A^* = sum_j K_j (A samples f at the training
points). A step 1/(2 sigma) <= 1/L therefore needs sigma >= lambda_max(sum_j K_j)/n + mu. The
paper's sigma = (1/2) max_j lambda_max(K_j) + mu lacks the 1/n and uses max for sum: it is
over-cautious by ~n/2 for one kernel and can be BELOW L/4 (where the iteration diverges) when many
similar kernels are active (tests/test_pfbs.py checks both numerically). So:
  step="lipschitz" (default): sigma = lambda_max(sum_{j in W} K_j)/n + mu over the working set W
      (the iteration never touches other blocks, so this is the exact constant of the iterated
      problem); lambda_max by Lanczos on the summed held blocks (dense for n <= 200), capped by
      sum_{j in W} engine.lambda_max[j], which is a valid upper bound. On factor kernels
      (K_j = L_j L_j^T, issue 17) it is lambda_max(F^T F) of the stacked factors F = [L_j] (R x R,
      R the summed rank; Lanczos on F (F^T v) beyond FACTOR_EIG_MAX_R columns): no n x n matrix.
  step="paper": sigma = (1/2) max_j engine.lambda_max[j] + mu, raised to the Lipschitz value when
      it falls below it (``history[i]["sigma"]`` shows what was used).

The same problem as SpicyMKL's (42), through the plug-ins (``plugins``)
-----------------------------------------------------------------------
P = (2/n) [ Square(y, F) + sum_j ElasticNet_C(||f_j||) ] with C = n (tau + mu), lam = mu / (tau + mu):
the primal, the dual along the residual's ray and the relative gap come from ``duality``
(``primal_value``, ``scaled_dual``, ``relative_gap``), and the step uses ``Square.grad`` and
``L1.prox`` (tests/test_pfbs.py checks that PFBS and SpicyMKL reach the same optimum).

Dual and duality gap (derived; used for stopping, not only max_iter)
--------------------------------------------------------------------
Fenchel dual of min L(Af) + G(f) with L(z) = (1/n)||z - y||^2, G(f) = sum_j h(||f_j||),
h(x) = mu x^2 + 2 tau x: L*(v) = v.y + (n/4)||v||^2, h*(s) = (s - 2 tau)_+^2 / (4 mu), and
||A^* v||_{H_j} = ||v||_{K_j}. With v = -2 theta:

    D(theta) = 2 theta.y - n ||theta||^2 - (1/mu) sum_j (||theta||_{K_j} - tau)_+^2      (mu > 0)
    D(theta) = 2 theta.y - n ||theta||^2,  s.t. ||theta||_{K_j} <= tau for all j          (mu = 0)

P(alpha) >= D(theta) for every alpha, theta; at the optimum theta* = (y - F*)/n. From an iterate we
use theta = -s eps/n with the scalar s >= 0 maximising D (a concave piecewise quadratic in s,
maximised exactly; for mu = 0 this also enforces feasibility). The stopping rule is the relative
gap (P - D)/|P| <= tol. Kernels outside W enter D only through ||eps||_{K_j}: either exactly, from
one engine.quad_forms pass, or through the upper bound ||eps||_K <= ||eps_ref||_K +
sqrt(lambda_max(K)) ||eps - eps_ref||_2 from the last pass (docs/design.md; toolkit.screening), which only lowers D, so
the certificate stays valid.

KKT and the working set
-----------------------
0 in (2/n) eps + 2 mu alpha_j + 2 tau d||f_j||: alpha_j = 0 is optimal iff ||eps||_{K_j} / n <= tau
(the residual-based test). At alpha = 0, eps = -y, hence alpha = 0 exactly iff
tau >= tau_max = max_j sqrt(y^T K_j y) / n (the note's formula holds for this scaling). The solver
iterates on a working set W of kernels held via engine.blocks (restricted gap on W is free from
the cached matvecs); when that gap is below tol it certifies over ALL kernels with the bound or
one quad_forms pass of the shared residual, and re-adds violators (||eps||_{K_j}/n > tau, largest
first, at most max(8, |W|) per round).

Returned model (weights d, dual_coef c, bias b), f = sum_j d_j K_j c + b
------------------------------------------------------------------------
For active j the KKT condition reads (1/n) eps + mu alpha_j + tau alpha_j / ||f_j|| = 0, i.e.

    alpha_j* = theta* / (mu + tau / ||f_j*||),    theta* = (y - F*)/n,

so all optimal alpha_j are proportional to the residual (exactly, not only modulo null(K_j): the
fixed-point equation gives alpha_j (1 - c_j (1 - mu/sigma)) = -c_j eps/(n sigma)). Hence
c = (y - F)/n (the dual variable) and d_j = ||f_j|| / (mu ||f_j|| + tau). PFBS iterates are not of
this form, so the model uses c = (y - F)/n at the last iterate and the least-squares weight
d_j = <alpha_j, c>_{K_j} / ||c||^2_{K_j} (exactly 0 when alpha_j = 0), which coincides with the
formula at convergence. ``objective`` and ``gap`` are evaluated at the RETURNED model against the
certified dual value. With ``center=True`` the problem is solved for y - mean(y) and the model gets
bias = mean(y): a fixed, unpenalised offset (exactly the optimal bias only when every K_j has
centred rows; otherwise it is the usual RLS convention, not a joint optimum over b).

FISTA (``accelerated=True``): Beck-Teboulle extrapolation z = x_k + ((t_{k-1} - 1)/t_k)(x_k - x_{k-1})
(K_j z is a combination of cached g_j, so still one matvec per kernel), with O'Donoghue-Candes
gradient restart when <z - x_{k+1}, x_{k+1} - x_k>_H > 0, and a restart whenever W changes.
The per-iteration gap pairs P(x_{k+1}) with the dual point from the residual at z.

Checkpoints (``fit(..., checkpoint=Checkpoint(...))``, mklscale.runtime.checkpoint)
-----------------------------------------------------------------------------------
``checkpoint.step`` runs at the start of every PFBS iteration (all working-set rounds). The state
(:meth:`PFBSSolver._state`) is the iterate and everything the remaining iterations read: the
working-set kernel indices in held order, alpha_j and g_j = K_j alpha_j (exactly as cached, not
recomputed), the FISTA pair (x_{k-1}, K x_{k-1}) and t_k, the round's gap target, the cached step
size (|W|, sigma) and Lanczos start vector, the reference residual and norms of the last full pass
(the inactivity bound), the iteration count and the history with its pass / byte / time counters.
No kernel blocks: a resume re-reads W with engine.blocks. The resumed run is bit-identical to an
uninterrupted one; its first new history entry has ``"resumed": True``. The caller's fingerprint
must identify the problem: the bank, y, tau, mu and every other parameter of :func:`fit`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import scipy.linalg
from scipy.sparse.linalg import LinearOperator, eigsh

from mklscale.errors import InvalidInputError
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers import _validation as check
from mklscale.solvers import duality
from mklscale.solvers.duality import relative_gap
from mklscale.solvers.losses import Square
from mklscale.solvers.penalties import L1, ElasticNet
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog
from mklscale.solvers.toolkit.screening import Screening
from mklscale.solvers.toolkit.working_set import HeldKernels

STEP_RULES = ("lipschitz", "paper")
INITIAL_WORKING_SET = 16
MIN_ADDITIONS = 8
INNER_TOL_FACTOR = 0.5        # the working-set gap target, relative to tol, before a certification
DENSE_EIG_MAX_N = 200
FACTOR_EIG_MAX_R = 2000
#: The plug-ins of the forward-backward step (the solver needs Square.grad and L1.prox).
_SQUARE, _BLOCK_L1 = Square(), L1()
#: What to do when the working set does not fit in memory.
_MEMORY_REMEDY = ("use a larger tau (fewer active kernels: a larger fraction of pfbs.tau_max), or SpicyMKL, "
                  "which streams the bank and holds only the kernels it can fit")


@dataclasses.dataclass
class PFBSCoefficients:
    """The raw per-kernel coefficients of the last iterate: alpha_{kernels[i]} = alphas[i]
    (every kernel not listed has alpha = 0). Usable as ``init`` of :func:`fit`."""

    kernels: np.ndarray
    alphas: np.ndarray


# ---- values of problem (1) and its dual -------------------------------------------------------

def plugins(n: int, tau: float, mu: float) -> tuple[Square, ElasticNet, float]:
    """Problem (1) as problem (42) of SpicyMKL: (loss, penalty, C) with P_(1) = (2/n) P_(42).

    (1/n)||F - y||^2 + mu sum ||f_j||^2 + 2 tau sum ||f_j||
        = (2/n) [ (1/2)||y - F||^2 + sum_j C ((1 - lam) ||f_j|| + lam ||f_j||^2 / 2) ]
    with C = n (tau + mu) and lam = mu / (tau + mu): the square loss and the elastic-net penalty, so
    the primal, the dual and the gap come from the one duality module (``duality``).
    """
    total = tau + mu
    return Square(), ElasticNet(mu / total if total > 0.0 else 0.0), n * total


def primal_value(residual: np.ndarray, block_norms: np.ndarray, tau: float, mu: float) -> float:
    """P = (1/n)||F - y||^2 + mu sum ||f_j||^2 + 2 tau sum ||f_j|| from the residual F - y
    (through :func:`plugins`: the square loss of the residual and the elastic-net penalty)."""
    n = residual.size
    loss, penalty, C = plugins(n, tau, mu)
    return 2.0 / n * duality.primal_value(loss, penalty, residual, C, np.zeros(n), block_norms)


def dual_value(residual: np.ndarray, y: np.ndarray, kkt_norms: np.ndarray, tau: float,
               mu: float) -> tuple[float, float]:
    """(D(theta), s) at theta = -s residual / n with s >= 0 maximising D (see module docstring):
    ``duality.scaled_dual`` along rho = -residual, scaled by 2/n as the primal (:func:`plugins`).

    ``kkt_norms`` holds ||residual||_{K_j} / n for the kernels of the problem being certified (all
    M for the full problem, W for the restricted one); upper bounds in place of exact values give a
    smaller, still valid, dual value.
    """
    n = residual.size
    loss, penalty, C = plugins(n, tau, mu)
    value, s = duality.scaled_dual(loss, penalty, y, C, -residual, n * kkt_norms)
    return 2.0 / n * value, s


def tau_max(engine, y, center: bool = False) -> float:
    """max_j sqrt(y^T K_j y) / n: the smallest tau with alpha = 0 optimal (one quad_forms pass)."""
    n, _, _ = check.check_engine(engine)
    y = check.check_targets(y, n, False, "square")
    if center:
        y = y - y.mean()
    q = np.asarray(engine.quad_forms(y), dtype=np.float64)
    return float(np.sqrt(max(float(q.max()), 0.0)) / n)


# ---- the working set and the bank -------------------------------------------------------------

class _WorkingSet:
    """The held kernels W (:class:`~mklscale.solvers.toolkit.working_set.HeldKernels`: as the
    engine stores them, one copy each, float64 products), their alpha_j and the cached
    g_j = K_j alpha_j."""

    def __init__(self, engine):
        self.held = HeldKernels(engine, name="PFBS")
        self.n = self.held.n
        self.alphas = np.zeros((0, self.n))
        self.K_alphas = np.zeros((0, self.n))
        self._top_vector = None

    @property
    def index(self) -> np.ndarray:
        return self.held.index

    @property
    def size(self) -> int:
        return self.held.size

    def add(self, idx) -> None:
        """Hold kernels ``idx`` (those not held yet) with alpha_j = 0."""
        count = self.held.fetch(idx, _MEMORY_REMEDY).size
        self.alphas = np.concatenate([self.alphas, np.zeros((count, self.n))])
        self.K_alphas = np.concatenate([self.K_alphas, np.zeros((count, self.n))])

    def matvecs(self, u: np.ndarray) -> np.ndarray:
        """(k, n) K_j u for every held kernel, in float64."""
        return self.held.matvecs(u)

    def refresh(self) -> None:
        """Recompute g_j = K_j alpha_j exactly (the recurrences accumulate rounding)."""
        self.K_alphas = self.held.each_matvec(self.alphas)

    def lambda_max_of_sum(self) -> float:
        """lambda_max(sum_j K_j) of the held kernels, on the sum as the representation gives it."""
        return self.held.with_sum(self._lambda_max_of_dense, _lambda_max_of_factor)

    def _lambda_max_of_dense(self, S: np.ndarray) -> float:
        n = S.shape[0]
        if n <= DENSE_EIG_MAX_N:
            return float(scipy.linalg.eigh(S, eigvals_only=True, subset_by_index=[n - 1, n - 1])[0])
        v0 = np.ones(n) if self._top_vector is None else self._top_vector
        vals, vecs = eigsh(S, k=1, which="LA", v0=v0, tol=1e-10)
        self._top_vector = vecs[:, 0]
        return float(vals[0]) * (1.0 + 1e-8)  # Ritz values approach lambda_max from below


def _lambda_max_of_factor(F: np.ndarray) -> float:
    """lambda_max(sum_j K_j) = lambda_max(F F^T) = lambda_max(F^T F) for the stacked factors F
    (n, R) of the held kernels (issue 17): the R x R eigenproblem for R <= FACTOR_EIG_MAX_R, else
    Lanczos with the products F (F^T v), never an n x n matrix."""
    n, R = F.shape
    if R == 0:
        return 0.0
    if R <= FACTOR_EIG_MAX_R:
        G = F.T @ F
        return float(scipy.linalg.eigh(G, eigvals_only=True, subset_by_index=[R - 1, R - 1])[0]) * (1.0 + 1e-12)
    op = LinearOperator((n, n), matvec=lambda v: F @ (F.T @ v), dtype=np.float64)
    vals = eigsh(op, k=1, which="LA", v0=np.ones(n), tol=1e-10, return_eigenvectors=False)
    return float(vals[0]) * (1.0 + 1e-8)


def _forward_backward(ws: _WorkingSet, z, Kz, y, tau, mu, sigma):
    """One PFBS step from z (with Kz = K_j z_j cached): returns (x, Kx, eps_z, ||eps_z||_{K_j}/n).

    Forward: the gradient of the smooth part, the square loss (eps = F - y, ``Square.grad``) and the
    ridge part mu of the elastic net; backward: the prox of the block 1-norm part 2 tau sum ||f_j||,
    a block soft threshold at tau / sigma (``L1.prox``).
    """
    n = y.size
    eps = _SQUARE.grad(y, Kz.sum(axis=0))
    K_eps = ws.matvecs(eps)                                     # the one matvec per kernel
    shrink, scale = 1.0 - mu / sigma, 1.0 / (n * sigma)
    a0 = shrink * z - scale * eps
    Ka0 = shrink * Kz - scale * K_eps
    norm0 = np.sqrt(np.maximum(np.einsum("ki,ki->k", a0, Ka0), 0.0))
    factor = np.zeros_like(norm0)
    keep = norm0 > tau / sigma
    factor[keep] = _BLOCK_L1.prox(norm0[keep], tau / sigma) / norm0[keep]
    kkt = np.sqrt(np.maximum(K_eps @ eps, 0.0)) / n
    return factor[:, None] * a0, factor[:, None] * Ka0, eps, kkt


def _block_norms(alphas, K_alphas) -> np.ndarray:
    return np.sqrt(np.maximum(np.einsum("ki,ki->k", alphas, K_alphas), 0.0))


# ---- the solver -------------------------------------------------------------------------------

class PFBSSolver:
    """PFBS on one engine, targets and mu, kept across calls to :meth:`solve` (a tau path reuses
    the held blocks, the working set and the last full-pass norms)."""

    def __init__(self, engine, y, mu: float, center: bool = False, step: str = "lipschitz",
                 working_set=None, accelerated: bool = False, tol: float = 1e-6, max_iter: int = 20000,
                 verbose: bool = False):
        self.engine = engine
        self.n, self.M, lambda_max = check.check_engine(engine)
        y = check.check_targets(y, self.n, False, "square")
        self.mu = check.check_positive("mu", mu, allow_zero=True)
        self.step = check.check_choice("step", step, STEP_RULES)
        self.tol = check.check_positive("tol", tol)
        self.max_iter = check.check_count("max_iter", max_iter)
        self.center, self.accelerated, self.verbose = _flag("center", center), _flag("accelerated", accelerated), verbose
        self.bias = float(y.mean()) if self.center else 0.0
        self.y = y - self.bias
        self.lambda_max = lambda_max
        self.working_set_rule = check.check_working_set(working_set, self.M)
        self.screen = Screening(engine, lambda_max)
        self.ws = _WorkingSet(engine)
        self._sigma_for = None     # (working-set size, sigma) of the last step-size computation

    # -- public ---------------------------------------------------------------------------------
    def solve(self, tau: float, init=None, return_coefficients: bool = False, checkpoint=None):
        """Solve for ``tau`` (see :func:`fit`); with ``checkpoint`` (a fresh solver only) resume
        from its state when there is one (``init`` is then ignored) and save as it goes."""
        tau = check.check_positive("tau", tau, allow_zero=True)
        if tau == 0.0 and self.mu == 0.0:
            raise InvalidInputError("tau = 0 and mu = 0 is unregularised least squares (no unique "
                                    "solution, no certificate); give tau > 0 or mu > 0")
        self.log = RunLog(self.engine, "pfbs", self.verbose, not_monotone="the forward-backward iterates' gap is "
                          "not monotone" + (" (FISTA's momentum)" if self.accelerated else ""))
        self._said_working_set = 0   # |W| at the last verbose line
        self.iterations = 0
        self._target = INNER_TOL_FACTOR * self.tol     # gap target of the working-set rounds
        self._momentum = None     # (x_prev, K x_prev, t) the next round starts from (a resume)
        state = checkpoint.load() if checkpoint is not None else None
        if state is None:
            self._set_initial(init)
            self._initial_working_set(tau)
        else:
            self._restore(state)
        converged, certificate = self._outer_loop(tau, checkpoint)
        result = self._result(tau, certificate, converged)
        if return_coefficients:
            return result, PFBSCoefficients(self.ws.index.copy(), self.ws.alphas.copy())
        return result

    # -- initial point and working set -----------------------------------------------------------
    def _set_initial(self, init) -> None:
        if init is None:
            return                       # keep the current iterate (zero on the first call)
        if isinstance(init, MKLResult):
            if init.weights.size != self.M or init.dual_coef.size != self.n:
                raise InvalidInputError(f"init has {init.weights.size} weights and {init.dual_coef.size} "
                                        f"dual coefficients; this problem has M={self.M}, n={self.n}")
            kernels = init.active
            alphas = init.weights[kernels, None] * init.dual_coef[None, :]
        elif isinstance(init, PFBSCoefficients):
            kernels = np.asarray(init.kernels, dtype=np.int64).reshape(-1)
            alphas = np.asarray(init.alphas, dtype=np.float64).reshape(kernels.size, -1)
            if alphas.shape[1] != self.n or (kernels.size and (kernels.min() < 0 or kernels.max() >= self.M)):
                raise InvalidInputError(f"init coefficients must be (k, n={self.n}) with kernels in [0, {self.M})")
        else:
            raise InvalidInputError(f"init must be None, an MKLResult or PFBSCoefficients; got {type(init).__name__}")
        if not np.all(np.isfinite(alphas)):
            raise InvalidInputError("init contains NaN or inf")
        self.ws.alphas[:] = 0.0
        self.ws.add(kernels[~np.isin(kernels, self.ws.index)])
        pos = {int(k): i for i, k in enumerate(self.ws.index)}
        for k, a in zip(kernels, alphas):
            self.ws.alphas[pos[int(k)]] = a
        self.ws.refresh()

    def _initial_working_set(self, tau: float) -> None:
        rule = self.working_set_rule
        if isinstance(rule, str) and rule == "all":
            self.ws.add(np.arange(self.M))
            return
        if not isinstance(rule, str):      # given indices: certification re-adds what they miss
            self.ws.add(rule)
            return
        residual = self.ws.K_alphas.sum(axis=0) - self.y
        kkt = self.screen.norms(residual) / self.n
        outside = np.setdiff1d(np.arange(self.M), self.ws.index)
        violators = outside[kkt[outside] > tau]
        violators = violators[np.argsort(-kkt[violators], kind="stable")]
        self.ws.add(violators[:INITIAL_WORKING_SET])

    # -- iterations -------------------------------------------------------------------------------
    def _sigma(self) -> float:
        if self._sigma_for is not None and self._sigma_for[0] == self.ws.size:
            return self._sigma_for[1]
        lam_sum = min(self.ws.lambda_max_of_sum(), float(self.lambda_max[self.ws.index].sum()))
        sigma = lam_sum / self.n + self.mu
        if self.step == "paper":
            sigma = max(0.5 * float(self.lambda_max.max()) + self.mu, sigma)
        if sigma <= 0.0:                   # all held kernels are zero: any step works
            sigma = 1.0
        self._sigma_for = (self.ws.size, sigma)
        return sigma

    def _iterate(self, tau: float, target_gap: float, checkpoint=None) -> float:
        """Iterate on W until its (restricted) relative gap <= target_gap or the budget runs out."""
        ws, y, mu = self.ws, self.y, self.mu
        sigma = self._sigma()
        x, Kx = ws.alphas, ws.K_alphas
        x_prev, Kx_prev, t = self._momentum or (x, Kx, 1.0)
        self._momentum = None
        gap = math.inf
        while self.iterations < self.max_iter:
            if checkpoint is not None:
                checkpoint.step(self.iterations, functools.partial(self._state, x, Kx, x_prev, Kx_prev, t))
            self.iterations += 1
            if self.accelerated:
                t_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
                beta = (t - 1.0) / t_next
                z, Kz = x + beta * (x - x_prev), Kx + beta * (Kx - Kx_prev)
            else:
                t_next, z, Kz = 1.0, x, Kx
            x_new, Kx_new, eps_z, kkt_z = _forward_backward(ws, z, Kz, y, tau, mu, sigma)
            norms = _block_norms(x_new, Kx_new)
            primal = primal_value(Kx_new.sum(axis=0) - y, norms, tau, mu)
            dual, _ = dual_value(eps_z, y, kkt_z, tau, mu)
            gap = relative_gap(primal, dual)
            restarted = False
            if self.accelerated and np.einsum("ki,ki->", z - x_new, Kx_new - Kx) > 0.0:
                t_next, restarted = 1.0, True
            x_prev, Kx_prev, x, Kx, t = x, Kx, x_new, Kx_new, t_next
            self._record(primal, dual, gap, int(np.count_nonzero(norms)), "working_set", sigma=sigma,
                         restart=restarted)
            if gap <= target_gap:
                break
        ws.alphas, ws.K_alphas = x, Kx
        return gap

    def _outer_loop(self, tau: float, checkpoint=None):
        while True:
            if self.ws.size:
                self._iterate(tau, self._target, checkpoint)
            certificate = self._certify(tau)
            gap, violators = certificate["gap"], certificate["violators"]
            if gap <= self.tol:
                return True, certificate
            if self.iterations >= self.max_iter:
                return False, certificate
            if violators.size:
                order = np.argsort(-certificate["kkt"][violators], kind="stable")
                self.ws.add(violators[order][: max(MIN_ADDITIONS, self.ws.size)])
            else:
                self._target = max(0.1 * self._target, 1e-15)

    def _certify(self, tau: float) -> dict:
        """Gap of the model built from the current iterate (see "Returned model") over ALL
        kernels: the inactivity bound first, one quad_forms pass if it cannot decide."""
        ws = self.ws
        ws.refresh()
        residual = ws.K_alphas.sum(axis=0) - self.y
        iterate_primal = primal_value(residual, _block_norms(ws.alphas, ws.K_alphas), tau, self.mu)
        model = self._model(residual, tau)
        inside = np.sqrt(np.maximum(ws.matvecs(residual) @ residual, 0.0)) / self.n
        kkt = np.zeros(self.M)
        kkt[ws.index] = inside
        outside = np.ones(self.M, dtype=bool)
        outside[ws.index] = False
        used_pass, passes_before = False, self.engine.counters().passes
        if outside.any():
            bounds = self.screen.upper_bounds(residual)
            certified = False
            if bounds is not None and np.all(bounds[outside] / self.n <= tau):
                kkt[outside] = bounds[outside] / self.n
                dual, _ = dual_value(residual, self.y, kkt, tau, self.mu)
                certified = relative_gap(model["objective"], dual) <= self.tol
            if not certified:
                kkt[outside] = self.screen.norms(residual)[outside] / self.n
                used_pass = True
        dual, _ = dual_value(residual, self.y, kkt, tau, self.mu)
        gap = relative_gap(model["objective"], dual)
        violators = np.flatnonzero(outside & (kkt > tau)) if used_pass else np.zeros(0, dtype=np.int64)
        self._record(model["objective"], dual, gap, int(np.count_nonzero(model["weights"])), "all",
                     iterate_primal=iterate_primal, iterate_gap=relative_gap(iterate_primal, dual),
                     full_pass=self.engine.counters().passes > passes_before, violators=int(violators.size))
        return {"model": model, "dual": dual, "gap": gap, "violators": violators, "kkt": kkt,
                "iterate_primal": iterate_primal}

    def _model(self, residual: np.ndarray, tau: float) -> dict:
        """(weights d, c = (y - F)/n) from the iterate, d_j = <alpha_j, c>_K / ||c||_K^2, and
        the primal value of problem (1) at alpha_j = d_j c."""
        ws = self.ws
        c = -residual / self.n
        weights = np.zeros(self.M)
        if ws.size:
            K_c = ws.matvecs(c)
            c_norms_sq = K_c @ c
            inner = ws.K_alphas @ c
            with np.errstate(divide="ignore", invalid="ignore"):
                d = np.where(ws.alphas.any(axis=1) & (c_norms_sq > 0.0), inner / c_norms_sq, 0.0)
            d = np.maximum(d, 0.0)
            weights[ws.index] = d
            F = d @ K_c
            block_norms = d * np.sqrt(np.maximum(c_norms_sq, 0.0))
        else:
            F, block_norms = np.zeros(self.n), np.zeros(0)
        objective = primal_value(F - self.y, block_norms, tau, self.mu)
        return {"weights": weights, "dual_coef": c, "objective": objective}

    # -- checkpoints ----------------------------------------------------------------------------
    def _state(self, x, Kx, x_prev, Kx_prev, t) -> dict:
        """Checkpoint state at the start of an iteration (module docstring, "Checkpoints")."""
        state = {"kernels": self.ws.index.copy(), "alphas": x, "K_alphas": Kx, "alphas_prev": x_prev,
                 "K_alphas_prev": Kx_prev, "t": t, "target": self._target,
                 "sigma_for": None if self._sigma_for is None else list(self._sigma_for),
                 **self.log.state(), **self.screen.state()}
        if self.ws._top_vector is not None:
            state["top_vector"] = self.ws._top_vector
        return state

    def _restore(self, state: dict) -> None:
        """Continue from :meth:`_state`'s dict: re-hold W (one engine.blocks read), set the rest."""
        if self.ws.size:
            raise InvalidInputError("a checkpoint resumes into a fresh PFBSSolver (this one holds kernels)")
        self.log.restore(state)
        self.iterations = int(state["iteration"])
        self.ws.add(state["kernels"])
        self.ws.alphas, self.ws.K_alphas = state["alphas"], state["K_alphas"]
        self._momentum = (state["alphas_prev"], state["K_alphas_prev"], float(state["t"]))
        self._target = float(state["target"])
        self._sigma_for = None if state["sigma_for"] is None else (int(state["sigma_for"][0]), float(state["sigma_for"][1]))
        self.screen.restore(state)
        self.ws._top_vector = state.get("top_vector")

    # -- bookkeeping ----------------------------------------------------------------------------
    def _record(self, primal, dual, gap, n_active, scope, **extra) -> None:
        entry = self.log.record({"iteration": self.iterations, "primal": primal, "dual": dual, "gap": gap,
                                 "n_active": n_active, "working_set": self.ws.size, "scope": scope, **extra})
        if scope == "all" or self.iterations % 100 == 0:
            self.log.explain(f"[{scope}]", {
                "working_set": "the gap of the iterate over the working set W (the kernels held) only, printed "
                               "every 100 iterations",
                "all": f"the gap of the model returned from the iterate (weights d_j, module docstring) over all "
                       f"{self.M} kernels, which decides whether PFBS stops"}[scope])
            grew = self.ws.size - self._said_working_set if self._said_working_set else 0
            self._said_working_set = self.ws.size
            self.log.say(f"it {self.iterations:6d} [{scope}] P={primal:.10g} D={dual:.10g} gap={gap:.2e} "
                         f"active={n_active} |W|={self.ws.size} passes={entry['passes']}"
                         + (f"  {extra['violators']} kernel(s) outside W violate the optimality test"
                            if extra.get("violators") else ""),
                         gap=gap, scope="all" if scope == "all" else "working set",
                         why=f"the working set W grew by {grew} kernel(s) since the previous line" if grew > 0 else None)

    def _result(self, tau: float, certificate: dict, converged: bool) -> MKLResult:
        model = certificate["model"]
        return MKLResult(weights=model["weights"], dual_coef=model["dual_coef"], bias=self.bias,
                         active=np.flatnonzero(model["weights"]), objective=model["objective"],
                         gap=certificate["gap"], history=self.log.history, converged=converged,
                         solver="pfbs/fista" if self.accelerated else "pfbs",
                         params={"tau": tau, "mu": self.mu, "tol": self.tol, "max_iter": self.max_iter,
                                 "accelerated": self.accelerated, "center": self.center, "step": self.step,
                                 "iterations": self.iterations,
                                 "working_set": self.ws.index.tolist(),
                                 "iterate_objective": certificate["iterate_primal"]})


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(f"{name} must be True or False; got {value!r}")
    return bool(value)


@single_blas_thread_for_small_n
def fit(engine, y, tau, mu, tol: float = 1e-6, max_iter: int = 20000, accelerated: bool = True,
        center: bool = False, init=None, working_set=None, step: str = "lipschitz",
        return_coefficients: bool = False, verbose: bool = False, checkpoint=None):
    """Solve problem (1) by PFBS (see the module docstring for formulas, gap and errata).

    Parameters
    ----------
    engine : mklscale engine (n, M, lambda_max, quad_forms, matvecs, blocks, stats).
    y : (n,) real targets (square loss; +-1 labels give RLS classification).
    tau : group-L1 weight >= 0 (tau >= tau_max gives alpha = 0 exactly); mu : ridge weight >= 0.
    tol : relative duality gap (P - D)/|P| certified over all M kernels.
    max_iter : total PFBS iterations (all working-set rounds together).
    accelerated : FISTA with adaptive restart (default) instead of plain PFBS (the paper's iteration,
        ``accelerated=False``): at tau = 0.1 tau_max on breast_cancer (36 kernels) plain PFBS stopped at
        gap 0.04 after 20 000 iterations where FISTA certified 5e-7.
    center : solve for y - mean(y) and return bias = mean(y) (a fixed offset, see docstring).
    init : None, an MKLResult (alpha_j = weights[j] dual_coef) or PFBSCoefficients (warm start).
    working_set : None/"auto" (grow from violators), "all" (no passes; every kernel held), or
        kernel indices to start from (violators are re-added by certification).
    step : "lipschitz" or "paper" (see "Step size").
    return_coefficients : also return the raw PFBSCoefficients of the last iterate.
    checkpoint : None or a :class:`mklscale.runtime.checkpoint.Checkpoint`: resume from its state
        if it holds one (``init`` is then ignored), save it every iteration when due and on
        SIGTERM/SIGINT (see "Checkpoints"; the caller clears it after storing the result).
    """
    solver = PFBSSolver(engine, y, mu, center=center, step=step, working_set=working_set,
                        accelerated=accelerated, tol=tol, max_iter=max_iter, verbose=verbose)
    return solver.solve(tau, init=init, return_coefficients=return_coefficients, checkpoint=checkpoint)
