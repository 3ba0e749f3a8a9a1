"""Benchmark of the Afkanpour solvers (SGD-1s, GCD-1s, GCD-2s) against UNIFORM and AMKL.

Part 1 (thesis 6.1.3): SGD-1s on the polynomial product family (D = 3, linear base kernel per input),
x ~ U[-1,1]^r, y = sum of 10 random monomials of degree <= 3 in the first 5 variables (noise free);
test MSE and training time versus r, against UNIFORM (all degree <= 3 products, kernel ridge, best
of three ridges on the TEST set — an optimistic baseline).

Part 2 (thesis 6.2.2 / Table 6.4 protocol, reduced): Gaussian banks (10 widths on all features + 3
widths per single feature) on ringnorm, waveform and digits (mklscale.datasets.load); UNIFORM, AMKL,
GCD-1s (squared loss on the +-1 labels, ridge 0.1), GCD-2s alignment and Euclidean (SVM C = 1);
test error, rank per task, seconds, iterations. No hyper-parameter tuning (fixed values above).

Banks are written under /tmp (never in the repository). ``--quick`` uses smaller sizes.
Usage: python benchmarks/bench_sgd_gcd.py [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # n x n solves on a shared machine
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import describe_machine  # noqa: E402

from mklscale import datasets  # noqa: E402
from mklscale.bank import KernelSpec, build_bank  # noqa: E402
from mklscale.engine import Engine  # noqa: E402
from mklscale.solvers import baselines, gcd, sgd  # noqa: E402
from mklscale.solvers._final_fit import kernel_ridge  # noqa: E402
from mklscale.solvers.sources import PolynomialFamily  # noqa: E402


def polynomial_data(r, n_train, n_test, seed):
    rng = np.random.default_rng(seed)
    monomials = [tuple(rng.integers(0, 5, size=int(rng.integers(1, 4)))) for _ in range(10)]
    X = rng.uniform(-1, 1, (n_train + n_test, r))
    y = sum(np.prod(X[:, list(m)], axis=1) for m in monomials)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def polynomial_part(rs, n_train, n_test, T, seed=0):
    rows = []
    for r in rs:
        Xtr, ytr, Xte, yte = polynomial_data(r, n_train, n_test, seed)
        fam = PolynomialFamily(Xtr, D=3)
        t0 = time.perf_counter()
        uni = []
        for lam in (1e-3, 1e-1, 1e1):
            c, b = kernel_ridge(fam.uniform_gram(), ytr, lam)
            uni.append(float(np.mean((fam.uniform_cross(Xte) @ c + b - yte) ** 2)))
        t_uni = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = sgd.fit(fam, ytr, lam=0.1, T=T, seed=seed)
        t_sgd = time.perf_counter() - t0
        mse = float(np.mean((fam.predict(res, Xte) - yte) ** 2))
        rows.append({"r": r, "n_kernels": fam.size, "sgd_mse": mse, "sgd_seconds": t_sgd, "sgd_T": T,
                     "sgd_selected": int(res.n_active), "uniform_mse_best": min(uni), "uniform_seconds": t_uni,
                     "target_variance": float(np.var(yte))})
        print(f"poly r={r:3d} |I|={fam.size:>9d} SGD-1s mse={mse:.4f} ({t_sgd:.1f}s, {res.n_active} kernels) "
              f"UNIFORM mse={min(uni):.4f} ({t_uni:.1f}s)", flush=True)
    return rows


def gaussian_specs(d):
    specs = [KernelSpec.gaussian(w) for w in np.geomspace(0.5, 50.0, 10) * np.sqrt(d) / 4]
    specs += [KernelSpec.gaussian(w, (j,)) for j in range(d) for w in (0.3, 1.0, 3.0)]
    return specs


def classification_part(names, n_train, n_test, workdir, seed=0):
    rows = []
    for name in names:
        if name == "digits":
            data = datasets.load("digits")
        else:
            data = datasets.load(name, n_samples=n_train + n_test, seed=seed)
        rng = np.random.default_rng(seed)
        perm = rng.permutation(data.n_samples)
        tr, te = perm[:n_train], perm[n_train:n_train + n_test]
        Xtr, ytr, Xte, yte = data.X[tr], data.y[tr], data.X[te], data.y[te]
        bank = build_bank(Xtr, gaussian_specs(data.n_features), workdir / name, normalize=None, dtype="float64",
                          overwrite=True, progress=False)
        eng = Engine(bank)
        runs = {
            "UNIFORM": lambda: baselines.uniform(eng, ytr, C=1.0),
            "AMKL": lambda: baselines.alignment(eng, ytr, C=1.0),
            "GCD-1s": lambda: gcd.fit_one_stage(eng, ytr, lam=0.1, max_iter=100, tol=1e-3),
            "GCD-2s (align)": lambda: gcd.fit_two_stage(eng, ytr, criterion="alignment", C=1.0),
            "GCD-2s (eucl)": lambda: gcd.fit_two_stage(eng, ytr, criterion="euclidean", C=1.0, max_iter=100),
        }
        task = {"dataset": name, "n_train": int(tr.size), "n_test": int(te.size), "M": eng.M, "methods": {}}
        for method, run in runs.items():
            t0 = time.perf_counter()
            res = run()
            secs = time.perf_counter() - t0
            f = res.decision_function_from_kernels(bank.cross(Xte, kernels=res.active.tolist()))
            err = float(np.mean(np.sign(f) != yte))
            task["methods"][method] = {"test_error": err, "seconds": secs, "iterations": len(res.history),
                                       "n_active": int(res.n_active), "converged": bool(res.converged),
                                       "alignment": res.params.get("alignment")}
            print(f"{name:9s} {method:15s} err={err:.3f} {secs:6.2f}s it={len(res.history):3d} "
                  f"active={res.n_active}", flush=True)
        errs = {m: v["test_error"] for m, v in task["methods"].items()}
        order = sorted(errs, key=errs.get)
        for m in errs:  # average ranks for ties
            tied = [i + 1 for i, o in enumerate(order) if errs[o] == errs[m]]
            task["methods"][m]["rank"] = float(np.mean(tied))
        rows.append(task)
        eng.close()
    methods = list(rows[0]["methods"]) if rows else []
    summary = {m: {"median_rank": float(np.median([t["methods"][m]["rank"] for t in rows])),
                   "mean_seconds": float(np.mean([t["methods"][m]["seconds"] for t in rows])),
                   "mean_iterations": float(np.mean([t["methods"][m]["iterations"] for t in rows]))}
               for m in methods}
    return rows, summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (minutes on 2 cores)")
    args = ap.parse_args(argv)
    if args.quick:
        rs, n_poly, n_poly_test, T = (5, 10, 20, 50, 100), 300, 500, 300
        n_train, n_test = 200, 500
    else:
        rs, n_poly, n_poly_test, T = (5, 10, 20, 50, 100), 500, 1000, 800
        n_train, n_test = 500, 1000
    workdir = Path(tempfile.mkdtemp(prefix="bench_sgd_gcd_", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        poly = polynomial_part(rs, n_poly, n_poly_test, T)
        tasks, summary = classification_part(("ringnorm", "waveform", "digits"), n_train, n_test, workdir)
        out = {"machine": describe_machine(workdir), "quick": args.quick, "polynomial": poly,
               "classification": tasks, "classification_summary": summary,
               "total_seconds": time.perf_counter() - t0}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    path = HERE / "results" / f"bench_sgd_gcd{'_quick' if args.quick else ''}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
    for m, s in summary.items():
        print(f"{m:15s} median rank {s['median_rank']:.1f}  mean {s['mean_seconds']:.2f}s  "
              f"iterations {s['mean_iterations']:.1f}")


if __name__ == "__main__":
    main()
