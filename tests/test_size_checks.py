"""No surprise writes (issue 28, item 1): every entry point that creates a bank checks its size against
the free space of its disk (and, for the estimators' cache, against $MKLSCALE_CACHE_MAX) before the
first kernel or file; a refusal names the size, the limit and remedies with their sizes, worded for
the entry point, and leaves the disk as it was. Real tmpfs mounts (tests/_disk.py; skipped where
mounting is not allowed), real builds, the real CLI."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from _disk import tmpfs

from mklscale import MKLClassifier
from mklscale.bank import KernelBank, build_bank, families
from mklscale.bank.storage.local import disk_usage
from mklscale.bank.size import BankTooLargeError, bank_bytes, check_fits, human
from mklscale.cli import main as cli
from mklscale.errors import InvalidInputError, NotABankError
from mklscale.pipeline import run_pipeline

THREE = {"family": "gaussian", "widths": [1.0, 2.0, 3.0], "features": "all"}
N, D = 300, 4  # three dense 300 x 300 float32 kernels: 1.1 MB on disk


def _data(n: int = N, d: int = D, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1, -1)


def _listing(root: Path) -> list[str]:
    """Every file and folder under ``root``, hidden ones (lock files, ``.partial-*``) included."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _size_in(message: str) -> tuple[int, int]:
    """(M, n) of the refused bank, read from the message."""
    m = re.search(r"bank of (\d+) kernels over n = (\d+) rows", message)
    assert m, message
    return int(m[1]), int(m[2])


@pytest.fixture
def small_disk(tmp_path):
    """A 512 kB tmpfs: smaller than the three-kernel dense bank, large enough for a rank-64 factor bank."""
    with tmpfs(tmp_path / "disk", "512k") as mnt:
        yield mnt


# ---- the size formula ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank, layout", [(None, {"chunk_mb": 3, "shard_mb": 6}),
                                          (64, {"chunk_mb": 0.5, "shard_mb": 1.2})], ids=["dense", "factor"])
def test_predicted_size_is_what_a_built_bank_occupies(tmp_path, rank, layout):
    X, _ = _data(n=600, d=5)
    specs = families.gaussian([0.5, 1, 2, 4, 8, 16, 32])
    bank = build_bank(X, specs, tmp_path / "b", progress=False, rank=rank, max_error=1.0, **layout)
    # several shards, the last one's last inner chunk zero-padded: the layout the formula models
    assert bank.n_shards > 1 and len(specs) % bank.attrs["layout"]["kernels_per_chunk"] != 0
    real = disk_usage(tmp_path / "b")
    predicted = bank_bytes(len(specs), 600, "float32", rank, n_features=5, **layout)
    assert real <= predicted <= 1.03 * real, (predicted, real)
    if rank is not None:  # the (M, r, r) float64 transforms are counted: 40% of the factor data here
        assert predicted > bank.nbytes + len(specs) * rank * rank * 8


def test_predicted_size_of_an_import_counts_its_cross_kernels(tmp_path):
    rng = np.random.default_rng(1)
    A = rng.normal(size=(4, 300, 5))
    grams = A @ A.transpose(0, 2, 1)
    cross = rng.normal(size=(4, 80, 300))
    KernelBank.from_arrays(grams, tmp_path / "b", cross_grams=cross)
    real, predicted = disk_usage(tmp_path / "b"), bank_bytes(4, 300, n_cross=80)
    assert real <= predicted <= 1.03 * real, (predicted, real)


