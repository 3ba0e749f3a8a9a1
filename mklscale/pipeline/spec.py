"""A pipeline's spec: the TOML file read, checked and turned into a :class:`Pipeline`.

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
                                        # gaussian, polynomial, linear, random_subsets, per_feature,
                                        # interactions; "gaussian" is the
                                        # 24 SimpleMKL widths on all features and on each single one)
    normalize = "trace"                 # "trace" | "diag" | "none"
    dtype = "float32"
    path = "bank.zarr"                  # relative to the run directory, or absolute (shared banks)
    rank = 64                           # optional: a factor bank, K~_m = L_m L_m^T with L_m n x rank
    method = "nystrom"                  # factor banks: "nystrom" | "cholesky"
    landmarks = "kmeans++"              # factor banks, nystrom: "kmeans++" | "uniform" | "rls"
    tol = 1e-6                          # factor banks, cholesky: relative residual trace
    max_error = 0.05                    # factor banks: warn above this relative trace error
    computed = false                    # true: store the features only, compute the kernels in every
                                        # pass (many kernels over few rows, e.g. family = "per_feature")

    [[solver]]                          # any number; each becomes one fitted model
    name = "spicy_l1"                   # unique label
    solver = "spicy"                    # mklscale.solvers.registry name
    C = 0.05                            # the solver's main regularisation (see the registry); a list
                                        # [0.01, 0.1] or "auto": chosen by k-fold CV on the training
                                        # rows (mklscale.model_selection; also tau / lam by their names)
    cv_folds = 3                        # folds of that CV (only with a list or "auto")
    stability = 20                      # optional (0: off): refit at the chosen C on 20 subsamples of the
                                        # training rows and record how often each feature is selected
                                        # (results.json feature_stability, a figure in the report;
                                        # mklscale.feature_selection; banks built from features only)
    stability_fraction = 0.5            # the share of each class's training rows a subsample draws
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

:func:`load_pipeline` checks everything that can be checked without the data; the checks that need the
data (each [[solver]]'s values for the task, the split, the bank's size) are the run's
(:mod:`mklscale.pipeline.fits`, :mod:`mklscale.pipeline.data`, :mod:`mklscale.pipeline.bank_stage`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from pathlib import Path

from mklscale import model_selection
from mklscale.bank.factor import LANDMARK_RULES, MAX_ERROR, METHODS, FactorSettings
from mklscale.bank.storage.location import bank_location
from mklscale.config import Field, check_table, check_value, fraction, one_of, positive, read_toml
from mklscale.errors import ConfigError, InvalidInputError


#: the most values a [[path]] may have (each is a solve; a billion would run for ever)
MAX_TAUS = 10_000
#: the most subsamples a [[solver]]'s stability may fit (each is a solve)
MAX_RESAMPLES = 1000
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
    # kernels computed from the features in every pass, never stored (issue 31; not with rank)
    "computed": Field((bool,), False),
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
                                   lambda v: None if v >= 2 else f"must be >= 2, got {v!r}"),
                 # feature selection stability: refits on subsamples of the training rows (mklscale.feature_selection)
                 "stability": Field((int,), 0, lambda v: None if 0 <= v <= MAX_RESAMPLES else
                                    f"must be between 0 (off) and {MAX_RESAMPLES} subsamples, got {v}"),
                 "stability_fraction": Field((float,), 0.5, lambda v: None if 0 < v < 1 else
                                             f"must be in (0, 1), the share of each class's rows a subsample "
                                             f"draws; got {v}")}
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
    if bank["grams"] is not None and any(s["stability"] for s in solvers):
        raise ConfigError(f"{where}: stability counts how often each input feature is selected, and [bank] grams gives "
                          "Gram matrices without features; remove stability from the [[solver]] entries")
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
    if fixed["computed"] and factor:
        raise ConfigError(f"{where}: computed = true computes every kernel in each pass and stores none; rank stores "
                          "factors: choose one (computed for many kernels over few rows, rank for many rows)")
    try:  # a URL scheme other than s3://, or storage options for a local path, are refused here
        bank_location(fixed["path"], fixed["storage_options"])
    except InvalidInputError as exc:
        raise ConfigError(f"{where}.path: {exc}") from None
    return {"kernels": kernels, "normalize": fixed["normalize"], "dtype": fixed["dtype"], "path": fixed["path"],
            "factor": factor, "computed": fixed["computed"], "storage_options": fixed["storage_options"], "grams": None,
            "names": None}


def _check_grams_bank(table: dict, where: str, source: Path | None) -> dict:
    """[bank] grams = "K.npy" (or a dense bank folder): the user's own Gram matrices over the dataset's rows,
    imported per split (``load_data``, ``prepare_bank``); no families, no factor settings."""
    fixed = check_table(table, _BANK, where)
    clash = [k for k in ("family", "families", "rank", "computed", *_FACTOR_KEYS) if k in table]
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
    try:  # a folder or an s3:// URL (the import goes through the bank's storage either way)
        bank_location(fixed["path"], fixed["storage_options"])
    except InvalidInputError as exc:
        raise ConfigError(f"{where}.path: {exc}") from None
    return {"kernels": None, "normalize": fixed["normalize"], "dtype": fixed["dtype"], "path": fixed["path"],
            "factor": {}, "storage_options": fixed["storage_options"], "grams": file, "names": names}


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
    if "stability_fraction" in table and not fixed["stability"]:
        raise ConfigError(f"{where}: stability_fraction applies only with stability = N (N > 0 subsamples); add "
                          "stability or remove stability_fraction")
    if model_selection.request(entry, where) is None and "cv_folds" in table:
        raise ConfigError(f"{where}: cv_folds applies only when C (or the solver's tau / lam) is a list of values "
                          'or "auto"; give a grid or remove cv_folds')
    return entry
