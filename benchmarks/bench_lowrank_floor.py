"""Low-rank accuracy against its floor: factor banks beside the best rank-r approximation (issue 32, item 3).

    python benchmarks/bench_lowrank_floor.py                                  # ringnorm, waveform, twonorm at n = 2000
    python benchmarks/bench_lowrank_floor.py --datasets breast_cancer --ranks 32 64 128 256
    python benchmarks/bench_lowrank_floor.py --datasets ringnorm --n 500 --M 8 --ranks 16 64   # a smoke run

The protocol of ``bench_factor.py --accuracy`` (its ``_data``: training rows with seed 0, 2000 test rows with
seed 1, waveform as class 0 against the rest; M Gaussian kernels on random feature subsets, unit trace),
SMO-MKL at its defaults (C = "auto" = n, tol 1e-3). Per dataset, the dense bank's test accuracy, then per
rank r:

- **best rank-r** (the floor): each unit-trace kernel K_m replaced by its truncated eigendecomposition
  U_r diag(lam_r) U_r^T, rescaled to unit trace as the factor banks are (the best rank-r approximation in
  every unitarily invariant norm, Eckart-Young-Mirsky); new points by the Nystrom extension with every
  training row a landmark, K~(x, X) = K(x, X) U_r U_r^T / sum(lam_r). Fitted on an in-memory factor engine.
- **Nystrom** factor banks with landmarks by k-means++ (the default), uniformly, or by ridge leverage scores
  (recursive RLS-Nystrom, Musco & Musco 2017: ``landmarks="rls"``);
- **pivoted Cholesky** to relative residual trace 1e-3, at most r columns (a per-kernel rank chosen to a
  tolerance; the mean rank it used is recorded).

Recorded per (dataset, rank, method): test accuracy, minus dense (points), the median relative trace error
(tr K - tr K~) / tr K of the kernels, fit seconds, the kept kernels and the certified gap. Rows of earlier
runs at other (dataset, n, rank, method) are kept, so datasets can be run separately. The target: every
method within 0.5 points of dense at the smallest rank where the best rank-r approximation is (the table
says where not). Results: benchmarks/results/bench_lowrank_floor.json; the table is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_factor import _data  # noqa: E402
from machine import describe_machine, write_record  # noqa: E402

RESULT = HERE / "results" / "bench_lowrank_floor.json"
#: factor banks compared with the floor: (label, build_bank keywords)
FACTOR_METHODS = (("nystrom k-means++", {"method": "nystrom", "landmarks": "kmeans++"}),
                  ("nystrom uniform", {"method": "nystrom", "landmarks": "uniform"}),
                  ("nystrom rls", {"method": "nystrom", "landmarks": "rls"}),
                  ("cholesky tol 1e-3", {"method": "cholesky", "tol": 1e-3}))


def _accuracy(f: np.ndarray, yt: np.ndarray) -> float:
    return float(np.mean(np.where(f > 0, 1.0, -1.0) == yt))


def _fit(engine, y):
    from mklscale.solvers.registry import fit_solver, resolve_C

    C = resolve_C("smo", engine, [y], "classification", {}, "auto")
    t0 = time.perf_counter()
    res = fit_solver("smo", engine, y, "classification", C=C)
    return res, time.perf_counter() - t0


def _summary(res, seconds: float, accuracy: float) -> dict:
    return {"accuracy": accuracy, "fit_s": seconds, "active": int(res.active.size), "gap": float(res.gap),
            "converged": bool(res.converged)}


def dense_and_floor(X, y, Xt, yt, specs, ranks, workdir: Path) -> list[dict]:
    """The dense bank's row, then the best rank-r row for every r (eigendecompositions of its kernels)."""
    from mklscale.bank import build_bank
    from mklscale.engine import Engine
    from mklscale.engine.memory import InMemoryFactorEngine
    from mklscale.model import MKLModel

    bank = build_bank(X, specs, workdir / "dense", progress=False)
    with Engine(bank) as engine:
        res, seconds = _fit(engine, y)
    model = MKLModel.from_results(bank, res, "classification", classes=np.array([-1.0, 1.0]))
    rows = [{"method": "dense", "rank": "dense", "approx_error_median": 0.0,
             **_summary(res, seconds, _accuracy(model.decision_function(Xt), yt))}]
    n, top = bank.n, max(r for r in ranks if r < bank.n)
    t0 = time.perf_counter()
    eig = []
    for m in range(bank.M):       # the top eigenpairs of every unit-trace kernel, largest first (LAPACK syevd:
        lam, U = np.linalg.eigh(np.asarray(bank.kernel(m), dtype=np.float64))   # syevr's subset fails on these)
        eig.append((np.maximum(lam[::-1][:top], 0.0), np.ascontiguousarray(U[:, ::-1][:, :top])))
    eig_s = time.perf_counter() - t0
    cross = bank.cross(Xt)        # K_m(X_test, X), the training normalisation
    for r in ranks:
        if r >= n:
            continue
        lams = [lam[:r] for lam, _ in eig]
        L = np.stack([U[:, :r] * np.sqrt(lam / lam.sum()) for lam, (_, U) in zip(lams, eig)])
        res, seconds = _fit(InMemoryFactorEngine(L), y)
        f = np.full(Xt.shape[0], res.bias)
        for m in res.active:      # K~_m(x, X) c = K_m(x, X) U U^T c / sum(lam)
            U = eig[m][1][:, :r]
            f += res.weights[m] * (cross[m] @ (U @ (U.T @ res.dual_coef))) / lams[m].sum()
        rows.append({"method": "best rank-r", "rank": r, "eig_s_all_ranks": eig_s,
                     "approx_error_median": float(np.median([1.0 - lam.sum() for lam in lams])),
                     **_summary(res, seconds, _accuracy(f, yt))})
        print(rows[-1], flush=True)
    shutil.rmtree(workdir / "dense", ignore_errors=True)
    return rows


