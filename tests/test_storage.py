"""The storage conformance suite: every backend of ``mklscale.bank.storage`` (a folder, an S3 object
store on a real SeaweedFS server, a process's memory) keeps the same promises, and a bank built,
read, verified, damaged and copied through each gives the same results.

The S3 cases skip with the reason where the ``weed`` binary cannot start (conftest ``s3_server``).
"""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

import mklscale
from mklscale.bank import KernelBank
from mklscale.bank.storage import MemoryLocation, Storage, storage_for
from mklscale.bank.storage.memory import forget
from mklscale.bank.transfer import copy_bank
from mklscale.engine import Engine
from mklscale.errors import BankCorruptError, BankLockedError, NotABankError

BACKENDS = ["local", "s3", "memory"]
PACKAGE = Path(mklscale.__file__).parent
#: a test of which backend a location is (what only ``storage_for`` and the backends may ask)
DECIDES_THE_BACKEND = re.compile(r'isinstance\([^)]*(ObjectURL|MemoryLocation|LocalStorage|ObjectStorage)|'
                                 r'\.remote\b|is_url\(|"://" in|\.with_fence\(')


def test_no_module_outside_the_storage_package_decides_the_backend():
    hits = [f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
            for path in sorted(PACKAGE.rglob("*.py")) if "storage" not in path.relative_to(PACKAGE).parts
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if DECIDES_THE_BACKEND.search(line) and not line.strip().startswith("#")]
    assert not hits, "ask the bank's Storage (storage_for) instead:\n" + "\n".join(hits)


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path):
    """An empty bank location on one backend."""
    if request.param == "local":
        yield tmp_path / "bank.zarr"
    elif request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        yield f"s3://{bucket}/banks/bank.zarr"
    else:
        name = uuid.uuid4().hex
        yield MemoryLocation(name)
        forget(name)


@pytest.fixture(scope="module")
def grams():
    A = np.random.default_rng(3).standard_normal((7, 24, 5))
    return np.einsum("mik,mjk->mij", A, A)  # 7 PSD 24 x 24 Gram matrices


def _bank(grams, location) -> KernelBank:
    # 2 kernels per chunk, 4 per shard: two shards, the last one padded
    return KernelBank.from_arrays(grams, location, dtype="float64", chunk_mb=2 * 24 * 24 * 8 / 2**20,
                                  shard_mb=4 * 24 * 24 * 8 / 2**20)


# ---- the protocol ------------------------------------------------------------------------------
def test_objects_are_put_read_listed_and_deleted(location):
    st = storage_for(location)
    assert isinstance(st, Storage) and st.size("a/b") is None and st.open_range("a/b") is None
    assert st.read("a/b") is None
    data = np.arange(1000, dtype=np.uint8)
    st.put("a/b", data)
    assert st.size("a/b") == 1000 and np.array_equal(st.read("a/b"), data)
    assert ("a/b", 1000) in st.list()
    st.put("a/b", data[::-1].copy())  # replaced whole
    assert np.array_equal(st.read("a/b"), data[::-1])
    st.delete("a/b")
    st.delete("a/b")  # nothing there: no error
    assert st.size("a/b") is None and all(key != "a/b" for key, _ in st.list())


def test_ranges_are_read_into_buffers_with_or_without_a_prefetch_hint(location):
    st = storage_for(location)
    data = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)
    st.put("obj", data)
    source = st.open_range("obj")
    try:
        assert source.size == 5000
        out = np.empty(300, np.uint8)
        source.read_into(1234, out)
        assert np.array_equal(out, data[1234:1534])
        source.prefetch(1000, 4000)  # a hint: reads inside and outside it give the same bytes
        for offset in (1000, 2500, 3700, 4500, 0):
            source.read_into(offset, out)
            assert np.array_equal(out, data[offset:offset + 300]), offset
        with pytest.raises(BankCorruptError):
            source.read_into(4900, out)  # past the end
    finally:
        source.close()


def test_one_writer_at_a_time(location):
    st = storage_for(location)
    refused = []

    def second_writer():
        try:
            with storage_for(location).writer("second", wait=False):
                refused.append(False)
        except BankLockedError:
            refused.append(True)

    with st.writer("first", wait=False) as target:
        assert isinstance(target, Storage) and str(target) == str(st)
        assert st.other_writer() is None  # this process holds it
        with st.writer("re-entered", wait=False):  # re-entrant in the holding thread
            pass
        thread = threading.Thread(target=second_writer)
        thread.start()
        thread.join()
    assert refused == [True]
    with st.writer("after", wait=False):  # released
        pass


def test_an_empty_location_is_no_bank_and_foreign_objects_are_never_cleared(location, grams):
    st = storage_for(location)
    assert not st.is_bank() and st.open_group("r") is None
    with pytest.raises(NotABankError):
        st.open_bank_group("r")
    with st.writer("test") as target:
        assert target.prepare(False, None, KernelBank.open) == "create"
    st.put("notes.txt", np.frombuffer(b"a user's file", np.uint8))
    with pytest.raises(NotABankError, match="not an mklscale kernel bank"):
        with st.writer("test") as target:
            target.prepare(True, None, KernelBank.open)
    assert st.size("notes.txt") == 13


# ---- a bank on each backend --------------------------------------------------------------------
def test_a_bank_is_built_read_and_verified_alike_on_every_backend(location, grams):
    bank = _bank(grams, location)
    assert bank.n_shards == 2 and bank.complete.all() and KernelBank.is_bank(location)
    again = KernelBank.open(location)
    assert np.array_equal(again.kernels(range(7)), grams)
    u = np.random.default_rng(1).standard_normal(24)
    with Engine(again, threads=2) as engine:
        np.testing.assert_allclose(engine.quad_forms(u), np.einsum("i,mij,j->m", u, grams, u), rtol=1e-12)
    assert again.verify(progress=False).ok


def test_damaged_shard_bytes_are_found_on_every_backend(location, grams):
    bank = _bank(grams, location)
    key = bank.shard_key(1)
    data = bank.storage.read(key)
    data[100] ^= 0xFF  # a flipped byte of kernel 4 (the first of shard 1)
    bank.storage.put(key, data)
    with pytest.raises(BankCorruptError, match="kernel 4"):
        with Engine(KernelBank.open(location), threads=1) as engine:
            engine.quad_forms(np.ones(24))
    report = KernelBank.open(location).verify(progress=False, mark_bad=False)
    assert report.bad_indices == [4]
    bank.storage.delete(key)
    report = KernelBank.open(location).verify(progress=False, mark_bad=False)
    assert report.bad_indices == [4, 5, 6] and "is missing" in str(report)


def test_a_bank_copied_between_backends_is_the_same_bank(location, grams, tmp_path):
    source = _bank(grams, tmp_path / "source.zarr")
    assert copy_bank(source.path, location).ok
    memory = MemoryLocation(uuid.uuid4().hex)
    try:
        assert copy_bank(location, memory).ok  # and on, from this backend
        back = tmp_path / "back.zarr"
        assert copy_bank(memory, back).ok
    finally:
        forget(memory.name)
    assert np.array_equal(KernelBank.open(back).kernels(range(7)), source.kernels(range(7)))
    with pytest.raises(Exception, match="not empty"):
        copy_bank(source.path, location)  # no overwrite
