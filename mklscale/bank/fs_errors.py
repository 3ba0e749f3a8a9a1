"""Filesystem errors met writing a bank, turned into mklscale's errors with what to do about them.

A full disk becomes DiskFullError, a read-only or unwritable store ReadOnlyStoreError; both say
what to do, and that the kernels already finished are kept.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import NoReturn

from mklscale.errors import DiskFullError, ReadOnlyStoreError


def require_writable(path: Path) -> None:
    """Raise ReadOnlyStoreError unless files can be created in ``path`` (a read-only mount, or
    permissions): checked before any work, with a probe file, since root passes ``os.access``."""
    path = Path(path)
    try:
        fd, probe = tempfile.mkstemp(prefix=".mklscale-write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(disk_full_message(path)) from None
        raise ReadOnlyStoreError(
            f"cannot write to {path} ({exc.strerror or exc}): the store is read-only. Remount it read-write or "
            "fix its permissions, or copy the bank to a writable folder (or choose another output path) and run "
            "the command there") from None


def disk_full_message(path: Path) -> str:
    """What to say when the file system holding bank ``path`` is full."""
    return (f"no space left on the device holding {path}: free some space or choose another path (move the bank "
            "there first to keep its work); the kernels already finished are kept and marked complete, and running "
            "the same build (or repair) again resumes with the rest")


def raise_store_error(path: Path, exc: OSError) -> NoReturn:
    """Re-raise an OSError met writing bank ``path``: a full disk as DiskFullError, a read-only or
    unwritable one as ReadOnlyStoreError (messages say what to do); anything else unchanged."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(disk_full_message(path)) from exc
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        raise ReadOnlyStoreError(f"{path} is not writable ({exc.strerror}); remount it read-write or move the bank to "
                                 "a writable folder, then run the same command again (finished kernels are kept)") from exc
    raise exc
