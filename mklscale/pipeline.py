"""Declarative pipelines: dataset -> bank -> solvers (and regularisation paths) -> evaluation -> report.

A pipeline is a TOML file (see ``pipelines/``)::

    name = "quickstart"                 # the run's label
    description = "..."                 # optional
    seed = 0                            # train/test split seed

    [dataset]                           # mklscale.datasets: nothing is downloaded
    name = "breast_cancer"              # (`mklscale run ... --dataset NAME` replaces it for one run)
    test_fraction = 0.25                # held-out rows (stratified for classification)
    max_train = 200                     # optional: keep at most this many training rows
    options = { n_samples = 7400 }      # optional: passed to datasets.load (generated sets); the run
                                        # loads raw features: the bank standardises them, the models too

    [dataset]                           # or your own data instead of name (mklscale.tabular)
    path = "data.csv"                   # .csv (header row) | .parquet (needs pyarrow) | .npy; relative
                                        # to this file's folder, or absolute
    target = "label"                    # .csv / .parquet: the target column; the others are features
    labels = "y.npy"                    # .npy: the targets, a second .npy file (instead of target)
    task = "classification"             # or "regression"; left out: inferred from the target and
                                        # printed (whole numbers, at most 20 values, or text: classes)
    test_fraction = 0.25                # test_fraction and max_train as above

    [dataset]                           # or, with [bank] grams below, the targets alone
    labels = "y.npy"                    # one target per row of the Gram matrices (task as above)

    [bank]                              # your own Gram matrices instead of families (string, graph kernels...)
    grams = "K.npy"                     # an (M, n, n) .npy (memory-mapped) or a dense bank folder, over the
                                        # dataset's n rows in its order; each split's training Gram
                                        # matrices are imported (KernelBank.from_arrays: checked symmetric and
                                        # PSD), the test rows' cross kernels predicted from; the models
                                        # take kernels (kernels="precomputed")
    names = ["string", "graph"]         # optional: one name per matrix (the report's kernel names)
    normalize = "trace"                 # "trace" | "none"

    [bank]                              # one family, or a list under families = [...] (names or tables)
    family = "simplemkl"                # + that family's parameters, e.g. widths = [1, 2], features = "all";
                                        # every parameter is optional and a name means the same bank as
                                        # in Python and on the CLI (bank.families: auto, simplemkl,
                                        # gaussian, polynomial, linear, random_subsets; "gaussian" is the
                                        # 24 SimpleMKL widths on all features and on each single one)
    normalize = "trace"                 # "trace" | "diag" | "none"
    dtype = "float32"
    path = "bank.zarr"                  # relative to the run directory, or absolute (shared banks)
    rank = 64                           # optional: a factor bank, K~_m = L_m L_m^T with L_m n x rank
    method = "nystrom"                  # factor banks: "nystrom" | "cholesky"
    landmarks = "kmeans++"              # factor banks, nystrom: "kmeans++" | "uniform"
    tol = 1e-6                          # factor banks, cholesky: relative residual trace
    max_error = 0.05                    # factor banks: warn above this relative trace error

    [[solver]]                          # any number; each becomes one fitted model
    name = "spicy_l1"                   # unique label
    solver = "spicy"                    # mklscale.solvers.registry name
    C = 0.05                            # the solver's main regularisation (see the registry); a list
                                        # [0.01, 0.1] or "auto": chosen by k-fold CV on the training
                                        # rows (mklscale.model_selection; also tau / lam by their names)
    cv_folds = 3                        # folds of that CV (only with a list or "auto")
    loss = "logistic"                   # every other key is a parameter of that solver

    [[path]]                            # optional: PFBS regularisation paths (square loss)
    name = "pfbs_path"
    mu = 1e-4
    n_taus = 20
    eps = 1e-3                          # smallest tau = eps * tau_max
    cv_folds = 0                        # > 1: choose tau by k-fold cross-validation

    [report]
    enabled = true

    [checkpoint]                        # iterative solvers save their state into checkpoints/
    every_s = 60.0

Unknown keys and wrong types are :class:`~mklscale.errors.ConfigError` before any work starts; so
are, for [dataset] path, a missing file or target column, feature columns that are not numbers,
NaN or infinite values, a target of one class, and a .parquet file without pyarrow installed.
The report and results.json name kernels by the table's column names.

The run directory holds ``pipeline.toml`` (a copy of the spec), ``bank.zarr`` (unless the bank
path is absolute), ``models/<name>/`` (one model file per solver, see ``mklscale.model``),
``results.json`` (schema below, written atomically when the run ends), ``report/`` and
``checkpoints/``: each solver's state while it runs (see ``mklscale.runtime.checkpoint``) and, for
each finished solver, its results entry (``<name>.done.json``). On SIGTERM/SIGINT (preemption,
walltime, Ctrl-C) in any stage the run stops with ``Stopped`` (exit code 75), whose one line says
what was saved (bank kernels, finished solvers, the running solver's checkpoint) and the command
that resumes; a checkpointed solver saves its state first, Citi and the baselines start over.
``run_pipeline(..., resume=True)`` (``mklscale run ... --resume``) reuses the bank (builds resume
kernel by kernel), the finished solvers' entries and models, and continues the interrupted solver
from its checkpoint, giving the same results as an uninterrupted run; on a finished run it changes
nothing. A run directory holding an earlier run is refused unless ``resume`` or ``overwrite``.

Before any work (the cluster, the bank) every [[solver]]'s values are checked as the estimators
check them, the split must leave 2 training rows per class, and the bank must fit on its disk.

results.json: ``schema_version``, ``mklscale_version``, ``pipeline`` {name, description, path,
config}, ``started``/``finished``/``seconds``, ``machine``, ``cluster`` {kind, dashboard, workers},
``dataset`` {name, task, n_train, n_test, n_features, classes, feature_names, null_model}, ``bank`` {path, M,
n, dtype, normalize, build_seconds, kernels_computed, families}, ``solvers``: one entry per solver
and per path with name, solver, params, status ("ok"/"failed"), error, metrics (train/test
accuracy, balanced_accuracy and roc_auc, or r2 and rmse), confusion_matrix (classification, test
rows: labels, counts[true][predicted]), seconds, passes, bytes_read, converged, objective, gap,
n_active, kernels (kept kernels with index, name, family, params, features, weight, head; the name
shows the dataset's feature names, e.g. ``gaussian(width=2)[mean radius]``, the features their
column indices), history (per iteration, with
head for one-vs-rest), path (for [[path]] entries: parameter, values, kernel_names, weights,
n_active, scores, score_name), convergence_warning (the estimator's ConvergenceWarning text:
solver, class, gap and what to change; null when converged), model (relative path or null), cv
(the cross-validation curve and the chosen value when C was a list or "auto", else null),
null_model (the test metric beside the majority-class / mean predictor's) and constant_predictor
(whether the model predicts one class / value everywhere). docs/design.md, "Model selection and
the null model", lists these fields.

A solver that did not converge is flagged on its console line (``!! NOT CONVERGED (gap ...)``,
followed by the warning's text) and in the report; the run goes on. The console line shows the
majority rate (or the mean predictor's R^2) beside the solver's test metric, the cross-validated
value, and ``!! CONSTANT PREDICTOR (every row ...)`` for a model that predicts one class / value.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from sklearn.exceptions import ConvergenceWarning

from mklscale import __version__, model_selection, null_model
from mklscale.bank.factor import LANDMARK_RULES, MAX_ERROR, METHODS, FactorSettings
from mklscale.bank.storage.location import bank_location, is_url, redact_options, redact_toml
from mklscale.config import Field, check_table, check_value, fraction, one_of, positive, read_toml
from mklscale.errors import (
    CheckpointError,
    ClusterUnavailableError,
    ConfigError,
    InvalidInputError,
    MKLScaleError,
    OutputWriteError,
    Preempted,
    Stopped,
)
from mklscale.runtime.interrupt import stop_cleanly
from mklscale.solvers.result import json_safe

SCHEMA_VERSION = 1
#: the most values a [[path]] may have (each is a solve; a billion would run for ever)
MAX_TAUS = 10_000
#: the training split must keep this many rows of each class (of all rows, for regression)
MIN_TRAIN_PER_CLASS = 2
#: the flag the console line of an unconverged solver carries (the report shows its own)
NOT_CONVERGED = "!! NOT CONVERGED"
#: the flag of a model that predicts one class (or one value) for every train and test row
CONSTANT_PREDICTOR = "!! CONSTANT PREDICTOR"
#: the estimators' ConvergenceWarning, which the run prints and records instead of warning
_CONVERGENCE_WARNING = r"MKL(Classifier|Regressor): solver .* did not converge"

_TOP = {
    "name": Field((str,)),
    "description": Field((str,), ""),
    "seed": Field((int,), 0, lambda v: None if 0 <= v < 2**32 else
                  f"must be between 0 and 2**32 - 1 (a numpy seed), got {v}; give a seed in that range"),
    "dataset": Field((dict,)),
    "bank": Field((dict,)),
    "solver": Field((list,), []),
    "path": Field((list,), []),
    "report": Field((dict,), {}),
    "checkpoint": Field((dict,), {}),
}
_DATASET = {
    "name": Field((str,), None),
    "path": Field((str,), None),
    "target": Field((str,), None),
    "labels": Field((str,), None),
    "task": Field((str,), None, one_of("classification", "regression")),
    "test_fraction": Field((float,), 0.25, fraction),
    "max_train": Field((int,), 0, lambda v: None if v >= 0 else "must be >= 0 (0 = all rows)"),
    "options": Field((dict,), {}),
}
_BANK = {
    "family": Field((str,), None),
    "families": Field((list,), None),
    # your own Gram matrices instead of families: an (M, n, n) .npy or a dense bank folder over the dataset's rows
    "grams": Field((str,), None),
    "names": Field((list,), None),
    "normalize": Field((str,), "trace", one_of("trace", "diag", "none")),
    "dtype": Field((str,), "float32", one_of("float32", "float64")),
    "path": Field((str,), "bank.zarr"),
    "rank": Field((int,), None, positive),
    "method": Field((str,), FactorSettings.method, one_of(*METHODS)),
    "landmarks": Field((str,), FactorSettings.landmarks, one_of(*LANDMARK_RULES)),
    "tol": Field((float,), FactorSettings.tol, positive),
    "max_error": Field((float,), MAX_ERROR, positive),
    # overrides of AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for a path s3://bucket/prefix (issue 20)
    "storage_options": Field((dict,), None),
}
_FACTOR_KEYS = ("method", "landmarks", "tol", "max_error")
_SOLVER_FIXED = {"name": Field((str,)), "solver": Field((str,)),
                 "C": Field((float, list, str), None, model_selection.check_grid),
                 "cv_folds": Field((int,), model_selection.DEFAULT_FOLDS,
                                   lambda v: None if v >= 2 else f"must be >= 2, got {v!r}")}
_PATH = {
    "name": Field((str,)),
    "mu": Field((float,), 1e-4, lambda v: None if v >= 0 else "must be >= 0"),
    "n_taus": Field((int,), 20, lambda v: None if 1 <= v <= MAX_TAUS else
                    f"must be between 1 and {MAX_TAUS}, got {v}; give fewer values (20-100 trace a path well)"),
    "eps": Field((float,), 1e-3, fraction),
    "tol": Field((float,), 1e-6, positive),
    "cv_folds": Field((int,), 0, lambda v: None if v == 0 or v > 1 else "must be 0 (no CV) or >= 2"),
}
_REPORT = {"enabled": Field((bool,), True)}
_CHECKPOINT = {"every_s": Field((float,), 60.0, positive)}
_PARAM_TYPES = (str, int, float, bool, list)


@dataclasses.dataclass
class Pipeline:
    """A validated pipeline spec (see the module docstring); ``raw`` is the parsed TOML."""

    name: str
    description: str
    seed: int
    dataset: dict
    bank: dict
    solvers: list[dict]
    paths: list[dict]
    report: bool
    checkpoint_every_s: float
    source: Path | None
    raw: dict
    dataset_option: str | None = None   # the offline dataset `mklscale run --dataset` put in [dataset]


def load_pipeline(spec: str | os.PathLike | dict) -> Pipeline:
    """Read and validate a pipeline TOML file (or an already-parsed dict)."""
    source = None if isinstance(spec, dict) else Path(spec)
    raw = spec if isinstance(spec, dict) else read_toml(source, "pipeline")
    where = f"pipeline {source}" if source else "pipeline"
    top = check_table(raw, _TOP, where)
    dataset = _check_dataset(top["dataset"], f"{where} [dataset]", source)
    bank = _check_bank(top["bank"], f"{where} [bank]", source)
    if dataset["name"] is None and dataset["path"] is None and bank["grams"] is None:
        raise ConfigError(f"{where} [dataset]: labels alone (no name or path) give only targets; they go with "
                          "[bank] grams = \"K.npy\" (your own Gram matrices over the same rows). Add grams, or give "
                          "the features with path = \"X.npy\"")
    solvers = [_check_solver(entry, f"{where} [[solver]] #{i + 1}") for i, entry in enumerate(top["solver"])]
    paths = [check_table(entry, _PATH, f"{where} [[path]] #{i + 1}") for i, entry in enumerate(top["path"])]
    if not solvers and not paths:
        raise ConfigError(f"{where} has no [[solver]] and no [[path]] entry; add at least one")
    names = [s["name"] for s in solvers] + [p["name"] for p in paths]
    duplicates = sorted(n for n, c in collections.Counter(names).items() if c > 1)
    if duplicates:
        raise ConfigError(f"{where}: solver/path names must be unique; repeated: {', '.join(duplicates)}; rename "
                          "the repeated entries (each name becomes a model folder)")
    bad = [n for n in names if not n or not all(c.isalnum() or c in "-_." for c in n)]
    if bad:
        raise ConfigError(f"{where}: names may use letters, digits, '-', '_' and '.' only (they name model "
                          f"folders); fix {', '.join(map(repr, bad))}")
    report = check_table(top["report"], _REPORT, f"{where} [report]")["enabled"]
    every_s = check_table(top["checkpoint"], _CHECKPOINT, f"{where} [checkpoint]")["every_s"]
    return Pipeline(top["name"], top["description"], top["seed"], dataset, bank, solvers, paths, report,
                    every_s, source, raw)


def _check_dataset(table, where: str, source: Path | None) -> dict:
    """[dataset]: exactly one of ``name`` (an offline dataset, with ``options``) or ``path`` (a file of
    the user's, with ``target`` or ``labels`` and optionally ``task``); ``path`` and ``labels`` are
    resolved against the pipeline file's folder (``file``, ``labels_file``)."""
    from mklscale.datasets import available
    from mklscale.tabular import kind

    cfg = check_table(table, _DATASET, where)

    def resolve(text: str) -> Path:
        file = Path(text).expanduser()
        return file if file.is_absolute() or source is None else source.parent / file

    if cfg["name"] is None and cfg["path"] is None and cfg["labels"] is not None:
        if cfg["target"] is not None or cfg["options"]:
            raise ConfigError(f"{where}: labels alone (with [bank] grams) take no target or options; remove them")
        cfg.update(file=None, labels_file=resolve(cfg["labels"]))     # targets only: the kernels are the data
        return cfg
    if (cfg["name"] is None) == (cfg["path"] is None):
        raise ConfigError(f"{where}: give exactly one of name = \"...\" (an offline dataset: "
                          f"{', '.join(available())}) or path = \"data.csv\" (your own .csv, .parquet or .npy file), "
                          "or labels = \"y.npy\" alone with [bank] grams (your own Gram matrices)")
    if cfg["name"] is not None:
        extra = [k for k in ("target", "labels", "task") if cfg[k] is not None]
        if extra:
            raise ConfigError(f"{where}: {', '.join(extra)} apply to path = \"...\" (your own data) only; remove "
                              f"them (the dataset {cfg['name']!r} has its own target and task)")
        return cfg
    if cfg["options"]:
        raise ConfigError(f"{where}: options apply to an offline dataset (name = \"...\") only; remove them")
    cfg["file"] = resolve(cfg["path"])
    file_kind = kind(cfg["file"])
    if file_kind is None:
        raise ConfigError(f"{where}.path: {cfg['path']!r} is not a .csv, .parquet or .npy file (by its name); give "
                          "a .csv file with a header row, a .parquet file or a .npy array")
    if file_kind == "npy":
        if cfg["target"] is not None:
            raise ConfigError(f"{where}: target names a column of a .csv or .parquet table, and {cfg['path']} is a "
                              ".npy array; give its targets as a second .npy file with labels = \"y.npy\"")
        if cfg["labels"] is None:
            raise ConfigError(f"{where}: path = {cfg['path']!r} is a .npy array of features; add labels = \"y.npy\", "
                              "a .npy file with one target per row")
    else:
        if cfg["labels"] is not None:
            raise ConfigError(f"{where}: labels is for .npy feature files; for the table {cfg['path']} name its "
                              "target column with target = \"COLUMN\"")
        if cfg["target"] is None:
            raise ConfigError(f"{where}: path = {cfg['path']!r} is a table; add target = \"COLUMN\", the column that "
                              "holds the labels (or values) to predict; the other columns are the features")
    cfg["labels_file"] = None if cfg["labels"] is None else resolve(cfg["labels"])
    return cfg


def with_dataset(pipe: Pipeline, name: str) -> Pipeline:
    """``pipe`` with its [dataset] replaced by the offline dataset ``name`` (``mklscale run --dataset``).

    ``test_fraction`` and ``max_train`` stay; a file's ``path``, ``target``, ``labels`` and ``task``
    go; of ``options``, the keys ``name`` accepts stay (a generated set's n_samples for another
    generated set) and the others go, listed in ``dropped_options`` (the run prints them). The
    default run directory becomes ``runs/<pipeline name>-<name>`` and results.json records ``name``.
    """
    from mklscale.datasets import accepted_options, available

    if name not in available():
        raise ConfigError(f"--dataset {name!r}: unknown dataset; choose one of {', '.join(available())}")
    old = pipe.dataset
    accepted = accepted_options(name)
    options = {k: v for k, v in old["options"].items() if k in accepted}
    dataset = {**{k: None for k in ("path", "target", "labels", "task", "file", "labels_file")},
               "name": name, "test_fraction": old["test_fraction"], "max_train": old["max_train"], "options": options,
               "dropped_options": sorted(set(old["options"]) - set(options))}
    raw_dataset = {k: v for k, v in pipe.raw["dataset"].items() if k in ("test_fraction", "max_train")}
    raw = {**pipe.raw, "dataset": {"name": name, **raw_dataset, **({"options": options} if options else {})}}
    return dataclasses.replace(pipe, dataset=dataset, raw=raw, dataset_option=name)


def _check_bank(table, where: str, source: Path | None = None) -> dict:
    """Bank table: exactly one of ``family`` (+ its parameters) or ``families`` (a list of family names
    or tables). Each family description is checked by ``bank.families.parameters`` and turned into
    specs by ``bank.families.resolve``, as the estimators' ``kernels=`` and the CLI's ``--family``
    are: a family name means the same bank everywhere (``family = "gaussian"`` is
    ``{"family": "gaussian"}`` with the family's defaults)."""
    from mklscale.bank.families import FAMILIES, FAMILY_PARAMS, parameters
    from mklscale.errors import SpecError

    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    if "grams" in table:
        return _check_grams_bank(table, where, source)
    if "names" in table:
        raise ConfigError(f"{where}: names labels the Gram matrices of grams = \"K.npy\"; remove it, or add grams")
    family = table.get("family")
    param_keys = set(FAMILY_PARAMS.get(family, ())) if isinstance(family, str) else set()
    unknown = sorted(set(table) - set(_BANK) - param_keys)
    if unknown and family in FAMILY_PARAMS:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} for family {family!r}; remove or rename them "
                          f"(family parameters: {', '.join(FAMILY_PARAMS[family]) or 'none'}; bank keys: "
                          f"{', '.join(k for k in _BANK if k != 'families')})")
    fixed = check_table({k: v for k, v in table.items() if k not in param_keys}, _BANK, where)
    if (fixed["family"] is None) == (fixed["families"] is None):
        raise ConfigError(f"{where}: give either family = \"...\" (with its parameters) or families = [...]")
    if fixed["family"] is not None:
        if fixed["family"] not in FAMILY_PARAMS:
            raise ConfigError(f"{where}.family: unknown family {fixed['family']!r}; choose one of "
                              f"{', '.join(FAMILIES)}")
        kernels = [{"family": family, **{k: table[k] for k in param_keys if k in table}}]
        places = [where]
    else:
        kernels = fixed["families"]
        if not kernels:
            raise ConfigError(f"{where}.families is empty; give at least one family, e.g. families = [\"auto\"]")
        places = [f"{where}.families[{i}]" for i in range(len(kernels))]
    for place, entry in zip(places, kernels):
        if not isinstance(entry, (str, dict)):
            raise ConfigError(f"{place} must be a family name or a table with family = one of {', '.join(FAMILIES)}; "
                              f"got {entry!r}")
        try:
            parameters(entry)
        except SpecError as exc:
            raise ConfigError(f"{place}: {exc}") from None
    if fixed["rank"] is None and any(k in table for k in _FACTOR_KEYS):
        raise ConfigError(f"{where}: {', '.join(k for k in _FACTOR_KEYS if k in table)} apply to factor banks only; "
                          "add rank = R (e.g. rank = 64) or remove them")
    factor = {} if fixed["rank"] is None else {k: fixed[k] for k in ("rank", *_FACTOR_KEYS)}
    try:  # a URL scheme other than s3://, or storage options for a local path, are refused here
        bank_location(fixed["path"], fixed["storage_options"])
    except InvalidInputError as exc:
        raise ConfigError(f"{where}.path: {exc}") from None
    return {"kernels": kernels, "normalize": fixed["normalize"], "dtype": fixed["dtype"], "path": fixed["path"],
            "factor": factor, "storage_options": fixed["storage_options"], "grams": None, "names": None}


