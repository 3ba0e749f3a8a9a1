"""Where the time of a SpicyMKL fit on a factor bank goes (issue 32, item 1).

    python benchmarks/profile_factor.py                  # n = 10,000 and 50,000 (M = 50, r = 64, C = 6e-5 n)
    python benchmarks/profile_factor.py --sizes 10000    # one size
    python benchmarks/profile_factor.py --quick          # n = 2000, M = 10 (a smoke test)
    python benchmarks/profile_factor.py --ab /tmp/before --sizes 10000 --rounds 4
                                                         # before/after: fit times of the mklscale package
                                                         # under /tmp/before (e.g. ``git archive <commit>
                                                         # mklscale | tar -x -C /tmp/before``) and of this
                                                         # checkout, interleaved (before, after, before, ...)

The problem of issue 32: ringnorm (``load("ringnorm", n_samples=n, seed=0)``), M random-subset Gaussian
kernels (``families.random_subsets(20, M, seed=0)``), factor bank of rank r (Nystrom on k-means++
landmarks), SpicyMKL logistic, block-1 penalty, C = 6e-5 n (0.6 at n = 10^4: 5 active kernels), tol 1e-3,
the proximal method (named: on a factor bank "auto" now takes the primal block descent, ``bcd.py``,
which has none of the phases below; it fits the n = 10^4 case in ~0.4 s against ~4.4 s).
The bank is built once per size (its time is reported, not profiled); the fit runs under cProfile
with timers wrapped around its phases:

    passes             engine.quad_forms (the full passes over the bank: initial + certifications)
    fetch W            engine.blocks (reading the working set's factors into the driver)
    Newton system      _spicy_inner.solve_newton_system, of which
      blocks L_j, z_j    NewtonSystem.blocks (the kernels' factors, widened, and z_j = L_j^T a_j)
      scale L~           BlockWoodbury.__init__ (D^{-1/2} L into one (n, R) float64 array)
      factorise          BlockWoodbury.factorise (the capacitance: one syrk, n R^2, and its Cholesky)
      solve              BlockWoodbury.solve
      capacitance CG     BlockWoodbury.capacitance_cg (R >= CAPACITANCE_CG_MIN_COLUMNS)
      dense Cholesky     the n x n path (R > n)
    Hessian parts      InnerProblem.hessian
    direction          InnerProblem.direction (K_m d for the working set: the line search's products)
    line search        InnerProblem.value_along (objective along the step; cached products only)
    evaluate           InnerProblem.evaluate (gradient at the accepted point)
    model + dual       _Spicy._model, _Spicy._working_set_dual (the primal model and dual value per outer step)
    certify            _Spicy._certify (bound test / pass; includes its pass time)

Times are inclusive (a phase's time includes the phases nested in it: the indented ones inside
"Newton system", "passes" inside "certify", "fetch W" inside "grow W"); "other" is the fit's time
outside the top-level phases (the proximal update, the gamma schedule, logging, Python glue).
cProfile's own overhead inflates the total by a few per cent; the fit is then timed once more without
it (after the profiled one, so that one-off costs such as loading numba's cache fall on the profiled run).
``--ab``: each round runs one process per version (the same script, PYTHONPATH set to the version),
each timing one plain fit on the same bank; the result per size is the median over rounds of the
after / before ratio of a pair (benchmarks/results/profile_factor_ab.json).
Results: benchmarks/results/profile_factor.json; the table in benchmarks/README.md (make_readme.py).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, write_record  # noqa: E402

RESULTS = HERE / "results"
C_PER_N = 6e-5

#: (label, owner path, attribute, parent label or None): the phases timed (module docstring).
PHASES = [
    ("Newton system", "mklscale.solvers._spicy_inner", "solve_newton_system", None),
    ("blocks L_j, z_j", "mklscale.solvers._spicy_inner:NewtonSystem", "blocks", "Newton system"),
    ("scale L~", "mklscale.solvers.toolkit.lowrank:BlockWoodbury", "__init__", "Newton system"),
    ("factorise", "mklscale.solvers.toolkit.lowrank:BlockWoodbury", "factorise", "Newton system"),
    ("solve", "mklscale.solvers.toolkit.lowrank:BlockWoodbury", "solve", "Newton system"),
    ("capacitance CG", "mklscale.solvers.toolkit.lowrank:BlockWoodbury", "capacitance_cg", "Newton system"),
    ("dense Cholesky", "mklscale.solvers._spicy_inner", "_cholesky_solve", "Newton system"),
    ("Hessian parts", "mklscale.solvers._spicy_inner:InnerProblem", "hessian", None),
    ("direction", "mklscale.solvers._spicy_inner:InnerProblem", "direction", None),
    ("line search", "mklscale.solvers._spicy_inner:InnerProblem", "value_along", None),
    ("evaluate", "mklscale.solvers._spicy_inner:InnerProblem", "evaluate", None),
    ("model + dual", "mklscale.solvers.spicy:_Spicy", "_model", None),
    ("model + dual", "mklscale.solvers.spicy:_Spicy", "_working_set_dual", None),
    ("certify", "mklscale.solvers.spicy:_Spicy", "_certify", None),
    ("grow W", "mklscale.solvers.spicy:_Spicy", "_add_kernels", None),
]


class Timers:
    """Inclusive seconds and calls per label; a label re-entered inside itself is counted once."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)
        self._depth = defaultdict(int)

    def wrap(self, label, fn):
        @functools.wraps(fn)
        def timed(*a, **k):
            self._depth[label] += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self._depth[label] -= 1
                if self._depth[label] == 0:
                    self.seconds[label] += time.perf_counter() - t0
                    self.calls[label] += 1
        return timed


