"""The byte layout of a bank's shard files: the one format the build writes and the engine reads.

The ``gram`` array of a bank (a factor bank's ``factor`` array: the same format with (n, r) kernels)
is zarr v3 with sharding: one file per shard, ``gram/c/<s>/0/0`` (``shard_path``), holding
``kernels_per_shard`` kernels. When its codecs are the plain ones
(``is_plain``: raw little-endian inner chunks, the index at the end with a crc32c; what
``group.create_bank_group`` creates), a shard file is

    inner chunk 0 | inner chunk 1 | ... | index: (offset, nbytes) uint64 LE per chunk | crc32c (uint32 LE)

with ``kernels_per_chunk`` whole kernels (C order) per inner chunk, the last one zero-padded, and
both index entries of a chunk past the end of the bank 2^64 - 1. ``index_nbytes`` is the size of
the tail, ``chunk_offsets`` reads and checks it. ``write_shard_file`` writes such a file (the
build, ``shards.build_shard``); ``KernelBank.read_shard`` and the engine's
``mklscale.engine.reader`` read it directly, bypassing zarr, for banks where
``KernelBank.plain_layout`` is True.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import google_crc32c
import numpy as np
import zarr

from mklscale.bank.direct_io import write_direct
from mklscale.errors import BankCorruptError, NotABankError

_EMPTY = np.iinfo(np.uint64).max


def shard_key(s: int, array: str = "gram") -> str:
    """The key of shard s relative to the bank (zarr's default chunk key encoding), on every
    backend; ``array`` is the bank's data array: "gram" (dense) or "factor" (``group.data_array_name``)."""
    return f"{array}/c/{s}/0/0"


def shard_path(bank_path: str | os.PathLike, s: int, array: str = "gram") -> Path:
    """The file holding shard s of the bank in the folder ``bank_path``."""
    return Path(bank_path) / shard_key(s, array)


def index_nbytes(per_chunk: int, per_shard: int) -> int:
    """Bytes at the end of every shard file: the (offset, nbytes) index and its crc32c."""
    return 16 * (per_shard // per_chunk) + 4


def write_shard_file(bank_path: Path, s: int, block: np.ndarray, per_chunk: int, per_shard: int,
                     array: str = "gram") -> None:
    """Write one shard of the ``array`` array ((k, n, n) kernels, or a factor bank's (k, n, r)
    factors) in zarr v3's sharding format, uncompressed.

    The file is the inner chunks back to back (the last one zero-padded to full size), then the
    index of (offset, nbytes) little-endian uint64 pairs for every inner chunk of the shard (empty
    chunks: both 2^64 - 1), then the crc32c of the index. This is the byte layout zarr itself
    writes with ShardingCodec(BytesCodec) and index codecs (BytesCodec, Crc32cCodec) at the end;
    writing it directly avoids zarr's per-chunk encode path, which runs several times slower than
    the disk. Written to a temporary file and renamed, so a shard is either old or new, never torn.

    The kernels go to disk with direct I/O where they can (``write_direct``): copying them through
    the page cache costs CPU time the build needs (the copy, and reclaiming pages once the bank
    outgrows memory, where it cannot stay cached anyway). The price: a bank that fits in memory is
    read from the disk on its first pass instead of from the cache.
    """
    kernel_bytes, pad, tail = _tail(block, per_chunk, per_shard)
    target = shard_path(bank_path, s, array)
    shard_folder(bank_path, target)
    tmp = target.with_name(f".0.{uuid.uuid4().hex[:8]}.partial")
    data = memoryview(block.astype(block.dtype.newbyteorder("<"), copy=False)).cast("B")
    try:
        with open(tmp, "wb") as f:
            done = write_direct(tmp, data)
            f.seek(done)
            f.write(data[done:])
            if pad:
                f.write(bytes(pad * kernel_bytes))
            f.write(tail)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def shard_folder(bank_path: Path, target: Path) -> None:
    """Make the folder of shard file ``target`` inside the bank at ``bank_path``, refusing to write
    where the bank is not (a worker that does not share the driver's file system, or runs in
    another folder) or outside it (a symbolic link inside the store that leads out)."""
    import platform

    if not Path(bank_path).is_dir():
        raise NotABankError(
            f"no kernel bank at {bank_path} on host {platform.node()} (working directory {os.getcwd()}): this process "
            "writes shards of a bank it cannot see; every Dask worker must see the bank at the same absolute path "
            "(a shared file system, see cluster/README.md), or build without a cluster")
    target.parent.mkdir(parents=True, exist_ok=True)
    root, folder = os.path.realpath(bank_path), os.path.realpath(target.parent)
    if os.path.commonpath([root, folder]) != root:
        raise BankCorruptError(
            f"{target.parent} leads to {folder}, outside the bank {bank_path} (a symbolic link inside the store); "
            "mklscale never writes through links that leave the store: replace the link by the folder it points to "
            "and run again")


def _tail(block: np.ndarray, per_chunk: int, per_shard: int) -> tuple[int, int, bytes]:
    """(bytes per kernel, zero kernels padding the last chunk, the index and its crc32c) of the
    shard holding the kernels ``block``."""
    k = block.shape[0]
    kernel_bytes = block.shape[1] * block.shape[2] * block.dtype.itemsize
    n_chunks = -(-k // per_chunk)
    chunk_bytes = per_chunk * kernel_bytes
    index = np.full((per_shard // per_chunk, 2), _EMPTY, dtype="<u8")
    index[:n_chunks, 0] = np.arange(n_chunks, dtype=np.uint64) * chunk_bytes
    index[:n_chunks, 1] = chunk_bytes
    index_bytes = index.tobytes()
    crc = np.array([google_crc32c.value(index_bytes)], dtype="<u4").tobytes()
    return kernel_bytes, n_chunks * per_chunk - k, index_bytes + crc


def shard_bytes(block: np.ndarray, per_chunk: int, per_shard: int) -> np.ndarray:
    """The bytes ``write_shard_file`` writes, as one uint8 array (one object PUT on an object store)."""
    kernel_bytes, pad, tail = _tail(block, per_chunk, per_shard)
    data = np.frombuffer(memoryview(block.astype(block.dtype.newbyteorder("<"), copy=False)).cast("B"), np.uint8)
    out = np.empty(data.size + pad * kernel_bytes + len(tail), dtype=np.uint8)
    out[:data.size] = data
    out[data.size:data.size + pad * kernel_bytes] = 0
    out[out.size - len(tail):] = np.frombuffer(tail, np.uint8)
    return out


def chunk_offsets(tail: bytes, file_size: int, *, n_kernels: int, per_chunk: int, per_shard: int,
                  kernel_bytes: int, where: str) -> np.ndarray:
    """Byte offsets (int64) of the inner chunks holding a shard's ``n_kernels`` kernels, from the
    file's last ``index_nbytes`` bytes ``tail``, after checking the index's crc32c and that every
    such chunk is present, full size and inside the file.

    Raises BankCorruptError, its message starting with ``where`` (the shard and its kernels), otherwise.
    """
    tail_nbytes = index_nbytes(per_chunk, per_shard)
    if file_size < tail_nbytes:
        raise BankCorruptError(f"{where} is truncated ({file_size} bytes); those kernels need repair")
    index_raw = bytes(tail[:-4])
    if google_crc32c.value(index_raw) != int.from_bytes(bytes(tail[-4:]), "little"):
        raise BankCorruptError(f"{where} has a damaged index (truncated or overwritten); those kernels need repair")
    n_chunks = -(-n_kernels // per_chunk)
    index = np.frombuffer(index_raw, dtype="<u8").reshape(-1, 2)[:n_chunks]
    chunk_bytes = per_chunk * kernel_bytes
    if (index[:, 1] != chunk_bytes).any() or (index[:, 0] + chunk_bytes > file_size - tail_nbytes).any():
        raise BankCorruptError(f"{where} is truncated or malformed (a chunk is missing or has the wrong size); "
                               "those kernels need repair")
    return index[:, 0].astype(np.int64)


def is_plain(gram: zarr.Array, dtype: np.dtype) -> bool:
    """True when ``gram`` (the bank's data array, stored as ``dtype``) is sharded with this module's layout: raw
    little-endian inner chunks, the index at the end with a crc32c, "/" in chunk keys. Other
    banks (compressed ones) must be read through zarr."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    codecs = gram.metadata.codecs
    return (
        len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)
        and len(codecs[0].codecs) == 1 and isinstance(codecs[0].codecs[0], BytesCodec)
        and dtype.byteorder in ("<", "=") and np.little_endian
        and codecs[0].index_location.value == "end"
        and [type(c) for c in codecs[0].index_codecs] == [BytesCodec, Crc32cCodec]
        and gram.metadata.chunk_key_encoding.separator == "/"
    )
