"""Bank integrity (issue 9, items 3 and 4): verify finds corrupt, missing and truncated shards and
records them; repair recomputes exactly those from their specs; the Engine refuses recorded-bad
kernels; a full disk stops a build cleanly and it resumes; a read-only store is refused before
any work."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from _disk import fill, remount, tmpfs

from mklscale import cli
from mklscale.bank import KernelBank, build_bank, families
from mklscale.bank import _compute
from mklscale.bank import shards as shards_module
from mklscale.engine.core import Engine
from mklscale.errors import (
    BankCorruptError,
    BankIncompleteError,
    BankMismatchError,
    DiskFullError,
    ReadOnlyStoreError,
    SpecError,
)

SPECS = families.gaussian([0.3, 1.0, 4.0]) + families.polynomial([1, 2]) + families.linear(features=[0, 1])
LAYOUT = {"chunk_mb": 0.01, "shard_mb": 0.02}  # n = 37, float32: one kernel a chunk, three a shard


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(3).normal(size=(37, 4)) * [1.0, 2.0, 0.5, 3.0]


@pytest.fixture(scope="module")
def fresh(X, tmp_path_factory):
    """A clean build of the same bank: what every repair must reproduce bit for bit."""
    return build_bank(X, SPECS, tmp_path_factory.mktemp("fresh") / "b", progress=False, **LAYOUT)


@pytest.fixture
def bank(X, tmp_path):
    b = build_bank(X, SPECS, tmp_path / "b", progress=False, **LAYOUT)
    assert b.kernels_per_shard == 3 and b.n_shards == 2 and b.verify().ok
    return b


def _all(bank: KernelBank) -> np.ndarray:
    return np.concatenate([bank.read_shard(s) for s in range(bank.n_shards)])


def _flip_byte(bank: KernelBank, m: int) -> None:
    s, k = divmod(m, bank.kernels_per_shard)
    data = bytearray(bank.shard_file(s).read_bytes())
    data[k * bank.n * bank.n * bank.dtype.itemsize + 123] ^= 0x40
    bank.shard_file(s).write_bytes(bytes(data))


def _assert_repaired_like(bank: KernelBank, fresh: KernelBank, expect_kernels: list[int]) -> None:
    report = bank.repair(progress=False)
    assert report.kernels == expect_kernels and report.ok, str(report)
    again = KernelBank.open(bank.path)
    assert again.verify().ok and again.complete.all() and again.recorded_bad() == {}
    np.testing.assert_array_equal(_all(again), _all(fresh))
    np.testing.assert_array_equal(again.checksums, fresh.checksums)
    np.testing.assert_array_equal(again.lambda_max, fresh.lambda_max)


# ---- verify + repair -------------------------------------------------------------------------------
def test_flipped_byte_is_named_recorded_refused_and_repaired(bank, fresh):
    _flip_byte(bank, 4)
    report = KernelBank.open(bank.path).verify()
    assert report.bad_indices == [4] and report.marked is True and SPECS[4].name in str(report)
    assert "repair" in str(report)
    reopened = KernelBank.open(bank.path)
    assert not reopened.complete[4] and reopened.complete.sum() == len(SPECS) - 1
    assert "checksum mismatch" in reopened.recorded_bad()[4]
    # a second verify still names it (from the record; its flag is clear so it is not re-read)
    assert KernelBank.open(bank.path).verify().bad_indices == [4]
    # solvers refuse it without a verify of their own, and say what to do
    with pytest.raises(BankIncompleteError, match="corrupt") as err:
        Engine(bank.path, threads=1)
    assert SPECS[4].name in str(err.value) and "mklscale bank repair" in str(err.value)
    assert "allow_incomplete" in str(err.value)
    with Engine(bank.path, allow_incomplete=True, threads=1) as eng:
        q = eng.quad_forms(np.ones(bank.n))
    assert np.isnan(q[4]) and np.isfinite(np.delete(q, 4)).all()
    _assert_repaired_like(bank, fresh, [4])


def test_missing_shard_is_repaired(bank, fresh):
    bank.shard_file(0).unlink()
    report = bank.verify()
    assert report.bad_indices == [0, 1, 2] and "missing" in str(report)
    _assert_repaired_like(bank, fresh, [0, 1, 2])


@pytest.mark.parametrize("cut", ["half", "index crc", "offsets past the end"])
def test_truncated_shard_names_all_its_kernels_and_is_repaired(bank, fresh, cut):
    file = bank.shard_file(1)
    data = file.read_bytes()
    kernel_bytes = bank.n * bank.n * bank.dtype.itemsize
    cut_data = {"half": data[: len(data) // 2],  # the index at the end is gone
                "index crc": data[:-2],
                "offsets past the end": data[:kernel_bytes] + data[-bank.shard_index_bytes:]}[cut]
    file.write_bytes(cut_data)
    report = KernelBank.open(bank.path).verify()
    assert report.bad_indices == [3, 4, 5] and "truncated" in str(report)
    _assert_repaired_like(bank, fresh, [3, 4, 5])


def test_repair_keeps_good_kernels_bit_identical_or_refuses(bank):
    """Kernel 3 verified fine; if recomputing its shard does not reproduce it, nothing is written."""
    _flip_byte(bank, 4)
    group = KernelBank.open(bank.path, mode="r+")._group
    sums = group["checksum"][:]
    sums[3] ^= 1  # pretend kernel 3 was stored with other bytes
    group["checksum"][:] = sums
    before = bank.shard_file(1).read_bytes()
    with pytest.raises(BankCorruptError, match=r"kernel\(s\) \[3\].*nothing was written"):
        KernelBank.open(bank.path).repair(kernels=[4], progress=False)
    assert bank.shard_file(1).read_bytes() == before


def test_explicit_kernels_and_nothing_to_repair(bank, fresh):
    report = bank.repair(progress=False)
    assert report.kernels == [] and report.ok and "nothing to repair" in str(report)
    mtime = bank.shard_file(0).stat().st_mtime_ns
    report = bank.repair(kernels=[5], progress=False)  # only shard 1 is rewritten
    assert report.kernels == [5] and report.shards == [1] and report.ok
    assert bank.shard_file(0).stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(_all(KernelBank.open(bank.path)), _all(fresh))


def test_repair_on_a_distributed_client(bank, fresh, cluster_client):
    _flip_byte(bank, 1)
    report = bank.repair(client=cluster_client, progress=False)
    assert report.kernels == [1] and report.ok
    np.testing.assert_array_equal(_all(KernelBank.open(bank.path)), _all(fresh))


def test_imported_bank_cannot_be_repaired(tmp_path, capsys):
    rng = np.random.default_rng(1)
    A = rng.normal(size=(3, 12, 5))
    bank = KernelBank.from_arrays(np.einsum("mik,mjk->mij", A, A), tmp_path / "imp")
    _flip_byte(bank, 1)
    assert bank.verify().bad_indices == [1]
    with pytest.raises(SpecError, match="imported from Gram matrices.*re-import"):
        KernelBank.open(bank.path).repair()
    assert cli.main(["bank", "repair", str(bank.path), "--quiet"]) == 2
    assert "re-import" in capsys.readouterr().err


def test_cli_verify_and_repair_exit_codes(bank, fresh, capsys):
    _flip_byte(bank, 1)
    path = str(bank.path)
    assert cli.main(["bank", "verify", path, "--quiet"]) == 1
    assert SPECS[1].name in capsys.readouterr().out
    assert cli.main(["bank", "repair", path, "--quiet"]) == 0
    assert "repaired 1 kernel(s)" in capsys.readouterr().out
    assert cli.main(["bank", "verify", path, "--quiet"]) == 0
    np.testing.assert_array_equal(_all(KernelBank.open(path)), _all(fresh))
    assert cli.main(["bank", "repair", str(Path(path).parent / "nope"), "--quiet"]) == 2


# ---- disk full and read-only stores ------------------------------------------------------------------
def test_disk_full_build_stops_cleanly_and_resumes(tmp_path, monkeypatch):
    """The disk has room for the bank when the build starts (its size check passes), then another
    writer fills it while the shards are written."""
    X = np.random.default_rng(4).normal(size=(200, 4))
    specs = families.gaussian(list(np.linspace(0.2, 5.0, 30)))  # 30 x 160 kB = 4.8 MB
    layout = {"chunk_mb": 0.16, "shard_mb": 0.5}  # three kernels a shard
    reference = build_bank(X, specs, tmp_path / "ref", progress=False, **layout)
    with tmpfs(tmp_path / "small", "8M") as mnt:
        real, guard, filled = shards_module.build_shard, threading.Lock(), []

        def another_writer_fills_the_disk(*args):
            with guard:
                if not filled:
                    filled.append(fill(mnt, leave_pages=300))  # room for about two shards of 480 kB
            return real(*args)

        monkeypatch.setattr(shards_module, "build_shard", another_writer_fills_the_disk)
        # one shard at a time: each is recorded before the next is written (with several in flight the one
        # that fails may be met before the finished ones are recorded: nothing kept, a legitimate outcome)
        monkeypatch.setattr(shards_module, "BUILD_THREADS", 1)
        with pytest.raises(DiskFullError) as err:
            build_bank(X, specs, mnt / "b", progress=False, flush_every_s=0, **layout)
        monkeypatch.undo()
        filled[0].unlink()
        msg = str(err.value)
        assert "no space left" in msg and "free some space or choose another path" in msg
        assert "kept" in msg and "resumes" in msg
        bank = KernelBank.open(mnt / "b")
        done = bank.complete
        assert 0 < done.sum() < len(specs)
        S = bank.kernels_per_shard
        assert all(done[s * S:(s + 1) * S].all() or not done[s * S:(s + 1) * S].any() for s in range(bank.n_shards))
        assert bank.verify(kernels=np.flatnonzero(done).tolist()).ok
        np.testing.assert_array_equal(bank.checksums[done], reference.checksums[done])
        assert not [p for p in mnt.rglob("*") if "partial" in p.name]
        resumed = build_bank(X, specs, mnt / "b", progress=False, **layout)
        assert resumed.last_build_computed == len(specs) - done.sum()
        assert resumed.verify().ok and resumed.complete.all()
        np.testing.assert_array_equal(_all(resumed), _all(reference))


def test_read_only_store_is_refused_before_any_work(X, tmp_path, monkeypatch):
    calls = []
    real = shards_module.build_shard
    monkeypatch.setattr(shards_module, "build_shard", lambda *a: calls.append(a[5]) or real(*a))
    with tmpfs(tmp_path / "ro", "8M") as mnt:
        bank = build_bank(X, SPECS, mnt / "b", progress=False, **LAYOUT)
        assert len(calls) == 2  # the counter sees the build's tasks
        _flip_byte(bank, 2)
        group = KernelBank.open(bank.path, mode="r+")._group
        flags = group["complete"][:]
        flags[5] = False  # an unfinished kernel: a build would have work to do
        group["complete"][:] = flags
        remount(mnt, "ro")
        calls.clear()
        with pytest.raises(ReadOnlyStoreError, match="read-only.*(Remount|copy)"):
            KernelBank.open(mnt / "b", mode="r+")
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            build_bank(X, SPECS, mnt / "b", progress=False, **LAYOUT)
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            KernelBank.open(mnt / "b").repair(progress=False)
        with pytest.raises(ReadOnlyStoreError):
            build_bank(X, SPECS, mnt / "new", progress=False, **LAYOUT)
        assert calls == []
        report = KernelBank.open(mnt / "b").verify()  # still reports, cannot record
        assert report.bad_indices == [2] and report.marked is False and "read-only" in str(report)
        assert cli.main(["bank", "repair", str(mnt / "b"), "--quiet"]) == 2
        remount(mnt, "rw")


# ---- kernel arithmetic version ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype, recorded, refused", [("float32", None, True), ("float32", 2, True),
                                                     ("float64", None, False), ("float64", 2, False)])
def test_bank_of_another_arithmetic_is_not_finished_or_repaired(X, tmp_path, dtype, recorded, refused):
    """A float32 bank started by an mklscale with another kernel arithmetic (from before the version
    was recorded: 1; or 2, exp_single) is refused by resume and repair with the remedy, before any
    work: a build only writes the current arithmetic, so a bank never mixes two; float64 kernels did
    not change, so such a bank still resumes."""
    import zarr

    path = tmp_path / "b"
    build_bank(X, SPECS, path, dtype=dtype, progress=False, **LAYOUT)
    group = zarr.open_group(path, mode="r+")
    assert group.attrs["arithmetic"] == _compute.ARITHMETIC
    if recorded is None:
        group.attrs.pop("arithmetic")  # as a bank written before the version was recorded (version 1)
    else:
        group.attrs["arithmetic"] = recorded
    flags = group["complete"][:]
    flags[4] = False
    group["complete"][:] = flags
    if not refused:
        resumed = build_bank(X, SPECS, path, dtype=dtype, progress=False, **LAYOUT)
        assert resumed.last_build_computed == 1 and resumed.complete.all() and resumed.verify().ok
        return
    for attempt in (lambda: build_bank(X, SPECS, path, dtype=dtype, progress=False, **LAYOUT),
                    lambda: KernelBank.open(path).repair(progress=False)):
        with pytest.raises(BankMismatchError, match=rf"arithmetic version {recorded or 1}.*overwrite=True"):
            attempt()
    assert not KernelBank.open(path).complete[4]
