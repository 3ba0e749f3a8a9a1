"""Greedy coordinate descent MKL (Afkanpour thesis, Chapter 5; NOTES-afkanpour.md §3).

GCD-1s = CKL (Algorithm 6, Argyriou et al. 2005): Frank-Wolfe on the reduced one-stage objective
over Delta_1 = {theta >= 0, sum theta <= 1} (vertices 0 and e_i), squared loss, rho_i = 1:

    J(theta) = (1/2) t^T (K_theta + lam I)^{-1} t,  alpha* = (K_theta + lam I)^{-1} t   (_final_fit)
    I     = argmax_i alpha*^T K_i alpha*            (5.3): ONE quad_forms pass (finite bank), or the
                                                    continuous width search (5.4) for a family
    eta   = argmin_{[0,1]} J((1 - eta) theta + eta e_I)   exact (eigen-decomposition line search)
    theta <- (1 - eta) theta + eta e_I,  K_theta <- (1 - eta) K_theta + eta K_I  (driver-side matrix)

Certificate: the Frank-Wolfe gap <grad J, theta - e_I> = (1/2)(max_i q_i - alpha*^T K_theta alpha*)
>= J(theta) - J* (exact for a finite bank; for a continuous family it uses the maximum found).
Stops when the relative gap (J - max(J - gap, 0)) / J <= tol (``duality.relative_gap``), i.e. tol bounds the
RELATIVE suboptimality (J - J*)/J. The model:
f = K_theta alpha* + b, i.e. weights theta, dual_coef alpha*.

variant="fw" is Algorithm 6 as printed. Its rate is sublinear (J - J* <= 2 C_J/(k + 2)):
once the optimum lies on a face of Delta_1 spanned by several kernels, the iterates zig-zag between
vertices and the gap shrinks like 1/k. Measured (a bank as in benchmarks/bench_sgd_gcd.py: 70 Gaussian
kernels on 500 points of datasets.load("ringnorm", n_samples=1000, seed=0), lam = 0.1): the relative gap is 1.4e-1, 4.6e-3, 2.2e-3, 1.4e-3 after 10,
25, 50, 100 iterations and first reaches 1e-3 at iteration 274 — which is why the benchmark's
max_iter = 100 stopped it unconverged (neither the line search, exact to 1e-15 in eta, nor tol was at
fault). variant="away" is the away-step Frank-Wolfe method (Guelat & Marcotte 1986; Lacoste-Julien &
Jaggi 2015, linear convergence on polytopes): with the atoms of theta (the selected vertices e_i with
weights theta_i, plus the vertex 0 with weight 1 - sum theta when positive), the away vertex
v = argmin_{atoms} q_i (largest gradient -q_i/2); when the away gap (1/2)(alpha*^T K_theta alpha* - q_v)
exceeds the Frank-Wolfe gap, the step is theta <- theta + gamma (theta - e_v), gamma in
[0, theta_v/(1 - theta_v)] by the same exact line search (at the upper end theta_v = 0: a "drop"
step that removes the kernel). The q_i of the atoms come from the same quad_forms pass (finite
bank: still ONE pass per iteration; families recompute the atoms' blocks). Same problem, same
certificate and stopping rule; on the ringnorm bank above it reaches 1e-3 at iteration 34 and 1e-6 at
68; on a digits bank (202 kernels, 500 points, lam = 0.1) plain Frank-Wolfe is still above 1e-3 after
300 iterations (1.5e-2 at 100), away steps reach 1e-3 at 144 and 1e-5 at 285. The thesis uses plain Frank-Wolfe (CKL "needs about 50" iterations); away steps are an addition,
and the default (with max_iter = 1000): on the default "auto" bank of breast_cancer plain Frank-Wolfe
was still at a relative gap of 3.6e-3 after 100 iterations, away steps certified 3.5e-5 at 35.
History entries record "step": "fw" | "away" | "drop" (eta < 0 for away steps: -gamma).

GCD-2s, criterion="alignment" (Algorithm 7, FSAM, Section 5.3.1), centred ideal kernel K*_c = y_c y_c^T:

    K^0 = eps I;  repeat: P = C_n F'(K) C_n with F'(K) = (K*_c - <K, K*_c>/||K||^2 K)/(||K|| ||K*_c||) (5.7)
    I = argmax <P, K_i> (a frobenius pass / the width search (5.6)); K' = C_n K_I C_n
    eta = best of {0, eta*, eta_max} for F(K + eta K'), eta* = max(0, (ad - bc)/(bd - ae)) clipped to
    eta_max (Prop. 5.4, a = <K,K*_c>, b = <K',K*_c>, c = <K,K>, d = <K,K'>, e = <K',K'>)
    K <- K + eta K'; stop when F rises by <= delta (1e-3) or after T (50) iterations.
Weights are the accumulated eta's (not normalised: eta_max = 1 acts as the regulariser, as in the thesis).
DEVIATION (checked numerically): taken literally, K^0 = eps I stays part of K, and at k = 1 the
maximiser of F(eps I + eta K') is an interior eta* of order eps whenever a little identity improves
the alignment — all later steps are then of order eps too and eps I acts as a hidden ridge
component of the learned kernel. Here eps I is used only to define P at k = 1; K^1 = eta_max K'
(F(eta K') is constant in eta > 0), and the iterations continue on sum eta_k K'_k alone, so the
learned kernel is exactly the weighted sum of bank kernels that the final fit uses.

GCD-2s, criterion="euclidean" (Algorithm 8, Section 5.3.2): min_{theta in Delta_1} (1/(2n^2))
||beta sum theta_i K_{i,c} - K*_c||_F^2 by Frank-Wolfe; I = argmax <K_i, K*_c - K>. The printed rule stops
when max_i <K_i, K*_c - K> <= 0, but the Frank-Wolfe vertex of Delta_1 is then theta = 0 (not optimality):
the gap <grad, theta - s> = (<K, K - K*_c> + beta max(0, max_i <K_i, K*_c - K>)) / n^2 >= J - J* (s = e_I,
or 0 when no <K_i, K*_c - K> > 0) can still be large (measured 2e-3..3e-2 of the initial objective on small banks). Here that
step shrinks K towards 0 (same exact line search, direction -K); the loop stops, converged, only when
the relative gap (J - max(J - gap, 0)) / J <= tol (``duality.relative_gap``, as every solver), else after max_iter with
converged=False (Frank-Wolfe is sublinear: e.g. 677 iterations for tol = 1e-6 on a 6-kernel bank).
step="thesis" keeps the printed stop (converged only if the gap is within tol there).
A constant kernel (C_n K C_n = 0) selected first raises InvalidInputError naming the constant kernels
(``_centred_block``); selected later it counts as the vertex 0.
ERRATUM used: the printed step min(1, <K_I, K*_c - K> / (beta <K_I, K_I>)) is the minimiser for an
ADDITIVE step theta + eta e_I, but the update is the convex combination (1 - eta) theta + eta e_I; the
exact line search for that update is eta = <K*_c - K, beta K_I - K> / ||beta K_I - K||^2 clipped to
[0, 1] (K centred, K_I centred). step="exact" (default) uses it; step="thesis" the printed rule (the
objective may then increase; history records it). beta=None: start from twice the best single-kernel
scale of the first kernel and double beta (halving theta, so K is unchanged) whenever sum(theta)
exceeds 1/2, so the simplex constraint never binds and the solution is the alignment maximiser
((2.12) up to scale). Weights are beta*theta normalised to sum one (as AMKL).

Both two-stage variants end with the final fit of ``_final_fit`` (kernel ridge with unpenalised bias for
regression, libsvm SVC(kernel="precomputed") for classification) on sum_i w_i K_i (uncentred; the
bias absorbs the mean).

Results: for a finite bank (an engine or FiniteBank) weights have length M; for a family they index the
selected kernels listed in ``params["kernels"]`` (see ``sources``).

Checkpoints (``checkpoint=Checkpoint(...)`` of ``fit_one_stage`` / ``fit_two_stage``,
mklscale.runtime.checkpoint): ``checkpoint.step`` runs before every greedy step. The state is the
weights so far (keys as ``source.describe`` dicts in selection order, values), the driver-side
(n, n) combination the next step starts from (K_theta for GCD-1s, K for Algorithms 7 and 8: an exact
copy, since recomputing it from the weights changes its rounding; on factor engines the factors are
recombined from the weights, deterministically), the loop's scalars (GCD-1s: alpha*,
J and the last gap; FSAM: F of the previous step; Algorithm 8: beta and the last gap), the history
and its time / pass counters (``_Run``). A resumed run is bit-identical (the two-stage final fit runs
after the loop, as without a resume); its first new history entry has ``"resumed": True``. The
caller's fingerprint must identify the source (bank), y, the stage / criterion and every parameter.
"""

