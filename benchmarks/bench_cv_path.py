"""Cross-validation along a warm-started path against cold cross-validation, and against one fit.

    python benchmarks/bench_cv_path.py                       # additive, breast_cancer, ringnorm (n = 1000)
    python benchmarks/bench_cv_path.py --datasets additive --solvers spicy --repeats 1   # a smoke run

For each dataset (its default "auto" bank, built once in /tmp) and each solver, on one threaded Engine:

- **warm CV**: ``mklscale.solvers.cv.cross_validate``, what MKLClassifierCV / MKLRegressorCV and the pipelines
  run: 3 stratified folds, each a path over the solver's 10-value "auto" grid (``registry.fit_path``), every
  value starting from the previous solution;
- **cold CV**: the same folds and grid, every (value, fold) solved from the solver's usual start;
- **one fit**: a cold fit on all rows at the value the warm CV chose (what the CV estimators refit).

Before the timings, one untimed CV at the grid's first value loads each solver's compiled code, which the
first timed CV would otherwise pay alone (measured: 0.2 s of alignment's first fold on additive).

Recorded per pair: the seconds of each (median over ``--repeats`` rounds, the three run in turn A B C A B C
so that a change of load hits all three), warm CV / one fit (the issue's target: <= 3), cold / warm, the
seconds of the warm CV's solves up to the chosen value and past it (``CVScores.fit_seconds``), the
values each CV chose (equal unless two grid values tie within the folds' scores) and how many fold fits
ended unconverged. Results: benchmarks/results/bench_cv_path.json; the table is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, write_record  # noqa: E402

from mklscale import MKLClassifier, MKLRegressor  # noqa: E402
from mklscale.datasets import load  # noqa: E402
from mklscale.engine import Engine, RowSubsetEngine  # noqa: E402
from mklscale.solvers import cv, registry  # noqa: E402

SOLVERS = ("spicy", "pfbs", "smo", "citi", "gcd", "alignment")
FOLDS = 3


def bank_of(name: str, cache: Path):
    """(bank, y, task, classes) of the dataset's default "auto" bank, built by the estimators' cache."""
    kw = {"n_samples": 1000} if name in ("ringnorm", "twonorm", "waveform") else {}
    ds = load(name, standardise=False, **kw)
    task = "regression" if ds.task == "regression" else "classification"
    Estimator = MKLRegressor if task == "regression" else MKLClassifier
    est = Estimator(solver="uniform", cache_dir=cache).fit(ds.X, ds.y)
    from mklscale.bank import KernelBank

    classes = None if task == "regression" else np.unique(ds.y)
    return KernelBank.open(est.fit_stats_["bank"]), ds.y, task, classes


def cold_cv(solver, engine, y, task, grid, classes, fold):
    """Every (value, fold) fitted from the solver's own start; (scores (values, folds), unconverged)."""
    heads = cv.head_targets(y, classes) if classes is not None else [np.asarray(y, float)]
    scores = np.empty((len(grid), FOLDS))
    unconverged = 0
    for k in range(FOLDS):
        train, test = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        sub = RowSubsetEngine(engine, train)
        for i, value in enumerate(grid):
            f = np.empty((test.size, len(heads)))
            for h, target in enumerate(heads):
                result = registry.fit_solver(solver, sub, target[train], task, C=value)
                unconverged += not result.converged
                f[:, h] = cv.predict_rows(engine, result, train, test)
            scores[i, k] = cv.score(y[test], f, classes, cv.check_scoring(None, task))
    return scores, unconverged


