"""The bank's zarr v3 group: what arrays and attributes it holds, creating it, recognising it.

Layout of a bank (see docs/design.md, "The bank on disk")::

    gram         (M, n, n) float32|float64, chunks of whole kernels, sharded, uncompressed
                 (the shard files' bytes: ``shard_format``); a dense bank (attrs representation "dense",
                 or none for banks written before factor banks existed)
    factor       (M, n, r) instead of ``gram`` in a factor bank (representation "factor"): L_m with
                 K~_m = L_m L_m^T, zero columns past the kernel's rank r_m; same chunking and shard bytes
    rank         (M,) int32      r_m (factor banks)
    landmarks    (M, r) int64    training rows of kernel m's landmarks, -1 padded (factor banks)
    transform    (M, r, r) float64  T_m: L_m(x) = k_m(x, X[landmarks_m]) T_m (factor banks; ``factor``)
    approx_error, exact_trace  (M,) float64  (tr K_m - tr K~_m) / tr K_m and tr K_m, before normalisation
    X            (n, d) float64  standardised training features (banks built from features), uncompressed,
                 in chunks of whole columns (n, c) with each chunk's crc32c (``features``, attribute
                 X_chunks); banks written before: one chunk, its crc32c in the attribute X_checksum
    X_mean, X_scale  (d,) float64  the standardisation (X - mean) / scale (banks built with it; before
                 these arrays, the attribute standardization held both as lists)
    cross_gram   (M, n_cross, n) optional cross kernels imported with ``from_arrays``
    complete     (M,) bool      data of kernel m is on disk (set only after the write)
    trace, fro, lambda_max, norm_factor  (M,) float64  of the STORED (normalised) matrix (factor banks:
                 of K~_m = L_m L_m^T, from the r x r matrix L_m^T L_m)
    checksum     (M,) uint32    crc32c of kernel m's stored bytes (C order, little endian)
    spec         (M,) str       the kernel's KernelSpec as JSON
    attrs        schema, n, M, dtype, normalize, representation, rank, factor (method, landmarks,
                 eig_cutoff, tol, seed), standardisation, train_rows, fingerprint, layout, created,
                 arithmetic (``_compute.ARITHMETIC`` of build_bank's kernels), integrity (what the last
                 ``verify`` found bad; see ``store``, "Integrity")

``create_bank_group`` creates it atomically (the arrays, no kernel data yet), ``open_bank_group``
opens a folder that holds one (and refuses a newer schema).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import zarr

from mklscale.bank.fs_errors import raise_store_error
from mklscale.bank.spec import KernelSpec
from mklscale.errors import InvalidInputError, SchemaVersionError
from mklscale.runtime.atomic import swap_into_place

SCHEMA_VERSION = 1
#: The per-kernel float64 statistics a bank records (``stats.kernel_stats``).
PER_KERNEL_FLOATS = ("trace", "fro", "lambda_max", "norm_factor")
#: The per-kernel arrays only a factor bank has (written by the driver with the statistics).
FACTOR_META = ("rank", "landmarks", "transform", "approx_error", "exact_trace")


#: How a bank holds its kernels: every K_m stored (n x n), its factor L_m stored (n x r), or nothing
#: stored and every kernel computed from the features X in each pass ("computed", issue 31).
REPRESENTATIONS = ("dense", "factor", "computed")


def data_array_name(representation: str) -> str:
    """The array holding the kernels as stored: ``gram`` (dense) or ``factor``."""
    return "factor" if representation == "factor" else "gram"


def layout_for(M: int, n: int, itemsize: int, chunk_mb: float = 16, shard_mb: float = 64,
               width: int | None = None) -> tuple[int, int]:
    """(kernels per chunk, kernels per shard): whole kernels per chunk, about chunk_mb a chunk,
    and a whole number of chunks per shard of about shard_mb (so 10k kernels are ~100s of files).
    A kernel is n x ``width`` (None: n x n; a factor bank's n x r)."""
    kernel_bytes = n * (n if width is None else int(width)) * itemsize
    per_chunk = int(max(1, min(M, chunk_mb * 2**20 // kernel_bytes)))
    chunks_per_shard = int(max(1, shard_mb * 2**20 // (per_chunk * kernel_bytes)))
    per_shard = min(per_chunk * chunks_per_shard, -(-M // per_chunk) * per_chunk)
    return per_chunk, per_shard


def open_bank_group(path, mode: str, store=None) -> zarr.Group | None:
    """The bank's group at ``path`` opened in ``mode``; None when ``path`` holds no bank. Raises
    SchemaVersionError for a bank written with a newer schema than this mklscale reads. ``store``:
    the zarr store to open instead of the folder ``path`` (a bank on an object store or in memory: ``storage.keyed``)."""
    if store is None and not (path / "zarr.json").is_file():
        return None
    try:
        group = zarr.open_group(path if store is None else store, mode=mode)
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
    X,
    chunk_mb: float,
    shard_mb: float,
    fill=None,
    rank: int | None = None,
    computed: bool = False,
    replace: bool = False,
) -> None:
    """Create the bank's group and arrays in a temporary sibling folder and rename it into place,
    so ``path`` either does not exist or holds a well-formed bank. ``fill(group)`` may write data
    (``from_arrays``) before the rename. ``rank``: None for a dense bank (``gram``), r for a factor
    bank (``factor`` (M, n, r) and the arrays of ``FACTOR_META``). ``X``: None, or ``write(group)``
    writing the features (``features.write_columns``; the build's) and returning the attributes it adds.
    ``computed``: no data array at
    all, a computed bank (its kernels computed from ``X`` in every pass). ``replace``: an existing store
    at ``path`` is swapped out for the new one (``runtime.atomic.swap_into_place``) and then
    removed; without it only a missing or empty folder is replaced."""
    M = len(specs)
    width = n if rank is None else int(rank)
    per_chunk, per_shard = layout_for(M, n, dtype.itemsize, chunk_mb, shard_mb, width)
    tmp = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        group = zarr.open_group(tmp, mode="w")
        representation = "computed" if computed else "dense" if rank is None else "factor"
        if not computed:
            group.create_array(data_array_name(representation), shape=(M, n, width), chunks=(per_chunk, n, width),
                               shards=(per_shard, n, width), dtype=dtype, compressors=None, fill_value=0,
                               dimension_names=("kernel", "i", "j" if rank is None else "rank"))
        if rank is not None:
            meta_chunks = (per_shard,)  # one chunk per shard: the driver rewrites only finished shards' chunks
            group.create_array("rank", data=np.zeros(M, dtype=np.int32), chunks=(M,))
            group.create_array("landmarks", data=np.full((M, width), -1, dtype=np.int64),
                               chunks=meta_chunks + (width,))
            group.create_array("transform", data=np.zeros((M, width, width)), chunks=meta_chunks + (width, width))
            for name in ("approx_error", "exact_trace"):
                group.create_array(name, data=np.full(M, np.nan), chunks=(M,))
        group.create_array("complete", data=np.zeros(M, dtype=bool), chunks=(M,))
        for name in PER_KERNEL_FLOATS:
            group.create_array(name, data=np.full(M, np.nan), chunks=(M,))
        group.create_array("checksum", data=np.zeros(M, dtype=np.uint32), chunks=(M,))
        group.create_array("meta_checksum", data=np.zeros(M, dtype=np.uint32), chunks=(M,))
        spec_array = group.create_array("spec", shape=(M,), dtype="str", chunks=(M,))
        spec_array[:] = np.array([s.to_json() for s in specs], dtype=object)
        written = {} if X is None else X(group)
        group.update_attributes({  # one write of zarr.json (attrs.update writes it once per key)
            **attrs,
            **written,  # the stored features' chunk checksums (X_train and every read check them)
            "mklscale": {"kind": "kernel_bank", "schema_version": SCHEMA_VERSION},
            "n": int(n), "M": int(M), "dtype": dtype.name,
            "representation": representation, "rank": None if rank is None else int(rank),
            "layout": {"kernels_per_chunk": per_chunk, "kernels_per_shard": per_shard},
        })
        if fill is not None:
            fill(group)
        if replace and path.exists():
            swap_into_place(tmp, path)
        else:
            os.replace(tmp, path) if not path.exists() else _replace_empty_dir(tmp, path)
    except OSError as exc:
        raise_store_error(path, exc)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _replace_empty_dir(tmp: Path, path: Path) -> None:
    path.rmdir()  # only an empty directory may be replaced; rmdir refuses anything else
    os.replace(tmp, path)


def creation_info() -> dict:
    """When, where and with which versions a bank (or a record in it) was written: ``attrs["created"]``."""
    import datetime
    import platform

    from mklscale import __version__
    return {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mklscale_version": __version__, "host": platform.node(), "python": platform.python_version(),
            "zarr_version": zarr.__version__}


def json_attr(obj) -> dict | list:
    """Round-trip through JSON so attributes hold plain types only."""
    return json.loads(json.dumps(obj))


def refuse_foreign(path, keys: list[str], members) -> None:
    """Refuse to overwrite the bank at ``path`` when its folder or prefix holds ``keys`` that are not
    the bank's (``foreign_keys``; ``members``: its group's arrays): replacing the bank would delete them."""
    foreign = foreign_keys(keys, members)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InvalidInputError(f"{path} holds {len(foreign)} file(s) or object(s) that are not part of the bank "
                                f"({shown}); overwriting the bank would delete them: move them out first, or "
                                "choose another path")


def foreign_keys(keys, members) -> list[str]:
    """The keys (paths relative to the bank, '/'-separated) that are not part of the bank whose group
    has arrays ``members``: anything but the root ``zarr.json``, an array's ``A/zarr.json`` and its
    chunks ``A/c/...`` (and the creation marker of an object-store bank), e.g. a bank nested in the
    folder or a file a user put there. Overwriting a bank must not delete them silently."""
    members = set(members)
    out = []
    for key in keys:
        parts = key.split("/")
        if key in ("zarr.json", ".mklscale-creating"):
            continue
        if parts[0] in members and (parts[1:] == ["zarr.json"] or (len(parts) > 2 and parts[1] == "c")):
            continue
        out.append(key)
    return sorted(out)
