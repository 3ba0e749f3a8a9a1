"""One engine per bank per run: a pipeline's solvers (their cross-validation and their refit) and its
paths all run on the one engine the run opens on its bank, so the kernels the CV read stay in the
engine's block cache for the refit; every results entry still counts only its own passes."""

from __future__ import annotations

import numpy as np
import pytest

from mklscale.bank import KernelBank
from mklscale.engine import Engine
from mklscale.errors import InvalidInputError
from mklscale.estimators import MKLClassifier
from mklscale.pipeline import run_pipeline
from tests._banks import subset_gaussian_bank

SPEC = {
    "name": "one_engine",
    "seed": 1,
    "dataset": {"name": "breast_cancer", "test_fraction": 0.3, "max_train": 60},
    "bank": {"families": [{"family": "gaussian", "widths": [1, 2], "features": "all"},
                          {"family": "linear", "features": "all"}]},
    "solver": [{"name": "uni_cv", "solver": "uniform", "C": "auto"},
               {"name": "spicy_c", "solver": "spicy", "C": 0.1, "loss": "logistic"}],
    "path": [{"name": "pfbs_path", "n_taus": 3, "cv_folds": 2}],
    "report": {"enabled": False},
}


@pytest.fixture
def engines_opened(monkeypatch) -> list:
    """Every Engine constructed while the test runs."""
    opened, construct = [], Engine.__init__

    def counting(self, *args, **kwargs):
        opened.append(self)
        construct(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "__init__", counting)
    return opened


def test_a_run_opens_one_engine_for_its_cross_validations_refits_and_paths(tmp_path, cluster_client,
                                                                           engines_opened):
    address = {"kind": "address", "address": cluster_client.scheduler.address}
    results = run_pipeline(SPEC, out=tmp_path / "run", cluster=address, quiet=True)
    assert [s["status"] for s in results["solvers"]] == ["ok", "ok", "ok"]
    assert results["solvers"][0]["cv"] is not None
    assert len(engines_opened) == 1   # was: one per CV, one per refit, one per path (4 here)
    engine = engines_opened[0]
    assert len(engine.cache) == 0     # closed (its cache dropped) when the run ended
    assert sum(s["passes"] for s in results["solvers"]) <= engine.stats["passes"]


def test_fit_bank_on_a_given_engine_leaves_it_open_and_counts_its_own_passes(tmp_path):
    grams, y = subset_gaussian_bank(40, 6, seed=0)
    bank = KernelBank.from_arrays(grams, tmp_path / "bank")
    alone = MKLClassifier(solver="spicy", C=0.5).fit_bank(bank, y)
    with Engine(bank) as engine:
        engine.blocks([0])              # a kernel in its block cache, which closing the engine would drop
        first = MKLClassifier(solver="spicy", C=0.5).fit_bank(bank, y, engine=engine)
        again = MKLClassifier(solver="spicy", C=0.5).fit_bank(bank, y, engine=engine)
        assert 0 in engine.cache        # still open after both fits
        assert engine.stats["passes"] == 2 * alone.fit_stats_["passes"]
    for fitted in (first, again):
        assert fitted.fit_stats_["passes"] == alone.fit_stats_["passes"]
        np.testing.assert_array_equal(fitted.result_.weights, alone.result_.weights)
    other = KernelBank.from_arrays(grams[:3], tmp_path / "other")
    with Engine(other) as engine, pytest.raises(InvalidInputError, match="engine= is open on the bank"):
        MKLClassifier(solver="spicy", C=0.5).fit_bank(bank, y, engine=engine)
