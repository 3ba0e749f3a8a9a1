"""What `mklscale fit`, `mklscale predict` and `mklscale run` write (issue 18, items 11 and 14).

Item 11: every output (a model folder, a predictions file) is written under a temporary name and
renamed, so a full disk -- a real one, a small tmpfs filled to its last page -- gives exit code 2 with
a message saying what to do, leaves no partial or temporary file, and keeps what was there before.

Item 14: a model fitted by `mklscale fit --dataset NAME` owns the whole map from the dataset's raw
features to the kernel inputs, so `predict --features` on raw rows agrees with `predict --dataset`;
model files of schema < 3, fitted on standardised dataset features, still load and say so.
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
        assert cli.main(["fit", *_fit_args(small), "--C", "2", "--out", str(mnt / "model")]) == 2
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
def test_fit_on_a_dataset_predicts_its_raw_features(tmp_path):
    """`fit --dataset wine` then `predict --features` on the raw wine rows gives the classes of
    `predict --dataset wine` (and the training labels, mostly): the model standardises them itself."""
    raw = load("wine", standardise=False)
    np.save(tmp_path / "X_raw.npy", raw.X)
    assert cli.main(["fit", "--dataset", "wine", *WINE, "--cache-dir", str(tmp_path / "c"),
                     "--out", str(tmp_path / "m")]) == 0
    assert cli.main(["predict", str(tmp_path / "m"), "--features", str(tmp_path / "X_raw.npy"),
                     "--out", str(tmp_path / "p_raw.npy")]) == 0
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
