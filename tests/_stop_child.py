"""Child process of tests/test_stops.py: the real ``mklscale`` command, held at one phase for a signal.

Usage: python _stop_child.py PHASE ARGV... runs ``mklscale.cli.main(ARGV)`` with one hook: when the
command reaches PHASE it prints ``PAUSED PHASE`` on stdout and waits there (at most 60 s, then it
just goes on) for SIGINT/SIGTERM, so the test's signal lands inside that phase however loaded the
machine is. Waiting changes nothing the command computes. Phases:

- ``build``: in the bank build's driver, before it records the first finished shard;
- ``citi``: in Citi's second outer iteration (Citi keeps no checkpoint);
- ``sgd``: at SGD's second checkpoint step (a checkpointed solver: the signal is acted on there);
- ``uniform``: inside the uniform baseline, before its final fit;
- ``report``: when the report starts being written.
"""

from __future__ import annotations

import functools
import sys
import time

from threadpoolctl import threadpool_limits

from mklscale import cli
from mklscale.runtime import checkpoint

PAUSE_LIMIT_S = 60.0


def pause(phase: str) -> None:
    print(f"PAUSED {phase}", flush=True)
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while checkpoint.stop_requested() is None and time.monotonic() < deadline:
        time.sleep(0.01)   # a raising handler (runtime.interrupt) interrupts the sleep


def pausing(phase: str, function, on_call: int = 1):
    """``function`` with a pause before its ``on_call``-th call (once)."""
    calls = [0]

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == on_call:
            pause(phase)
        return function(*args, **kwargs)

    return wrapper


def install(phase: str) -> None:
    if phase == "build":
        from mklscale.bank import shards as build

        build._MetadataWriter.record = pausing(phase, build._MetadataWriter.record)
    elif phase == "citi":
        from mklscale.solvers import citi

        citi._all_quad_forms = pausing(phase, citi._all_quad_forms, on_call=2)
    elif phase == "sgd":
        checkpoint.Checkpoint.step = pausing(phase, checkpoint.Checkpoint.step, on_call=2)
    elif phase == "uniform":
        from mklscale.solvers import baselines

        baselines.uniform = pausing(phase, baselines.uniform)
    elif phase == "report":
        from mklscale import report

        report.write_report = pausing(phase, report.write_report)
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    threadpool_limits(1)
    install(sys.argv[1])
    sys.exit(cli.main(sys.argv[2:]))
