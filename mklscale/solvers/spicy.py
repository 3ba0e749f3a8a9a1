"""SpicyMKL (Suzuki & Tomioka, "SpicyMKL: a fast algorithm for multiple kernel learning with
thousands of kernels"), out of core over an engine.

Problem (7)/(42), solved in the finite representation of the representer theorem:

    min_{alpha, b}  P(alpha, b) = sum_i loss(y_i, (sum_m K_m alpha_m)_i + b) + sum_m g~_C(||alpha_m||_{K_m})

with g~_C from ``penalties`` (block 1-norm C x, elastic net C((1-lam) x + lam x^2/2), block q-norm
C x^q/q) and the loss from ``losses`` (logistic, hinge, (1/2)(y-f)^2, eps-insensitive); b = 0 when
``bias=False``. Dual (48): max_{1^T rho = 0} -L*(-rho) - sum_m g~_C*(||rho||_{K_m}).

Methods
-------
"proximal" (SpicyMKL, §3 and §4.2): proximal minimisation = augmented Lagrangian on the dual.
  Outer step t with per-block proximity parameters gamma_m, gamma_b ((8), footnote 2):
    rho^t = argmin_rho phi(rho), phi = L*(-rho) + sum_m ghat(||alpha_m + gamma_m rho||; gamma_m C)/gamma_m
                                 + (b + gamma_b 1^T rho)^2 / (2 gamma_b)                   ((25), (47))
    alpha_m <- prox(alpha_m + gamma_m rho^t | g~_{gamma_m C}),  b <- b + gamma_b 1^T rho^t  ((11)-(12))
  Hinge: slack augmented Lagrangian (§3.4.1); eps-insensitive: constrained conjugate (§3.4.2).
  For these two piecewise-linear conjugates the inner objective also gets a proximal term
  ||rho - rho^t||^2 / (2 tau), tau = 1, 10, 100, ... (capped): without it the Newton matrix is
  singular wherever no kernel term and no box constraint is active (e.g. in the near-null space
  of smooth Gaussian kernels) and the inner Newton stalls. This is the proximal method of
  multipliers (Rockafellar 1976), which has the same fixed points as (8)-(12); the [CODE] adds
  1e-8 I to the Newton matrix instead.
  Inner minimisation: damped Newton (see _spicy_inner), stopped on the gradient, which is the
  residual of f = -grad L*(-rho) at the next primal iterate. gamma schedule [CODE]: ck = smallest
  maximal violation so far; a block whose violation exceeds ck/2 gets gamma *= 10, else += 10;
  gamma is capped at 1e6 (beyond that alpha_m + gamma rho loses the digits the update needs).
"bcd" (factor banks; logistic / square / hinge loss, block 1-norm / elastic net; "auto" there): the same
  problem in the primal, f = sum_m L_m v_m + b with ||f_m|| = ||v_m||, by block coordinate Newton with
  r x r block Hessians (``bcd.py``), with this module's working sets, certificate and returned model.
"one_step" (ElastMKL, §4.3; elastic net with lam > 0, block q-norm): Newton on the dual (48)
  directly, 1^T rho = 0 kept exactly (the paper penalises C_b (1^T rho)^2). For hinge and
  eps-insensitive the box constraints of L* still need the slack augmented Lagrangian (§3.4), so
  the outer loop only updates those multipliers.

Primal model returned (weights d, dual_coef c, bias b), f = sum_m d_m K_m c + b
--------------------------------------------------------------------------------
KKT of (42) (from the Lagrangian (14), erratum 6): at the optimum
  sum_m K_m alpha_m* + b* 1 = f* = -grad_rho L*(-rho)|rho*   (i.e. rho*_i = -loss'(y_i, f*_i)),
  alpha_m* maximises <rho*, alpha_m>_{K_m} - g~_C(||alpha_m||_{K_m}), so alpha_m* is a non-negative
  multiple of rho*: alpha_m* = x_m rho*/||rho*||_{K_m} with ||rho*||_{K_m} = g~_C'(x_m), x_m = ||alpha_m*||.
Hence alpha_m* = (x_m / g~_C'(x_m)) rho* = (d_m / C) rho* with d_m = 1/(2 g'(x_m^2)) the Table 3
weight (g~_C'(x) = 2 C x g'(x^2)). So c = rho*/C is shared by all kernels and d_m is the kernel
weight. The iterates of the proximal method are not exactly of this form (alpha_m^{t+1} =
s_m (alpha_m^t + gamma_m rho^t) mixes different rho^t), so the returned model uses c = rho^t/C and
the least-squares weight d_m = C <alpha_m, rho^t>_{K_m} / ||rho^t||^2_{K_m} (>= 0, exactly 0 when
alpha_m = 0); it coincides with alpha at convergence. ``objective`` and ``gap`` are evaluated at
the RETURNED model, so they certify what is returned, not an internal iterate. Without
convergence (max_outer reached) the certified iterate with the smallest gap is returned.

Out of core
-----------
Kernels with alpha_m = 0 only enter through ||rho||_{K_m}. The solver keeps a working set W of
dense kernels (engine.blocks), initialised from one full quad_forms pass at the projected initial
rho (the first 32 kernels above the penalty threshold, largest first; on a factor bank the first
512 / r, see below). It solves on W until the
duality gap of the restricted problem is below tol, then certifies over all M kernels: if the bound
||u||_K <= ||u_ref||_K + sqrt(lambda_max(K)) ||u - u_ref||_2 (u_ref from the last pass) proves every
kernel outside W below the threshold, no pass is needed; otherwise one quad_forms pass computes the
gap over all kernels and the violators (||rho~||_{K_m} > threshold), which join W (largest first;
at most max(16, |W|) per round for the proximal method, max(16, 3 |W|) for one_step, see
``_Spicy._growth``) with warm start. Penalties without a threshold (block q-norm,
elastic net with lam = 1) have every kernel in the model, so W is the whole bank.

Factor banks (issue 17): on an engine storing K~_m = L_m L_m^T as L_m (n x r) the same problem is
solved on the K~_m (f = sum_m L_m v_m + b, ||f_m|| = ||v_m||): W holds the factors, every product
is K~_m u = L_m (L_m^T u), and the Newton systems are solved by Woodbury on the stacked factors of
the kernels that enter (``_spicy_inner.solve_newton_system``): O(n R^2) per Newton step with R the
summed rank, never an n x n array. Every loss and penalty runs there (tests/test_spicy_factor.py).
While gamma_m is small, the proximal method's first outer steps keep every kernel of W in their
Newton systems, so W starts from fewer kernels there: 512 / r of them (``Factor.working_set_start``,
8 at r = 64; issue 32: 35 s -> 6 s at n = 10,000, M = 50, 5 active; a pass over factors costs
O(n r M), far less than those Newton steps).

Memory: W's kernels are held once, as the engine stores them (float32 for a float32 bank; the
engine is asked not to keep a cache copy of them, ``blocks(idx, keep=False)``), and every product
with them accumulates in float64 (``_spicy_inner.KernelTerm``). Their bytes are capped by
``working_set_bytes`` (default: the engine's block-cache budget): violators beyond the room left
wait for a later round (largest first); when the violators do not fit, the kernels of W with zero
weight are dropped to make room, and when W holds only weighted kernels and is full while kernels
outside it still violate the optimality condition, the fit stops with InvalidInputError saying how
much W needs.
"""

