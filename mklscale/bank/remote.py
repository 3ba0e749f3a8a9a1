"""What differs for a bank on an object store (``s3://bucket/prefix``, issue 20), behind small hooks
in ``store``, ``build`` and the engine's ``reader``: opening and creating its group, deciding what to
do with the target of a build, writing and reading shard objects, and copying banks.

The bank's objects have the keys its files would have on disk (``zarr.json``, ``gram/c/<s>/0/0``,
...), so a bank copied object by object is the same bank. Differences from a folder:

- creation: the group is created in a local temporary folder (``group.create_bank_group``) and
  uploaded with the root ``zarr.json`` last, after a marker object ``.mklscale-creating``; a prefix
  holding the marker but no ``zarr.json`` is the leftover of an interrupted creation and is reused.
- shards: one object each, one single-part PUT (atomic), checked by ``ObjectBank.put_verified``
  before the task returns, so the driver marks kernels complete only once their object is stored.
- metadata arrays and attributes go through zarr's ``ObjectStore``; each array is one chunk, one PUT.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import numpy as np

from mklscale.bank import shard_format
from mklscale.bank.direct_io import thread_buffer
from mklscale.bank.group import create_bank_group, data_array_name, open_bank_group, refuse_foreign
from mklscale.bank.location import ObjectURL
from mklscale.bank.objstore import ObjectBank
from mklscale.errors import BankCorruptError, BankMismatchError, NotABankError

CREATING = ".mklscale-creating"


def objects(url: ObjectURL) -> ObjectBank:
    return ObjectBank(url)


def open_group(url: ObjectURL, mode: str):
    """The bank's zarr group on the store, or None when ``url`` holds no bank (after checking
    that the bucket exists and the credentials work: ObjectStoreError otherwise)."""
    ob = ObjectBank(url)
    ob.check_access()
    if not ob.exists("zarr.json"):
        return None
    return open_bank_group(url, mode, store=ob.zarr_store(read_only=(mode == "r")))


def is_bank(url: ObjectURL) -> bool:
    return open_group(url, "r") is not None


def prepare(url: ObjectURL, overwrite: bool, fingerprint: str | None, is_same) -> bool:
    """``store.prepare_path`` for a URL: True to resume the bank there; clears it with
    ``overwrite``; refuses a prefix holding other objects. ``is_same(fingerprint)`` compares with
    the existing bank's fingerprint."""
    ob = ObjectBank(url)
    ob.check_access()
    keys = [m["path"] for m in ob.list()]
    if not keys:
        return False
    if "zarr.json" not in keys:
        if CREATING in keys:  # our own interrupted creation: nothing in it was ever a bank
            delete_all(ob, keys)
            return False
        raise NotABankError(f"{url} holds objects and is not an mklscale kernel bank; choose another prefix "
                            "(mklscale never deletes objects it did not create)")
    if open_group(url, "r") is None:
        raise NotABankError(f"{url} holds a zarr.json that is not an mklscale kernel bank; choose another prefix")
    if overwrite:
        refuse_foreign(url, keys, [name for name, _ in open_group(url, "r").members()])
        delete_all(ob, keys)
        return False
    if fingerprint is not None and is_same(fingerprint):
        return True
    raise BankMismatchError(f"{url} holds a bank built from different data, kernel specs or settings; pass "
                            "overwrite=True (CLI: --overwrite) to replace it, or choose another prefix")


def delete_all(ob: ObjectBank, keys: list[str]) -> None:
    """Delete ``keys`` of a bank (an overwrite; what an interrupted creation or copy left)."""
    # zarr.json first: from then on the prefix is no bank, whatever else is left
    for key in sorted(keys, key=lambda k: (k != "zarr.json", k)):
        ob.delete(key)


def create_group(url: ObjectURL, **kwargs) -> None:
    """``group.create_bank_group`` for a URL: build the group in a temporary folder, upload it
    (marker first, root ``zarr.json`` last), remove the marker."""
    ob = ObjectBank(url)
    ob.put(CREATING, b"")
    with tempfile.TemporaryDirectory(prefix="mklscale-bank-") as tmp:
        local = Path(tmp) / "bank.zarr"
        create_bank_group(local, **kwargs)
        ob.upload_tree(local)
    ob.delete(CREATING)


# ---- shards ---------------------------------------------------------------------------------------
def shard_key(s: int, array: str = "gram") -> str:
    return f"{array}/c/{s}/0/0"


def write_shard(url: ObjectURL, s: int, block: np.ndarray, per_chunk: int, per_shard: int,
                array: str = "gram") -> None:
    """``shard_format.write_shard_file`` for a URL: the same bytes, one verified PUT."""
    ObjectBank(url).put_verified(shard_key(s, array), shard_format.shard_bytes(block, per_chunk, per_shard))


