"""A run's data: the [dataset] loaded (an offline dataset, the user's file, or targets alone with
[bank] grams) and split into training and test rows (seeded; stratified for classification)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mklscale.errors import ConfigError, InvalidInputError
from mklscale.pipeline.spec import Pipeline


#: the training split must keep this many rows of each class (of all rows, for regression)
MIN_TRAIN_PER_CLASS = 2


@dataclasses.dataclass
class Data:
    """The run's split: training and test rows (with [bank] grams, X_* are their Gram matrices:
    (M, n_train, n_train) and (M, n_test, n_train)), the task and the sorted classes."""

    name: str
    task: str               # "classification" | "regression"
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    classes: list | None
    feature_names: tuple[str, ...] | None = None   # one per column; kernel names use them


def load_data(pipe: Pipeline, say=lambda *a: None) -> Data:
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
    return Data(name, task, X_tr, y_tr, X_te, y_te, classes, feature_names)


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
        if bank.representation == "factor":
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
