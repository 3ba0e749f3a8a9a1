"""Factor banks (issue 17): K~_m = L_m L_m^T stored as L_m (n x r), by Nystrom or pivoted Cholesky.

Against dense formulas: full-rank factors reproduce the dense bank, cross factors reproduce the
stored ones through the landmarks, normalisation applies to K~, the recorded approximation error
is tr K - tr K~ computed densely; integrity (verify, repair, a killed build resumed, a distributed
build) bit for bit; bad input refused before anything is written; the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from _banks import build_killed_after

from mklscale.bank import KernelBank, KernelSpec, build_bank, families
from mklscale.errors import InvalidInputError

MIXED = (families.gaussian([0.5, 1.0, 3.0]) + families.gaussian([0.7], features=[1, 3])
         + families.polynomial([1, 2]) + families.linear(features=[0, 2]) + families.linear(features=[1]))
TINY = dict(chunk_mb=0.002, shard_mb=0.005)


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(0).normal(size=(36, 4)) * [1.0, 3.0, 0.5, 2.0] + [0.0, 5.0, -1.0, 0.0]


def _standardised(X):
    return (X - X.mean(0)) / X.std(0)


def _raw_kernel(spec: KernelSpec, X) -> np.ndarray:
    """The exact, unnormalised kernel on the standardised data (independent numpy formula)."""
    Xs = _standardised(X)
    cols = Xs if spec.features is None else Xs[:, list(spec.features)]
    if spec.family == "gaussian":
        d2 = ((cols[:, None, :] - cols[None, :, :]) ** 2).sum(-1)
        return np.exp(-d2 / (2 * spec.param("width") ** 2))
    if spec.family == "polynomial":
        return (cols @ cols.T + spec.param("offset")) ** spec.param("degree")
    return cols @ cols.T


def _tilde(bank: KernelBank) -> np.ndarray:
    L = np.asarray(bank.factors(range(len(bank))), dtype=np.float64)
    return np.einsum("mir,mjr->mij", L, L)


# ---- values ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("normalize", ["trace", "diag", None])
@pytest.mark.parametrize("method", ["nystrom", "cholesky"])
def test_full_rank_factors_reproduce_the_dense_bank(tmp_path, X, normalize, method):
    n = X.shape[0]
    dense = build_bank(X, MIXED, tmp_path / "dense", normalize=normalize, progress=False)
    fb = build_bank(X, MIXED, tmp_path / "factor", normalize=normalize, rank=n, method=method, tol=1e-12,
                    progress=False, max_error=1.0)
    assert (fb.representation, fb.rank, fb.block_shape) == ("factor", n, (n, n))
    assert fb.ranks[-1] == 1 and fb.ranks[-2] == 2  # linear kernels on 1 and 2 features
    Kt, K = _tilde(fb), dense.kernels(range(len(MIXED))).astype(np.float64)
    for m in range(len(MIXED)):
        np.testing.assert_allclose(Kt[m], K[m], rtol=0, atol=2e-6 * np.abs(K[m]).max(), err_msg=MIXED[m].name)
    np.testing.assert_allclose(fb.approx_error, 0, atol=1e-6)
    np.testing.assert_allclose(fb.trace, dense.trace, rtol=1e-6)


@pytest.mark.parametrize("method,kw", [("nystrom", {"landmarks": "kmeans++"}), ("nystrom", {"landmarks": "uniform"}),
                                       ("nystrom", {"landmarks": "rls"}), ("cholesky", {"tol": 1e-3})])
@pytest.mark.parametrize("normalize", ["trace", "diag", None])
def test_cross_factor_of_the_training_rows_reproduces_the_stored_factors(tmp_path, X, method, kw, normalize):
    fb = build_bank(X, MIXED, tmp_path / "b", normalize=normalize, rank=7, method=method, progress=False,
                    max_error=1.0, **kw)
    stored = np.asarray(fb.factors(range(len(MIXED))), dtype=np.float64)
    got = fb.cross_factor(X)
    assert got.shape == (len(MIXED), X.shape[0], 7)
    np.testing.assert_allclose(got, stored, rtol=0, atol=1e-6 * np.abs(stored).max())
    assert np.array_equal(got.astype(np.float32), fb.factors(range(len(MIXED))))  # the same formula, bit for bit
    for m in range(len(MIXED)):
        lm = fb.landmarks(m)
        assert lm.size == (7 if method == "nystrom" else fb.ranks[m]) and len(set(lm.tolist())) == lm.size
        assert not np.any(stored[m][:, fb.ranks[m]:])  # zero columns past the kernel's rank
    # new points: K~(X_new, X) = L(X_new) L^T, the Nystrom extension of the same approximation
    sub = fb.cross_factor(X[:5], kernels=[3, 0])
    np.testing.assert_array_equal(sub, got[[3, 0], :5])


def test_normalisation_applies_to_the_approximation(tmp_path, X):
    tr = build_bank(X, MIXED, tmp_path / "t", rank=5, progress=False, max_error=1.0)
    none = build_bank(X, MIXED, tmp_path / "n", rank=5, normalize=None, progress=False, max_error=1.0)
    dg = build_bank(X, MIXED, tmp_path / "d", rank=5, normalize="diag", progress=False, max_error=1.0)
    Kt_tr, Kt_none, Kt_dg = _tilde(tr), _tilde(none), _tilde(dg)
    for m in range(len(MIXED)):
        assert np.trace(Kt_tr[m]) == pytest.approx(1.0, rel=1e-6)
        np.testing.assert_allclose(Kt_tr[m], Kt_none[m] * tr.norm_factor[m], rtol=0, atol=1e-6 * np.abs(Kt_tr[m]).max())
        assert tr.norm_factor[m] == pytest.approx(1.0 / np.trace(Kt_none[m]), rel=1e-6)
        np.testing.assert_allclose(np.diag(Kt_dg[m]), 1.0, rtol=1e-6)
    np.testing.assert_allclose(tr.trace, 1.0, rtol=1e-6)
    np.testing.assert_array_equal(none.norm_factor, 1.0)
    # statistics of K~: Frobenius norm and a tight upper bound on the largest eigenvalue
    for m in range(len(MIXED)):
        lam = np.linalg.eigvalsh(Kt_tr[m])[-1]
        assert lam <= tr.lambda_max[m] <= lam * (1 + 1e-6) + 1e-12
        assert tr.fro[m] == pytest.approx(np.linalg.norm(Kt_tr[m]), rel=1e-6)


@pytest.mark.parametrize("normalize", ["trace", None])
@pytest.mark.parametrize("method", ["nystrom", "cholesky"])
def test_approx_error_is_the_dense_trace_gap(tmp_path, X, normalize, method):
    fb = build_bank(X, MIXED, tmp_path / "b", rank=4, method=method, normalize=normalize, progress=False,
                    max_error=1.0)
    raw = _tilde(fb) / fb.norm_factor[:, None, None]  # K~ before normalisation
    for m, spec in enumerate(MIXED):
        K = _raw_kernel(spec, X)
        assert fb.exact_trace[m] == pytest.approx(np.trace(K), rel=1e-10)
        assert fb.approx_error[m] == pytest.approx((np.trace(K) - np.trace(raw[m])) / np.trace(K), abs=1e-6)
        assert fb.approx_error[m] > -1e-9  # K - K~ is PSD for both methods
        assert np.linalg.eigvalsh(K - raw[m])[0] > -1e-6 * np.trace(K)


def test_cholesky_stops_at_the_tolerance(tmp_path, X):
    fb = build_bank(X, MIXED, tmp_path / "b", rank=X.shape[0], method="cholesky", tol=1e-2, progress=False)
    assert np.all(fb.approx_error <= 1e-2 + 1e-9)
    assert fb.ranks[1:].max() < X.shape[0] and fb.ranks[-1] == 1  # all but the narrowest Gaussian stop early
    assert fb.factor_settings == {"method": "cholesky", "landmarks": "kmeans++", "tol": 1e-2, "seed": 0,
                                  "eig_cutoff": 1e-10}


def test_builds_are_reproducible_and_seeded(tmp_path, X):
    a = build_bank(X, MIXED, tmp_path / "a", rank=6, progress=False, max_error=1.0)
    b = build_bank(X, MIXED, tmp_path / "b", rank=6, progress=False, max_error=1.0, **TINY)
    c = build_bank(X, MIXED, tmp_path / "c", rank=6, seed=1, progress=False, max_error=1.0)
    np.testing.assert_array_equal(a.checksums, b.checksums)
    assert not np.array_equal(a.landmarks(0), c.landmarks(0))


def test_large_error_warns_with_the_remedy(tmp_path, X):
    with pytest.warns(UserWarning, match="raise the rank.*cholesky"):
        build_bank(X, MIXED, tmp_path / "a", rank=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_bank(X, MIXED, tmp_path / "b", rank=2, progress=False, max_error=1.0)


def test_reading_a_factor_bank(tmp_path, X):
    fb = build_bank(X, MIXED, tmp_path / "b", rank=5, progress=False, max_error=1.0, **TINY)
    assert fb.n_shards >= 2 and fb.nbytes == len(MIXED) * X.shape[0] * 5 * 4
    with pytest.raises(InvalidInputError, match="factor bank.*materialize=True"):
        fb.kernel(0)
    with pytest.raises(InvalidInputError, match="factor bank"):
        fb.kernels([0, 1])
    with pytest.raises(InvalidInputError, match="cross_factor"):
        fb.cross(X)
    L = fb.factor(2).astype(np.float64)
    np.testing.assert_array_equal(fb.kernel(2, materialize=True), L @ L.T)
    monkey = KernelBank.open(fb.path)
    monkey.MATERIALIZE_LIMIT = 100
    with pytest.raises(InvalidInputError, match="GiB"):
        monkey.kernel(2, materialize=True)
    np.testing.assert_array_equal(fb.factors([4, 1]), np.stack([fb.factor(4), fb.factor(1)]))
    np.testing.assert_array_equal(np.concatenate([fb.read_shard(s) for s in range(fb.n_shards)]),
                                  fb.factors(range(len(MIXED))))
    xa = fb.to_xarray()
    assert xa.dims == ("kernel", "i", "rank") and xa.shape == (len(MIXED), X.shape[0], 5)
    np.testing.assert_array_equal(xa.sel(kernel=3).values, fb.factor(3))
    assert fb.transform(0).shape == (5, 5) and fb.attrs["representation"] == "factor"
    dense = build_bank(X, MIXED[:2], tmp_path / "dense", progress=False)
    assert (dense.representation, dense.rank, dense.block_shape) == ("dense", None, (36, 36))
    with pytest.raises(InvalidInputError, match="dense"):
        dense.factor(0)


# ---- integrity -------------------------------------------------------------------------------------
def test_verify_detects_a_flipped_byte_and_repair_restores_it(tmp_path, X):
    fb = build_bank(X, MIXED, tmp_path / "b", rank=5, progress=False, max_error=1.0, **TINY)
    fresh = build_bank(X, MIXED, tmp_path / "fresh", rank=5, progress=False, max_error=1.0, **TINY)
    assert fb.verify().ok
    S = fb.kernels_per_shard
    target = S + 1  # the second kernel of shard 1
    shard = fb.shard_file(1)
    assert shard.parts[-5] == "factor"
    data = bytearray(shard.read_bytes())
    data[X.shape[0] * 5 * 4 + 17] ^= 0x40
    shard.write_bytes(bytes(data))
    report = KernelBank.open(fb.path).verify()
    assert report.bad_indices == [target] and MIXED[target].name in str(report)
    repaired = KernelBank.open(fb.path).repair(progress=False)
    assert repaired.ok and repaired.kernels == [target]
    again = KernelBank.open(fb.path)
    np.testing.assert_array_equal(again.checksums, fresh.checksums)
    np.testing.assert_array_equal(again.factors(range(len(MIXED))), fresh.factors(range(len(MIXED))))
    np.testing.assert_array_equal(again.approx_error, fresh.approx_error)


def test_killed_build_resumes_to_identical_checksums(tmp_path):
    X = np.random.default_rng(5).normal(size=(400, 6))
    specs = families.random_subsets(6, 150, seed=1)
    kw = dict(rank=16, chunk_mb=0.03, shard_mb=0.06, max_error=1.0)
    target = build_killed_after(tmp_path, X, 150, seed=1, **kw)
    before = KernelBank.open(target).complete
    assert 0 < before.sum() < len(specs)
    resumed = build_bank(X, specs, target, progress=False, **kw)
    assert resumed.last_build_computed == len(specs) - before.sum()
    clean = build_bank(X, specs, tmp_path / "clean", progress=False, **kw)
    np.testing.assert_array_equal(resumed.checksums, clean.checksums)
    np.testing.assert_array_equal(resumed.approx_error, clean.approx_error)
    assert np.array_equal(resumed._group["transform"][:], clean._group["transform"][:])
    assert resumed.verify().ok and resumed.complete.all()


def test_distributed_build_equals_the_threaded_one(tmp_path, X, cluster_client):
    for method in ("nystrom", "cholesky"):
        a = build_bank(X, MIXED, tmp_path / f"t{method}", rank=6, method=method, progress=False, max_error=1.0, **TINY)
        b = build_bank(X, MIXED, tmp_path / f"p{method}", rank=6, method=method, client=cluster_client,
                       progress=False, max_error=1.0, **TINY)
        np.testing.assert_array_equal(a.checksums, b.checksums)
        np.testing.assert_array_equal(a.factors(range(len(MIXED))), b.factors(range(len(MIXED))))
        np.testing.assert_array_equal(a._group["transform"][:], b._group["transform"][:])
        assert b.verify().ok


# ---- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    (dict(rank=0), "rank must be"), (dict(rank=37), r"1\.\.36"), (dict(rank=True), "rank must be"),
    (dict(rank=2.5), "rank must be"), (dict(rank=4, method="svd"), "unknown factor method"),
    (dict(rank=4, landmarks="random"), "unknown landmarks"), (dict(rank=4, method="cholesky", tol=0), "tol must"),
    (dict(rank=4, tol=-1e-3), "tol must"), (dict(rank=4, tol=float("nan")), "tol must"),
    (dict(rank=4, seed=-1), "seed must"),
])
def test_bad_factor_arguments_write_nothing(tmp_path, X, kw, match):
    with pytest.raises(InvalidInputError, match=match):
        build_bank(X, MIXED, tmp_path / "b", progress=False, **kw)
    assert not (tmp_path / "b").exists()


def test_nan_features_write_nothing(tmp_path, X):
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        build_bank(bad, MIXED, tmp_path / "b", rank=4, progress=False)
    assert not (tmp_path / "b").exists()


def test_a_dense_bank_is_not_resumed_as_a_factor_bank(tmp_path, X):
    from mklscale.errors import BankMismatchError

    build_bank(X, MIXED, tmp_path / "b", progress=False)
    with pytest.raises(BankMismatchError):
        build_bank(X, MIXED, tmp_path / "b", rank=4, progress=False)
    build_bank(X, MIXED, tmp_path / "c", rank=4, progress=False, max_error=1.0)
    with pytest.raises(BankMismatchError):
        build_bank(X, MIXED, tmp_path / "c", rank=5, progress=False, max_error=1.0)


# ---- CLI -------------------------------------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mklscale.cli", *args], capture_output=True, text=True)


def test_cli_build_and_info(tmp_path):
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(40, 3)))
    out = tmp_path / "f.zarr"
    r = _cli("bank", "build", "--features", str(tmp_path / "X.npy"), "--family", "gaussian", "--widths", "0.5", "1", "2",
             "--kernel-features", "all", "--out", str(out), "--quiet", "--rank", "6", "--method", "cholesky")
    assert r.returncode == 0, r.stderr
    bank = KernelBank.open(out)
    assert (bank.representation, bank.rank, bank.factor_settings["method"]) == ("factor", 6, "cholesky")
    r = _cli("bank", "info", str(out))
    assert r.returncode == 0 and "factor" in r.stdout and "rank 6" in r.stdout and "approximation error" in r.stdout
    info = json.loads(_cli("bank", "info", str(out), "--json").stdout)
    assert info["representation"] == "factor" and info["rank"] == 6
    assert info["approx_error"]["max"] == pytest.approx(float(bank.approx_error.max()))
    r = _cli("bank", "build", "--features", str(tmp_path / "X.npy"), "--family", "gaussian", "--widths", "1",
             "--kernel-features", "all", "--out", str(tmp_path / "w.zarr"), "--quiet", "--rank", "1")
    assert r.returncode == 0 and "raise the rank" in (r.stdout + r.stderr)
    for bad, match in ((["--rank", "0"], "rank"), (["--rank", "41"], "rank"), (["--rank", "3", "--method", "svd"], "svd"),
                       (["--rank", "3", "--landmarks", "nope"], "nope")):
        r = _cli("bank", "build", "--features", str(tmp_path / "X.npy"), "--family", "gaussian", "--widths", "1",
                 "--kernel-features", "all", "--out", str(tmp_path / "bad.zarr"), "--quiet", *bad)
        assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "bad.zarr").exists()


# ---- pipeline TOML ---------------------------------------------------------------------------------
PIPE = {"name": "t", "dataset": {"name": "breast_cancer", "max_train": 60},
        "bank": {"family": "gaussian", "widths": [1.0, 2.0], "features": "all"},
        "solver": [{"name": "uni", "solver": "uniform", "C": 1.0}]}


def test_pipeline_bank_table_takes_the_factor_keys():
    from mklscale.pipeline import load_pipeline

    pipe = load_pipeline({**PIPE, "bank": {**PIPE["bank"], "rank": 16, "method": "cholesky", "tol": 1e-4}})
    assert pipe.bank["factor"] == {"rank": 16, "method": "cholesky", "landmarks": "kmeans++", "tol": 1e-4,
                                   "max_error": 0.05}
    assert load_pipeline(PIPE).bank["factor"] == {}


@pytest.mark.parametrize("keys,fragment", [
    ({"rank": 0}, "must be > 0"), ({"rank": 2.5}, "must be int"), ({"rank": "64"}, "must be int"),
    ({"rank": 8, "method": "svd"}, "must be one of"), ({"rank": 8, "landmarks": "grid"}, "must be one of"),
    ({"rank": 8, "tol": -1.0}, "must be > 0"), ({"method": "cholesky"}, "factor banks only"),
])
def test_pipeline_bad_factor_keys_are_config_errors(keys, fragment):
    from mklscale.errors import ConfigError
    from mklscale.pipeline import load_pipeline

    with pytest.raises(ConfigError, match=fragment):
        load_pipeline({**PIPE, "bank": {**PIPE["bank"], **keys}})


def test_pipeline_builds_a_factor_bank(tmp_path):
    from mklscale.datasets import load
    from mklscale.pipeline import load_pipeline
    from mklscale.pipeline.bank_stage import prepare_bank
    from mklscale.pipeline.data import Data

    pipe = load_pipeline({**PIPE, "bank": {**PIPE["bank"], "rank": 8, "max_error": 1.0}})
    ds = load("breast_cancer")
    data = Data("breast_cancer", "classification", ds.X[:50], ds.y[:50], ds.X[50:60], ds.y[50:60], None)
    said = []
    bank, info = prepare_bank(pipe, data, tmp_path, None, True, said.append)
    assert (bank.representation, bank.rank, info["representation"], info["rank"]) == ("factor", 8, "factor", 8)


def test_layout_is_sized_by_the_factor_bytes_and_old_banks_open_as_dense(tmp_path, X):
    from mklscale.bank.group import layout_for

    fb = build_bank(X, MIXED, tmp_path / "f", rank=5, progress=False, max_error=1.0, **TINY)
    per_chunk, per_shard = layout_for(len(MIXED), X.shape[0], 4, TINY["chunk_mb"], TINY["shard_mb"], width=5)
    assert fb.attrs["layout"] == {"kernels_per_chunk": per_chunk, "kernels_per_shard": per_shard}
    assert per_chunk == int(TINY["chunk_mb"] * 2**20 // (X.shape[0] * 5 * 4)) > 1
    # a bank written before factor banks existed has no representation attribute: it is dense
    dense = build_bank(X, MIXED[:2], tmp_path / "d", progress=False)
    meta = json.loads((dense.path / "zarr.json").read_text())
    for key in ("representation", "rank"):
        del meta["attributes"][key]
    (dense.path / "zarr.json").write_text(json.dumps(meta))
    old = KernelBank.open(dense.path)
    assert (old.representation, old.rank, old.block_shape) == ("dense", None, (36, 36)) and old.verify().ok
    np.testing.assert_array_equal(old.kernel(1), dense.kernel(1))


def test_ridge_leverage_landmarks_find_the_isolated_points(tmp_path):
    """RLS-Nystrom (Musco & Musco 2017): 300 rows in one tight cluster and 8 isolated rows, a narrow
    Gaussian (the isolated rows' kernel columns are nearly unit vectors: high ridge leverage). At rank 24,
    over seeds 0..4, the leverage sampler takes at least 4 of the 8 (uniform sampling: 24 / 308 of them,
    0.6 expected) and its approximation error (tr K - tr K~) / tr K is below uniform sampling's, on
    average by more than half (measured: 0.0091 against 0.0253; k-means++, which D^2 sampling drives to
    outliers, takes all 8 here)."""
    from mklscale.bank.spec import KernelSpec

    rng = np.random.default_rng(0)
    X = np.vstack([0.05 * rng.standard_normal((300, 2)), 10.0 * rng.standard_normal((8, 2)) + 20.0])
    specs = [KernelSpec("gaussian", {"width": 0.3})]
    errors = {"rls": [], "uniform": []}
    for seed in range(5):
        for rule in errors:
            bank = build_bank(X, specs, tmp_path / f"{rule}{seed}", rank=24, landmarks=rule, seed=seed, progress=False,
                              max_error=1.0, normalize=None, standardize=False)
            errors[rule].append(float(bank.approx_error[0]))
            if rule == "rls":
                assert np.sum(bank.landmarks(0) >= 300) >= 4
                rls_bank = bank
        assert errors["rls"][-1] < errors["uniform"][-1]
    assert np.mean(errors["rls"]) < 0.5 * np.mean(errors["uniform"])
    again = build_bank(X, specs, tmp_path / "again", rank=24, landmarks="rls", seed=4, progress=False, max_error=1.0,
                       normalize=None, standardize=False)
    np.testing.assert_array_equal(again.landmarks(0), rls_bank.landmarks(0))     # seeded per kernel
