"""MKLModel: prediction without the bank, model files, ``mklscale.load``.

The model must reproduce f = sum_m w_m K_m(X_new, X_train) c + b computed through the bank's own
cross kernels (``KernelBank.cross``), while evaluating only the kept kernels against only the
training rows with non-zero dual coefficients.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mklscale
from mklscale import datasets
from mklscale.bank import KernelBank, KernelSpec, build_bank, families
from mklscale.errors import InvalidInputError, ModelFileError
from mklscale.model import SCHEMA_VERSION, MKLModel
from mklscale.solvers.result import MKLResult

SPECS = (families.gaussian([0.5, 2.0]) + families.gaussian([1.0], features=[0, 2])
         + families.polynomial([2]) + families.linear(features=[1, 3]))


@pytest.fixture(scope="module")
def data():
    ds = datasets.load("breast_cancer", standardise=False)
    X = ds.X[:, :6]
    return X[:60], ds.y[:60], X[60:90]


def _bank(tmp_path, X, normalize):
    return build_bank(X, SPECS, tmp_path / f"bank-{normalize}", normalize=normalize, progress=False)


def _sparse_result(M: int, n: int, seed: int) -> MKLResult:
    """A model with half the kernels and ~60% of the dual coefficients exactly zero."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 2.0, M) * (rng.random(M) < 0.5)
    w[seed % M] = 1.0  # at least one kernel
    c = rng.normal(size=n) * (rng.random(n) < 0.4)
    return MKLResult(weights=w, dual_coef=c, bias=rng.normal(), active=np.flatnonzero(w), objective=0.0, gap=0.0,
                     solver="hand-made")


class _ComputeSpy:
    """Records the kernels evaluated (KernelSpec.from_base) and the rows of every pairwise base."""

    def __init__(self, monkeypatch):
        self.kernels, self.base_rows = [], []
        base, from_base = KernelSpec.base, KernelSpec.from_base

        def spy_base(spec, X, Z):
            self.base_rows.append(Z.shape[0])
            return base(spec, X, Z)

        def spy_from_base(spec, B):
            if B.ndim == 2:  # spec.diag maps 1-D diagonals through from_base too
                self.kernels.append(spec)
            return from_base(spec, B)

        monkeypatch.setattr(KernelSpec, "base", spy_base)
        monkeypatch.setattr(KernelSpec, "from_base", spy_from_base)


@pytest.mark.parametrize("normalize", ["trace", "diag"])
def test_prediction_equals_bank_cross_and_touches_only_kept_kernels_and_rows(tmp_path, data, normalize, monkeypatch):
    X, _, X_new = data
    bank = _bank(tmp_path, X, normalize)
    result = _sparse_result(bank.M, bank.n, seed=1)
    expected = result.decision_function_from_kernels(bank.cross(X_new, result.active))

    model = MKLModel.from_results(bank, result, "regression")
    rows = np.flatnonzero(result.dual_coef)
    assert len(model.specs) == result.active.size < bank.M
    np.testing.assert_array_equal(model.rows, rows)
    assert model.X_rows.shape == (rows.size, X.shape[1]) and rows.size < bank.n

    spy = _ComputeSpy(monkeypatch)
    got = model.decision_function(X_new)
    assert spy.kernels == [bank.specs[m] for m in result.active]
    assert spy.base_rows and set(spy.base_rows) == {rows.size}
    assert got.shape == (X_new.shape[0],)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-8)


