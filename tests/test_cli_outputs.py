"""What `mklscale fit`, `mklscale predict` and `mklscale run` write (issue 18, items 11 and 14).

Item 11: every output (a model folder, a predictions file) is written under a temporary name and
renamed, so a full disk -- a real one, a small tmpfs filled to its last page -- gives exit code 2 with
a message saying what to do, leaves no partial or temporary file, and keeps what was there before.

Item 14: a model fitted by `mklscale fit --dataset NAME` owns the whole map from the dataset's raw
features to the kernel inputs, so `predict --features` on raw rows agrees with `predict --dataset`;
model files of schema < 3, fitted on standardised dataset features, still load and say so.

Issue 28 (item 8): `fit --out` refuses a model unless --overwrite; `fit` and a run's console show kernel
weights as shares; `predict` writes a CSV header and warns about rows that look already standardised.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _disk import fill, tmpfs

import mklscale
from mklscale import cli
from mklscale.datasets import load

WINE = ["--family", "gaussian", "--widths", "1", "3", "--kernel-features", "all", "--solver", "uniform", "--quiet"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """40 rows of breast_cancer as .npy files and a model fitted on them."""
    d = tmp_path_factory.mktemp("small")
    ds = load("breast_cancer", standardise=False)
    rows = np.concatenate([np.flatnonzero(ds.y > 0)[:20], np.flatnonzero(ds.y < 0)[:20]])
    np.save(d / "X.npy", ds.X[rows])
    np.save(d / "y.npy", ds.y[rows])
    assert cli.main(["fit", *_fit_args(d), "--out", str(d / "model")]) == 0
    return d


def _fit_args(d) -> list[str]:
    return ["--features", str(d / "X.npy"), "--labels", str(d / "y.npy"), "--task", "classification", *WINE,
            "--cache-dir", str(d / "cache")]


def _names(mount) -> list[str]:
    return sorted(p.name for p in mount.iterdir())


# ---- item 11: full disks -------------------------------------------------------------------------------
def test_fit_out_on_a_full_disk_keeps_the_model_there(small, tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "1M") as mnt:
        assert cli.main(["fit", *_fit_args(small), "--out", str(mnt / "model")]) == 0
        before = {p.name: p.read_bytes() for p in (mnt / "model").iterdir()}
        fill(mnt)
        capsys.readouterr()
        assert cli.main(["fit", *_fit_args(small), "--C", "2", "--out", str(mnt / "model"), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert "cannot write the model" in err and "no space left" in err and "free some space" in err
        assert _names(mnt) == ["filler", "model"]  # no temporary folder left
        assert {p.name: p.read_bytes() for p in (mnt / "model").iterdir()} == before
        mklscale.load(mnt / "model")
        assert cli.main(["fit", *_fit_args(small), "--out", str(mnt / "new")]) == 2
        assert _names(mnt) == ["filler", "model"]


@pytest.mark.parametrize("out", ["pred.npy", "pred.csv"])
def test_predict_out_on_a_full_disk_leaves_no_file(small, tmp_path, capsys, out):
    with tmpfs(tmp_path / "disk", "256k") as mnt:
        fill(mnt)
        capsys.readouterr()
        code = cli.main(["predict", str(small / "model"), "--features", str(small / "X.npy"), "--out", str(mnt / out)])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err
        assert "cannot write the predictions" in err and "no space left" in err
        assert _names(mnt) == ["filler"]  # neither a 0-byte file nor a temporary one
        (mnt / "filler").unlink()
        assert cli.main(["predict", str(small / "model"), "--features", str(small / "X.npy"),
                         "--out", str(mnt / out)]) == 0
        assert _names(mnt) == [out]


PIPELINE = """\
name = "full-disk"
seed = 0

[dataset]
name = "breast_cancer"
test_fraction = 0.3
max_train = 40

[bank]
families = [{{ family = "gaussian", widths = [1, 2], features = "all" }}]
path = "{bank}"

[[solver]]
name = "uni"
solver = "uniform"

