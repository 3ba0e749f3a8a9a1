"""The solver registry is derived from the solvers' signatures, so no parameter drops out of reach."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import mklscale
from mklscale.errors import InvalidInputError
from mklscale.solvers import registry


@pytest.mark.parametrize("name", registry.names())
def test_every_keyword_of_the_solver_functions_is_accepted(name):
    info = registry.info(name)
    accepted = set(registry.accepted_params(name))
    for target in info.functions:
        module, function = target.split(":")
        fn = getattr(__import__(f"mklscale.solvers.{module}", fromlist=[function]), function)
        own = set(inspect.signature(fn).parameters) - registry.NOT_PARAMETERS
        assert own <= accepted, f"{name}: {sorted(own - accepted)} cannot be set through the registry"
    assert not accepted & registry.NOT_PARAMETERS


@pytest.mark.parametrize("name, param, value", [
    ("spicy", "working_set_bytes", 10**9), ("sgd", "average_from", 10), ("gcd", "variant", "fw")])
def test_parameters_that_used_to_be_unreachable(name, param, value):
    task = "regression"
    assert registry.check_params(name, {param: value}, task) == {param: value}
    est = mklscale.MKLRegressor(solver=name, solver_params={param: value})
    assert est._check_solver()[param] == value


def test_estimators_declare_and_enforce_parameter_types():
    constraints = mklscale.MKLClassifier._parameter_constraints
    assert set(constraints) == set(mklscale.MKLClassifier().get_params())
    X, y = np.random.default_rng(0).normal(size=(12, 2)), np.array([0, 1] * 6)
    with pytest.raises(InvalidInputError, match="'checkpoint_every_s' parameter.*range"):
        mklscale.MKLClassifier(checkpoint_every_s=0).fit(X, y)
    with pytest.raises(InvalidInputError, match="'normalize' parameter"):
        mklscale.MKLClassifier(normalize="max").fit(X, y)
    with pytest.raises(InvalidInputError, match="unknown solver 'newton'"):
        mklscale.MKLClassifier(solver="newton").fit(X, y)


def test_citi_has_its_own_name_and_the_old_one_still_works():
    assert "citi" in registry.names() and "elasticnet" not in registry.names()
    assert registry.canonical("elasticnet") == "citi" == registry.canonical("citi")
    assert registry.accepted_params("elasticnet") == registry.accepted_params("citi")
    assert registry.supports("elasticnet", "classification") and not registry.supports("citi", "regression")
    from mklscale.pipeline.spec import _check_solver

    assert _check_solver({"name": "old", "solver": "elasticnet", "eta": 0.5}, "solver[0]")["solver"] == "elasticnet"
    old = mklscale.MKLClassifier(kernels="linear", solver="elasticnet", cache_dir=None)
    assert old._check_solver() == {}
