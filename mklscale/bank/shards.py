"""Compute and write whole shards of a bank as Dask tasks (or threads), and record what they computed.

One task computes the kernels of one shard (a whole object of the ``gram`` array; in a factor bank,
of the ``factor`` array: the factors L_m of ``factor.build_factor``), writes them in a single atomic
write through the bank's storage (``Storage.write_shard``), and returns their statistics. Only the
driver writes per-kernel metadata, in batches (``_MetadataWriter``), and it marks a kernel complete
only after the task that wrote its data has returned. ``build.build_bank`` computes the unfinished
shards of a new or resumed bank with ``compute_shards``, ``integrity.repair`` the shards holding bad
kernels. Kernels kept from before must come out bit-identical to their recorded checksums (the
computation is deterministic), checked in the task before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from threadpoolctl import threadpool_limits

from mklscale.bank import _compute
from mklscale.bank import factor as factor_math
from mklscale.bank.direct_io import aligned_empty
from mklscale.bank.features import StoredRef, release_stored
from mklscale.bank.fs_errors import raise_store_error
from mklscale.bank.group import FACTOR_META, PER_KERNEL_FLOATS, data_array_name
from mklscale.bank.size import bank_bytes, human
from mklscale.bank.spec import KernelSpec, specs_from_json, specs_to_json
from mklscale.bank.stats import checksum, kernel_stats, meta_checksum
from mklscale.bank.storage import storage_for
from mklscale.errors import (
    BankCorruptError,
    BankLockLostError,
    BankMismatchError,
    ClusterUnavailableError,
    ObjectStoreError,
)
from mklscale.runtime.cluster import require_shared_folder
from mklscale.runtime.jit import COMPILING, will_compile
from mklscale.runtime.liveness import POLL_S, SchedulerWatch


def unfinished_shards(done: np.ndarray, per_shard: int) -> list[int]:
    """Shards holding at least one kernel that is not flagged complete."""
    return sorted({int(m) // per_shard for m in np.flatnonzero(~done)})


def compute_shards(bank, specs: Sequence[KernelSpec], Xs: np.ndarray | None, shards: list[int], *,
                    keep: np.ndarray, client, progress: bool, flush_every_s: float = 2.0) -> int:
    """Recompute and rewrite whole shards of an opened (writable) bank, one task per shard; return
    the number of kernels computed.

    ``Xs``: the standardised features, sent to every task; None: each task reads the columns its
    kernels use from the bank (``features.StoredRef``: a computed bank's build and repair, which never
    hold X whole).

    Kernels flagged in ``keep`` are already stored and verified: their recomputed bytes must match
    the recorded checksums bit for bit (the build is deterministic), else that shard's task raises
    BankCorruptError before writing. The driver records statistics and ``complete`` flags as shards
    finish (``_MetadataWriter``). A full disk raises DiskFullError and a read-only one
    ReadOnlyStoreError; kernels finished before that keep their flags (best effort flush).
    """
    _check_arithmetic(bank)
    S = bank.kernels_per_shard
    checks = bank.checksums.astype(np.int64)
    expected = {s: np.where(keep[s * S:(s + 1) * S], checks[s * S:(s + 1) * S], -1) for s in shards}
    layout = (int(bank.attrs["layout"]["kernels_per_chunk"]), S)
    writer = _MetadataWriter(bank, flush_every_s)
    runner = _run_distributed if client is not None else _run_threaded
    computed = 0
    todo = sum(len(range(*bank.shard_range(s))) for s in shards)
    compiling = bool(progress and todo) and will_compile(_ENTRY_POINTS["dense" if bank.rank is None else "factor"])
    if Xs is None:
        Xs = StoredRef(bank.storage.worker_location, bank.attrs.get("fingerprint"))
    n_features = bank.group["X"].shape[1]
    nbytes = bank_bytes(bank.M, bank.n, bank.dtype.name, bank.rank, n_features=n_features, layout=layout,
                        computed=not bank.stores_kernels)
    what = f"{bank.M} kernels, {human(nbytes)}" + ("" if bank.stores_kernels else " stored: computed bank")
    with _progress(len(specs), len(specs) - todo, progress, what, compiling) as bar:
        try:
            # workers run in other folders: they get a folder's path as the driver resolves it
            with contextlib.closing(runner(client, bank.storage.worker_location, specs, Xs,
                                           bank.normalize, bank.dtype.name,
                                           layout, shards, expected, _factor_of(bank),
                                           bank.stores_kernels)) as results:
                for first, stats in results:
                    writer.record(first, stats)
                    if compiling:
                        compiling = False
                        bar.set_description(f"{_BAR} ({what})")
                    bar.update(len(stats["checksum"]))
                    computed += len(stats["checksum"])
            writer.flush()
        except BaseException as exc:
            # best effort: keep the flags of the shards that did finish; not when the store is out of reach
            # (each request would wait out the retry deadline again) or the writer lost its lock
            if not isinstance(exc, (ObjectStoreError, BankLockLostError)):
                with contextlib.suppress(OSError, ObjectStoreError, BankLockLostError):
                    writer.flush()
            if isinstance(exc, OSError) and not isinstance(exc, ObjectStoreError):
                raise_store_error(bank.path, exc)
            raise
        finally:
            _BLOCKS.clear()
            release_stored()  # this process's cached column chunks of X (worker processes keep theirs)
    return computed


def _factor_of(bank) -> dict | None:
    """The factor settings the shard tasks need ({"rank", method, ...}); None for a dense bank."""
    return None if bank.rank is None else {"rank": bank.rank, **bank.factor_settings}


def _check_arithmetic(bank) -> None:
    """Refuse to finish or repair a float32 bank whose kernels another arithmetic computed
    (``_compute.ARITHMETIC``; banks from before it was recorded are version 1): their bytes
    differ in the last bit from what this build computes, so the bank would mix the two."""
    recorded = int(bank.attrs.get("arithmetic", 1))
    if recorded != _compute.ARITHMETIC and bank.dtype == np.float32:
        raise BankMismatchError(
            f"bank {bank.path} was started by an mklscale that computes float32 kernels with arithmetic "
            f"version {recorded}; this one uses version {_compute.ARITHMETIC}, whose values differ in the last "
            "bit, so it cannot finish or repair that bank consistently; finish it with the mklscale that "
            "started it, or rebuild it: build_bank(..., overwrite=True), `mklscale bank build ... --overwrite`, "
            "or delete the folder and build again")


# ---- the task --------------------------------------------------------------------------------------
def build_shard(path: str, specs_json: str, Xs, normalize, dtype: str, s: int,
                layout: tuple[int, int], expected: np.ndarray | None = None,
                factor: dict | None = None, store: bool = True) -> tuple[int, dict]:
    """Compute, normalise and write the kernels of shard s; return (first kernel, statistics).

    ``store=False``: a computed bank's (``KernelBank.stores_kernels``): the kernels are computed for
    their statistics and checksums only, and never written (passes compute them again, ``fill_block``);
    lambda_max is then ``stats.lambda_bound`` (no eigensolve: creation is one pass at the cost of
    computing the kernels), a valid upper bound, which is all the solvers use it as.

    ``factor``: a factor bank's settings (``FactorSettings`` fields): the shard's factors L_m are
    computed instead (``factor.build_factor``, seeded by the global kernel index) and the
    statistics carry their ranks, landmarks, transforms and approximation errors too.

    ``expected``: per kernel of the shard, the crc32c its recomputed bytes must have (-1: not
    checked). Kernels kept through a resume or repair are checked so; a mismatch raises
    BankCorruptError and nothing is written.

    Consecutive kernels that share a pairwise base (same family kind and feature subset) are
    filled in one sweep that computes each row of the base once (``_compute.fill_grams``): the
    stored matrix is cast(f(base) * normalisation), e.g. K = exp(-||x - z||^2 / (2 s^2)) / tr K
    for a trace-normalised Gaussian, exactly symmetric. All heavy steps release the GIL.

    ``Xs``: the standardised features (n, d), or a ``features.StoredRef``: then the columns these
    kernels use are read from the bank (checked chunks) and the specs re-indexed to them (the same bytes).
    """
    specs = specs_from_json(specs_json)
    if isinstance(Xs, StoredRef):
        Xs, specs = Xs.features_for(specs)
    stats = {k: np.empty(len(specs)) for k in PER_KERNEL_FLOATS}
    stats["checksum"] = np.empty(len(specs), dtype=np.uint32)
    per_chunk, per_shard = layout
    if factor is not None:
        return _build_factor_shard(path, specs, Xs, normalize, np.dtype(dtype), s, layout, expected,
                                   factor_math.FactorSettings(**factor), stats)
    with _BLOCKS.block(len(specs), Xs.shape[0], Xs.shape[0], np.dtype(dtype)) as block:
        stats["norm_factor"][:] = fill_block(specs, Xs, normalize, block)
        for k in range(len(specs)):  # a computed bank records a cheaper valid bound on lambda_max (kernel_stats)
            stats["trace"][k], stats["fro"][k], stats["lambda_max"][k], stats["checksum"][k] = \
                kernel_stats(block[k], exact_lambda=store)
        _check_reproduced(s, s * per_shard, stats["checksum"], expected)
        if store:
            with _off_the_worker_pool():
                _write_shard(path, s, block, per_chunk, per_shard)
    return s * per_shard, stats


def fill_block(specs: Sequence[KernelSpec], Xs: np.ndarray, normalize, out: np.ndarray,
               arithmetic: int = _compute.ARITHMETIC) -> np.ndarray:
    """Kernels ``specs`` on the standardised rows Xs, normalised, into ``out`` (len(specs), n, n) of the
    bank's dtype; returns their normalisation factors. Consecutive kernels that share a pairwise base
    (same family kind and feature subset) are filled in one sweep that computes each row of the base
    once (``_compute.fill_grams``). The bytes depend on each kernel's spec, Xs and the arithmetic version
    only (``_compute.ARITHMETIC``: a build's; a computed bank's passes use the one it recorded), never on
    its neighbours: a build stores them, a computed bank's passes compute the same bytes again."""
    factors = np.empty(len(specs))
    for first, stop, Xsub, kind, params in _sweeps(specs, Xs):
        factors[first:stop] = _compute.fill_grams(Xsub, kind, params, _NORM_CODES[normalize], out[first:stop],
                                                  arithmetic)
    return factors


