"""Pipelines: every shipped spec validates, bad specs fail before any work, and a real run writes
results.json, model files and a report that agree with each other."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

import mklscale
from mklscale.cli import main as cli
from mklscale.errors import ConfigError
from mklscale.pipeline import load_pipeline, run_pipeline

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "pipelines").glob("*.toml"))

TINY = {
    "name": "t",
    "dataset": {"name": "breast_cancer", "test_fraction": 0.3, "max_train": 60},
    "bank": {"families": [{"family": "gaussian", "widths": [1, 2, 5], "features": "all"},
                          {"family": "linear", "features": [0, 2]}]},
    "solver": [{"name": "spicy", "solver": "spicy", "C": 0.1, "loss": "logistic"},
               {"name": "uni", "solver": "uniform", "C": 1.0}],
    "report": {"enabled": False},
}


def _with(base: dict, **changes) -> dict:
    out = json.loads(json.dumps(base))
    for dotted, value in changes.items():
        node, *path = dotted.split("__")
        target = out
        for key in [node, *path][:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        last = [node, *path][-1]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
    return out


_DELETE = object()


def test_shipped_pipelines_are_listed():
    names = {p.stem for p in SHIPPED}
    assert {"quickstart", "uci_simplemkl", "ida_many_kernels", "regularization_path", "scaling_10k"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_pipeline_validates(path):
    pipe = load_pipeline(path)
    assert pipe.name == path.stem
    assert pipe.solvers or pipe.paths


@pytest.mark.parametrize("changes, fragment", [
    ({"colour": "red"}, "unknown key(s) colour"),
    ({"dataset__test_fraction": 1.5}, "strictly between 0 and 1"),
    ({"dataset__test_fraction": "0.2"}, "must be float"),
    ({"bank__families": _DELETE}, "either family"),
    ({"bank__families__0__width": 3}, "families[0]: kernel family 'gaussian' does not take width"),
    ({"bank__normalize": "max"}, "must be one of"),
    ({"solver__0__solver": "simplemkl"}, "unknown solver"),
    ({"solver__0__nonsense": 1}, "does not take nonsense"),
    ({"solver__0__C": -1.0}, "must be > 0"),
    ({"solver__0__C": True}, "must be float"),
    ({"solver__1__name": "spicy"}, "repeated: spicy"),
    ({"solver__0__name": "../escape"}, "names may use"),
    ({"report__enabled": "yes"}, "must be bool"),
])
def test_bad_pipeline_is_a_config_error_naming_the_key(changes, fragment):
    with pytest.raises(ConfigError) as info:
        load_pipeline(_with(TINY, **changes))
    assert fragment in str(info.value)


def test_bad_toml_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[dataset\n')
    with pytest.raises(ConfigError, match="bad.toml is not valid TOML"):
        load_pipeline(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_pipeline(tmp_path / "missing.toml")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, cluster_client):
    """One real run of the tiny pipeline on the session's 2-process LocalCluster (through an address config)."""
    out = tmp_path_factory.mktemp("run")
    address = {"kind": "address", "address": cluster_client.scheduler.address}
    results = run_pipeline(_with(TINY, report__enabled=True), out=out, cluster=address, quiet=True)
    return out, results


def test_run_writes_results_models_and_report(tiny_run):
    out, results = tiny_run
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["schema_version"] == 1
    assert on_disk["bank"]["M"] == 4 and on_disk["bank"]["n"] == 60 and on_disk["bank"]["kernels_computed"] == 4
    assert on_disk["cluster"]["workers"] == 2
    assert [s["name"] for s in on_disk["solvers"]] == ["spicy", "uni"]
    assert all(s["status"] == "ok" for s in on_disk["solvers"])
    assert (out / "report" / "index.html").is_file()
    for entry in on_disk["solvers"]:
        assert 0.5 < entry["metrics"]["test_accuracy"] <= 1.0
        assert (out / entry["model"] / "model.json").is_file()


