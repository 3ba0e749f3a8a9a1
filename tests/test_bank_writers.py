"""One writer per bank, and writers that stay inside the bank (issue 18: concurrency and store safety).

The concurrency tests run real builds, repairs and verifies in child processes and pause them with
SIGSTOP / SIGCONT at the moment the issue describes; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from mklscale import cli
from mklscale.bank import KernelBank, build_bank, families, integrity
from mklscale.bank.storage import writer_lock
from mklscale.bank.shards import _MetadataWriter
from mklscale.bank.shard_format import write_shard_file
from mklscale.errors import BankCorruptError, BankLockedError, ClusterUnavailableError, NotABankError

from _processes import stop_processes

LAYOUT = {"chunk_mb": 0.16, "shard_mb": 0.5}  # n = 200, float32: three kernels a shard
CHILD_ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), OMP_NUM_THREADS="1")

BUILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from mklscale.bank import build_bank, families
    X = np.load(sys.argv[1])
    kw = json.loads(sys.argv[3])
    specs = (families.gaussian(kw.pop("widths")) if "widths" in kw
             else families.random_subsets(X.shape[1], kw.pop("n_kernels"), seed=kw.pop("seed")))
    bank = build_bank(X, specs, sys.argv[2], progress=False, flush_every_s=0, **kw)
    print("computed", bank.last_build_computed, flush=True)
""")

CLI = "import sys; from mklscale.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(3).normal(size=(200, 5))


def _build_child(tmp_path: Path, X, path: Path, log: str, **kw) -> subprocess.Popen:
    np.save(tmp_path / "X.npy", X)
    with open(tmp_path / log, "w") as out:
        return subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path / "X.npy"), str(path), json.dumps(kw)],
                                stdout=out, stderr=subprocess.STDOUT, env=CHILD_ENV)


