"""The shard-store protocol: what a bank needs from the place its bytes live.

A bank is a set of named objects (keys relative to the bank: ``zarr.json``, ``gram/zarr.json``,
``gram/c/<s>/0/0``, ...), the same keys on every backend, so a bank copied key by key is the same
bank. A ``Storage`` is one bank's location on one backend; it offers

- bytes: ``size(key)``, ``open_range(key)`` (a ``RangeReader``: read a byte range into a buffer),
  ``read(key)``, ``put(key, data)`` (atomic: a reader sees the old object or the new one, never a
  torn one), ``write_shard`` (the same for a shard, in ``shard_format``'s layout), ``list()``,
  ``delete(key)``;
- the bank's zarr group: ``open_group(mode)``, ``create_group(...)`` (appears whole or not at all);
- the writer lock: ``writer(what, wait)`` holds it and yields the storage to write through
  (on an object store fenced by the lock: ``objlock``), ``other_writer()`` names another holder;
- what a build does with the location (``refuse_target`` before the lock, ``prepare`` under it);
- the capabilities callers ask instead of asking which backend it is: ``mappable`` (objects are
  local files the reader may map or read with O_DIRECT), ``reachable_from_workers`` (a worker on
  another host reaches it by its location alone), ``room()`` (bytes free where it writes, None: no limit to
  check), ``worker_location`` (what a task is given to reopen the bank).

Backends: ``local.LocalStorage`` (a folder on a local or shared file system), ``objects.ObjectStorage``
(``s3://bucket/prefix``), ``memory.MemoryStorage`` (a process's memory, for tests). One conformance
suite (tests/test_storage.py) runs on all three; ``storage_for`` is the one place that picks one.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from mklscale.bank import shard_format

#: The marker object/file of a bank being created or copied and not finished yet.
CREATING = ".mklscale-creating"


class RangeReader(ABC):
    """One stored object opened for reading byte ranges (a shard: its index at the end, kernels in
    between). ``size`` is its length; ``where`` names it in messages."""

    size: int
    where: str

    @abstractmethod
    def read_into(self, offset: int, out: np.ndarray) -> None:
        """Bytes [offset, offset + out.nbytes) into ``out`` (C-contiguous); BankCorruptError when the
        object ends early or vanished meanwhile."""

    def prefetch(self, lo: int, hi: int) -> None:
        """A hint: bytes [lo, hi) are about to be read (a backend with costly requests fetches them at once)."""

    def view(self, offset: int, nbytes: int) -> np.ndarray | None:
        """The bytes as a read-only view of a mapping, or None where this backend maps nothing."""
        return None

    def read_direct(self, offset: int, nbytes: int) -> np.ndarray | None:
        """The bytes read past the page cache (O_DIRECT) into the thread's aligned buffer, or None
        where this backend or its file system cannot."""
        return None

    def checked(self) -> set[int] | None:
        """Kernels of this object's current version whose mapped bytes were checked already (None: not mapped)."""
        return None

    def close(self) -> None:
        pass


