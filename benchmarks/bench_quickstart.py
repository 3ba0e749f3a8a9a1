"""The README's main job, ``mklscale run pipelines/quickstart.toml``, first run and warm, and where the seconds go.

    python benchmarks/bench_quickstart.py              # 3 first runs and 3 warm runs, in turn
    python benchmarks/bench_quickstart.py --repeats 1

A **first run** is the job as a fresh clone runs it: before it every ``__pycache__`` folder of the installed
mklscale package is removed, so Python recompiles its bytecode and numba compiles every kernel the job uses
and writes its cache (numba's ``cache=True``, next to the sources). A **warm run** follows with the caches in
place. The two alternate (first, warm, first, warm, ...) so a change of load hits both; medians are quoted.

Where the seconds go, from the run's own results.json (``seconds`` of the run from loading the data to the
last solver, the bank's ``build_seconds``, each solver's cross-validation ``cv.seconds`` and its refit
``seconds``) and the process's wall time; what the run does not time itself (Python start-up and imports,
the LocalCluster's start, writing results.json and the HTML report) is the remainder. The test accuracies of
the solvers (sparse MKL against the uniform baseline) are recorded beside. Results:
benchmarks/results/bench_quickstart.json; the table is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, write_record  # noqa: E402

import mklscale  # noqa: E402

PIPELINE = HERE.parent / "pipelines" / "quickstart.toml"


def clear_caches() -> int:
    """Remove every __pycache__ folder of the mklscale package (bytecode and numba's cache); how many."""
    package = Path(mklscale.__file__).resolve().parent
    folders = list(package.rglob("__pycache__"))
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return len(folders)


def one_run(kind: str, workdir: Path) -> dict:
    if kind == "first":
        clear_caches()
    out = workdir / f"run-{kind}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mklscale", "run", str(PIPELINE), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=workdir)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the quickstart failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    results = json.loads((out / "results.json").read_text())
    solvers = {s["name"]: {"cv_seconds": s["cv"]["seconds"], "refit_seconds": s["seconds"],
                           "test_accuracy": s["metrics"]["test_accuracy"], "kept": s["n_active"],
                           "chosen": s["cv"]["chosen"]} for s in results["solvers"]}
    timed = results["bank"]["build_seconds"] + sum(s["cv_seconds"] + s["refit_seconds"] for s in solvers.values())
    shutil.rmtree(out, ignore_errors=True)
    return {"kind": kind, "wall": wall, "run_seconds": results["seconds"], "bank_seconds": results["bank"]["build_seconds"],
            "solvers": solvers, "rest_of_run": results["seconds"] - timed,
            "outside_run": wall - results["seconds"], "majority": results["dataset"]["null_model"]["test_accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bench_quickstart.json")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mklscale-bench-quickstart-"))
    record = {"machine": describe_machine(workdir), "pipeline": str(PIPELINE.relative_to(HERE.parent)), "runs": []}
    t0 = time.perf_counter()
    t_import = subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import mklscale.pipeline, "
                               "mklscale.estimators, distributed; print(time.perf_counter() - t)"],
                              capture_output=True, text=True, check=True)
    record["import_seconds"] = float(t_import.stdout.strip())
    for _ in range(args.repeats):
        for kind in ("first", "warm"):
            run = one_run(kind, workdir)
            record["runs"].append(run)
            print(f"{kind:5s} wall {run['wall']:6.2f} s  (bank {run['bank_seconds']:.2f} s, solvers "
                  + ", ".join(f"{k} cv {v['cv_seconds']:.2f} + {v['refit_seconds']:.2f} s" for k, v in run["solvers"].items())
                  + f", rest of run {run['rest_of_run']:.2f} s, outside the run {run['outside_run']:.2f} s)", flush=True)
    record["median_wall"] = {kind: statistics.median(r["wall"] for r in record["runs"] if r["kind"] == kind)
                             for kind in ("first", "warm")}
    record["seconds"] = time.perf_counter() - t0
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"median wall: first run {record['median_wall']['first']:.1f} s, warm {record['median_wall']['warm']:.1f} s")
    write_record(record, args.out)


if __name__ == "__main__":
    main()