from __future__ import annotations

import functools

import numpy as np

from mklscale.engine.cache import parse_bytes
from mklscale.errors import InvalidInputError
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers import bcd, duality
from mklscale.solvers import _validation as check
from mklscale.solvers._spicy_inner import NEWTON_BACKENDS, InnerProblem, KernelTerm, newton
from mklscale.solvers._spicy_loss_terms import make_loss_term
from mklscale.solvers.losses import LOSSES, Loss, make_loss
from mklscale.solvers.penalties import PENALTIES, Penalty, make_penalty
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog
from mklscale.solvers.toolkit.screening import Screening
from mklscale.solvers.toolkit.working_set import HeldKernels

GAMMA_INIT = 10.0          # [CODE] initial gamma_m and per-sample slack gammas
GAMMA_BIAS_INIT = 1.0      # [CODE] initial gamma_b
GAMMA_FACTOR = 10.0        # [CODE] calpha
TAU_INIT = 1.0            # proximal parameter on rho for hinge / eps-insensitive
TAU_FACTOR = 10.0
GAMMA_MAX = 1e6            # cap: beyond this the Newton systems lose accuracy, nothing is gained
INITIAL_WORKING_SET = 32
MIN_ADDITIONS = 16
GROWTH = {"proximal": 1, "one_step": 3, "bcd": 1}   # W grows by at most max(MIN_ADDITIONS, GROWTH |W|) per round
INNER_GTOL = 1e-10
METHODS = ("auto", "proximal", "one_step", "bcd")
#: max_outer's default: outer iterations, or epochs of the block descent (each costs about one matrix-
#: vector product per kernel of W; waveform n = 2000, 594 kernels, 49 active: 542 epochs, 7.5 s)
MAX_OUTER = {"proximal": 500, "one_step": 500, "bcd": 5000}


#: What to do when the working set does not fit (its byte budget or the machine's memory).
_REMEDY = "raise working_set_bytes (or the engine's cache_bytes), or use a larger C (fewer active kernels)"


