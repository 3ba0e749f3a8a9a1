"""RunLog: the record of one solve.

Every history entry a solver appends gets the solve's running totals: ``seconds`` since the solve
began, and ``passes`` / ``bytes_read``, the engine's counters (mklscale.engine.contract.Counters)
since then. All three are totals within this solve only (an engine used by earlier fits does not
leak its counts into this one), so entry i of any solver can be plotted against time or passes.
A solve resumed from a checkpoint continues the totals of the saved one (``state`` / ``restore``),
and its first new entry carries ``"resumed": True``.
"""

from __future__ import annotations

import time

from mklscale.engine.contract import Counters, KernelEngine

_NO_COUNTERS = Counters(0, 0)


class RunLog:
    """History, running totals and the verbose line of one solve.

    engine : the engine the solver reads (None for kernel families computed in the driver: their
        passes and bytes stay 0).
    name : the prefix of the verbose lines, e.g. "spicy".
    verbose : print the lines given to :meth:`record` / :meth:`say`.
    """

    def __init__(self, engine: KernelEngine | None, name: str, verbose: bool = False):
        self.engine, self.name, self.verbose = engine, name, bool(verbose)
        self.history: list[dict] = []
        self._t0 = time.perf_counter()
        self._base = self._counters()
        self._resumed = False

    def _counters(self) -> Counters:
        return self.engine.counters() if self.engine is not None else _NO_COUNTERS

    def totals(self) -> dict:
        """{"passes", "bytes_read", "seconds"} of this solve so far."""
        now = self._counters()
        return {"passes": now.passes - self._base.passes, "bytes_read": now.bytes_read - self._base.bytes_read,
                "seconds": time.perf_counter() - self._t0}

    def record(self, entry: dict, line: str | None = None) -> dict:
        """Append ``entry`` with the running totals (and the resume mark); print ``line`` if verbose."""
        entry.update(self.totals())
        if self._resumed:
            entry["resumed"], self._resumed = True, False
        self.history.append(entry)
        if line is not None:
            self.say(line)
        return entry

    def say(self, line: str) -> None:
        if self.verbose:
            print(f"[{self.name}] {line}", flush=True)

    def state(self) -> dict:
        """What a checkpoint keeps of the log: the history and the totals."""
        return {"history": self.history, **self.totals()}

    def restore(self, state: dict) -> None:
        """Continue the log of :meth:`state`'s dict: its history, and totals counted on from its own."""
        self.history = list(state["history"])
        now = self._counters()
        self._base = Counters(now.passes - int(state["passes"]), now.bytes_read - int(state["bytes_read"]))
        self._t0 = time.perf_counter() - float(state["seconds"])
        self._resumed = True
