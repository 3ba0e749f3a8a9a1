"""benchmarks/bench_peers.py and benchmarks/peers/run_mklpy.py: the equal-footing pieces (issue 21) —
the CV folds both sides share, the choice rule, the matched-pair agreement, and MKLpy's CV + fit run
end to end where the MKLpy environment exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _benchmarks import ROOT, load_module

MKLPY_PY = Path(os.environ.get("MKLPY_VENV", ROOT / "benchmarks" / "peers" / ".venv")) / "bin" / "python"


@pytest.fixture(scope="module")
def bench():
    return load_module("bench_peers", ROOT / "benchmarks" / "bench_peers.py")


@pytest.fixture(scope="module")
def runner():
    return load_module("run_mklpy", ROOT / "benchmarks" / "peers" / "run_mklpy.py")


def test_choice_rule_is_model_selections(runner):
    """run_mklpy.best_index (it cannot import mklscale) picks what cv.best_index picks, ties included."""
    from mklscale.solvers.cv import best_index as _best

    rng = np.random.default_rng(0)
    grid = [0.1, 1.0, 10.0, 100.0]
    for _ in range(200):
        mean = rng.integers(0, 3, size=4) / 2.0  # many ties
        for larger in (True, False):
            assert runner.best_index(mean, grid, larger) == _best(mean, grid, larger)


def test_folds_reach_mklpy_as_our_cv_uses_them(bench, runner, tmp_path):
    """The fold array in the exported npz is cv.fold_assignment's (what model_selection.select uses
    with the same seed), and run_mklpy's fold_rows partitions the rows, stratified."""
    from mklscale.bank import build_bank, families
    from mklscale.solvers import cv

    rng = np.random.default_rng(1)
    X = rng.standard_normal((30, 4))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    bank = build_bank(X, families.random_subsets(4, 3, seed=0), tmp_path / "bank", normalize="diag",
                      dtype="float32", progress=False)
    fold = bench.cv_folds(y, 3, seed=7)
    np.testing.assert_array_equal(fold, cv.fold_assignment(y, 3, True, 7))
    bench.export_npz(bank, X[:5], y, y[:5], tmp_path / "g.npz", fold=fold)
    with np.load(tmp_path / "g.npz", allow_pickle=False) as z:
        np.testing.assert_array_equal(z["fold"], fold)
        assert z["K_train"].shape == (3, 30, 30)
    seen = []
    for k in range(3):
        tr, te = runner.fold_rows(fold, k)
        assert np.intersect1d(tr, te).size == 0 and tr.size + te.size == y.size
        assert abs(np.mean(y[te] > 0) - np.mean(y > 0)) < 0.15
        seen.append(te)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(y.size))


def test_agreement_of_a_matched_pair(bench):
    peer = {"test_accuracy": 0.9, "test_pred": [1, -1, 1, 1], "weights": [1.0, 1.0, 2.0]}
    ours = {"test_accuracy": 0.8, "test_pred": [1, -1, -1, 1], "weights": [0.25, 0.25, 0.5]}
    a = bench.agreement(peer, ours)
    assert a["accuracy_diff"] == pytest.approx(0.1)
    assert a["test_label_agreement"] == 0.75
    assert a["weights_max_abs_diff"] == pytest.approx(0.0)


@pytest.mark.skipif(not MKLPY_PY.exists(), reason="no MKLpy environment (bash benchmarks/peers/setup_mklpy_venv.sh)")
def test_mklpy_cv_then_fit(runner, tmp_path):
    """run_mklpy.py with a CV'd method: C chosen from the grid on the npz's folds, CV seconds and the
    iterations / stopping reason recorded, the fit's peak read before the test kernels are loaded."""
    from tests._banks import subset_gaussian_bank

    grams, y = subset_gaussian_bank(45, 3, seed=2)
    tr, te = np.arange(36), np.arange(36, 45)
    fold = np.arange(36) % 3
    c = np.ascontiguousarray
    np.savez(tmp_path / "g.npz", K_train=c(grams[:, tr][:, :, tr]), K_test=c(grams[:, te][:, :, tr]),
             y_train=y[tr], y_test=y[te], fold=fold)
    run = subprocess.run([str(MKLPY_PY), str(ROOT / "benchmarks" / "peers" / "run_mklpy.py"), str(tmp_path / "g.npz"),
                          "--out", str(tmp_path / "r.json"), "--methods", "GRAM,AverageMKL", "--cv-methods", "GRAM",
                          "--cv-grid", "0.1,1,10,100", "--max-iter", "30", "--threads", "1"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads((tmp_path / "r.json").read_text())
    gram, avg = out["methods"]["GRAM"], out["methods"]["AverageMKL"]
    assert gram["status"] == "ok" and avg["status"] == "ok", (gram, avg)
    assert gram["cv"]["grid"] == [0.1, 1.0, 10.0, 100.0] and gram["C"] == gram["cv"]["chosen"] in gram["cv"]["grid"]
    assert np.asarray(gram["cv"]["fold_scores"]).shape == (4, 3) and gram["cv_seconds"] > 0
    assert 1 <= gram["iterations"] <= 30 and gram["stopped_on"]
    assert "cv" not in avg and avg["C"] == 1.0
    assert avg["peak_rss_GB"] <= avg["predict_peak_rss_GB"]
    assert out["warmup"]["failed"] == {}
    assert len(gram["test_pred"]) == te.size


def test_readme_states_the_footing_and_the_stops():
    """The README's peers section (benchmarks/readme_peers.py) states the CV, grids and stopping rules from a run's params, and
    each fit's iterations and stopping reason; runs from before issue 21 keep their old sentence."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        mr = load_module("readme_peers", ROOT / "benchmarks" / "readme_peers.py")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    p = {"C": 1.0, "match": {"AverageMKL": "uniform"},
         "cv": {"enabled": True, "folds": 3, "seed": 0, "metric": "accuracy", "rule": "ties to the more regularised",
                "mklpy_methods": ["GRAM"], "mklpy_grid": [0.1, 1.0], "mklpy_parameter": "SVM C",
                "ours_grid": "C_max x [0.1, 0.03]", "ours_parameter": "SpicyMKL's C", "time_limit_s": 240.0},
         "stopping": {"svm": "libsvm tol 1e-3", "GRAM/RMKL/MEMO": "ReduceOnWorsening", "spicy": "gap 0.01",
                      "smo": "OPT_3"}}
    text = mr._peers_footing(p)
    assert "3-fold stratified CV" in text and "[0.1, 1.0]" in text and "ReduceOnWorsening" in text
    assert "AverageMKL / UNIFORM" in text
    assert "no model selection" in mr._peers_footing({"C": 1.0, "mklpy_max_iter": 100})
    assert mr._peer_stop({"status": "ok", "iterations": 12, "stopped_on": "max_iter 2000"}) == "12 (max_iter 2000)"
    assert mr._peer_stop({"status": "ok", "iterations": 3, "converged": True}) == "3 (converged)"
    assert mr._peer_stop({"status": "timeout"}) == "-"
