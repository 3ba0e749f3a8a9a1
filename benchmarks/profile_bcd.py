"""Where a primal block-descent fit on a factor bank spends its time (issue 32, item 1; ``bcd.py``, what
``spicy.fit`` runs on factor banks).

    python benchmarks/profile_bcd.py                  # n = 50,000, M = 300, r = 64, square, C = 0.0015 C_max
    python benchmarks/profile_bcd.py --no-gram        # the square loss's Newton-CG products over the factors
    python benchmarks/profile_bcd.py --sizes 20000 --loss logistic --fraction 0.0002
    python benchmarks/profile_bcd.py --quick          # n = 2000, M = 20 (a smoke test)

The problem of bench_skglm.py (its ``_bank``): ringnorm, M Gaussian kernels on random feature subsets,
float32 factors of rank r; C = fraction x C_max; tol 1e-5. The fit runs once under cProfile; the phases
are the inclusive seconds of the solver's own methods (indented phases are inside the one above):

    epochs             BlockDescent.epoch: the block steps, the bias, Anderson and the Newton steps
      block steps        _update_block (one coordinate Newton step per block of W)
      Newton steps       _newton_step (a Newton-CG step on all nonzero blocks), of which
        Gram             _gram_of (the square loss's Gram of W's centred factors: built, extended)
        CG products      hessian_times (per CG iteration: through the Gram, or two passes over A's factors)
    model + gap        _model (SpicyMKL's model from the epoch's dual point, its P and D)
    certify            _Spicy._certify (the bound test or a pass over all M kernels)
    fetch W            _add (reading the working set's factors into the driver)

``--no-gram`` sets GRAM_MIN_COLUMNS out of reach: the fit as before the Gram (the CG products over the
factors). Results: benchmarks/results/profile_bcd.json (one row per run, merged by (n, loss, fraction,
gram)); README via make_readme.py.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, write_record  # noqa: E402

#: (phase, parent phase or None, the file's tail and the function whose cumulative time it is)
PHASES = (("epochs", None, "bcd.py", "epoch"), ("block steps", "epochs", "bcd.py", "_update_block"),
          ("Newton steps", "epochs", "bcd.py", "_newton_step"), ("Gram", "Newton steps", "bcd.py", "_gram_of"),
          ("CG products", "Newton steps", "bcd.py", "hessian_times"), ("model + gap", None, "bcd.py", "_model"),
          ("certify", None, "spicy.py", "_certify"), ("fetch W", None, "bcd.py", "_add"))


def phases_of(stats: pstats.Stats) -> list[dict]:
    """The PHASES' inclusive seconds and call counts from cProfile's table."""
    rows = []
    for phase, parent, file, function in PHASES:
        hits = [(v[1], v[3]) for (f, _, name), v in stats.stats.items() if f.endswith(file) and name == function]
        rows.append({"phase": phase, "parent": parent, "calls": sum(c for c, _ in hits),
                     "seconds": sum(s for _, s in hits)})
    return rows


def profile(n: int, M: int, rank: int, loss: str, fraction: float, gram: bool, workdir: Path) -> dict:
    from bench_skglm import _bank

    from mklscale.engine import Engine
    from mklscale.solvers import bcd, spicy

    if not gram:
        bcd.GRAM_MIN_COLUMNS = 2**62
    bank, y, build_s = _bank(n, M, rank, workdir)
    with Engine(bank) as engine:
        C = fraction * spicy.c_max(engine, y, loss)
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        res = spicy.fit(engine, y, C, loss=loss, penalty="l1", tol=1e-5)
        profiler.disable()
        fit_s = time.perf_counter() - t0
    stats = pstats.Stats(profiler)
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:8]
    history = res.history
    return {"n": n, "M": M, "rank": rank, "loss": loss, "C_fraction": fraction, "C": C, "gram": gram,
            "fit_profiled_s": fit_s, "build_s": build_s, "active": int(res.active.size), "gap": float(res.gap),
            "converged": bool(res.converged), "objective": float(res.objective), "epochs": len(history),
            "newton_steps": sum(bool(h.get("newton_step")) for h in history),
            "working_set": sorted({int(h["working_set"]) for h in history}), "phases": phases_of(stats),
            "top_functions": [{"function": f"{Path(f).name}:{line}({name})", "calls": v[1], "tottime_s": v[2],
                               "cumtime_s": v[3]} for (f, line, name), v in top],
            "gram_min_columns": int(bcd.GRAM_MIN_COLUMNS)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[50_000])
    p.add_argument("--M", type=int, default=300)
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--loss", default="square", choices=("square", "logistic"))
    p.add_argument("--fraction", type=float, default=0.0015, help="C / C_max")
    p.add_argument("--no-gram", action="store_true", help="the Newton-CG products over the factors")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workdir", default="/tmp/mklscale-bench/skglm")
    p.add_argument("--out", type=Path, default=None, help="default results/profile_bcd[_quick].json")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.M = [2000], 20
    out = args.out or HERE / "results" / ("profile_bcd_quick.json" if args.quick else "profile_bcd.json")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    record = {"machine": describe_machine(workdir), "rows": []}
    for n in args.sizes:
        row = profile(n, args.M, args.rank, args.loss, args.fraction, not args.no_gram, workdir)
        row["machine"] = record["machine"]
        record["rows"].append(row)
        print(f"n {n} {args.loss} {args.fraction:g} C_max gram={row['gram']}: {row['fit_profiled_s']:.1f} s, "
              f"{row['active']} active, gap {row['gap']:.2e}, {row['epochs']} epochs, {row['newton_steps']} Newton "
              f"steps; " + ", ".join(f"{x['phase']} {x['seconds']:.1f} s" for x in row["phases"]), flush=True)
    if out.exists():   # keep the earlier runs of other cases
        key = lambda r: (r["n"], r["M"], r["loss"], r["C_fraction"], r["gram"])  # noqa: E731
        done = {key(r) for r in record["rows"]}
        record["rows"] = [r for r in json.loads(out.read_text())["rows"] if key(r) not in done] + record["rows"]
    write_record(record, out)


if __name__ == "__main__":
    main()
