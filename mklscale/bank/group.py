"""The bank's zarr v3 group: what arrays and attributes it holds, creating it, recognising it.

Layout of a bank (see docs/design.md, "The bank on disk")::

    gram         (M, n, n) float32|float64, chunks of whole kernels, sharded, uncompressed
                 (the shard files' bytes: ``shard_format``)
    X            (n, d) float64  standardised training features (banks built from features)
    cross_gram   (M, n_cross, n) optional cross kernels imported with ``from_arrays``
    complete     (M,) bool      data of kernel m is on disk (set only after the write)
    trace, fro, lambda_max, norm_factor  (M,) float64  of the STORED (normalised) matrix
    checksum     (M,) uint32    crc32c of kernel m's stored bytes (C order, little endian)
    spec         (M,) str       the kernel's KernelSpec as JSON
    attrs        schema, n, M, dtype, normalize, standardisation, train_rows, fingerprint, layout, created,
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
from mklscale.errors import SchemaVersionError

SCHEMA_VERSION = 1
#: The per-kernel float64 statistics a bank records (``stats.kernel_stats``).
PER_KERNEL_FLOATS = ("trace", "fro", "lambda_max", "norm_factor")


def layout_for(M: int, n: int, itemsize: int, chunk_mb: float = 16, shard_mb: float = 64) -> tuple[int, int]:
    """(kernels per chunk, kernels per shard): whole kernels per chunk, about chunk_mb a chunk,
    and a whole number of chunks per shard of about shard_mb (so 10k kernels are ~100s of files)."""
    kernel_bytes = n * n * itemsize
    per_chunk = int(max(1, min(M, chunk_mb * 2**20 // kernel_bytes)))
    chunks_per_shard = int(max(1, shard_mb * 2**20 // (per_chunk * kernel_bytes)))
    per_shard = min(per_chunk * chunks_per_shard, -(-M // per_chunk) * per_chunk)
    return per_chunk, per_shard


def open_bank_group(path: Path, mode: str) -> zarr.Group | None:
    """The bank's group at ``path`` opened in ``mode``; None when ``path`` holds no bank. Raises
    SchemaVersionError for a bank written with a newer schema than this mklscale reads."""
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
