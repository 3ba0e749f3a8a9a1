"""Defaults that work (issue 28): every registered solver, on every task it supports, converges at its
default parameters (kernels="auto", C="auto") on the shipped datasets: no ConvergenceWarning.

The quick datasets run by default; the larger ones (breast_cancer, digits, the IDA generators at n = 1000)
under ``-m slow``. Times are measured in benchmarks/, never asserted here."""

from __future__ import annotations

import warnings

import pytest
from sklearn.exceptions import ConvergenceWarning

from mklscale import MKLClassifier, MKLRegressor, datasets
from mklscale.solvers import registry

QUICK = ("wine", "iris", "diabetes")
SLOW = ("breast_cancer", "digits", "ringnorm", "twonorm", "waveform")


def _cases(names):
    for name in names:
        task = "regression" if name == "diabetes" else "classification"
        for solver in registry.names():
            if registry.supports(solver, task):
                yield pytest.param(name, solver, id=f"{name}-{solver}")


def _fit_with_defaults(name, solver, cache):
    kw = {"n_samples": 1000} if name in ("ringnorm", "twonorm", "waveform") else {}
    ds = datasets.load(name, standardise=False, **kw)
    Estimator = MKLRegressor if ds.task == "regression" else MKLClassifier
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = Estimator(solver=solver, random_state=0, cache_dir=cache).fit(ds.X, ds.y)
    assert est.fit_stats_["converged"] and est.fit_stats_["convergence_warning"] is None
    assert est.C_ > 0 and est.fit_stats_["C"] == est.C_
    assert est.score(ds.X, ds.y) > (0.3 if ds.task == "regression" else 0.8)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("banks")


@pytest.mark.parametrize("name,solver", list(_cases(QUICK)))
def test_defaults_converge(name, solver, cache):
    _fit_with_defaults(name, solver, cache)


@pytest.mark.slow
@pytest.mark.parametrize("name,solver", list(_cases(SLOW)))
def test_defaults_converge_on_the_larger_sets(name, solver, cache):
    _fit_with_defaults(name, solver, cache)