# ---- estimators: the disk and the cache cap ------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:factor bank")  # rank r of 300 rows approximates the narrowest kernel coarsely
def test_estimator_fit_refuses_a_bank_larger_than_the_cache_disk(small_disk, monkeypatch):
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "none")
    X, y = _data()
    with pytest.raises(BankTooLargeError) as err:
        MKLClassifier(kernels=THREE, solver="uniform", cache_dir=small_disk / "cache", computed=False).fit(X, y)
    msg = str(err.value)
    assert isinstance(err.value, InvalidInputError)
    total = bank_bytes(3, N, n_features=D)
    assert f"a dense bank of 3 kernels over n = {N} rows (float32) takes {human(total)}" in msg
    assert f"free on the disk holding {small_disk / 'cache'}" in msg and f"(mounted at {small_disk})" in msg
    r = int(re.search(r"Remedies: rank=(\d+) \(a factor bank", msg)[1])
    assert f"rank={r} (a factor bank, n x {r} per kernel) stores {human(bank_bytes(3, N, rank=r, n_features=D))}" in msg
    assert bank_bytes(3, N, rank=r, n_features=D) <= 512 * 1024 < bank_bytes(3, N, rank=2 * r, n_features=D)
    assert f"pass cache_dir= a folder on a disk with {human(total)} free" in msg
    assert f"computed=True (no kernel stored: every pass computes them from the features) stores " \
           f"{human(bank_bytes(3, N, n_features=D, computed=True))}" in msg
    assert "MKLSCALE_CACHE_MAX" not in msg
    assert _listing(small_disk) == []  # no cache folder, bank, partial store, lock or use file
    # the remedy it names works on the same disk
    est = MKLClassifier(kernels=THREE, solver="uniform", rank=r, cache_dir=small_disk / "cache").fit(X, y)
    assert est.fit_stats_["kernels_built"] == 3


def test_estimator_fit_refuses_a_bank_over_the_cache_cap(tmp_path, monkeypatch):
    X, y = _data()
    cache = tmp_path / "cache"
    total = bank_bytes(3, N, n_features=D)
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "500kB")
    with pytest.raises(BankTooLargeError) as err:
        MKLClassifier(kernels=THREE, solver="uniform", cache_dir=cache, computed=False).fit(X, y)
    msg = str(err.value)
    assert f"takes {human(total)}, more than the bank cache's cap MKLSCALE_CACHE_MAX=500kB" in msg
    assert re.search(r"Remedies: rank=\d+ \(a factor bank", msg)
    m = re.search(r"set MKLSCALE_CACHE_MAX=(\S+) \(or none\)", msg)
    from dask.utils import parse_bytes

    assert total <= parse_bytes(m[1]) <= 1.1 * total  # the cap it suggests holds the bank
    assert "free on the disk" not in msg and "cache_dir=" not in msg  # the disk has room: not named
    assert not cache.exists()
    # at the suggested cap it builds; a bank already complete in the cache is reused under any cap
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", m[1])
    est = MKLClassifier(kernels=THREE, solver="uniform", cache_dir=cache).fit(X, y)
    assert est.fit_stats_["kernels_built"] == 3
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "1kB")
    est = MKLClassifier(kernels=THREE, solver="uniform", cache_dir=cache).fit(X, y)
    assert est.fit_stats_["kernels_built"] == 0


def test_estimator_fit_over_the_cap_builds_a_computed_bank_by_default(tmp_path, monkeypatch):
    """computed="auto" (the default): a stored bank over the cap gives way to a computed one (features and
    metadata only), with the same results; a bank that does not fit even computed is refused as one."""
    X, y = _data()
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "none")
    stored = MKLClassifier(kernels=THREE, solver="uniform", cache_dir=tmp_path / "a").fit(X, y)
    assert stored.fit_stats_["bank_representation"] == "dense"
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "500kB")
    computed = MKLClassifier(kernels=THREE, solver="uniform", cache_dir=tmp_path / "b").fit(X, y)
    assert computed.fit_stats_["bank_representation"] == "computed" and computed.fit_stats_["kernels_built"] == 3
    np.testing.assert_array_equal(computed.decision_function(X), stored.decision_function(X))
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "1kB")
    with pytest.raises(BankTooLargeError, match="a computed bank of 3 kernels"):
        MKLClassifier(kernels=THREE, solver="uniform", cache_dir=tmp_path / "c").fit(X, y)


