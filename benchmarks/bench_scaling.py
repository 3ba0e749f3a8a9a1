"""Scaling study (issue 10, items 2-6): six solvers against M, n, workers, a bank larger than memory,
and the time of one read of the bank at the disk's speed (issue 21).

    python benchmarks/bench_scaling.py --quick                     # every item at tiny sizes (< 2 min)
    python benchmarks/bench_scaling.py --m-scaling --n 200         # item 2: M = 100 ... 10,000 at n = 200
    python benchmarks/bench_scaling.py --m-scaling --n 1000 --big-bank /tmp/mklscale-bench/big
                                                                   # item 2 at n = 1000: M <= 3000 built here,
                                                                   # plus the M = 7947/10,000 bank of item 5
    python benchmarks/bench_scaling.py --n-scaling                 # item 3: n = 200 ... 4000 at M = 100
    python benchmarks/bench_scaling.py --workers                   # item 4: 1 vs 2 worker processes + a model
    python benchmarks/bench_scaling.py --out-of-core /tmp/mklscale-bench/big   # item 5 (builds the bank if absent)
    python benchmarks/bench_scaling.py --physical /tmp/mklscale-bench/phys --physical-build
                                                                   # item 6: cold pass and fit time / direct read

Item 6 (issue 21) needs root: before each measurement it runs ``sync; echo 3 > /proc/sys/vm/drop_caches``
(a failure is printed and recorded in the JSON's ``page_cache`` and ``cache_state``). Its reference is
the fastest of O_DIRECT reads of the shard files with 1, 2 and 4 threads (``--physical-read-threads``);
then one engine quad_forms pass from a cold cache, and each solver of ``--physical-solvers`` (SpicyMKL
by default) in a fresh worker process, the cache dropped just before the timed fit: fit seconds over
the reference, and over (bank reads x reference). ``--physical-build`` builds an absent bank at
n = 1000 with M for about 1.4x the machine's memory (``--physical-M`` to choose; fewer where the disk
is short, 5 GB kept free).

Protocol (IDA, as bench_spicy.py): ringnorm, training rows ``load("ringnorm", n_samples=n, seed=0)``,
test rows ``load("ringnorm", n_samples=1000, seed=1)`` (independent draws of the same generator);
Gaussian kernels on random feature subsets, width 5 chi^2 + 0.1 (``families.random_subsets(20, M,
seed=0)``), unit trace, float32. With seed 0 for data and specs, the bank of a given (n, M) is the
bank ``bench_pass.py --big`` builds (``/tmp/mklscale-bench/big``), so it is reused as is.

A ``KernelSubsetEngine`` over the largest bank would read its kernels as a subset scattered
over that bank's shards, not as a bank of M kernels, so every M is its own bank, built once into ``--workdir`` and reused on later runs (``build_bank``
resumes or skips a bank with the same data and specs). At n = 1000 the nested banks M = 100 ...
3000 take 17.6 GB; the M = 10,000 point (40 GB) is the bank of item 5, passed with ``--big-bank``.

Solvers and their settings (the existing benchmarks' tolerances; the regularisation constants are
the registry defaults for unit-trace kernels, except SpicyMKL's C = 0.05 of bench_spicy.py):
see ``SOLVERS``. Every fit runs in a worker process (spawned once, reused; each solver is run once
on a tiny bank first so numba loading is not timed) under a wall-clock limit ``--timeout``; a fit
past it is killed and recorded as ``timeout``, and the solver is not run at larger sizes of that
sweep (recorded as ``skipped``). Times are the solver's wall time (median of up to --repeats fits;
a fit longer than 5 s is run once), passes and bytes read come from the engine's counters, test
accuracy uses cross kernels of the active kernels only (outside the timing).

Results: benchmarks/results/bench_scaling_<item>.json (+ .png), README via make_readme.py.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine  # noqa: E402

RESULTS = HERE / "results"
GB = 1e9
N_TEST = 1000
DATA_SEED, TEST_SEED, SPEC_SEED = 0, 1, 0

#: solver -> label, the value of the registry's C (None: computed, see PFBS), solver parameters.
SOLVERS = {
    "spicy": {"label": "SpicyMKL", "C": 0.05,
              "params": {"loss": "logistic", "penalty": "l1", "tol": 0.01},
              "note": "logistic, block-1, C = 0.05, relative gap 0.01 (bench_spicy.py)"},
    "smo": {"label": "SMO-MKL", "C": 100.0, "params": {"tol": 1e-4},
            "note": "C = 100 (registry default, unit trace), certified relative gap 1e-4 (bench_smo_citi.py)"},
    "elasticnet": {"label": "Citi", "C": 100.0, "params": {"eta": 0.5, "tol": 1e-4, "max_iter": 5000},
                   "note": "eta = 0.5, C = 100, tol 1e-4, max_iter 5000, max_seconds = 0.9 x the fit limit (bench_smo_citi.py)"},
    "pfbs": {"label": "PFBS", "C": None, "params": {"mu": 1e-3, "accelerated": True, "center": True, "tol": 1e-5,
                                                    "max_iter": 20000},
             "note": "FISTA, tau = 0.1 tau_max (computed before the timing), mu = 1e-3, gap 1e-5 (bench_pfbs.py CV)"},
    "sgd": {"label": "SGD-1s", "C": 0.01, "params": {"T": 800, "seed": 0},
            "note": "lam = 0.01 (registry default), T = 800 (bench_sgd_gcd.py)"},
    "gcd": {"label": "GCD-1s", "C": 0.01, "params": {"max_iter": 100, "tol": 1e-3},
            "note": "one stage, lam = 0.01, max_iter 100, tol 1e-3 (bench_sgd_gcd.py)"},
}
ALL_SOLVERS = list(SOLVERS)


# ---- data and banks ----------------------------------------------------------------------------
def ringnorm(n: int, seed: int):
    from mklscale.datasets import load

    ds = load("ringnorm", n_samples=n, seed=seed)
    return np.asarray(ds.X, dtype=np.float64), np.asarray(ds.y, dtype=np.float64)


def get_bank(path: Path, n: int, M: int) -> tuple:
    """The ringnorm bank of (n, M) at ``path``: reused when complete, built (or resumed) otherwise.
    Returns (bank, build_seconds or None when reused)."""
    from mklscale.bank import KernelBank, build_bank, families

    if KernelBank.is_bank(path):
        bank = KernelBank.open(path)
        if (len(bank), bank.n) == (M, n) and bank.complete.all():
            return bank, None
    X, _ = ringnorm(n, DATA_SEED)
    specs = families.random_subsets(X.shape[1], M, seed=SPEC_SEED)
    t0 = time.perf_counter()
    bank = build_bank(X, specs, path, dtype="float32", overwrite=False, progress=False)
    secs = time.perf_counter() - t0
    print(f"  built {path.name}: M={M} n={n} ({bank.nbytes / GB:.2f} GB) in {secs:.1f} s", flush=True)
    return bank, secs


def warm_bank(workdir: Path):
    return get_bank(workdir / "warm-n40-M6", 40, 6)[0]


# ---- one fit, in a worker process ---------------------------------------------------------------
def _solver_call(name: str, engine, y, timeout: float | None):
    from mklscale.solvers import pfbs, registry

    spec = SOLVERS[name]
    params = dict(spec["params"])
    C = spec["C"]
    if name == "pfbs":
        C = 0.1 * pfbs.tau_max(engine, y, center=True)
    if name == "elasticnet" and timeout:
        params["max_seconds"] = 0.9 * float(timeout)
    return C, (lambda: registry.fit_solver(name, engine, y, "classification", C=C, params=params))


def _predict(bank, res, X_test, chunk_bytes: int = 256 * 2**20) -> np.ndarray:
    """Decision values on X_test from cross kernels of the active kernels, in chunks."""
    active = np.asarray(res.active)
    f = np.full(X_test.shape[0], res.bias)
    step = max(1, chunk_bytes // (8 * X_test.shape[0] * bank.n))
    for s in range(0, active.size, step):
        idx = active[s:s + step]
        Kc = bank.cross(X_test, kernels=idx.tolist())
        f += np.einsum("m,mij->ij", res.weights[idx], Kc) @ res.dual_coef
    return f


def fit_job(job: dict, out=None) -> dict:
    """Open the bank, (optionally) start a LocalCluster, run the solver, measure."""
    from mklscale.bank import KernelBank
    from mklscale.engine import Engine

    bank = KernelBank.open(job["bank"])
    _, y = ringnorm(bank.n, DATA_SEED)
    X_test, y_test = ringnorm(N_TEST, TEST_SEED)
    cluster = client = None
    if job.get("workers"):
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=job["workers"], threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        if job.get("warm"):  # numba / cluster warm-up on a tiny bank, not timed
            wb = KernelBank.open(job["warm"])
            with Engine(wb, client=client) as weng:
                _solver_call(job["solver"], weng, ringnorm(wb.n, DATA_SEED)[1], None)[1]()
        with Engine(bank, client=client) as eng:
            C, call = _solver_call(job["solver"], eng, y, job.get("timeout"))
            if out is not None:
                out.put({"started": time.time()})
            times, cache = [], None
            if job.get("drop_page_cache"):
                cache = drop_page_cache()
            for _ in range(job.get("repeats", 1)):
                p0, b0 = eng.stats["passes"], eng.stats["bytes_read"]
                t0 = time.perf_counter()
                res = call()
                times.append(time.perf_counter() - t0)
                passes, nbytes = eng.stats["passes"] - p0, eng.stats["bytes_read"] - b0
                if times[-1] > 5.0:
                    break
        f = _predict(bank, res, X_test)
        return {"status": "ok", "C": float(C), "seconds": statistics.median(times), "seconds_all": times,
                "passes": int(passes), "bytes_read": int(nbytes), "bank_reads": nbytes / bank.nbytes,
                "active": int(res.n_active), "iterations": len(res.history),
                "test_accuracy": float(np.mean(np.where(f >= 0, 1.0, -1.0) == y_test)),
                "converged": bool(res.converged), "gap": float(res.gap), "objective": float(res.objective),
                **({"page_cache": cache} if cache is not None else {})}
    finally:
        if client is not None:
            client.close()
            cluster.close()


def _worker_loop(jobs, out) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            result = fit_job(job, out)
        except Exception as e:  # recorded, not raised: a failing solver is a result
            result = {"status": "error", "message": f"{type(e).__name__}: {e}"[:400]}
        out.put({"result": result})


class FitRunner:
    """Runs fit jobs in one spawned worker process (reused); kills it (and its children) on timeout."""

    START_S = 180.0  # bank open + cluster start + warm-up allowance before the timed fit

    def __init__(self):
        self.proc = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.jobs, self.out = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_worker_loop, args=(self.jobs, self.out), daemon=False)
        self.proc.start()

    def kill(self) -> None:
        import psutil

        if self.proc is None:
            return
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True) + [psutil.Process(self.proc.pid)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        self.proc.join(10)
        self.proc = None

    def run(self, job: dict, timeout: float, fresh: bool = False) -> dict:
        """Run one job; ``fresh``: in a new worker process (its peak memory is this fit's alone)."""
        if fresh:
            self.close()
        if self.proc is None or not self.proc.is_alive():
            self._start()
        job = {**job, "timeout": timeout}
        self.jobs.put(job)
        t_start = time.perf_counter()
        try:
            msg = self._get(self.START_S)
            if "result" in msg:
                return msg["result"]
            return self._get(timeout + 30)["result"]
        except queue.Empty:
            self.kill()
            waited = time.perf_counter() - t_start
            return {"status": "timeout", "timeout_s": timeout, "message": f"killed after {waited:.0f} s"}
        except ChildProcessError as e:
            self.proc = None
            return {"status": "error", "message": str(e)}

    def _get(self, timeout: float) -> dict:
        """The worker's next message; ChildProcessError when the worker dies first (the kernel's OOM
        killer: exit code -9), queue.Empty after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while True:
            try:
                return self.out.get(timeout=min(2.0, max(end - time.monotonic(), 0.01)))
            except queue.Empty:
                if not self.proc.is_alive():
                    code = self.proc.exitcode
                    raise ChildProcessError(f"the fit's worker process died (exit code {code}"
                                            + (": SIGKILL, most likely the kernel's OOM killer)" if code == -9
                                               else ")")) from None
                if time.monotonic() >= end:
                    raise

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.jobs.put(None)
            self.proc.join(30)
            if self.proc.is_alive():
                self.kill()
        self.proc = None


def mark_time_limit(r: dict, timeout: float) -> dict:
    if r["status"] == "ok" and not r["converged"] and r["seconds"] >= 0.85 * timeout:
        r["hit_time_limit"] = True  # Citi's max_seconds: stopped by the limit, not converged
    return r


def sweep(runner: FitRunner, points: list[tuple], solvers: list[str], timeout: float, repeats: int,
          warm: Path, key: str, measured: dict | None = None) -> list[dict]:
    """Fit every solver on every (value, bank, build_seconds) point; a solver that times out is
    skipped at the larger points of the sweep. ``measured`` maps (value, solver) to a fit already
    made in this run on the same bank (item 6's fits of the M = 10,000 bank), which is not repeated."""
    rows, stopped, measured = [], {}, measured or {}
    for value, bank, build_s in points:
        for s in solvers:
            base = {"solver": s, "label": SOLVERS[s]["label"], key: value, "n": bank.n, "M": len(bank),
                    "bank_GB": bank.nbytes / GB, "build_seconds": build_s}
            if s in stopped:
                rows.append({**base, "status": "skipped", "message": f"timed out at {key} = {stopped[s]}"})
                continue
            if (value, s) in measured:
                r = {**measured[(value, s)], "from_item": "physical"}
            else:
                r = mark_time_limit(runner.run({"bank": str(bank.path), "solver": s, "repeats": repeats,
                                                "warm": str(warm.path)}, timeout), timeout)
            rows.append({**base, **r})
            if r["status"] == "timeout" or r.get("hit_time_limit"):
                stopped[s] = value
            print(f"  {key}={value:6d} {SOLVERS[s]['label']:9s} {r['status']:8s} "
                  + (f"{r['seconds']:8.2f} s passes={r['passes']:4d} reads={r['bank_reads']:6.1f} "
                     f"active={r['active']:5d} acc={r['test_accuracy']:.3f} conv={r['converged']}"
                     if r["status"] == "ok" else r.get("message", "")), flush=True)
    return rows


def loglog_slopes(rows: list[dict], key: str, above: float | None) -> dict:
    out = {}
    for s in dict.fromkeys(r["solver"] for r in rows):
        pts = [(r[key], r["seconds"]) for r in rows if r["solver"] == s and r["status"] == "ok"
               and not r.get("hit_time_limit") and (above is None or r[key] > above)]
        if len(pts) >= 2 and len({p[0] for p in pts}) >= 2:
            out[s] = float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0])
    return out


