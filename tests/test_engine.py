"""Tests for mklscale.engine: every operation against a numpy reference, bit-identical results
across schedulers / threads / plans / a worker killed mid-pass, the block cache's budget, and
bad inputs."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from mklscale.bank import KernelBank, build_bank, families
from mklscale.bank.storage import local
from mklscale.engine import Engine, reader
from mklscale.engine.cache import parse_bytes
from mklscale.errors import BankCorruptError, BankIncompleteError, InvalidInputError

REPO = Path(__file__).resolve().parents[1]


def random_psd(rng, M: int, n: int, rank: int = 6) -> np.ndarray:
    X = rng.standard_normal((M, n, rank))
    G = np.einsum("mir,mjr->mij", X, X) / rank
    return (G + G.transpose(0, 2, 1)) / 2


def stored(bank: KernelBank) -> np.ndarray:
    """All kernels through zarr (an independent read path), as float64."""
    return bank.kernels(range(len(bank))).astype(np.float64)


# ---- banks ---------------------------------------------------------------------------------------
# chunk_mb / shard_mb are chosen so that chunks hold several kernels, shards several chunks, and
# neither divides M: the last shard (and its last chunk) is partial.
@pytest.fixture(scope="module")
def banks(tmp_path_factory) -> dict[str, tuple[KernelBank, np.ndarray]]:
    root = tmp_path_factory.mktemp("banks")
    rng = np.random.default_rng(0)
    out = {}
    b = KernelBank.from_arrays(random_psd(rng, 23, 37), root / "f32", chunk_mb=0.012, shard_mb=0.045)
    assert (b.attrs["layout"]["kernels_per_chunk"], b.kernels_per_shard, b.n_shards) == (2, 8, 3)
    out["f32"] = b
    b = KernelBank.from_arrays(random_psd(rng, 19, 21), root / "f64", dtype="float64", chunk_mb=0.011, shard_mb=0.025)
    assert (b.attrs["layout"]["kernels_per_chunk"], b.kernels_per_shard, b.n_shards) == (3, 6, 4)
    out["f64"] = b
    out["tiny"] = KernelBank.from_arrays(random_psd(rng, 5, 9), root / "tiny")  # n < 16: scalar paths
    X = rng.standard_normal((50, 4))
    specs = families.gaussian([0.3, 0.7, 1.0, 2.0, 4.0, 8.0]) + families.polynomial([1, 2, 3]) + \
        families.gaussian([0.5, 1.5, 3.0], features=(0, 2)) + families.gaussian([1.0, 2.0, 5.0], features=(1,))
    b = build_bank(X, specs, root / "gauss", chunk_mb=0.02, shard_mb=0.06, progress=False)
    assert (b.attrs["layout"]["kernels_per_chunk"], b.kernels_per_shard, b.n_shards) == (2, 6, 3)
    out["gauss"] = b
    return {name: (bank, stored(bank)) for name, bank in out.items()}


BANKS = ["f32", "f64", "tiny", "gauss"]


def close(a, b):
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12 * scale)


def every_op(eng: Engine, seed: int = 1) -> dict[str, np.ndarray]:
    """One result of every operation (fresh cache for the cached ones), keyed by name."""
    rng = np.random.default_rng(seed)
    n, M = eng.n, eng.M
    idx = [M - 1, 0, 3, 3, 1]
    u, U = rng.standard_normal(n), rng.standard_normal((11, n))
    w = np.where(rng.random(M) < 0.5, rng.random(M), 0.0)
    w[0] = 0.5
    return {
        "q1": eng.quad_forms(u), "qk": eng.quad_forms(U), "qsub": eng.quad_forms(U[:3], kernels=idx),
        "qeach": eng.quad_forms(U[:5], kernels=idx, per_kernel=True),
        "mv": eng.matvecs(u, kernels=idx), "mvk": eng.matvecs(U[:2], kernels=idx), "mvall": eng.matvecs(u),
        "mveach": eng.matvecs(U[:5], kernels=idx, per_kernel=True),
        "frob": eng.frobenius(np.outer(u, u) + np.eye(n)),
        "frobsub": eng.frobenius(np.eye(n), kernels=idx),
        "comb": eng.combine(w), "combdense": eng.combine(np.linspace(-1, 2, M)),
        "gram": eng.gram_of_kernels(idx), "gramall": eng.gram_of_kernels(),
        "blocks": eng.blocks(idx),
    }


# ---- every operation against numpy ---------------------------------------------------------------
@pytest.mark.parametrize("name", BANKS)
def test_operations_match_numpy(banks, name):
    bank, K = banks[name]
    M, n = K.shape[:2]
    rng = np.random.default_rng(2)
    idx = np.array([M - 1, 0, 3, 3, 1])
    with Engine(bank) as eng:
        assert (eng.n, eng.M) == (n, M)
        assert eng.lambda_max.dtype == np.float64 and eng.lambda_max.shape == (M,)
        for k in (1, 3, 8, 9, 17):  # tiles of 8 vectors, remainders, one vector as (1, n)
            U = rng.standard_normal((k, n))
            Q = eng.quad_forms(U)
            assert Q.shape == (M, k) and Q.dtype == np.float64
            close(Q, np.einsum("ki,mij,kj->mk", U, K, U))
        u = rng.standard_normal(n)
        q = eng.quad_forms(u)
        assert q.shape == (M,)
        close(q, np.einsum("i,mij,j->m", u, K, u))
        close(eng.quad_forms(U[:4], kernels=idx), np.einsum("ki,mij,kj->mk", U[:4], K[idx], U[:4]))
        close(eng.quad_forms(U[:5], kernels=idx, per_kernel=True), np.einsum("pi,pij,pj->p", U[:5], K[idx], U[:5]))
        close(eng.matvecs(u, kernels=idx), np.einsum("pij,j->pi", K[idx], u))
        close(eng.matvecs(U[:3], kernels=idx), np.einsum("pij,kj->pki", K[idx], U[:3]))
        close(eng.matvecs(u), K @ u)
        close(eng.matvecs(U[:5], kernels=idx, per_kernel=True), np.einsum("pij,pj->pi", K[idx], U[:5]))
        T = rng.standard_normal((n, n))
        close(eng.frobenius(T), np.einsum("mij,ij->m", K, T))
        close(eng.frobenius(T, kernels=idx), np.einsum("mij,ij->m", K[idx], T))
        w = np.zeros(M)
        w[[0, M - 1, 2]] = [0.25, 2.0, -1.0]
        close(eng.combine(w), np.einsum("m,mij->ij", w, K))
        w = rng.random(M)  # every kernel, several combine blocks
        close(eng.combine(w), np.einsum("m,mij->ij", w, K))
        assert np.array_equal(eng.combine(np.zeros(M)), np.zeros((n, n)))
        G = eng.gram_of_kernels(idx)
        close(G, np.einsum("aij,bij->ab", K[idx], K[idx]))
        assert np.array_equal(G, G.T)
        close(eng.gram_of_kernels(), np.einsum("aij,bij->ab", K, K))
        B = eng.blocks(idx)
        assert B.dtype == bank.dtype and B.flags.writeable and np.array_equal(B, K[idx])
        assert eng.quad_forms(u, kernels=[]).shape == (0,)
        assert eng.blocks([]).shape == (0, n, n)


def test_gram_blocks_cross_block_boundaries(banks, monkeypatch):
    import mklscale.engine.core as core

    bank, K = banks["f32"]
    monkeypatch.setattr(core, "GRAM_BLOCK", 4)  # 6 block pairs, diagonal and off-diagonal
    with Engine(bank) as eng:
        G = eng.gram_of_kernels(np.arange(2, 23))
    close(G, np.einsum("aij,bij->ab", K[2:], K[2:]))
    with Engine(bank) as eng:
        assert np.array_equal(G, eng.gram_of_kernels(np.arange(2, 23)))


def _direct_io_works(folder) -> bool:
    """Whether the filesystem of ``folder`` serves O_DIRECT reads (tmpfs does not)."""
    from mklscale.bank.direct_io import aligned_empty

    probe = Path(folder) / "direct-probe"
    probe.write_bytes(b"x" * 8192)
    try:
        fd = os.open(probe, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        try:
            return hasattr(os, "O_DIRECT") and os.preadv(fd, [memoryview(aligned_empty((4096,), np.uint8))], 0) == 4096
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        probe.unlink()


def test_reader_matches_read_shard(banks, monkeypatch):
    for name in BANKS:
        bank, _ = banks[name]
        every = np.arange(len(bank))
        expected = np.concatenate([bank.read_shard(s) for s in range(bank.n_shards)])
        # mapped views; direct reads of whole kernels and of row panels; copies of whole kernels and of row panels
        panel = 3 * bank.n * bank.dtype.itemsize
        for source, piece, direct in (("mapped", None, None), ("direct", None, None), ("direct", None, panel),
                                      ("copied", reader.PIECE_BYTES, None), ("copied", panel, None)):
            monkeypatch.setattr(reader, "DIRECT_PIECE_BYTES", direct or reader.DIRECT_PIECE_BYTES)
            got = np.empty_like(expected)
            with reader.KernelReader(bank, piece_bytes=piece, source=source) as r:
                assert r.source == source
                for pos, count, r0, r1, block in r.pieces(every):
                    got[pos:pos + count, r0:r1] = block
                rows = np.empty((4,) + expected.shape[2:], bank.dtype)
                r.read_rows(len(bank) - 1, 1, 5, rows)
                if source == "direct" and _direct_io_works(bank.path):
                    assert all(sh.source._direct_fd >= 0 for sh in r._shards.values())  # not the buffered fallback
            assert np.array_equal(got, expected), (name, source, piece, direct)
            assert np.array_equal(rows, expected[-1, 1:5]), (name, source)
            monkeypatch.undo()


def test_direct_reads_fall_back_to_copies_where_the_filesystem_refuses_them(banks, monkeypatch):
    """O_DIRECT refused at open or at the first read (tmpfs, some network filesystems): the same
    bytes come through the copying path, and the shard keeps no direct descriptor."""
    bank, _ = banks["f32"]
    expected = np.concatenate([bank.read_shard(s) for s in range(bank.n_shards)])
    real_open = os.open

    def refuse(*_args, **_kw):
        raise OSError(errno.EINVAL, "O_DIRECT refused")

    for where in ("open", "read"):
        if where == "open":
            monkeypatch.setattr(os, "open", lambda path, flags, *a: refuse() if flags & getattr(os, "O_DIRECT", 0)
                                else real_open(path, flags, *a))
        else:
            monkeypatch.setattr(os, "preadv", refuse)
        got = np.empty_like(expected)
        with reader.KernelReader(bank, source="direct") as r:
            for pos, count, r0, r1, block in r.pieces(np.arange(len(bank))):
                got[pos:pos + count, r0:r1] = block
            assert all(sh.source._direct_fd == -1 for sh in r._shards.values()), where
        monkeypatch.undo()
        assert np.array_equal(got, expected), where


def test_direct_reads_of_page_aligned_kernels(tmp_path):
    """n = 32 float32: every kernel is exactly one 4096-byte page, so direct reads start and end on
    page boundaries (no rounding up), the case the other banks' odd sizes never reach."""
    K = random_psd(np.random.default_rng(3), 9, 32).astype(np.float32)
    bank = KernelBank.from_arrays(K, tmp_path / "aligned", chunk_mb=0.008, shard_mb=0.03)
    expected = np.concatenate([bank.read_shard(s) for s in range(bank.n_shards)])
    got = np.empty_like(expected)
    with reader.KernelReader(bank, source="direct") as r:
        for pos, count, r0, r1, block in r.pieces(np.arange(len(bank))):
            got[pos:pos + count, r0:r1] = block
    assert np.array_equal(got, expected)