def test_results_name_features_and_hold_the_classification_metrics(tiny_run):
    """Kernel names show the dataset's feature names; balanced accuracy, ROC AUC and the test rows'
    confusion matrix are recorded next to the accuracy."""
    out, results = tiny_run
    assert results["dataset"]["feature_names"][:3] == ["mean radius", "mean texture", "mean perimeter"]
    assert results["pipeline"]["description"] == ""
    uni = results["solvers"][1]
    by_name = {k["name"]: k for k in uni["kernels"]}
    assert by_name["linear()[mean radius,mean perimeter]"]["features"] == [0, 2]
    assert "gaussian(width=2)[all]" in by_name
    for entry in results["solvers"]:
        m = entry["metrics"]
        for key in ("test_balanced_accuracy", "test_roc_auc", "train_balanced_accuracy", "train_roc_auc"):
            assert 0.0 <= m[key] <= 1.0, key
        cm = entry["confusion_matrix"]
        counts = np.array(cm["counts"])
        assert cm["labels"] == results["dataset"]["classes"] == [-1.0, 1.0]
        assert counts.sum() == results["dataset"]["n_test"]
        assert np.trace(counts) / counts.sum() == pytest.approx(m["test_accuracy"], abs=1e-12)
        recall = np.diag(counts) / counts.sum(axis=1)
        assert recall.mean() == pytest.approx(m["test_balanced_accuracy"], abs=1e-12)


def test_saved_model_reproduces_the_recorded_test_accuracy(tiny_run):
    """The model file alone (no bank) predicts the held-out raw rows (as a user has them: the run fits on
    raw features and the model standardises them, issue 18) with the accuracy results.json records."""
    from sklearn.model_selection import train_test_split

    from mklscale.datasets import load

    out, results = tiny_run
    ds = load("breast_cancer", standardise=False)
    _, X_te, _, y_te = train_test_split(ds.X, ds.y, test_size=0.3, random_state=0, stratify=ds.y)
    for entry in results["solvers"]:
        model = mklscale.load(out / entry["model"])
        accuracy = float(np.mean(model.predict(X_te) == y_te))
        assert accuracy == pytest.approx(entry["metrics"]["test_accuracy"], abs=1e-12)


def test_kept_kernels_and_weights_match_the_model(tiny_run):
    out, results = tiny_run
    spicy = results["solvers"][0]
    model = mklscale.load(out / spicy["model"])
    recorded = {k["name"]: k["weight"] for k in spicy["kernels"]}
    # the model was fitted on a bank (arrays, no column names): its names show column indices
    names = results["dataset"]["feature_names"]
    labels = {spec.name: spec.label(names) for spec in model.model_.specs}
    assert set(recorded) == set(labels.values()) and set(labels) == set(model.selected_kernels_)
    weights = model.kernel_weights_
    for name, label in labels.items():
        assert weights[name] == pytest.approx(recorded[label], rel=1e-12)


def test_unconverged_solver_is_flagged_in_console_results_and_report(tmp_path, cluster_client, capsys):
    """smo stopped by max_steps: its console line carries the flag and the warning's remedy follows;
    results.json keeps the text; the report shows the flag next to the solver."""
    spec = _with(TINY, report__enabled=True,
                 solver=[{"name": "stuck", "solver": "smo", "C": 100.0, "max_steps": 5}])
    address = {"kind": "address", "address": cluster_client.scheduler.address}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # printed and recorded, not warned
        results = run_pipeline(spec, out=tmp_path / "run", cluster=address)
    out = capsys.readouterr().out
    entry = results["solvers"][0]
    line = next(line for line in out.splitlines() if line.startswith("[stuck] test_accuracy"))
    assert line.endswith(f"converged False  !! NOT CONVERGED (gap {entry['gap']:.3g})")
    assert entry["converged"] is False and "raise max_steps (now 5)" in entry["convergence_warning"]
    assert f"    {entry['convergence_warning']}" in out
    page = (tmp_path / "run" / "report" / "index.html").read_text()
    assert '<span class="not-converged">NOT CONVERGED</span></h3>' in page
    assert "raise max_steps (now 5)" in page


def test_cli_run_quiet_keeps_the_summary_lines(tmp_path, cluster_client, capsys):
    """--quiet drops the progress chatter and kernel lists, not each solver's result or where it went."""
    pipeline, cluster, out = tmp_path / "q.toml", tmp_path / "cluster.toml", tmp_path / "run"
    pipeline.write_text('name = "q"\n[dataset]\nname = "breast_cancer"\ntest_fraction = 0.3\nmax_train = 60\n'
                        '[bank]\nfamilies = [{ family = "linear", features = "all" }]\n'
                        '[[solver]]\nname = "uni"\nsolver = "uniform"\n'
                        '[report]\nenabled = false\n')
    cluster.write_text(f'kind = "address"\naddress = "{cluster_client.scheduler.address}"\n')
    assert cli(["run", str(pipeline), "--cluster", str(cluster), "--out", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("[uni] test_accuracy ") and "kept 1/1 kernels" in lines[0]
    assert lines[1] == f"[q] results: {out / 'results.json'}"


def test_cli_run_exit_codes(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nfoo = 1\n')
    assert cli(["run", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "unknown key(s) foo" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
