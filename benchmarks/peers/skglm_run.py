"""One skglm solve of SpicyMKL's group lasso (``skglm_group.py``) in a process of its own, so that the
benchmark can time it, follow its objective as it goes and stop it at a wall-clock cap.

    python -u skglm_run.py BANK Y.npy C LOSS TOL OUT.json

The child opens the bank, builds Phi (float64) from its float32 factors, compiles skglm's numba code on a
tiny problem, then prints ``START``, solves with ``verbose=2`` (skglm prints its objective P / n at every
outer iteration, every proximal Newton step (logistic) and every 10th epoch (square)), and
writes v, b's summary to OUT.json: the solve's seconds (timed here, from just before the solve to its
return, as in-process), P in our units, the active groups and the seconds spent building Phi. A parent that
stops the child at a cap reads the progress lines instead (``progress_objective``).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import skglm_group  # noqa: E402

#: skglm's verbose lines: "Iteration 3: 0.1234567890, stopping crit: ...", "PN iteration 2: 0.12...",
#: "Epoch 11, objective 0.12..."; group 1 is its objective P / n
_PROGRESS = re.compile(r"^(?:Iteration \d+:|PN iteration \d+:|Epoch \d+, objective) ([-+0-9.eE]+)")


def progress_objective(line: str, n: int) -> float | None:
    """P in our units from one of skglm's verbose lines (its objective times n), or None for other lines."""
    m = _PROGRESS.match(line.strip())
    return None if m is None else float(m.group(1)) * n


def main(bank_path: str, y_path: str, C: float, loss: str, tol: float, out: str) -> None:
    from mklscale.bank import KernelBank
    from mklscale.engine import Engine

    y = np.load(y_path)
    t0 = time.perf_counter()
    with Engine(KernelBank.open(bank_path)) as engine:
        design = skglm_group.group_design(engine.blocks(np.arange(engine.M), keep=False))
    design_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)  # compile skglm's numba code for this loss outside the timing
    skglm_group.solve(*skglm_group.group_design(rng.normal(size=(3, 40, 2))),
                      np.where(rng.normal(size=40) > 0, 1.0, -1.0), 1.0, loss, tol=1e-4)
    print("START", flush=True)
    t0 = time.perf_counter()
    v, b = skglm_group.solve(*design, y, C, loss, tol=tol, verbose=2)
    seconds = time.perf_counter() - t0
    Phi, ptr, _ = design
    Path(out).write_text(json.dumps({
        "seconds": seconds, "design_s": design_s, "active": skglm_group.active_groups(ptr, v),
        "objective": skglm_group.objective(Phi, ptr, v, b, y, C, loss)}))


if __name__ == "__main__":
    bank, y_file, c, loss_name, tolerance, out_file = sys.argv[1:7]
    main(bank, y_file, float(c), loss_name, float(tolerance), out_file)
