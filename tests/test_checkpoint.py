"""The checkpoint file: atomic writes, refusal of other problems' and damaged files, stop on signals."""

from __future__ import annotations

import errno
import os
import signal

import numpy as np
import pytest

from mklscale.runtime import checkpoint as ck


def _state(k: float) -> dict:
    return {"alpha": np.arange(5.0) * k, "gamma": 2.5 * k, "active": np.array([1, 3]), "label": "x"}


def test_save_load_round_trip_is_exact(tmp_path):
    c = ck.Checkpoint(tmp_path / "s.npz", {"solver": "spicy", "C": 0.1})
    assert c.load() is None
    state = _state(1 / 3)
    c.save(7, state)
    back = ck.Checkpoint(tmp_path / "s.npz", {"C": 0.1, "solver": "spicy"}).load()
    assert back["iteration"] == 7 and back["gamma"] == state["gamma"] and back["label"] == "x"
    np.testing.assert_array_equal(back["alpha"], state["alpha"])
    assert back["active"].dtype == np.int64
    assert [p.name for p in tmp_path.iterdir()] == ["s.npz"]


def test_other_problem_and_damaged_files_are_refused(tmp_path):
    path = tmp_path / "s.npz"
    ck.Checkpoint(path, {"C": 0.1}).save(1, _state(1))
    with pytest.raises(ck.CheckpointError, match="another problem .*differs in: C"):
        ck.Checkpoint(path, {"C": 0.2}).load()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ck.CheckpointError, match="unreadable.*delete it"):
        ck.Checkpoint(path, {"C": 0.1}).load()


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "s.npz"
    c = ck.Checkpoint(path, {"C": 0.1})
    c.save(1, _state(1))
    before = path.read_bytes()

    def full_disk(fh, **arrays):
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.np, "savez", full_disk)
    with pytest.raises(ck.CheckpointError, match="no space left.*previous checkpoint is intact"):
        c.save(2, _state(2))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.npz"]


def test_read_only_store_is_a_clear_error(tmp_path, monkeypatch):
    def read_only(fh, **arrays):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(ck.np, "savez", read_only)
    with pytest.raises(ck.CheckpointError, match="Read-only file system.*choose a writable run directory"):
        ck.Checkpoint(tmp_path / "s.npz", {}).save(1, _state(1))
    assert list(tmp_path.iterdir()) == []


def test_step_writes_when_due_and_on_signal(tmp_path):
    c = ck.Checkpoint(tmp_path / "s.npz", {}, every_s=None, every_iter=3)
    calls = []

    def state():
        calls.append(1)
        return _state(1)

    for it in range(1, 7):
        c.step(it, state)
    assert c.writes == 2 and len(calls) == 2          # at iterations 3 and 6
    before = signal.getsignal(signal.SIGTERM)
    with ck.stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(ck.Preempted, match="SIGTERM.*resume") as info:
            c.step(7, state)
    assert info.value.checkpoint == tmp_path / "s.npz"
    assert c.load()["iteration"] == 7
    assert signal.getsignal(signal.SIGTERM) is before
    assert ck.stop_requested() is None


def test_bad_schedule_values():
    with pytest.raises(Exception, match="every_s must be > 0"):
        ck.Checkpoint("x.npz", {}, every_s=0)
    with pytest.raises(Exception, match="every_iter must be a positive integer"):
        ck.Checkpoint("x.npz", {}, every_iter=0)
