"""Build a kernel bank from features and specs as Dask tasks: resumable, normalised, safe to kill.

The shards are computed and written by ``shards.compute_shards`` (one task per shard; only the
driver writes per-kernel metadata, and it marks a kernel complete only after the task that wrote its
data has returned). A build killed at any moment therefore leaves complete kernels intact and, run
again with the same arguments, recomputes exactly the unfinished shards. ``repair_bank``
(``KernelBank.repair``, ``integrity.repair``) reuses the same tasks to recompute shards holding
kernels that ``verify`` found bad.

Builds and repairs hold the bank's writer lock (``Storage.writer``: ``writer_lock``, ``objlock``) from before
they look at the path until they return, so one process writes a bank at a time. Shard tasks get
the bank's absolute path; on a cluster every worker must first show that it sees the driver's
folder (``runtime.cluster.require_shared_folder``), and a task never creates a bank folder.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Sequence

import numpy as np

from mklscale.bank import _compute, integrity
from mklscale.bank import factor as factor_math
from mklscale.bank.group import creation_info, json_attr
from mklscale.bank.features import as_source, fingerprint_rows, scan, write_columns
from mklscale.bank.inputs import NORMALIZATIONS, validate_dtype
from mklscale.bank.integrity import RepairReport
from mklscale.bank.shards import compute_shards, unfinished_shards
from mklscale.bank.size import check_fits
from mklscale.bank.spec import KernelSpec, hash_specs_json
from mklscale.bank.storage import storage_for
from mklscale.bank.store import KernelBank, prepare_path, refuse_target
from mklscale.errors import InvalidInputError, SpecError


def build_bank(
    X,
    specs: Sequence[KernelSpec],
    path: str | os.PathLike,
    normalize: str | None = "trace",
    dtype: str = "float32",
    client=None,
    overwrite: bool = False,
    standardize: bool = True,
    row_ids: Sequence[int] | None = None,
    chunk_mb: float = 16,
    shard_mb: float = 64,
    progress: bool = True,
    flush_every_s: float = 2.0,
    rank: int | None = None,
    method: str = factor_math.FactorSettings.method,
    landmarks: str = factor_math.FactorSettings.landmarks,
    tol: float = factor_math.FactorSettings.tol,
    seed: int = factor_math.FactorSettings.seed,
    max_error: float = factor_math.MAX_ERROR,
    wait: bool | float = True,
    storage_options: dict | None = None,
    computed: bool = False,
) -> KernelBank:
    """Compute K_m(X, X) for every spec and store them as a bank at ``path``.

    ``computed=True``: a computed bank (issue 31): no kernel is stored, only the standardised features,
    the specs and each kernel's statistics and checksum (one streaming pass now); every pass computes
    the kernels again from the features inside its tasks (``shards.fill_block``: the same bytes a
    stored bank holds). For many kernels over few rows (one or a few kernels per feature at genomics
    scale), where the kernels cost more to store than to compute. Not with ``rank``.

    ``rank=None``: a dense bank, every K_m stored n x n. ``rank=r``: a factor bank, every kernel
    stored as L_m (n x r) with K~_m = L_m L_m^T, by ``method`` "nystrom" (r landmarks chosen by
    ``landmarks`` "kmeans++", "uniform" or "rls" (ridge leverage scores), from ``seed`` and the kernel's
    index) or "cholesky"
    (pivoted incomplete Cholesky to relative residual trace ``tol`` or rank r); formulas in
    ``mklscale.bank.factor``. Normalisation applies to K~_m. A factor bank whose largest relative
    trace error (tr K - tr K~) / tr K exceeds ``max_error`` warns (UserWarning) naming the worst
    kernels.

    X is raw (n x d): an array, a zarr array or the path of a ``.npy`` file, read by column blocks
    (``features``: X is never held whole, nor converted whole to float64); with ``standardize`` every
    column is centred and scaled to unit variance (constant columns are only centred) and the
    transform is recorded so cross kernels on new data match. The bank stores the standardised X in
    chunks of whole columns with a crc32c each; a computed bank's tasks read only the chunks of the
    features their kernels use. ``normalize``: "trace" (K / trace K, unit trace as in SimpleMKL/SpicyMKL), "diag"
    (K_ij / sqrt(K_ii K_jj)) or None. ``client``: a ``distributed.Client`` to run the tasks on,
    or None for Dask's threaded scheduler in this process.

    If ``path`` holds a bank built with the same X, specs and settings, the build resumes: only
    unfinished kernels are computed. A bank built from anything else is refused unless
    ``overwrite=True``. Completion flags are written every ``flush_every_s`` seconds and at the
    end (0 = after every shard). Returns the opened bank; its ``last_build_computed`` says how many
    kernels this call computed.

    A bank larger than the free space of its disk (``size.check_fits``: the bytes still to write, for
    a resumed bank) raises BankTooLargeError (an InvalidInputError naming the size, the free space
    and the remedies with their sizes) before anything is computed or written. A store that cannot
    be written raises ReadOnlyStoreError before any task runs. A disk that
    fills up mid-build raises DiskFullError: shards are written whole (temporary file + rename), so
    the kernels already flagged complete stay intact, no partial shard is left or flagged, and the
    same call resumes once there is room (or after moving the bank elsewhere).

    One process writes a bank at a time: the build holds the bank's writer lock (``writer_lock``)
    from before it looks at ``path`` until it returns. ``wait``: True (default) waits for another
    writer of the same bank to finish, saying once on stderr which process it is; False raises
    BankLockedError naming it (pid and host) at once, a number after that many seconds. Two equal
    builds started together therefore compute the kernels once: the second resumes the finished bank.
    """
    source = as_source(X, "X")
    n, d = source.shape
    specs = _validate_specs(specs, d)
    factor = None if rank is None else factor_math.settings(rank, method, landmarks, tol, seed, n)
    if computed and factor is not None:
        raise InvalidInputError("computed=True computes every kernel from the features in each pass and stores "
                                "none; rank= stores factors: choose one (computed=True for many kernels over few rows, "
                                "rank=r for many rows)")
    if normalize not in NORMALIZATIONS:
        raise InvalidInputError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    dt = validate_dtype(dtype)
    rows = list(range(n)) if row_ids is None else [int(r) for r in row_ids]
    if len(rows) != n:
        raise InvalidInputError(f"row_ids has {len(rows)} entries but X has {n} rows; pass one id per "
                                "row of X, or row_ids=None")

    found = scan(source, standardize)  # every value checked, the standardisation: by column blocks
    fingerprint = _fingerprint(source, specs, normalize, dt.name, standardize, rows, factor, computed)
    storage = storage_for(path, storage_options)  # a folder, or s3://bucket/prefix
    action = refuse_target(storage, overwrite, fingerprint)  # refused input leaves everything as it was, the lock file too
    # a bank that would not fit its disk is refused here, before the lock file or anything else is written
    check_fits(storage, len(specs), n, dt.name, None if factor is None else factor.rank, n_features=d,
               chunk_mb=chunk_mb, shard_mb=shard_mb, action=action, computed=computed)
    # one writer per bank (``writer_lock``; ``objlock`` on an object store, whose writes go through the fenced URL)
    with storage.writer("build", wait) as target:
        action = prepare_path(target, overwrite=overwrite, fingerprint=fingerprint)
        if action != "resume":
            attrs = {
                "normalize": normalize,
                "train_rows": rows,
                "fingerprint": fingerprint,
                "source": "build_bank",
                "arithmetic": _compute.ARITHMETIC,
                "created": creation_info(),
            }
            if factor is not None:
                attrs["factor"] = json_attr(factor.to_attrs())

            def write_X(group):  # the standardised features, a column chunk at a time (``features``)
                return write_columns(group, source, found, chunk_mb)

            kw = dict(specs=specs, n=n, dtype=dt, attrs=attrs, X=write_X, chunk_mb=chunk_mb, shard_mb=shard_mb,
                      rank=None if factor is None else factor.rank, computed=bool(computed))
            target.create_group(replace=action == "replace", **kw)

        bank = KernelBank.open(target)
        done = bank.complete
        bank.last_build_computed = 0  # kernels computed by this call (tests check resumption with it)
        if not done.all():
            del bank  # one opened bank (its specs) at a time
            bank = KernelBank.open(target, mode="r+")  # ReadOnlyStoreError here, before any task runs
            # a computed bank's tasks read the features they need from the bank; stored kernels get X whole
            Xs = None if computed else bank.X_train
            bank.last_build_computed = compute_shards(bank, specs, Xs, unfinished_shards(done, bank.kernels_per_shard),
                                                       keep=done, client=client, progress=progress,
                                                       flush_every_s=flush_every_s)
    if target.unfenced() is not target:  # the caller's bank is not fenced by a lock it no longer holds
        computed, bank = bank.last_build_computed, KernelBank.open(target.unfenced())
        bank.last_build_computed = computed
    if factor is not None:
        _warn_approximation(bank, max_error)
    return bank


def approximation_warning(bank: KernelBank, max_error: float) -> str | None:
    """The message of a factor bank whose largest relative trace error exceeds max_error, else None."""
    summary = bank.approximation_summary()
    if summary["max"] is None or summary["max"] <= max_error:
        return None
    worst = ", ".join(f"{m} {name} ({e:.3g})" for m, name, e in summary["worst"] if e > max_error)
    return (f"factor bank {bank.path}: relative trace error (tr K - tr K~) / tr K up to {summary['max']:.3g} > "
            f"max_error={max_error:g} (median {summary['median']:.3g}); worst kernels: {worst}; raise the rank, "
            "or use method='cholesky' with a tolerance (tol) so each kernel gets the rank it needs")


def _warn_approximation(bank: KernelBank, max_error: float) -> None:
    message = approximation_warning(bank, max_error)
    if message:
        warnings.warn(message, UserWarning, stacklevel=3)


# ---- helpers -------------------------------------------------------------------------------------
def _validate_specs(specs, n_features: int) -> list[KernelSpec]:
    specs = list(specs)
    if not specs:
        raise SpecError("no kernel specs given; use mklscale.bank.families to make some")
    for s in specs:
        if not isinstance(s, KernelSpec):
            raise SpecError(f"expected KernelSpec objects, got {type(s).__name__}: {s!r}")
        if s.family == "precomputed":
            raise SpecError("precomputed specs cannot be built from features; use KernelBank.from_arrays")
        s.check_features(n_features)
    return specs


def _fingerprint(source, specs, normalize, dtype: str, standardize: bool, rows, factor=None,
                 computed: bool = False) -> str:
    """sha256 of X's shape and C-order float64 bytes (``features.fingerprint_rows``: by row blocks, the
    digest of ``X.tobytes()``), the specs and the settings: what a resumed build must match."""
    h = hashlib.sha256()
    h.update(repr(source.shape).encode())
    fingerprint_rows(h, source)
    hash_specs_json(h, specs)  # = h.update(specs_to_json(specs).encode()), in batches
    h.update(repr((normalize, dtype, bool(standardize))).encode())
    h.update(np.asarray(rows, dtype=np.int64).tobytes())
    if factor is not None:  # dense banks keep the fingerprint they always had
        h.update(repr(sorted(((k, v) for k, v in vars(factor).items()))).encode())
    if computed:
        h.update(b"computed")
    return h.hexdigest()


def repair_bank(bank, kernels: Sequence[int] | None = None, client=None, progress: bool = True,
                wait: bool | float = True) -> RepairReport:
    """``KernelBank.repair`` of the bank at ``bank`` (a ``KernelBank`` or its path): ``integrity.repair``."""
    target = bank.storage if isinstance(bank, KernelBank) else storage_for(bank)
    return integrity.repair(target, KernelBank.open, kernels, client, progress, wait)
