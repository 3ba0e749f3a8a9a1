"""Engine: every quantity a solver needs from a kernel bank, computed in passes over its shards.

    eng = Engine(bank, client=None, cache_bytes="2GB")
    eng.quad_forms(u)                       # (M,)   q_m = u^T K_m u
    eng.quad_forms(U)                       # (M, k) all k vectors in one pass
    eng.quad_forms(U, kernels=idx, per_kernel=True)   # (len(idx),) u_p^T K_{idx[p]} u_p
    eng.matvecs(u, kernels=idx)             # (len(idx), n) K_m u
    eng.frobenius(T)                        # (M,)   <K_m, T>_F
    eng.combine(w)                          # (n, n) sum_m w_m K_m over w_m != 0
    eng.gram_of_kernels(idx)                # (p, p) <K_i, K_j>_F
    eng.blocks(idx)                         # (p, n, n) storage dtype, through the driver-side LRU cache
    eng.blocks(idx, keep=False)             # the same without keeping a cache copy
    eng.stats                               # passes, bytes_read, seconds, ..., log: one entry per call
    eng.n, eng.M, eng.lambda_max, eng.block_nbytes, eng.bank; eng.close() / with Engine(...) as eng

A pass is a Dask graph with one task per group of kernels of one shard (``plan``); each task reads
its kernels itself from the bank path (``tasks``, ``reader``) and folds them into float64 numbers
with the numba kernels of ``kernels`` (a factor bank, K_m = L_m L_m^T: ``factor_tasks`` and
``factor_kernels``, O(n r) per kernel and vector). Which task module, and how a cached kernel is
folded in the driver, is the bank's kernel representation's (``representation.py``): no operation
here tests the representation. Results are placed by kernel index and every number has one
fixed summation order, so they are bit-identical on the threaded default and on any cluster, with
any number of workers, and when workers die mid-pass. Kernels held in the cache are computed in
the driver with the same kernels, giving the same bits without touching the cluster.
"""

from __future__ import annotations

import os
import time

import numpy as np

from mklscale.engine import tasks, validate
from mklscale.engine.cache import BlockCache, parse_bytes
from mklscale.engine.contract import Counters, KernelEngine
from mklscale.engine.plan import TASK_BYTES, blocks_of, split_by_shard, tree_pairs
from mklscale.engine.runner import Runner, Shared
from mklscale.errors import BankIncompleteError, InvalidInputError

#: Kernels summed one after another in combine before the fixed tree adds the block sums.
COMBINE_BLOCK = 16
#: Kernels per row/column block of gram_of_kernels (a task computes one block pair).
GRAM_BLOCK = 64
#: Bytes of row panels a gram task holds at once.
GRAM_PANEL_BYTES = 32 * 2**20
#: The default of ``small_bank_bytes()``: a local bank up to this size is reduced in the driver's threads even
#: when a cluster is given. A pass over such a bank (page cache, mapped reader) takes a few ms, a round trip to a
#: 2-worker LocalCluster 25-30 ms (measured: 273 passes of the quickstart's CV, 49 MB bank, 7.9 s on the
#: cluster); bigger banks go to the cluster, where reading them in parallel pays.
SMALL_BANK_BYTES = 256 * 2**20


def small_bank_bytes() -> int:
    """The ``local_bytes`` estimators and pipelines open their engines with: ``MKLSCALE_LOCAL_PASS_BYTES``
    (bytes; 0 sends every pass to the cluster), else ``SMALL_BANK_BYTES``."""
    env = os.environ.get("MKLSCALE_LOCAL_PASS_BYTES")
    if env is None:
        return SMALL_BANK_BYTES
    try:
        return max(0, int(float(env)))
    except ValueError:
        raise InvalidInputError(f"MKLSCALE_LOCAL_PASS_BYTES must be a number of bytes (0: every pass on the "
                                f"cluster), got {env!r}") from None


