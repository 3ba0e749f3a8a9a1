"""Read kernels, or row panels of kernels, straight from a bank's shards, through its storage.

``KernelBank.read_shard`` returns a whole shard (typically 256 MB) in freshly allocated memory.
A pass only needs each piece of a kernel long enough to fold it into a few float64 numbers, so the
reader here copies pieces of about ``piece_bytes`` (a few MB: they stay in the core's L2/L3 cache
until the chunk kernel has used them) into a buffer that each thread reuses for its whole life.
Measured on the benchmark machine that is ~3x the bandwidth of ``np.fromfile`` of the same
files (fresh pages are zero-filled and faulted in on every call; a reused buffer is not).

Layout handled: the shard files of ``mklscale.bank.shard_format`` (the one the build writes), for
banks whose ``KernelBank.plain_layout`` is True: one object per shard at ``gram/c/<s>/0/0`` holding
raw little-endian inner chunks of ``kernels_per_chunk`` whole kernels (a factor bank's
``factor/c/<s>/0/0``: the same with (n, r) factors), followed by the shard index
(``(offset, nbytes)`` uint64 per chunk) and its crc32c, located and checked by the bank's
``shard_key``, ``shard_index_bytes`` and ``chunk_offsets``. Anything else (compressed banks) falls
back to ``bank.read_shard``. The bytes come from the bank's storage (``bank.storage.open_range``,
``mklscale.bank.storage``): one shard reader here over every backend. A storage that is not
``mappable`` (an object store) is read by copying, after a hint of the task's byte range of each
shard (``RangeReader.prefetch``: an object store fetches it with concurrent ranged GETs).

Mapped reading. A local bank whose shard files fit in ``map_limit()`` bytes (half the machine's
memory by default; ``MKLSCALE_MAP_BYTES`` overrides it, 0 turns it off) is not copied at all: each
shard file is mapped read-only once per process (``storage.local.mapped_file``; the mapping outlives the task and
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

from collections.abc import Iterator, Sequence

import numpy as np

from mklscale.bank.direct_io import thread_buffer
from mklscale.bank.stats import checksum, checksum_extend
from mklscale.bank.storage.local import map_limit, physical_memory
from mklscale.errors import BankCorruptError

#: Bytes copied per read call: big enough that a read costs far more than the call, small enough
#: to stay in a core's L2 (2 MB here) while the chunk kernel consumes it.
PIECE_BYTES = 2 * 2**20

#: Bytes per direct read: large requests are what the disk streams fastest (the benchmark's direct
#: read of the whole bank uses 8 MiB).
DIRECT_PIECE_BYTES = 8 * 2**20


class _Shard:
    """One shard of the bank opened from its storage (``Storage.open_range``), with its validated
    chunk index: where each kernel lies in it. Reads go to the storage's ``RangeReader``."""

    def __init__(self, bank, s: int):
        self.s = s
        first, stop = bank.shard_range(s)
        self.first = first
        self.per_chunk = int(bank.attrs["layout"]["kernels_per_chunk"])
        self.kernel_bytes = bank.n * bank.block_shape[1] * bank.dtype.itemsize
        key = bank.shard_key(s)
        source = bank.storage.open_range(key)
        if source is None:
            raise BankCorruptError(f"shard {s} of {bank.path} (kernels {first}..{stop - 1}): the shard "
                                   f"{bank.storage.describe(key)} is missing although its kernels are marked complete; "
                                   "run `mklscale bank verify` and `mklscale bank repair`")
        self.source = source
        try:
            tail = np.empty(min(source.size, bank.shard_index_bytes), dtype=np.uint8)
            source.read_into(source.size - tail.size, tail)
            self.offsets = bank.chunk_offsets(s, source.size, tail.tobytes())
        except BaseException:
            source.close()
            raise

    def offset(self, m: int) -> int:
        """Byte offset of global kernel m in this shard."""
        local = m - self.first
        return int(self.offsets[local // self.per_chunk]) + (local % self.per_chunk) * self.kernel_bytes

    def same_chunk(self, m: int, m2: int) -> bool:
        return (m - self.first) // self.per_chunk == (m2 - self.first) // self.per_chunk

    def close(self) -> None:
        self.source.close()


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
        self.source = source if self.plain and bank.storage.mappable else "copied"
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
            self._shards[s] = _Shard(self.bank, s)
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
        if self.source == "copied":
            self._prefetch(kernels)
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

    def _prefetch(self, kernels: np.ndarray) -> None:
        """Tell each shard's storage the bytes of ``kernels`` (ascending) a task is about to read:
        consecutive kernels of one shard lie back to back in it (an object store fetches them with
        concurrent ranged GETs and serves the pieces from there; a file ignores the hint)."""
        S = self.bank.kernels_per_shard
        for s in np.unique(kernels // S):
            ms = kernels[kernels // S == s]
            shard = self._shard(int(s))
            lo = shard.offset(int(ms[0]))
            hi = shard.offset(int(ms[-1])) + shard.kernel_bytes
            if hi - lo <= 4 * len(ms) * shard.kernel_bytes:  # not a sparse selection spread over the object
                shard.source.prefetch(lo, hi)

    def _check_whole(self, shard, m0: int, block: np.ndarray) -> None:
        """Check the crc32c of the whole kernels m0.. in ``block`` (mapped: those not checked yet)."""
        seen = shard.source.checked() if self.source == "mapped" else None
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
            return shard.source.view(offset, nbytes).view(self.dtype)
        if self.source == "direct":
            data = shard.source.read_direct(offset, nbytes)
            if data is not None:
                return data.view(self.dtype)
        block = thread_buffer(nbytes)[:nbytes].view(self.dtype)
        shard.source.read_into(offset, block)
        return block

    def read_rows(self, m: int, r0: int, r1: int, out: np.ndarray) -> None:
        """Rows r0..r1-1 of kernel m into ``out`` (a C-contiguous (r1 - r0, w) array of the stored dtype)."""
        if not self.plain:
            out[...] = self._fallback(m)[r0:r1]
            return
        shard = self._shard(m // self.bank.kernels_per_shard)
        offset = shard.offset(m) + r0 * self.width * self.dtype.itemsize
        if self.source == "copied":
            shard.source.read_into(offset, out)
        else:
            out[...] = self._fetch(shard, offset, out.nbytes).reshape(out.shape)
