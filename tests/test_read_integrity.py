"""No pass reduces bytes it has not checked (issue 29, item 5): a byte flipped anywhere in a kernel's
stored bytes makes every reader (mapped, direct, copied, in whole kernels or in row pieces, and the
object-store reader) raise BankCorruptError naming the kernel, instead of a different result."""

from __future__ import annotations

import shutil
import zlib

import numpy as np
import pytest

from mklscale.bank import KernelBank, build_bank, families
from mklscale.engine import Engine
from mklscale.engine.reader import KernelReader
from mklscale.errors import BankCorruptError

LAYOUT = dict(chunk_mb=0.02, shard_mb=0.05)  # 60 x 60 float32 kernels: 1 per chunk, 3 per shard
FLIPS = 12


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    X = np.random.default_rng(0).normal(size=(60, 4))
    return build_bank(X, families.random_subsets(4, 11, seed=1), tmp_path_factory.mktemp("b") / "bank.zarr",
                      progress=False, **LAYOUT)


def _flip(bank: KernelBank, m: int, k: int, rng) -> None:
    """Change byte k of kernel m's stored bytes in place (a different value, the file rewritten in place)."""
    with KernelReader(bank, source="copied") as reader:
        shard = reader._shard(m // bank.kernels_per_shard)
        offset = shard.offset(m) + k
    with open(bank.shard_file(m // bank.kernels_per_shard), "r+b") as f:
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([(old + int(rng.integers(1, 256))) % 256]))


def _read_all(bank: KernelBank, source: str, piece_bytes=None) -> None:
    with KernelReader(bank, source=source, piece_bytes=piece_bytes) as reader:
        for _ in reader.pieces(np.arange(len(bank))):
            pass


@pytest.mark.parametrize("source, piece_bytes", [("mapped", None), ("direct", None), ("copied", None),
                                                 ("copied", 60 * 4 * 7)])   # the last: kernels in row pieces
def test_every_flipped_byte_is_caught_by_every_reader(pristine, tmp_path, source, piece_bytes):
    rng = np.random.default_rng(zlib.crc32(f"{source}{piece_bytes}".encode()))
    kernel_bytes = pristine.n * pristine.n * pristine.dtype.itemsize
    for i in range(FLIPS):
        path = tmp_path / f"flip{i}.zarr"
        shutil.copytree(pristine.path, path)
        bank = KernelBank.open(path)
        _read_all(bank, source, piece_bytes)  # intact: reads (and, mapped, checks this file version)
        m, k = int(rng.integers(len(bank))), int(rng.integers(kernel_bytes))
        _flip(bank, m, k, rng)
        with pytest.raises(BankCorruptError, match=rf"kernel {m} .*bank verify.*bank repair"):
            _read_all(bank, source, piece_bytes)
        shutil.rmtree(path)


def test_a_pass_and_a_fit_refuse_a_damaged_kernel(pristine, tmp_path):
    path = tmp_path / "bank.zarr"
    shutil.copytree(pristine.path, path)
    bank = KernelBank.open(path)
    U = np.random.default_rng(1).normal(size=(2, bank.n))
    with Engine(bank) as engine:
        before = engine.quad_forms(U)
    _flip(bank, 4, 1000, np.random.default_rng(2))
    with Engine(KernelBank.open(path)) as engine:
        with pytest.raises(BankCorruptError, match="kernel 4 "):
            engine.quad_forms(U)
    report = KernelBank.open(path).verify()
    assert report.bad_indices == [4]
    from mklscale.bank.build import repair_bank

    repair_bank(KernelBank.open(path), progress=False)
    with Engine(KernelBank.open(path)) as engine:
        np.testing.assert_array_equal(engine.quad_forms(U), before)


def test_the_object_store_reader_checks_what_it_fetches(s3_server, s3_bucket, pristine):
    X = np.random.default_rng(0).normal(size=(60, 4))
    url = f"s3://{s3_bucket}/integrity/bank.zarr"
    bank = build_bank(X, families.random_subsets(4, 11, seed=1), url, progress=False, **LAYOUT)
    key = "integrity/bank.zarr/gram/c/1/0/0"  # kernels 3..5
    client = s3_server.client()
    data = bytearray(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    data[60 * 60 * 4 + 17] ^= 0x40  # a byte of kernel 4
    client.put_object(Bucket=s3_bucket, Key=key, Body=bytes(data))
    with pytest.raises(BankCorruptError, match="kernel 4 "):
        _read_all(KernelBank.open(url), "copied")
    assert bank.verify(mark_bad=False).bad_indices == [4]


# ---- metadata (items 6, 12) ---------------------------------------------------------------------------
def test_an_edited_normalisation_factor_is_found_by_verify_and_repaired(pristine, tmp_path):
    import zarr

    path = tmp_path / "bank.zarr"
    shutil.copytree(pristine.path, path)
    group = zarr.open_group(path, mode="r+")
    nf = group["norm_factor"][:]
    nf[2] *= 1.5
    group["norm_factor"][:] = nf
    report = KernelBank.open(path).verify()
    assert report.bad_indices == [2] and "normalisation factor" in report.bad[0][2]
    from mklscale.bank.build import repair_bank

    repair_bank(KernelBank.open(path), progress=False)
    np.testing.assert_array_equal(KernelBank.open(path).norm_factor, pristine.norm_factor)
    assert KernelBank.open(path).verify().ok


@pytest.mark.parametrize("array", ["complete", "checksum", "meta_checksum", "trace", "fro", "lambda_max",
                                   "norm_factor", "spec"])
def test_damage_to_any_metadata_chunk_is_an_error_or_found_never_used_silently(pristine, tmp_path, array, capsys):
    import zarr

    from mklscale.cli import main

    original = zarr.open_group(pristine.path, mode="r")[array][:]
    rng = np.random.default_rng(zlib.crc32(array.encode()))
    chunk = pristine.path / array / "c" / "0"
    size = chunk.stat().st_size
    outcomes = set()
    for i in range(6):
        path = tmp_path / f"{array}{i}.zarr"
        shutil.copytree(pristine.path, path)
        data = bytearray((path / array / "c" / "0").read_bytes())
        data[int(rng.integers(size))] ^= int(rng.integers(1, 256))
        (path / array / "c" / "0").write_bytes(bytes(data))
        try:
            bank = KernelBank.open(path)
        except BankCorruptError:
            outcomes.add("refused at open")
            assert main(["bank", "info", str(path)]) == 2 and main(["bank", "verify", str(path)]) == 2
            assert "Traceback" not in capsys.readouterr().err
            continue
        now = zarr.open_group(path, mode="r")[array][:]
        if np.array_equal(now, original, equal_nan=array != "spec") if array != "spec" else (now == original).all():
            outcomes.add("harmless")  # the flip hit bytes that decode to the same values
            continue
        report = bank.verify(mark_bad=False)
        assert report.bad or report.incomplete, f"{array}: damaged values passed verify"
        outcomes.add("found by verify")
    assert outcomes


def test_the_estimators_cache_never_fits_on_a_damaged_bank(tmp_path):
    from mklscale import MKLClassifier

    rng = np.random.default_rng(3)
    X = rng.normal(size=(80, 3))
    y = (X[:, 0] + 0.3 * rng.normal(size=80) > 0).astype(int)
    kw = dict(solver="spicy", C=0.1, kernels={"family": "gaussian", "widths": [0.5, 1, 2]}, cache_dir=tmp_path)
    first = MKLClassifier(**kw).fit(X, y)
    bank = KernelBank.open(first.fit_stats_["bank"])
    _flip(bank, 1, 333, np.random.default_rng(4))
    with pytest.warns(UserWarning, match="was damaged .*repaired and the fit redone"):
        again = MKLClassifier(**kw).fit(X, y)
    np.testing.assert_array_equal(again.decision_function(X), first.decision_function(X))
    assert KernelBank.open(first.fit_stats_["bank"]).verify().ok


def test_a_factor_banks_edited_transform_is_found_by_verify(tmp_path):
    import zarr

    X = np.random.default_rng(5).normal(size=(80, 4))
    bank = build_bank(X, families.random_subsets(4, 6, seed=2), tmp_path / "f.zarr", rank=8, progress=False,
                      max_error=1.0)
    assert bank.verify().ok
    group = zarr.open_group(bank.path, mode="r+")
    transform = group["transform"][:]
    transform[3, 0, 0] *= 1.01  # predictions of new rows move; the stored factor bytes do not
    group["transform"][:] = transform
    report = KernelBank.open(bank.path).verify(mark_bad=False)
    assert report.bad_indices == [3] and "checksum" in report.bad[0][2]


def test_the_stored_features_are_checked_where_they_are_used(pristine, tmp_path, capsys):
    import zarr

    from mklscale.bank.build import repair_bank
    from mklscale.cli import main

    path = tmp_path / "bank.zarr"
    shutil.copytree(pristine.path, path)
    assert KernelBank.open(path).X_train is not None and KernelBank.open(path).verify().ok
    group = zarr.open_group(path, mode="r+")
    X = group["X"][:]
    X[7, 1] += 0.5  # cross kernels of new rows and any recomputed kernel would change
    group["X"][:] = X
    with pytest.raises(BankCorruptError, match="stored features X do not match"):
        KernelBank.open(path).X_train
    report = KernelBank.open(path).verify(mark_bad=False)
    assert not report.ok and "stored features X" in str(report)
    with pytest.raises(BankCorruptError, match="stored features X"):
        repair_bank(KernelBank.open(path), kernels=[0], progress=False)
    assert main(["bank", "verify", str(path)]) != 0
    assert "stored features X" in capsys.readouterr().out
