"""The driver-side LRU cache of kernel blocks ((n, n) arrays in the bank's storage dtype) under a
byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from mklscale.errors import InvalidInputError


def parse_bytes(value, name: str = "cache_bytes") -> int:
    """Bytes from an int or a string such as "2GB", "512MB", "1.5 GiB" (decimal units for kB/MB/GB,
    binary for KiB/MiB/GiB); ``name`` is the parameter named in error messages."""
    if isinstance(value, bool):
        raise InvalidInputError(f"{name} must be a byte count or a string like '2GB', got {value!r}")
    if isinstance(value, (int, np.integer)):
        nbytes = int(value)
    elif isinstance(value, str):
        from dask.utils import parse_bytes as dask_parse

        try:
            nbytes = int(dask_parse(value))
        except (ValueError, TypeError):
            raise InvalidInputError(f"cannot read {name}={value!r} as a size; write it like '2GB', '512MB' "
                                    "or 1000000") from None
    else:
        raise InvalidInputError(f"{name} must be a byte count or a string like '2GB', got {type(value).__name__}")
    if nbytes < 0:
        raise InvalidInputError(f"{name} must be >= 0, got {nbytes}")
    return nbytes


class BlockCache:
    """Kernel index -> read-only (n, n) array in the bank's storage dtype (float32 by default: the
    values as stored, half the bytes of float64; the engine's numba kernels widen them exactly and
    accumulate in float64), least recently used evicted first.

    The bytes held never exceed ``budget``: ``store`` refuses a set larger than the budget (the
    caller still returns the arrays, they are just not kept).
    """

    def __init__(self, budget: int):
        self.budget = int(budget)
        self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._nbytes = 0
        self._lock = threading.RLock()
        self.evictions = 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, m: int) -> bool:
        return int(m) in self._blocks

    def keys(self) -> list[int]:
        with self._lock:
            return list(self._blocks)

    def get(self, m: int) -> np.ndarray | None:
        """The block of kernel m (marked most recently used), or None."""
        with self._lock:
            block = self._blocks.get(int(m))
            if block is not None:
                self._blocks.move_to_end(int(m))
            return block

    def peek(self, m: int) -> np.ndarray | None:
        """The block of kernel m without changing its place in the LRU order."""
        return self._blocks.get(int(m))

    def touch(self, kernels: Iterable[int]) -> None:
        with self._lock:
            for m in kernels:
                if int(m) in self._blocks:
                    self._blocks.move_to_end(int(m))

    def store(self, blocks: dict[int, np.ndarray], keep: Iterable[int] = ()) -> bool:
        """Add ``blocks``; evict least recently used blocks (never those in ``keep``) to make room.
        Returns False (and stores nothing) when the new blocks plus ``keep`` exceed the budget."""
        with self._lock:
            keep = {int(m) for m in keep}
            new = {int(m): b for m, b in blocks.items() if int(m) not in self._blocks}
            need = sum(b.nbytes for b in new.values())
            kept = sum(self._blocks[m].nbytes for m in keep if m in self._blocks)
            if need + kept > self.budget:
                return False
            for m in list(self._blocks):
                if self._nbytes + need <= self.budget:
                    break
                if m not in keep:
                    self._nbytes -= self._blocks.pop(m).nbytes
                    self.evictions += 1
            for m, b in new.items():
                b = np.array(b, order="C")  # own copy: never pins the caller's (larger) array
                b.setflags(write=False)
                self._blocks[m] = b
                self._nbytes += b.nbytes
            return True

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._nbytes = 0
