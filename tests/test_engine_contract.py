"""One conformance suite for every implementation of the engine contract (mklscale.engine.contract).

Each engine is built over the same kernels and every operation is compared with a direct numpy
computation on the Gram matrices it represents (float32-rounded for a float32 bank, principal
submatrices for a row view, the chosen kernels for a kernel view).
"""

from __future__ import annotations

import numpy as np
import pytest

from mklscale.bank import KernelBank
from mklscale.engine import (Engine, InMemoryEngine, InMemoryFactorEngine, KernelEngine, KernelSubsetEngine,
                             RowSubsetEngine)
from mklscale.errors import InvalidInputError

N, M = 24, 7
ROWS = np.array([0, 2, 3, 5, 8, 9, 11, 13, 17, 18, 20, 23])
KERNELS = np.array([1, 2, 4, 6])


def _grams() -> np.ndarray:
    rng = np.random.default_rng(11)
    X = rng.standard_normal((N, 3))
    d2 = ((X[:, None] - X[None]) ** 2).sum(-1)
    grams = [np.exp(-d2 / w) for w in (0.5, 1, 2, 4)] + [np.outer(X[:, j], X[:, j]) for j in range(3)]
    return np.stack(grams)


def _factors() -> np.ndarray:
    """(M, N, 5) factors, one of rank 2 (zero columns, as a factor bank pads lower ranks)."""
    L = np.random.default_rng(12).standard_normal((M, N, 5))
    L[3, :, 2:] = 0.0
    return L


def _materialise(L: np.ndarray) -> np.ndarray:
    return np.einsum("mir,mjr->mij", L, L)


FACTOR_CASES = ["factor-memory", "rows-factor-memory", "kernels-factor-memory"]
ZARR_FACTOR_CASES = ["factor-zarr32", "rows-factor-zarr"]


def _factor_bank(path):
    """A float32 factor bank (rank 5, Nystrom) of Gaussian and linear kernels, in tiny shards."""
    from mklscale.bank import KernelSpec, build_bank

    X = np.random.default_rng(11).standard_normal((N, 3))
    specs = [KernelSpec.gaussian(w) for w in (0.7, 1, 2, 4)] + [KernelSpec.linear([j]) for j in range(3)]
    return build_bank(X, specs, path, rank=5, chunk_mb=0.001, shard_mb=0.002, progress=False, max_error=1.0)


COMPUTED_CASES = ["computed32", "rows-computed"]


def _computed_bank(path):
    """A float32 computed bank (issue 31: kernels computed from X in every pass) of per-feature Gaussian and
    linear kernels and a Gaussian on a feature pair, in tiny virtual shards."""
    from mklscale.bank import build_bank, families

    X = np.random.default_rng(11).standard_normal((N, 3))
    specs = families.resolve(["per_feature", {"family": "interactions", "pairs": [[0, 2]], "widths": [1.0]}], 3)
    return build_bank(X, specs[:M], path, computed=True, chunk_mb=0.005, shard_mb=0.01, progress=False)


@pytest.fixture(scope="module", params=["memory", "zarr64", "zarr32", "rows-memory", "rows-zarr", "kernels-memory",
                                        *FACTOR_CASES, *ZARR_FACTOR_CASES, *COMPUTED_CASES])
