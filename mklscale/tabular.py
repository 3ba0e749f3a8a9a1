"""Your own data: a feature table and its target read from ``.npy``, ``.csv`` or ``.parquet``.

One reader serves every entry point that takes a file of features: pipelines (``[dataset] path``),
``mklscale fit --features``, ``mklscale predict MODEL --features`` and ``mklscale bank build
--features``.

- ``.csv`` (also ``.csv.gz``, ``.csv.bz2``, ``.csv.zip``, ``.csv.xz``: pandas decompresses them):
  :func:`pandas.read_csv`; the first row is the header, the column names.
- ``.parquet`` / ``.pq``: :func:`pandas.read_parquet`, which needs pyarrow (or fastparquet);
  neither is a dependency of mklscale: without one the error says ``pip install pyarrow``.
- ``.npy``: one (n, d) array of numbers (``numpy.load(allow_pickle=False)``); its labels come from
  a second ``.npy`` file with n entries. A ``.npy`` file has no column names.

In a table the target is the column named by ``target``; every other column is a feature (or, with
``columns``, the named columns are, in that order: a saved model's feature names). Feature columns
must be numeric (booleans count as 0/1): text or categorical columns are refused, naming them, to
be encoded first (e.g. ``pandas.get_dummies``). Missing (NaN) or infinite values in a feature or in
the target are refused, naming the columns and the first rows.

The task, when not given, is inferred from the target (:func:`infer_task`): a target of text,
booleans or categories is a classification target; a numeric one is a classification target when
all its values are whole numbers and it has at most :data:`MAX_INFERRED_CLASSES` distinct values
(labels such as 0/1, -1/+1 or 1..10), a regression target otherwise. Callers print what was inferred.

Every problem is an :class:`~mklscale.errors.InvalidInputError` whose message names the file and
says what to do, in the words of the caller's options (:class:`Spelling`: the CLI's flags or a
pipeline's keys); pipelines raise it again as a ConfigError.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mklscale.errors import InvalidInputError

__all__ = ["CLI", "MAX_INFERRED_CLASSES", "PIPELINE", "Spelling", "Table", "check_task", "infer_task",
           "load_npy", "read_table"]

#: a numeric target of whole numbers with at most this many distinct values is inferred to be class labels
MAX_INFERRED_CLASSES = 20
#: how many offending rows a message lists
_SHOW_ROWS = 5

_CSV = (".csv",)
_COMPRESSED = (".gz", ".bz2", ".zip", ".xz", ".zst")
_PARQUET = (".parquet", ".pq")


@dataclasses.dataclass(frozen=True)
class Spelling:
    """How a caller spells its inputs, so that a message says what to write there.

    ``task`` is a template for one task (``--task {}``); ``labels_name`` names the labels option.
    """

    features: str
    target: str
    labels: str
    labels_name: str
    task: str


#: ``mklscale fit / predict / bank build``
CLI = Spelling("--features", "--target COLUMN", "--labels y.npy", "--labels", "--task {}")
#: a pipeline's ``[dataset]`` table
PIPELINE = Spelling("[dataset] path", 'target = "COLUMN"', 'labels = "y.npy"', "labels", 'task = "{}"')


@dataclasses.dataclass(frozen=True, eq=False)
class Table:
    """Features and target read from files.

    X : float64 (n, d). y : the target column as read (numbers or labels; None when none was asked
    for). feature_names : the table's column names for the columns of X (None for ``.npy``).
    target_name : the target column's name (None for ``.npy`` labels or no target).
    """

    X: np.ndarray
    y: np.ndarray | None
    feature_names: tuple[str, ...] | None
    target_name: str | None


def kind(path: Path) -> str | None:
    """"csv", "parquet" or "npy" from the file name (a .csv may be compressed); None for another name
    (:func:`read_table` reads it as .npy, as the command line always has; pipelines refuse it)."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    last = suffixes[-1] if suffixes else ""
    if last in _CSV or last in _COMPRESSED and len(suffixes) > 1 and suffixes[-2] in _CSV:
        return "csv"
    if last in _PARQUET:
        return "parquet"
    return "npy" if last == ".npy" else None