class _Spicy:
    def __init__(self, engine, y, C, loss: Loss, penalty: Penalty, bias: bool, tol: float, max_outer: int,
                 max_inner: int, working_set, method: str, verbose: bool, working_set_bytes: int | None = None,
                 newton_solver: str = "auto"):
        self.n, self.M, lambda_max = check.check_engine(engine, allow_unavailable=True)
        self.engine = engine
        self.y = check.check_targets(y, self.n, loss.is_classification, loss.name)
        self.C, self.loss, self.penalty, self.bias = C, loss, penalty, bias
        self.tol, self.max_outer, self.max_inner = tol, max_outer, max_inner
        self.method, self.newton_solver = method, newton_solver
        self.log = RunLog(engine, "spicy", verbose, not_monotone="the gap of the model built from each outer step's "
                          "dual point is not monotone from one outer step to the next")
        self._said_working_set = 0   # |W| at the last verbose line (a rise of the gap may come from W growing)
        self.screen = Screening(engine, lambda_max)
        self.threshold = penalty.threshold(C)
        # the first round's size: INITIAL_WORKING_SET, fewer on factor banks (Factor.working_set_start)
        self.initial_size = engine.kernel_representation.working_set_start(INITIAL_WORKING_SET, engine.rank)
        self.working_set_rule = check.check_working_set(working_set, self.M)
        mode = "conjugate" if method == "one_step" else "proximal"
        self.kernels = KernelTerm(HeldKernels(engine, working_set_bytes, "SpicyMKL"), penalty, C, mode)
        self.loss_term = make_loss_term(loss, self.y, GAMMA_INIT)
        self.b, self.gamma_b = 0.0, GAMMA_BIAS_INIT
        # proximal term on rho for the piecewise-linear conjugates (see module docstring)
        self.tau = TAU_INIT if loss.conjugate_kind == "slack" else np.inf
        self.ck = np.inf
        self.params: dict = {}

    @property
    def index(self) -> np.ndarray:
        """The working set W: kernel ids in the order they are held."""
        return self.kernels.held.index

    # -- setup ---------------------------------------------------------------------------------
    def _initial_rho(self) -> np.ndarray:
        y = self.y
        if self.method == "one_step" and self.bias:
            # interior start with 1^T rho = 0 exactly (the equality-constrained Newton stays on it)
            if self.loss.is_classification:
                n_pos, n_neg = np.sum(y > 0), np.sum(y < 0)
                return np.where(y > 0, n_neg / y.size, -n_pos / y.size)
            rho = self.loss.initial_dual(y)
            return rho - rho.mean()
        return self.loss.initial_dual(y)

    def _add_kernels(self, idx: np.ndarray, needed: int | None, rho: np.ndarray, K_rho: np.ndarray,
                     inactive: np.ndarray | None = None) -> np.ndarray:
        """Fetch the kernels ``idx`` (most important first) into W, as many as the byte budget
        leaves room for; returns K_m rho for the new W. ``needed``: how many of them must fit
        (None: all of ``idx``; after a certification only one, so that W keeps growing). When
        they do not fit, the kernels of W flagged ``inactive`` (zero weight in the current model,
        alpha_m = 0) are dropped first: they leave the model's support unchanged, and if one
        becomes a violator again the next certification brings it back."""
        held = self.kernels.held
        room = held.capacity() - self.index.size
        needed = idx.size if needed is None else needed
        if idx.size > room and inactive is not None and np.any(inactive):
            keep = ~inactive
            self.kernels.keep(keep)
            K_rho = K_rho[keep]
            room = held.capacity() - self.index.size
        if needed > room:
            per = held.kernel_nbytes
            raise InvalidInputError(
                f"the SpicyMKL working set is full: it holds {self.index.size} kernels "
                f"({self.index.size * per / 1e9:.3g} GB) and needs at least {needed - room} more "
                f"({(self.index.size + needed) * per / 1e9:.3g} GB in all) against working_set_bytes = "
                f"{held.budget / 1e9:.3g} GB; {_REMEDY}")
        idx = idx[: int(min(idx.size, room))]
        if idx.size == 0:
            return K_rho
        gamma = float(np.min(self.kernels.gamma)) if self.kernels.size else GAMMA_INIT
        self.kernels.add(idx, gamma, _REMEDY)
        return np.concatenate([K_rho, self.kernels.matvec(rho, first=self.index.size - idx.size)])

    def _initial_working_set(self, norms0: np.ndarray) -> tuple[np.ndarray, int | None]:
        """(kernels to start from, how many of them must fit the byte budget: None = all)."""
        rule = self.working_set_rule
        if isinstance(rule, np.ndarray):
            if self.threshold <= 0.0:
                return np.flatnonzero(self.screen.available), None
            if not np.all(self.screen.available[rule]):
                raise InvalidInputError("working_set names kernels the engine cannot serve (unfinished)")
            return rule, None
        if rule == "all" or self.threshold <= 0.0:
            return np.flatnonzero(self.screen.available), None
        above = np.flatnonzero((norms0 > self.threshold) & self.screen.available)
        order = above[np.argsort(-norms0[above], kind="stable")]
        return order[:self._growth(0, order.size)], min(1, above.size)

    def starting_set(self, norms0: np.ndarray, init: MKLResult | None) -> tuple[np.ndarray, int | None]:
        """The first W (:meth:`_initial_working_set` at the first pass's norms ``norms0``), with a warm
        start's kernels first: (kernels, how many must fit)."""
        start, needed = self._initial_working_set(norms0)
        if init is not None:  # the previous model's kernels first, then this point's violators
            previous = init.active[self.screen.available[init.active]]
            start = np.concatenate([previous, start[~np.isin(start, previous)]])
            needed = previous.size or needed
        return start, needed

    def _growth(self, size: int, violators: int) -> int:
        """How many violators join a working set of ``size`` kernels (largest first): the first
        INITIAL_WORKING_SET (fewer on a factor bank: ``Representation.working_set_start``, 8 at
        r = 64), then at most max(MIN_ADDITIONS, GROWTH[method] * size) per round.

        Each round costs a certification pass over all M kernels plus an inner solve whose Newton
        steps cost O(|W| n^2), so the rule trades passes against inner work. proximal (block
        1-norm): W at most doubles; at an intermediate rho many kernels exceed the threshold that
        end inactive (the solution is sparse). one_step (ElastMKL §4.3, elastic net): most kernels
        end active (IDA protocol, lam = 0.5: 5941 of M = 10000), and doubling from 32 took
        log2(active / 32) ~ 8-10 rounds, each a full pass, so passes grew with log M on top of the
        linear cost (bench_spicy slopes up to 1.25). W at most quadruples: half the rounds, and
        W overshoots the active set by little. Same-load comparison (twonorm / ringnorm, n = 200,
        M = 3000 and 10000, logistic and hinge): 1.3-1.7x faster than doubling and than adding
        every violator at once (which needs 1-3 passes but runs every Newton step on W = M).
        """
        if size == 0:
            return min(violators, self.initial_size)
        return min(violators, max(MIN_ADDITIONS, GROWTH[self.method] * size))

    def block_descent(self) -> "bcd.BlockDescent":
        """The primal block coordinate descent (method="bcd", ``bcd.py``) on this solver's problem, held
        kernels, screening, working-set rules and certificate; max_outer bounds its epochs."""
        return bcd.BlockDescent(self)

    # -- one outer step ------------------------------------------------------------------------
    def _proximal_update(self, point) -> list[np.ndarray]:
        """alpha_m <- prox(alpha_m + gamma_m rho), b <- b + gamma_b 1^T rho; returns violations."""
        k, rho = self.kernels, point.rho
        violations = []
        if k.size:
            prox = self.penalty.prox(point.norms, k.gamma * self.C)
            shrink = np.divide(prox, point.norms, out=np.zeros_like(prox), where=point.norms > 0.0)
            v = k.alpha + k.gamma[:, None] * rho
            new_alpha = shrink[:, None] * v
            violations.append(np.linalg.norm(new_alpha - k.alpha, axis=1) / k.gamma)
            k.alpha, k.K_alpha, k.alpha_K_alpha = new_alpha, shrink[:, None] * point.w, prox**2
        if self.bias:
            total = float(rho.sum())
            violations.append(np.array([abs(total)]))
            self.b += self.gamma_b * total
        return violations

    def _grow_gammas(self, kernel_viol, bias_viol, loss_viol):
        """[CODE] schedule; blocks are judged against the ck of the previous iteration."""
        parts = [v for v in (kernel_viol, bias_viol, loss_viol) if v is not None and v.size]
        max_violation = float(max(np.max(v) for v in parts)) if parts else 0.0
        ck = self.ck
        if kernel_viol is not None and kernel_viol.size:
            slow = kernel_viol > 0.5 * ck
            g = self.kernels.gamma
            g[slow] *= GAMMA_FACTOR
            g[~slow] += GAMMA_FACTOR
            np.minimum(g, GAMMA_MAX, out=g)
        if bias_viol is not None and bias_viol.size:
            self.gamma_b = self.gamma_b * GAMMA_FACTOR if bias_viol[0] > 0.5 * ck else self.gamma_b + GAMMA_FACTOR
            self.gamma_b = min(self.gamma_b, GAMMA_MAX)
        if loss_viol is not None and loss_viol.size:
            self.loss_term.grow_gammas(loss_viol, ck, GAMMA_FACTOR, GAMMA_MAX)
        self.ck = min(self.ck, max_violation)

    def _model(self, problem, point):
        """(weights on W, bias, f, block norms of the returned alpha_m = d_m rho/C)."""
        rho, K_rho, C = point.rho, point.K_rho, self.C
        if self.method == "one_step":
            x = self.penalty.conjugate_derivative(point.norms, C)     # ||alpha_m|| = g~*'(||rho||)
            d = np.divide(C * x, point.norms, out=np.zeros_like(x), where=point.norms > 0.0)
            b = -float(problem.kkt_gradient(point).mean()) if self.bias else 0.0  # multiplier of 1^T rho = 0
        else:
            rho_K_rho = np.einsum("mi,i->m", K_rho, rho)
            d = np.divide(C * (self.kernels.K_alpha @ rho), rho_K_rho, out=np.zeros_like(rho_K_rho),
                          where=rho_K_rho > 0.0)
            d = np.maximum(d, 0.0)
            x = d * np.sqrt(np.maximum(rho_K_rho, 0.0)) / C
            b = self.b
        f = (d @ K_rho) / C + b if d.size else np.full(self.n, b)
        return d, b, f, x

    def _alpha_primal(self) -> float:
        k = self.kernels
        f = k.K_alpha.sum(axis=0) + self.b if k.size else np.full(self.n, self.b)
        return duality.primal_value(self.loss, self.penalty, self.y, self.C, f, np.sqrt(k.alpha_K_alpha))

    def _working_set_dual(self, rho):
        rho_tilde = duality.project_dual(self.loss, self.y, rho, self.bias)
        K_rt = self.kernels.matvec(rho_tilde)
        norms_w = np.sqrt(np.maximum(K_rt @ rho_tilde, 0.0))
        return rho_tilde, norms_w

    def _certify(self, rho_tilde, norms_w):
        """Dual value over ALL kernels and the violators outside W (bound first, then a pass)."""
        norms, violators = self.screen.certify(rho_tilde, self.index, norms_w, self.threshold)
        return duality.dual_value(self.loss, self.penalty, self.y, self.C, rho_tilde, norms)[0], violators

    # -- main loop -----------------------------------------------------------------------------
    def run(self, checkpoint=None, init: MKLResult | None = None) -> MKLResult:
        state = checkpoint.load() if checkpoint is not None else None
        if state is None:
            rho = self._initial_rho() if init is None else self._warm_rho(init)
            norms0 = self.screen.full_pass(duality.project_dual(self.loss, self.y, rho, self.bias))
            start, needed = self.starting_set(norms0, init)
            K_rho = self._add_kernels(start, needed, rho, np.zeros((0, self.n)))
            if init is not None:
                self._warm_primal(init, K_rho)
            first, best = 0, None
        else:
            rho, K_rho, best, first = self._restore(state)
        converged = False
        for t in range(first, self.max_outer):
            if checkpoint is not None:
                checkpoint.step(t, functools.partial(self._state, rho, K_rho, best))
            problem, point, report = self._outer_step(rho, K_rho)
            rho, K_rho = point.rho, point.K_rho
            d, b, f, x = self._model(problem, point)
            primal = duality.primal_value(self.loss, self.penalty, self.y, self.C, f, x)
            rho_tilde, norms_w = self._working_set_dual(rho)
            dual = duality.dual_value(self.loss, self.penalty, self.y, self.C, rho_tilde, norms_w)[0]
            gap = duality.relative_gap(primal, dual)
            certified = self.index.size == np.count_nonzero(self.screen.available)
            violators = np.zeros(0, dtype=np.int64)
            if gap <= self.tol or t == self.max_outer - 1:
                dual, violators = self._certify(rho_tilde, norms_w)
                gap, certified = duality.relative_gap(primal, dual), True
            self._record(t, primal, dual, gap, certified, d, report, violators)
            if certified and (best is None or gap <= best[4] or gap <= self.tol):
                best = (d.copy(), b, rho.copy(), primal, gap, self.index.copy())
            if certified and gap <= self.tol and violators.size == 0:
                converged = True
                break
            if violators.size:
                grow = self._growth(self.index.size, violators.size)
                K_rho = self._add_kernels(violators[:grow], 1, rho, K_rho, inactive=d == 0.0)
        return self._result(best, converged)

    # -- warm start (a path over C: registry.fit_path) ------------------------------------------
    def _warm_rho(self, init: MKLResult) -> np.ndarray:
        """rho of a solution at another C: its dual point rho = C' c (c = dual_coef, C' its C), which is
        the KKT point -loss'(y, f) of its model f and so lies in the domain of L* (module docstring)."""
        if init.dual_coef.shape != (self.n,) or init.weights.shape != (self.M,):
            raise InvalidInputError(f"init has {init.dual_coef.size} dual coefficients and {init.weights.size} weights; "
                                    f"a warm start needs a result on this engine (n = {self.n}, M = {self.M})")
        rho = np.asarray(init.dual_coef, dtype=np.float64) * float(init.params.get("C", self.C))
        if self.method == "one_step" and self.bias:
            rho = rho - rho.mean()   # the equality-constrained Newton keeps 1^T rho = 0 only from a point on it
        return rho

    def _warm_primal(self, init: MKLResult, K_rho: np.ndarray) -> None:
        """The proximal method's primal blocks from the previous model: alpha_m = d_m c for its kernels
        (the same f = sum_m K_m alpha_m + b), K_m alpha_m = (d_m / C') K_m rho, and its bias."""
        if self.bias:
            self.b = float(init.bias)
        if self.method != "proximal" or init.active.size == 0:
            return
        gammas = init.warm_state.get("gammas")
        if gammas:  # the proximity parameters and ck the previous value reached: its outer steps are not redone
            known = gammas["kernels"]
            self.kernels.gamma[:] = [known.get(int(m), g) for m, g in zip(self.index, self.kernels.gamma)]
            self.gamma_b, self.ck = gammas["bias"], gammas["ck"]
        k = self.kernels
        position = {int(m): p for p, m in enumerate(self.index)}
        rows = np.array([position[int(m)] for m in init.active if int(m) in position], dtype=np.int64)
        d = init.weights[self.index[rows]]
        c = np.asarray(init.dual_coef, dtype=np.float64)
        k.alpha[rows] = d[:, None] * c[None, :]
        k.K_alpha[rows] = (d / float(init.params.get("C", self.C)))[:, None] * K_rho[rows]
        k.alpha_K_alpha[rows] = np.einsum("mi,mi->m", k.alpha[rows], k.K_alpha[rows])

    # -- checkpoints (mklscale.runtime.checkpoint) ---------------------------------------------
    def _state(self, rho, K_rho, best) -> dict:
        """Everything the next outer iterations read, at the top of one: the dual point and its
        K_m rho on W, W itself (its kernels are re-read from the engine on resume), the kernel
        term's alpha_m, K_m alpha_m, gamma_m, the loss term's multipliers and gammas, b, gamma_b,
        tau, ck, the best certified model, the last full pass (inactivity bound), the history and
        the pass counters."""
        k = self.kernels
        state = {"rho": rho, "K_rho": K_rho, "index": self.index, "alpha": k.alpha, "K_alpha": k.K_alpha,
                 "alpha_K_alpha": k.alpha_K_alpha, "kernel_gamma": k.gamma,
                 "b": float(self.b), "gamma_b": float(self.gamma_b), "tau": float(self.tau), "ck": float(self.ck),
                 **self.log.state()}
        state.update(self.screen.state())
        for (owner, name), value in _loss_multipliers(self.loss_term).items():
            state[f"loss_{owner}_{name}"] = value
        if best is not None:
            d, b, best_rho, primal, gap, index = best
            state.update(best_d=d, best_b=float(b), best_rho=best_rho, best_primal=float(primal),
                         best_gap=float(gap), best_index=index)
        return state

    def _restore(self, state: dict):
        """Set the solver to a state of :meth:`_state`; returns (rho, K_rho, best, first iteration)."""
        self.screen.restore(state)
        self.kernels.add(state["index"].astype(np.int64), 1.0, _REMEDY)
        k = self.kernels
        k.alpha, k.K_alpha = state["alpha"], state["K_alpha"]
        k.alpha_K_alpha, k.gamma = state["alpha_K_alpha"], state["kernel_gamma"]
        for owner, name in _loss_multipliers(self.loss_term):
            target = self.loss_term if owner == "term" else getattr(self.loss_term, owner)
            setattr(target, name, state[f"loss_{owner}_{name}"])
        self.b, self.gamma_b, self.tau, self.ck = state["b"], state["gamma_b"], state["tau"], state["ck"]
        self.log.restore(state)
        best = None
        if "best_d" in state:
            best = (state["best_d"], state["best_b"], state["best_rho"], state["best_primal"], state["best_gap"],
                    state["best_index"].astype(np.int64))
        return state["rho"], state["K_rho"], best, int(state["iteration"])

    def _outer_step(self, rho, K_rho):
        """Inner Newton solve, then the multiplier updates and the gamma schedule."""
        bias_mode = ("equality" if self.method == "one_step" else "al") if self.bias else "none"
        problem = InnerProblem(self.loss_term, self.kernels, bias_mode, self.b, self.gamma_b, rho.copy(), self.tau)
        point, report = newton(problem, problem.evaluate(rho, K_rho), self.max_inner, INNER_GTOL, self.newton_solver)
        self.tau = min(self.tau * TAU_FACTOR, GAMMA_MAX)
        kernel_viol = bias_viol = loss_viol = None
        if self.method == "proximal":
            viol = self._proximal_update(point)
            kernel_viol = viol[0] if self.kernels.size else None
            bias_viol = viol[-1] if self.bias else None
        if self.loss_term.has_multipliers:
            loss_viol = self.loss_term.update_multipliers(point.rho)
        self._grow_gammas(kernel_viol, bias_viol, loss_viol)
        return problem, point, report

    def _record(self, t, primal, dual, gap, certified, d, report, violators):
        entry = {
            "iteration": t + 1, "primal": float(primal), "dual": float(dual), "gap": float(gap),
            "certified": bool(certified), "n_active": int(np.count_nonzero(d)),
            "working_set": int(self.index.size), "violators": int(violators.size),
            "inner_iterations": int(report.iterations),
            "gamma_max": float(np.max(self.kernels.gamma)) if self.kernels.size else 0.0,
        }
        if self.method == "proximal":
            entry["primal_alpha"] = self._alpha_primal()
        self.log.record(entry)
        log = self.log
        log.explain("active a/w/M", "kernels with a non-zero weight / in the working set W (the kernels held) / in "
                                    "the bank; inner = Newton steps of this outer step")
        if not certified:
            log.explain("(W)", f"the gap covers only the working set W; once it is below tol it is re-measured over "
                               f"all {self.M} kernels (it may then rise), and kernels outside W that violate the "
                               "optimality test join W")
        grew = self.index.size - self._said_working_set if self._said_working_set else 0
        self._said_working_set = self.index.size
        joined = f"  {violators.size} kernel(s) outside W violate the optimality test" if violators.size else ""
        log.say(f"it {t + 1:3d} primal {primal:.10g} dual {dual:.10g} gap {gap:.3e}"
                f"{'' if certified else ' (W)'} active {entry['n_active']}/{self.index.size}/{self.M}"
                f" passes {entry['passes']} inner {report.iterations}{joined}",
                gap=gap, scope="all" if certified else "working set",
                why=f"the working set W grew by {grew} kernel(s) since the previous line" if grew > 0 else None)

    def _result(self, model, converged) -> MKLResult:
        d, b, rho, primal, gap, index = model
        weights = np.zeros(self.M)
        weights[index[: d.size]] = d
        # the proximity parameters reached, for a warm start at the next value of a path (_warm_primal)
        gammas = {"kernels": dict(zip(self.index.tolist(), self.kernels.gamma.tolist())), "bias": float(self.gamma_b),
                  "ck": float(self.ck)}
        return MKLResult(weights=weights, dual_coef=rho / self.C, bias=b, active=np.flatnonzero(weights),
                         objective=primal, gap=gap, history=self.log.history, converged=converged,
                         solver=f"spicy/{self.method}", params=dict(self.params), warm_state={"gammas": gammas})