def _owner(path: str):
    import importlib

    module, _, cls = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, cls) if cls else obj


def _instrument(timers: Timers):
    """Wrap the phases (PHASES); returns a function that undoes it."""
    undo = []
    for label, path, attr, _ in PHASES:
        owner = _owner(path)
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        setattr(owner, attr, timers.wrap(label, original))
        undo.append((owner, attr, original))

    def restore():
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)
    return restore


def _bank(n: int, M: int, rank: int, workdir: Path):
    from bench_factor import _data
    from mklscale.bank import build_bank, families

    X, y, _, _ = _data(n, 10)
    specs = families.random_subsets(X.shape[1], M, seed=0)
    t0 = time.perf_counter()
    bank = build_bank(X, specs, workdir / f"profile-n{n}-M{M}-r{rank}", progress=False, rank=rank)
    return bank, y, time.perf_counter() - t0


def _fit(bank, y, C, profile: bool, timers: Timers | None = None):
    from mklscale.engine import Engine
    from mklscale.solvers import spicy

    with Engine(bank) as engine:
        if timers is not None:
            for name in ("quad_forms", "blocks"):
                label = {"quad_forms": "passes", "blocks": "fetch W"}[name]
                setattr(engine, name, timers.wrap(label, getattr(engine, name)))
        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        res = spicy.fit(engine, y, C, loss="logistic", penalty="l1", tol=1e-3, method="proximal")
        if prof is not None:
            prof.disable()
        seconds = time.perf_counter() - t0
        passes = engine.counters().passes
    return res, seconds, passes, prof


def _top(prof, count: int = 25) -> list[dict]:
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}({name})", "calls": int(nc), "tottime_s": tt,
                     "cumtime_s": ct})
    rows.sort(key=lambda r: -r["tottime_s"])
    return rows[:count]


def profile_size(n: int, M: int, rank: int, workdir: Path) -> dict:
    bank, y, build_s = _bank(n, M, rank, workdir)
    C = C_PER_N * n
    timers = Timers()
    restore = _instrument(timers)
    try:
        res, total_s, passes, prof = _fit(bank, y, C, profile=True, timers=timers)
    finally:
        restore()
    _, plain_s, _, _ = _fit(bank, y, C, profile=False)   # the fit alone (no timers, no cProfile), warmed up
    phases = []
    top_level = 0.0
    seen = set()
    for label, _, _, parent in PHASES + [("passes", "", "", "certify"), ("fetch W", "", "", "grow W")]:
        if label in seen:
            continue
        seen.add(label)
        phases.append({"phase": label, "parent": parent, "seconds": timers.seconds.get(label, 0.0),
                       "calls": timers.calls.get(label, 0)})
    for p in phases:
        if p["parent"] is None:
            top_level += p["seconds"]
    # the passes outside _certify (the initial pass) and fetches outside _add_kernels are top level too
    hist = res.history
    inner = int(sum(h.get("inner_iterations", 0) for h in hist))
    return {
        "n": n, "M": M, "rank": rank, "C": C, "build_s": build_s, "fit_s": plain_s, "fit_profiled_s": total_s,
        "phases": phases, "other_s": max(total_s - top_level, 0.0), "passes": int(passes),
        "outer_iterations": len(hist), "newton_steps": inner, "working_set": [int(h["working_set"]) for h in hist],
        "active": int(res.active.size), "gap": float(res.gap), "objective": float(res.objective),
        "converged": bool(res.converged), "bank_GB": bank.nbytes / 1e9, "top_functions": _top(prof),
    }


