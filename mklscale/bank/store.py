"""KernelBank: the zarr v3 store of M Gram matrices and their per-kernel metadata.

Layout of a bank (a zarr v3 group; see ../shared/DESIGN.md "The bank on disk")::

    gram         (M, n, n) float32|float64, chunks of whole kernels, sharded, uncompressed
    X            (n, d) float64  standardised training features (banks built from features)
    cross_gram   (M, n_cross, n) optional cross kernels imported with ``from_arrays``
    complete     (M,) bool      data of kernel m is on disk (set only after the write)
    trace, fro, lambda_max, norm_factor  (M,) float64  of the STORED (normalised) matrix
    checksum     (M,) uint32    crc32c of kernel m's stored bytes (C order, little endian)
    spec         (M,) str       the kernel's KernelSpec as JSON
    attrs        schema, n, M, dtype, normalize, standardisation, train_rows, fingerprint, layout, created,
                 arithmetic (``_compute.ARITHMETIC`` of build_bank's kernels), integrity (what the last
                 ``verify`` found bad; see below)

Integrity. ``verify`` re-reads kernels and compares their crc32c with ``checksum``. A kernel it finds
bad (flipped bytes, a missing or truncated shard file) is recorded on disk, when the store is
writable: its ``complete`` flag is cleared and ``attrs["integrity"]["bad"][str(m)]`` keeps the
reason. Everything that refuses unfinished kernels (the Engine, ``require_complete``) therefore
refuses corrupt ones without re-reading the bank on every open, and ``allow_incomplete=True`` runs
on the rest. A recorded reason counts only while the kernel's ``complete`` flag is clear, so a
rebuild or ``repair`` (which set it again) retires it. ``repair`` recomputes bad kernels from their
specs (banks built from features only).

Nothing in a store is executed or unpickled: specs are JSON, everything else is numbers.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import google_crc32c
import numpy as np
import zarr

from mklscale.bank.spec import KernelSpec
from mklscale.errors import (
    BankCorruptError,
    BankIncompleteError,
    BankMismatchError,
    DiskFullError,
    InvalidInputError,
    NotABankError,
    ReadOnlyStoreError,
    SchemaVersionError,
    SpecError,
)

SCHEMA_VERSION = 1
DTYPES = ("float32", "float64")
NORMALIZATIONS = ("trace", "diag", None)
PER_KERNEL_FLOATS = ("trace", "fro", "lambda_max", "norm_factor")


@dataclass
class VerifyReport:
    """What ``KernelBank.verify`` found: kernels whose bytes do not match their checksum."""

    checked: int
    bad: list[tuple[int, str, str]] = field(default_factory=list)  # (index, name, reason)
    incomplete: list[int] = field(default_factory=list)
    #: True: newly found bad kernels were marked unfinished on disk; False: the store is read-only
    #: and they could not be; None: nothing new to mark.
    marked: bool | None = None

    @property
    def ok(self) -> bool:
        return not self.bad and not self.incomplete

    @property
    def bad_indices(self) -> list[int]:
        return [b[0] for b in self.bad]

    def __str__(self) -> str:
        lines = [f"checked {self.checked} kernel(s): " + ("OK" if self.ok else "PROBLEMS")]
        lines += [f"  kernel {m} ({name}): {why}" for m, name, why in self.bad]
        if self.incomplete:
            shown = ", ".join(map(str, self.incomplete[:20]))
            more = "" if len(self.incomplete) <= 20 else f" ... (+{len(self.incomplete) - 20})"
            lines.append(f"  {len(self.incomplete)} kernel(s) not built yet: {shown}{more}")
        if self.bad:
            lines.append("  bad kernels are marked unfinished in the bank (solvers skip or refuse them); "
                         "run `mklscale bank repair PATH` to recompute them" if self.marked is not False else
                         "  the store is read-only, so bad kernels could not be marked; copy the bank to a "
                         "writable folder and run `mklscale bank repair PATH` there")
        return "\n".join(lines)


def kernel_stats(K: np.ndarray) -> tuple[float, float, float, int]:
    """(trace, Frobenius norm, largest eigenvalue, crc32c) of one stored kernel, in float64.

    trace = sum_i K_ii and ||K||_F = sqrt(sum_ij K_ij^2) of the stored values; the largest
    eigenvalue is an upper bound within a factor 1 + LAMBDA_TOL (1e-8) of the true one (Lanczos
    from a start vector fixed by K, capped by Gershgorin's bound: deterministic; see
    ``_compute.lambda_max``). Solvers use it for step sizes and the safe screening bound
    ||v||_K <= ||u||_K + sqrt(lambda_max) ||v - u||, which an overestimate keeps safe (the
    ARPACK value used before could fall short by up to 1e-8 relative). Every step releases the GIL.
    """
    from mklscale.bank import _compute

    native = K.dtype.newbyteorder("=") if K.dtype.kind == "f" and K.dtype.itemsize in (4, 8) else np.dtype(np.float64)
    A = np.ascontiguousarray(K, dtype=native)  # no copy for the stored float32/float64 kernels
    tr, fro, colabs = _compute.trace_fro_colabs(A)
    lam = _compute.lambda_max(A, _compute.LAMBDA_TOL, colabs)
    return float(tr), float(fro), float(lam), checksum(K)


_EMPTY = np.iinfo(np.uint64).max


def write_shard_file(bank_path: Path, s: int, block: np.ndarray, per_chunk: int, per_shard: int) -> None:
    """Write one shard of the ``gram`` array in zarr v3's sharding format, uncompressed.

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
    k, n = block.shape[0], block.shape[1]
    n_chunks = -(-k // per_chunk)
    chunk_bytes = per_chunk * n * n * block.dtype.itemsize
    index = np.full((per_shard // per_chunk, 2), _EMPTY, dtype="<u8")
    index[:n_chunks, 0] = np.arange(n_chunks, dtype=np.uint64) * chunk_bytes
    index[:n_chunks, 1] = chunk_bytes
    index_bytes = index.tobytes()
    crc = np.array([google_crc32c.value(index_bytes)], dtype="<u4").tobytes()
    pad = n_chunks * per_chunk - k
    target = Path(bank_path) / "gram" / "c" / str(s) / "0" / "0"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".0.{uuid.uuid4().hex[:8]}.partial")
    data = memoryview(block.astype(block.dtype.newbyteorder("<"), copy=False)).cast("B")
    try:
        with open(tmp, "wb") as f:
            done = write_direct(tmp, data)
            f.seek(done)
            f.write(data[done:])
            if pad:
                f.write(bytes(pad * n * n * block.dtype.itemsize))
            f.write(index_bytes)
            f.write(crc)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


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


def checksum(block: np.ndarray) -> int:
    """crc32c of one kernel's stored bytes (C order, little endian), read in place."""
    little = np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<"))  # no copy when already so
    return _crc32c_of(little)


def _crc32c_in_place():
    """crc32c over a buffer without copying it to bytes, releasing the GIL: google_crc32c's C
    library called through ctypes (its Python API takes only bytes, a copy of every kernel).
    Falls back to that API where the C library is not there (the pure-Python build)."""
    import ctypes

    try:
        from google_crc32c import _crc32c

        fn = ctypes.CDLL(_crc32c.__file__).crc32c_value  # exported by the libcrc32c it links
    except (ImportError, OSError, AttributeError):
        return lambda a: int(google_crc32c.value(a.tobytes()))
    fn.restype = ctypes.c_uint32
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return lambda a: int(fn(a.ctypes.data, a.nbytes))


_crc32c_of = _crc32c_in_place()


def layout_for(M: int, n: int, itemsize: int, chunk_mb: float = 16, shard_mb: float = 64) -> tuple[int, int]:
    """(kernels per chunk, kernels per shard): whole kernels per chunk, about chunk_mb a chunk,
    and a whole number of chunks per shard of about shard_mb (so 10k kernels are ~100s of files)."""
    kernel_bytes = n * n * itemsize
    per_chunk = int(max(1, min(M, chunk_mb * 2**20 // kernel_bytes)))
    chunks_per_shard = int(max(1, shard_mb * 2**20 // (per_chunk * kernel_bytes)))
    per_shard = min(per_chunk * chunks_per_shard, -(-M // per_chunk) * per_chunk)
    return per_chunk, per_shard


class KernelBank:
    """An opened bank. ``len(bank)`` is M, ``bank.n`` the number of training points."""

    def __init__(self, path: str | os.PathLike, group: zarr.Group):
        self.path = Path(path)
        self._group = group
        attrs = group.attrs.asdict()
        self._attrs = attrs
        self.n: int = int(attrs["n"])
        self.M: int = int(attrs["M"])
        self.dtype = np.dtype(attrs["dtype"])
        self.normalize: str | None = attrs["normalize"]
        self.kernels_per_shard: int = int(attrs["layout"]["kernels_per_shard"])
        self.specs: list[KernelSpec] = [KernelSpec.from_json(s) for s in group["spec"][:]]
        self.gram: zarr.Array = group["gram"]
        self._mode = "r"

    # ---- creating -----------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        grams,
        path: str | os.PathLike,
        names: Sequence[str] | None = None,
        cross_grams=None,
        normalize: str | None = None,
        dtype: str = "float32",
        overwrite: bool = False,
        psd_tol: float = 1e-6,
        chunk_mb: float = 16,
        shard_mb: float = 64,
    ) -> KernelBank:
        """Import precomputed Gram matrices (graph or string kernels computed elsewhere).

        ``grams`` is (M, n, n) or a sequence of (n, n); ``cross_grams`` optionally (M, n_new, n)
        for prediction. Each matrix must be square, finite, symmetric and PSD: its smallest
        eigenvalue must be >= -psd_tol * max(1, largest). ``normalize`` is None or "trace" (unit
        trace; the same factor scales the cross kernels). The bank appears atomically: either the
        whole import is on disk or nothing is.
        """
        dt = validate_dtype(dtype)
        if normalize not in (None, "trace"):
            raise InvalidInputError(f"from_arrays supports normalize=None or 'trace', got {normalize!r} "
                                    "(unit-diagonal scaling of cross kernels needs k(x, x) of the new points)")
        mats = [np.asarray(g, dtype=np.float64) for g in grams]
        if not mats:
            raise InvalidInputError("grams is empty; give at least one Gram matrix")
        names = [f"kernel_{m}" for m in range(len(mats))] if names is None else [str(x) for x in names]
        if len(names) != len(mats) or len(set(names)) != len(names):
            raise InvalidInputError(f"names must be {len(mats)} distinct strings, got {len(names)} ({len(set(names))} distinct)")
        n = mats[0].shape[0] if mats[0].ndim == 2 else -1
        for name, K in zip(names, mats):
            _check_gram(name, K, n, psd_tol)
        factors = [1.0 / np.trace(K) if normalize == "trace" and np.trace(K) > 0 else 1.0 for K in mats]
        crosses = None
        if cross_grams is not None:
            crosses = np.asarray(cross_grams, dtype=np.float64)
            if crosses.ndim != 3 or crosses.shape[0] != len(mats) or crosses.shape[2] != n:
                raise InvalidInputError(f"cross_grams must have shape ({len(mats)}, n_new, {n}), got {crosses.shape}")
            if not np.isfinite(crosses).all():
                raise InvalidInputError("cross_grams contains NaN or inf")
        path = Path(path)
        prepare_path(path, overwrite=overwrite, fingerprint=None)
        specs = [KernelSpec.precomputed(x) for x in names]

        def fill(group: zarr.Group) -> None:
            stats = np.empty((len(mats), 4))
            sums = np.empty(len(mats), dtype=np.uint32)
            for m, K in enumerate(mats):
                stored = (K * factors[m]).astype(dt)
                group["gram"][m] = stored
                *stats[m, :3], sums[m] = kernel_stats(stored)
            for k, name in enumerate(("trace", "fro", "lambda_max")):
                group[name][:] = stats[:, k]
            group["norm_factor"][:] = np.asarray(factors)
            group["checksum"][:] = sums
            if crosses is not None:
                scaled = (crosses * np.asarray(factors)[:, None, None]).astype(dt)
                group.create_array("cross_gram", data=scaled, chunks=(1,) + scaled.shape[1:], compressors=None)
            group["complete"][:] = True

        attrs = {"normalize": normalize, "standardization": None, "train_rows": list(range(n)),
                 "fingerprint": None, "source": "from_arrays", "created": creation_info()}
        create_bank_group(path, specs=specs, n=n, dtype=dt, attrs=attrs, X=None,
                          chunk_mb=chunk_mb, shard_mb=shard_mb, fill=fill)
        return cls.open(path)

    # ---- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r") -> KernelBank:
        """Open an existing bank (mode "r" or "r+"); errors say what is wrong with the path."""
        path = Path(path)
        if not path.exists():
            raise NotABankError(f"no kernel bank at {path}: the path does not exist (build one with build_bank or `mklscale bank build`)")
        group = _open_group_or_none(path, mode)
        if group is None:
            raise NotABankError(f"{path} exists but is not an mklscale kernel bank (no bank metadata found); give the "
                               "folder written by build_bank / `mklscale bank build`")
        if mode != "r":
            require_writable(path)
        bank = cls(path, group)
        bank._mode = mode
        return bank

    @staticmethod
    def is_bank(path: str | os.PathLike) -> bool:
        return Path(path).is_dir() and _open_group_or_none(Path(path), "r") is not None

    # ---- sizes and metadata -------------------------------------------------------------------
    def __len__(self) -> int:
        return self.M

    def __repr__(self) -> str:
        return f"KernelBank({str(self.path)!r}, M={self.M}, n={self.n}, dtype={self.dtype}, normalize={self.normalize})"

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def attrs(self) -> dict:
        return dict(self._attrs)

    @property
    def nbytes(self) -> int:
        return self.M * self.n * self.n * self.dtype.itemsize

    def _meta(self, name: str) -> np.ndarray:
        return self._group[name][:]

    @property
    def complete(self) -> np.ndarray:
        return self._meta("complete").astype(bool)

    @property
    def trace(self) -> np.ndarray:
        return self._meta("trace")

    @property
    def fro(self) -> np.ndarray:
        return self._meta("fro")

    @property
    def lambda_max(self) -> np.ndarray:
        return self._meta("lambda_max")

    @property
    def norm_factor(self) -> np.ndarray:
        return self._meta("norm_factor")

    @property
    def checksums(self) -> np.ndarray:
        return self._meta("checksum")

    @property
    def X_train(self) -> np.ndarray | None:
        """Standardised training features, or None for banks imported from Gram matrices."""
        return self._group["X"][:] if "X" in self._group else None

    @property
    def train_rows(self) -> np.ndarray:
        return np.asarray(self._attrs["train_rows"], dtype=np.int64)

    def require_complete(self) -> None:
        """Raise BankIncompleteError when a kernel is unfinished or was found corrupt by ``verify``."""
        message = self.incomplete_message()
        if message:
            raise BankIncompleteError(message + "; or `mklscale bank verify` to inspect it")

    def recorded_bad(self) -> dict[int, str]:
        """{kernel: reason} for kernels an earlier ``verify`` found bad and nothing has rebuilt since
        (their ``complete`` flag is still clear). Read from the metadata only: no kernel is read."""
        bad = (self._attrs.get("integrity") or {}).get("bad") or {}
        complete = self.complete
        return {int(m): str(why) for m, why in sorted(bad.items(), key=lambda kv: int(kv[0]))
                if 0 <= int(m) < self.M and not complete[int(m)]}

    def incomplete_message(self) -> str | None:
        """Why this bank cannot be used whole (corrupt kernels, unfinished kernels), with what to do;
        None when every kernel is complete."""
        missing = np.flatnonzero(~self.complete)
        if not missing.size:
            return None
        bad = self.recorded_bad()
        parts = []
        if bad:
            shown = "; ".join(f"{m} ({self.specs[m].name}): {why}" for m, why in list(bad.items())[:5])
            more = "" if len(bad) <= 5 else f"; ... (+{len(bad) - 5})"
            parts.append(f"{len(bad)} kernel(s) found corrupt by verify ({shown}{more}); run "
                         f"`mklscale bank repair {self.path}` (KernelBank.repair) to recompute them")
        unfinished = [int(m) for m in missing if int(m) not in bad]
        if unfinished:
            parts.append(f"{len(unfinished)} unfinished kernel(s) (first: {unfinished[:10]}); run the same build "
                         "again to finish it")
        return f"bank {self.path} has " + "; and ".join(parts)

    # ---- reading ------------------------------------------------------------------------------
    def _check_index(self, m) -> int:
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not -self.M <= m < self.M:
            raise InvalidInputError(f"kernel index {m!r} out of range for a bank of {self.M} kernels")
        return int(m) % self.M

    def kernel(self, m: int) -> np.ndarray:
        """Kernel m as an (n, n) array of the stored dtype."""
        m = self._check_index(m)
        return self.gram[m]

    def kernels(self, idx: Sequence[int]) -> np.ndarray:
        """Kernels idx as a (len(idx), n, n) array of the stored dtype, in the order given."""
        idx = [self._check_index(m) for m in idx]
        if not idx:
            return np.empty((0, self.n, self.n), self.dtype)
        return self.gram.get_orthogonal_selection((np.asarray(idx), slice(None), slice(None)))

    @property
    def n_shards(self) -> int:
        return -(-self.M // self.kernels_per_shard)

    def shard_range(self, s: int) -> tuple[int, int]:
        """Kernel indices [first, stop) held by shard s."""
        first = s * self.kernels_per_shard
        return first, min(first + self.kernels_per_shard, self.M)

    def shard_file(self, s: int) -> Path:
        """The file holding shard s (zarr's default chunk key encoding)."""
        return self.path / "gram" / "c" / str(s) / "0" / "0"

    @property
    def shard_index_bytes(self) -> int:
        """Bytes at the end of every shard file: the (offset, nbytes) index and its crc32c."""
        return 16 * (self.kernels_per_shard // int(self._attrs["layout"]["kernels_per_chunk"])) + 4

    def chunk_offsets(self, s: int, file_size: int, tail: bytes) -> np.ndarray:
        """Byte offsets (int64) of the inner chunks of shard s, from the file's last
        ``shard_index_bytes`` bytes ``tail``, after checking the index's crc32c and that every chunk
        holding kernels of the bank is present, full size and inside the file.

        Raises BankCorruptError naming the shard and its kernels otherwise.
        """
        first, stop = self.shard_range(s)
        where = f"shard {s} of {self.path} (kernels {first}..{stop - 1})"
        if file_size < self.shard_index_bytes:
            raise BankCorruptError(f"{where} is truncated ({file_size} bytes); those kernels need repair")
        index_raw = bytes(tail[:-4])
        if google_crc32c.value(index_raw) != int.from_bytes(bytes(tail[-4:]), "little"):
            raise BankCorruptError(f"{where} has a damaged index (truncated or overwritten); those kernels need repair")
        C = int(self._attrs["layout"]["kernels_per_chunk"])
        n_chunks = -(-(stop - first) // C)
        index = np.frombuffer(index_raw, dtype="<u8").reshape(-1, 2)[:n_chunks]
        chunk_bytes = C * self.n * self.n * self.dtype.itemsize
        if (index[:, 1] != chunk_bytes).any() or (index[:, 0] + chunk_bytes > file_size - self.shard_index_bytes).any():
            raise BankCorruptError(f"{where} is truncated or malformed (a chunk is missing or has the wrong size); "
                                   "those kernels need repair")
        return index[:, 0].astype(np.int64)

    def read_shard(self, s: int) -> np.ndarray:
        """All kernels of shard s as one (stop - first, n, n) array of the stored dtype.

        Uncompressed banks are read with one plain file read and viewed through the shard index
        (zarr's generic sharded read costs several times the bytes it reads); anything else goes
        through zarr. Raises BankCorruptError when the shard file is truncated or its index is
        damaged. Unwritten chunks read as zeros (zarr's fill value).
        """
        first, stop = self.shard_range(s)
        if not self._plain_layout:
            return self.gram[first:stop]
        file = self.shard_file(s)
        if not file.exists():
            return np.zeros((stop - first, self.n, self.n), self.dtype)
        raw = np.fromfile(file, dtype=np.uint8)
        offsets = self.chunk_offsets(s, raw.size, raw[raw.size - self.shard_index_bytes:].tobytes())
        C = int(self._attrs["layout"]["kernels_per_chunk"])
        chunk_bytes = C * self.n * self.n * self.dtype.itemsize
        if np.array_equal(offsets, np.arange(len(offsets)) * chunk_bytes):
            return raw[: len(offsets) * chunk_bytes].view(self.dtype).reshape(-1, self.n, self.n)[: stop - first]
        out = np.empty((len(offsets) * C, self.n, self.n), self.dtype)
        for c, off in enumerate(offsets):
            out[c * C:(c + 1) * C] = raw[off:off + chunk_bytes].view(self.dtype).reshape(C, self.n, self.n)
        return out[: stop - first]

    @property
    def _plain_layout(self) -> bool:
        """True when gram is sharded (index at the end, crc32c) with raw little-endian inner chunks."""
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

        codecs = self.gram.metadata.codecs
        return (
            len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)
            and len(codecs[0].codecs) == 1 and isinstance(codecs[0].codecs[0], BytesCodec)
            and self.dtype.byteorder in ("<", "=") and np.little_endian
            and codecs[0].index_location.value == "end"
            and [type(c) for c in codecs[0].index_codecs] == [BytesCodec, Crc32cCodec]
            and self.gram.metadata.chunk_key_encoding.separator == "/"
        )

    def to_xarray(self):
        """A lazily indexed xarray DataArray (kernel, i, j) with per-kernel coordinates."""
        import dask.array as da
        import xarray as xr

        data = da.from_zarr(self.gram)
        coords = {
            "kernel": np.arange(self.M),
            "name": ("kernel", np.array(self.names, dtype=object)),
            "family": ("kernel", np.array([s.family for s in self.specs], dtype=object)),
            "width": ("kernel", _param_column(self.specs, "width")),
            "degree": ("kernel", _param_column(self.specs, "degree")),
            "n_features_used": ("kernel", np.array([-1 if s.features is None else len(s.features) for s in self.specs])),
            "complete": ("kernel", self.complete),
        }
        for name in PER_KERNEL_FLOATS:
            coords[name] = ("kernel", self._meta(name))
        return xr.DataArray(data, dims=("kernel", "i", "j"), coords=coords, name="gram",
                            attrs={"normalize": str(self.normalize), "path": str(self.path)})

    # ---- integrity ----------------------------------------------------------------------------
    def verify(self, kernels: Sequence[int] | None = None, threads: int = 4, progress: bool = False,
               mark_bad: bool = True) -> VerifyReport:
        """Re-read every complete kernel, recompute its crc32c and compare with the recorded one.

        A missing, truncated or garbled shard file makes all of its kernels bad (the reason says
        which). With ``mark_bad`` (default) newly found bad kernels are recorded on disk (module
        docstring, "Integrity"): their ``complete`` flag is cleared, so solvers refuse them until
        ``repair``; on a read-only store this is skipped and ``report.marked`` is False. Kernels
        recorded bad by an earlier verify are reported bad again, with their recorded reason.
        """
        from tqdm.auto import tqdm

        complete = self.complete
        sel = np.arange(self.M) if kernels is None else np.array([self._check_index(m) for m in kernels], dtype=np.int64)
        recorded = self.recorded_bad()
        report = VerifyReport(checked=0)
        report.bad = [(int(m), self.specs[m].name, f"{recorded[m]} (found by an earlier verify)")
                      for m in sel if int(m) in recorded]
        report.incomplete = [int(m) for m in sel if not complete[m] and int(m) not in recorded]
        todo = np.array([m for m in sel if complete[m]], dtype=np.int64)
        report.checked = int(todo.size)
        S = self.kernels_per_shard
        groups = [todo[(todo // S) == s] for s in np.unique(todo // S)]
        found: list[tuple[int, str, str]] = []
        with ThreadPoolExecutor(max(1, threads)) as pool:
            for bad in tqdm(pool.map(self._check_shard, groups), total=len(groups), disable=not progress,
                            unit="shard", desc="verify"):
                found += bad
        if found and mark_bad:
            report.marked = self._mark_bad({m: why for m, _, why in found})
        report.bad = sorted(report.bad + found)
        return report

    def _check_shard(self, ms: np.ndarray) -> list[tuple[int, str, str]]:
        """(kernel, name, reason) for the kernels ms (all of one shard) whose stored bytes are bad."""
        S = self.kernels_per_shard
        s = int(ms[0]) // S
        if self._plain_layout and not self.shard_file(s).exists():
            return [(int(m), self.specs[m].name, f"shard file {self.shard_file(s)} is missing") for m in ms]
        try:
            block = self.read_shard(s)
        except Exception as exc:  # a truncated or garbled shard fails to decode
            return [(int(m), self.specs[m].name, f"unreadable: {type(exc).__name__}: {exc}") for m in ms]
        expected = self.checksums
        return [(int(m), self.specs[m].name, "checksum mismatch")
                for m in ms if checksum(block[m - s * S]) != int(expected[m])]

    def _mark_bad(self, bad: dict[int, str]) -> bool:
        """Record kernels found bad: the reason in ``attrs["integrity"]`` first, then clear their
        ``complete`` flags (each write is atomic). Returns False when the store is read-only."""
        try:
            group = zarr.open_group(self.path, mode="r+")
            record = dict((group.attrs.get("integrity") or {}).get("bad") or {})
            record.update({str(m): why for m, why in bad.items()})
            group.attrs["integrity"] = {"bad": record, "verified": creation_info()["time"]}
            flags = group["complete"][:]
            flags[list(bad)] = False
            group["complete"][:] = flags
        except OSError:  # read-only or full: report without marking
            return False
        finally:
            self._reload()
        return True

    def forget_bad(self, kernels: Sequence[int]) -> None:
        """Drop the recorded reasons of ``kernels`` (after they were recomputed)."""
        group = zarr.open_group(self.path, mode="r+")
        record = dict((group.attrs.get("integrity") or {}).get("bad") or {})
        if any(str(int(m)) in record for m in kernels):
            for m in kernels:
                record.pop(str(int(m)), None)
            group.attrs["integrity"] = {"bad": record, "verified": (group.attrs.get("integrity") or {}).get("verified")}
        self._reload()

    def _reload(self) -> None:
        """Re-read the group's metadata (attributes written through another handle)."""
        self._group = zarr.open_group(self.path, mode=self._mode)
        self._attrs = self._group.attrs.asdict()
        self.gram = self._group["gram"]

    def repair(self, kernels: Sequence[int] | None = None, client=None, progress: bool = True):
        """Recompute bad kernels from their specs and the stored standardised X; see
        ``mklscale.bank.build.repair_bank`` (returns its ``RepairReport``)."""
        from mklscale.bank.build import repair_bank

        return repair_bank(self, kernels=kernels, client=client, progress=progress)

    # ---- cross kernels ------------------------------------------------------------------------
    def standardize(self, X: np.ndarray) -> np.ndarray:
        """Apply the training standardisation recorded at build time to raw features X."""
        X = validate_features(X, "X_new")
        std = self._attrs.get("standardization")
        d = self._group["X"].shape[1] if "X" in self._group else None
        if d is not None and X.shape[1] != d:
            raise InvalidInputError(f"X_new has {X.shape[1]} feature(s) but the bank was built on {d}")
        if std is None:
            return X
        return (X - np.asarray(std["mean"])) / np.asarray(std["scale"])

    def cross(self, X_new: np.ndarray | None, kernels: Sequence[int] | None = None) -> np.ndarray:
        """K_m(X_new, X_train) with exactly the training normalisation: (len(kernels), n_new, n) float64.

        For banks imported with ``from_arrays``, pass ``X_new=None`` to get the stored cross kernels.
        ``cross(X_train_raw)`` reproduces the bank (to the stored dtype's rounding).
        """
        idx = list(range(self.M)) if kernels is None else [self._check_index(m) for m in kernels]
        if X_new is None:
            if "cross_gram" not in self._group:
                raise InvalidInputError(f"bank {self.path} stores no cross kernels; pass X_new (raw features)")
            return self._group["cross_gram"].get_orthogonal_selection((np.asarray(idx, dtype=np.int64), slice(None), slice(None))).astype(np.float64)
        if "X" not in self._group:
            raise SpecError(f"bank {self.path} was imported from Gram matrices and holds no features; "
                            "it cannot compute cross kernels for new data (import them with cross_grams=)")
        Xs = self.standardize(X_new)
        Xt = self.X_train
        factor = self.norm_factor
        out = np.empty((len(idx), Xs.shape[0], self.n))
        for k, m in enumerate(idx):
            spec = self.specs[m]
            out[k] = normalize_block(spec.compute(Xs, Xt), self.normalize, factor[m], spec, Xs, Xt)
        return out


# ---- helpers shared with build.py -----------------------------------------------------------------
def normalize_block(K: np.ndarray, rule: str | None, factor: float, spec: KernelSpec, Xa: np.ndarray, Xb: np.ndarray) -> np.ndarray:
    """Apply a normalisation rule to K(Xa, Xb).

    trace: K * factor with factor = 1 / trace(K_train) (unit trace on the training set);
    diag:  K_ij / sqrt(k(a_i, a_i) k(b_j, b_j)) (unit diagonal; zero diagonals left unscaled);
    None:  unchanged.
    """
    if rule == "trace":
        return K * factor
    if rule == "diag":
        da, db = _safe_diag(spec.diag(Xa)), _safe_diag(spec.diag(Xb))
        return K / np.sqrt(np.outer(da, db))
    return K


def _safe_diag(d: np.ndarray) -> np.ndarray:
    return np.where(d > 1e-300, d, 1.0)


def validate_features(X, what: str = "X") -> np.ndarray:
    X = np.asarray(X)
    if X.dtype.kind not in "fiub":
        raise InvalidInputError(f"{what} must be numeric, got dtype {X.dtype}; convert it with "
                                f"np.asarray({what}, dtype=float) (encode categorical columns first)")
    X = X.astype(np.float64, copy=False)
    if X.ndim != 2:
        raise InvalidInputError(f"{what} must be a 2-D array (n_samples, n_features), got shape {X.shape}; reshape "
                                f"it, e.g. {what}.reshape(-1, 1) for a single feature")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InvalidInputError(f"{what} is empty (shape {X.shape}); it needs at least one row and one feature")
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InvalidInputError(f"{what} contains {int(bad.sum())} NaN/inf value(s) (first at row {r}, column {c}); "
                                "impute or drop them before building kernels")
    return X


def validate_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.name not in DTYPES:
        raise InvalidInputError(f"bank dtype must be one of {DTYPES}, got {dtype!r}")
    return dt


def _param_column(specs: list[KernelSpec], name: str) -> np.ndarray:
    return np.array([float(dict(s.params).get(name, np.nan)) for s in specs])


def _open_group_or_none(path: Path, mode: str) -> zarr.Group | None:
    if not (path / "zarr.json").is_file():
        return None
    try:
        group = zarr.open_group(path, mode=mode)
    except Exception:
        return None
    info = group.attrs.get("mklscale")
    if not isinstance(info, dict) or info.get("kind") != "kernel_bank":
        return None
    if int(info.get("schema_version", 0)) > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"bank {path} was written with schema version {info['schema_version']}, newer than this "
            f"mklscale reads ({SCHEMA_VERSION}); upgrade mklscale to open it"
        )
    return group


def create_bank_group(
    path: Path,
    *,
    specs: Sequence[KernelSpec],
    n: int,
    dtype: np.dtype,
    attrs: dict,
    X: np.ndarray | None,
    chunk_mb: float,
    shard_mb: float,
    fill=None,
) -> None:
    """Create the bank's group and arrays in a temporary sibling folder and rename it into place,
    so ``path`` either does not exist or holds a well-formed bank. ``fill(group)`` may write data
    (``from_arrays``) before the rename."""
    M = len(specs)
    per_chunk, per_shard = layout_for(M, n, dtype.itemsize, chunk_mb, shard_mb)
    tmp = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        group = zarr.open_group(tmp, mode="w")
        group.create_array("gram", shape=(M, n, n), chunks=(per_chunk, n, n), shards=(per_shard, n, n),
                           dtype=dtype, compressors=None, fill_value=0, dimension_names=("kernel", "i", "j"))
        group.create_array("complete", data=np.zeros(M, dtype=bool), chunks=(M,))
        for name in PER_KERNEL_FLOATS:
            group.create_array(name, data=np.full(M, np.nan), chunks=(M,))
        group.create_array("checksum", data=np.zeros(M, dtype=np.uint32), chunks=(M,))
        spec_array = group.create_array("spec", shape=(M,), dtype="str", chunks=(M,))
        spec_array[:] = np.array([s.to_json() for s in specs], dtype=object)
        if X is not None:
            group.create_array("X", data=X, chunks=X.shape)
        group.update_attributes({  # one write of zarr.json (attrs.update writes it once per key)
            **attrs,
            "mklscale": {"kind": "kernel_bank", "schema_version": SCHEMA_VERSION},
            "n": int(n), "M": int(M), "dtype": dtype.name,
            "layout": {"kernels_per_chunk": per_chunk, "kernels_per_shard": per_shard},
        })
        if fill is not None:
            fill(group)
        os.replace(tmp, path) if not path.exists() else _replace_empty_dir(tmp, path)
    except OSError as exc:
        raise_store_error(path, exc)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _replace_empty_dir(tmp: Path, path: Path) -> None:
    path.rmdir()  # only an empty directory may be replaced; rmdir refuses anything else
    os.replace(tmp, path)


def _check_gram(name: str, K: np.ndarray, n: int, psd_tol: float) -> None:
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise InvalidInputError(f"Gram matrix {name!r} is not square: shape {K.shape}")
    if K.shape[0] != n:
        raise InvalidInputError(f"Gram matrix {name!r} is {K.shape[0]} x {K.shape[0]} but the first one is {n} x {n}")
    if not np.isfinite(K).all():
        raise InvalidInputError(f"Gram matrix {name!r} contains NaN or inf")
    scale = max(1.0, float(np.abs(K).max()))
    asym = float(np.abs(K - K.T).max())
    if asym > 1e-6 * scale:
        raise InvalidInputError(f"Gram matrix {name!r} is not symmetric (max |K - K^T| = {asym:.3g}); symmetrise it, e.g. (K + K.T) / 2")
    eig = np.linalg.eigvalsh(K)
    if eig[0] < -psd_tol * max(1.0, float(eig[-1])):
        raise InvalidInputError(f"Gram matrix {name!r} is not positive semidefinite: smallest eigenvalue {eig[0]:.6g} "
                                f"(largest {eig[-1]:.6g}); fix the kernel or clip negative eigenvalues before importing")


def require_writable(path: Path) -> None:
    """Raise ReadOnlyStoreError unless files can be created in ``path`` (a read-only mount, or
    permissions): checked before any work, with a probe file, since root passes ``os.access``."""
    path = Path(path)
    try:
        fd, probe = tempfile.mkstemp(prefix=".mklscale-write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(disk_full_message(path)) from None
        raise ReadOnlyStoreError(
            f"cannot write to {path} ({exc.strerror or exc}): the store is read-only. Remount it read-write or "
            "fix its permissions, or copy the bank to a writable folder (or choose another output path) and run "
            "the command there") from None


def disk_full_message(path: Path) -> str:
    """What to say when the file system holding bank ``path`` is full."""
    return (f"no space left on the device holding {path}: free some space or choose another path (move the bank "
            "there first to keep its work); the kernels already finished are kept and marked complete, and running "
            "the same build (or repair) again resumes with the rest")


def raise_store_error(path: Path, exc: OSError) -> NoReturn:
    """Re-raise an OSError met writing bank ``path``: a full disk as DiskFullError, a read-only or
    unwritable one as ReadOnlyStoreError (messages say what to do); anything else unchanged."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(disk_full_message(path)) from exc
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        raise ReadOnlyStoreError(f"{path} is not writable ({exc.strerror}); remount it read-write or move the bank to "
                                 "a writable folder, then run the same command again (finished kernels are kept)") from exc
    raise exc


def prepare_path(path: Path, overwrite: bool, fingerprint: str | None) -> bool:
    """Decide what to do with the target path. Returns True when an existing bank with the same
    fingerprint should be resumed; removes an existing bank if ``overwrite``; refuses anything
    else that exists (a non-empty folder that is not a bank is never deleted)."""
    if not path.exists():
        parent = path.parent if str(path.parent) else Path(".")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReadOnlyStoreError(f"cannot create the folder {parent} ({exc.strerror or exc}); choose a "
                                     "writable path") from None
        require_writable(parent)
        return False
    if path.is_dir() and not any(path.iterdir()):
        require_writable(path)
        return False
    if not KernelBank.is_bank(path):
        raise NotABankError(f"{path} exists and is not an mklscale kernel bank; choose another path "
                            "(mklscale never deletes a folder it did not create)")
    if overwrite:
        require_writable(path)
        shutil.rmtree(path)
        return False
    existing = KernelBank.open(path).attrs.get("fingerprint")
    if fingerprint is not None and existing == fingerprint:
        return True
    raise BankMismatchError(f"{path} holds a bank built from different data, kernel specs or settings; "
                            "pass overwrite=True (CLI: --overwrite) to replace it, or choose another path")


def creation_info() -> dict:
    import datetime
    import platform

    from mklscale import __version__
    return {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mklscale_version": __version__, "host": platform.node(), "python": platform.python_version(),
            "zarr_version": zarr.__version__}


def json_attr(obj) -> dict | list:
    """Round-trip through JSON so attributes hold plain types only."""
    return json.loads(json.dumps(obj))
