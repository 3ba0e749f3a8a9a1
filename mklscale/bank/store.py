"""KernelBank: an opened kernel bank, the zarr v3 store of M Gram matrices (or, in a factor bank, of
their factors L_m with K~_m = L_m L_m^T: ``representation``, ``factor``) and their per-kernel metadata.

The bank's arrays and attributes, and how its group is created: ``group``; the bytes of its shards:
``shard_format``; where they live: ``storage`` (``KernelBank.storage``, a folder, an object store).

Integrity (``integrity``: ``verify``, ``repair`` and the record of bad kernels). A kernel ``verify``
finds bad is recorded in the bank: its ``complete`` flag is cleared and ``attrs["integrity"]``
keeps the reason, so everything that refuses unfinished kernels (the Engine, ``require_complete``)
refuses corrupt ones without re-reading the bank on every open, and ``allow_incomplete=True`` runs
on the rest. The metadata that changes results (normalisation factor, trace, fro, lambda_max, the
data checksum, a factor bank's rank, landmarks, transform and errors, the spec) is covered per
kernel by ``meta_checksum`` (``stats.meta_checksum``). Passes check every kernel's bytes as they
read them (``engine.reader``, "Integrity on read"), so a damaged kernel is an error, never a result.

Writers. Everything that writes a bank (``from_arrays``, ``build.build_bank``, ``repair``,
``verify``'s marking) holds its writer lock (``Storage.writer``; in a folder it also sweeps a killed
writer's temporary files and refuses symbolic links leading out of the store). Opening a bank
checks its metadata (``metadata.read_metadata``): damage raises BankCorruptError naming it.

Nothing in a store is executed or unpickled: specs are JSON, everything else is numbers.

The helpers this module held before it was split (shard writing, direct I/O, checksums, input
checks, group creation, filesystem errors) stay importable from here under their old names.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import zarr

from mklscale.bank import _compute, integrity, shard_format
from mklscale.bank.features import StoredFeatures, subset
from mklscale.bank.integrity import VerifyReport
from mklscale.bank.factor import factor_rows
from mklscale.bank.direct_io import DIRECT_ALIGN, aligned_empty, write_direct
from mklscale.bank.fs_errors import disk_full_message, raise_store_error, require_writable
from mklscale.bank.group import (
    PER_KERNEL_FLOATS,
    SCHEMA_VERSION,
    create_bank_group,
    data_array_name,
    creation_info,
    json_attr,
    layout_for,
)
from mklscale.bank.storage import Storage, storage_for
from mklscale.bank.metadata import read_metadata
from mklscale.bank.inputs import DTYPES, NORMALIZATIONS, check_gram, validate_dtype, validate_features
from mklscale.bank.normalize import cross_kernels, normalize_block
from mklscale.bank.shard_format import write_shard_file
from mklscale.bank.shards import fill_block, quad_block
from mklscale.bank.size import check_fits
from mklscale.bank.spec import KernelSpec
from mklscale.bank.stats import checksum, kernel_stats, meta_checksums
from mklscale.errors import (
    BankIncompleteError,
    BankMismatchError,
    InvalidInputError,
    SpecError,
)

__all__ = [
    "KernelBank", "VerifyReport", "prepare_path", "refuse_target",
    # moved to the modules named above; still importable from here
    "DIRECT_ALIGN", "DTYPES", "NORMALIZATIONS", "PER_KERNEL_FLOATS", "SCHEMA_VERSION", "aligned_empty",
    "checksum", "create_bank_group", "creation_info", "disk_full_message", "json_attr", "kernel_stats",
    "layout_for", "normalize_block", "raise_store_error", "require_writable", "validate_dtype",
    "validate_features", "write_direct", "write_shard_file",
]


class KernelBank:
    """An opened bank. ``len(bank)`` is M, ``bank.n`` the number of training points."""

    def __init__(self, path: str | os.PathLike | Storage, group: zarr.Group):
        #: where the bank's bytes live (``storage``: a folder, an object store, ...)
        self.storage: Storage = storage_for(path)
        self.path = self.storage.location  # a Path, or an ObjectURL for a bank on an object store
        self._group = group
        meta = read_metadata(self.path, group)  # BankCorruptError naming what is damaged
        attrs = meta.attrs
        self._attrs = attrs
        self.n: int = int(attrs["n"])
        self.M: int = int(attrs["M"])
        self.dtype = np.dtype(attrs["dtype"])
        self.normalize: str | None = attrs["normalize"]
        self.kernels_per_shard: int = int(attrs["layout"]["kernels_per_shard"])
        self.specs: list[KernelSpec] = meta.specs
        #: "dense" (every K_m stored, n x n) or "factor" (L_m stored, n x r, K~_m = L_m L_m^T);
        #: banks written before factor banks existed have no such attribute and are dense.
        self.representation: str = attrs.get("representation") or "dense"
        self._data: zarr.Array | None = meta.data  # None: a computed bank stores no kernels
        self._mode = "r"
        self._Xs: np.ndarray | None = None  # the whole standardised X, when kernels need most of it
        self._features: StoredFeatures | None = None  # X by checked column chunks (``features``)

    @property
    def stores_kernels(self) -> bool:
        """False for a computed bank (``build_bank(..., computed=True)``): it holds the standardised
        features, the specs and each kernel's statistics and checksum; its kernels are computed from
        the features whenever they are read (``shards.fill_block``: the bytes a stored bank holds)."""
        return self._data is not None

    @property
    def gram(self) -> zarr.Array:
        """The (M, n, n) zarr array of a dense bank."""
        if self.representation == "factor":
            raise InvalidInputError(self._factor_message("has no `gram` array"))
        if not self.stores_kernels:
            raise InvalidInputError(f"bank {self.path} is a computed bank: it stores no kernels; read them with "
                                    "bank.kernel(m) / bank.kernels(idx), which compute them from its features")
        return self._data

    @property
    def rank(self) -> int | None:
        """Columns r of every stored factor (factor banks; kernel m uses the first ``ranks[m]``); None if dense."""
        return None if self.representation != "factor" else int(self._attrs["rank"])

    @property
    def block_shape(self) -> tuple[int, int]:
        """Shape of one kernel as stored: (n, n), or (n, r) for a factor bank."""
        return (self.n, self.n) if self.rank is None else (self.n, self.rank)

    @property
    def _kernel_bytes(self) -> int:
        return self.block_shape[0] * self.block_shape[1] * self.dtype.itemsize

    def _factor_message(self, what: str) -> str:
        return (f"bank {self.path} is a factor bank (rank {self.rank}): it {what}; kernel m is stored as its "
                "factor L_m (n x r) with K~_m = L_m L_m^T: read factors with bank.factor(m) / bank.factors(idx), "
                "or materialise one kernel with bank.kernel(m, materialize=True)")

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
        wait: bool | float = True,
    ) -> KernelBank:
        """Import precomputed Gram matrices (graph or string kernels computed elsewhere).

        ``grams`` is (M, n, n) or a sequence of (n, n); ``cross_grams`` optionally (M, n_new, n)
        for prediction. Each matrix must be square, finite, symmetric and PSD: its smallest
        eigenvalue must be >= -psd_tol * max(1, largest). ``normalize`` is None or "trace" (unit
        trace; the same factor scales the cross kernels). The bank appears atomically: either the
        whole import is on disk or nothing is (``overwrite`` swaps the new store in for the old). A
        bank larger than its disk's free space (``size.check_fits``) raises BankTooLargeError before
        anything is written.
        ``wait``: what to do while another process writes a bank at ``path`` (``writing``).
        """
        dt = validate_dtype(dtype)
        if normalize not in (None, "trace"):
            raise InvalidInputError(f"from_arrays supports normalize=None or 'trace', got {normalize!r} "
                                    "(unit-diagonal scaling of cross kernels needs k(x, x) of the new points)")
        M = len(grams)
        if M == 0:
            raise InvalidInputError("grams is empty; give at least one Gram matrix")

        def gram(m: int) -> np.ndarray:   # one at a time: a memory-mapped (M, n, n) array is never loaded whole
            return np.asarray(grams[m], dtype=np.float64)

        names = [f"kernel_{m}" for m in range(M)] if names is None else [str(x) for x in names]
        if len(names) != M or len(set(names)) != len(names):
            raise InvalidInputError(f"names must be {M} distinct strings, got {len(names)} ({len(set(names))} distinct)")
        first = gram(0)
        n = first.shape[0] if first.ndim == 2 else -1
        factors = []
        for m, name in enumerate(names):
            K = first if m == 0 else gram(m)
            check_gram(name, K, n, psd_tol)
            factors.append(1.0 / np.trace(K) if normalize == "trace" and np.trace(K) > 0 else 1.0)
        del first
        crosses = None
        if cross_grams is not None:
            crosses = np.asarray(cross_grams, dtype=np.float64)
            if crosses.ndim != 3 or crosses.shape[0] != M or crosses.shape[2] != n:
                raise InvalidInputError(f"cross_grams must have shape ({M}, n_new, {n}), got {crosses.shape}")
            if not np.isfinite(crosses).all():
                raise InvalidInputError("cross_grams contains NaN or inf")
        storage = storage_for(path)
        specs = [KernelSpec.precomputed(x) for x in names]

        def fill(group: zarr.Group) -> None:
            stats = np.empty((M, 4))
            sums = np.empty(M, dtype=np.uint32)
            for m in range(M):
                stored = (gram(m) * factors[m]).astype(dt)
                group["gram"][m] = stored
                *stats[m, :3], sums[m] = kernel_stats(stored)
            for k, name in enumerate(("trace", "fro", "lambda_max")):
                group[name][:] = stats[:, k]
            group["norm_factor"][:] = np.asarray(factors)
            group["checksum"][:] = sums
            group["meta_checksum"][:] = meta_checksums(group)
            if crosses is not None:
                scaled = (crosses * np.asarray(factors)[:, None, None]).astype(dt)
                group.create_array("cross_gram", data=scaled, chunks=(1,) + scaled.shape[1:], compressors=None)
            group["complete"][:] = True

        attrs = {"normalize": normalize, "standardization": None, "train_rows": list(range(n)),
                 "fingerprint": None, "source": "from_arrays", "created": creation_info()}
        refuse_target(storage, overwrite, None)  # refused input leaves everything as it was, the lock file too
        # the whole new store is written beside any old one (swapped in at the end): all of it must fit
        check_fits(storage, M, n, dt.name, n_cross=0 if crosses is None else crosses.shape[1], chunk_mb=chunk_mb,
                   shard_mb=shard_mb, action="create", spelling="import")
        with storage.writer("import (from_arrays)", wait) as target:
            action = prepare_path(target, overwrite=overwrite, fingerprint=None)
            target.create_group(specs=specs, n=n, dtype=dt, attrs=attrs, X=None, chunk_mb=chunk_mb,
                                shard_mb=shard_mb, fill=fill, replace=action == "replace")
        return cls.open(storage.unfenced())

    # ---- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r", storage_options: dict | None = None) -> KernelBank:
        """Open an existing bank (mode "r" or "r+") at a path or an s3:// URL (``storage_options``
        override the AWS_* environment variables); errors say what is wrong with the path."""
        storage = storage_for(path, storage_options)
        bank = cls(storage, storage.open_bank_group(mode))  # NotABankError saying what to give instead
        bank._mode = mode
        return bank

    @staticmethod
    def is_bank(path: str | os.PathLike) -> bool:
        return storage_for(path).is_bank()

    # ---- sizes and metadata -------------------------------------------------------------------
    def __len__(self) -> int:
        return self.M

    def __repr__(self) -> str:
        factor = "" if self.rank is None else f", representation='factor', rank={self.rank}"
        factor = factor if self.stores_kernels else ", representation='computed'"
        return f"KernelBank({str(self.path)!r}, M={self.M}, n={self.n}, dtype={self.dtype}, normalize={self.normalize}{factor})"

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def attrs(self) -> dict:
        return dict(self._attrs)

    @property
    def nbytes(self) -> int:
        return self.M * self._kernel_bytes

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

    def expected_checksum(self, m: int, fresh: bool = False) -> int:
        """Kernel m's recorded crc32c, from a copy read once per bank object (the passes' integrity
        check, ``engine.reader``); ``fresh`` reads it again (a build or repair recorded more since)."""
        sums = getattr(self, "_expected_sums", None)
        if sums is None or fresh:
            sums = self._expected_sums = self.checksums
        return int(sums[m])

    @property
    def features(self) -> StoredFeatures | None:
        """The standardised training features by checked column chunks (``features.StoredFeatures``),
        or None for banks imported from Gram matrices."""
        if self._features is None and "X" in self._group:
            self._features = StoredFeatures(self._group, self._attrs, str(self.path))
        return self._features

    @property
    def X_train(self) -> np.ndarray | None:
        """Standardised training features (n, d) float64, whole, or None for banks imported from Gram
        matrices; every column chunk checked against the crc32c recorded at creation (``X_chunks``;
        banks from before it: the whole X against ``X_checksum``, or unchecked). What needs a few
        features reads them with ``_features_for`` instead."""
        return None if self.features is None else self.features.all()

    def _features_for(self, specs: Sequence[KernelSpec]) -> tuple[np.ndarray, list[KernelSpec]]:
        """(Xs, local): the standardised columns the kernels ``specs`` use, float64 C-contiguous (n, k)
        in increasing column order, and ``specs`` re-indexed to those columns (``features.subset``;
        ``fill_block(local, Xs, ...)`` gives the bytes of ``fill_block(specs, X_train, ...)``). Only
        their column chunks are read (checked, a small per-bank cache); a run of kernels using all
        features or most of them gets the whole X, read once per bank object."""
        feats = self.features
        if feats is None:
            raise SpecError(f"bank {self.path} holds no features to compute its kernels from")
        cols, local = subset(specs, feats.shape[1])
        if cols is not None:
            return feats.columns(cols), local
        if self._Xs is None:
            self._Xs = feats.all()
        return self._Xs, local

    @property
    def standardization(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, scale) (d,) float64 of the training standardisation (X - mean) / scale, or None.
        Stored as the arrays X_mean and X_scale; banks from before them hold both in the attribute."""
        std = self._attrs.get("standardization")
        if std is None:
            return None
        if "arrays" in std:
            return tuple(np.asarray(self._group[name][:], dtype=np.float64) for name in std["arrays"])
        return np.asarray(std["mean"], dtype=np.float64), np.asarray(std["scale"], dtype=np.float64)

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

    #: ``kernel(m, materialize=True)`` on a factor bank refuses n x n float64 matrices above this.
    MATERIALIZE_LIMIT = 2**30

    def kernel(self, m: int, materialize: bool = False) -> np.ndarray:
        """Kernel m as an (n, n) array of the stored dtype. A factor bank refuses (its kernels are
        not stored) unless ``materialize``: then K~_m = L_m L_m^T in float64, up to 1 GiB."""
        m = self._check_index(m)
        if self.representation != "factor":
            return self._stored([m])[0]
        if not materialize:
            raise InvalidInputError(self._factor_message("stores no n x n kernels"))
        if self.n * self.n * 8 > self.MATERIALIZE_LIMIT:
            raise InvalidInputError(f"kernel {m} of {self.path} would be an n x n = {self.n} x {self.n} float64 matrix "
                                    f"({self.n * self.n * 8 / 2**30:.1f} GiB > 1 GiB); work with its factor "
                                    "bank.factor(m) (n x r) instead")
        L = self.factor(m).astype(np.float64)
        return L @ L.T

    def kernels(self, idx: Sequence[int]) -> np.ndarray:
        """Kernels idx as a (len(idx), n, n) array of the stored dtype, in the order given (dense banks)."""
        if self.representation == "factor":
            raise InvalidInputError(self._factor_message("stores no n x n kernels"))
        return self._stored(idx)

    def _stored(self, idx: Sequence[int]) -> np.ndarray:
        idx = [self._check_index(m) for m in idx]
        if not idx:
            return np.empty((0,) + self.block_shape, self.dtype)
        if not self.stores_kernels:
            return self.compute_kernels(idx)
        return self._data.get_orthogonal_selection((np.asarray(idx), slice(None), slice(None)))

    def compute_kernels(self, idx: Sequence[int], out: np.ndarray | None = None) -> np.ndarray:
        """Kernels idx (in the order given) computed from the bank's stored features with its
        normalisation and the kernel arithmetic version it recorded (``_compute.ARITHMETIC``), as
        (len(idx), n, n) of the bank's dtype (into ``out`` when given): the bytes a build stores
        (``shards.fill_block``), whatever the bank stores."""
        arithmetic = self._arithmetic()
        if out is None:
            out = np.empty((len(idx), self.n, self.n), self.dtype)
        Xs, local = self._features_for([self.specs[int(m)] for m in idx])
        fill_block(local, Xs, self.normalize, out, arithmetic)
        return out

    def compute_quad_forms(self, idx: Sequence[int], U: np.ndarray, each: bool = False) -> np.ndarray:
        """u^T K_m u for kernels idx computed as ``compute_kernels`` computes them (the same values) and
        reduced on their upper triangles at once, never held whole (``shards.quad_block``): (len(idx), k)
        for U (k, n), (len(idx),) with ``each`` (U (len(idx), n))."""
        Xs, local = self._features_for([self.specs[int(m)] for m in idx])
        return quad_block(local, Xs, self.normalize, self.dtype, U, each, self._arithmetic())

    def _arithmetic(self) -> int:
        """The kernel arithmetic version the bank recorded (``_compute.ARITHMETIC``), one this mklscale computes."""
        arithmetic = int(self._attrs.get("arithmetic", 1))
        if arithmetic not in _compute.ARITHMETICS:
            raise BankMismatchError(
                f"bank {self.path} records kernel arithmetic version {arithmetic}, which this mklscale does not "
                f"compute (it knows {', '.join(map(str, _compute.ARITHMETICS))}); read it with the newer mklscale "
                "that created it")
        return arithmetic

    # ---- factor banks -------------------------------------------------------------------------
    def _require_factor(self, what: str) -> None:
        if self.representation != "factor":
            raise InvalidInputError(f"bank {self.path} is dense (every K_m stored n x n): it has no {what}; "
                                    "build a factor bank with build_bank(..., rank=r)")

    def factor(self, m: int) -> np.ndarray:
        """Factor L_m (n, r) of the stored dtype, K~_m = L_m L_m^T (columns past ``ranks[m]`` are 0)."""
        self._require_factor("factors")
        return self._data[self._check_index(m)]

    def factors(self, idx: Sequence[int]) -> np.ndarray:
        """Factors of kernels idx as a (len(idx), n, r) array of the stored dtype, in the order given."""
        self._require_factor("factors")
        return self._stored(idx)

    def landmarks(self, m: int) -> np.ndarray:
        """Training rows of kernel m's landmarks (int64, without the -1 padding)."""
        self._require_factor("landmarks")
        rows = self._group["landmarks"][self._check_index(m)]
        return rows[rows >= 0]

    def transform(self, m: int) -> np.ndarray:
        """Kernel m's (r, r) float64 transform T_m: L_m(x) = k_m(x, X[landmarks(m)]) T_m[:len(landmarks)]."""
        self._require_factor("transforms")
        return self._group["transform"][self._check_index(m)]

    @property
    def ranks(self) -> np.ndarray:
        """(M,) int32 rank r_m of every factor (factor banks)."""
        self._require_factor("ranks")
        return self._meta("rank")

    @property
    def approx_error(self) -> np.ndarray:
        """(M,) (tr K_m - tr K~_m) / tr K_m before normalisation: the relative trace-norm error (factor banks)."""
        self._require_factor("approximation errors")
        return self._meta("approx_error")

    @property
    def exact_trace(self) -> np.ndarray:
        """(M,) tr K_m of the exact, unnormalised kernels (factor banks)."""
        self._require_factor("exact traces")
        return self._meta("exact_trace")

    def approximation_summary(self, worst: int = 5) -> dict:
        """min / median / max of a factor bank's ``approx_error`` over its complete kernels, and the
        ``worst`` kernels as (index, name, error), largest first (all None / [] before any is built)."""
        err = np.where(self.complete, self.approx_error, np.nan)
        ok = np.flatnonzero(np.isfinite(err))
        if not ok.size:
            return {"min": None, "median": None, "max": None, "worst": []}
        order = ok[np.argsort(-err[ok], kind="stable")][:worst]
        return {"min": float(err[ok].min()), "median": float(np.median(err[ok])), "max": float(err[ok].max()),
                "worst": [(int(m), self.specs[m].name, float(err[m])) for m in order]}

    @property
    def factor_settings(self) -> dict | None:
        """How the factors were built (method, landmarks, eig_cutoff, tol, seed); None if dense."""
        return None if self.rank is None else dict(self._attrs.get("factor") or {})

    def cross_factor(self, X_new: np.ndarray, kernels: Sequence[int] | None = None) -> np.ndarray:
        """L_m(X_new) (len(kernels), n_new, r) float64 for raw features X_new, through each kernel's
        landmarks and transform with the training normalisation (``factor.factor_rows``), so that
        K~_m(X_new, X_train) = L_m(X_new) L_m^T. ``cross_factor(X_train_raw)`` reproduces the factors
        (to the stored dtype's rounding)."""
        self._require_factor("cross factors")
        idx = list(range(self.M)) if kernels is None else [self._check_index(m) for m in kernels]
        Xs = self.standardize(X_new)
        Xt = self.X_train
        out = np.empty((len(idx), Xs.shape[0], self.rank))
        for k, m in enumerate(idx):
            out[k] = factor_rows(self.specs[m], Xs, Xt[self.landmarks(m)], self.transform(m),
                                 self.normalize == "diag")
        return out

    @property
    def n_shards(self) -> int:
        return -(-self.M // self.kernels_per_shard)

    def shard_range(self, s: int) -> tuple[int, int]:
        """Kernel indices [first, stop) held by shard s."""
        first = s * self.kernels_per_shard
        return first, min(first + self.kernels_per_shard, self.M)

    def shard_key(self, s: int) -> str:
        """The key of shard s in the bank's storage (zarr's default chunk key encoding)."""
        return shard_format.shard_key(s, data_array_name(self.representation))

    def shard_file(self, s: int) -> Path:
        """The file holding shard s of a bank in a folder."""
        if not self.storage.mappable:
            raise InvalidInputError(f"bank {self.path} is not in a folder: its shards are objects, not files")
        return shard_format.shard_path(self.path, s, data_array_name(self.representation))

    def _shard_raw(self, s: int) -> np.ndarray | None:
        """The bytes of shard s's file or object (uint8), None when there is none."""
        return self.storage.read(self.shard_key(s))

    @property
    def shard_index_bytes(self) -> int:
        """Bytes at the end of every shard file: the (offset, nbytes) index and its crc32c."""
        return shard_format.index_nbytes(int(self._attrs["layout"]["kernels_per_chunk"]), self.kernels_per_shard)

    def chunk_offsets(self, s: int, file_size: int, tail: bytes) -> np.ndarray:
        """Byte offsets (int64) of the inner chunks of shard s, from the file's last
        ``shard_index_bytes`` bytes ``tail``, after checking the index's crc32c and that every chunk
        holding kernels of the bank is present, full size and inside the file
        (``shard_format.chunk_offsets``).

        Raises BankCorruptError naming the shard and its kernels otherwise.
        """
        first, stop = self.shard_range(s)
        return shard_format.chunk_offsets(
            tail, file_size, n_kernels=stop - first, per_chunk=int(self._attrs["layout"]["kernels_per_chunk"]),
            per_shard=self.kernels_per_shard, kernel_bytes=self._kernel_bytes,
            where=f"shard {s} of {self.path} (kernels {first}..{stop - 1})")

    def read_shard(self, s: int) -> np.ndarray:
        """All kernels of shard s as one (stop - first, *block_shape) array of the stored dtype.

        Uncompressed banks are read with one plain file read and viewed through the shard index
        (zarr's generic sharded read costs several times the bytes it reads); anything else goes
        through zarr. Raises BankCorruptError when the shard file is truncated or its index is
        damaged. Unwritten chunks read as zeros (zarr's fill value).
        """
        first, stop = self.shard_range(s)
        if not self.stores_kernels:
            return self.compute_kernels(range(first, stop))
        if not self.plain_layout:
            return self._data[first:stop]
        shape = self.block_shape
        raw = self._shard_raw(s)
        if raw is None:
            return np.zeros((stop - first,) + shape, self.dtype)
        offsets = self.chunk_offsets(s, raw.size, raw[raw.size - self.shard_index_bytes:].tobytes())
        C = int(self._attrs["layout"]["kernels_per_chunk"])
        chunk_bytes = C * self._kernel_bytes
        if np.array_equal(offsets, np.arange(len(offsets)) * chunk_bytes):
            return raw[: len(offsets) * chunk_bytes].view(self.dtype).reshape((-1,) + shape)[: stop - first]
        out = np.empty((len(offsets) * C,) + shape, self.dtype)
        for c, off in enumerate(offsets):
            out[c * C:(c + 1) * C] = raw[off:off + chunk_bytes].view(self.dtype).reshape((C,) + shape)
        return out[: stop - first]

    @property
    def plain_layout(self) -> bool:
        """True when the shard files have the plain byte layout of ``shard_format`` (raw
        little-endian inner chunks, the index at the end with a crc32c; every bank ``build_bank``
        or ``from_arrays`` writes): then they can be read directly, as ``read_shard`` and the
        engine's reader (``mklscale.engine.reader``) do, instead of through zarr. False for a
        computed bank (no shards)."""
        return self.stores_kernels and shard_format.is_plain(self._data, self.dtype)

    def to_xarray(self):
        """A lazily indexed xarray DataArray (kernel, i, j) with per-kernel coordinates; a factor
        bank's is its factors (kernel, i, rank), named "factor", with rank and approx_error coords."""
        import dask.array as da
        import xarray as xr

        if not self.stores_kernels:
            raise InvalidInputError(f"bank {self.path} is a computed bank: it stores no kernels to view lazily; "
                                    "compute the ones you need with bank.kernels(idx)")
        data = da.from_zarr(self._data)
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
        factor = self.representation == "factor"
        if factor:
            coords.update({"kernel_rank": ("kernel", self.ranks), "approx_error": ("kernel", self.approx_error)})
        return xr.DataArray(data, dims=("kernel", "i", "rank" if factor else "j"), coords=coords,
                            name=data_array_name(self.representation),
                            attrs={"normalize": str(self.normalize), "path": str(self.path),
                                   "representation": self.representation})

    # ---- integrity (``integrity``) ---------------------------------------------------------------
    def verify(self, kernels: Sequence[int] | None = None, threads: int = 4, progress: bool = False,
               mark_bad: bool = True, wait: bool | float = True) -> VerifyReport:
        """``integrity.verify`` of this bank: re-read kernels and compare their crc32c, record bad ones."""
        return integrity.verify(self, kernels, threads, progress, mark_bad, wait)

    def repair(self, kernels: Sequence[int] | None = None, client=None, progress: bool = True,
               wait: bool | float = True):
        """``integrity.repair`` of this bank: recompute bad or unfinished kernels from their specs;
        returns its ``RepairReport``."""
        return integrity.repair(self.storage, type(self).open, kernels, client, progress, wait)

    def reload(self) -> None:
        """Re-read the group's metadata (attributes written through another handle)."""
        self._group = self.storage.open_group(self._mode)
        self._attrs = self._group.attrs.asdict()
        self._data = self._group[data_array_name(self.representation)] if self.stores_kernels else None
        self._features, self._Xs = None, None

    @property
    def group(self) -> zarr.Group:
        """The bank's zarr group (its arrays and attributes), opened in the bank's mode."""
        return self._group

    # ---- cross kernels ------------------------------------------------------------------------
    def standardize(self, X: np.ndarray) -> np.ndarray:
        """Apply the training standardisation recorded at build time to raw features X."""
        X = validate_features(X, "X_new")
        std = self.standardization
        d = self._group["X"].shape[1] if "X" in self._group else None
        if d is not None and X.shape[1] != d:
            raise InvalidInputError(f"X_new has {X.shape[1]} feature(s) but the bank was built on {d}")
        if std is None:
            return X
        return (X - std[0]) / std[1]

    def cross(self, X_new: np.ndarray | None, kernels: Sequence[int] | None = None) -> np.ndarray:
        """K_m(X_new, X_train) with exactly the training normalisation: (len(kernels), n_new, n) float64.
        Dense banks only: a factor bank refuses and names ``cross_factor``.

        For banks imported with ``from_arrays``, pass ``X_new=None`` to get the stored cross kernels.
        ``cross(X_train_raw)`` reproduces the bank (to the stored dtype's rounding).
        """
        if self.representation == "factor":
            raise InvalidInputError(f"bank {self.path} is a factor bank: its cross kernels are K~_m(X_new, X_train) "
                                    "= L_m(X_new) L_m^T; compute L_m(X_new) with bank.cross_factor(X_new, kernels) "
                                    "and multiply by bank.factor(m).T (only for the few kernels you need)")
        idx = list(range(self.M)) if kernels is None else [self._check_index(m) for m in kernels]
        if X_new is None:
            if "cross_gram" not in self._group:
                raise InvalidInputError(f"bank {self.path} stores no cross kernels; pass X_new (raw features)")
            return self._group["cross_gram"].get_orthogonal_selection((np.asarray(idx, dtype=np.int64), slice(None), slice(None))).astype(np.float64)
        if "X" not in self._group:
            raise SpecError(f"bank {self.path} was imported from Gram matrices and holds no features; "
                            "it cannot compute cross kernels for new data (import them with cross_grams=)")
        Xs = self.standardize(X_new)
        out = np.empty((len(idx), Xs.shape[0], self.n))
        for k, K in cross_kernels([self.specs[m] for m in idx], Xs, self.X_train, self.normalize, self.norm_factor[idx]):
            out[k] = K
        return out


def _param_column(specs: list[KernelSpec], name: str) -> np.ndarray:
    return np.array([float(dict(s.params).get(name, np.nan)) for s in specs])


def prepare_path(path, overwrite: bool, fingerprint: str | None) -> str:
    """Decide what to do with the target ``path`` (a location or a ``Storage``; call it holding the
    writer lock, ``writing``): "resume" when an existing bank with the same fingerprint should be
    resumed, "replace" when an existing bank is to be replaced (``overwrite``; ``create_group(...,
    replace=True)`` swaps the new store in, so readers never see a half-deleted one), "create" when
    there is nothing yet. Refuses anything else that exists (a folder or prefix that is not a bank
    is never deleted). ``Storage.prepare``."""
    return storage_for(path).prepare(overwrite, fingerprint, KernelBank.open)


def refuse_target(path, overwrite: bool, fingerprint: str | None) -> str:
    """What ``prepare_path`` will do with ``path`` ("create", "resume" or "replace"), or the error it
    will raise (NotABankError, BankMismatchError, BankCorruptError), found without writing anything:
    builds call it before they take the writer lock too, so that input refused here leaves even the
    lock file untouched. ``Storage.refuse_target``."""
    return storage_for(path).refuse_target(overwrite, fingerprint, KernelBank.open)
