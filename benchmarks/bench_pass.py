"""Engine pass throughput against a plain read of the same shard files, in the same run.

    python benchmarks/bench_pass.py             # the issue's sizes (M=2000, n=500 float32 = 2 GB bank)
    python benchmarks/bench_pass.py --quick     # small smoke run (seconds)
    python benchmarks/bench_pass.py --big       # bank larger than memory, peak RSS (long: builds tens of GB)
    python benchmarks/bench_pass.py --big --big-M 200    # the --big code path at a small scale

Sections (default run; results to benchmarks/results/bench_pass.json):

- cached bank (M=2000, n=500 float32, in the page cache): quad_forms with k = 1, 4, 16 vectors
  and frobenius on the threaded default, as GB/s of kernel data and as a ratio to the plain read:
  np.fromfile of every shard file (1 and 2 threads) and readinto into reused buffers (1 and 2
  threads: what the engine's reader does); the target (>= 0.8x) is against the FASTEST of these. The
  floor: one read of the same bytes already in the process's memory (2 threads summing), i.e. the
  memory bandwidth a pass cannot beat (a quad-forms pass is one read and two flops per number).
- small bank (M=100, n=100): median time of one quad_forms pass. Target: < 50 ms.
- workers: the cached-bank pass on the threaded default and on LocalClusters of 1 and 2 worker
  processes (1 thread each).

--big: M=10,000, n=1,000 float32 (40 GB) if the work folder's disk has 2.5x that free, otherwise
the largest M that does (stated in the output); quad_forms passes on the threaded default and on
2 worker processes against the plain read, sampling the resident memory of the driver and all its
child processes (psutil) every 20 ms. Target: peak RSS <= 4 GB. Results to bench_pass_big.json.

All times are medians over --repeats runs (>= 5 by default). Engine and plain read alternate
within each repeat so both see the same page-cache state. Bank data lives in --workdir (default
/tmp/mklscale-bench), never in the repository; banks are reused between runs when they match.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402

from mklscale.bank import KernelBank, build_bank, families  # noqa: E402
from mklscale.engine import Engine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GB = 1e9


# ---- banks and baselines --------------------------------------------------------------------------
def get_bank(path: Path, M: int, n: int, dtype: str = "float32", seed: int = 0, data: str = "random") -> KernelBank:
    """Gaussian kernels on random feature subsets (SpicyMKL IDA recipe) of n points (random normal
    in 10 dimensions, or ringnorm with its labels so solvers can run on the bank); a bank already
    at ``path`` built from the same inputs is reused (build_bank resumes / skips it)."""
    if data == "ringnorm":
        from mklscale.datasets import load

        X = load("ringnorm", n_samples=n, seed=seed).X
    else:
        X = np.random.default_rng(seed).standard_normal((n, 10))
    specs = families.random_subsets(X.shape[1], M, seed=seed)
    t0 = time.perf_counter()
    bank = build_bank(X, specs, path, dtype=dtype, overwrite=False, progress=M >= 1000) if not _same(path, M, n, dtype) \
        else KernelBank.open(path)
    if time.perf_counter() - t0 > 1:
        print(f"  built {path.name}: M={M} n={n} {dtype} in {time.perf_counter() - t0:.0f} s", flush=True)
    return bank


def _same(path: Path, M: int, n: int, dtype: str) -> bool:
    if not KernelBank.is_bank(path):
        if path.exists():
            shutil.rmtree(path)
        return False
    bank = KernelBank.open(path)
    if (len(bank), bank.n, bank.dtype.name) == (M, n, dtype) and bank.complete.all():
        return True
    shutil.rmtree(path)
    return False


def shard_files(bank: KernelBank) -> list[Path]:
    return [bank.shard_file(s) for s in range(bank.n_shards)]


def plain_fromfile(files: list[Path], threads: int) -> None:
    if threads == 1:
        for f in files:
            np.fromfile(f, dtype=np.uint8)
        return
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda f: np.fromfile(f, dtype=np.uint8).size, files))


def plain_readinto(files: list[Path], threads: int, block: int = 2 * 2**20) -> None:
    """Read every file into a per-thread reused buffer of ``block`` bytes (the engine's reader)."""
    local = threading.local()

    def read(f: Path) -> None:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = memoryview(bytearray(block))
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf) == block:
                pass

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(read, files))


def memory_read(arr: np.ndarray, threads: int) -> None:
    """Sum ``arr`` (in RAM) in ``threads`` contiguous parts: one read of every byte from memory, the floor
    of a pass over data already in memory (a quad-forms pass reads each stored number once and does two
    flops with it; numpy's reductions release the GIL)."""
    parts = np.array_split(arr, threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.add.reduce, parts))


