"""A pipeline stopped by SIGTERM mid-solve exits 75 and `--resume` finishes with the uninterrupted result,
on a stored bank and on a computed one (its kernels computed in every pass: the resumed process checks
each kernel whole on its first pass and then folds its quad forms on the fly, the same bits)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mklscale.pipeline import run_pipeline
from mklscale.runtime.checkpoint import EXIT_PREEMPTED

PIPELINE = """
name = "resume"
[dataset]
name = "breast_cancer"
test_fraction = 0.3
max_train = 60
[bank]
families = [{ family = "gaussian", widths = [1, 2, 5], features = "all" }, { family = "linear", features = "all" }]
[[solver]]
name = "first"
solver = "uniform"
[[solver]]
name = "sgd"
solver = "sgd"
C = 0.1
T = 10000
seed = 3
tol = 1e-12          # never certified: all T iterations run, long enough to be interrupted
[report]
enabled = false
[checkpoint]
every_s = 0.05
"""
CLUSTER = 'kind = "local"\nn_workers = 1\nprocesses = false\n'


def _arrays(run_dir: Path, name: str) -> dict:
    with np.load(run_dir / "models" / name / "arrays.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.cluster
@pytest.mark.parametrize("computed", [False, True], ids=["stored", "computed"])
def test_sigterm_then_resume_equals_uninterrupted(tmp_path, computed):
    spec, cluster = tmp_path / "p.toml", tmp_path / "c.toml"
    spec.write_text(PIPELINE.replace("[bank]\n", "[bank]\ncomputed = true\n") if computed else PIPELINE)
    cluster.write_text(CLUSTER)
    whole = run_pipeline(spec, out=tmp_path / "whole", cluster=cluster, quiet=True)

    run_dir = tmp_path / "cut"
    child = subprocess.Popen([sys.executable, "-m", "mklscale.cli", "run", str(spec), "--cluster", str(cluster),
                              "--out", str(run_dir), "--quiet"], stderr=subprocess.PIPE, text=True)
    checkpoint = run_dir / "checkpoints" / "sgd"
    deadline = time.monotonic() + 120
    while not list(checkpoint.glob("*.npz")):
        assert child.poll() is None, f"the run ended before its first checkpoint: {child.stderr.read()}"
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == EXIT_PREEMPTED, err
    assert "SIGTERM" in err and "--resume" in err
    assert (run_dir / "checkpoints" / "first.done.json").is_file()
    assert not (run_dir / "results.json").exists()

    resumed = run_pipeline(spec, out=run_dir, cluster=cluster, quiet=True, resume=True)
    for name in ("first", "sgd"):
        a, b = _arrays(tmp_path / "whole", name), _arrays(run_dir, name)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}: {key}")
    assert [s["metrics"] for s in resumed["solvers"]] == [s["metrics"] for s in whole["solvers"]]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["bank"].get("representation", "dense") == ("computed" if computed else "dense")
    history = results["solvers"][1]["history"]
    assert any(h.get("resumed") for h in history)
    assert not list(checkpoint.glob("*.npz"))          # cleared once the result is stored
    assert sorted(os.listdir(run_dir / "models")) == ["first", "sgd"]
