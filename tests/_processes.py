"""Stopping the subprocesses a test started (dask schedulers and workers)."""

from __future__ import annotations

import subprocess


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate processes and wait for them; kill what does not exit within 10 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