def compute_floor(n: int, dtype, k: int, source: str, threads: int, seconds: float = 0.5) -> float:
    """GB/s of the engine's own quad-form chunk kernel for k vectors (the sweep its reader's
    ``source`` selects) over one kernel already in the core's cache, ``threads`` threads at once:
    the arithmetic a pass cannot beat, whatever the reading (kernel bytes per second)."""
    from mklscale.engine import kernels as K
    from mklscale.engine.tasks import quad_sweep

    stream, row_block = quad_sweep(source, k)
    rng = np.random.default_rng(4)
    U = rng.standard_normal((k, n))
    Ut = np.ascontiguousarray(U.T)
    block = rng.random((1, n, n)).astype(dtype)

    def one(_) -> int:
        out, V, S = np.empty((1, k)), np.zeros((k, n)), np.zeros((8, 16))
        K.quad_kernels(block, U, Ut, out, V, S, stream, row_block)  # compiled, block in cache
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            K.quad_kernels(block, U, Ut, out, V, S, stream, row_block)
            reps += 1
        return reps

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        reps = sum(pool.map(one, range(threads)))
    return reps * block.nbytes / (time.perf_counter() - t0) / GB


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function; one warm-up, then the functions alternate per repeat."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


# ---- sections ---------------------------------------------------------------------------------------
def cached_bank(bank: KernelBank, repeats: int) -> dict:
    files = shard_files(bank)
    file_bytes = sum(f.stat().st_size for f in files)
    rng = np.random.default_rng(1)
    U = {k: rng.standard_normal((k, bank.n)) for k in (1, 4, 16)}
    T = rng.standard_normal((bank.n, bank.n))
    plain_fromfile(files, 1)  # into the page cache
    in_ram = np.ones(bank.nbytes // 4, dtype=np.float32)   # the bank's bytes, in the process's memory
    with Engine(bank) as eng:
        fns = {
            "plain fromfile 1 thread": lambda: plain_fromfile(files, 1),
            "plain fromfile 2 threads": lambda: plain_fromfile(files, 2),
            "plain readinto 1 thread": lambda: plain_readinto(files, 1),
            "plain readinto 2 threads": lambda: plain_readinto(files, 2),
            "memory read 2 threads (floor)": lambda: memory_read(in_ram, 2),
            **{f"quad_forms k={k}": (lambda k=k: eng.quad_forms(U[k])) for k in U},
            "frobenius": lambda: eng.frobenius(T),
        }
        t = medians(fns, repeats)
    del in_ram
    plain = {name: file_bytes / t[name] / GB for name in t if name.startswith("plain")}
    best_name = max(plain, key=plain.get)       # the strongest reference: readinto into reused buffers, in practice
    memory = bank.nbytes / t["memory read 2 threads (floor)"] / GB
    rows = []
    for name, sec in t.items():
        gbps = (file_bytes if name.startswith("plain") else bank.nbytes) / sec / GB
        rows.append({"what": name, "seconds": sec, "GB_per_s": gbps,
                     "x_plain_1thread": gbps / plain["plain fromfile 1 thread"],
                     "x_plain_2threads": gbps / plain["plain fromfile 2 threads"],
                     "x_best_plain": gbps / plain[best_name], "x_memory": gbps / memory})
    k1, k16 = t["quad_forms k=1"], t["quad_forms k=16"]
    from mklscale.engine.reader import KernelReader

    import dask.system

    source = KernelReader(bank).source
    threads = int(dask.system.CPU_COUNT)
    floors = {}
    for k in U:
        floors[f"quad_forms k={k}"] = compute_floor(bank.n, bank.dtype, k, source, threads)
    for r in rows:
        if r["what"] in floors:
            r["compute_floor_GB_per_s"] = floors[r["what"]]
            r["x_floor"] = r["GB_per_s"] / min(floors[r["what"]], memory)
    return {"M": len(bank), "n": bank.n, "dtype": bank.dtype.name, "bank_bytes": bank.nbytes, "file_bytes": file_bytes,
            "reader": source, "compute_floor_threads": threads, "shards": bank.n_shards, "kernels_per_shard": bank.kernels_per_shard, "repeats": repeats,
            "rows": rows, "k16_over_k1_time": k16 / k1, "best_plain": best_name, "memory_GB_per_s": memory,
            "target_0.8x_plain_met": {r["what"]: r["x_best_plain"] >= 0.8 for r in rows
                                      if not r["what"].startswith(("plain", "memory"))}}


def small_bank(bank: KernelBank, repeats: int, client=None) -> dict:
    u = np.random.default_rng(2).standard_normal(bank.n)
    with Engine(bank, client=client) as eng:
        eng.quad_forms(u)
        times = [timed(lambda: eng.quad_forms(u)) for _ in range(max(repeats, 20))]
    med = statistics.median(times)
    return {"M": len(bank), "n": bank.n, "median_ms": med * 1e3, "min_ms": min(times) * 1e3, "target_50ms_met": med < 0.05}


def workers(bank: KernelBank, small: KernelBank, repeats: int) -> dict:
    """The cached-bank pass (and the small-bank pass) threaded and on 1 and 2 worker processes."""
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(3)
    U = {k: rng.standard_normal((k, bank.n)) for k in (1, 16)}
    rows = []

    def measure(label: str, client) -> None:
        with Engine(bank, client=client) as eng:
            t = medians({k: (lambda k=k: eng.quad_forms(U[k])) for k in U}, repeats)
        for k, sec in t.items():
            rows.append({"where": label, "k": k, "seconds": sec, "GB_per_s": bank.nbytes / sec / GB})
        rows.append({"where": label, "small_bank_pass_ms": small_bank(small, repeats, client)["median_ms"]})

    measure("threaded default", None)
    for n_workers in (1, 2):
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            measure(f"LocalCluster {n_workers} worker process(es)", client)
    return {"M": len(bank), "n": bank.n, "rows": rows}


class PeakRSS:
    """Samples the resident memory of this process and all its descendants every ``every`` s."""

    def __init__(self, every: float = 0.02):
        import psutil

        self._me = psutil.Process()
        self.every = every
        self.peak_total = self.peak_driver = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        total = driver = self._me.memory_info().rss
        for child in self._me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        self.peak_total, self.peak_driver = max(self.peak_total, total), max(self.peak_driver, driver)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.every)

    def __enter__(self) -> PeakRSS:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def big_bank(workdir: Path, M: int | None, n: int, repeats: int) -> dict:
    from distributed import Client, LocalCluster

    kernel_bytes = n * n * 4
    free = shutil.disk_usage(workdir).free
    existing = KernelBank.open(workdir / "big").nbytes if KernelBank.is_bank(workdir / "big") else 0
    fits = int((free + existing) // (2.5 * kernel_bytes))
    wanted = 10_000 if M is None else M
    M_used = min(wanted, fits)
    note = (f"M={M_used} (asked {wanted}): {(free + existing) / GB:.0f} GB free on the work disk, "
            f"2.5x the bank must fit" if M_used < wanted else f"M={M_used}")
    print(f"  big bank: {note}; {M_used * kernel_bytes / GB:.1f} GB", flush=True)
    bank = get_bank(workdir / "big", M_used, n, data="ringnorm")  # ringnorm: bench_spicy --out-of-core reuses it
    files = shard_files(bank)
    u = np.random.default_rng(4).standard_normal(n)
    U16 = np.random.default_rng(5).standard_normal((16, n))
    out = {"M": M_used, "n": n, "bank_GB": bank.nbytes / GB, "note": note, "repeats": repeats,
           "memory_GB": None, "rows": []}
    import psutil

    out["memory_GB"] = psutil.virtual_memory().total / GB
    with PeakRSS() as rss_plain:
        t_plain = medians({"plain": lambda: plain_fromfile(files, 1)}, repeats)["plain"]
    out["rows"].append({"what": "plain fromfile 1 thread", "seconds": t_plain, "GB_per_s": bank.nbytes / t_plain / GB,
                        "peak_rss_GB": rss_plain.peak_total / GB})
    runs = [("threaded default", None)]
    for label, client_spec in runs + [("LocalCluster 2 worker processes", 2)]:
        cluster = client = None
        if client_spec:
            cluster = LocalCluster(n_workers=client_spec, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(cluster)
        try:
            with Engine(bank, client=client) as eng, PeakRSS() as rss:
                t = medians({"k=1": lambda: eng.quad_forms(u), "k=16": lambda: eng.quad_forms(U16)}, repeats)
            for k, sec in t.items():
                out["rows"].append({"what": f"quad_forms {k}, {label}", "seconds": sec,
                                    "GB_per_s": bank.nbytes / sec / GB, "x_plain": t_plain / sec,
                                    "peak_rss_GB": rss.peak_total / GB, "peak_rss_driver_GB": rss.peak_driver / GB})
        finally:
            if client is not None:
                client.close()
                cluster.close()
    out["peak_rss_GB"] = max(r["peak_rss_GB"] for r in out["rows"])
    out["target_4GB_met"] = out["peak_rss_GB"] <= 4.0
    return out


# ---- output ------------------------------------------------------------------------------------------
def table(result: dict) -> str:
    lines = []
    if "cached_bank" in result:
        c = result["cached_bank"]
        lines.append(f"cached bank M={c['M']} n={c['n']} {c['dtype']} ({c['bank_bytes'] / GB:.2f} GB), medians of {c['repeats']}")
        lines.append(f"  {'':34s} {'s':>8s} {'GB/s':>7s} {'x1T':>6s} {'x2T':>6s} {'xbest':>6s} {'xmem':>6s}")
        for r in c["rows"]:
            lines.append(f"  {r['what']:34s} {r['seconds']:8.3f} {r['GB_per_s']:7.2f} "
                         f"{r['x_plain_1thread']:6.2f} {r['x_plain_2threads']:6.2f} {r['x_best_plain']:6.2f} "
                         f"{r['x_memory']:6.2f}")
        lines.append(f"  x1T / x2T: against np.fromfile (1 / 2 threads); xbest: against the fastest plain read "
                     f"({c['best_plain']}); xmem: against one read of the bytes in RAM")
        lines.append(f"  k=16 pass time / k=1 pass time: {c['k16_over_k1_time']:.2f}")
    if "small_bank" in result:
        s = result["small_bank"]
        lines.append(f"small bank M={s['M']} n={s['n']}: pass median {s['median_ms']:.2f} ms (target < 50 ms)")
    if "workers" in result:
        lines.append("workers (cached bank GB/s; small bank pass ms)")
        for r in result["workers"]["rows"]:
            if "k" in r:
                lines.append(f"  {r['where']:40s} k={r['k']:<3d} {r['GB_per_s']:7.2f} GB/s")
            else:
                lines.append(f"  {r['where']:40s} small  {r['small_bank_pass_ms']:7.2f} ms")
    if "big_bank" in result:
        b = result["big_bank"]
        lines.append(f"big bank {b['note']} ({b['bank_GB']:.1f} GB, RAM {b['memory_GB']:.0f} GB)")
        for r in b["rows"]:
            lines.append(f"  {r['what']:50s} {r['GB_per_s']:7.2f} GB/s  peak RSS {r['peak_rss_GB']:.2f} GB")
        lines.append(f"  peak RSS {b['peak_rss_GB']:.2f} GB (target <= 4 GB)")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = result["cached_bank"]["rows"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = [r["what"] for r in rows]
    ax.barh(names, [r["GB_per_s"] for r in rows], color=["0.6" if n.startswith("plain") else "C0" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("GB/s of kernel data")
    c = result["cached_bank"]
    ax.set_title(f"Engine passes vs plain read, M={c['M']} n={c['n']} {c['dtype']} (page cache)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats (a smoke run)")
    ap.add_argument("--big", action="store_true", help="only the larger-than-memory bank section")
    ap.add_argument("--big-M", type=int, default=None, help="kernels of the --big bank (default 10000, capped by disk)")
    ap.add_argument("--big-n", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=None, help="default 5 (3 with --quick)")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "mklscale-bench")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/bench_pass[_big|_quick].json)")
    args = ap.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if Path(__file__).resolve().parent.parent in args.workdir.resolve().parents:
        ap.error("--workdir must be outside the repository")
    suffix = "_big" if args.big else "_quick" if args.quick else ""
    out = args.out or RESULTS / f"bench_pass{suffix}.json"
    import dask
    import distributed

    result = {"machine": {**describe_machine(args.workdir), "distributed": distributed.__version__,
                          "loadavg_at_start": os.getloadavg()},
              "settings": {"quick": args.quick, "big": args.big, "repeats": repeats, "workdir": str(args.workdir),
                           "dask_threads": dask.system.CPU_COUNT}}
    if args.big:
        result["big_bank"] = big_bank(args.workdir, args.big_M, args.big_n, repeats)
    else:
        M, n = (200, 200) if args.quick else (2000, 500)
        print(f"cached bank M={M} n={n} ...", flush=True)
        result["cached_bank"] = cached_bank(get_bank(args.workdir / f"cached-{M}x{n}", M, n), repeats)
        print("small bank M=100 n=100 ...", flush=True)
        small = get_bank(args.workdir / "small-100x100", 100, 100)
        result["small_bank"] = small_bank(small, repeats)
        print("workers ...", flush=True)
        result["workers"] = workers(KernelBank.open(args.workdir / f"cached-{M}x{n}"), small, repeats)
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    if "cached_bank" in result and not args.quick and args.out is None:
        plot(result, RESULTS / "bench_pass.png")
    print(table(result))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