def _check_grams_bank(table: dict, where: str, source: Path | None) -> dict:
    """[bank] grams = "K.npy" (or a dense bank folder): the user's own Gram matrices over the dataset's rows,
    imported per split (``_load_data``, ``_build_bank``); no families, no factor settings."""
    fixed = check_table(table, _BANK, where)
    clash = [k for k in ("family", "families", "rank", *_FACTOR_KEYS, "storage_options") if k in table]
    if clash:
        raise ConfigError(f"{where}: grams gives the kernels themselves; remove {', '.join(clash)} (families and factor "
                          "settings compute kernels from features)")
    if fixed["normalize"] == "diag":
        raise ConfigError(f"{where}.normalize: \"diag\" needs k(x, x) of the test rows' own kernels, which imported "
                          "Gram matrices are scaled without; use \"trace\" (the default) or \"none\"")
    names = fixed["names"]
    if names is not None and (not all(isinstance(x, str) for x in names) or len(set(names)) != len(names)):
        raise ConfigError(f"{where}.names must be distinct strings, one per Gram matrix; got {names!r}")
    file = Path(fixed["grams"]).expanduser()
    file = file if file.is_absolute() or source is None else source.parent / file
    if is_url(fixed["path"]):
        raise ConfigError(f"{where}.path: with grams the run imports the training Gram matrices into a local folder; "
                          "give a folder path")
    return {"kernels": None, "normalize": fixed["normalize"], "dtype": fixed["dtype"], "path": fixed["path"],
            "factor": {}, "storage_options": None, "grams": file, "names": names}


