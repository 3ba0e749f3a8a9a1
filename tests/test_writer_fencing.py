"""One writer per bank, for real (issue 29, items 1-4, 8, 9): a writer that lost its S3 lock cannot
change the bank, release never removes another writer's lock, verify's marks, copy and overwrite take
the lock, a symlinked bank name shares its target's lock, and URL misspellings are refused.

The S3 cases run against the real SeaweedFS fixture with a short lease (MKLSCALE_S3_LOCK_TTL_S=4 in
the child writers, the same module constants here), so a paused writer (SIGSTOP) outlives its lease
in seconds rather than a minute.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from _slow_build import slow_shard_writes, wait_for_kernels

from mklscale.bank import KernelBank, build_bank, families, shards
from mklscale.bank.storage import objlock, objstore
from mklscale.bank.storage.location import bank_location
from mklscale.bank.storage.objstore import ObjectBank
from mklscale.bank.transfer import copy_bank
from mklscale.bank.storage.writer_lock import bank_writer, lock_path
from mklscale.errors import BankLockedError, BankLockLostError, InvalidInputError

LAYOUT = dict(chunk_mb=0.02, shard_mb=0.05)  # 60 x 60 float32 kernels: 1 per chunk, 3 per shard
TTL = 4.0


@pytest.fixture
def short_lease(monkeypatch):
    monkeypatch.setattr(objstore, "TTL_S", TTL)
    monkeypatch.setattr(objstore, "MARGIN_S", TTL / 3)
    monkeypatch.setattr(objstore, "FENCE_RECHECK_S", TTL / 12)
    monkeypatch.setattr(objlock, "POLL_S", 0.1)


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(0).normal(size=(60, 4))


def _lock_record(s3_server, bucket: str, key: str) -> dict | None:
    try:
        body = s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception:  # noqa: BLE001 - no such key
        return None
    return json.loads(body)


def _slow_writes(monkeypatch, seconds: float) -> None:
    write = shards._write_shard

    def slow(*a, **k):
        time.sleep(seconds)
        write(*a, **k)

    monkeypatch.setattr(shards, "_write_shard", slow)
    monkeypatch.setattr(shards, "BUILD_THREADS", 1)


# ---- S3: fencing --------------------------------------------------------------------------------------
def test_a_paused_writer_whose_lease_expired_stops_and_never_writes_into_the_new_writers_bank(
        s3_server, s3_bucket, X, tmp_path, short_lease, monkeypatch):
    url = f"s3://{s3_bucket}/fenced/bank.zarr"
    specs_a, specs_b = families.random_subsets(4, 11, seed=1), families.random_subsets(4, 11, seed=2)
    np.save(tmp_path / "X.npy", X)
    script = slow_shard_writes(0.8) + textwrap.dedent(f"""
        import sys, numpy as np
        from mklscale.bank import build_bank, families
        from mklscale.errors import BankLockLostError
        try:
            build_bank(np.load({str(tmp_path / 'X.npy')!r}), families.random_subsets(4, 11, seed=1), {url!r},
                       progress=False, flush_every_s=0, chunk_mb=0.02, shard_mb=0.05)
        except BankLockLostError as exc:
            print("LOST:", exc, file=sys.stderr); sys.exit(2)
    """)
    a = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "MKLSCALE_S3_LOCK_TTL_S": str(TTL)},
                         stderr=subprocess.PIPE, text=True)
    wait_for_kernels(url, 3, a, timeout=60)  # A has stored a shard: stop it mid-build
    a.send_signal(signal.SIGSTOP)
    try:
        time.sleep(TTL + 0.5)  # A's lease runs out while it is stopped
        _slow_writes(monkeypatch, 0.5)
        built = []
        b = threading.Thread(target=lambda: built.append(build_bank(X, specs_b, url, overwrite=True, progress=False,
                                                                    flush_every_s=0, **LAYOUT)))
        b.start()  # B takes the expired lock over and overwrites the bank
        lock = _lock_record(s3_server, s3_bucket, "fenced/.bank.zarr.lock")
        while b.is_alive() and (lock is None or lock.get("pid") != os.getpid()):
            time.sleep(0.05)
            lock = _lock_record(s3_server, s3_bucket, "fenced/.bank.zarr.lock")
    finally:
        a.send_signal(signal.SIGCONT)  # A goes on while B writes
    _, err = a.communicate(timeout=60)
    b.join(120)
    assert a.returncode == 2, err
    assert "no longer holds the writer lock" in err or "was lost" in err
    reference = build_bank(X, specs_b, tmp_path / "b.zarr", progress=False, **LAYOUT)
    bank = KernelBank.open(url)
    assert [s.name for s in bank.specs] == [s.name for s in reference.specs]
    np.testing.assert_array_equal(bank.checksums, reference.checksums)
    assert bank.complete.all() and bank.verify(mark_bad=False).ok  # not one byte of A's in B's bank
    assert specs_a != specs_b


def test_release_never_removes_another_writers_lock_and_a_lost_lock_ends_in_an_error(
        s3_server, s3_bucket, short_lease):
    url = bank_location(f"s3://{s3_bucket}/release/bank.zarr")
    key = "release/.bank.zarr.lock"
    other = {"pid": 1, "host": "elsewhere", "what": "build", "token": "theirs", "count": 0, "since": "now",
             "expires": time.time() + 600}
    with pytest.raises(BankLockLostError, match="was lost"):
        with objlock.object_writer(url, "mine") as fenced:
            assert fenced.fence == _lock_record(s3_server, s3_bucket, key)["token"]
            s3_server.client().put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(other).encode())
            with pytest.raises(BankLockLostError, match="no longer holds"):
                ObjectBank(fenced).put("zarr.json", b"{}")  # a fenced write is refused...
            assert not ObjectBank(url).exists("zarr.json")  # ...before it is made
    assert _lock_record(s3_server, s3_bucket, key)["token"] == "theirs"  # their lock is still there

    # an orderly release leaves an expired record, which the next writer takes over at once
    url2 = bank_location(f"s3://{s3_bucket}/release/other.zarr")
    with objlock.object_writer(url2, "first"):
        pass
    record = _lock_record(s3_server, s3_bucket, "release/.other.zarr.lock")
    assert record["released"] and record["expires"] < time.time()
    with objlock.object_writer(url2, "second", wait=False):
        assert _lock_record(s3_server, s3_bucket, "release/.other.zarr.lock")["what"] == "second"


def test_verify_marks_bad_kernels_on_s3_under_the_writer_lock(s3_server, s3_bucket, X, short_lease):
    url = f"s3://{s3_bucket}/marks/bank.zarr"
    build_bank(X, families.random_subsets(4, 11, seed=1), url, progress=False, **LAYOUT)
    s3_server.client().delete_object(Bucket=s3_bucket, Key="marks/bank.zarr/gram/c/1/0/0")  # kernels 3..5
    reports, refused = [], []
    with objlock.object_writer(bank_location(url), "a build"):
        thread = threading.Thread(target=lambda: reports.append(KernelBank.open(url).verify()))
        thread.start()
        time.sleep(1.5)
        assert thread.is_alive() and not reports  # its marks wait for the writer
        other = threading.Thread(target=lambda: refused.append(_refused(
            lambda overwrite: KernelBank.open(url).verify(wait=False))))
        other.start()
        other.join(30)
        assert isinstance(refused[0], BankLockedError)
    thread.join(60)
    assert reports[0].bad_indices == [3, 4, 5] and reports[0].marked
    assert not KernelBank.open(url).complete[3:6].any()


def test_bank_copy_overwrite_refuses_a_destination_being_written(s3_bucket, X, tmp_path, short_lease):
    src = build_bank(X, families.random_subsets(4, 5, seed=1), tmp_path / "src.zarr", progress=False, **LAYOUT)
    local = build_bank(X, families.random_subsets(4, 5, seed=2), tmp_path / "dst.zarr", progress=False, **LAYOUT)
    with bank_writer(local.path, "a build"):
        result = []
        thread = threading.Thread(target=lambda: result.append(_refused(copy_bank, src.path, local.path)))
        thread.start()
        thread.join(30)
    assert isinstance(result[0], BankLockedError)
    url = f"s3://{s3_bucket}/copydst/bank.zarr"
    copy_bank(src.path, url)
    with objlock.object_writer(bank_location(url), "a build"):
        result = []
        thread = threading.Thread(target=lambda: result.append(_refused(copy_bank, local.path, url)))
        thread.start()
        thread.join(30)
    assert isinstance(result[0], BankLockedError)
    np.testing.assert_array_equal(KernelBank.open(url).checksums, src.checksums)  # untouched


def _refused(fn, *args):
    try:
        fn(*args, overwrite=True)
    except Exception as exc:  # noqa: BLE001 - returned for the assertion
        return exc
    return None


# ---- local --------------------------------------------------------------------------------------------
def test_a_symlinked_bank_name_shares_its_targets_lock(X, tmp_path):
    bank = build_bank(X, families.random_subsets(4, 5, seed=1), tmp_path / "real.zarr", progress=False, **LAYOUT)
    (tmp_path / "alias.zarr").symlink_to(tmp_path / "real.zarr")
    assert lock_path(tmp_path / "alias.zarr") == lock_path(bank.path)
    with bank_writer(tmp_path / "alias.zarr", "a build"):
        result = []
        thread = threading.Thread(target=lambda: result.append(
            _refused(lambda *a, overwrite: bank_writer(bank.path, "second", wait=False).__enter__())))
        thread.start()
        thread.join(30)
    assert isinstance(result[0], BankLockedError)


@pytest.mark.parametrize("spelling", ["s3:/bucket/x", "s3:bucket/x", "S3:/bucket/x", "s3:///bucket/x",
                                      "gs:/bucket/x"])
def test_misspelt_urls_are_refused_and_write_nothing(spelling, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError, match="s3://"):
        bank_location(spelling)
    assert not any(tmp_path.iterdir())


# ---- overwrite never deletes what is not the bank's (item 10) -------------------------------------------
def test_overwrite_refuses_a_folder_or_prefix_holding_more_than_the_bank(s3_server, s3_bucket, X, tmp_path):
    specs = families.random_subsets(4, 5, seed=1)
    bank = build_bank(X, specs, tmp_path / "outer.zarr", progress=False, **LAYOUT)
    build_bank(X, specs, tmp_path / "outer.zarr" / "nested.zarr", progress=False, **LAYOUT)
    (tmp_path / "outer.zarr" / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInputError, match=r"holds \d+ file\(s\) or object\(s\) that are not part of the bank"):
        build_bank(X, families.random_subsets(4, 5, seed=2), bank.path, overwrite=True, progress=False, **LAYOUT)
    assert (tmp_path / "outer.zarr" / "notes.txt").read_text() == "mine"
    assert KernelBank.open(tmp_path / "outer.zarr" / "nested.zarr").verify(mark_bad=False).ok

    url = f"s3://{s3_bucket}/foreign/bank.zarr"
    build_bank(X, specs, url, progress=False, **LAYOUT)
    s3_server.client().put_object(Bucket=s3_bucket, Key="foreign/bank.zarr/theirs.csv", Body=b"1,2")
    with pytest.raises(InvalidInputError, match="theirs.csv"):
        build_bank(X, families.random_subsets(4, 5, seed=2), url, overwrite=True, progress=False, **LAYOUT)
    assert s3_server.client().get_object(Bucket=s3_bucket, Key="foreign/bank.zarr/theirs.csv")["Body"].read() == b"1,2"
    # a plain overwrite of a bank alone still works
    replaced = build_bank(X, families.random_subsets(4, 5, seed=2), tmp_path / "nested-free.zarr", progress=False,
                          **LAYOUT)
    build_bank(X, specs, replaced.path, overwrite=True, progress=False, **LAYOUT)


# ---- secrets in the run folder's copy of the pipeline (item 7) -------------------------------------------
@pytest.mark.parametrize("spelling", [
    'secret_access_key = "S3CRETVALUE"',
    '"secret_access_key" = "S3CRETVALUE"',
    "'secret_access_key' = 'S3CRETVALUE'",
    'secret_access_key = """S3CRETVALUE"""',
    "secret_access_key = '''\nS3CRETVALUE'''",
])
def test_the_run_folders_copy_of_the_pipeline_never_holds_a_secret(spelling):
    import tomllib

    from mklscale.bank.storage.location import redact_toml

    text = f'# my pipeline\n[bank]\npath = "s3://b/x.zarr"\n[bank.storage_options]\n{spelling}\nregion = "r"\n'
    copy = redact_toml(text)
    assert "S3CRETVALUE" not in copy
    doc = tomllib.loads(copy)
    assert doc["bank"]["storage_options"] == {"secret_access_key": "<redacted>", "region": "r"}
    inline = 'x = 1\n[bank]\nstorage_options = { access_key_id = "AKIA1", "session_token" = """TOK""" }\n'
    assert "AKIA1" not in redact_toml(inline) and "TOK" not in redact_toml(inline)
    plain = "# kept as written\n[bank]\npath = \"b.zarr\"\n"
    assert redact_toml(plain) == plain


def test_a_build_stopped_while_waiting_for_another_writer_says_it_wrote_nothing(X, tmp_path):
    from mklscale.bank.storage.writer_lock import is_held
    from mklscale.cli import _saved_kernels

    bank = build_bank(X, families.random_subsets(4, 5, seed=1), tmp_path / "busy.zarr", progress=False, **LAYOUT)
    assert "5 of 5 kernels are saved" in _saved_kernels(bank.path)
    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from mklscale.bank.storage.writer_lock import bank_writer
        with bank_writer({str(bank.path)!r}, "build"):
            print("held", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        assert is_held(bank.path)
        said = _saved_kernels(bank.path)  # what a build stopped in its wait for that writer reports
        assert said.startswith(f"it was waiting for pid {other.pid} ") and "wrote nothing" in said
    finally:
        other.kill()
        other.wait()
    assert not is_held(bank.path) and "5 of 5 kernels are saved" in _saved_kernels(bank.path)


def test_an_interrupted_copy_to_s3_resumes_by_running_it_again(s3_bucket, X, tmp_path):
    src = build_bank(X, families.random_subsets(4, 5, seed=1), tmp_path / "src.zarr", progress=False, **LAYOUT)
    url = bank_location(f"s3://{s3_bucket}/copied-again/bank.zarr")
    ob = ObjectBank(url)
    ob.put(".mklscale-creating", b"")  # what a copy stopped mid-way leaves: the marker and some objects
    ob.put("checksum/zarr.json", b"{}")
    copy_bank(src.path, url)  # no --overwrite needed
    np.testing.assert_array_equal(KernelBank.open(url).checksums, src.checksums)
    assert not ob.exists(".mklscale-creating")
