"""Every field of an ``MKLModel`` checked against the others, before any compiled kernel sees them.

A model read from disk (or built from fitted results) is refused when one of its fields is of the
wrong kind, shape or dtype, holds NaN/inf, or disagrees with another: H heads and k kept kernels
(``weights`` (H, k)) fix the shape of every other array, the training rows S of a dense model
(``rows`` (r,)) fix ``dual_coef`` (H, r) and ``X_rows`` (r, d), d = ``n_features`` fixes ``mean``,
``scale``, the kernels' feature subsets and a factor model's ``factor_landmark_rows`` (p, d);
indices must lie inside what they index. ``check_model`` raises ValueError("FIELD: what is wrong"),
which the callers turn into ModelFileError (a file) or InvalidInputError (fitted results).

Without these checks a crafted or damaged file reaches the numba distance kernels with operands
of other shapes than they index (reads out of bounds), or predicts constant labels from NaN
weights without a word.
"""

from __future__ import annotations

import numpy as np

from mklscale.bank.inputs import NORMALIZATIONS
from mklscale.bank.spec import KernelSpec

TASKS = ("classification", "regression")


def check_model(m) -> None:
    """Raise ValueError naming the first inconsistent field of MKLModel ``m`` (module docstring)."""
    if m.task not in TASKS:
        raise ValueError(f"task {m.task!r} is not one of {TASKS}")
    if m.dataset_features not in ("raw", "standardised"):
        raise ValueError(f"dataset_features {m.dataset_features!r} is not 'raw' or 'standardised'")
    if m.normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize {m.normalize!r} is not one of {NORMALIZATIONS}")
    weights = _floats("weights", m.weights, 2)
    H, k = weights.shape
    if H < 1:
        raise ValueError("weights has no head (shape (0, k)); a model has at least one head")
    _floats("bias", m.bias, 1, (H,))
    _check_heads(m, H)
    _check_classes(m, H)
    d = _count("n_features", m.n_features, none_ok=True)
    n_bank = _count("n_bank_kernels", m.n_bank_kernels)
    n_train = _count("n_train", m.n_train)
    if not isinstance(m.specs, list) or len(m.specs) != k or not all(isinstance(s, KernelSpec) for s in m.specs):
        raise ValueError(f"specs must list the {k} kept kernels (weights has {k} columns)")
    norm = _floats("norm_factor", m.norm_factor, 1, (k,))
    if (norm <= 0).any():
        raise ValueError("norm_factor has entries <= 0; the per-kernel normalisation factors are positive")
    _indices("bank_kernels", m.bank_kernels, k, n_bank)
    if (m.mean is None) != (m.scale is None):
        raise ValueError("mean and scale come together: one is missing")
    if m.mean is not None:
        if d is None:
            raise ValueError("mean/scale are given but n_features is null")
        _floats("mean", m.mean, 1, (d,))
        if (_floats("scale", m.scale, 1, (d,)) <= 0).any():
            raise ValueError("scale has entries <= 0; standardisation divides by it")
    if d is not None:
        for s in m.specs:
            if s.family == "precomputed":
                raise ValueError(f"specs: kernel {s.name} is precomputed but the model has features (n_features {d})")
            if s.features is not None and max(s.features) >= d:
                raise ValueError(f"specs: kernel {s.name} uses feature {max(s.features)} but n_features is {d}")
    if m.factor is None:
        _check_dense(m, H, d, n_train)
    else:
        _check_factor(m, H, k, d)


def _check_dense(m, H: int, d: int | None, n_train: int) -> None:
    r = _indices("rows", m.rows, None, n_train)
    _floats("dual_coef", m.dual_coef, 2, (H, r))
    if np.ndim(m.train_row_ids) != 1 or np.shape(m.train_row_ids)[0] != r:
        raise ValueError(f"train_row_ids must have shape ({r},) (one id per kept row); got {np.shape(m.train_row_ids)}")
    if (m.X_rows is None) != (d is None):
        raise ValueError("X_rows is missing although n_features is set" if m.X_rows is None
                         else "X_rows is given but n_features is null")
    if m.X_rows is not None:
        _floats("X_rows", m.X_rows, 2, (r, d))


