"""Computed banks (issue 31): a pass over kernels computed inside the tasks against the same kernels
stored, and feature selection at scale.

    python benchmarks/bench_computed.py pass  [--n 500 --d 500 --pairs 5]
    python benchmarks/bench_computed.py scale [--n 1000 --d 25000]
    python benchmarks/bench_computed.py lambda [--n 500 --M 2000 20000 --pairs 3]
    python benchmarks/bench_computed.py peer   [--n 500 --d 10000 100000]
    python benchmarks/bench_computed.py million [--n 500 --d 1000000]
    python benchmarks/bench_computed.py marginal [--n 500 --d 100000]

``pass``: per_feature kernels (3 Gaussian widths and the linear kernel per feature: M = 4 d) at
n = 500, once as a stored dense float32 bank (read through its mapping: the page cache holds it,
as the issue asks) and once computed; the same ``quad_forms`` pass (one vector) on one Engine each
(both threads of the machine), run A B A B ... (``--pairs`` pairs), medians and each pair's ratio
stored / computed (the computed pass's speed as a share of the stored one's; target >= 0.5), and
the process's CPU seconds of each pass (all threads: a measure that other load on the machine
disturbs less).
The computed pass is fused (each kernel computed on its upper triangle and folded into u^T K u at
once, ``shards.quad_block``). Beside it the machine's floors for computing the kernels: the values the
fused pass computes with no reduction (``quad_block`` with no vector: what the pass cannot beat), and
``shards.fill_block`` of every whole kernel on the same threads, and the exp rate of one core
(numpy float32 exp), in kernel evaluations per second; and on 2^14 values in cache, one core's rate of
the float32 Gaussian kernel's exp (arithmetic 3: ``exp_f32_scaled``, with the argument's split and
the scale, called from Python once per 2^14 values) beside numpy's float32 exp.

``scale``: synthetic data with 10 relevant features carrying nonlinear effects (sin, a product of two,
a square, ...) among d - 10 noise features, per_feature kernels (M = 4 d) on a computed bank: the
creation pass, SpicyMKL (logistic) to tol 1e-3 at a C keeping a handful of kernels, peak RSS, and
where the 10 relevant features rank by their kernels' weights.

``lambda``: creating a computed bank of per_feature kernels (M = 4 d) at n = 500 with each kernel's
lambda_max from Lanczos (``kernel_stats(exact_lambda=True)``, what creation did before) against the
bound without an eigensolve it records now (``stats.lambda_bound``), A B pairs, medians; the bound's
ratio to the Lanczos value per kernel family; and a SpicyMKL fit (logistic, tol 1e-3, the ``scale``
data) on the largest bank with each lambda_max (screening uses it): seconds, passes, objective.

``peer``: the ``scale`` data (n training rows, n_test held-out rows from the same draw) at each d,
every method in a process of its own (time, peak memory of its process tree sampled at 20 Hz and
its ru_maxrss): ours (creating the computed per_feature bank and SpicyMKL logistic at c_ratio C_max,
as ``scale``; "ours": the default ladder, M = 4 d; "ours1": HSIC Lasso's kernel, one Gaussian of
width 1 per standardised feature, M = d) and pyHSICLasso's block HSIC Lasso (``pip install pyHSICLasso``; classification,
B = 20, M = 3 permutations, its defaults, num_feat = 20, n_jobs = -1: both cores), each ranking the
features (ours: summed weight of each feature's kernels; HSIC Lasso: its selection order). Planted
features recovered: those among the first 10 of a method's ranking, over the 4 planted features with
a marginal effect (x0, x3, x4, x5: the products x1 x2, x6 x7, sin(x8) x9 have none, so no
per-feature method sees them) and over all 10. Where MKL wins: held-out accuracy of the SpicyMKL
model and of the uniform-weight baseline (solver "uniform": every kernel weight 1/M, then an SVM;
its prediction evaluates all M cross kernels, so it runs up to --uniform-max-d) beside the majority
rate of the held-out labels. A HSIC Lasso run whose design matrix (n B M d float32 values, held
twice while joblib's results are stacked) would not fit in the memory available is not started: the
record says why and how much it needed.

``marginal``: the first-pass score q_j = y^T K_j y of every feature on the ``million`` kernel, and where
it ranks the planted features among d and, by the noise above them, among 10 d (``run_marginal``).

``million``: the target M = 10^6 (issue 31): the ``peer`` data (``synthetic(n + n_test, d)``, the same
values, generated row block by row block from the same random stream and written to C-order float64
``.npy`` files, so no 4 GB array is ever held), HSIC Lasso's kernel (one Gaussian of width 1 per
standardised feature, M = d, "ours1"), a computed bank built from the training file (read by column
blocks), C_max, SpicyMKL logistic to tol 1e-3 at c_ratio C_max, the ranking of features by their
kernels' summed weight, and (up to --predict-max-d) held-out accuracy. Per stage: seconds, the peak
resident set of the process tree during the stage (``TreePeak``, 20 Hz) and the resident set at its
end; the peak over the target's stages (specs to ranking; ``peak_run_GB``: with generation and
prediction); passes, gap, kept kernels, ranks of the planted features (recovery counted over
the 4 with a marginal effect, as ``peer``). Runs of other d already in the file are kept.

Results: benchmarks/results/computed_pass.json, computed_scale.json, computed_lambda.json,
computed_peer.json, computed_million.json (rendered by make_readme.py).
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

from mklscale.bank import KernelBank, build_bank, families  # noqa: E402
from mklscale.bank.shards import fill_block, quad_block  # noqa: E402
from mklscale.engine import Engine  # noqa: E402

RELEVANT = 10


def timed_pass(engine, u) -> float:
    u = u + np.random.default_rng().normal(size=u.shape) * 1e-3  # a new vector: no result is reused
    t0 = time.perf_counter()
    engine.quad_forms(u)
    return time.perf_counter() - t0


def compute_floor(bank, threads: int, upper: bool = False) -> float:
    """Seconds to compute every kernel of ``bank`` once (``fill_block`` per run of kernels sharing a
    base, on ``threads`` threads), no reduction: the floor of a pass over whole kernels; ``upper``: only
    the values a fused quad-forms pass computes (``quad_block`` with no vector: each kernel's upper
    triangle, a tile of rows at a time, folded into nothing), the floor of that pass."""
    Xs, specs, n = np.ascontiguousarray(bank.X_train), bank.specs, bank.n
    runs = [list(range(s, min(s + 4, len(specs)))) for s in range(0, len(specs), 4)]  # a feature's 4 kernels
    local = threading.local()
    none = np.empty((0, n))

    def one(run):
        if upper:
            quad_block([specs[m] for m in run], Xs, bank.normalize, bank.dtype, none, False)
            return
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
        floors = []
        for _ in range(3):
            c0 = time.process_time()
            floors.append((compute_floor(computed, threads, upper=True), time.process_time() - c0))
        record["upper_floor_s"], record["upper_floor_cpu_s"] = min(f[0] for f in floors), min(f[1] for f in floors)
        record["exp_per_s_one_core"] = exp_rate()
        record["exp_f32_per_s_one_core_cached"], record["numpy_exp_per_s_one_core_cached"] = exp_rates_cached()
        record["threads"] = threads
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_record(record, HERE / "results" / "computed_pass.json")
    print(f"stored {record['median_stored_s']:.3f} s, computed {record['median_computed_s']:.3f} s, "
          f"ratio {record['median_ratio']:.2f}; floor {record['compute_floor_s']:.3f} s")


MARGINAL = (0, 3, 4, 5)  # planted features with a marginal effect: sin(2 x0), x3^2, cos(x4), |x5|


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


def run_marginal(args) -> None:
    """Where a marginal score puts the planted features among d: q_j = y^T K_j y for HSIC Lasso's kernel
    (one trace-normalised Gaussian of width 1 per standardised feature, the ``million`` bank), the
    quad form SpicyMKL's first pass screens with (its dual point at zero is proportional to y), from one
    fused pass over a computed bank. The rank of each planted feature with a marginal effect among d, and
    the rank the noise above it predicts among 10 d features (noise scores are i.i.d.: 10 times as many
    noise features put about 10 times as many above it)."""
    X, y = synthetic(args.n, args.d)
    specs = families.resolve({"family": "per_feature", "widths": [1.0], "linear": False}, args.d)
    folder = Path(tempfile.mkdtemp(prefix="bench-computed-marginal-"))
    try:
        bank = build_bank(X, specs, folder / "bank", progress=False, computed=True)
        with Engine(bank) as engine:
            q = engine.quad_forms(y.astype(np.float64))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    noise = np.sort(q[RELEVANT:])[::-1]
    rows = [{"feature": j, "score": float(q[j]), "rank": int(np.sum(q > q[j])) + 1,
             "noise_above": int(np.sum(noise > q[j])), "predicted_rank_at_10d": int(10 * np.sum(noise > q[j])) + 1}
            for j in MARGINAL]
    record = {"machine": describe_machine(), "n": args.n, "d": args.d, "rows": rows,
              "noise_top": noise[:10].tolist(), "noise_median": float(np.median(noise))}
    write_record(record, HERE / "results" / "computed_marginal.json")
    print(rows)


def _create(X, specs, folder, exact: bool):
    """(seconds, bank): a computed bank created with Lanczos lambda_max (exact) or the bound (as shipped)."""
    from mklscale.bank import shards

    shutil.rmtree(folder, ignore_errors=True)  # a new bank each time (an existing one would be reused)
    stats_of = shards.kernel_stats
    if exact:  # the creation before the bound: every kernel's lambda_max by Lanczos
        shards.kernel_stats = lambda K, exact_lambda=True: stats_of(K, exact_lambda=True)
    try:
        t0 = time.perf_counter()
        bank = build_bank(X, specs, folder, progress=False, computed=True)
        return time.perf_counter() - t0, bank
    finally:
        shards.kernel_stats = stats_of


def run_lambda(args) -> None:
    from mklscale.solvers import spicy
    from mklscale.solvers.registry import fit_solver

    record = {"machine": describe_machine(), "n": args.n, "pairs": args.pairs, "cases": []}
    folder = Path(tempfile.mkdtemp(prefix="bench-computed-lambda-"))
    try:
        X, y = synthetic(args.n, max(args.M) // 4)
        _create(X[:, :10], families.resolve("per_feature", 10), folder / "warm", True)  # numba, imports
        for M in args.M:
            d = M // 4
            specs = families.resolve("per_feature", d)
            exact, bound = [], []
            for _ in range(args.pairs):
                exact.append(_create(X[:, :d], specs, folder / "exact", True)[0])
                bound.append(_create(X[:, :d], specs, folder / "bound", False)[0])
            case = {"M": M, "d": d, "exact_s": exact, "bound_s": bound, "median_exact_s": statistics.median(exact),
                    "median_bound_s": statistics.median(bound)}
            a, b = KernelBank.open(folder / "exact"), KernelBank.open(folder / "bound")
            ratio = b.lambda_max / a.lambda_max
            case["ratio_min"], case["ratio_max"] = float(ratio.min()), float(ratio.max())
            case["ratio_median_by_kernel"] = {specs[k].name.split("[")[0]: float(np.median(ratio[k::4]))
                                              for k in range(4)}
            record["cases"].append(case)
            print(case)
        fits = {}
        for name, bank in (("exact", a), ("bound", b)):
            with Engine(bank) as engine:
                C = args.c_ratio * spicy.c_max(engine, y, "logistic")
                passes, t0 = engine.stats["passes"], time.perf_counter()
                r = fit_solver("spicy", engine, y, "classification", C=C, params={"tol": 1e-3, "loss": "logistic"})
                fits[name] = {"fit_s": time.perf_counter() - t0, "passes": engine.stats["passes"] - passes,
                              "objective": float(r.objective), "gap": float(r.gap),
                              "active": int(np.count_nonzero(r.weights)), "weights": r.weights}
        wa, wb = fits["exact"].pop("weights"), fits["bound"].pop("weights")
        record["fit"] = {"M": len(a), "c_ratio": args.c_ratio, **fits,
                         "max_weight_difference": float(np.abs(wa - wb).max())}
        print(record["fit"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_record(record, HERE / "results" / "computed_lambda.json")


class TreePeak:
    """Peak resident set of this process and its descendants (summed), sampled every ``dt`` seconds."""

    def __init__(self, dt: float = 0.05):
        import psutil

        self.proc, self.dt, self.peak, self._stop = psutil.Process(), dt, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.total())
            self._stop.wait(self.dt)

    def reset(self) -> int:
        """Start a new peak from the current resident set of the tree; returns the old peak."""
        old = self.peak
        self.peak = self.total()
        return old

    def total(self) -> int:
        import psutil

        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


CLASSES = np.array([-1, 1])  # the labels of ``synthetic``; a decision value > 0 predicts +1


def _ranks(order: list[int], d: int) -> list[int | None]:
    """Rank (1 = first) of each planted feature in a method's ranking ``order`` (None: not ranked)."""
    pos = {int(j): r + 1 for r, j in enumerate(order)}
    return [pos.get(j) for j in range(RELEVANT)]