def test_one_vs_rest_heads_share_kernels_and_rows(tmp_path, data):
    X, _, X_new = data
    bank = _bank(tmp_path, X, "trace")
    results = [_sparse_result(bank.M, bank.n, seed=s) for s in (2, 3, 4)]
    model = MKLModel.from_results(bank, results, "classification", classes=np.array(["a", "b", "c"]))
    union = np.unique(np.concatenate([r.active for r in results]))
    np.testing.assert_array_equal(model.bank_kernels, union)
    F = model.decision_function(X_new)
    assert F.shape == (X_new.shape[0], 3)
    for h, r in enumerate(results):
        expected = r.decision_function_from_kernels(bank.cross(X_new, r.active))
        np.testing.assert_allclose(F[:, h], expected, rtol=0, atol=1e-8)
    # a head without kernels predicts its bias
    empty = MKLResult(weights=np.zeros(bank.M), dual_coef=np.ones(bank.n), bias=0.25, active=[], objective=0.0, gap=0.0)
    m2 = MKLModel.from_results(bank, [results[0], empty], "classification", classes=np.array([0, 1]))
    np.testing.assert_allclose(m2.decision_function(X_new)[:, 1], 0.25)
    np.testing.assert_array_equal(m2.rows, np.flatnonzero(results[0].dual_coef))


def test_model_predicts_without_the_bank(tmp_path, data):
    import shutil

    X, y, X_new = data
    est = mklscale.MKLClassifier(kernels=SPECS, solver="smo", cache_dir=tmp_path / "cache").fit(X, y)
    before = est.decision_function(X_new)
    shutil.rmtree(est.fit_stats_["bank"])
    np.testing.assert_array_equal(est.decision_function(X_new), before)


def test_save_load_predict_is_bit_identical(tmp_path, data):
    X, y, X_new = data
    est = mklscale.MKLClassifier(kernels=SPECS, solver="spicy", C=0.05, cache_dir=tmp_path / "cache").fit(X, y)
    path = est.save(tmp_path / "model")
    assert sorted(os.listdir(path)) == ["arrays.npz", "model.json"]
    loaded = mklscale.load(path)
    assert type(loaded) is mklscale.MKLClassifier
    np.testing.assert_array_equal(loaded.decision_function(X_new), est.decision_function(X_new))
    np.testing.assert_array_equal(loaded.predict_proba(X_new), est.predict_proba(X_new))
    np.testing.assert_array_equal(loaded.classes_, est.classes_)
    assert loaded.get_params()["kernels"] == list(SPECS)
    assert loaded.get_params()["C"] == 0.05
    assert list(loaded.kernel_weights_.index) == est.selected_kernels_
    assert loaded.n_features_in_ == X.shape[1]
    doc = json.loads((path / "model.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION and doc["mklscale_version"] == mklscale.__version__
    assert doc["task"] == "classification" and doc["classes"] == [-1.0, 1.0]
    assert len(doc["specs"]) == len(est.selected_kernels_) and len(doc["heads"]) == 1
    assert doc["heads"][0]["bias"] == float(est.model_.bias[0])
    # saving again over the model replaces it and leaves no temporary folder behind
    est.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "model"]


def test_model_file_has_no_pickles(tmp_path, data, monkeypatch):
    X, y, X_new = data
    est = mklscale.MKLRegressor(kernels=SPECS[:3], cache_dir=tmp_path / "cache").fit(X, X[:, 0])
    path = est.save(tmp_path / "model")
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:  # raises on any object array
        assert all(npz[k].dtype.kind in "fiub" for k in npz.files)
    seen = []
    original = np.load

    def load(*args, **kwargs):
        seen.append(kwargs.get("allow_pickle", False))
        return original(*args, **kwargs)

    monkeypatch.setattr(np, "load", load)
    mklscale.load(path).predict(X_new)
    assert seen == [False]


def test_truncated_arrays_are_refused(tmp_path, data):
    X, y, _ = data
    est = mklscale.MKLClassifier(kernels=SPECS[:2], cache_dir=tmp_path / "cache").fit(X, y)
    path = est.save(tmp_path / "model")
    f = path / "arrays.npz"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ModelFileError, match=r"arrays\.npz.*(re-save|refit)"):
        mklscale.load(path)


