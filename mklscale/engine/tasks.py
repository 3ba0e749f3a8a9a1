"""Per-task functions: what one Dask task does with a group of kernels of one shard.

A task receives the bank's path (never its data), reopens the bank through a small per-process
cache, streams its kernels through ``KernelReader`` (``reader_class``: a computed bank's
``computed_tasks.ComputedReader``, which computes them; its quad forms are computed_tasks' own,
fused) and returns one result per kernel, in the
order of its ``kernels`` argument (ascending global indices). The driver places results by kernel
index, so nothing depends on which worker ran a task or how often (Dask reruns tasks lost with a
worker).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from mklscale.engine import kernels as K
from mklscale.engine.reader import KernelReader

_BANKS: OrderedDict[tuple[str, int], object] = OrderedDict()
_BANKS_LOCK = threading.Lock()
_MAX_BANKS = 8


def _bank_key(path) -> tuple[str, object]:
    """(location, version): a bank rebuilt at the same location is told from the one opened before
    (``Storage.version``: a file's mtime, an object's ETag)."""
    from mklscale.bank.storage import storage_for

    return storage_for(path).version()


def open_bank(path: str):
    """The bank at ``path``, opened once per process (a few banks are kept, least recently used out)."""
    from mklscale.bank.store import KernelBank

    key = _bank_key(path)
    with _BANKS_LOCK:
        bank = _BANKS.get(key)
        if bank is not None:
            _BANKS.move_to_end(key)
            return bank
    bank = KernelBank.open(path)
    remember_bank(bank)
    return bank


def remember_bank(bank) -> None:
    """Put an already opened bank in this process's cache (the engine does so for its own bank)."""
    key = bank.storage.version()
    with _BANKS_LOCK:
        _BANKS[key] = bank
        _BANKS.move_to_end(key)
        while len(_BANKS) > _MAX_BANKS:
            _BANKS.popitem(last=False)


#: Most vectors for which a quad-forms pass over mapped kernels sweeps them row by row
#: (``kernels.quad_stream``); with more, the register tiles of ``quad_accumulate`` (fewer loads and
#: stores of V per number) win, over sub-panels of ``kernels.MAPPED_ROW_BLOCK`` rows.
STREAM_MAX_K = 4


def quad_sweep(source: str, k: int) -> tuple[bool, int]:
    """(stream, row_block) of ``kernels.quad_kernels`` for k vectors over pieces from a reader's
    ``source``: row by row or in short row blocks from memory (mapped or direct pieces), 128-row
    tiles from L2 (copied pieces)."""
    if source != "copied":
        return k <= STREAM_MAX_K, K.MAPPED_ROW_BLOCK
    return False, K.ROW_BLOCK


def _accumulate(panel, r0: int, Ut, V, S, stream: bool, row_block: int) -> None:
    """V += U^T-weighted rows r0.. of a kernel (``kernels.quad_stream`` or ``quad_accumulate``: same bits)."""
    if stream:
        K.quad_stream(panel, r0, Ut, V)
    else:
        K.quad_accumulate(panel, r0, Ut, V, S, row_block)


