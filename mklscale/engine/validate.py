"""Checks of the engine's inputs; each failure says what is wrong and what to pass instead."""

from __future__ import annotations

import numpy as np

from mklscale.errors import InvalidInputError


def _numeric(x, what: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise InvalidInputError(f"{what} could not be read as an array ({exc}); pass a numpy array of floats") from None
    if arr.dtype.kind not in "fiu":
        raise InvalidInputError(f"{what} must be real numbers, got dtype {arr.dtype}; "
                                "convert it with np.asarray(..., dtype=float)")
    return arr


def _finite(arr: np.ndarray, what: str) -> np.ndarray:
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidInputError(f"{what} contains {int(bad.sum())} NaN/inf value(s) (first at index {where}); "
                                "check the solver state that produced it")
    return arr


def vectors(u, n: int, what: str = "u") -> tuple[np.ndarray, bool]:
    """(U as a (k, n) float64 C array, True if u was one vector)."""
    arr = _numeric(u, what)
    if arr.ndim == 1 and arr.shape[0] == n:
        return _finite(arr[None, :], what), True
    if arr.ndim == 2 and arr.shape[1] == n and arr.shape[0] >= 1:
        return _finite(arr, what), False
    raise InvalidInputError(f"{what} has shape {arr.shape}, but the bank has n={n} training points, so each vector "
                            f"needs length {n}; pass one vector of shape ({n},) or k vectors as an array of shape (k, {n})")


def per_kernel_vectors(u, count: int, n: int, what: str = "U") -> np.ndarray:
    """(count, n) float64: one vector per selected kernel."""
    arr = _numeric(u, what)
    if arr.ndim != 2 or arr.shape != (count, n):
        raise InvalidInputError(f"with per_kernel=True, {what} needs one row per selected kernel: shape ({count}, {n}), "
                                f"got {arr.shape}")
    return _finite(arr, what)


def kernel_indices(idx, M: int, what: str = "kernels") -> np.ndarray:
    """Kernel indices as an int64 array; each must be an integer in 0..M-1 (no negative indexing)."""
    if idx is None:
        raise InvalidInputError(f"{what} is None; pass a list of kernel indices in 0..{M - 1}")
    if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
        raise InvalidInputError(f"{what} must be a list or array of kernel indices, got the single integer {idx}; "
                                f"pass [{idx}]")
    try:
        arr = np.asarray(idx)
    except Exception:
        raise InvalidInputError(f"{what} could not be read as a list of kernel indices; pass integers in 0..{M - 1}") from None
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.ndim != 1:
        raise InvalidInputError(f"{what} must be a 1-D list of kernel indices, got an array of shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InvalidInputError(f"{what} must be integers, got dtype {arr.dtype} ({arr[:5].tolist()}...); "
                                "pass integer kernel indices (e.g. np.flatnonzero(mask), not a boolean mask or floats)")
    bad = (arr < 0) | (arr >= M)
    if bad.any():
        raise InvalidInputError(f"{what} has {int(bad.sum())} index(es) outside 0..{M - 1} "
                                f"(first: {arr[bad][:5].tolist()}); the bank has {M} kernels and negative indices "
                                "are not accepted")
    return arr.astype(np.int64)


def square(T, n: int, what: str = "T") -> np.ndarray:
    arr = _numeric(T, what)
    if arr.shape != (n, n):
        raise InvalidInputError(f"{what} must be a dense ({n}, {n}) matrix (n = training points of the bank), "
                                f"got shape {arr.shape}")
    return _finite(arr, what)


def weights(w, M: int, what: str = "weights") -> np.ndarray:
    arr = _numeric(w, what)
    if arr.ndim != 1 or arr.shape[0] != M:
        raise InvalidInputError(f"{what} must have one entry per kernel: shape ({M},), got {arr.shape}")
    return _finite(arr, what)
