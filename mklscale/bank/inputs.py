"""Checks of what users hand to a bank: raw features, the stored dtype, imported Gram matrices.

Each check raises InvalidInputError with a message that says what is wrong and how to fix it.
"""

from __future__ import annotations

import numpy as np

from mklscale.errors import InvalidInputError

#: The dtypes a bank stores its kernels in, and its normalisation rules (``normalize.normalize_block``).
DTYPES = ("float32", "float64")
NORMALIZATIONS = ("trace", "diag", None)


def validate_features(X, what: str = "X") -> np.ndarray:
    """``X`` as a finite, non-empty 2-D float64 array (``what`` names it in the messages)."""
    X = np.asarray(X)
    if X.dtype.kind not in "fiub":
        raise InvalidInputError(f"{what} must be numeric, got dtype {X.dtype}; convert it with "
                                f"np.asarray({what}, dtype=float) (encode categorical columns first)")
    X = X.astype(np.float64, copy=False)
    if X.ndim != 2:
        raise InvalidInputError(f"{what} must be a 2-D array (n_samples, n_features), got shape {X.shape}; reshape "
                                f"it, e.g. {what}.reshape(-1, 1) for a single feature")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InvalidInputError(f"{what} is empty (shape {X.shape}); it needs at least one row and one feature")
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InvalidInputError(f"{what} contains {int(bad.sum())} NaN/inf value(s) (first at row {r}, column {c}); "
                                "impute or drop them before building kernels")
    big = np.abs(X) > MAX_FEATURE_MAGNITUDE
    if big.any():
        r, c = np.argwhere(big)[0]
        raise InvalidInputError(f"{what} holds {int(big.sum())} value(s) of magnitude above {MAX_FEATURE_MAGNITUDE:g} "
                                f"(first {X[r, c]:g} at row {r}, column {c}); squared distances and inner products "
                                "of such values overflow float64: rescale those columns (e.g. log or divide by a "
                                "constant) before building kernels")
    return X


#: |x| above this overflows x^2 summed over features in float64 (1e150^2 = 1e300 < 1.8e308)
MAX_FEATURE_MAGNITUDE = 1e150


def validate_dtype(dtype) -> np.dtype:
    """``dtype`` as a numpy dtype, one of ``DTYPES``."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.name not in DTYPES:
        raise InvalidInputError(f"bank dtype must be one of {DTYPES}, got {dtype!r}")
    return dt


def check_gram(name: str, K: np.ndarray, n: int, psd_tol: float) -> None:
    """Refuse an imported Gram matrix that is not n x n, finite, symmetric and PSD within ``psd_tol``."""
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise InvalidInputError(f"Gram matrix {name!r} is not square: shape {K.shape}")
    if K.shape[0] != n:
        raise InvalidInputError(f"Gram matrix {name!r} is {K.shape[0]} x {K.shape[0]} but the first one is {n} x {n}")
    if not np.isfinite(K).all():
        raise InvalidInputError(f"Gram matrix {name!r} contains NaN or inf")
    scale = max(1.0, float(np.abs(K).max()))
    asym = float(np.abs(K - K.T).max())
    if asym > 1e-6 * scale:
        raise InvalidInputError(f"Gram matrix {name!r} is not symmetric (max |K - K^T| = {asym:.3g}); symmetrise it, e.g. (K + K.T) / 2")
    eig = np.linalg.eigvalsh(K)
    if eig[0] < -psd_tol * max(1.0, float(eig[-1])):
        raise InvalidInputError(f"Gram matrix {name!r} is not positive semidefinite: smallest eigenvalue {eig[0]:.6g} "
                                f"(largest {eig[-1]:.6g}); fix the kernel or clip negative eigenvalues before importing")
