"""A results.json of real solver runs, built the way ``mklscale run`` writes it (schema_version 1),
for the report tests (tests/test_report.py, tests/test_report_browser.py): a small trace-normalised
bank on 60 rows of breast_cancer, SpicyMKL (logistic, block 1-norm) with its history, a one-vs-rest
style pair of SpicyMKL heads, a PFBS tau path, the uniform baseline (equal weights on every kernel)
and one failed solver. Kernel names carry the dataset's feature names.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from mklscale.solvers.result import json_safe

DESCRIPTION = "Gaussian and polynomial kernels on breast cancer rows: sparse SpicyMKL against PFBS and uniform weights."


def _kernel_entries(result, specs, head=None, names=None) -> list[dict]:
    return [{"index": int(m), "name": specs[m].label(names), "family": specs[m].family, "params": dict(specs[m].params),
             "features": None if specs[m].features is None else list(specs[m].features),
             "weight": float(result.weights[m]), "head": head} for m in result.active]


def _accuracy(result, bank, X, y) -> float:
    if result.active.size == 0:
        return float(np.mean(np.sign(result.bias) == y))
    f = result.decision_function_from_kernels(bank.cross(X, kernels=result.active))
    return float(np.mean(np.where(f >= 0.0, 1.0, -1.0) == y))


def _solver_entry(name, algorithm, results, specs, bank, data, heads=(None,), path=None, names=None) -> dict:
    """A results.json solver entry from one MKLResult per head (one-vs-rest heads are merged)."""
    X_tr, y_tr, X_te, y_te = data
    kernels, history = [], []
    for head, (res, sign) in zip(heads, results):
        kernels += _kernel_entries(res, specs, head, names)
        history += [{**{k: e[k] for k in ("iteration", "primal", "dual", "gap", "n_active", "passes",
                                             "bytes_read", "seconds") if k in e}, "head": head} for e in res.history]
    first = results[0][0]
    seconds = sum(r.history[-1]["seconds"] for r, _ in results if r.history)
    return json_safe({
        "name": name, "solver": algorithm, "params": first.params, "status": "ok", "error": None,
        "metrics": {"train_accuracy": _accuracy(first, bank, X_tr, results[0][1] * y_tr),
                    "test_accuracy": _accuracy(first, bank, X_te, results[0][1] * y_te)},
        "seconds": seconds, "passes": sum(r.history[-1]["passes"] for r, _ in results if r.history),
        "bytes_read": sum(r.history[-1]["bytes_read"] for r, _ in results if r.history),
        "converged": all(r.converged for r, _ in results), "objective": first.objective,
        "gap": max(r.gap for r, _ in results), "n_active": len({k["name"] for k in kernels}),
        "kernels": kernels, "history": history, "path": path, "model": f"models/{name}",
    })


def _path_entry(pfbs_path, specs) -> dict:
    ever = np.flatnonzero((pfbs_path.weights > 0.0).any(axis=0))
    return json_safe({
        "parameter": "tau", "values": pfbs_path.taus, "kernel_names": [specs[m].name for m in ever],
        "weights": pfbs_path.weights[:, ever], "n_active": [a.size for a in pfbs_path.active],
        "scores": None, "score_name": None,
    })


def build_results(run_dir, n_train: int = 60, n_test: int = 40, specs=None, name: str = "report-test") -> dict:
    """Build a bank, run the solvers and write ``run_dir/results.json``; returns the dict written."""
    from mklscale.bank import build_bank, families
    from mklscale.datasets import load
    from mklscale.engine import Engine
    from mklscale.solvers import paths, spicy

    ds = load("breast_cancer")
    order = np.random.default_rng(0).permutation(len(ds.y))
    tr, te = order[:n_train], order[n_train:n_train + n_test]
    if specs is None:
        specs = (families.gaussian([0.5, 1, 2, 4, 8, 16]) + families.polynomial([1, 2, 3])
                 + [s for j in (0, 7, 21) for s in families.gaussian([1, 4, 16], features=[j])]
                 + families.gaussian([2, 8], features=[3, 7, 20]) + families.polynomial([2], features=[0, 1]))
    bank = build_bank(ds.X[tr], specs, run_dir / "bank.zarr", progress=False)
    data = (ds.X[tr], ds.y[tr], ds.X[te], ds.y[te])
    with Engine(bank, threads=1) as engine:
        l1 = spicy.fit(engine, ds.y[tr], 0.5, loss="logistic", tol=1e-4)
        ovr = [(spicy.fit(engine, sign * ds.y[tr], C, loss="hinge", tol=1e-4), sign)
               for sign, C in ((1.0, 0.3), (-1.0, 0.1))]
        tau_path = paths.path(engine, ds.y[tr], n_taus=10, mu=1e-4, tol=1e-5, accelerated=True)
    pfbs_last = tau_path.results[-1]
    for e in pfbs_last.history:       # PFBS entries keep no "dual" in this run: must still plot
        e.pop("dual", None)
    names = ds.feature_names
    solvers = [
        _solver_entry("spicy_l1", "spicy", [(l1, 1.0)], specs, bank, data, names=names),
        _solver_entry("spicy_ovr", "spicy", ovr, specs, bank, data, heads=("1", "-1"), names=names),
        _solver_entry("pfbs_path", "pfbs", [(pfbs_last, 1.0)], specs, bank, data,
                      path=_path_entry(tau_path, specs), names=names),
        {"name": "uniform", "solver": "uniform", "params": {"C": None}, "status": "ok", "error": None,
         "metrics": {"train_accuracy": 0.9, "test_accuracy": 0.85}, "converged": True, "gap": 0.0, "passes": 1,
         "n_active": len(specs), "history": [{"iteration": 1, "n_active": len(specs), "seconds": 0.1, "head": None}],
         "kernels": [{"index": m, "name": spec.label(names), "family": spec.family, "params": dict(spec.params),
                      "features": None if spec.features is None else list(spec.features), "weight": 1.0 / len(specs),
                      "head": None} for m, spec in enumerate(specs)], "path": None, "model": "models/uniform"},
        {"name": "smo_broken", "solver": "smo", "params": {"C": 1.0}, "status": "failed",
         "error": "InvalidInputError: C must be > 0 <and> finite", "metrics": None, "history": None,
         "kernels": [], "path": None, "model": None},
    ]
    families_count = {}
    for s in specs:
        families_count[s.family] = families_count.get(s.family, 0) + 1
    results = {
        "schema_version": 1, "mklscale_version": "0.1.0",
        "pipeline": {"name": name, "description": DESCRIPTION, "path": "pipelines/report-test.toml",
                     "config": {"solvers": ["spicy"], "description": DESCRIPTION}},
        "started": "2026-11-22T07:00:00+00:00", "finished": "2026-11-22T07:00:09+00:00", "seconds": 9.1,
        "machine": {"cpus": 2, "memory": 8_000_000_000, "python": sys.version.split()[0]},
        "cluster": {"kind": "local", "dashboard": "http://127.0.0.1:8787/status", "workers": 1},
        "dataset": {"name": "breast_cancer", "task": "classification", "n_train": int(tr.size),
                    "n_test": int(te.size), "n_features": int(ds.X.shape[1]), "classes": [-1, 1],
                    "feature_names": list(names)},
        "bank": {"path": "bank.zarr", "M": len(specs), "n": int(tr.size), "dtype": "float32",
                 "normalize": "trace", "build_seconds": 0.5, "kernels_computed": len(specs),
                 "families": families_count},
        "solvers": solvers,
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    return results


def stability_record(run_dir, results: dict, values=(0.5,), n_resamples: int = 3) -> dict:
    """A real ``feature_stability`` record for the spicy_l1 entry of ``results``: SpicyMKL (logistic) refitted
    on ``n_resamples`` subsamples of the run's bank at each of ``values`` (``feature_selection.stability``)."""
    from mklscale.bank import KernelBank
    from mklscale.datasets import load
    from mklscale.engine import Engine
    from mklscale.feature_selection import importances, stability

    bank = KernelBank.open(run_dir / "bank.zarr")
    ds = load("breast_cancer")
    y = ds.y[np.random.default_rng(0).permutation(len(ds.y))[:bank.n]]
    d = int(ds.X.shape[1])
    with Engine(bank, threads=1) as engine:
        st = stability("spicy", engine, bank.specs, y, "classification", list(values), {"loss": "logistic"},
                       classes=[-1, 1], n_features=d, n_resamples=n_resamples, feature_names=ds.feature_names)
    kept = results["solvers"][0]["kernels"]
    imp = importances([None if k["features"] is None else tuple(k["features"]) for k in kept],
                      [k["weight"] for k in kept], d)
    return json_safe(st.to_record(imp))
