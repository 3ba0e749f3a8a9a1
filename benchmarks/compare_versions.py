"""Same-run before/after comparison of two mklscale versions on the --quick benchmarks.

    git worktree add --detach /tmp/before <old commit>; git worktree add --detach /tmp/after HEAD
    python benchmarks/compare_versions.py --before /tmp/before --after /tmp/after --rounds 3

Runs ``bench_scaling.py --quick`` and ``bench_peers.py --quick --skip-mklpy`` (our side only: the
MKLpy side is the same program in both runs) in each version, alternating before, after, before,
after, ... so both see the same machine state; each version runs with its own tree first on
PYTHONPATH and its own bank workdir. Per fit (solver, bank size) it takes the median seconds over
the rounds of each version, then reports per solver the median and range of the after/before
ratios and whether the passes are the same. Timings on a shared 2-core machine are noisy: the
load average at each run is recorded, and the ratios, not the seconds, are the result.

Results: benchmarks/results/compare_versions.json (rendered by make_readme.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine  # noqa: E402

#: benchmark -> (its command, the result file it writes; None: it takes --out)
BENCHMARKS = {
    "bench_scaling": (["benchmarks/bench_scaling.py", "--quick"], "bench_scaling_quick.json"),
    "bench_peers": (["benchmarks/bench_peers.py", "--quick", "--skip-mklpy"], None),
}


def scaling_fits(d: dict) -> dict:
    """{(item, solver, M, n): (seconds, passes)} of the fits bench_scaling --quick records."""
    out = {}
    for item in ("m_scaling", "n_scaling"):
        for row in d[item]["rows"]:
            if row.get("status") == "ok":
                out[(item, row["solver"], row["M"], row["n"])] = (row["seconds"], row.get("passes"))
    ooc = d["out_of_core"]
    for i, row in enumerate(ooc["rows"]):
        if row.get("status") == "ok":
            out[(f"out_of_core[{i}]", "spicy", ooc["M"], ooc["n"])] = (row["seconds"], row.get("passes"))
    return out


def peers_fits(d: dict) -> dict:
    """{(task, solver, M, n): (seconds, passes)} of our fits in bench_peers --quick."""
    out = {}
    for point in d["grid"]:
        for name, res in point.get("ours", {}).items():
            if isinstance(res, dict) and res.get("status") == "ok":
                out[(point["task"], name, point["M"], point["n"])] = (res["fit_seconds"], res.get("passes"))
    return out


EXTRACT = {"bench_scaling": scaling_fits, "bench_peers": peers_fits}


def git_commit(tree: str) -> str:
    return subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def run_rounds(trees: dict, rounds: int, keep: Path) -> tuple[dict, list]:
    """{bench: {version: [fits of each round]}} and the load log."""
    fits = {b: {v: [] for v in trees} for b in BENCHMARKS}
    loads = []
    for r in range(rounds):
        for version, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree)
            for bench, (args, result) in BENCHMARKS.items():
                raw = keep / f"{bench}-{version}-{r}.json"
                extra = ["--workdir", str(keep / f"work-{version}")] if result else ["--out", str(raw)]
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                subprocess.run([sys.executable, *args, *extra], cwd=tree, env=env, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if result:
                    shutil.copy(Path(tree) / "benchmarks" / "results" / result, raw)
                fits[bench][version].append(EXTRACT[bench](json.loads(raw.read_text())))
                loads.append({"round": r, "version": version, "benchmark": bench, "load_1min": round(load, 2),
                              "seconds": round(time.perf_counter() - t0, 1)})
                print(f"round {r} {version:6s} {bench:13s} {loads[-1]['seconds']:6.1f} s  load {load:.2f}", flush=True)
    return fits, loads


def summarise(fits: dict) -> list[dict]:
    """Per benchmark and solver: median/min/max of the per-fit after/before ratios of medians."""
    rows = []
    for bench, by_version in fits.items():
        common = set.intersection(*(set(f) for runs in by_version.values() for f in runs))
        per_solver: dict[str, list] = {}
        for key in sorted(common, key=str):
            med = {v: statistics.median(f[key][0] for f in runs) for v, runs in by_version.items()}
            passes = {v: sorted({f[key][1] for f in runs}, key=str) for v, runs in by_version.items()}
            per_solver.setdefault(key[1], []).append((med["after"] / med["before"], med["before"], med["after"],
                                                      passes["before"] == passes["after"]))
        for solver, items in sorted(per_solver.items()):
            ratios = [i[0] for i in items]
            rows.append({"benchmark": bench, "solver": solver, "fits": len(items),
                         "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                         "max_ratio": max(ratios), "seconds_before": sum(i[1] for i in items),
                         "seconds_after": sum(i[2] for i in items), "passes_equal": all(i[3] for i in items)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="worktree of the old version")
    ap.add_argument("--after", required=True, help="worktree of the new version")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="folder for the raw JSON of every run (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "compare_versions.json")
    args = ap.parse_args(argv)
    keep = args.keep or Path(tempfile.mkdtemp(prefix="mklscale-compare-"))
    keep.mkdir(parents=True, exist_ok=True)
    trees = {"before": args.before, "after": args.after}
    t0 = time.perf_counter()
    fits, loads = run_rounds(trees, args.rounds, keep)
    result = {"benchmark": "compare_versions", "machine": describe_machine(),
              "command": "python benchmarks/compare_versions.py " + " ".join(argv or sys.argv[1:]),
              "commits": {v: git_commit(t) for v, t in trees.items()}, "rounds": args.rounds,
              "total_seconds": time.perf_counter() - t0, "runs": loads, "solvers": summarise(fits),
              "raw": str(keep)}
    args.out.write_text(json.dumps(result, indent=1))
    for row in result["solvers"]:
        print(f"{row['benchmark']:13s} {row['solver']:15s} median after/before {row['median_ratio']:.2f} "
              f"({row['min_ratio']:.2f}-{row['max_ratio']:.2f}, {row['fits']} fits), passes equal {row['passes_equal']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
