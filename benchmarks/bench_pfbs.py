"""PFBS (mklscale.solvers.pfbs) on two banks: a tau path with and without FISTA, and CV test error.

    python benchmarks/bench_pfbs.py            # diabetes (297 kernels) + ringnorm (1000 kernels, n = 500)
    python benchmarks/bench_pfbs.py --quick    # small banks, short grids (a smoke run)

diabetes (regression, n = 442): the SimpleMKL recipe on its 10 features (27 x 11 = 297 kernels).
ringnorm (classification, n rows): 900 Gaussian kernels on random feature subsets (SpicyMKL IDA
recipe) + polynomial degrees 1-5 on each of the 20 single features (100) = 1000 kernels.
Both banks are unit-trace normalised, float32 on disk, built in /tmp (outside the repository).

Per dataset:
- path: 20 taus from tau_max down to eps * tau_max at a fixed mu, warm-started, plain PFBS and
  FISTA: wall time, iterations, full-bank passes, bytes read, convergence;
- CV: a held-out test split (seeded); K-fold CV over (mu, tau) on the training rows only (folds
  are row subsets of the same bank via RowSubsetEngine), refit on the training rows, error on the
  test rows (RMSE / accuracy) against the trivial predictor (training mean / majority class).
The bank is built once over all rows (train + test), so feature standardisation saw the test
features (not their targets); the solvers and CV only ever use the training rows' kernel entries.
Results go to benchmarks/results/bench_pfbs.json (bench_pfbs_quick.json with --quick) and a path
plot to benchmarks/results/bench_pfbs_path_<dataset>.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.datasets import load  # noqa: E402
from mklscale.engine import RowSubsetEngine  # noqa: E402
from mklscale.solvers import paths  # noqa: E402
from mklscale.solvers.cv import predict_rows  # noqa: E402


def open_engine(bank):
    """The real Engine when importable, else the in-memory DenseEngine of the tests."""
    try:
        from mklscale.engine import Engine
    except ImportError:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from _dense_engine import DenseEngine

        return DenseEngine(np.asarray(bank.kernels(range(bank.M)), dtype=np.float64)), "DenseEngine (in memory)"
    return Engine(bank), "mklscale.engine.Engine (threaded, in process)"


def diabetes_bank(workdir: Path, quick: bool):
    data = load("diabetes")
    widths = (0.5, 1.0, 2.0, 5.0, 10.0) if quick else families.SIMPLEMKL_WIDTHS
    specs = families.simplemkl(data.X.shape[1], widths=widths)
    return data, specs


def ringnorm_bank(workdir: Path, quick: bool, n: int):
    data = load("ringnorm", n_samples=n, seed=0)
    d = data.X.shape[1]
    n_gauss, degrees = (90, (1, 2)) if quick else (900, (1, 2, 3, 4, 5))
    specs = families.random_subsets(d, n_gauss, seed=0)
    for j in range(d):
        specs += families.polynomial(degrees, 1.0, features=(j,))
    return data, specs


def counters(engine) -> tuple[int, int]:
    stats = engine.stats
    return int(stats["passes"]), int(stats["bytes_read"])


def run_path(engine, y, rows, mu, n_taus, eps, accelerated, tol, max_iter):
    sub = RowSubsetEngine(engine, rows)
    p0, b0 = counters(engine)
    t0 = time.perf_counter()
    p = paths.path(sub, y[rows], n_taus=n_taus, mu=mu, eps=eps, accelerated=accelerated, center=True,
                  tol=tol, max_iter=max_iter)
    seconds = time.perf_counter() - t0
    p1, b1 = counters(engine)
    summary = {
        "seconds": seconds, "iterations": p.total_iterations, "passes": p1 - p0, "GB_read": (b1 - b0) / 1e9,
        "all_converged": bool(p.converged.all()), "max_gap": float(p.gaps.max()),
        "per_tau": {"tau": p.taus.tolist(), "iterations": p.iterations.tolist(), "passes": p.passes.tolist(),
                    "n_active": [int(a.size) for a in p.active], "seconds": p.seconds.tolist(),
                    "gap": p.gaps.tolist()},
    }
    print(f"  path {'FISTA' if accelerated else 'plain'}: {seconds:.1f} s, {p.total_iterations} iterations, "
          f"{p1 - p0} passes, active at the end {p.active[-1].size}, converged {bool(p.converged.all())}")
    return p, summary


def run_cv(engine, y, train, test, task, mus, folds, n_taus, eps, tol, max_iter):
    p0, b0 = counters(engine)
    t0 = time.perf_counter()
    cv = paths.cross_validate(RowSubsetEngine(engine, train), y[train], mus=mus, folds=folds, task=task,
                             n_taus=n_taus, eps=eps, center=True, accelerated=True, tol=tol, max_iter=max_iter)
    pred = predict_rows(engine, cv.result, train, test)
    seconds = time.perf_counter() - t0
    p1, b1 = counters(engine)
    if task == "classification":
        test_error = float(np.mean(np.where(pred >= 0, 1.0, -1.0) == y[test]))
        majority = 1.0 if np.mean(y[train]) >= 0 else -1.0
        baseline = float(np.mean(y[test] == majority))
        names = ("test_accuracy", "majority_class_test_accuracy", "cv_accuracy")
    else:
        test_error = float(np.sqrt(np.mean((pred - y[test]) ** 2)))
        baseline = float(np.sqrt(np.mean((y[train].mean() - y[test]) ** 2)))
        names = ("test_rmse", "train_mean_test_rmse", "cv_rmse")
    best = (list(cv.mus).index(cv.best_mu), list(cv.taus).index(cv.best_tau))
    summary = {
        "folds": folds, "mus": cv.mus.tolist(), "n_taus": n_taus, "eps": eps,
        "best_mu": cv.best_mu, "best_tau": cv.best_tau, "best_tau_over_tau_max": cv.best_tau / cv.taus[0],
        names[2]: float(cv.errors[best]), names[0]: test_error, names[1]: baseline,
        "n_active": int(cv.result.active.size), "active": cv.result.active.tolist(),
        "seconds": seconds, "passes": p1 - p0, "GB_read": (b1 - b0) / 1e9,
        "cv_grid": cv.errors.tolist(),
    }
    print(f"  CV: best mu={cv.best_mu:g} tau={cv.best_tau:.3g} ({cv.best_tau / cv.taus[0]:.3g} tau_max), "
          f"{names[0]}={test_error:.4g} (baseline {baseline:.4g}), {cv.result.active.size} kernels, "
          f"{seconds:.1f} s, {p1 - p0} passes")
    return summary


def plot(p, path_png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    paths.plot_path(p, ax=ax)
    ax.set_title(title + "\n" + ax.get_title(), fontsize=10)
    fig.tight_layout()
    fig.savefig(path_png, dpi=110)
    plt.close(fig)


def bench_dataset(name, data, specs, task, args, workdir: Path, out_dir: Path) -> dict:
    print(f"{name}: n={data.X.shape[0]}, M={len(specs)}")
    t0 = time.perf_counter()
    bank = build_bank(data.X, specs, workdir / name, progress=False, overwrite=True)
    build_s = time.perf_counter() - t0
    engine, engine_name = open_engine(bank)
    y = np.asarray(data.y, dtype=np.float64)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(y.size)
    n_test = int(round(args.test_fraction * y.size))
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    result = {"n": int(y.size), "M": len(specs), "task": task, "engine": engine_name, "bank_build_s": build_s,
              "bank_GB": bank.nbytes / 1e9, "n_train": int(train.size), "n_test": int(test.size)}
    paths = {}
    for accelerated in (False, True):
        p, summary = run_path(engine, y, train, args.mu, args.n_taus, args.eps, accelerated, args.tol, args.max_iter)
        paths["fista" if accelerated else "plain"] = summary
        if accelerated:
            png = out_dir / f"bench_pfbs{'_quick' if args.quick else ''}_path_{name}.png"
            plot(p, png, f"{name}: n_train={train.size}, M={len(specs)}")
            result["path_plot"] = png.name
    result["path"] = {"n_taus": args.n_taus, "mu": args.mu, "eps": args.eps, "tol": args.tol,
                      "max_iter_per_tau": args.max_iter, "tau_max": float(p.taus[0]), **paths}
    result["cv"] = run_cv(engine, y, train, test, task, args.mus, args.folds, args.cv_n_taus, args.eps,
                          args.cv_tol, args.max_iter)
    if hasattr(engine, "close"):
        engine.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small banks, 10-value grids, 3 folds")
    ap.add_argument("--ringnorm-n", type=int, default=500)
    ap.add_argument("--mu", type=float, default=1e-3, help="mu of the timed path")
    ap.add_argument("--n-taus", type=int, default=20)
    ap.add_argument("--eps", type=float, default=1e-2, help="the grid ends at eps * tau_max")
    ap.add_argument("--tol", type=float, default=1e-6, help="relative duality gap per tau (path)")
    ap.add_argument("--max-iter", type=int, default=20000, help="PFBS iterations per tau")
    ap.add_argument("--mus", type=float, nargs="+", default=[1e-5, 1e-4, 1e-3])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--cv-n-taus", type=int, default=12)
    ap.add_argument("--cv-tol", type=float, default=1e-5)
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/mklscale-bench-pfbs"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bench_pfbs.json")
    args = ap.parse_args()
    if args.quick:
        args.ringnorm_n, args.n_taus, args.cv_n_taus, args.folds = 200, 10, 6, 3
        args.mus = [1e-4, 1e-3]
        args.out = args.out.with_name("bench_pfbs_quick.json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    datasets = {}
    data, specs = diabetes_bank(args.workdir, args.quick)
    datasets["diabetes"] = bench_dataset("diabetes", data, specs, "regression", args, args.workdir, args.out.parent)
    data, specs = ringnorm_bank(args.workdir, args.quick, args.ringnorm_n)
    datasets["ringnorm"] = bench_dataset("ringnorm", data, specs, "classification", args, args.workdir, args.out.parent)
    report = {
        "benchmark": "bench_pfbs",
        "machine": describe_machine(args.workdir),
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "notes": ["square loss for both tasks (ringnorm: RLS classification on +-1 targets, accuracy of sign(f))",
                  "center=True everywhere: y centred on the training rows, bias = their mean",
                  "passes = full-bank quad_forms passes counted by the engine; iterations = PFBS steps",
                  "bank built over all rows (train + test); solvers use the training rows only"],
        "datasets": datasets,
        "total_seconds": time.perf_counter() - t0,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out} ({report['total_seconds']:.0f} s)")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