def read_table(path, target: str | None = None, labels=None, *, columns=None, drop: str | None = None,
               rows: int | None = None, spelling: Spelling = CLI) -> Table:
    """Read features (and a target) from ``path`` (see the module docstring).

    ``target``: the target column of a .csv/.parquet table (the other columns are the features).
    ``labels``: a .npy file of targets for a .npy feature file. Neither: features only (all the
    table's columns, or those named in ``columns``). ``columns``: take exactly these feature
    columns, by name, in this order (other columns, the target among them, are ignored); a missing
    one is an error listing it. ``drop``: a column to leave out of the features when it is there
    (the target, at prediction). ``rows``: read only the first ``rows`` rows.
    """
    path = Path(path)
    what = spelling.features
    file_kind = kind(path) or "npy"
    if file_kind != "npy" and not path.is_file():
        relative = " (a relative path is relative to the pipeline file's folder)" if spelling is PIPELINE else ""
        raise InvalidInputError(f"{what} {path}: no such file; give the path of an existing .csv, .parquet or .npy "
                                f"file{relative}")
    if file_kind == "npy":
        if target is not None:
            raise InvalidInputError(f"{what} {path}: a .npy file has no named columns, so {spelling.target} does "
                                    f"not apply; give the targets as a separate file with {spelling.labels}, or "
                                    "save the table as .csv with a header row")
        if columns is not None:
            raise InvalidInputError(f"{what} {path}: the model was fitted on named columns "
                                    f"({_names(columns)}) and a .npy file has none; give a .csv or .parquet file "
                                    "with those columns")
        X = load_npy(path, what, rows=rows)
        if X.ndim != 2:
            raise InvalidInputError(f"{what} {path}: holds an array of shape {X.shape}; give an (n_samples, "
                                    "n_features) array (reshape a single feature with x.reshape(-1, 1))")
        if X.dtype.kind not in "biuf":
            raise InvalidInputError(f"{what} {path}: holds {X.dtype} values; features must be numbers: encode "
                                    "text features first (e.g. pandas.get_dummies) and save a float array")
        X = np.asarray(X, dtype=np.float64)
        _check_finite_array(X, f"{what} {path}")
        y = None
        if labels is not None:
            y = load_npy(Path(labels), spelling.labels_name)
            if y.ndim == 2 and y.shape[1] == 1:
                y = y[:, 0]
            if y.ndim != 1:
                raise InvalidInputError(f"{spelling.labels_name} {labels}: holds an array of shape {y.shape}; "
                                        "give one target per row, shape (n_samples,)")
            if rows is not None:
                y = y[:rows]
            if len(y) != len(X):
                raise InvalidInputError(f"{spelling.labels_name} {labels} has {len(y)} entries but "
                                        f"{what} {path} has {len(X)} rows; give one target per row of the features")
            _check_finite_target(y, f"{spelling.labels_name} {labels}")
        return Table(X, y, None, None)
    if labels is not None:
        raise InvalidInputError(f"{what} {path}: {spelling.labels_name} is for .npy feature files; name the "
                                f"target column of the table with {spelling.target}")
    frame = _read_frame(path, file_kind, rows, what)
    frame.columns = [str(c) for c in frame.columns]
    present = list(frame.columns)
    if target is not None and target not in present:
        raise InvalidInputError(f"{what} {path}: no column {target!r} for the target; its columns are "
                                f"{_names(present)}; give one of them with {spelling.target}")
    if columns is not None:
        columns = [str(c) for c in columns]
        missing = [c for c in columns if c not in present]
        if missing:
            raise InvalidInputError(f"{what} {path}: lacks column(s) {_names(missing)} the model was fitted on; "
                                    f"its columns are {_names(present)}; give a table with every feature column of "
                                    f"the model ({_names(columns)}), named as at fit")
        feature_cols = columns
    else:
        feature_cols = [c for c in present if c != target and c != drop]
    if not feature_cols:
        raise InvalidInputError(f"{what} {path}: has no feature columns (only {_names(present)}); give a table with "
                                "at least one feature column beside the target")
    if len(frame) == 0:
        raise InvalidInputError(f"{what} {path}: has no rows; give a table with data rows under its header")
    features = frame[feature_cols]
    X = _numeric(features, f"{what} {path}", spelling)
    _check_finite_frame(features, X, f"{what} {path}")
    y = None
    if target is not None:
        y = frame[target].to_numpy()
        _check_finite_target(y, f"{what} {path}, target column {target!r}")
        if y.dtype == object:   # text labels as numpy strings (sortable, JSON-able)
            y = y.astype(str)
    return Table(X, y, tuple(feature_cols), target)


