"""SMO-MKL on a factor bank (issue 17): fit time, passes and objective at n = 2000, 5000, 10000.

    python benchmarks/bench_smo_factor.py                 # n = 2000, 5000, 10000 (M = 20, r = 64)
    python benchmarks/bench_smo_factor.py --n 10000        # chosen sizes, merged into the saved runs
    python benchmarks/bench_smo_factor.py --quick         # n = 500, 1000

Problem: Breiman's ringnorm (``mklscale.datasets.ringnorm``, d = 20, standardised), M = 20 Gaussian
kernels on random feature subsets (1 to 6 features) with random widths, each stored as its Nystrom
factor L_m = K_m(X, Z) U diag(s)^(-1/2) (n x r) on r = 64 landmarks Z drawn from the rows
(K_m(Z, Z) = U diag(s) U^T, eigenvalues below 1e-10 s_max dropped), so K~_m = L_m L_m^T; the
factors are float32, as a factor bank stores them, read through ``InMemoryFactorEngine``. SMO-MKL
runs with its defaults (eps1 = 5e-4 n, eps2 = 1e-4, mu = 0.5) and C = 1. A size is skipped when the
time predicted from the smaller sizes (log-log fit, or n^2 from one size) exceeds --max-seconds;
the prediction is recorded. Fit time excludes building the factors. For n <= --dense-max the same
problem is also solved on the dense engine of the K~_m = L_m L_m^T (``InMemoryEngine``, float64
n x n kernels; its start is the kappa = 1 SVM): time and objective, the same optimum within the tolerance.
Results: benchmarks/results/bench_smo_factor[_quick].json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402

from mklscale.datasets import ringnorm  # noqa: E402
from mklscale.engine.memory import InMemoryEngine, InMemoryFactorEngine  # noqa: E402
from mklscale.solvers import smo  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FULL_N = (2000, 5000, 10000)
QUICK_N = (500, 1000)


def nystrom_bank(n: int, M: int, r: int, seed: int):
    """(factors (M, n, r) float32, y): Nystrom factors of Gaussian kernels on random feature subsets."""
    data = ringnorm(n_samples=n, n_features=20, seed=seed)
    X, y = data.X, data.y
    rng = np.random.default_rng(seed + 1)
    landmarks = rng.choice(n, size=r, replace=False)
    factors = np.zeros((M, n, r), dtype=np.float32)
    for m in range(M):
        feats = rng.choice(X.shape[1], size=int(rng.integers(1, 7)), replace=False)
        width = np.sqrt(feats.size) * (0.5 + 2.5 * rng.random())
        Xf = X[:, feats]
        sq = ((Xf[:, None, :] - Xf[None, landmarks, :]) ** 2).sum(-1)
        K_nz = np.exp(-sq / (2.0 * width * width))
        s, U = np.linalg.eigh(K_nz[landmarks])
        keep = s > 1e-10 * s[-1]
        factors[m, :, :keep.sum()] = K_nz @ (U[:, keep] / np.sqrt(s[keep]))
    return factors, y


def run_one(n: int, M: int, r: int, C: float, seed: int, dense_max: int) -> dict:
    t0 = time.perf_counter()
    factors, y = nystrom_bank(n, M, r, seed)
    build = time.perf_counter() - t0
    engine = InMemoryFactorEngine(factors)
    t0 = time.perf_counter()
    res = smo.fit(engine, y, C)
    seconds = time.perf_counter() - t0
    stages = res.history[1:]
    return {"n": n, "M": M, "r": r, "C": C, "seconds": seconds, "build_seconds": build,
            "passes": res.params["passes"], "objective": res.objective, "dual": res.params["dual"],
            "gap": res.gap, "converged": res.converged, "status": res.params["status"],
            "n_active": int(res.n_active), "stages": len(stages),
            "smo_steps": int(sum(h["smo_steps"] for h in stages)),
            "steps_per_stage": [int(h["smo_steps"]) for h in stages],
            "working_set_per_stage": [int(h["n_working"]) for h in stages],
            "seconds_per_stage": list(np.diff([h["seconds"] for h in res.history]).round(3)),
            "kappa": res.params["kappa"], **(dense_run(factors, y, C, res.objective) if n <= dense_max else {})}


def dense_run(factors, y, C: float, factor_objective: float) -> dict:
    """SMO-MKL on the dense engine of the K~_m = L_m L_m^T (same problem)."""
    L = factors.astype(np.float64)
    engine = InMemoryEngine(np.einsum("mir,mjr->mij", L, L))
    t0 = time.perf_counter()
    res = smo.fit(engine, y, C)
    seconds = time.perf_counter() - t0
    return {"dense_seconds": seconds, "dense_objective": res.objective, "dense_gap": res.gap,
            "dense_converged": res.converged,
            "objective_rel_diff": abs(res.objective - factor_objective) / abs(res.objective)}


def predicted_seconds(done: list[dict], n: int) -> float:
    if not done:
        return 0.0
    ns = np.log([d["n"] for d in done])
    ts = np.log([max(d["seconds"], 1e-3) for d in done])
    slope = np.polyfit(ns, ts, 1)[0] if len(done) > 1 else 2.0
    return float(np.exp(ts[-1] + max(slope, 1.0) * (np.log(n) - ns[-1])))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--M", type=int, default=20)
    parser.add_argument("--r", type=int, default=64)
    parser.add_argument("--C", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=240.0)
    parser.add_argument("--dense-max", type=int, default=2000)
    args = parser.parse_args(argv)
    sizes = args.n or (QUICK_N if args.quick else FULL_N)
    runs, skipped = [], []
    for n in sizes:
        guess = predicted_seconds(runs, n)
        if guess > args.max_seconds:
            skipped.append({"n": n, "predicted_seconds": guess})
            print(f"n = {n}: skipped (predicted {guess:.0f} s > --max-seconds {args.max_seconds:.0f})", flush=True)
            continue
        run = run_one(n, args.M, args.r, args.C, args.seed, args.dense_max)
        runs.append(run)
        print(f"n = {n}: {run['seconds']:.1f} s, {run['passes']} passes, P = {run['objective']:.8g}, "
              f"gap = {run['gap']:.2e}, {run['status']}, {run['stages']} stages, {run['smo_steps']} SMO steps, "
              f"{run['n_active']} active", flush=True)
        if "dense_seconds" in run:
            print(f"    dense engine of the K~: {run['dense_seconds']:.1f} s, P = {run['dense_objective']:.8g} "
                  f"(relative difference {run['objective_rel_diff']:.1e})", flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("bench_smo_factor_quick.json" if args.quick else "bench_smo_factor.json")
    settings = {"M": args.M, "r": args.r, "C": args.C, "seed": args.seed}
    if args.n and out.exists():  # chosen sizes replace those sizes of a saved run with the same settings
        saved = json.loads(out.read_text())
        if {k: saved["settings"].get(k) for k in settings} == settings:
            runs += [r for r in saved["runs"] if r["n"] not in sizes]
            skipped += [r for r in saved["skipped"] if r["n"] not in sizes and r["n"] not in
                        {run["n"] for run in runs}]
    runs.sort(key=lambda r: r["n"])
    skipped.sort(key=lambda r: r["n"])
    out.write_text(json.dumps({"machine": describe_machine(), "runs": runs, "skipped": skipped,
                               "settings": dict(settings, max_seconds=args.max_seconds)}, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
