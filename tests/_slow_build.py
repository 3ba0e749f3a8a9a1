"""A build in a child process slowed down enough to be stopped mid-build, and waiting for its progress
(the S3 tests that kill, pause or cut off a writer)."""

from __future__ import annotations

import textwrap
import time

from mklscale.bank import KernelBank
from mklscale.errors import NotABankError, ObjectStoreError


def slow_shard_writes(seconds: float) -> str:
    """Source lines for the head of a child script: every shard write of a build first waits ``seconds``
    and the build runs one thread, so shards land one at a time."""
    return textwrap.dedent(f"""
        import time as _time
        from mklscale.bank import shards as _build
        _write = _build._write_shard
        def _slow_write(*a, **k):
            _time.sleep({seconds!r}); _write(*a, **k)
        _build._write_shard = _slow_write
        _build.BUILD_THREADS = 1
    """)


def wait_for_kernels(location, k: int, proc, timeout: float = 120.0) -> int:
    """Poll the bank at ``location`` until it holds at least ``k`` complete kernels, ``proc`` (the
    writer) ends or ``timeout`` passes; the number of complete kernels last seen (0: no bank yet)."""
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            done = int(KernelBank.open(location).complete.sum())
        except (NotABankError, ObjectStoreError):
            done = 0
        if done >= k:
            break
        time.sleep(0.05)
    return done
