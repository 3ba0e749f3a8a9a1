"""SpicyMKL's inner Newton back ends on dense banks (issue 17): old (dense Cholesky of the n x n
Newton matrix, n^3/3 flops a Newton step) versus new ("auto": Woodbury on pivoted Cholesky factors
when the active kernels' summed rank is at most min(n/2, 256), else Newton-CG on the formed matrix,
an inexact Newton step at O(n^2) a CG step), in the same run, interleaved.

    python benchmarks/bench_spicy_newton.py                  # n = 1000, 2000 (M = 100)
    python benchmarks/bench_spicy_newton.py --ns 1000 2000 4000

Protocol (bench_scaling.py's n-scaling item): ringnorm rows ``load("ringnorm", n_samples=n,
seed=0)``, Gaussian kernels on random feature subsets (``families.random_subsets(20, M, seed=0)``),
unit trace, float32 bank built with build_bank in a temporary directory, read by the embedded
Engine; SpicyMKL logistic, block-1, C = 0.05, tol 0.01 (bench_spicy.py). Per n: the fit time of
each back end (median of ``--repeats``, alternating old/new), the objective difference relative
to the old one, outer and Newton iterations. Results: benchmarks/results/bench_spicy_newton.json.
"""

from __future__ import annotations

import argparse
import json
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
from mklscale.solvers import spicy  # noqa: E402

BACKENDS = {"old": "cholesky", "new": "auto"}
SETTING = {"C": 0.05, "loss": "logistic", "penalty": "l1", "tol": 0.01}


def fit(engine, y, backend: str) -> dict:
    t0 = time.perf_counter()
    res = spicy.fit(engine, y, newton_solver=backend, **SETTING)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "objective": float(res.objective), "gap": float(res.gap),
            "converged": bool(res.converged), "outer": len(res.history), "active": int(res.active.size),
            "newton": int(sum(h["inner_iterations"] for h in res.history)),
            "working_set": int(res.history[-1]["working_set"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bench_spicy_newton.json")
    args = ap.parse_args()
    rows = []
    workdir = Path(tempfile.mkdtemp(prefix="bench_spicy_newton-"))
    try:
        for n in args.ns:
            ds = load("ringnorm", n_samples=n, seed=0)
            specs = families.random_subsets(ds.X.shape[1], args.M, seed=0)
            t0 = time.perf_counter()
            bank = build_bank(ds.X, specs, workdir / f"ringnorm-{n}", progress=False, overwrite=True)
            build_s = time.perf_counter() - t0
            runs = {name: [] for name in BACKENDS}
            with Engine(bank) as engine:
                for _ in range(args.repeats):
                    for name, backend in BACKENDS.items():       # interleaved: old, new, old, new, ...
                        runs[name].append(fit(engine, ds.y, backend))
                        r = runs[name][-1]
                        print(f"n={n:5d} {name}: {r['seconds']:8.2f} s  P={r['objective']:.10g}  gap={r['gap']:.2g}  "
                              f"outer={r['outer']}  newton={r['newton']}  active={r['active']}/{r['working_set']}",
                              flush=True)
            row = {"n": n, "M": args.M, "build_seconds": build_s}
            for name in BACKENDS:
                row[name] = {**runs[name][-1], "seconds": statistics.median(r["seconds"] for r in runs[name]),
                             "seconds_all": [r["seconds"] for r in runs[name]]}
            old, new = row["old"]["objective"], row["new"]["objective"]
            row["objective_rel_difference"] = abs(new - old) / max(abs(old), 1e-12)
            row["speedup"] = row["old"]["seconds"] / row["new"]["seconds"]
            rows.append(row)
            shutil.rmtree(workdir / f"ringnorm-{n}", ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {"benchmark": "bench_spicy_newton", "machine": describe_machine(Path(tempfile.gettempdir())),
              "params": {**SETTING, "M": args.M, "repeats": args.repeats, "backends": BACKENDS,
                         "kernels": "gaussian on random feature subsets (seed 0), unit trace, float32"},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
