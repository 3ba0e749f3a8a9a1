"""One table of the MKL solvers: name -> adapter, supported tasks, accepted parameters, and what ``C`` means.

Every adapter has the signature ``fit(engine, y, task, C, params) -> MKLResult`` and returns a model
f(x) = sum_m weights[m] k_m(x, X_train) dual_coef + bias. ``task`` is "classification" (y in {-1, +1},
both present; the prediction is sign f) or "regression" (real y).

How the estimators' single ``C`` maps onto each solver (defaults assume unit-trace kernels,
``normalize="trace"``, and targets of unit scale; tune C by cross-validation):

============  =====================  ==============================  =======================================
solver        tasks                  ``C`` sets                      direction, default
============  =====================  ==============================  =======================================
spicy         classif., regression   spicy ``C`` (penalty weight)    larger = sparser / smoother, 0.1
citi          classification         Citi SVM ``C`` (loss weight)    larger = less regularised, 100
smo           classification         SMO-MKL SVM ``C`` (loss wt.)    larger = less regularised, 100
pfbs          classif., regression   PFBS ``tau`` (group-L1 weight)  larger = sparser, 1e-3
sgd           classif., regression   SGD-1s ridge ``lam``            larger = more regularised, 0.01
gcd           classif., regression   one stage: ridge ``lam``;       larger lam = more regularised, 0.01;
                                     two stage: ``C`` (classif.) /   larger C = less regularised, 100
                                     ``lam`` (regression) of the
                                     final fit
uniform       classif., regression   final-fit ``C`` (classif., SVM) larger C = less regularised, 100;
alignment,                           / ``lam`` (regression, ridge)   larger lam = more regularised, 0.01
fheuristic
easymkl       classification         EasyMKL ``lam`` in (0, 1]       larger = more regularised (1: centroid
                                                                     distance), 0.1 (MKLpy's default)
============  =====================  ==============================  =======================================

The square-loss solvers (pfbs, sgd, gcd one stage) classify by least squares on the +-1 labels
(RLS classification) and have no probability model. Only spicy with ``loss="logistic"`` (its default
for classification) gives calibrated-style probabilities sigmoid(f).

Parameters other than the mapped one go in ``params`` (the solver's keyword arguments, listed by
:func:`accepted_params`: read from the signatures of the solver's functions, minus the arguments
no caller sets by name (``NOT_PARAMETERS``), so a parameter a solver gains is accepted everywhere at
once); unknown names raise :class:`~mklscale.errors.InvalidInputError` listing the
accepted ones. The mapped parameter may also be given in ``params`` when ``C`` is None (the pipeline
runner does that), but not both. ``seed`` (where a solver has one) is the solver's random seed.

This module imports no estimator code, so the pipeline runner can use it directly:
``fit_solver(name, engine, y, task, C=None, params=None, checkpoint=None)``, ``names()``,
``supports(name, task)``, ``checkpoints(name)``, ``accepted_params(name)``, ``limit_params(name)``,
``convergence_advice(name, task, used)`` (the "what to change" of an unconverged run),
``c_parameter(name, task, params)``, ``c_names(name)``, ``default_C(name, task, params)``.

Checkpoints: ``fit_solver(..., checkpoint=Checkpoint(path, fingerprint, ...))``
(:mod:`mklscale.runtime.checkpoint`) is passed to the solvers whose row has ``checkpoints=True``
(spicy, pfbs, smo, sgd, gcd): they resume from a saved state, save as they go and raise ``Preempted``
on SIGTERM/SIGINT inside ``stop_on_signals()``. The others (citi, uniform, alignment, fheuristic,
easymkl: one-shot or short) ignore it and run from the start. The caller chooses the fingerprint: it must
identify the problem (solver name, task, the mapped C value and every parameter including the seed, the
bank and the targets), so that a checkpoint of another problem is refused; and the caller clears the
checkpoint after storing the result (the solvers leave it in place).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mklscale.errors import InvalidInputError
from mklscale.solvers.result import MKLResult

TASKS = ("classification", "regression")
#: the value of ``C`` that asks for the automatic regularisation (:func:`resolve_C`)
AUTO = "auto"

#: arguments of the solvers' functions that are not user parameters: the bank, the targets, the task
#: (the registry's), the checkpoint (fit_solver's) and pfbs' raw-coefficient switch (fit_solver
#: returns an MKLResult)
NOT_PARAMETERS = frozenset({"engine", "source", "y", "task", "checkpoint", "return_coefficients", "init",
                            "sample_weight"})

#: the losses of spicy that fit each task (the first one is the default)
SPICY_LOSSES = {"classification": ("logistic", "hinge"), "regression": ("square", "eps_insensitive")}


@dataclass(frozen=True)
class Regularisation:
    """What the estimators' ``C`` means for one solver on one task: the only place that says it.

    name : the solver parameter ``C`` sets (C, tau or lam);
    larger_regularises : whether a larger value gives a simpler model (sparser, smoother, more shrunk);
    zero_ok : whether 0 is a valid value (pfbs' tau = 0 is the ridge end of its path), else > 0;
    scale(engine, heads, task, params) -> s, the problem's scale, at most one pass over the bank
        (``heads``: the +-1 or real targets of every head the value is for);
    scale_text : what s is, for messages and the CV record;
    default : ``C = "auto"`` (and None) means ``default * s``;
    span : the "auto" grid runs geometrically from ``span[0] * s`` (the most regularised end, where
        a warm-started path starts) to ``span[1] * s``.
    """

    name: str
    larger_regularises: bool
    scale: Callable[..., float]
    scale_text: str
    default: float
    span: tuple[float, float]
    zero_ok: bool = False

    def auto(self, engine, heads, task: str, params: dict) -> float:
        """The value "auto" stands for on this bank and these targets."""
        return self.default * float(self.scale(engine, heads, task, params))

    def grid(self, engine, heads, task: str, params: dict, n_values: int = 10) -> tuple[list[float], str]:
        """(values from the most to the least regularised, rule text): the "auto" grid, 3 significant digits."""
        s = float(self.scale(engine, heads, task, params))
        values = np.geomspace(self.span[0] * s, self.span[1] * s, int(n_values)) if n_values > 1 else \
            np.array([self.default * s])
        values = list(dict.fromkeys(float(f"{v:.3g}") for v in values))
        rule = (f"{len(values)} values from {self.span[0]:g} to {self.span[1]:g} x {self.scale_text}, "
                f"{self.scale_text} = {s:.4g}")
        return values, rule

    def check(self, value, solver: str) -> str | None:
        """None when ``value`` is a valid setting, else what is wrong with it."""
        ok = (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
              and np.isfinite(value) and (value >= 0 if self.zero_ok else value > 0))
        if ok:
            return None
        return (f"C = {value!r} is not a valid regularisation for solver {solver!r} (it sets {self.name}); pass a "
                f"finite number {'>= 0' if self.zero_ok else '> 0'}, or C=\"auto\" ({self.default:g} x "
                f"{self.scale_text})")

    def order(self, values) -> list[float]:
        """``values`` sorted from the most to the least regularised (the order a warm-started path takes)."""
        return sorted({float(v) for v in values}, reverse=self.larger_regularises)


@dataclass(frozen=True)
class SolverInfo:
    """One row of the table.

    name : registry name; tasks : supported tasks; functions : the solver functions ("module:function"
    in mklscale.solvers) whose keyword parameters it accepts (:attr:`params`, plus ``extra``, minus
    NOT_PARAMETERS; ``accepted_params`` adds the names C may stand for);
    regularisation(task, params) -> :class:`Regularisation`, what ``C`` means on ``task``;
    run(engine, y, task, c_value, params) -> MKLResult (params already checked);
    seed_param : the parameter holding the solver's random seed, or None; summary : one line;
    checkpoints : whether ``run`` takes ``checkpoint=`` (resumable solves, module docstring);
    variants : parameter settings that change what ``C`` sets (gcd's stage), for :func:`c_names`;
    warm_starts : whether ``run`` takes ``init=`` (an MKLResult of the same problem at another C, to
    start from: :func:`fit_path`);
    sample_weights : whether ``run`` takes ``sample_weight=`` (per-sample weights of the final fit's loss:
    libsvm's per-sample C, or the weighted kernel ridge).
    """

    name: str
    tasks: tuple[str, ...]
    functions: tuple[str, ...]
    regularisation: Callable[[str, dict], Regularisation]
    run: Callable[..., MKLResult]
    seed_param: str | None
    summary: str
    checkpoints: bool = False
    extra: tuple[str, ...] = ()
    warm_starts: bool = False
    variants: tuple[dict, ...] = ({},)
    sample_weights: bool = False

    @property
    def params(self) -> tuple[str, ...]:
        """The keyword parameters of ``functions`` (in order, without repeats) and ``extra``."""
        return _signature_params(self.functions, self.extra)


@functools.cache
def _signature_params(functions: tuple[str, ...], extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    names = list(extra)
    for target in functions:
        module, function = target.split(":")
        fn = getattr(importlib.import_module(f"mklscale.solvers.{module}"), function)
        names += [p for p in inspect.signature(fn).parameters if p not in NOT_PARAMETERS and p not in names]
    return tuple(names)


# ---- adapters ------------------------------------------------------------------------------------
def _run_spicy(engine, y, task, C, params, checkpoint=None, init=None):
    from mklscale.solvers import spicy

    params = dict(params)
    params.setdefault("loss", SPICY_LOSSES[task][0])
    _check_spicy(task, params)
    return spicy.fit(engine, y, C=C, checkpoint=checkpoint, init=init, **params)


def _check_spicy(task: str, params: dict) -> None:
    from mklscale.solvers.losses import make_loss
    from mklscale.solvers.penalties import make_penalty

    loss = params.get("loss", SPICY_LOSSES[task][0])
    if loss not in SPICY_LOSSES[task]:
        raise InvalidInputError(f"spicy loss {loss!r} does not fit task {task!r}; use one of {SPICY_LOSSES[task]}")
    # the loss and penalty objects check eps, lam and q: fail here, before a bank is built
    make_loss(loss, params.get("eps", 0.1))
    make_penalty(params.get("penalty", "l1"), params.get("lam", 0.5), params.get("q", 1.5))


def _run_citi(engine, y, task, C, params, init=None):
    from mklscale.solvers import citi

    params = dict(params)
    params.setdefault("eta", 0.5)
    return citi.fit(engine, y, C=C, init=init, **params)


def _run_smo(engine, y, task, C, params, checkpoint=None, init=None):
    from mklscale.solvers import smo

    return smo.fit(engine, y, C=C, checkpoint=checkpoint, init=init, **params)


def _run_pfbs(engine, y, task, C, params, checkpoint=None, init=None):
    from mklscale.solvers import pfbs

    params = dict(params)
    params.setdefault("mu", 0.0)
    params.setdefault("center", True)
    return pfbs.fit(engine, y, tau=C, checkpoint=checkpoint, init=init, **params)


def _run_sgd(engine, y, task, C, params, checkpoint=None):
    from mklscale.solvers import sgd

    return sgd.fit(engine, y, lam=C, checkpoint=checkpoint, **params)


def _run_gcd(engine, y, task, C, params, checkpoint=None, init=None, sample_weight=None):
    from mklscale.solvers import gcd

    _check_gcd(task, params)
    params = dict(params)
    if params.pop("stage", "one") == "one":
        return gcd.fit_one_stage(engine, y, lam=C, checkpoint=checkpoint, init=init, **params)
    key = _final_fit_param(task, params)
    params[key] = C
    return gcd.fit_two_stage(engine, y, task=task, checkpoint=checkpoint, sample_weight=sample_weight, **params)


def _check_gcd(task: str, params: dict) -> None:
    stage = params.get("stage", "one")
    if stage not in ("one", "two"):
        raise InvalidInputError(f"gcd stage must be 'one' (GCD-1s) or 'two' (GCD-2s); got {stage!r}")
    one_stage = _signature_params(("gcd:fit_one_stage",))
    extra = sorted(set(params) - {"stage", "lam"} - set(one_stage)) if stage == "one" else []
    if extra:
        raise InvalidInputError(f"gcd stage='one' does not take {extra}; they belong to stage='two' "
                                f"(one-stage parameters: {sorted(one_stage)})")


def _run_baseline(fn_name, module="baselines"):
    """Adapter of a weights-then-final-fit solver ``mklscale.solvers.<module>.<fn_name>(engine, y, task, lam, C)``."""
    def run(engine, y, task, C, params, sample_weight=None, init=None):
        import importlib

        from mklscale.solvers import baselines

        params = dict(params)
        params[_final_fit_param(task, params)] = C
        if init is not None:   # the weights do not depend on C / lam: only the final fit is redone
            return baselines.refit(engine, y, task, params.get("lam", 1.0), params.get("C", 1.0), init, sample_weight)
        return getattr(importlib.import_module(f"mklscale.solvers.{module}"), fn_name)(
            engine, y, task=task, sample_weight=sample_weight, **params)

    return run


def _run_easymkl(engine, y, task, C, params):
    from mklscale.solvers import easymkl

    return easymkl.fit(engine, y, lam=C, **params)


def _final_fit_param(task: str, params: dict) -> str:
    return "C" if task == "classification" else "lam"


# ---- what C means: the scales of the problem and one Regularisation per solver and task ---------
def _svm_scale(engine, heads, task, params) -> float:
    """n / mean(tr K_m): an SVM constant c on kernels of unit mean diagonal is C = c * scale (on unit-trace
    kernels C = c * n; c = 1 is scikit-learn's SVC default on a unit-diagonal kernel)."""
    return float(engine.n) / float(np.mean(engine.traces))


def _ridge_scale(engine, heads, task, params) -> float:
    """mean(tr K_m) / n, the mean eigenvalue: a ridge r on kernels of unit mean diagonal is lam = r * scale
    (r = 1 is scikit-learn's KernelRidge default alpha on a unit-diagonal kernel)."""
    return float(np.mean(engine.traces)) / float(engine.n)


def _unit_scale(engine, heads, task, params) -> float:
    return 1.0


def _spicy_scale(engine, heads, task, params) -> float:
    """C_max of spicy (``spicy.c_max``) over the heads: the smallest C whose model keeps no kernel."""
    from mklscale.solvers import spicy

    loss = params.get("loss", SPICY_LOSSES[task][0])
    return max(spicy.c_max(engine, y, loss=loss, penalty=params.get("penalty", "l1"), lam=params.get("lam", 0.5),
                           bias=params.get("bias", True)) for y in heads)


def _pfbs_scale(engine, heads, task, params) -> float:
    """tau_max of pfbs (``pfbs.tau_max``) over the heads: the smallest tau whose model keeps no kernel."""
    from mklscale.solvers import pfbs

    return max(pfbs.tau_max(engine, y, center=params.get("center", True)) for y in heads)


#: an SVM constant (smo, citi, the final SVM of the baselines and of gcd two-stage)
SVM_C = Regularisation("C", False, _svm_scale, "n / mean trace", 1.0, (1e-2, 1e2))
#: a ridge (sgd, gcd one-stage, the final kernel ridge of the baselines and of gcd two-stage)
RIDGE = Regularisation("lam", True, _ridge_scale, "mean trace / n", 1.0, (1e2, 1e-3))


def _final_fit_regularisation(task: str, params: dict) -> Regularisation:
    return SVM_C if task == "classification" else RIDGE


def _gcd_regularisation(task: str, params: dict) -> Regularisation:
    return RIDGE if params.get("stage", "one") == "one" else _final_fit_regularisation(task, params)


def _fixed(reg: Regularisation):
    return lambda task, params: reg


_TABLE: dict[str, SolverInfo] = {
    "spicy": SolverInfo("spicy", TASKS, ("spicy:fit",),
                        _fixed(Regularisation("C", True, _spicy_scale, "C_max", 0.1, (1.0, 1e-3))), _run_spicy, None,
                        "SpicyMKL (block-1 / elastic-net / block-q penalty; logistic, hinge, square, "
                        "eps-insensitive loss; default loss logistic for classification, square for regression)",
                        checkpoints=True, warm_starts=True),
    "citi": SolverInfo("citi", ("classification",), ("citi:fit",), _fixed(SVM_C), _run_citi, "seed",
                       "Citi elastic-net constrained MKL, hinge loss (eta default 0.5; eta = 1 is L1 MKL)",
                       warm_starts=True),
    "smo": SolverInfo("smo", ("classification",), ("smo:fit",), _fixed(SVM_C), _run_smo, "seed",
                      "SMO-MKL support kernel machine (squared block-1 MKL, hinge loss)", checkpoints=True,
                      warm_starts=True),
    "pfbs": SolverInfo("pfbs", TASKS, ("pfbs:fit",),
                       _fixed(Regularisation("tau", True, _pfbs_scale, "tau_max", 0.1, (1.0, 1e-3), zero_ok=True)),
                       _run_pfbs, None,
                       "PFBS elastic-net MKL, square loss (mu default 0, center default True)", checkpoints=True,
                       warm_starts=True),
    "sgd": SolverInfo("sgd", TASKS, ("sgd:fit",), _fixed(RIDGE), _run_sgd, "seed",
                      "SGD-1s one-stage MKL with importance-sampled kernels, square loss", checkpoints=True),
    "gcd": SolverInfo("gcd", TASKS, ("gcd:fit_one_stage", "gcd:fit_two_stage"),
                      _gcd_regularisation, _run_gcd, None,
                      "greedy coordinate descent MKL: stage='one' (GCD-1s/CKL, square loss, default) or "
                      "stage='two' (GCD-2s alignment/euclidean, then SVM or kernel ridge)", checkpoints=True,
                      extra=("stage",), variants=({}, {"stage": "two"}), warm_starts=True, sample_weights=True),
    "uniform": SolverInfo("uniform", TASKS, ("baselines:uniform",), _final_fit_regularisation,
                          _run_baseline("uniform"), None, "UNIFORM weights 1/M, then SVM or kernel ridge",
                          sample_weights=True, warm_starts=True),
    "alignment": SolverInfo("alignment", TASKS, ("baselines:alignment",), _final_fit_regularisation,
                            _run_baseline("alignment"), None,
                            "AMKL centred-alignment weights (Cortes et al.), then SVM or kernel ridge",
                            sample_weights=True, warm_starts=True),
    "fheuristic": SolverInfo("fheuristic", TASKS, ("fheuristic:fit",), _final_fit_regularisation,
                             _run_baseline("fit", "fheuristic"), None,
                             "FHeuristic weights ~ uncentred alignment with y y^T (Qiu & Lane; MKLpy), "
                             "then SVM or kernel ridge", sample_weights=True, warm_starts=True),
    "easymkl": SolverInfo("easymkl", ("classification",), ("easymkl:fit",),
                          _fixed(Regularisation("lam", True, _unit_scale, "1", 0.1, (1.0, 1e-3))), _run_easymkl,
                          None, "EasyMKL margin-based weights (Aiolli & Donini; MKLpy), then KOMD (default) or "
                          "SVM (learner='svm', svm_C)"),
}


#: old names still accepted: name -> registry name ("elasticnet" was Citi's module and registry name
#: before it was told apart from the elastic-net penalty of spicy and pfbs)
ALIASES = {"elasticnet": "citi"}

#: checks of parameter combinations run before any work (check_params with a task)
_PRECHECKS = {"spicy": _check_spicy, "gcd": _check_gcd}

# ---- public API ----------------------------------------------------------------------------------
def names() -> list[str]:
    """Registered solver names, in table order (aliases not included)."""
    return list(_TABLE)


def canonical(name: str) -> str:
    """The registry name of ``name`` (an alias such as "elasticnet" gives "citi")."""
    return info(name).name


def info(name: str) -> SolverInfo:
    """The table row of ``name`` or of the solver it is an alias of (ALIASES); unknown names raise
    InvalidInputError listing the known ones."""
    row = _TABLE.get(ALIASES.get(name, name)) if isinstance(name, str) else None
    if row is None:
        raise InvalidInputError(f"unknown solver {name!r}; choose one of {names()}")
    return row


def supports(name: str, task: str) -> bool:
    """Whether solver ``name`` fits ``task`` ("classification" or "regression")."""
    _check_task(task)
    return task in info(name).tasks


def checkpoints(name: str) -> bool:
    """Whether solver ``name`` uses a ``checkpoint`` given to :func:`fit_solver` (else it is ignored)."""
    return info(name).checkpoints


def accepted_params(name: str) -> tuple[str, ...]:
    """Keyword parameters the solver takes in ``params``, including the one ``C`` sets (module table)."""
    entry = info(name)
    return entry.params + tuple(c for c in c_names(name) if c not in entry.params)


def limit_params(name: str) -> tuple[str, ...]:
    """The accepted parameters that bound the work of a run: the ``max_*`` names (max_iter, max_steps,
    max_outer, max_stages, max_seconds...), except the ``max_*_set`` ones, which bound a set's size."""
    return tuple(p for p in accepted_params(name) if p.startswith("max_") and not p.endswith("_set"))


def convergence_advice(name: str, task: str, used: dict | None = None) -> str:
    """What to change after a run of ``name`` ended unconverged, from the parameters it accepts.

    ``used`` is the run's ``MKLResult.params`` (for the values in force and, where the solver records it,
    ``status``: the limit that ended the run). The text names, in this order: the limit that stopped
    the run (or every :func:`limit_params` when the status names none), ``tol`` (a looser target),
    the inner tolerances ``*_tol`` (an inexact inner solve bounds the gap from below) and the
    parameter the estimators' ``C`` sets (the problem's conditioning).
    """
    used = dict(used or {})
    accepted = accepted_params(name)
    status = used.get("status")
    limits = [status] if isinstance(status, str) and status in accepted else list(limit_params(name))

    def now(p: str) -> str:
        value = _number_text(used.get(p))
        return f"{p} (now {value})" if value else p

    steps = []
    if limits:
        steps.append("raise " + " / ".join(now(p) for p in limits))
    if "tol" in accepted:
        steps.append(f"loosen {now('tol')} if that gap is good enough")
    inner = [p for p in accepted if p.endswith("_tol")]
    if inner:
        steps.append("tighten " + " / ".join(now(p) for p in inner) + ", as inexact inner solves bound the gap")
    c_name = c_parameter(name, task, used)
    c_value = _number_text(used.get(c_name))
    change_c = f"change C (it sets {name}'s {c_name}{' = ' + c_value if c_value else ''})"
    if not steps:
        return change_c
    return f"in solver_params {', '.join(steps[:-1]) + ', or ' if len(steps) > 1 else ''}{steps[-1]}; or {change_c}"


def _number_text(value) -> str:
    """``value`` formatted with :g when it is a number (not a bool), else ""."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def regularisation(name: str, task: str, params: dict | None = None) -> Regularisation:
    """What the estimators' ``C`` means for solver ``name`` on ``task`` (its row's :class:`Regularisation`)."""
    return info(name).regularisation(task, dict(params or {}))


def c_parameter(name: str, task: str, params: dict | None = None) -> str:
    """Name of the solver parameter the estimators' ``C`` sets (e.g. "tau" for pfbs)."""
    return regularisation(name, task, params).name


def c_names(name: str) -> tuple[str, ...]:
    """Every solver parameter ``C`` can stand for (e.g. ("C", "lam") for the baselines: C for
    classification, lam for regression); which one it sets for a task is :func:`c_parameter`."""
    row = info(name)
    found = [row.regularisation(task, dict(v)).name for task in row.tasks for v in row.variants]
    return tuple(dict.fromkeys(found))


def is_auto(C) -> bool:
    """Whether ``C`` asks for the automatic value: None or "auto"."""
    return C is None or (isinstance(C, str) and C == AUTO)


def resolve_C(name: str, engine, heads, task: str, params: dict | None = None, C=AUTO) -> float:
    """The value of the regularisation ``C`` stands for: ``C`` itself when it is a number, else (None /
    "auto") the row's default times the problem's scale on ``engine`` for the targets ``heads`` (a list:
    one value for every head of a one-vs-rest fit). ``params`` may hold the value under the solver's
    own name instead (e.g. tau for pfbs), as :func:`fit_solver` accepts it."""
    params = dict(params or {})
    reg = regularisation(name, task, params)
    given = params.get(reg.name)
    if not is_auto(C):
        if given is not None:
            raise InvalidInputError(f"solver {name!r}: C and solver_params[{reg.name!r}] set the same parameter; "
                                    "give only one")
        value = C
    elif given is not None and not is_auto(given):
        value = given
    else:
        return reg.auto(engine, [np.asarray(h, dtype=np.float64) for h in heads], task, params)
    problem = reg.check(value, name)
    if problem:
        raise InvalidInputError(problem)
    return float(value)


def check_params(name: str, params: dict | None, task: str | None = None) -> dict:
    """A copy of ``params`` (None -> {}); unknown names raise InvalidInputError listing the accepted ones.

    With ``task``, also the combinations known to fail before any work is done (a spicy loss that
    does not fit the task, one-stage gcd with two-stage parameters), so callers can check settings
    before building a bank.
    """
    info(name)  # unknown solver names fail here
    if task is not None:
        _check_task(task)
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInputError(f"solver_params must be a dict or None; got {type(params).__name__}")
    accepted = accepted_params(name)
    unknown = sorted(str(p) for p in params if p not in accepted)
    if unknown:
        raise InvalidInputError(f"solver {name!r} does not take parameter(s) {unknown}; remove it or use one of "
                                f"{sorted(accepted)} (its main regularisation is best set by C)")
    if task is not None and canonical(name) in _PRECHECKS:
        _PRECHECKS[canonical(name)](task, params)
    return dict(params)


def fit_solver(name: str, engine, y, task: str, C=None, params: dict | None = None,
               checkpoint=None, init: MKLResult | None = None, sample_weight=None) -> MKLResult:
    """Run solver ``name`` (module table) on ``engine`` and targets ``y``.

    ``C`` sets the solver's main regularisation (:func:`regularisation`); None or "auto" uses the value
    in ``params`` under the solver's own name for it (e.g. ``{"tau": 0.01}`` for pfbs) or else "auto" on
    this engine and ``y`` (:func:`resolve_C`; the result's ``params`` hold the value used).
    ``checkpoint`` (a ``mklscale.runtime.checkpoint.Checkpoint`` or None) goes to the solvers with
    :func:`checkpoints` true and is ignored by the others (module docstring, "Checkpoints"). ``init``
    (an MKLResult of the same problem at another value, e.g. the previous point of a path) is where the
    solvers with ``warm_starts`` start from; the others ignore it. A warm start changes where a solve
    starts, not the problem: the result is certified to the same tolerance. ``sample_weight`` (n,) weights
    each sample's loss term in the final fit of the solvers with ``sample_weights`` (:func:`check_sample_weight`).
    """
    entry = info(name)
    _check_task(task)
    if task not in entry.tasks:
        raise InvalidInputError(f"solver {name!r} does not support {task}; it supports {list(entry.tasks)}. "
                                f"Solvers for {task}: {[n for n in names() if task in _TABLE[n].tasks]}")
    params = check_params(name, params, task)
    value = resolve_C(name, engine, [y], task, params, C)
    params.pop(regularisation(name, task, params).name, None)
    extra = {}
    if checkpoint is not None and entry.checkpoints:
        extra["checkpoint"] = checkpoint
    if init is not None and entry.warm_starts:
        extra["init"] = init
    if sample_weight is not None:
        check_sample_weight(name, params)
        extra["sample_weight"] = sample_weight
    return entry.run(engine, y, task, value, params, **extra)


def check_sample_weight(name: str, params: dict | None = None) -> None:
    """Refuse sample weights for a solver (with these ``params``) that cannot use them, naming those that can."""
    one_stage = canonical(name) == "gcd" and (params or {}).get("stage", "one") == "one"
    if not info(name).sample_weights or one_stage:
        raise InvalidInputError(f"solver {name!r} does not take sample_weight (or class_weight): per-sample weights "
                                "enter the final fit (libsvm's per-sample C, the weighted kernel ridge) of "
                                f"{[n for n in names() if info(n).sample_weights]} (gcd with stage='two'); use one "
                                "of these, or fit without weights")


def fit_path(name: str, engine, y, task: str, values, params: dict | None = None, stop=None,
             sample_weight=None) -> list:
    """Solve at every value of ``values`` (taken from the most to the least regularised, the order of
    :meth:`Regularisation.order`), each solve starting from the previous solution where the solver
    warm-starts (``warm_starts``), else from its usual start.

    ``y``: one target vector, or a list of them (the heads of a one-vs-rest fit, solved value by value
    in lockstep). Returns, in the order of ``values`` as given, the result at each value (a list of one
    per head when ``y`` is a list), or None for values the path did not reach: ``stop(value, results)``,
    called after each value, ends the path when it returns True (e.g. the CV's held-out score stopped
    improving)."""
    params = check_params(name, params, task)
    reg = regularisation(name, task, params)
    params.pop(reg.name, None)
    heads = y if isinstance(y, list) else [y]
    results: dict[float, list] = {}
    previous = [None] * len(heads)
    for value in reg.order(values):
        previous = [fit_solver(name, engine, target, task, C=value, params=params, init=init,
                               sample_weight=sample_weight) for target, init in zip(heads, previous)]
        results[value] = previous if isinstance(y, list) else previous[0]
        if stop is not None and stop(value, results[value]):
            break
    return [results.get(float(v)) for v in values]


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise InvalidInputError(f"task must be one of {TASKS}; got {task!r}")