def one_case(solver, engine, y, task, classes, repeats: int) -> dict:
    heads = cv.head_targets(y, classes) if classes is not None else [np.asarray(y, float)]
    reg = registry.regularisation(solver, task)
    grid, rule = reg.grid(engine, heads, task, {}, 10)
    fold = cv.fold_assignment(y, FOLDS, task == "classification", 0)
    times = {"warm_cv": [], "cold_cv": [], "one_fit": []}
    # untimed: the solver's and the views' code compiled or loaded from numba's cache, so that the first
    # timing (the warm CV's first fold) does not carry what the other two never pay
    cv.cross_validate(solver, engine, y, task, grid[:1], {}, classes, fold=fold)
    for _ in range(repeats):
        t0 = time.perf_counter()
        warm = cv.cross_validate(solver, engine, y, task, grid, {}, classes, fold=fold)
        times["warm_cv"].append(time.perf_counter() - t0)
        chosen_warm = grid[cv.best_index(warm.mean, grid, reg.larger_regularises)]
        t0 = time.perf_counter()
        cold_scores, cold_unconverged = cold_cv(solver, engine, y, task, grid, classes, fold)
        times["cold_cv"].append(time.perf_counter() - t0)
        chosen_cold = grid[cv.best_index(cold_scores.mean(axis=1), grid, reg.larger_regularises)]
        t0 = time.perf_counter()
        for target in heads:
            registry.fit_solver(solver, engine, target, task, C=chosen_warm)
        times["one_fit"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    to_choice, past_choice = split_at_choice(warm.fit_seconds, grid, chosen_warm, reg)
    return {"solver": solver, "grid": grid, "rule": rule, "seconds": times, "median": med,
            "warm_fit_seconds": [[None if t != t else t for t in row] for row in warm.fit_seconds.tolist()],
            "fits_to_choice_s": to_choice, "fits_past_choice_s": past_choice,
            "warm_over_one_fit": med["warm_cv"] / med["one_fit"], "cold_over_warm": med["cold_cv"] / med["warm_cv"],
            "chosen_warm": chosen_warm, "chosen_cold": chosen_cold, "warm_mean": warm.mean.tolist(),
            "cold_mean": cold_scores.mean(axis=1).tolist(), "warm_unconverged": int(warm.unconverged.sum()),
            "cold_unconverged": int(cold_unconverged)}


def split_at_choice(fit_seconds: np.ndarray, grid: list, chosen: float, reg) -> tuple[float, float]:
    """Seconds of the folds' solves (the last round's warm CV) along the path up to and including the
    chosen value, and past it: the values a path must solve after its best before it may stop."""
    order = [grid.index(v) for v in reg.order(grid)]
    cut = order.index(grid.index(chosen)) + 1
    return float(np.nansum(fit_seconds[order[:cut]])), float(np.nansum(fit_seconds[order[cut:]]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="additive,breast_cancer,ringnorm")
    ap.add_argument("--solvers", default=",".join(SOLVERS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bench_cv_path.json")
    ap.add_argument("--merge", action="store_true",
                    help="keep the cases of --out for the (dataset, solver) pairs this run does not redo")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mklscale-bench-cv-"))
    record = {"machine": describe_machine(workdir), "folds": FOLDS, "repeats": args.repeats, "datasets": []}
    for name in args.datasets.split(","):
        bank, y, task, classes = bank_of(name, workdir)
        entry = {"dataset": name, "n": bank.n, "M": len(bank), "task": task, "cases": []}
        with Engine(bank) as engine:
            for solver in args.solvers.split(","):
                if not registry.supports(solver, task):
                    continue
                case = one_case(solver, engine, y, task, classes, args.repeats)
                entry["cases"].append(case)
                m = case["median"]
                print(f"{name:14s} {solver:10s} warm CV {m['warm_cv']:7.2f} s  cold CV {m['cold_cv']:7.2f} s  "
                      f"one fit {m['one_fit']:6.2f} s  warm/one {case['warm_over_one_fit']:5.2f}  "
                      f"cold/warm {case['cold_over_warm']:5.2f}  C {case['chosen_warm']:.3g} / {case['chosen_cold']:.3g}",
                      flush=True)
        record["datasets"].append(entry)
    if args.merge and args.out.exists():
        _merge_earlier(record, json.loads(args.out.read_text()))
    write_record(record, args.out)


def _merge_earlier(record: dict, earlier: dict) -> None:
    """Add to ``record`` the cases of an earlier run for the (dataset, solver) pairs it did not redo, each
    marked with that run's date and load (``recorded``), in the earlier run's order."""
    done = {(e["dataset"], c["solver"]) for e in record["datasets"] for c in e["cases"]}
    stamp = {"date": earlier["machine"].get("date"), "load_average": earlier["machine"].get("load_average_at_record")}
    entries = {e["dataset"]: e for e in record["datasets"]}
    for old in earlier["datasets"]:
        kept = [dict(c, recorded=c.get("recorded", stamp)) for c in old["cases"] if (old["dataset"], c["solver"]) not in done]
        if old["dataset"] not in entries:
            entries[old["dataset"]] = dict(old, cases=[])
            record["datasets"].append(entries[old["dataset"]])
        entry = entries[old["dataset"]]
        order = [c["solver"] for c in old["cases"]]
        entry["cases"] = sorted(entry["cases"] + kept,
                                key=lambda c: order.index(c["solver"]) if c["solver"] in order else len(order))


if __name__ == "__main__":
    main()
