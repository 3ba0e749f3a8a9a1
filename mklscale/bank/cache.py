"""The estimators' bank cache: banks kept for reuse by later fits, under a size cap.

Folder (``$MKLSCALE_CACHE`` or ``~/.cache/mklscale/banks``), per bank NAME (``bank-`` and 24 hex
digits of the key the estimators hash from the data and kernel settings):

    NAME/                    the bank (a zarr group; ``.NAME.partial-*`` while it is being created)
    .NAME.lock               build lock: the bank's writer lock (``writer_lock``), held while a fit
                             builds or checks the bank and while an eviction removes it
    .NAME.use                use lock: shared by every fit using the bank, from its build to its end

A bank's last use is its folder's modification time, set when a fit takes it (:func:`touch`).

The cap ``$MKLSCALE_CACHE_MAX`` (default 2GB; "none" for no cap) is a hard limit on a new bank: a fit
whose bank would be larger is refused before anything is written (``size.check_fits``, which also
checks the free space of the cache's disk; a bank already complete in the cache is reused whatever
its size). After each fit takes its bank, :func:`evict` removes the least recently used other banks
until the cache is no larger than the cap. A bank is removed only while its build lock and its use
lock are both held here, taken without waiting: a bank another process is building or fitting on is
never removed.
The use lock files stay: deleting a lock file another process holds open would let a third
process lock a new file of the same name, and both would think they hold the lock (the writer
lock removes its file only while holding it, and its takers check they locked the file still there).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mklscale.bank.storage.local import disk_usage
from mklscale.bank.storage.writer_lock import bank_writer
from mklscale.errors import BankLockedError, InvalidInputError

#: the cap when ``$MKLSCALE_CACHE_MAX`` is not set
DEFAULT_MAX = "2GB"
#: the cache's bank folders; nothing else in the folder is counted or removed
BANK_NAME = re.compile(r"bank-[0-9a-f]{24}")


def default_dir() -> Path:
    """``$MKLSCALE_CACHE`` or ``~/.cache/mklscale/banks``."""
    env = os.environ.get("MKLSCALE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mklscale" / "banks"


def max_bytes() -> int | None:
    """The cap from ``$MKLSCALE_CACHE_MAX`` (default 2GB): bytes as dask writes them ("2GB", "500 MB",
    "3GiB", "1e9"), or "none" for no cap (None)."""
    from dask.utils import parse_bytes

    text = max_setting()
    if text.lower() in ("none", "unlimited"):
        return None
    try:
        value = parse_bytes(text)
    except (ValueError, TypeError):
        value = -1
    if value < 0:
        raise InvalidInputError(f"MKLSCALE_CACHE_MAX={text!r} is not a size; set it to a size such as 2GB or 500MB, "
                                "or to none for no cap")
    return int(value)


def max_setting() -> str:
    """``$MKLSCALE_CACHE_MAX`` as set (the default when unset), for messages."""
    return os.environ.get("MKLSCALE_CACHE_MAX", DEFAULT_MAX).strip()


def name_for(key: str) -> str:
    """The folder name of the bank with the estimators' hex ``key``."""
    return f"bank-{key[:24]}"


def _use_lock(cache: Path, name: str) -> Path:
    return Path(cache) / f".{name}.use"


@dataclass(frozen=True)
class CachedBank:
    path: Path
    nbytes: int        # on disk, with any unfinished ``.NAME.partial-*`` folder
    last_used: float   # seconds since the epoch


def banks(cache: Path) -> list[CachedBank]:
    """The banks in ``cache``, least recently used first."""
    cache = Path(cache)
    if not cache.is_dir():
        return []
    found = []
    for entry in os.scandir(cache):
        if BANK_NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile by another process
                size = disk_usage(Path(entry.path)) + sum(disk_usage(p) for p in cache.glob(f".{entry.name}.partial-*"))
                found.append(CachedBank(Path(entry.path), size, entry.stat(follow_symlinks=False).st_mtime))
    return sorted(found, key=lambda b: (b.last_used, b.path.name))


def info(cache: Path) -> dict:
    """{"path", "bytes" (every bank), "n_banks", "max_bytes" (None: no cap)}."""
    found = banks(cache)
    return {"path": str(cache), "bytes": sum(b.nbytes for b in found), "n_banks": len(found), "max_bytes": max_bytes()}


@contextlib.contextmanager
def using(cache: Path, name: str) -> Iterator[None]:
    """Mark bank ``name`` as in use (its shared use lock) for the duration: :func:`evict` and
    :func:`clear` leave it alone. Waits only while an eviction is removing this very bank."""
    with _locked(_use_lock(cache, name), shared=True, wait=True):
        yield


def touch(path: Path) -> None:
    """Record that the bank at ``path`` was used now."""
    with contextlib.suppress(OSError):
        os.utime(path)


def evict(cache: Path, keep: Path | None = None, limit: int | None = -1) -> list[Path]:
    """Remove the least recently used banks not in use, except ``keep``, until ``cache`` holds at most
    ``limit`` bytes (-1: :func:`max_bytes`; None: no cap, nothing is removed). Returns the removed banks."""
    limit = max_bytes() if limit == -1 else limit
    if limit is None:
        return []
    found = banks(cache)
    total = sum(b.nbytes for b in found)
    removed = []
    for bank in found:
        if total <= limit:
            break
        if keep is not None and bank.path == Path(keep):
            continue
        if _remove_if_unused(Path(cache), bank.path):
            total -= bank.nbytes
            removed.append(bank.path)
    return removed


def clear(cache: Path) -> tuple[list[CachedBank], list[CachedBank]]:
    """Remove every bank not in use: (removed, left in place because a fit is using or building it)."""
    removed, busy = [], []
    for bank in banks(cache):
        (removed if _remove_if_unused(Path(cache), bank.path) else busy).append(bank)
    return removed, busy


def _remove_if_unused(cache: Path, path: Path) -> bool:
    """Remove the bank at ``path`` if its use and build locks can both be taken now; whether it was."""
    name = path.name
    with _locked(_use_lock(cache, name), shared=False, wait=False) as unused:
        if not unused:
            return False
        try:
            with bank_writer(path, "eviction from the bank cache", wait=False):  # the build lock
                for partial in cache.glob(f".{name}.partial-*"):
                    shutil.rmtree(partial, ignore_errors=True)
                shutil.rmtree(path, ignore_errors=True)
                return not path.exists()
        except BankLockedError:  # a fit is building or checking it
            return False


@contextlib.contextmanager
def _locked(path: Path, shared: bool, wait: bool) -> Iterator[bool]:
    """flock ``path`` (shared or exclusive; without waiting unless ``wait``): yields whether it is held.
    Without flock (not POSIX) nothing can be known about other processes: a lock that would wait is
    taken as held, one that must not wait as not (so nothing is ever removed there)."""
    try:
        import fcntl
    except ImportError:
        yield wait
        return
    with open(path, "a") as f:
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(f, flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