def test_a_read_past_the_end_of_a_shard_file_is_corruption(banks):
    """A shard file shorter than its index says (a torn copy): every reader says so, none loops."""
    bank, _ = banks["f32"]
    shard = reader._Shard(bank, 0).source
    size = os.fstat(shard.file.fileno()).st_size
    try:
        readers = [shard.view] + ([shard.read_direct] if _direct_io_works(bank.path) else [])
        for read in readers:
            with pytest.raises(BankCorruptError, match="ended early"):
                read(size - 8, 8192)
        with pytest.raises(BankCorruptError, match="ended early"):
            shard.read_into(size - 8, np.empty(8192, np.uint8))
    finally:
        shard.close()


def test_mapped_reading_follows_a_rebuilt_bank_and_its_limit(tmp_path, monkeypatch):
    """A bank rebuilt at the same path is read anew (the old mapping is keyed by the old file);
    MKLSCALE_MAP_BYTES below the bank's size, or 0, reads by copying; a bad value is named."""
    rng = np.random.default_rng(5)
    first, second = (np.einsum("mij,mkj->mik", A, A) for A in rng.random((2, 6, 12, 4)))  # PSD
    path = tmp_path / "b"
    u = rng.standard_normal(12)
    with Engine(KernelBank.from_arrays(first, path, dtype="float64")) as eng:
        close(eng.quad_forms(u), np.einsum("i,mij,j->m", u, first, u))
    bank = KernelBank.from_arrays(second, path, dtype="float64", overwrite=True)
    with Engine(bank) as eng:
        close(eng.quad_forms(u), np.einsum("i,mij,j->m", u, second, u))
    # the first bank's (deleted) shard files are no longer held mapped, so their disk space is free
    assert not any(local._replaced(p, k) for k, (p, _) in local._MAPS.items())
    assert reader.KernelReader(bank).source == "mapped"
    monkeypatch.setenv("MKLSCALE_MAP_BYTES", str(bank.nbytes - 1))
    assert reader.KernelReader(bank).source == "copied"
    monkeypatch.setattr(reader, "physical_memory", lambda: bank.nbytes - 1)  # a bank larger than memory
    assert reader.KernelReader(bank).source == "direct"
    monkeypatch.setenv("MKLSCALE_MAP_BYTES", "lots")
    with pytest.raises(ValueError, match="MKLSCALE_MAP_BYTES must be a number of bytes"):
        reader.KernelReader(bank)


