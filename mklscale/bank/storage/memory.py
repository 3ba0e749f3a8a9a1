"""A bank in this process's memory: ``MemoryStorage``, for tests (the storage conformance suite, a
bank built and read with no disk and no server). Its location is ``MemoryLocation(name)``
(``memory://name``); every storage of one name in a process shares the same objects, so a bank
reopened by name (the engine's tasks in threads) finds them. Processes share nothing.

The objects are zarr ``Buffer``s in one dict, so zarr's ``MemoryStore`` over the same dict reads
and writes the metadata. The writer lock is a process-wide lock per name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from mklscale.bank.storage.base import RangeReader
from mklscale.bank.storage.keyed import KeyedStorage
from mklscale.errors import BankCorruptError, BankLockedError


@dataclass(frozen=True)
class MemoryLocation:
    """Where a ``MemoryStorage`` bank lives: ``memory://name``."""

    name: str

    def __str__(self) -> str:
        return f"memory://{self.name}"


_OBJECTS: dict[str, dict] = {}  # name -> {key: zarr Buffer}
_LOCKS: dict[str, threading.RLock] = {}
_HOLDERS: dict[str, str] = {}
_GUARD = threading.Lock()


class MemoryRange(RangeReader):
    def __init__(self, data: np.ndarray, where: str):
        self.data, self.size, self.where = data, data.size, where

    def read_into(self, offset: int, out: np.ndarray) -> None:
        raw = out.reshape(-1).view(np.uint8)
        if offset + raw.size > self.size:
            raise BankCorruptError(f"{self.where} ended early (wanted {raw.size} bytes at offset {offset})")
        raw[:] = self.data[offset:offset + raw.size]


class MemoryStorage(KeyedStorage):
    """The bank named ``location.name`` in this process's memory (module doc)."""

    def __init__(self, location: MemoryLocation):
        self.location = location
        with _GUARD:
            self._objects = _OBJECTS.setdefault(location.name, {})
            self._lock = _LOCKS.setdefault(location.name, threading.RLock())

    def zarr_store(self, read_only: bool = True):
        from zarr.storage import MemoryStore

        return MemoryStore(self._objects, read_only=read_only)

    def _data(self, key: str) -> np.ndarray | None:
        buf = self._objects.get(key)
        return None if buf is None else buf.as_numpy_array().view(np.uint8)

    def size(self, key: str) -> int | None:
        data = self._data(key)
        return None if data is None else data.size

    def open_range(self, key: str) -> MemoryRange | None:
        data = self._data(key)
        return None if data is None else MemoryRange(data, f"{self.location}/{key}")

    def put(self, key: str, data) -> None:
        from zarr.core.buffer import cpu

        self._objects[key] = cpu.Buffer.from_bytes(bytes(memoryview(data).cast("B")))  # one assignment: atomic

    def list(self) -> list[tuple[str, int]]:
        return sorted((key, len(buf)) for key, buf in list(self._objects.items()))

    def delete(self, key: str) -> None:
        self._objects.pop(key, None)

    def version(self) -> tuple[str, int]:
        buf = self._objects.get("zarr.json")
        return str(self.location), id(buf)

    @contextmanager
    def writer(self, what: str, wait: bool | float = True) -> Iterator[MemoryStorage]:
        timeout = -1 if wait is True else 0 if wait is False else float(wait)
        if not self._lock.acquire(timeout=timeout):
            raise BankLockedError(f"bank {self.location} is being written by {_HOLDERS.get(self.location.name)}; "
                                  "wait for it to finish")
        outer = self.location.name not in _HOLDERS
        _HOLDERS.setdefault(self.location.name, f"thread {threading.get_ident()} of this process ({what})")
        try:
            yield self
        finally:
            if outer:
                _HOLDERS.pop(self.location.name, None)
            self._lock.release()

    def other_writer(self) -> str | None:
        return None  # only this process ever writes a bank in its memory


def forget(name: str) -> None:
    """Drop the objects of the in-memory bank ``name``."""
    with _GUARD:
        _OBJECTS.pop(name, None)
