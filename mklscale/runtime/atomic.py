"""Crash-safe writes: files and folders (model folders, reports, predictions) are written under a
temporary sibling name, fsynced and renamed into place, so a path holds its old or its new complete
content, never a part; ``output_error`` turns the OSError of a failed write into a message saying what
to do."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from mklscale.errors import OutputWriteError


def fsync_dir(path: Path) -> None:
    """fsync a folder so a rename inside it is durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def swap_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished folder ``tmp`` to ``final``. An existing ``final`` is moved aside first,
    restored if the rename fails and removed after it succeeds, so ``final`` holds either the old or
    the new complete content, never a mixture."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    fsync_dir(final.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def write_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write the file ``path`` through ``write(fh)`` into a temporary sibling, fsync it and rename it over
    ``path``. On any failure (a full disk, an interrupt) the temporary file is removed, ``path`` is left
    as it was and the exception propagates."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def output_error(path: Path, exc: OSError, what: str) -> OutputWriteError:
    """The OutputWriteError for an OSError met writing ``what`` (e.g. "the model") to ``path``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "no space left on the device holding it: free some space or choose another path"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        reason = f"the folder is not writable ({exc.strerror}): choose a writable path"
    else:
        reason = f"{exc.strerror or exc}: choose another path"
    return OutputWriteError(f"cannot write {what} to {path}: {reason}, then run the same command again "
                            f"(nothing was written there; what was at {path} before is unchanged)")