from __future__ import annotations

import functools

import numpy as np

from mklscale.errors import InvalidInputError
from mklscale.solvers._threads import single_blas_thread_for_small_n
from mklscale.solvers import _final_fit
from mklscale.solvers._final_fit import centre
from mklscale.solvers.toolkit.lowrank import LowRank, frob_inner, weighted_factor
from mklscale.solvers._validation import check_choice, check_count, check_positive, check_targets
from mklscale.solvers.baselines import resolve_task
from mklscale.solvers import duality
from mklscale.solvers.result import MKLResult
from mklscale.solvers.toolkit import RunLog
from mklscale.solvers.sources import as_source


class _Weights:
    """Sparse weights over kernel keys, in order of first selection."""

    def __init__(self):
        self.keys: list = []
        self.values: dict = {}

    def scale(self, factor: float) -> None:
        for k in self.values:
            self.values[k] *= factor

    def add(self, key, amount: float) -> None:
        if key not in self.values:
            self.keys.append(key)
            self.values[key] = 0.0
        self.values[key] += amount

    def state(self, source) -> dict:
        return {"weight_keys": [source.describe(k) for k in self.keys],
                "weight_values": np.array([self.values[k] for k in self.keys], dtype=np.float64)}

    @classmethod
    def from_state(cls, state: dict, source) -> _Weights:
        weights = cls()
        weights.keys = [source.key_from(d) for d in state["weight_keys"]]
        weights.values = dict(zip(weights.keys, state["weight_values"].tolist()))
        return weights

    def as_result_arrays(self, source) -> tuple[np.ndarray, dict]:
        """(weights, extra params) in MKLResult layout; exact zeros are dropped from family lists."""
        if source.finite:
            w = np.zeros(source.M)
            for k in self.keys:
                w[k] = self.values[k]
            return w, {}
        kept = [k for k in self.keys if self.values[k] != 0.0]
        return (np.array([self.values[k] for k in kept], dtype=np.float64),
                {"kernels": [source.describe(k) for k in kept]})