def _sweeps(specs: Sequence[KernelSpec], Xs: np.ndarray):
    """(first, stop, Xsub, kind, params) per run of consecutive specs sharing a pairwise base
    (``_base_groups``): their feature columns of Xs, the base (SQDIST or DOT) and the (family, a, p)
    rows the ``_compute`` sweeps take."""
    for first, stop in _base_groups(specs):
        group = specs[first:stop]
        cols = slice(None) if group[0].features is None else list(group[0].features)
        kind = _compute.SQDIST if group[0].base_key[0] == "sqdist" else _compute.DOT
        yield first, stop, Xs[:, cols], kind, np.array([_kernel_params(sp) for sp in group])


def quad_block(specs: Sequence[KernelSpec], Xs: np.ndarray, normalize, dtype, U: np.ndarray, each: bool,
               arithmetic: int = _compute.ARITHMETIC) -> np.ndarray:
    """u^T K_m u of the kernels ``specs`` as ``fill_block`` would fill them (of ``dtype``), computed on
    their upper triangles and reduced at once, never held whole (``_compute.quad_grams``, one sweep
    per group sharing a base): (len(specs), k) for U (k, n), or (len(specs),) with ``each`` (U
    (len(specs), n): one vector per kernel)."""
    q = np.empty((len(specs), 1 if each else U.shape[0]))
    for first, stop, Xsub, kind, params in _sweeps(specs, Xs):
        q[first:stop] = _compute.quad_grams(Xsub, kind, params, _NORM_CODES[normalize],
                                            U[first:stop] if each else U, each, dtype, arithmetic)
    return q[:, 0] if each else q