def case(request, tmp_path_factory):
    """(engine, the float64 Gram matrices it represents, whether a kernels=None call is a pass)."""
    grams = _grams()
    kind = request.param
    if kind in FACTOR_CASES:
        L = _factors()
        engine, grams = InMemoryFactorEngine(L), _materialise(L)
        if kind == "rows-factor-memory":
            engine, grams = RowSubsetEngine(engine, ROWS), grams[:, ROWS][:, :, ROWS]
        elif kind == "kernels-factor-memory":
            engine, grams = KernelSubsetEngine(engine, KERNELS), grams[KERNELS]
        yield engine, grams
        return
    if kind in ZARR_FACTOR_CASES:
        bank = _factor_bank(tmp_path_factory.mktemp(kind) / "bank")
        grams = _materialise(np.asarray(bank.factors(np.arange(M)), dtype=np.float64))
        with Engine(bank, threads=1, cache_bytes="1KB") as engine:
            yield (RowSubsetEngine(engine, ROWS), grams[:, ROWS][:, :, ROWS]) if kind == "rows-factor-zarr" \
                else (engine, grams)
        return
    if kind in COMPUTED_CASES:
        bank = _computed_bank(tmp_path_factory.mktemp(kind) / "bank")
        grams = np.asarray(bank.kernels(range(M)), dtype=np.float64)  # the float32 kernels, computed
        with Engine(bank, threads=1, cache_bytes="1KB") as engine:
            yield (RowSubsetEngine(engine, ROWS), grams[:, ROWS][:, :, ROWS]) if kind == "rows-computed" \
                else (engine, grams)
        return
    if kind == "memory":
        yield InMemoryEngine(grams), grams
        return
    if kind == "kernels-memory":
        yield KernelSubsetEngine(InMemoryEngine(grams), KERNELS), grams[KERNELS]
        return
    if kind == "rows-memory":
        yield RowSubsetEngine(InMemoryEngine(grams), ROWS), grams[:, ROWS][:, :, ROWS]
        return
    dtype = "float32" if kind == "zarr32" else "float64"
    bank = KernelBank.from_arrays(grams, tmp_path_factory.mktemp(kind) / "bank", dtype=dtype,
                                  chunk_mb=0.005, shard_mb=0.01)
    stored = grams.astype(dtype).astype(np.float64)
    with Engine(bank, threads=1, cache_bytes="1MB") as engine:
        if kind == "rows-zarr":
            yield RowSubsetEngine(engine, ROWS), stored[:, ROWS][:, :, ROWS]
        else:
            yield engine, stored


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), b, rtol=1e-10, atol=1e-10)


def test_is_a_kernel_engine_with_sizes_and_lambda_max(case):
    engine, grams = case
    assert isinstance(engine, KernelEngine)
    assert (engine.n, engine.M) == grams.shape[1:2] + grams.shape[:1]
    top = np.array([np.linalg.eigvalsh(K)[-1] for K in grams])
    lam = engine.lambda_max
    assert lam.shape == (engine.M,) and np.all(lam >= top - 1e-6 * np.maximum(top, 1))   # a bound (views) or the value
    budget = engine.working_set_budget
    assert budget is None or (isinstance(budget, int) and budget > 0)


def test_quad_forms_and_matvecs(case):
    engine, grams = case
    rng = np.random.default_rng(1)
    u, U = rng.standard_normal(engine.n), rng.standard_normal((3, engine.n))
    _close(engine.quad_forms(u), np.einsum("i,mij,j->m", u, grams, u))
    _close(engine.quad_forms(U), np.einsum("ki,mij,kj->mk", U, grams, U))
    idx = np.array([2, 0, 2])
    _close(engine.quad_forms(U, kernels=idx), np.einsum("ki,mij,kj->mk", U, grams[idx], U))
    per = rng.standard_normal((idx.size, engine.n))
    _close(engine.quad_forms(per, kernels=idx, per_kernel=True), np.einsum("mi,mij,mj->m", per, grams[idx], per))
    _close(engine.matvecs(u, kernels=idx), np.einsum("mij,j->mi", grams[idx], u))
    _close(engine.matvecs(U, kernels=idx), np.einsum("mij,kj->mki", grams[idx], U))
    _close(engine.matvecs(per, kernels=idx, per_kernel=True), np.einsum("mij,mj->mi", grams[idx], per))
    _close(engine.matvecs(u), np.einsum("mij,j->mi", grams, u))