class _Run:
    """A greedy loop's run log (toolkit RunLog: history with running totals) and its checkpoint.

    ``load()`` returns the saved state (or None) and continues the log from it;
    ``step(it, weights, get_state)`` calls ``checkpoint.step`` (if any) with the loop's own
    ``get_state()`` plus the weights and the log.
    """

    def __init__(self, src, checkpoint, name: str, verbose: bool):
        self.src, self.checkpoint = src, checkpoint
        self.log = RunLog(src.engine, name, verbose, not_monotone="the Frank-Wolfe gap bounds J - J* at each iterate "
                          "but is not monotone: a step toward one vertex can raise the gradient's score of another")

    @property
    def history(self) -> list[dict]:
        return self.log.history

    def append(self, entry: dict, line: str | None = None) -> None:
        self.log.record(entry, line)

    def load(self) -> dict | None:
        saved = self.checkpoint.load() if self.checkpoint is not None else None
        if saved is not None:
            self.log.restore(saved)
        return saved

    def step(self, it: int, weights: _Weights, get_state) -> None:
        if self.checkpoint is not None:
            self.checkpoint.step(it, lambda: {**get_state(), **weights.state(self.src), **self.log.state()})


def _targets(y, n, fit_intercept):
    y = check_targets(y, n, classification=False, loss_name="squared")
    b = float(y.mean()) if fit_intercept else 0.0
    return y, y - b, b


# ---- GCD-1s --------------------------------------------------------------------------------------------
@single_blas_thread_for_small_n
def fit_one_stage(source, y, lam: float = 1.0, max_iter: int = 1000, tol: float = 1e-4,
                  fit_intercept: bool = True, reg: float = 0.0, variant: str = "away", verbose: bool = False,
                  checkpoint=None, init=None) -> MKLResult:
    """GCD-1s / CKL (Algorithm 6) on a finite bank (engine) or a continuous family; see the module docstring.

    ``lam`` is the ridge of J (``_final_fit`` convention), ``tol`` the relative Frank-Wolfe gap,
    ``reg`` the per-feature width regulariser of a per-feature Gaussian family, ``variant`` "fw"
    (Algorithm 6 as printed) or "away" (away-step Frank-Wolfe, module docstring). ``checkpoint``: None or
    a :class:`mklscale.runtime.checkpoint.Checkpoint`; resume from its state if it holds one, save it
    before each step when due and on SIGTERM/SIGINT (module docstring; the caller clears it). ``init``:
    None or the MKLResult of this problem at another lam on the same finite bank (the previous point of a
    path): Frank-Wolfe starts from its theta (a point of Delta_1 whatever lam is) instead of theta = 0.
    """
    src = as_source(source)
    lam = check_positive("lam", lam)
    max_iter = check_count("max_iter", max_iter)
    tol = check_positive("tol", tol)
    variant = check_choice("variant", variant, ("fw", "away"))
    y, t, bias = _targets(y, src.n, fit_intercept)
    run = _Run(src, checkpoint, "gcd-1s", verbose)
    saved = run.load()
    converged = False
    kernels = src.choose(_MatrixKernels, _FactorKernels)(src)
    if saved is None:
        weights, first = _warm_weights(init, src), 1
        K_theta = kernels.combination(weights)
        alpha, J = _final_fit.ridge_dual(K_theta, t, lam)
        gap = np.inf
    else:
        weights, first = _Weights.from_state(saved, src), saved["iteration"] + 1
        K_theta = kernels.restore_combination(saved, weights)
        alpha, J, gap = saved["alpha"], float(saved["J"]), float(saved["gap"])
    for it in range(first, max_iter + 1):
        run.step(it - 1, weights, functools.partial(kernels.state, K_theta, alpha=alpha, J=J, gap=gap))
        key, q_max, q_all = src.argmax_frobenius(None, alpha=alpha) if src.finite else \
            src.argmax_frobenius(None, alpha=alpha, reg=reg)
        aKa = kernels.quad(K_theta, alpha)
        gap = max(0.5 * (q_max - aKa), 0.0)
        if duality.relative_gap(J, J - gap) <= tol:
            converged = True
            run.append(_entry(it, J, gap, 0.0, key, src))
            break
        away = _away_atom(src, weights, alpha, q_all) if variant == "away" else None
        if away is not None and 0.5 * (aKa - away[1]) > gap:
            # away step: theta <- theta + gamma (theta - e_v), gamma in [0, theta_v / (1 - theta_v)]
            v, _, theta_v = away
            g_max = theta_v / (1.0 - theta_v)
            K_end, K_v = kernels.away_end(K_theta, weights, v, g_max)    # theta_v = 0 there: a point of Delta_1
            s, J = _final_fit.exact_segment_search(K_theta, K_end, t, lam)
            gamma = s * g_max
            weights.scale(1.0 + gamma)
            kind = "drop" if s >= 1.0 else "away"
            if v is not None:
                weights.add(v, -gamma)
                if kind == "drop":
                    weights.values[v] = 0.0
            K_theta = kernels.away_step(K_theta, K_end, K_v, gamma, kind == "drop", weights)
            eta, key = -gamma, v
        else:
            K_new = kernels.vertex(key)
            eta, J = _final_fit.exact_segment_search(K_theta, K_new, t, lam)
            weights.scale(1.0 - eta)
            weights.add(key, eta)
            K_theta = kernels.fw_step(K_theta, eta, K_new, weights)
            kind = "fw"
        alpha, J = _final_fit.ridge_dual(K_theta, t, lam)
        run.log.explain("gap", "the Frank-Wolfe gap (1/2)(max_i q_i - alpha^T K_theta alpha) of the iterate before "
                        "the step, a bound on J - J* (absolute; the stop needs gap / J <= tol)")
        run.log.explain(kind, {"fw": "a Frank-Wolfe step toward kernel `key` (eta: its step length)",
                               "away": "an away step: weight moved off kernel `key` (eta = -gamma)",
                               "drop": "an away step that removed kernel `key` from the combination"}[kind])
        run.log.record({**_entry(it, J, gap, eta, key, src), "step": kind},
                       f"it {it:4d} J={J:.10g} gap={gap:.3e} {kind} eta={eta:.4f} key={src.describe(key)}", gap=gap)
    w, extra = weights.as_result_arrays(src)
    return MKLResult(weights=w, dual_coef=alpha, bias=bias, active=np.flatnonzero(w), objective=J,
                     gap=duality.relative_gap(J, J - gap), history=run.history, converged=converged,
                     solver="gcd-1s", params={"lam": lam, "max_iter": max_iter, "tol": tol,
                                              "fit_intercept": fit_intercept, "reg": reg, "simplex": "Delta_1",
                                              "variant": variant,
                                              "iterations": len(run.history), **extra})