def shard_size(bank, s: int) -> int | None:
    meta = ObjectBank(bank.path).head(shard_key(s, data_array_name(bank.representation)))
    return None if meta is None else int(meta["size"])


def read_shard_bytes(bank, s: int) -> np.ndarray | None:
    """The whole shard object as uint8 (concurrent ranged GETs), or None when there is none."""
    ob = ObjectBank(bank.path)
    key = shard_key(s, data_array_name(bank.representation))
    meta = ob.head(key)
    if meta is None:
        return None
    out = np.empty(int(meta["size"]), dtype=np.uint8)
    try:
        ob.read_into(key, 0, out)
    except (FileNotFoundError, EOFError):
        return None if not ob.exists(key) else read_shard_bytes(bank, s)  # replaced meanwhile: read again
    return out


#: which ObjectShard's byte range the calling thread's prefetch window holds
_local = threading.local()


class ObjectShard:
    """``engine.reader``'s shard for a bank on an object store: the same interface as its file
    shard (``offset``, ``same_chunk``, ``read``, ``close``) plus ``prefetch``: the byte range a
    task is about to read is fetched with concurrent ranged GETs into a buffer the thread reuses,
    and pieces are then served from it."""

    def __init__(self, bank, s: int):
        self.s = s
        self.ob = ObjectBank(bank.path)
        self.key = shard_key(s, data_array_name(bank.representation))
        self.path = f"{bank.path}/{self.key}"
        first, stop = bank.shard_range(s)
        self.first = first
        self.per_chunk = int(bank.attrs["layout"]["kernels_per_chunk"])
        self.kernel_bytes = bank.n * bank.block_shape[1] * bank.dtype.itemsize
        meta = self.ob.head(self.key)
        if meta is None:
            raise BankCorruptError(f"shard {s} of {bank.path} (kernels {first}..{stop - 1}): the shard object is "
                                   "missing although its kernels are marked complete; run `mklscale bank verify` and "
                                   "`mklscale bank repair`")
        size = int(meta["size"])
        tail = np.empty(min(size, bank.shard_index_bytes), dtype=np.uint8)
        self._get(size - tail.size, tail)
        self.offsets = bank.chunk_offsets(s, size, tail.tobytes())
        self._plan = (0, 0)  # bytes a task is about to read (``prefetch``)
        self._lo = self._hi = 0  # the window [lo, hi) of the object in ``_buf`` while this shard owns it
        self._buf: np.ndarray | None = None

    def _get(self, offset: int, out: np.ndarray) -> None:
        try:
            self.ob.read_into(self.key, offset, out)
        except (FileNotFoundError, EOFError) as exc:
            raise BankCorruptError(f"{self.path} changed or vanished while it was read ({exc}); run "
                                   "`mklscale bank verify`") from None

    def offset(self, m: int) -> int:
        local = m - self.first
        return int(self.offsets[local // self.per_chunk]) + (local % self.per_chunk) * self.kernel_bytes

    def same_chunk(self, m: int, m2: int) -> bool:
        return (m - self.first) // self.per_chunk == (m2 - self.first) // self.per_chunk

    def prefetch(self, lo: int, hi: int) -> None:
        """Plan to read bytes [lo, hi): the first read inside them fetches them all, concurrently."""
        self._plan = (lo, hi)

    def read(self, offset: int, out: np.ndarray) -> None:
        raw = out.reshape(-1).view(np.uint8)
        end = offset + raw.size
        if getattr(_local, "owner", None) is not self or not (self._lo <= offset and end <= self._hi):
            lo, hi = self._plan
            if not (lo <= offset and end <= hi):
                self._get(offset, raw)  # outside the plan: one direct ranged GET
                return
            # the thread's window buffer is shared by the shards this thread reads: claim it
            _local.owner = None
            self._buf = thread_buffer(hi - lo, slot="window")
            self._get(lo, self._buf[: hi - lo])
            self._lo, self._hi, _local.owner = lo, hi, self
        raw[:] = self._buf[offset - self._lo: end - self._lo]

    def close(self) -> None:
        if getattr(_local, "owner", None) is self:
            _local.owner = None
        self._buf = None


def prefetch_runs(reader, kernels: np.ndarray) -> None:
    """Prefetch, shard by shard, the bytes of ``kernels`` (ascending) a task is about to read:
    consecutive kernels of one shard lie back to back in its object."""
    S = reader.bank.kernels_per_shard
    kernels = np.asarray(kernels, dtype=np.int64)
    for s in np.unique(kernels // S):
        ms = kernels[kernels // S == s]
        shard = reader._shard(int(s))
        lo = shard.offset(int(ms[0]))
        hi = shard.offset(int(ms[-1])) + shard.kernel_bytes
        if hi - lo <= 4 * len(ms) * shard.kernel_bytes:  # not a sparse selection spread over the object
            shard.prefetch(lo, hi)