def _build_factor_shard(path: str, specs: list[KernelSpec], Xs: np.ndarray, normalize, dtype: np.dtype, s: int,
                        layout: tuple[int, int], expected: np.ndarray | None, st: factor_math.FactorSettings,
                        stats: dict) -> tuple[int, dict]:
    """``build_shard`` for a factor bank: each kernel's factor (``factor.build_factor``), cast to
    the bank's dtype, its statistics from the stored bytes (``factor.factor_stats``), one write."""
    per_chunk, per_shard = layout
    first, k, r = s * per_shard, len(specs), st.rank
    stats.update({"rank": np.empty(k, dtype=np.int32), "landmarks": np.empty((k, r), dtype=np.int64),
                  "transform": np.empty((k, r, r)), "approx_error": np.empty(k), "exact_trace": np.empty(k)})
    with _BLOCKS.block(k, Xs.shape[0], r, dtype) as block:
        for q, spec in enumerate(specs):
            f = factor_math.build_factor(spec, Xs, first + q, st, normalize)
            block[q] = f.L
            stats["trace"][q], stats["fro"][q], stats["lambda_max"][q] = factor_math.factor_stats(block[q])
            stats["checksum"][q] = checksum(block[q])
            stats["norm_factor"][q] = f.norm_factor
            stats["rank"][q], stats["landmarks"][q], stats["transform"][q] = f.rank, f.landmarks, f.transform
            stats["approx_error"][q], stats["exact_trace"][q] = f.approx_error, f.exact_trace
        _check_reproduced(s, first, stats["checksum"], expected)
        with _off_the_worker_pool():
            _write_shard(path, s, block, per_chunk, per_shard, data_array_name("factor"))
    return first, stats


