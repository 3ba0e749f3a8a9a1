"""Input checks shared by the solvers; every failure raises InvalidInputError saying what to do."""

from __future__ import annotations

import math

import numpy as np

from mklscale.engine.contract import KernelEngine
from mklscale.errors import InvalidInputError


def check_targets(y, n: int, classification: bool, loss_name: str) -> np.ndarray:
    """y as a float64 (n,) array; classification losses need labels in {-1, +1}, both present."""
    try:
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"y must be numeric; could not convert it to float64 ({exc})") from None
    if y.ndim != 1:
        raise InvalidInputError(f"y must be 1-D; got shape {y.shape}")
    if y.size != n:
        raise InvalidInputError(f"y has {y.size} entries but the kernel bank has n = {n} training "
                                "points; pass the targets of the rows the bank was built on")
    if not np.all(np.isfinite(y)):
        raise InvalidInputError(f"y contains {int(np.sum(~np.isfinite(y)))} NaN/inf values; "
                                "drop or impute those rows before building the bank")
    if classification:
        labels = np.unique(y)
        if not np.all(np.isin(labels, (-1.0, 1.0))):
            shown = labels[:5].tolist()
            raise InvalidInputError(
                f"the {loss_name} loss needs two-class labels in {{-1, +1}}; got values {shown}"
                f"{'...' if labels.size > 5 else ''}. Map the classes to -1/+1 (e.g. y = 2*y - 1 "
                "for 0/1 labels); for more than two classes use one-vs-rest")
        if labels.size != 2:
            raise InvalidInputError(f"the {loss_name} loss needs both classes -1 and +1 in y; "
                                    f"only {labels.tolist()} is present; give labels of both classes")
    return y


def check_positive(name: str, value, allow_zero: bool = False) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a number; got {value!r}") from None
    ok = math.isfinite(value) and (value >= 0.0 if allow_zero else value > 0.0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidInputError(f"{name} must be finite and {bound}; got {value}; pass a finite {name} {bound}")
    return value


def check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidInputError(f"{name} must be an integer >= {minimum}; got {value!r}; pass an integer >= {minimum}")
    return int(value)


def check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise InvalidInputError(f"unknown {name} {value!r}; choose one of {tuple(choices)}")
    return value


def require_engine(engine) -> KernelEngine:
    """``engine`` itself if it implements the engine contract (mklscale.engine.contract)."""
    if not isinstance(engine, KernelEngine):
        raise InvalidInputError(f"expected an mklscale engine (a KernelEngine: Engine, InMemoryEngine or a view of "
                                f"mklscale.engine); got {type(engine).__name__}")
    return engine


def check_engine(engine, allow_unavailable: bool = False) -> tuple[int, int, np.ndarray]:
    """(n, M, lambda_max) of an engine, checked. With ``allow_unavailable``, NaN lambda_max marks
    a kernel the engine cannot serve (an unfinished kernel of a bank opened with allow_incomplete);
    otherwise every lambda_max must be finite."""
    require_engine(engine)
    n, M = int(engine.n), int(engine.M)
    lam = np.asarray(engine.lambda_max, dtype=np.float64).reshape(-1)
    known = lam[~np.isnan(lam)] if allow_unavailable else lam
    if n < 2 or M < 1 or lam.size != M or not np.all(np.isfinite(known)) or np.any(known < 0):
        raise InvalidInputError(f"engine reports n={n}, M={M} and {lam.size} lambda_max values; one finite "
                                "non-negative value per kernel is needed")
    return n, M, lam


def check_working_set(working_set, M: int):
    """None/"auto" (grow from the violators), "all", or a sequence of kernel indices to start from."""
    if working_set is None:
        return "auto"
    if isinstance(working_set, str):
        if working_set in ("auto", "all"):
            return working_set
        raise InvalidInputError(f"working_set must be None, 'auto', 'all' or kernel indices; got {working_set!r}")
    try:
        idx = np.unique(np.asarray(list(working_set), dtype=np.int64).reshape(-1))
    except (TypeError, ValueError):
        raise InvalidInputError(f"working_set must be None, 'auto', 'all' or kernel indices; got {working_set!r}") from None
    if idx.size and (idx[0] < 0 or idx[-1] >= M):
        raise InvalidInputError(f"working_set indices must lie in [0, {M}); got {idx.tolist()[:10]}")
    return idx