def _scratch(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((k, n)), np.zeros((8, 16))


def quad_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """(len(kernels), k): q[m, j] = u_j^T K_m u_j for the k vectors U (k, n)."""
    bank = open_bank(path)
    k, n = U.shape
    Ut = np.ascontiguousarray(U.T)
    out = np.empty((len(kernels), k))
    V, S = _scratch(k, n)
    with KernelReader(bank) as reader:
        stream, row_block = quad_sweep(reader.source, k)
        for pos, count, r0, r1, block in reader.pieces(kernels):
            if r0 == 0 and r1 == n:
                K.quad_kernels(block, U, Ut, out[pos:pos + count], V, S, stream, row_block)
                continue
            if r0 == 0:
                V[:] = 0.0
            _accumulate(block[0], r0, Ut, V, S, stream, row_block)
            if r1 == n:
                K.quad_finish(U, V, out[pos])
    return out


def quad_each_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """(len(kernels),): q_m = u_m^T K_m u_m with one vector per kernel, U (len(kernels), n)."""
    bank = open_bank(path)
    n = bank.n
    out = np.empty(len(kernels))
    V, S = _scratch(1, n)
    with KernelReader(bank) as reader:
        stream, row_block = quad_sweep(reader.source, 1)
        for pos, count, r0, r1, block in reader.pieces(kernels):
            for c in range(count):
                u = U[pos + c: pos + c + 1]
                if r0 == 0:
                    V[:] = 0.0
                _accumulate(block[c], r0, np.ascontiguousarray(u.T), V, S, stream, row_block)
                if r1 == n:
                    K.quad_finish(u, V, out[pos + c: pos + c + 1])
    return out


def matvec_task(path: str, kernels: np.ndarray, U: np.ndarray, each: bool = False,
                reader_class=KernelReader) -> np.ndarray:
    """K_m u for the task's kernels: (len, k, n) for shared vectors U (k, n), or (len, n) with
    ``each`` (U (len, n): one vector per kernel)."""
    bank = open_bank(path)
    n = bank.n
    out = np.empty((len(kernels), 1 if each else U.shape[0], n))
    with reader_class(bank) as reader:
        for pos, count, r0, r1, block in reader.pieces(kernels):
            for c in range(count):
                vecs = U[pos + c: pos + c + 1] if each else U
                K.matvec_rows(block[c], r0, vecs, out[pos + c])
    return out[:, 0] if each else out


def matvec_each_task(path: str, kernels: np.ndarray, U: np.ndarray, reader_class=KernelReader) -> np.ndarray:
    """(len(kernels), n): K_m u_m with one vector per kernel, U (len(kernels), n)."""
    return matvec_task(path, kernels, U, each=True, reader_class=reader_class)


def frob_task(path: str, kernels: np.ndarray, T: np.ndarray, reader_class=KernelReader) -> np.ndarray:
    """(len(kernels),): <K_m, T>_F."""
    bank = open_bank(path)
    out = np.zeros(len(kernels))
    with reader_class(bank) as reader:
        for pos, count, r0, _, block in reader.pieces(kernels):
            for c in range(count):
                out[pos + c] = K.frob_rows(block[c], r0, T, out[pos + c])
    return out


def combine_task(path: str, kernels: np.ndarray, weights: np.ndarray, reader_class=KernelReader) -> np.ndarray:
    """(n, n): sum_m weights[m] K_m over the task's kernels, added in order."""
    bank = open_bank(path)
    out = np.zeros((bank.n, bank.n))
    with reader_class(bank) as reader:
        for pos, count, r0, _, block in reader.pieces(kernels):
            for c in range(count):
                K.axpy_rows(block[c], r0, float(weights[pos + c]), out)
    return out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One node of combine's fixed-shape reduction tree."""
    return a + b


def gram_task(path: str, rows_kernels: np.ndarray, cols_kernels: np.ndarray, upper: bool, budget: int,
              reader_class=KernelReader) -> np.ndarray:
    """(len(rows), len(cols)): <K_a, K_b>_F, reading the same row panel of every kernel at once
    (at most ``budget`` bytes of panels). With ``upper`` (same kernel set) only b >= a is filled."""
    bank = open_bank(path)
    n, dt = bank.n, bank.dtype
    kernels = np.asarray(rows_kernels) if upper else np.concatenate([rows_kernels, cols_kernels])
    rows = int(max(1, min(n, budget // max(1, len(kernels) * n * dt.itemsize))))
    G = np.zeros((len(rows_kernels), len(cols_kernels)))
    with reader_class(bank) as reader:
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            panel = np.empty((len(kernels), r1 - r0, n), dt)
            for c, m in enumerate(kernels):
                reader.read_rows(int(m), r0, r1, panel[c])
            A = panel[: len(rows_kernels)]
            B = A if upper else panel[len(rows_kernels):]
            K.gram_rows(A, B, G, upper)
    return G