def _write_shard(path, s: int, block: np.ndarray, per_chunk: int, per_shard: int, array: str = "gram") -> None:
    """Shard s stored atomically (``Storage.write_shard``: a file renamed into place, one verified PUT)."""
    storage_for(path).write_shard(s, block, per_chunk, per_shard, array)


@contextmanager
def _off_the_worker_pool() -> Iterator[None]:
    """On a distributed worker, leave its thread pool while this task waits on the disk, so the
    worker starts computing the next shard meanwhile (``distributed.secede``/``rejoin``); a no-op
    elsewhere (the threaded build runs two tasks per core instead, ``BUILD_THREADS``)."""
    try:
        from distributed import get_worker, rejoin, secede

        get_worker()
    except (ImportError, ValueError):
        yield
        return
    secede()
    try:
        yield
    finally:
        rejoin()


def _check_reproduced(s: int, first: int, got: np.ndarray, expected: np.ndarray | None) -> None:
    """Raise BankCorruptError when a kept kernel's recomputed checksum differs from the recorded one."""
    if expected is None:
        return
    differ = np.flatnonzero((expected >= 0) & (got.astype(np.int64) != expected))
    if differ.size:
        raise BankCorruptError(
            f"recomputing shard {s} gave different bytes for kernel(s) {(first + differ).tolist()} that verified "
            "fine, so the build is not reproducible here (another mklscale version or machine built the bank?); "
            "nothing was written for this shard; rebuild the bank with overwrite=True")


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
    def block(self, k: int, n: int, width: int, dtype: np.dtype) -> Iterator[np.ndarray]:
        """A (k, n, width) array: k kernels of n x n, or k factors of n x r."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free)
                    if b.shape[0] >= k and b.shape[1:] == (n, width) and b.dtype == dtype]
            buf = self._free.pop(fits[0]) if fits else aligned_empty((k, n, width), dtype)
        try:
            yield buf[:k]
        finally:
            with self._lock:
                if len(self._free) < self._keep:
                    self._free.append(buf)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


#: Shard tasks the threaded build runs at once: two per core. A task spends about as long blocked
#: in its direct write (``write_shard_file``) as computing, and the second task computes meanwhile
#: (bench_build.py: 1 per core left the cores idle half the time). Each holds one shard buffer.
BUILD_THREADS = 2 * (os.cpu_count() or 1)

_BLOCKS = _BlockPool(keep=BUILD_THREADS)


_NORM_CODES = {None: _compute.NO_NORM, "trace": _compute.TRACE, "diag": _compute.DIAG}


def _base_groups(specs: Sequence[KernelSpec]) -> list[tuple[int, int]]:
    """[first, stop) runs of consecutive specs with the same base_key."""
    cuts = [k for k in range(1, len(specs)) if specs[k].base_key != specs[k - 1].base_key]
    return list(zip([0, *cuts], [*cuts, len(specs)]))


_kernel_params = factor_math.kernel_params  # (family code, a, p) of ``_compute.fill_grams``


def _run_threaded(client, path, specs, Xs, normalize, dtype, layout, shards, expected,
                  factor, store) -> Iterator[tuple[int, dict]]:
    """Dask's threaded scheduler; results are handed to the driver as each task finishes.

    The tasks run on a pool of this call's own. When the build stops early (a task failed, or the
    driver stopped reading: a metadata write failed, Ctrl-C), tasks not started yet are skipped
    and the running ones are waited for, so no shard is still being written once this returns."""
    S = layout[1]
    from concurrent.futures import ThreadPoolExecutor

    from dask.threaded import get

    stop = threading.Event()

    def task(*args):
        if stop.is_set():
            raise _Stopped()
        return build_shard(*args)

    dsk = {("shard", s): (task, path, specs_to_json(specs[s * S:(s + 1) * S]), Xs, normalize, dtype, s, layout,
                          expected[s], factor, store)
           for s in shards}
    # posttask runs in the scheduling thread; results reach the driver through a queue.
    results = _ThreadedResults()
    error: list[BaseException] = []

    def run() -> None:
        pool = ThreadPoolExecutor(BUILD_THREADS, thread_name_prefix="mklscale-shard")
        try:
            get(dsk, list(dsk), pool=pool, callbacks=[(None, None, None, results.posttask, None)])
        except BaseException as exc:  # re-raised in the driver thread
            error.append(exc)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            results.finish()

    thread = threading.Thread(target=run, name="mklscale-build", daemon=True)
    # Dask already runs one task per core; BLAS threads on top of that only oversubscribe.
    with threadpool_limits(1):
        thread.start()
        try:
            yield from results.drain()
        finally:
            stop.set()
            thread.join()
    if error and not isinstance(error[0], _Stopped):
        raise error[0]


class _Stopped(Exception):
    """Raised by shard tasks that start after the driver stopped the build."""


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


def _run_distributed(client, path, specs, Xs, normalize, dtype, layout, shards, expected,
                     factor, store) -> Iterator[tuple[int, dict]]:
    from distributed import wait

    S = layout[1]
    if not storage_for(path).reachable_from_workers:
        require_shared_folder(client, path, f"the build of {path}")
    X_future = Xs if isinstance(Xs, StoredRef) else client.scatter(Xs, broadcast=True)
    futures = [
        client.submit(build_shard, path, specs_to_json(specs[s * S:(s + 1) * S]), X_future, normalize, dtype, s, layout,
                      expected[s], factor, store, key=f"mklscale-build-{os.path.basename(str(path))}-{s}-{os.getpid()}-{time.monotonic_ns()}", pure=False)
        for s in shards
    ]
    watch = SchedulerWatch(client, f"the build of {path}")
    pending = set(futures)
    try:
        while pending:
            try:
                done = wait(pending, timeout=POLL_S, return_when="FIRST_COMPLETED").done
            except TimeoutError:
                done = ()
            if not done:
                watch.check()
            for fut in done:
                pending.discard(fut)
                yield fut.result()
    except ClusterUnavailableError:
        raise
    except Exception as exc:
        if watch.connected():
            raise
        raise watch.lost(exc) from exc
    finally:
        if watch.connected():
            with contextlib.suppress(Exception):
                client.cancel(futures)


# ---- driver-side metadata ------------------------------------------------------------------------
class _MetadataWriter:
    """Holds the per-kernel metadata of the kernels this build computed and writes them every
    few seconds.

    A flush rewrites only the entries of the kernels recorded here: each array is read back from
    disk and just those entries replaced (the writer lock keeps other writers out meanwhile), so
    what another writer recorded before, such as ``verify`` clearing the flag of a kernel it found
    bad, is kept. ``complete`` is written last, after the statistics, and each array write is
    atomic (zarr's local store writes a temporary file and renames it), so a kernel flagged
    complete always has its data and statistics on disk.
    """

    #: a factor bank's per-kernel rows, chunked by shard: only the shards recorded since the last
    #: flush are written (rewriting all of ``transform``, M r^2 floats, every flush would not scale)
    _BY_SHARD = ("landmarks", "transform")

    def __init__(self, bank, every_s: float = 2.0):
        self._group = bank._group
        whole = (*PER_KERNEL_FLOATS, "checksum")
        if bank.representation == "factor":
            whole += tuple(k for k in FACTOR_META if k not in self._BY_SHARD)
        # a bank created before meta_checksum existed is resumed without it
        self._specs = self._group["spec"][:] if "meta_checksum" in self._group else None
        if self._specs is not None:
            whole += ("meta_checksum",)
        self._whole = (*whole, "complete")  # complete last
        self._arrays = {k: self._group[k][:] for k in self._whole}
        self._owned = np.zeros(bank.M, dtype=bool)  # kernels recorded by this writer
        self._rows: dict[int, dict] = {}  # first kernel -> {name: rows} not written yet
        self._every = every_s
        self._last = time.monotonic()
        self._cost = 0.0  # seconds the last flush took

    def record(self, first: int, stats: dict) -> None:
        k = len(stats["checksum"])
        for name, values in stats.items():
            if name in self._BY_SHARD:
                self._rows.setdefault(first, {})[name] = values
            else:
                self._arrays[name][first:first + k] = values
        if self._specs is not None:
            self._arrays["meta_checksum"][first:first + k] = [
                meta_checksum({name: values[q] for name, values in stats.items()}, str(self._specs[first + q]))
                for q in range(k)]
        self._arrays["complete"][first:first + k] = True
        self._owned[first:first + k] = True
        # every ``every_s`` seconds (0: after every shard), and then at most ~10% of the time (a flush
        # rewrites (M,) arrays: 10^6 kernels)
        if self._every <= 0 or time.monotonic() - self._last >= max(self._every, 10 * self._cost):
            self.flush()

    def flush(self) -> None:
        t0 = time.monotonic()
        for first, rows in list(self._rows.items()):
            for name, values in rows.items():
                self._group[name][first:first + len(values)] = values
            del self._rows[first]
        if self._owned.any():
            for name in self._whole:
                on_disk = self._group[name][:]
                on_disk[self._owned] = self._arrays[name][self._owned]
                self._group[name][:] = on_disk
        self._last = time.monotonic()
        self._cost = self._last - t0


_BAR = "build bank"
#: the numba functions a shard task calls (the others compile with them), dense and factor banks
_ENTRY_POINTS = {"dense": (_compute._fill_grams, _compute.trace_fro_colabs, _compute.lambda_max),
                 "factor": (factor_math._kdiag, factor_math._sum, factor_math._cross_cols, factor_math._apply,
                            factor_math._row_sq_sum)}


def _progress(total: int, initial: int, enabled: bool, what: str, compiling: bool = False):
    """The build's progress bar: kernels done of ``total``, described by ``what`` (the bank's kernels and
    size on disk), e.g. "build bank (567 kernels, 227 GB)"; ``compiling``: it says so until the first
    shard is done (numba's first compilation of the build kernels, ``runtime.jit``, takes tens of seconds)."""
    from tqdm.auto import tqdm

    desc = f"{_BAR}: {COMPILING}; {what}" if compiling else f"{_BAR} ({what})"
    return tqdm(total=total, initial=initial, unit="kernel", desc=desc, disable=not enabled)

