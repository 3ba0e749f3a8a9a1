"""Reading a bank's metadata and checking it against itself before anything trusts it.

``KernelBank`` opens a bank through ``read_metadata``: the attributes (n, M, dtype, layout,
representation, rank), the per-kernel arrays of ``group`` and their shapes and dtypes, and every
spec entry must agree, or ``BankCorruptError`` names what is wrong. Damaged metadata is not
something ``repair`` can fix (it recomputes kernel data from the metadata), so the message says to
rebuild the bank or restore it from a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from mklscale.bank.group import FACTOR_META, PER_KERNEL_FLOATS, REPRESENTATIONS, data_array_name
from mklscale.bank.inputs import DTYPES, NORMALIZATIONS
from mklscale.bank.spec import KernelSpec, specs_from_entries
from mklscale.errors import BankCorruptError


@dataclass
class BankMetadata:
    attrs: dict
    specs: list[KernelSpec]
    data: zarr.Array | None  # None for a computed bank


def read_metadata(path: Path, group: zarr.Group) -> BankMetadata:
    """The checked attributes, specs and data array of the bank ``group`` at ``path``."""
    def fail(what: str) -> BankCorruptError:
        return BankCorruptError(
            f"bank {path} has damaged metadata: {what}; `mklscale bank repair` cannot fix this (it recomputes kernel "
            "data from that metadata): rebuild the bank (build_bank(..., overwrite=True), `mklscale bank build ... "
            "--overwrite`) or restore it from a copy")

    attrs = group.attrs.asdict()
    n, M = attrs.get("n"), attrs.get("M")
    for name, value in (("n", n), ("M", M)):
        if not _int(value) or value <= 0:
            raise fail(f"attribute {name} is {value!r}, not a positive integer")
    if attrs.get("dtype") not in DTYPES:
        raise fail(f"attribute dtype is {attrs.get('dtype')!r}, not one of {DTYPES}")
    if attrs.get("normalize", "missing") not in NORMALIZATIONS:
        raise fail(f"attribute normalize is {attrs.get('normalize', 'missing')!r}, not one of {NORMALIZATIONS}")
    representation = attrs.get("representation") or "dense"
    if representation not in REPRESENTATIONS:
        raise fail(f"attribute representation is {representation!r}, not one of {', '.join(REPRESENTATIONS)}")
    width = n
    if representation == "factor":
        width = attrs.get("rank")
        if not _int(width) or width <= 0:
            raise fail(f"attribute rank of a factor bank is {width!r}, not a positive integer")
    layout = attrs.get("layout") if isinstance(attrs.get("layout"), dict) else {}
    per_chunk, per_shard = layout.get("kernels_per_chunk"), layout.get("kernels_per_shard")
    if not (_int(per_chunk) and _int(per_shard) and 0 < per_chunk <= per_shard and per_shard % per_chunk == 0):
        raise fail(f"attribute layout is {attrs.get('layout')!r}: kernels_per_chunk and kernels_per_shard must be "
                   "positive integers, the second a multiple of the first")

    def values(arr: zarr.Array) -> np.ndarray:
        try:
            return arr[:]
        except Exception as exc:  # a damaged (undecodable, truncated) chunk
            raise fail(f"the array {arr.basename!r} cannot be decoded ({type(exc).__name__}: {exc})") from None

    def array(name: str, shape: tuple, dtype=None) -> zarr.Array:
        try:
            arr = group[name]
        except KeyError:
            raise fail(f"the array {name!r} is missing") from None
        except Exception as exc:  # unknown codec, negative shape, malformed zarr.json
            raise fail(f"the array {name!r} cannot be read ({type(exc).__name__}: {exc})") from None
        if not isinstance(arr, zarr.Array):
            raise fail(f"{name!r} is a group, not an array")
        if tuple(arr.shape) != shape:
            raise fail(f"the array {name!r} has shape {tuple(arr.shape)}, expected {shape} (attributes n={n}, M={M})")
        if dtype is not None and np.dtype(arr.dtype) != np.dtype(dtype):
            raise fail(f"the array {name!r} holds {arr.dtype}, but the attributes say {np.dtype(dtype).name}")
        return arr

    data = None
    if representation == "computed":  # kernels computed from X in every pass: no data array, X required
        if "X" not in group:
            raise fail("the computed bank holds no features X to compute its kernels from")
        if data_array_name("dense") in group:
            raise fail("the computed bank holds a stored kernel array 'gram' (a computed bank stores none)")
    else:
        data = array(data_array_name(representation), (M, n, width), attrs["dtype"])
        shards = getattr(data, "shards", None) or (per_shard,)  # unsharded (not written by mklscale): chunks only
        if shards[0] != per_shard or data.chunks[0] != per_chunk:
            raise fail(f"the array {data.basename!r} is stored {shards[0]} kernels per "
                       f"shard in chunks of {data.chunks[0]}, but attribute layout says {per_shard} and {per_chunk}")
    complete = values(array("complete", (M,), bool))
    values(array("checksum", (M,), np.uint32))
    if "meta_checksum" in group:  # banks written before it existed have none
        values(array("meta_checksum", (M,), np.uint32))
    for name in PER_KERNEL_FLOATS:
        stat = values(array(name, (M,), np.float64))
        wrong = complete & (~np.isfinite(stat) | ((stat <= 0) if name == "norm_factor" else False))
        if wrong.any():
            bad = int(np.flatnonzero(wrong)[0])
            raise fail(f"the array {name!r} holds {stat[bad]!r} for the complete kernel {bad}, not a "
                       f"finite{' positive' if name == 'norm_factor' else ''} number")
    if representation == "factor":
        for name in FACTOR_META:
            array(name, {"landmarks": (M, width), "transform": (M, width, width)}.get(name, (M,)))
    entries = values(array("spec", (M,)))
    try:
        specs = specs_from_entries(entries)
    except Exception:  # name the first bad entry
        for m, entry in enumerate(entries):
            try:
                KernelSpec.from_json(entry)
            except Exception as exc:
                raise fail(f"the spec of kernel {m} is not a valid kernel spec ({type(exc).__name__}: {exc}): "
                           f"{str(entry)[:80]!r}") from None
        raise
    if "X" in group:
        X = group["X"]
        if not isinstance(X, zarr.Array) or X.ndim != 2 or X.shape[0] != n:
            raise fail(f"the array 'X' has shape {getattr(X, 'shape', None)}, expected ({n}, d)")
    return BankMetadata(attrs, specs, data)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

