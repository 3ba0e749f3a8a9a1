"""Models fitted on factor banks: prediction through landmarks, model files, bad input (issue 17).

The model must reproduce f = sum_m w_m L_m(X_new) L_m^T c + b with L_m(X_new) the bank's own
``cross_factor`` and L_m the stored factors, keep only the kept kernels' landmarks (no training rows),
and give on the training rows the stored factors' decision values.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import mklscale
from mklscale import datasets
from mklscale.bank import build_bank, families
from mklscale.errors import InvalidInputError
from mklscale.model import SCHEMA_VERSION, MKLModel
from mklscale.solvers.result import MKLResult

SPECS = (families.gaussian([0.5, 2.0]) + families.gaussian([1.0], features=[0, 2])
         + families.polynomial([2]) + families.linear(features=[1, 3]))
RANK = 12


@pytest.fixture(scope="module")
def data():
    ds = datasets.load("breast_cancer", standardise=False)
    X = ds.X[:, :6]
    return X[:80], ds.y[:80], X[80:130]


def _bank(tmp_path, X, normalize, rank=RANK, method="nystrom"):
    return build_bank(X, SPECS, tmp_path / f"fbank-{normalize}-{rank}-{method}", normalize=normalize, rank=rank,
                      method=method, max_error=1.0, progress=False)


def _sparse_result(M: int, n: int, seed: int) -> MKLResult:
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 2.0, M) * (rng.random(M) < 0.5)
    w[seed % M] = 1.0
    c = rng.normal(size=n) * (rng.random(n) < 0.4)
    return MKLResult(weights=w, dual_coef=c, bias=rng.normal(), active=np.flatnonzero(w), objective=0.0, gap=0.0,
                     solver="hand-made")


def _through_bank(bank, result, X_new):
    """sum_m w_m L_m(X_new) (L_m^T c) + b with the bank's cross_factor and stored factors."""
    f = np.full(X_new.shape[0], result.bias)
    for m in result.active:
        Lx = np.asarray(bank.cross_factor(X_new, [int(m)])[0], dtype=np.float64)
        f += result.weights[m] * Lx @ (np.asarray(bank.factor(int(m)), dtype=np.float64).T @ result.dual_coef)
    return f


@pytest.mark.parametrize("normalize", ["trace", "diag", None])
@pytest.mark.parametrize("method", ["nystrom", "cholesky"])
def test_prediction_equals_bank_cross_factor(tmp_path, data, normalize, method):
    X, _, X_new = data
    bank = _bank(tmp_path, X, normalize, method=method)
    result = _sparse_result(bank.M, bank.n, seed=3)
    model = MKLModel.from_results(bank, result, "classification", classes=[0, 1])
    np.testing.assert_allclose(model.decision_function(X_new), _through_bank(bank, result, X_new), rtol=1e-9,
                               atol=1e-9)
    # on the training rows L_m(X_train) is the stored factor (float32): the decision values of the fit
    stored = result.bias + sum(result.weights[m] * np.asarray(bank.factor(m), np.float64)
                               @ (np.asarray(bank.factor(m), np.float64).T @ result.dual_coef) for m in result.active)
    np.testing.assert_allclose(model.decision_function(X), stored, rtol=1e-4, atol=1e-4 * np.abs(stored).max())


def test_model_keeps_landmarks_not_training_rows(tmp_path, data):
    X, _, _ = data
    bank = _bank(tmp_path, X, "trace")
    result = _sparse_result(bank.M, bank.n, seed=1)
    model = MKLModel.from_results(bank, result, "classification", classes=[0, 1])
    assert model.X_rows is None and model.rows.size == 0 and model.dual_coef.shape == (1, 0)
    k = result.active.size
    assert model.factor.coef.shape == (1, k, RANK) and model.factor.transforms.shape == (k, RANK, RANK)
    landmarks = np.unique(np.concatenate([bank.landmarks(int(m)) for m in result.active]))
    landmarks = landmarks[landmarks >= 0]
    assert model.factor.n_landmarks == landmarks.size
    np.testing.assert_array_equal(model.factor.landmark_rows, bank.X_train[landmarks])


