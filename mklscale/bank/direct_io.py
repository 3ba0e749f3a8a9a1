"""Direct I/O: writing a buffer to disk with O_DIRECT (DMA, no copy into the page cache).

Used by ``shard_format.write_shard_file`` for the kernels of a shard, which take far more bytes than
anything else the build writes; ``aligned_empty`` makes buffers the kernels can be computed into
and written from without a copy.
"""

from __future__ import annotations

import errno
import os
import threading
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


def thread_buffer(nbytes: int, slot: str = "piece") -> np.ndarray:
    """A uint8 buffer of at least ``nbytes`` owned by the calling thread and reused across calls;
    ``slot`` names independent buffers of one thread (the engine's read pieces, an object-store
    shard's prefetch window)."""
    buf = getattr(_thread_buffers, slot, None)
    if buf is None or buf.size < nbytes:
        buf = np.empty(nbytes, dtype=np.uint8)
        setattr(_thread_buffers, slot, buf)
    return buf
