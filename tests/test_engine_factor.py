"""The streaming Engine on a factor bank (K_m = L_m L_m^T, L_m stored): every operation against numpy
on the stored factors, and bit-identical results across threads, task plans, the driver's cache and
a LocalCluster of worker processes, as for dense banks (test_engine.py). The conformance suite
(test_engine_contract.py) runs the contract's assertions on a factor bank too.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import client, every_op  # noqa: F401  (client: the module's LocalCluster fixture)

from mklscale.bank import build_bank, families
from mklscale.engine import Engine, InMemoryFactorEngine


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    """A float32 rank-6 Nystrom bank of 17 kernels at n = 45, several kernels per chunk, three shards."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((45, 4))
    specs = families.gaussian([0.3, 0.7, 1.0, 2.0, 4.0, 8.0]) + families.polynomial([1, 2, 3]) + \
        families.gaussian([0.5, 1.5, 3.0], features=(0, 2)) + families.gaussian([1.0, 2.0, 5.0, 9.0, 11.0], features=(1,))
    b = build_bank(X, specs, tmp_path_factory.mktemp("factor") / "bank", rank=6, chunk_mb=0.002, shard_mb=0.005,
                   progress=False, max_error=1.0)
    assert b.representation == "factor" and b.n_shards >= 3
    return b


def test_operations_match_numpy_on_the_stored_factors(bank):
    L = np.asarray(bank.factors(np.arange(len(bank))), dtype=np.float64)
    with Engine(bank) as eng:
        assert (eng.representation, eng.rank, eng.block_nbytes) == ("factor", 6, bank.n * 6 * 4)
        got = every_op(eng)
        F = eng.combine_factors(np.r_[0.5, np.zeros(len(bank) - 2), 2.0])
    ref = every_op(InMemoryFactorEngine(L))
    for key in ref:
        np.testing.assert_allclose(np.asarray(got[key], dtype=np.float64), ref[key], rtol=1e-10,
                                   atol=1e-12 * max(1.0, float(np.abs(ref[key]).max())), err_msg=key)
    np.testing.assert_allclose(F @ F.T, 0.5 * L[0] @ L[0].T + 2.0 * L[-1] @ L[-1].T, rtol=1e-12, atol=1e-14)


def test_identical_bits_across_threads_plans_and_cache(bank):
    with Engine(bank, threads=2) as eng:
        ref = every_op(eng)
    for kw in (dict(threads=1), dict(threads=2, task_bytes=1), dict(threads=2, task_bytes=3 * bank.n * 6 * 4)):
        with Engine(bank, **kw) as eng:
            got = every_op(eng)
        for key in ref:
            assert np.array_equal(got[key], ref[key]), (kw, key)
    with Engine(bank) as eng:  # everything from the driver-side cache
        eng.blocks(range(eng.M))
        got = every_op(eng)
    for key in ref:
        assert np.array_equal(got[key], ref[key]), ("cache", key)


@pytest.mark.cluster
def test_distributed_results_identical_to_threaded(bank, client):  # noqa: F811
    with Engine(bank) as eng:
        ref = every_op(eng)
    with Engine(bank, client=client, task_bytes=2 * bank.n * 6 * 4) as eng:
        got = every_op(eng)
    for key in ref:
        assert np.array_equal(got[key], ref[key]), key