[report]
enabled = false
"""


def test_run_with_a_full_disk_at_model_save_stops_cleanly_and_resumes(tmp_path, capsys):
    """The run directory on a disk with one free page: the pipeline copy fits, the model does not."""
    spec = tmp_path / "p.toml"
    spec.write_text(PIPELINE.format(bank=tmp_path / "bank"))
    cluster = tmp_path / "local.toml"
    cluster.write_text('kind = "local"\nn_workers = 1\nprocesses = false\n')
    with tmpfs(tmp_path / "disk", "256k") as mnt:
        fill(mnt, leave_pages=1)
        run = ["run", str(spec), "--cluster", str(cluster), "--out", str(mnt / "run"), "--quiet"]
        capsys.readouterr()
        assert cli.main(run) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert "cannot write the model" in err and "no space left" in err and "--resume" in err
        assert not (mnt / "run" / "models" / "uni").exists()
        assert not [p for p in mnt.rglob("*") if ".tmp-" in p.name]
        (mnt / "filler").unlink()
        assert cli.main([*run, "--resume"]) == 0
        results = json.loads((mnt / "run" / "results.json").read_text())
        assert results["solvers"][0]["status"] == "ok"
        mklscale.load(mnt / "run" / "models" / "uni")


# ---- item 14: the model owns the map from raw features to kernel inputs ------------------------------------
def test_fit_on_a_dataset_predicts_its_raw_features(tmp_path, capsys):
    """`fit --dataset wine` then `predict --features` on the raw wine rows gives the classes of
    `predict --dataset wine` (and the training labels, mostly): the model standardises them itself.
    The standardised rows of ``load("wine").X`` get a warning saying to pass the raw ones (issue 28)."""
    raw = load("wine", standardise=False)
    np.save(tmp_path / "X_raw.npy", raw.X)
    np.save(tmp_path / "X_std.npy", load("wine").X)
    assert cli.main(["fit", "--dataset", "wine", *WINE, "--cache-dir", str(tmp_path / "c"),
                     "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert cli.main(["predict", str(tmp_path / "m"), "--features", str(tmp_path / "X_raw.npy"),
                     "--out", str(tmp_path / "p_raw.npy")]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(["predict", str(tmp_path / "m"), "--features", str(tmp_path / "X_std.npy"),
                     "--out", str(tmp_path / "p_std.npy")]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"mklscale: warning: model {tmp_path / 'm'}: these rows look already standardised")
    assert err.count("\n") == 1 and "load(NAME, standardise=False).X" in err and "Traceback" not in err
    assert cli.main(["predict", str(tmp_path / "m"), "--dataset", "wine", "--out", str(tmp_path / "p_ds.npy")]) == 0
    p_raw, p_ds = np.load(tmp_path / "p_raw.npy"), np.load(tmp_path / "p_ds.npy")
    assert (p_raw == raw.y).mean() > 0.95
    np.testing.assert_array_equal(p_raw, p_ds)
    model = mklscale.load(tmp_path / "m").model_  # the standardisation the fit applied to the raw rows
    assert model.dataset_features == "raw"
    np.testing.assert_allclose(model.mean, raw.X.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(model.scale, raw.X.std(axis=0), rtol=1e-12)


def test_model_files_before_schema_3_say_they_expect_standardised_features(tmp_path, capsys):
    """A schema-1 model fitted on standardised dataset features (as `fit --dataset` did before) still
    predicts `--dataset` right, and `--features` warns that it expects standardised rows."""
    ds = load("wine")
    est = mklscale.MKLClassifier(kernels={"family": "gaussian", "widths": [1, 3], "features": "all"}, solver="uniform",
                                 cache_dir=tmp_path / "c").fit(ds.X, ds.y)
    path = est.save(tmp_path / "m")
    doc = json.loads((path / "model.json").read_text())
    doc["schema_version"] = 1
    (path / "model.json").write_text(json.dumps(doc))
    np.save(tmp_path / "X_raw.npy", load("wine", standardise=False).X)
    capsys.readouterr()
    assert cli.main(["predict", str(path), "--dataset", "wine", "--out", str(tmp_path / "p.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), est.predict(ds.X))
    assert "warning" not in capsys.readouterr().err
    assert cli.main(["predict", str(path), "--features", str(tmp_path / "X_raw.npy")]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "already standardised" in err and "refit it" in err


# ---- issue 28, item 8: what fit and predict print and write ------------------------------------------------
def _files(path) -> dict:
    return {p.name: p.read_bytes() for p in path.iterdir()}


def test_fit_out_holding_a_model_is_refused_unless_overwrite(small, tmp_path, capsys):
    """`fit --out` on a model exits 2 before any work (no bank built) with one line naming --overwrite;
    --overwrite replaces it; a folder holding anything else is refused even with --overwrite."""
    model = tmp_path / "model"
    assert cli.main(["fit", *_fit_args(small), "--out", str(model)]) == 0
    before = _files(model)
    fresh_cache = ["--cache-dir", str(tmp_path / "unused-cache")]
    capsys.readouterr()
    assert cli.main(["fit", *_fit_args(small), "--C", "2", *fresh_cache, "--out", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mklscale: error: ")
    assert "already holds a model" in err and "--overwrite" in err and "another --out" in err
    assert _files(model) == before and not (tmp_path / "unused-cache").exists()
    assert cli.main(["fit", *_fit_args(small), "--C", "2", "--out", str(model), "--overwrite"]) == 0
    after = _files(model)
    assert after["arrays.npz"] != before["arrays.npz"]   # the new fit (C = 2) replaced the old one
    assert json.loads(after["model.json"])["fitted"]["fit_stats_"]["C"] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]   # no temporary or moved-aside folder

    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert cli.main(["fit", *_fit_args(small), *fresh_cache, "--out", str(foreign), *extra]) == 2
        err = capsys.readouterr().err
        assert "not an mklscale model folder" in err and "choose another --out" in err
        assert _files(foreign) == {"keep.txt": b"mine"}
    (tmp_path / "empty").mkdir()
    assert cli.main(["fit", *_fit_args(small), "--out", str(tmp_path / "empty")]) == 0
    mklscale.load(tmp_path / "empty")


def test_fit_prints_each_kept_kernels_share_of_the_weight(small, tmp_path, capsys):
    """The terminal shows what the report shows: each kept kernel's share of the total weight."""
    capsys.readouterr()
    assert cli.main(["fit", *_fit_args(small), "--out", str(tmp_path / "m")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"model: {tmp_path / 'm'}  kept 2 kernel(s)")
    shares = {}
    for line in lines[1:]:
        share, name = line.split("%  ")
        shares[name] = float(share)
    assert set(shares) == {"gaussian(width=1)[all]", "gaussian(width=3)[all]"}
    assert sum(shares.values()) == pytest.approx(100.0, abs=0.1)
    weights = mklscale.load(tmp_path / "m").model_.weights[0]
    assert shares["gaussian(width=1)[all]"] == pytest.approx(100 * weights[0] / weights.sum(), abs=0.05)


def test_pipeline_console_shows_kernel_shares_not_raw_weights(capsys):
    from mklscale.pipeline.console import say_solver

    record = {"name": "spicy", "metrics": {"test_accuracy": 0.9}, "gap": 1e-4, "converged": True, "n_active": 3,
              "passes": 4, "seconds": 1.0, "kernels": [
                  {"name": "gaussian(width=2)[mean radius]", "weight": 121.4, "head": None},
                  {"name": "linear[all]", "weight": 0.371, "head": None},
                  {"name": "polynomial(degree=2)[all]", "weight": 0.0032, "head": None}]}
    say_solver(print, record, 30)
    out = capsys.readouterr().out.splitlines()[1:]
    assert out == ["     99.7%  gaussian(width=2)[mean radius]", "      0.3%  linear[all]",
                   "    0.0026%  polynomial(degree=2)[all]"]


def test_predict_csv_has_a_header_and_labelled_probability_columns(small, tmp_path, capsys):
    """--out .csv and stdout write the same CSV: a `prediction` column, or one `proba_<class>` column per
    class with --proba; .npy output stays a bare array."""
    import csv

    X = np.load(small / "X.npy")
    clf = mklscale.MKLClassifier(kernels={"family": "gaussian", "widths": [1, 3]}, solver="spicy", C=0.5,
                                 cache_dir=small / "cache").fit(X, np.load(small / "y.npy"))
    clf.save(tmp_path / "logistic")
    features = ["--features", str(small / "X.npy")]
    for proba, header, expected in ((False, ["prediction"], clf.predict(X)[:, None]),
                                    (True, ["proba_-1", "proba_1"], clf.predict_proba(X))):
        flag = ["--proba"] if proba else []
        out = tmp_path / f"p{int(proba)}.csv"
        assert cli.main(["predict", str(tmp_path / "logistic"), *features, *flag, "--out", str(out)]) == 0
        rows = list(csv.reader(out.open()))
        assert rows[0] == header and len(rows) == 1 + X.shape[0]
        np.testing.assert_allclose(np.array(rows[1:], dtype=float), expected, rtol=1e-12)
        capsys.readouterr()
        assert cli.main(["predict", str(tmp_path / "logistic"), *features, *flag]) == 0
        assert capsys.readouterr().out == out.read_text()
    assert cli.main(["predict", str(tmp_path / "logistic"), *features, "--proba", "--out", str(tmp_path / "p.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), clf.predict_proba(X), rtol=1e-12)

    ds = load("diabetes", standardise=False)
    reg = mklscale.MKLRegressor(kernels={"family": "gaussian", "widths": [3]}, solver="uniform",
                                cache_dir=small / "cache").fit(ds.X[:40], ds.y[:40])
    reg.save(tmp_path / "reg")
    np.save(tmp_path / "Xr.npy", ds.X[40:50])
    capsys.readouterr()
    assert cli.main(["predict", str(tmp_path / "reg"), "--features", str(tmp_path / "Xr.npy")]) == 0
    rows = list(csv.reader(capsys.readouterr().out.splitlines()))
    assert rows[0] == ["prediction"]
    np.testing.assert_allclose(np.array(rows[1:], dtype=float)[:, 0], reg.predict(ds.X[40:50]), rtol=1e-12)
