"""A run's fits: each [[solver]] (its regularisation cross-validated when a list or "auto", then fitted,
evaluated on the test rows and saved) and each [[path]], all on the run's one engine over its bank.

A solver's finished results entry is kept in ``checkpoints/<name>.done.json`` (reused on ``--resume``),
its CV state in ``checkpoints/<name>.cv.json``, its solver state in ``checkpoints/<name>/``.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from mklscale import model_selection, null_model
from mklscale.errors import (
    CheckpointError,
    ClusterUnavailableError,
    ConfigError,
    InvalidInputError,
    MKLScaleError,
    OutputWriteError,
)
from mklscale.pipeline.console import say_solver, summary
from mklscale.pipeline.data import Data
from mklscale.pipeline.spec import Pipeline
from mklscale.results import write_json_atomic
from mklscale.solvers import registry
from mklscale.solvers.result import json_safe


#: the estimators' ConvergenceWarning, which the run prints and records instead of warning
_CONVERGENCE_WARNING = r"MKL(Classifier|Regressor): solver .* did not converge"


def check_solvers(pipe: Pipeline, task: str) -> None:
    """Every [[solver]] entry's values (a loss typo, a solver without this task, a bad C) checked as the
    estimators check them, before the cluster starts and the bank is built."""
    from mklscale.estimators import MKLClassifier, MKLRegressor

    Estimator = MKLClassifier if task == "classification" else MKLRegressor
    where = f"pipeline {pipe.source}" if pipe.source else "pipeline"
    for i, entry in enumerate(pipe.solvers):
        label = f"{where} [[solver]] #{i + 1} ({entry['name']})"
        for candidate in model_selection.candidates(entry, task, label):   # every value of a C grid
            try:
                Estimator(solver=candidate["solver"], C=candidate["C"],
                          solver_params=dict(candidate["params"]))._check_solver()
            except InvalidInputError as exc:
                raise ConfigError(f"{label}: {exc}") from None


def run_solver(entry: dict, engine, data: Data, run_dir: Path, client, quiet: bool, say, every_s: float,
               resume: bool, seed: int = 0) -> dict:
    """Fit one [[solver]] entry on the run's bank, evaluate it on the test rows and save its model.

    ``engine``: the run's engine on the bank; the CV and the refit both use it, so the kernels the CV
    read stay in its block cache for the refit. The finished entry is kept in
    ``checkpoints/<name>.done.json``; with ``resume`` a finished entry with the same parameters is
    reused instead of fitting again.
    """
    from mklscale.estimators import MKLClassifier, MKLRegressor
    from mklscale.runtime.checkpoint import Preempted

    bank, name = engine.bank, entry["name"]
    requested = {"C": entry["C"], **entry["params"]}
    record = {"name": name, "solver": entry["solver"], "params": requested, "status": "ok",
              "error": None, "model": None, "path": None, "cv": None}
    done = run_dir / "checkpoints" / f"{name}.done.json"
    if resume and done.is_file():
        try:
            previous = json.loads(done.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{done} is unreadable ({exc}): the record of finished solver {name} is damaged; "
                                  f"delete it to run {name} again on --resume") from None
        same_cv = (previous.get("cv") or {}).get("folds", entry["cv_folds"]) == entry["cv_folds"]
        if model_selection.requested_params(previous) == json_safe(requested) and same_cv \
                and _recorded_stability(previous) == _requested_stability(entry) \
                and (run_dir / str(previous.get("model"))).is_dir():
            summary(f"[{name}] finished before the interruption; kept")
            return previous
    done.unlink(missing_ok=True)
    try:
        record["cv"] = _cross_validate(entry, engine, data, run_dir, say, seed, resume)
    except (Preempted, ClusterUnavailableError):
        raise
    except MKLScaleError as exc:
        record.update(status="failed", error=f"cross-validation: {type(exc).__name__}: {exc}")
        summary(f"[{name}] FAILED: {record['error']}")
        return record
    if record["cv"] is not None:
        entry = model_selection.at_choice(entry, record["cv"])
        record["params"] = {"C": entry["C"], **entry["params"]}
    params = dict(entry["params"])
    Estimator = MKLClassifier if data.task == "classification" else MKLRegressor
    # with [bank] grams the data are the raw Gram matrices (X_train, X_test): the model predicts from them
    kernels = {"kernels": "precomputed"} if data.X_train.ndim == 3 else {}
    estimator = Estimator(solver=entry["solver"], C=entry["C"], solver_params=params, client=client,
                          verbose=not quiet, checkpoint_dir=str(run_dir / "checkpoints" / name),
                          checkpoint_every_s=every_s, **kernels)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():  # the run prints and records it (convergence_warning) instead
            warnings.filterwarnings("ignore", message=_CONVERGENCE_WARNING, category=ConvergenceWarning)
            estimator.fit_bank(bank, data.y_train, resume=resume, engine=engine)
    except (Preempted, ClusterUnavailableError):
        raise   # the run stops: resumable from its checkpoints, not a failure of this solver
    except MKLScaleError as exc:
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0)
        summary(f"[{name}] FAILED: {record['error']}")
        return record
    record["seconds"] = time.perf_counter() - t0
    record["convergence_warning"] = estimator.fit_stats_.get("convergence_warning")
    record["metrics"] = _metrics(estimator, data)
    if data.task == "classification":
        record["confusion_matrix"] = _confusion(estimator, data)
    record.update(_null_model_check(estimator, data, record["metrics"]))
    record.update(_result_summary(estimator, bank, data.feature_names))
    if entry.get("stability"):
        record["feature_stability"] = _feature_stability(entry, estimator, engine, data, seed)
    model_dir = run_dir / "models" / name
    try:
        estimator.save(model_dir)
    except OutputWriteError as exc:  # a full disk stops the run; the bank and finished solvers are kept
        raise OutputWriteError(f"{exc}; add --resume to keep the run's bank and finished solvers") from None
    record["model"] = str(model_dir.relative_to(run_dir))
    write_json_atomic(done, json_safe(record))
    say_solver(say, record, len(bank))
    return record


def _cross_validate(entry: dict, engine, data: Data, run_dir: Path, say, seed: int, resume: bool) -> dict | None:
    """The ``cv`` record of a solver whose regularisation is a list or "auto" (None otherwise):
    k-fold CV on the bank's rows with the run's ``engine`` (``mklscale.model_selection``); its state in
    checkpoints/<name>.cv.json."""
    req = model_selection.request(entry)
    if req is None:
        return None
    state = run_dir / "checkpoints" / f"{entry['name']}.cv.json"
    if not resume:
        state.unlink(missing_ok=True)
    return model_selection.select(entry, req, engine, data.task, data.y_train, data.classes, seed, state, resume,
                                  say)


def _requested_stability(entry: dict) -> tuple:
    """(subsamples, fraction) a [[solver]] entry asks for; (0, None) without stability."""
    n = int(entry.get("stability") or 0)
    return (n, float(entry["stability_fraction"])) if n else (0, None)


def _recorded_stability(record: dict) -> tuple:
    """(subsamples, fraction) a finished results entry's feature_stability ran with; (0, None) without one."""
    fs = record.get("feature_stability") or {}
    n = int(fs.get("n_resamples") or 0)
    return (n, fs.get("fraction")) if n else (0, None)