def _until(condition, timeout_s: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def _complete_count(path: Path) -> int:
    try:
        return int(KernelBank.open(path).complete.sum())
    except Exception:
        return -1


def _finish(*procs: subprocess.Popen, timeout_s: float = 300) -> list[int]:
    for p in procs:
        p.send_signal(signal.SIGCONT)
    return [p.wait(timeout=timeout_s) for p in procs]


def _flip_byte(bank: KernelBank, m: int) -> None:
    s, k = divmod(m, bank.kernels_per_shard)
    data = bytearray(bank.shard_file(s).read_bytes())
    data[k * bank.n * bank.n * bank.dtype.itemsize + 123] ^= 0x40
    bank.shard_file(s).write_bytes(bytes(data))


# ---- item 1: an overwrite while another build runs ----------------------------------------------------
def test_overwrite_waits_for_the_running_build_and_wins_whole(X, tmp_path):
    """Build A paused right after its zarr.json appears; build B (other widths, overwrite=True) must
    not touch the store until A is done, and the bank ends up B's, every kernel B's own bytes."""
    path = tmp_path / "bank"
    widths_a, widths_b = list(np.linspace(0.3, 6.0, 240)), list(np.linspace(0.5, 8.0, 60))
    a = _build_child(tmp_path, X, path, "a.log", widths=widths_a, **LAYOUT)
    try:
        _until(lambda: (path / "zarr.json").exists() or a.poll() is not None, what="build A's zarr.json")
        a.send_signal(signal.SIGSTOP)
        assert a.poll() is None and _complete_count(path) < len(widths_a), "build A finished too early"
        with pytest.raises(BankLockedError, match=rf"pid {a.pid} on host {platform.node()} \(build since"):
            build_bank(X, families.gaussian(widths_b), path, overwrite=True, wait=False, progress=False, **LAYOUT)
        b = _build_child(tmp_path, X, path, "b.log", widths=widths_b, overwrite=True, **LAYOUT)
        _until(lambda: f"written by pid {a.pid}" in (tmp_path / "b.log").read_text() or b.poll() is not None,
               what="build B's waiting message")
        assert b.poll() is None, (tmp_path / "b.log").read_text()  # B waits while A is paused
    finally:
        rc_a = _finish(a)
    assert rc_a == [0], (tmp_path / "a.log").read_text()
    assert b.wait(timeout=300) == 0, (tmp_path / "b.log").read_text()
    bank = KernelBank.open(path)
    assert bank.names == [s.name for s in families.gaussian(widths_b)]
    assert bank.complete.all() and bank.verify().ok
    reference = build_bank(X, families.gaussian(widths_b), tmp_path / "ref", progress=False, **LAYOUT)
    np.testing.assert_array_equal(bank.checksums, reference.checksums)
    np.testing.assert_array_equal(bank.gram[:], reference.gram[:])
    assert not list(tmp_path.glob(".bank.*-*")), "the replaced store was left behind"


def test_overwrite_swaps_the_store_in_one_step(X, tmp_path):
    """An overwrite builds the new store beside the old one and exchanges them: the path never
    disappears and no half-deleted store is left (runtime.atomic.swap_into_place)."""
    path = tmp_path / "bank"
    build_bank(X, families.gaussian([1.0, 2.0]), path, progress=False)
    seen_missing = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if not (path / "zarr.json").exists():
                seen_missing.append(time.monotonic())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for widths in ([0.5, 3.0, 4.0], [1.5], [2.5, 0.7]):
            bank = build_bank(X, families.gaussian(widths), path, overwrite=True, progress=False)
            assert bank.M == len(widths)
    finally:
        stop.set()
        watcher.join()
    assert seen_missing == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bank.lock", "bank"]


# ---- item 2: verify's bad mark and a build's later flush ----------------------------------------------
def test_verify_mark_survives_a_build_flushing_afterwards(X, tmp_path):
    path = tmp_path / "bank"
    kw = {"n_kernels": 150, "seed": 1, **LAYOUT}
    first = _build_child(tmp_path, X, path, "first.log", **kw)
    _until(lambda: _complete_count(path) >= 12 or first.poll() is not None, what="the first build's progress")
    first.send_signal(signal.SIGKILL)
    first.wait()
    bank = KernelBank.open(path)
    assert not bank.complete.all(), "the first build finished before it could be killed"
    S = bank.kernels_per_shard
    done_shards = [s for s in range(bank.n_shards) if bank.complete[s * S:(s + 1) * S].all()]
    bad = done_shards[0] * S + 1  # in a complete shard: the resumed build does not recompute it
    _flip_byte(bank, bad)
    before = _complete_count(path)
    resume = _build_child(tmp_path, X, path, "resume.log", **kw)
    try:
        _until(lambda: _complete_count(path) > before or resume.poll() is not None, what="the resumed build")
        resume.send_signal(signal.SIGSTOP)  # it holds its metadata in memory and will flush it again
        assert resume.poll() is None, "the resumed build finished too early"
        with open(tmp_path / "verify.log", "w") as out:
            verify = subprocess.Popen([sys.executable, "-c", CLI, "bank", "verify", str(path), "--quiet"],
                                      stdout=out, stderr=subprocess.STDOUT, env=CHILD_ENV)
        _until(lambda: verify.poll() is not None or f"pid {resume.pid}" in (tmp_path / "verify.log").read_text(),
               what="verify to finish or to wait")
    finally:
        _finish(resume)
    assert resume.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()
    assert verify.wait(timeout=300) == 1, (tmp_path / "verify.log").read_text()
    bank = KernelBank.open(path)
    assert not bank.complete[bad] and bad in bank.recorded_bad(), (bad, (tmp_path / "verify.log").read_text())
    assert np.flatnonzero(~bank.complete).tolist() == [bad]
    assert bank.verify().bad_indices == [bad]


def test_metadata_writer_touches_only_the_kernels_it_recorded(X, tmp_path):
    bank = build_bank(X[:40], families.gaussian([0.5, 1.0, 2.0, 4.0]), tmp_path / "b", progress=False,
                      chunk_mb=0.0064, shard_mb=0.0128)  # two kernels a shard
    assert bank.kernels_per_shard == 2
    writer = _MetadataWriter(KernelBank.open(bank.path, mode="r+"), every_s=3600)
    other = KernelBank.open(bank.path, mode="r+")
    integrity.record_bad(other, {0: "found bad meanwhile"})  # another writer's change after the writer read the arrays
    stats = {k: other._meta(k)[2:4] for k in ("trace", "fro", "lambda_max", "norm_factor", "checksum")}
    writer.record(2, stats)
    writer.flush()
    again = KernelBank.open(bank.path)
    assert again.complete.tolist() == [False, True, True, True] and again.recorded_bad() == {0: "found bad meanwhile"}


# ---- item 3: two identical builds started together ---------------------------------------------------
def test_two_identical_builds_started_together_compute_once(X, tmp_path):
    path = tmp_path / "bank"
    kw = {"widths": list(np.linspace(0.3, 6.0, 90)), **LAYOUT}
    procs = [_build_child(tmp_path, X, path, f"{i}.log", **kw) for i in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    computed = sorted(int(log.split("computed")[-1]) for log in logs)
    assert computed == [0, 90], logs  # the second waited, then found the bank finished
    bank = KernelBank.open(path)
    assert bank.complete.all() and bank.verify().ok


# ---- the lock itself ----------------------------------------------------------------------------------
def test_lock_is_reentrant_in_a_thread_and_excludes_other_threads(tmp_path):
    path = tmp_path / "bank"
    order = []
    with writer_lock.bank_writer(path, "build"):
        with writer_lock.bank_writer(path, "repair"):  # re-entered: a repair's verify marks under it
            info = writer_lock.holder(path)
            assert info["pid"] == os.getpid() and info["host"] == platform.node() and info["what"] == "build"

        def other():
            with pytest.raises(BankLockedError, match=r"this process.*after waiting 0.2 s"):
                with writer_lock.bank_writer(path, "verify", wait=0.2):
                    pass
            with writer_lock.bank_writer(path, "verify"):
                order.append("other")

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.5)
        order.append("first")
    t.join(timeout=30)
    assert order == ["first", "other"]
    assert writer_lock.holder(path) is None and not writer_lock.lock_path(path).exists()  # gone with the lock


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    path = tmp_path / "bank"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from mklscale.bank.storage.writer_lock import bank_writer
        with bank_writer({str(path)!r}, "build"):
            print("held", flush=True)
            time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
    assert child.stdout.readline().strip() == "held"
    with pytest.raises(BankLockedError, match=f"pid {child.pid}"):
        with writer_lock.bank_writer(path, "build", wait=False):
            pass
    child.kill()
    child.wait()
    with writer_lock.bank_writer(path, "build", wait=False):
        pass


# ---- item 6: symbolic links out of the store ---------------------------------------------------------
def _small_bank(X, path: Path) -> KernelBank:
    return build_bank(X[:40], families.gaussian([0.5, 1.0, 2.0, 4.0]), path, progress=False,
                      chunk_mb=0.0064, shard_mb=0.0128)  # two kernels a shard


def test_repair_never_writes_through_a_link_out_of_the_store(X, tmp_path):
    bank = _small_bank(X, tmp_path / "b")
    outside = tmp_path / "outside"
    outside.mkdir()
    inner = bank.path / "gram" / "c" / "0" / "0"  # the folder holding shard 0's file
    shutil.move(str(inner), outside / "0")
    inner.symlink_to(outside / "0", target_is_directory=True)
    _flip_byte(bank, 1)
    before = (outside / "0" / "0").read_bytes()
    with pytest.raises(BankCorruptError, match=r"symbolic link to .*outside.*outside the bank"):
        bank.repair(progress=False)
    assert cli.main(["bank", "repair", str(bank.path), "--quiet"]) == 2
    with pytest.raises(BankCorruptError, match="outside the bank"):
        build_bank(X[:40], families.gaussian([0.5, 1.0, 2.0, 4.0]), bank.path, progress=False,
                   chunk_mb=0.0064, shard_mb=0.0128)
    assert (outside / "0" / "0").read_bytes() == before and sorted(os.listdir(outside / "0")) == ["0"]


def test_shard_writes_refuse_a_link_that_appears_during_a_build(X, tmp_path):
    bank = _small_bank(X, tmp_path / "b")
    outside = tmp_path / "outside"
    shutil.move(str(bank.path / "gram" / "c" / "1"), outside)
    (bank.path / "gram" / "c" / "1").symlink_to(outside, target_is_directory=True)
    block = bank.gram[2:4]
    with pytest.raises(BankCorruptError, match="outside the bank"):
        write_shard_file(bank.path, 1, block, 2, 2)
    assert sorted(os.listdir(outside / "0")) == ["0"]


# ---- item 7: damaged metadata ------------------------------------------------------------------------
def _edit_json(file: Path, edit) -> None:
    meta = json.loads(file.read_text())
    edit(meta)
    file.write_text(json.dumps(meta))


def _set_attr(key, value):
    def edit(meta):
        if value is _DELETE:
            del meta["attributes"][key]
        else:
            meta["attributes"][key] = value
    return edit


_DELETE = object()

DAMAGE = {
    "missing complete": (lambda p: shutil.rmtree(p / "complete"), "array 'complete' is missing"),
    "missing spec": (lambda p: shutil.rmtree(p / "spec"), "array 'spec' is missing"),
    "missing gram": (lambda p: shutil.rmtree(p / "gram"), "array 'gram' is missing"),
    "missing checksum": (lambda p: shutil.rmtree(p / "checksum"), "array 'checksum' is missing"),
    "kernels_per_shard = 0": (lambda p: _edit_json(p / "zarr.json", _set_attr(
        "layout", {"kernels_per_chunk": 2, "kernels_per_shard": 0})), "attribute layout"),
    "M = 10^12": (lambda p: _edit_json(p / "zarr.json", _set_attr("M", 10**12)), "has shape"),
    "wrong M": (lambda p: _edit_json(p / "zarr.json", _set_attr("M", 5)), r"'gram' has shape \(4, 40, 40\), expected \(5"),
    "missing dtype": (lambda p: _edit_json(p / "zarr.json", _set_attr("dtype", _DELETE)), "attribute dtype is None"),
    "dtype disagrees": (lambda p: _edit_json(p / "zarr.json", _set_attr("dtype", "float64")),
                        "holds float32, but the attributes say float64"),
    "spec not JSON": (lambda p: zarr.open_array(p / "spec", mode="r+").__setitem__(1, "{not json"),
                      "spec of kernel 1 is not a valid kernel spec"),
    "unknown codec": (lambda p: _edit_json(p / "gram" / "zarr.json",
                                           lambda m: m["codecs"][0].__setitem__("name", "no_such_codec")),
                      "array 'gram' cannot be read"),
    "negative shape": (lambda p: _edit_json(p / "gram" / "zarr.json", lambda m: m["shape"].__setitem__(0, -4)),
                       "array 'gram' (cannot be read|has shape)"),
}


@pytest.fixture(scope="module")
def intact_bank(X, tmp_path_factory):
    return _small_bank(X, tmp_path_factory.mktemp("intact") / "b")


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_metadata_is_named_and_repair_refuses_it(intact_bank, tmp_path, capsys, damage):
    path = tmp_path / "b"
    shutil.copytree(intact_bank.path, path)
    shards = {f: f.read_bytes() for f in (path / "gram" / "c").rglob("*") if f.is_file()}
    breaks, words = DAMAGE[damage]
    breaks(path)
    with pytest.raises((BankCorruptError, NotABankError), match=words) as err:
        KernelBank.open(path)
    assert "damaged metadata" in str(err.value) and "repair` cannot fix" in str(err.value)
    assert cli.main(["bank", "repair", str(path), "--quiet"]) == 2
    message = capsys.readouterr().err
    assert "damaged metadata" in message and "Traceback" not in message
    assert cli.main(["bank", "verify", str(path)]) == 2
    assert {f: f.read_bytes() for f in shards if f.exists()} == {f: b for f, b in shards.items() if f.exists()}


# ---- item 8: leftovers of a killed writer ------------------------------------------------------------
def test_leftovers_of_a_killed_writer_are_swept_by_the_next(X, tmp_path):
    bank = _small_bank(X, tmp_path / "b")
    shard_dir = bank.shard_file(1).parent
    partial = shard_dir / ".0.deadbeef.partial"  # what write_shard_file leaves when killed mid-write
    partial.write_bytes(b"x" * 1000)
    zarr_partial = bank.path / "complete" / "c" / "zarr.0123456789abcdef0123456789abcdef.partial"  # zarr's own
    zarr_partial.parent.mkdir(parents=True, exist_ok=True)
    zarr_partial.write_bytes(b"{}")
    half_created = tmp_path / ".b.partial-0badc0de"  # create_bank_group killed before its rename
    (half_created / "gram").mkdir(parents=True)
    half_replaced = tmp_path / ".b.old-0badc0de"  # an overwrite killed while removing the old store
    half_replaced.mkdir()
    _flip_byte(bank, 2)
    report = bank.repair(progress=False)
    assert report.ok and report.kernels == [2]
    assert not partial.exists() and not zarr_partial.exists()
    assert not half_created.exists() and not half_replaced.exists()
    assert sorted(os.listdir(shard_dir)) == ["0"]


def test_a_repair_killed_mid_write_leaves_a_partial_the_next_writer_removes(X, tmp_path):
    """A repair child is killed inside its shard write (a stop in write_shard_file after the temporary
    file is written); the next repair removes that file and finishes."""
    bank = _small_bank(X, tmp_path / "b")
    _flip_byte(bank, 0)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from mklscale.bank import shard_format, KernelBank
        real = os.replace
        def stop_before_rename(src, dst):
            if os.path.basename(src).startswith(".0.") and str(src).endswith(".partial"):  # a shard's
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst)
        shard_format.os.replace = stop_before_rename
        KernelBank.open({str(bank.path)!r}).repair(progress=False)
    """)], env=CHILD_ENV)
    assert child.wait(timeout=120) == -signal.SIGKILL
    leftovers = list(bank.path.rglob("*.partial"))
    assert len(leftovers) == 1
    assert KernelBank.open(bank.path).repair(progress=False).ok
    assert not list(bank.path.rglob("*.partial"))


# ---- item 10: relative paths and workers without the bank ---------------------------------------------
def _worker(address: str, cwd: Path, log: Path, wrap: list[str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
           "--no-dashboard", "--local-directory", str(cwd)]
    with log.open("w") as out:
        return subprocess.Popen((wrap or []) + cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=CHILD_ENV)


@pytest.mark.cluster
def test_relative_bank_path_with_workers_started_elsewhere(X, tmp_path, monkeypatch):
    from distributed import Client, LocalCluster

    here, elsewhere = tmp_path / "driver", tmp_path / "workers"
    here.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(here)
    with LocalCluster(n_workers=0, processes=True, dashboard_address=None, scheduler_port=0) as cluster:
        workers = [_worker(cluster.scheduler_address, elsewhere, tmp_path / f"w{i}.log") for i in range(2)]
        try:
            with Client(cluster) as client:
                client.wait_for_workers(2, timeout=120)
                bank = build_bank(X[:60], families.gaussian(list(np.linspace(0.5, 4, 12))), "rel/bank",
                                  client=client, progress=False, chunk_mb=0.0144, shard_mb=0.0288)
        finally:
            stop_processes(workers)
    assert bank.complete.all() and bank.verify().ok
    assert not (elsewhere / "rel").exists()


@pytest.mark.cluster
def test_workers_that_cannot_see_the_bank_are_named_before_any_task(X, tmp_path):
    """A worker in its own mount namespace, with an empty file system over the bank's folder: it
    sees a folder at the same path, but not the driver's (no shared file system)."""
    from distributed import Client, LocalCluster

    shared = tmp_path / "shared"
    shared.mkdir()
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs tmpfs {shared}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot give a worker its own file system view: {probe.stderr.strip()}")
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs tmpfs {shared} && mkdir -p {shared}/bank && exec "$@"', "worker"]
    with LocalCluster(n_workers=0, processes=True, dashboard_address=None, scheduler_port=0) as cluster:
        workers = [_worker(cluster.scheduler_address, tmp_path, tmp_path / "w.log", wrap)]
        try:
            with Client(cluster) as client:
                client.wait_for_workers(1, timeout=120)
                with pytest.raises(ClusterUnavailableError, match=r"1 of 1 Dask worker\(s\) cannot see .*shared/bank"):
                    build_bank(X[:60], families.gaussian([0.5, 1.0]), shared / "bank", client=client, progress=False)
        finally:
            stop_processes(workers)
    assert KernelBank.open(shared / "bank").complete.sum() == 0