def _warm_weights(init, src) -> _Weights:
    """The weights a one-stage run starts from: theta of ``init`` (a result on this finite bank), else none."""
    weights = _Weights()
    if init is None:
        return weights
    if not src.finite or np.shape(init.weights) != (src.M,):
        raise InvalidInputError(f"init has {np.size(init.weights)} weights; a warm start needs a result on this finite "
                                f"bank of M = {src.M} kernels")
    for k in np.flatnonzero(init.weights > 0.0):
        weights.add(int(k), float(init.weights[k]))
    return weights


class _Factors:
    """The factors L_k of the kernels a greedy loop selected, on a factor engine above the dense cap
    (issue 17): combinations of them are ``LowRank`` factors, never (n, n) matrices."""

    def __init__(self, src):
        self.src = src
        self.L: dict = {}

    def get(self, key) -> np.ndarray:
        if key not in self.L:
            self.L[key] = self.src.factor(key)
        return self.L[key]

    def single(self, key) -> LowRank:
        return LowRank(self.get(key))

    def combine(self, values: dict) -> LowRank:
        """sum_k values[k] K_k (values >= 0; non-positive ones are left out) as a LowRank."""
        for k in values:
            self.get(k)
        return LowRank(weighted_factor(self.L, values, self.src.n))


def _entry(it, J, gap, eta, key, src) -> dict:
    return {"iteration": it, "objective": J, "gap": gap, "eta": eta,
            "kernel": src.describe(key) if key is not None else None}


def _away_atom(src, weights: _Weights, alpha, q_all):
    """(key, q, weight) of the away atom: the active vertex of Delta_1 with the LARGEST gradient
    -q_i / 2, i.e. the smallest q_i = alpha*^T K_i alpha* (the vertex 0, key None, q = 0, weight
    1 - sum theta, when it carries weight); None when theta is a single vertex (no away direction)."""
    active = [k for k in weights.keys if weights.values[k] > 0.0]
    atoms = []
    rest = 1.0 - sum(weights.values[k] for k in active)
    if rest > 1e-12:
        atoms.append((None, 0.0, rest))
    for k in active:
        q = float(q_all[k]) if src.finite else float(alpha @ src.block(k) @ alpha)
        atoms.append((k, q, weights.values[k]))
    if len(atoms) < 2:
        return None
    v = min(atoms, key=lambda a: a[1])
    return v if v[2] < 1.0 - 1e-12 else None


# ---- GCD-2s --------------------------------------------------------------------------------------------
@single_blas_thread_for_small_n
def fit_two_stage(source, y, criterion: str = "alignment", task: str = "auto", lam: float = 1.0, C: float = 1.0,
                  max_iter: int = 50, delta: float = 1e-3, eps: float = 1e-6, eta_max: float = 1.0,
                  beta: float | None = None, step: str = "exact", tol: float = 1e-6, reg: float = 0.0,
                  verbose: bool = False, checkpoint=None, sample_weight=None) -> MKLResult:
    """GCD-2s: Algorithm 7 (criterion="alignment") or Algorithm 8 (criterion="euclidean"), then the final
    fit (kernel ridge with ridge ``lam`` for regression, SVM with ``C`` for classification).

    ``objective`` is the centred alignment of the learned kernel sum_i w_i K_i; ``params["alignment"]`` too.
    ``checkpoint``: None or a :class:`mklscale.runtime.checkpoint.Checkpoint` for the greedy loop (module
    docstring; the caller clears it after storing the result).
    """
    src = as_source(source)
    criterion = check_choice("criterion", criterion, ("alignment", "euclidean"))
    step = check_choice("step", step, ("exact", "thesis"))
    task, y = resolve_task(task, y)
    y = check_targets(y, src.n, classification=False, loss_name="squared")
    _final_fit.check_task(task, y)
    lam, C = check_positive("lam", lam), check_positive("C", C)
    max_iter = check_count("max_iter", max_iter)
    yc = y - y.mean()
    if not np.any(yc):
        raise InvalidInputError("y is constant: the centred ideal kernel is zero and alignment is undefined")
    run = _Run(src, checkpoint, f"gcd-2s/{criterion}", verbose)
    kernels = src.choose(_MatrixKernels, _FactorKernels)(src)
    if criterion == "alignment":
        weights, converged, extra = _fsam(kernels, yc, max_iter, check_positive("delta", delta, allow_zero=True),
                                          check_positive("eps", eps), check_positive("eta_max", eta_max), reg, run)
    else:
        weights, converged, extra = _euclidean(kernels, yc, max_iter, beta, step, check_positive("tol", tol), reg, run)
    history = run.history
    w, fam = weights.as_result_arrays(src)
    if criterion == "euclidean" and w.sum() > 0:
        w = w / w.sum()
    K = _combine(src, weights, w)
    c, b = _final_fit.final_fit(K, y, task, lam, C, sample_weight)   # the kernel weights are unweighted
    align = _final_fit.centred_alignment(K, y)
    return MKLResult(weights=w, dual_coef=c, bias=b, active=np.flatnonzero(w), objective=align,
                     gap=extra.pop("gap", np.nan), history=history, converged=converged,
                     solver=f"gcd-2s/{criterion}",
                     params={"criterion": criterion, "task": task, "lam": lam, "C": C, "max_iter": max_iter,
                             "alignment": align, "iterations": len(history), **extra, **fam})