@single_blas_thread_for_small_n
def fit(engine, y, C, loss="logistic", penalty="l1", lam=0.5, q=1.5, eps=0.1, bias=True, tol=1e-3,
        max_outer=None, max_inner=50, working_set=None, method="auto", working_set_bytes=None,
        newton_solver="auto", verbose=False, checkpoint=None, init=None) -> MKLResult:
    """Solve problem (42) of SpicyMKL over the kernels of ``engine``; see the module docstring.

    Parameters
    ----------
    engine : object with n, M, lambda_max, quad_forms, blocks, stats (mklscale engine API).
    y : (n,) targets; labels in {-1, +1} for "logistic" and "hinge".
    C : regularisation constant > 0.
    loss : "logistic" | "hinge" | "square" ((1/2)(y - f)^2) | "eps_insensitive" (uses eps).
    penalty : "l1" | "elastic_net" (uses lam in [0, 1]) | "block_q" (uses q > 1).
    bias : fit an unregularised offset b.
    tol : duality gap (P - D)/max(|P|, 1) to stop at, certified over all M kernels.
    max_outer, max_inner : outer (proximal / multiplier; method="bcd": epochs) and inner (Newton)
        iteration limits; max_outer None: MAX_OUTER[method] (500 outer iterations, 5000 epochs).
    working_set : None or "auto" (grow from violators), "all", or initial kernel indices.
    method : "auto" (on a factor bank with the logistic or square loss and the block 1-norm or elastic
        net: bcd; else one_step when the penalty conjugate is smooth, else proximal), "proximal",
        "one_step" (§4.3; elastic net with lam > 0 or block q-norm only), "bcd" (the same problem in the
        primal by block coordinate Newton, ``bcd.py``; factor banks, those losses and penalties).
    working_set_bytes : cap on the bytes of dense kernels the working set holds (an int or a
        string like "2GB"); None: the engine's block-cache budget (``engine.cache.budget``), no cap
        for an engine without one. A fit whose violators no longer fit raises InvalidInputError.
    newton_solver : how the inner Newton systems are solved (``_spicy_inner.solve_newton_system``):
        "auto" (Woodbury on factor banks and on dense kernels of small summed rank, n >= 512; else
        dense Cholesky), "cholesky" (dense only), "woodbury", "cg" (dense kernels: Jacobi-preconditioned
        CG on the formed matrix; factor banks: block-Jacobi CG on the Woodbury capacitance, never formed).
    verbose : print one line per outer iteration.
    checkpoint : None or a ``mklscale.runtime.checkpoint.Checkpoint``: the state (see ``_Spicy._state``)
        is saved at the top of outer iterations when due and on SIGTERM/SIGINT; a run started with a
        checkpoint file continues from it and returns the same result bit for bit.
    init : None or the MKLResult of this problem at another C (the previous point of a path): start from
        its dual point rho = C' c, its kernels in the working set and (proximal method) its primal blocks
        alpha_m = d_m c, bias, and the proximity parameters gamma_m, gamma_b and ck it had reached
        (``MKLResult.warm_state``; restarting them at GAMMA_INIT redid its outer steps: 3-fold CV over a
        path cost 3.4-4.7x one fit, 2.4-4.1x with them). Where the solve starts, not what it solves: the
        same stopping rule and certificate apply. Ignored when a checkpoint holds a state.

    Returns
    -------
    MKLResult with f = sum_m weights[m] K_m dual_coef + bias, ``objective`` = P at that model and
    ``gap`` its relative duality gap certified over all kernels.
    """
    solver = _build(engine, y, C, loss, penalty, lam, q, eps, bias, tol, max_outer, max_inner, working_set,
                    method, verbose, working_set_bytes, newton_solver)
    if solver.method == "bcd":
        return solver.block_descent().run(checkpoint, init)
    return solver.run(checkpoint, init)


