"""One rule for every solver's history (issue 16, defect 1): ``seconds``, ``passes`` and
``bytes_read`` are running totals within one solve, so each is non-decreasing along the history and a
second solve on the same engine reports the same passes as the first (nothing leaks from earlier
fits on that engine)."""

from __future__ import annotations

import numpy as np
import pytest
from _banks import subset_gaussian_bank

from mklscale.engine import InMemoryEngine
from mklscale.solvers import registry

PARAMS = {"sgd": {"T": 60, "record_every": 10}, "gcd": {"max_iter": 15}, "smo": {"C": 10.0}, "citi": {"C": 10.0}}


@pytest.mark.parametrize("name", registry.names())
def test_history_holds_running_totals_of_this_solve(name):
    grams, y = subset_gaussian_bank(30, 8, seed=4)
    grams = grams / (np.trace(grams, axis1=1, axis2=2)[:, None, None] / 30)
    task = "classification" if registry.supports(name, "classification") else "regression"
    engine = InMemoryEngine(grams)
    params = dict(PARAMS.get(name, {}))
    C = params.pop("C", None)
    runs = [registry.fit_solver(name, engine, y, task, C=C, params=params) for _ in range(2)]
    for res in runs:
        assert res.history, f"{name} records no history"
        for key in ("seconds", "passes", "bytes_read"):
            values = [h[key] for h in res.history]
            assert all(np.diff(values) >= 0), f"{name}: history[{key!r}] is not a running total: {values}"
    first, second = ([h["passes"] for h in r.history] for r in runs)
    assert first == second, f"{name}: a second solve on the same engine reports other passes: {first} vs {second}"
    assert runs[1].history[-1]["passes"] <= engine.counters().passes - runs[0].history[-1]["passes"]


# ---- the verbose lines explain themselves (issue 28) ------------------------------------------------------
import re  # noqa: E402

from mklscale.solvers.toolkit import RunLog  # noqa: E402

GAP = re.compile(r"\bgap[ =]([-+0-9.e]+|inf|nan)\b")
#: markers of each solver's lines and the legend that must come before the first line showing them
MARKERS = {"spicy": [("(W)", "(W) = "), (" active ", "active a/w/M = ")],
           "pfbs": [("[working_set]", "[working_set] = "), ("[all]", "[all] = ")],
           "smo": [(" opt4 ", "opt4, eps1 = "), ("  W ", "W = ")],
           "citi": [(" O_low ", "O_up, O_low = "), (" selected ", "selected = ")],
           "gcd": [(" fw ", "fw = "), (" gap=", "gap = ")],
           "sgd": [(" C=", "C = ")]}
VERBOSE = {"spicy": {"working_set": [0]}, "pfbs": {"working_set": [0], "accelerated": False},
           "gcd": {"max_iter": 15, "variant": "away"},
           "sgd": {"T": 60, "record_every": 10}, "smo": {"max_working_set": 1}}


@pytest.mark.parametrize("name", ["spicy", "pfbs", "smo", "citi", "gcd", "sgd"])
def test_verbose_lines_explain_their_markers_and_every_rise_of_the_gap(name, capsys):
    """Each marker is explained by a `legend:` line before the first line showing it (once), and a line
    whose gap is above the previous line's says why on that line. SpicyMKL and PFBS start from a
    working set of one kernel, so their gap is re-measured over all kernels and jumps up."""
    grams, y = subset_gaussian_bank(40, 12, seed=4)
    grams = grams / (np.trace(grams, axis1=1, axis2=2)[:, None, None] / 40)
    task = "classification" if registry.supports(name, "classification") else "regression"
    params = {**VERBOSE.get(name, {}), **PARAMS.get(name, {}), "verbose": True}
    C = params.pop("C", None)
    capsys.readouterr()
    registry.fit_solver(name, InMemoryEngine(grams), y, task, C=C, params=params)
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    legends = [i for i, line in enumerate(lines) if line.startswith("legend: ")]
    for marker, legend in MARKERS[name]:
        first = next(i for i, line in enumerate(lines) if marker in line and i not in legends)
        explained = [i for i in legends if lines[i].startswith(f"legend: {legend}")]
        assert len(explained) == 1 and explained[0] < first, (marker, lines[:first + 1])
    previous, rises = None, 0
    for line in lines:
        found = GAP.search(line) if not line.startswith("legend: ") else None
        if found is None or not np.isfinite(float(found.group(1))):
            continue
        gap = float(found.group(1))
        if previous is not None and gap > previous:
            rises += 1
            assert "  <- gap up from " in line and line.split("<- gap up from ", 1)[1].split(": ", 1)[1], line
        previous = gap
    if name in ("spicy", "pfbs"):
        jumps = [line for line in lines if "re-measured over all 12 kernels" in line]
        assert rises >= 1 and jumps, lines


def test_runlog_says_why_a_gap_rises_and_explains_a_marker_once(capsys):
    log = RunLog(InMemoryEngine(np.stack([np.eye(3)] * 4)), "t", verbose=True, not_monotone="it wobbles")
    log.explain("(W)", "working set only")
    log.say("a", gap=1e-3, scope="working set")
    log.explain("(W)", "working set only")
    log.say("b", gap=0.43, scope="all")
    log.say("c", gap=0.1, scope="working set")
    log.say("d", gap=0.2, scope="working set", why="the working set grew by 2 kernels")
    log.say("e", gap=0.3, scope="working set")
    log.say("f", gap=0.01)
    assert capsys.readouterr().out.splitlines() == [
        "[t] legend: (W) = working set only", "[t] a",
        "[t] b  <- gap up from 1.00e-03: re-measured over all 4 kernels (the previous gap covered only the working set)",
        "[t] c", "[t] d  <- gap up from 1.00e-01: the working set grew by 2 kernels",
        "[t] e  <- gap up from 2.00e-01: it wobbles", "[t] f"]
    quiet = RunLog(None, "t")
    quiet.explain("x", "y")
    quiet.say("line", gap=1.0)
    assert capsys.readouterr().out == ""
