"""SMO-MKL (Bach, Lanckriet & Jordan 2004): the support kernel machine by SMO on its Moreau-Yosida
regularisation, with continuation, out of core over an engine.

Problem (P) (§2.2), y in {-1, +1}, d_j > 0 (1 by default):

    min_{w, b, xi >= 0} (1/2) (sum_j d_j ||w_j||)^2 + C sum_i xi_i   s.t.  y_i (sum_j <w_j, phi_j(x_i)> + b) >= 1 - xi_i

Its dual (D_K): min (1/2) gamma^2 - e^T alpha s.t. 0 <= alpha <= C, y^T alpha = 0,
q_j(alpha) = alpha^T D(y) K_j D(y) alpha <= gamma^2 d_j^2, so for every feasible alpha
    D(alpha) = e^T alpha - (1/2) max_j q_j / d_j^2  <=  optimum of (P)   (weak duality).
It is the QCQP (L) of Lanckriet et al. with tr K_j / c = d_j^2 (note: d_j^2, not d_j), and
optimum(P) = -optimum(L) / 2. With d_j = 1 it is also Citi's elastic-net MKL with eta = 1.

MY-regularised SKM (R) (§4): (P) + (1/2) sum_j a_j^2 ||w_j||^2; its dual is min G(alpha) on the same
box and hyperplane, G differentiable (Appendix C; computed in ``_smo_kernels``), solved by SMO
(§4.2): maximal violating pair on OPT_6 (index sets I_M u I_0- u I_C+ / I_M u I_0+ u I_C-, as
corrected in NOTES-pfbs-smo.md), line search by Brent's method on the root of the derivative along
the pair (the paper: "one-dimensional root finding, such as Brent's method"), q_l(t) quadratic in t
from the cached z_l = K_l D(y) alpha. The SMO loop is compiled with numba.

Continuation (§4.4):
  kappa = 1: the plain SVM on sum_j K_j / d_j^2 (libsvm via scikit-learn, to eps2/2)
  repeat: kappa <- mu kappa; SMO on (R)(kappa) to eps2/2 from the previous alpha; weights
          w = scale * eta~(alpha) (Appendix C) with sum_j d_j^2 w_j = 1;
          stop when (OPT_3) holds with w (no LP solve):
            (a) every kernel with w_j > 0 is eps1-active: max_k q_k/d_k^2 - q_j/d_j^2 <= 2 eps1,
            (b) (OPT_4) max_{I_M u I_0- u I_C+} g_i <= min_{I_M u I_0+ u I_C-} g_i + 2 eps2,
                g = K(w) D(y) alpha - y, K(w) = sum_j w_j K_j,
          With ``tol`` (default 1e-3, the tolerance every solver here uses) the run stops instead as
          soon as the relative duality gap (P(w, alpha, b) - D(alpha)) / P, certified over all M
          kernels, is <= tol: the gap bounds the suboptimality of the returned model (what the
          other solvers stop on), while (OPT_3) bounds KKT residuals and at large C asks for many
          more stages (measured: breast_cancer, 36 kernels, C = n: gap 5e-5 at kappa = 7.8e-3,
          where (OPT_3) was still unmet after 426 000 SMO steps in the next stage). The gap on W
          is free after each stage; when it is <= tol, one pass certifies it over all kernels.
          ``tol=None`` keeps the paper's test alone. When (OPT_3) holds but the gap does not, the
          SMO precision is tightened by mu along with kappa, since the gap is then limited by
          eps2 / 2 as much as by kappa. With ``tol`` the stages are solved to eps2 = tol (within
          [1e-4, 1e-3]); the MY bias falls like kappa^2, so a stage whose gap fell by less than kappa
          did is held up by that precision: it is tightened by mu and the same kappa solved again.
  Stage parameters, ``continuation``:
    "target" (default): a_j = kappa d_j, d_j fixed; scale = 1. Every stage is the MY regularisation
        of the target (P) itself, so Theorem 1's errors are O(kappa^2) (eps1 ~ 2 n C kappa^2,
        eps2 ~ eps + C kappa^2 max_j M_j / d_j^2).
    "paper": a_j = kappa d_j, d_j(kappa) = (1 - kappa) d_j (the paper's a = kappa, d = 1 - kappa);
        scale = (1 - kappa)^2. Stage kappa is then the MY regularisation of (P) with C / (1 - kappa)^2,
        an O(kappa) bias: (OPT_4) for the target decreases only like 4 kappa, and since SMO steps grow
        like ~1/kappa^2 the run stalls before eps2 = 1e-4 (measured: n = 120, 6 kernels, opt4 = 1.6e-2
        at kappa = 3.9e-3 and 120 000 steps per stage, where "target" met (OPT_3) at kappa = 7.8e-3).

Final weights: w (exact zeros outside the support of eta~); dual_coef = D(y) alpha; bias = the exact
minimiser of the hinge sum for f0 = K(w) D(y) alpha (it can only lower the primal value).

Out of core: SMO runs on a working set W of kernels held as the engine stores them (``engine.blocks``).
After the kappa = 1 stage one pass gives q_j for all kernels; W starts as the kernels with the
largest q_j / d_j^2, all of them when they fit (``max_working_set``, by default what fits in 2 GiB
of float64 blocks). A kernel of W whose eta_j stayed 0 for ``drop_after`` successive stages is
dropped. When (OPT_3) holds on W, ONE pass over all kernels (quad_forms of D(y) alpha) certifies the
dropped ones: j outside W is a violator if gamma_j = sqrt(q_j) / d_j(kappa) > gamma(alpha) (it
would get eta_j > 0). Without violators the solution on W is the MY solution over all M kernels,
so (OPT_3) and the duality gap hold over all M kernels; otherwise the violators join W (even beyond
``max_working_set``, which is a target) and the continuation restarts at kappa = mu from the
current alpha (at small kappa SMO needs very many steps to move the newcomers' gamma_j). The same
check also runs once earlier, at the first stage where (a) holds on W (the support has settled,
kappa is still large, so a kernel dropped too early comes back cheaply): with no violators a run
makes 3 passes after the kappa = 1 SVM (the first, this early check, the final certification).

Factor engines (issue 17; the engine's kernel representation answers every question below that depends
on the storage, ``engine/representation.py``): kernel j is stored as L_j (n x r_j)
and the problem is (P) on K~_j = L_j L_j^T, exactly as on the dense engine of the K~_j. W holds the
factors (``engine.blocks``: (p, n, r), never an n x n matrix) and the SMO steps are the same numba
loop with the representation as data (``_smo_kernels.smo_solve``): P_j = L_j^T D(y) alpha (r,) per
kernel gives q_j = ||P_j||^2 and the pair terms (O(r)); z_j = K~_j D(y) alpha is kept only for the
kernels with eta_j != 0, moved by the columns K~_j[:, i] = L_j L_j[i] (O(n r)) held in an LRU cache of
``COLUMN_CACHE_BYTES`` (as libsvm caches kernel columns: SMO revisits the same indices), so a step
costs O(n p_active + r p) on hits and O(n r p_active) on misses. The cache size changes no bit of
the result. The start differs: the
kappa = 1 SVM on sum_j K~_j would need the n x n sum (or an SMO over all kernels at O(n sum_j r_j)
per step), so a factor run starts the first MY stage (kappa = mu) from alpha = 0 and ranks the
kernels for W by y^T K~_j y / d_j^2 (the start pass, with the PSD probes); its first history entry
(kappa = 1, no SMO steps) records that start, with D(0) = 0. Passes and certificates are as above.

Large n (``method``): a step costs O(n r) per active kernel and a stage needs of the order of n steps, so
SMO-MKL costs >= n^2 r on factors (n = 500,000, M = 100, C = 100: its first stage unfinished after 10
minutes). ``method="primal"`` (``smo_primal.py``) solves the same (P) through SpicyMKL's hinge problem
in the primal, certified by this module's D(alpha); "auto" takes it on factor engines from n = PRIMAL_MIN_N.

Quantities reported: ``objective`` = P(w, alpha, b) (primal (P) at the returned model,
||w_j|| = w_j sqrt(q_j)); ``gap`` = (P - D) / |P| with D over all kernels; history per kappa stage.

Checkpoints (``fit(..., checkpoint=Checkpoint(...))``, mklscale.runtime.checkpoint): ``checkpoint.step``
runs before every MY stage (one numba SMO solve; a signal is acted on when the stage ends). The state
(``_SMO._state``) is what the remaining stages read: alpha, the working set W (sorted indices), the
caches Z = K_W D(y) alpha and q_W, the zero-eta streaks, kappa, the SMO precision, whether the early
certification ran, the model of the last converged stage (alpha, W, w, f0, kappa), the stage count,
the history, and the pass / byte / time counters. No kernel blocks (a resume re-reads W; the kappa = 1
SVM and first pass are not repeated). Resumed runs are bit-identical; the first new history entry has
``"resumed": True``. The caller's fingerprint must identify the bank, y, C and every other parameter.
"""

