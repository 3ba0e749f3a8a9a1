"""How large a bank will be, checked against the free disk space before any work starts.

A dense bank stores M kernels of n x n values, a factor bank M factors of n x rank values (plus a
few floats per kernel). A bank that cannot fit is refused with its size, so that
``--n-kernels 1000000000`` fails in a second instead of generating specs and writing for days.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from mklscale.errors import InvalidInputError


def bank_bytes(M: int, n: int, dtype: str = "float32", rank: int | None = None) -> int:
    """Bytes of the kernel data of a bank of M kernels over n rows (dense, or rank-``rank`` factors)."""
    width = n if rank is None else min(int(rank), n)
    return int(M) * int(n) * width * np.dtype(dtype).itemsize


def count_kernels(kernels, n_features: int) -> int:
    """The number of specs ``families.resolve(kernels, n_features)`` gives, without generating
    ``random_subsets`` specs (their number is the description's n_kernels, checked)."""
    from mklscale.bank import families

    items = kernels if isinstance(kernels, (list, tuple)) else [kernels]
    total = 0
    for item in items:
        if isinstance(item, (str, dict)) and not (isinstance(item, dict) and "params" in item):
            family, params = families.parameters(item)
            if family == "random_subsets":
                total += params["n_kernels"]
                continue
        total += len(families.resolve(item, n_features))
    return total


def check_fits(path: str | Path, M: int, n: int, dtype: str = "float32", rank: int | None = None) -> None:
    """Raise InvalidInputError when a new bank at ``path`` would not fit on its disk (an existing bank
    at ``path`` is resumed into space it mostly holds already, and an object store has no disk to
    ask: neither is checked)."""
    if "://" in str(path):
        return  # an object store (s3://...): no local disk to check
    path = Path(path)
    if path.exists():
        return
    need = bank_bytes(M, n, dtype, rank)
    parent = next((p for p in [path.parent, *path.parent.parents] if p.exists()), Path("."))
    free = shutil.disk_usage(parent).free
    if need > free:
        hint = "" if rank is not None else ", or a factor bank (--rank 64 / rank = 64) of n x 64 per kernel"
        raise InvalidInputError(f"a bank of {M} kernels over n = {n} rows ({dtype}) takes {_size(need)}, but the disk "
                                f"holding {path} has {_size(free)} free; use fewer kernels or rows{hint}, or choose a "
                                "path on a larger disk")


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if nbytes < 1000 or unit == "PB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1000
    return f"{nbytes:.3g} PB"
