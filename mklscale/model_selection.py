"""Model selection in pipelines: a solver's main regularisation chosen by k-fold cross-validation.

In a ``[[solver]]`` entry the parameter the estimators' ``C`` sets (``registry.c_parameter``: C, or
tau / lam given under the solver's own name) may be a list of values or ``"auto"``::

    [[solver]]
    name = "smo_mkl"
    solver = "smo"
    C = "auto"              # or C = [100.0, 1000.0]; or, e.g. for pfbs, tau = "auto"
    cv_folds = 3            # optional (default 3)

The value is then chosen by k-fold cross-validation on the training part, on the same bank: a fold
trains on ``RowSubsetEngine(engine, train_rows)`` (principal submatrices of the stored Gram
matrices, no rebuild) and predicts its held-out rows with ``paths.predict_rows``. Folds come from
``paths.fold_assignment`` (seeded by the pipeline's ``seed``; stratified by class for
classification). The score is the accuracy of the predicted labels (classification; one-vs-rest
heads for three or more classes, argmax as the estimators predict) or R^2 (regression). The chosen
value has the best mean score over the folds; ties go to the more regularised value. The pipeline
then refits on the whole training part at that value (the normal solver run).

``"auto"`` grids, relative to the problem's scale (n training rows, traces t_m of the kernels):

- SVM constants (smo, citi, the final SVM of uniform / alignment / fheuristic and of gcd two-stage):
  C = c * n / mean(t_m), c in ``SVM_FACTORS``, i.e. c is the SVM constant on kernels of unit mean
  diagonal (on unit-trace kernels C = c * n).
- ridges (sgd, gcd one-stage, the final kernel ridge of the baselines): lam = r * mean(t_m) / n,
  r in ``RIDGE_FACTORS`` (the ridge relative to the mean eigenvalue).
- spicy's penalty weight C: C = f * C_max, f in ``PENALTY_FACTORS``, where C_max = max_m ||rho_0||_{K_m}
  is the smallest C whose model has no kernel (rho_0 = -loss'(y, b_0) at the best constant model:
  (y - mean y)/2 for the logistic loss with bias, y - mean y for the others; divided by (1 - lam) for
  the elastic net, whose threshold is C (1 - lam)); one pass over the bank per head.
- pfbs' tau: tau = f * tau_max, tau_max = max_m ||y~||_{K_m} / n (y~ centred when center is true;
  ``paths`` module docstring), f in ``PENALTY_FACTORS``; one pass.
- easymkl's lam in (0, 1]: ``EASYMKL_LAMS``.

results.json gets, per selected solver, ``cv``: {key (the name the spec used), parameter (the
solver's name for it), requested ("auto" or the list, as given), grid (ascending),
mean, std, fold_scores (grid x folds), unconverged (per value, fold fits that did not converge),
metric ("accuracy" / "r2"), folds, seed, chosen, at_edge (the chosen value is the grid's smallest or
largest: one beyond it may be better), rule (how the grid was made), seconds}; the
solver's ``params`` hold the chosen value. Interrupted (SIGTERM/SIGINT) during the CV, a run keeps
the finished fold scores in ``checkpoints/<name>.cv.json`` and ``--resume`` continues from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import r2_score

from mklscale.errors import ConfigError, Preempted
from mklscale.estimators import head_targets
from mklscale.solvers import registry

AUTO = "auto"
DEFAULT_FOLDS = 3
#: SVM constant on kernels of unit mean diagonal (sklearn's usual C range, short for the quickstart)
SVM_FACTORS = (0.1, 1.0, 10.0)
#: ridge relative to the mean eigenvalue mean(t_m) / n
RIDGE_FACTORS = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
#: penalty weight relative to the smallest weight with an empty model (C_max, tau_max)
PENALTY_FACTORS = (0.1, 0.03, 0.01, 0.003)
EASYMKL_LAMS = (0.01, 0.1, 0.5, 0.9)


@dataclasses.dataclass(frozen=True)
class Request:
    """A [[solver]] entry's grid request: ``key`` ("C" or the solver's name for it), ``values``
    (a list, or AUTO) and ``folds``."""

    key: str
    values: list | str
    folds: int


def check_grid(value) -> str | None:
    """Config check of a C value: a number > 0, a non-empty list of numbers > 0, or "auto"."""
    if isinstance(value, str):
        return None if value == AUTO else f'must be a number > 0, a list of them or "auto"; got {value!r}'
    if not isinstance(value, list):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) and value > 0
        return None if ok else f'must be > 0, got {value!r} (or a list of values > 0, or "auto", to cross-validate)'
    if not value:
        return 'is an empty list; give at least one value (or "auto")'
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
            return f'must be a list of numbers > 0 (or "auto"); got {value!r}'
    return None


def is_grid(value) -> bool:
    return isinstance(value, list) or value == AUTO


def request(entry: dict, where: str = "[[solver]]") -> Request | None:
    """The grid request of a checked [[solver]] entry (None: every regularisation value is a number).

    A grid under a name in ``registry.c_names`` (tau, lam) must pass :func:`check_grid`; at most one
    parameter may be a grid.
    """
    keys = ["C"] if is_grid(entry.get("C")) else []
    for name in registry.c_names(entry["solver"]):
        value = entry["params"].get(name)
        if name != "C" and isinstance(value, (str, list)):
            problem = check_grid(value)
            if problem:
                raise ConfigError(f"{where}.{name} {problem}")
            keys.append(name)
    if not keys:
        return None
    if len(keys) > 1:
        raise ConfigError(f"{where}: {' and '.join(keys)} are both grids; cross-validate one regularisation "
                          "parameter (give the other a number)")
    key = keys[0]
    value = entry["C"] if key == "C" else entry["params"][key]
    return Request(key, value if value == AUTO else sorted({float(v) for v in value}),
                   int(entry.get("cv_folds", DEFAULT_FOLDS)))


def candidates(entry: dict, task: str, where: str = "[[solver]]") -> list[dict]:
    """``entry`` at each value of its grid (without it for "auto"), for the checks made before any work;
    ``entry`` itself when it has no grid. A grid under a name that is not what the solver regularises
    on ``task`` (e.g. lam for a baseline's SVM) is a ConfigError."""
    req = request(entry, where)
    if req is None:
        return [entry]
    params = {k: v for k, v in entry["params"].items() if k != req.key}
    c_name = registry.c_parameter(entry["solver"], task, params)
    if req.key not in ("C", c_name):
        raise ConfigError(f"{where}: {req.key} is not what {entry['solver']} regularises on a {task} task "
                          f"({c_name} is); give the grid as C = ... or {c_name} = ...")
    if req.values == AUTO:
        return [{**entry, "C": None if req.key == "C" else entry["C"], "params": params}]
    return [at_choice(entry, {"key": req.key, "chosen": v}) for v in req.values]


def requested_params(record: dict) -> dict:
    """The params of a results entry as the spec gave them (the grid request in place of the chosen value)."""
    params = dict(record.get("params") or {})
    cv = record.get("cv")
    if cv:
        params[cv["key"]] = cv["requested"]
    return params


def at_choice(entry: dict, selection: dict) -> dict:
    """``entry`` with its grid replaced by the chosen value."""
    out = {**entry, "params": dict(entry["params"])}
    if selection["key"] == "C":
        out["C"] = selection["chosen"]
    else:
        out["params"][selection["key"]] = selection["chosen"]
    return out


# ---- the cross-validation ----------------------------------------------------------------------
def select(entry: dict, req: Request, bank, task: str, y, classes, client, seed: int, state: Path,
           resume: bool, say) -> dict:
    """Cross-validate ``entry``'s regularisation over its grid; return the ``cv`` record (module docstring).

    ``y``: training labels / targets (bank rows); ``classes``: sorted labels (classification) or
    None; ``state``: the JSON file keeping finished fold scores (reused with ``resume``).
    """
    from mklscale.engine import Engine
    from mklscale.engine.views import RowSubsetEngine
    from mklscale.runtime.checkpoint import stop_on_signals, stop_requested
    from mklscale.solvers import paths

    t0 = time.perf_counter()
    solver, name = entry["solver"], entry["name"]
    candidates(entry, task, f"[[solver]] {name}")       # the grid's name fits the task
    params = {k: v for k, v in entry["params"].items() if k != req.key}
    c_name = registry.c_parameter(solver, task, params)
    classification = task == "classification"
    y = np.asarray(y)
    heads = head_targets(y, classes) if classification else [np.asarray(y, dtype=np.float64)]
    if not 2 <= req.folds <= _smallest_group(y, classification):
        raise ConfigError(f"[[solver]] {name}: cv_folds = {req.folds} needs at least that many training rows "
                          f"{'of every class' if classification else ''}; lower cv_folds")
    fold = paths.fold_assignment(y, req.folds, classification, seed)
    with Engine(bank, client=client, progress=False) as engine:
        grid, rule = (req.values, "given") if req.values != AUTO else auto_grid(solver, task, params, engine, heads)
        grid = sorted({float(v) for v in grid})
        fingerprint = _fingerprint(entry, req, grid, seed, bank, y)
        scores, unconverged = _load_state(state, fingerprint, len(grid), req.folds) if resume else (None, None)
        if scores is None:
            scores, unconverged = np.full((len(grid), req.folds), np.nan), np.zeros((len(grid), req.folds), bool)
        with stop_on_signals():
            for i, value in enumerate(grid):
                for k in range(req.folds):
                    if np.isfinite(scores[i, k]):
                        continue
                    if stop_requested() is not None:
                        raise Preempted(stop_requested(), state)
                    train, test = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
                    sub = RowSubsetEngine(engine, train)
                    fs = []
                    for target in heads:
                        result = registry.fit_solver(solver, sub, target[train], task, **_c_args(req.key, value, params))
                        unconverged[i, k] |= not result.converged
                        fs.append(paths.predict_rows(engine, result, train, test))
                    scores[i, k] = _score(np.column_stack(fs), y[test], classes)
                    _save_state(state, fingerprint, grid, scores, unconverged)
                say(f"[{name}] cv {req.key} = {value:.4g}: {_METRIC[classification]} {scores[i].mean():.4f} "
                    f"+- {scores[i].std():.4f}" + (f"  ({int(unconverged[i].sum())} fold fit(s) not converged)"
                                                    if unconverged[i].any() else ""))
    mean, std = scores.mean(axis=1), scores.std(axis=1)
    best = _best(mean, grid, _more_regularised_is_larger(solver, c_name))
    at_edge = len(grid) > 1 and best in (0, len(grid) - 1)
    say(f"[{name}] cv chose {req.key} = {grid[best]:.4g} ({req.folds} folds, {_METRIC[classification]} "
        f"{mean[best]:.4f})" + ("; at the edge of the grid: a value beyond it may be better" if at_edge else ""))
    requested = entry["C"] if req.key == "C" else entry["params"][req.key]      # as the spec gave it
    return {"key": req.key, "parameter": c_name, "requested": requested, "grid": grid, "mean": mean.tolist(),
            "std": std.tolist(), "fold_scores": scores.tolist(), "unconverged": unconverged.sum(axis=1).tolist(),
            "metric": _METRIC[classification], "folds": req.folds, "seed": seed, "chosen": grid[best], "at_edge": at_edge,
            "rule": rule, "seconds": time.perf_counter() - t0}


_METRIC = {True: "accuracy", False: "r2"}


def _c_args(key: str, value: float, params: dict) -> dict:
    return {"C": value, "params": params} if key == "C" else {"C": None, "params": {**params, key: value}}


def _smallest_group(y: np.ndarray, classification: bool) -> int:
    return int(min(np.unique(y, return_counts=True)[1])) if classification else int(y.size)


def _score(f: np.ndarray, y: np.ndarray, classes) -> float:
    """Accuracy of the labels the estimators would predict from f (n, heads), or R^2 of f (regression)."""
    if classes is None:
        return float(r2_score(y, f[:, 0]))       # as the pipeline's test_r2 (the estimators' score)
    classes = np.asarray(classes)
    labels = classes[(f[:, 0] > 0).astype(np.int64)] if f.shape[1] == 1 else classes[np.argmax(f, axis=1)]
    return float(np.mean(labels == y))


def _more_regularised_is_larger(solver: str, c_name: str) -> bool:
    """Direction of the regularisation (registry table): SVM constants regularise less as they grow."""
    return not (c_name == "C" and registry.canonical(solver) != "spicy")


def _best(mean: np.ndarray, grid: list, larger_regularises: bool) -> int:
    """Index of the best mean score; ties go to the more regularised value."""
    top = np.flatnonzero(mean >= np.max(mean) - 1e-12)
    values = np.asarray(grid)[top]
    return int(top[np.argmax(values) if larger_regularises else np.argmin(values)])


# ---- "auto" grids ------------------------------------------------------------------------------
def auto_grid(solver: str, task: str, params: dict, engine, heads: list[np.ndarray]) -> tuple[list, str]:
    """The "auto" grid of ``solver``'s regularisation on ``engine`` (module docstring; values rounded to
    3 significant digits, ascending) and its rule text."""
    grid, rule = _auto_grid(solver, task, params, engine, heads)
    return sorted({float(f"{v:.3g}") for v in grid}), rule


def _auto_grid(solver: str, task: str, params: dict, engine, heads: list[np.ndarray]) -> tuple[list, str]:
    solver = registry.canonical(solver)
    c_name = registry.c_parameter(solver, task, params)
    n, mean_trace = int(engine.n), float(np.mean(engine.traces))
    if solver == "spicy":
        c_max = max(_spicy_c_max(engine, target, task, params) for target in heads)
        return [c_max * f for f in PENALTY_FACTORS], f"C_max * {list(PENALTY_FACTORS)}, C_max = {c_max:.4g}"
    if solver == "pfbs":
        tau_max = max(_tau_max(engine, target, params.get("center", True)) for target in heads)
        return [tau_max * f for f in PENALTY_FACTORS], f"tau_max * {list(PENALTY_FACTORS)}, tau_max = {tau_max:.4g}"
    if solver == "easymkl":
        return list(EASYMKL_LAMS), f"lam in {list(EASYMKL_LAMS)}"
    if c_name == "C":
        scale = n / mean_trace
        return [scale * f for f in SVM_FACTORS], f"n / mean trace * {list(SVM_FACTORS)}, n / mean trace = {scale:.4g}"
    scale = mean_trace / n
    return [scale * f for f in RIDGE_FACTORS], f"mean trace / n * {list(RIDGE_FACTORS)}, mean trace / n = {scale:.4g}"


def _spicy_c_max(engine, y: np.ndarray, task: str, params: dict) -> float:
    """Smallest spicy C with no kernel in the model (block-1 / elastic-net threshold; module docstring)."""
    loss = params.get("loss", registry.SPICY_LOSSES[task][0])
    rho = y - y.mean() if params.get("bias", True) else y.astype(np.float64)
    if loss == "logistic":
        rho = rho / 2.0
    c_max = float(np.sqrt(max(float(np.max(engine.quad_forms(rho))), 0.0)))
    if params.get("penalty", "l1") == "elasticnet":
        c_max /= max(1.0 - float(params.get("lam", 0.5)), 1e-3)
    return c_max


def _tau_max(engine, y: np.ndarray, center: bool) -> float:
    y_fit = y - y.mean() if center else y
    return float(np.sqrt(max(float(np.max(engine.quad_forms(y_fit))), 0.0))) / int(engine.n)


# ---- the CV state (resume) ---------------------------------------------------------------------
def _fingerprint(entry: dict, req: Request, grid: list, seed: int, bank, y: np.ndarray) -> str:
    from mklscale.solvers.result import json_safe

    text = json.dumps(json_safe({"solver": entry["solver"], "C": entry["C"], "params": entry["params"],
                                 "key": req.key, "grid": grid, "folds": req.folds, "seed": seed}), sort_keys=True)
    digest = hashlib.sha256(text.encode())
    digest.update(np.ascontiguousarray(bank.checksums).tobytes())
    digest.update(np.asarray(y).astype(str).tobytes())
    return digest.hexdigest()


def _load_state(path: Path, fingerprint: str, n_values: int, folds: int):
    try:
        state = json.loads(Path(path).read_text())
        scores = np.array(state["scores"], dtype=np.float64)
        unconverged = np.array(state["unconverged"], dtype=bool)
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    if state.get("fingerprint") != fingerprint or scores.shape != (n_values, folds) or unconverged.shape != scores.shape:
        return None, None
    return scores, unconverged


def _save_state(path: Path, fingerprint: str, grid: list, scores: np.ndarray, unconverged: np.ndarray) -> None:
    from mklscale.runtime.checkpoint import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"fingerprint": fingerprint, "grid": grid,
                       "scores": [[None if not np.isfinite(s) else float(s) for s in row] for row in scores],
                       "unconverged": unconverged.tolist()}).encode()
    write_atomic(path, lambda fh: fh.write(text))
