"""Build a kernel bank from features and specs as Dask tasks: resumable, normalised, safe to kill.

One task computes the kernels of one shard (a whole file of the ``gram`` array), writes them in a
single write, and returns their statistics. Only the driver writes per-kernel metadata, in
batches, and it marks a kernel complete only after the task that wrote its data has returned. A
build killed at any moment therefore leaves complete kernels intact and, run again with the same
arguments, recomputes exactly the unfinished shards.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from mklscale.bank import _compute
from mklscale.bank.spec import KernelSpec, specs_from_json, specs_to_json
from mklscale.bank.store import (
    NORMALIZATIONS,
    PER_KERNEL_FLOATS,
    KernelBank,
    create_bank_group,
    creation_info,
    json_attr,
    kernel_stats,
    prepare_path,
    validate_dtype,
    validate_features,
    write_shard_file,
)
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
) -> KernelBank:
    """Compute K_m(X, X) for every spec and store them as a bank at ``path``.

    X is raw (n x d); with ``standardize`` every column is centred and scaled to unit variance
    (constant columns are only centred) and the transform is recorded so cross kernels on new data
    match. ``normalize``: "trace" (K / trace K, unit trace as in SimpleMKL/SpicyMKL), "diag"
    (K_ij / sqrt(K_ii K_jj)) or None. ``client``: a ``distributed.Client`` to run the tasks on,
    or None for Dask's threaded scheduler in this process.

    If ``path`` holds a bank built with the same X, specs and settings, the build resumes: only
    unfinished kernels are computed. A bank built from anything else is refused unless
    ``overwrite=True``. Completion flags are written every ``flush_every_s`` seconds and at the
    end (0 = after every shard). Returns the opened bank; its ``last_build_computed`` says how many
    kernels this call computed.
    """
    X = validate_features(X, "X")
    specs = _validate_specs(specs, X.shape[1])
    if normalize not in NORMALIZATIONS:
        raise InvalidInputError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    dt = validate_dtype(dtype)
    rows = list(range(X.shape[0])) if row_ids is None else [int(r) for r in row_ids]
    if len(rows) != X.shape[0]:
        raise InvalidInputError(f"row_ids has {len(rows)} entries but X has {X.shape[0]} rows")

    mean, scale = _standardisation(X) if standardize else (None, None)
    Xs = X if mean is None else (X - mean) / scale
    fingerprint = _fingerprint(X, specs, normalize, dt.name, standardize, rows)
    path = Path(path)
    if not prepare_path(path, overwrite=overwrite, fingerprint=fingerprint):
        attrs = {
            "normalize": normalize,
            "standardization": None if mean is None else json_attr({"mean": mean.tolist(), "scale": scale.tolist()}),
            "train_rows": rows,
            "fingerprint": fingerprint,
            "source": "build_bank",
            "created": creation_info(),
        }
        create_bank_group(path, specs=specs, n=X.shape[0], dtype=dt, attrs=attrs, X=Xs,
                          chunk_mb=chunk_mb, shard_mb=shard_mb)

    bank = KernelBank.open(path, mode="r+")
    S = bank.kernels_per_shard
    done = bank.complete
    todo = [s for s in range(-(-len(specs) // S)) if not done[s * S:(s + 1) * S].all()]
    bank.last_build_computed = 0  # kernels computed by this call (tests check resumption with it)
    if todo:
        writer = _MetadataWriter(bank, flush_every_s)
        runner = _run_distributed if client is not None else _run_threaded
        with _progress(len(specs), int(done.sum()), progress) as bar:
            try:
                layout = (int(bank.attrs["layout"]["kernels_per_chunk"]), S)
                for first, stats in runner(client, str(path), specs, Xs, normalize, dt.name, layout, todo):
                    writer.record(first, stats)
                    bar.update(len(stats["checksum"]))
                    bank.last_build_computed += len(stats["checksum"])
            finally:
                writer.flush()
                _BLOCKS.clear()
    return bank


# ---- the task --------------------------------------------------------------------------------------
def build_shard(path: str, specs_json: str, Xs: np.ndarray, normalize, dtype: str, s: int,
                layout: tuple[int, int]) -> tuple[int, dict]:
    """Compute, normalise and write the kernels of shard s; return (first kernel, statistics).

    Consecutive kernels that share a pairwise base (same family kind and feature subset) are
    filled in one sweep that computes each row of the base once (``_compute.fill_grams``): the
    stored matrix is cast(f(base) * normalisation), e.g. K = exp(-||x - z||^2 / (2 s^2)) / tr K
    for a trace-normalised Gaussian, exactly symmetric. All heavy steps release the GIL.
    """
    specs = specs_from_json(specs_json)
    stats = {k: np.empty(len(specs)) for k in PER_KERNEL_FLOATS}
    stats["checksum"] = np.empty(len(specs), dtype=np.uint32)
    with _BLOCKS.block(len(specs), Xs.shape[0], np.dtype(dtype)) as block:
        for first, stop in _base_groups(specs):
            group = specs[first:stop]
            cols = slice(None) if group[0].features is None else list(group[0].features)
            kind = _compute.SQDIST if group[0].base_key[0] == "sqdist" else _compute.DOT
            stats["norm_factor"][first:stop] = _compute.fill_grams(
                Xs[:, cols], kind, np.array([_kernel_params(sp) for sp in group]), _NORM_CODES[normalize],
                block[first:stop])
        for k in range(len(specs)):
            stats["trace"][k], stats["fro"][k], stats["lambda_max"][k], stats["checksum"][k] = kernel_stats(block[k])
        per_chunk, per_shard = layout
        write_shard_file(Path(path), s, block, per_chunk, per_shard)
    return s * per_shard, stats


class _BlockPool:
    """Shard-sized output arrays reused from shard to shard within a process.

    A fresh 64 MB array per shard costs as many page faults (and zeroed pages) as writing the
    shard out; reusing one per running task removes that. At most ``keep`` arrays are kept
    (about one per thread running shards); ``build_bank`` empties its own process's pool at the
    end (worker processes of a distributed client keep theirs for their next build).
    """

    def __init__(self, keep: int):
        self._free: list[np.ndarray] = []
        self._keep = keep
        self._lock = threading.Lock()

    @contextmanager
    def block(self, k: int, n: int, dtype: np.dtype) -> Iterator[np.ndarray]:
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.shape[0] >= k and b.shape[1] == n and b.dtype == dtype]
            buf = self._free.pop(fits[0]) if fits else np.empty((k, n, n), dtype=dtype)
        try:
            yield buf[:k]
        finally:
            with self._lock:
                if len(self._free) < self._keep:
                    self._free.append(buf)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


_BLOCKS = _BlockPool(keep=os.cpu_count() or 1)


_NORM_CODES = {None: _compute.NO_NORM, "trace": _compute.TRACE, "diag": _compute.DIAG}


def _base_groups(specs: Sequence[KernelSpec]) -> list[tuple[int, int]]:
    """[first, stop) runs of consecutive specs with the same base_key."""
    cuts = [k for k in range(1, len(specs)) if specs[k].base_key != specs[k - 1].base_key]
    return list(zip([0, *cuts], [*cuts, len(specs)]))


def _kernel_params(spec: KernelSpec) -> tuple[float, float, float]:
    """(family code, a, p) for ``_compute.fill_grams``: Gaussian a = -1 / (2 s^2); polynomial
    a = offset, p = degree; linear none."""
    if spec.family == "gaussian":
        w = float(spec.param("width"))
        return _compute.GAUSSIAN, -1.0 / (2.0 * w * w), 0
    if spec.family == "polynomial":
        return _compute.POLYNOMIAL, float(spec.param("offset")), int(spec.param("degree"))
    return _compute.LINEAR, 0.0, 0


def _run_threaded(client, path, specs, Xs, normalize, dtype, layout, shards) -> Iterator[tuple[int, dict]]:
    """Dask's threaded scheduler; results are handed to the driver as each task finishes."""
    S = layout[1]
    import threading

    from dask.threaded import get

    dsk = {("shard", s): (build_shard, path, specs_to_json(specs[s * S:(s + 1) * S]), Xs, normalize, dtype, s, layout)
           for s in shards}
    # posttask runs in the scheduling thread; results reach the driver through a queue.
    results = _ThreadedResults()
    error: list[BaseException] = []

    def run() -> None:
        try:
            get(dsk, list(dsk), callbacks=[(None, None, None, results.posttask, None)])
        except BaseException as exc:  # re-raised in the driver thread
            error.append(exc)
        finally:
            results.finish()

    thread = threading.Thread(target=run, name="mklscale-build", daemon=True)
    # Dask already runs one task per core; BLAS threads on top of that only oversubscribe.
    with threadpool_limits(1):
        thread.start()
        yield from results.drain()
        thread.join()
    if error:
        raise error[0]