def _combine(src, weights: _Weights, w: np.ndarray):
    if src.finite:
        return _final_fit.combined_kernel(src.engine, w)
    kept = [k for k in weights.keys if weights.values[k] != 0.0]
    return sum(wi * src.block(k) for wi, k in zip(w, kept)) if kept else np.zeros((src.n, src.n))


def _argmax(src, A, reg):
    if src.finite:
        key, val, _ = src.argmax_frobenius(A)
    else:
        key, val, _ = src.argmax_frobenius(A, reg=reg)
    return key, val


#: a kernel whose centred Gram matrix has ||C_n K C_n||_F <= CONSTANT_RTOL ||K||_F is constant over the
#: training points (up to rounding): it has no centred alignment and no two-stage step along it exists
CONSTANT_RTOL = 1e-10


def _centred_block(src, key, criterion: str, first: bool) -> np.ndarray | None:
    """C_n K_key C_n of the kernel a greedy two-stage step selected, or None if that is zero (a constant
    kernel); InvalidInputError instead when the learned kernel is still zero (``first``: the step that must
    start the combination).

    The two-stage criteria are defined on centred kernels (Section 5.3): a constant kernel (K = c 1 1^T,
    e.g. a Gaussian of a constant feature or of a huge width) has K_c = 0, so its alignment is 0/0 and
    Algorithm 7's F(eta K_c) / Algorithm 8's scale <K_I, R>/||K_I,c||^2 are undefined. The greedy step
    selects one only when no kernel scores higher. At a later step that only means no kernel improves the
    criterion (Algorithm 7: the step is 0; Algorithm 8: the Frank-Wolfe vertex is theta = 0); at the first
    step the whole fit is undefined.
    For a finite bank the message lists every constant kernel (tr(C_n K C_n) = <K, C_n>, zero for a
    PSD kernel iff C_n K C_n = 0: two frobenius passes, on this error path only).
    """
    K = src.block(key)
    Kc = centre(K)
    norm, norm_c = float(np.linalg.norm(K)), float(np.linalg.norm(Kc))
    if norm_c > CONSTANT_RTOL * norm:
        return Kc
    if not first:
        return None
    what = f"kernel {src.describe(key)}"
    if src.finite:
        n = src.n
        tr_c = src.frobenius(np.eye(n) - np.full((n, n), 1.0 / n))
        tr = src.frobenius(np.eye(n))
        const = np.flatnonzero(np.abs(tr_c) <= CONSTANT_RTOL * np.abs(tr))
        listed = ", ".join(str(int(m)) for m in const[:20]) + (", ..." if const.size > 20 else "")
        what += f"; {const.size} of the {src.M} kernels are constant (indices {listed})"
    raise InvalidInputError(
        f"gcd.fit_two_stage(criterion={criterion!r}): the greedy step selected a kernel that is constant over "
        f"the training points ({what}): its centred Gram matrix C_n K C_n is zero (||C_n K C_n||_F = {norm_c:.3g}, "
        f"||K||_F = {norm:.3g}), so its centred alignment with y is undefined; the first step selects it only "
        "when no kernel of the bank scores higher. Remove the constant kernels from the bank (or build them "
        "with widths / features that vary over the data), or fit the one-stage solver (stage='one'), which "
        "handles them (its intercept-only model).")


# ---- the greedy loops' kernel algebra, in the form the source combines its kernels ----------------------
# GCD-1s and Algorithms 7 and 8 are written once over the few operations they need on Gram matrices:
# quadratic forms y^T K y, squared norms ||K||_F^2, Frobenius products <K, L>, the greedy scores <K_i, A>
# over the bank for A = y_c y_c^T - coef K, and the updates of the combined kernel. ``_MatrixKernels`` does
# them on (n, n) matrices, ``_FactorKernels`` on LowRank factors: <F F^T, G G^T> = ||F^T G||_F^2,
# y^T F F^T y = ||F^T y||^2, and the scores are ONE quad_forms pass over the rows [y_c; F_c^T]; O(n R^2)
# per step. ``src.choose`` picks one (the engine's kernel representation decides: factors on a factor
# engine above the dense cap, issue 17; matrices for dense banks and kernel families).