def test_float32_and_float64_storage_give_identical_bits(banks, tmp_path):
    bank32, K = banks["f32"]
    bank64 = KernelBank.from_arrays(K, tmp_path / "same64", dtype="float64")  # the same values, exactly
    with Engine(bank32) as e32, Engine(bank64) as e64:
        r32, r64 = every_op(e32), every_op(e64)
    for key in r32:
        assert np.array_equal(r32[key], r64[key]), key


@pytest.mark.parametrize("name", ["f32", "gauss"])
def test_identical_across_threads_plans_panels_and_cache(banks, name, monkeypatch):
    bank, _ = banks[name]
    with Engine(bank, threads=2) as eng:
        ref = every_op(eng)
    variants = [dict(threads=1), dict(threads=2, task_bytes=1), dict(threads=2, task_bytes=3 * bank.n ** 2 * 4)]
    for kw in variants:
        with Engine(bank, **kw) as eng:
            got = every_op(eng)
        for key in ref:
            assert np.array_equal(got[key], ref[key]), (kw, key)
    monkeypatch.setenv("MKLSCALE_MAP_BYTES", "0")  # the copying reader: whole kernels, then row panels of 5 rows
    with Engine(bank) as eng:
        got = every_op(eng)
    for key in ref:
        assert np.array_equal(got[key], ref[key]), ("copied", key)
    monkeypatch.setattr(reader, "PIECE_BYTES", 5 * bank.n * bank.dtype.itemsize)
    with Engine(bank) as eng:
        got = every_op(eng)
    for key in ref:
        assert np.array_equal(got[key], ref[key]), ("panels", key)
    monkeypatch.setattr(reader, "physical_memory", lambda: 1)  # a bank "larger than memory": direct reads
    with Engine(bank) as eng:
        got = every_op(eng)
    for key in ref:
        assert np.array_equal(got[key], ref[key]), ("direct", key)
    monkeypatch.setattr(reader, "DIRECT_PIECE_BYTES", 5 * bank.n * bank.dtype.itemsize)  # direct row panels
    with Engine(bank) as eng:
        got = every_op(eng)
    for key in ref:
        assert np.array_equal(got[key], ref[key]), ("direct panels", key)
    monkeypatch.setattr(KernelBank, "plain_layout", property(lambda self: False))  # zarr's read path
    with Engine(bank) as eng:
        got = every_op(eng)
    for key in ref:
        assert np.array_equal(got[key], ref[key]), ("zarr read", key)
    monkeypatch.undo()
    with Engine(bank) as eng:  # everything from the driver-side cache
        eng.blocks(range(eng.M))
        got = every_op(eng)
        assert all(e["kernels_read"] == 0 for e in eng.stats["log"][1:] if not e["full_pass"])
    for key in ref:
        assert np.array_equal(got[key], ref[key]), ("cache", key)