def c_max(engine, y, loss: str = "logistic", penalty: str = "l1", lam: float = 0.5, bias: bool = True) -> float:
    """The smallest C whose model keeps no kernel: C_max = max_m ||rho_0||_{K_m} / (1 - lam) (one pass).

    At the best constant model f = b_0 the dual point is rho_0 = -loss'(y, b_0) (KKT of (42) with alpha = 0):
    (y - mean y) / 2 for the logistic loss with bias (exact: sigma(-y b_0) is 1 - p or p at b_0 = logit p),
    y - mean y for the other losses with bias (exact for the square loss; the hinge and eps-insensitive
    subgradients at b_0 are not unique, so there it is the scale of the threshold, not its exact value),
    y without bias. Every kernel stays out while ||rho_0||_{K_m} <= the penalty's threshold C (block 1-norm)
    or C (1 - lam) (elastic net); block q-norm penalties have no threshold (every kernel is in the model)
    and get the block 1-norm value as their scale.
    """
    y = np.asarray(y, dtype=np.float64)
    rho = y - y.mean() if bias else y.copy()
    if loss == "logistic":
        rho = rho / 2.0
    value = float(np.sqrt(max(float(np.max(engine.quad_forms(rho))), 0.0)))
    if penalty == "elastic_net":
        value /= max(1.0 - float(lam), 1e-3)
    return value


