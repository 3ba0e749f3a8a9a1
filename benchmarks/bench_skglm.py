"""skglm as a recorded peer on factor banks (issue 32): SpicyMKL against skglm's group-lasso solvers on the
same problem, both times in one run.

    python benchmarks/bench_skglm.py --sizes 10000       # n = 10,000, M = 50, r = 64 (recorded run)
    python benchmarks/bench_skglm.py --sizes 50000 --out benchmarks/results/bench_skglm_n50000.json
    python benchmarks/bench_skglm.py --M 200 --sizes 10000 --C 0.05 --repeats 1 --out ...   # ~60 active
    python benchmarks/bench_skglm.py --M 300 --sizes 10000 --losses square --fractions 0.003 --repeats 1 \
        --out benchmarks/results/bench_skglm_many_active_square.json     # 135 active (skglm: ~50 minutes)
    python benchmarks/bench_skglm.py --M 300 --sizes 10000 --losses logistic --fractions 0.0002 --skglm-cap 600 \
        --out benchmarks/results/bench_skglm_many_active_logistic.json   # 100 active (skglm: not done in 43 min)
    python benchmarks/bench_skglm.py --M 300 --sizes 50000 --losses logistic --fractions 0.0002 --skglm-cap 600 \
        --out benchmarks/results/bench_skglm_n50000_many_active_logistic.json   # ~150 active
    python benchmarks/bench_skglm.py --M 300 --sizes 50000 --losses square --fractions 0.003 --skglm-cap 600 \
        --out benchmarks/results/bench_skglm_n50000_M300_square_frac0.003.json   # 83 active
    python benchmarks/bench_skglm.py --M 300 --sizes 50000 --losses square --fractions 0.0015 --skglm-cap 600 \
        --out benchmarks/results/bench_skglm_n50000_M300_square_frac0.0015.json  # ~150 active
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
(float64, the same float32 factors widened, outside the timings), tol = ``--skglm-tol`` (its own stopping criterion), in a
process of its own (``peers/skglm_run.py``: it builds Phi from the bank, compiles skglm's numba code on a tiny
problem, then times the solve; its verbose lines give its objective as it goes, and the first time that came
within MATCH_REL = 1e-5 of ours is recorded). ``--skglm-cap S`` stops it after S seconds of solving: the row
then records its last objective, a lower bound cap / ours on the ratio, and when the model of one of our epochs (the fit's
history) first reached the objective skglm had at the cap (cap / that: the ratio at equal objective); a
stopped run is not repeated (it would hit the same cap), ours still runs ``--repeats`` times. Each row
runs ours, skglm, ours, skglm, ... (``--repeats`` each, interleaved); times are medians, and the speed-up
is the median of the per-pair ratios skglm / ours. Objective agreement: (P_skglm - P_ours) / |P_ours|, both evaluated in our
units (``skglm_group.objective`` for skglm; ``objective`` of our result, at the model returned).
Results: benchmarks/results/bench_skglm.json (``--quick``: bench_skglm_quick.json), beside it a plot of both
objectives against time for the rows that recorded them (same name, .png); README via make_readme.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))
from machine import describe_machine, write_record  # noqa: E402

RESULTS = HERE / "results"
#: skglm "matches" our objective once its own is within this of ours, relative (issue 32: equal to 1e-5)
MATCH_REL = 1e-5


def _bank(n: int, M: int, rank: int, workdir: Path):
    from bench_factor import _data
    from mklscale.bank import build_bank, families

    X, y, _, _ = _data(n, 10)
    specs = families.random_subsets(X.shape[1], M, seed=0)
    t0 = time.perf_counter()
    bank = build_bank(X, specs, workdir / f"skglm-n{n}-M{M}-r{rank}", progress=False, rank=rank)
    return bank, np.asarray(y, dtype=np.float64), time.perf_counter() - t0


def _ours(engine, y, C, loss, tol):
    from mklscale.solvers import spicy

    t0 = time.perf_counter()
    res = spicy.fit(engine, y, C, loss=loss, penalty="l1", tol=tol)
    return time.perf_counter() - t0, res


def _theirs(bank_path: Path, y_path: Path, n: int, C: float, loss: str, tol: float, cap: float | None,
            P_ours: float) -> dict:
    """skglm's solve in a child process (``peers/skglm_run.py``), stopped at ``cap`` seconds of solving
    (None: never). Returns whether it finished, its seconds (the solve's own timing; the cap when stopped),
    its objective P in our units (at its solution; when stopped, the last it printed), its active groups
    (None when stopped), the seconds until its printed objective first came within ``MATCH_REL`` of ours
    (None if never) and its trajectory [(seconds, (P - P_ours) / |P_ours|)], thinned to at most 200 points."""
    import queue
    import subprocess
    import threading

    import skglm_run

    out = bank_path.parent / f"skglm-result-{bank_path.name}.json"
    out.unlink(missing_ok=True)
    child = subprocess.Popen([sys.executable, "-u", str(HERE / "peers" / "skglm_run.py"), str(bank_path),
                              str(y_path), repr(C), loss, repr(tol), str(out)], stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()

    def read():
        for line in child.stdout:
            lines.put((time.perf_counter(), line))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    started, trajectory, match_s, capped, last_P = None, [], None, False, float("nan")
    while True:
        wait = None if cap is None or started is None else max(0.0, started + cap - time.perf_counter())
        try:
            item = lines.get(timeout=wait)
        except queue.Empty:
            child.kill()
            capped = True
            break
        if item is None:
            break
        t, line = item
        if line.startswith("START"):
            started = t
            continue
        P = skglm_run.progress_objective(line, n)
        if P is not None and started is not None:
            last_P, rel = P, (P - P_ours) / abs(P_ours)
            trajectory.append((t - started, rel))
            if match_s is None and rel <= MATCH_REL:
                match_s = t - started
    child.wait()
    thinned = trajectory[::max(1, len(trajectory) // 200)] + trajectory[-1:]
    if capped or child.returncode != 0:
        if not capped:
            raise RuntimeError(f"skglm's child process failed (exit {child.returncode}); see its messages above")
        return {"finished": False, "seconds": float(cap), "objective": last_P, "active": None,
                "match_s": match_s, "trajectory": thinned}
    rec = json.loads(out.read_text())
    return {"finished": True, "seconds": rec["seconds"], "objective": rec["objective"], "active": rec["active"],
            "match_s": match_s, "trajectory": thinned, "design_s": rec["design_s"]}


def _first_below(trajectory: list, level: float) -> float | None:
    """The first time in [(seconds, relative objective)] at which the objective is <= level (None: never)."""
    return next((t for t, rel in trajectory if rel <= level), None)


def plot_trajectories(rows: list[dict], png: Path) -> None:
    """Objective above the better of the two final objectives, relative, against seconds, ours beside skglm,
    one panel per row (log y); written only for rows that recorded both trajectories. Ours is the objective of
    the model each epoch would return (SpicyMKL's model from the epoch's dual point, ``bcd.py``): not the
    iterate's own objective, which falls monotonically, so it rises where kernels join the working set."""
    rows = [r for r in rows if r.get("ours_trajectory") and r.get("skglm_trajectory")]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4), squeeze=False)
    for ax, r in zip(axes[0], rows):
        base = min(0.0, r["objective_rel_diff"])  # both trajectories are relative to our final objective
        for key, label in (("ours_trajectory", "mklscale: each epoch's model"), ("skglm_trajectory", "skglm")):
            t, rel = np.array(r[key]).T
            ax.semilogy(t, np.maximum(rel - base, 1e-10), marker=".", label=label)
        if not r["skglm_finished"]:
            ax.axvline(r["skglm_cap_s"], color="grey", ls=":", label=f"skglm stopped ({r['skglm_cap_s']:.0f} s)")
        ax.set(title=f"n = {r['n']}, M = {r['M']}, {r['loss']}, {r['ours_active']} active", xlabel="seconds",
               ylabel="(P - P_best) / |P_best|")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {png}")