# ---- stats, cache ---------------------------------------------------------------------------------
def test_stats_count_passes_bytes_and_calls(banks):
    bank, _ = banks["f32"]
    kb = bank.n ** 2 * 4
    with Engine(bank) as eng:
        u = np.ones(eng.n)
        eng.quad_forms(u)
        eng.quad_forms(np.ones((4, eng.n)))
        eng.matvecs(u, kernels=[1, 2])
        s = eng.stats
        assert s["passes"] == 2 and s["calls"] == 3
        assert s["bytes_read"] == (2 * eng.M + 2) * kb and s["kernels_read"] == 2 * eng.M + 2
        assert [e["op"] for e in s["log"]] == ["quad_forms", "quad_forms", "matvecs"]
        assert s["log"][2]["bytes"] == 2 * kb and s["seconds"] > 0
        s["passes"] = 99  # a snapshot
        assert eng.stats["passes"] == 2


def test_cache_respects_budget_and_evicts_lru(banks):
    bank, K = banks["f32"]
    one = bank.n ** 2 * 4  # the cache holds kernels as stored: float32
    with Engine(bank, cache_bytes=3 * one) as eng:
        cache = eng.cache
        assert np.array_equal(eng.blocks([0, 1]), K[[0, 1]])
        assert sorted(cache.keys()) == [0, 1] and cache.nbytes == 2 * one
        assert all(cache.peek(m).dtype == np.float32 and not cache.peek(m).flags.writeable for m in (0, 1))
        eng.blocks([0])  # 0 becomes most recently used, 1 is the oldest
        assert np.array_equal(eng.blocks([2, 3]), K[[2, 3]])
        assert sorted(cache.keys()) == [0, 2, 3] and cache.nbytes <= cache.budget and cache.evictions == 1
        assert eng.stats["log"][-1]["kernels_read"] == 2
        big = eng.blocks(range(6))  # larger than the budget: returned, not kept
        assert np.array_equal(big, K[:6]) and sorted(cache.keys()) == [0, 2, 3] and cache.nbytes <= cache.budget
        for m in range(8, 14):
            eng.blocks([m, m + 1])
            assert cache.nbytes <= cache.budget and len(cache) <= 3
        assert sorted(cache.keys()) == [12, 13, 14]
        before = eng.stats["kernels_read"]
        mv = eng.matvecs(np.ones(eng.n), kernels=[13, 12])
        q = eng.quad_forms(np.ones((1, eng.n)), kernels=[14], per_kernel=True)
        assert eng.stats["kernels_read"] == before and eng.stats["log"][-1]["tasks"] == 0
        close(mv, K[[13, 12]] @ np.ones(eng.n))
        close(q, K[[14]].sum(axis=(1, 2)))
    with Engine(bank, cache_bytes=0) as eng:
        assert np.array_equal(eng.blocks([4]), K[[4]]) and len(eng.cache) == 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocks_hold_one_copy_per_kernel(tmp_path, dtype):
    """Memory held for k kernels fetched through blocks(): the cache keeps each kernel once, in the
    storage dtype, and never pins the returned stack; with keep=False nothing is kept beyond the
    returned array (tracemalloc counts numpy's buffers). Kernels of n = 160 in chunks of one or two
    kernels, so that a second copy (>= k n^2 itemsize bytes) stands far above the reader's reused
    chunk buffer (one chunk)."""
    import gc
    import tracemalloc

    K = random_psd(np.random.default_rng(5), 20, 160)
    bank = KernelBank.from_arrays(K, tmp_path / "b", dtype=dtype, chunk_mb=0.21, shard_mb=0.9)
    K = stored(bank)
    k, one = 16, bank.n ** 2 * bank.dtype.itemsize
    slack = 0.5 * k * one + 16384  # reader buffers, bookkeeping; a second copy would be >= k * one
    idx = np.arange(k)
    with Engine(bank, cache_bytes="64MB", threads=1) as eng:
        eng.quad_forms(np.ones(eng.n))  # compile / warm up outside the measurement
        eng.blocks(idx[:1], keep=False)   # ... and the reader's reused buffer of this thread
        gc.collect()
        tracemalloc.start()
        B = eng.blocks(idx, keep=False)
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert np.array_equal(B, K[idx]) and B.dtype == bank.dtype and B.nbytes == k * one
        assert len(eng.cache) == 0 and eng.cache.nbytes == 0
        assert held < k * one + slack, "blocks(keep=False) keeps more than the returned array"
        B = eng.blocks(idx)  # kept: one own copy per kernel, independent of the returned stack
        assert eng.cache.nbytes == k * one and len(eng.cache) == k
        assert all(eng.cache.peek(m).base is None or eng.cache.peek(m).base is not B for m in idx)
        tracemalloc.start()
        again = eng.blocks(idx, keep=False)  # cache hits: just the returned stack
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert np.array_equal(again, K[idx]) and held < k * one + slack and eng.cache.nbytes == k * one


