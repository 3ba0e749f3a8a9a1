"""The solver toolkit (mklscale.solvers.toolkit): held kernels, screening and the run log."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mklscale.engine import InMemoryEngine
from mklscale.errors import InvalidInputError
from mklscale.solvers.toolkit import RunLog
from mklscale.solvers.toolkit.screening import Screening
from mklscale.solvers.toolkit.working_set import HeldKernels


def test_held_kernels_keep_compacts_in_place():
    """keep() drops kernels chunk by chunk without a second copy; products with the kept kernels
    are unchanged (float32 blocks, float64 accumulation)."""
    rng = np.random.default_rng(3)
    n = 96  # a kernel (36 kB) far above what other threads allocate meanwhile (tracemalloc sees them too)
    tracemalloc.start()  # before the kernels exist, so that freeing them is counted
    grams = rng.standard_normal((9, n, n)).astype(np.float32)
    held = HeldKernels(InMemoryEngine(grams[:1]))
    held.append(np.arange(4), grams[:4].copy())
    held.append(np.arange(4, 9), grams[4:].copy())
    u = rng.standard_normal(n)
    exact = np.einsum("mij,j->mi", grams.astype(np.float64), u)
    np.testing.assert_allclose(held.matvecs(u), exact, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(held.matvecs(u, first=6), exact[6:], rtol=1e-12, atol=1e-12)
    mask = np.array([True, False, True, True, False, False, False, False, True])
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    held.keep(mask)
    kept, peak = (v - before for v in tracemalloc.get_traced_memory())
    tracemalloc.stop()
    assert held.size == 4 and held.nbytes == 4 * n * n * 4 and len(held.chunks) == 2
    assert held.index.tolist() == [0, 2, 3, 8]
    # 5 of 9 kernels freed; at no point a copy of a kept kernel (n * n * 4 bytes) more
    assert kept < -4 * n * n * 4 and peak < n * n * 4, "keep() copied kept kernels instead of compacting"
    np.testing.assert_allclose(held.matvecs(u), exact[mask], rtol=1e-12, atol=1e-12)
    H = np.zeros((n, n))
    held.add_weighted(np.array([0, 3]), np.array([2.0, -1.0]), H)
    np.testing.assert_allclose(H, 2.0 * grams[0] - grams[8].astype(np.float64), rtol=1e-12, atol=1e-12)
    A = rng.standard_normal((4, n))
    np.testing.assert_allclose(held.each_matvec(A), np.einsum("mij,mj->mi", grams[mask].astype(np.float64), A),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(held.total(), grams[mask].astype(np.float64).sum(0), rtol=1e-12, atol=1e-12)


def test_held_kernels_fetch_once_and_obey_the_memory_rule():
    grams = np.stack([np.eye(6) * (m + 1) for m in range(5)])
    engine = InMemoryEngine(grams)
    held = HeldKernels(engine, budget_bytes=3 * engine.block_nbytes, name="X")
    assert held.capacity() == 3
    assert held.fetch([3, 1], "remedy").tolist() == [3, 1]
    assert held.fetch([1, 4], "remedy").tolist() == [4]       # held kernels are not read again
    assert held.index.tolist() == [3, 1, 4] and engine.stats["block_loads"] == 3
    assert HeldKernels(engine).capacity() == np.inf           # the in-memory engine sets no budget
    huge = type("Huge", (InMemoryEngine,), {"block_nbytes": 10**13})(grams)
    with pytest.raises(InvalidInputError, match=r"the X working set would hold 1 kernels.*do this"):
        HeldKernels(huge, name="X").fetch([0], "do this")


def _psd_bank(seed: int, M: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((M, n, 3)) * rng.uniform(0.1, 3.0, size=(M, 1, 1))
    return np.einsum("mik,mjk->mij", F, F)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3), M=st.integers(1, 6), n=st.integers(2, 9))
def test_screening_bound_is_never_below_the_true_norm(seed, scale, M, n):
    """ref_norm + sqrt(lambda_max) ||u - u_ref|| >= ||u||_{K_m} for random banks and vectors,
    including vectors far from the reference."""
    grams = _psd_bank(seed, M, n)
    screen = Screening(InMemoryEngine(grams), InMemoryEngine(grams).lambda_max)
    rng = np.random.default_rng(seed + 1)
    assert screen.upper_bounds(rng.standard_normal(n)) is None        # no pass yet: no bound
    ref = rng.standard_normal(n)
    screen.full_pass(ref)
    for _ in range(5):
        u = ref + scale * rng.standard_normal(n) * rng.uniform(0, 1)
        true = np.sqrt(np.maximum(np.einsum("i,mij,j->m", u, grams, u), 0.0))
        bound = screen.upper_bounds(u)
        assert np.all(bound >= true * (1 - 1e-12) - 1e-12)
        np.testing.assert_array_equal(screen.upper_bounds(u, np.arange(M)[::-1]), bound[::-1])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3), M=st.integers(1, 6), n=st.integers(2, 9),
       rank=st.integers(1, 9))
def test_screening_stays_safe_with_a_computed_banks_bound(seed, scale, M, n, rank):
    """The same property with the lambda_max a computed bank stores (stats.lambda_bound: no eigensolve,
    never below the largest eigenvalue): the bounds are never below the true norms, including
    along each kernel's top eigenvector, the direction where the bound with the exact value is attained."""
    from mklscale.bank import _compute
    from mklscale.bank.stats import lambda_bound

    rng = np.random.default_rng(seed)
    F = rng.standard_normal((M, n, rank)) * rng.uniform(0.1, 3.0, size=(M, 1, 1))
    grams = np.einsum("mik,mjk->mij", F, F)
    bounds = np.array([lambda_bound(*_compute.trace_fro_colabs(K)) for K in grams])
    assert np.all(bounds >= np.linalg.eigvalsh(grams)[:, -1] * (1 - 1e-12))
    screen = Screening(InMemoryEngine(grams), bounds)
    ref = rng.standard_normal(n)
    screen.full_pass(ref)
    tops = np.linalg.eigh(grams)[1][:, :, -1]
    for u in [ref + scale * rng.standard_normal(n) * rng.uniform(0, 1) for _ in range(5)] + list(ref + scale * tops):
        true = np.sqrt(np.maximum(np.einsum("i,mij,j->m", u, grams, u), 0.0))
        assert np.all(screen.upper_bounds(u) >= true * (1 - 1e-12) - 1e-12)


