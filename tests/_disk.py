"""Small real file systems for the full-disk and read-only tests: a tmpfs mounted for the duration of a
test (needs root and CAP_SYS_ADMIN; the test is skipped where mounting is not allowed), remounted with
other options, or filled to the last free page."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from pathlib import Path

import pytest

PAGE = 4096


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path`` for the duration (needs root and CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=False,
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to simulate a full or read-only disk: {r.stderr.strip() or r.returncode}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False, capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


def fill(mount: Path, leave_pages: int = 0) -> Path:
    """Write a file into ``mount`` until the file system is full, then give ``leave_pages`` pages back;
    returns the filler's path (delete it to free the space)."""
    keep = mount / ".reserve"
    keep.write_bytes(b"\0" * PAGE * leave_pages)
    filler = mount / "filler"
    with open(filler, "wb", buffering=0) as f:
        block = b"\0" * PAGE
        while True:
            try:
                f.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    keep.unlink()
    return filler
