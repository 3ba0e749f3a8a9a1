"""One writer per bank: the exclusive lock every bank writer holds while it writes.

Builds (``build_bank``, ``KernelBank.from_arrays``), repairs and ``verify``'s marking of bad
kernels write a bank; each takes ``bank_writer(path, what)`` first. The lock is ``fcntl.flock``
on the file ``.<name>.lock`` beside the store (``lock_path``), so it outlives the store being
replaced (``overwrite``) and the estimators' bank cache (``cache_dir``) uses the very same file.
The holder writes its pid, host, what it does and since when into the file; a second writer
either waits, saying once on stderr who holds it, or (``wait=False``, or after ``wait`` seconds)
raises ``BankLockedError`` naming the holder. Readers take no lock.

The lock file stays beside the bank; where no bank is left at the path (no ``zarr.json``: a build
refused bad input, the bank cache evicted it) the holder removes it as it lets go, and a waiter whose file was removed
opens the new one (it checks that the file it locked is still the one at the path). The lock is
reentrant within a thread (a repair takes it, then its verify marks under it) and
excludes other threads of the same process as well as other processes: flock locks belong to an
open file, and every acquisition that is not a re-entry opens the file anew.

A lock dies with its holder (the kernel drops flock locks of a killed process), so a crashed
build never leaves a stale lock. On NFS (Linux clients since 2.6.12, NFSv4 or lockd) flock is
carried out as a whole-file POSIX lock that every client sees; on Lustre only when mounted with
``-o flock`` (``localflock`` locks each node separately). A file system that refuses locks raises
``BankLockedError`` saying so (cluster/README.md, "Concurrent use of a bank").
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mklscale.errors import BankLockedError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, writers are not serialised
    fcntl = None  # type: ignore[assignment]

#: seconds between tries while waiting for another writer
POLL_S = 0.1

_held: dict[str, tuple[int, int, int]] = {}  # lock file -> (owning thread, fd, depth)
_guard = threading.Lock()


def lock_path(bank_path: str | os.PathLike) -> Path:
    """The lock file of the bank at ``bank_path``: ``.<name>.lock`` in the same folder."""
    # the real path: a bank reached through a symlink (its name or a parent folder) has one lock,
    # whatever the name used
    path = Path(os.path.realpath(os.path.abspath(bank_path)))
    return path.parent / f".{path.name}.lock"


def holder(bank_path: str | os.PathLike) -> dict | None:
    """What the current holder wrote into the lock file ({pid, host, what, since}); None when
    nobody holds it or the file cannot be read."""
    try:
        text = lock_path(bank_path).read_text()
        info = json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_held(bank_path: str | os.PathLike) -> bool:
    """True when some open file holds the writer lock of the bank at ``bank_path`` now (a probe: a
    shared lock tried without waiting and let go at once)."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        fd = os.open(lock_path(bank_path), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # closing lets go of the probe's lock


def by_this_process(info: dict) -> bool:
    """Whether a writer lock's record ({pid, host, ...}: a folder's or an object store's) is this process's."""
    return info.get("pid") == os.getpid() and info.get("host") == platform.node()


def describe(info: dict | None) -> str:
    """'pid 123 on host node7 (build since 2026-...)' from ``holder``'s record."""
    if not info:
        return "another process (it wrote no details)"
    mine = " (this process)" if by_this_process(info) else ""
    return (f"pid {info.get('pid')} on host {info.get('host')}{mine} "
            f"({info.get('what', 'writing')} since {info.get('since', '?')})")


