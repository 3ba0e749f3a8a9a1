"""Your own data (issue 28, item 4): .csv / .parquet / .npy files in pipelines ([dataset] path) and on
the command line (fit / predict / bank build --features), read by mklscale.tabular; and
`mklscale run --dataset NAME` on the shipped UCI sets."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mklscale
from mklscale import tabular
from mklscale.bank import KernelBank
from mklscale.cli import main as cli
from mklscale.datasets import load
from mklscale.errors import ConfigError, InvalidInputError
from mklscale.pipeline import load_pipeline, run_pipeline, with_dataset
from mklscale.pipeline.console import resume_command
from mklscale.pipeline.data import load_data

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["sepal length", "sepal width", "petal length", "petal width"]


def _iris_frame() -> pd.DataFrame:
    """iris as a user's table: named columns, text labels in a column 'species' in the middle."""
    ds = load("iris", standardise=False)
    frame = pd.DataFrame(ds.X, columns=NAMES)
    frame.insert(2, "species", np.array(["setosa", "versicolor", "virginica"])[ds.y])
    return frame


@pytest.fixture
def iris_csv(tmp_path) -> Path:
    path = tmp_path / "iris.csv"
    _iris_frame().to_csv(path, index=False)
    return path


def _address(tmp_path: Path, client) -> Path:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'kind = "address"\naddress = "{client.scheduler.address}"\n')
    return cluster


def _pipeline_text(dataset: str, name: str = "own") -> str:
    return (f'name = "{name}"\n[dataset]\n{dataset}\ntest_fraction = 0.3\n'
            '[bank]\nfamilies = [{family = "gaussian", widths = [1.0, 3.0], features = [0]}, '
            '{family = "gaussian", widths = [1.0], features = [2]}, {family = "linear", features = [1, 3]}]\n'
            '[[solver]]\nname = "spicy"\nsolver = "spicy"\nC = 0.1\n')


