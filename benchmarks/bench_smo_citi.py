"""SMO-MKL and Citi (eta = 1) against cvxpy on the QCQP (L): the protocol of Figure 2 of Bach,
Lanckriet & Jordan (2004), on offline data.

    python benchmarks/bench_smo_citi.py            # breast_cancer (n = 569), ringnorm (n = 1000),
                                                   # m = 3 ... 192, and an n sweep on ringnorm
    python benchmarks/bench_smo_citi.py --quick    # breast_cancer, m = 3, 6, 12; a small n sweep

Protocol: Gaussian kernels on random feature subsets with random widths (``families.random_subsets``,
nested in m: the first m kernels of a larger bank are the smaller bank), unit diagonal
(``normalize="diag"``), float32 bank under --workdir (never in the repository), C = 1. The three
solvers read the same bank through the same engine (a fresh one each, so no solver inherits another's
block cache) and solve the same problem: the SKM (P) with d_j = 1 = Citi's (1)-(2) with eta = 1 =
-(1/2) (L) with tr K_j / c = 1. Times are the solver's wall time, the median of --repeats runs (3) for
SMO-MKL and cvxpy (one run for Citi); for cvxpy the whole time includes the eigendecompositions K_j =
L_j L_j^T (eigenvalues below 1e-12 lambda_max dropped), the problem construction and cvxpy's compilation,
and each part is recorded as well, so the ratio is quoted both on the whole time and on Clarabel's own
solve time. For an equal footing run both sides on one core: ``taskset -c 1`` with
OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=NUMBA_NUM_THREADS=1 (recorded in params). cvxpy (Clarabel,
default tolerances) is skipped when its time, extrapolated from the
smaller m of the same dataset (log-log fit), exceeds --cvxpy-limit seconds; the prediction is recorded.
SMO uses the paper's settings (eps1 = 5e-4 n, eps2 = 1e-4, mu = 0.5) plus a certified relative duality
gap --smo-tol (default 1e-4), so its objective is provably within 1e-4 of the optimum; Citi stops at
its relative gap 1e-4 or after --citi-max-seconds. Scaling exponents are least-squares slopes of
log(seconds) against log(m) (and log(n)).
Results: benchmarks/results/bench_smo_citi[_quick].json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.datasets import load  # noqa: E402
from mklscale.solvers import citi, smo  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FULL_M = (3, 6, 12, 24, 48, 96, 192)
QUICK_M = (3, 6, 12)
FULL_N = (250, 500, 1000)
QUICK_N = (150, 300)
N_SWEEP_M = 12
#: cvxpy time ~ m^1.5 and ~ n^3 until two points of a sweep are measured
DEFAULT_SLOPE = {"m": 1.5, "n": 3.0}


def engine_for(bank_path: Path):
    """A fresh engine over the bank: the real Engine when importable, else the dense stand-in."""
    try:
        from mklscale.engine import Engine

        return Engine(bank_path), "Engine"
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from _dense_engine import DenseEngine
        from mklscale.bank import KernelBank

        bank = KernelBank.open(bank_path)
        return DenseEngine(bank.kernels(np.arange(len(bank)))), "DenseEngine"


def lanckriet_cvxpy(grams: np.ndarray, y: np.ndarray, C: float) -> dict:
    """Solve (L) with Clarabel; returns the SKM objective -(L)/2 and the time, split into its parts:
    factor_seconds (the eigendecompositions K_j = L_j L_j^T), compile_seconds (cvxpy's
    canonicalisation, ``problem.compilation_time``), solver_seconds (Clarabel's own solve time,
    ``solver_stats.solve_time``); seconds is the whole wall time (the three plus problem construction)."""
    import cvxpy as cp

    t0 = time.perf_counter()
    alpha, zeta = cp.Variable(y.size), cp.Variable()
    constraints = [alpha >= 0, alpha <= C, y @ alpha == 0]
    factor_seconds = 0.0
    for K in grams:
        t1 = time.perf_counter()
        w, V = np.linalg.eigh(K)
        keep = w > 1e-12 * w[-1]
        L = V[:, keep] * np.sqrt(w[keep])
        factor_seconds += time.perf_counter() - t1
        constraints.append(cp.sum_squares(L.T @ cp.multiply(y, alpha)) <= zeta)
    problem = cp.Problem(cp.Minimize(zeta - 2 * cp.sum(alpha)), constraints)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problem.solve(solver="CLARABEL")
    return {"seconds": time.perf_counter() - t0, "objective": -float(problem.value) / 2.0,
            "status": problem.status, "factor_seconds": factor_seconds,
            "compile_seconds": float(problem.compilation_time or np.nan),
            "solver_seconds": float(problem.solver_stats.solve_time or np.nan)}


def repeated(fn, repeats: int, keys: tuple[str, ...]) -> dict:
    """fn() run ``repeats`` times: the last run's record with each of ``keys`` replaced by its median
    over the runs and the runs' values kept as ``<key>_all``."""
    runs = [fn() for _ in range(repeats)]
    out = dict(runs[-1], repeats=repeats)
    for k in keys:
        values = [r[k] for r in runs]
        out[k], out[k + "_all"] = float(np.median(values)), values
    return out