def test_corrupted_arrays_are_refused(tmp_path, data):
    X, y, _ = data
    path = mklscale.MKLClassifier(kernels=SPECS[:2], cache_dir=tmp_path / "c").fit(X, y).save(tmp_path / "m")
    raw = bytearray((path / "arrays.npz").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (path / "arrays.npz").write_bytes(bytes(raw))
    with pytest.raises(ModelFileError, match="corrupted"):
        mklscale.load(path)


def test_newer_schema_is_refused(tmp_path, data):
    X, y, _ = data
    path = mklscale.MKLClassifier(kernels=SPECS[:2], cache_dir=tmp_path / "c").fit(X, y).save(tmp_path / "m")
    doc = json.loads((path / "model.json").read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    (path / "model.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="upgrade mklscale"):
        mklscale.load(path)


def test_missing_or_foreign_paths(tmp_path, data):
    X, y, _ = data
    with pytest.raises(ModelFileError, match="model.json is missing"):
        mklscale.load(tmp_path / "nothing")
    est = mklscale.MKLClassifier(kernels=SPECS[:2], cache_dir=tmp_path / "c").fit(X, y)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(ModelFileError, match="not an mklscale model"):
        est.save(foreign)
    assert (foreign / "keep.txt").read_text() == "mine"


def test_failed_save_leaves_old_model_intact(tmp_path, data, monkeypatch):
    X, y, X_new = data
    est = mklscale.MKLClassifier(kernels=SPECS[:2], cache_dir=tmp_path / "c").fit(X, y)
    path = est.save(tmp_path / "m")
    before = (path / "arrays.npz").read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        est.save(path)
    assert (path / "arrays.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "m"]
    monkeypatch.undo()
    np.testing.assert_array_equal(mklscale.load(path).predict(X_new), est.predict(X_new))


def test_gram_matrix_bank_predicts_from_cross_kernels_only(tmp_path, data):
    X, y, X_new = data
    feature_bank = build_bank(X, SPECS, tmp_path / "features", normalize=None, standardize=False, progress=False)
    grams = feature_bank.kernels(range(feature_bank.M)).astype(np.float64)
    cross = feature_bank.cross(X_new)
    bank = KernelBank.from_arrays(grams, tmp_path / "grams", names=feature_bank.names, cross_grams=cross,
                                  normalize="trace", dtype="float64")
    est = mklscale.MKLClassifier(solver="smo").fit_bank(bank, y)
    assert not hasattr(est, "n_features_in_")
    with pytest.raises(InvalidInputError, match="decision_function_from_kernels"):
        est.predict(X_new)
    r = est.result_
    expected = r.decision_function_from_kernels(bank.cross(None, r.active))
    np.testing.assert_allclose(est.decision_function_from_kernels(bank.cross(None)), expected, rtol=0, atol=1e-8)
    np.testing.assert_allclose(est.decision_function_from_kernels(bank.cross(None, est.model_.bank_kernels)),
                               expected, rtol=0, atol=1e-8)
    assert set(est.predict_from_kernels(bank.cross(None))) <= {-1.0, 1.0}
    with pytest.raises(InvalidInputError, match="K_cross must have shape"):
        est.decision_function_from_kernels(bank.cross(None)[:, :, :5])
    loaded = mklscale.load(est.save(tmp_path / "m"))
    np.testing.assert_array_equal(loaded.decision_function_from_kernels(bank.cross(None)),
                                  est.decision_function_from_kernels(bank.cross(None)))


@pytest.mark.parametrize("normalize", ["trace", "diag"])
def test_fitted_estimator_matches_its_result_through_bank_cross(tmp_path, data, normalize):
    X, y, X_new = data
    est = mklscale.MKLClassifier(kernels=SPECS, solver="smo", normalize=normalize, cache_dir=tmp_path / "c").fit(X, y)
    bank = KernelBank.open(est.fit_stats_["bank"])
    assert bank.normalize == normalize
    r = est.result_
    assert est.model_.rows.size == np.count_nonzero(r.dual_coef) < bank.n  # hinge loss: sparse dual
    expected = r.decision_function_from_kernels(bank.cross(X_new, r.active))
    np.testing.assert_allclose(est.decision_function(X_new), expected, rtol=0, atol=1e-8)


# ---- issue 18: compiled kernels never see operands of other shapes -------------------------------------
def test_distance_kernels_check_their_operands_shapes():
    """The numba kernels prediction runs (pairwise bases, factor rows) raise on operands of other shapes
    instead of reading out of bounds; operands of the right shapes give the values."""
    from mklscale.bank import _compute, factor

    X, Z = np.ones((3, 4)), np.zeros((2, 4))
    np.testing.assert_array_equal(_compute.sqdist(X, Z), np.full((3, 2), 4.0))
    for fn in (_compute.sqdist, _compute.dot):
        with pytest.raises(ValueError, match="operand shapes disagree"):
            fn(X, Z[:, :3])  # Z narrower than X
        with pytest.raises(ValueError, match="operand shapes disagree"):
            fn(X[:, :3], Z)  # X narrower than Z
    Xt, Zt = np.ones((4, 3)), np.ones((4, 2))
    with pytest.raises(ValueError, match="operand shapes disagree"):
        _compute.base_row(Xt, 0, Zt, 0, 5, _compute.SQDIST, np.empty(5))  # j1 beyond Z's points
    with pytest.raises(ValueError, match="operand shapes disagree"):
        _compute.base_row(Xt, 3, Zt, 0, 2, _compute.SQDIST, np.empty(2))  # i beyond X's points
    with pytest.raises(ValueError, match="operand shapes disagree"):
        _compute.base_row(Xt, 0, Zt, 0, 2, _compute.SQDIST, np.empty(1))  # out too short
    params = np.array([[_compute.LINEAR, 0.0, 1.0]] * 2)
    with pytest.raises(ValueError, match="_fill_grams"):
        _compute.fill_grams(X, _compute.DOT, params, _compute.NO_NORM, np.empty((1, 3, 3)))  # room for 1 kernel of 2
    with pytest.raises(ValueError, match="_kernel_row"):
        _compute._kernel_row(np.ones(5), _compute.LINEAR, 0.0, 1, 1.0, np.ones(5), np.empty(3), _compute.EXP_F64)
    with pytest.raises(ValueError, match="_kernel_row: EXP_F32"):
        _compute._kernel_row(np.ones(5), _compute.GAUSSIAN, -0.5, 1, 1.0, np.ones(5), np.empty(5, np.float32),
                             _compute.EXP_F32)
    with pytest.raises(ValueError, match="_cross_cols"):
        factor._cross_cols(Xt, Zt, _compute.SQDIST, _compute.GAUSSIAN, -0.5, 1, np.empty((2, 2)))
    with pytest.raises(ValueError, match="operand shapes disagree"):
        factor._cross_cols(Xt, Zt[:3], _compute.SQDIST, _compute.GAUSSIAN, -0.5, 1, np.empty((2, 3)))
    with pytest.raises(ValueError, match="_apply"):
        factor._apply(np.ones((3, 5)), np.ones((2, 4)), False, np.empty((5, 4)))  # T has fewer rows than landmarks
    with pytest.raises(ValueError, match="_apply"):
        factor._apply(np.ones((2, 5)), np.ones((2, 4)), False, np.empty((4, 4)))  # out of the wrong shape


def test_results_that_do_not_make_a_valid_model_are_refused(tmp_path, data):
    X, _, _ = data
    bank = _bank(tmp_path, X, "trace")
    r = _sparse_result(bank.M, bank.n, seed=1)
    r.dual_coef[np.flatnonzero(r.dual_coef)[0]] = np.nan
    with pytest.raises(InvalidInputError, match="dual_coef contains NaN or inf"):
        MKLModel.from_results(bank, r, "regression")
    with pytest.raises(InvalidInputError, match=r"3 classes need one head per class"):
        MKLModel.from_results(bank, _sparse_result(bank.M, bank.n, seed=1), "classification", classes=[0, 1, 2])


def test_model_files_of_schema_1_still_load_and_take_standardised_dataset_features(tmp_path, data):
    """A dense model file of schema 1 (written before issue 18) loads and predicts as before; it is taken
    to expect a named dataset's standardised features (what `mklscale fit --dataset` fitted it on)."""
    X, y, X_new = data
    est = mklscale.MKLClassifier(kernels=SPECS[:2], solver="uniform", cache_dir=tmp_path / "c").fit(X, y)
    path = est.save(tmp_path / "m")
    assert mklscale.load(path).model_.dataset_features == "raw"
    doc = json.loads((path / "model.json").read_text())
    doc["schema_version"] = 1
    del doc["representation"]  # schema 1 files had no representation entry
    (path / "model.json").write_text(json.dumps(doc))
    old = mklscale.load(path)
    assert old.model_.dataset_features == "standardised"
    np.testing.assert_array_equal(old.decision_function(X_new), est.decision_function(X_new))


# ---- issue 28: rows scaled the wrong way, a short repr ------------------------------------------------------
@pytest.mark.parametrize("name", ["wine", "breast_cancer", "digits", "diabetes"])
def test_standardised_rows_given_to_a_model_of_raw_rows_warn(tmp_path, name):
    """A model fitted on a dataset's raw rows warns (UserWarning, at the caller's line) when given the
    standardised rows of ``datasets.load(name).X``, also 10 of them; raw rows, single rows and a model
    fitted on standardised rows (nothing to tell apart) do not warn."""
    import warnings

    raw, std = datasets.load(name, standardise=False), datasets.load(name)
    Est = mklscale.MKLRegressor if raw.task == "regression" else mklscale.MKLClassifier
    kw = dict(kernels={"family": "gaussian", "widths": [3.0]}, solver="uniform", cache_dir=tmp_path / "c")
    est = Est(**kw).fit(raw.X[:120], raw.y[:120])
    rows = np.random.default_rng(0).choice(len(raw.y), 10, replace=False)
    for X in (std.X, std.X[rows]):
        with pytest.warns(UserWarning, match="look already standardised") as caught:
            est.predict(X)
        assert caught[0].filename == __file__
        assert "load(NAME, standardise=False).X" in str(caught[0].message)
    on_std = Est(**kw).fit(std.X[:120], std.y[:120])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for X in (raw.X, raw.X[rows], raw.X[120:], std.X[:1]):
            est.predict(X)
        on_std.predict(std.X)
        on_std.predict(std.X[rows])


def test_model_repr_is_one_short_line_and_the_estimators_stays_sklearns(tmp_path, data):
    X, y, X_new = data
    est = mklscale.MKLClassifier(kernels=SPECS, solver="spicy", C=0.3, cache_dir=tmp_path / "c").fit(X, y)
    model = est.model_
    text = repr(model)
    assert str(model) == text and "\n" not in text and len(text) < 400 and "array(" not in text
    assert text.startswith("<MKLModel classification, 2 classes, dense: ")
    assert f"{len(model.specs)} of {len(SPECS)} kernels kept" in text
    assert f"{model.rows.size} of {X.shape[0]} training rows" in text
    assert "6 raw features standardised by the model" in text
    shares = 100 * np.abs(model.weights[0]) / np.abs(model.weights[0]).sum()
    top = int(np.argmax(shares))
    assert f"{shares[top]:.1f}% {model.specs[top].name}" in text
    assert repr(est).startswith("MKLClassifier(") and "C=0.3" in repr(est) and "MKLModel" not in repr(est)
    ovr = mklscale.MKLClassifier(kernels=SPECS[:2], solver="uniform", cache_dir=tmp_path / "c").fit(
        X, np.arange(X.shape[0]) % 3)
    assert repr(ovr.model_).startswith("<MKLModel classification, 3 classes (3 one-vs-rest heads), dense: 2 of 2")
