"""Direct I/O: writing a buffer to disk with O_DIRECT (DMA, no copy into the page cache).

Used by ``shard_format.write_shard_file`` for the kernels of a shard, which take far more bytes than
anything else the build writes; ``aligned_empty`` makes buffers the kernels can be computed into
and written from without a copy. ``read_files_direct`` is the reading counterpart: the disk's own
read speed, the reference the out-of-core benchmark (``benchmarks/bench_scaling.py --physical``)
compares a pass with.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


DIRECT_ALIGN = 4096  # O_DIRECT wants the buffer address, the file offset and the length aligned to this


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty whose data starts on a DIRECT_ALIGN boundary (so ``write_direct`` can use it)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + DIRECT_ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % DIRECT_ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def write_direct(path: Path, data: memoryview) -> int:
    """Write the longest aligned prefix of ``data`` at the start of the existing file ``path``
    with O_DIRECT (DMA from ``data``, no copy into the page cache); return the bytes written.

    0 when the buffer is not aligned, the platform has no O_DIRECT or the filesystem refuses it
    (EINVAL): the caller writes the rest through the page cache as usual. A short write (the disk
    filling up) also returns what was written; the caller's buffered write then raises ENOSPC.
    """
    flag = getattr(os, "O_DIRECT", 0)
    head = data.nbytes - data.nbytes % DIRECT_ALIGN
    if not flag or head == 0 or np.frombuffer(data, np.uint8).ctypes.data % DIRECT_ALIGN:
        return 0
    try:
        fd = os.open(path, os.O_WRONLY | flag)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return 0
        raise
    done = 0
    try:
        while done < head:
            try:
                step = os.write(fd, data[done:head])
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                return done  # the filesystem refuses direct I/O after all: the rest goes buffered
            done += max(step, 0)
            if step <= 0 or step % DIRECT_ALIGN:
                return done
    finally:
        os.close(fd)
    return done


_thread_buffers = threading.local()


def thread_buffer(nbytes: int, slot: str = "piece", aligned: bool = False) -> np.ndarray:
    """A uint8 buffer of at least ``nbytes`` owned by the calling thread and reused across calls;
    ``slot`` names independent buffers of one thread (the engine's read pieces, its direct reads,
    an object-store shard's prefetch window). ``aligned``: starting on a DIRECT_ALIGN boundary."""
    buf = getattr(_thread_buffers, slot, None)
    if buf is None or buf.size < nbytes:
        buf = aligned_empty((nbytes,), np.uint8) if aligned else np.empty(nbytes, dtype=np.uint8)
        setattr(_thread_buffers, slot, buf)
    return buf


def pread_direct(fd: int, offset: int, nbytes: int) -> np.ndarray | None:
    """Bytes offset..offset+nbytes of the file open with O_DIRECT as ``fd``, as a uint8 array in the
    calling thread's aligned "direct" buffer (valid until that thread's next direct read): the whole
    pages around the range are read (the last may pass the end of the file: O_DIRECT allows it),
    with as many ``preadv`` calls as it takes. None when the file ends before offset + nbytes;
    OSError (EINVAL) where the filesystem refuses the read."""
    start = offset - offset % DIRECT_ALIGN
    want = offset + nbytes - start
    ask = -(-want // DIRECT_ALIGN) * DIRECT_ALIGN
    window = memoryview(thread_buffer(ask, slot="direct", aligned=True))[:ask]  # the buffer may be larger
    got = 0
    while got < want:
        step = os.preadv(fd, [window[got:]], start + got)
        if step <= 0:
            return None
        got += step
    return np.frombuffer(window, np.uint8, nbytes, offset - start)


def read_files_direct(paths: Sequence[Path], threads: int = 1, block: int = 8 * 2**20,
                      consume: Callable[[int, int, memoryview], None] | None = None) -> int:
    """Read every byte of ``paths`` with O_DIRECT (DMA from the disk, the page cache neither used
    nor filled); return the number of bytes read.

    The files are cut into blocks of ``block`` bytes (a multiple of DIRECT_ALIGN) that ``threads``
    threads read with ``pread_direct`` into one aligned buffer per thread, reused for every block.
    ``consume(file_index, offset, data)``, when given, sees each block's bytes before the buffer is
    reused. OSError (EINVAL) where the platform or the filesystem has no direct I/O (tmpfs): there
    is no silent fallback to buffered reads.
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        raise OSError(errno.EINVAL, "this platform has no O_DIRECT")
    if block <= 0 or block % DIRECT_ALIGN:
        raise ValueError(f"block must be a positive multiple of {DIRECT_ALIGN} bytes, got {block}")
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | flag))
        sizes = [os.fstat(fd).st_size for fd in fds]
        pieces = [(i, off) for i, size in enumerate(sizes) for off in range(0, size, block)]

        def read(piece: tuple[int, int]) -> int:
            i, off = piece
            want = min(block, sizes[i] - off)
            data = pread_direct(fds[i], off, want)
            if data is None:
                raise OSError(errno.EIO, f"{paths[i]}: the file ended before {off + want} bytes while reading it")
            if consume is not None:
                consume(i, off, memoryview(data))
            return want

        with ThreadPoolExecutor(max(1, int(threads))) as pool:
            return sum(pool.map(read, pieces))
    finally:
        for fd in fds:
            os.close(fd)
