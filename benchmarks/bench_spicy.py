"""SpicyMKL on the IDA protocol (SpicyMKL §6.2): time, passes, active kernels, accuracy versus M.

    python benchmarks/bench_spicy.py            # ringnorm and twonorm, M = 50 ... 10000
    python benchmarks/bench_spicy.py --quick    # M = 50, 300 on ringnorm only
    python benchmarks/bench_spicy.py --uci      # the UCI protocol on breast_cancer (Table 4 comparison)
    python benchmarks/bench_spicy.py --out-of-core /tmp/mklscale-bench/big   # the engine benchmark's
        larger-than-memory ringnorm bank (built by bench_pass.py --big): time, passes, peak memory

Protocol: n = 200 training points and 1000 test points drawn from the seeded generator; Gaussian
kernels on random feature subsets with widths 5 chi^2 + 0.1 (``families.random_subsets``), unit
trace, float32 bank on disk; stopping at relative duality gap 0.01 (the paper's setting). Each fit
runs on the embedded engine (threads in this process) over the on-disk bank; the time is the
solver's wall time only (bank build reported separately). Test accuracy uses cross kernels
computed for the active kernels only. Results: benchmarks/results/bench_spicy.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.datasets import load  # noqa: E402
from mklscale.engine import Engine  # noqa: E402
from mklscale.solvers import spicy  # noqa: E402

SETTINGS = [
    {"loss": "logistic", "penalty": "l1"},
    {"loss": "hinge", "penalty": "l1"},
    {"loss": "logistic", "penalty": "elastic_net", "lam": 0.5},
    {"loss": "hinge", "penalty": "elastic_net", "lam": 0.5},
]


def run_one(engine, bank, y, X_test, y_test, C: float, setting: dict, repeats: int) -> dict:
    times, res = [], None
    for _ in range(repeats):
        p0, b0 = engine.stats["passes"], engine.stats["bytes_read"]
        t0 = time.perf_counter()
        res = spicy.fit(engine, y, C, tol=0.01, **setting)
        times.append(time.perf_counter() - t0)
        passes, bytes_read = engine.stats["passes"] - p0, engine.stats["bytes_read"] - b0
    active = np.asarray(res.active)
    Kc = bank.cross(X_test, kernels=active)
    acc = float(np.mean(np.sign(res.decision_function_from_kernels(Kc)) == y_test))
    return {
        **setting, "C": C, "seconds": statistics.median(times), "seconds_all": times,
        "passes": int(passes), "bytes_read": int(bytes_read), "outer_iterations": len(res.history),
        "active": int(active.size), "test_accuracy": acc, "gap": float(res.gap),
        "converged": bool(res.converged), "objective": float(res.objective),
    }


#: SpicyMKL Table 4: average outer iterations over the five UCI sets, per loss and C.
TABLE4_OUTER_RANGE = {("hinge", 0.005): (22.6, 38.0), ("hinge", 0.05): (13.2, 18.3), ("hinge", 0.5): (6.0, 7.9),
                      ("logistic", 0.005): (20.1, 27.2), ("logistic", 0.05): (13.9, 17.1), ("logistic", 0.5): (2.0, 5.4)}


def uci_protocol(workdir: Path, seed: int = 0) -> dict:
    """SpicyMKL §6.1 on breast_cancer: the 27 (d + 1) SimpleMKL bank, unit trace, an 80/20 split,
    C in {0.005, 0.05, 0.5}, hinge and logistic, block 1-norm, relative gap 0.01."""
    ds = load("breast_cancer")
    order = np.random.default_rng(seed).permutation(len(ds.y))
    n_train = int(round(0.8 * len(order)))
    tr, te = order[:n_train], order[n_train:]
    specs = families.simplemkl(ds.X.shape[1])
    bank = build_bank(ds.X[tr], specs, workdir / "uci-breast_cancer", progress=False, overwrite=True)
    rows = []
    with Engine(bank) as engine:
        for loss in ("hinge", "logistic"):
            for C in (0.005, 0.05, 0.5):
                p0, t0 = engine.stats["passes"], time.perf_counter()
                res = spicy.fit(engine, ds.y[tr], C, loss=loss, penalty="l1", tol=0.01)
                seconds = time.perf_counter() - t0
                Kc = bank.cross(ds.X[te], kernels=res.active)
                acc = float(np.mean(np.sign(res.decision_function_from_kernels(Kc)) == ds.y[te]))
                rows.append({"loss": loss, "C": C, "seconds": seconds, "outer_iterations": len(res.history),
                             "passes": engine.stats["passes"] - p0, "active": int(len(res.active)),
                             "test_accuracy": acc, "gap": float(res.gap), "converged": bool(res.converged),
                             "paper_table4_outer_range_uci": TABLE4_OUTER_RANGE[(loss, C)]})
    return {"dataset": "breast_cancer", "M": len(bank), "n_train": len(tr), "n_test": len(te), "rows": rows}


def out_of_core(path: Path, C: float) -> dict:
    """One SpicyMKL fit (logistic, block-1) over a bank larger than memory, with peak RSS of all
    processes sampled every 20 ms (bench_pass.PeakRSS)."""
    from bench_pass import PeakRSS

    from mklscale.bank import KernelBank

    bank = KernelBank.open(path)
    y = load("ringnorm", n_samples=bank.n, seed=0).y  # the labels of the rows the bank was built on
    rows = []
    for setting in SETTINGS[:2]:
        with Engine(bank) as engine, PeakRSS() as rss:
            t0 = time.perf_counter()
            res = spicy.fit(engine, y, C, tol=0.01, **setting)
            seconds = time.perf_counter() - t0
            stats = engine.stats
        rows.append({**setting, "C": C, "seconds": seconds, "passes": stats["passes"],
                     "bytes_read_GB": stats["bytes_read"] / 1e9, "bank_GB": bank.nbytes / 1e9,
                     "bank_reads": stats["bytes_read"] / bank.nbytes, "outer_iterations": len(res.history),
                     "active": int(np.asarray(res.active).size), "gap": float(res.gap),
                     "converged": bool(res.converged), "peak_rss_GB": rss.peak_total / 1e9,
                     "max_working_set": max(h["working_set"] for h in res.history),
                     "working_set_GB": max(h["working_set"] for h in res.history) * bank.n ** 2
                     * bank.dtype.itemsize / 1e9})
        print(rows[-1], flush=True)
    return {"bank": str(path), "M": len(bank), "n": bank.n, "rows": rows,
            "targets": {"seconds": 600, "peak_rss_GB": 4.0}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["ringnorm", "twonorm"])
    ap.add_argument("--Ms", type=int, nargs="+", default=[50, 100, 300, 1000, 3000, 6000, 10000])
    ap.add_argument("--C", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out-of-core", type=Path, default=None, help="only the out-of-core fit on this bank")
    ap.add_argument("--uci", action="store_true", help="only the UCI protocol on breast_cancer")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "mklscale-bench-spicy")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bench_spicy.json")
    args = ap.parse_args()
    if args.out_of_core is not None:
        result = {"benchmark": "bench_spicy_out_of_core", "machine": describe_machine(args.out_of_core),
                  **out_of_core(args.out_of_core, args.C)}
        out = args.out.with_name("bench_spicy_out_of_core.json")
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
        return
    if args.uci:
        result = {"benchmark": "bench_spicy_uci", "machine": describe_machine(args.workdir), **uci_protocol(args.workdir)}
        for r in result["rows"]:
            print(r, flush=True)
        out = args.out.with_name("bench_spicy_uci.json")
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
        return
    if args.quick:
        args.datasets, args.Ms, args.repeats = ["ringnorm"], [50, 300], 1
        args.out = args.out.with_name("bench_spicy_quick.json")

    rows = []
    for name in args.datasets:
        ds = load(name, n_samples=1200, seed=0)
        X, y, X_test, y_test = ds.X[:200], ds.y[:200], ds.X[200:], ds.y[200:]
        for M in args.Ms:
            specs = families.random_subsets(X.shape[1], M, seed=M)
            t0 = time.perf_counter()
            bank = build_bank(X, specs, args.workdir / f"{name}-{M}", progress=False, overwrite=True)
            build_s = time.perf_counter() - t0
            with Engine(bank) as engine:
                for setting in SETTINGS:
                    row = {"dataset": name, "M": M, "n": 200, "build_seconds": build_s,
                           **run_one(engine, bank, y, X_test, y_test, args.C, setting, args.repeats)}
                    rows.append(row)
                    print(f"{name:9s} M={M:6d} {setting['loss']:8s} {setting['penalty']:11s} "
                          f"{row['seconds']:7.2f} s  passes={row['passes']:3d}  outer={row['outer_iterations']:3d}  "
                          f"active={row['active']:4d}  acc={row['test_accuracy']:.3f}  gap={row['gap']:.2g}", flush=True)
            shutil.rmtree(args.workdir / f"{name}-{M}", ignore_errors=True)
    result = {"benchmark": "bench_spicy", "machine": describe_machine(args.workdir),
              "params": {"C": args.C, "tol": 0.01, "n_train": 200, "n_test": 1000, "repeats": args.repeats,
                         "kernels": "gaussian on random feature subsets, width 5 chi^2 + 0.1, unit trace, float32"},
              "rows": rows, "targets": {"M=3000 seconds": 5.0, "median passes per solve": 6}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"median passes per solve: {statistics.median(r['passes'] for r in rows)}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