def predict_cvxpy(points: list[tuple[int, float]], x: int, axis: str) -> float:
    """cvxpy seconds at m (or n) = x, extrapolated from the measured points of the same sweep."""
    if not points:
        return 0.0
    if len(points) == 1:
        slope = DEFAULT_SLOPE[axis]
    else:
        log_x, log_t = np.log([p[0] for p in points]), np.log([p[1] for p in points])
        slope = max(float(np.polyfit(log_x, log_t, 1)[0]), 1.0)
    x_last, t_last = points[-1]
    return t_last * (x / x_last) ** slope


def run_point(name, X, y, m, C, args, cvxpy_points, engine_kind, axis: str = "m") -> dict:
    path = Path(args.workdir) / f"{name}_n{y.size}_m{m}"
    specs = families.random_subsets(X.shape[1], m, seed=args.seed)
    t0 = time.perf_counter()
    build_bank(X, specs, path, normalize="diag", dtype=args.dtype, overwrite=True, progress=False)
    record = {"dataset": name, "n": int(y.size), "m": m, "build_seconds": time.perf_counter() - t0}

    def smo_run() -> dict:  # a fresh engine each time: no run inherits another's block cache
        engine, engine_kind[0] = engine_for(path)
        t0 = time.perf_counter()
        res = smo.fit(engine, y, C, tol=args.smo_tol)
        return {
            "seconds": time.perf_counter() - t0, "objective": res.objective, "dual": res.params["dual"],
            "gap": res.gap, "converged": res.converged, "status": res.params["status"], "n_active": res.n_active,
            "stages": res.params["stages"], "final_kappa": res.params["kappa"], "passes": res.params["passes"],
            "smo_steps": int(sum(h["smo_steps"] for h in res.history)),
            "max_working_set": res.params["max_working_set"],
        }

    record["smo"] = repeated(smo_run, args.repeats, ("seconds",))

    if not args.no_citi:
        engine, _ = engine_for(path)
        t0 = time.perf_counter()
        cres = citi.fit(engine, y, C, 1.0, tol=args.citi_tol, max_iter=args.citi_max_iter,
                              max_seconds=args.citi_max_seconds)
        record["citi"] = {
            "seconds": time.perf_counter() - t0, "objective": cres.objective, "gap": cres.gap,
            "converged": cres.converged, "status": cres.params["status"], "iterations": len(cres.history),
            "n_selected": cres.params["n_selected"],
            "passes": cres.params["passes"],
        }
        del engine

    predicted = predict_cvxpy(cvxpy_points, record[axis], axis)
    if predicted > args.cvxpy_limit:
        record["cvxpy"] = {"skipped": True, "predicted_seconds": predicted}
    else:
        engine, _ = engine_for(path)
        grams = engine.blocks(np.arange(m))
        del engine
        out = repeated(lambda: lanckriet_cvxpy(grams, y, C), args.repeats,
                       ("seconds", "factor_seconds", "compile_seconds", "solver_seconds"))
        del grams
        record["cvxpy"] = dict(out, skipped=False, predicted_seconds=predicted)
        cvxpy_points.append((record[axis], out["seconds"]))
    ref = record["cvxpy"].get("objective")
    if ref is not None:
        record["smo"]["rel_diff_vs_cvxpy"] = (record["smo"]["objective"] - ref) / abs(ref)
        if "citi" in record:
            record["citi"]["rel_diff_vs_cvxpy"] = (record["citi"]["objective"] - ref) / abs(ref)
    if "citi" in record:
        record["smo"]["rel_diff_vs_citi"] = (record["smo"]["objective"] - record["citi"]["objective"]) / abs(
            record["citi"]["objective"])
    cv = record["cvxpy"]
    cv_time = cv.get("seconds", cv["predicted_seconds"])
    record["speedup_vs_cvxpy"] = cv_time / record["smo"]["seconds"]
    if not cv["skipped"]:  # Clarabel's own solve time alone: no factorisation, no compilation
        record["solver_speedup_vs_cvxpy"] = cv["solver_seconds"] / record["smo"]["seconds"]
    record["speedup_measured"] = not cv["skipped"]
    shutil.rmtree(path, ignore_errors=True)
    print(f"{name:14s} n={y.size:5d} m={m:4d}  SMO {record['smo']['seconds']:8.2f}s obj {record['smo']['objective']:.8g} "
          f"gap {record['smo']['gap']:.1e} | Citi {record.get('citi', {}).get('seconds', np.nan):8.2f}s "
          f"| cvxpy {'skip' if cv['skipped'] else format(cv['seconds'], '8.2f') + 's'} "
          f"(pred {cv['predicted_seconds']:.0f}s)  speedup {record['speedup_vs_cvxpy']:.1f}", flush=True)
    return record