# ---- items ------------------------------------------------------------------------------------
def item_m_scaling(args, runner, warm, physical: dict | None = None) -> dict:
    n = args.n
    points = []
    for M in args.Ms:
        bank, build_s = get_bank(args.workdir / f"ringnorm-n{n}-M{M}", n, M)
        points.append((M, bank, build_s))
    if args.big_bank is not None:
        from mklscale.bank import KernelBank

        big = KernelBank.open(args.big_bank)
        if big.n != n:
            raise SystemExit(f"--big-bank has n = {big.n}, not {n}")
        points.append((len(big), big, None))
    measured = {}
    if physical is not None and args.big_bank is not None and Path(physical["bank"]).resolve() == args.big_bank.resolve():
        measured = {(physical["M"], r["solver"]): {k: v for k, v in r.items() if k not in ("solver", "label")}
                    for r in physical["rows"]}
    rows = sweep(runner, points, args.solvers, args.timeout, args.repeats, warm, "M", measured)
    return {"n": n, "Ms": [p[0] for p in points], "rows": rows,
            "big_bank": str(args.big_bank) if args.big_bank else None,
            "slopes_all_M": loglog_slopes(rows, "M", None), "slopes_M_above_1000": loglog_slopes(rows, "M", 1000)}


def item_n_scaling(args, runner, warm) -> dict:
    points = []
    for n in args.ns:
        bank, build_s = get_bank(args.workdir / f"ringnorm-n{n}-M{args.n_scaling_M}", n, args.n_scaling_M)
        points.append((n, bank, build_s))
    rows = sweep(runner, points, args.solvers, args.timeout, args.repeats, warm, "n_train")
    return {"M": args.n_scaling_M, "ns": list(args.ns), "rows": rows,
            "slopes_all_n": loglog_slopes(rows, "n_train", None),
            "slopes_n_above_500": loglog_slopes(rows, "n_train", 500)}