def _check_solver(table, where: str) -> dict:
    """A [[solver]] entry: name, solver, C, and parameters the registry says that solver accepts."""
    from mklscale.solvers import registry

    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    fixed = check_table({k: v for k, v in table.items() if k in _SOLVER_FIXED}, _SOLVER_FIXED, where)
    if fixed["solver"] not in registry.names() and fixed["solver"] not in registry.ALIASES:
        raise ConfigError(f"{where}.solver: unknown solver {fixed['solver']!r}; choose one of "
                          f"{', '.join(registry.names())}")
    accepted = registry.accepted_params(fixed["solver"])
    params = {k: v for k, v in table.items() if k not in _SOLVER_FIXED}
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(f"{where}: solver {fixed['solver']!r} does not take {', '.join(unknown)}; remove it or use "
                          f"one of its parameters: {', '.join(['C'] + sorted(set(accepted) - {'C'}))}")
    for key, value in params.items():
        check_value(value, Field(_PARAM_TYPES), f"{where}.{key}")
    entry = {**fixed, "params": params}
    if model_selection.request(entry, where) is None and "cv_folds" in table:
        raise ConfigError(f"{where}: cv_folds applies only when C (or the solver's tau / lam) is a list of values "
                          'or "auto"; give a grid or remove cv_folds')
    return entry


