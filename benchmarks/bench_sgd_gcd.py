"""Benchmark of the Afkanpour solvers (SGD-1s, GCD-1s, GCD-2s) against UNIFORM and AMKL.

Part 1 (thesis 6.1.3): SGD-1s on the polynomial product family (D = 3, linear base kernel per input),
x ~ U[-1,1]^r, y = sum of 10 random monomials of degree <= 3 in the first 5 variables (noise free);
test MSE and training time versus r, against UNIFORM (all degree <= 3 products, kernel ridge).

Part 2 (thesis 6.2.2 / Table 6.4 protocol, reduced): Gaussian banks (10 widths on all features + 3
widths per single feature) on ringnorm, waveform and digits (mklscale.datasets.load); UNIFORM, AMKL,
GCD-2s alignment and Euclidean (each followed by an SVM), GCD-1s (squared loss on the +-1 labels,
away-step Frank-Wolfe, stopped at relative Frank-Wolfe gap <= 1e-3, i.e. (J - J*)/J <= 1e-3, or 300
iterations); test error, rank per task, seconds, iterations, and for GCD-1s also plain Frank-Wolfe
(Algorithm 6 as printed) with the same tol and cap, to show why it stopped at max_iter before.

Hyper-parameter selection (no test data is used for any choice): every tuned value is chosen on a
VALIDATION SPLIT OF THE TRAINING DATA ONLY — a seeded random 20% of the training points is held out,
each candidate is fitted on the other 80% and scored on the held-out 20% (MSE for part 1, 0-1 error
for part 2, ties to the first candidate in the grid order), and the chosen value is then refitted on
the whole training set, which alone is evaluated on the test set. Grids: part 1 UNIFORM ridge
{1e-3, 1e-2, 1e-1, 1, 10}, SGD-1s lam {1e-2, 1e-1, 1}; part 2 SVM C {0.1, 1, 10} (UNIFORM, AMKL,
GCD-2s), GCD-1s lam {1e-2, 1e-1, 1}. Fixed, not tuned: SGD-1s T (800; quick 300), step "auto",
seed 0, suffix average over the second half; GCD-2s delta = 1e-3, max_iter 50 (alignment) / 300
(Euclidean). Reported seconds are those of the final fit on the whole training set; the selection
time is recorded separately ("select_seconds").

The machine is shared: the load average is recorded with the machine description and before each
part. Banks are written under /tmp (never in the repository). ``--quick`` uses smaller sizes.
Plots (from the JSON; ``--plot-only`` redraws them without re-running):
results/bench_sgd_gcd[_quick]_poly.png and results/bench_sgd_gcd[_quick]_classification.png.
Usage: python benchmarks/bench_sgd_gcd.py [--quick] [--plot-only]
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


def validation_split(n, seed, share=0.2):
    """(fit, validation) index arrays: a seeded random ``share`` of the n training points held out."""
    perm = np.random.default_rng(seed + 12345).permutation(n)
    n_val = max(1, int(round(share * n)))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def select(grid, score):
    """(best value, {value: validation score}) — the first minimiser in grid order."""
    scores = {v: float(score(v)) for v in grid}
    best = min(grid, key=lambda v: scores[v])
    return best, scores


UNIFORM_RIDGES = (1e-3, 1e-2, 1e-1, 1.0, 1e1)
SGD_LAMS = (1e-2, 1e-1, 1.0)
SVM_CS = (0.1, 1.0, 10.0)
GCD1_LAMS = (1e-2, 1e-1, 1.0)


def polynomial_part(rs, n_train, n_test, T, seed=0):
    rows = []
    for r in rs:
        load = [round(x, 2) for x in os.getloadavg()]
        Xtr, ytr, Xte, yte = polynomial_data(r, n_train, n_test, seed)
        fit_idx, val_idx = validation_split(n_train, seed)
        fam_fit = PolynomialFamily(Xtr[fit_idx], D=3)

        def uniform_val(lam):
            c, b = kernel_ridge(fam_fit.uniform_gram(), ytr[fit_idx], lam)
            return np.mean((fam_fit.uniform_cross(Xtr[val_idx]) @ c + b - ytr[val_idx]) ** 2)

        def sgd_val(lam):
            res = sgd.fit(fam_fit, ytr[fit_idx], lam=lam, T=T, seed=seed)
            return np.mean((fam_fit.predict(res, Xtr[val_idx]) - ytr[val_idx]) ** 2)

        t0 = time.perf_counter()
        lam_uni, val_uni = select(UNIFORM_RIDGES, uniform_val)
        sel_uni = time.perf_counter() - t0
        t0 = time.perf_counter()
        lam_sgd, val_sgd = select(SGD_LAMS, sgd_val)
        sel_sgd = time.perf_counter() - t0

        t0 = time.perf_counter()
        fam = PolynomialFamily(Xtr, D=3)
        c, b = kernel_ridge(fam.uniform_gram(), ytr, lam_uni)
        uni_mse = float(np.mean((fam.uniform_cross(Xte) @ c + b - yte) ** 2))
        t_uni = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = sgd.fit(PolynomialFamily(Xtr, D=3), ytr, lam=lam_sgd, T=T, seed=seed)
        t_sgd = time.perf_counter() - t0
        mse = float(np.mean((fam.predict(res, Xte) - yte) ** 2))
        rows.append({"r": r, "n_kernels": fam.size, "sgd_mse": mse, "sgd_seconds": t_sgd, "sgd_T": T,
                     "sgd_lam": lam_sgd, "sgd_validation_mse": val_sgd, "sgd_select_seconds": sel_sgd,
                     "sgd_selected": int(res.n_active), "sgd_objective": float(res.objective),
                     "uniform_mse": uni_mse, "uniform_lam": lam_uni, "uniform_validation_mse": val_uni,
                     "uniform_seconds": t_uni, "uniform_select_seconds": sel_uni,
                     "target_variance": float(np.var(yte)), "load_average_before": load})
        print(f"poly r={r:3d} |I|={fam.size:>9d} SGD-1s lam={lam_sgd:g} mse={mse:.4f} ({t_sgd:.1f}s, "
              f"{res.n_active} kernels) UNIFORM lam={lam_uni:g} mse={uni_mse:.4f} ({t_uni:.1f}s) load {load}",
              flush=True)
    return rows


def gaussian_specs(d):
    specs = [KernelSpec.gaussian(w) for w in np.geomspace(0.5, 50.0, 10) * np.sqrt(d) / 4]
    specs += [KernelSpec.gaussian(w, (j,)) for j in range(d) for w in (0.3, 1.0, 3.0)]
    return specs


def _methods(eng, y, lam_gcd=None, C=None):
    """name -> (callable fitting on ``eng``/``y`` for a hyper-parameter value, grid)."""
    return {
        "UNIFORM": (lambda v: baselines.uniform(eng, y, C=v), SVM_CS),
        "AMKL": (lambda v: baselines.alignment(eng, y, C=v), SVM_CS),
        "GCD-1s": (lambda v: gcd.fit_one_stage(eng, y, lam=v, max_iter=GCD1_MAX_ITER, tol=GCD1_TOL, variant="away"),
                   GCD1_LAMS),
        "GCD-2s (align)": (lambda v: gcd.fit_two_stage(eng, y, criterion="alignment", C=v), SVM_CS),
        "GCD-2s (eucl)": (lambda v: gcd.fit_two_stage(eng, y, criterion="euclidean", C=v, max_iter=300), SVM_CS),
    }


GCD1_TOL, GCD1_MAX_ITER = 1e-3, 300


def _error(res, bank, X, y):
    f = res.decision_function_from_kernels(bank.cross(X, kernels=res.active.tolist()))
    return float(np.mean(np.sign(f) != y))


def classification_part(names, n_train, n_test, workdir, seed=0):
    rows = []
    for name in names:
        load = [round(x, 2) for x in os.getloadavg()]
        if name == "digits":
            data = datasets.load("digits")
        else:
            data = datasets.load(name, n_samples=n_train + n_test, seed=seed)
        rng = np.random.default_rng(seed)
        perm = rng.permutation(data.n_samples)
        tr, te = perm[:n_train], perm[n_train:n_train + n_test]
        Xtr, ytr, Xte, yte = data.X[tr], data.y[tr], data.X[te], data.y[te]
        specs = gaussian_specs(data.n_features)
        fit_idx, val_idx = validation_split(tr.size, seed)
        bank_fit = build_bank(Xtr[fit_idx], specs, workdir / f"{name}_fit", normalize=None, dtype="float64",
                              overwrite=True, progress=False)
        eng_fit = Engine(bank_fit)
        bank = build_bank(Xtr, specs, workdir / name, normalize=None, dtype="float64", overwrite=True,
                          progress=False)
        eng = Engine(bank)
        task = {"dataset": name, "n_train": int(tr.size), "n_test": int(te.size), "n_validation": int(val_idx.size),
                "M": eng.M, "load_average_before": load, "methods": {}}
        full = _methods(eng, ytr)
        for method, (fit_val, grid) in _methods(eng_fit, ytr[fit_idx]).items():
            t0 = time.perf_counter()
            value, val_err = select(grid, lambda v: _error(fit_val(v), bank_fit, Xtr[val_idx], ytr[val_idx]))
            sel = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = full[method][0](value)
            secs = time.perf_counter() - t0
            err = _error(res, bank, Xte, yte)
            entry = {"test_error": err, "seconds": secs, "iterations": len(res.history),
                     "n_active": int(res.n_active), "converged": bool(res.converged),
                     "alignment": res.params.get("alignment"), "select_seconds": sel,
                     "hyper_parameter": {"lam" if method == "GCD-1s" else "C": value},
                     "validation_error": {str(k): v for k, v in val_err.items()}}
            if method == "GCD-1s":
                entry.update(relative_gap=float(res.gap), tol=GCD1_TOL, max_iter=GCD1_MAX_ITER, variant="away",
                             away_steps=sum(1 for h in res.history if h.get("step") in ("away", "drop")))
                t0 = time.perf_counter()
                fw = gcd.fit_one_stage(eng, ytr, lam=value, max_iter=GCD1_MAX_ITER, tol=GCD1_TOL, variant="fw")
                entry["plain_frank_wolfe"] = {"iterations": len(fw.history), "converged": bool(fw.converged),
                                              "relative_gap": float(fw.gap), "seconds": time.perf_counter() - t0,
                                              "test_error": _error(fw, bank, Xte, yte),
                                              "objective_over_away": float(fw.objective / res.objective)}
            task["methods"][method] = entry
            print(f"{name:9s} {method:15s} {entry['hyper_parameter']} err={err:.3f} {secs:6.2f}s "
                  f"it={len(res.history):3d} conv={res.converged} active={res.n_active} (select {sel:.1f}s)"
                  + (f" | plain FW it={entry['plain_frank_wolfe']['iterations']} "
                     f"conv={entry['plain_frank_wolfe']['converged']}" if method == "GCD-1s" else ""), flush=True)
        errs = {m: v["test_error"] for m, v in task["methods"].items()}
        order = sorted(errs, key=errs.get)
        for m in errs:  # average ranks for ties
            tied = [i + 1 for i, o in enumerate(order) if errs[o] == errs[m]]
            task["methods"][m]["rank"] = float(np.mean(tied))
        rows.append(task)
        eng.close()
        eng_fit.close()
    methods = list(rows[0]["methods"]) if rows else []
    summary = {m: {"median_rank": float(np.median([t["methods"][m]["rank"] for t in rows])),
                   "mean_seconds": float(np.mean([t["methods"][m]["seconds"] for t in rows])),
                   "mean_iterations": float(np.mean([t["methods"][m]["iterations"] for t in rows])),
                   "all_converged": all(t["methods"][m]["converged"] for t in rows)}
               for m in methods}
    return rows, summary


METHOD_COLOURS = {"UNIFORM": "tab:gray", "AMKL": "tab:olive", "GCD-1s": "tab:blue", "GCD-2s (align)": "tab:orange",
                  "GCD-2s (eucl)": "tab:green", "GCD-1s plain FW": "tab:purple"}


def make_plots(out: dict, stem: str) -> list[str]:
    """Draw the two figures from a result dict; returns the file names (under results/)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    poly = out["polynomial"]
    rs = [x["r"] for x in poly]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    ax.plot(rs, [x["sgd_mse"] for x in poly], "o-", label="SGD-1s (D = 3)")
    ax.plot(rs, [x["uniform_mse"] for x in poly], "s-", label="UNIFORM (degree <= 3)")
    ax.plot(rs, [x["target_variance"] for x in poly], "k:", label="test variance of y")
    for x in poly:
        ax.annotate(f"{x['n_kernels']:.0e}", (x["r"], x["sgd_mse"]), textcoords="offset points", xytext=(4, -10),
                    fontsize=7)
    ax.set(xscale="log", yscale="log", xlabel="r (base kernels); labels: kernels in the family",
           ylabel="test MSE", title="Polynomial family: test MSE (ridges chosen on validation)")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(rs, [x["sgd_seconds"] for x in poly], "o-", label=f"SGD-1s, T = {poly[0]['sgd_T']}")
    ax.plot(rs, [x["uniform_seconds"] for x in poly], "s-", label="UNIFORM")
    ax.set(xscale="log", yscale="log", xlabel="r", ylabel="seconds (final fit)", title="Training time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    names.append(f"{stem}_poly.png")
    fig.savefig(HERE / "results" / names[-1], dpi=110)
    plt.close(fig)

    tasks = out["classification"]
    methods = list(tasks[0]["methods"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(methods)
    xs = np.arange(len(tasks))
    for j, m in enumerate(methods):
        off = xs + (j - (len(methods) - 1) / 2) * width
        axes[0].bar(off, [t["methods"][m]["test_error"] for t in tasks], width, label=m, color=METHOD_COLOURS[m])
        axes[1].bar(off, [t["methods"][m]["rank"] for t in tasks], width, label=m, color=METHOD_COLOURS[m])
    it_methods = [m for m in methods if m not in ("UNIFORM", "AMKL")] + ["GCD-1s plain FW"]
    width_it = 0.8 / len(it_methods)
    for j, m in enumerate(it_methods):
        off = xs + (j - (len(it_methods) - 1) / 2) * width_it
        entries = [t["methods"]["GCD-1s"]["plain_frank_wolfe"] if m == "GCD-1s plain FW" else t["methods"][m]
                   for t in tasks]
        bars = axes[2].bar(off, [e["iterations"] for e in entries], width_it, label=m, color=METHOD_COLOURS[m])
        for bar, e in zip(bars, entries):
            if not e["converged"]:
                bar.set_hatch("//")
                bar.set_edgecolor("black")
    labels = [t["dataset"] for t in tasks]
    axes[0].set(xticks=xs, xticklabels=labels, ylabel="test error", title="Test error (hyper-parameters on validation)")
    axes[1].set(xticks=xs, xticklabels=labels, ylabel="rank (1 = best)", title="Rank per task")
    axes[2].set(xticks=xs, xticklabels=labels, ylabel="iterations", yscale="log",
                title="Iterations to stop (hatched: cap reached)")
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    names.append(f"{stem}_classification.png")
    fig.savefig(HERE / "results" / names[-1], dpi=110)
    plt.close(fig)
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (minutes on 2 cores)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plots from the recorded JSON")
    args = ap.parse_args(argv)
    stem = f"bench_sgd_gcd{'_quick' if args.quick else ''}"
    path = HERE / "results" / f"{stem}.json"
    if args.plot_only:
        out = json.loads(path.read_text())
        out["plots"] = make_plots(out, stem)
        path.write_text(json.dumps(out, indent=2))
        print("wrote", ", ".join(out["plots"]))
        return
    if args.quick:
        rs, n_poly, n_poly_test, T = (5, 10, 20, 50, 100), 300, 500, 300
        n_train, n_test = 200, 500
    else:
        rs, n_poly, n_poly_test, T = (5, 10, 20, 50, 100), 500, 1000, 800
        n_train, n_test = 500, 1000
    workdir = Path(tempfile.mkdtemp(prefix="bench_sgd_gcd_", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        machine = describe_machine(workdir)
        poly = polynomial_part(rs, n_poly, n_poly_test, T)
        tasks, summary = classification_part(("ringnorm", "waveform", "digits"), n_train, n_test, workdir)
        out = {"machine": machine, "quick": args.quick,
               "protocol": {"validation_share_of_training": 0.2, "uniform_ridges": UNIFORM_RIDGES,
                            "sgd_lams": SGD_LAMS, "svm_Cs": SVM_CS, "gcd1s_lams": GCD1_LAMS,
                            "gcd1s_tol_relative_gap": GCD1_TOL, "gcd1s_max_iter": GCD1_MAX_ITER,
                            "sgd_average_from": 0.5},
               "polynomial": poly, "classification": tasks, "classification_summary": summary,
               "total_seconds": time.perf_counter() - t0, "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["plots"] = make_plots(out, stem)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path} and {', '.join(out['plots'])}")
    for m, s in summary.items():
        print(f"{m:15s} median rank {s['median_rank']:.1f}  mean {s['mean_seconds']:.2f}s  "
              f"iterations {s['mean_iterations']:.1f}  all converged {s['all_converged']}")


if __name__ == "__main__":
    main()