def test_one_vs_rest_heads(tmp_path, data):
    X, _, X_new = data
    bank = _bank(tmp_path, X, "trace")
    results = [_sparse_result(bank.M, bank.n, seed=s) for s in (1, 2, 5)]
    model = MKLModel.from_results(bank, results, "classification", classes=["a", "b", "c"])
    F = model.decision_function(X_new)
    for h, r in enumerate(results):
        np.testing.assert_allclose(F[:, h], _through_bank(bank, r, X_new), rtol=1e-9, atol=1e-9)


def test_save_load_predict_is_bit_identical_and_predicts_in_blocks(tmp_path, data, monkeypatch):
    X, _, X_new = data
    bank = _bank(tmp_path, X, "diag")
    model = MKLModel.from_results(bank, _sparse_result(bank.M, bank.n, seed=4), "regression")
    path = model.save(tmp_path / "model")
    doc = json.loads((path / "model.json").read_text())
    assert doc["representation"] == "factor" and doc["schema_version"] == SCHEMA_VERSION
    loaded, _ = MKLModel.read(path)
    expected = model.decision_function(X_new)
    np.testing.assert_array_equal(loaded.decision_function(X_new), expected)
    import mklscale.model_factor as mf
    monkeypatch.setattr(mf, "BATCH_BYTES", 8 * RANK * 7)  # blocks of a few rows: the same values
    np.testing.assert_allclose(loaded.decision_function(X_new), expected, rtol=1e-12, atol=1e-12)


def test_bad_input_to_a_factor_model(tmp_path, data):
    X, _, X_new = data
    bank = _bank(tmp_path, X, "trace")
    model = MKLModel.from_results(bank, _sparse_result(bank.M, bank.n, seed=2), "regression")
    with pytest.raises(InvalidInputError, match="same 6 columns"):
        model.decision_function(X_new[:, :5])
    with pytest.raises(InvalidInputError, match="factor bank"):
        model.decision_function_from_kernels(np.zeros((bank.M, 3, bank.n)))


def test_estimator_on_a_factor_bank_saves_and_loads(tmp_path, data):
    """MKLClassifier(rank=...) fits, predicts, saves and loads through the factor model."""
    X, y, X_new = data
    est = mklscale.MKLClassifier(kernels=list(SPECS), solver="uniform", rank=RANK, cache_dir=str(tmp_path / "c"))
    est.fit(X, y)
    assert est.model_.factor is not None
    n_marks = est.model_.factor.n_landmarks   # a short repr, no arrays (issue 28)
    assert f", factor: {len(SPECS)} of {len(SPECS)} kernels kept (" in repr(est.model_)
    assert f"{n_marks} landmark rows of {X.shape[0]} training rows" in repr(est.model_)
    assert repr(est.model_.factor).startswith(f"<FactorTerms {len(SPECS)} kernel(s) of rank <= {RANK}, {n_marks} landmark")
    est.save(tmp_path / "m")
    loaded = mklscale.load(tmp_path / "m")
    np.testing.assert_array_equal(loaded.decision_function(X_new), est.decision_function(X_new))
    assert (est.predict(X) == y).mean() > 0.8


def test_cli_fit_with_rank_then_predict(tmp_path, data, capsys):
    """`mklscale fit --rank R` saves a factor model; `mklscale predict` reads it; --rank 0 exits 2."""
    from mklscale import cli

    X, y, X_new = data
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "Xn.npy", X_new)
    common = ["--features", str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy"), "--task",
              "classification", "--family", "gaussian", "--widths", "1", "3", "--kernel-features", "all",
              "--solver", "uniform",
              "--cache-dir", str(tmp_path / "c"), "--quiet"]
    assert cli.main(["fit", *common, "--rank", "10", "--out", str(tmp_path / "m")]) == 0
    assert cli.main(["predict", str(tmp_path / "m"), "--features", str(tmp_path / "Xn.npy"), "--out",
                     str(tmp_path / "p.npy")]) == 0
    est = mklscale.load(tmp_path / "m")
    assert est.model_.factor is not None
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), est.predict(X_new))
    capsys.readouterr()
    assert cli.main(["fit", *common, "--rank", "0", "--out", str(tmp_path / "m0")]) == 2
    err = capsys.readouterr().err
    assert "rank" in err and "Traceback" not in err and not (tmp_path / "m0").exists()
