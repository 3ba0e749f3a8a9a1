"""Pass time against the number of worker hosts (issue 33, item 2), on hosts made on this machine by
cluster/hosts.py: each worker host's link limited to the same rate (tc tbf), the S3 server's link
unlimited, the bank on S3.

    sudo cluster/setup_hosts.sh                                   # once
    python benchmarks/bench_hosts_scaling.py --quick              # M=64, n=300 (23 MB): a smoke run
    python benchmarks/bench_hosts_scaling.py                      # M=2000, n=500 float32 = 2 GB

One run: hosts with max(--workers) worker hosts; the workers build the bank into S3; the server's
own throughput is measured alone (plain concurrent GETs of every shard object from the driver host,
whose link is unlimited); then for N = 8, 4, 2, 1 (worker hosts killed in between) a pass
(``Engine.quad_forms``, --repeats times, median) and a SpicyMKL fit end to end. Results to
benchmarks/results/bench_hosts_scaling[_quick].json and a plot beside it.

Target (issue 33): speed-up >= 0.8 N until the server's throughput is the limit, i.e. while
N * rate < server throughput. Run it alone on the machine (results: benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "cluster"), str(ROOT / "benchmarks")]


def rate_bytes(rate: str) -> float:
    """--rate ('200mbit') in bytes per second (``netns.rate_bytes``); a bad one ends the run with its message."""
    from netns import rate_bytes as parse

    try:
        return parse(rate)
    except ValueError as exc:
        raise SystemExit(f"--rate: {exc}") from None


# ---- the driver host's side ----------------------------------------------------------------------
def drive(args) -> None:
    """One measurement, run on the driver host; prints one JSON line."""
    import numpy as np
    from distributed import Client

    from mklscale.bank import build_bank, families

    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.n, 5))
    y = np.where(X[:, 0] + 0.5 * rng.standard_normal(args.n) > 0, 1.0, -1.0)
    out: dict = {}
    if args.what == "server":  # plain GETs of every shard object, 16 at a time, no Dask
        from concurrent.futures import ThreadPoolExecutor

        from mklscale.bank.storage import storage_for

        store = storage_for(args.bank)  # endpoint and credentials from the AWS_* variables
        keys = [key for key, _ in store.list() if key.startswith("gram/c/")]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            sizes = list(pool.map(lambda k: store.read(k).size, keys))
        seconds = time.perf_counter() - t0
        out = {"objects": len(keys), "bytes": sum(sizes), "seconds": seconds, "MBps": sum(sizes) / seconds / 1e6}
    else:
        with Client(args.scheduler, timeout=60) as client:
            client.wait_for_workers(args.workers, timeout=300)
            if args.what == "build":
                specs = families.gaussian(np.geomspace(0.1, 30, args.m))
                t0 = time.perf_counter()
                build_bank(X, specs, args.bank, client=client, progress=False)
                out = {"seconds": time.perf_counter() - t0}
            elif args.what == "pass":
                from mklscale.engine import Engine

                U = rng.standard_normal((1, args.n))
                engine = Engine(args.bank, client=client, cache_bytes=0)
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    engine.quad_forms(U)
                    times.append(time.perf_counter() - t0)
                out = {"seconds": statistics.median(times), "all": times}
            else:
                from mklscale.estimators import MKLClassifier

                t0 = time.perf_counter()
                est = MKLClassifier(solver="spicy", C=1.0, client=client).fit_bank(args.bank, y)
                out = {"seconds": time.perf_counter() - t0, "passes": est.fit_stats_.get("passes")}
    print(json.dumps(out), flush=True)


# ---- the benchmark ----------------------------------------------------------------------------------
def _measure(hosts, what: str, args, workers: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "drive", "--what", what, "--scheduler",
           hosts.scheduler_address, "--bank", f"s3://{hosts.bucket}/scaling.zarr", "--n", str(args.n), "--m",
           str(args.m), "--repeats", str(args.repeats), "--workers", str(workers)]
    run = hosts.driver_run(cmd, timeout=3600)
    if run.returncode != 0:
        raise SystemExit(f"{what} with {workers} worker host(s) failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drive_", nargs="?", choices=["drive"], help=argparse.SUPPRESS)
    p.add_argument("--what", choices=["build", "pass", "fit", "server"], help=argparse.SUPPRESS)
    p.add_argument("--scheduler", help=argparse.SUPPRESS)
    p.add_argument("--bank", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="M=64, n=300: a smoke run")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--rate", default="200mbit", help="each worker host's link (tc syntax)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", help="results/NAME.json (default bench_hosts_scaling[_quick]); e.g. the same run with "
                                  "unlimited links (--rate 10gbit) as bench_hosts_unlimited: the machine's own floor")
    p.add_argument("--n", type=int)
    p.add_argument("--m", type=int)
    args = p.parse_args()
    if args.drive_:
        args.workers = args.workers[0]
        drive(args)
        return
    args.n = args.n or (300 if args.quick else 500)
    args.m = args.m or (64 if args.quick else 2000)
    rate = rate_bytes(args.rate)
    counts = sorted(set(args.workers), reverse=True)
    if counts[-1] < 1:
        raise SystemExit("--workers must be positive")

    import hosts as hostlab
    from machine import describe_machine

    results: dict = {"machine": describe_machine(), "rate": args.rate, "rate_MBps": rate / 1e6, "n": args.n,
                     "M": args.m, "bank_MB": args.m * args.n * args.n * 4 / 1e6, "repeats": args.repeats, "curve": []}
    with hostlab.Hosts(counts[0], worker_rate=args.rate) as hosts:
        results["build"] = _measure(hosts, "build", args, counts[0])
        results["server"] = _measure(hosts, "server", args, counts[0])
        alive = list(hosts.workers)
        for n_hosts in counts:
            while len(alive) > n_hosts:
                hosts.kill(alive.pop())
            point = {"workers": n_hosts, "pass": _measure(hosts, "pass", args, n_hosts),
                     "fit": _measure(hosts, "fit", args, n_hosts)}
            results["curve"].append(point)
            print(f"{n_hosts} worker host(s): pass {point['pass']['seconds']:.2f} s, fit {point['fit']['seconds']:.2f} s",
                  flush=True)
    one = next((c for c in results["curve"] if c["workers"] == 1), None)
    for c in results["curve"]:
        c["speedup"] = one["pass"]["seconds"] / c["pass"]["seconds"] if one else None
        c["server_bound"] = c["workers"] * rate > results["server"]["MBps"] * 1e6
        c["meets_0.8N"] = None if c["speedup"] is None else c["speedup"] >= 0.8 * c["workers"]
    name = args.name or "bench_hosts_scaling" + ("_quick" if args.quick else "")
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    out.write_text(json.dumps(results, indent=1))
    _plot(results, out.with_suffix(".png"))
    print(f"results: {out}")


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = sorted(results["curve"], key=lambda c: c["workers"])
    n = [c["workers"] for c in curve]
    fig, ax = plt.subplots(figsize=(5, 4))
    if all(c["speedup"] is not None for c in curve):
        ax.plot(n, [c["speedup"] for c in curve], "o-", label="pass speed-up")
    ax.plot(n, [0.8 * k for k in n], "--", color="grey", label="0.8 N (target)")
    bound = results["server"]["MBps"] / results["rate_MBps"]
    ax.axvline(bound, color="red", linestyle=":", label=f"server limit ({results['server']['MBps']:.0f} MB/s)")
    ax.set_xlabel(f"worker hosts (each link {results['rate']})")
    ax.set_ylabel("speed-up over 1 host")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
