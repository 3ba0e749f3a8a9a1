"""Every solver at its defaults on every shipped dataset: does it converge, how long does a fit take?

    python benchmarks/bench_defaults.py                      # all solvers x all datasets, 3 fits each
    python benchmarks/bench_defaults.py --datasets wine --repeats 1

The estimators at their defaults (``kernels="auto"``, ``C="auto"``, every solver parameter at its default)
on a stratified 75 % of each dataset (breast_cancer, wine, digits, iris, diabetes; ringnorm, twonorm and
waveform at n = 1000). The bank is built once per dataset (the first, untimed fit) and reused from the
estimators' cache, so the figure is the fit a user repeats: the solve (all heads) and the model, median of
``--repeats``. Recorded: seconds, whether the fit converged (no ConvergenceWarning), the value "auto" stood
for (``C_``), kept kernels, and the held-out score beside the majority rate or the mean predictor's R^2 = 0.
The issue's target: every fit converged and under 10 s on this 2-core machine. Results:
benchmarks/results/bench_defaults.json; the table is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, write_record  # noqa: E402

from mklscale import MKLClassifier, MKLRegressor  # noqa: E402
from mklscale.datasets import load  # noqa: E402
from mklscale.solvers import registry  # noqa: E402

DATASETS = ("breast_cancer", "wine", "digits", "iris", "diabetes", "ringnorm", "twonorm", "waveform")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--solvers", default=",".join(registry.names()))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bench_defaults.json")
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="mklscale-bench-defaults-"))
    record = {"machine": describe_machine(cache), "repeats": args.repeats, "fits": []}
    for name in args.datasets.split(","):
        kw = {"n_samples": 1000} if name in ("ringnorm", "twonorm", "waveform") else {}
        ds = load(name, standardise=False, **kw)
        task = "regression" if ds.task == "regression" else "classification"
        X_tr, X_te, y_tr, y_te = train_test_split(ds.X, ds.y, test_size=0.25, random_state=0,
                                                  stratify=ds.y if task == "classification" else None)
        Estimator = MKLRegressor if task == "regression" else MKLClassifier
        t0 = time.perf_counter()
        Estimator(solver="uniform", cache_dir=cache).fit(X_tr, y_tr)          # builds the bank once
        build = time.perf_counter() - t0
        null = 0.0 if task == "regression" else float(np.max(np.unique(y_te, return_counts=True)[1]) / y_te.size)
        for solver in args.solvers.split(","):
            if not registry.supports(solver, task):
                continue
            seconds, converged = [], True
            for _ in range(args.repeats):
                est = Estimator(solver=solver, random_state=0, cache_dir=cache)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", ConvergenceWarning)
                    t0 = time.perf_counter()
                    est.fit(X_tr, y_tr)
                    seconds.append(time.perf_counter() - t0)
                converged &= not any(issubclass(w.category, ConvergenceWarning) for w in caught)
            row = {"dataset": name, "task": task, "n_train": int(y_tr.size), "M": est.fit_stats_["n_kernels"],
                   "solver": solver, "seconds": seconds, "median_seconds": statistics.median(seconds),
                   "converged": bool(converged), "C": float(est.C_), "kept": len(est.selected_kernels_),
                   "test_score": float(est.score(X_te, y_te)), "null_score": null, "bank_build_seconds": build}
            record["fits"].append(row)
            print(f"{name:14s} {solver:10s} {row['median_seconds']:7.2f} s  converged {converged!s:5s}  "
                  f"C {row['C']:<10.4g} kept {row['kept']:3d}/{row['M']}  test {row['test_score']:.4f} "
                  f"(null {null:.4f})", flush=True)
    write_record(record, args.out)


if __name__ == "__main__":
    main()
