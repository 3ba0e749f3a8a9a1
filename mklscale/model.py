"""MKLModel: everything prediction needs, without the kernel bank; model files (read back as
estimators by ``mklscale.load``, which lives in ``estimators``: the estimators import this module).

A fitted MKL model with H heads (one for binary classification and regression, one per class for
one-vs-rest) predicts

    f_h(x) = sum_{m in kept} w_{h,m} k~_m(x, X_S) c_{h,S} + b_h,       h = 1..H,

where ``kept`` are the kernels with a non-zero weight in some head (the union over heads), S the
training rows with a non-zero dual coefficient in some head that has kernels, and k~_m the kernel
with the bank's normalisation applied to the standardised features:

    x~ = (x - mean) / scale                      (the bank's recorded standardisation)
    k~_m(x, z) = k_m(x~, z~) * factor_m          ("trace": factor_m = 1 / trace K_m(X_train))
    k~_m(x, z) = k_m(x~, z~) / sqrt(k_m(x~, x~) k_m(z~, z~))   ("diag")

Only the kept kernels are evaluated, and only against the rows S (``bank.normalize.cross_kernels`` and
``KernelSpec.compute`` = ``from_base(base(.))``, as ``KernelBank.cross`` does, so the values are those
of the bank's cross kernels restricted to S; kernels sharing a pairwise base reuse it). The stored training rows are the STANDARDISED rows of the bank
(``bank.X_train[S]``), which is what makes the model's cross kernels bit-identical to the bank's.

Model file (a directory)::

    model.json   {"format": "mklscale-model", "schema_version", "mklscale_version", "task", "classes",
                  "classes_dtype", "normalize", "specs" (JSON KernelSpecs of the kept kernels), "heads"
                  (per-head scalars: bias, solver, objective, gap, converged, n_kernels, n_rows, label),
                  "estimator" (class and parameters), "fitted" (fitted attributes as JSON),
                  "arrays": {"file": "arrays.npz", "sha256", "bytes"}, ...}
    arrays.npz   weights (H, k), dual_coef (H, r), norm_factor (k,), bank_kernels (k,), rows (r,),
                 train_row_ids (r,), X_rows (r, d) [feature banks], mean/scale (d,) [standardised]

A model fitted on a factor bank (K~_m = L_m L_m^T, ``build_bank(..., rank=r)``) predicts through the
kept kernels' landmarks instead of the training rows S (``model_factor``): model.json says
``"representation": "factor"`` and arrays.npz holds factor_landmark_rows (p, d),
factor_landmark_index (k, r), factor_transforms (k, r, r) and factor_coef (H, k, r) in place of rows,
dual_coef and X_rows (empty there).

Schema versions: 1 dense models, 2 factor models, 3 (written now) either; from 3 on, models fitted by
`mklscale fit --dataset` and `mklscale run` take the dataset's raw features (mean/scale standardise
them), older ones its standardised features (``MKLModel.dataset_features``). mean/scale are always the
standardisation the fit applied to the features it was given.

Rows scaled the wrong way (issue 28): a model whose standardisation changes its features expects raw
rows; rows that look already standardised instead (``input_scale_warning``, the rule is in its
docstring) get a warning from the estimators' predict and from `mklscale predict`, as do rows that do
not look standardised given to a model of schema < 3 fitted on standardised dataset features.

Everything is numbers, strings and JSON; ``arrays.npz`` is written and read with
``allow_pickle=False``. Every field is checked against the others (``model_checks``: shapes, dtypes,
finiteness, index ranges) when a model is read, built from results or saved, before any compiled
kernel sees it; a file that fails is refused with ModelFileError naming the field. Saving is atomic
(temporary sibling folder, fsync, rename); a full disk raises OutputWriteError and keeps what was there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mklscale.bank.spec import KernelSpec
from mklscale.bank.inputs import validate_features
from mklscale.bank.normalize import cross_kernels
from mklscale.errors import InvalidInputError, MKLScaleError, ModelFileError
from mklscale.feature_selection import importances
from mklscale.model_checks import TASKS, check_model
from mklscale.model_factor import FactorTerms
from mklscale.runtime.atomic import fsync_dir, output_error, swap_into_place
from mklscale.solvers.result import MKLResult, json_safe

#: the model file layout this mklscale writes and the newest it reads. 1: dense models; 2: factor models
#: (so an older mklscale refuses them instead of misreading them); 3: either, and `mklscale fit --dataset`
#: and `mklscale run` fit on the dataset's raw features (``dataset_features``), so an older mklscale, whose
#: `predict --dataset` standardises the dataset first, refuses them too.
SCHEMA_VERSION = 3
#: the first schema version whose models take a named dataset's raw features (``MKLModel.dataset_features``)
RAW_FEATURES_SINCE = 3
FORMAT = "mklscale-model"
JSON_FILE = "model.json"
ARRAYS_FILE = "arrays.npz"
#: bytes of one cross-kernel block (n_batch x |S| float64) evaluated at once in decision_function
BATCH_BYTES = 32 * 2**20
#: fewer rows than this tell too little about how they were scaled: ``input_scale_warning`` stays silent
SCALE_CHECK_MIN_ROWS = 10
#: kernels named by ``repr(model)``, the largest shares of the total weight first
REPR_KERNELS = 3


@dataclass
class MKLModel:
    """A fitted multiple kernel model without its bank (formulas in the module docstring).

    Attributes
    ----------
    task : "classification" | "regression".
    classes : (K,) class labels (classification) or None. Binary: one head, f > 0 means classes[1];
        one-vs-rest (K >= 3): head h scores classes[h].
    specs : KernelSpecs of the kept kernels (union over heads), in bank order.
    normalize : the bank's normalisation rule ("trace", "diag" or None).
    norm_factor : (k,) per-kernel factor of the kept kernels ("trace": 1 / trace of the training Gram).
    weights : (H, k) kernel weights per head (zeros where a head does not use a kept kernel).
    dual_coef : (H, r) dual coefficients on the kept training rows.
    bias : (H,) offsets.
    X_rows : (r, d) standardised training rows S, or None (bank imported from Gram matrices).
    mean, scale : (d,) training standardisation, or None (features used as they are).
    rows : (r,) positions of S among the bank's n training points; train_row_ids : their row ids.
    bank_kernels : (k,) indices of the kept kernels in the bank; n_bank_kernels, n_train : M and n of it.
    n_features : d, or None for a bank without features.
    heads : per-head JSON scalars (solver, objective, gap, converged, label, ...).
    info : JSON-safe description (solver name and parameters, bank path).
    factor : the landmarks, transforms and v_{h,m} of a model fitted on a factor bank (``model_factor``),
        or None (dense bank: prediction through X_rows and dual_coef).
    dataset_features : which features of a named dataset (``mklscale.datasets``) the model takes: "raw"
        (``load(name, standardise=False).X``; the model's mean/scale standardise them; every model this
        mklscale writes) or "standardised" (``load(name).X``: model files of schema < 3, which
        `mklscale fit --dataset` and `mklscale run` fitted on the dataset's standardised features).
        Features given to ``decision_function`` are always taken as they were given to fit.
    """

    task: str
    classes: np.ndarray | None
    specs: list[KernelSpec]
    normalize: str | None
    norm_factor: np.ndarray
    weights: np.ndarray
    dual_coef: np.ndarray
    bias: np.ndarray
    X_rows: np.ndarray | None
    mean: np.ndarray | None
    scale: np.ndarray | None
    rows: np.ndarray
    train_row_ids: np.ndarray
    bank_kernels: np.ndarray
    n_bank_kernels: int
    n_train: int
    n_features: int | None
    heads: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    factor: FactorTerms | None = None
    dataset_features: str = "raw"

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_results(cls, bank, results: MKLResult | Sequence[MKLResult], task: str, classes=None,
                     info: dict | None = None) -> MKLModel:
        """Keep from ``bank`` only what the heads ``results`` need for prediction.

        ``results``: one MKLResult (binary / regression) or one per class (one-vs-rest, in the order
        of ``classes``). A head whose weights are all zero predicts its bias; its dual coefficients
        are dropped. On a factor bank the model keeps v_{h,m} = w_{h,m} L_m^T c_h and the kept kernels'
        landmarks instead of training rows (``model_factor``).
        """
        if task not in TASKS:
            raise InvalidInputError(f"task must be one of {TASKS}; got {task!r}")
        results = [results] if isinstance(results, MKLResult) else list(results)
        if not results:
            raise InvalidInputError("results is empty; pass the MKLResult of every head")
        for r in results:
            if r.weights.size != bank.M or r.dual_coef.size != bank.n:
                raise InvalidInputError(f"an MKLResult has {r.weights.size} weights and {r.dual_coef.size} dual "
                                        f"coefficients, but the bank has M = {bank.M} kernels and n = {bank.n} rows; "
                                        "pass the results fitted on this bank")
        kept = np.unique(np.concatenate([r.active for r in results])).astype(np.int64)
        used = [r for r in results if r.active.size]
        weights = np.array([r.weights[kept] for r in results], dtype=np.float64).reshape(len(results), kept.size)
        factor = None
        if getattr(bank, "representation", "dense") == "factor":
            duals = np.array([r.dual_coef if r.active.size else np.zeros(bank.n) for r in results], dtype=np.float64)
            factor = FactorTerms.from_bank(bank, kept, weights, duals)
            used = []  # no training rows: prediction goes through the landmarks
        rows = (np.unique(np.concatenate([np.flatnonzero(r.dual_coef) for r in used])).astype(np.int64)
                if used else np.zeros(0, np.int64))
        dual = np.array([r.dual_coef[rows] if r.active.size else np.zeros(rows.size) for r in results],
                        dtype=np.float64).reshape(len(results), rows.size)
        std = bank.standardization
        X_train = bank.X_train
        labels = [None] * len(results) if classes is None or len(results) == 1 else list(classes)
        heads = [{"bias": r.bias, "solver": r.solver, "objective": r.objective, "gap": r.gap, "converged": r.converged,
                  "n_kernels": int(r.active.size), "n_rows": int(np.count_nonzero(r.dual_coef[rows])),
                  "label": json_safe(_plain(lab))} for r, lab in zip(results, labels)]
        model = cls(
            task=task, classes=None if classes is None else np.asarray(classes),
            specs=[bank.specs[m] for m in kept], normalize=bank.normalize,
            norm_factor=np.asarray(bank.norm_factor, dtype=np.float64)[kept],
            weights=weights, dual_coef=dual, bias=np.array([r.bias for r in results], dtype=np.float64),
            X_rows=None if X_train is None or factor is not None else np.ascontiguousarray(X_train[rows], dtype=np.float64),
            mean=None if std is None else std[0],
            scale=None if std is None else std[1],
            rows=rows, train_row_ids=bank.train_rows[rows], bank_kernels=kept, n_bank_kernels=int(bank.M),
            n_train=int(bank.n), n_features=None if X_train is None else int(X_train.shape[1]),
            heads=heads, info=dict(info or {}), factor=factor,
        )
        try:
            check_model(model)
        except ValueError as exc:
            raise InvalidInputError(f"these results do not make a valid model ({exc}); pass the results of a "
                                    "finished fit on this bank") from None
        return model

    # ---- description --------------------------------------------------------------------------
    @property
    def n_heads(self) -> int:
        return int(self.weights.shape[0])

    @property
    def kernel_names(self) -> list[str]:
        return [s.name for s in self.specs]

    def kernel_entries(self, feature_names=None) -> list[dict]:
        """The kept kernels of every head as results.json lists them (``mklscale run``): one entry per
        head and kernel with a non-zero weight, {index (in the bank), name (``spec.label(feature_names)``),
        family, params, features, weight, head (the class of a one-vs-rest head, else None)}; what
        ``plots.weight_shares`` / ``plots.share_lines`` read."""
        out = []
        for h in range(self.n_heads):
            head = None if self.n_heads == 1 or self.classes is None else _plain(self.classes[h])
            for k in np.flatnonzero(self.weights[h]):
                spec = self.specs[k]
                out.append({"index": int(self.bank_kernels[k]), "name": spec.label(feature_names),
                            "family": spec.family, "params": dict(spec.params),
                            "features": None if spec.features is None else list(spec.features),
                            "weight": float(self.weights[h, k]), "head": head})
        return out

    def feature_importances(self) -> np.ndarray:
        """(d,) each input feature's importance: the weight shares of the kept kernels that use it, each
        split evenly among the kernel's features, averaged over the heads (the rule:
        ``mklscale.feature_selection.importances``; a kernel over all features counts for every feature).
        A model without features (imported Gram matrices) raises InvalidInputError."""
        if self.n_features is None or any(s.family == "precomputed" for s in self.specs):
            raise InvalidInputError("this model was fitted on precomputed Gram matrices (kernels='precomputed' or a bank "
                                    "imported with KernelBank.from_arrays): its kernels have no input features, so it "
                                    "has no feature importances; the weight of each kernel is in kernel_weights_ / "
                                    "kernel_entries()")
        return importances([s.features for s in self.specs], self.weights, int(self.n_features))

    def __repr__(self) -> str:
        """One line: task, classes and heads, representation, the kept kernels (count, the largest
        shares of the total weight), the training rows or landmarks kept, and how it takes features."""
        from mklscale.plots import share_lines

        if self.task == "classification" and self.classes is not None:
            task = (f"classification, {len(self.classes)} classes"
                    + (f" ({self.n_heads} one-vs-rest heads)" if self.n_heads > 1 else ""))
        else:
            task = self.task
        shares = [" ".join(line.split("  ")).strip()
                  for line in share_lines(self.kernel_entries(), top=REPR_KERNELS, rest=False)]
        more = len(self.specs) - REPR_KERNELS if self.n_heads == 1 else 0
        kernels = (f"{len(self.specs)} of {self.n_bank_kernels} kernels kept"
                   + (f" ({'; '.join(shares)}{f'; +{more} more' if more > 0 else ''})" if shares else ""))
        if self.factor is not None:
            rows = f"{self.factor.n_landmarks} landmark rows of {self.n_train} training rows"
        else:
            rows = f"{self.rows.size} of {self.n_train} training rows"
        return (f"<MKLModel {task}, {'dense' if self.factor is None else 'factor'}: {kernels}, {rows}, "
                f"{self._features_text()}>")

    def _features_text(self) -> str:
        if self.n_features is None:
            return "no features (predicts from cross kernels)"
        if self.mean is None:
            return f"{self.n_features} features used as given"
        if _is_identity(self.mean, self.scale):
            return f"{self.n_features} standardised features used as given"
        return f"{self.n_features} raw features standardised by the model"

    def input_scale_warning(self, X) -> str | None:
        """Why the rows ``X`` look scaled differently from the features this model takes, or None.

        Per column j the rows have mean m_j and standard deviation t_j; the distance of those two
        moments from a distribution with mean a and standard deviation b is
        delta(a, b) = |m_j - a| / b + |ln(t_j / b)| (0: the same mean and spread).

        - A model that standardises raw rows (mean mu_j, scale s_j stored, not 0 and 1): the columns
          that tell raw from standardised rows are those with delta_j(mu_j, s_j) measured from (0, 1),
          i.e. |mu_j| + |ln s_j|, at least 1, and non-constant in ``X``. Over them, D_std = median
          delta_j(0, 1) and D_raw = median delta_j(mu_j, s_j) (the median: a few sparse columns, e.g.
          pixels rarely lit, have wild sample moments in a few rows). The rows look already standardised when
          D_raw >= 2 D_std + 1: they match standardised features much better than raw ones. (D_std of
          standardised rows equals D_raw of the same rows raw, so a subset of raw rows, e.g. one class,
          is judged as its standardised copy would be, the other way round.) Raw features that are
          themselves near mean 0 and std 1 have no telling column: no warning; nor when fewer than half
          of the columns that vary in ``X`` tell (the training features were mostly standardised
          already, and a few sparse columns of a small training set differ by chance).
        - A model of schema < 3 fitted on a dataset's standardised features (stored standardisation
          the identity, ``dataset_features == "standardised"``): the rows do not look standardised
          when D_std (the median over all non-constant columns) exceeds 1.
        Fewer than ``SCALE_CHECK_MIN_ROWS`` rows, or rows of the wrong width, are not judged (None).
        """
        X = np.asarray(X)
        if (self.mean is None or X.ndim != 2 or X.shape[0] < SCALE_CHECK_MIN_ROWS or X.shape[1] != self.mean.size
                or X.dtype.kind not in "biuf"):
            return None
        m, t = X.mean(axis=0), X.std(axis=0)
        varies = np.isfinite(m) & np.isfinite(t) & (t > 0.0)
        d_std = _moment_distance(m, t, 0.0, 1.0)
        if _is_identity(self.mean, self.scale):
            if self.dataset_features != "standardised" or not varies.any() or np.median(d_std[varies]) <= 1.0:
                return None
            return ("this model was written by an older mklscale (model schema < 3) and fitted on features that were "
                    "already standardised, e.g. a dataset of `mklscale fit --dataset` or `mklscale run`: it expects "
                    "rows standardised the same way (mklscale.datasets.load(NAME).X), and these rows do not look "
                    f"standardised ({_column_text(varies, m, t)}); pass standardised rows, or refit it with this "
                    "mklscale to predict on raw features")
        telling = varies & (_moment_distance(self.mean, self.scale, 0.0, 1.0) >= 1.0)
        if not telling.any() or 2 * int(telling.sum()) < int(varies.sum()):
            return None
        D_std = float(np.median(d_std[telling]))
        D_raw = float(np.median(_moment_distance(m, t, self.mean, self.scale)[telling]))
        if D_raw < 2.0 * D_std + 1.0:
            return None
        j = int(np.flatnonzero(telling)[np.argmax(_moment_distance(self.mean, self.scale, 0.0, 1.0)[telling])])
        return (f"these rows look already standardised (over the {int(telling.sum())} column(s) whose training "
                f"values were not, their mean and spread match mean 0 and std 1: column {j} has mean "
                f"{round(float(m[j]), 2) + 0.0:.2f} and std {t[j]:.2f} here but mean {self.mean[j]:.4g} and std {self.scale[j]:.4g} at fit), while this model "
                "takes raw rows and standardises them itself, so its predictions on them are wrong; pass the raw "
                "features (for a dataset: mklscale.datasets.load(NAME, standardise=False).X, not load(NAME).X)")

    # ---- prediction ---------------------------------------------------------------------------
    def standardize(self, X) -> np.ndarray:
        """x~ = (x - mean) / scale with the training standardisation (the same formula as the bank)."""
        X = validate_features(X, "X")
        if self.n_features is not None and X.shape[1] != self.n_features:
            raise InvalidInputError(f"X has {X.shape[1]} feature(s) but the model was fitted on {self.n_features}; "
                                    f"pass X with the same {self.n_features} columns, in the same order, as at fit")
        if self.mean is None:
            return X
        return (X - self.mean) / self.scale

    def decision_values(self, X) -> np.ndarray:
        """(n_new, H): f_h(x) for every head (module docstring), kept kernels and rows S only (their
        landmarks on a factor model), in row blocks of bounded memory."""
        if self.factor is not None:
            return self.factor.decision(self.standardize(X), self.specs) + self.bias
        if self.X_rows is None:
            raise InvalidInputError(
                "this model was fitted on a kernel bank imported from Gram matrices (no features), so it "
                "cannot evaluate kernels on new data; pass the cross kernels K_m(X_new, X_train) to "
                "decision_function_from_kernels instead")
        Xs = self.standardize(X)
        out = np.empty((Xs.shape[0], self.n_heads))
        step = max(1, BATCH_BYTES // (8 * max(1, self.rows.size)))
        for start in range(0, Xs.shape[0], step):
            out[start:start + step] = self._decision_batch(Xs[start:start + step])
        return out

    def _decision_batch(self, Xs: np.ndarray) -> np.ndarray:
        F = np.zeros((Xs.shape[0], self.n_heads))
        coef = self.dual_coef.T  # (r, H)
        for k, K in cross_kernels(self.specs, Xs, self.X_rows, self.normalize, self.norm_factor):
            F += K @ (coef * self.weights[:, k])
        return F + self.bias

    def decision_function(self, X) -> np.ndarray:
        """f(x): (n_new,) with one head, (n_new, H) with several."""
        return _squeeze(self.decision_values(X))

    def decision_function_from_kernels(self, K_cross, normalised: bool = True) -> np.ndarray:
        """f from precomputed cross kernels K_m(X_new, X_train).

        ``K_cross`` has shape (M, n_new, n) for every kernel of the bank the model came from, or
        (k, n_new, n) for the kept kernels only (order of ``bank_kernels``); n is the bank's number
        of training rows (a bank imported with ``cross_grams`` gives them by ``bank.cross(None)``).
        ``normalised``: whether they are scaled as the bank's kernels already (``bank.cross``), or raw,
        as the Gram matrices given to ``fit(K, y)`` with ``kernels="precomputed"`` (then each is scaled by
        its kernel's ``norm_factor``, the factor that normalised the training Gram matrix).
        """
        if self.factor is not None:
            raise InvalidInputError(
                "this model was fitted on a factor bank: it predicts from features through the kept kernels' "
                "landmarks, not from cross kernels; call decision_function(X_new) (or predict) with raw features")
        K = np.asarray(K_cross, dtype=np.float64)
        k = len(self.specs)
        if K.ndim != 3 or K.shape[2] != self.n_train or K.shape[0] not in (k, self.n_bank_kernels):
            raise InvalidInputError(
                f"K_cross must have shape ({self.n_bank_kernels} (all bank kernels) or {k} (kept kernels), "
                f"n_new, {self.n_train}); got {K.shape}. Pass K_m(X_new, X_train) for every kernel of the bank "
                "(bank.cross(...)) or for the kept ones, with one column per training row")
        if not np.isfinite(K).all():
            raise InvalidInputError("K_cross contains NaN or inf; check how the cross kernels were computed (drop "
                                    "rows of X_new with missing values)")
        if K.shape[0] != k:  # all bank kernels given (k == M means every kernel is kept, in bank order)
            K = K[self.bank_kernels]
        F = np.zeros((K.shape[1], self.n_heads))
        coef = self.dual_coef.T
        scale = np.ones(k) if normalised else self.norm_factor
        for j in range(k):
            F += scale[j] * (K[j][:, self.rows] @ (coef * self.weights[:, j]))
        return _squeeze(F + self.bias)

    # ---- files --------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        out = {"weights": self.weights, "dual_coef": self.dual_coef, "bias": self.bias,
               "norm_factor": self.norm_factor, "bank_kernels": self.bank_kernels, "rows": self.rows,
               "train_row_ids": self.train_row_ids}
        if self.X_rows is not None:
            out["X_rows"] = self.X_rows
        if self.mean is not None:
            out["mean"], out["scale"] = self.mean, self.scale
        if self.factor is not None:
            out.update(self.factor.arrays())
        return {k: np.ascontiguousarray(v) for k, v in out.items()}

    def to_json(self, extra: dict | None = None) -> dict:
        """The model.json document without the "arrays" entry (added by ``save``)."""
        from mklscale import __version__

        classes, classes_dtype = _classes_to_json(self.classes)
        return {
            "format": FORMAT, "schema_version": SCHEMA_VERSION,
            "mklscale_version": __version__,
            "representation": "dense" if self.factor is None else "factor",
            "task": self.task, "classes": classes, "classes_dtype": classes_dtype,
            "normalize": self.normalize, "specs": [s.to_dict() for s in self.specs],
            "kernel_names": self.kernel_names, "n_bank_kernels": self.n_bank_kernels, "n_train": self.n_train,
            "n_features": self.n_features, "heads": json_safe(self.heads), "info": json_safe(self.info),
            **(extra or {}),
        }

    def save(self, path, extra: dict | None = None) -> Path:
        """Write the model directory at ``path`` atomically; ``extra`` adds JSON entries (estimator).

        An existing model directory is replaced; any other existing, non-empty path is refused. A
        full or read-only disk raises OutputWriteError and leaves ``path`` as it was.
        """
        path = Path(path)
        _check_target(path)
        try:
            check_model(self)
        except ValueError as exc:
            raise InvalidInputError(f"this model is not valid ({exc}); refit it instead of editing its "
                                    "fields") from None
        doc = self.to_json(extra)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            tmp.mkdir(parents=True)
            arrays_file = tmp / ARRAYS_FILE
            with open(arrays_file, "wb") as f:
                np.savez(f, allow_pickle=False, **self.arrays())
                f.flush()
                os.fsync(f.fileno())
            doc["arrays"] = {"file": ARRAYS_FILE, "sha256": _sha256(arrays_file), "bytes": arrays_file.stat().st_size}
            text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)
            with open(tmp / JSON_FILE, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(tmp)
            swap_into_place(tmp, path)
        except OSError as exc:  # a full or read-only disk: nothing of the new model is left, an old one is kept
            raise output_error(path, exc, "the model") from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return path

    @classmethod
    def read(cls, path) -> tuple[MKLModel, dict]:
        """(model, model.json document) of a model directory; ModelFileError says what is wrong."""
        path = Path(path)
        doc = read_document(path)
        arrays = _read_arrays(path, doc)
        return cls._from_parts(path, doc, arrays), doc

    @classmethod
    def _from_parts(cls, path: Path, doc: dict, a: dict) -> MKLModel:
        try:
            factor = (FactorTerms.from_arrays(a, doc["normalize"] == "diag")
                      if doc.get("representation", "dense") == "factor" else None)
            model = cls(
                task=doc["task"], classes=_classes_from_json(doc["classes"], doc["classes_dtype"]),
                specs=[KernelSpec.from_dict(d) for d in doc["specs"]],
                normalize=doc["normalize"], norm_factor=a["norm_factor"], weights=a["weights"],
                dual_coef=a["dual_coef"], bias=a["bias"],
                X_rows=a.get("X_rows"), mean=a.get("mean"), scale=a.get("scale"), rows=a["rows"],
                train_row_ids=a["train_row_ids"], bank_kernels=a["bank_kernels"], n_bank_kernels=doc["n_bank_kernels"],
                n_train=doc["n_train"], n_features=doc["n_features"], heads=doc["heads"], info=doc.get("info", {}),
                factor=factor,
                dataset_features="raw" if doc["schema_version"] >= RAW_FEATURES_SINCE else "standardised",
            )
            check_model(model)
            if [h.get("bias") for h in model.heads] != model.bias.tolist():
                raise ValueError("heads: the per-head biases in model.json differ from bias in arrays.npz")
        except (KeyError, TypeError, ValueError, MKLScaleError) as exc:
            what = f"{type(exc).__name__}: {exc}" if isinstance(exc, (KeyError, TypeError)) else str(exc)
            raise _invalid(path, what) from None
        return model


def _squeeze(F: np.ndarray) -> np.ndarray:
    return F[:, 0] if F.shape[1] == 1 else F


def _is_identity(mean: np.ndarray, scale: np.ndarray) -> bool:
    """Whether a stored standardisation does nothing: the model was fitted on standardised features."""
    return bool(np.allclose(mean, 0.0, atol=1e-8) and np.allclose(scale, 1.0, atol=1e-8))


def _moment_distance(m, t, a, b) -> np.ndarray:
    """|m - a| / b + |ln(t / b)|: how far a column with mean m and std t is from mean a and std b."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(m - a) / b + np.abs(np.log(t / b))


def _column_text(columns: np.ndarray, m: np.ndarray, t: np.ndarray) -> str:
    """'column j has mean .. and std ..' for the column furthest from mean 0 and std 1."""
    j = int(np.flatnonzero(columns)[np.argmax(_moment_distance(m, t, 0.0, 1.0)[columns])])
    return f"column {j} has mean {m[j]:.4g} and std {t[j]:.4g}"


# ---- model files ---------------------------------------------------------------------------------
def is_model_dir(path) -> bool:
    """True when ``path`` is a directory holding an mklscale model.json."""
    f = Path(path) / JSON_FILE
    if not f.is_file():
        return False
    try:
        return json.loads(f.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def read_document(path: Path) -> dict:
    """model.json of ``path``, checked for format and schema version."""
    f = path / JSON_FILE
    if not path.is_dir() or not f.is_file():
        raise ModelFileError(f"no mklscale model at {path}: {JSON_FILE} is missing; give the folder written by "
                             "est.save(path) or `mklscale fit --out`")
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except RecursionError:
        raise _invalid(path, "nested deeper than any model file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelFileError(f"{f} is unreadable or truncated ({exc}); re-save the model or refit it") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelFileError(f"{f} is not an mklscale model file (format "
                             f"{doc.get('format') if isinstance(doc, dict) else None!r}); give the folder written by "
                             "est.save(path) or `mklscale fit --out`")
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelFileError(f"{f} has no valid schema_version (a whole number >= 1, got {version!r}); re-save the "
                             "model or refit it")
    if version > SCHEMA_VERSION:
        raise ModelFileError(f"model {path} was written with model schema version {version} (mklscale "
                             f"{doc.get('mklscale_version')}), newer than this mklscale reads ({SCHEMA_VERSION}); "
                             "upgrade mklscale to load it")
    problem = _document_problem(doc)
    if problem:
        raise _invalid(path, problem)
    return doc


def _invalid(path: Path, what: str) -> ModelFileError:
    """The error of a model folder whose files were damaged or edited (``what`` says how)."""
    return ModelFileError(f"model {path} is invalid ({what}); it was damaged or edited: refit the model, or restore "
                          "the folder written by est.save / `mklscale fit --out`")


#: model.json's top-level fields and the JSON types each may hold (checked where present; a missing
#: required one is reported when the model is assembled)
_FIELD_TYPES = {
    "mklscale_version": (str,), "representation": (str,), "task": (str,), "classes": (list, type(None)),
    "classes_dtype": (str, type(None)), "normalize": (str,), "specs": (list,), "kernel_names": (list,),
    "n_bank_kernels": (int,), "n_train": (int,), "n_features": (int, type(None)), "heads": (list,),
    "info": (dict,), "arrays": (dict,), "estimator": (dict,), "fitted": (dict,),
}
#: deeper nesting than any model file has (info and fit_stats hold small tables)
MAX_DEPTH = 24
REPRESENTATIONS = ("dense", "factor")


def _document_problem(doc: dict) -> str | None:
    """What is wrong with a parsed model.json's structure (None: nothing): nesting deeper than
    ``MAX_DEPTH``, a field of the wrong JSON type, an unknown representation, specs and heads that
    are not tables, estimator parameters or fitted attributes that are not tables."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    for name, types in _FIELD_TYPES.items():
        if name in doc and (not isinstance(doc[name], types) or (isinstance(doc[name], bool) and bool not in types)):
            wanted = " or ".join("null" if t is type(None) else {str: "a string", list: "a list", dict: "a table",
                                                                  int: "a whole number"}[t] for t in types)
            return f"{name} must be {wanted}, got {type(doc[name]).__name__}"
    if doc.get("representation", "dense") not in REPRESENTATIONS:
        return f"representation {doc['representation']!r} is not one of {REPRESENTATIONS}"
    for name in ("specs", "heads"):
        if not all(isinstance(item, dict) for item in doc.get(name, [])):
            return f"every entry of {name} must be a table"
    if not isinstance((doc.get("estimator") or {}).get("params", {}), dict):
        return "estimator.params must be a table"
    if not isinstance((doc.get("fitted") or {}).get("fit_stats_", {}), dict):
        return "fitted.fit_stats_ must be a table"
    return None


def _read_arrays(path: Path, doc: dict) -> dict[str, np.ndarray]:
    meta = doc.get("arrays")
    if not isinstance(meta, dict) or meta.get("file") != ARRAYS_FILE:
        raise ModelFileError(f"{path / JSON_FILE} does not describe its arrays file; re-save the model or refit it")
    f = path / ARRAYS_FILE
    if not f.is_file():
        raise ModelFileError(f"{f} is missing; re-save the model or refit it")
    size = f.stat().st_size
    if size != meta.get("bytes") or _sha256(f) != meta.get("sha256"):
        raise ModelFileError(f"{f} is truncated or corrupted ({size} bytes, expected {meta.get('bytes')}; checksum "
                             "mismatch); re-save the model or refit it")
    try:
        with np.load(f, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except Exception as exc:  # a damaged zip or an object array
        raise ModelFileError(f"{f} cannot be read ({type(exc).__name__}: {exc}); re-save the model or refit it") from None


def _check_target(path: Path) -> None:
    if not path.exists():
        return
    if path.is_dir() and (is_model_dir(path) or not any(path.iterdir())):
        return
    raise ModelFileError(f"{path} exists and is not an mklscale model directory; choose another path "
                         "(mklscale never overwrites what it did not write)")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def _plain(v):
    return v.item() if isinstance(v, np.generic) else v


def _classes_to_json(classes) -> tuple[list | None, str | None]:
    """Class labels as a JSON list and a numpy dtype string; only numbers, strings and booleans."""
    if classes is None:
        return None, None
    c = np.asarray(classes)
    if c.dtype.kind == "O":
        values = c.tolist()
        if all(isinstance(v, str) for v in values):
            c = np.asarray(values, dtype=str)
        elif all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            c = np.asarray(values, dtype=np.int64)
        else:
            raise InvalidInputError("class labels must be all numbers, all strings or booleans to be saved; "
                                    f"got {values[:5]!r}. Encode them (e.g. sklearn LabelEncoder) before fitting")
    if c.dtype.kind not in "biufU":
        raise InvalidInputError(f"class labels of dtype {c.dtype} cannot be saved; use numbers or strings")
    return [_plain(v) for v in c.tolist()], c.dtype.str


def _classes_from_json(values, dtype) -> np.ndarray | None:
    if values is None:
        return None
    return np.asarray(values, dtype=np.dtype(dtype))