def slope(points) -> float | None:
    points = [(x, t) for x, t in points if t is not None and t > 0]
    if len(points) < 2:
        return None
    x, t = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, t, 1)[0])


def exponents(records, key_axis: str) -> dict:
    out = {}
    for solver in ("smo", "citi", "cvxpy"):
        pts = [(r[key_axis], r[solver]["seconds"]) for r in records
               if solver in r and not r[solver].get("skipped") and "seconds" in r[solver]]
        out[solver] = slope(pts)
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(results["m_sweeps"].items())
    if results["n_sweep"]:
        panels.append(("n sweep (ringnorm, m=%d)" % results["params"]["n_sweep_m"], results["n_sweep"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (title, recs) in zip(np.atleast_1d(axes), panels):
        axis = "n" if title.startswith("n sweep") else "m"
        xs = [r[axis] for r in recs]
        ax.loglog(xs, [r["smo"]["seconds"] for r in recs], "o-", label="SMO-MKL")
        if recs and "citi" in recs[0]:
            ax.loglog(xs, [r["citi"]["seconds"] for r in recs], "s-", label="Citi (eta=1)")
        meas = [(r[axis], r["cvxpy"]["seconds"]) for r in recs if not r["cvxpy"]["skipped"]]
        pred = [(r[axis], r["cvxpy"]["predicted_seconds"]) for r in recs if r["cvxpy"]["skipped"]]
        if meas:
            ax.loglog(*zip(*meas), "^-", label="cvxpy (L)")
        if pred:
            ax.loglog(*zip(*pred), "^", mfc="none", label="cvxpy predicted (skipped)")
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel(axis)
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="breast_cancer m = 3, 6, 12 and a small n sweep")
    parser.add_argument("--C", type=float, default=1.0)
    parser.add_argument("--cvxpy-limit", type=float, default=None,
                        help="skip cvxpy when predicted slower, seconds (default 120; 60 with --quick)")
    parser.add_argument("--citi-tol", type=float, default=1e-4)
    parser.add_argument("--citi-max-iter", type=int, default=5000)
    parser.add_argument("--citi-max-seconds", type=float, default=300.0, help="wall-time budget of one Citi fit")
    parser.add_argument("--smo-tol", type=float, default=1e-4,
                        help="relative duality gap SMO must certify in addition to the paper's (OPT_3) test")
    parser.add_argument("--repeats", type=int, default=3,
                        help="SMO-MKL and cvxpy runs per point; their median times are reported (default 3)")
    parser.add_argument("--no-citi", action="store_true")
    parser.add_argument("--datasets", default=None, help="comma list of breast_cancer,ringnorm (default: all)")
    parser.add_argument("--m", default=None, help="comma list of m values (default: the protocol's)")
    parser.add_argument("--no-n-sweep", action="store_true")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/mklscale_bench_smo_citi")
    parser.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/...)")
    args = parser.parse_args(argv)
    if args.cvxpy_limit is None:
        args.cvxpy_limit = 60.0 if args.quick else 120.0
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    engine_kind = ["?"]

    names = ["breast_cancer"] if args.quick else ["breast_cancer", "ringnorm"]
    if args.datasets:
        names = [x.strip() for x in args.datasets.split(",") if x.strip()]
    datasets = [(x, load(x) if x == "breast_cancer" else load(x, n_samples=1000)) for x in names]
    m_values = QUICK_M if args.quick else FULL_M
    if args.m:
        m_values = tuple(int(x) for x in args.m.split(","))
    m_sweeps = {}
    for name, ds in datasets:
        points: list = []
        m_sweeps[name] = [run_point(name, ds.X, ds.y, m, args.C, args, points, engine_kind) for m in m_values]

    n_points: list = []
    n_sweep = []
    for n in () if args.no_n_sweep else (QUICK_N if args.quick else FULL_N):
        ds = load("ringnorm", n_samples=n)
        m = 6 if args.quick else N_SWEEP_M
        n_sweep.append(run_point("ringnorm", ds.X, ds.y, m, args.C, args, n_points, engine_kind, axis="n"))

    results = {
        "benchmark": "bench_smo_citi",
        "machine": describe_machine(Path(args.workdir)),
        "engine": engine_kind[0],
        "params": {"C": args.C, "dtype": args.dtype, "seed": args.seed, "normalize": "diag",
                   "family": "random_subsets (gaussian on random feature subsets, width 5 chi^2 + 0.1)",
                   "smo": {"eps1": "5e-4 n", "eps2": 1e-4, "mu": 0.5, "continuation": "target", "tol": args.smo_tol},
                   "citi": {"eta": 1.0, "tol": args.citi_tol, "max_iter": args.citi_max_iter,
                            "max_seconds": args.citi_max_seconds},
                   "cvxpy": "Clarabel, default tolerances; (L) with eigen factors", "cvxpy_limit_s": args.cvxpy_limit,
                   "repeats": args.repeats,
                   "timing": "SMO-MKL and cvxpy: median of `repeats` runs (a fresh engine per SMO run); Citi: one run. "
                             "cvxpy seconds = factorisation + compilation + Clarabel's solve, each also recorded",
                   "cpu_affinity": sorted(os.sched_getaffinity(0)),
                   "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                              "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
                                  if k in os.environ},
                   "n_sweep_m": 6 if args.quick else N_SWEEP_M, "quick": args.quick,
                   "m_values": list(m_values), "datasets": names, "n_sweep_run": not args.no_n_sweep},
        "m_sweeps": m_sweeps,
        "n_sweep": n_sweep,
        "exponents_m": {name: exponents(recs, "m") for name, recs in m_sweeps.items()},
        "exponents_n": exponents(n_sweep, "n"),
    }
    at96 = [r for recs in m_sweeps.values() for r in recs if r["m"] == 96]
    results["target_m96"] = [{"dataset": r["dataset"], "speedup_vs_cvxpy": r["speedup_vs_cvxpy"],
                              "cvxpy_measured": r["speedup_measured"],
                              "solver_speedup_vs_cvxpy": r.get("solver_speedup_vs_cvxpy"),
                              "smo_rel_diff_vs_cvxpy": r["smo"].get("rel_diff_vs_cvxpy"),
                              "smo_gap": r["smo"]["gap"]} for r in at96]
    stem = "bench_smo_citi_quick" if args.quick else "bench_smo_citi"
    if args.m or args.datasets or args.no_n_sweep:  # never overwrite the protocol's results
        stem += "_partial"
    out = Path(args.out) if args.out else RESULTS / f"{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=float))
    plot(results, out.with_suffix(".png"))
    print(f"exponents in m: {results['exponents_m']}\nexponents in n: {results['exponents_n']}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
