"""Model selection in pipelines: a solver's main regularisation chosen by k-fold cross-validation.

In a ``[[solver]]`` entry the parameter the estimators' ``C`` sets (``registry.c_parameter``: C, or
tau / lam given under the solver's own name) may be a list of values or ``"auto"``::

    [[solver]]
    name = "smo_mkl"
    solver = "smo"
    C = "auto"              # or C = [100.0, 1000.0]; or, e.g. for pfbs, tau = "auto"
    cv_folds = 3            # optional (default 3)

The value is then chosen by k-fold cross-validation on the training part, on the same bank, by the
one CV core :mod:`mklscale.solvers.cv` (also behind ``MKLClassifierCV`` / ``MKLRegressorCV``): a fold
trains a warm-started path over the grid on ``RowSubsetEngine(engine, train_rows)`` (principal
submatrices of the stored Gram matrices, no rebuild), stopped two values past the fold's peak
(``cv.past_peak``; the values some fold did not reach are "nan" in ``mean`` and never chosen), and
predicts its held-out rows with ``cv.predict_rows``. Folds come from ``cv.fold_assignment`` (seeded by the pipeline's ``seed``;
stratified by class for classification). The score is the accuracy of the predicted labels
(classification; one-vs-rest heads for three or more classes, argmax as the estimators predict) or R^2
(regression). The chosen value has the best mean score over the folds; ties go to the more
regularised value (``cv.best_index``). The pipeline then refits on the whole training part at that
value (the normal solver run).

``"auto"`` grids are the solver's own (``registry.regularisation(solver, task).grid``): 10 values,
geometric, from the most regularised end of the solver's span to the other, relative to the problem's
scale: C_max (spicy: the smallest C whose model keeps no kernel, ``spicy.c_max``) or tau_max (pfbs,
``pfbs.tau_max``) down to 1e-3 of it; SVM constants (smo, citi, the final SVM of the baselines) from
0.01 to 100 times n / mean trace; ridges (sgd, gcd one-stage, the baselines' kernel ridge) from 100 down
to 1e-3 times mean trace / n; easymkl's lam from 1 down to 1e-3. One pass over the bank at most.

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

from mklscale.errors import ConfigError, Preempted
from mklscale.solvers import cv, registry

AUTO = registry.AUTO
DEFAULT_FOLDS = cv.DEFAULT_FOLDS


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
def select(entry: dict, req: Request, engine, task: str, y, classes, seed: int, state: Path, resume: bool,
           say) -> dict:
    """Cross-validate ``entry``'s regularisation over its grid; return the ``cv`` record (module docstring).

    ``engine``: the run's open engine on its bank (the pipeline's one engine; left open, its block cache
    then serves the refit); ``y``: training labels / targets (bank rows); ``classes``: sorted labels
    (classification) or None; ``state``: the JSON file keeping finished folds' scores (reused with
    ``resume``).
    """
    from mklscale.runtime.checkpoint import stop_on_signals, stop_requested

    t0 = time.perf_counter()
    solver, name = entry["solver"], entry["name"]
    candidates(entry, task, f"[[solver]] {name}")       # the grid's name fits the task
    params = {k: v for k, v in entry["params"].items() if k != req.key}
    reg = registry.regularisation(solver, task, params)
    classification = task == "classification"
    y = np.asarray(y)
    heads = cv.head_targets(y, classes) if classification else [np.asarray(y, dtype=np.float64)]
    if not 2 <= req.folds <= _smallest_group(y, classification):
        raise ConfigError(f"[[solver]] {name}: cv_folds = {req.folds} needs at least that many training rows "
                          f"{'of every class' if classification else ''}; lower cv_folds")
    fold = cv.fold_assignment(y, req.folds, classification, seed)
    grid, rule = (req.values, "given") if req.values != AUTO else reg.grid(engine, heads, task, params)
    grid = sorted({float(v) for v in grid})
    fingerprint = _fingerprint(entry, req, grid, seed, engine.bank, y)
    done = _load_state(state, fingerprint, len(grid), req.folds) if resume else None

    def fold_finished(k: int, partial: cv.CVScores) -> None:
        _save_state(state, fingerprint, grid, partial)
        scores = partial.scores[:, k]
        reached = int(np.count_nonzero(np.isfinite(scores)))
        say(f"[{name}] cv fold {k + 1}/{req.folds}: best {req.key} = {grid[int(np.nanargmax(scores))]:.4g} "
            f"({_METRIC[classification]} {np.nanmax(scores):.4f}), {reached} of {len(grid)} values "
            f"(the path stops {cv.DEFAULT_PATIENCE} values past the fold's best), {partial.seconds[k]:.1f} s")
        if stop_requested() is not None:
            raise Preempted(stop_requested(), state)

    with stop_on_signals():
        if stop_requested() is not None:
            raise Preempted(stop_requested(), state)
        result = cv.cross_validate(solver, engine, y, task, grid, _c_params(req.key, params), classes,
                                   fold=fold, done=done, on_fold=fold_finished)
    unconverged = result.unconverged
    mean, std = result.mean, result.std
    best = cv.best_index(mean, grid, reg.larger_regularises)
    at_edge = len(grid) > 1 and best in (0, len(grid) - 1)
    say(f"[{name}] cv chose {req.key} = {grid[best]:.4g} ({req.folds} folds, {_METRIC[classification]} "
        f"{mean[best]:.4f})" + ("; at the edge of the grid: a value beyond it may be better" if at_edge else ""))
    requested = entry["C"] if req.key == "C" else entry["params"][req.key]      # as the spec gave it
    return {"key": req.key, "parameter": reg.name, "requested": requested, "grid": grid, "mean": mean.tolist(),
            "std": std.tolist(), "fold_scores": result.scores.tolist(), "unconverged": unconverged.sum(axis=1).tolist(),
            "metric": _METRIC[classification], "folds": req.folds, "seed": seed, "chosen": grid[best], "at_edge": at_edge,
            "rule": rule, "seconds": time.perf_counter() - t0}


_METRIC = {True: "accuracy", False: "r2"}


def _c_params(key: str, params: dict) -> dict:
    """The solver parameters of a CV fit: the grid value goes in as C (registry.fit_path), so a grid
    given under the solver's own name (tau, lam) is not repeated in params."""
    return {k: v for k, v in params.items() if k != key}