def _peer_data(args, d: int):
    X, y = synthetic(args.n + args.n_test, d)
    return X[:args.n], y[:args.n], X[args.n:], y[args.n:]


#: the per_feature banks ``peer`` fits: the default ladder (3 Gaussian widths and the linear kernel per
#: feature, M = 4 d) and HSIC Lasso's own kernel (one Gaussian of width 1 on each standardised feature, M = d)
OURS = {"ours": "per_feature", "ours1": {"family": "per_feature", "widths": [1.0], "linear": False}}


def _child_ours(args, d: int) -> dict:
    from mklscale.model import MKLModel
    from mklscale.solvers import spicy
    from mklscale.solvers.registry import fit_solver, resolve_C

    X, y, Xt, yt = _peer_data(args, d)
    specs = families.resolve(OURS[args.method], d)
    out = {"M": len(specs)}
    folder = Path(tempfile.mkdtemp(prefix="bench-computed-peer-"))
    try:
        with TreePeak() as peak:
            t0 = time.perf_counter()
            bank = build_bank(X, specs, folder / "bank", progress=False, computed=True)
            out["create_s"] = time.perf_counter() - t0
            with Engine(bank) as engine:
                C = args.c_ratio * spicy.c_max(engine, y, "logistic")
                t1, passes = time.perf_counter(), engine.stats["passes"]
                r = fit_solver("spicy", engine, y, "classification", C=C, params={"tol": 1e-3, "loss": "logistic"})
                out.update(fit_s=time.perf_counter() - t1, passes=engine.stats["passes"] - passes)
            out["time_s"] = time.perf_counter() - t0
        out.update(peak_tree_GB=peak.peak / 1e9, gap=float(r.gap), converged=bool(r.converged),
                   kept=int(np.count_nonzero(r.weights)))
        importance = np.zeros(d)
        np.add.at(importance, [specs[m].features[0] for m in np.flatnonzero(r.weights)], r.weights[r.weights > 0])
        order = [int(j) for j in np.argsort(-importance, kind="stable") if importance[j] > 0]
        out["ranked"], out["ranks"], out["top"] = len(order), _ranks(order, d), order[:20]
        out["accuracy_spicy"] = float(np.mean(np.sign(MKLModel.from_results(bank, r, "classification", CLASSES)
                                                     .decision_function(Xt)) == yt))
        if d <= args.uniform_max_d:
            with Engine(bank) as engine:
                t1 = time.perf_counter()
                u = fit_solver("uniform", engine, y, "classification",
                               C=resolve_C("uniform", engine, [y], "classification"))
                model = MKLModel.from_results(bank, u, "classification", CLASSES)
                out["accuracy_uniform"] = float(np.mean(np.sign(model.decision_function(Xt)) == yt))
                out["uniform_s"] = time.perf_counter() - t1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out["majority_rate"] = float(max(np.mean(yt == 1), np.mean(yt == -1)))
    return out