def test_estimator_fit_that_fits_still_builds_and_its_bar_shows_the_size(tmp_path, monkeypatch, capsys):
    """No false refusal: a tmpfs with a few pages more than the predicted size holds the cached bank."""
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "none")
    X, y = _data()
    total = bank_bytes(3, N, n_features=D)
    with tmpfs(tmp_path / "disk", str(total + 16 * 4096)) as mnt:
        est = MKLClassifier(kernels=THREE, solver="uniform", cache_dir=mnt, progress=True).fit(X, y)
        assert est.fit_stats_["kernels_built"] == 3
    assert f"build bank (3 kernels, {human(total)})" in capsys.readouterr().err


def test_fit_bank_on_a_missing_path_writes_nothing(tmp_path):
    X, y = _data()
    with pytest.raises(NotABankError):
        MKLClassifier(solver="uniform").fit_bank(tmp_path / "nothing" / "bank", y)
    assert _listing(tmp_path) == []


# ---- the command line ----------------------------------------------------------------------------------
def _npy(folder: Path, n: int = 1000) -> tuple[Path, Path]:
    X, y = _data(n=n, d=2)
    np.save(folder / "X.npy", X)
    np.save(folder / "y.npy", y)
    return folder / "X.npy", folder / "y.npy"


@pytest.fixture
def disk_16m(tmp_path):
    """A 16 MB tmpfs: far smaller than the default dense bank on 1000 rows, large enough for a factor bank."""
    with tmpfs(tmp_path / "disk", "16M") as mnt:
        yield mnt