def fit_once(n: int, M: int, rank: int, workdir: Path) -> dict:
    """One plain fit with the mklscale on sys.path (``--ab``'s child)."""
    import mklscale

    bank, y, _ = _bank(n, M, rank, workdir)
    res, seconds, passes, _ = _fit(bank, y, C_PER_N * n, profile=False)
    return {"fit_s": seconds, "objective": float(res.objective), "gap": float(res.gap), "passes": int(passes),
            "active": int(res.active.size), "outer_iterations": len(res.history),
            "newton_steps": int(sum(h.get("inner_iterations", 0) for h in res.history)),
            "package": str(Path(mklscale.__file__).parent)}


def ab(before: Path, sizes, M: int, rank: int, rounds: int, workdir: Path) -> list[dict]:
    """Interleaved before/after fit times (module docstring)."""
    after = HERE.parent
    rows = []
    for n in sizes:
        _bank(n, M, rank, workdir)     # built once, by this version, before any timing
        runs = {"before": [], "after": []}
        for _ in range(rounds):
            for name, tree in (("before", before), ("after", after)):
                env = dict(os.environ, PYTHONPATH=str(tree))
                out = subprocess.run([sys.executable, __file__, "--fit-once", str(n), "--M", str(M), "--rank",
                                      str(rank), "--workdir", str(workdir)], env=env, check=True,
                                     capture_output=True, text=True, cwd="/")
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(name, n, runs[name][-1], flush=True)
        ratios = [a["fit_s"] / b["fit_s"] for a, b in zip(runs["after"], runs["before"])]
        rows.append({"n": n, "M": M, "rank": rank, "C": C_PER_N * n, "rounds": rounds, "runs": runs,
                     "before_s": float(np.median([r["fit_s"] for r in runs["before"]])),
                     "after_s": float(np.median([r["fit_s"] for r in runs["after"]])),
                     "ratio_after_before": float(np.median(ratios)), "ratios": ratios})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000])
    p.add_argument("--M", type=int, default=50)
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workdir", default="/tmp/mklscale-bench/profile-factor")
    p.add_argument("--out", default=None, help="results file (default results/profile_factor[_quick].json)")
    p.add_argument("--ab", default=None, help="a folder holding the mklscale package to compare with (before)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--before-note", default=None, help="what the --ab folder holds (e.g. its commit), for the README")
    p.add_argument("--fit-once", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.fit_once:
        print(json.dumps(fit_once(args.fit_once, args.M, args.rank, workdir)))
        return
    machine = describe_machine(workdir)
    if args.ab:
        rows = ab(Path(args.ab), args.sizes, args.M, args.rank, args.rounds, workdir)
        for r in rows:
            print(f"n = {r['n']}: before {r['before_s']:.2f} s, after {r['after_s']:.2f} s, "
                  f"after / before {r['ratio_after_before']:.3f} (median of {r['rounds']} pairs)")
        out = Path(args.out) if args.out else RESULTS / "profile_factor_ab.json"
        write_record({"machine": machine, "before": str(args.ab), "before_note": args.before_note, "rows": rows}, out)
        return
    sizes, M = ([2000], 10) if args.quick else (args.sizes, args.M)
    rows = []
    for n in sizes:
        rows.append(profile_size(n, M, args.rank, workdir))
        r = rows[-1]
        print(f"n = {n}: fit {r['fit_s']:.2f} s (profiled {r['fit_profiled_s']:.2f} s), passes {r['passes']}, "
              f"outer {r['outer_iterations']}, Newton {r['newton_steps']}, active {r['active']}", flush=True)
        for ph in r["phases"]:
            print(f"   {'  ' if ph['parent'] else ''}{ph['phase']:<18} {ph['seconds']:8.2f} s  {ph['calls']:6d} calls")
        print(f"   {'other':<18} {r['other_s']:8.2f} s")
    RESULTS.mkdir(exist_ok=True)
    name = "profile_factor_quick.json" if args.quick else "profile_factor.json"
    out = Path(args.out) if args.out else RESULTS / name
    write_record({"machine": machine, "rows": rows}, out)


if __name__ == "__main__":
    main()