def plain_read(files: list[Path], threads: int = 1) -> float:
    from bench_pass import plain_fromfile

    t0 = time.perf_counter()
    plain_fromfile(files, threads)
    return time.perf_counter() - t0


def item_workers(args, warm) -> dict:
    """Pass and SpicyMKL solve on the threaded default and 1 / 2 worker processes; I/O and compute
    split of a pass; a model of T(k) workers (stated as a model)."""
    from bench_pass import medians
    from distributed import Client, LocalCluster

    from bench_pass import shard_files

    from mklscale.engine import Engine
    from mklscale.solvers import spicy

    bank, _ = get_bank(args.workdir / f"ringnorm-n{args.workers_n}-M{args.workers_M}", args.workers_n, args.workers_M)
    _, y = ringnorm(bank.n, DATA_SEED)
    files = shard_files(bank)
    file_bytes = sum(f.stat().st_size for f in files)
    u = np.random.default_rng(3).standard_normal(bank.n)
    reps = args.pass_repeats
    from bench_pass import plain_readinto

    plain_read(files, 1)  # into the page cache
    reads = medians({"fromfile 1": lambda: plain_read(files, 1), "fromfile 2": lambda: plain_read(files, 2),
                     "readinto 1": lambda: plain_readinto(files, 1), "readinto 2": lambda: plain_readinto(files, 2)},
                    reps)
    t_read = reads["readinto 1"]  # the engine's reader: shard files into a reused buffer, 1 thread
    t_read2 = reads["readinto 2"]
    # compute: the engine's kernels on blocks held in the driver-side cache (one thread, no I/O)
    n_sub = min(len(bank), max(1, int(1.5e9 // (bank.n * bank.n * bank.dtype.itemsize))), 2000)
    idx = np.arange(n_sub)
    with Engine(bank, cache_bytes=int(2 * n_sub * bank.n ** 2 * bank.dtype.itemsize) + 2**20) as eng:
        eng.blocks(idx)
        t_sub = medians({"c": lambda: eng.quad_forms(u, kernels=idx)}, reps)["c"]
        assert eng.stats["log"][-1]["cache_hits"] == n_sub, "compute timing did not hit the cache"
    t_cpu = t_sub * len(bank) / n_sub
    rows = []

    def measure(label: str, k: int, client) -> dict:
        with Engine(bank, client=client) as eng:
            eng.quad_forms(u)
            t_pass = medians({"p": lambda: eng.quad_forms(u)}, reps)["p"]
            spicy.fit(eng, y, 0.05, loss="logistic", penalty="l1", tol=0.01)  # warm
            solve_t, passes, full_s, eng_s = [], 0, [], []
            for _ in range(args.repeats):
                p0, l0 = eng.stats["passes"], len(eng.stats["log"])
                t0 = time.perf_counter()
                spicy.fit(eng, y, 0.05, loss="logistic", penalty="l1", tol=0.01)
                solve_t.append(time.perf_counter() - t0)
                passes = eng.stats["passes"] - p0
                log = eng.stats["log"][l0:]
                full_s.append(sum(e["seconds"] for e in log if e["full_pass"]))
                eng_s.append(sum(e["seconds"] for e in log))
        row = {"where": label, "workers": k, "pass_seconds": t_pass, "pass_GB_per_s": bank.nbytes / t_pass / GB,
               "solve_seconds": statistics.median(solve_t), "solve_passes": passes,
               "solve_full_pass_seconds": statistics.median(full_s), "solve_engine_seconds": statistics.median(eng_s)}
        print(f"  {label:36s} pass {t_pass:.3f} s  solve {row['solve_seconds']:.2f} s ({passes} passes)", flush=True)
        rows.append(row)
        return row

    measure("threaded default (2 threads)", 0, None)
    for k in (1, 2):
        with LocalCluster(n_workers=k, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            measure(f"LocalCluster {k} worker process(es)", k, client)
    T1 = rows[1]["pass_seconds"]
    t_ovh = T1 - t_read - t_cpu
    r_agg = file_bytes / min(reads.values())

    def model(k: int) -> float:
        return t_ovh + max((t_read + t_cpu) / k, file_bytes / r_agg)

    S1 = rows[1]
    solve_other = S1["solve_seconds"] - S1["solve_full_pass_seconds"]
    proj = [{"workers": k, "pass_seconds_model": model(k),
             "solve_seconds_model": solve_other + S1["solve_full_pass_seconds"] * model(k) / model(1)}
            for k in (1, 2, 4, 8, 16, 32)]
    return {
        "bank": str(bank.path), "M": len(bank), "n": bank.n, "bank_GB": bank.nbytes / GB, "repeats": reps,
        "page_cache": "bank read once before timing; all passes from the page cache",
        "plain_reads_s": reads,
        "split": {"t_read_1thread_s": t_read, "t_read_2threads_s": t_read2, "t_cpu_1core_s": t_cpu,
                  "t_cpu_measured_on_kernels": n_sub, "t_overhead_s": t_ovh, "R_agg_GB_per_s": r_agg / GB},
        "rows": rows,
        "model": {
            "formula": "T(k) = t_ovh + max((t_read + t_cpu) / k, bytes / R_agg); "
                       "solve(k) = (solve_1 - P_1) + P_1 * T(k) / T(1)",
            "terms": "t_read: plain read of the bank files into a reused buffer (readinto, the engine's reader), "
                     "1 thread (same cache state); t_cpu: the engine's quad_form "
                     "kernels on cached blocks, 1 core, scaled to M; t_ovh = T_1 - t_read - t_cpu (scheduler, graph, "
                     "transfer: measured residual at 1 worker, assumed constant in k); R_agg: the best measured "
                     "aggregate read rate (any plain read above, 1 or 2 threads), the ceiling of the storage; one core per "
                     "worker assumed; P_1: the seconds of the full passes inside the 1-worker solve (engine log), "
                     "the rest of the solve (driver work, block reads of the active kernels) held constant",
            "check_2_workers": {"model_s": model(2), "measured_s": rows[2]["pass_seconds"],
                                "solve_model_s": proj[1]["solve_seconds_model"],
                                "solve_measured_s": rows[2]["solve_seconds"]},
            "projection": proj,
        },
    }


def ensure_big_bank(path: Path, n: int, M: int) -> tuple:
    """The bank at ``path``: reused when complete (whatever its M), else built (or resumed) at (n, M),
    M lowered to what the disk holds with 5 GB kept free. Returns (bank, build record, note)."""
    from bench_pass import PeakRSS

    from mklscale.bank import KernelBank

    kernel_bytes = n ** 2 * 4
    if KernelBank.is_bank(path) and KernelBank.open(path).complete.all():
        bank = KernelBank.open(path)
        build = {"reused": True, "seconds": None,
                 "note": "existing bank reused (built earlier by bench_pass.py --big or a previous run); build time not measured here"}
        return bank, build, f"M={len(bank)}, n={bank.n}: existing bank"
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = KernelBank.open(path).nbytes if KernelBank.is_bank(path) else 0
    free = shutil.disk_usage(path.parent).free + existing
    fits = int((free - 5 * 2**30) // (1.05 * kernel_bytes))
    M_built = min(M, fits)
    note = f"M={M_built}" + (f" (asked {M}: {free / GB:.0f} GB free, 5 GB kept)" if M_built < M else "")
    print(f"  building {path}: {note}", flush=True)
    with PeakRSS() as rss:
        bank, secs = get_bank(path, n, M_built)
    build = {"reused": False, "seconds": secs, "peak_rss_GB": rss.peak_total / GB,
             "kernels_per_s": M_built / secs if secs else None}
    return bank, build, note


def item_out_of_core(args, runner, warm) -> dict:
    from bench_pass import PeakRSS

    import psutil

    bank, build, note = ensure_big_bank(args.out_of_core, args.ooc_n, args.ooc_M)
    mem = psutil.virtual_memory().total
    rows = []
    for workers in args.ooc_workers:
        runner.kill()  # a fresh worker process: its RSS is this fit's
        with PeakRSS() as rss:
            r = runner.run({"bank": str(bank.path), "solver": "spicy", "repeats": 1, "workers": workers,
                            "warm": str(warm.path)}, args.ooc_timeout)
        r.update({"workers": workers, "where": "threaded default" if not workers else f"LocalCluster {workers} workers",
                  "peak_rss_GB": rss.peak_total / GB, "peak_rss_driver_GB": rss.peak_driver / GB})
        rows.append(r)
        runner.kill()
        print(f"  out of core, workers={workers}: {r.get('status')} {r.get('seconds', float('nan')):.1f} s, "
              f"passes={r.get('passes')}, peak RSS {r['peak_rss_GB']:.2f} GB", flush=True)
    return {"bank": str(bank.path), "M": len(bank), "n": bank.n, "bank_GB": bank.nbytes / GB, "memory_GB": mem / GB,
            "larger_than_memory": bank.nbytes > mem, "note": note, "build": build, "rows": rows,
            "targets": {"fit_seconds": 600, "peak_rss_GB": 4.0},
            "rss_note": "psutil RSS of the benchmark process and all its descendants (fit worker process, its "
                        "LocalCluster workers, multiprocessing's resource tracker), sampled every 20 ms; page cache "
                        "not counted"}


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache() -> dict:
    """``sync; echo 3 > /proc/sys/vm/drop_caches`` (needs root): the next read of any file comes from
    the disk. Returns {"dropped": True} or {"dropped": False, "error": why}; a failure is printed."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
        return {"dropped": True}
    except OSError as e:
        print(f"  WARNING: the page cache was NOT dropped ({e}); the timing that follows may read from it", flush=True)
        return {"dropped": False, "error": f"{type(e).__name__}: {e}"}


def direct_read(files: list[Path], threads: int, block: int) -> dict:
    """One O_DIRECT read of every shard file with ``threads`` threads, after dropping the page cache."""
    from mklscale.bank.direct_io import read_files_direct

    cache = drop_page_cache()
    t0 = time.perf_counter()
    nbytes = read_files_direct(files, threads=threads, block=block)
    secs = time.perf_counter() - t0
    return {"threads": threads, "seconds": secs, "bytes": nbytes, "GB_per_s": nbytes / secs / GB, "page_cache": cache}


def cold_pass(bank, warm) -> dict:
    """One engine quad_forms pass (k = 1, threaded default) over the whole bank by a fresh Engine (empty
    engine cache) after dropping the page cache; numba compiled beforehand on the warm-up bank and on
    4 kernels of this bank (the same reader, hence the same array types)."""
    from mklscale.engine import Engine
    from mklscale.engine.reader import KernelReader

    u = np.random.default_rng(0).standard_normal(bank.n)
    with Engine(warm) as weng:
        weng.quad_forms(np.random.default_rng(0).standard_normal(warm.n))
    with Engine(bank) as eng:
        eng.quad_forms(u, kernels=np.arange(min(4, len(bank))))
    with Engine(bank) as eng:
        cache = drop_page_cache()
        p0, b0 = eng.stats["passes"], eng.stats["bytes_read"]
        t0 = time.perf_counter()
        eng.quad_forms(u)
        secs = time.perf_counter() - t0
        passes, nbytes = eng.stats["passes"] - p0, eng.stats["bytes_read"] - b0
    return {"seconds": secs, "passes": int(passes), "bytes_read": int(nbytes), "bank_reads": nbytes / bank.nbytes,
            "GB_per_s": nbytes / secs / GB, "page_cache": cache, "reader": KernelReader(bank).source}


def item_physical(args, runner, warm) -> dict:
    """Item 6 (issue 21): fit time against the disk's own read speed. The reference is the fastest
    of O_DIRECT reads of the shard files with 1, 2, 4 threads, each after dropping the page cache;
    a cold engine pass and each fit (in a fresh worker process) also start after a drop."""
    import psutil
    from bench_pass import shard_files

    mem = psutil.virtual_memory().total
    # main() has refused an absent bank without --physical-build (under --quick, item 5 has built it)
    M = args.physical_M or int(np.ceil(1.4 * mem / (args.physical_n ** 2 * 4)))
    bank, build, note = ensure_big_bank(args.physical, args.physical_n, M)
    files = shard_files(bank)
    file_bytes = sum(f.stat().st_size for f in files)
    larger = file_bytes > mem
    reads = []
    for t in args.physical_read_threads:
        reads.append(direct_read(files, t, args.physical_read_block))
        print(f"  direct read, {t} thread(s), cache {'dropped' if reads[-1]['page_cache']['dropped'] else 'NOT dropped'}: "
              f"{reads[-1]['seconds']:.1f} s, {reads[-1]['GB_per_s']:.2f} GB/s", flush=True)
    ref = min(reads, key=lambda r: r["seconds"])
    t_ref = ref["seconds"]
    cold = cold_pass(bank, warm)
    cold["over_reference"] = cold["seconds"] / t_ref
    print(f"  cold engine pass: {cold['seconds']:.1f} s ({cold['over_reference']:.2f} x reference)", flush=True)
    rows = []
    timeout = args.physical_timeout or args.timeout
    for s in args.physical_solvers:
        r = mark_time_limit(runner.run({"bank": str(bank.path), "solver": s, "repeats": 1, "warm": str(warm.path),
                                        "drop_page_cache": True}, timeout, fresh=True), timeout)
        rows.append({"solver": s, "label": SOLVERS[s]["label"], **r})
        if r["status"] == "ok":
            r = rows[-1]
            r["fit_over_reference"] = r["seconds"] / t_ref
            r["fit_over_reads_x_reference"] = r["seconds"] / (r["bank_reads"] * t_ref) if r["bank_reads"] else None
        elif r["status"] == "timeout":
            rows[-1]["fit_over_reference_at_least"] = r["timeout_s"] / t_ref
        print(f"  {SOLVERS[s]['label']:9s} {r['status']:8s} {r.get('seconds', float('nan')):8.1f} s", flush=True)
    drops = [r["page_cache"] for r in reads] + [cold["page_cache"]] + [r["page_cache"] for r in rows if "page_cache" in r]
    failed = [d["error"] for d in drops if not d["dropped"]]
    if failed:
        cache_state = (f"page cache NOT dropped before {len(failed)} of {len(drops)} measurements ({failed[0]}): those "
                       "may have read from memory" + ("" if larger else ", and the bank fits in it"))
    else:
        cache_state = (f"page cache dropped (sync; echo 3 > {DROP_CACHES}) before each of the {len(drops)} measurements; "
                       + ("the bank is larger than memory, so a fit's later passes cannot be served from the cache either"
                          if larger else "the bank FITS in memory, so a fit's passes after its first may read from "
                                         "the page cache")
                       + "; each engine starts with its own cache (2 GB) empty")
    return {"bank": str(bank.path), "M": len(bank), "n": bank.n, "bank_GB": file_bytes / GB, "memory_GB": mem / GB,
            "larger_than_memory": larger, "note": note, "build": build,
            "reference": {"seconds": t_ref, "threads": ref["threads"], "GB_per_s": ref["GB_per_s"],
                          "how": f"O_DIRECT pread of every shard file ({len(files)} files) in blocks of "
                                 f"{args.physical_read_block // 2**20} MiB into one aligned reused buffer per thread "
                                 "(mklscale.bank.direct_io.read_files_direct), the page cache dropped before each; "
                                 "the fastest of the thread counts tried"},
            "direct_reads": reads, "cold_pass": cold, "cache_state": cache_state,
            "rows": rows, "target": {"spicy_fit_over_read": 8.0}}


# ---- plots ------------------------------------------------------------------------------------
def plot_scaling(section: dict, key: str, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    slopes = section.get("slopes_all_M") or section.get("slopes_all_n") or {}
    for i, s in enumerate(dict.fromkeys(r["solver"] for r in section["rows"])):
        pts = sorted((r[key], r["seconds"], r["bank_reads"]) for r in section["rows"]
                     if r["solver"] == s and r["status"] == "ok" and not r.get("hit_time_limit"))
        for r in section["rows"]:
            if r["solver"] == s and r.get("hit_time_limit"):
                axes[0].plot([r[key]], [r["seconds"]], "x", color=f"C{i}", ms=10)
        if not pts:
            continue
        x = [p[0] for p in pts]
        lab = SOLVERS[s]["label"] + (f" (slope {slopes[s]:.2f})" if s in slopes else "")
        axes[0].loglog(x, [p[1] for p in pts], "o-", color=f"C{i}", label=lab)
        axes[1].loglog(x, [max(p[2], 1e-3) for p in pts], "o-", color=f"C{i}", label=SOLVERS[s]["label"])
        to = [r[key] for r in section["rows"] if r["solver"] == s and r["status"] == "timeout"]
        for t in to:
            axes[0].plot([t], [next(r for r in section["rows"] if r["solver"] == s and r[key] == t)["timeout_s"]],
                         "x", color=f"C{i}", ms=10)
    axes[0].set_xlabel(key.replace("_train", "")), axes[0].set_ylabel("fit seconds (x: time limit)")
    axes[1].set_xlabel(key.replace("_train", "")), axes[1].set_ylabel("bank reads (bytes read / bank bytes)")
    xs = sorted({r[key] for r in section["rows"]})
    for ax in axes:
        ax.set_xticks(xs, [str(v) for v in xs], fontsize=7)
        ax.minorticks_off()
    axes[0].legend(fontsize=7)
    axes[0].set_title(title + " (slopes over all points)", fontsize=9)
    axes[1].set_title("I/O per fit", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replot(path: Path) -> None:
    res = json.loads(path.read_text())
    if "m_scaling" in res:
        sec = res["m_scaling"]
        sec["slopes_all_M"], sec["slopes_M_above_1000"] = loglog_slopes(sec["rows"], "M", None), \
            loglog_slopes(sec["rows"], "M", 1000)
        plot_scaling(sec, "M", path.with_suffix(".png"), f"fit time vs M, n = {sec['n']}")
    if "n_scaling" in res:
        sec = res["n_scaling"]
        sec["slopes_all_n"], sec["slopes_n_above_500"] = loglog_slopes(sec["rows"], "n_train", None), \
            loglog_slopes(sec["rows"], "n_train", 500)
        p = path.with_suffix(".png") if not res.get("quick") else path.with_name("bench_scaling_quick_n.png")
        plot_scaling(sec, "n_train", p, f"fit time vs n, M = {sec['M']}")
    path.write_text(json.dumps(res, indent=2))
    print(f"rewrote the derived fields of {path}")


# ---- main -------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="every item at tiny sizes (a smoke run, < 2 min)")
    ap.add_argument("--m-scaling", action="store_true", help="item 2 (with --n)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--Ms", type=int, nargs="+", default=None, help="default 100 300 1000 3000 6000 10000 "
                                                                    "(n = 200) or 100 300 1000 3000 (n > 200)")
    ap.add_argument("--big-bank", type=Path, default=None, help="add this bank (same n, same data) as the largest M")
    ap.add_argument("--n-scaling", action="store_true", help="item 3")
    ap.add_argument("--ns", type=int, nargs="+", default=[200, 500, 1000, 2000, 4000])
    ap.add_argument("--n-scaling-M", type=int, default=100)
    ap.add_argument("--workers", action="store_true", help="item 4")
    ap.add_argument("--workers-n", type=int, default=200)
    ap.add_argument("--workers-M", type=int, default=10000)
    ap.add_argument("--out-of-core", type=Path, default=None, help="item 5 on the bank at this path (built if absent)")
    ap.add_argument("--ooc-M", type=int, default=10000)
    ap.add_argument("--ooc-n", type=int, default=1000)
    ap.add_argument("--ooc-workers", type=int, nargs="+", default=[0, 2], help="0 = threaded default")
    ap.add_argument("--ooc-timeout", type=float, default=1200.0)
    ap.add_argument("--physical", type=Path, default=None, help="item 6 on the bank at this path (see --physical-build)")
    ap.add_argument("--physical-build", action="store_true",
                    help="build the item-6 bank when absent: n = --physical-n, M = --physical-M")
    ap.add_argument("--physical-n", type=int, default=1000)
    ap.add_argument("--physical-M", type=int, default=None,
                    help="default: the M whose bank is about 1.4x this machine's memory (lowered to what the disk holds)")
    ap.add_argument("--physical-solvers", nargs="+", default=["spicy"], choices=ALL_SOLVERS,
                    help="solvers fitted in item 6 (default SpicyMKL only)")
    ap.add_argument("--physical-read-threads", type=int, nargs="+", default=[1, 2, 4],
                    help="thread counts of the direct-I/O reference read")
    ap.add_argument("--physical-read-block", type=int, default=8 * 2**20, help="bytes per O_DIRECT read (multiple of 4096)")
    ap.add_argument("--solvers", nargs="+", default=ALL_SOLVERS, choices=ALL_SOLVERS)
    ap.add_argument("--timeout", type=float, default=300.0, help="per-fit wall-clock limit (s)")
    ap.add_argument("--physical-timeout", type=float, default=None, help="per-fit limit of item 6 (default --timeout)")
    ap.add_argument("--repeats", type=int, default=3, help="fits per point (median); a fit > 5 s runs once")
    ap.add_argument("--pass-repeats", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "mklscale-bench-scaling")
    ap.add_argument("--replot", type=Path, default=None,
                    help="recompute the derived fields (slopes) and the plot of a recorded JSON from its rows")
    args = ap.parse_args()
    if args.replot is not None:
        replot(args.replot)
        return
    if args.physical is not None and not args.quick and not args.physical_build:
        from mklscale.bank import KernelBank

        if not (KernelBank.is_bank(args.physical) and KernelBank.open(args.physical).complete.all()):
            ap.error(f"no complete bank at {args.physical}: pass --physical-build to build one there")
    if args.physical_read_block <= 0 or args.physical_read_block % 4096:
        ap.error("--physical-read-block must be a positive multiple of 4096")
    if HERE.parent in args.workdir.resolve().parents:
        ap.error("--workdir must be outside the repository")
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.Ms is None:
        args.Ms = [100, 300, 1000, 3000, 6000, 10000] if args.n <= 200 else [100, 300, 1000, 3000]

    items = []
    if args.quick:
        args.workdir = args.workdir / "quick"
        args.workdir.mkdir(parents=True, exist_ok=True)
        args.n, args.Ms, args.big_bank = 60, [20, 80], None
        args.ns, args.n_scaling_M = [60, 120], 20
        args.workers_n, args.workers_M = 60, 80
        args.out_of_core, args.ooc_n, args.ooc_M, args.ooc_workers = args.workdir / "ooc", 80, 60, [0, 2]
        args.physical = args.workdir / "ooc"
        args.timeout, args.ooc_timeout, args.repeats, args.pass_repeats = 60.0, 60.0, 1, 3
        items = ["m_scaling", "n_scaling", "workers", "out_of_core", "physical"]
    else:
        # item 6 before item 2, so item 2 reuses its fits when --big-bank is the same bank
        items += ["physical"] if args.physical else []
        items += ["m_scaling"] if args.m_scaling else []
        items += ["n_scaling"] if args.n_scaling else []
        items += ["workers"] if args.workers else []
        items += ["out_of_core"] if args.out_of_core else []
    if not items:
        ap.error("choose an item: --m-scaling, --n-scaling, --workers, --out-of-core PATH, --physical PATH, or --quick")

    warm = warm_bank(args.workdir)
    runner = FitRunner()
    t_all = time.perf_counter()
    load0 = [round(x, 2) for x in os.getloadavg()]
    sections = {}
    try:
        for item in items:
            print(f"== {item}", flush=True)
            t0 = time.perf_counter()
            if item == "m_scaling":
                sec = item_m_scaling(args, runner, warm, sections.get("physical"))
            elif item == "n_scaling":
                sec = item_n_scaling(args, runner, warm)
            elif item == "workers":
                sec = item_workers(args, warm)
            elif item == "out_of_core":
                sec = item_out_of_core(args, runner, warm)
            else:
                sec = item_physical(args, runner, warm)
            sec["item_seconds"] = time.perf_counter() - t0
            sections[item] = sec
    finally:
        runner.close()
    import distributed

    result = {
        "benchmark": "bench_scaling", "quick": args.quick,
        "command": "python benchmarks/bench_scaling.py " + " ".join(sys.argv[1:]),
        "machine": {**describe_machine(args.workdir), "distributed": distributed.__version__},
        "load_average_at_start": load0, "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "total_seconds": time.perf_counter() - t_all,
        "params": {"data": "ringnorm (20 features), train load('ringnorm', n_samples=n, seed=0), test "
                           f"load('ringnorm', n_samples={N_TEST}, seed=1)",
                   "kernels": "gaussian on random feature subsets (families.random_subsets, seed 0), width 5 chi^2 + 0.1, "
                              "unit trace, float32",
                   "solvers": {s: {**SOLVERS[s], "params": dict(SOLVERS[s]["params"])} for s in args.solvers},
                   "timeout_s": args.timeout, "physical_timeout_s": args.physical_timeout or args.timeout,
                   "repeats": args.repeats,
                   "timing": "solver wall time in a spawned worker process, after an untimed warm-up fit of the same "
                             "solver on a 6-kernel bank; median of up to `repeats` fits (a fit > 5 s runs once); "
                             "a fit past the limit is killed (status timeout) and the solver skipped at larger sizes",
                   "workdir": str(args.workdir)},
        **sections,
    }
    if args.quick:
        names = {"quick": result}
    else:
        names = {}
        for item, sec in sections.items():
            suffix = {"m_scaling": f"m_n{args.n}", "n_scaling": "n", "workers": "workers",
                      "out_of_core": "ooc", "physical": "physical"}[item]
            names[suffix] = {k: v for k, v in result.items() if k not in sections or k == item}
    RESULTS.mkdir(parents=True, exist_ok=True)
    for suffix, res in names.items():
        out = RESULTS / f"bench_scaling_{suffix}.json"
        out.write_text(json.dumps(res, indent=2, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
        print(f"wrote {out}")
        if "m_scaling" in res:
            plot_scaling(res["m_scaling"], "M", out.with_suffix(".png"), f"fit time vs M, n = {res['m_scaling']['n']}")
        if "n_scaling" in res:
            p = out.with_suffix(".png") if suffix != "quick" else out.with_name("bench_scaling_quick_n.png")
            plot_scaling(res["n_scaling"], "n_train", p, f"fit time vs n, M = {res['n_scaling']['M']}")


if __name__ == "__main__":
    main()
