"""Factor banks (issue 17): MKL at n in the tens of thousands, each kernel stored as L_m (n x r).

    python benchmarks/bench_factor.py --scale            # n = 50,000, M = 1,000, r = 64: build + SpicyMKL
                                                         # (logistic) + prediction of 10^5 rows, peak RSS
    python benchmarks/bench_factor.py --half-million     # n = 500,000, M = 100, r = 64 (12.8 GB): the same
                                                         # items, targets 30 min and 8 GB peak RSS
    python benchmarks/bench_factor.py --half-million-hinge   # the same bank, SpicyMKL with the hinge loss
    python benchmarks/bench_factor.py --half-million-smo     # the same bank, SMO-MKL's problem (P) at C = 100
                                                         # ("auto": its primal method, smo_primal.py)
    python benchmarks/bench_factor.py --many-active      # the --scale bank at C = 0.0018 C_max: ~120 kernels
                                                         # active (target: >= 100 active, under 300 s)
    python benchmarks/bench_factor.py --vs-dense         # every solver at its defaults on the dense bank and on
                                                         # factor banks of the same kernels, interleaved
    python benchmarks/bench_factor.py --n-slope          # fit time over n = 2000 ... 50,000 (M = 100, r = 64)
    python benchmarks/bench_factor.py --accuracy         # factor vs dense test accuracy, ranks 32 ... 256
    python benchmarks/bench_factor.py --larger-than-memory   # n = 10,000, M = 10,000, r = 64 (~26 GB bank)
    python benchmarks/bench_factor.py --quick            # every item at tiny sizes (a smoke test)

Protocol (as bench_scaling.py): ringnorm (``load("ringnorm", n_samples=n, seed=0)``, test rows drawn
with seed 1), Gaussian kernels on random feature subsets (``families.random_subsets(20, M, seed=0)``),
unit trace, float32; factor banks by Nystrom on k-means++ landmarks drawn per kernel. SpicyMKL
logistic, block-1 penalty (on a factor bank its "auto" method is the primal block descent,
``method="bcd"``), C = C_PER_N * n (6e-5 n: 0.3 at n = 5000, 3 at n = 50,000; the loss
is a sum over the n points, so C grows with n to keep a comparable number of active kernels across
sizes), tol 1e-3; ``--many-active``: C = MANY_ACTIVE_FRACTION x C_max, ~120 kernels active. (Before
the block descent, SpicyMKL's proximal Newton step on factors cost O(n R^2) with R = r x (kernels in the
Newton system): at n = 5000, M = 1000, r = 64 C = 0.05 kept ~100 kernels active and took 309 s.) Each item runs in its own process
(``--item`` re-invokes this script), so the peak RSS recorded (``ru_maxrss`` of that process) is the
item's own. Results: benchmarks/results/bench_factor_<item>.json; README via make_readme.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
import timeit
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine  # noqa: E402

RESULTS = HERE / "results"
C_PER_N = 6e-5
#: --many-active: C = this x C_max keeps ~120 of the 1000 kernels active at n = 50,000 (issue 32: >= 100),
#: whose factors (12.8 MB each) need a working set above the engine's 2 GB default
MANY_ACTIVE_FRACTION = 0.0018
MANY_ACTIVE_BYTES = "4GB"
#: --half-million-smo: SMO-MKL's C; its (P) is SpicyMKL's hinge problem at lam ~ 24 (lam C = Omega(w(lam))),
#: next to --half-million-hinge's 30. The registry's default C = n / mean trace (500,000 here) is a near
#: hard-margin machine whose lam ~ 0.01 is far down the path.
HALF_MILLION_SMO_C = 100.0


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _data(n: int, n_test: int, name: str = "ringnorm"):
    from mklscale.datasets import load

    if name == "breast_cancer":
        ds = load(name)
        rng = np.random.default_rng(0)
        order = rng.permutation(ds.X.shape[0])
        cut = int(0.7 * order.size)
        return ds.X[order[:cut]], ds.y[order[:cut]], ds.X[order[cut:]], ds.y[order[cut:]]
    train, test = load(name, n_samples=n, seed=0), load(name, n_samples=n_test, seed=1)
    y, yt = np.asarray(train.y), np.asarray(test.y)
    if name == "waveform":  # class 0 against the rest
        y, yt = np.where(y == y.max(), 1.0, -1.0), np.where(yt == y.max(), 1.0, -1.0)
    return train.X, y, test.X, yt


def fit_and_score(X, y, Xt, yt, specs, path: Path, rank: int | None, solver: str = "spicy",
                  c_fraction: float | None = None, working_set_bytes: str | None = None,
                  loss: str = "logistic", C: float | None = None) -> dict:
    """Build (or reuse) the bank, fit ``solver``, predict the test rows; seconds of each stage. SpicyMKL's
    C is C_PER_N n, or ``c_fraction`` x C_max (``spicy.c_max``: one pass, counted in the fit's seconds);
    its loss ``loss``; ``C`` given: that C (else the other solvers' registry default)."""
    from mklscale.bank import build_bank
    from mklscale.engine import Engine
    from mklscale.model import MKLModel
    from mklscale.solvers.registry import fit_solver

    t0 = time.perf_counter()
    kw = {} if rank is None else {"rank": rank}
    bank = build_bank(X, specs, path, progress=False, **kw)
    t_build = time.perf_counter() - t0
    with Engine(bank) as engine:
        t0 = time.perf_counter()
        params = {"loss": loss, "tol": 1e-3} if solver == "spicy" else {}
        if working_set_bytes:
            params["working_set_bytes"] = working_set_bytes
        if C is None and solver == "spicy":
            C = C_PER_N * len(y)
        if c_fraction is not None:
            from mklscale.solvers import spicy

            C = c_fraction * spicy.c_max(engine, y, loss)
        res = fit_solver(solver, engine, y, "classification", C=C, params=params)
        t_fit = time.perf_counter() - t0
        passes = engine.counters().passes
    t0 = time.perf_counter()
    model = MKLModel.from_results(bank, res, "classification", classes=np.array([-1.0, 1.0]))
    f = model.decision_function(Xt)
    t_predict = time.perf_counter() - t0
    out = {"build_s": t_build, "fit_s": t_fit, "predict_s": t_predict, "passes": int(passes),
           "accuracy": float(np.mean(np.where(f > 0, 1.0, -1.0) == yt)), "active": int(res.active.size),
           "gap": float(res.gap), "converged": bool(res.converged), "objective": float(res.objective),
           "bank_GB": bank.nbytes / 1e9, "model_bytes": int(sum(a.nbytes for a in model.arrays().values())),
           "C": C if C is not None else res.params.get("C"), "method": res.params.get("method"), "solver": solver,
           "loss": {"spicy": loss, "smo": "hinge"}.get(solver)}
    if rank is not None:
        rel = np.asarray(bank.approx_error)  # (tr K - tr K~) / tr K per kernel
        out["approx_error_rel"] = {"median": float(np.median(rel)), "max": float(rel.max())}
    return out


def item_scale(args) -> dict:
    from mklscale.bank import families

    n, M, r = args.n, args.M, args.rank
    X, y, Xt, yt = _data(n, args.n_test)
    specs = families.random_subsets(X.shape[1], M, seed=0)
    path = Path(args.workdir) / f"factor-n{n}-M{M}-r{r}"
    t0 = time.perf_counter()
    res = fit_and_score(X, y, Xt, yt, specs, path, r, args.solver, c_fraction=args.c_fraction,
                        working_set_bytes=args.working_set_bytes, loss=args.loss, C=args.C)
    res.update(total_s=time.perf_counter() - t0, n=n, M=M, rank=r, n_test=args.n_test, peak_rss_GB=_peak_rss_gb(),
               C_fraction=args.c_fraction, working_set_bytes=args.working_set_bytes)
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)
    return res


def item_accuracy(args) -> dict:
    from mklscale.bank import families

    rows = []
    for name in args.datasets:
        for n in args.sizes:
            X, y, Xt, yt = _data(n, 2000, name)
            specs = families.random_subsets(X.shape[1], args.M, seed=0)
            for solver in ("spicy", "smo"):
                dense = fit_and_score(X, y, Xt, yt, specs, Path(args.workdir) / f"acc-{name}-{n}-dense", None, solver)
                rows.append({"dataset": name, "n": int(X.shape[0]), "solver": solver, "rank": "dense", **dense})
                for r in args.ranks:
                    if r >= X.shape[0]:
                        continue
                    res = fit_and_score(X, y, Xt, yt, specs, Path(args.workdir) / f"acc-{name}-{n}-r{r}", r, solver)
                    rows.append({"dataset": name, "n": int(X.shape[0]), "solver": solver, "rank": r, **res,
                                 "accuracy_minus_dense": res["accuracy"] - dense["accuracy"]})
                    print(rows[-1], flush=True)
    return {"rows": rows}


def item_vs_dense(args) -> dict:
    """Every solver of ``args.solvers`` at its defaults (the registry's, as ``fit_solver`` gives them) on the
    dense bank and on factor banks of ranks ``args.ranks`` of the same specs, fitted in turn (dense, then
    each rank, ``args.repeats`` rounds): seconds (medians), each round's factor / dense ratio, bank bytes,
    held-out accuracy. Issue 32: a factor bank no slower than the dense bank whenever it is the smaller."""
    from mklscale.bank import build_bank, families
    from mklscale.engine import Engine
    from mklscale.model import MKLModel
    from mklscale.solvers.registry import fit_solver

    rows, floors = [], []
    for name in args.datasets:
        for n in args.sizes:
            X, y, Xt, yt = _data(n, 2000, name)
            specs = families.random_subsets(X.shape[1], args.M, seed=0)
            ranks = [None] + [r for r in args.ranks if r < X.shape[0]]
            banks = {r: build_bank(X, specs, Path(args.workdir) / f"vs-{name}-{n}-{r or 'dense'}", progress=False,
                                   **({} if r is None else {"rank": r})) for r in ranks}
            floors.append({"dataset": name, "n": int(X.shape[0]), **_combine_floor(banks, ranks, args.M, args.repeats)})
            print(floors[-1], flush=True)
            for solver in args.solvers:
                times = {r: [] for r in ranks}
                last = {}
                for _ in range(args.repeats):
                    for r in ranks:
                        with Engine(banks[r]) as engine:
                            t0 = time.perf_counter()
                            res = fit_solver(solver, engine, y, "classification")
                            times[r].append(time.perf_counter() - t0)
                        last[r] = res
                for r in ranks:
                    model = MKLModel.from_results(banks[r], last[r], "classification", classes=np.array([-1.0, 1.0]))
                    accuracy = float(np.mean(np.where(model.decision_function(Xt) > 0, 1.0, -1.0) == yt))
                    rows.append({"dataset": name, "n": int(X.shape[0]), "solver": solver, "rank": r or "dense",
                                 "bank_bytes": int(banks[r].nbytes), "seconds": times[r],
                                 "median_s": float(np.median(times[r])), "accuracy": accuracy,
                                 "gap": float(last[r].gap), "converged": bool(last[r].converged),
                                 "iterations": len(last[r].history),
                                 "smo_steps": int(sum(e.get("smo_steps") or 0 for e in last[r].history)),
                                 "ratios_to_dense": None if r is None else
                                 [a / b for a, b in zip(times[r], times[None])]})
                    print({k: v for k, v in rows[-1].items() if k != "seconds"}, flush=True)
            if not args.keep:
                for r in ranks:
                    shutil.rmtree(Path(args.workdir) / f"vs-{name}-{n}-{r or 'dense'}", ignore_errors=True)
    return {"rows": rows, "combine_floor": floors, "M": args.M, "repeats": args.repeats}


def _combine_floor(banks: dict, ranks: list, M: int, repeats: int) -> dict:
    """Seconds (medians of ``repeats``) to form the combined kernel sum_m K_m / M, the work of every solver
    that fits an SVM on a combination (uniform, easymkl, alignment, citi at each iteration): ``dense``, the
    dense bank's ``engine.combine`` (n^2 M additions of stored entries); per rank, the engine's combine on the
    factor bank and the floor of any code on this machine, one float32 BLAS product F F^T of the factors
    F = [L_1 ... L_M] / sqrt(M) (n x Mr) already in memory (n^2 M r multiply-adds)."""
    from mklscale.engine import Engine

    w = np.full(M, 1.0 / M)
    out = {}
    for r in ranks:
        with Engine(banks[r]) as engine:
            engine.combine(w)                      # the bank's pages in memory, as in the fits' second round
            out["dense" if r is None else f"engine_r{r}"] = float(np.median(
                timeit.repeat(lambda: engine.combine(w), number=1, repeat=repeats)))
            if r is not None:
                F = np.ascontiguousarray(engine.combine_factors(w), dtype=np.float32)
                out[f"blas_r{r}"] = float(np.median(timeit.repeat(lambda: F @ F.T, number=1, repeat=repeats)))
    return out


def run_item(item: str, argv: list[str]) -> dict:
    """Run ``item`` in a fresh process (so its peak RSS is its own) and return its JSON."""
    out = subprocess.run([sys.executable, __file__, "--item", item, *argv], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", action="store_true")
    p.add_argument("--half-million", action="store_true")
    p.add_argument("--half-million-hinge", action="store_true")
    p.add_argument("--many-active", action="store_true")
    p.add_argument("--half-million-smo", action="store_true")
    p.add_argument("--loss", default="logistic", help=argparse.SUPPRESS)
    p.add_argument("--solver", default="spicy", help=argparse.SUPPRESS)
    p.add_argument("--C", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--c-fraction", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--working-set-bytes", default=None, help=argparse.SUPPRESS)
    p.add_argument("--vs-dense", action="store_true")
    p.add_argument("--solvers", nargs="+", default=["spicy", "smo", "pfbs", "citi", "gcd", "sgd", "easymkl",
                                                      "alignment", "uniform"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n-slope", action="store_true")
    p.add_argument("--accuracy", action="store_true")
    p.add_argument("--larger-than-memory", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--item", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--M", type=int, default=1000)
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--n-test", type=int, default=100_000)
    p.add_argument("--sizes", type=int, nargs="+", default=[2000, 4000])
    p.add_argument("--ranks", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--datasets", nargs="+", default=["ringnorm", "twonorm", "waveform", "breast_cancer"])
    p.add_argument("--workdir", default="/tmp/mklscale-bench/factor")
    p.add_argument("--keep", action="store_true", help="keep the banks built")
    args, _ = p.parse_known_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)

    if args.item:
        fn = {"scale": item_scale, "accuracy": item_accuracy, "vs_dense": item_vs_dense}[args.item]
        print(json.dumps(fn(args)))
        return

    RESULTS.mkdir(exist_ok=True)
    machine = describe_machine(Path(args.workdir))
    base = ["--workdir", args.workdir] + (["--keep"] if args.keep else [])
    def record_scale(name: str, argv: list[str], targets: dict) -> None:
        """One "scale" item in its own process, its JSON written to results/``name`` and printed."""
        res = run_item("scale", base + argv)
        (RESULTS / name).write_text(json.dumps({"machine": machine, "result": res, "targets": targets}, indent=1))
        print(json.dumps(res, indent=1))

    half_million = ["--n", "500000", "--M", "100", "--rank", "64", "--n-test", str(args.n_test)]
    if args.scale or args.quick:
        record_scale("bench_factor_quick_scale.json" if args.quick else "bench_factor_scale.json",
                     ["--n", "3000", "--M", "20", "--n-test", "2000"] if args.quick else
                     ["--n", str(args.n), "--M", str(args.M), "--rank", str(args.rank), "--n-test", str(args.n_test)],
                     {"total_s": 120, "peak_rss_GB": 4, "note": "issue 32; issue 17's was 600 s"})
    if args.half_million:
        record_scale("bench_factor_half_million.json", half_million, {"total_s": 1800, "peak_rss_GB": 8})
    if args.half_million_hinge:
        record_scale("bench_factor_half_million_hinge.json", half_million + ["--loss", "hinge"],
                     {"total_s": 1800, "peak_rss_GB": 8})
    if args.half_million_smo:
        record_scale("bench_factor_half_million_smo.json",
                     half_million + ["--solver", "smo", "--C", str(HALF_MILLION_SMO_C)], {"total_s": 1800, "peak_rss_GB": 8})
    if args.many_active:
        record_scale("bench_factor_many_active.json",
                     ["--n", str(args.n), "--M", str(args.M), "--rank", str(args.rank), "--n-test", str(args.n_test),
                      "--c-fraction", str(MANY_ACTIVE_FRACTION), "--working-set-bytes", MANY_ACTIVE_BYTES],
                     {"total_s": 300, "active": 100})
    if args.vs_dense:
        argv = base + ["--M", str(args.M), "--sizes", *map(str, args.sizes), "--ranks", *map(str, args.ranks),
                       "--datasets", *args.datasets, "--solvers", *args.solvers, "--repeats", str(args.repeats)]
        res = run_item("vs_dense", argv)
        (RESULTS / "bench_factor_vs_dense.json").write_text(json.dumps(
            {"machine": machine, "command": "python benchmarks/bench_factor.py " + " ".join(sys.argv[1:]), **res},
            indent=1))
    if args.n_slope:
        rows = []
        for n in args.sizes:
            rows.append(run_item("scale", base + ["--n", str(n), "--M", str(args.M), "--rank", str(args.rank),
                                                  "--n-test", "2000"]))
            print(rows[-1], flush=True)
        ns, ts = np.log([r["n"] for r in rows]), np.log([r["fit_s"] for r in rows])
        slope = float(np.polyfit(ns, ts, 1)[0]) if len(rows) > 1 else float("nan")
        (RESULTS / "bench_factor_n_slope.json").write_text(json.dumps(
            {"machine": machine, "rows": rows, "slope_fit_s": slope, "dense_slope_before": 2.3,
             "target_slope": 1.3}, indent=1))
        print("slope", slope)
    if args.accuracy:
        argv = base + ["--M", str(args.M), "--sizes", *map(str, args.sizes), "--ranks", *map(str, args.ranks),
                       "--datasets", *args.datasets]
        res = run_item("accuracy", argv)
        # rows of earlier runs at other (dataset, n, solver, rank) are kept: sizes can be run separately
        path = RESULTS / "bench_factor_accuracy.json"
        key = lambda x: (x["dataset"], x["n"], x["solver"], str(x["rank"]))  # noqa: E731
        new = {key(x) for x in res["rows"]}
        old = json.loads(path.read_text())["rows"] if path.exists() else []
        rows = [x for x in old if key(x) not in new] + res["rows"]
        path.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    if args.larger_than_memory:
        res = run_item("scale", base + ["--n", "10000", "--M", "10000", "--rank", str(args.rank), "--n-test", "2000"])
        (RESULTS / "bench_factor_larger_than_memory.json").write_text(json.dumps(
            {"machine": machine, "result": res, "targets": {"fit_s": 900}}, indent=1))
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
