"""The README's first command, ``mklscale run pipelines/quickstart.toml``: every solver it shows is at a
cross-validated setting and beats (or matches) the majority-class rate, and none is a constant predictor.

This is the one slow-ish default test (the whole quickstart: bank, CV, refits, report); it runs on the
session's LocalCluster and writes into a temporary run directory instead of runs/quickstart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mklscale.pipeline import run_pipeline

QUICKSTART = Path(__file__).resolve().parents[1] / "pipelines" / "quickstart.toml"


def test_quickstart_solvers_are_cross_validated_and_beat_the_majority_rate(tmp_path, cluster_client):
    address = {"kind": "address", "address": cluster_client.scheduler.address}
    results = run_pipeline(QUICKSTART, out=tmp_path / "quickstart", cluster=address, quiet=True)
    majority = results["dataset"]["null_model"]["test_accuracy"]
    assert results["dataset"]["null_model"]["kind"] == "majority_class" and 0.5 < majority < 0.7
    assert (tmp_path / "quickstart" / "report" / "index.html").is_file()
    for entry in results["solvers"]:
        name, cv = entry["name"], entry["cv"]
        assert entry["status"] == "ok", name
        assert cv is not None and cv["folds"] == 3 and cv["chosen"] in cv["grid"], name
        assert entry["params"][cv["key"]] == cv["chosen"], name
        assert cv["mean"][cv["grid"].index(cv["chosen"])] == np.nanmax(cv["mean"]), name   # NaN: past a fold's stop
        assert entry["constant_predictor"]["constant"] is False, name
        assert entry["null_model"] == {"metric": "test_accuracy", "solver": entry["metrics"]["test_accuracy"],
                                       "null": majority, "at_least_null": True}, name
        assert entry["metrics"]["test_accuracy"] > majority + 0.2, name    # far from the majority rate
