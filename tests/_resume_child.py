"""Child process of tests/test_resume.py: one solver fit with a checkpoint, stopped by SIGTERM.

Usage: python _resume_child.py '<json spec>' with keys bank, y (a .npy path), solver, task, C, params,
checkpoint, fingerprint, pause_at. The fit runs through ``registry.fit_solver`` inside
``stop_on_signals()`` and writes a checkpoint every iteration; ``Preempted`` exits with
EXIT_PREEMPTED (75), as the CLI does. So that the test's SIGTERM always lands before the solve ends
(the machine may be loaded), the checkpoint waits from iteration ``pause_at`` on until a stop is
requested (at most 60 s, then the fit just goes on). Waiting changes no number of the solve.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from mklscale.engine import Engine
from mklscale.runtime.checkpoint import (
    EXIT_PREEMPTED,
    Checkpoint,
    Preempted,
    stop_on_signals,
    stop_requested,
)
from mklscale.solvers import registry

PAUSE_LIMIT_S = 60.0


class PausingCheckpoint(Checkpoint):
    """A Checkpoint whose ``step`` waits for a stop request from iteration ``pause_at`` on (once)."""

    def __init__(self, *args, pause_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.pause_at, self.paused = pause_at, False

    def step(self, iteration, get_state):
        if iteration >= self.pause_at and not self.paused:
            self.paused = True
            deadline = time.monotonic() + PAUSE_LIMIT_S
            while stop_requested() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        super().step(iteration, get_state)


def main(spec: dict) -> int:
    threadpool_limits(1)      # as tests/conftest.py in the parent, so both compute the same bits
    engine = Engine(spec["bank"])
    y = np.load(spec["y"])
    checkpoint = PausingCheckpoint(spec["checkpoint"], spec["fingerprint"], every_s=None, every_iter=1,
                                   pause_at=spec["pause_at"])
    with stop_on_signals():
        try:
            registry.fit_solver(spec["solver"], engine, y, spec["task"], C=spec["C"], params=spec["params"],
                                checkpoint=checkpoint)
        except Preempted:
            return EXIT_PREEMPTED
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
