"""Model selection in pipelines (mklscale.model_selection) and the null-model checks (mklscale.null_model):
grids in [[solver]] entries, k-fold CV on row subsets of the same bank, the cv record in results.json,
the majority-class / mean predictor beside each solver and the constant-predictor flag."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mklscale import model_selection, null_model
from mklscale.bank.store import KernelBank
from mklscale.engine import Engine, InMemoryEngine
from mklscale.errors import ConfigError
from mklscale.pipeline import CONSTANT_PREDICTOR, load_pipeline, run_pipeline
from mklscale.solvers import cv, paths, registry
from tests._banks import subset_gaussian_bank

ROOT = Path(__file__).resolve().parents[1]

SPEC = {
    "name": "cv",
    "seed": 3,
    "dataset": {"name": "breast_cancer", "test_fraction": 0.3, "max_train": 60},
    "bank": {"families": [{"family": "gaussian", "widths": [1, 2, 5], "features": "all"},
                          {"family": "linear", "features": "all"}]},
    "solver": [{"name": "uni_cv", "solver": "uniform", "C": "auto"},
               {"name": "uni_c1", "solver": "uniform", "C": 1.0},
               {"name": "spicy_cv", "solver": "spicy", "C": [0.02, 0.2, 2.0], "cv_folds": 4}],
    "report": {"enabled": False},
}


def _spec(**solver) -> dict:
    return {**SPEC, "solver": [{"name": "s", "solver": "uniform", **solver}]}


# ---- configuration ----------------------------------------------------------------------------
@pytest.mark.parametrize("solver, fragment", [
    ({"C": "autp"}, 'must be a number > 0, a list of them or "auto"'),
    ({"C": []}, "is an empty list"),
    ({"C": [1.0, -2.0]}, "a list of numbers > 0"),
    ({"C": [1.0, True]}, "a list of numbers > 0"),
    ({"C": "auto", "cv_folds": 1}, "cv_folds: must be >= 2"),
    ({"C": 1.0, "cv_folds": 3}, "cv_folds applies only when C"),
    ({"C": "auto", "lam": "auto"}, "C and lam are both grids"),
    ({"lam": "often"}, 'lam must be a number > 0, a list of them or "auto"'),
])
def test_bad_grid_is_a_config_error_naming_the_key(solver, fragment):
    with pytest.raises(ConfigError) as info:
        load_pipeline(_spec(**solver))
    assert fragment in str(info.value)


def test_grid_under_a_name_the_task_does_not_use_fails_before_any_work(tmp_path):
    """uniform regularises a classification by its SVM's C: a lam grid is refused before the cluster starts."""
    spec = {**SPEC, "solver": [{"name": "s", "solver": "uniform", "lam": [0.1, 1.0]}]}
    with pytest.raises(ConfigError, match="lam is not what uniform regularises on a classification task"):
        run_pipeline(spec, out=tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


def test_grid_requests_are_read_from_C_or_the_solvers_own_name():
    pipe = load_pipeline({**SPEC, "solver": [
        {"name": "a", "solver": "smo", "C": [100, 10]},
        {"name": "b", "solver": "pfbs", "tau": "auto", "cv_folds": 5},
        {"name": "c", "solver": "spicy", "C": 0.1}]})
    a, b, c = (model_selection.request(s) for s in pipe.solvers)
    assert a == model_selection.Request("C", [10.0, 100.0], 3)
    assert b == model_selection.Request("tau", "auto", 5)
    assert c is None


def test_shipped_main_pipelines_cross_validate_every_solver():
    for name in ("quickstart", "uci_simplemkl"):
        pipe = load_pipeline(ROOT / "pipelines" / f"{name}.toml")
        assert all(model_selection.request(s) is not None for s in pipe.solvers), name


# ---- the cross-validation ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_bank(tmp_path_factory):
    grams, y = subset_gaussian_bank(n=48, M=5, seed=1)
    bank = KernelBank.from_arrays(grams, tmp_path_factory.mktemp("bank") / "b.zarr", normalize="trace")
    return bank, y


def _select(bank, y, grid, tmp_path, seed=0, resume=False, folds=3, solver="uniform", **params):
    entry = {"name": "s", "solver": solver, "C": grid, "params": params, "cv_folds": folds}
    with Engine(bank) as engine:
        return model_selection.select(entry, model_selection.request(entry), engine, "classification", y,
                                      [-1.0, 1.0], seed, tmp_path / "s.cv.json", resume, lambda *a: None)


def _grams(bank) -> np.ndarray:
    return np.asarray([bank.kernel(m) for m in range(len(bank))], dtype=np.float64)


def test_fold_scores_are_fits_on_the_fold_rows_scored_on_the_held_out_rows(small_bank, tmp_path):
    """Every fold score equals a fit on the principal submatrices of the training rows (an in-memory
    engine, no view) scored by f = sum_m w_m K_m[test, train] c + b on the held-out rows."""
    bank, y = small_bank
    record = _select(bank, y, [1.0, 30.0, 1000.0], tmp_path, seed=7)
    grams = _grams(bank)
    fold = cv.fold_assignment(y, 3, True, 7)
    expected = np.empty((3, 3))
    for i, C in enumerate(record["grid"]):
        for k in range(3):
            tr, te = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
            res = registry.fit_solver("uniform", InMemoryEngine(grams[:, tr][:, :, tr]), y[tr], "classification", C=C)
            f = np.einsum("m,mij,j->i", res.weights, grams[:, te][:, :, tr], res.dual_coef) + res.bias
            expected[i, k] = np.mean(np.where(f > 0, 1.0, -1.0) == y[te])
    np.testing.assert_allclose(record["fold_scores"], expected, atol=1e-12)
    np.testing.assert_allclose(record["mean"], expected.mean(axis=1))
    np.testing.assert_allclose(record["std"], expected.std(axis=1))
    assert record["chosen"] == record["grid"][int(np.argmax(expected.mean(axis=1)))] or \
        np.ptp(expected.mean(axis=1)) == 0
    assert record["folds"] == 3 and record["seed"] == 7 and record["metric"] == "accuracy"


def test_folds_are_stratified_and_seeded():
    y = np.array([1.0] * 40 + [-1.0] * 20)
    a, b, c = (cv.fold_assignment(y, 3, True, s) for s in (0, 0, 1))
    np.testing.assert_array_equal(a, b)
    assert np.any(a != c)
    for k in range(3):
        assert np.sum((a == k) & (y > 0)) in (13, 14) and np.sum((a == k) & (y < 0)) in (6, 7)


def test_ties_go_to_the_more_regularised_value():
    mean = np.array([0.9, 0.95, 0.95, 0.9])
    grid = [1.0, 10.0, 100.0, 1000.0]
    assert cv.best_index(mean, grid, larger_regularises=False) == 1   # SVM C: the smaller
    assert cv.best_index(mean, grid, larger_regularises=True) == 2    # penalty / ridge: the larger


def test_auto_grids_follow_the_problem_scale(small_bank):
    """The registry rows' "auto" grids: 10 values from the most regularised end, on the problem's scale."""
    bank, y = small_bank
    engine, n = InMemoryEngine(_grams(bank)), y.size

    def grid(solver, task, params=None):
        return registry.regularisation(solver, task, params).grid(engine, [y], task, params or {})

    svm, rule = grid("smo", "classification")
    np.testing.assert_allclose(svm, np.geomspace(0.01 * n, 100 * n, 10), rtol=5e-3)   # unit trace: n / mean trace = n
    assert "n / mean trace" in rule
    ridge, _ = grid("uniform", "regression")
    np.testing.assert_allclose(ridge, np.geomspace(100 / n, 1e-3 / n, 10), rtol=5e-3)
    # spicy: C_max is the smallest C with an empty model: just above it no kernel, just below some
    spicy, rule = grid("spicy", "classification", {"loss": "logistic"})
    c_max = float(rule.rsplit("= ", 1)[1])
    np.testing.assert_allclose(spicy, np.geomspace(c_max, 1e-3 * c_max, 10), rtol=5e-3)
    above = registry.fit_solver("spicy", engine, y, "classification", C=1.05 * c_max, params={"tol": 1e-6})
    below = registry.fit_solver("spicy", engine, y, "classification", C=0.9 * c_max, params={"tol": 1e-6})
    assert above.active.size == 0 and below.active.size > 0
    tau, rule = grid("pfbs", "classification")
    tau_max = float(rule.rsplit("= ", 1)[1])
    assert registry.fit_solver("pfbs", engine, y, "classification", C=1.05 * tau_max).active.size == 0
    assert registry.fit_solver("pfbs", engine, y, "classification", C=0.9 * tau_max).active.size > 0
    # "auto" as a single value is the row's default on the same scale
    assert registry.resolve_C("smo", engine, [y], "classification") == pytest.approx(n, rel=2e-3)
    assert registry.resolve_C("spicy", engine, [y], "classification", {"loss": "logistic"}) == \
        pytest.approx(0.1 * c_max, rel=1e-3)


def test_resume_reuses_the_finished_fold_scores(small_bank, tmp_path):
    bank, y = small_bank
    state = tmp_path / "s.cv.json"
    first = _select(bank, y, [1.0, 1000.0], tmp_path)
    saved = json.loads(state.read_text())
    saved["scores"][0] = [0.125, 0.25, 0.125]      # planted scores: folds 0 and 2 finished, fold 1 not
    saved["finished"] = [True, False, True]
    state.write_text(json.dumps(saved))
    again = _select(bank, y, [1.0, 1000.0], tmp_path, resume=True)
    assert again["fold_scores"][0][0] == 0.125 and again["fold_scores"][0][2] == 0.125
    assert again["fold_scores"][0][1] == first["fold_scores"][0][1]           # recomputed
    fresh = _select(bank, y, [1.0, 1000.0], tmp_path, resume=False)
    assert fresh["fold_scores"] == first["fold_scores"]
    other_seed = _select(bank, y, [1.0, 1000.0], tmp_path, resume=True, seed=5)  # another problem
    assert other_seed["fold_scores"][0][0] != 0.125


# ---- null model and constant predictors ---------------------------------------------------------
def test_null_model_scores():
    clf = null_model.null_model("classification", np.array([1, 1, 2, 1]), np.array([2, 2, 1]))
    assert clf == {"kind": "majority_class", "label": 1, "train_accuracy": 0.75, "test_accuracy": 1 / 3}
    reg = null_model.null_model("regression", np.array([1.0, 3.0]), np.array([2.0, 4.0]))
    assert reg["value"] == 2.0 and reg["train_r2"] == 0.0 and reg["test_r2"] == pytest.approx(-1.0)
    assert reg["test_rmse"] == pytest.approx(np.sqrt(2.0))
    assert null_model.constant_prediction([np.array([1, 1]), np.array([1])], "classification", None) == \
        {"constant": True, "value": 1}
    assert not null_model.constant_prediction([np.array([1, 1]), np.array([2])], "classification", None)["constant"]
    assert null_model.constant_prediction([np.full(3, 0.5), np.full(2, 0.5)], "regression", [0.0, 1.0])["constant"]
    assert not null_model.constant_prediction([np.array([0.5, 0.6])], "regression", [0.0, 1.0])["constant"]
    nearly = 0.5 + 1e-5 * np.random.default_rng(0).standard_normal(20)    # explains < 1e-6 of the variance
    assert null_model.constant_prediction([nearly], "regression", [0.0, 1.0])["constant"]


@pytest.fixture(scope="module")
def cv_run(tmp_path_factory, cluster_client):
    out = tmp_path_factory.mktemp("cvrun")
    address = {"kind": "address", "address": cluster_client.scheduler.address}
    import contextlib
    import io

    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        results = run_pipeline(SPEC, out=out, cluster=address, quiet=False)
    return out, results, console.getvalue()


def test_pipeline_records_the_cv_curve_and_refits_at_the_chosen_value(cv_run):
    out, results, _ = cv_run
    on_disk = json.loads((out / "results.json").read_text())
    entries = {s["name"]: s for s in on_disk["solvers"]}
    uni, spicy = entries["uni_cv"]["cv"], entries["spicy_cv"]["cv"]
    assert uni["requested"] == "auto" and uni["grid"] == sorted(uni["grid"]) and len(uni["grid"]) == 10
    assert spicy["requested"] == [0.02, 0.2, 2.0] and spicy["grid"] == [0.02, 0.2, 2.0]
    assert spicy["folds"] == 4 and np.shape(spicy["fold_scores"]) == (3, 4)
    assert uni["folds"] == 3 and np.shape(uni["fold_scores"]) == (10, 3)
    for name, cv in (("uni_cv", uni), ("spicy_cv", spicy)):
        assert len(cv["mean"]) == len(cv["std"]) == len(cv["unconverged"]) == len(cv["grid"])
        mean = np.array([np.nan if m == "nan" else m for m in cv["mean"]], dtype=float)   # nan: a value not reached
        assert mean[cv["grid"].index(cv["chosen"])] == np.nanmax(mean)
        assert cv["seed"] == 3 and cv["metric"] == "accuracy" and cv["key"] == "C"
        assert cv["at_edge"] == (cv["chosen"] in (cv["grid"][0], cv["grid"][-1]))
        assert entries[name]["params"]["C"] == cv["chosen"]
        saved = json.loads((out / entries[name]["model"] / "model.json").read_text())
        assert saved["estimator"]["params"]["C"] == cv["chosen"]      # the model is the refit at the choice
    assert entries["uni_c1"]["cv"] is None


def test_null_model_and_constant_predictor_flag(cv_run):
    """Uniform at C = 1 on unit-trace kernels predicts the majority class everywhere: flagged in
    results.json and on the console; the CV-chosen C beats the majority rate."""
    out, results, console = cv_run
    null = results["dataset"]["null_model"]
    assert null["kind"] == "majority_class"
    entries = {s["name"]: s for s in results["solvers"]}
    flat = entries["uni_c1"]
    assert flat["constant_predictor"] == {"constant": True, "value": null["label"]}
    assert flat["null_model"]["null"] == null["test_accuracy"] == flat["metrics"]["test_accuracy"]
    line = next(line for line in console.splitlines() if line.startswith("[uni_c1] test_accuracy"))
    assert f"(majority {null['test_accuracy']:.4f})" in line and CONSTANT_PREDICTOR in line
    for name in ("uni_cv", "spicy_cv"):
        assert entries[name]["constant_predictor"]["constant"] is False
        assert entries[name]["null_model"]["at_least_null"] is True
        assert entries[name]["metrics"]["test_accuracy"] > null["test_accuracy"] + 0.1
    assert f"[cv] null model: majority class {null['label']!r}" in console


def test_regression_run_has_the_mean_predictor_and_flags_a_constant_model(tmp_path, cluster_client):
    spec = {**SPEC, "dataset": {"name": "diabetes", "test_fraction": 0.3, "max_train": 60},
            "solver": [{"name": "ridge_cv", "solver": "uniform", "lam": "auto"},
                       {"name": "flat", "solver": "uniform", "lam": 1e6}]}
    address = {"kind": "address", "address": cluster_client.scheduler.address}
    results = run_pipeline(spec, out=tmp_path / "run", cluster=address, quiet=True)
    null = results["dataset"]["null_model"]
    assert null["kind"] == "mean" and null["train_r2"] == pytest.approx(0.0, abs=1e-12)
    fitted, flat = results["solvers"]
    assert fitted["cv"]["metric"] == "r2" and fitted["cv"]["key"] == "lam" and fitted["cv"]["parameter"] == "lam"
    assert fitted["params"]["lam"] == fitted["cv"]["chosen"] and len(fitted["cv"]["grid"]) == 10
    assert fitted["null_model"]["metric"] == "test_r2" and fitted["null_model"]["at_least_null"]
    assert fitted["metrics"]["test_r2"] > 0.2 and not fitted["constant_predictor"]["constant"]
    assert flat["constant_predictor"]["constant"] is True
    assert flat["constant_predictor"]["value"] == pytest.approx(null["value"], rel=1e-3)


# ---- SIGTERM during the cross-validation --------------------------------------------------------
CV_PIPELINE = """
name = "cvresume"
[dataset]
name = "breast_cancer"
test_fraction = 0.3
max_train = 60
[bank]
families = [{ family = "gaussian", widths = [1, 2, 5], features = "all" }, { family = "linear", features = "all" }]
[[solver]]
name = "sgd"
solver = "sgd"
lam = [0.01, 0.1]
T = 1500
seed = 3
[report]
enabled = false
"""


@pytest.mark.cluster
def test_sigterm_during_cv_then_resume_keeps_the_finished_folds(tmp_path, capsys):
    """SIGTERM between fold fits stops the run with exit 75 and the finished fold scores in
    checkpoints/<name>.cv.json; --resume continues and gives the uninterrupted CV record."""
    import signal
    import subprocess
    import sys
    import time

    from mklscale.runtime.checkpoint import EXIT_PREEMPTED

    spec, cluster = tmp_path / "p.toml", tmp_path / "c.toml"
    spec.write_text(CV_PIPELINE)
    cluster.write_text('kind = "local"\nn_workers = 1\nprocesses = false\n')
    whole = run_pipeline(spec, out=tmp_path / "whole", cluster=cluster, quiet=True)["solvers"][0]["cv"]

    run_dir = tmp_path / "cut"
    child = subprocess.Popen([sys.executable, "-m", "mklscale.cli", "run", str(spec), "--cluster", str(cluster),
                              "--out", str(run_dir), "--quiet"], stderr=subprocess.PIPE, text=True)
    state = run_dir / "checkpoints" / "sgd.cv.json"
    deadline = time.monotonic() + 120
    while not state.is_file():
        assert child.poll() is None, f"the run ended before its first fold: {child.stderr.read()}"
        assert time.monotonic() < deadline, "no fold finished within 120 s"
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == EXIT_PREEMPTED, err
    assert "SIGTERM" in err and not (run_dir / "results.json").exists()
    kept = json.loads(state.read_text())["scores"]
    finished = [(i, k) for i, row in enumerate(kept) for k, s in enumerate(row) if s is not None]
    assert 0 < len(finished) < 6
    resumed = run_pipeline(spec, out=run_dir, cluster=cluster, quiet=True, resume=True)["solvers"][0]["cv"]
    assert resumed["fold_scores"] == whole["fold_scores"] and resumed["chosen"] == whole["chosen"]
    capsys.readouterr()
    (run_dir / "results.json").unlink()    # as if stopped after the solver finished, before the results
    again = run_pipeline(spec, out=run_dir, cluster=cluster, quiet=True, resume=True)["solvers"][0]
    assert "[sgd] finished before the interruption; kept" in capsys.readouterr().out   # no second CV or refit
    assert again["cv"] == resumed