def _smallest_group(y: np.ndarray, classification: bool) -> int:
    return int(min(np.unique(y, return_counts=True)[1])) if classification else int(y.size)


# ---- the CV state (resume) ---------------------------------------------------------------------
def _fingerprint(entry: dict, req: Request, grid: list, seed: int, bank, y: np.ndarray) -> str:
    from mklscale.solvers.result import json_safe

    text = json.dumps(json_safe({"solver": entry["solver"], "C": entry["C"], "params": entry["params"],
                                 "key": req.key, "grid": grid, "folds": req.folds, "seed": seed}), sort_keys=True)
    digest = hashlib.sha256(text.encode())
    digest.update(np.ascontiguousarray(bank.checksums).tobytes())
    digest.update(np.asarray(y).astype(str).tobytes())
    return digest.hexdigest()


def _load_state(path: Path, fingerprint: str, n_values: int, folds: int) -> cv.CVScores | None:
    """The folds a stopped run finished (``cv.CVScores`` with their scores and ``finished``), or None."""
    try:
        state = json.loads(Path(path).read_text())
        scores = np.array([[np.nan if v is None else v for v in row] for row in state["scores"]], dtype=np.float64)
        unconverged = np.array(state["unconverged"], dtype=bool)
        finished = np.array(state["finished"], dtype=bool)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (state.get("fingerprint") != fingerprint or scores.shape != (n_values, folds)
            or unconverged.shape != scores.shape or finished.shape != (folds,)):
        return None
    return cv.CVScores(list(state["grid"]), scores, unconverged, np.zeros(0, np.int64), np.full(folds, np.nan),
                       "", finished, np.full(scores.shape, np.nan))


def _save_state(path: Path, fingerprint: str, grid: list, partial: cv.CVScores) -> None:
    from mklscale.runtime.checkpoint import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"fingerprint": fingerprint, "grid": grid,
                       "scores": [[None if not np.isfinite(s) else float(s) for s in row] for row in partial.scores],
                       "unconverged": partial.unconverged.tolist(), "finished": partial.finished.tolist()}).encode()
    write_atomic(path, lambda fh: fh.write(text))
