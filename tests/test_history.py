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
