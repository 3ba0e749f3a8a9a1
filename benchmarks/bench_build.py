"""Bank build throughput against a plain write of the same bytes, in the same run.

    python benchmarks/bench_build.py                # M = 1000 Gaussian kernels, n = 1000 (4 GB float32)
    python benchmarks/bench_build.py --quick        # a small smoke run

The bank: ringnorm features (n rows, 20 features), Gaussian kernels on random feature subsets with
widths 5 chi^2 + 0.1 (the SpicyMKL IDA recipe), unit-trace normalised, float32, built on the
embedded default (Dask threads in this process). Every kernel costs its own distance matrix, exp,
trace, Frobenius norm, largest eigenvalue and checksum.

The baseline: numpy writes the same number of bytes, as the same number of files of the same size
(one per shard), with the same number of threads, each file written with ndarray.tofile. Build and
plain write alternate over the repeats, each starting after os.sync() (no dirty pages of the one
before), so both see the same page-cache and disk state; the ratio
reported is median(plain write time) / median(build time), i.e. build throughput / write throughput.
The plain write runs twice back to back (files deleted in between) and the second is the baseline:
on a virtual machine that hands freed page-cache memory back to its host within seconds (the
benchmark machine's DAMON reclaim), a write whose pages must come back from the host costs ~10x
the system time, so the first write swings between about 0.8 s and 6 s for 4 GB while the second
reuses the pages the first freed. Both are recorded; the second, fast one is the stricter baseline.

The build writes its shards with direct I/O (``shard_format.write_shard_file``): when it returns, the bytes
are on the disk. The plain write returns once they are in the page cache (writeback follows
later), so it is the faster of the two for a few GB on a machine with free memory. A second
baseline, the same plain write followed by fsync of every file, is recorded next to it: the time
to put the same bytes on the disk. A third, the direct write, is the build's own write path alone
(``shard_format.write_shard_file`` of every shard from one aligned buffer, with the build's threads, no
compute): no build can finish faster than it, whatever its compute costs.
Each run also records the process CPU time (user, system) of both and the load average before it:
on a shared machine the write's own system time and the CPU left to this process decide the ratio.
Results go to benchmarks/results/bench_build.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.bank.shards import BUILD_THREADS  # noqa: E402
from mklscale.bank.direct_io import aligned_empty  # noqa: E402
from mklscale.bank.shard_format import write_shard_file  # noqa: E402
from mklscale.datasets import load  # noqa: E402


def plain_write(folder: Path, n_files: int, file_bytes: int, threads: int, fsync: bool = False) -> float:
    """Write n_files files of file_bytes each with numpy (and fsync each one); return seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    block = np.random.default_rng(0).random(file_bytes // 4, dtype=np.float32)

    def write(i: int) -> None:
        with open(folder / f"shard-{i}", "wb") as f:
            block.tofile(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    return _seconds_on_threads(write, n_files, threads)


def direct_write(folder: Path, shard_sizes: list[int], n: int, per_chunk: int, per_shard: int, threads: int) -> float:
    """Write shards of the given kernel counts as the build does (direct I/O, same layout); return seconds."""
    block = aligned_empty((max(shard_sizes), n, n), np.float32)
    block[:] = np.random.default_rng(0).random(block.shape[1:], dtype=np.float32)

    def write(s: int) -> None:
        write_shard_file(folder, s, block[:shard_sizes[s]], per_chunk, per_shard)

    return _seconds_on_threads(write, len(shard_sizes), threads)


def _seconds_on_threads(write, count: int, threads: int) -> float:
    """Seconds to run write(0) ... write(count - 1) on a pool of ``threads`` threads."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, range(count)))
    return time.perf_counter() - t0


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def timed(fn, *args, **kwargs):
    """(result, wall seconds, {"user": s, "sys": s} of CPU this process spent). Dirty pages left by
    the previous write are flushed first (not timed), so every write starts from the same state
    instead of being throttled by the writeback of the one before."""
    os.sync()
    u0, s0 = cpu_seconds()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    wall = time.perf_counter() - t0
    u1, s1 = cpu_seconds()
    return out, wall, {"user": u1 - u0, "sys": s1 - s0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--M", type=int, default=1000)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="M=100, n=300, 2 repeats")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "mklscale-bench-build")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bench_build.json")
    args = ap.parse_args()
    if args.quick:
        args.M, args.n, args.repeats = 100, 300, 2
        args.out = args.out.with_name("bench_build_quick.json")

    X = load("ringnorm", n_samples=args.n, seed=0).X
    specs = families.random_subsets(X.shape[1], args.M, seed=0)
    threads = os.cpu_count() or 1
    build_bank(X[:50], specs[:4], args.workdir / "warmup", progress=False, overwrite=True)  # numba compile
    runs = []
    for r in range(args.repeats):
        shutil.rmtree(args.workdir / "bank", ignore_errors=True)
        load_avg = [round(x, 2) for x in os.getloadavg()]
        bank, t_build, cpu_build = timed(build_bank, X, specs, args.workdir / "bank", progress=False)
        files = sorted((bank.path / "gram" / "c").rglob("*"))
        files = [f for f in files if f.is_file()]
        bytes_on_disk = sum(f.stat().st_size for f in files)
        shutil.rmtree(args.workdir / "plain", ignore_errors=True)
        plain = (args.workdir / "plain", len(files), bytes_on_disk // len(files), threads)
        _, t_first, cpu_first = timed(plain_write, *plain)
        shutil.rmtree(args.workdir / "plain", ignore_errors=True)
        _, t_plain, cpu_plain = timed(plain_write, *plain)
        shutil.rmtree(args.workdir / "plain", ignore_errors=True)
        _, t_sync, _ = timed(plain_write, *plain, fsync=True)
        shutil.rmtree(args.workdir / "plain", ignore_errors=True)
        sizes = [len(range(*bank.shard_range(s))) for s in range(bank.n_shards)]
        _, t_direct, cpu_direct = timed(direct_write, args.workdir / "plain", sizes, bank.n,
                                        int(bank.attrs["layout"]["kernels_per_chunk"]), bank.kernels_per_shard, BUILD_THREADS)
        runs.append({"build_s": t_build, "plain_write_first_s": t_first, "plain_write_first_cpu_s": cpu_first,
                     "plain_write_s": t_plain, "plain_write_fsync_s": t_sync,
                     "direct_write_s": t_direct, "build_cpu_s": cpu_build, "plain_write_cpu_s": cpu_plain,
                     "direct_write_cpu_s": cpu_direct, "load_average_before": load_avg})
        print(f"repeat {r}: build {t_build:.2f} s (cpu user {cpu_build['user']:.2f} sys {cpu_build['sys']:.2f}), "
              f"plain write {t_first:.2f} s then {t_plain:.2f} s (cpu user {cpu_plain['user']:.2f} sys {cpu_plain['sys']:.2f}), "
              f"plain write + fsync {t_sync:.2f} s, direct write {t_direct:.2f} s, load {load_avg}")
    t_build = statistics.median(x["build_s"] for x in runs)
    t_plain = statistics.median(x["plain_write_s"] for x in runs)
    t_first = statistics.median(x["plain_write_first_s"] for x in runs)
    t_sync = statistics.median(x["plain_write_fsync_s"] for x in runs)
    t_direct = statistics.median(x["direct_write_s"] for x in runs)
    gb = bank.nbytes / 1e9
    result = {
        "benchmark": "bench_build",
        "machine": describe_machine(args.workdir),
        "params": {"M": args.M, "n": args.n, "dtype": "float32", "family": "random_subsets (gaussian, IDA recipe)",
                   "normalize": "trace", "threads": threads, "build_threads": BUILD_THREADS, "write": "direct I/O", "shards": bank.n_shards, "repeats": args.repeats},
        "runs": runs,
        "median": {
            "build_s": t_build, "plain_write_s": t_plain, "plain_write_first_s": t_first,
            "kernels_per_s": args.M / t_build, "build_GBps": gb / t_build, "plain_write_GBps": gb / t_plain,
            "build_over_plain_write": t_plain / t_build,
            "plain_write_fsync_s": t_sync, "build_over_plain_write_fsync": t_sync / t_build,
            "direct_write_s": t_direct, "build_over_direct_write": t_direct / t_build,
            "build_cpu_s": statistics.median(x["build_cpu_s"]["user"] + x["build_cpu_s"]["sys"] for x in runs),
            "plain_write_cpu_s": statistics.median(x["plain_write_cpu_s"]["user"] + x["plain_write_cpu_s"]["sys"] for x in runs),
        },
        "target": {"build_over_plain_write": 0.7},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    m = result["median"]
    print(f"M={args.M} n={args.n}: {m['kernels_per_s']:.1f} kernels/s, build {m['build_GBps']:.2f} GB/s, "
          f"plain write {m['plain_write_GBps']:.2f} GB/s, ratio {m['build_over_plain_write']:.2f} (target >= 0.7); "
          f"against plain write + fsync {m['build_over_plain_write_fsync']:.2f}; "
          f"against the direct write {m['build_over_direct_write']:.2f}")
    print(f"wrote {args.out}")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
