"""Pipelines on your own Gram matrices: [bank] grams = "K.npy" (or a dense bank folder) over the dataset's rows,
[dataset] labels = "y.npy" alone; each split's Gram matrices are imported, the models predict from kernels,
and the report is written."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mklscale
from mklscale import datasets
from mklscale.bank import build_bank, families
from mklscale.errors import ConfigError
from mklscale.pipeline import load_pipeline, run_pipeline


@pytest.fixture(scope="module")
def grams(tmp_path_factory):
    """Gram matrices of three kernels on breast_cancer's standardised rows, saved as K.npy beside y.npy."""
    folder = tmp_path_factory.mktemp("grams")
    ds = datasets.load("breast_cancer")
    X, y = ds.X[::2], ds.y[::2]
    specs = families.resolve([{"family": "gaussian", "widths": [3.0, 10.0], "features": "all"},
                              {"family": "linear", "features": "all"}], X.shape[1])
    np.save(folder / "K.npy", np.stack([s.compute(X) for s in specs]))
    np.save(folder / "y.npy", y)
    return folder, X, y, specs


def _spec(folder, grams="K.npy", **bank):
    return (f'name = "own"\nseed = 1\n[dataset]\nlabels = "y.npy"\ntask = "classification"\ntest_fraction = 0.3\n'
            f'[bank]\ngrams = "{grams}"\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in bank.items())
            + '[[solver]]\nname = "spicy"\nsolver = "spicy"\nC = "auto"\n'
            '[[solver]]\nname = "uniform"\nsolver = "uniform"\n[report]\nenabled = true\n')


def test_a_pipeline_on_gram_matrices_runs_reports_and_saves_models_that_predict_from_kernels(grams, tmp_path):
    folder, X, y, specs = grams
    (folder / "own.toml").write_text(_spec(folder, names=["wide", "narrow", "lin"]))
    out = tmp_path / "run"
    results = run_pipeline(folder / "own.toml", out=out, quiet=True)
    assert results["bank"]["M"] == 3 and results["bank"]["families"] == {"precomputed": 3}
    assert results["dataset"]["n_features"] is None and results["dataset"]["n_train"] + results["dataset"]["n_test"] == y.size
    for entry in results["solvers"]:
        assert entry["status"] == "ok" and entry["metrics"]["test_accuracy"] > 0.9, entry["name"]
        assert {k["name"] for k in entry["kernels"]} <= {"wide", "narrow", "lin"}
    assert (out / "report" / "index.html").is_file()
    model = mklscale.load(out / results["solvers"][0]["model"])
    assert model.kernels == "precomputed"
    from sklearn.model_selection import train_test_split   # the run's split: seed 1, stratified, 30 % held out

    train, test = train_test_split(np.arange(y.size), test_size=0.3, random_state=1, stratify=y)
    K = np.load(folder / "K.npy")
    accuracy = model.score(K[:, test][:, :, train], y[test])
    assert accuracy == pytest.approx(results["solvers"][0]["metrics"]["test_accuracy"])


def test_a_bank_folder_as_grams(grams, tmp_path):
    folder, X, y, specs = grams
    build_bank(X, specs, folder / "full.zarr", normalize=None, dtype="float64", progress=False)
    (folder / "banked.toml").write_text(_spec(folder, grams="full.zarr"))
    results = run_pipeline(folder / "banked.toml", out=tmp_path / "run", quiet=True)
    assert all(e["status"] == "ok" and e["metrics"]["test_accuracy"] > 0.9 for e in results["solvers"])


def test_gram_matrices_imported_into_a_bank_on_s3(grams, tmp_path, s3_bucket):
    """The import goes through the bank's storage: an s3:// [bank] path holds the same bank, and the run
    the same results, as the run's own folder."""
    folder, X, y, specs = grams
    (folder / "local.toml").write_text(_spec(folder))
    (folder / "s3.toml").write_text(_spec(folder, path=f"s3://{s3_bucket}/runs/own.zarr"))
    local = run_pipeline(folder / "local.toml", out=tmp_path / "local", quiet=True)
    remote = run_pipeline(folder / "s3.toml", out=tmp_path / "s3", quiet=True)
    assert remote["bank"]["path"] == f"s3://{s3_bucket}/runs/own.zarr"
    for a, b in zip(local["solvers"], remote["solvers"]):
        assert a["metrics"] == b["metrics"] and a["kernels"] == b["kernels"], a["name"]


def test_bad_gram_configurations_say_what_to_do(grams, tmp_path):
    folder, X, y, specs = grams
    np.save(folder / "short.npy", np.load(folder / "K.npy")[:, :-1, :-1])
    cases = {
        _spec(folder, grams="short.npy"): r"shape \(3, 284, 284\).*over the dataset's 285 rows",
        _spec(folder, family="auto"): "grams gives the kernels themselves; remove family",
        _spec(folder, normalize="diag"): 'use "trace"',
        _spec(folder, names=["a", "b"]): "2 names for 3 Gram matrices",
        _spec(folder, grams="missing.npy"): "neither a .npy file nor a kernel bank folder",
    }
    for i, (text, message) in enumerate(cases.items()):
        (folder / f"bad{i}.toml").write_text(text)
        with pytest.raises(ConfigError, match=message):
            run_pipeline(folder / f"bad{i}.toml", out=tmp_path / f"run{i}", quiet=True)
        assert not (tmp_path / f"run{i}").exists()
    (folder / "nolabels.toml").write_text(_spec(folder).replace('grams = "K.npy"\n', 'family = "auto"\n'))
    with pytest.raises(ConfigError, match="labels alone"):
        load_pipeline(folder / "nolabels.toml")
