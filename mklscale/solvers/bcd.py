"""SpicyMKL's problem (42) on a factor bank, solved in the primal by block coordinate descent
(``spicy.fit(..., method="bcd")``; issue 32: many active kernels at large n).

Problem: on a factor bank (K_m = L_m L_m^T, L_m (n, r)) the functions of kernel m are f_m = L_m v_m
with RKHS norm ||v_m||, so (42) with the block 1-norm or the elastic net reads

    min_{v, b}  P(v, b) = sum_i loss(y_i, f_i) + sum_m g~_C(||v_m||),   f = sum_m L_m v_m + b,
    g~_C(x) = t x + (q / 2) x^2,  t = C (1 - lam) (the threshold), q = C lam (lam = 0: block 1-norm),

a group lasso over Phi = [L_1 ... L_M] (skglm's problem; benchmarks/bench_skglm.py). Losses: logistic
and square (twice differentiable, ``_bcd_kernels``), and the hinge through its smoothing h_mu (below).

The hinge: the descent runs on h_mu (the Moreau envelope of width mu, quadratic on the band
1 - mu < y f < 1, ``_bcd_kernels``) with continuation mu = 1, 0.1, 0.01, ...: mu is cut when the gap for
the hinge itself (the model and dual point below, evaluated with the true hinge) is at most twice
mu sum_i a_i (1 - a_i), a_i = -y_i h_mu'(y_i f_i), the gap that the smoothing alone leaves at the smoothed
optimum (``_smoothing_bound``); the run stops on the hinge's certified gap as for the other losses.
Outside the band h_mu is linear, so the Newton steps use a floor curvature there, adapted by their
outcomes (Levenberg-Marquardt, ``_adapt_curvature_floor``), and their cadence follows whether they
lowered the gap (``_pace_newton``). Measured (ringnorm n = 10,000, M = 50,
C = 0.6, tol 1e-3, 5 active): 1.4 s against 28.5 s for the proximal method on the same factor bank;
n = 500,000, M = 100: 30 s (benchmarks/README.md).

Method: block coordinate (proximal) Newton with an Armijo line search, the coordinate gradient descent
of Tseng & Yun (Math. Program. 117, 2009) with one block per kernel. For block m, with
z = grad_{v_m} loss = L~_m^T loss'(y, f) and H = L~_m^T diag(loss''(y, f)) L~_m (r x r: the Newton
system in the r-dimensional space of the block, n r^2 flops), the direction is d = w - v_m with

    w = argmin_w (1/2) w^T (H + q I) w - (H v_m - z)^T w + t ||w||

(zero when ||H v_m - z|| <= t, else ``_bcd_kernels.group_minimiser`` on the eigendecomposition of
H + q I), and the step s in {1, 1/2, ...} is the first with
P(v_m + s d) <= P(v_m) + sigma s Delta, Delta = z^T d + g~(||w||) - g~(||v_m||) (Tseng & Yun (9),
sigma = 1e-4). A block at v_m = 0 with ||z|| <= t stays at zero without its H. One epoch updates
every block of the working set in turn, then the bias by Newton steps on the one-dimensional loss.
Cost of an epoch: two passes over the held factors (L^T g and L d, O(n r) per block) and the block
Hessians of the blocks that move (O(n r^2) each, float32 products); never an n x n array, and an
R_W x R_W one only for the square loss's Newton steps below, while it is no larger than W's factors.
SpicyMKL's Newton step on the dual costs O(n R^2) in the summed rank R of the kernels in its system
(``_spicy_inner``), which dominates once ~100 kernels are active.

Coupled blocks: every ANDERSON_DEPTH epochs, once the nonzero blocks A have stayed the same that long,
one Newton step on all of A and the bias together (``_newton_step``: conjugate gradients
preconditioned by the blocks' r x r metrics, two passes over A's factors per iteration, Armijo on P;
for the square loss, loss'' = 1, each iteration multiplies by the Gram matrix of W's centred factors
instead, G = L~_W^T L~_W (``_factor_gram``, r x r tiles, extended as W grows and cut as it drops
blocks, GRAM_MIN_COLUMNS <= R_W <= n)).
Block descent alone converges linearly at a rate set by the coupling between blocks, which is strong
for overlapping kernels and near-interpolating fits: ringnorm n = 10,000, M = 300, square loss, 135
kernels active, gap 0.34 after 400 epochs without it, 1.2e-6 after 175 epochs (34 s) with it; on 12
random-feature kernels of the same inputs 3-8x fewer epochs (tests/test_spicy_bcd.py).

Centring: with a bias the columns of each L_m are centred, L~_m = L_m - 1 mu_m^T (mu_m the column
means). f = sum_m L~_m v_m + b~ with b~ = b + sum_m mu_m^T v_m is the same function and the same
penalty, so the problem is unchanged; without it every block is coupled to the bias through the
kernels' means, and block descent crawls (ringnorm n = 10,000, M = 200, C = 0.05: relative gap 0.17
after 200 epochs uncentred, 7e-3 after 40 centred).

Certificate and model: the dual point is rho = -loss'(y, f), projected (``duality.project_dual``);
the returned model is SpicyMKL's: c = rho~/C shared by every kernel, d_m = C v_m^T L_m^T rho~ /
||L_m^T rho~||^2 (the least-squares weight, >= 0; at the optimum v_m = (d_m / C) L_m^T rho*), the bias
refitted by Newton on the loss, and ``objective`` / ``gap`` are evaluated at that model, as in
spicy.py. Working set W: as SpicyMKL's proximal method (``spicy._Spicy._growth``): the violators of
the first pass (at the best constant model), largest first; W is solved until its restricted gap is
below tol, then certified over all M kernels (the screening bound, else one quad_forms pass), and
the violators join W.
"""

