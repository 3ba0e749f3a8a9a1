"""Run a pass — a Dask graph of per-task calls — threaded in-process or on a distributed cluster.

A pass is a list of calls ``(function, *args)``; an argument wrapped in ``Shared`` (the vectors,
T) enters the graph once, as its own key (or, on a cluster and above SCATTER_BYTES, as data
scattered to every worker), and every task that names it depends on it: a cluster ships it once
per worker rather than once per task. Results come back in call order.

On a cluster, a pass waits in slices and checks the scheduler between them
(:mod:`mklscale.runtime.liveness`): losing the scheduler raises
:class:`~mklscale.errors.ClusterUnavailableError` within about HEARTBEAT_S + HEARTBEAT_TIMEOUT_S
seconds, never a hang. Losing a worker is not an error: the scheduler reruns its tasks elsewhere
and the results are the same bits.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

from mklscale.engine.plan import tree_pairs
from mklscale.engine.tasks import add
from mklscale.errors import ClusterUnavailableError
from mklscale.runtime.liveness import HEARTBEAT_S, HEARTBEAT_TIMEOUT_S, POLL_S, SchedulerWatch  # noqa: F401

#: Pass-wide arguments larger than this go to a cluster's workers by scatter, not in the graph.
SCATTER_BYTES = 2**20


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
            watch = SchedulerWatch(self.client, f"the '{op}' pass")
            watch.check()
            try:
                dsk, keys = self._graph(op, calls)  # may scatter to the workers
            except Exception as exc:
                if watch.connected():
                    raise
                raise watch.lost(exc) from exc
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
        watch = SchedulerWatch(client, f"the '{op}' pass")
        futures = None
        try:
            futures = client.get(dsk, keys, sync=False)
            step = n_tasks // len(keys) if len(keys) < n_tasks else 1
            shown = 0
            while not self._all_done(futures):
                if self.progress:
                    finished = sum(f.done() for f in futures)
                    bar.update(step * (finished - shown))
                    shown = finished
                watch.check()
            bar.update(step * (len(futures) - shown))
            return list(client.gather(futures))
        except ClusterUnavailableError:
            raise
        except Exception as exc:
            if watch.connected():
                raise  # a task's own error (bad data, corrupt shard): not the cluster's fault
            raise watch.lost(exc) from exc
        finally:
            if futures is not None and watch.connected():
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