def test_cache_bytes_strings():
    assert parse_bytes("2GB") == 2 * 10**9 and parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1GiB") == 2**30 and parse_bytes(1000) == 1000
    for bad in ("lots", -1, 1.5, True, None):
        with pytest.raises(InvalidInputError):
            parse_bytes(bad)


# ---- bad inputs, incomplete banks -----------------------------------------------------------------
def test_bad_inputs_raise_invalid_input(banks):
    bank, _ = banks["f32"]
    n, M = bank.n, len(bank)
    nan_u = np.ones(n)
    nan_u[3] = np.nan
    inf_T = np.eye(n)
    inf_T[1, 2] = np.inf
    with Engine(bank) as eng:
        cases = [
            (eng.quad_forms, (np.ones(n + 1),), {}, "n=37"),
            (eng.quad_forms, (np.ones((2, 3, n)),), {}, "shape"),
            (eng.quad_forms, (np.ones((0, n)),), {}, "shape"),
            (eng.quad_forms, (nan_u,), {}, "NaN"),
            (eng.quad_forms, (np.full((2, n), np.inf),), {}, "NaN/inf"),
            (eng.quad_forms, (np.array(["a"] * n),), {}, "real numbers"),
            (eng.quad_forms, (np.ones(n),), {"kernels": [0, M]}, "outside"),
            (eng.quad_forms, (np.ones(n),), {"kernels": [-1]}, "negative"),
            (eng.quad_forms, (np.ones(n),), {"kernels": [0.0, 1.0]}, "integers"),
            (eng.quad_forms, (np.ones(n),), {"kernels": np.ones(M, dtype=bool)}, "boolean mask"),
            (eng.quad_forms, (np.ones(n),), {"kernels": 3}, "single integer"),
            (eng.quad_forms, (np.ones((2, n)),), {"kernels": [0, 1, 2], "per_kernel": True}, "one row per selected kernel"),
            (eng.matvecs, (np.ones(n - 1),), {"kernels": [0]}, "length"),
            (eng.matvecs, (nan_u,), {"kernels": [0]}, "NaN"),
            (eng.frobenius, (np.eye(n + 1),), {}, "dense (37, 37)"),
            (eng.frobenius, (inf_T,), {}, "NaN/inf"),
            (eng.combine, (np.ones(M - 1),), {}, "one entry per kernel"),
            (eng.combine, (np.full(M, np.nan),), {}, "NaN"),
            (eng.gram_of_kernels, ([M + 5],), {}, "outside"),
            (eng.blocks, ([[0, 1]],), {}, "1-D"),
        ]
        for fn, args, kw, words in cases:
            with pytest.raises(InvalidInputError, match=re.escape(words)):
                fn(*args, **kw)
    with pytest.raises(InvalidInputError, match="cache_bytes|size"):
        Engine(bank, cache_bytes="much")
    with pytest.raises(InvalidInputError, match="KernelBank"):
        Engine(np.ones((3, 3, 3)))


