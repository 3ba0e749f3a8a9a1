"""Interleaved before/after timing of every solver's fit, in process, on one bank (issue 16).

    python benchmarks/ab_fits.py --before /tmp/before --after /tmp/after --rounds 6

The --quick benchmarks time fits of 0.05-2 s in spawned processes, and on this shared VM the
machine's speed drifts by tens of per cent from minute to minute, so a few rounds of them cannot
separate a 10% change from noise. Here each round runs one short process per version, back to back
(before, after, before, after, ...), each timing six fits of every solver on the same bank (ringnorm,
n = 200, M = 100 Gaussian kernels on random feature subsets, unit trace, float32; the IDA protocol of
bench_scaling at its smallest size) with the real engine on one thread, and keeps the median of the
last five. The result per solver is the median over rounds of the after/before ratio of a pair.

Results: benchmarks/results/ab_fits.json (rendered by make_readme.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: solver -> (task, parameters): the settings of bench_scaling.py
CASES = {"spicy": ("classification", {"C": 0.05, "tol": 1e-2}),
         "smo": ("classification", {"C": 100.0, "tol": 1e-4}),
         "citi": ("classification", {"C": 100.0, "eta": 0.5, "tol": 1e-4, "max_iter": 5000}),
         "pfbs": ("regression", {"tau": 0.01, "mu": 1e-3, "accelerated": True}),
         "sgd": ("regression", {"lam": 0.01, "T": 800, "seed": 0}),
         "gcd": ("regression", {"lam": 0.01, "max_iter": 100, "tol": 1e-3}),
         "uniform": ("classification", {"C": 100.0}),
         "alignment": ("classification", {"C": 100.0})}


def time_fits(bank_dir: str) -> dict:
    """{solver: median seconds of fits 2..6} in this process (the version on PYTHONPATH)."""
    from threadpoolctl import threadpool_limits

    from mklscale.bank import build_bank, families
    from mklscale.datasets import load
    from mklscale.engine import Engine
    from mklscale.solvers import registry

    ds = load("ringnorm", n_samples=200, seed=0)
    bank = build_bank(ds.X, families.random_subsets(20, 100, seed=0), bank_dir, normalize="trace")
    out = {}
    with threadpool_limits(1):
        for name, (task, params) in CASES.items():
            if name == "citi" and "citi" not in registry.names():
                name_here = "elasticnet"     # the registry name before issue 16
            else:
                name_here = name
            times = []
            for _ in range(6):
                with Engine(bank, threads=1) as engine:
                    p = dict(params)
                    C = p.pop("C", None)
                    t0 = time.perf_counter()
                    registry.fit_solver(name_here, engine, ds.y.astype(float), task, C=C, params=p)
                    times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times[1:])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before")
    ap.add_argument("--after")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "ab_fits.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(time_fits(args.worker)))
        return 0
    sys.path.insert(0, str(HERE))
    from compare_versions import git_commit
    from machine import describe_machine

    trees = {"before": args.before, "after": args.after}
    work = Path(tempfile.mkdtemp(prefix="mklscale-ab-"))
    rounds = []
    t0 = time.perf_counter()
    for r in range(args.rounds):
        entry = {"round": r}
        for version, tree in trees.items():
            load = os.getloadavg()[0]
            proc = subprocess.run([sys.executable, __file__, "--worker", str(work / f"bank-{version}")],
                                  env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True, check=True)
            entry[version] = json.loads(proc.stdout.strip().splitlines()[-1])
            entry[f"load_{version}"] = round(load, 2)
        rounds.append(entry)
        print(f"round {r}: " + ", ".join(f"{s} {entry['after'][s] / entry['before'][s]:.2f}" for s in CASES), flush=True)
    commits = {v: git_commit(t) for v, t in trees.items()}
    solvers = []
    for s in CASES:
        ratios = [e["after"][s] / e["before"][s] for e in rounds]
        solvers.append({"solver": s, "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                        "max_ratio": max(ratios), "before_s": statistics.median(e["before"][s] for e in rounds),
                        "after_s": statistics.median(e["after"][s] for e in rounds)})
    result = {"benchmark": "ab_fits", "machine": describe_machine(), "commits": commits, "rounds": rounds,
              "solvers": solvers, "total_seconds": time.perf_counter() - t0,
              "command": "python benchmarks/ab_fits.py " + " ".join(argv or sys.argv[1:])}
    args.out.write_text(json.dumps(result, indent=1))
    for row in solvers:
        print(f"{row['solver']:10s} after/before {row['median_ratio']:.2f} ({row['min_ratio']:.2f}-{row['max_ratio']:.2f})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
