"""SMO-MKL's problem (P) in the primal (``smo.fit(..., method="primal")``, ``smo_primal.py``; issue 32).

It must reach the optimum of (P) itself: the Lanckriet QCQP oracle of test_smo and SMO-MKL on the same
factor bank, with a gap that bounds the truth and a returned model whose objective is (P) at that model;
no n x n matrix formed; "auto" takes it only where it applies; what it cannot solve is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from _banks import subset_gaussian_bank
from test_smo import lanckriet_oracle
from test_smo_factor import NoDenseFactorEngine, eigen_factors, grams_of

from mklscale.engine.memory import InMemoryEngine, InMemoryFactorEngine
from mklscale.errors import InvalidInputError
from mklscale.runtime.checkpoint import Checkpoint
from mklscale.solvers import smo

TOL = 1e-6


@pytest.fixture(scope="module")
def low_rank():
    grams, y = subset_gaussian_bank(60, 8, seed=1)
    factors = eigen_factors(grams, rank=12)
    return factors, grams_of(factors), y


@pytest.mark.parametrize("C", (0.1, 1.0, 30.0))
def test_reaches_the_qcqp_oracle_and_smo(low_rank, C):
    factors, tilde, y = low_rank
    ours = smo.fit(NoDenseFactorEngine(factors), y, C, tol=TOL, method="primal")
    theirs = smo.fit(NoDenseFactorEngine(factors), y, C, tol=1e-7, method="smo")
    optimum = lanckriet_oracle(tilde, y, C)
    assert ours.converged and ours.solver == "smo/primal" and ours.params["method"] == "primal"
    # the QCQP oracle is good to ~1e-6 here (at C = 30 our certified dual lies 1.6e-7 above it)
    assert ours.gap <= TOL and ours.params["dual"] <= optimum * (1 + 1e-6)
    assert -1e-6 <= (ours.objective - optimum) / ours.objective <= ours.gap + 1e-6
    assert ours.objective == pytest.approx(theirs.objective, rel=max(theirs.gap, TOL))
    # SMO-MKL's model form: f = sum_j w_j K~_j c + b, sum_j w_j = 1, objective = (P) there
    assert np.sum(ours.weights) == pytest.approx(1.0, abs=1e-12)
    q = np.einsum("i,mij,j->m", ours.dual_coef, tilde, ours.dual_coef)
    f = np.einsum("m,mij,j->i", ours.weights, tilde, ours.dual_coef) + ours.bias
    assert smo.primal_value(ours.weights, q, np.ones(len(q)), y, C, f) == pytest.approx(ours.objective, rel=1e-10)


def test_auto_takes_it_on_large_factor_banks_only(low_rank, monkeypatch, tmp_path):
    factors, tilde, y = low_rank
    monkeypatch.setattr(smo, "PRIMAL_MIN_N", y.size)
    assert smo.fit(InMemoryFactorEngine(factors), y, 1.0).params["method"] == "primal"
    assert smo.fit(InMemoryEngine(tilde), y, 1.0).params["method"] == "smo"
    assert smo.fit(InMemoryFactorEngine(factors), y, 1.0, d=np.full(8, 2.0)).params["method"] == "smo"
    assert smo.fit(InMemoryFactorEngine(factors), y, 1.0, tol=None).params["method"] == "smo"
    checkpoint = Checkpoint(tmp_path / "ck.npz", {"case": "auto"}, every_s=None, every_iter=1)
    assert smo.fit(InMemoryFactorEngine(factors), y, 1.0, checkpoint=checkpoint).params["method"] == "smo"
    monkeypatch.setattr(smo, "PRIMAL_MIN_N", y.size + 1)
    assert smo.fit(InMemoryFactorEngine(factors), y, 1.0).params["method"] == "smo"


def test_what_it_cannot_solve_is_refused(low_rank, tmp_path):
    factors, _, y = low_rank
    engine = InMemoryFactorEngine(factors)
    for kwargs in ({"d": np.full(8, 2.0)}, {"tol": None},
                   {"checkpoint": Checkpoint(tmp_path / "ck.npz", {"case": "no"}, every_s=None, every_iter=1)}):
        with pytest.raises(InvalidInputError, match="method='primal' solves"):
            smo.fit(engine, y, 1.0, method="primal", **kwargs)
    with pytest.raises(InvalidInputError, match="method"):
        smo.fit(engine, y, 1.0, method="dual")