class _ThreadedResults:
    def __init__(self):
        import queue

        self._q: queue.Queue = queue.Queue()

    def posttask(self, key, result, dsk, state, worker_id) -> None:
        self._q.put(result)

    def finish(self) -> None:
        self._q.put(None)

    def drain(self) -> Iterator[tuple[int, dict]]:
        while (item := self._q.get()) is not None:
            yield item


def _run_distributed(client, path, specs, Xs, normalize, dtype, layout, shards) -> Iterator[tuple[int, dict]]:
    from distributed import as_completed

    S = layout[1]
    X_future = client.scatter(Xs, broadcast=True)
    futures = [
        client.submit(build_shard, path, specs_to_json(specs[s * S:(s + 1) * S]), X_future, normalize, dtype, s, layout,
                      key=f"mklscale-build-{os.path.basename(path)}-{s}-{os.getpid()}-{time.monotonic_ns()}", pure=False)
        for s in shards
    ]
    try:
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        client.cancel(futures)


# ---- driver-side metadata ------------------------------------------------------------------------
class _MetadataWriter:
    """Holds the per-kernel metadata arrays in memory and writes them every few seconds.

    ``complete`` is written last, after the statistics, and each array write is atomic (zarr's
    local store writes a temporary file and renames it), so a kernel flagged complete always has
    its data and statistics on disk.
    """

    def __init__(self, bank: KernelBank, every_s: float = 2.0):
        self._group = bank._group
        self._arrays = {k: self._group[k][:] for k in (*PER_KERNEL_FLOATS, "checksum", "complete")}
        self._every = every_s
        self._last = time.monotonic()

    def record(self, first: int, stats: dict) -> None:
        k = len(stats["checksum"])
        for name, values in stats.items():
            self._arrays[name][first:first + k] = values
        self._arrays["complete"][first:first + k] = True
        if time.monotonic() - self._last >= self._every:
            self.flush()

    def flush(self) -> None:
        for name in (*PER_KERNEL_FLOATS, "checksum", "complete"):
            self._group[name][:] = self._arrays[name]
        self._last = time.monotonic()


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


def _standardisation(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    return mean, np.where(scale > 1e-12 * np.maximum(1.0, np.abs(mean)), scale, 1.0)


def _fingerprint(X: np.ndarray, specs, normalize, dtype: str, standardize: bool, rows) -> str:
    h = hashlib.sha256()
    h.update(repr(X.shape).encode())
    h.update(np.ascontiguousarray(X).tobytes())
    h.update(specs_to_json(specs).encode())
    h.update(repr((normalize, dtype, bool(standardize))).encode())
    h.update(np.asarray(rows, dtype=np.int64).tobytes())
    return h.hexdigest()


def _progress(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="kernel", desc="build bank", disable=not enabled)

