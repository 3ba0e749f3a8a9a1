"""skglm as a recorded peer on factor banks (issue 32): SpicyMKL against skglm's group-lasso solvers on the
same problem, both times in one run.

    python benchmarks/bench_skglm.py --sizes 10000       # n = 10,000, M = 50, r = 64 (recorded run)
    python benchmarks/bench_skglm.py --sizes 50000 --out benchmarks/results/bench_skglm_n50000.json
    python benchmarks/bench_skglm.py --M 200 --sizes 10000 --C 0.05 --repeats 1 --out ...   # ~60 active
    python benchmarks/bench_skglm.py --M 300 --sizes 10000 --losses square --fractions 0.003 --repeats 1 \
        --out benchmarks/results/bench_skglm_many_active_square.json     # 135 active (skglm: ~50 minutes)
    python benchmarks/bench_skglm.py --M 300 --sizes 10000 --losses logistic --fractions 0.0002 --repeats 1 \
        --out benchmarks/results/bench_skglm_many_active_logistic.json   # 100 active
    python benchmarks/bench_skglm.py --quick             # n = 1000, M = 10, one repeat (a smoke test)

The problem (``benchmarks/peers/skglm_group.py``): SpicyMKL's block-1 problem on a factor bank,
P(v, b) = sum_i loss(y_i, sum_m L_m v_m + b) + C sum_m ||v_m||, is the group lasso over Phi = [L_1 ... L_M]
(groups of r columns, unpenalised intercept); skglm's objective is P / n with alpha = C / n
(tests/test_skglm_peer.py). Logistic loss: ``LogisticGroup`` + ``WeightedGroupL2``, ``GroupProxNewton``;
square loss ((1/2)(y - f)^2): ``QuadraticGroup`` + ``GroupBCD``.

Protocol (bench_factor.py's): ringnorm (``load("ringnorm", n_samples=n, seed=0)``; square loss on the
same +-1 labels), M Gaussian kernels on random feature subsets (``families.random_subsets(20, M, seed=0)``),
unit trace, float32 factors of rank r (Nystrom on k-means++ landmarks). C = frac x C_max (C_max =
``spicy.c_max``, the smallest C keeping no kernel) for each of ``--fractions`` (ringnorm, M = 50, n = 10^4:
C_max = 22.6 (logistic); 0.03 C_max ~ the C = 0.6 of issue 32: 4 kernels active; 0.01: 5) or the
values ``--C``; the number of kernels active is recorded per row. Ours: ``spicy.fit`` (its "auto" method: on
a factor bank the primal block descent, ``method="bcd"``, recorded per row) on the bank's
engine (its passes read the bank), tol = ``--tol`` (relative duality gap, certified). skglm: on Phi
(float64, the same float32 factors widened, built once per size outside the timings), tol = ``--skglm-tol`` (its own stopping criterion). Each row
runs ours, skglm, ours, skglm, ... (``--repeats`` each, interleaved); times are medians, and the speed-up
is the median of the per-pair ratios skglm / ours. skglm's numba code is compiled by one small solve
per loss before any timing. Objective agreement: (P_skglm - P_ours) / |P_ours|, both evaluated in our
units (``skglm_group.objective`` for skglm; ``objective`` of our result, at the model returned).
Results: benchmarks/results/bench_skglm.json (``--quick``: bench_skglm_quick.json); README via make_readme.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))
from machine import describe_machine, write_record  # noqa: E402

RESULTS = HERE / "results"


def _bank(n: int, M: int, rank: int, workdir: Path):
    from bench_factor import _data
    from mklscale.bank import build_bank, families

    X, y, _, _ = _data(n, 10)
    specs = families.random_subsets(X.shape[1], M, seed=0)
    t0 = time.perf_counter()
    bank = build_bank(X, specs, workdir / f"skglm-n{n}-M{M}-r{rank}", progress=False, rank=rank)
    return bank, np.asarray(y, dtype=np.float64), time.perf_counter() - t0


def _warm_up(loss: str) -> None:
    """Compile skglm's numba code for ``loss`` on a tiny problem (kept out of the timings)."""
    import skglm_group

    rng = np.random.default_rng(0)
    L = rng.normal(size=(3, 40, 2))
    y = np.where(rng.normal(size=40) > 0, 1.0, -1.0)
    skglm_group.solve(*skglm_group.group_design(L), y, 1.0, loss, tol=1e-4)