def _feature_stability(entry: dict, estimator, engine, data: Data, seed: int) -> dict:
    """The ``feature_stability`` record of a [[solver]] with ``stability = N``: how often each feature is
    selected by refits at the chosen C on N subsamples of the training rows (``feature_selection.stability``,
    on the run's engine: row views, nothing rebuilt), with each feature's importance in the fitted model.
    A bank without features (imported Gram matrices), or a failure, records {"error": why}."""
    from mklscale.feature_selection import stability

    try:
        importance = estimator.feature_importances_
    except AttributeError as exc:
        return {"error": str(exc)}
    params = dict(entry["params"])
    params.pop(registry.c_parameter(entry["solver"], data.task, params), None)
    try:
        st = stability(entry["solver"], engine, engine.bank.specs, data.y_train, data.task, [estimator.C_], params,
                       classes=data.classes if data.task == "classification" else None, n_features=importance.size,
                       n_resamples=entry["stability"], fraction=entry["stability_fraction"], seed=seed,
                       feature_names=data.feature_names)
    except MKLScaleError as exc:
        summary(f"[{entry['name']}] feature stability FAILED: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}
    record = st.to_record(importance)
    top = ", ".join(f"{name} {freq:.2f}" for name, freq in zip(record["names"][:5], record["frequency"][:5]))
    summary(f"[{entry['name']}] feature stability over {st.n_resamples} subsamples ({st.seconds:.1f} s): "
            f"{record['n_selected']} of {st.n_features} features ever selected; most often: {top or 'none'}")
    return record


def _null_model_check(estimator, data: Data, metrics: dict) -> dict:
    """The null model beside the solver's test metric, and whether the model predicts one class / value."""
    null = null_model.null_model(data.task, data.y_train, data.y_test)
    predictions = [estimator.predict(data.X_train), estimator.predict(data.X_test)]
    return {"null_model": null_model.compare(null, metrics),
            "constant_predictor": null_model.constant_prediction(predictions, data.task, data.y_train)}


def _metrics(estimator, data: Data) -> dict:
    """Train and test accuracy, balanced accuracy and ROC AUC (classification), or R^2 and RMSE
    (regression). The AUC ranks the decision values f(x); with K >= 3 classes it is the mean of the
    K one-vs-rest AUCs (f_k ranking class k against the rest), or None when the split lacks a class."""
    from sklearn.metrics import balanced_accuracy_score

    out = {}
    if data.task == "classification":
        for split, X, y in (("train", data.X_train, data.y_train), ("test", data.X_test, data.y_test)):
            f = estimator.decision_function(X)
            pred = estimator.predict(X)
            out[f"{split}_accuracy"] = float(np.mean(pred == y))
            out[f"{split}_balanced_accuracy"] = float(balanced_accuracy_score(y, pred))
            out[f"{split}_roc_auc"] = _roc_auc(y, f, estimator.classes_)
        return out
    for split, X, y in (("train", data.X_train, data.y_train), ("test", data.X_test, data.y_test)):
        pred = estimator.predict(X)
        out[f"{split}_r2"] = float(estimator.score(X, y))
        out[f"{split}_rmse"] = float(np.sqrt(np.mean((pred - y) ** 2)))
    return out


def _roc_auc(y, f: np.ndarray, classes) -> float | None:
    """ROC AUC of decision values (binary: f ranks classes[1]; one-vs-rest: mean over the heads)."""
    from sklearn.metrics import roc_auc_score

    if f.ndim == 1:
        targets, scores = [y == classes[1]], [f]
    else:
        targets, scores = [y == c for c in classes], list(f.T)
    if any(t.all() or not t.any() for t in targets):
        return None   # a class missing from this split: the AUC is undefined
    return float(np.mean([roc_auc_score(t, s) for t, s in zip(targets, scores)]))


def _confusion(estimator, data: Data) -> dict:
    """The test rows' confusion matrix: counts[i][j] = rows of class labels[i] predicted labels[j]."""
    from sklearn.metrics import confusion_matrix

    labels = estimator.classes_
    counts = confusion_matrix(data.y_test, estimator.predict(data.X_test), labels=labels)
    return {"labels": json_safe(labels.tolist()), "counts": counts.tolist()}


def _result_summary(estimator, bank, feature_names=None) -> dict:
    """Kept kernels (per head for one-vs-rest), history, convergence and pass counts of a fitted estimator."""
    results = estimator.result_ if isinstance(estimator.result_, list) else [estimator.result_]
    heads = [str(c) for c in estimator.classes_] if len(results) > 1 else [None]
    kernels, history = [], []
    for head, res in zip(heads, results):
        kernels += [_kernel_entry(bank, int(m), float(res.weights[m]), head, feature_names) for m in res.active]
        history += [{"iteration": i + 1, **json_safe(h), "head": head} for i, h in enumerate(res.history)]
    stats = getattr(estimator, "fit_stats_", {}) or {}
    return {
        "passes": stats.get("passes"), "bytes_read": stats.get("bytes_read"),
        "converged": all(r.converged for r in results), "objective": json_safe(sum(r.objective for r in results)),
        "gap": json_safe(max(r.gap for r in results)),
        "n_active": len({k["index"] for k in kernels}), "kernels": kernels, "history": history,
    }


def _kernel_entry(bank, m: int, weight: float, head, feature_names=None) -> dict:
    spec = bank.specs[m]
    return {"index": m, "name": spec.label(feature_names), "family": spec.family, "params": dict(spec.params),
            "features": None if spec.features is None else list(spec.features), "weight": weight, "head": head}


def run_path(entry: dict, engine, data: Data, quiet: bool, say) -> dict:
    """A PFBS regularisation path (square loss on the targets, ±1 labels for binary tasks) on the run's
    ``engine``, with a progress bar per pass unless ``quiet``."""
    from mklscale.solvers import paths

    bank, name = engine.bank, entry["name"]
    record = {"name": name, "solver": "pfbs_path", "params": {k: v for k, v in entry.items() if k != "name"},
              "status": "ok", "error": None, "model": None, "kernels": [], "history": []}
    if data.task == "classification" and len(data.classes) != 2:
        record.update(status="failed", error="a [[path]] needs a regression or binary task")
        summary(f"[{name}] FAILED: {record['error']}")
        return record
    y = np.asarray(data.y_train, dtype=np.float64)
    t0 = time.perf_counter()
    before, shown = engine.counters(), engine.progress
    engine.progress = not quiet
    try:
        p = paths.path(engine, y, n_taus=entry["n_taus"], mu=entry["mu"], eps=entry["eps"], tol=entry["tol"])
        scores, score_name = None, None
        if entry["cv_folds"]:
            cv = paths.cross_validate(engine, y, taus=p.taus, mus=[entry["mu"]], folds=entry["cv_folds"],
                                      task="classification" if data.task == "classification" else "regression")
            scores, score_name = cv.errors[0].tolist(), f"cv_{cv.metric}"
    finally:
        engine.progress = shown
    passes, bytes_read = (now - then for now, then in zip(engine.counters(), before))
    ever = np.flatnonzero(np.any(p.weights != 0, axis=0))
    record.update(
        seconds=time.perf_counter() - t0, passes=passes, bytes_read=bytes_read,
        converged=bool(np.all(p.converged)), objective=float(p.objectives[-1]), gap=float(p.gaps[-1]),
        n_active=int(ever.size), metrics={},
        path={"parameter": "tau", "values": p.taus.tolist(), "kernel_names": [bank.specs[m].label(data.feature_names) for m in ever],
              "weights": p.weights[:, ever].tolist(), "n_active": [len(a) for a in p.active],
              "scores": scores, "score_name": score_name})
    summary(f"[{name}] path over {len(p.taus)} taus: up to {ever.size}/{len(bank)} kernels, "
            f"passes {record['passes']}, {record['seconds']:.1f} s")
    return record
