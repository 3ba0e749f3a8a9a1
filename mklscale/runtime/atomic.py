"""Crash-safe replacement of folders on disk (model folders, reports) and folder fsync."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


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
