"""The null model of a run and the constant-predictor check of a fitted model.

A solver is only useful if it beats the model that ignores the features: the majority class of
the training labels (classification; its accuracy is the majority-class rate) or the mean of the
training targets (regression). :func:`null_model` scores that model on the training and test
parts; :func:`compare` puts it beside a solver's metrics; :func:`constant_prediction` flags a
fitted model that predicts one class (or one value) for every training and test row, which is
what an over-regularised SVM or penalised model does (e.g. an SVM with C far below the scale of
unit-trace kernels).

results.json: ``dataset.null_model`` = {kind: "majority_class", label, train_accuracy,
test_accuracy} or {kind: "mean", value, train_r2, test_r2, train_rmse, test_rmse}; per solver
``null_model`` = {metric, solver, null, at_least_null} (the solver's test metric against the null
model's, at_least_null: the solver's test accuracy / R^2 is >= the null model's) and
``constant_predictor`` = {constant: bool, value: the one label or value predicted, or null}.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import r2_score

#: a regression model counts as constant when the standard deviation of its predictions is below this
#: fraction of the training targets' (it then explains less than CONSTANT_RTOL^2 of their variance)
CONSTANT_RTOL = 1e-3


def null_model(task: str, y_train, y_test) -> dict:
    """The majority-class (classification) or training-mean (regression) predictor, scored on both parts."""
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    if task == "classification":
        labels, counts = np.unique(y_train, return_counts=True)
        label = labels[int(np.argmax(counts))]
        return {"kind": "majority_class", "label": label.item() if hasattr(label, "item") else label,
                "train_accuracy": float(np.mean(y_train == label)), "test_accuracy": float(np.mean(y_test == label))}
    mean = float(np.mean(y_train))
    out = {"kind": "mean", "value": mean}
    for split, y in (("train", y_train), ("test", y_test)):
        out[f"{split}_r2"] = float(r2_score(y, np.full(y.shape, mean)))   # as the solvers' metrics
        out[f"{split}_rmse"] = float(np.sqrt(np.mean((y - mean) ** 2)))
    return out


def test_metric(metrics: dict) -> str | None:
    """The metric a solver is compared with the null model on: test accuracy or test R^2."""
    return next((m for m in ("test_accuracy", "test_r2") if m in metrics), None)


def compare(null: dict, metrics: dict) -> dict | None:
    """A solver's test metric beside the null model's (None when the solver has no test metric)."""
    metric = test_metric(metrics)
    if metric is None or metric not in null:
        return None
    return {"metric": metric, "solver": metrics[metric], "null": null[metric],
            "at_least_null": bool(metrics[metric] >= null[metric] - 1e-12)}


def constant_prediction(predictions: list[np.ndarray], task: str, y_train) -> dict:
    """{constant, value}: whether ``predictions`` (labels or values on the train and test rows) are one
    class / one value (for regression: a standard deviation below CONSTANT_RTOL times the targets')."""
    pred = np.concatenate([np.asarray(p).reshape(-1) for p in predictions])
    if task == "classification":
        values = np.unique(pred)
        constant = values.size == 1
        value = values[0] if constant else None
    else:
        scale = max(float(np.std(np.asarray(y_train, dtype=np.float64))), 1e-300)
        constant = bool(np.std(pred) <= CONSTANT_RTOL * scale)
        value = float(np.mean(pred)) if constant else None
    if value is not None and hasattr(value, "item"):
        value = value.item()
    return {"constant": bool(constant), "value": value}