def _loss_multipliers(term) -> dict:
    """{(owner, name): array} of the loss term's multipliers and their gammas (slack losses only):
    owner "box" is the term's linear-constraint block, "term" the term itself."""
    out = {}
    for owner, name in (("box", "mu"), ("box", "gamma"), ("term", "mu_abs"), ("term", "gamma_abs")):
        holder = term if owner == "term" else getattr(term, owner, None)
        if holder is not None and hasattr(holder, name):
            out[(owner, name)] = getattr(holder, name)
    return out


def _build(engine, y, C, loss, penalty, lam, q, eps, bias, tol, max_outer, max_inner, working_set, method,
           verbose, working_set_bytes=None, newton_solver="auto") -> _Spicy:
    """Validate the arguments and set up a solver (tests use it to inspect the iterates)."""
    check.check_choice("loss", loss, LOSSES)
    check.check_choice("penalty", penalty, PENALTIES)
    check.check_choice("method", method, METHODS)
    check.check_choice("newton_solver", newton_solver, NEWTON_BACKENDS)
    C = check.check_positive("C", C)
    tol = check.check_positive("tol", tol)
    max_inner = check.check_count("max_inner", max_inner)
    if not isinstance(bias, (bool, np.bool_)):
        raise InvalidInputError(f"bias must be True or False; got {bias!r}")
    loss_obj = make_loss(loss, eps)
    penalty_obj = make_penalty(penalty, lam, q)
    check.require_engine(engine)
    if method == "auto":
        if engine.kernel_representation.blocks_are_factors and bcd.supports(loss_obj, penalty_obj) is None:
            method = "bcd"
        else:
            method = "one_step" if penalty_obj.smooth_conjugate else "proximal"
    if method == "one_step" and not penalty_obj.smooth_conjugate:
        raise InvalidInputError("method='one_step' needs a twice-differentiable penalty conjugate "
                                "(elastic_net with lam > 0, or block_q); use method='proximal'")
    if method == "bcd":
        why = bcd.supports(loss_obj, penalty_obj)
        if why is None and not engine.kernel_representation.blocks_are_factors:
            why = ("method='bcd' runs on factor banks (build_bank(..., rank=r)); this engine holds "
                   f"{engine.kernel_representation.name} kernels: use method='auto'")
        if why is not None:
            raise InvalidInputError(why)
    max_outer = MAX_OUTER[method] if max_outer is None else check.check_count("max_outer", max_outer)
    if working_set_bytes is not None:
        working_set_bytes = parse_bytes(working_set_bytes, "working_set_bytes")
    engine.kernel_representation.newton_backend(newton_solver)   # refuses a back end the kernels cannot serve
    solver = _Spicy(engine, y, C, loss_obj, penalty_obj, bool(bias), tol, max_outer, max_inner,
                    working_set, method, verbose, working_set_bytes, newton_solver)
    ws = solver.working_set_rule
    solver.params = {
        "loss": loss, "penalty": penalty, "C": C, "bias": bool(bias), "tol": tol, "method": method,
        "newton_solver": newton_solver, "max_outer": max_outer, "max_inner": max_inner, "working_set_bytes": solver.kernels.held.budget,
        "working_set": ws.tolist() if isinstance(ws, np.ndarray) else ws,
        **loss_obj.params(), **penalty_obj.params(),
    }
    return solver
