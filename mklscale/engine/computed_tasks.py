"""The pass tasks of a computed bank (``build_bank(..., computed=True)``, issue 31): every kernel is
computed from the bank's standardised features inside the task and reduced at once, never stored.

``ComputedReader`` has ``KernelReader``'s interface (``pieces``, ``read_rows``, ``source``), so the
tasks are the dense bank's own (``tasks``) with this reader: the same numba reductions over the same
bytes. A piece is a run of consecutive kernels of at most ``PIECE_BYTES``, made of whole groups of
kernels sharing a pairwise base (a feature's Gaussian width ladder) where they fit, computed by
``shards.fill_block`` (a group's base once) into the thread's reused buffer: the bytes a build would
have stored (with the kernel arithmetic version the bank recorded, ``KernelBank.compute_kernels``),
checked once per process against the crc32c recorded when the bank was created (a kernel computed
differently here is an error, never a result).

Quad forms (the pass every solver screens all M kernels with) are fused instead: a kernel this
process has checked is computed on its upper triangle a tile of rows at a time and folded into
u^T K u = sum_i u_i (K_ii u_i + 2 sum_{j>i} K_ij u_j) at once (``KernelBank.compute_quad_forms``),
never held whole: half the kernel evaluations and no n x n buffer. A kernel not yet checked is
computed whole, checked, and folded by the same sums from its upper triangle
(``_compute.quad_upper``), so every pass gives the same bits whichever path a kernel took. They
agree with a stored bank's pass (which sums whole rows) to rounding, not bit for bit.

Cost: a kernel of n rows costs n^2 / 2 kernel evaluations (an exp for a Gaussian) in a quad-forms
pass; other passes compute it whole (n^2 / 2 and a mirror; n^2 for float32 kernels on few features,
whose whole rows cost less than the mirror), plus its pairwise base, instead of reading 4 n^2 bytes;
the bank's features travel with the bank (each worker process opens the bank, and reads X, once).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np

from mklscale.bank import _compute
from mklscale.bank.direct_io import thread_buffer
from mklscale.bank.stats import checksum
from mklscale.engine import tasks
from mklscale.errors import BankCorruptError

#: Bytes of kernels one piece computes at once (a feature's 4 per_feature kernels of n = 500; one of
#: n = 2000): fewer pieces cost less Python per pass, smaller ones stay in cache for the reduction.
PIECE_BYTES = 4 * 2**20
#: Bytes of whole kernels ``read_rows`` keeps between row panels (gram tasks read every kernel by panels).
ROWS_CACHE_BYTES = 256 * 2**20

_CHECKED: dict[tuple, set[int]] = {}  # (bank location, fingerprint) -> kernels whose bytes matched
_CHECKED_LOCK = threading.Lock()


class ComputedReader:
    """``KernelReader`` for a computed bank: pieces are computed, not read (module doc)."""

    source = "computed"

    def __init__(self, bank, piece_bytes: int | None = None):
        self.bank = bank
        self.n = bank.n
        self.dtype = bank.dtype
        self.piece_bytes = int(PIECE_BYTES if piece_bytes is None else piece_bytes)
        self._rows: OrderedDict[int, np.ndarray] = OrderedDict()
        key = (str(bank.path), bank.attrs.get("fingerprint"))
        with _CHECKED_LOCK:
            self._checked = _CHECKED.setdefault(key, set())

    def __enter__(self) -> ComputedReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._rows.clear()

    def _runs(self, kernels: np.ndarray) -> Iterator[tuple[int, int]]:
        """(pos, count): runs of consecutive kernels, each within piece_bytes, made of whole groups of
        kernels sharing a pairwise base (``fill_block`` computes a group's base once) where they fit:
        a group that would not fit whole in the run starts the next one."""
        specs, per = self.bank.specs, max(1, self.piece_bytes // (self.n * self.n * self.dtype.itemsize))
        pos = 0
        while pos < len(kernels):
            m0, count = int(kernels[pos]), 1
            while count < per and pos + count < len(kernels) and int(kernels[pos + count]) == m0 + count:
                if specs[m0 + count].base_key != specs[m0 + count - 1].base_key:  # a group starts here
                    size = 1
                    while (count + size <= per and pos + count + size < len(kernels)
                           and int(kernels[pos + count + size]) == m0 + count + size
                           and specs[m0 + count + size].base_key == specs[m0 + count].base_key):
                        size += 1
                    if count + size > per:
                        break
                count += 1
            yield pos, count
            pos += count

    def _compute(self, ms: Sequence[int]) -> np.ndarray:
        nbytes = len(ms) * self.n * self.n * self.dtype.itemsize
        block = thread_buffer(nbytes)[:nbytes].view(self.dtype).reshape(len(ms), self.n, self.n)
        self.bank.compute_kernels(ms, out=block)
        for c, m in enumerate(ms):
            if m not in self._checked:
                self._compare(m, checksum(block[c]))
                self._checked.add(m)
        return block

    def _compare(self, m: int, crc: int) -> None:
        if crc != self.bank.expected_checksum(m) and crc != self.bank.expected_checksum(m, fresh=True):
            raise BankCorruptError(
                f"kernel {m} ({self.bank.specs[m].name}) of the computed bank {self.bank.path}: computed here from its "
                "features, its bytes do not match the crc32c recorded when the bank was created (a different "
                "arithmetic, or damaged metadata), so no result was computed from them; run `mklscale bank verify "
                f"{self.bank.path}`, and rebuild the bank with this mklscale if it reports the kernel")

    def quad_forms(self, kernels: Sequence[int], U: np.ndarray, each: bool = False) -> np.ndarray:
        """u^T K_m u for ``kernels`` (module doc, "Quad forms"): (len(kernels), k) for U (k, n), or
        (len(kernels),) with ``each`` (U (len(kernels), n): one vector per kernel)."""
        kernels = np.asarray(kernels, dtype=np.int64)
        out = np.empty((len(kernels), 1 if each else U.shape[0]))
        for pos, count in self._runs(kernels):
            ms = [int(m) for m in kernels[pos:pos + count]]
            vecs = U[pos:pos + count] if each else U
            if all(m in self._checked for m in ms):
                out[pos:pos + count] = self.bank.compute_quad_forms(ms, vecs, each).reshape(count, -1)
            else:
                _compute.quad_upper(self._compute(ms), np.ascontiguousarray(vecs, dtype=np.float64), each,
                                    out[pos:pos + count])
        return out[:, 0] if each else out

    def pieces(self, kernels: Sequence[int]) -> Iterator[tuple[int, int, int, int, np.ndarray]]:
        """``KernelReader.pieces``: (pos, count, 0, n, block), whole kernels only."""
        kernels = np.asarray(kernels, dtype=np.int64)
        for pos, count in self._runs(kernels):
            yield pos, count, 0, self.n, self._compute([int(m) for m in kernels[pos:pos + count]])

    def read_rows(self, m: int, r0: int, r1: int, out: np.ndarray) -> None:
        """Rows r0..r1-1 of kernel m into ``out``; the whole kernel is computed once and kept
        (least recently used out beyond ROWS_CACHE_BYTES) for its other row panels."""
        block = self._rows.get(m)
        if block is None:
            block = self._compute([m])[0].copy()
            self._rows[m] = block
            while len(self._rows) * block.nbytes > ROWS_CACHE_BYTES and len(self._rows) > 1:
                self._rows.popitem(last=False)
        else:
            self._rows.move_to_end(m)
        out[...] = block[r0:r1]


def quad_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """``tasks.quad_task``, computed on the fly (``ComputedReader.quad_forms``)."""
    with ComputedReader(tasks.open_bank(path)) as reader:
        return reader.quad_forms(kernels, U)


def quad_each_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """``tasks.quad_each_task``, computed on the fly (``ComputedReader.quad_forms``)."""
    with ComputedReader(tasks.open_bank(path)) as reader:
        return reader.quad_forms(kernels, U, each=True)


def matvec_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    return tasks.matvec_task(path, kernels, U, reader_class=ComputedReader)


def matvec_each_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    return tasks.matvec_each_task(path, kernels, U, reader_class=ComputedReader)


def frob_task(path: str, kernels: np.ndarray, T: np.ndarray) -> np.ndarray:
    return tasks.frob_task(path, kernels, T, reader_class=ComputedReader)


def combine_task(path: str, kernels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return tasks.combine_task(path, kernels, weights, reader_class=ComputedReader)


def gram_task(path: str, rows_kernels: np.ndarray, cols_kernels: np.ndarray, upper: bool, budget: int) -> np.ndarray:
    return tasks.gram_task(path, rows_kernels, cols_kernels, upper, budget, reader_class=ComputedReader)


add = tasks.add