def test_screening_bound_is_tight_along_the_top_eigenvector():
    """The bound is attained (so a smaller shift term would be wrong): u = u_ref + t v_max with
    u_ref in the same direction."""
    grams = _psd_bank(0, 3, 7)
    engine = InMemoryEngine(grams)
    w, V = np.linalg.eigh(grams[1])
    v = V[:, -1]
    screen = Screening(engine, engine.lambda_max)
    screen.full_pass(2.0 * v)
    u = 5.0 * v
    assert screen.upper_bounds(u)[1] == pytest.approx(np.sqrt(u @ grams[1] @ u), rel=1e-9)


def test_run_log_totals_are_per_solve_and_survive_a_resume():
    engine = InMemoryEngine(_psd_bank(1, 3, 5))
    engine.quad_forms(np.ones(5))                       # an earlier solve's pass
    log = RunLog(engine, "x")
    log.record({"it": 0})
    engine.quad_forms(np.ones(5))
    log.record({"it": 1})
    assert [h["passes"] for h in log.history] == [0, 1]
    assert log.history[1]["seconds"] >= log.history[0]["seconds"] and "resumed" not in log.history[1]
    saved = log.state()
    other = InMemoryEngine(_psd_bank(1, 3, 5))
    for _ in range(4):
        other.quad_forms(np.ones(5))
    resumed = RunLog(other, "x")
    resumed.restore(saved)
    other.quad_forms(np.ones(5))
    entry = resumed.record({"it": 2})
    assert entry["passes"] == 2 and entry["resumed"] and entry["seconds"] >= saved["seconds"]
    assert RunLog(None, "x").totals()["passes"] == 0