# ---- running ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Data:
    name: str
    task: str               # "classification" | "regression"
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    classes: list | None
    feature_names: tuple[str, ...] | None = None   # one per column; kernel names use them


def run_pipeline(spec, out: str | os.PathLike | None = None, cluster=None, quiet: bool = False,
                 resume: bool = False, overwrite: bool = False, dataset: str | None = None) -> dict:
    """Run every stage of a pipeline and return the results dict (also written to ``out/results.json``).

    ``spec``: a path, a dict or a :class:`Pipeline`. ``out``: the run directory (default
    ``runs/<name>``). ``cluster``: a cluster config path/dict for ``mklscale.runtime.cluster``
    (None: the embedded LocalCluster). ``quiet``: no progress bars, per-iteration lines or kernel
    lists; the summary lines (each solver's result or failure, bank warnings, where the results and
    the report went) are printed still.
    ``resume``: continue an interrupted run in ``out`` (see the module docstring); a finished run
    is returned as it is (its report written if it is missing). ``overwrite``: replace an earlier
    run in ``out`` (its bank too, when the bank lives in the run directory). An earlier run in
    ``out`` without either is refused. SIGTERM/SIGINT raise ``Stopped``, whose message says what
    was saved and how to resume. ``dataset``: an offline dataset that replaces the pipeline's
    [dataset] for this run (:func:`with_dataset`; the default ``out`` is then
    ``runs/<name>-<dataset>``).
    """
    pipe = spec if isinstance(spec, Pipeline) else load_pipeline(spec)
    if dataset is not None:
        pipe = with_dataset(pipe, dataset)
    label = pipe.name if pipe.dataset_option is None else f"{pipe.name}-{pipe.dataset_option}"
    run_dir = Path(out) if out is not None else Path("runs") / label
    stage = _Stage()
    with stop_cleanly():
        try:
            return _run(pipe, run_dir, cluster, quiet, resume, overwrite, stage)
        except (Stopped, Preempted) as exc:
            raise Stopped(exc.signum, _stop_message(exc, pipe, run_dir, stage)) from None


@dataclasses.dataclass
class _Stage:
    """How far a run got, for the message of a stop: what it was doing, the bank, finished solvers."""

    doing: str = "loading the data"
    bank: Path | None = None
    finished: list = dataclasses.field(default_factory=list)
    solver: str | None = None


