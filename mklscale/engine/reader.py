"""Read kernels, or row panels of kernels, straight from a bank's shard files.

``KernelBank.read_shard`` returns a whole shard (typically 256 MB) in freshly allocated memory.
A pass only needs each piece of a kernel long enough to fold it into a few float64 numbers, so the
reader here copies pieces of about ``piece_bytes`` (a few MB: they stay in the core's L2/L3 cache
until the chunk kernel has used them) into a buffer that each thread reuses for its whole life.
Measured on the benchmark machine that is ~3x the bandwidth of ``np.fromfile`` of the same
files (fresh pages are zero-filled and faulted in on every call; a reused buffer is not).

Layout handled: the shard files of ``mklscale.bank.shard_format`` (the one the build writes), for
banks whose ``KernelBank.plain_layout`` is True: one file per shard at ``gram/c/<s>/0/0`` holding
raw little-endian inner chunks of ``kernels_per_chunk`` whole kernels (a factor bank's
``factor/c/<s>/0/0``: the same with (n, r) factors), followed by the shard index
(``(offset, nbytes)`` uint64 per chunk) and its crc32c, located and checked by the bank's
``shard_file``, ``shard_index_bytes`` and ``chunk_offsets``. Anything else (compressed banks) falls
back to ``bank.read_shard``.

Mapped reading. A local bank whose shard files fit in ``map_limit()`` bytes (half the machine's
memory by default; ``MKLSCALE_MAP_BYTES`` overrides it, 0 turns it off) is not copied at all: each
shard file is mapped read-only once per process (``mapped_file``; the mapping outlives the task and
is shared by every later pass), and ``pieces`` yields views of the page cache itself. A pass then
reads each stored number once, from memory, instead of copying it into a buffer and reading it
again (2x on the pass benchmark). Shard files are only ever replaced whole (temporary file +
rename), so a mapping always shows one consistent file; it is keyed by the file's inode and mtime,
so a rebuilt bank is mapped anew. A bank larger than that is streamed through the copying path:
mapping it would only make the kernel evict pages from under the mapping, and its pages would
count in the process's resident set. Mapped pages count there too (as file pages, shared and
reclaimable, not memory the process owns): a run that measures private memory sets
``MKLSCALE_MAP_BYTES=0``.

Direct reading. A local bank larger than the machine's memory can never stay in the page cache,
so buffered reads only make the kernel evict pages and copy each one (measured: a cold pass at 0.2x
the disk's direct-read speed). Its pieces (``DIRECT_PIECE_BYTES``) are read with O_DIRECT (DMA
straight into an aligned buffer the thread reuses, the page cache neither used nor filled). A
filesystem that refuses O_DIRECT (tmpfs) is read buffered.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np

from mklscale.bank.direct_io import pread_direct, thread_buffer
from mklscale.bank.remote import ObjectShard, prefetch_runs
from mklscale.bank.stats import checksum, checksum_extend
from mklscale.errors import BankCorruptError

#: Bytes copied per read call: big enough that a read costs far more than the call, small enough
#: to stay in a core's L2 (2 MB here) while the chunk kernel consumes it.
PIECE_BYTES = 2 * 2**20

#: Bytes per direct read: large requests are what the disk streams fastest (the benchmark's direct
#: read of the whole bank uses 8 MiB).
DIRECT_PIECE_BYTES = 8 * 2**20

_MAPS: OrderedDict[tuple, tuple[str, np.ndarray]] = OrderedDict()  # key -> (path, whole-file array)
_MAPS_LOCK = threading.Lock()
#: mapped file version -> the kernels in it whose bytes this process has checked (checked once per version)
_CHECKED: dict[tuple, set[int]] = {}


def physical_memory() -> int:
    """Bytes of physical memory (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _dask_worker_memory_limit() -> int:
    """The memory limit of the Dask worker running this code (0: not in a worker, or no limit)."""
    distributed = sys.modules.get("distributed")  # never imported just for this
    if distributed is None:
        return 0
    try:
        worker = distributed.get_worker()
    except ValueError:
        return 0
    return int(getattr(getattr(worker, "memory_manager", None), "memory_limit", 0) or 0)


def map_limit() -> int:
    """Largest bank (bytes of shard files) read through mappings, and the most bytes of shard
    files this process keeps mapped: ``MKLSCALE_MAP_BYTES``, or half the physical memory and, in a
    Dask worker with a memory limit, a quarter of that limit (its nanny pauses and restarts workers
    by resident set, in which mapped pages count)."""
    env = os.environ.get("MKLSCALE_MAP_BYTES")
    if env is not None:
        try:
            return max(0, int(float(env)))
        except ValueError:
            raise ValueError(f"MKLSCALE_MAP_BYTES must be a number of bytes (0 turns mapped reading off), "
                             f"got {env!r}") from None
    limit = physical_memory() // 2
    worker = _dask_worker_memory_limit()
    return min(limit, worker // 4) if worker else limit


def _replaced(path: str, key: tuple) -> bool:
    """Whether the file mapped under ``key`` is no longer the one at ``path`` (rebuilt or deleted)."""
    try:
        st = os.stat(path)
    except OSError:
        return True
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != key


def mapped_file(file) -> np.ndarray:
    """The whole of the open file ``file`` as a read-only uint8 array backed by a shared mapping,
    made once per process per (device, inode, size, mtime) and kept (least recently used first
    out beyond ``map_limit()`` bytes; an evicted mapping is unmapped when its last view goes).
    Making a new mapping also lets go of those whose file has since been replaced or deleted, so a
    rebuilt bank's old shard files do not keep their disk space for the life of the process."""
    st = os.fstat(file.fileno())
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _MAPS_LOCK:
        entry = _MAPS.get(key)
        if entry is not None:
            _MAPS.move_to_end(key)
            return entry[1]
    data = np.frombuffer(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    with _MAPS_LOCK:
        for old in [k for k, (path, _) in _MAPS.items() if _replaced(path, k)]:
            del _MAPS[old]
            _CHECKED.pop(old, None)
        entry = _MAPS.setdefault(key, (file.name, data))
        _MAPS.move_to_end(key)
        limit, total = map_limit(), sum(d.size for _, d in _MAPS.values())
        while total > limit and len(_MAPS) > 1:
            total -= _MAPS.popitem(last=False)[1][1].size
    return entry[1]


class _Shard:
    """One open shard file and its validated chunk index."""

    def __init__(self, bank, s: int):
        self.s = s
        self.path = bank.shard_file(s)
        first, stop = bank.shard_range(s)
        self.first = first
        self.per_chunk = int(bank.attrs["layout"]["kernels_per_chunk"])
        self.kernel_bytes = bank.n * bank.block_shape[1] * bank.dtype.itemsize
        self._direct_fd: int | None = None
        try:
            self.file = open(self.path, "rb", buffering=0)
        except FileNotFoundError:
            raise BankCorruptError(f"shard {s} of {bank.path} (kernels {first}..{stop - 1}): the shard file is missing "
                                   "although its kernels are marked complete; rebuild the bank (or run "
                                   "`mklscale bank verify`)") from None
        try:
            size = os.fstat(self.file.fileno()).st_size
            tail = bytearray(min(size, bank.shard_index_bytes))
            self._read_exact(size - len(tail), memoryview(tail))
            self.offsets = bank.chunk_offsets(s, size, bytes(tail))
        except BaseException:
            self.file.close()
            raise

    def offset(self, m: int) -> int:
        """Byte offset of global kernel m in this file."""
        local = m - self.first
        return int(self.offsets[local // self.per_chunk]) + (local % self.per_chunk) * self.kernel_bytes

    def same_chunk(self, m: int, m2: int) -> bool:
        return (m - self.first) // self.per_chunk == (m2 - self.first) // self.per_chunk

    def _read_exact(self, offset: int, view: memoryview) -> None:
        self.file.seek(offset)
        done = 0
        while done < len(view):
            got = self.file.readinto(view[done:])
            if not got:
                raise BankCorruptError(f"{self.path} ended early (wanted {len(view)} bytes at offset {offset}); "
                                       "the shard needs repair")
            done += got

    def read(self, offset: int, out: np.ndarray) -> None:
        self._read_exact(offset, memoryview(out).cast("B"))

    def read_direct(self, offset: int, nbytes: int) -> np.ndarray | None:
        """Bytes offset..offset+nbytes of the file read with O_DIRECT into the thread's aligned
        buffer (valid until its next direct read), or None where the filesystem refuses O_DIRECT."""
        if self._direct_fd is None:
            try:
                self._direct_fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            except OSError:
                self._direct_fd = -1
        if self._direct_fd < 0 or not hasattr(os, "O_DIRECT"):
            return None
        try:
            data = pread_direct(self._direct_fd, offset, nbytes)
        except OSError:  # EINVAL: this filesystem takes O_DIRECT at open but not for reads
            os.close(self._direct_fd)
            self._direct_fd = -1
            return None
        if data is None:
            raise BankCorruptError(f"{self.path} ended early (wanted {nbytes} bytes at offset {offset}); "
                                   "the shard needs repair")
        return data

    def checked(self) -> set[int]:
        """The kernels of this file's current version whose mapped bytes were checked already."""
        st = os.fstat(self.file.fileno())
        with _MAPS_LOCK:
            return _CHECKED.setdefault((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), set())

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """Bytes offset..offset+nbytes of the file, read-only, straight from its mapping."""
        data = mapped_file(self.file)
        if offset + nbytes > data.size:
            raise BankCorruptError(f"{self.path} ended early (wanted {nbytes} bytes at offset {offset}); "
                                   "the shard needs repair")
        return data[offset:offset + nbytes]

    def close(self) -> None:
        self.file.close()
        if self._direct_fd is not None and self._direct_fd >= 0:
            os.close(self._direct_fd)
        self._direct_fd = None


class KernelReader:
    """Reads kernels of one bank for the duration of a task; shard files stay open until ``close``.

    A kernel is read as stored, ``bank.block_shape``: (n, n), or (n, r) for a factor bank; ``w``
    below is its row length (n or r).

    ``pieces(kernels)`` yields ``(pos, count, r0, r1, block)``: ``block`` is a C-contiguous
    (count, r1 - r0, w) array of the stored dtype holding rows r0..r1-1 of kernels
    ``kernels[pos:pos + count]`` (count > 1 only for whole kernels). The block lives in the
    thread's reused buffer: it is valid until the next piece is requested.

    ``source`` says where the bytes come from (module doc): "mapped" (a read-only view of the shard
    file's mapping; a piece is a whole run of consecutive kernels of one inner chunk), "direct"
    (O_DIRECT reads of about DIRECT_PIECE_BYTES) or "copied" (reads of about ``piece_bytes`` into a
    small buffer, so the piece is in L2 when the chunk kernel gets it). None chooses by the bank's
    size: mapped within ``map_limit()``, direct beyond the machine's memory, copied between (and
    always for banks on object stores).
    """

    def __init__(self, bank, piece_bytes: int | None = None, source: str | None = None):
        self.bank = bank
        self.n = bank.n
        self.width = int(bank.block_shape[1])
        self.dtype = bank.dtype
        self.piece_bytes = int(PIECE_BYTES if piece_bytes is None else piece_bytes)
        self.plain = bool(bank.plain_layout)
        if source is None:
            size = bank.nbytes
            source = "mapped" if size <= map_limit() else "direct" if size > physical_memory() > 0 else "copied"
        if source not in ("mapped", "direct", "copied"):
            raise ValueError(f"source must be 'mapped', 'direct', 'copied' or None, got {source!r}")
        self.source = source if self.plain and not bank.remote else "copied"
        self._shards: dict[int, _Shard] = {}
        self._whole: dict[int, np.ndarray] = {}  # fallback: whole shards read through zarr

    def __enter__(self) -> KernelReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for shard in self._shards.values():
            shard.close()
        self._shards.clear()
        self._whole.clear()

    def _shard(self, s: int) -> _Shard:
        if s not in self._shards:
            # issue 20: a bank on an object store reads shard objects with ranged GETs
            self._shards[s] = ObjectShard(self.bank, s) if self.bank.remote else _Shard(self.bank, s)
        return self._shards[s]

    def _fallback(self, m: int) -> np.ndarray:
        s = m // self.bank.kernels_per_shard
        if s not in self._whole:
            if len(self._whole) >= 2:  # a gram task alternates between two blocks of kernels
                self._whole.pop(next(iter(self._whole)))
            self._whole[s] = self.bank.read_shard(s)
        return self._whole[s][m - s * self.bank.kernels_per_shard]

    def pieces(self, kernels: Sequence[int]) -> Iterator[tuple[int, int, int, int, np.ndarray]]:
        """Iterate over ``kernels`` (ascending global indices) in pieces of about piece_bytes."""
        n, w, itemsize = self.n, self.width, self.dtype.itemsize
        kernels = np.asarray(kernels, dtype=np.int64)
        kb = n * w * itemsize
        if not self.plain:
            for pos, m in enumerate(kernels):
                block = np.ascontiguousarray(self._fallback(int(m)))
                self._compare(int(m), checksum(block))
                yield pos, 1, 0, n, block[None]
            return
        S = self.bank.kernels_per_shard
        if self.bank.remote:
            prefetch_runs(self, kernels)  # concurrent ranged GETs of the task's bytes, pieces served from them
        limit = {"mapped": None, "direct": DIRECT_PIECE_BYTES, "copied": self.piece_bytes}[self.source]
        if limit is None or kb <= limit:
            per = len(kernels) if limit is None else limit // kb
            pos = 0
            while pos < len(kernels):
                m0 = int(kernels[pos])
                shard = self._shard(m0 // S)
                count = 1
                # extend over consecutive kernels of the same inner chunk (contiguous on disk)
                while (count < per and pos + count < len(kernels) and int(kernels[pos + count]) == m0 + count
                       and shard.same_chunk(m0, m0 + count)):
                    count += 1
                block = self._fetch(shard, shard.offset(m0), count * kb).reshape(count, n, w)
                self._check_whole(shard, m0, block)
                yield pos, count, 0, n, block
                pos += count
        else:
            rows = max(1, limit // (w * itemsize))
            for pos, m in enumerate(kernels):
                m = int(m)
                shard = self._shard(m // S)
                base = shard.offset(m)
                crc = 0
                for r0 in range(0, n, rows):
                    r1 = min(n, r0 + rows)
                    block = self._fetch(shard, base + r0 * w * itemsize, (r1 - r0) * w * itemsize)
                    crc = checksum_extend(crc, block)
                    if r1 == n:
                        self._compare(m, crc)
                    yield pos, 1, r0, r1, block.reshape(1, r1 - r0, w)

    def _check_whole(self, shard, m0: int, block: np.ndarray) -> None:
        """Check the crc32c of the whole kernels m0.. in ``block`` (mapped: those not checked yet)."""
        seen = shard.checked() if self.source == "mapped" else None
        for m in range(m0, m0 + block.shape[0]):
            if seen is None or m not in seen:
                self._compare(m, checksum(block[m - m0]))
                if seen is not None:
                    seen.add(m)

    def _compare(self, m: int, crc: int) -> None:
        if crc != self.bank.expected_checksum(m) and crc != self.bank.expected_checksum(m, fresh=True):
            name = self.bank.specs[m].name
            raise BankCorruptError(
                f"kernel {m} ({name}) of bank {self.bank.path}: its stored bytes do not match their recorded crc32c "
                "(damaged on disk or in transit), so no result was computed from them; run `mklscale bank verify "
                f"{self.bank.path}` to find every damaged kernel and `mklscale bank repair {self.bank.path}` to "
                "recompute them")

    def _fetch(self, shard, offset: int, nbytes: int) -> np.ndarray:
        """Bytes offset..offset+nbytes of a shard file as a flat array of the stored dtype, from
        this reader's source (a direct read the filesystem refuses is done by copying)."""
        if self.source == "mapped":
            return shard.view(offset, nbytes).view(self.dtype)
        if self.source == "direct":
            data = shard.read_direct(offset, nbytes)
            if data is not None:
                return data.view(self.dtype)
        block = thread_buffer(nbytes)[:nbytes].view(self.dtype)
        shard.read(offset, block)
        return block

    def read_rows(self, m: int, r0: int, r1: int, out: np.ndarray) -> None:
        """Rows r0..r1-1 of kernel m into ``out`` (a C-contiguous (r1 - r0, w) array of the stored dtype)."""
        if not self.plain:
            out[...] = self._fallback(m)[r0:r1]
            return
        shard = self._shard(m // self.bank.kernels_per_shard)
        offset = shard.offset(m) + r0 * self.width * self.dtype.itemsize
        if self.source == "copied":
            shard.read(offset, out)
        else:
            out[...] = self._fetch(shard, offset, out.nbytes).reshape(out.shape)
