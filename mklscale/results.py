"""``results.json``, what a pipeline run records: its schema, written here and read here.

The run (:mod:`mklscale.pipeline.run`) writes it with :func:`write_json_atomic` when it ends; the report
(:mod:`mklscale.report`) and other readers read it with :func:`load_results`, which checks the parts every
reader relies on. This docstring is the schema; docs/design.md, "Model selection and the null model",
details the ``null_model``, ``constant_predictor`` and ``cv`` fields.

Schema version 1 (:data:`SCHEMA_VERSION`):

- ``schema_version``, ``mklscale_version``;
- ``pipeline`` {name, description, path, config (the parsed spec, storage-option secrets redacted)};
- ``started`` / ``finished`` (ISO 8601, UTC), ``seconds``, ``machine`` {hostname, python, cpus, platform},
  ``cluster`` {kind, dashboard, workers};
- ``dataset`` {name, task, n_train, n_test, n_features (null with [bank] grams), classes, feature_names,
  null_model (the majority-class {kind: "majority_class", label, train_accuracy, test_accuracy} or
  training-mean {kind: "mean", value, train_r2, test_r2, train_rmse, test_rmse} predictor)};
- ``bank`` {path, M, n, dtype, normalize, build_seconds, kernels_computed, families (family -> kernels)},
  for factor banks also representation ("factor"), rank, method, landmarks, tol, max_error and
  approx_error_max, and with [bank] grams the Gram matrices' file under ``grams``;
- ``solvers``: one entry per [[solver]] and per [[path]] with name, solver, params, status ("ok" /
  "failed"), error, metrics (train / test accuracy, balanced_accuracy and roc_auc, or r2 and rmse),
  confusion_matrix (classification, test rows: labels, counts[true][predicted]), seconds, passes,
  bytes_read, converged, objective, gap, n_active, kernels (the kept kernels: index, name, family,
  params, features, weight, head; the name shows the dataset's feature names, e.g.
  ``gaussian(width=2)[mean radius]``, the features their column indices), history (per iteration, with
  head for one-vs-rest), path ([[path]] entries: parameter, values, kernel_names, weights, n_active,
  scores, score_name), convergence_warning (the estimator's ConvergenceWarning text: solver, class, gap
  reached and what to change; null when converged), model (the model folder relative to the run
  directory, or null), cv (the cross-validation curve and the chosen value when C was a list or
  "auto", else null; see :func:`mklscale.plots.selection_table`), null_model {metric, solver, null,
  at_least_null} and constant_predictor {constant, value}; with ``stability = N`` in the [[solver]],
  feature_stability (``FeatureStability.to_record``, :mod:`mklscale.feature_selection`): {parameter,
  values (the C the refits used, the chosen one), n_resamples, fraction, seed, fits (per value),
  all_feature_fits (fits that kept a kernel over all features, which selects every feature),
  n_features, n_selected (features selected at least once), features / names / frequency /
  frequency_by_value / mean_importance (over the fits) / importance (in the fitted model) of the (at most 1000) most often
  selected features, most often first, seconds}, or {error} when it could not run.

``feature_stability`` was added to schema version 1 without a new version: it is optional, and readers
of version 1 ignore fields they do not know.

Only ``schema_version`` and ``solvers`` are required of a file a reader opens; every other field may be
missing. Non-finite floats are the strings "inf" / "-inf" / "nan" (``solvers.result.json_safe``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mklscale import __version__
from mklscale.errors import InvalidInputError

SCHEMA_VERSION = 1
#: the file's name in the run directory
RESULTS_FILE = "results.json"
_RUN_HINT = ("run the pipeline first (`mklscale run PIPELINE.toml`), then give `mklscale report` the "
             "run folder it wrote")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file, fsync, rename: see ``runtime.checkpoint.write_atomic``)."""
    from mklscale.runtime.checkpoint import write_atomic

    text = json.dumps(data, indent=1, allow_nan=False).encode()
    write_atomic(path, lambda fh: fh.write(text))


def load_results(run_dir: str | Path) -> dict:
    """The parsed ``RUN_DIR/results.json``, checked for the parts every reader relies on.

    Raises InvalidInputError (saying which file and what to do) when the folder or file is missing,
    is not valid JSON, or is not a results.json of schema version 1.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InvalidInputError(f"run folder {run_dir} does not exist or is not a folder; {_RUN_HINT}")
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        raise InvalidInputError(f"{path} not found: {run_dir} holds no finished pipeline run; {_RUN_HINT}")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path} is not valid JSON ({exc}); the file is damaged or was cut short "
                                f"(an interrupted run?): run the pipeline again") from None
    _check_schema(results, path)
    return results


def _check_schema(results: Any, path: Path) -> None:
    """Raise InvalidInputError unless ``results`` is a schema-1 results dict with a list of solvers."""
    if not isinstance(results, dict) or "schema_version" not in results:
        raise InvalidInputError(f"{path} is not an mklscale results file (no schema_version); "
                                f"{_RUN_HINT}")
    version = results["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        what = "upgrade mklscale to read it" if newer else "run the pipeline again with this mklscale"
        raise InvalidInputError(f"{path} has schema_version {version!r}; this mklscale {__version__} reads "
                                f"schema_version {SCHEMA_VERSION}: {what}")
    solvers = results.get("solvers")
    if not isinstance(solvers, list) or not all(isinstance(s, dict) for s in solvers):
        raise InvalidInputError(f"{path}: 'solvers' must be a list of objects, one per solver run; the file "
                                f"is damaged: run the pipeline again")