def test_incomplete_bank_refused_unless_allowed(tmp_path):
    rng = np.random.default_rng(5)
    K = random_psd(rng, 6, 20)
    bank = KernelBank.from_arrays(K, tmp_path / "partial")
    zarr.open_group(tmp_path / "partial", mode="r+")["complete"][2] = False
    bank = KernelBank.open(tmp_path / "partial")
    with pytest.raises(BankIncompleteError, match="allow_incomplete"):
        Engine(bank)
    with Engine(bank, allow_incomplete=True) as eng:
        u = rng.standard_normal(20)
        q = eng.quad_forms(u)
        K32 = stored(bank)
        assert np.isnan(q[2]) and eng.stats["log"][-1]["kernels_read"] == 5
        assert np.isnan(eng.lambda_max[2]) and np.isfinite(np.delete(eng.lambda_max, 2)).all()
        close(np.delete(q, 2), np.delete(np.einsum("i,mij,j->m", u, K32, u), 2))
        for call in (lambda: eng.blocks([2]), lambda: eng.matvecs(u, kernels=[1, 2]),
                     lambda: eng.combine(np.ones(6)), lambda: eng.quad_forms(u, kernels=[2])):
            with pytest.raises(BankIncompleteError, match="not built"):
                call()


def test_damaged_shards_raise_bank_corrupt(banks, tmp_path):
    import shutil

    from mklscale.errors import BankCorruptError

    bank, _ = banks["f32"]
    for damage in ("truncate", "index", "missing"):
        path = tmp_path / damage
        shutil.copytree(bank.path, path)
        shard = path / "gram" / "c" / "1" / "0" / "0"
        data = shard.read_bytes()
        if damage == "truncate":
            shard.write_bytes(data[: len(data) // 2])
        elif damage == "index":
            shard.write_bytes(data[:-8] + bytes(8))
        else:
            shard.unlink()
        with Engine(path) as eng:
            with pytest.raises(BankCorruptError, match="shard 1"):
                eng.quad_forms(np.ones(eng.n))
            eng.quad_forms(np.ones(eng.n), kernels=[0, 20])  # other shards still read


def test_progress_is_silent_by_default(banks, capsys):
    bank, _ = banks["f32"]
    with Engine(bank) as eng:
        eng.quad_forms(np.ones(eng.n))
    assert capsys.readouterr().err == ""
    with Engine(bank, progress=True) as eng:
        eng.quad_forms(np.ones(eng.n))
    assert "quad_forms" in capsys.readouterr().err


def test_engine_accepts_a_path(banks):
    """(The small-bank pass time is benchmarks/bench_pass.py's to measure, never a test's.)"""
    bank, K = banks["gauss"]
    with Engine(str(bank.path)) as eng:
        u = np.ones(eng.n)
        close(eng.quad_forms(u), np.einsum("i,mij,j->m", u, K, u))


# ---- distributed ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c


@pytest.mark.cluster
@pytest.mark.parametrize("name", ["f32", "f64", "gauss"])
def test_distributed_results_identical_to_threaded(banks, client, name):
    bank, _ = banks[name]
    with Engine(bank) as eng:
        ref = every_op(eng)
    with Engine(bank, client=client, task_bytes=2 * bank.n ** 2 * bank.dtype.itemsize) as eng:
        got = every_op(eng)
        assert eng.stats["passes"] >= 4
    for key in ref:
        assert np.array_equal(got[key], ref[key]), key


@pytest.mark.cluster
def test_scheduler_address_gives_an_owned_client(banks, client):
    bank, _ = banks["gauss"]
    u = np.linspace(-1, 1, bank.n)
    with Engine(bank) as eng:
        ref = eng.quad_forms(u)
    eng = Engine(bank, client=client.scheduler.address)
    assert eng.client is not client and np.array_equal(eng.quad_forms(u), ref)
    own = eng.client
    eng.close()
    assert own.status == "closed" and client.status == "running"


@pytest.mark.cluster
def test_a_small_local_bank_is_reduced_in_the_driver_with_the_same_bits(banks, client, monkeypatch):
    """local_bytes >= the bank's bytes: no pass reaches the cluster (no scheduler transitions), and every
    operation gives the bits the cluster gives; small_bank_bytes() reads MKLSCALE_LOCAL_PASS_BYTES."""
    from mklscale.engine.core import SMALL_BANK_BYTES, small_bank_bytes

    bank, _ = banks["f32"]
    u = np.linspace(-1, 1, bank.n)
    with Engine(bank, client=client) as eng:
        on_cluster = (eng.quad_forms(u), eng.matvecs(u, kernels=[1, 3]), eng.combine(np.linspace(0, 1, eng.M)))
    with Engine(bank, client=client, local_bytes=bank.nbytes) as eng:
        before = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)
        local = (eng.quad_forms(u), eng.matvecs(u, kernels=[1, 3]), eng.combine(np.linspace(0, 1, eng.M)))
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter) == before
    for a, b in zip(on_cluster, local):
        assert np.array_equal(a, b)
    with Engine(bank, client=client, local_bytes=bank.nbytes - 1) as eng:   # one byte too big: the cluster
        before = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)
        eng.quad_forms(u)
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter) > before
    assert small_bank_bytes() == SMALL_BANK_BYTES
    monkeypatch.setenv("MKLSCALE_LOCAL_PASS_BYTES", "0")
    assert small_bank_bytes() == 0
    monkeypatch.setenv("MKLSCALE_LOCAL_PASS_BYTES", "lots")
    with pytest.raises(InvalidInputError, match="MKLSCALE_LOCAL_PASS_BYTES must be a number of bytes"):
        small_bank_bytes()