class _MatrixKernels:
    """Gram-matrix operations of the two-stage loops on (n, n) matrices. The learned kernel is updated
    step by step (K + eta K', (1 - eta) K + eta beta K_c); checkpoints keep an exact copy of it (module
    docstring)."""

    def __init__(self, src):
        self.src, self.n = src, src.n

    # GCD-1s: K_theta updated step by step; a checkpoint keeps an exact copy
    def combination(self, weights: _Weights) -> np.ndarray:
        """sum_k w_k K_k, added from zero in selection order."""
        K = np.zeros((self.n, self.n))
        for k in weights.keys:
            K += weights.values[k] * self.src.block(k)
        return K

    def restore_combination(self, saved: dict, weights: _Weights) -> np.ndarray:
        return saved["K"]

    def vertex(self, key) -> np.ndarray:
        return self.src.block(key)

    def fw_step(self, K, eta: float, K_new, weights: _Weights) -> np.ndarray:
        """(1 - eta) K_theta + eta K_I."""
        return (1.0 - eta) * K + eta * K_new

    def away_end(self, K, weights: _Weights, v, g_max: float):
        """(K at gamma = g_max, K_v): (1 + g_max) K_theta - g_max K_v (K_v = 0 for the vertex 0, v None)."""
        K_v = self.src.block(v) if v is not None else np.zeros((self.n, self.n))
        return (1.0 + g_max) * K - g_max * K_v, K_v

    def away_step(self, K, K_end, K_v, gamma: float, drop: bool, weights: _Weights) -> np.ndarray:
        """(1 + gamma) K_theta - gamma K_v (the end itself for a drop step)."""
        return K_end if drop else (1.0 + gamma) * K - gamma * K_v

    # Algorithms 7 and 8
    def zero(self) -> np.ndarray:
        return np.zeros((self.n, self.n))

    def restore(self, saved: dict, weights: _Weights, beta: float | None = 1.0) -> np.ndarray:
        return saved["K"]

    def state(self, K, **scalars) -> dict:
        return {"K": K, **scalars}

    def is_zero(self, K) -> bool:
        return not np.any(K)

    def quad(self, K, v) -> float:
        return float(v @ K @ v)

    def frob2(self, K) -> float:
        return float(np.sum(K * K))

    def inner(self, K, L) -> float:
        return float(np.sum(K * L))

    def argmax(self, yc, K, coef: float, scale: float, reg: float):
        """(key, value) of max_i <K_i, scale (y_c y_c^T - coef K)> (``scale`` matters only to a
        family's width regulariser ``reg``)."""
        return _argmax(self.src, scale * (np.outer(yc, yc) - coef * K), reg)

    def first_argmax(self, yc, scale: float, reg: float):
        """``argmax`` at K^0 = eps I: C_n F'(eps I) C_n = scale (y_c y_c^T - (||y_c||^2 / n) H)."""
        H = np.eye(self.n) - 1.0 / self.n
        return self.argmax(yc, H, float(yc @ yc) / self.n, scale, reg)

    def centred_block(self, key, criterion: str, first: bool):
        return _centred_block(self.src, key, criterion, first)

    def objective(self, K, yc) -> float:
        """Algorithm 8's J = ||K*_c - K||_F^2 / (2 n^2), formed (no cancellation near a perfect fit)."""
        R = np.outer(yc, yc) - K
        return 0.5 * float(np.sum(R * R)) / self.n**2

    def line_search(self, K, Kc, beta: float, yc) -> tuple[float, float]:
        """(<R, D>, ||D||^2) for R = K*_c - K and the direction D = beta K_c - K (D = -K when Kc is None)."""
        D = beta * Kc - K if Kc is not None else -K
        return float(np.sum((np.outer(yc, yc) - K) * D)), float(np.sum(D * D))

    def add(self, K, eta: float, Kp, weights: _Weights):
        """Algorithm 7's K + eta K' (K' None: a constant kernel, no step)."""
        return K + eta * Kp if Kp is not None else K

    def convex_step(self, K, eta: float, Kc, beta: float, weights: _Weights):
        """Algorithm 8's (1 - eta) K + eta beta K_c (Kc None: the vertex theta = 0)."""
        return (1.0 - eta) * K + eta * beta * Kc if Kc is not None else (1.0 - eta) * K