def _child_hsic(args, d: int) -> dict:
    import contextlib
    import io

    from pyHSICLasso import HSICLasso

    X, y, _, _ = _peer_data(args, d)
    with TreePeak() as peak:
        t0 = time.perf_counter()
        h = HSICLasso()
        with contextlib.redirect_stdout(io.StringIO()):
            h.input(X, y)
            h.classification(num_feat=args.num_feat, B=args.hsic_B, M=args.hsic_M, n_jobs=-1)
        order = [int(j) for j in h.get_index()]
        out = {"time_s": time.perf_counter() - t0}
    out.update(peak_tree_GB=peak.peak / 1e9, ranked=len(order), ranks=_ranks(order, d), top=order[:20])
    return out


def _hsic_bytes(args, d: int) -> int:
    """Block HSIC Lasso's peak: 4.5 x its (n B M, d) float32 design matrix (joblib's per-feature results,
    their stacked copy, and the scaled X, which numpy makes float64; measured: 5.2 GB for a 1.2 GB
    design matrix at n = 500, d = 10^4, B = 20, M = 3)."""
    return int(4.5 * args.n * args.hsic_B * args.hsic_M * d * 4)


def run_peer_child(args) -> None:
    out = (_child_hsic if args.method == "hsic" else _child_ours)(args, args.d[0])
    out["ru_maxrss_GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    out["ru_maxrss_children_GB"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9
    Path(args.out).write_text(__import__("json").dumps(out))


def run_peer(args) -> None:
    import json
    import subprocess

    import psutil

    record = {"machine": describe_machine(), "n": args.n, "n_test": args.n_test, "c_ratio": args.c_ratio,
              "hsic": {"B": args.hsic_B, "M": args.hsic_M, "num_feat": args.num_feat, "n_jobs": -1},
              "uniform_max_d": args.uniform_max_d, "marginal": list(MARGINAL), "timeout_s": args.timeout,
              "runs": []}
    from importlib.metadata import PackageNotFoundError, version

    try:
        record["hsic"]["version"] = version("pyHSICLasso")
    except PackageNotFoundError:
        record["hsic"]["version"] = None
    for d in args.d:
        for method in args.methods:
            run = {"d": d, "method": method}
            need, avail = _hsic_bytes(args, d), psutil.virtual_memory().available
            if method == "hsic" and (record["hsic"]["version"] is None or need > 0.8 * avail or d <= args.num_feat):
                run["skipped"] = ("pyHSICLasso is not installed" if record["hsic"]["version"] is None else
                                  f"d <= num_feat = {args.num_feat}: it would select every feature" if d <= args.num_feat
                                  else f"it would need {need / 1e9:.1f} GB (4.5 x its n B M d float32 design matrix) "
                                  f"and {avail / 1e9:.1f} GB are available")
                record["runs"].append(run)
                print(run)
                continue
            out = Path(tempfile.mkstemp(suffix=".json")[1])
            cmd = [sys.executable, __file__, "_peer_child", "--method", method, "--d", str(d), "--out", str(out),
                   "--n", str(args.n), "--n-test", str(args.n_test), "--c-ratio", str(args.c_ratio),
                   "--hsic-B", str(args.hsic_B), "--hsic-M", str(args.hsic_M), "--num-feat", str(args.num_feat),
                   "--uniform-max-d", str(args.uniform_max_d)]
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                run["wall_s"] = time.perf_counter() - t0
                if p.returncode == 0:
                    run.update(json.loads(out.read_text()))
                else:
                    run["failed"] = f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:] if p.stderr else ''}"
            except subprocess.TimeoutExpired:
                run["failed"] = f"timed out after {args.timeout} s"
            out.unlink(missing_ok=True)
            run["load_average_at_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
            run["date"] = describe_machine()["date"]
            record["runs"].append(run)
            print({k: v for k, v in run.items() if k != "top"}, flush=True)
    target = HERE / "results" / args.name
    if args.append and target.exists():  # runs of another invocation (other d), theirs replaced by this one's
        earlier = json.loads(target.read_text())
        mine = {(x["d"], x["method"]) for x in record["runs"]}
        record["runs"] = [x for x in earlier["runs"] if (x["d"], x["method"]) not in mine] + record["runs"]
        record["runs"].sort(key=lambda x: (x["d"], ["ours", "ours1", "hsic"].index(x["method"])))
    write_record(record, target)



def write_synthetic(folder: Path, n: int, n_test: int, d: int, seed: int = 0,
                    block_bytes: int = 64 * 2**20, write_test: bool = True) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """``synthetic(n + n_test, d, seed)`` written to folder/train.npy (its first n rows) and test.npy (the
    rest; only drawn, not written, without ``write_test``) as C-order float64, row block by row block from
    the same random stream (the same values; no array of the whole X is held). Returns (train path, test
    path, y_train, y_test)."""
    rng = np.random.default_rng(seed)
    N, step = n + n_test, max(1, block_bytes // (8 * d))
    f = np.empty(N)
    paths = (folder / "train.npy", folder / "test.npy")
    sizes = (n, n_test) if write_test else (n,)
    outs = [np.lib.format.open_memmap(p, mode="w+", dtype=np.float64, shape=(k, d)) for p, k in zip(paths, sizes)]
    del outs  # only the headers and sizes: the rows are written with plain writes below
    offsets = []
    for p in paths[:len(sizes)]:
        with open(p, "rb") as fh:
            np.lib.format.read_magic(fh)
            np.lib.format.read_array_header_1_0(fh)
            offsets.append(fh.tell())
    for r0 in range(0, N, step):
        r1 = min(r0 + step, N)
        B = rng.normal(size=(r1 - r0, d))
        f[r0:r1] = (np.sin(2 * B[:, 0]) + B[:, 1] * B[:, 2] + B[:, 3] ** 2 + np.cos(B[:, 4]) + np.abs(B[:, 5])
                    + B[:, 6] * B[:, 7] + np.sin(B[:, 8]) * B[:, 9])
        for k, (lo, hi) in enumerate(((0, n), (n, N))[:len(sizes)]):
            a, b = max(r0, lo), min(r1, hi)
            if a < b:
                with open(paths[k], "r+b") as fh:
                    fh.seek(offsets[k] + (a - lo) * d * 8)
                    fh.write(np.ascontiguousarray(B[a - r0:b - r0]).tobytes())
    y = np.where(f > np.median(f), 1, -1)
    return paths[0], paths[1], y[:n], y[n:]


def run_million(args) -> None:
    import json
    import os

    from mklscale.model import MKLModel
    from mklscale.solvers import spicy
    from mklscale.solvers.registry import fit_solver

    d = args.d
    run = {"d": d, "n": args.n, "n_test": args.n_test, "c_ratio": args.c_ratio, "bank": OURS["ours1"],
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "stages": {}}
    folder = Path(tempfile.mkdtemp(prefix="bench-computed-million-", dir=args.scratch))
    stages = run["stages"]
    try:
        with TreePeak() as peak:
            def stage(name, fn):
                peak.reset()
                t0 = time.perf_counter()
                out = fn()
                stages[name] = {"s": time.perf_counter() - t0, "peak_GB": max(peak.peak, peak.total()) / 1e9,
                                "end_GB": peak.total() / 1e9}
                print(name, {k: round(v, 2) for k, v in stages[name].items()}, flush=True)
                return out

            train, test, y, yt = stage("generate", lambda: write_synthetic(folder, args.n, args.n_test, d,
                                                                            write_test=d <= args.predict_max_d))
            specs = stage("specs", lambda: families.resolve(OURS["ours1"], d))
            run["M"] = len(specs)
            bank = stage("create", lambda: build_bank(train, specs, folder / "bank", progress=False, computed=True))
            engine = stage("engine", lambda: Engine(bank))
            C = args.c_ratio * stage("c_max", lambda: spicy.c_max(engine, y, "logistic"))
            passes = engine.stats["passes"]
            r = stage("fit", lambda: fit_solver("spicy", engine, y, "classification", C=C,
                                                params={"tol": 1e-3, "loss": "logistic"}))
            run.update(C=C, passes=engine.stats["passes"] - passes, gap=float(r.gap), converged=bool(r.converged),
                       kept=int(np.count_nonzero(r.weights)))
            engine.close()

            def rank():
                importance = np.zeros(d)
                kept = np.flatnonzero(r.weights)
                np.add.at(importance, [specs[m].features[0] for m in kept], r.weights[kept])
                return [int(j) for j in np.argsort(-importance, kind="stable") if importance[j] > 0]

            order = stage("rank", rank)
            run.update(ranked=len(order), ranks=_ranks(order, d), top=order[:20])
            if d <= args.predict_max_d:
                def predict():
                    model = MKLModel.from_results(bank, r, "classification", CLASSES)
                    return float(np.mean(np.sign(model.decision_function(np.load(test))) == yt))

                run["accuracy_spicy"] = stage("predict", predict)
            run["majority_rate"] = float(max(np.mean(yt == 1), np.mean(yt == -1)))
        target = ("specs", "create", "engine", "c_max", "fit", "rank")  # the target's: features to ranking
        run["peak_tree_GB"] = max(x["peak_GB"] for k, x in stages.items() if k in target)
        run["peak_run_GB"] = max([peak.peak / 1e9] + [x["peak_GB"] for x in stages.values()])  # with predict
        run["time_s"] = sum(x["s"] for k, x in stages.items() if k in target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    run["ru_maxrss_GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    run["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    run["note"] = args.note
    target = HERE / "results" / "computed_million.json"
    record = {"machine": describe_machine(), "marginal": list(MARGINAL), "runs": []}
    if target.exists():
        record["runs"] = [x for x in json.loads(target.read_text())["runs"] if x["d"] != d]
    record["runs"] = sorted(record["runs"] + [run], key=lambda x: x["d"])
    write_record(record, target)
    print({k: v for k, v in run.items() if k not in ("top", "stages")})


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
    lam = sub.add_parser("lambda")
    lam.add_argument("--n", type=int, default=500)
    lam.add_argument("--M", type=int, nargs="+", default=[2000, 20000], help="kernels (multiples of 4)")
    lam.add_argument("--pairs", type=int, default=3)
    lam.add_argument("--c-ratio", type=float, default=0.5)
    for name in ("peer", "_peer_child"):
        q = sub.add_parser(name)
        q.add_argument("--n", type=int, default=500)
        q.add_argument("--n-test", type=int, default=500)
        q.add_argument("--d", type=int, nargs="+", default=[10_000, 100_000])
        q.add_argument("--c-ratio", type=float, default=0.5)
        q.add_argument("--hsic-B", type=int, default=20)
        q.add_argument("--hsic-M", type=int, default=3)
        q.add_argument("--num-feat", type=int, default=20)
        q.add_argument("--uniform-max-d", type=int, default=10_000)
        if name == "peer":
            q.add_argument("--methods", nargs="+", default=["ours", "ours1", "hsic"], choices=["ours", "ours1", "hsic"])
            q.add_argument("--timeout", type=float, default=600, help="seconds per method and d")
            q.add_argument("--name", default="computed_peer.json", help="results file name")
            q.add_argument("--append", action="store_true",
                           help="keep the runs of other d (or methods) already in the results file")
        else:
            q.add_argument("--method", choices=["ours", "ours1", "hsic"], required=True)
            q.add_argument("--out", required=True)
    mar = sub.add_parser("marginal")
    mar.add_argument("--n", type=int, default=500)
    mar.add_argument("--d", type=int, default=100_000)
    mil = sub.add_parser("million")
    mil.add_argument("--n", type=int, default=500)
    mil.add_argument("--n-test", type=int, default=500)
    mil.add_argument("--d", type=int, default=1_000_000)
    mil.add_argument("--c-ratio", type=float, default=0.5)
    mil.add_argument("--predict-max-d", type=int, default=100_000,
                     help="held-out accuracy up to this d (the model holds its support rows' features)")
    mil.add_argument("--scratch", default=None, help="folder for the data files and the bank (default: the temp folder)")
    mil.add_argument("--note", default="", help="recorded with the run (e.g. the machine's load)")
    args = p.parse_args()
    {"million": run_million, "marginal": run_marginal, "pass": run_pass, "scale": run_scale, "lambda": run_lambda, "peer": run_peer,
     "_peer_child": run_peer_child}[args.case](args)


if __name__ == "__main__":
    main()