def _ours(engine, y, C, loss, tol):
    from mklscale.solvers import spicy

    t0 = time.perf_counter()
    res = spicy.fit(engine, y, C, loss=loss, penalty="l1", tol=tol)
    return time.perf_counter() - t0, res


def _theirs(design, y, C, loss, tol):
    import skglm_group

    t0 = time.perf_counter()
    v, b = skglm_group.solve(*design, y, C, loss, tol=tol)
    return time.perf_counter() - t0, v, b


def run_size(n: int, args, workdir: Path) -> list[dict]:
    import skglm_group
    from mklscale.engine import Engine
    from mklscale.solvers import spicy

    bank, y, build_s = _bank(n, args.M, args.rank, workdir)
    rows = []
    with Engine(bank) as engine:
        t0 = time.perf_counter()
        design = skglm_group.group_design(engine.blocks(np.arange(engine.M), keep=False))
        design_s = time.perf_counter() - t0
        Phi, ptr, _ = design
        for loss in args.losses:
            c_max = spicy.c_max(engine, y, loss)
            for frac, C in ([(c / c_max, c) for c in args.C] if args.C else [(f, f * c_max) for f in args.fractions]):
                ours_s, theirs_s, ours_res, theirs_vb = [], [], None, None
                for _ in range(args.repeats):
                    t, ours_res = _ours(engine, y, C, loss, args.tol)
                    ours_s.append(t)
                    t, v, b = _theirs(design, y, C, loss, args.skglm_tol)
                    theirs_s.append(t)
                    theirs_vb = (v, b)
                v, b = theirs_vb
                P_theirs = skglm_group.objective(Phi, ptr, v, b, y, C, loss)
                P_ours = float(ours_res.objective)
                ratios = np.array(theirs_s) / np.array(ours_s)
                row = {
                    "n": n, "M": args.M, "rank": args.rank, "loss": loss, "C_fraction": frac, "C": C,
                    "ours_s": float(np.median(ours_s)), "skglm_s": float(np.median(theirs_s)),
                    "ours_runs_s": ours_s, "skglm_runs_s": theirs_s, "speedup": float(np.median(ratios)),
                    "ours_objective": P_ours, "skglm_objective": P_theirs,
                    "objective_rel_diff": (P_theirs - P_ours) / abs(P_ours),
                    "ours_gap": float(ours_res.gap), "ours_converged": bool(ours_res.converged),
                    "ours_active": int(ours_res.active.size), "skglm_active": skglm_group.active_groups(ptr, v),
                    "ours_passes": int(ours_res.history[-1].get("passes", 0)) if ours_res.history else 0,
                    "ours_method": ours_res.params.get("method"),
                    "build_s": build_s, "design_s": design_s,
                }
                rows.append(row)
                print(f"n {n} {loss:8s} C {C:9.4g} ({frac:g} C_max): ours {row['ours_s']:7.2f} s "
                      f"(active {row['ours_active']}, gap {row['ours_gap']:.1e})  skglm {row['skglm_s']:7.2f} s "
                      f"(active {row['skglm_active']})  skglm/ours {row['speedup']:.2f}  "
                      f"P diff {row['objective_rel_diff']:+.1e}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000])
    p.add_argument("--M", type=int, default=50)
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--losses", nargs="+", default=["logistic", "square"])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.03, 0.01, 0.003],
                   help="C as fractions of C_max (from few to many kernels active)")
    p.add_argument("--C", type=float, nargs="+", default=None, help="values of C instead of --fractions")
    p.add_argument("--tol", type=float, default=1e-5, help="our relative duality gap")
    p.add_argument("--skglm-tol", type=float, default=1e-8, help="skglm's stopping criterion")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workdir", default="/tmp/mklscale-bench/skglm")
    p.add_argument("--out", default=None, help="results file (default results/bench_skglm[_quick].json)")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.M, args.repeats = [1000], 10, 1
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(workdir)
    for loss in args.losses:
        _warm_up(loss)
    import skglm

    rows = []
    for n in args.sizes:
        rows += run_size(n, args, workdir)
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / ("bench_skglm_quick.json" if args.quick else "bench_skglm.json")
    settings = {k: getattr(args, k) for k in ("M", "rank", "losses", "fractions", "tol", "skglm_tol", "repeats")}
    write_record({"machine": machine, "skglm_version": skglm.__version__, "settings": settings, "rows": rows}, out)


if __name__ == "__main__":
    main()