class _FactorKernels:
    """The same operations on LowRank factors. The learned kernel is recombined from the weights after
    each step, K = beta H (sum_k w_k L_k L_k^T) H (deterministic, so a resume needs only the weights)."""

    def __init__(self, src):
        self.src, self.n = src, src.n
        self.factors = _Factors(src)

    # GCD-1s: K_theta recombined from the weights (deterministic: a checkpoint keeps the weights only)
    def combination(self, weights: _Weights) -> LowRank:
        return self.factors.combine(weights.values)

    def restore_combination(self, saved: dict, weights: _Weights) -> LowRank:
        return self.factors.combine(weights.values)

    def vertex(self, key) -> LowRank:
        return self.factors.single(key)

    def fw_step(self, K, eta: float, K_new, weights: _Weights) -> LowRank:
        return self.factors.combine(weights.values)

    def away_end(self, K, weights: _Weights, v, g_max: float):
        return self.factors.combine({k: 0.0 if k == v else (1.0 + g_max) * w for k, w in weights.values.items()}), None

    def away_step(self, K, K_end, K_v, gamma: float, drop: bool, weights: _Weights) -> LowRank:
        return self.factors.combine(weights.values)

    # Algorithms 7 and 8
    def learned(self, weights: _Weights, beta: float | None = 1.0) -> LowRank:
        if not beta:
            return LowRank(np.zeros((self.n, 0)))
        return LowRank(np.sqrt(beta) * self.factors.combine(weights.values).centred().F)

    def zero(self) -> LowRank:
        return LowRank(np.zeros((self.n, 0)))

    def restore(self, saved: dict, weights: _Weights, beta: float | None = 1.0) -> LowRank:
        return self.learned(weights, beta)

    def state(self, K, **scalars) -> dict:
        return {"K": np.zeros((0, 0)), **scalars}

    def is_zero(self, K) -> bool:
        return K.rank == 0

    def quad(self, K, v) -> float:
        return K.quad(v)

    def frob2(self, K) -> float:
        return K.frobenius_norm() ** 2

    def inner(self, K, L) -> float:
        return frob_inner(K.F, L.F)

    def argmax(self, yc, K, coef: float, scale: float, reg: float):
        """<K_i, y_c y_c^T - coef K> = y_c^T K_i y_c - coef sum_j F[:, j]^T K_i F[:, j]: one pass."""
        if K.rank == 0:
            values = self.src.quad_forms(yc)
        else:
            q = np.asarray(self.src.engine.quad_forms(np.vstack([yc, K.F.T])), dtype=np.float64)
            values = q[:, 0] - coef * q[:, 1:].sum(axis=1)
        key = int(np.argmax(values))
        return key, float(values[key])

    def first_argmax(self, yc, scale: float, reg: float):
        """<K_i, y_c y_c^T - (||y_c||^2 / n) H>, <K_i, H> = tr(K_i) - 1^T K_i 1 / n."""
        tr_c = np.asarray(self.src.engine.traces, dtype=np.float64) - self.src.quad_forms(np.ones(self.n)) / self.n
        values = self.src.quad_forms(yc) - (float(yc @ yc) / self.n) * tr_c
        key = int(np.argmax(values))
        return key, float(values[key])

    def centred_block(self, key, criterion: str, first: bool):
        return _centred_factor(self.src, self.factors, key, criterion, first)

    def objective(self, K, yc) -> float:
        return 0.5 * (float(yc @ yc) ** 2 - 2.0 * K.quad(yc) + K.frobenius_norm() ** 2) / self.n**2

    def line_search(self, K, Kc, beta: float, yc) -> tuple[float, float]:
        yKy, KK = K.quad(yc), K.frobenius_norm() ** 2
        if Kc is None:
            return KK - yKy, KK
        dK = frob_inner(Kc.F, K.F) if K.rank else 0.0
        cc = Kc.frobenius_norm() ** 2
        return beta * Kc.quad(yc) - beta * dK - yKy + KK, beta * beta * cc - 2.0 * beta * dK + KK

    def add(self, K, eta: float, Kp, weights: _Weights) -> LowRank:
        return self.learned(weights)

    def convex_step(self, K, eta: float, Kc, beta: float, weights: _Weights) -> LowRank:
        return self.learned(weights, beta)


def _centred_factor(src, factors: _Factors, key, criterion: str, first: bool) -> LowRank | None:
    """``_centred_block`` on factors: H L_key centred, None for a constant kernel (InvalidInputError
    at the first step, naming the constant kernels: tr(H K_m H) = tr(K_m) - 1^T K_m 1 / n, one pass)."""
    K = factors.single(key)
    Kc = K.centred()
    norm, norm_c = K.frobenius_norm(), Kc.frobenius_norm()
    if norm_c > CONSTANT_RTOL * norm:
        return Kc
    if not first:
        return None
    tr = np.asarray(src.engine.traces, dtype=np.float64)
    tr_c = tr - src.quad_forms(np.ones(src.n)) / src.n
    const = np.flatnonzero(np.abs(tr_c) <= CONSTANT_RTOL * np.abs(tr))
    listed = ", ".join(str(int(m)) for m in const[:20]) + (", ..." if const.size > 20 else "")
    raise InvalidInputError(
        f"gcd.fit_two_stage(criterion={criterion!r}): the greedy step selected a kernel that is constant over "
        f"the training points (kernel {src.describe(key)}; {const.size} of the {src.M} kernels are constant, "
        f"indices {listed}): its centred Gram matrix is zero, so its centred alignment with y is undefined. "
        "Remove the constant kernels from the bank, or fit the one-stage solver (stage='one').")