def _run(pipe: Pipeline, run_dir: Path, cluster, quiet: bool, resume: bool, overwrite: bool, stage: _Stage) -> dict:
    from mklscale.runtime.cluster import load_cluster_config, open_client

    cluster_config = load_cluster_config(cluster) if cluster is not None else None
    _check_run_dir(run_dir, resume, overwrite)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    if resume and (run_dir / "results.json").is_file():
        return _finished_run(pipe, run_dir, stage)
    started, t0 = _now(), time.perf_counter()
    data = _load_data(pipe, say)
    _check_solvers(pipe, data.task)
    say(f"[{pipe.name}] {data.name}: {len(data.y_train)} training rows, {len(data.y_test)} test rows, "
        + (f"{data.X_train.shape[0]} Gram matrices" if data.X_train.ndim == 3 else f"{data.X_train.shape[1]} features")
        + f" ({data.task})")
    null = null_model.null_model(data.task, data.y_train, data.y_test)
    say(f"[{pipe.name}] null model: {_null_text(null)}")
    stage.doing = "starting the cluster"
    with open_client(cluster_config, quiet=quiet) as client:
        # the run folder is created only once the data loaded and the cluster answered, so a bad
        # dataset or an unreachable cluster leaves nothing on disk
        _prepare_run_dir(run_dir, pipe, overwrite)
        try:
            bank, bank_info = _build_bank(pipe, data, run_dir, client, quiet, say, overwrite, stage)
            entries = []
            for entry in pipe.solvers:
                stage.doing, stage.solver = f"running solver {entry['name']}", entry["name"]
                entries.append(_run_solver(entry, bank, data, run_dir, client, quiet, say, pipe.checkpoint_every_s,
                                           resume, seed=pipe.seed))
                stage.finished.append(entry["name"])
            for entry in pipe.paths:
                stage.doing, stage.solver = f"running path {entry['name']}", entry["name"]
                entries.append(_run_path(entry, bank, data, client, quiet, say))
            stage.solver = None
        except ClusterUnavailableError as exc:
            raise ClusterUnavailableError(
                f"{exc}. The run's state is kept in {run_dir} (the bank, finished solvers and checkpoints in "
                f"{run_dir / 'checkpoints'}); when the cluster is back, resume with: "
                f"{_resume_command(pipe, run_dir)}") from exc
        cluster_info = _cluster_info(cluster_config, client)
    results = {
        "schema_version": SCHEMA_VERSION, "mklscale_version": __version__,
        "pipeline": {"name": pipe.name, "description": pipe.description,
                     "path": str(pipe.source) if pipe.source else None, "config": _redacted(pipe.raw)},
        "started": started, "finished": _now(), "seconds": time.perf_counter() - t0,
        "machine": _machine(), "cluster": cluster_info,
        "dataset": {"name": data.name, "task": data.task, "n_train": int(len(data.y_train)),
                    "n_test": int(len(data.y_test)),
                    "n_features": None if data.X_train.ndim == 3 else int(data.X_train.shape[1]),
                    "classes": data.classes, "null_model": null,
                    "feature_names": None if data.feature_names is None else list(data.feature_names)},
        "bank": bank_info, "solvers": entries,
    }
    stage.doing = "writing the results"
    write_json_atomic(run_dir / "results.json", json_safe(results))
    stage.doing = "writing the report"
    if pipe.report:
        from mklscale.report import write_report

        _summary(f"[{pipe.name}] report: {write_report(run_dir, quiet=True)}")
    _summary(f"[{pipe.name}] results: {run_dir / 'results.json'}")
    return results


def _summary(line: str) -> None:
    """Print a line ``quiet`` keeps: a solver's result or failure, a bank warning, where the results went."""
    print(line, flush=True)


def _finished_run(pipe: Pipeline, run_dir: Path, stage: _Stage) -> dict:
    """``resume`` on a run that finished: its results as they are (timings included); only a missing
    report is written."""
    from mklscale.report import write_report

    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{run_dir / 'results.json'} is unreadable ({exc}); rerun the pipeline with "
                                "--overwrite") from None
    _summary(f"[{pipe.name}] finished before: {run_dir / 'results.json'} kept as it is")
    if pipe.report and not (run_dir / "report" / "index.html").is_file():
        stage.doing = "writing the report"
        _summary(f"[{pipe.name}] report: {write_report(run_dir, quiet=True)}")
    return results


#: what an earlier run leaves in its run directory
_RUN_OUTPUTS = ("results.json", "checkpoints", "models", "report")


def _check_run_dir(run_dir: Path, resume: bool = False, overwrite: bool = False) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise InvalidInputError(f"--out {run_dir} exists and is not a directory; choose another run directory")
    earlier = [name for name in _RUN_OUTPUTS if (run_dir / name).exists()]
    if earlier and not (resume or overwrite):
        raise InvalidInputError(f"--out {run_dir} holds an earlier run ({', '.join(earlier)}); pass --resume to "
                                "continue it, --overwrite to replace it (run_pipeline: resume=True / "
                                "overwrite=True), or choose another --out")


def _redacted(raw: dict) -> dict:
    """The parsed spec with the secrets of its bank's storage options replaced (results.json)."""
    bank = raw.get("bank")
    if not isinstance(bank, dict) or not isinstance(bank.get("storage_options"), dict):
        return raw
    return {**raw, "bank": {**bank, "storage_options": redact_options(bank["storage_options"])}}


