"""Computed banks (issue 31): a pass over kernels computed inside the tasks against the same kernels
stored, and feature selection at scale.

    python benchmarks/bench_computed.py pass  [--n 500 --d 500 --pairs 5]
    python benchmarks/bench_computed.py scale [--n 1000 --d 25000]

``pass``: per_feature kernels (3 Gaussian widths and the linear kernel per feature: M = 4 d) at
n = 500, once as a stored dense float32 bank (read through its mapping: the page cache holds it,
as the issue asks) and once computed; the same ``quad_forms`` pass (one vector) on one Engine each
(both threads of the machine), run A B A B ... (``--pairs`` pairs), medians and each pair's ratio
stored / computed (the computed pass's speed as a share of the stored one's; target >= 0.5), and
the process's CPU seconds of each pass (all threads: a measure that other load on the machine
disturbs less).
Beside it the machine's floor for computing the kernels: ``shards.fill_block`` of every kernel on
the same threads with no reduction (what a computed pass cannot beat), and the exp rate of one core
(numpy float32 exp), in kernel evaluations per second; and on 2^14 values in cache, one core's rate of
the float32 Gaussian kernel's exp (arithmetic 3: ``exp_f32_scaled``, with the argument's split and
the scale, called from Python once per 2^14 values) beside numpy's float32 exp.

``scale``: synthetic data with 10 relevant features carrying nonlinear effects (sin, a product of two,
a square, ...) among d - 10 noise features, per_feature kernels (M = 4 d) on a computed bank: the
creation pass, SpicyMKL (logistic) to tol 1e-3 at a C keeping a handful of kernels, peak RSS, and
where the 10 relevant features rank by their kernels' weights.

Results: benchmarks/results/computed_pass.json, computed_scale.json (rendered by make_readme.py).
Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, write_record  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.bank.shards import fill_block  # noqa: E402
from mklscale.engine import Engine  # noqa: E402

RELEVANT = 10


def timed_pass(engine, u) -> float:
    u = u + np.random.default_rng().normal(size=u.shape) * 1e-3  # a new vector: no result is reused
    t0 = time.perf_counter()
    engine.quad_forms(u)
    return time.perf_counter() - t0


def compute_floor(bank, threads: int) -> float:
    """Seconds to compute every kernel of ``bank`` once (``fill_block`` per run of kernels sharing a
    base, on ``threads`` threads), no reduction: the floor of a computed pass."""
    Xs, specs, n = np.ascontiguousarray(bank.X_train), bank.specs, bank.n
    runs = [list(range(s, min(s + 4, len(specs)))) for s in range(0, len(specs), 4)]  # a feature's 4 kernels
    local = threading.local()

    def one(run):
        if getattr(local, "out", None) is None:
            local.out = np.empty((4, n, n), np.float32)
        fill_block([specs[m] for m in run], Xs, bank.normalize, local.out[:len(run)])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, runs))
    return time.perf_counter() - t0


def exp_rate() -> float:
    """float32 exp evaluations per second of one core (numpy, 2^24 values, best of 5)."""
    x = -np.random.default_rng(0).random(2**24, dtype=np.float32)
    out = np.empty_like(x)
    best = min(_timed(lambda: np.exp(x, out=out)) for _ in range(5))
    return x.size / best


def exp_rates_cached() -> tuple[float, float]:
    """(mklscale, numpy) float32 exp evaluations per second of one core on 2^14 values held in cache
    (best of 5 runs of 1000 sweeps): mklscale's is a float32 Gaussian kernel's (arithmetic 3,
    ``_compute._gaussian_f32``: the argument a b from float64 squared distances split in two float32,
    ``exp_f32_scaled``, the scale 1 / tr K), numpy's ``np.exp`` on float32."""
    from mklscale.bank import _compute

    n, sweeps = 2**14, 1000
    B = np.random.default_rng(0).random(n) * 40.0  # squared distances; a = -0.5: arguments in [-20, 0]
    xf, xl = np.empty(n + 64, np.float32), np.empty(n + 64, np.float32)
    y, tail = np.empty(n, np.float32), np.empty(64, np.float32)
    c = np.float32(1 / 500)

    def mine():
        for _ in range(sweeps):
            _compute._gaussian_f32(B, n, -0.5, c, xf, xl, y, tail)

    x = (-B * 0.5).astype(np.float32)
    out = np.empty_like(x)

    def theirs():
        for _ in range(sweeps):
            np.exp(x, out=out)

    mine(), theirs()
    return (n * sweeps / min(_timed(mine) for _ in range(5)), n * sweeps / min(_timed(theirs) for _ in range(5)))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_pass(args) -> None:
    record = {"machine": describe_machine(), "n": args.n, "d": args.d, "pairs": args.pairs}
    X = np.random.default_rng(0).normal(size=(args.n, args.d))
    specs = families.resolve("per_feature", args.d)
    folder = Path(tempfile.mkdtemp(prefix="bench-computed-"))
    try:
        t0 = time.perf_counter()
        stored = build_bank(X, specs, folder / "stored", progress=False)
        record["build_stored_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        computed = build_bank(X, specs, folder / "computed", progress=False, computed=True)
        record["build_computed_s"] = time.perf_counter() - t0
        record["M"], record["stored_bytes"] = len(specs), int(stored.nbytes)
        u = np.random.default_rng(1).normal(size=args.n)
        a, b, cpu_a, cpu_b = [], [], [], []
        with Engine(stored, cache_bytes=0) as es, Engine(computed, cache_bytes=0) as ec:
            timed_pass(es, u), timed_pass(ec, u)  # warm: the mapping, numba, the bank caches
            for _ in range(args.pairs):
                for engine, wall, cpu in ((es, a, cpu_a), (ec, b, cpu_b)):
                    c0 = time.process_time()
                    wall.append(timed_pass(engine, u))
                    cpu.append(time.process_time() - c0)
            threads = es._runner.threads
        record["stored_s"], record["computed_s"] = a, b
        # CPU seconds of the process (all threads): what the pass costs, less sensitive to other load
        record["stored_cpu_s"], record["computed_cpu_s"] = cpu_a, cpu_b
        record["ratios"] = [x / y for x, y in zip(a, b)]
        record["median_stored_s"], record["median_computed_s"] = statistics.median(a), statistics.median(b)
        record["median_ratio"] = statistics.median(record["ratios"])
        record["evaluations_per_pass"] = len(specs) * args.n * (args.n + 1) // 2  # the symmetric half
        floors = []
        for _ in range(3):
            c0 = time.process_time()
            floors.append((compute_floor(computed, threads), time.process_time() - c0))
        record["compute_floor_s"], record["compute_floor_cpu_s"] = min(f[0] for f in floors), min(f[1] for f in floors)
        record["exp_per_s_one_core"] = exp_rate()
        record["exp_f32_per_s_one_core_cached"], record["numpy_exp_per_s_one_core_cached"] = exp_rates_cached()
        record["threads"] = threads
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_record(record, HERE / "results" / "computed_pass.json")
    print(f"stored {record['median_stored_s']:.3f} s, computed {record['median_computed_s']:.3f} s, "
          f"ratio {record['median_ratio']:.2f}; floor {record['compute_floor_s']:.3f} s")


def synthetic(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """X (n, d) standard normal; y = sign(f(x) - median) with f nonlinear in the first RELEVANT features:
    sin(2 x0) + x1 x2 + x3^2 + cos(x4) + |x5| + x6 x7 + sin(x8) x9."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    f = (np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + X[:, 3] ** 2 + np.cos(X[:, 4]) + np.abs(X[:, 5])
         + X[:, 6] * X[:, 7] + np.sin(X[:, 8]) * X[:, 9])
    return X, np.where(f > np.median(f), 1, -1)


def run_scale(args) -> None:
    from mklscale.solvers import spicy
    from mklscale.solvers.registry import fit_solver

    record = {"machine": describe_machine(), "n": args.n, "d": args.d}
    X, y = synthetic(args.n, args.d)
    specs = families.resolve("per_feature", args.d)
    folder = Path(tempfile.mkdtemp(prefix="bench-computed-scale-"))
    try:
        t0 = time.perf_counter()
        bank = build_bank(X, specs, folder / "bank", progress=True, computed=True)
        record["M"], record["build_s"] = len(specs), time.perf_counter() - t0
        with Engine(bank) as engine:
            C_max = spicy.c_max(engine, y, "logistic")
            C = args.c_ratio * C_max
            t0 = time.perf_counter()
            passes = engine.stats["passes"]
            result = fit_solver("spicy", engine, y, "classification", C=C, params={"tol": 1e-3, "loss": "logistic"})
            record["fit_s"] = time.perf_counter() - t0
            record["passes"] = engine.stats["passes"] - passes
        record.update({"C": C, "C_max": C_max, "gap": float(result.gap), "converged": bool(result.converged),
                       "active": int(np.count_nonzero(result.weights))})
        importance = np.zeros(args.d)
        for m in np.flatnonzero(result.weights):
            importance[specs[m].features[0]] += result.weights[m]
        order = np.argsort(-importance)
        record["relevant_ranks"] = [int(np.flatnonzero(order == j)[0]) + 1 for j in range(RELEVANT)]
        record["top_features"] = order[:20].tolist()
        record["peak_rss_GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_record(record, HERE / "results" / "computed_scale.json")
    print({k: v for k, v in record.items() if k != "machine"})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="case", required=True)
    a = sub.add_parser("pass")
    a.add_argument("--n", type=int, default=500)
    a.add_argument("--d", type=int, default=500)
    a.add_argument("--pairs", type=int, default=5)
    s = sub.add_parser("scale")
    s.add_argument("--n", type=int, default=1000)
    s.add_argument("--d", type=int, default=25_000)
    s.add_argument("--c-ratio", type=float, default=0.5, help="C as a share of C_max (C_max keeps no kernel)")
    args = p.parse_args()
    (run_pass if args.case == "pass" else run_scale)(args)


if __name__ == "__main__":
    main()
