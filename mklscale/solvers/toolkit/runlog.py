"""RunLog: the record of one solve.

Every history entry a solver appends gets the solve's running totals: ``seconds`` since the solve
began, and ``passes`` / ``bytes_read``, the engine's counters (mklscale.engine.contract.Counters)
since then. All three are totals within this solve only (an engine used by earlier fits does not
leak its counts into this one), so entry i of any solver can be plotted against time or passes.
A solve resumed from a checkpoint continues the totals of the saved one (``state`` / ``restore``),
and its first new entry carries ``"resumed": True``.

The verbose lines explain themselves (issue 28): a marker or abbreviation is explained by one
``legend:`` line the first time it is printed in a solve (:meth:`RunLog.explain`), and a line whose
relative duality gap is above the gap of the previous line that printed one ends with why
(:meth:`RunLog.say`): the gap was re-measured over all kernels after lines that covered only the
working set, an event the solver names (the working set grew, a continuation restarted), or else the
solver's statement that its gap is not monotone between iterations.
"""

from __future__ import annotations

import math
import time

from mklscale.engine.contract import Counters, KernelEngine

_NO_COUNTERS = Counters(0, 0)


class RunLog:
    """History, running totals and the verbose line of one solve.

    engine : the engine the solver reads (None for kernel families computed in the driver: their
        passes and bytes stay 0).
    name : the prefix of the verbose lines, e.g. "spicy".
    verbose : print the lines given to :meth:`record` / :meth:`say`.
    not_monotone : why this solver's gap may rise from one line to the next when nothing else explains
        it (see :meth:`say`), e.g. "the proximal iterates' gap is not monotone".
    """

    def __init__(self, engine: KernelEngine | None, name: str, verbose: bool = False, not_monotone: str | None = None):
        self.engine, self.name, self.verbose = engine, name, bool(verbose)
        self.not_monotone = not_monotone or "this solver's gap is not monotone from one iteration to the next"
        self.history: list[dict] = []
        self._t0 = time.perf_counter()
        self._base = self._counters()
        self._resumed = False
        self._explained: set[str] = set()
        self._last_gap: tuple[float, str | None] | None = None   # (gap, scope) of the last line with a gap

    def _counters(self) -> Counters:
        return self.engine.counters() if self.engine is not None else _NO_COUNTERS

    def totals(self) -> dict:
        """{"passes", "bytes_read", "seconds"} of this solve so far."""
        now = self._counters()
        return {"passes": now.passes - self._base.passes, "bytes_read": now.bytes_read - self._base.bytes_read,
                "seconds": time.perf_counter() - self._t0}

    def record(self, entry: dict, line: str | None = None, gap: float | None = None, scope: str | None = None,
               why: str | None = None) -> dict:
        """Append ``entry`` with the running totals (and the resume mark); print ``line`` if verbose
        (``gap``, ``scope``, ``why``: see :meth:`say`)."""
        entry.update(self.totals())
        if self._resumed:
            entry["resumed"], self._resumed = True, False
        self.history.append(entry)
        if line is not None:
            self.say(line, gap=gap, scope=scope, why=why)
        return entry

    def say(self, line: str, gap: float | None = None, scope: str | None = None, why: str | None = None) -> None:
        """Print ``[name] line`` if verbose.

        ``gap``: the relative duality gap the line shows; ``scope``: what it was measured over,
        ``"working set"`` (the kernels the solver holds) or ``"all"`` (every kernel of the bank), None
        when the solver has one scope. When ``gap`` is above the gap of the previous line that gave
        one, the line ends with ``<- gap up from <previous>:`` and the reasons: re-measured over all
        kernels (previous scope the working set, this one all), ``why`` (an event the solver names:
        "the working set grew by 12 kernels"), or, when neither applies, the log's ``not_monotone``.
        """
        if gap is not None and math.isfinite(gap):
            if self._last_gap is not None and gap > self._last_gap[0]:
                line += f"  <- gap up from {self._last_gap[0]:.2e}: {self._rise_reason(scope, why)}"
            self._last_gap = (float(gap), scope)
        if self.verbose:
            print(f"[{self.name}] {line}", flush=True)

    def _rise_reason(self, scope: str | None, why: str | None) -> str:
        reasons = []
        if scope == "all" and self._last_gap[1] not in (None, "all"):
            kernels = f"all {self.engine.M} kernels" if self.engine is not None else "all kernels"
            reasons.append(f"re-measured over {kernels} (the previous gap covered only the working set)")
        if why:
            reasons.append(why)
        return "; ".join(reasons) if reasons else self.not_monotone

    def explain(self, marker: str, meaning: str) -> None:
        """Print ``[name] legend: marker = meaning`` once per solve, before the first line showing
        ``marker`` (a later call with the same marker prints nothing)."""
        if marker not in self._explained:
            self._explained.add(marker)
            self.say(f"legend: {marker} = {meaning}")

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