from __future__ import annotations

import numpy as np
import psutil

from mklscale.errors import InvalidInputError
from mklscale.solvers import duality
from mklscale.solvers._factor_gram import CentredGram
from mklscale.solvers._bcd_kernels import (LOSS_CODES, derivatives, group_minimiser, loss_along, product,
                                           scaled_centred, transposed_product)
from mklscale.solvers.losses import Loss
from mklscale.solvers.penalties import ElasticNet, L1, Penalty
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog

ARMIJO = 1e-4
#: a block's Hessian is recomputed after this many epochs (or when the line search cut its last step)
METRIC_EPOCHS = 5
#: W is certified over all kernels once its gap is below tol or this share of its gap at the first
#: epoch after the last certification: a round need not reach tol on a W that is about to grow
#: (n = 50,000, M = 1,000, ~100 active: each round to tol cost ~80 epochs, a certification one pass)
CERTIFY_SHARE = 0.1
#: Anderson extrapolation from this many epochs' differences (skglm's default)
ANDERSON_DEPTH = 5
MAX_HALVINGS = 40
#: the Armijo test allows a rise of the objective at its rounding level: near the optimum a block's
#: first-order residual (which the gap sees, times ||v_m||) is ~sqrt(eps) while the decrease it buys
#: is below rounding, and without the slack every step there is refused (gap stuck near 1e-9)
ROUNDING = 1e-13
#: the hinge is fitted through its smoothing h_mu (``_bcd_kernels``), mu = SMOOTHING_START at first and
#: cut by SMOOTHING_DECREASE whenever the smoothing accounts for the gap (``_smooth_less``)
SMOOTHING_START = 1.0
SMOOTHING_DECREASE = 0.1
#: outside its band the smoothed hinge is linear (loss'' = 0) and a block's quadratic model may have no
#: minimum; the Newton steps use the curvature curvature_floor / mu there, curvature_floor adapted in
#: [CURVATURE_FLOOR_MIN, 1] by the Newton steps' outcomes (``_adapt_curvature_floor``)
CURVATURE_FLOOR_START = 1e-2
CURVATURE_FLOOR_MIN = 1e-8
BIAS_NEWTON_STEPS = 5
#: conjugate-gradient iterations of one Newton step on the nonzero blocks, and the residual it stops at
#: (relative to the gradient's norm)
NEWTON_CG_ITERATIONS = 200
NEWTON_CG_RESIDUAL = 0.1
#: the square loss's Newton steps multiply by the Gram matrix of W's centred factors (``_factor_gram``)
#: once W holds at least this many columns, and while it holds at most n (the Gram then takes no more
#: memory than the factors W holds): ringnorm n = 50,000, M = 300, ~150 active, a CG product over the
#: factors took 0.134 s (two passes over 2 GB) and the Newton steps ~80 % of the fit
GRAM_MIN_COLUMNS = 1024
#: the longest interval between Newton steps (``_pace_newton``), a multiple of ANDERSON_DEPTH
NEWTON_EVERY_MAX = 80
#: a block's Hessian is floored at RIDGE x its mean eigenvalue (padded or collinear factor columns)
RIDGE = 1e-10
_REMEDY = "raise working_set_bytes (or the engine's cache_bytes), or use a larger C (fewer active kernels)"


def supports(loss: Loss, penalty: Penalty) -> str | None:
    """None when method="bcd" solves this loss and penalty, else why not."""
    if loss.name not in LOSS_CODES:
        return (f"method='bcd' solves the {', '.join(LOSS_CODES)} losses; got {loss.name!r}: "
                "use method='proximal'")
    if not isinstance(penalty, (L1, ElasticNet)):
        return f"method='bcd' solves the block 1-norm and the elastic net; got {penalty.name!r}: use method='auto'"
    return None


