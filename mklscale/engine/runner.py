"""Run a pass — a Dask graph of per-task calls — threaded in-process or on a distributed cluster.

A pass is a list of calls ``(function, *args)``; an argument wrapped in ``Shared`` (the vectors,
T) enters the graph once, as its own key (or, on a cluster and above SCATTER_BYTES, as data
scattered to every worker), and every task that names it depends on it: a cluster ships it once
per worker rather than once per task. Results come back in call order.

On a cluster, a pass waits in slices of POLL_S seconds and between them checks that the client is
still connected and, every HEARTBEAT_S seconds, that the scheduler answers within
HEARTBEAT_TIMEOUT_S. Losing the scheduler (killed, its host gone, the connection closed, or a
scheduler that stops answering) therefore raises :class:`~mklscale.errors.ClusterUnavailableError`
within about HEARTBEAT_S + HEARTBEAT_TIMEOUT_S seconds, never a hang. Losing a worker is not an
error: the scheduler reruns its tasks elsewhere and the results are the same bits.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass

from mklscale.engine.plan import tree_pairs
from mklscale.engine.tasks import add
from mklscale.errors import ClusterUnavailableError

#: Pass-wide arguments larger than this go to a cluster's workers by scatter, not in the graph.
SCATTER_BYTES = 2**20
#: Seconds between checks of the client's connection while a pass runs on a cluster.
POLL_S = 0.5
#: Seconds between pings of the scheduler while a pass runs, and how long a ping may take.
HEARTBEAT_S = 5.0
HEARTBEAT_TIMEOUT_S = 10.0


@dataclass(frozen=True, eq=False)
class Shared:
    """A pass-wide argument (stored once per pass)."""

    value: object


class Runner:
    """Executes passes. ``client``: None for Dask's threaded scheduler in this process (``threads``
    threads, default one per core), or a ``distributed.Client``."""

    def __init__(self, client=None, threads: int | None = None, progress: bool = False):
        from dask.system import CPU_COUNT

        self.client = client
        # dask's own default outside the main thread would be min(32, cores + 4) threads
        self.threads = threads or CPU_COUNT
        self.progress = progress

    @property
    def distributed(self) -> bool:
        return self.client is not None

    def _graph(self, op: str, calls: list[tuple]) -> tuple[dict, list]:
        prefix = f"mklscale-{op}-{uuid.uuid4().hex[:12]}"
        dsk: dict = {}
        shared: dict[int, object] = {}
        keys = []
        for i, (func, *args) in enumerate(calls):
            targs = []
            for a in args:
                if isinstance(a, Shared):
                    ref = shared.get(id(a))
                    if ref is None:
                        ref = shared[id(a)] = self._share(a.value, f"{prefix}-shared-{len(shared)}", dsk)
                    targs.append(ref)
                else:
                    targs.append(a)
            dsk[(prefix, i)] = (func, *targs)
            keys.append((prefix, i))
        return dsk, keys

    def _share(self, value, key: str, dsk: dict):
        """A reference tasks can take as an argument: a graph key holding ``value``, or on a
        cluster, for values over SCATTER_BYTES, a future of ``value`` copied to every worker
        (kept off the scheduler; a replacement worker fetches it from the others)."""
        if self.distributed and getattr(value, "nbytes", 0) > SCATTER_BYTES:
            return self.client.scatter(value, broadcast=True, hash=False)
        dsk[key] = value
        return key

    def run(self, op: str, calls: list[tuple], reduce_sum: bool = False) -> list:
        """Results of ``calls`` in order; with ``reduce_sum``, one value: the sum of all results
        over a fixed pairwise tree (same additions in the same order on every run)."""
        if not calls:
            return []
        if self.distributed:
            self._check_connected(op)
            try:
                dsk, keys = self._graph(op, calls)  # may scatter to the workers
            except Exception as exc:
                if self._connected():
                    raise
                raise self._lost(op, exc) from exc
        else:
            dsk, keys = self._graph(op, calls)
        if reduce_sum:
            prefix = keys[0][0]
            for depth, level in enumerate(tree_pairs(len(keys))):
                nxt = []
                for i, (a, b) in enumerate(level):
                    node = (f"{prefix}-sum{depth}", i)
                    dsk[node] = (add, keys[a], keys[b]) if b >= 0 else keys[a]
                    nxt.append(node)
                keys = nxt
        return self._execute(op, dsk, keys, len(calls))

    def _execute(self, op: str, dsk: dict, keys: list, n_tasks: int) -> list:
        from tqdm.auto import tqdm

        with tqdm(total=n_tasks, desc=op, unit="task", disable=not self.progress, leave=False) as bar:
            if not self.distributed:
                from dask.threaded import get

                leaf = {k for k in dsk if isinstance(k, tuple) and "-sum" not in k[0]}

                def posttask(key, result, dsk_, state, worker_id):
                    if key in leaf:
                        bar.update(1)

                return list(get(dsk, keys, num_workers=self.threads, callbacks=[(None, None, None, posttask, None)]))
            return self._execute_distributed(op, dsk, keys, n_tasks, bar)

    # ---- on a cluster: bounded waits -----------------------------------------------------------
    def _execute_distributed(self, op: str, dsk: dict, keys: list, n_tasks: int, bar) -> list:
        client = self.client
        self._check_connected(op)
        futures = None
        try:
            futures = client.get(dsk, keys, sync=False)
            step = n_tasks // len(keys) if len(keys) < n_tasks else 1
            last_ping, shown = time.monotonic(), 0
            while not self._all_done(futures):
                if self.progress:
                    finished = sum(f.done() for f in futures)
                    bar.update(step * (finished - shown))
                    shown = finished
                self._check_connected(op)
                if time.monotonic() - last_ping >= HEARTBEAT_S:
                    self._ping(op)
                    last_ping = time.monotonic()
            bar.update(step * (len(futures) - shown))
            return list(client.gather(futures))
        except ClusterUnavailableError:
            raise
        except Exception as exc:
            if self._connected():
                raise  # a task's own error (bad data, corrupt shard): not the cluster's fault
            raise self._lost(op, exc) from exc
        finally:
            if futures is not None and self._connected():
                with contextlib.suppress(Exception):  # the scheduler may have gone just now
                    client.cancel(futures)

    @staticmethod
    def _all_done(futures: list) -> bool:
        """Wait up to POLL_S for every future to finish (or fail, or be cancelled)."""
        from distributed import wait

        try:
            wait(futures, timeout=POLL_S)
        except TimeoutError:
            return False
        return True

    def _connected(self) -> bool:
        client = self.client
        if client is None or client.status != "running":
            return False
        comm = getattr(client, "scheduler_comm", None)
        return comm is not None and comm.comm is not None and not comm.comm.closed()

    def _check_connected(self, op: str) -> None:
        if not self._connected():
            raise self._lost(op, None)

    def _ping(self, op: str) -> None:
        """Ask the scheduler for its identity; no answer within HEARTBEAT_TIMEOUT_S means it is gone."""
        try:
            self.client.sync(self.client.scheduler.identity, callback_timeout=HEARTBEAT_TIMEOUT_S)
        except Exception as exc:  # timeout, closed comm, OSError: all mean no scheduler
            raise self._lost(op, exc) from exc

    def _lost(self, op: str, exc: BaseException | None) -> ClusterUnavailableError:
        client = self.client
        address = getattr(getattr(client, "scheduler", None), "address", None) or "(unknown address)"
        status = getattr(client, "status", "closed")
        why = f" ({type(exc).__name__}: {exc})" if exc is not None and str(exc) else \
            (f" ({type(exc).__name__})" if exc is not None else "")
        return ClusterUnavailableError(
            f"lost the Dask scheduler at {address} during the '{op}' pass (client status: {status}){why}. "
            "The pass was abandoned; restart the scheduler (or the cluster) and run again, resuming from the "
            "last checkpoint if there is one")
