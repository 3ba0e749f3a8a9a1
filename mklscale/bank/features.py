"""A bank's features by column blocks: the user's X read in blocks (in memory, a ``.npy`` file, a
zarr array), and the bank's stored standardised X read by column chunks.

Nothing here holds X whole unless the caller asks for it (``StoredFeatures.all``), so a bank of one
kernel per feature over 10^6 features builds and runs in memory of the order of one column block
(issue 31, "M = 10^6").

Input (``FeatureSource``, ``as_source``): X is an (n, d) numeric array in memory, a ``.npy`` path
(opened per block, never mapped whole: each block maps the file, copies its part and unmaps it) or a
zarr array. ``scan`` checks it (finite, of a magnitude whose squares do not overflow: the messages of
``inputs.validate_features``) and computes the standardisation mean_j, scale_j column block by column
block, with the same numpy reductions as on the whole array (the block keeps the source's memory
order), so every value is bit-identical to the whole-array computation. ``fingerprint_rows`` feeds the
C-order float64 bytes of X to a hash row block by row block: the same digest as hashing
``X.tobytes()`` (a C-contiguous float64 array in memory is hashed in place).

Stored (``write_columns``, ``StoredFeatures``): the standardised X of a bank is the zarr array ``X``
(n, d) float64, uncompressed, in chunks of whole columns (n, c) of about ``chunk_mb``, with the crc32c
of every chunk's bytes (C order, little endian) in the attribute ``X_chunks`` ({"columns": c,
"crc32c": [...]}). Banks written before it hold X in one chunk with the crc32c of the whole array in
``X_checksum`` (or none at all: unchecked); they are read as one chunk. A chunk is checked every time it
is read from the store; a per-object least-recently-used cache keeps up to ``CACHE_BYTES`` of checked
chunks. ``subset(specs)`` maps a run of kernel specs to the columns they use and the specs re-indexed to
those columns, which give the same kernels bit for bit (a kernel's values depend on its columns'
values only).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from mklscale.bank.inputs import MAX_FEATURE_MAGNITUDE
from mklscale.bank.stats import checksum
from mklscale.errors import BankCorruptError, InvalidInputError

#: Bytes of float64 values one block of the input holds while it is scanned, hashed or written.
BLOCK_BYTES = 64 * 2**20
#: Bytes of checked column chunks a ``StoredFeatures`` keeps (least recently used out).
CACHE_BYTES = 128 * 2**20


# ---- the user's X, read in blocks ------------------------------------------------------------------
class FeatureSource:
    """Read-only (n, d) numeric features, served in float64 blocks (module doc). ``what`` names X in
    messages."""

    def __init__(self, X, what: str = "X"):
        self.what = what
        self._npy: tuple | None = None
        if isinstance(X, (str, Path)):
            self._npy = _npy_header(Path(X), what)
            shape, dtype = self._npy[1], self._npy[2]
            self._array = None
        else:
            if not hasattr(X, "shape") or not hasattr(X, "dtype"):
                X = np.asarray(X)
            self._array = X
            shape, dtype = tuple(X.shape), np.dtype(X.dtype)
        if dtype.kind not in "fiub":
            raise InvalidInputError(f"{what} must be numeric, got dtype {dtype}; convert it with "
                                    f"np.asarray({what}, dtype=float) (encode categorical columns first)")
        if len(shape) != 2:
            raise InvalidInputError(f"{what} must be a 2-D array (n_samples, n_features), got shape {shape}; reshape "
                                    f"it, e.g. {what}.reshape(-1, 1) for a single feature")
        if shape[0] == 0 or shape[1] == 0:
            raise InvalidInputError(f"{what} is empty (shape {shape}); it needs at least one row and one feature")
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = dtype

    @property
    def in_memory(self) -> bool:
        return isinstance(self._array, np.ndarray)

    def _slice(self, rows: slice, cols: slice) -> np.ndarray:
        if self._npy is not None:
            path, shape, dtype, fortran, offset = self._npy
            mm = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
            try:
                return np.array(mm[rows, cols])  # copied out; the mapping goes with mm
            finally:
                del mm
        return np.asarray(self._array[rows, cols])

    def columns(self, c0: int, c1: int) -> np.ndarray:
        """Columns c0..c1-1 as float64 (n, c1 - c0), in the source's memory order (a view of an
        in-memory float64 array)."""
        return self._slice(slice(None), slice(c0, c1)).astype(np.float64, copy=False)

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1-1 as a C-contiguous float64 array."""
        return np.ascontiguousarray(self._slice(slice(r0, r1), slice(None)), dtype=np.float64)

    def column_blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, int]]:
        step = max(1, int(block_bytes) // (8 * self.shape[0]))
        for c0 in range(0, self.shape[1], step):
            yield c0, min(c0 + step, self.shape[1])


def as_source(X, what: str = "X") -> FeatureSource:
    """``X`` as a ``FeatureSource`` (one already is returned as it is)."""
    return X if isinstance(X, FeatureSource) else FeatureSource(X, what)


def _npy_header(path: Path, what: str) -> tuple:
    """(path, shape, dtype, fortran_order, data offset) of a ``.npy`` file."""
    if not path.is_file():
        raise InvalidInputError(f"{what} is the path {path}, which is not a file; give an array, a zarr array or the "
                                "path of a .npy file")
    try:
        with open(path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except (ValueError, OSError) as exc:
        raise InvalidInputError(f"{what}: {path} is not a readable .npy file ({exc}); save X with np.save") from None
    if dtype.hasobject:
        raise InvalidInputError(f"{what}: {path} holds Python objects; save a numeric array")
    return path, tuple(shape), dtype, bool(fortran), offset


@dataclasses.dataclass
class Scan:
    """What ``scan`` found: mean and scale (None without standardisation)."""

    mean: np.ndarray | None
    scale: np.ndarray | None


def scan(source: FeatureSource, standardize: bool, block_bytes: int = BLOCK_BYTES) -> Scan:
    """Check every value of ``source`` (``inputs.validate_features``'s rules and messages: the count over
    all of X, the first offending value in row-major order) and, with ``standardize``, compute each
    column's mean and scale (``standardisation``), one column block at a time."""
    n, d = source.shape
    mean = np.empty(d) if standardize else None
    scale = np.empty(d) if standardize else None
    bad_count, bad_first, big_count, big_first = 0, None, 0, None
    for c0, c1 in source.column_blocks(block_bytes):
        B = source.columns(c0, c1)
        bad = ~np.isfinite(B)
        if bad.any():
            bad_count += int(bad.sum())
            r, c = np.argwhere(bad)[0]
            bad_first = min(bad_first or (n, d), (int(r), c0 + int(c)))
            continue
        big = np.abs(B) > MAX_FEATURE_MAGNITUDE
        if big.any():
            big_count += int(big.sum())
            r, c = np.argwhere(big)[0]
            if big_first is None or (int(r), c0 + int(c)) < big_first[:2]:
                big_first = (int(r), c0 + int(c), float(B[r, c]))
        if standardize and not bad_count and not big_count:
            mean[c0:c1], scale[c0:c1] = standardisation(B)
    what = source.what
    if bad_count:
        r, c = bad_first
        raise InvalidInputError(f"{what} contains {bad_count} NaN/inf value(s) (first at row {r}, column {c}); "
                                "impute or drop them before building kernels")
    if big_count:
        r, c, v = big_first
        raise InvalidInputError(f"{what} holds {big_count} value(s) of magnitude above {MAX_FEATURE_MAGNITUDE:g} "
                                f"(first {v:g} at row {r}, column {c}); squared distances and inner products "
                                "of such values overflow float64: rescale those columns (e.g. log or divide by a "
                                "constant) before building kernels")
    return Scan(mean, scale)


def standardisation(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean_j, scale_j) of the columns of X: scale_j is the standard deviation, or 1 for a constant
    column (sd <= 1e-12 max(1, |mean_j|)), which is then only centred."""
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    return mean, np.where(scale > 1e-12 * np.maximum(1.0, np.abs(mean)), scale, 1.0)


def fingerprint_rows(h, source: FeatureSource, block_bytes: int = BLOCK_BYTES) -> None:
    """Update the hash ``h`` with X's C-order float64 bytes (= ``h.update(X.tobytes())`` of the float64
    array), a row block at a time (in place for a C-contiguous float64 array in memory)."""
    n, d = source.shape
    if source.in_memory and source._array.dtype == np.float64 and source._array.flags.c_contiguous:
        h.update(source._array.data if source._array.dtype.byteorder in "=<|" else source._array.tobytes())
        return
    step = max(1, int(block_bytes) // (8 * d))
    for r0 in range(0, n, step):
        h.update(source.rows(r0, min(r0 + step, n)).data)


def standardised_blocks(source: FeatureSource, found: Scan, columns: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """(c0, c1, Xs[:, c0:c1]) of the standardised features, C-contiguous, ``columns`` at a time:
    (X - mean) / scale, or X itself without standardisation."""
    d = source.shape[1]
    for c0 in range(0, d, columns):
        c1 = min(c0 + columns, d)
        B = source.columns(c0, c1)
        if found.mean is not None:
            B = (B - found.mean[c0:c1]) / found.scale[c0:c1]
        yield c0, c1, np.ascontiguousarray(B, dtype=np.float64)


def chunk_columns(n: int, chunk_mb: float) -> int:
    """Columns per chunk of a bank's stored X: about ``chunk_mb`` of float64 (at least one column)."""
    return int(max(1, chunk_mb * 2**20 // (8 * n)))


def write_columns(group, source: FeatureSource, found: Scan, chunk_mb: float) -> dict:
    """Create the array ``X`` of ``group`` (module doc) from the standardised ``source``, one chunk at a
    time, and with a standardisation its arrays ``X_mean`` and ``X_scale``; returns the attributes
    ``X_chunks`` and ``standardization`` ({"arrays": ["X_mean", "X_scale"]}, or None)."""
    n, d = source.shape
    cols = min(d, chunk_columns(n, chunk_mb))
    arr = group.create_array("X", shape=(n, d), chunks=(n, cols), dtype=np.float64, compressors=None,
                             fill_value=0.0, dimension_names=("i", "feature"))
    sums = []
    for c0, c1, B in standardised_blocks(source, found, cols):
        arr[:, c0:c1] = B
        sums.append(checksum(B))
    if found.mean is not None:
        for name, values in (("X_mean", found.mean), ("X_scale", found.scale)):
            group.create_array(name, data=values, chunks=(d,), compressors=None)
    return {"X_chunks": {"columns": cols, "crc32c": sums},
            "standardization": None if found.mean is None else {"arrays": ["X_mean", "X_scale"]}}


# ---- the stored X, read by column chunks ------------------------------------------------------------
PROBLEM = ("the stored features X do not match their checksum (damaged or edited): repair cannot recompute "
           "kernels from them and cross kernels of new rows would be wrong; rebuild the bank "
           "(build_bank(..., overwrite=True), `mklscale bank build ... --overwrite`)")


class StoredFeatures:
    """The standardised features of an opened bank (its zarr ``group``, attributes ``attrs``), read by
    checked column chunks (module doc). Thread-safe."""

    def __init__(self, group, attrs: dict, where: str, cache_bytes: int = CACHE_BYTES):
        self._array = group["X"]
        self.shape = tuple(int(s) for s in self._array.shape)
        self.where = where
        info = attrs.get("X_chunks")
        if isinstance(info, dict):
            self.columns_per_chunk = int(info["columns"])
            self._sums = [int(s) for s in info["crc32c"]]
        else:  # a bank from before X_chunks: X in one chunk, its crc32c in X_checksum (or unchecked)
            self.columns_per_chunk = self.shape[1]
            self._sums = [None if attrs.get("X_checksum") is None else int(attrs["X_checksum"])]
        self.n_chunks = -(-self.shape[1] // self.columns_per_chunk)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cache_bytes = int(cache_bytes)
        self._lock = threading.Lock()

    def chunk_range(self, c: int) -> tuple[int, int]:
        c0 = c * self.columns_per_chunk
        return c0, min(c0 + self.columns_per_chunk, self.shape[1])

    def problem(self, c: int, block: np.ndarray) -> str | None:
        """What is wrong with chunk c's values ``block`` (its crc32c does not match), or None."""
        expected = self._sums[c] if c < len(self._sums) else -1
        if expected is None or checksum(np.ascontiguousarray(block)) == expected:
            return None
        return PROBLEM + ("" if self.n_chunks == 1 else f" (columns {self.chunk_range(c)[0]}..{self.chunk_range(c)[1] - 1})")

    def read_chunk(self, c: int) -> np.ndarray:
        """Chunk c as read from the store, unchecked (``verify`` reads them so)."""
        c0, c1 = self.chunk_range(c)
        return np.ascontiguousarray(self._array[:, c0:c1], dtype=np.float64)

    def chunk(self, c: int) -> np.ndarray:
        """Chunk c (n, its columns) float64, checked; BankCorruptError when it does not match."""
        with self._lock:
            block = self._cache.get(c)
            if block is not None:
                self._cache.move_to_end(c)
                return block
        block = self.read_chunk(c)
        problem = self.problem(c, block)
        if problem:
            raise BankCorruptError(f"bank {self.where}: {problem}")
        block.setflags(write=False)
        with self._lock:
            self._cache[c] = block
            while len(self._cache) > 1 and sum(b.nbytes for b in self._cache.values()) > self._cache_bytes:
                self._cache.popitem(last=False)
        return block

    def columns(self, cols: Sequence[int]) -> np.ndarray:
        """Columns ``cols`` (in the order given) as a C-contiguous float64 (n, len(cols)) array."""
        cols = np.asarray(cols, dtype=np.int64)
        out = np.empty((self.shape[0], cols.size))
        per = self.columns_per_chunk
        for c in np.unique(cols // per):
            at = np.flatnonzero(cols // per == c)
            out[:, at] = self.chunk(int(c))[:, cols[at] - c * per]
        return out

    def all(self) -> np.ndarray:
        """The whole standardised X (n, d), every chunk checked."""
        if self.n_chunks == 1:
            return np.array(self.chunk(0))
        return self.columns(np.arange(self.shape[1]))

    def scan_problems(self) -> list[str]:
        """Every chunk read and checked once (``verify``): what is wrong, [] when nothing is."""
        out = []
        for c in range(self.n_chunks):
            try:
                problem = self.problem(c, self.read_chunk(c))
            except Exception as exc:  # an undecodable chunk
                problem = f"the stored features X cannot be read ({type(exc).__name__}: {exc})"
            if problem:
                out.append(problem)
        return out


def subset(specs: Sequence, n_features: int) -> tuple[np.ndarray | None, list]:
    """(columns, specs re-indexed to them) for kernels ``specs``: the sorted columns their features use
    and each spec with its features renumbered as positions in that list; (None, specs) when a spec uses
    all features (features None) or the run uses more than half of them (then X is read whole)."""
    used = set()
    for s in specs:
        if s.features is None:
            return None, list(specs)
        used.update(s.features)
    if len(used) * 2 > n_features:
        return None, list(specs)
    cols = sorted(used)
    where = {j: k for k, j in enumerate(cols)}
    out = []
    for s in specs:
        key = (s.family, s.params, tuple(where[j] for j in s.features))  # increasing: sorted, distinct
        r = _LOCAL.get(key)
        if r is None:
            if len(_LOCAL) > 4096:
                _LOCAL.clear()
            r = _LOCAL[key] = dataclasses.replace(s, features=key[2])
        out.append(r)
    return np.array(cols, dtype=np.int64), out


#: re-indexed specs by (family, params, local features): a pass re-indexes every kernel it computes
_LOCAL: dict = {}


@dataclasses.dataclass(frozen=True)
class StoredRef:
    """What a task needs to read a bank's stored features in its own process (a build's or repair's
    shard tasks of a computed bank): the bank's location (``Storage.worker_location``) and fingerprint.
    ``open`` keeps one ``StoredFeatures`` per bank and process (the last ``_MAX_OPEN``)."""

    location: object
    fingerprint: str | None

    def open(self) -> StoredFeatures:
        from mklscale.bank.storage import storage_for

        key = (str(self.location), self.fingerprint)
        with _OPEN_LOCK:
            found = _OPEN.get(key)
            if found is not None:
                _OPEN.move_to_end(key)
                return found
        group = storage_for(self.location).open_group("r")
        if group is None or "X" not in group:
            raise BankCorruptError(f"bank {self.location} holds no features X to compute its kernels from")
        found = StoredFeatures(group, group.attrs.asdict(), str(self.location))
        with _OPEN_LOCK:
            _OPEN[key] = found
            while len(_OPEN) > _MAX_OPEN:
                _OPEN.popitem(last=False)
        return found

    def features_for(self, specs: Sequence) -> tuple[np.ndarray, list]:
        """(Xs, specs): the columns kernels ``specs`` use and the specs re-indexed to them (``subset``)."""
        stored = self.open()
        cols, local = subset(specs, stored.shape[1])
        return (stored.all() if cols is None else stored.columns(cols)), local


_OPEN: OrderedDict[tuple, StoredFeatures] = OrderedDict()
_OPEN_LOCK = threading.Lock()
_MAX_OPEN = 2


def release_stored() -> None:
    """Forget this process's ``StoredRef.open`` features (their cached chunks): the end of a build."""
    with _OPEN_LOCK:
        _OPEN.clear()