class Engine(KernelEngine):
    """Passes over a ``KernelBank`` (see the module docstring for the operations; the contract it
    implements: :mod:`mklscale.engine.contract`).

    Parameters
    ----------
    bank : KernelBank or path
    client : None (Dask's threaded scheduler in this process), a ``distributed.Client``, or a
        scheduler address (a client is then created and closed with the engine).
    cache_bytes : budget of the driver-side block cache, an int or a string like "2GB".
    allow_incomplete : accept a bank with unfinished kernels, including those ``verify`` found
        corrupt (it flags them unfinished); full passes then return NaN for them and asking for
        one explicitly raises ``BankIncompleteError``. Without it such a bank is refused with a
        message naming the corrupt kernels and saying to run ``mklscale bank repair``.
    progress : show a tqdm bar per pass (off by default).
    threads : threads of the in-process scheduler (default: one per core).
    task_bytes : kernel bytes per task.
    local_bytes : with a client, still run the passes in this process's threads when the bank is on a
        local or shared filesystem (not an object store) and its stored bytes are at most this
        (``small_bank_bytes()`` is what estimators and pipelines pass; 0, the default, always uses the client).
        The results are the same bits either way (the sums' order is fixed by the chunk kernels).
    """

    def __init__(self, bank, client=None, cache_bytes="2GB", *, allow_incomplete: bool = False,
                 progress: bool = False, threads: int | None = None, task_bytes: int = TASK_BYTES,
                 local_bytes: int = 0):
        from mklscale.bank.store import KernelBank

        if isinstance(bank, (str, os.PathLike)):
            bank = KernelBank.open(bank)
        if not isinstance(bank, KernelBank):
            raise InvalidInputError(f"Engine needs a KernelBank or the path of one, got {type(bank).__name__}")
        complete = bank.complete
        if not complete.all() and not allow_incomplete:
            # corrupt kernels found by `mklscale bank verify` are flagged unfinished on disk
            # (store.py, "Integrity"), so this check refuses them without re-reading the bank
            raise BankIncompleteError(
                f"{bank.incomplete_message()}; or pass allow_incomplete=True to use only the complete kernels")
        if threads is not None and (not isinstance(threads, (int, np.integer)) or threads < 1):
            raise InvalidInputError(f"threads must be a positive integer or None, got {threads!r}")
        if not isinstance(task_bytes, (int, np.integer)) or task_bytes < 1:
            raise InvalidInputError(f"task_bytes must be a positive integer, got {task_bytes!r}")
        self.bank = bank
        self.n: int = bank.n
        self.M: int = len(bank)
        self._complete = complete
        self._lambda_max = np.where(complete, np.asarray(bank.lambda_max, dtype=np.float64), np.nan)
        # tasks reopen the bank from this: a resolved folder, or the ObjectURL of a bank on an object store
        self._path = bank.storage.worker_location
        self.representation: str = bank.representation
        self._kernel_bytes = int(np.prod(bank.block_shape)) * bank.dtype.itemsize
        self._task_bytes = int(task_bytes)
        self._cache = BlockCache(parse_bytes(cache_bytes))
        self._own_client = False
        if isinstance(client, str):
            from distributed import Client

            client = Client(client)
            self._own_client = True
        self.client = client
        small = bank.storage.mappable and bank.nbytes <= int(local_bytes)
        self._runner = Runner(None if small else client, threads=threads, progress=progress)
        tasks.remember_bank(bank)
        self._stats = {"passes": 0, "bytes_read": 0, "kernels_read": 0, "cache_hits": 0, "seconds": 0.0,
                       "calls": 0, "log": []}

    # ---- properties ---------------------------------------------------------------------------
    @property
    def lambda_max(self) -> np.ndarray:
        """(M,) float64 largest eigenvalue of every stored kernel (bank metadata); NaN for a kernel
        not built yet (only with allow_incomplete)."""
        return self._lambda_max.copy()

    @property
    def traces(self) -> np.ndarray:
        """(M,) trace of every stored kernel, from the bank's metadata (float64, of the stored values)."""
        return np.asarray(self.bank.trace, dtype=np.float64).reshape(-1)

    @property
    def frobenius_norms(self) -> np.ndarray:
        """(M,) Frobenius norm of every stored kernel, from the bank's metadata."""
        return np.asarray(self.bank.fro, dtype=np.float64).reshape(-1)

    @property
    def rank(self) -> int | None:
        """Columns of every stored factor (factor banks); None for a dense bank."""
        return self.bank.rank

    @property
    def complete(self) -> np.ndarray:
        return self._complete.copy()

    @property
    def progress(self) -> bool:
        return self._runner.progress

    @progress.setter
    def progress(self, value: bool) -> None:
        self._runner.progress = bool(value)

    @property
    def cache(self) -> BlockCache:
        return self._cache

    @property
    def stats(self) -> dict:
        """passes (calls that streamed the whole bank), bytes_read, kernels_read, cache_hits,
        seconds, calls, and ``log``: one dict per call (op, kernels_read, cache_hits, bytes,
        seconds, tasks, full_pass). A snapshot: later calls do not change it."""
        return dict(self._stats, log=list(self._stats["log"]))

    def counters(self) -> Counters:
        return Counters(self._stats["passes"], self._stats["bytes_read"])

    @property
    def working_set_budget(self) -> int:
        """The block cache's budget: what a solver's working set may hold unless told otherwise."""
        return self._cache.budget

    def __repr__(self) -> str:
        where = "threaded" if self.client is None else f"client={self.client!r}"
        return f"Engine({self.bank!r}, {where}, cache={self._cache.nbytes}/{self._cache.budget} bytes)"

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the cache and close the client if the engine created it."""
        self._cache.clear()
        if self._own_client and self.client is not None:
            self.client.close()
        self.client = None
        self._runner.client = None

    # ---- bookkeeping --------------------------------------------------------------------------
    def _record(self, op: str, t0: float, kernels_read: int, hits: int, n_tasks: int, full: bool) -> None:
        seconds = time.perf_counter() - t0
        nbytes = int(kernels_read) * self._kernel_bytes
        s = self._stats
        s["passes"] += int(full)
        s["bytes_read"] += nbytes
        s["kernels_read"] += int(kernels_read)
        s["cache_hits"] += int(hits)
        s["seconds"] += seconds
        s["calls"] += 1
        s["log"].append({"op": op, "kernels_read": int(kernels_read), "cache_hits": int(hits), "bytes": nbytes,
                         "seconds": seconds, "tasks": int(n_tasks), "full_pass": bool(full)})

    def _selection(self, kernels) -> tuple[np.ndarray, bool]:
        """(indices, full): all complete kernels for None, else validated indices that must be complete."""
        if kernels is None:
            return np.flatnonzero(self._complete), True
        idx = validate.kernel_indices(kernels, self.M)
        bad = idx[~self._complete[idx]]
        if bad.size:
            raise BankIncompleteError(f"kernel(s) {np.unique(bad)[:10].tolist()} are not built yet; "
                                      "finish the bank build or leave them out")
        return idx, False

    def _groups(self, kernels: np.ndarray) -> list[np.ndarray]:
        return split_by_shard(kernels, self.bank.kernels_per_shard, self._kernel_bytes, self._task_bytes)

    def _evaluate(self, op: str, kernels: np.ndarray, shape: tuple, task, shared=(), per_pos=None,
                  local=None, full: bool = False) -> np.ndarray:
        """One result of ``shape`` per entry of ``kernels`` (any order, repeats allowed).

        Cached kernels (not on full passes) are computed in the driver with ``local(block, p)``;
        the rest by tasks ``task(path, kernels_of_task, *shared, [per_pos rows])``.
        """
        t0 = time.perf_counter()
        out = np.full((len(kernels),) + shape, np.nan)
        hit = np.zeros(len(kernels), dtype=bool)
        if not full and local is not None and len(self._cache):
            for p, m in enumerate(kernels):
                block = self._cache.get(m)
                if block is not None:
                    out[p] = local(block, p)
                    hit[p] = True
        todo = np.flatnonzero(~hit)
        order = todo[np.argsort(kernels[todo], kind="stable")]
        sorted_kernels = kernels[order]
        groups = self._groups(sorted_kernels)
        shared = tuple(Shared(a) for a in shared)
        calls = []
        for g in groups:
            extra = () if per_pos is None else (np.ascontiguousarray(per_pos[order[g]]),)
            calls.append((task, self._path, sorted_kernels[g], *shared, *extra))
        for g, res in zip(groups, self._runner.run(op, calls)):
            out[order[g]] = res
        self._record(op, t0, len(order), int(hit.sum()), len(calls), full)
        return out

    def _full(self, kernels: np.ndarray, values: np.ndarray, shape: tuple) -> np.ndarray:
        """Scatter results of the complete kernels into an (M, ...) array, NaN for the others."""
        if len(kernels) == self.M:
            return values
        out = np.full((self.M,) + shape, np.nan)
        out[kernels] = values
        return out

    # ---- operations ---------------------------------------------------------------------------
    def quad_forms(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        """Quadratic forms q = u^T K_m u, accumulated in float64 in one pass over the kernels.

        - ``U`` (n,): (M,) for all kernels, or (len(kernels),) for a subset.
        - ``U`` (k, n): (M, k) / (len(kernels), k), all k vectors from one read of each kernel.
        - ``per_kernel=True``: ``U`` (len(kernels), n), one vector per kernel: (len(kernels),)
          with entry p = U[p]^T K_{kernels[p]} U[p] (kernels=None means all M, U (M, n)).

        Kernels in the block cache are computed in the driver by the representation's ``quad``,
        the same numba kernels as the tasks (same bits).
        """
        rep = self.kernel_representation
        if per_kernel:
            idx, full = self._selection(np.arange(self.M) if kernels is None else kernels)
            Up = validate.per_kernel_vectors(U, len(idx), self.n)
            return self._evaluate("quad_forms", idx, (), rep.tasks.quad_each_task, per_pos=Up,
                                  local=lambda block, p: rep.quad(block, Up[p:p + 1])[0], full=kernels is None)
        U2, one = validate.vectors(U, self.n)
        idx, full = self._selection(kernels)
        k = U2.shape[0]
        res = self._evaluate("quad_forms", idx, (k,), rep.tasks.quad_task, shared=(U2,),
                             local=lambda block, p: rep.quad(block, U2), full=full)
        if full:
            res = self._full(idx, res, (k,))
        return res[:, 0] if one else res

    def matvecs(self, U, kernels=None, per_kernel: bool = False) -> np.ndarray:
        """K_m u for the selected kernels (all M when ``kernels`` is None), float64.

        ``U`` (n,) -> (len, n); ``U`` (k, n) -> (len, k, n); ``per_kernel=True`` with ``U``
        (len(kernels), n) -> (len, n), row p = K_{kernels[p]} U[p].
        """
        n, rep = self.n, self.kernel_representation
        if per_kernel:
            idx, _ = self._selection(np.arange(self.M) if kernels is None else kernels)
            Up = validate.per_kernel_vectors(U, len(idx), n)
            return self._evaluate("matvecs", idx, (n,), rep.tasks.matvec_each_task, per_pos=Up,
                                  local=lambda block, p: rep.matvec(block, Up[p:p + 1])[0], full=kernels is None)
        U2, one = validate.vectors(U, n)
        idx, full = self._selection(kernels)
        k = U2.shape[0]
        res = self._evaluate("matvecs", idx, (k, n), rep.tasks.matvec_task, shared=(U2,),
                             local=lambda block, p: rep.matvec(block, U2), full=full)
        if full:
            res = self._full(idx, res, (k, n))
        return res[:, 0] if one else res

    def frobenius(self, T, kernels=None) -> np.ndarray:
        """<K_m, T>_F = sum_ij K_m[i, j] T[i, j] for a dense (n, n) T: (M,) or (len(kernels),)."""
        T2 = validate.square(T, self.n)
        idx, full = self._selection(kernels)
        rep = self.kernel_representation
        res = self._evaluate("frobenius", idx, (), rep.tasks.frob_task, shared=(T2,),
                             local=lambda block, p: rep.frobenius(block, T2), full=full)
        return self._full(idx, res, ()) if full else res

    def combine(self, weights) -> np.ndarray:
        """sum_m w_m K_m as an (n, n) float64 array, reading only the kernels with w_m != 0.

        Order of the additions, fixed by the support alone (not by tasks, cache or cluster): the
        support, in index order, is cut into blocks of COMBINE_BLOCK kernels; each block is summed from
        zero by the representation's ``add_block`` (dense: kernel after kernel; factors: one BLAS product
        of the block's factors), and the block sums are added over a fixed pairwise tree.
        """
        t0 = time.perf_counter()
        rep = self.kernel_representation
        w = validate.weights(weights, self.M)
        support = np.flatnonzero(w != 0)
        self._selection(support)
        groups = blocks_of(support, COMBINE_BLOCK)
        if not groups:
            self._record("combine", t0, 0, 0, 0, False)
            return np.zeros((self.n, self.n))
        if all(m in self._cache for m in support):
            partials = []
            for g in groups:
                acc = np.zeros((self.n, self.n))
                rep.add_block([self._cache.get(m) for m in g], w[g], acc)
                partials.append(acc)
            for level in tree_pairs(len(partials)):
                partials = [tasks.add(partials[a], partials[b]) if b >= 0 else partials[a] for a, b in level]
            self._record("combine", t0, 0, support.size, 0, False)
            return partials[0]
        calls = [(rep.tasks.combine_task, self._path, g, w[g]) for g in groups]
        result = self._runner.run("combine", calls, reduce_sum=True)[0]
        self._record("combine", t0, support.size, 0, len(calls), support.size == self.M)
        return result

    def gram_of_kernels(self, kernels=None) -> np.ndarray:
        """(p, p) matrix of <K_i, K_j>_F for the kernels given (all M for None), computed in
        blocks of GRAM_BLOCK kernels; each task streams the same row panels of two blocks."""
        t0 = time.perf_counter()
        rep = self.kernel_representation
        idx, _ = self._selection(kernels)
        uniq, where = np.unique(idx, return_inverse=True)
        p = uniq.size
        G = np.zeros((p, p))
        if p and all(m in self._cache for m in uniq):
            G = rep.gram_fixed(np.stack([self._cache.get(m) for m in uniq]))
            read, hits, n_tasks = 0, p, 0
        else:
            blocks = blocks_of(uniq, rep.gram_block(self.rank, GRAM_BLOCK, GRAM_PANEL_BYTES))
            starts = np.cumsum([0] + [b.size for b in blocks])
            pairs = [(a, b) for a in range(len(blocks)) for b in range(a, len(blocks))]
            calls = [(rep.tasks.gram_task, self._path, blocks[a], blocks[b], a == b, GRAM_PANEL_BYTES) for a, b in pairs]
            for (a, b), res in zip(pairs, self._runner.run("gram_of_kernels", calls)):
                G[starts[a]:starts[a + 1], starts[b]:starts[b + 1]] = res
            read = sum(blocks[a].size + (blocks[b].size if a != b else 0) for a, b in pairs)
            hits, n_tasks = 0, len(calls)
            G = np.triu(G) + np.triu(G, 1).T  # the tasks compute j >= i only; <K_i, K_j> is symmetric
        self._record("gram_of_kernels", t0, read, hits, n_tasks, False)
        return G[np.ix_(where, where)]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one kernel as ``blocks`` returns it and the cache holds it (n * n, or n * r for a
        factor bank, times the itemsize of the bank's storage dtype)."""
        return self._kernel_bytes

    def blocks(self, kernels, keep: bool = True) -> np.ndarray:
        """(len(kernels), n, n) array of the kernels' values (factor banks: (len(kernels), n, r),
        the factors L_m) in the bank's storage dtype (float32
        unless the bank was built as float64; widening to float64 is exact, callers that need
        float64 convert). The array is new and owned by the caller.

        Cached kernels are copied from the driver-side LRU cache; the others are read in the
        driver straight into their rows of the output (``reader.KernelReader``, in index order, so
        consecutive kernels are one read), holding nothing else but the reader's buffer (no task
        results in float64 to convert: 3-10x faster for thousands of small kernels). With ``keep`` (the default) the kernels are then kept in the cache (each as its own
        read-only array, so the cache never pins the returned stack) unless the request alone
        exceeds the cache budget. ``keep=False`` is for callers that hold the returned kernels
        themselves (e.g. a solver's working set): the cache then does not add a second copy.
        """
        t0 = time.perf_counter()
        idx, _ = self._selection(kernels)
        uniq, first = np.unique(idx, return_index=True)
        out = np.empty((len(idx),) + tuple(self.bank.block_shape), dtype=self.bank.dtype)
        missing, hits = [], 0
        for m, p in zip(uniq.tolist(), first.tolist()):
            block = self._cache.get(m)
            if block is None:
                missing.append(m)
            else:
                out[p] = block
                hits += 1
        missing = np.array(missing, dtype=np.int64)  # ascending, as uniq
        where = dict(zip(uniq.tolist(), first.tolist()))
        rows = np.array([where[m] for m in missing.tolist()], dtype=np.int64)
        if missing.size:
            with self.kernel_representation.reader(self.bank) as reader:
                for pos, count, r0, r1, block in reader.pieces(missing):
                    out[rows[pos:pos + count], r0:r1] = block
        rest = np.setdiff1d(np.arange(len(idx)), first)
        if rest.size:
            out[rest] = out[first[np.searchsorted(uniq, idx[rest])]]
        if keep and missing.size and uniq.size * self._kernel_bytes <= self._cache.budget:
            self._cache.store({m: out[where[m]] for m in missing.tolist()}, keep=uniq)
        self._record("blocks", t0, missing.size, hits, 0, False)
        return out
