"""Solver checkpoints: atomic state files, and a clean stop on SIGTERM / SIGINT (preemption, walltime).

A solver that supports checkpoints takes ``checkpoint=Checkpoint(path, ...)`` and, once per outer
iteration (a point where its whole state is a few arrays and scalars), calls
``checkpoint.step(iteration, get_state)``:

- if SIGTERM or SIGINT arrived since the last step (inside :func:`stop_on_signals`), the state is
  written and :class:`Preempted` is raised; the CLI turns it into exit code
  :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL``: "try again later"), which batch scripts requeue on;
- otherwise the state is written when ``every_s`` seconds or ``every_iter`` iterations have passed.

On start the solver calls ``checkpoint.load()`` and continues from the returned state (or starts
fresh on None). Deterministic solvers resume bit-identically: the state holds everything the next
iteration reads.

The file is ``<path>`` (an ``.npz`` with ``allow_pickle=False``: arrays, plus the scalars and the
fingerprint as one JSON string). Writes go to a temporary file in the same folder, are fsynced and
renamed over the old file, then the folder is fsynced: a crash, a kill or a full disk at any moment
leaves either the previous checkpoint or the new one, never a mix. A checkpoint written for another
problem (other solver, parameters, bank or targets: the ``fingerprint``) is refused, not resumed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mklscale.errors import CheckpointError, InvalidInputError, Preempted
from mklscale.runtime.atomic import write_file

EXIT_PREEMPTED = 75
#: a checkpoint's temp file untouched this long belongs to a writer that was killed
STALE_TEMP_S = 300.0
FORMAT_VERSION = 1
_META = "__meta__"

_stop_signal: int | None = None


@contextlib.contextmanager
def stop_on_signals(signums=(signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Within the block, SIGTERM/SIGINT set a flag that the next ``Checkpoint.step`` acts on.

    Only the main thread can install handlers; elsewhere this is a no-op (signals keep their
    default action). Previous handlers are restored on exit; a signal caught after the last step
    (the block ended without a step acting on it) is then raised again for the handler outside.
    """
    global _stop_signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        global _stop_signal
        _stop_signal = signum

    previous = {s: signal.signal(s, handler) for s in signums}
    _stop_signal = None
    try:
        yield
    finally:
        pending = _stop_signal
        for s, h in previous.items():
            signal.signal(s, h)
        _stop_signal = None
    if pending is not None:  # caught after the last step: hand it to the handler outside the block
        signal.raise_signal(pending)


def stop_requested() -> int | None:
    """The signal number caught by :func:`stop_on_signals`, or None."""
    return _stop_signal


class Checkpoint:
    """One solver's checkpoint file (see the module docstring).

    path : the .npz file. every_s / every_iter : write when this many seconds / iterations passed
    since the last write (None: never on that criterion; SIGTERM always writes). fingerprint : a
    JSON-safe dict describing the problem (solver, parameters, bank, targets); ``load`` refuses a
    file with another fingerprint.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict, every_s: float | None = 60.0,
                 every_iter: int | None = None):
        if every_s is not None and not every_s > 0:
            raise InvalidInputError(f"checkpoint every_s must be > 0 or None, got {every_s!r}")
        if every_iter is not None and (not isinstance(every_iter, int) or every_iter < 1):
            raise InvalidInputError(f"checkpoint every_iter must be a positive integer or None, got {every_iter!r}")
        self.path = Path(path)
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True))
        self.every_s, self.every_iter = every_s, every_iter
        self._last_time, self._last_iter = time.monotonic(), 0
        self.writes = 0

    # ---- reading ------------------------------------------------------------------------------
    def load(self) -> dict | None:
        """The saved state (arrays as numpy, scalars as JSON values) or None when there is no file."""
        if not self.path.exists():
            return None
        try:
            with np.load(self.path, allow_pickle=False) as data:
                meta = json.loads(str(data[_META]))
                arrays = {k: data[k] for k in data.files if k != _META}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is unreadable ({exc}); delete it to start over") from None
        if meta.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {self.path} has format {meta.get('format')!r}, this mklscale reads "
                                  f"{FORMAT_VERSION}; finish the run with the mklscale that wrote it or delete it")
        if meta["fingerprint"] != self.fingerprint:
            diff = sorted(k for k in set(meta["fingerprint"]) | set(self.fingerprint)
                          if meta["fingerprint"].get(k) != self.fingerprint.get(k))
            raise CheckpointError(f"checkpoint {self.path} belongs to another problem (differs in: "
                                  f"{', '.join(diff)}); delete it or use another run directory")
        self._last_iter = int(meta["iteration"])
        return {**meta["scalars"], **arrays, "iteration": int(meta["iteration"])}

    # ---- writing ------------------------------------------------------------------------------
    def step(self, iteration: int, get_state: Callable[[], dict]) -> None:
        """Called once per outer iteration: save on a caught signal (then raise Preempted) or when due."""
        global _stop_signal
        signum = stop_requested()
        if signum is not None:
            self.save(iteration, get_state())
            _stop_signal = None  # acted on
            raise Preempted(signum, self.path)
        due_time = self.every_s is not None and time.monotonic() - self._last_time >= self.every_s
        due_iter = self.every_iter is not None and iteration - self._last_iter >= self.every_iter
        if due_time or due_iter:
            self.save(iteration, get_state())

    def save(self, iteration: int, state: dict[str, Any]) -> None:
        """Write ``state`` atomically (arrays -> npz members, everything else -> JSON scalars)."""
        arrays = {k: np.asarray(v) for k, v in state.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in state.items() if not isinstance(v, np.ndarray)}
        meta = {"format": FORMAT_VERSION, "iteration": int(iteration), "fingerprint": self.fingerprint,
                "scalars": scalars, "saved": time.time()}
        try:
            meta_json = json.dumps(meta, allow_nan=True)
        except TypeError as exc:
            raise CheckpointError(f"solver state is not JSON-serialisable: {exc}") from None
        write_atomic(self.path, lambda fh: np.savez(fh, **arrays, **{_META: np.array(meta_json)}))
        self._last_time, self._last_iter = time.monotonic(), int(iteration)
        self.writes += 1

    def clear(self) -> None:
        """Remove the file (after a solve finished and its result is stored)."""
        self.path.unlink(missing_ok=True)


class StopAt(Checkpoint):
    """A Checkpoint that sends SIGTERM to this process when ``step`` reaches iteration ``stop_at``:
    a preemption on cue, for tests and benchmarks of resume (use inside :func:`stop_on_signals`)."""

    def __init__(self, *args, stop_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_at = stop_at

    def step(self, iteration: int, get_state: Callable[[], dict]) -> None:
        if iteration == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        super().step(iteration, get_state)


def write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    """Write a file through ``write(fh)`` to a temp file beside ``path``, fsync, rename, fsync the folder.

    A failure (ENOSPC, EROFS, a crash) leaves the previous file untouched and no temp file behind.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(_os_message(path, exc)) from None
    _sweep_temp_files(path)
    try:
        write_file(path, write)
    except OSError as exc:
        raise CheckpointError(_os_message(path, exc)) from None


def _sweep_temp_files(path: Path) -> None:
    """Remove the temp files of ``path`` that writers killed mid-write left behind (SIGKILL, a lost
    node): those untouched for :data:`STALE_TEMP_S` seconds (a live writer keeps its file's mtime
    fresh as it writes)."""
    now = time.time()
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime > STALE_TEMP_S:
                tmp.unlink()


def _os_message(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device holding {path}; free space and resume (the previous checkpoint is intact)"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {path} ({exc.strerror}); choose a writable run directory"
    return f"cannot write {path}: {exc}"