def infer_task(y: np.ndarray) -> tuple[str, str]:
    """("classification" | "regression", why) from a target's values (rule: the module docstring)."""
    y = np.asarray(y)
    if y.dtype.kind == "b":
        return "classification", "booleans"
    if y.dtype.kind in "iuf":
        distinct = np.unique(y)
        whole = y.dtype.kind in "iu" or bool(np.all(np.mod(distinct, 1) == 0))
        if whole and len(distinct) <= MAX_INFERRED_CLASSES:
            return "classification", (f"{len(distinct)} distinct whole-number values "
                                       f"(at most {MAX_INFERRED_CLASSES} read as class labels)")
        if whole:
            return "regression", f"{len(distinct)} distinct whole-number values (more than {MAX_INFERRED_CLASSES})"
        return "regression", "numbers that are not all whole"
    return "classification", "labels that are not numbers"


def check_task(y: np.ndarray, task: str | None, where: str, spelling: Spelling = CLI) -> tuple[str, str | None]:
    """The task (given, or inferred when None) checked against the target; returns (task, note).

    ``note`` says what was inferred and how to change it (None when ``task`` was given). A
    classification target needs two classes; a regression target numbers.
    """
    note = None
    if task is None:
        task, why = infer_task(y)
        other = "regression" if task == "classification" else "classification"
        note = f"task: {task} (inferred from the target: {why}); give {spelling.task.format(other)} to change it"
    if task not in ("classification", "regression"):
        raise InvalidInputError(f"{where}: task must be 'classification' or 'regression', got {task!r}")
    if task == "classification":
        classes = np.unique(y)
        if len(classes) < 2:
            raise InvalidInputError(f"{where}: the target holds one class only ({classes[0].item()!r} in all {len(y)} "
                                    "rows); "
                                    "a classifier needs rows of at least two classes: check the target column")
    elif np.asarray(y).dtype.kind not in "biuf":
        raise InvalidInputError(f"{where}: a regression target must be numbers, got {np.asarray(y).dtype} values "
                                f"such as {np.asarray(y)[0]!r}; give {spelling.task.format('classification')} for "
                                "class labels, or a numeric target column")
    return task, note


def load_npy(path: Path, what: str, rows: int | None = None) -> np.ndarray:
    """The array in a .npy file; with ``rows``, only its first rows are read (memory-mapped)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"{what} {path}: no such file; give the path of an existing .npy file "
                                "(write one with numpy.save)")
    if _holds_objects(path):
        raise InvalidInputError(f"{what} {path}: holds Python objects (dtype object), which mklscale does not load "
                                "(that would run pickle); save plain numbers or strings instead, e.g. "
                                "numpy.save(path, np.asarray(values, dtype=str)) or .astype(float)")
    try:
        array = np.load(path, allow_pickle=False, mmap_mode=None if rows is None else "r")
    except (ValueError, OSError, EOFError) as exc:
        raise InvalidInputError(f"{what} {path}: not a plain .npy array ({exc}); save the array with "
                                "numpy.save(path, array) (numbers only, no objects), or give a table as .csv (with "
                                "a header row) or .parquet") from None
    if not isinstance(array, np.ndarray):  # an .npz archive
        array.close()
        raise InvalidInputError(f"{what} {path}: is an .npz archive, not one array; save the array alone with "
                                "numpy.save(path, array)")
    return array if rows is None else np.array(array[:rows])


def _holds_objects(path: Path) -> bool:
    """Whether a .npy file's header declares an object dtype (False when it has no readable header)."""
    try:
        with open(path, "rb") as fh:
            major, _ = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            _, _, dtype = read_header(fh)
    except (ValueError, OSError, EOFError):
        return False
    return dtype.hasobject