@pytest.mark.cluster
def test_cached_kernels_do_not_touch_the_cluster(banks, client):
    bank, K = banks["f32"]
    with Engine(bank, client=client) as eng:
        eng.blocks([4, 5])
        before = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)
        u = np.arange(eng.n, dtype=float)
        mv = eng.matvecs(u, kernels=[5, 4])
        q = eng.quad_forms(np.ones((2, eng.n)), kernels=[4, 5], per_kernel=True)
        after = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)
        assert after == before and eng.stats["log"][-1]["tasks"] == 0
    close(mv, K[[5, 4]] @ u)
    close(q, K[[4, 5]].sum(axis=(1, 2)))


def _pass_state(dask_scheduler, prefix):
    """(task states counted, {worker address: tasks processing}) for keys starting with prefix."""
    states, processing = {}, {}
    for key, ts in dask_scheduler.tasks.items():
        name = key[0] if isinstance(key, tuple) else key
        if isinstance(name, str) and name.startswith(prefix):
            states[ts.state] = states.get(ts.state, 0) + 1
            if ts.state == "processing" and ts.processing_on is not None:
                processing[ts.processing_on.address] = processing.get(ts.processing_on.address, 0) + 1
    return states, processing


@pytest.mark.cluster
def test_worker_killed_mid_pass_gives_identical_result(client, tmp_path):
    rng = np.random.default_rng(9)
    bank = build_bank(rng.standard_normal((200, 3)), families.gaussian(np.geomspace(0.2, 20, 64)), tmp_path / "kill",
                      progress=False)
    U = rng.standard_normal((12000, 200))  # ~15 ms per kernel and task: the pass lasts ~0.5 s per worker
    one_kernel = 200 * 200 * 4
    with Engine(bank, task_bytes=one_kernel) as eng:
        ref = eng.quad_forms(U)
    client.wait_for_workers(2)
    pids = client.run(os.getpid)
    out: dict = {}
    with Engine(bank, client=client, task_bytes=one_kernel) as eng:
        thread = threading.Thread(target=lambda: out.update(q=eng.quad_forms(U)))
        thread.start()
        victim, deadline = None, time.time() + 120
        while victim is None and time.time() < deadline:
            states, processing = client.run_on_scheduler(_pass_state, prefix="mklscale-quad_forms")
            if states.get("memory", 0) >= 2 and processing:
                victim = next(iter(processing))
            else:
                time.sleep(0.005)
        assert victim is not None, "the pass never got going"
        os.kill(pids[victim], signal.SIGKILL)
        killed_at = time.time()
        assert thread.is_alive(), "the pass finished before the kill landed"
        thread.join(300)
        assert not thread.is_alive()
    assert time.time() > killed_at
    assert np.array_equal(out["q"], ref)
    client.wait_for_workers(2, timeout=120)
    new_pids = client.run(os.getpid)
    assert pids[victim] not in new_pids.values(), "the killed worker did not die"


# ---- benchmark smoke -----------------------------------------------------------------------------
@pytest.mark.slow
def test_benchmark_quick_runs(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_pass.py"), "--quick",
                           "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    result = json.loads(out.read_text())
    assert result["machine"]["cores"] >= 1 and result["cached_bank"]["rows"]


def _worker_map_limit() -> tuple[int, int]:
    from distributed import get_worker

    return reader.map_limit(), get_worker().memory_manager.memory_limit


@pytest.mark.cluster
def test_map_limit_in_a_dask_worker_is_a_quarter_of_its_memory_limit(client, monkeypatch):
    """Mapped pages count in a worker's resident set, which its nanny polices: a worker maps at
    most a quarter of its memory limit; the driver (no worker) half the machine's memory."""
    monkeypatch.delenv("MKLSCALE_MAP_BYTES", raising=False)
    got, limit = client.submit(_worker_map_limit, pure=False).result()
    assert limit and got == min(reader.physical_memory() // 2, limit // 4)
    assert reader.map_limit() == reader.physical_memory() // 2
