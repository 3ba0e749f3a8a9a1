"""Crafted inputs are clear errors (issue 29, items 13-15): a seeded fuzzer of model.json mutations
(every mutated file loads and predicts, or is refused with ModelFileError, CLI exit 2; no
RecursionError, AttributeError, TypeError, KeyError: exit 70), features that overflow, a billion
random-subset kernels, an endpoint URL holding credentials."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest

import mklscale
from mklscale import MKLClassifier
from mklscale.cli import main
from mklscale.errors import MKLScaleError, ModelFileError

MUTATIONS = 300
ODD_VALUES = [None, True, False, 0, -1, 2**63, 1e308, float("-inf"), "", "x" * 3, [], [1, "a"], {}, {"a": 1},
              "dense", "factor", "sparse", "classification", "gaussian"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = (X[:, 0] > 0).astype(int)
    path = tmp_path_factory.mktemp("model") / "m"
    est = MKLClassifier(solver="uniform", kernels={"family": "gaussian", "widths": [1, 2]},
                        cache_dir=tmp_path_factory.mktemp("cache")).fit(X, y)
    est.save(path)
    return path, X


def _paths(value, prefix=()):
    """Every (path, value) inside a JSON document."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _mutate(doc: dict, rng: np.random.Generator) -> dict:
    doc = copy.deepcopy(doc)
    paths = [p for p, _ in _paths(doc) if p and p[0] != "arrays"]
    path = paths[rng.integers(len(paths))]
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    kind = rng.integers(4)
    if kind == 0:
        parent[path[-1]] = ODD_VALUES[rng.integers(len(ODD_VALUES))]
    elif kind == 1 and isinstance(parent, dict):
        del parent[path[-1]]
    elif kind == 2:
        deep = 0
        for _ in range(int(rng.choice([30, 900]))):
            deep = [deep]
        parent[path[-1]] = deep
    else:
        parent[path[-1]] = {"unexpected": parent[path[-1]]}
    return doc


def test_mutated_model_files_load_and_predict_or_are_refused_clearly(saved, tmp_path):
    path, X = saved
    original = json.loads((path / "model.json").read_text())
    rng = np.random.default_rng(29)
    outcomes = {"loaded": 0, "refused": 0}
    target = tmp_path / "mutant"
    for i in range(MUTATIONS):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(path, target)
        doc = _mutate(original, rng)
        (target / "model.json").write_text(json.dumps(doc))
        try:
            est = mklscale.load(target)
            est.predict(X)
            outcomes["loaded"] += 1
        except ModelFileError:
            outcomes["refused"] += 1
        except MKLScaleError as exc:  # a clear error of another kind (e.g. predict's input checks)
            outcomes["refused"] += 1
            assert str(exc), i
        except Exception as exc:  # noqa: BLE001 - anything else is a defect
            pytest.fail(f"mutation {i} of model.json escaped as {type(exc).__name__}: {exc}\n{json.dumps(doc)[:400]}")
    assert outcomes["refused"] > MUTATIONS // 4 and outcomes["loaded"] > 0, outcomes


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(estimator="MKLClassifier"), "estimator must be a table"),
    (lambda d: d.update(representation="sparse"), "representation 'sparse'"),
    (lambda d: d.update(schema_version=0), "schema_version"),
    (lambda d: d.update(schema_version=-3), "schema_version"),
    (lambda d: d.update(schema_version=True), "schema_version"),
    (lambda d: d["estimator"]["params"].update(surprise=1), "unknown parameter"),
    (lambda d: d["estimator"]["params"].update(solver=17), "parameters are invalid"),
])
def test_each_crafted_field_is_named(saved, tmp_path, edit, message, capsys):
    path, X = saved
    target = tmp_path / "m"
    shutil.copytree(path, target)
    doc = json.loads((target / "model.json").read_text())
    edit(doc)
    (target / "model.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match=message):
        mklscale.load(target)
    np.save(tmp_path / "X.npy", X)
    assert main(["predict", str(target), "--features", str(tmp_path / "X.npy")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_deeply_nested_model_file_is_refused(saved, tmp_path):
    path, _ = saved
    target = tmp_path / "m"
    shutil.copytree(path, target)
    text = (target / "model.json").read_text()
    (target / "model.json").write_text(text[:-1] + ', "info2": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(ModelFileError, match="nested deeper"):
        mklscale.load(target)


def test_features_whose_squares_overflow_are_refused_before_any_work(tmp_path):
    from mklscale.errors import InvalidInputError

    X = np.ones((20, 2))
    X[3, 1] = 1e300
    with pytest.raises(InvalidInputError, match="row 3, column 1.*overflow"):
        MKLClassifier(solver="uniform", cache_dir=tmp_path).fit(X, np.arange(20) % 2)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no bank was started


def test_a_billion_random_subsets_are_refused_at_once_everywhere(tmp_path, capsys, monkeypatch):
    import time

    from mklscale.errors import SpecError

    X = np.random.default_rng(0).normal(size=(30, 4))
    t0 = time.monotonic()
    with pytest.raises(SpecError, match="n_kernels=1,000,000,000 needs about .* GB of memory"):
        MKLClassifier(kernels={"family": "random_subsets", "n_kernels": 10**9}, cache_dir=tmp_path).fit(X, np.arange(30) % 2)
    np.save(tmp_path / "X.npy", X)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: refused before any request
    assert main(["bank", "build", "--features", str(tmp_path / "X.npy"), "--family", "random_subsets",
                 "--n-kernels", str(10**9), "--out", "s3://some-bucket/huge.zarr", "--quiet"]) == 2
    assert "needs about" in capsys.readouterr().err
    assert time.monotonic() - t0 < 20


def test_an_endpoint_url_with_credentials_is_refused_without_showing_them(tmp_path, monkeypatch, capsys):
    from mklscale.bank import KernelBank

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://keyid:S3CRETVALUE@127.0.0.1:9")
    with pytest.raises(Exception) as info:
        KernelBank.open("s3://some-bucket/bank.zarr")
    assert "holds credentials" in str(info.value) and "S3CRETVALUE" not in str(info.value)
    assert main(["bank", "info", "s3://some-bucket/bank.zarr"]) == 2
    assert "S3CRETVALUE" not in capsys.readouterr().err