class Storage(ABC):
    """One bank's location on one backend (module doc). ``location`` is what users give and see:
    a ``Path`` or an ``ObjectURL``."""

    location: Path | object
    #: objects are local files: the reader may map them or read them with O_DIRECT
    mappable: bool = False
    #: a worker on another host reaches the bank by ``worker_location`` alone (no shared folder needed)
    reachable_from_workers: bool = False

    def __str__(self) -> str:
        return str(self.location)

    # ---- bytes ------------------------------------------------------------------------------
    @abstractmethod
    def size(self, key: str) -> int | None:
        """Bytes of object ``key``, None when there is none."""

    @abstractmethod
    def open_range(self, key: str) -> RangeReader | None:
        """``key`` opened for ranged reads, None when there is none."""

    def read(self, key: str) -> np.ndarray | None:
        """The whole object ``key`` as uint8, None when there is none."""
        source = self.open_range(key)
        if source is None:
            return None
        try:
            out = np.empty(source.size, dtype=np.uint8)
            source.read_into(0, out)
            return out
        finally:
            source.close()

    @abstractmethod
    def put(self, key: str, data) -> None:
        """Store ``data`` (bytes-like) as ``key``, atomically, checked before returning."""

    def write_shard(self, s: int, block: np.ndarray, per_chunk: int, per_shard: int, array: str = "gram") -> None:
        """Shard s of ``array`` holding ``block`` in ``shard_format``'s layout, stored atomically."""
        self.put(shard_format.shard_key(s, array), shard_format.shard_bytes(block, per_chunk, per_shard))

    @abstractmethod
    def list(self) -> list[tuple[str, int]]:
        """(key, size) of every object of the bank (and anything else under its location)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (nothing when there is none)."""

    def describe(self, key: str) -> str:
        """How messages name object ``key``: 'file /x/bank/gram/c/0/0', 'object gram/c/0/0'."""
        return f"object {key}"

    def total_bytes(self) -> int:
        return sum(size for _, size in self.list())

    def room(self) -> tuple[int, str] | None:
        """(bytes that can still be written here, the file system they are on: its mount point), or
        None where there is no limit to check (an object store)."""
        return None

    # ---- the bank's group -------------------------------------------------------------------
    @abstractmethod
    def open_group(self, mode: str):
        """The bank's zarr group in ``mode``, or None when the location holds no bank."""

    @abstractmethod
    def open_bank_group(self, mode: str):
        """``open_group``, raising NotABankError with what to do when there is no bank (or the
        location exists and is something else), ReadOnlyStoreError for "r+" on a read-only store."""

    def is_bank(self) -> bool:
        return self.open_group("r") is not None

    @abstractmethod
    def create_group(self, replace: bool = False, **kwargs) -> None:
        """``group.create_bank_group(**kwargs)`` here: the group appears whole or not at all;
        ``replace``: an existing bank is swapped out for the new one."""

    @abstractmethod
    def version(self) -> tuple[str, object]:
        """(location, a token that changes when the bank is created anew): a process's cache key."""

    @property
    def worker_location(self):
        """What a task gets to reopen this bank in another process (pickled into the task)."""
        return self.location

    # ---- writers ----------------------------------------------------------------------------
    @abstractmethod
    def writer(self, what: str, wait: bool | float = True) -> contextlib.AbstractContextManager[Storage]:
        """Hold this bank's writer lock (one writer per bank; ``wait``: True waits, a number of seconds
        waits that long, False refuses at once with BankLockedError) and yield the storage to write
        through, made safe to write (a killed writer's leftovers removed)."""

    @abstractmethod
    def other_writer(self) -> str | None:
        """Who else holds the writer lock now ('pid 12 on host h (build since ...)'), or None."""

    def unfenced(self) -> Storage:
        """This storage for reading after the writer lock is released (its location without a fence)."""
        return self

    # ---- what a build does with its target --------------------------------------------------
    @abstractmethod
    def refuse_target(self, overwrite: bool, fingerprint: str | None, open_bank: Callable) -> str:
        """What ``prepare`` will do ("create", "resume", "replace"), or the error it will raise, found
        without writing anything (callers ask before they take the writer lock). ``open_bank(location)``
        opens the existing bank (a ``KernelBank``)."""

    @abstractmethod
    def prepare(self, overwrite: bool, fingerprint: str | None, open_bank: Callable) -> str:
        """Under the writer lock: "resume" (a bank of the same fingerprint is there), "replace"
        (``overwrite`` of a bank: ``create_group(replace=True)`` swaps the new one in), "create"
        (nothing there, or what was there is cleared); refuses anything else."""

    # ---- copies -----------------------------------------------------------------------------
    @abstractmethod
    def export_to(self, folder: Path) -> None:
        """Every object into files under ``folder`` (``zarr.json`` last)."""

    @contextlib.contextmanager
    def as_folder(self) -> Iterator[Path]:
        """A local folder holding the bank's files for the duration (a temporary copy where needed)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mklscale-copy-") as tmp:
            self.export_to(Path(tmp) / "bank")
            yield Path(tmp) / "bank"

    @abstractmethod
    def install(self, source: Storage, overwrite: bool) -> None:
        """Make this location hold a copy of the bank at ``source``, appearing whole or recognisably
        unfinished (called holding the writer lock); a non-empty location is refused unless
        ``overwrite`` and it holds a bank."""


def upload_tree(storage: Storage, folder: Path, last: str = "zarr.json") -> None:
    """Put every file under ``folder`` to the same keys of ``storage``; the top-level ``last`` goes
    last, so a reader sees the bank only once all of it is there."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    top = folder / last
    for p in [p for p in files if p != top] + ([top] if top in files else []):
        storage.put(p.relative_to(folder).as_posix(), np.fromfile(p, dtype=np.uint8))


def download_tree(storage: Storage, folder: Path) -> None:
    """Every object of ``storage`` into files under ``folder`` (``zarr.json`` last)."""
    folder = Path(folder)
    keys = sorted(key for key, _ in storage.list())
    for key in [k for k in keys if k != "zarr.json"] + (["zarr.json"] if "zarr.json" in keys else []):
        target = folder / key
        target.parent.mkdir(parents=True, exist_ok=True)
        data = storage.read(key)
        if data is not None:
            data.tofile(target)