def test_cli_fit_refuses_with_one_line_in_its_own_options(disk_16m, tmp_path, capsys, monkeypatch):
    """`mklscale fit --features X.npy` with the default kernels, its cache on a small disk."""
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "none")
    small_disk = disk_16m
    X, y = _npy(tmp_path)
    code = cli(["fit", "--features", str(X), "--labels", str(y), "--task", "classification", "--computed", "no",
                "--cache-dir", str(small_disk / "cache"), "--out", str(tmp_path / "model"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("mklscale: error: a dense bank of ")
    assert "--computed yes (no kernel stored" in err
    M, n = _size_in(err)
    assert n == 1000 and f"takes {human(bank_bytes(M, 1000, n_features=2))}" in err
    assert f"free on the disk holding {small_disk / 'cache'}" in err
    assert re.search(r"Remedies: --rank \d+ \(a factor bank, n x \d+ per kernel\) stores \d", err)
    assert "pass --cache-dir a folder on a disk with" in err and "rank=" not in err and "cache_dir=" not in err
    assert _listing(small_disk) == [] and not (tmp_path / "model").exists()


def test_cli_bank_build_refuses_before_writing(disk_16m, tmp_path, capsys):
    small_disk = disk_16m
    X, _ = _npy(tmp_path)
    assert cli(["bank", "build", "--features", str(X), "--out", str(small_disk / "bank"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    M, n = _size_in(err)
    assert f"takes {human(bank_bytes(M, n, n_features=2))}, more than the " in err
    assert re.search(r"Remedies: --rank \d+ .* stores .*; fewer kernels: at most \d+ of the \d+ fit", err)
    assert "give --out a path on a disk with" in err
    assert _listing(small_disk) == []


def test_cli_bank_build_shows_the_size_in_its_bar(tmp_path, capsys):
    X, _ = _npy(tmp_path, n=150)
    assert cli(["bank", "build", "--features", str(X), "--out", str(tmp_path / "bank")]) == 0
    bank = KernelBank.open(tmp_path / "bank")
    assert f"build bank ({bank.M} kernels, {human(bank_bytes(bank.M, 150, n_features=2))})" in capsys.readouterr().err


# ---- pipelines -------------------------------------------------------------------------------------------
PIPELINE = """\
name = "too-large"
seed = 0

[dataset]
name = "breast_cancer"
test_fraction = 0.25

[bank]
families = [{{ family = "gaussian", widths = [1, 2, 5], features = "all" }}]
path = "{bank}"

[[solver]]
name = "uni"
solver = "uniform"

[report]
enabled = false
"""


def test_pipeline_refuses_a_bank_larger_than_its_disk(small_disk, tmp_path):
    spec = tmp_path / "p.toml"
    spec.write_text(PIPELINE.format(bank=small_disk / "bank"))
    cluster = tmp_path / "local.toml"
    cluster.write_text('kind = "local"\nn_workers = 1\nprocesses = false\n')
    with pytest.raises(BankTooLargeError) as err:
        run_pipeline(spec, out=tmp_path / "run", cluster=cluster, quiet=True)
    msg = str(err.value)
    M, n = _size_in(msg)
    assert M == 3 and f"takes {human(bank_bytes(3, n, n_features=30))}" in msg
    assert re.search(r"Remedies: rank = \d+ in \[bank\] \(a factor bank", msg)
    assert "put the run (--out) or [bank] path on a disk with" in msg
    assert _listing(small_disk) == []


# ---- build_bank and from_arrays ------------------------------------------------------------------------
def test_build_bank_refuses_before_the_lock_or_any_file(small_disk):
    X, _ = _data()
    with pytest.raises(BankTooLargeError, match=r"Remedies: rank=\d+ .*give a path on a disk with"):
        build_bank(X, families.gaussian([1, 2, 3]), small_disk / "sub" / "b", progress=False)
    assert _listing(small_disk) == []  # not even the folder that would hold it, nor `.b.lock`


def test_from_arrays_refuses_before_writing(small_disk):
    rng = np.random.default_rng(2)
    A = rng.normal(size=(3, N, 4))
    with pytest.raises(BankTooLargeError) as err:
        KernelBank.from_arrays(A @ A.transpose(0, 2, 1), small_disk / "b")
    msg = str(err.value)
    assert f"takes {human(bank_bytes(3, N))}" in msg and "give a path on a disk with" in msg
    assert "rank" not in msg  # imported Gram matrices cannot become a factor bank
    assert _listing(small_disk) == []


def test_a_resumed_bank_needs_only_its_missing_part(tmp_path):
    """A half-built bank on a disk that could not hold the whole bank again: the build resumes."""
    X, _ = _data(n=200)
    specs = families.gaussian(list(np.linspace(0.5, 5.0, 12)))  # 12 x 160 kB, two kernels a shard
    layout = {"chunk_mb": 0.16, "shard_mb": 0.32}
    total = bank_bytes(12, 200, n_features=D, **layout)
    with tmpfs(tmp_path / "disk", str(total + 16 * 4096)) as mnt:
        bank = build_bank(X, specs, mnt / "b", progress=False, **layout)
        assert bank.kernels_per_shard == 2
        for s in range(3, 6):  # the last three shards are lost (a killed build had not written them)
            bank.shard_file(s).unlink()
        assert not KernelBank.open(mnt / "b", mode="r+").verify().ok  # their kernels are flagged unfinished
        with pytest.raises(BankTooLargeError):  # the disk could not take the whole bank again ...
            check_fits(mnt / "new", 12, 200, n_features=D, **layout)
        resumed = build_bank(X, specs, mnt / "b", progress=False, **layout)  # ... but takes what is missing
        assert resumed.last_build_computed == 6 and resumed.complete.all() and resumed.verify().ok


def test_bank_copy_refuses_a_disk_too_small_before_writing(small_disk, tmp_path, capsys):
    from mklscale.cli import main

    X, _ = _data()
    bank = build_bank(X, families.gaussian([0.5, 1, 2]), tmp_path / "src", progress=False)
    assert disk_usage(bank.path) > 512 * 1024
    assert main(["bank", "copy", str(bank.path), str(small_disk / "copy")]) == 2
    err = capsys.readouterr().err
    assert "more than the" in err and "free on the disk" in err and "Traceback" not in err
    assert not any(small_disk.iterdir())