def _read_frame(path: Path, file_kind: str, rows: int | None, what: str):
    import pandas as pd

    try:
        if file_kind == "csv":
            return pd.read_csv(path, nrows=rows)
        try:
            frame = pd.read_parquet(path)
        except ImportError:
            raise InvalidInputError(f"{what} {path}: reading parquet files needs pyarrow, which mklscale does not "
                                    "install; run: pip install pyarrow (or save the table as .csv)") from None
        return frame if rows is None else frame.iloc[:rows]
    except InvalidInputError:
        raise
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise InvalidInputError(f"{what} {path}: cannot be read as {file_kind} ({type(exc).__name__}: "
                                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no details'}); give a "
                                f"{'comma-separated file with a header row' if file_kind == 'csv' else 'parquet file'}"
                                ) from None


def _numeric(features, where: str, spelling: Spelling) -> np.ndarray:
    """The feature columns as float64; text or categorical columns are refused, naming them."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    bad = [c for c in features.columns if not (is_numeric_dtype(features[c]) or is_bool_dtype(features[c]))]
    if bad:
        example = features[bad[0]].dropna()
        shown = f" (e.g. {example.iloc[0]!r} in {bad[0]!r})" if len(example) else ""
        raise InvalidInputError(f"{where}: feature column(s) {_names(bad)} are not numbers{shown}; encode them as "
                                "numbers first (e.g. pandas.get_dummies for categories), or drop them from the table "
                                f"(a target column: name it with {spelling.target})")
    return features.to_numpy(dtype=np.float64, na_value=np.nan)


def _check_finite_frame(features, X: np.ndarray, where: str) -> None:
    bad = ~np.isfinite(X)
    if not bad.any():
        return
    cols = [str(c) for c, b in zip(features.columns, bad.any(axis=0)) if b]
    rows = np.flatnonzero(bad.any(axis=1))
    raise InvalidInputError(f"{where}: NaN/inf (missing or infinite) values in feature column(s) {_names(cols)}, "
                            f"{len(rows)} row(s) (first: {_rows(rows)}); impute or drop those rows first "
                            "(e.g. sklearn.impute.SimpleImputer or frame.dropna())")


def _check_finite_array(X: np.ndarray, where: str) -> None:
    bad = ~np.isfinite(X)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise InvalidInputError(f"{where}: NaN/inf (missing or infinite) values in {len(rows)} row(s) (first: "
                                f"{_rows(rows)}), column(s) {np.flatnonzero(bad.any(axis=0))[:_SHOW_ROWS].tolist()}; "
                                "impute or drop those rows first")


def _check_finite_target(y: np.ndarray, where: str) -> None:
    import pandas as pd

    missing = pd.isna(y) if y.dtype == object else (~np.isfinite(y) if y.dtype.kind == "f" else np.zeros(len(y), bool))
    if np.any(missing):
        rows = np.flatnonzero(missing)
        raise InvalidInputError(f"{where}: {len(rows)} NaN/inf (missing or infinite) target value(s) (first rows: "
                                f"{_rows(rows)}); drop those rows: every row needs its target")


def _rows(rows: np.ndarray) -> str:
    """Data row numbers (0-based, the header not counted) of the first few offending rows."""
    return ", ".join(str(int(r)) for r in rows[:_SHOW_ROWS]) + (", ..." if len(rows) > _SHOW_ROWS else "")


def _names(names) -> str:
    names = [str(n) for n in names]
    shown = ", ".join(repr(n) for n in names[:12])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