def run_size(n: int, args, workdir: Path) -> list[dict]:
    from mklscale.engine import Engine
    from mklscale.solvers import spicy

    bank, y, build_s = _bank(n, args.M, args.rank, workdir)
    y_path = workdir / f"skglm-y-n{n}.npy"
    np.save(y_path, y)
    rows = []
    with Engine(bank) as engine:
        for loss in args.losses:
            c_max = spicy.c_max(engine, y, loss)
            for frac, C in ([(c / c_max, c) for c in args.C] if args.C else [(f, f * c_max) for f in args.fractions]):
                ours_s, theirs, ours_res = [], [], None
                for _ in range(args.repeats):
                    t, ours_res = _ours(engine, y, C, loss, args.tol)
                    ours_s.append(t)
                    if not theirs or theirs[-1]["finished"]:  # a capped run is not repeated: it hits the same cap
                        theirs.append(_theirs(Path(bank.path), y_path, n, C, loss, args.skglm_tol, args.skglm_cap,
                                              float(ours_res.objective)))
                finished = all(x["finished"] for x in theirs)
                theirs_s = [x["seconds"] for x in theirs]
                P_ours, P_theirs = float(ours_res.objective), theirs[-1]["objective"]
                rel_diff = (P_theirs - P_ours) / abs(P_ours)
                ratios = np.array(theirs_s) / np.array(ours_s[:len(theirs_s)])
                match = [x["match_s"] for x in theirs]
                ours_trajectory = [(float(h["seconds"]), (float(h["primal"]) - P_ours) / abs(P_ours))
                                   for h in ours_res.history if "primal" in h and "seconds" in h]
                row = {
                    "n": n, "M": args.M, "rank": args.rank, "loss": loss, "C_fraction": frac, "C": C,
                    "ours_s": float(np.median(ours_s)), "skglm_s": float(np.median(theirs_s)),
                    "ours_runs_s": ours_s, "skglm_runs_s": theirs_s,
                    "skglm_finished": finished, "skglm_cap_s": args.skglm_cap,
                    # finished: the median of the pairs' ratios; stopped at the cap: a lower bound, cap / ours
                    "speedup": float(np.median(ratios)) if finished else float(args.skglm_cap / np.median(ours_s)),
                    "skglm_match_s": None if None in match else float(np.median(match)),
                    "skglm_trajectory": theirs[-1]["trajectory"], "ours_trajectory": ours_trajectory,
                    # stopped at the cap: when the model of one of our epochs first had the objective skglm had then
                    "ours_to_skglm_level_s": None if finished else _first_below(ours_trajectory, rel_diff),
                    "ours_objective": P_ours, "skglm_objective": P_theirs, "objective_rel_diff": rel_diff,
                    "ours_gap": float(ours_res.gap), "ours_converged": bool(ours_res.converged),
                    "ours_active": int(ours_res.active.size), "skglm_active": theirs[-1]["active"],
                    "ours_passes": int(ours_res.history[-1].get("passes", 0)) if ours_res.history else 0,
                    "ours_method": ours_res.params.get("method"),
                    "build_s": build_s, "design_s": theirs[-1].get("design_s"),
                }
                rows.append(row)
                bound = "" if finished else (f"stopped at the cap, P diff then; ours reached that objective after "
                                             f"{row['ours_to_skglm_level_s']} s; >= ")
                print(f"n {n} {loss:8s} C {C:9.4g} ({frac:g} C_max): ours {row['ours_s']:7.2f} s "
                      f"(active {row['ours_active']}, gap {row['ours_gap']:.1e})  skglm {row['skglm_s']:7.2f} s "
                      f"(active {row['skglm_active']}; within {MATCH_REL:g} of ours after {row['skglm_match_s']} s) "
                      f" skglm/ours {bound}{row['speedup']:.2f}  P diff {row['objective_rel_diff']:+.1e}", flush=True)
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
    p.add_argument("--skglm-cap", type=float, default=None,
                   help="stop skglm after this many seconds of solving (its ratio is then a lower bound)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workdir", default="/tmp/mklscale-bench/skglm")
    p.add_argument("--out", default=None, help="results file (default results/bench_skglm[_quick].json)")
    p.add_argument("--replot", nargs="+", type=Path, default=None, metavar="JSON",
                   help="only redraw the trajectory plots of these results files")
    args = p.parse_args()
    if args.replot:
        for path in args.replot:
            plot_trajectories(json.loads(path.read_text())["rows"], path.with_suffix(".png"))
        return
    if args.quick:
        args.sizes, args.M, args.repeats = [1000], 10, 1
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(workdir)
    import skglm

    rows = []
    for n in args.sizes:
        rows += run_size(n, args, workdir)
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / ("bench_skglm_quick.json" if args.quick else "bench_skglm.json")
    settings = {k: getattr(args, k) for k in ("M", "rank", "losses", "fractions", "tol", "skglm_tol", "skglm_cap",
                                              "repeats")}
    write_record({"machine": machine, "skglm_version": skglm.__version__, "settings": settings, "rows": rows}, out)
    plot_trajectories(rows, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
