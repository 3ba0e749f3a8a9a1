"""A bank on an S3-compatible object store (``s3://bucket/prefix``, issue 20): ``ObjectStorage``.

The client and its errors: ``objstore``; the writer lock and its fencing: ``objlock``; what it shares
with every key-value backend (creation marker, overwrite, copies): ``keyed``. Here:

- a shard is one object, one single-part PUT (atomic), checked by ``ObjectBank.put_verified``
  before the task returns, so the driver marks kernels complete only once their object is stored;
- reads: ``ObjectRange`` HEADs the object once; before a task's pieces the engine's reader calls
  ``prefetch(lo, hi)`` with the task's byte range of the shard, fetched on the first read inside it
  with concurrent ranged GETs into a buffer the thread reuses; pieces are then served from it.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from collections.abc import Iterator

import numpy as np

from mklscale.bank.direct_io import thread_buffer
from mklscale.bank.storage.keyed import KeyedStorage
from mklscale.bank.storage.location import ObjectURL
from mklscale.bank.storage.base import RangeReader
from mklscale.bank.storage.objstore import ObjectBank, describe_lock, lock_url, read_lock
from mklscale.bank.storage.writer_lock import by_this_process
from mklscale.errors import BankCorruptError, ObjectStoreError

#: which ObjectRange's byte range the calling thread's prefetch window holds
_local = threading.local()


class ObjectRange(RangeReader):
    """One object read with ranged GETs, through the thread's prefetch window (module doc)."""

    def __init__(self, ob: ObjectBank, key: str, size: int):
        self.ob, self.key, self.size = ob, key, size
        self.where = f"{ob.url}/{key}"
        self._plan = (0, 0)  # bytes a task is about to read (``prefetch``)
        self._lo = self._hi = 0  # the window [lo, hi) of the object in ``_buf`` while this object owns it
        self._buf: np.ndarray | None = None

    def _get(self, offset: int, out: np.ndarray) -> None:
        try:
            self.ob.read_into(self.key, offset, out)
        except (FileNotFoundError, EOFError) as exc:
            raise BankCorruptError(f"{self.where} changed or vanished while it was read ({exc}); run "
                                   "`mklscale bank verify`") from None

    def prefetch(self, lo: int, hi: int) -> None:
        self._plan = (lo, hi)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        raw = out.reshape(-1).view(np.uint8)
        end = offset + raw.size
        if getattr(_local, "owner", None) is not self or not (self._lo <= offset and end <= self._hi):
            lo, hi = self._plan
            if not (lo <= offset and end <= hi):
                self._get(offset, raw)  # outside the plan: one direct ranged GET
                return
            # the thread's window buffer is shared by the objects this thread reads: claim it
            _local.owner = None
            self._buf = thread_buffer(hi - lo, slot="window")
            self._get(lo, self._buf[: hi - lo])
            self._lo, self._hi, _local.owner = lo, hi, self
        raw[:] = self._buf[offset - self._lo: end - self._lo]

    def close(self) -> None:
        if getattr(_local, "owner", None) is self:
            _local.owner = None
        self._buf = None


class ObjectStorage(KeyedStorage):
    """The bank at ``location`` (an ``ObjectURL``; a fenced one writes through its writer's lock)."""

    reachable_from_workers = True  # every worker reaches the store by the URL (credentials in its environment)

    def __init__(self, location: ObjectURL):
        self.location = location
        self.ob = ObjectBank(location)

    def check_access(self) -> None:
        self.ob.check_access()

    def zarr_store(self, read_only: bool = True):
        return self.ob.zarr_store(read_only)

    def size(self, key: str) -> int | None:
        meta = self.ob.head(key)
        return None if meta is None else int(meta["size"])

    def open_range(self, key: str) -> ObjectRange | None:
        size = self.size(key)
        return None if size is None else ObjectRange(self.ob, key, size)

    def read(self, key: str) -> np.ndarray | None:
        size = self.size(key)
        if size is None:
            return None
        out = np.empty(size, dtype=np.uint8)
        try:
            self.ob.read_into(key, 0, out)
        except (FileNotFoundError, EOFError):
            return None if self.size(key) is None else self.read(key)  # replaced meanwhile: read again
        return out

    def put(self, key: str, data) -> None:
        self.ob.put_verified(key, data)

    def list(self) -> list[tuple[str, int]]:
        return sorted((meta["path"], int(meta["size"])) for meta in self.ob.list())

    def delete(self, key: str) -> None:
        self.ob.delete(key)

    def version(self) -> tuple[str, str]:
        return str(self.location), str((self.ob.head("zarr.json") or {}).get("e_tag"))

    @contextmanager
    def writer(self, what: str, wait: bool | float = True) -> Iterator[ObjectStorage]:
        from mklscale.bank.storage.objlock import object_writer

        with object_writer(self.location, what, wait) as fenced:
            yield ObjectStorage(fenced)

    def other_writer(self) -> str | None:
        where, key = lock_url(self.location)
        try:
            info = read_lock(ObjectBank(where), key)
        except ObjectStoreError:
            return None
        if info is None or info.get("released") or float(info.get("expires", 0)) <= time.time() \
                or by_this_process(info):
            return None
        return describe_lock(info)

    def unfenced(self) -> ObjectStorage:
        return ObjectStorage(self.location.with_fence(None))