def _check_factor(m, H: int, k: int, d: int | None) -> None:
    f = m.factor
    if d is None:
        raise ValueError("n_features is null, but a factor model evaluates its kernels on features")
    if m.X_rows is not None or np.size(m.rows) != 0 or np.shape(m.dual_coef) != (H, 0):
        raise ValueError("a factor model keeps no training rows: X_rows must be absent, rows and dual_coef empty")
    coef = _floats("factor_coef", f.coef, 3)
    if coef.shape[:2] != (H, k) or coef.shape[2] < 1:
        raise ValueError(f"factor_coef must have shape ({H}, {k}, rank); got {coef.shape}")
    r = coef.shape[2]
    landmarks = _floats("factor_landmark_rows", f.landmark_rows, 2)
    if landmarks.shape[1] != d:
        raise ValueError(f"factor_landmark_rows has {landmarks.shape[1]} columns but n_features is {d}")
    _floats("factor_transforms", f.transforms, 3, (k, r, r))
    index = np.asarray(f.landmark_index)
    if index.dtype.kind not in "iu" or index.shape != (k, r):
        raise ValueError(f"factor_landmark_index must be integers of shape ({k}, {r}); got {index.dtype} {index.shape}")
    if index.size and (index.min() < -1 or index.max() >= landmarks.shape[0]):
        raise ValueError(f"factor_landmark_index must lie in [-1, {landmarks.shape[0]}) (positions in "
                         "factor_landmark_rows, -1 for padding)")
    used = index >= 0
    if (used[:, 1:] & ~used[:, :-1]).any():
        raise ValueError("factor_landmark_index: each kernel's landmarks come first, the -1 padding after them")


def _check_heads(m, H: int) -> None:
    if not isinstance(m.heads, list) or len(m.heads) != H or not all(isinstance(h, dict) for h in m.heads):
        raise ValueError(f"heads must list {H} head(s) (weights has {H} rows)")


def _check_classes(m, H: int) -> None:
    if m.task == "regression":
        if m.classes is not None or H != 1:
            raise ValueError("a regression model has one head and no classes")
        return
    classes = m.classes
    if classes is None or np.ndim(classes) != 1 or len(classes) < 2:
        raise ValueError("classes must list at least two labels for a classification model")
    if len(np.unique(classes)) != len(classes):
        raise ValueError("classes repeats a label")
    if H != len(classes) and not (H == 1 and len(classes) == 2):
        raise ValueError(f"{len(classes)} classes need one head per class (or one head for two classes); weights "
                         f"has {H} head(s)")


def _floats(name: str, a, ndim: int, shape: tuple | None = None) -> np.ndarray:
    """``a`` as a finite float64 array of ``ndim`` dimensions (and ``shape``), else ValueError."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float64:
        raise ValueError(f"{name} must be a float64 array; got {getattr(a, 'dtype', type(a).__name__)}")
    if a.ndim != ndim or (shape is not None and a.shape != tuple(shape)):
        want = shape if shape is not None else f"{ndim} dimension(s)"
        raise ValueError(f"{name} has shape {a.shape}; expected {want}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or inf")
    return a


def _indices(name: str, a, size: int | None, bound: int) -> int:
    """``a`` as strictly increasing integers in [0, bound) (of ``size`` entries); returns its size."""
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu" or a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D integer array; got {getattr(a, 'dtype', type(a).__name__)} "
                         f"{np.shape(a)}")
    if size is not None and a.size != size:
        raise ValueError(f"{name} has {a.size} entries; expected {size}")
    if a.size and (a.min() < 0 or a.max() >= bound or (np.diff(a) <= 0).any()):
        raise ValueError(f"{name} must be increasing indices in [0, {bound})")
    return int(a.size)


def _count(name: str, v, none_ok: bool = False) -> int | None:
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive integer; got {v!r}")
    return int(v)
