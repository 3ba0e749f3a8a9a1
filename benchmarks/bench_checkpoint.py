"""Checkpoint overhead and time to resume, on the 3000-kernel IDA benchmark (issue 9).

    python benchmarks/bench_checkpoint.py            # M = 3000, 5 interleaved repeats
    python benchmarks/bench_checkpoint.py --quick    # M = 300, 2 repeats

Protocol: the bench_spicy IDA setting (ringnorm, n = 200, Gaussian kernels on random feature
subsets, width 5 chi^2 + 0.1, unit trace, float32 bank on disk, relative gap 0.01) for SpicyMKL
(logistic and hinge, block 1-norm and elastic net) and SMO-MKL. Each fit runs three ways, the
repeats interleaved so load changes hit all three alike: no checkpoint; a checkpoint every 10 s
(the issue's setting: at these solve times it writes at most the final state of a preemption, so
it measures the cost of the per-iteration ``step`` call); a checkpoint after EVERY outer iteration
(the worst case: an atomic npz write + fsync per iteration). Overhead = median(with) / median(none) - 1.

Time to resume: a fit stopped by SIGTERM half-way through its outer iterations is resumed from
its checkpoint; "resume cost" = the resumed fit's time minus the time the uninterrupted fit spent
after that iteration (from its history): loading the file and re-reading the working-set kernels.
Results: benchmarks/results/bench_checkpoint.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.datasets import load  # noqa: E402
from mklscale.engine import Engine  # noqa: E402
from mklscale.runtime.checkpoint import Checkpoint, Preempted, StopAt, stop_on_signals  # noqa: E402
from mklscale.solvers import registry  # noqa: E402

SETTINGS = [
    ("spicy", 0.05, {"loss": "logistic", "penalty": "l1", "tol": 0.01}),
    ("spicy", 0.05, {"loss": "hinge", "penalty": "l1", "tol": 0.01}),
    ("spicy", 0.05, {"loss": "logistic", "penalty": "elastic_net", "lam": 0.5, "tol": 0.01}),
    ("smo", 10.0, {}),
]
MODES = {"none": None, "every_10s": {"every_s": 10.0}, "every_iteration": {"every_s": None, "every_iter": 1}}


def fit(engine, y, solver, C, params, checkpoint=None):
    t0 = time.perf_counter()
    res = registry.fit_solver(solver, engine, y, "classification", C=C, params=params, checkpoint=checkpoint)
    return res, time.perf_counter() - t0


def overhead(engine, y, solver, C, params, repeats, folder: Path) -> dict:
    fit(engine, y, solver, C, params)          # warm-up: numba compilation and the page cache
    times = {mode: [] for mode in MODES}
    writes = {}
    for r in range(repeats):
        for mode, kw in MODES.items():
            ck = None if kw is None else Checkpoint(folder / f"{mode}-{r}.npz", {"r": r}, **kw)
            _, seconds = fit(engine, y, solver, C, params, ck)
            times[mode].append(seconds)
            if ck is not None:
                writes[mode] = ck.writes
                ck.clear()
    med = {mode: statistics.median(t) for mode, t in times.items()}
    return {"seconds": med, "seconds_all": times, "checkpoint_writes": writes,
            "overhead": {mode: med[mode] / med["none"] - 1.0 for mode in MODES if mode != "none"}}


def resume_cost(engine, y, solver, C, params, folder: Path) -> dict:
    reference, total = fit(engine, y, solver, C, params)
    stop = max(1, len(reference.history) // 2)
    path = folder / "resume.npz"
    with stop_on_signals():
        try:
            fit(engine, y, solver, C, params, StopAt(path, {"case": solver}, every_s=None, stop_at=stop))
            return {"stop_at": stop, "note": "the fit ended before the stop iteration"}
        except Preempted:
            pass
    size = path.stat().st_size
    resumed, seconds = fit(engine, y, solver, C, params, Checkpoint(path, {"case": solver}, every_s=None))
    done_at_stop = reference.history[stop - 1]["seconds"] if stop >= 1 else 0.0
    path.unlink()
    return {"stop_at": stop, "outer_iterations": len(reference.history), "checkpoint_bytes": size,
            "resumed_seconds": seconds, "remaining_seconds_uninterrupted": total - done_at_stop,
            "resume_cost_seconds": seconds - (total - done_at_stop),
            "same_weights": bool((resumed.weights == reference.weights).all())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--M", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "mklscale-bench-ckpt")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bench_checkpoint.json")
    args = ap.parse_args()
    if args.quick:
        args.M, args.repeats, args.out = 300, 2, args.out.with_name("bench_checkpoint_quick.json")
    ds = load("ringnorm", n_samples=1200, seed=0)
    X, y = ds.X[:200], ds.y[:200]
    bank = build_bank(X, families.random_subsets(X.shape[1], args.M, seed=args.M), args.workdir / "bank",
                      progress=False, overwrite=True)
    rows = []
    with Engine(bank) as engine, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for solver, C, params in SETTINGS:
            row = {"solver": solver, "C": C, "params": params,
                   **overhead(engine, y, solver, C, params, args.repeats, Path(tmp)),
                   "resume": resume_cost(engine, y, solver, C, params, Path(tmp))}
            rows.append(row)
            print(f"{solver:5s} {json.dumps(params):60s} none {row['seconds']['none']:.3f} s  "
                  f"10s {row['overhead']['every_10s']:+.1%}  every-it {row['overhead']['every_iteration']:+.1%}  "
                  f"resume cost {row['resume'].get('resume_cost_seconds', float('nan')):.3f} s", flush=True)
    shutil.rmtree(args.workdir / "bank", ignore_errors=True)
    result = {"benchmark": "bench_checkpoint", "machine": describe_machine(args.workdir),
              "params": {"dataset": "ringnorm", "n_train": 200, "M": args.M, "repeats": args.repeats,
                         "kernels": "gaussian on random feature subsets, width 5 chi^2 + 0.1, unit trace, float32"},
              "rows": rows, "targets": {"overhead every_10s": 0.05}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