def test_frobenius_combine_and_gram_of_kernels(case):
    engine, grams = case
    rng = np.random.default_rng(2)
    A = rng.standard_normal((engine.n, engine.n))
    T = A + A.T
    _close(engine.frobenius(T), np.einsum("mij,ij->m", grams, T))
    _close(engine.frobenius(T, kernels=[1]), np.einsum("mij,ij->m", grams[[1]], T))
    w = np.zeros(engine.M)
    w[[0, engine.M - 1]] = (0.3, 1.7)
    combined = engine.combine(w)
    assert combined.dtype == np.float64
    _close(combined, np.einsum("m,mij->ij", w, grams))
    _close(engine.gram_of_kernels(), np.einsum("aij,bij->ab", grams, grams))
    _close(engine.gram_of_kernels([2, 0]), np.einsum("aij,bij->ab", grams[[2, 0]], grams[[2, 0]]))


@pytest.mark.parametrize("keep", (True, False))
def test_blocks_are_the_callers_own_copies(case, keep):
    engine, grams = case
    B = engine.blocks([1, 0], keep=keep)
    factors = engine.kernel_representation.blocks_are_factors
    cols = engine.rank if factors else engine.n
    assert B.shape == (2, engine.n, cols) and B[0].nbytes == engine.block_nbytes
    stored = lambda b: _materialise(np.asarray(b, dtype=np.float64)) if factors else b
    _close(stored(B), grams[[1, 0]])
    B[:] = 0.0
    _close(stored(engine.blocks([1], keep=keep)), grams[[1]])


def test_combine_factors_is_a_factor_of_the_combination(case):
    engine, grams = case
    w = np.zeros(engine.M)
    w[[0, engine.M - 1]] = (0.3, 1.7)
    if not engine.kernel_representation.blocks_are_factors:
        assert engine.rank is None
        with pytest.raises(InvalidInputError, match="combine"):
            engine.combine_factors(w)
        return
    F = engine.combine_factors(w)
    assert F.dtype == np.float64 and F.shape == (engine.n, 2 * engine.rank)
    _close(F @ F.T, np.einsum("m,mij->ij", w, grams))
    with pytest.raises(InvalidInputError, match="non-negative"):
        engine.combine_factors(-w)


def test_counters_count_passes_and_bytes(case):
    engine, grams = case
    before = engine.counters()
    engine.quad_forms(np.ones(engine.n), kernels=[0])
    middle = engine.counters()
    assert middle.passes == before.passes and middle.bytes_read >= before.bytes_read
    engine.quad_forms(np.ones(engine.n))
    after = engine.counters()
    assert after.passes == middle.passes + 1 and after.bytes_read > middle.bytes_read


def test_bad_input_is_refused_with_a_message(case):
    engine, _ = case
    with pytest.raises(InvalidInputError):
        engine.quad_forms(np.ones(engine.n + 1))
    with pytest.raises(InvalidInputError):
        engine.blocks([engine.M])
    with pytest.raises(InvalidInputError):
        engine.combine(np.ones(engine.M + 1))
    with pytest.raises(InvalidInputError):
        engine.frobenius(np.ones((engine.n + 1, engine.n + 1)))


def test_views_refuse_what_is_not_an_engine_or_bad_subsets():
    engine = InMemoryEngine(_grams())
    with pytest.raises(InvalidInputError, match="KernelEngine"):
        RowSubsetEngine(_grams(), ROWS)
    with pytest.raises(InvalidInputError, match="at least 2 distinct"):
        RowSubsetEngine(engine, [3, 3])
    with pytest.raises(InvalidInputError, match="distinct"):
        KernelSubsetEngine(engine, [1, 1])
    with pytest.raises(InvalidInputError, match="shape"):
        InMemoryEngine(np.ones((3, 4)))


def test_traces_and_frobenius_norms(case):
    engine, grams = case
    _close(engine.traces, np.trace(grams, axis1=1, axis2=2))
    np.testing.assert_allclose(engine.frobenius_norms, np.sqrt(np.einsum("mij,mij->m", grams, grams)), rtol=1e-6)