class BlockDescent:
    """One solve; see the module docstring. ``solver`` is the SpicyMKL solver (``spicy._Spicy``) whose
    problem this solves: its held kernels (W), screening, working-set rules (``starting_set``,
    ``_growth``), certificate (``_certify``) and parameters are used as they are."""

    def __init__(self, solver):
        self.solver = solver
        self.y, self.C, self.loss, self.penalty = solver.y, float(solver.C), solver.loss, solver.penalty
        self.bias, self.tol, self.max_epochs = bool(solver.bias), float(solver.tol), int(solver.max_outer)
        self.n, self.M = int(solver.n), int(solver.M)
        self.t = self.penalty.threshold(self.C)
        self.q = self.C * self.penalty.lam if isinstance(self.penalty, ElasticNet) else 0.0
        self.code = LOSS_CODES[self.loss.name]
        self.smoothing = SMOOTHING_START if self.loss.name == "hinge" else 0.0   # the hinge's mu (0: unused)
        self.curvature_floor = CURVATURE_FLOOR_START   # x 1 / mu: the curvature used outside the hinge's band
        self.held, self.screen = solver.kernels.held, solver.screen
        self.log = RunLog(solver.engine, "spicy/bcd", solver.log.verbose, not_monotone="the gap of the model "
                          "built from each epoch's dual point is not monotone")
        self.r = int(solver.engine.rank)
        self.blocks: list[np.ndarray] = []       # L_m of W, views into the held chunks
        self.mu = np.zeros((0, self.r))          # column means (zero without a bias)
        self.V = np.zeros((0, self.r))
        self.b = 0.0                             # b~ of the centred parametrisation
        self.f = np.zeros(self.n)
        self.grad, self.curv = np.zeros(self.n), np.zeros(self.n)
        self.loss_value = 0.0
        self._scratch = None
        self.metrics: list = []                  # per block: (eigenvalues, eigenvectors, epoch computed) or None
        self.last_step = np.zeros(0)             # per block: the last accepted step (0: refused)
        self.epochs = 0
        self._anderson: list[np.ndarray] = []
        self.gram = CentredGram(self.r)           # W's Gram for the square loss's Newton steps (``_gram_of``)
        self._certify_below = np.inf              # W's gap at which the next certification is due
        self._support_since = 0                   # the epoch since which the nonzero blocks are the same
        self._support = np.zeros(0, dtype=bool)
        self.newton_taken = False                 # whether the last epoch ended with a Newton step
        self.newton_every = ANDERSON_DEPTH        # the Newton steps' cadence (``_pace_newton``)
        self._z, self._u = np.zeros(self.r), np.zeros(self.n)

    @property
    def index(self) -> np.ndarray:
        return self.held.index

    # -- working set ---------------------------------------------------------------------------
    def _add(self, idx: np.ndarray) -> None:
        """Hold the kernels ``idx`` (most important first) as new blocks at v = 0, as many as the byte
        budget leaves room for; when they do not all fit, the blocks at v = 0 leave W first (as in
        SpicyMKL: a kernel that violates again later comes back with the next certification)."""
        room = self.held.capacity() - self.index.size
        if idx.size > room:
            self._drop_zero_blocks()
            room = self.held.capacity() - self.index.size
        if idx.size and room < 1:
            per = self.held.kernel_nbytes
            raise InvalidInputError(
                f"the SpicyMKL (bcd) working set is full: it holds {self.index.size} kernels "
                f"({self.index.size * per / 1e9:.3g} GB) and kernels outside it still violate the optimality "
                f"condition; working_set_bytes = {self.held.budget / 1e9:.3g} GB; {_REMEDY}")
        idx = idx[: int(min(idx.size, room))]
        added = self.held.fetch(idx, _REMEDY)
        if added.size == 0:
            return
        new = self.held.chunks[-1]
        self.blocks.extend(new[j] for j in range(new.shape[0]))
        mu = new.mean(axis=1, dtype=np.float64) if self.bias else np.zeros((new.shape[0], self.r))
        self.mu = np.concatenate([self.mu, mu])
        self.V = np.concatenate([self.V, np.zeros((new.shape[0], self.r))])
        self.metrics.extend([None] * new.shape[0])
        self._anderson = []
        self.last_step = np.concatenate([self.last_step, np.ones(new.shape[0])])

    def _drop_zero_blocks(self) -> None:
        keep = np.any(self.V != 0.0, axis=1)
        if np.all(keep):
            return
        self.held.keep(keep)
        self.blocks = [chunk[j] for chunk in self.held.chunks for j in range(chunk.shape[0])]
        self.mu, self.V, self.last_step = self.mu[keep], self.V[keep], self.last_step[keep]
        self.metrics = [m for m, k in zip(self.metrics, keep) if k]
        self._anderson = []
        self.gram.keep(keep)

    # -- the pieces ----------------------------------------------------------------------------
    def _derivatives(self, f: np.ndarray, grad: np.ndarray, curv: np.ndarray) -> float:
        """grad = loss'(y, f), curv = loss''(y, f) in place (the hinge smoothed to mu, its curvature floored at
        ``curvature_floor``); the loss sum."""
        value = derivatives(self.code, self.y, f, grad, curv, self.smoothing)
        if self.smoothing:
            np.maximum(curv, self.curvature_floor * (1.0 / self.smoothing), out=curv)
        return value

    def _loss_along(self, u: np.ndarray, step: float) -> float:
        return loss_along(self.code, self.y, self.f, u, step, self.smoothing)

    def _newton_on_offset(self, f: np.ndarray, grad: np.ndarray, curv: np.ndarray, value: float) -> tuple[float, float]:
        """Newton steps on a constant added to f (the bias; one-dimensional, halving until the loss does not
        rise): f, grad = loss'(y, f) and curv = loss''(y, f) are updated in place; returns (the constant
        added, the loss there)."""
        ones, total = np.ones(f.size), 0.0
        for _ in range(BIAS_NEWTON_STEPS):
            g, h = float(grad.sum()), float(curv.sum())
            if h <= 0.0 or abs(g) <= 1e-12 * (1.0 + f.size):
                break
            step = -g / h
            for _ in range(MAX_HALVINGS):
                if loss_along(self.code, self.y, f, ones, step, self.smoothing) <= value:
                    break
                step *= 0.5
            else:
                break
            total += step
            f += step
            value = self._derivatives(f, grad, curv)
        return total, value

    def _penalty(self, norm: float) -> float:
        return float(self.penalty.value(norm, self.C))

    def _refresh(self) -> None:
        """f = sum_m L~_m v_m + b~ from scratch, and the loss derivatives there."""
        self.f[:] = self.b
        for p, L in enumerate(self.blocks):
            if np.any(self.V[p]):
                product(L, self.V[p], float(self.mu[p] @ self.V[p]), self._u)
                self.f += self._u
        self.loss_value = self._derivatives(self.f, self.grad, self.curv)

    def _block_gradient(self, p: int) -> np.ndarray:
        transposed_product(self.blocks[p], self.grad, self._z)
        if self.bias:
            self._z -= self.mu[p] * float(self.grad.sum())
        return self._z

    def _metric(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Block p's Hessian (:meth:`_hessian`), reused for METRIC_EPOCHS epochs (loss'' changes slowly;
        the square loss's never does) unless the block's last step was cut by the line search."""
        kept = self.metrics[p]
        if kept is None or (self.code != LOSS_CODES["square"] and
                            (self.epochs - kept[2] >= METRIC_EPOCHS or self.last_step[p] < 1.0)):
            kept = (*self._hessian(p), self.epochs)
            self.metrics[p] = kept
        return kept[0], kept[1]

    def _hessian(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Eigendecomposition of L~^T diag(loss'') L~ for block p (the bank's precision, float64 eigh)."""
        L = self.blocks[p]
        if self._scratch is None:   # the bank's precision: float32 products for a float32 bank
            self._scratch = np.empty((self.n, self.r), dtype=L.dtype)
        scaled_centred(L, self.mu[p], np.sqrt(self.curv), self._scratch)
        H = (self._scratch.T @ self._scratch).astype(np.float64)
        lam, Q = np.linalg.eigh(H)
        lam = np.maximum(lam, RIDGE * max(float(np.mean(np.abs(lam))), 1e-300))
        return lam, Q

    @staticmethod
    def _armijo(base: float, slope: float, value_at) -> float:
        """The first step s of 1, 1/2, ... (MAX_HALVINGS of them) with value_at(s) <= base + ARMIJO s slope
        plus the rounding slack (ROUNDING); 0.0 when none passes."""
        slack = ROUNDING * (1.0 + abs(base))
        step = 1.0
        for _ in range(MAX_HALVINGS):
            if value_at(step) <= base + ARMIJO * step * slope + slack:
                return step
            step *= 0.5
        return 0.0

    def _update_block(self, p: int) -> bool:
        """One coordinate Newton step on block p; True when it moved."""
        z = self._block_gradient(p)
        v = self.V[p]
        v_norm = float(np.linalg.norm(v))
        if v_norm == 0.0 and float(np.linalg.norm(z)) <= self.t:
            return False
        lam, Q = self._metric(p)
        a_rot = lam * (Q.T @ v) - Q.T @ z
        if float(np.linalg.norm(a_rot)) <= self.t:
            w = np.zeros(self.r)
        else:
            w = Q @ group_minimiser(lam + self.q, a_rot, self.t)
        d = w - v
        if not np.any(d):
            return False
        delta = min(float(z @ d) + self._penalty(float(np.linalg.norm(w))) - self._penalty(v_norm), 0.0)
        product(self.blocks[p], d, float(self.mu[p] @ d), self._u)
        step = self._armijo(self.loss_value + self._penalty(v_norm), delta, lambda step: self._loss_along(
            self._u, step) + self._penalty(float(np.linalg.norm(v + step * d))))
        self.last_step[p] = step
        if step == 0.0:
            return False
        self.V[p] = v + step * d
        self.f += step * self._u
        self.loss_value = self._derivatives(self.f, self.grad, self.curv)
        return True

    def _update_bias(self) -> None:
        """Newton steps on b~ (:func:`_newton_on_offset`)."""
        if self.bias:
            shift, self.loss_value = self._newton_on_offset(self.f, self.grad, self.curv,
                                                       self.loss_value)
            self.b += shift

    def epoch(self) -> int:
        """Every block of W once, then the bias, then (every ANDERSON_DEPTH epochs) the extrapolation
        and, when the nonzero blocks have stayed the same over those epochs, a Newton step on them
        (:meth:`_newton_step`); returns how many blocks moved."""
        moved = sum(self._update_block(p) for p in range(len(self.blocks)))
        self._update_bias()
        self.epochs += 1
        support = np.any(self.V != 0.0, axis=1)
        if support.shape != self._support.shape or np.any(support != self._support):
            self._support, self._support_since = support, self.epochs
        self._extrapolate()
        self.newton_taken = (self.epochs % self.newton_every == 0 and self.epochs - self._support_since >= ANDERSON_DEPTH
                             and self._newton_step())
        return moved

    def _newton_step(self) -> bool:
        """A Newton step on the nonzero blocks A and the bias, where P is twice differentiable: block
        descent crawls when the blocks are coupled (overlapping kernels, a near-interpolating fit), and
        this step sees the coupling. Direction: :meth:`_newton_direction`; step: the first of 1, 1/2, ...
        that passes the Armijo test on P itself (the blocks' norms exactly, so a step through a block's
        zero is judged by the true objective); returns whether one was taken."""
        A = np.flatnonzero(np.any(self.V != 0.0, axis=1))
        if A.size == 0:
            return False
        V = self.V[A]
        S, s_b, slope = self._newton_direction(A)
        if not slope < 0.0:
            return False
        u = np.full(self.n, s_b)
        for p, s in zip(A, S):
            product(self.blocks[p], s, float(self.mu[p] @ s), self._u)
            u += self._u
        before = self._objective()
        step = self._armijo(before, slope, lambda step: self._loss_along(u, step) +
                            float(np.sum(self.penalty.value(np.linalg.norm(V + step * S, axis=1), self.C))))
        if step > 0.0:
            self.V[A] = V + step * S
            self.b += step * s_b
            self.f += step * u
            self.loss_value = self._derivatives(self.f, self.grad, self.curv)
            self._anderson = []
        if self.smoothing:
            self._adapt_curvature_floor(step, before - self._objective(), slope)
        return step > 0.0

    def _pace_newton(self) -> None:
        """The Newton steps' cadence on the smoothed hinge: an epoch that ended with one and whose gap rose
        doubles the interval (up to NEWTON_EVERY_MAX epochs), one whose gap fell sets it back to
        ANDERSON_DEPTH. With ~100 coupled blocks a joint step moves many points across the band and spoils
        the dual point the gap is built from (ringnorm n = 10,000, M = 300, C = 0.06, 102 active: gap 1.8e-2
        after 240 s with a step every 5 epochs, 3.3e-3 with none, 7.4e-3 paced), while with few blocks it is
        what converges (M = 50, C = 0.6, 5 active, tol 1e-5: 1.5 s every 5 epochs, 15 s with none, 2.4 s
        paced; 30 points: 1e-6 within 5,000 epochs only when a fall sets the interval back at once, not when
        it halves it). The smooth losses keep every 5 epochs (square, 135 active: 31 s, 42 s paced). The
        gaps compared are the last two of the history."""
        history = self.log.history
        if self.newton_taken and self.smoothing and len(history) > 1:
            if history[-1]["gap"] > history[-2]["gap"]:
                self.newton_every = min(2 * self.newton_every, NEWTON_EVERY_MAX)
            else:
                self.newton_every = ANDERSON_DEPTH

    def _adapt_curvature_floor(self, step: float, decrease: float, slope: float) -> None:
        """Levenberg-Marquardt on the curvature used outside the hinge's band, where the smoothed hinge is
        linear: a Newton step that had to be cut raises it x 10; a full step that bought more than 3/4 of
        its slope (an exact quadratic model buys 1/2) showed the model too curved, and lowers it x 10."""
        if step < 1.0:
            self.curvature_floor = min(self.curvature_floor * 10.0, 1.0)
        elif decrease > -0.75 * slope:
            self.curvature_floor = max(self.curvature_floor * 0.1, CURVATURE_FLOOR_MIN)

    def _newton_direction(self, A: np.ndarray) -> tuple[np.ndarray, float, float]:
        """(S, s_b, grad^T (S, s_b)): an approximate solution of H (S, s_b) = -grad for the blocks A
        (all nonzero) and the bias, by conjugate gradients (NEWTON_CG_ITERATIONS, to NEWTON_CG_RESIDUAL
        ||grad||). H (S, s_b) = (L~_A^T w + penalty terms, 1^T w) with w = loss'' (L~_A S + s_b); block m's
        penalty Hessian is (t / ||v_m||) (I - v^ v^T) + q I, v^ = v_m / ||v_m||. The products run in the
        bank's precision (float32 for a float32 bank: the direction needs no more). Preconditioner: the
        blocks' r x r metrics (``_metric``) with t / ||v_m|| + q added to their eigenvalues, and
        1 / sum loss'' for the bias. The gradient itself is the block steps' (``_block_gradient``)."""
        blocks, mu, V = [self.blocks[p] for p in A], self.mu[A], self.V[A]
        norms = np.linalg.norm(V, axis=1)
        unit = V / norms[:, None]
        across = self.t / norms                              # the penalty's curvature across v^
        dtype = blocks[0].dtype
        bias_curvature = float(self.curv.sum())
        gram = self._gram_of()

        def transposed(w: np.ndarray) -> np.ndarray:          # L~_A^T w (mu is 0 without a bias)
            w_bank = w.astype(dtype)
            return np.array([w_bank @ L for L in blocks], dtype=np.float64) - mu * float(w.sum())

        def data_times(S: np.ndarray, s_b: float) -> tuple[np.ndarray, float]:
            """(L~_A^T w, 1^T w) with w = loss'' (L~_A S + s_b)."""
            if gram is not None:   # loss'' = 1, and the centred columns are orthogonal to 1
                return gram.times(S, A), self.n * s_b
            u = np.full(self.n, s_b - float(np.einsum("mr,mr->", mu, S)))
            for L, s in zip(blocks, S.astype(dtype)):
                u += L @ s
            w = self.curv * u
            return transposed(w), float(w.sum())

        def hessian_times(S: np.ndarray, s_b: float) -> tuple[np.ndarray, float]:
            HS, w_sum = data_times(S, s_b)
            HS += across[:, None] * (S - unit * np.einsum("mr,mr->m", unit, S)[:, None]) + self.q * S
            return HS, w_sum if self.bias else 0.0

        metrics = [self._metric(p) for p in A]

        def preconditioned(R: np.ndarray, r_b: float) -> tuple[np.ndarray, float]:
            Z = np.array([Q @ ((Q.T @ r) / (lam + a + self.q)) for (lam, Q), r, a in zip(metrics, R, across)])
            return Z, (r_b / bias_curvature if self.bias and bias_curvature > 0.0 else 0.0)

        # the gradient as the block steps compute it (float64 accumulation): near the optimum it is a small
        # difference of L~^T loss' and the penalty's gradient, below a float32 product's rounding
        G = np.array([self._block_gradient(p).copy() for p in A]) + (across + self.q)[:, None] * V
        g_b = float(self.grad.sum()) if self.bias else 0.0
        g_norm = np.sqrt(float(np.sum(G * G)) + g_b * g_b)
        S, s_b = np.zeros_like(G), 0.0
        R, r_b = -G, -g_b
        Z, z_b = preconditioned(R, r_b)
        D, d_b = Z, z_b
        rz = float(np.sum(R * Z)) + r_b * z_b
        for _ in range(NEWTON_CG_ITERATIONS):
            if rz <= 0.0:
                break
            HD, hd_b = hessian_times(D, d_b)
            curvature = float(np.sum(D * HD)) + d_b * hd_b
            if curvature <= 0.0:
                break
            a = rz / curvature
            S, s_b = S + a * D, s_b + a * d_b
            R, r_b = R - a * HD, r_b - a * hd_b
            if np.sqrt(float(np.sum(R * R)) + r_b * r_b) <= NEWTON_CG_RESIDUAL * g_norm:
                break
            Z, z_b = preconditioned(R, r_b)
            rz_next = float(np.sum(R * Z)) + r_b * z_b
            D, d_b = Z + (rz_next / rz) * D, z_b + (rz_next / rz) * d_b
            rz = rz_next
        return S, s_b, float(np.sum(G * S)) + g_b * s_b

    def _gram_of(self) -> CentredGram | None:
        """W's Gram for the square loss's Newton step, extended to the blocks that joined W since
        (GRAM_MIN_COLUMNS); None where the products pass over the factors."""
        columns = len(self.blocks) * self.r
        if self.code != LOSS_CODES["square"] or not GRAM_MIN_COLUMNS <= columns <= self.n:
            return None
        if self.gram.blocks < len(self.blocks):
            # where memory is short for the update, the products pass over the factors instead
            needed = self.gram.bytes_to_update(len(self.blocks), self.blocks[0].itemsize)
            if needed > 0.5 * psutil.virtual_memory().available:
                self.gram.clear()
                return None
            self.gram.update(self.blocks, self.mu)
        return self.gram

    def _objective(self) -> float:
        return self.loss_value + float(np.sum(self.penalty.value(np.linalg.norm(self.V, axis=1), self.C)))

    def _extrapolate(self) -> None:
        """Anderson acceleration of the epochs (as skglm's solvers; Bertrand & Massias, AISTATS 2021):
        from the last ANDERSON_DEPTH + 1 iterates x_k = (v, b~) and their differences U, the point
        sum_k c_k x_k with c = (U^T U)^{-1} 1 / 1^T (U^T U)^{-1} 1 replaces the iterate when its objective
        is lower. The history restarts when W changes (``_add``, ``_drop_zero_blocks``)."""
        self._anderson.append(np.concatenate([self.V.ravel(), [self.b]]))
        if len(self._anderson) <= ANDERSON_DEPTH:
            return
        X = np.array(self._anderson)
        self._anderson = []
        U = np.diff(X, axis=0)
        gram = U @ U.T
        try:
            z = np.linalg.solve(gram + 1e-12 * max(float(np.trace(gram)), 1e-300) * np.eye(gram.shape[0]),
                                np.ones(gram.shape[0]))
        except np.linalg.LinAlgError:
            return
        if not np.all(np.isfinite(z)) or abs(float(z.sum())) < 1e-300:
            return
        c = z / z.sum()
        extrapolated = c @ X[1:]
        V, b = extrapolated[:-1].reshape(self.V.shape), float(extrapolated[-1])
        before = (self.V, self.b, self.f.copy(), self.grad.copy(), self.curv.copy(), self.loss_value)
        value = self._objective()
        self.V, self.b = V, b
        self._refresh()
        if not self._objective() < value:
            self.V, self.b, self.f, self.grad, self.curv, self.loss_value = before

    # -- the hinge's smoothing -----------------------------------------------------------------
    def _smoothing_bound(self) -> float:
        """mu sum_i a_i (1 - a_i), a_i = -y_i loss'_i in [0, 1]: the duality gap for the hinge that the
        smoothing alone leaves at the optimum of the smoothed problem (there the model is v and its dual
        point rho = -loss'; per point hinge - h_mu - (mu / 2) a^2 = mu a (1 - a), zero outside the
        smoothed band 1 - mu < y f < 1)."""
        a = -self.y * self.grad
        return self.smoothing * float(a @ (1.0 - a))

    def _smooth_less(self, primal: float, dual: float) -> None:
        """Continuation: mu *= SMOOTHING_DECREASE once the smoothing accounts for at least half of the
        gap for the hinge (the smoothed problem is solved about as far as it can help); the loss, its
        derivatives and the block metrics are then those of the new mu."""
        if not self.smoothing or primal - max(dual, 0.0) > 2.0 * self._smoothing_bound():
            return
        self.smoothing *= SMOOTHING_DECREASE
        self.loss_value = self._derivatives(self.f, self.grad, self.curv)
        self.metrics = [None] * len(self.metrics)
        self._anderson = []

    # -- model and certificate -----------------------------------------------------------------
    def _model(self):
        """(rho~, norms on W, weights on W, bias, f of the model, block norms) (module docstring)."""
        rho = duality.project_dual(self.loss, self.y, -self.grad, self.bias)
        norms = np.zeros(len(self.blocks))
        d = np.zeros(len(self.blocks))
        f = np.zeros(self.n)
        z = np.zeros(self.r)
        for p, L in enumerate(self.blocks):
            transposed_product(L, rho, z)
            zz = float(z @ z)
            norms[p] = np.sqrt(zz)
            if zz > 0.0 and np.any(self.V[p]):
                d[p] = max(self.C * float(self.V[p] @ z) / zz, 0.0)
                if d[p] > 0.0:
                    product(L, z, 0.0, self._u)
                    f += (d[p] / self.C) * self._u
        b = self.b - float(np.einsum("mr,mr->", self.mu, self.V)) if self.bias else 0.0
        if self.bias:
            b = self._refit_bias(f, b)
        return rho, norms, d, b, f + b, d * norms / self.C

    def _refit_bias(self, f: np.ndarray, b: float) -> float:
        """The best bias for the model's decision values f (without bias), from b."""
        f = f + b
        grad, curv = np.empty(self.n), np.empty(self.n)
        value = self._derivatives(f, grad, curv)
        return b + self._newton_on_offset(f, grad, curv, value)[0]

    # -- main loop -----------------------------------------------------------------------------
    def _initial_point(self, init: MKLResult | None) -> None:
        """The best constant model (or ``init``'s model), the first pass, W."""
        y = self.y
        if self.bias:
            if self.code == 0:
                p = float(np.clip(np.mean(y > 0), 1e-12, 1 - 1e-12))
                self.b = float(np.log(p / (1.0 - p)))
            else:
                self.b = float(np.mean(y))
        self.f[:] = self.b
        self.loss_value = self._derivatives(self.f, self.grad, self.curv)
        rho = duality.project_dual(self.loss, y, -self.grad, self.bias)
        start, _ = self.solver.starting_set(self.screen.full_pass(rho), init)
        self._add(np.asarray(start, dtype=np.int64))
        if init is not None and init.active.size:
            self._warm(init)

    def _warm(self, init: MKLResult) -> None:
        """v_m = L_m^T alpha_m with alpha_m = d_m c (init's model), b~ from its bias."""
        c = np.asarray(init.dual_coef, dtype=np.float64)
        if c.shape != (self.n,) or init.weights.shape != (self.M,):
            raise InvalidInputError(f"init has {c.size} dual coefficients and {init.weights.size} weights; a warm "
                                    f"start needs a result on this engine (n = {self.n}, M = {self.M})")
        z = np.zeros(self.r)
        for p, m in enumerate(self.index):
            if init.weights[m] > 0.0:
                transposed_product(self.blocks[p], c, z)
                self.V[p] = init.weights[m] * z
        self.b = float(init.bias) + (float(np.einsum("mr,mr->", self.mu, self.V)) if self.bias else 0.0)
        self._refresh()

    def run(self, checkpoint=None, init: MKLResult | None = None) -> MKLResult:
        """Epochs until the certified gap is below tol; ``checkpoint`` (``mklscale.runtime.checkpoint``)
        saves the state at the top of epochs and a run started from a saved state continues it bit for
        bit; ``init`` (ignored when resuming) warm-starts from another C's result."""
        state = checkpoint.load() if checkpoint is not None else None
        if state is None:
            self._initial_point(init)
            best, first = None, 1
        else:
            best, first = self._restore(state)
        converged = False
        for epoch in range(first, self.max_epochs + 1):
            if checkpoint is not None:
                checkpoint.step(epoch, lambda: self._state(best))
            moved = self.epoch()
            rho, norms_w, d, b, f, x = self._model()
            primal = duality.primal_value(self.loss, self.penalty, self.y, self.C, f, x)
            dual = duality.dual_value(self.loss, self.penalty, self.y, self.C, rho, norms_w)[0]
            gap = duality.relative_gap(primal, dual)
            certified = self.index.size == np.count_nonzero(self.screen.available)
            violators = np.zeros(0, dtype=np.int64)
            if not certified and not np.isfinite(self._certify_below):
                self._certify_below = CERTIFY_SHARE * gap
            if not certified and (gap <= max(self.tol, self._certify_below) or epoch == self.max_epochs):
                dual, violators = self.solver._certify(rho, norms_w)
                gap, certified = duality.relative_gap(primal, dual), True
                self._certify_below = np.inf
            self._record(epoch, primal, dual, gap, certified, d, moved, violators)
            self._pace_newton()
            if certified and (best is None or gap <= best[4]):
                best = (d.copy(), b, rho.copy(), primal, gap, self.index.copy())
            if certified and gap <= self.tol and violators.size == 0:
                converged = True
                break
            self._smooth_less(primal, dual)
            if violators.size:
                self._add(violators[: self.solver._growth(self.index.size, violators.size)])
        return self._result(best, converged)

    # -- checkpoints ---------------------------------------------------------------------------
    def _state(self, best) -> dict:
        """Everything the next epochs read: W, v, b~, f, the epoch count, the blocks' metrics and last
        steps, the nonzero blocks and since when, Anderson's history, the screening pass, the log, the best certified model."""
        w, r = len(self.blocks), self.r
        born = np.array([-1 if m is None else m[2] for m in self.metrics], dtype=np.int64)
        eigenvalues = np.zeros((w, r))
        eigenvectors = np.zeros((w, r, r))
        for p, m in enumerate(self.metrics):
            if m is not None:
                eigenvalues[p], eigenvectors[p] = m[0], m[1]
        state = {"index": self.index, "V": self.V, "b": float(self.b), "f": self.f, "epochs": int(self.epochs),
                 "metric_born": born, "metric_values": eigenvalues, "metric_vectors": eigenvectors,
                 "last_step": self.last_step, "certify_below": float(self._certify_below),
                 "support": self._support, "support_since": int(self._support_since),
                 "smoothing": float(self.smoothing), "curvature_floor": float(self.curvature_floor),
                 "newton_every": int(self.newton_every),
                 "anderson": np.array(self._anderson).reshape(len(self._anderson), self.V.size + 1),
                 **self.screen.state(), **self.log.state()}
        if best is not None:
            d, b, rho, primal, gap, index = best
            state.update(best_d=d, best_b=float(b), best_rho=rho, best_primal=float(primal), best_gap=float(gap),
                         best_index=index)
        return state

    def _restore(self, state: dict):
        """Set the solver to a state of :meth:`_state`; returns (best, the epoch to run next)."""
        self.screen.restore(state)
        self._add(state["index"].astype(np.int64))
        self.V, self.b, self.f = state["V"], float(state["b"]), state["f"]
        self.smoothing, self.curvature_floor = float(state["smoothing"]), float(state["curvature_floor"])
        self.newton_every = int(state["newton_every"])
        self.loss_value = self._derivatives(self.f, self.grad, self.curv)
        self.epochs = int(state["epochs"])
        self.metrics = [None if born < 0 else (lam, Q, int(born)) for born, lam, Q in
                        zip(state["metric_born"], state["metric_values"], state["metric_vectors"])]
        self.last_step, self._certify_below = state["last_step"], float(state["certify_below"])
        self._support, self._support_since = state["support"].astype(bool), int(state["support_since"])
        self._anderson = list(state["anderson"])
        self.log.restore(state)
        best = None
        if "best_d" in state:
            best = (state["best_d"], state["best_b"], state["best_rho"], state["best_primal"], state["best_gap"],
                    state["best_index"].astype(np.int64))
        return best, int(state["iteration"])

    def _record(self, epoch, primal, dual, gap, certified, d, moved, violators) -> None:
        entry = {"iteration": epoch, "primal": float(primal), "dual": float(dual), "gap": float(gap),
                 "certified": bool(certified), "n_active": int(np.count_nonzero(d)),
                 "working_set": int(self.index.size), "violators": int(violators.size), "blocks_moved": int(moved),
                 "newton_step": bool(self.newton_taken), "smoothing": float(self.smoothing)}
        self.log.record(entry)
        if not certified:
            self.log.explain("(W)", f"the gap covers only the working set W; once it is below tol it is re-measured "
                                    f"over all {self.M} kernels (it may then rise), and kernels outside W that "
                                    "violate the optimality test join W")
        if self.newton_taken:
            self.log.explain("+newton", "the epoch ended with a Newton step on all nonzero blocks together "
                                        "(conjugate gradients), taken when the nonzero blocks stayed the same for "
                                        f"{ANDERSON_DEPTH} epochs")
        joined = f"  {violators.size} kernel(s) outside W violate the optimality test" if violators.size else ""
        self.log.say(f"epoch {epoch:4d} primal {primal:.10g} dual {dual:.10g} gap {gap:.3e}"
                     f"{'' if certified else ' (W)'} active {entry['n_active']}/{self.index.size}/{self.M}"
                     f" moved {moved}{' +newton' if self.newton_taken else ''}"
                     f"{f' mu {self.smoothing:.0e}' if self.smoothing else ''} passes {entry['passes']}{joined}",
                     gap=gap, scope="all" if certified else "working set")

    def _result(self, best, converged) -> MKLResult:
        d, b, rho, primal, gap, index = best
        weights = np.zeros(self.M)
        weights[index[: d.size]] = d
        return MKLResult(weights=weights, dual_coef=rho / self.C, bias=b, active=np.flatnonzero(weights),
                         objective=primal, gap=gap, history=self.log.history, converged=converged,
                         solver="spicy/bcd", params=dict(self.solver.params))
