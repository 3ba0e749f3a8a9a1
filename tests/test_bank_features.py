"""A bank's features by column blocks (``mklscale.bank.features``; issue 31, M = 10^6).

The user's X is read by column blocks (in memory, a ``.npy`` file, a zarr array) and the bank stores
the standardised X in column chunks with a crc32c each; kernels computed from the chunks their
features lie in are bit-identical to kernels computed from the whole X, a bank built from an on-disk
X equals one built from the same X in memory (its fingerprint too: the digest of ``X.tobytes()``),
a damaged chunk is detected wherever it is read, and banks written before (X in one chunk, the
standardisation in an attribute) still open and compute the same kernels.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import zarr

from mklscale.bank import KernelBank, build_bank, families, features
from mklscale.bank.shards import fill_block
from mklscale.bank.spec import KernelSpec, hash_specs_json, specs_from_entries, specs_to_json
from mklscale.bank.stats import checksum
from mklscale.engine import Engine
from mklscale.errors import BankCorruptError, InvalidInputError

N, D = 40, 50
TINY = dict(chunk_mb=8 * N * 7 / 2**20, shard_mb=0.02)  # X chunks of 7 columns: 8 chunks, the last of 1


@pytest.fixture(scope="module")
def X():
    X = np.random.default_rng(3).normal(size=(N, D)) * np.linspace(0.5, 3, D) + np.arange(D)
    X[:, 4] = 2.0  # a constant column: only centred
    return X


def _specs():
    return families.resolve(["per_feature", {"family": "interactions", "pairs": [[1, 40], [6, 7]]}], D) + [
        KernelSpec.gaussian(3.0, features=[0, 13, 27])]


@pytest.fixture(scope="module")
def bank(X, tmp_path_factory):
    return build_bank(X, _specs(), tmp_path_factory.mktemp("f") / "bank", progress=False, computed=True, **TINY)


def _old_standardised(X):
    """The whole-array standardisation build_bank used before column blocks."""
    mean, scale = X.mean(axis=0), X.std(axis=0)
    scale = np.where(scale > 1e-12 * np.maximum(1.0, np.abs(mean)), scale, 1.0)
    return mean, scale, (X - mean) / scale


def test_the_stored_features_are_column_chunks_of_the_whole_standardisation(bank, X):
    mean, scale, Xs = _old_standardised(X)
    group = bank.group
    assert group["X"].chunks == (N, 7) and len(bank.attrs["X_chunks"]["crc32c"]) == 8
    np.testing.assert_array_equal(bank.X_train, Xs)  # bit for bit
    got_mean, got_scale = bank.standardization
    np.testing.assert_array_equal(got_mean, mean)
    np.testing.assert_array_equal(got_scale, scale)
    assert bank.attrs["standardization"] == {"arrays": ["X_mean", "X_scale"]}  # not two d-long lists
    for source in (X, np.asfortranarray(X)):  # blocks of 3 columns: the whole array's bits
        found = features.scan(features.as_source(source), True, block_bytes=8 * N * 3)
        m, s, _ = _old_standardised(source)
        np.testing.assert_array_equal(found.mean, m)
        np.testing.assert_array_equal(found.scale, s)
    Z = np.random.default_rng(4).normal(size=(5, D))
    np.testing.assert_array_equal(bank.standardize(Z), (Z - mean) / scale)


def test_kernels_from_the_chunks_their_features_use_are_the_whole_arrays(bank, X):
    Xs = _old_standardised(X)[2]
    specs = bank.specs
    for idx in ([0, 1, 2, 3], [17, 18], [len(specs) - 3, len(specs) - 2, len(specs) - 1], [5, 150, 2]):
        want = np.empty((len(idx), N, N), np.float32)
        fill_block([specs[m] for m in idx], Xs, "trace", want)
        np.testing.assert_array_equal(bank.compute_kernels(idx), want)
        cols, local = features.subset([specs[m] for m in idx], D)
        assert cols is not None and len(cols) < D and all(max(s.features) < len(cols) for s in local)
        Xc, local2 = bank._features_for([specs[m] for m in idx])
        np.testing.assert_array_equal(Xc, Xs[:, cols])
        assert local2 == local


def test_a_bank_from_a_file_or_a_zarr_array_equals_the_one_from_memory(bank, X, tmp_path):
    c_file, f_file, f32_file = tmp_path / "c.npy", tmp_path / "f.npy", tmp_path / "f32.npy"
    np.save(c_file, X)
    np.save(f_file, np.asfortranarray(X))
    X32 = X.astype(np.float32)
    np.save(f32_file, X32)
    z = zarr.create_array(tmp_path / "x.zarr", shape=X.shape, chunks=(11, 9), dtype=np.float64)
    z[:] = X
    specs = _specs()
    small = dict(TINY)
    for i, source in enumerate([str(c_file), c_file, z]):
        other = build_bank(source, specs, tmp_path / f"b{i}", progress=False, computed=True, **small)
        assert other.attrs["fingerprint"] == bank.attrs["fingerprint"]
        np.testing.assert_array_equal(other.X_train, bank.X_train)
        np.testing.assert_array_equal(other.checksums, bank.checksums)
        np.testing.assert_array_equal(other.compute_kernels(range(6)), bank.compute_kernels(range(6)))
    # Fortran order: the same fingerprint (C-order bytes) and the bytes of the in-memory Fortran array's build
    fb = build_bank(f_file, specs, tmp_path / "bf", progress=False, computed=True, **small)
    fm = build_bank(np.asfortranarray(X), specs, tmp_path / "bfm", progress=False, computed=True, **small)
    assert fb.attrs["fingerprint"] == fm.attrs["fingerprint"] == bank.attrs["fingerprint"]
    np.testing.assert_array_equal(fb.X_train, fm.X_train)
    np.testing.assert_array_equal(fb.checksums, fm.checksums)
    # float32 on disk: converted per block, the bank of its float64 values
    b32 = build_bank(f32_file, specs, tmp_path / "b32", progress=False, computed=True, **small)
    m32 = build_bank(X32.astype(np.float64), specs, tmp_path / "m32", progress=False, computed=True, **small)
    assert b32.attrs["fingerprint"] == m32.attrs["fingerprint"]
    np.testing.assert_array_equal(b32.checksums, m32.checksums)
    # and a stored (dense) bank from the file holds the computed bank's kernels
    dense = build_bank(c_file, specs, tmp_path / "dense", progress=False, **small)
    np.testing.assert_array_equal(dense.checksums, bank.checksums)


def test_the_fingerprint_is_the_digest_of_the_whole_arrays_bytes(bank, X):
    h = hashlib.sha256()
    h.update(repr(X.shape).encode())
    h.update(np.ascontiguousarray(X).tobytes())
    h.update(specs_to_json(bank.specs).encode())
    h.update(repr(("trace", "float32", True)).encode())
    h.update(np.arange(N, dtype=np.int64).tobytes())
    h.update(b"computed")
    assert bank.attrs["fingerprint"] == h.hexdigest()
    g = hashlib.sha256()
    features.fingerprint_rows(g, features.as_source(np.asfortranarray(X)), block_bytes=8 * D * 3)
    assert g.hexdigest() == hashlib.sha256(np.ascontiguousarray(X).tobytes()).hexdigest()


def test_bad_values_are_named_as_for_the_whole_array(X, tmp_path):
    Y = X.copy()
    Y[30, 2], Y[5, 45], Y[7, 44] = np.nan, np.inf, np.nan
    path = tmp_path / "y.npy"
    np.save(path, Y)
    for source in (Y, str(path)):
        with pytest.raises(InvalidInputError, match=r"contains 3 NaN/inf value\(s\) \(first at row 5, column 45\)"):
            features.scan(features.as_source(source), True, block_bytes=8 * N * 7)
    Y = X.copy()
    Y[9, 30], Y[2, 49] = 1e200, -1e160
    with pytest.raises(InvalidInputError, match=r"holds 2 value\(s\) .* \(first -1e\+160 at row 2, column 49\)"):
        build_bank(Y, _specs(), tmp_path / "big", progress=False, computed=True, **TINY)
    for bad, message in [(np.zeros((3, 0)), "is empty"), (np.zeros(4), "2-D"), (np.array([["a"]]), "numeric"),
                         (str(tmp_path / "missing.npy"), "not a file")]:
        with pytest.raises(InvalidInputError, match=message):
            build_bank(bad, _specs()[:1], tmp_path / "never", progress=False, computed=True)


def _damage(path, column: int, row: int = 3) -> None:
    group = zarr.open_group(path, mode="r+")
    value = group["X"][row, column]
    group["X"][row, column] = value + 0.25


def test_a_damaged_chunk_is_detected_where_it_is_read(bank, tmp_path):
    import shutil

    path = tmp_path / "damaged"
    shutil.copytree(bank.path, path)
    _damage(path, column=22)  # chunk 3 (columns 21..27)
    damaged = KernelBank.open(path)
    with pytest.raises(BankCorruptError, match=r"stored features X do not match .*columns 21\.\.27"):
        damaged.X_train
    specs = damaged.specs
    on_22 = [m for m, s in enumerate(specs) if s.features == (22,)]
    on_0 = [m for m, s in enumerate(specs) if s.features == (0,)]
    with pytest.raises(BankCorruptError, match="stored features X"):
        damaged.compute_kernels(on_22)
    np.testing.assert_array_equal(damaged.compute_kernels(on_0), bank.compute_kernels(on_0))  # an intact chunk
    report = KernelBank.open(path).verify(mark_bad=False)
    assert not report.ok and "stored features X" in str(report)
    with Engine(KernelBank.open(path)) as engine, pytest.raises(BankCorruptError, match="stored features X"):
        engine.quad_forms(np.ones(N))


def _to_old_format(path) -> None:
    """Rewrite a bank as banks were written before X_chunks: X in one chunk with X_checksum, the
    standardisation as lists in the attribute."""
    group = zarr.open_group(path, mode="r+")
    X, mean, scale = group["X"][:], group["X_mean"][:], group["X_scale"][:]
    for name in ("X", "X_mean", "X_scale"):
        del group[name]
    group.create_array("X", data=X, chunks=X.shape)
    attrs = group.attrs.asdict()
    attrs.pop("X_chunks")
    attrs["X_checksum"] = checksum(X)
    attrs["standardization"] = {"mean": mean.tolist(), "scale": scale.tolist()}
    group.attrs.clear()
    group.update_attributes(attrs)


def test_banks_written_before_column_chunks_still_open_and_compute(bank, X, tmp_path):
    import shutil

    path = tmp_path / "old"
    shutil.copytree(bank.path, path)
    _to_old_format(path)
    old = KernelBank.open(path)
    assert "X_chunks" not in old.attrs and old.features.n_chunks == 1
    np.testing.assert_array_equal(old.X_train, bank.X_train)
    np.testing.assert_array_equal(old.compute_kernels(range(len(old))), bank.compute_kernels(range(len(bank))))
    Z = np.random.default_rng(5).normal(size=(4, D))
    np.testing.assert_array_equal(old.standardize(Z), bank.standardize(Z))
    np.testing.assert_array_equal(old.cross(Z, [0, 9]), bank.cross(Z, [0, 9]))
    assert old.verify().ok
    # resuming it with the same inputs is a resume (the fingerprint did not change), not a refusal
    again = build_bank(X, _specs(), path, progress=False, computed=True, **TINY)
    assert again.last_build_computed == 0
    _damage(path, column=30)
    with pytest.raises(BankCorruptError, match="stored features X do not match"):
        KernelBank.open(path).X_train


def test_specs_read_in_bulk_and_hashed_in_batches_are_the_specs():
    specs = _specs() + [KernelSpec.polynomial(2, features=[3, 1]), KernelSpec.linear()]
    entries = [s.to_json() for s in specs]
    got = specs_from_entries(entries)
    assert got == specs and [hash(s) for s in got] == [hash(s) for s in specs]
    assert got[0].params is got[4].params  # one family's parameters shared
    a, b = hashlib.sha256(), hashlib.sha256()
    a.update(specs_to_json(specs).encode())
    hash_specs_json(b, specs, batch=3)
    assert a.hexdigest() == b.hexdigest()
    with pytest.raises(Exception, match="repeats an index"):
        specs_from_entries(['{"family": "linear", "params": {}, "features": [1, 1]}'])


def test_the_million_benchmark_writes_the_synthetic_data_by_row_blocks(tmp_path):
    from _benchmarks import ROOT, load_module

    bench = load_module("bench_computed_million", ROOT / "benchmarks" / "bench_computed.py")
    train, test, y, yt = bench.write_synthetic(tmp_path, 7, 5, 30, block_bytes=8 * 30 * 2)
    X, labels = bench.synthetic(12, 30)
    np.testing.assert_array_equal(np.load(train), X[:7])
    np.testing.assert_array_equal(np.load(test), X[7:])
    np.testing.assert_array_equal(np.concatenate([y, yt]), labels)


def test_the_size_formula_counts_the_column_chunks(bank):
    from mklscale.bank.size import bank_bytes
    from mklscale.bank.storage.local import disk_usage

    real = disk_usage(bank.path)
    predicted = bank_bytes(len(bank), N, "float32", n_features=D, computed=True, **TINY)
    assert real <= predicted, (predicted, real)
    # X: its zarr.json and 8 chunk files, X_mean and X_scale: a zarr.json and a chunk each (4 KiB blocks)
    without = bank_bytes(len(bank), N, "float32", n_features=0, computed=True, **TINY)
    assert predicted - without >= (1 + 8 + 4) * 4096


def test_worker_processes_build_and_repair_from_the_chunks_they_need(bank, X, tmp_path, cluster_client):
    """A computed build on a cluster sends each task the bank's location (``StoredRef``), not X."""
    np.save(tmp_path / "x.npy", X)
    other = build_bank(str(tmp_path / "x.npy"), _specs(), tmp_path / "procs", client=cluster_client, progress=False,
                       computed=True, **TINY)
    np.testing.assert_array_equal(other.checksums, bank.checksums)
    report = other.repair(kernels=[3, 40], client=cluster_client, progress=False)
    assert report.ok and other.verify().ok


def test_the_cli_passes_a_npy_file_on_to_be_read_by_column_blocks(X, tmp_path, capsys):
    from mklscale.cli import main

    np.save(tmp_path / "X.npy", X)
    out = tmp_path / "cli"
    assert main(["bank", "build", "--features", str(tmp_path / "X.npy"), "--family", "per_feature", "--widths", "1",
                 "--linear", "no", "--computed", "--out", str(out), "--quiet"]) == 0
    cli = KernelBank.open(out)
    mem = build_bank(X, families.resolve({"family": "per_feature", "widths": [1.0], "linear": False}, D),
                     tmp_path / "mem", progress=False, computed=True)
    assert cli.attrs["fingerprint"] == mem.attrs["fingerprint"]
    np.testing.assert_array_equal(cli.checksums, mem.checksums)
    Y = X.copy()
    Y[12, 33] = np.nan
    np.save(tmp_path / "Y.npy", Y)
    assert main(["bank", "build", "--features", str(tmp_path / "Y.npy"), "--family", "per_feature", "--computed",
                 "--out", str(tmp_path / "never"), "--quiet"]) != 0
    assert "NaN/inf" in capsys.readouterr().err and not (tmp_path / "never").exists()