def _prepare_run_dir(run_dir: Path, pipe: Pipeline, overwrite: bool = False) -> None:
    """Create the run directory and keep a copy of the spec that produced it; with ``overwrite``, the
    earlier run's outputs go first (an earlier bank is replaced by the build)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise InvalidInputError(f"--out {run_dir} exists and is not a directory; choose another run directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        (run_dir / "results.json").unlink(missing_ok=True)
        for name in ("checkpoints", "models", "report"):
            shutil.rmtree(run_dir / name, ignore_errors=True)
    if pipe.source is not None:
        # the copy never holds credentials of a [bank.storage_options] table
        text = redact_toml(Path(pipe.source).read_text())
        if pipe.dataset_option is not None:
            text = (f"# run with --dataset {pipe.dataset_option}: [dataset] name = \"{pipe.dataset_option}\" replaced "
                    "the [dataset] below (results.json records it)\n") + text
        (run_dir / "pipeline.toml").write_text(text)


def _check_solvers(pipe: Pipeline, task: str) -> None:
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


def _stop_message(exc: Stopped | Preempted, pipe: Pipeline, run_dir: Path, stage: _Stage) -> str:
    """One line: the signal, what the run was doing, what is saved, and the command that resumes."""
    import signal as signals

    saved = []
    if stage.bank is not None:
        saved.append(_bank_progress(stage.bank))
    if stage.finished:
        saved.append(f"finished solver(s) {', '.join(stage.finished)}")
    if isinstance(exc, Preempted) and exc.checkpoint:
        saved.append(f"the state of {stage.solver} ({exc.checkpoint})")
    if (run_dir / "results.json").is_file():
        saved.append("results.json")
    note = "" if stage.solver is None or isinstance(exc, Preempted) and exc.checkpoint else \
        f" ({stage.solver} keeps no checkpoint and starts over)"
    return (f"stopped by {signals.Signals(exc.signum).name} while {stage.doing}: saved "
            f"{'; '.join(saved) if saved else 'nothing yet'}{note}; resume with: {_resume_command(pipe, run_dir)}")


def _resume_command(pipe: Pipeline, run_dir: Path) -> str:
    """The command that continues this run (with the --dataset it was started with)."""
    source = pipe.source if pipe.source is not None else "PIPELINE.toml"
    option = "" if pipe.dataset_option is None else f" --dataset {pipe.dataset_option}"
    return f"mklscale run {source}{option} --out {run_dir} --resume"


def _bank_progress(path: Path) -> str:
    from mklscale.bank import KernelBank

    try:
        bank = KernelBank.open(path)
        done = int(bank.complete.sum())
    except Exception:  # noqa: BLE001 - a message about a stop must not fail on a bank it cannot read
        return f"the bank {path}"
    return f"{done} of {len(bank)} bank kernels ({path})"


def _load_data(pipe: Pipeline, say=lambda *a: None) -> _Data:
    """Load the dataset (an offline one, or the user's file: ``mklscale.tabular``) and split it
    (seeded; stratified for classification); ``say`` prints an inferred task or dropped options."""
    from sklearn.model_selection import train_test_split

    from mklscale.datasets import load

    cfg = pipe.dataset
    if cfg["name"] is None and cfg["path"] is None:     # labels alone: the data are [bank] grams
        X, y, task, name, feature_names = _read_labels(cfg, pipe, say)
    elif cfg["path"] is not None:
        X, y, task, name, feature_names = _read_own_data(cfg, pipe, say)
    else:
        if cfg["options"].get("standardise", False):
            raise ConfigError("pipeline [dataset] options: standardise = true is not allowed: the run fits on the raw "
                              "features (the bank standardises them and every saved model keeps that "
                              "standardisation, so it predicts from raw features); remove standardise")
        if cfg.get("dropped_options"):
            say(f"[{pipe.name}] --dataset {cfg['name']}: the pipeline's [dataset] options "
                f"{', '.join(cfg['dropped_options'])} do not apply to {cfg['name']} and are not used")
        try:
            ds = load(cfg["name"], **{**cfg["options"], "standardise": False})
        except InvalidInputError as exc:
            raise ConfigError(f"pipeline [dataset]: {exc}") from None
        X, y, name, feature_names = ds.X, ds.y, ds.name, tuple(ds.feature_names)
        task = "regression" if ds.task == "regression" else "classification"
    stratify = y if task == "classification" else None
    grams = None
    if pipe.bank["grams"] is not None:   # the rows of the user's Gram matrices take the features' place
        grams, X, feature_names = _read_grams(pipe, len(y)), np.arange(len(y)), None
        name = f"{name} with {pipe.bank['grams'].name}"
    try:
        X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=cfg["test_fraction"],
                                                  random_state=pipe.seed, stratify=stratify)
    except ValueError as exc:
        raise ConfigError(f"pipeline [dataset] test_fraction = {cfg['test_fraction']}: {name} ({len(y)} rows) "
                          f"cannot be split so ({exc}); give a smaller test_fraction") from None
    if cfg["max_train"] and cfg["max_train"] < len(y_tr):
        X_tr, y_tr = X_tr[: cfg["max_train"]], y_tr[: cfg["max_train"]]
    counts = np.unique(y_tr, return_counts=True)[1] if task == "classification" else np.array([len(y_tr)])
    if counts.size < (2 if task == "classification" else 1) or counts.min() < MIN_TRAIN_PER_CLASS:
        per = "of each class" if task == "classification" else ""
        raise ConfigError(f"pipeline [dataset]: test_fraction = {cfg['test_fraction']} (max_train = {cfg['max_train']}) "
                          f"leaves {len(y_tr)} training rows of {name}'s {len(y)}, fewer than "
                          f"{MIN_TRAIN_PER_CLASS} {per}; give a smaller test_fraction (0.25 is usual) or a larger "
                          "max_train")
    classes = sorted(np.unique(y_tr).tolist()) if task == "classification" else None
    if grams is not None:   # X becomes the raw kernels: (M, n_train, n_train) and the test rows' (M, n_test, n_train)
        X_tr, X_te = np.asarray(grams[:, X_tr][:, :, X_tr]), np.asarray(grams[:, X_te][:, :, X_tr])
    return _Data(name, task, X_tr, y_tr, X_te, y_te, classes, feature_names)


def _read_labels(cfg: dict, pipe: Pipeline, say):
    """[dataset] labels alone (with [bank] grams): (row placeholder, y, task, name, None)."""
    from mklscale import tabular

    where = f"pipeline {pipe.source} [dataset]" if pipe.source else "pipeline [dataset]"
    try:
        y = tabular.load_npy(cfg["labels_file"], "labels")
        if y.ndim != 1:
            raise InvalidInputError(f"labels {cfg['labels_file']} must hold one target per row (1-D); got shape {y.shape}")
        task, note = tabular.check_task(y, cfg["task"], f"labels {cfg['labels_file']}", tabular.PIPELINE)
    except InvalidInputError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if note:
        say(f"[{pipe.name}] {note}")
    return None, y, task, Path(cfg["labels_file"]).name, None


def _read_grams(pipe: Pipeline, n: int):
    """The user's Gram matrices ([bank] grams): an (M, n, n) .npy (memory-mapped) or a dense bank folder over
    the dataset's n rows, in the dataset's row order."""
    from mklscale.bank import KernelBank

    where = f"pipeline {pipe.source} [bank].grams" if pipe.source else "pipeline [bank].grams"
    path = pipe.bank["grams"]
    if KernelBank.is_bank(path):
        bank = KernelBank.open(path)
        if bank.representation != "dense":
            raise ConfigError(f"{where}: {path} is a factor bank; grams takes dense Gram matrices (an .npy, or a dense "
                              "bank)")
        grams = np.asarray(bank.kernels(range(len(bank))))
    elif path.suffix == ".npy" and path.is_file():
        try:
            grams = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{where}: {path} is not a plain .npy array ({exc}); save it with numpy.save") from None
    else:
        raise ConfigError(f"{where}: {path} is neither a .npy file nor a kernel bank folder; give an (M, n, n) array "
                          "saved with numpy.save, or a bank built by `mklscale bank build`")
    if grams.ndim != 3 or grams.shape[1:] != (n, n) or not np.issubdtype(grams.dtype, np.floating):
        raise ConfigError(f"{where}: {path} holds an array of shape {grams.shape} ({grams.dtype}); give M Gram "
                          f"matrices over the dataset's {n} rows, an (M, {n}, {n}) float array")
    names = pipe.bank["names"]
    if names is not None and len(names) != grams.shape[0]:
        raise ConfigError(f"{where}: {len(names)} names for {grams.shape[0]} Gram matrices; give one name per matrix")
    return grams


def _read_own_data(cfg: dict, pipe: Pipeline, say):
    """[dataset] path: (X, y, task, name, feature names) from the user's .csv / .parquet / .npy file."""
    from mklscale import tabular

    where = f"pipeline {pipe.source} [dataset]" if pipe.source else "pipeline [dataset]"
    try:
        table = tabular.read_table(cfg["file"], target=cfg["target"], labels=cfg["labels_file"],
                                   spelling=tabular.PIPELINE)
        task, note = tabular.check_task(table.y, cfg["task"], f"path {cfg['file']}", tabular.PIPELINE)
    except InvalidInputError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if note:
        say(f"[{pipe.name}] {note}")
    return table.X, table.y, task, cfg["path"], table.feature_names


def _build_bank(pipe: Pipeline, data: _Data, run_dir: Path, client, quiet: bool, say, overwrite: bool = False,
                stage: _Stage | None = None):
    """Build (or resume, or reuse) the bank on the training rows; return it and its results entry.

    ``overwrite`` replaces a bank of other data in the run directory (never a shared bank given by
    an absolute path)."""
    from mklscale.bank import build_bank, families
    from mklscale.errors import BankMismatchError

    from mklscale.bank.size import check_fits, count_kernels

    cfg = pipe.bank
    shared = is_url(cfg["path"]) or Path(cfg["path"]).is_absolute()
    if cfg["grams"] is not None:
        return _import_grams(pipe, data, Path(cfg["path"]) if shared else run_dir / cfg["path"], say,
                             overwrite and not shared, stage)
    if is_url(cfg["path"]):  # a bank on an object store (its options never reach results or logs)
        path = bank_location(cfg["path"], cfg.get("storage_options"))
    else:
        path = Path(cfg["path"]) if shared else run_dir / cfg["path"]
        check_fits(path, count_kernels(cfg["kernels"], data.X_train.shape[1]), len(data.y_train), cfg["dtype"],
                   (cfg.get("factor") or {}).get("rank"), n_features=data.X_train.shape[1],
                   overwrite=overwrite and not shared, spelling="pipeline")
    specs = families.resolve(cfg["kernels"], data.X_train.shape[1])
    if stage is not None:
        stage.doing, stage.bank = "building the bank", path
    normalize = None if cfg["normalize"] == "none" else cfg["normalize"]
    say(f"[{pipe.name}] bank: {len(specs)} kernels, n = {len(data.y_train)} -> {path}")
    t0 = time.perf_counter()
    factor = cfg.get("factor") or {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            bank = build_bank(data.X_train, specs, path, normalize=normalize, dtype=cfg["dtype"], client=client,
                              progress=not quiet, overwrite=overwrite and not shared, **factor)
        except BankMismatchError:
            remedy = ("remove it or give [bank] path another folder" if shared else
                      "pass --overwrite to mklscale run (run_pipeline: overwrite=True) to rebuild it, or choose "
                      "another --out")
            raise BankMismatchError(f"the bank {path} was built from other data or settings than this pipeline's "
                                    f"training rows and [bank]; {remedy}") from None
    for w in caught:
        _summary(f"[{pipe.name}] bank: warning: {w.message}")
    info = {"path": str(path), "M": len(bank), "n": bank.n, "dtype": cfg["dtype"], "normalize": cfg["normalize"],
            **({} if not factor else {"representation": "factor", **factor,
                                      "approx_error_max": float(np.nanmax(bank.approx_error))}),
            "build_seconds": time.perf_counter() - t0, "kernels_computed": getattr(bank, "last_build_computed", None),
            "families": dict(collections.Counter(s.family for s in specs))}
    return bank, info


def _import_grams(pipe: Pipeline, data: _Data, path: Path, say, overwrite: bool, stage: _Stage | None):
    """[bank] grams: the training rows' Gram matrices imported into the run's bank (``KernelBank.from_arrays``:
    checked symmetric and PSD, sized against the disk first); a resumed run reuses the bank it imported."""
    from mklscale.bank import KernelBank

    cfg = pipe.bank
    if stage is not None:
        stage.doing, stage.bank = "importing the Gram matrices", path
    normalize = None if cfg["normalize"] == "none" else cfg["normalize"]
    say(f"[{pipe.name}] bank: {data.X_train.shape[0]} Gram matrices of {cfg['grams']}, n = {len(data.y_train)} -> {path}")
    t0 = time.perf_counter()
    if KernelBank.is_bank(path) and not overwrite:
        bank = KernelBank.open(path)
        if bank.M != data.X_train.shape[0] or bank.n != len(data.y_train):
            raise ConfigError(f"the bank {path} holds {bank.M} kernels over {bank.n} rows, not this run's training "
                              f"Gram matrices; pass --overwrite to replace it, or choose another --out")
        computed = 0
    else:
        bank = KernelBank.from_arrays(data.X_train, path, names=cfg["names"], normalize=normalize, dtype=cfg["dtype"],
                                      overwrite=overwrite)
        computed = len(bank)
    info = {"path": str(path), "M": len(bank), "n": bank.n, "dtype": cfg["dtype"], "normalize": cfg["normalize"],
            "grams": str(cfg["grams"]), "build_seconds": time.perf_counter() - t0, "kernels_computed": computed,
            "families": {"precomputed": len(bank)}}
    return bank, info


def _run_solver(entry: dict, bank, data: _Data, run_dir: Path, client, quiet: bool, say, every_s: float,
                resume: bool, seed: int = 0) -> dict:
    """Fit one [[solver]] entry on the bank, evaluate it on the test rows and save its model.

    The finished entry is kept in ``checkpoints/<name>.done.json``; with ``resume`` a finished
    entry with the same parameters is reused instead of fitting again.
    """
    from mklscale.estimators import MKLClassifier, MKLRegressor
    from mklscale.runtime.checkpoint import Preempted

    name = entry["name"]
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
                and (run_dir / str(previous.get("model"))).is_dir():
            _summary(f"[{name}] finished before the interruption; kept")
            return previous
    done.unlink(missing_ok=True)
    try:
        record["cv"] = _cross_validate(entry, bank, data, run_dir, client, say, seed, resume)
    except (Preempted, ClusterUnavailableError):
        raise
    except MKLScaleError as exc:
        record.update(status="failed", error=f"cross-validation: {type(exc).__name__}: {exc}")
        _summary(f"[{name}] FAILED: {record['error']}")
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
            estimator.fit_bank(bank, data.y_train, resume=resume)
    except (Preempted, ClusterUnavailableError):
        raise   # the run stops: resumable from its checkpoints, not a failure of this solver
    except MKLScaleError as exc:
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0)
        _summary(f"[{name}] FAILED: {record['error']}")
        return record
    record["seconds"] = time.perf_counter() - t0
    record["convergence_warning"] = estimator.fit_stats_.get("convergence_warning")
    record["metrics"] = _metrics(estimator, data)
    if data.task == "classification":
        record["confusion_matrix"] = _confusion(estimator, data)
    record.update(_null_model_check(estimator, data, record["metrics"]))
    record.update(_result_summary(estimator, bank, data.feature_names))
    model_dir = run_dir / "models" / name
    try:
        estimator.save(model_dir)
    except OutputWriteError as exc:  # a full disk stops the run; the bank and finished solvers are kept
        raise OutputWriteError(f"{exc}; add --resume to keep the run's bank and finished solvers") from None
    record["model"] = str(model_dir.relative_to(run_dir))
    write_json_atomic(done, json_safe(record))
    _say_solver(say, record, len(bank))
    return record


def _cross_validate(entry: dict, bank, data: _Data, run_dir: Path, client, say, seed: int,
                    resume: bool) -> dict | None:
    """The ``cv`` record of a solver whose regularisation is a list or "auto" (None otherwise):
    k-fold CV on the bank's rows (``mklscale.model_selection``); its state in checkpoints/<name>.cv.json."""
    req = model_selection.request(entry)
    if req is None:
        return None
    state = run_dir / "checkpoints" / f"{entry['name']}.cv.json"
    if not resume:
        state.unlink(missing_ok=True)
    return model_selection.select(entry, req, bank, data.task, data.y_train, data.classes, client, seed, state,
                                  resume, say)


def _null_model_check(estimator, data: _Data, metrics: dict) -> dict:
    """The null model beside the solver's test metric, and whether the model predicts one class / value."""
    null = null_model.null_model(data.task, data.y_train, data.y_test)
    predictions = [estimator.predict(data.X_train), estimator.predict(data.X_test)]
    return {"null_model": null_model.compare(null, metrics),
            "constant_predictor": null_model.constant_prediction(predictions, data.task, data.y_train)}


def _metrics(estimator, data: _Data) -> dict:
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


def _confusion(estimator, data: _Data) -> dict:
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


def _null_text(null: dict) -> str:
    if null["kind"] == "majority_class":
        return f"majority class {null['label']!r}: test accuracy {null['test_accuracy']:.4f}"
    return f"training mean {null['value']:.4g}: test r2 {null['test_r2']:.4f}, test rmse {null['test_rmse']:.4g}"


def _say_solver(say, record: dict, M: int) -> None:
    """Print a solver's test metric beside the null model's, the cross-validated value, its cost and its
    flags (not converged, constant predictor) (a summary line, printed under ``quiet`` too), then
    through ``say`` its convergence advice and kept kernels (the 5 largest shares of the total weight,
    as the report shows them)."""
    from mklscale.plots import share_lines

    metric = null_model.test_metric(record["metrics"])
    gap = record["gap"]  # json_safe: a float, or "inf"/"nan"
    flag = "" if record["converged"] else f"  {NOT_CONVERGED} (gap {gap:.3g})" if isinstance(gap, float) \
        else f"  {NOT_CONVERGED} (gap {gap})"
    constant = record.get("constant_predictor") or {}
    if constant.get("constant"):
        flag += f"  {CONSTANT_PREDICTOR} (every row {constant['value']!r})"
    versus = record.get("null_model")
    beside = "" if not versus else f" ({'majority' if metric == 'test_accuracy' else 'mean'} {versus['null']:.4f})"
    chosen = "" if not record.get("cv") else f"  cv {record['cv']['key']} = {record['cv']['chosen']:.4g}"
    _summary(f"[{record['name']}] {metric} {record['metrics'][metric]:.4f}{beside}{chosen}  kept {record['n_active']}/"
             f"{M} kernels  passes {record['passes']}  {record['seconds']:.1f} s  converged {record['converged']}{flag}")
    if record.get("convergence_warning"):
        say(f"    {record['convergence_warning']}")
    for line in share_lines(record["kernels"], top=5):
        say(f"    {line}")


def _run_path(entry: dict, bank, data: _Data, client, quiet: bool, say) -> dict:
    """A PFBS regularisation path (square loss on the targets, ±1 labels for binary tasks)."""
    from mklscale.engine import Engine
    from mklscale.engine.core import small_bank_bytes
    from mklscale.solvers import paths

    name = entry["name"]
    record = {"name": name, "solver": "pfbs_path", "params": {k: v for k, v in entry.items() if k != "name"},
              "status": "ok", "error": None, "model": None, "kernels": [], "history": []}
    if data.task == "classification" and len(data.classes) != 2:
        record.update(status="failed", error="a [[path]] needs a regression or binary task")
        _summary(f"[{name}] FAILED: {record['error']}")
        return record
    y = np.asarray(data.y_train, dtype=np.float64)
    t0 = time.perf_counter()
    with Engine(bank, client=client, progress=not quiet, local_bytes=small_bank_bytes()) as engine:
        p = paths.path(engine, y, n_taus=entry["n_taus"], mu=entry["mu"], eps=entry["eps"], tol=entry["tol"])
        scores, score_name = None, None
        if entry["cv_folds"]:
            cv = paths.cross_validate(engine, y, taus=p.taus, mus=[entry["mu"]], folds=entry["cv_folds"],
                                      task="classification" if data.task == "classification" else "regression")
            scores, score_name = cv.errors[0].tolist(), f"cv_{cv.metric}"
        stats = engine.stats
    ever = np.flatnonzero(np.any(p.weights != 0, axis=0))
    record.update(
        seconds=time.perf_counter() - t0, passes=stats.get("passes"), bytes_read=stats.get("bytes_read"),
        converged=bool(np.all(p.converged)), objective=float(p.objectives[-1]), gap=float(p.gaps[-1]),
        n_active=int(ever.size), metrics={},
        path={"parameter": "tau", "values": p.taus.tolist(), "kernel_names": [bank.specs[m].label(data.feature_names) for m in ever],
              "weights": p.weights[:, ever].tolist(), "n_active": [len(a) for a in p.active],
              "scores": scores, "score_name": score_name})
    _summary(f"[{name}] path over {len(p.taus)} taus: up to {ever.size}/{len(bank)} kernels, "
             f"passes {record['passes']}, {record['seconds']:.1f} s")
    return record


def _cluster_info(config, client) -> dict:
    info = client.scheduler_info()
    dashboard = client.dashboard_link if "dashboard" in info.get("services", {}) else None
    return {"kind": "local" if config is None else config.kind, "dashboard": dashboard,
            "workers": len(info.get("workers", {}))}


def _machine() -> dict:
    import platform

    return {"hostname": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file, fsync, rename: see ``runtime.checkpoint.write_atomic``)."""
    from mklscale.runtime.checkpoint import write_atomic

    text = json.dumps(data, indent=1, allow_nan=False).encode()
    write_atomic(path, lambda fh: fh.write(text))
