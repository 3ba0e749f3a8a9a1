"""FHeuristic on the real engine over small zarr banks: weights against the numpy formula (both
tasks), the final fit, two passes with ||K_m||_F from the bank metadata, the in-memory fallback, the
uniform fallback and bad inputs. MKLpy's own FHeuristic is compared in test_easymkl.py."""

from __future__ import annotations

import numpy as np
import pytest
from _banks import subset_gaussian_bank, widths_and_linear_bank
from _dense_engine import DenseEngine

from mklscale.bank import KernelBank
from mklscale.engine import Engine
from mklscale.errors import InvalidInputError
from mklscale.solvers import _final_fit, fheuristic, registry


@pytest.fixture(autouse=True)
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def engine_of(grams, path):
    return Engine(KernelBank.from_arrays(grams, path, dtype="float64"), threads=1)


def numpy_weights(grams, y):
    """w_m = A_m / sum_j A_j, A_m = y^T K_m y / (||K_m||_F ||y||^2)."""
    a = np.einsum("i,mij,j->m", y, grams, y) / (np.linalg.norm(grams, axis=(1, 2)) * (y @ y))
    return a / a.sum()


@pytest.fixture(scope="module")
def classification():
    grams, y = subset_gaussian_bank(40, 6, 2)
    return grams * np.linspace(0.5, 3.0, len(grams))[:, None, None], y  # different Frobenius norms


def test_classification_weights_and_svm(classification, tmp_path):
    grams, y = classification
    with engine_of(grams, tmp_path / "bank") as eng:
        res = fheuristic.fit(eng, y, C=10.0)
        stats = eng.stats
    np.testing.assert_allclose(res.weights, numpy_weights(grams, y), rtol=1e-12)
    # the scale of a kernel does not change its alignment: weights differ from y^T K_m y normalised
    q = np.einsum("i,mij,j->m", y, grams, y)
    assert not np.allclose(res.weights, q / q.sum(), rtol=1e-3)
    K = np.einsum("m,mij->ij", res.weights, grams)
    c, b, _ = _final_fit.svm(K, y, 10.0)
    np.testing.assert_allclose(res.dual_coef, c, atol=1e-10)
    assert res.bias == pytest.approx(b, abs=1e-10)
    assert res.params["task"] == "classification" and not res.params["fallback"]
    assert res.objective == pytest.approx(_final_fit.centred_alignment(K, y))
    # one quad_forms pass and one combine pass; ||K_m||_F comes from the bank metadata
    assert stats["passes"] == 2 == res.history[-1]["passes"]
    assert [e["op"] for e in stats["log"]] == ["quad_forms", "combine"]
    assert stats["kernels_read"] == 2 * len(grams)


def test_regression_weights_and_kernel_ridge(tmp_path):
    grams, _, y = widths_and_linear_bank(30, 1)
    with engine_of(grams, tmp_path / "bank") as eng:
        res = fheuristic.fit(eng, y, lam=0.5)
    np.testing.assert_allclose(res.weights, numpy_weights(grams, y), rtol=1e-12)
    c, b = _final_fit.kernel_ridge(np.einsum("m,mij->ij", res.weights, grams), y, 0.5)
    np.testing.assert_allclose(res.dual_coef, c, atol=1e-10)
    assert res.bias == pytest.approx(b, abs=1e-10) and res.params["task"] == "regression"


def test_in_memory_engine_computes_the_norms(classification, tmp_path):
    """The in-memory engine computes ||K_m||_F itself; the real engine reads the bank's metadata."""
    grams, y = classification
    dense = DenseEngine(grams)
    np.testing.assert_allclose(dense.frobenius_norms, np.linalg.norm(grams, axis=(1, 2)), rtol=1e-13)
    np.testing.assert_allclose(dense.traces, np.trace(grams, axis1=1, axis2=2), rtol=1e-13)
    with engine_of(grams, tmp_path / "bank") as eng:
        real = fheuristic.fit(eng, y, C=10.0)
        np.testing.assert_allclose(eng.frobenius_norms, np.linalg.norm(grams, axis=(1, 2)), rtol=1e-12)
    mem = fheuristic.fit(dense, y, C=10.0)
    np.testing.assert_allclose(mem.weights, real.weights, rtol=1e-12)
    np.testing.assert_allclose(mem.dual_coef, real.dual_coef, atol=1e-9)


def test_no_aligned_kernel_falls_back_to_uniform(tmp_path):
    rng = np.random.default_rng(0)
    y = np.repeat([1.0, -1.0], 10)
    X = rng.normal(size=(20, 3))
    X -= np.outer(y, y @ X) / (y @ y)  # every feature orthogonal to y: y^T (x x^T) y = 0
    grams = np.stack([np.outer(X[:, j], X[:, j]) for j in range(3)])
    with engine_of(grams, tmp_path / "bank") as eng:
        res = fheuristic.fit(eng, y)
    assert res.params["fallback"] and np.allclose(res.weights, 1 / 3)


def test_registry_and_bad_inputs(classification, tmp_path):
    grams, y = classification
    with engine_of(grams, tmp_path / "bank") as eng:
        a = registry.fit_solver("fheuristic", eng, y, "classification", C=10.0)
        b = fheuristic.fit(eng, y, C=10.0)
        np.testing.assert_array_equal(a.dual_coef, b.dual_coef)
        assert a.solver == "fheuristic" and registry.c_parameter("fheuristic", "classification") == "C"
        auto = registry.resolve_C("fheuristic", eng, [y], "classification")       # scikit-learn's C = 1 on unit diagonal
        assert auto == pytest.approx(eng.n / np.mean(eng.traces))
        passes = eng.stats["passes"]
        with pytest.raises(InvalidInputError, match="C must be finite and > 0"):
            fheuristic.fit(eng, y, C=0.0)
        with pytest.raises(InvalidInputError, match="NaN"):
            fheuristic.fit(eng, np.where(np.arange(y.size) == 3, np.nan, y))
        with pytest.raises(InvalidInputError, match="y has 5 entries"):
            fheuristic.fit(eng, y[:5])
        with pytest.raises(InvalidInputError, match=r"\{-1, \+1\}"):
            fheuristic.fit(eng, np.arange(y.size, dtype=float), task="classification")
        with pytest.raises(InvalidInputError, match="does not take parameter"):
            registry.fit_solver("fheuristic", eng, y, "classification", params={"learner": "svm"})
        assert eng.stats["passes"] == passes  # refused before reading the bank