from __future__ import annotations

import functools

import numpy as np

from mklscale.errors import InvalidInputError
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers import _smo_kernels as kern
from mklscale.solvers import _svm, smo_primal
from mklscale.solvers import _validation as check
from mklscale.solvers.duality import relative_gap
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog
from mklscale.solvers.toolkit.working_set import HeldKernels

#: What to do when the working set does not fit in memory.
_REMEDY = "lower max_working_set, or use SpicyMKL, which streams the bank and holds only the kernels it can fit"

#: eps1 / n of the paper's experiments (§4.4).
EPS1_PER_SAMPLE = 5e-4
#: eps2 of (OPT_4): the paper's, kept for the paper's stopping test (tol=None), and the loosest default when
#: the certified gap stops the run (eps2 = tol within these two): at tol = 1e-3 a stage solved to 5e-4
#: instead of 5e-5 takes 2-3x fewer SMO steps on every shipped dataset with the same certified gap <= 1e-3
#: and the same held-out accuracy (digits, 70 kernels, C = n: 569 000 steps against 1 362 000); at
#: tol = 1e-5 the stages need the paper's precision, or the gap stalls above tol (tests/test_smo.py)
EPS2_PAPER, EPS2_LOOSEST = 1e-4, 1e-3


#: ``method``: SMO-MKL itself, or (P) in the primal (``smo_primal.py``); "auto" takes the primal on factor
#: engines from this n. Measured (ringnorm, M = 50, r = 64, tol 1e-3, SMO against primal): n = 10,000:
#: C = 1 1.8 / 1.0 s, C = 100 1.1 / 1.9 s, C = n 58.5 s / over 300 s; n = 50,000: C = 100 11.1 / 5.8 s,
#: C = n both over 300 s; n = 500,000, M = 100, C = 100: SMO's first stage unfinished after 600 s, primal 88 s
METHODS = ("auto", "smo", "primal")
PRIMAL_MIN_N = 50_000

