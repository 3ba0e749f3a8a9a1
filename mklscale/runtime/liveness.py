"""Bounded waits on a Dask cluster: notice a lost or frozen scheduler instead of hanging.

Long operations on a ``distributed.Client`` (engine passes, bank builds) wait in slices of POLL_S
seconds and call :meth:`SchedulerWatch.check` between them: it fails when the client's connection
is closed and, every HEARTBEAT_S seconds, asks the scheduler for its identity, which must answer
within HEARTBEAT_TIMEOUT_S. Losing the scheduler (killed, its host gone, the connection closed, or
a scheduler that stops answering) therefore raises
:class:`~mklscale.errors.ClusterUnavailableError` within about HEARTBEAT_S + HEARTBEAT_TIMEOUT_S
seconds. Losing a worker is not an error: the scheduler reruns its tasks elsewhere.
"""

from __future__ import annotations

import time

from mklscale.errors import ClusterUnavailableError

#: Seconds between checks of the client's connection while an operation runs on a cluster.
POLL_S = 0.5
#: Seconds between pings of the scheduler, and how long a ping may take.
HEARTBEAT_S = 5.0
HEARTBEAT_TIMEOUT_S = 10.0


class SchedulerWatch:
    """Liveness checks of ``client``'s scheduler during one operation (``what`` names it in errors)."""

    def __init__(self, client, what: str):
        self.client, self.what = client, what
        self._last_ping = time.monotonic()

    def connected(self) -> bool:
        client = self.client
        if client is None or client.status != "running":
            return False
        comm = getattr(client, "scheduler_comm", None)
        return comm is not None and comm.comm is not None and not comm.comm.closed()

    def check(self) -> None:
        """Raise ClusterUnavailableError if the connection is closed or a due ping goes unanswered."""
        if not self.connected():
            raise self.lost(None)
        if time.monotonic() - self._last_ping >= HEARTBEAT_S:
            try:
                self.client.sync(self.client.scheduler.identity, callback_timeout=HEARTBEAT_TIMEOUT_S)
            except Exception as exc:  # timeout, closed comm, OSError: all mean no scheduler
                raise self.lost(exc) from exc
            self._last_ping = time.monotonic()

    def lost(self, exc: BaseException | None) -> ClusterUnavailableError:
        client = self.client
        address = getattr(getattr(client, "scheduler", None), "address", None) or "(unknown address)"
        status = getattr(client, "status", "closed")
        why = f" ({type(exc).__name__}: {exc})" if exc is not None and str(exc) else \
            (f" ({type(exc).__name__})" if exc is not None else "")
        return ClusterUnavailableError(
            f"lost the Dask scheduler at {address} during {self.what} (client status: {status}){why}. "
            "It was abandoned; restart the scheduler (or the cluster) and run again, resuming from the "
            "last checkpoint if there is one")