def factor_rows(X, y, Xt, yt, specs, ranks, workdir: Path) -> list[dict]:
    """One row per (factor method, rank): build the factor bank, fit, predict."""
    from mklscale.bank import build_bank
    from mklscale.engine import Engine
    from mklscale.model import MKLModel

    rows = []
    for r in ranks:
        if r >= X.shape[0]:
            continue
        for label, kw in FACTOR_METHODS:
            path = workdir / f"r{r}-{label.replace(' ', '_')}"
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")      # the build's "large trace error" warning at small ranks
                bank = build_bank(X, specs, path, rank=r, progress=False, max_error=1.0, **kw)
            build_s = time.perf_counter() - t0
            with Engine(bank) as engine:
                res, seconds = _fit(engine, y)
            model = MKLModel.from_results(bank, res, "classification", classes=np.array([-1.0, 1.0]))
            rows.append({"method": label, "rank": r, "build_s": build_s, "mean_rank_used": float(np.mean(bank.ranks)),
                         "approx_error_median": float(np.median(bank.approx_error)),
                         **_summary(res, seconds, _accuracy(model.decision_function(Xt), yt))})
            print(rows[-1], flush=True)
            shutil.rmtree(path, ignore_errors=True)
    return rows


def main() -> None:
    from mklscale.bank import families

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["ringnorm", "waveform", "twonorm"])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--M", type=int, default=50)
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/mklscale-bench/lowrank-floor"))
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(args.workdir)
    for name in args.datasets:
        X, y, Xt, yt = _data(args.n, 2000, name)
        specs = families.random_subsets(X.shape[1], args.M, seed=0)
        rows = dense_and_floor(X, y, Xt, yt, specs, args.ranks, args.workdir)
        rows += factor_rows(X, y, Xt, yt, specs, args.ranks, args.workdir)
        dense = rows[0]["accuracy"]
        for row in rows:
            row.update(dataset=name, n=int(X.shape[0]), M=args.M, n_test=int(Xt.shape[0]),
                       accuracy_minus_dense=100.0 * (row["accuracy"] - dense))
        # keep earlier runs' rows for other (dataset, n, M); write after every dataset
        old = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
        kept = [x for x in old if (x["dataset"], x["n"], x["M"]) != (name, int(X.shape[0]), args.M)]
        write_record({"machine": dict(machine), "rows": kept + rows}, args.out)


if __name__ == "__main__":
    main()