#: Continuation schedules (see the module docstring).
CONTINUATIONS = ("target", "paper")
#: Default byte budget of the kernels held in the working set.
WORKING_SET_BYTES = 2 * 2**30
#: Bytes of the kernel columns K_l[:, i] = L_l L_l[i] the SMO steps cache on a factor engine.
COLUMN_CACHE_BYTES = 512 * 2**20


@single_blas_thread_for_small_n
def fit(engine, y, C, eps1: float | None = None, eps2: float | None = None, mu: float = 0.5, d=None,
        tol: float | None = 1e-3, continuation: str = "target", kappa_min: float = 1e-5,
        max_stages: int = 60, max_steps: int | None = None, max_working_set: int | None = None,
        drop_after: int = 2, seed: int = 0, verbose: bool = False, checkpoint=None, init=None,
        method: str = "auto") -> MKLResult:
    """Solve the support kernel machine (P) by SMO-MKL (see the module docstring).

    Parameters
    ----------
    engine : mklscale engine (n, M, lambda_max, quad_forms, blocks, stats; combine if available).
    y : (n,) labels in {-1, +1}, both present.
    C : SVM constant > 0.
    eps1 : eps1 of (OPT_3) (absolute); None gives the paper's 5e-4 n.
    eps2 : eps2 of (OPT_3)/(OPT_4); each SMO stage is solved to eps2 / 2. None: when ``tol`` stops the run,
        tol itself kept within [EPS2_PAPER, EPS2_LOOSEST] = [1e-4, 1e-3] (the certified gap decides; the stage
        precision only has to let the gap fall to tol, and it is tightened by mu whenever the gap is all that
        is missing, or falls by less than kappa did: then the same kappa is solved again); the paper's
        EPS2_PAPER with tol=None.
    mu : kappa <- mu kappa between stages, in (0, 1).
    d : (M,) positive per-kernel weights d_j of (P) (None: all 1).
    tol : stop when the relative duality gap certified over all kernels is <= tol (module docstring,
        "Continuation"); None: the paper's (OPT_3) test only.
    continuation : "target" (a_j = kappa d_j, d_j fixed) or "paper" (a_j = kappa d_j,
        d_j(kappa) = (1 - kappa) d_j); see the module docstring.
    kappa_min : stop (not converged) below this kappa (eta = (1 - gamma/gamma_j)/a_j^2 loses about
        log10(1/kappa^2) digits).
    max_stages : limit on SMO stages (kappa halvings plus re-solves after re-adding kernels).
    max_steps : SMO steps per stage (None: 1000 n); a stage that hits it ends the run (not converged)
        and the model of the last stage whose SMO converged is returned (certified over all kernels).
    max_working_set : most kernels held at once (None: as many as fit in 2 GiB of float64 blocks).
    drop_after : drop a kernel of the working set after this many successive stages with eta_j = 0.
    seed : seed of the PSD probe vectors of the first pass.
    checkpoint : None or a :class:`mklscale.runtime.checkpoint.Checkpoint`: resume from its state if it
        holds one, save it before each stage when due and on SIGTERM/SIGINT (module docstring; the caller
        clears it after storing the result).
    method : "smo" (this module's SMO-MKL), "primal" (the same problem (P) through SpicyMKL's hinge problem
        in the primal, ``smo_primal.py``: d_j = 1, tol not None, no checkpoint; the eps, mu,
        continuation, stage, working-set and init parameters are SMO's and unused there) or "auto": "primal" on a
        factor engine with n >= PRIMAL_MIN_N, d_j = 1, tol given and no checkpoint (SMO's steps cost
        >= n^2 r there), else "smo".
    init : None or the MKLResult of this problem at another C (the previous point of a path): start the
        continuation (at kappa = mu) from its alpha = |dual_coef| (feasible when it is <= C, as along a
        path of increasing C; else the usual start) with its kernels first in the working set, instead
        of from the kappa = 1 SVM. Where the solve starts, not what it solves. It saves the SVM and
        little else: the SMO steps of the last, small-kappa stages dominate wherever alpha starts
        (measured: 55 622 against 56 096 steps at C = 1 from the solution at C = 0.3; starting at the
        previous run's final kappa instead stalled, since at small kappa SMO moves alpha slowly).

    Returns
    -------
    MKLResult: weights w (sum_j d_j^2 w_j = 1, exact zeros out of the model), dual_coef D(y) alpha,
    bias b, f = sum_j w_j K_j D(y) alpha + b; history per stage (kappa, primal, dual, gap, n_active,
    n_working, smo_steps, smo_eps, violation, smo_converged, opt4, eps1_excess, n_violators, and the
    running totals passes, bytes_read, seconds of this solve); params["status"] is "converged", "max_steps" / "stalled" (an SMO stage did
    not reach its precision), "kappa_min" or "max_stages".
    """
    n, M, lambda_max = _svm.check_engine(engine)
    y = check.check_targets(y, n, classification=True, loss_name="hinge")
    C = check.check_positive("C", C)
    eps1 = EPS1_PER_SAMPLE * n if eps1 is None else check.check_positive("eps1", eps1)
    tol = None if tol is None else check.check_positive("tol", tol)
    if eps2 is None:
        eps2 = EPS2_PAPER if tol is None else min(max(tol, EPS2_PAPER), EPS2_LOOSEST)
    eps2 = check.check_positive("eps2", eps2)
    mu = check.check_positive("mu", mu)
    if not mu < 1.0:
        raise InvalidInputError(f"mu must lie in (0, 1) (kappa <- mu kappa); got {mu}")
    d = _check_d(d, M)
    method = check.check_choice("method", method, METHODS)
    primal_solves_it = bool(np.all(d == 1.0)) and tol is not None and checkpoint is None
    if method == "auto":
        method = ("primal" if primal_solves_it and engine.kernel_representation.blocks_are_factors
                  and n >= PRIMAL_MIN_N else "smo")
    if method == "primal":
        if not primal_solves_it:
            raise InvalidInputError("method='primal' solves (P) with d_j = 1, stops on the certified gap (tol "
                                    "not None) and keeps no checkpoint; use method='smo'")
        result = smo_primal.fit(engine, y, C, tol, verbose)
        result.params.update(C=C, d=d, tol=tol, method="primal")
        return result
    continuation = check.check_choice("continuation", continuation, CONTINUATIONS)
    kappa_min = check.check_positive("kappa_min", kappa_min)
    max_stages = check.check_count("max_stages", max_stages)
    max_steps = 1000 * n if max_steps is None else check.check_count("max_steps", max_steps)
    if max_working_set is None:  # float64-sized kernels (n x n) or factors (n x r) in WORKING_SET_BYTES
        per_kernel = 8 * int(np.prod(engine.kernel_representation.block_shape(n, engine.rank)))
        max_working_set = int(min(M, max(1, WORKING_SET_BYTES // per_kernel)))
    max_working_set = check.check_count("max_working_set", max_working_set)
    drop_after = check.check_count("drop_after", drop_after)
    params = {"C": C, "method": "smo", "eps1": eps1, "eps2": eps2, "mu": mu, "d": d, "tol": tol, "continuation": continuation,
              "kappa_min": kappa_min, "max_stages": max_stages, "max_steps": max_steps,
              "max_working_set": max_working_set, "drop_after": drop_after, "seed": seed}
    solver = _SMO(engine, y, C, d, lambda_max, eps1, eps2, mu, tol, continuation, kappa_min, max_stages,
                  max_steps, max_working_set, drop_after, seed, verbose)
    return solver.run(params, checkpoint, init)


def _check_d(d, M: int) -> np.ndarray:
    if d is None:
        return np.ones(M)
    try:
        d = np.asarray(d, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise InvalidInputError("d must be an array of M positive numbers") from None
    if d.size != M or not np.all(np.isfinite(d)) or np.any(d <= 0.0):
        raise InvalidInputError(f"d must hold M = {M} finite positive numbers (one d_j per kernel); got "
                                f"{d.size} values, min {np.min(d) if d.size else 'n/a'}")
    return d


def dual_value(alpha: np.ndarray, q: np.ndarray, d: np.ndarray) -> float:
    """D(alpha) = e^T alpha - (1/2) max_j q_j / d_j^2 (a lower bound on (P) for feasible alpha)."""
    return float(np.sum(alpha)) - 0.5 * float(np.max(q / (d * d)))


def primal_value(weights: np.ndarray, q: np.ndarray, d: np.ndarray, y: np.ndarray, C: float,
                 f: np.ndarray) -> float:
    """(P) at w_j = weights_j phi_j^T D(y) alpha: (1/2)(sum_j d_j weights_j sqrt(q_j))^2 + C hinge(f)."""
    block = float(np.sum(d * weights * np.sqrt(np.maximum(q, 0.0))))
    return 0.5 * block * block + C * _svm.hinge_sum(y, f)


def stage_parameters(d: np.ndarray, kappa: float, continuation: str):
    """(d(kappa), a(kappa), scale) of the MY stage kappa; scale maps eta~ to target weights."""
    if continuation == "paper":
        return (1.0 - kappa) * d, kappa * d, (1.0 - kappa) ** 2
    return d, kappa * d, 1.0


def skm_weights(q: np.ndarray, d: np.ndarray, kappa: float, continuation: str):
    """(eta, w, gamma) at stage kappa from the quadratic forms q of the working set: eta of
    Appendix C and the target weights w = scale * eta~ (sum_j d_j^2 w_j = 1)."""
    dk, ak, scale = stage_parameters(d, kappa, continuation)
    gammas = np.empty(q.size)
    kern.kernel_gammas(q, dk, gammas)
    gamma = kern.my_gamma(gammas, (dk / ak) ** 2)
    eta = np.empty(q.size)
    kern.my_weights(gammas, gamma, ak, eta)
    eta_tilde = np.where(eta > 0.0, eta / np.maximum(1.0 - ak * ak * eta, 1e-300), 0.0)
    return eta, scale * eta_tilde, gamma


class _SMO:
    def __init__(self, engine, y, C, d, lambda_max, eps1, eps2, mu, tol, continuation, kappa_min,
                 max_stages, max_steps, max_working_set, drop_after, seed, verbose):
        self.engine, self.y, self.C, self.d, self.lambda_max = engine, y, C, d, lambda_max
        self.eps1, self.eps2, self.mu, self.tol = eps1, eps2, mu, tol
        self.continuation, self.kappa_min = continuation, kappa_min
        self.max_stages, self.max_steps, self.max_working_set = max_stages, max_steps, max_working_set
        self.drop_after, self.seed = drop_after, seed
        self.n, self.M = y.size, d.size
        self.log = RunLog(engine, "smo", verbose, not_monotone="each stage's gap is that of the Moreau-Yosida "
                          "solution at its kappa (and SMO precision), which is not monotone from stage to stage")
        self._restart_news = None   # why the next stage's gap may rise: kernels joined W, kappa restarted
        self.rep = engine.kernel_representation
        # W's kernels as stored (K_l, or L_l on a factor engine), kept sorted by kernel id
        self.held = HeldKernels(engine, name="SMO-MKL")
        self._cold_start = False     # the start was alpha = 0 (no (n, n) sum for the start SVM)

    # ---- engine access --------------------------------------------------------------------------
    def _full_pass(self, alpha: np.ndarray, with_probes: bool) -> np.ndarray:
        """q_j = alpha^T D(y) K_j D(y) alpha for ALL kernels in one pass (checked for PSD)."""
        v = self.y * alpha
        U = np.vstack([v, _svm.probe_vectors(self.n, self.seed)]) if with_probes else v
        values = np.asarray(self.engine.quad_forms(U), dtype=np.float64)
        _svm.check_quad_forms(values, U, self.lambda_max)
        return np.maximum(values.reshape(self.M, -1)[:, 0], 0.0)

    def _load(self, kernels: np.ndarray, alpha: np.ndarray):
        """Hold ``kernels`` (none held yet) and return their caches z_l = K_l D(y) alpha, q_l."""
        self.held.fetch(kernels, _REMEDY)
        Z = np.empty((kernels.size, self.n))
        q = np.empty(kernels.size)
        kern.refresh_cache(self.held.chunks[-1], self.rep.blocks_are_factors, self.y, alpha, Z, q)
        _svm.check_quad_forms(q, self.y * alpha, self.lambda_max, kernels)
        return Z, q

    def _cache_columns(self, p: int) -> int:
        """Indices whose kernel columns (p float64 columns of n) the SMO steps cache (factor kernels;
        dense kernels' columns are read from the blocks: 0)."""
        return self.rep.cached_columns(self.n, p, COLUMN_CACHE_BYTES)

    # ---- checks ---------------------------------------------------------------------------------
    def _stage_test(self, alpha, Z, q, d, w):
        """(opt4 violation, eps1 excess, f0): (OPT_4) left minus right side (<= 2 eps2 required) and
        max_k q_k/d_k^2 - min_{w_j > 0} q_j/d_j^2 - 2 eps1 (<= 0 required), over the kernels given."""
        g = np.empty(self.n)
        kern.scaled_gradient(Z, self.y, w, g)
        _, _, opt4 = kern.violating_pair(g, self.y, alpha, self.C)
        f0 = g + self.y  # K(w) D(y) alpha
        scaled = q / (d * d)
        support = w > 0.0
        excess = float(np.max(scaled) - np.min(scaled[support])) - 2.0 * self.eps1 if np.any(support) else np.inf
        return float(opt4), excess, f0

    def _evaluate(self, alpha, q, d, w, f0):
        """(primal, dual, gap, bias) over the kernels given."""
        bias = _svm.optimal_bias(f0, self.y)
        primal = primal_value(w, q, d, self.y, self.C, f0 + bias)
        dual = dual_value(alpha, q, d)
        return primal, dual, relative_gap(primal, dual), bias

    # ---- main loop ------------------------------------------------------------------------------
    def run(self, params: dict, checkpoint=None, init=None) -> MKLResult:
        y, C, d = self.y, self.C, self.d
        state = checkpoint.load() if checkpoint is not None else None
        if state is None:
            warm = self._warm_start(init)
            alpha, rank_by, kappa = warm if warm is not None else (*self._start(), self.mu)
            # the working set: the kernels with the largest q_j / d_j^2, all of them when they fit
            order = np.argsort(-(rank_by / (d * d)), kind="stable")
            if warm is not None:  # the previous model's kernels first
                previous = np.flatnonzero(init.weights > 0.0)
                order = np.concatenate([previous, order[~np.isin(order, previous)]])
            W = np.sort(order[: max(self.max_working_set, int(np.count_nonzero(init.weights > 0.0)) if warm else 0)])
            Z, q = self._load(W, alpha)
            zero_streak = np.zeros(W.size, dtype=np.int64)
            smo_eps = 0.5 * self.eps2
            early_checked = False
            final = None
            first = 0
        else:
            first, alpha, W, Z, q, zero_streak, kappa, smo_eps, early_checked, final = self._restore(state)
            self.held.fetch(W, _REMEDY)
        status = "max_stages"
        for stage in range(first, self.max_stages):
            if checkpoint is not None:
                checkpoint.step(stage, functools.partial(self._state, alpha, W, Z, q, zero_streak, kappa,
                                                         smo_eps, early_checked, final))
            if kappa < self.kappa_min:
                status = "kappa_min"
                break
            dW = d[W]
            dk, ak, _ = stage_parameters(dW, kappa, self.continuation)
            K = self.held.stack()
            steps, violation, code = kern.smo_solve(K, self.rep.blocks_are_factors, y, alpha, Z, q, dk, ak, C,
                                                    smo_eps, self.max_steps, self._cache_columns(W.size))
            kern.refresh_cache(K, self.rep.blocks_are_factors, y, alpha, Z, q)
            del K
            smo_ok = code == kern.SMO_CONVERGED
            eta, w, _ = skm_weights(q, dW, kappa, self.continuation)
            opt4, excess, f0 = self._stage_test(alpha, Z, q, dW, w)
            primal, dual, gap, _ = self._evaluate(alpha, q, dW, w, f0)
            paper_test = smo_ok and opt4 <= 2.0 * self.eps2 and excess <= 0.0
            if smo_ok or final is None:  # a stage that failed is not kept when an earlier one converged
                final = (alpha.copy(), W.copy(), w, f0, kappa)
            violators = np.zeros(0, dtype=np.int64)
            certified = False
            early = smo_ok and excess <= 0.0 and not early_checked
            small_gap = smo_ok and self.tol is not None and gap <= self.tol
            if paper_test or early or small_gap:  # certify the kernels outside W with ONE pass over the bank
                early_checked = True
                q_all = self._full_pass(alpha, with_probes=False)
                violators = self._violators(q_all, W, kappa, q, dW)
                # without violators P and (OPT_3) over all kernels equal those on W; D takes every q_j
                certified = violators.size == 0
                dual = dual_value(alpha, q_all, d)
                gap = relative_gap(primal, dual)
            before = self.log.history[-1] if self.log.history else {}
            # the MY bias falls like kappa^2: a gap that fell by less than kappa did is held up by the SMO
            # precision (checkpointed through the history, so a resumed run decides the same)
            stalled = (self.tol is not None and before.get("kappa", 0.0) > kappa
                       and np.isfinite(before.get("gap", np.nan)) and gap > (kappa / before["kappa"]) * before["gap"])
            self._record(kappa, alpha, q, dW, w, (opt4, excess, primal, dual, gap), W.size, steps,
                         violation, smo_ok, n_violators=int(violators.size), smo_eps=smo_eps)
            if certified and (gap <= self.tol if self.tol is not None else paper_test):
                status = "converged"
                break
            if not smo_ok:
                status = kern.SMO_STATUS[code]
                break
            if violators.size:
                # restart the continuation: at small kappa SMO moves a newcomer's gamma_j very slowly
                size = W.size
                Z, q, W, zero_streak = self._add(Z, q, W, zero_streak, violators, alpha)
                self._restart_news = (f"{W.size - size} kernel(s) joined the working set W and kappa restarted at "
                                      f"mu = {self.mu:g}")
                self.log.say(f"{violators.size} kernel(s) outside the working set violate the optimality test: "
                             f"added (W {W.size}); kappa restarts at mu = {self.mu:g}, where SMO can still "
                             "move their weights")
                kappa, smo_eps = self.mu, 0.5 * self.eps2
                continue
            zero_streak = np.where(eta > 0.0, 0, zero_streak + 1)
            Z, q, W, zero_streak = self._drop(Z, q, W, zero_streak)
            if stalled:         # held up by the SMO precision, not by kappa: tighten it and solve this kappa again
                smo_eps *= self.mu
                continue
            kappa *= self._kappa_step(gap)
            if certified and paper_test:  # only the gap is missing: it is limited by the SMO precision as well
                smo_eps *= self.mu

        weights = np.zeros(self.M)
        if final is None:  # no MY stage ran: the start alpha on the sum of kernels, weights 1/(M d_j^2)
            f0 = self.rep.combined_matvec(self.engine, 1.0 / (d * d), y * alpha) / self.M
            weights[:] = 1.0 / (self.M * d * d)
            kappa = 1.0
        else:
            alpha, W_final, w, f0, kappa = final
            weights[W_final] = w
        if status != "converged":  # certify the returned model over all kernels (one pass)
            q_all = self._full_pass(alpha, with_probes=False)
        bias = _svm.optimal_bias(f0, y)
        primal = primal_value(weights, q_all, d, y, C, f0 + bias)
        dual = dual_value(alpha, q_all, d)
        gap = relative_gap(primal, dual)
        params = dict(params, kappa=kappa, stages=len(self.log.history) - 1, status=status, **self.log.totals(),
                      dual=dual, n_working=int(W.size))
        return MKLResult(weights=weights, dual_coef=y * alpha, bias=bias, active=np.flatnonzero(weights),
                         objective=primal, gap=gap, history=self.log.history, converged=status == "converged",
                         solver="smo_mkl", params=params)

    def _start(self):
        """(alpha, ranking q of the working set) at the start, after recording the start entry.
        Dense: alpha of the kappa = 1 SVM on sum_j K_j / d_j^2 (libsvm, to eps2 / 2: tol = 2 (eps2 / 2)),
        ranked by q_j(alpha). Factors: alpha = 0 (the SVM would need the n x n sum, or an SMO over all
        kernels at O(n sum_j r_j) per step); the first MY stage starts from it, and the kernels are
        ranked by q_j = y^T K_j y (alpha = 1). Either way one pass, with the PSD probes."""
        y, d = self.y, self.d
        K_sum = self.rep.optional_dense(self.engine, 1.0 / (d * d))
        if K_sum is None:
            self._cold_start = True
            alpha = np.zeros(self.n)
            rank_by = self._full_pass(np.ones(self.n), with_probes=True)
            self._record(1.0, alpha, np.zeros(self.M), d, None, None, self.M, 0, np.nan, True)
            return alpha, rank_by
        alpha, _, _, svm_ok = _svm.fit_svc(K_sum, y, self.C, self.eps2)
        del K_sum
        q_all = self._full_pass(alpha, with_probes=True)
        self._record(1.0, alpha, q_all, d, None, None, self.M, 0, np.nan, svm_ok)
        return alpha, q_all

    def _kappa_step(self, gap: float) -> float:
        """The factor kappa shrinks by for the next stage: mu, or, with ``tol``, a smaller step when the gap
        on W is already near it. The MY bias makes the gap about proportional to kappa (digits, 70 kernels,
        C = n: 3.97e-3, 1.02e-3, 2.73e-4 at kappa = 1/16, 1/32, 1/64) while a stage's SMO steps grow like
        1/kappa, so halving kappa when the gap is 1.02 tol paid a stage of twice the steps (1.3M) for a gap
        four times below tol; kappa x 0.8 tol / gap (never less than mu) aims just below tol instead."""
        if self.tol is None or not np.isfinite(gap) or gap <= 0.0:
            return self.mu
        return float(min(max(self.mu, 0.8 * self.tol / gap), 0.9))

    def _warm_start(self, init):
        """(alpha, ranking q, kappa = mu) from the result of this problem at another C, or None when it cannot
        start there: alpha = |dual_coef| (dual_coef = D(y) alpha) must lie in the box [0, C] (a path of
        increasing C keeps it there; y^T alpha = 0 holds already). One pass ranks the kernels (with the
        PSD probes), as the cold start's."""
        if init is None:
            return None
        if init.dual_coef.shape != (self.n,) or init.weights.shape != (self.M,):
            raise InvalidInputError(f"init has {init.dual_coef.size} dual coefficients and {init.weights.size} "
                                    f"weights; a warm start needs a result on this engine (n = {self.n}, M = {self.M})")
        alpha = np.abs(np.asarray(init.dual_coef, dtype=np.float64))
        kappa = self.mu
        if np.any(alpha > self.C) or not np.any(init.weights > 0.0):
            return None
        q_all = self._full_pass(alpha, with_probes=True)
        self.warm = True
        self._record(kappa, alpha, q_all, self.d, None, None, self.M, 0, np.nan, True)
        return alpha, q_all, kappa

    # ---- checkpoints ----------------------------------------------------------------------------
    def _state(self, alpha, W, Z, q, zero_streak, kappa, smo_eps, early_checked, final) -> dict:
        """Checkpoint state before a stage (module docstring); ``final`` is the last converged
        stage's (alpha, W, w, f0, kappa) or None. The stage count is the checkpoint's iteration."""
        state = {"alpha": alpha, "W": W, "Z": Z, "q": q, "zero_streak": zero_streak, "kappa": kappa,
                 "smo_eps": smo_eps, "early_checked": early_checked, "final_kappa": None, **self.log.state()}
        if final is not None:
            state.update(final_alpha=final[0], final_W=final[1], final_w=final[2], final_f0=final[3],
                         final_kappa=final[4])
        return state

    def _restore(self, state: dict):
        """(stage, alpha, W, Z, q, zero_streak, kappa, smo_eps, early_checked, final) from :meth:`_state`."""
        self.log.restore(state)
        final = None if state["final_kappa"] is None else \
            (state["final_alpha"], state["final_W"], state["final_w"], state["final_f0"], float(state["final_kappa"]))
        return (int(state["iteration"]), state["alpha"], state["W"], state["Z"], state["q"], state["zero_streak"],
                float(state["kappa"]), float(state["smo_eps"]), bool(state["early_checked"]), final)

    # ---- working set ----------------------------------------------------------------------------
    def _violators(self, q_all, W, kappa, q_W, d_W) -> np.ndarray:
        """Kernels outside W with gamma_j > gamma(alpha) at this kappa, largest first."""
        dk, ak, _ = stage_parameters(d_W, kappa, self.continuation)
        gammas = np.empty(q_W.size)
        kern.kernel_gammas(q_W, dk, gammas)
        gamma = kern.my_gamma(gammas, (dk / ak) ** 2)
        outside = np.setdiff1d(np.arange(self.M), W)
        g_out = np.sqrt(q_all[outside]) / stage_parameters(self.d[outside], kappa, self.continuation)[0]
        bad = outside[g_out > gamma]
        return bad[np.argsort(-g_out[g_out > gamma], kind="stable")]

    def _add(self, Z, q, W, zero_streak, new, alpha):
        room = max(self.max_working_set - W.size, 1)
        new = new[:room]
        Z_new, q_new = self._load(new, alpha)
        W = np.concatenate([W, new])
        order = np.argsort(W, kind="stable")
        self.held.reorder(order)
        Z = np.ascontiguousarray(np.concatenate([Z, Z_new])[order])
        q = np.concatenate([q, q_new])[order]
        zero_streak = np.concatenate([zero_streak, np.zeros(new.size, dtype=np.int64)])[order]
        return Z, q, W[order], zero_streak

    def _drop(self, Z, q, W, zero_streak):
        keep = zero_streak < self.drop_after
        if not np.any(keep):
            keep[int(np.argmax(q / self.d[W] ** 2))] = True
        if np.all(keep):
            return Z, q, W, zero_streak
        self.held.keep(keep)
        return np.ascontiguousarray(Z[keep]), q[keep], W[keep], zero_streak[keep]

    # ---- history --------------------------------------------------------------------------------
    def _record(self, kappa, alpha, q, d, w, tests, n_working, steps, violation, smo_ok, n_violators=0,
                smo_eps=np.nan):
        if tests is None:
            opt4 = excess = primal = np.nan
            dual = dual_value(alpha, q, d)
            gap = np.nan
            n_active = self.M
        else:
            opt4, excess, primal, dual, gap = tests
            n_active = int(np.count_nonzero(w))
        entry = {"kappa": kappa, "primal": primal, "dual": dual, "gap": gap, "n_active": n_active,
                 "n_working": int(n_working), "smo_steps": int(steps), "smo_eps": smo_eps,
                 "violation": float(violation),
                 "smo_converged": bool(smo_ok), "opt4": opt4, "eps1_excess": excess,
                 "n_violators": n_violators}
        if tests is None:  # the start: no kernel weights yet, so no primal, gap or stage tests
            start = ("alpha of the warm start (the previous solution of a path)" if getattr(self, "warm", False)
                     else "alpha = 0" if self._cold_start else "SVM on sum_j K_j / d_j^2")
            line = (f"kappa {kappa:.3e}  W {n_working:4d}  start: {start}, D {dual:.10g}; P and the gap "
                    "follow from the first stage's kernel weights")
        else:
            line = (f"kappa {kappa:.3e}  W {n_working:4d}  active {n_active:4d}  steps {steps:7d}  "
                    f"P {primal:.10g}  D {dual:.10g}  gap {gap:.2e}  opt4 {opt4:.2e}  eps1 {excess:.2e}")
            self.log.explain("opt4, eps1", f"the stage's (OPT_4) pair violation (the stop needs <= 2 eps2 = "
                             f"{2 * self.eps2:g}); the largest excess of a weighted kernel over the eps1-activity test "
                             "(the stop needs <= 0)")
        self.log.explain("W", "kernels in the working set; a stage's gap is measured over them, and one pass over all "
                         "kernels checks the others before SMO-MKL stops")
        why, self._restart_news = self._restart_news, None
        self.log.record(entry, line, gap=gap, why=why)