def _fsam(kernels, yc, T, delta, eps, eta_max, reg, run: _Run):
    """Algorithm 7 with the closed-form step of Prop. 5.4: with a = y_c^T K y_c, b = y_c^T K' y_c,
    c = ||K||^2, d = <K, K'>, e = ||K'||^2, F(K + h K') = (a + h b) / (sqrt(c + 2 h d + h^2 e) ||y_c||^2)."""
    src, n = kernels.src, kernels.n
    star_norm = float(yc @ yc)                      # ||y_c y_c^T||_F
    saved = run.load()
    if saved is None:
        weights, first = _Weights(), 1
        K = kernels.zero()
        F_old = 1.0 / np.sqrt(n)                    # F(eps I) = eps ||y_c||^2 / (eps sqrt(n) ||y_c||^2)
    else:
        weights, F_old, first = _Weights.from_state(saved, src), float(saved["F_old"]), saved["iteration"] + 1
        K = kernels.restore(saved, weights)
    converged = False
    for it in range(first, T + 1):
        run.step(it - 1, weights, functools.partial(kernels.state, K, F_old=F_old))
        if it == 1:
            # K^0 = eps I only defines the first direction: F(h K') is the same for every h > 0, and the
            # printed rule would pick eta* ~ eps, keeping eps I as a hidden component (module docstring)
            key, _ = kernels.first_argmax(yc, 1.0 / (eps * np.sqrt(n) * star_norm), reg)
            a = c = 0.0
        else:
            a, c = kernels.quad(K, yc), kernels.frob2(K)
            key, _ = kernels.argmax(yc, K, a / c, 1.0 / (np.sqrt(c) * star_norm), reg)   # C_n F'(K) C_n
        Kp = kernels.centred_block(key, "alignment", first=it == 1)
        b = kernels.quad(Kp, yc) if Kp is not None else 0.0
        e = kernels.frob2(Kp) if Kp is not None else 0.0
        d = kernels.inner(K, Kp) if it > 1 and Kp is not None else 0.0
        denom = b * d - a * e
        eta_star = max(0.0, (a * d - b * c) / denom) if denom != 0 else 0.0

        def F(h):
            sq = c + 2.0 * h * d + h * h * e
            return (a + h * b) / (np.sqrt(sq) * star_norm) if sq > 0 else 0.0

        if it == 1:
            eta_star, candidates = eta_max, [eta_max]
        else:
            candidates = [0.0, min(eta_star, eta_max), eta_max]
        values = [F(h) for h in candidates]
        eta = candidates[int(np.argmax(values))]
        weights.add(key, eta)
        K = kernels.add(K, eta, Kp, weights)
        F_new = max(values)
        run.append({"iteration": it, "alignment": F_new, "objective": F_new, "eta": eta, "eta_star": eta_star,
                    "kernel": src.describe(key)}, f"it {it:3d} F={F_new:.6f} eta={eta:.4f} key={src.describe(key)}")
        if it > 1 and F_new <= F_old + delta:   # K^0 is not part of the model: no test at k = 1
            converged = True
            break
        F_old = F_new
    return weights, converged, {"delta": delta, "eps": eps, "eta_max": eta_max, "gap": np.nan}


def _euclidean(kernels, yc, T, beta, step, tol, reg, run: _Run):
    """Algorithm 8 (Frank-Wolfe on (5.9)) with the exact convex-combination step (erratum above)."""
    src, n = kernels.src, kernels.n
    auto_beta = beta is None
    converged = False
    saved = run.load()
    if saved is None:
        weights, gap, first = _Weights(), np.nan, 1
        K = kernels.zero()                          # beta * sum theta_i K_{i,c}, centred
    else:
        weights = _Weights.from_state(saved, src)
        beta, gap, first = saved["beta"], float(saved["gap"]), saved["iteration"] + 1
        K = kernels.restore(saved, weights, beta)
    J = kernels.objective(K, yc)
    for it in range(first, T + 1):
        run.step(it - 1, weights, functools.partial(kernels.state, K, beta=beta, gap=gap))
        key, val = kernels.argmax(yc, K, 1.0, 1.0, reg)    # <K_i, R>, R = K*_c - K (= <K_{i,c}, R>: R centred)
        J = kernels.objective(K, yc)
        gap = (kernels.frob2(K) - kernels.quad(K, yc) + max(val, 0.0) * (beta or 0.0)) / n**2   # <K, -R> + ...
        if val <= 0 and kernels.is_zero(K):
            kernels.centred_block(key, "euclidean", first=True)    # theta = 0 is optimal: say so if constant kernels
        # the gap is a certificate once beta is set; at K = 0 with val <= 0 it is exactly 0 (theta = 0 optimal)
        if (beta is not None or val <= 0) and duality.relative_gap(J, J - gap) <= tol:
            converged = True
            run.append({"iteration": it, "objective": J, "gap": gap, "eta": 0.0, "kernel": src.describe(key)})
            break
        Kc = kernels.centred_block(key, "euclidean", first=kernels.is_zero(K)) if val > 0 else None
        if Kc is None:
            val = 0.0                               # (a constant kernel scored > 0 by rounding only)
        if val <= 0 and step == "thesis":          # the printed stopping rule; converged only if gap <= tol
            run.append({"iteration": it, "objective": J, "gap": gap, "eta": 0.0, "kernel": src.describe(key)})
            break
        if val > 0 and beta is None:
            beta = 2.0 * val / kernels.frob2(Kc)
        # no kernel positively aligned with R: the Frank-Wolfe vertex is theta = 0 (direction -K)
        if step == "exact":
            num, den = kernels.line_search(K, Kc, beta, yc)
            eta = min(1.0, max(0.0, num / den))
        else:
            eta = min(1.0, val / (beta * kernels.frob2(Kc)))
        weights.scale(1.0 - eta)
        if val > 0:
            weights.add(key, eta)
        K = kernels.convex_step(K, eta, Kc, beta, weights)
        if auto_beta and sum(weights.values.values()) > 0.5:
            beta *= 2.0                             # K = beta theta is unchanged
            weights.scale(0.5)
        J = kernels.objective(K, yc)
        run.append({"iteration": it, "objective": J, "gap": gap, "eta": eta, "beta": beta,
                    "kernel": src.describe(key) if val > 0 else None},
                   f"it {it:3d} J={J:.8g} eta={eta:.4f} beta={beta:.4g} key={src.describe(key)}")
    # the returned weights are beta * theta (normalised to sum one by the caller)
    weights.scale(beta if beta else 1.0)
    return weights, converged, {"beta": beta, "step": step, "tol": tol,
                                "gap": duality.relative_gap(J, J - gap) if np.isfinite(gap) else np.nan}