def _run_cli(args, capsys) -> tuple[int, str, str]:
    code = cli([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# ---- mklscale.tabular ------------------------------------------------------------------------------
def test_read_csv_features_target_and_names(iris_csv):
    table = tabular.read_table(iris_csv, target="species")
    frame = _iris_frame()
    assert table.feature_names == tuple(NAMES) and table.target_name == "species"
    assert table.X.dtype == np.float64
    np.testing.assert_array_equal(table.X, frame[NAMES].to_numpy())
    assert table.y.tolist() == frame["species"].tolist()


def test_read_compressed_csv_columns_drop_and_rows(tmp_path):
    path = tmp_path / "iris.csv.gz"
    with gzip.open(path, "wt") as fh:
        _iris_frame().to_csv(fh, index=False)
    assert tabular.kind(path) == "csv"
    # a model's columns, by name, in its order; other columns (the target among them) are ignored
    table = tabular.read_table(path, columns=["petal width", "sepal length"])
    np.testing.assert_array_equal(table.X, _iris_frame()[["petal width", "sepal length"]].to_numpy())
    dropped = tabular.read_table(path, drop="species", rows=7)
    assert dropped.X.shape == (7, 4) and dropped.feature_names == tuple(NAMES) and dropped.y is None


def test_read_npy_features_and_labels(tmp_path):
    X, y = np.arange(12.0).reshape(6, 2), np.array([0, 1, 0, 1, 0, 1])
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y.reshape(-1, 1))   # a column vector is accepted
    table = tabular.read_table(tmp_path / "X.npy", labels=tmp_path / "y.npy")
    np.testing.assert_array_equal(table.X, X)
    np.testing.assert_array_equal(table.y, y)
    assert table.feature_names is None and table.target_name is None


@pytest.mark.parametrize("y, task", [
    (np.array(["a", "b", "a"]), "classification"),
    (np.array([True, False, True]), "classification"),
    (np.array([-1.0, 1.0, 1.0]), "classification"),
    (np.arange(20) % 20, "classification"),                  # 20 whole-number values: class labels
    (np.arange(21), "regression"),                           # 21: a count, not labels
    (np.array([0.5, 1.0, 2.0]), "regression"),
])
def test_infer_task_rule(y, task):
    assert tabular.infer_task(y)[0] == task


def test_check_task_says_what_it_inferred_and_refuses_one_class():
    task, note = tabular.check_task(np.array([0, 1, 1]), None, "here")
    assert task == "classification" and "inferred" in note and "--task regression" in note
    assert tabular.check_task(np.array([0, 1, 1]), "regression", "here") == ("regression", None)
    with pytest.raises(InvalidInputError, match=r"one class only \('x' in all 3 rows\)"):
        tabular.check_task(np.array(["x", "x", "x"]), None, "here")
    with pytest.raises(InvalidInputError, match=r"regression target must be numbers.*task = \"classification\""):
        tabular.check_task(np.array(["a", "b"]), "regression", "here", tabular.PIPELINE)


def test_parquet_round_trip(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "iris.parquet"
    _iris_frame().to_parquet(path)
    table = tabular.read_table(path, target="species")
    assert table.feature_names == tuple(NAMES) and table.X.shape == (150, 4)


# ---- the command line: fit / predict / bank build on a CSV -----------------------------------------
def test_cli_fit_and_predict_on_csv(tmp_path, iris_csv, capsys):
    """fit --features data.csv --target COLUMN keeps the column names (kernel names show them); predict
    --features new.csv matches columns by name (shuffled, the target column present) and gives the
    predictions of the same rows as the estimator, with a header."""
    model = tmp_path / "model"
    code, out, err = _run_cli(["fit", "--features", iris_csv, "--target", "species", "--family", "gaussian",
                               "--widths", "1", "3", "--solver", "spicy", "--C", "0.1", "--cache-dir", tmp_path / "cache",
                               "--out", model, "--quiet"], capsys)
    assert code == 0, err
    assert "task: classification (inferred from the target: labels that are not numbers)" in err
    estimator = mklscale.load(model)
    assert list(estimator.feature_names_in_) == NAMES
    assert all("[" in name for name in estimator.selected_kernels_)
    frame = _iris_frame()
    shuffled = frame[["petal width", "species", "sepal width", "petal length", "sepal length"]].iloc[::7]
    shuffled.to_csv(tmp_path / "new.csv", index=False)
    code, _, err = _run_cli(["predict", model, "--features", tmp_path / "new.csv", "--out", tmp_path / "p.csv"], capsys)
    assert code == 0, err
    written = pd.read_csv(tmp_path / "p.csv", header=None).iloc[:, -1].astype(str).tolist()
    expected = estimator.predict(frame[NAMES].iloc[::7]).tolist()
    assert written[-len(expected):] == expected
    assert np.mean(np.array(expected) == frame["species"].iloc[::7].to_numpy()) > 0.8

    frame.drop(columns=["petal width"]).to_csv(tmp_path / "narrow.csv", index=False)
    code, _, err = _run_cli(["predict", model, "--features", tmp_path / "narrow.csv"], capsys)
    assert code == 2
    assert "lacks column(s) 'petal width' the model was fitted on" in err and "Traceback" not in err


def test_cli_predict_csv_for_a_model_without_names_drops_the_target(tmp_path, iris_csv, capsys):
    frame = _iris_frame()
    np.save(tmp_path / "X.npy", frame[NAMES].to_numpy())
    np.save(tmp_path / "y.npy", (frame["species"] == "setosa").to_numpy().astype(int))
    model = tmp_path / "model"
    code, _, err = _run_cli(["fit", "--features", tmp_path / "X.npy", "--labels", tmp_path / "y.npy", "--family",
                             "linear", "--solver", "uniform", "--cache-dir", tmp_path / "cache", "--out", model,
                             "--quiet"], capsys)
    assert code == 0, err
    assert "task: classification (inferred" in err
    frame["is_setosa"] = (frame["species"] == "setosa").astype(int)
    frame[NAMES + ["is_setosa"]].to_csv(tmp_path / "with_target.csv", index=False)
    code, _, err = _run_cli(["predict", model, "--features", tmp_path / "with_target.csv"], capsys)
    assert code == 2 and "has 5 feature column(s)" in err and "leaving out the target with --target COLUMN" in err
    code, out, err = _run_cli(["predict", model, "--features", tmp_path / "with_target.csv", "--target",
                               "is_setosa"], capsys)
    assert code == 0, err
    assert len(out.strip().splitlines()) >= 150


def test_cli_bank_build_from_csv(tmp_path, iris_csv, capsys):
    code, out, err = _run_cli(["bank", "build", "--features", iris_csv, "--target", "species", "--family", "gaussian",
                               "--widths", "1", "2", "--kernel-features", "all", "--rows", "40", "--out", tmp_path / "bank.zarr", "--quiet"], capsys)
    assert code == 0, err
    bank = KernelBank.open(tmp_path / "bank.zarr")
    assert bank.n == 40 and len(bank) == 2
    first = _iris_frame()[NAMES].to_numpy()[:40]   # the target column left out, the first 40 rows
    np.testing.assert_allclose(bank.X_train, (first - first.mean(axis=0)) / first.std(axis=0), atol=1e-12)
    code, _, err = _run_cli(["bank", "build", "--features", iris_csv, "--family", "linear",
                             "--out", tmp_path / "b2.zarr", "--quiet"], capsys)
    assert code == 2 and "'species' are not numbers" in err and "--target COLUMN" in err
    assert not (tmp_path / "b2.zarr").exists()


def _bad_tables(ws: Path) -> None:
    frame = _iris_frame()
    frame.to_csv(ws / "iris.csv", index=False)
    nan = frame.copy()
    nan.loc[4, "sepal width"] = np.nan
    nan.to_csv(ws / "nan.csv", index=False)
    inf = frame.copy()
    inf.loc[9, "petal length"] = np.inf
    inf.to_csv(ws / "inf.csv", index=False)
    target_nan = frame.copy()
    target_nan.loc[[3, 8], "species"] = np.nan
    target_nan.to_csv(ws / "target_nan.csv", index=False)
    one = frame.copy()
    one["species"] = "setosa"
    one.to_csv(ws / "one_class.csv", index=False)
    text = frame.copy()
    text["colour"] = "red"
    text["site"] = "north"
    text.to_csv(ws / "text.csv", index=False)
    (ws / "table.parquet").write_bytes(b"PAR1 not read: the engine is missing first")
    np.save(ws / "X1d.npy", np.arange(5.0))
    np.save(ws / "X.npy", np.ones((6, 2)))
    np.save(ws / "y5.npy", np.array([0, 1, 0, 1, 0]))


@pytest.fixture
def no_parquet_engine(monkeypatch):
    """pyarrow and fastparquet as if not installed (a None entry in sys.modules fails their import)."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "fastparquet", None)


FIT_ERRORS = [
    (["--features", "missing.csv", "--target", "species"], r"missing.csv: no such file; give the path of an existing"),
    (["--features", "iris.csv", "--target", "kind"],
     r"no column 'kind' for the target; its columns are 'sepal length'.*give one of them with --target COLUMN"),
    (["--features", "iris.csv"], r"needs its targets.*--target COLUMN for a .csv or .parquet table"),
    (["--features", "nan.csv", "--target", "species"],
     r"NaN/inf \(missing or infinite\) values in feature column\(s\) 'sepal width', 1 row\(s\) \(first: 4\); impute or drop"),
    (["--features", "inf.csv", "--target", "species"], r"NaN/inf .* column\(s\) 'petal length'.*\(first: 9\)"),
    (["--features", "target_nan.csv", "--target", "species"],
     r"target column 'species': 2 NaN/inf .*\(first rows: 3, 8\); drop those rows"),
    (["--features", "one_class.csv", "--target", "species"],
     r"one class only \('setosa' in all 150 rows\); a classifier needs rows of at least two classes"),
    (["--features", "text.csv", "--target", "species"],
     r"feature column\(s\) 'colour', 'site' are not numbers \(e.g. 'red' in 'colour'\); encode them as numbers"),
    (["--features", "table.parquet", "--target", "species"], r"needs pyarrow.*pip install pyarrow"),
    (["--features", "X1d.npy", "--labels", "y5.npy"], r"X1d.npy: holds an array of shape \(5,\); give an \(n_samples, "),
    (["--features", "X.npy", "--labels", "y5.npy"], r"--labels .*y5.npy has 5 entries but --features .*X.npy has 6 rows"),
    (["--features", "X.npy", "--target", "y"], r"a .npy file has no named columns.*--labels y.npy"),
    (["--features", "iris.csv", "--labels", "y5.npy"], r"--labels is for .npy feature files.*--target COLUMN"),
    (["--dataset", "wine", "--target", "species"], r"--target and --labels go with --features"),
]


@pytest.mark.parametrize("args, message", FIT_ERRORS, ids=[m[:40] for _, m in FIT_ERRORS])
def test_cli_fit_bad_own_data_exits_2_saying_what_to_do(tmp_path, capsys, no_parquet_engine, args, message):
    _bad_tables(tmp_path)
    args = [str(tmp_path / a) if a.endswith((".csv", ".npy", ".parquet")) else a for a in args]
    code, out, err = _run_cli(["fit", *args, "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out", "--quiet"],
                              capsys)
    assert code == 2, (out, err)
    assert err.startswith("mklscale: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


# ---- pipelines: [dataset] path ---------------------------------------------------------------------
def test_pipeline_on_a_csv_shows_its_feature_names(tmp_path, cluster_client, capsys):
    """A pipeline beside its CSV (relative path), run from another folder: results.json and the report
    name the kernels by the CSV's columns; the inferred task is printed; text labels work."""
    folder = tmp_path / "project"
    folder.mkdir()
    _iris_frame().to_csv(folder / "flowers.csv", index=False)
    spec = folder / "own.toml"
    spec.write_text(_pipeline_text('path = "flowers.csv"\ntarget = "species"'))
    code = cli(["run", str(spec), "--cluster", str(_address(tmp_path, cluster_client)), "--out",
                str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[own] task: classification (inferred from the target: labels that are not numbers)" in out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["dataset"]["name"] == "flowers.csv"
    assert results["dataset"]["feature_names"] == NAMES
    assert results["dataset"]["classes"] == ["setosa", "versicolor", "virginica"]
    kernels = results["solvers"][0]["kernels"]
    assert kernels and all(k["name"].endswith(("[sepal length]", "[petal length]", "[sepal width,petal width]"))
                           for k in kernels)
    page = (tmp_path / "run" / "report" / "index.html").read_text()
    assert "sepal length, sepal width, petal length, petal width" in page
    assert any(k["name"] in page for k in kernels)
    assert results["solvers"][0]["metrics"]["test_accuracy"] > 0.8


def test_pipeline_npy_path_with_labels_and_regression_inferred(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", X[:, 0] * 2.5 + 0.1)
    spec = tmp_path / "p.toml"
    spec.write_text(_pipeline_text('path = "X.npy"\nlabels = "y.npy"'))
    said = []
    data = load_data(load_pipeline(spec), said.append)
    assert data.task == "regression" and data.feature_names is None
    assert len(data.y_train) + len(data.y_test) == 40 and data.X_train.shape[1] == 3
    assert said == ['[own] task: regression (inferred from the target: numbers that are not all whole); give '
                    'task = "classification" to change it']
    spec.write_text(_pipeline_text(f'path = "{tmp_path / "X.npy"}"\nlabels = "y.npy"\ntask = "regression"'))
    said.clear()
    assert load_data(load_pipeline(spec), said.append).task == "regression" and said == []


PIPELINE_ERRORS = [
    ('name = "wine"\npath = "iris.csv"', r"give exactly one of name = .* or path = \"data.csv\""),
    ('max_train = 50', r"give exactly one of name"),
    ('name = "wine"\ntarget = "species"', r"target apply to path = .* only; remove them"),
    ('path = "iris.csv"', r"is a table; add target = \"COLUMN\""),
    ('path = "X.npy"', r"add labels = \"y.npy\""),
    ('path = "X.npy"\ntarget = "y"', r"target names a column of a .csv or .parquet table"),
    ('path = "iris.csv"\ntarget = "species"\nlabels = "y5.npy"', r"labels is for .npy feature files"),
    ('path = "iris.txt"\ntarget = "species"', r"is not a .csv, .parquet or .npy file"),
    ('path = "iris.csv"\ntarget = "species"\noptions = { n_samples = 3 }', r"options apply to an offline dataset"),
    ('path = "iris.csv"\ntarget = "species"\ntask = "clustering"', r"task: must be one of"),
]


@pytest.mark.parametrize("dataset, message", PIPELINE_ERRORS, ids=[m[:30] for _, m in PIPELINE_ERRORS])
def test_pipeline_dataset_table_errors(tmp_path, dataset, message):
    spec = tmp_path / "p.toml"
    spec.write_text(_pipeline_text(dataset))
    with pytest.raises(ConfigError, match=message):
        load_pipeline(spec)


RUN_ERRORS = [
    ('path = "missing.csv"\ntarget = "species"', r"missing.csv: no such file.*relative to the pipeline file's folder"),
    ('path = "iris.csv"\ntarget = "kind"', r"no column 'kind' for the target.*target = \"COLUMN\""),
    ('path = "nan.csv"\ntarget = "species"', r"NaN/inf .*'sepal width'.*impute or drop"),
    ('path = "one_class.csv"\ntarget = "species"', r"one class only"),
    ('path = "text.csv"\ntarget = "species"', r"'colour', 'site' are not numbers.*encode them"),
    ('path = "table.parquet"\ntarget = "species"', r"pip install pyarrow"),
    ('path = "X.npy"\nlabels = "y5.npy"', r"labels .*y5.npy has 5 entries but \[dataset\] path .*X.npy has 6 rows"),
]


@pytest.mark.parametrize("dataset, message", RUN_ERRORS, ids=[m[:30] for _, m in RUN_ERRORS])
def test_pipeline_bad_data_is_a_config_error_before_any_work(tmp_path, capsys, no_parquet_engine, dataset, message):
    """mklscale run exits 2 with one line; nothing is written (the data load before the cluster starts)."""
    _bad_tables(tmp_path)
    spec = tmp_path / "p.toml"
    spec.write_text(_pipeline_text(dataset))
    with pytest.raises(ConfigError, match=message):
        load_data(load_pipeline(spec))
    code, _, err = _run_cli(["run", spec, "--out", tmp_path / "run", "--quiet"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"pipeline {spec} [dataset]" in err
    assert not (tmp_path / "run").exists()


# ---- mklscale run --dataset on the shipped UCI sets -------------------------------------------------
def test_uci_simplemkl_pipeline_runs_each_shipped_set():
    """The shipped protocol's own dataset is liver; --dataset swaps in each UCI set with its 80/20 split."""
    pipe = load_pipeline(ROOT / "pipelines" / "uci_simplemkl.toml")
    assert pipe.dataset["name"] == "liver" and pipe.dataset["test_fraction"] == 0.2
    for name, n in (("liver", 345), ("pima", 768), ("ionosphere", 351), ("sonar", 208)):
        data = load_data(with_dataset(pipe, name))
        assert data.name == name and data.task == "classification" and data.classes == [-1.0, 1.0]
        assert len(data.y_test) == int(np.ceil(0.2 * n)) and len(data.y_train) + len(data.y_test) == n
        assert data.feature_names == load(name).feature_names


def test_with_dataset_keeps_the_split_and_the_options_the_new_set_takes():
    spec = {"name": "g", "dataset": {"name": "ringnorm", "test_fraction": 0.4, "max_train": 30,
                                     "options": {"n_samples": 80, "n_features": 5}},
            "bank": {"family": "linear"}, "solver": [{"name": "u", "solver": "uniform"}]}
    pipe = load_pipeline(spec)
    other = with_dataset(pipe, "twonorm")
    assert other.dataset["options"] == {"n_samples": 80, "n_features": 5} and other.dataset["max_train"] == 30
    assert other.raw["dataset"]["name"] == "twonorm" and other.dataset_option == "twonorm"
    sonar = with_dataset(pipe, "sonar")
    assert sonar.dataset["options"] == {} and sonar.dataset["dropped_options"] == ["n_features", "n_samples"]
    said = []
    data = load_data(sonar, said.append)
    assert data.name == "sonar" and len(data.y_train) == 30
    assert said == ["[g] --dataset sonar: the pipeline's [dataset] options n_features, n_samples do not apply to "
                    "sonar and are not used"]
    assert "--dataset sonar --out runs/x --resume" in resume_command(sonar, Path("runs/x"))
    with pytest.raises(ConfigError, match=r"--dataset 'bupa': unknown dataset; choose one of .*liver"):
        with_dataset(pipe, "bupa")


def test_cli_run_dataset_option_on_a_uci_set(tmp_path, cluster_client, capsys, monkeypatch):
    """`mklscale run P --dataset pima` (a small bank): the default run folder is runs/<name>-pima and
    results.json records pima; the copied pipeline.toml says what replaced its [dataset]."""
    spec = tmp_path / "uci_small.toml"
    spec.write_text('name = "uci_small"\n[dataset]\nname = "liver"\ntest_fraction = 0.2\nmax_train = 150\n'
                    '[bank]\nfamilies = [{family = "gaussian", widths = [2.0, 5.0]}, {family = "linear"}]\n'
                    '[[solver]]\nname = "spicy"\nsolver = "spicy"\nC = 0.05\n[report]\nenabled = false\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = _run_cli(["run", spec, "--dataset", "pima", "--cluster", _address(tmp_path, cluster_client),
                               "--quiet"], capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "uci_small-pima"
    results = json.loads((run / "results.json").read_text())
    assert results["dataset"]["name"] == "pima" and results["dataset"]["n_features"] == 8
    assert results["dataset"]["n_test"] == 154 and results["dataset"]["n_train"] == 150
    assert results["pipeline"]["config"]["dataset"]["name"] == "pima"
    assert results["dataset"]["feature_names"][1] == "glucose"
    assert results["solvers"][0]["status"] == "ok"
    assert results["solvers"][0]["metrics"]["test_accuracy"] > 0.6
    assert (run / "pipeline.toml").read_text().startswith("# run with --dataset pima")
    code, _, err = _run_cli(["run", spec, "--dataset", "nosuch", "--quiet"], capsys)
    assert code == 2 and "--dataset 'nosuch': unknown dataset" in err