@contextmanager
def bank_writer(bank_path: str | os.PathLike, what: str, wait: bool | float = True) -> Iterator[None]:
    """Hold the exclusive writer lock of the bank at ``bank_path`` for the ``with`` block.

    ``what`` says what the holder does ("build", "repair", ...), for the messages of others.
    ``wait``: True waits as long as it takes (saying once on stderr who holds the lock), False
    raises ``BankLockedError`` at once when another writer holds it, a number waits that many
    seconds before raising. The folder holding the bank is created if missing.
    """
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = lock_path(bank_path)
    key = str(path)
    me = threading.get_ident()
    with _guard:
        if key in _held and _held[key][0] == me:
            owner, fd, depth = _held[key]
            _held[key] = (owner, fd, depth + 1)
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield
        finally:
            with _guard:
                owner, fd, depth = _held[key]
                _held[key] = (owner, fd, depth - 1)
        return
    fd = _lock(path, bank_path, what, wait)
    if fd is None:  # a read-only folder: no writer can run there
        yield
        return
    try:
        _write_record(fd, what)
        with _guard:
            _held[key] = (me, fd, 1)
        try:
            yield
        finally:
            with _guard:
                del _held[key]
            if not os.path.lexists(os.path.join(bank_path, "zarr.json")) and _same_file(fd, path):
                # no bank here (a build refused, an eviction): no lock file left beside nothing. Removed
                # while held, so a waiter finds its file gone and reopens (``_lock``)
                with contextlib.suppress(OSError):
                    path.unlink()
    finally:
        os.close(fd)  # closing the last descriptor of the open file releases the lock


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _lock(path: Path, bank_path, what: str, wait: bool | float) -> int | None:
    """An open descriptor of the lock file ``path``, holding its flock (None: read-only folder)."""
    deadline = None if wait is True else time.monotonic() + (0.0 if wait is False else float(wait))
    said = False
    while True:
        fd = _open(path)
        if fd is None:
            return None
        try:
            held, said = _wait_for(fd, path, bank_path, what, deadline, wait, said)
            if held and _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed that file as it let go: lock the new one


def _open(path: Path) -> int | None:
    """The lock file opened for flock; None when it can neither be created nor opened because
    the folder is read-only (then nobody can write the bank there, and the caller's own first
    write fails with ReadOnlyStoreError saying so). flock needs no write access: a lock file
    another user created is opened read-only."""
    flags = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BankLockedError(f"the lock file {path} is a symbolic link; mklscale does not follow it: remove "
                                  "it and run again") from None
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
    try:
        return os.open(path, os.O_RDONLY | flags)
    except OSError:
        return None


def _wait_for(fd: int, path: Path, bank_path, what: str, deadline: float | None, wait,
              said: bool) -> tuple[bool, bool]:
    """Take the flock of ``fd``, waiting until ``deadline`` (None: for ever); (held, whether the
    waiting message was printed). Not held: the file at ``path`` was replaced meanwhile."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True, said
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise BankLockedError(
                    f"the file system holding {path} refuses file locks ({exc.strerror or exc}), so mklscale cannot "
                    "make sure only one process writes the bank; on Lustre mount it with -o flock, on NFS enable "
                    "locking (NFSv4 or lockd), or put the bank on a local disk (cluster/README.md, \"Concurrent use "
                    "of a bank\")") from None
        if not _same_file(fd, path):
            return False, said
        info = holder(bank_path)
        if info is None:  # the holder may be writing its record right now
            time.sleep(POLL_S)
            info = holder(bank_path)
        who = describe(info)
        if deadline is not None and time.monotonic() >= deadline:
            waited = "" if wait is False else f" after waiting {float(wait):g} s"
            raise BankLockedError(f"bank {bank_path} is being written by {who}{waited}; only one process may "
                                  f"write a bank at a time ({what} refused): wait for it to finish and run again, "
                                  f"or stop it (its lock file: {path})")
        if not said:
            print(f"mklscale: bank {bank_path} is being written by {who}; {what} waits for it to finish "
                  "(Ctrl-C to stop waiting)", file=sys.stderr, flush=True)
            said = True
        time.sleep(POLL_S)


def _write_record(fd: int, what: str) -> None:
    record = {"pid": os.getpid(), "host": platform.node(), "what": what,
              "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except OSError:  # a full disk: the lock holds without its record
        pass


def held_here(bank_path: str | os.PathLike) -> bool:
    """True when this thread holds the writer lock of the bank at ``bank_path``."""
    with _guard:
        entry = _held.get(str(lock_path(bank_path)))
    return entry is not None and entry[0] == threading.get_ident()
