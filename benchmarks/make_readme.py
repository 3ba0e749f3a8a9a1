"""Generate benchmarks/README.md from the recorded JSON results: no figure is typed by hand.

    python benchmarks/make_readme.py

Each benchmark has a renderer that turns its JSON into a markdown section; a missing result file
renders as "not recorded yet". The prose around the tables lives in this file, next to the code
that fills them.
"""

from __future__ import annotations

import json
import statistics

import numpy as np
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _machine(m: dict) -> str:
    pinned = m.get("cpu_affinity")
    pinned = f" (pinned to core(s) {', '.join(map(str, pinned))})" if pinned and len(pinned) < m["cores"] else ""
    return (f"{m['cpu']}, {m['cores']} cores{pinned}, {m['memory_GB']} GB RAM, {m['disk_free_GB']} GB disk free; "
            f"Python {m['python']}, numpy {m['numpy']}, numba {m['numba']}, dask {m['dask']}, zarr {m['zarr']}; "
            f"run {m['date']}")


def render_build() -> str:
    r = _load("bench_build.json")
    head = "## Bank build (`python benchmarks/bench_build.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    m, p = r["median"], r["params"]
    target = r["target"]["build_over_plain_write"]
    return head + (
        f"M = {p['M']} Gaussian kernels (random feature subsets, IDA recipe) at n = {p['n']}, {p['dtype']}, "
        f"{p['threads']} cores ({p.get('build_threads', p['threads'])} build threads), {p['shards']} shards; "
        f"medians of {p['repeats']} alternating repeats.\nMachine: {_machine(r['machine'])}.\n\n"
        + _table(["kernels/s", "build GB/s", "plain write GB/s", "build / plain write", "target",
                  "build / (plain write + fsync)", "build / direct write"],
                 [[m["kernels_per_s"], m["build_GBps"], m["plain_write_GBps"], m["build_over_plain_write"],
                   f">= {target}", m.get("build_over_plain_write_fsync", "-"), m.get("build_over_direct_write", "-")]])
        + "\n\nThe plain write is numpy writing the same bytes as the same number of files with the same "
        "threads; it returns once the bytes are in the page cache. "
        + (f"It is the second of two writes back to back: the first took {m['plain_write_first_s']:.2f} s (median), "
           "waiting for page-cache memory that this virtual machine had handed back to its host; the second reuses "
           "what the first freed, the stricter baseline. " if "plain_write_first_s" in m else "")
        + "The build writes with direct I/O, so its "
        "bytes are on the disk when it returns; the sixth column compares it with the plain write followed by "
        "fsync of every file, and the last with the direct write: the build's own write path alone (its shard "
        "writer, its threads, no compute). The build also computes every kernel (distance matrix, exp, "
        "normalisation), its trace, Frobenius norm, largest eigenvalue (Lanczos) and crc32c checksum.\n"
        + (_build_floors(m, p, target) if "build_cpu_s" in m and "direct_write_s" in m else "")
    )


def _build_floors(m: dict, p: dict, target: float) -> str:
    """Why the ratio is what it is: the build cannot beat its compute spread over the cores, nor its
    write path alone; the target allows plain write / target seconds."""
    budget, cpu_floor, disk_floor = m["plain_write_s"] / target, m["build_cpu_s"] / p["threads"], m["direct_write_s"]
    over = [what for what, floor in (("its write path alone", disk_floor), ("its compute alone", cpu_floor))
            if floor > budget]
    verdict = (f"so on this machine the target is out of reach whatever the build does: {' and '.join(over)} "
               f"take{'s' if len(over) == 1 else ''} longer than the target allows" if over
               else "so neither floor rules the target out here")
    return (f"\nFloors: the build's CPU time (user + system, all threads) was {m['build_cpu_s']:.2f} s, i.e. "
            f"{cpu_floor:.2f} s spread perfectly over {p['threads']} cores; the direct write of the same bytes took "
            f"{disk_floor:.2f} s. The target allows {budget:.2f} s ({target} x a {m['plain_write_s']:.2f} s plain "
            f"write), {verdict}.\n")


def render_spicy() -> str:
    r = _load("bench_spicy.json")
    head = "## SpicyMKL on the IDA protocol (`python benchmarks/bench_spicy.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    p = r["params"]
    rows = [[x["dataset"], x["M"], x["loss"], x["penalty"] + (f" (lam={x['lam']})" if "lam" in x else ""),
             x["seconds"], x["passes"], x["outer_iterations"], x["active"], x["test_accuracy"], x["gap"]]
            for x in r["rows"]]
    med_passes = statistics.median(x["passes"] for x in r["rows"])
    slopes = []
    for key in sorted({(x["dataset"], x["loss"], x["penalty"]) for x in r["rows"]}):
        pts = [(x["M"], x["seconds"]) for x in r["rows"] if (x["dataset"], x["loss"], x["penalty"]) == key and x["M"] >= 1000]
        if len(pts) >= 2:
            slope = np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0]
            slopes.append([*key, float(slope)])
    return head + (
        f"n = {p['n_train']} training / {p['n_test']} test points, C = {p['C']}, tol = {p['tol']} (relative "
        f"duality gap, certified over all M kernels), {p['kernels']}; median of {p['repeats']} fits.\n"
        f"Machine: {_machine(r['machine'])}.\n\n"
        + _table(["data", "M", "loss", "penalty", "seconds", "full passes", "outer its", "active", "test acc", "gap"], rows)
        + f"\n\nMedian full passes over the bank per solve: {med_passes:g} (target <= 6). "
        "Growth of the fit time with M from M = 1000 on (log-log slope; < 1 is sublinear):\n\n"
        + _table(["data", "loss", "penalty", "slope"], slopes)
        + "\n\nBlock-1 models stay sparse (tens of kernels) and cost a few passes whatever M is; the elastic "
        "net at lam = 0.5 keeps a large share of the bank active, so its cost follows the active set.\n"
    )


def render_pass() -> str:
    r = _load("bench_pass.json")
    head = "## Engine passes (`python benchmarks/bench_pass.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    c = r["cached_bank"]
    best = c.get("best_plain")
    rows = [[x["what"], x["seconds"], x["GB_per_s"], x["x_plain_1thread"], x["x_plain_2threads"]]
            + ([x["x_best_plain"], x["x_memory"]] if best else []) for x in c["rows"]]
    w = r["workers"]["rows"]
    wrows = [[x["where"], x.get("k", "-"), x.get("seconds", "-"), x.get("GB_per_s", "-"), x.get("small_bank_pass_ms", "-")]
             for x in w]
    sb = r["small_bank"]
    return head + (
        f"Bank in the page cache: M = {c['M']}, n = {c['n']} {c['dtype']} ({c['bank_bytes'] / 1e9:.1f} GB, "
        f"{c['shards']} shards), medians of {c['repeats']}.\nMachine: {_machine(r['machine'])}; load average "
        f"{r['machine'].get('load_average_at_record', '?')}.\n\n"
        + _table(["operation", "seconds", "GB/s", "x fromfile (1 thread)", "x fromfile (2 threads)"]
                 + ([f"x fastest plain read ({best})", "x memory read (floor)"] if best else []), rows)
        + f"\n\nk = 16 vectors cost {c['k16_over_k1_time']:.2f}x the time of k = 1 (target: well under 2x). "
        + (f"Memory read floor (the bank's bytes summed in RAM, 2 threads): {c['memory_GB_per_s']:.2f} GB/s. " if best else "")
        + ("Compute floor (the engine's own chunk kernel on one kernel already in cache, "
           f"{c['compute_floor_threads']} threads): "
           + ", ".join(f"{x['what']} {x['compute_floor_GB_per_s']:.1f} GB/s (the pass at {x['x_floor']:.2f}x the lower "
                       "of the two floors)" for x in c["rows"] if "compute_floor_GB_per_s" in x) + ". "
           if any("compute_floor_GB_per_s" in x for x in c["rows"]) else "")
        + f"Target >= 0.8x the {'fastest ' if best else ''}plain read: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in c["target_0.8x_plain_met"].items())
        + f".\n\nSmall bank M = {sb['M']}, n = {sb['n']}: a pass takes {sb['median_ms']:.2f} ms median (target < 50 ms).\n\n"
        "Where the passes run (same cached bank):\n\n"
        + _table(["where", "k", "seconds", "GB/s", "small-bank pass ms"], wrows)
        + "\n\nThe plain reads are `np.fromfile` of every shard file (allocating) and `readinto` into reused "
        "buffers (a copy out of the page cache); the target is against the fastest. "
        + ({"mapped": "The engine read this bank through its mapped reader (`engine/reader.py`: each shard file "
                      "mapped read-only once per process, so a pass reads the page cache in place, one read of each "
                      "stored number, where `readinto` reads it and writes a copy). ",
            "copied": "The engine read this bank through its copying reader (2 MB pieces into a reused buffer). ",
            "direct": "The engine read this bank with O_DIRECT. "}.get(c.get("reader"), ""))
        + "A k = 1 pass does two flops per stored number (a multiply and an add, float64); k = 4 and k = 16 do 8 "
        "and 32 and are compute bound. On 2 cores a worker process costs scheduler and "
        "transfer overhead the threaded default does not pay.\n"
    )


def render_pass_big() -> str:
    r = _load("bench_pass_big.json")
    head = "## Engine on a bank larger than memory (`python benchmarks/bench_pass.py --big`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    b = r["big_bank"]
    rows = [[x["what"], x["seconds"], x["GB_per_s"], x.get("x_plain", 1.0), x["peak_rss_GB"]] for x in b["rows"]]
    return head + (
        f"{b['note']}: {b['bank_GB']:.1f} GB on disk against {b['memory_GB']:.1f} GB of RAM; medians of {b['repeats']}.\n"
        f"Machine: {_machine(r['machine'])}.\n\n"
        + _table(["operation", "seconds", "GB/s", "x plain read", "peak RSS of all processes (GB)"], rows)
        + f"\n\nPeak resident memory {b['peak_rss_GB']:.2f} GB (target <= 4 GB: {'met' if b['target_4GB_met'] else 'NOT met'}).\n"
    )


def render_spicy_uci() -> str:
    r = _load("bench_spicy_uci.json")
    head = "## SpicyMKL on the UCI protocol (`python benchmarks/bench_spicy.py --uci`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    rows = [[x["loss"], x["C"], x["outer_iterations"], f"{x['paper_table4_outer_range_uci'][0]}-{x['paper_table4_outer_range_uci'][1]}",
             x["passes"], x["active"], x["test_accuracy"], x["seconds"], x["gap"]] for x in r["rows"]]
    return head + (
        f"{r['dataset']}: the 27 (d + 1) = {r['M']}-kernel SimpleMKL bank, unit trace, {r['n_train']}/{r['n_test']} "
        f"split, block 1-norm, relative gap 0.01.\nMachine: {_machine(r['machine'])}.\n\n"
        + _table(["loss", "C", "outer its", "paper Table 4 range (other UCI sets)", "full passes", "active",
                  "test acc", "seconds", "gap"], rows)
        + "\n\nThe paper's ranges are averages over Liver, Pima, Ionosphere, Wpbc and Sonar (not breast "
        "cancer); they are shown for scale.\n"
    )


def render_spicy_ooc() -> str:
    r = _load("bench_spicy_out_of_core.json")
    head = "## SpicyMKL out of core (`python benchmarks/bench_spicy.py --out-of-core BANK`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    rows = [[x["loss"], x["seconds"], x["passes"], x["bank_reads"], x["outer_iterations"], x["active"], x["gap"],
             x["peak_rss_GB"]] for x in r["rows"]]
    return head + (
        f"The engine benchmark's larger-than-memory bank: M = {r['M']}, n = {r['n']} (ringnorm, "
        f"{r['rows'][0]['bank_GB']:.1f} GB).\nMachine: {_machine(r['machine'])}.\n\n"
        + _table(["loss", "seconds", "full passes", "bank reads (bytes read / bank size)", "outer its", "active",
                  "gap", "peak RSS all processes (GB)"], rows)
        + "\n\nTargets: under 600 s, peak memory under 4 GB.\n"
    )


def render_pfbs() -> str:
    r = _load("bench_pfbs.json")
    head = "## PFBS paths and cross-validation (`python benchmarks/bench_pfbs.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    rows = []
    for name, d in r["datasets"].items():
        for variant in ("plain", "fista"):
            p = d["path"][variant]
            rows.append([name, d["M"], d["n_train"], variant, p["seconds"], p["iterations"], p["passes"], p["all_converged"]])
    cv = [[name, d["cv"]["best_mu"], d["cv"]["best_tau_over_tau_max"], d["cv"]["n_active"],
           d["cv"].get("test_rmse", d["cv"].get("test_accuracy")),
           d["cv"].get("train_mean_test_rmse", d["cv"].get("majority_class_test_accuracy")), d["cv"]["seconds"]]
          for name, d in r["datasets"].items()]
    return head + (
        f"A {r['params']['n_taus']}-value path from tau_max down to {r['params']['eps']} tau_max at mu = "
        f"{r['params']['mu']}, tol {r['params']['tol']} (duality gap).\nMachine: {_machine(r['machine'])}.\n\n"
        + _table(["data", "M", "n train", "method", "seconds", "iterations", "full passes", "all converged"], rows)
        + "\n\nCross-validated (tau, mu) and the held-out error:\n\n"
        + _table(["data", "mu", "tau / tau_max", "kernels kept", "test RMSE or accuracy", "baseline (mean / majority)", "CV seconds"], cv)
        + "\n\nPath plots: `results/bench_pfbs_path_diabetes.png`, `results/bench_pfbs_path_ringnorm.png`. "
        "Plain PFBS is slow when nearly the whole bank is active (ringnorm at small tau); FISTA cuts iterations 6-12x.\n"
    )


def render_sgd_gcd() -> str:
    r = _load("bench_sgd_gcd.json")
    head = "## SGD-1s, GCD and the two-stage baselines (`python benchmarks/bench_sgd_gcd.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    m, pr = r["machine"], r["protocol"]
    poly = [[x["r"], x["n_kernels"], x["sgd_lam"], x["sgd_mse"], x["sgd_seconds"], x["uniform_lam"],
             x["uniform_mse"], x["uniform_seconds"], x["target_variance"]] for x in r["polynomial"]]
    sgd_wins = [x["r"] for x in r["polynomial"] if x["sgd_mse"] < x["uniform_mse"]]
    uni_wins = [x["r"] for x in r["polynomial"] if x["sgd_mse"] >= x["uniform_mse"]]
    per_task = []
    for t in r["classification"]:
        for name, v in t["methods"].items():
            (hp, val), = v["hyper_parameter"].items()
            per_task.append([t["dataset"], name, f"{hp} = {val:g}", v["test_error"], v["rank"], v["seconds"],
                             v["iterations"], "yes" if v["converged"] else "no (cap)"])
    summ = [[k, v["median_rank"], v["mean_seconds"], v["mean_iterations"], "yes" if v["all_converged"] else "no"]
            for k, v in r["classification_summary"].items()]
    conv = []
    for t in r["classification"]:
        g = t["methods"]["GCD-1s"]
        fw = g["plain_frank_wolfe"]
        conv.append([t["dataset"], g["hyper_parameter"]["lam"], g["iterations"], g["away_steps"], f"{g['relative_gap']:.1e}",
                     "yes" if g["converged"] else "no", fw["iterations"], f"{fw['relative_gap']:.1e}",
                     "yes" if fw["converged"] else "no", f"{fw['objective_over_away'] - 1:.1e}"])
    fw_capped = [t["dataset"] for t in r["classification"] if not t["methods"]["GCD-1s"]["plain_frank_wolfe"]["converged"]]
    capped = [f"{name} on {t['dataset']}" for t in r["classification"] for name, v in t["methods"].items()
              if not v["converged"]]
    plots = dict(zip(("poly", "classification"), r["plots"]))
    loads = ", ".join(f"{t['dataset']} {t['load_average_before'][0]:.2f}" for t in r["classification"])
    poly_loads = ", ".join(f"r = {x['r']}: {x['load_average_before'][0]:.2f}" for x in r["polynomial"])
    return head + (
        f"Machine: {_machine(m)}. Shared machine: 1-minute load average {m['load_average_at_record'][0]:.2f} at the "
        f"start, {r['load_average_at_end'][0]:.2f} at the end (before each polynomial size: {poly_loads}; before each "
        f"classification task: {loads}); total {r['total_seconds']:.0f} s.\n\n"
        "Protocol: every hyper-parameter is chosen on a validation split of the TRAINING data only (a seeded "
        f"{pr['validation_share_of_training']:.0%} of the training points held out; each candidate fitted on the "
        "rest and scored there — MSE, resp. 0-1 error; the chosen value refitted on the whole training set, which "
        "alone meets the test set). Grids: UNIFORM ridge "
        f"{list(pr['uniform_ridges'])}, SGD-1s lam {list(pr['sgd_lams'])}, SVM C {list(pr['svm_Cs'])} "
        f"(UNIFORM, AMKL, GCD-2s), GCD-1s lam {list(pr['gcd1s_lams'])}. SGD-1s returns the average of the second "
        f"half of its iterates (average_from = {pr['sgd_average_from']}). GCD-1s runs away-step Frank-Wolfe and "
        f"stops at relative Frank-Wolfe gap (J - J*)/J <= {pr['gcd1s_tol_relative_gap']:g} "
        f"(or {pr['gcd1s_max_iter']} iterations). Seconds are those of the final fit; selection time is in the "
        "JSON (`select_seconds`).\n\n"
        "SGD-1s over the polynomial product family (degree <= 3) on synthetic polynomial data "
        f"(T = {r['polynomial'][0]['sgd_T']}):\n\n"
        + _table(["r", "kernels in the family", "SGD-1s lam", "SGD-1s test MSE", "SGD-1s seconds", "UNIFORM ridge",
                  "UNIFORM test MSE", "UNIFORM seconds", "target variance"], poly)
        + f"\n\nSGD-1s has the lower test MSE for r in {sgd_wins or 'none'}; UNIFORM for r in {uni_wins or 'none'} "
        "(noise-free data: for small r UNIFORM's kernel holds every monomial the target uses and interpolates "
        "it). Plot (test MSE and seconds against r, log scale): "
        f"`results/{plots['poly']}`.\n\n"
        "Classification (ringnorm, waveform, digits), as the thesis' Table 6.4:\n\n"
        + _table(["task", "method", "chosen", "test error", "rank", "seconds", "iterations", "converged"], per_task)
        + "\n\n"
        + _table(["method", "median rank", "mean seconds", "mean iterations", "converged on all tasks"], summ)
        + f"\n\nRuns that reached their iteration cap: {', '.join(capped) or 'none'}.\n\n"
        "GCD-1s convergence: away steps against Algorithm 6 as printed (plain Frank-Wolfe), same lam, "
        "tol and cap; the relative gap certifies (J - J*)/J. Plain Frank-Wolfe converges sublinearly (the "
        "iterates zig-zag between the vertices of the optimal face; see `mklscale/solvers/gcd.py`); it reached "
        f"the cap on: {', '.join(fw_capped) or 'none'}.\n\n"
        + _table(["task", "lam", "away-step FW iterations", "away/drop steps", "final rel. gap", "converged",
                  "plain FW iterations", "plain FW rel. gap", "plain FW converged", "J_FW / J_away - 1"], conv)
        + "\n\nPlot (test error, rank and iterations per task; hatched bars reached the iteration cap): "
        f"`results/{plots['classification']}`. `--quick` results: `results/bench_sgd_gcd_quick.json` "
        "(plots `results/bench_sgd_gcd_quick_*.png`, not rendered here).\n"
    )


def render_smo_citi() -> str:
    r = _load("bench_smo_citi.json")
    head = "## SMO-MKL and Citi against an interior-point solver (`python benchmarks/bench_smo_citi.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"

    def cvx(x):
        c = x["cvxpy"]
        return f"skipped (~{c['predicted_seconds']:.0f} s predicted)" if c["skipped"] else c["seconds"]

    rows = []
    for name, sweep in r["m_sweeps"].items():
        for x in sweep:
            rows.append([name, x["n"], x["m"], x["smo"]["seconds"], x["citi"]["seconds"], cvx(x), x["smo"]["passes"],
                         x["smo"]["n_active"], x["smo"]["rel_diff_vs_citi"], x["smo"]["gap"]])
    exps = [[k, v["smo"], v["citi"], v["cvxpy"] if v["cvxpy"] is not None else "-"] for k, v in r["exponents_m"].items()]
    en = r["exponents_n"]
    m96_text = _smo_cvxpy_repeats()
    return head + (
        f"Gaussian kernels on random feature subsets, unit diagonal, C = {r['params']['C']}, SMO-MKL with a certified "
        f"relative gap {r['params']['smo']['tol']}, Citi with eta = 1 (the same squared block-1 problem), cvxpy "
        f"(Clarabel) on the QCQP (L), skipped where predicted above {r['params']['cvxpy_limit_s']:.0f} s.\n"
        f"Machine: {_machine(r['machine'])}.\n\n"
        + _table(["data", "n", "m", "SMO-MKL s", "Citi s",
                  "cvxpy s" + ("" if r["params"].get("repeats", 1) > 1 else " (1 run)"), "SMO passes", "SMO active",
                  "SMO vs Citi objective (rel.)", "SMO gap"], rows)
        + m96_text
        + "\n\nFitted exponents of time in m:\n\n" + _table(["data", "SMO-MKL", "Citi", "cvxpy"], exps)
        + f"\n\nIn n (ringnorm, m = 12): SMO-MKL {en['smo']:.2f}, Citi {en['citi']:.2f}, cvxpy {en['cvxpy']:.2f} "
        "(the paper: SMO m^1.1 n^1.4, interior point m^1.6 n^4.1). Citi at eta = 1 is the slow one here: it "
        "needs up to ~2000 SVM-and-pass iterations. Plot: `results/bench_smo_citi.png`.\n"
    )


def _smo_cvxpy_repeats() -> str:
    """SMO-MKL against cvxpy with repeats (issue 21): the m = 96 point and the repeated sweep, each
    time a median of its runs, cvxpy's split into factorisation, compilation and Clarabel's solve."""
    files = [f for f in ("bench_smo_citi_cvxpy_repeats.json", "bench_smo_citi_m96_cvxpy.json") if _load(f)]
    rows, ratios, machine = [], [], None
    for f in files:
        r = _load(f)
        if r["params"].get("repeats", 1) < 2:
            continue
        machine = r
        for x in [x for sweep in r["m_sweeps"].values() for x in sweep] + r.get("n_sweep", []):
            c, smo = x["cvxpy"], x["smo"]
            if c["skipped"]:
                continue
            ratios.append((x["m"], x["n"], x["speedup_vs_cvxpy"], x["solver_speedup_vs_cvxpy"]))
            rows.append([x["dataset"], x["n"], x["m"], smo["seconds"], " / ".join(f"{t:.2f}" for t in smo["seconds_all"]),
                         c["seconds"], " / ".join(f"{t:.1f}" for t in c["seconds_all"]), c["factor_seconds"],
                         c["compile_seconds"], c["solver_seconds"], x["speedup_vs_cvxpy"], x["solver_speedup_vs_cvxpy"],
                         c["status"], smo.get("rel_diff_vs_cvxpy")])
    if not rows:
        return ""
    p = machine["params"]
    top = max(ratios, key=lambda t: (t[0], t[1]))
    return (
        f"\n\n### Against cvxpy, repeated (`{'`, `'.join(files)}`)\n\n"
        f"Each time is the median of {p['repeats']} runs (all runs listed; each part of cvxpy's time its own median); "
        f"both sides on one core (core {', '.join(map(str, p.get('cpu_affinity', [])))}; "
        f"{' '.join(f'{k}={v}' for k, v in (p.get('thread_env') or {}).items()) or 'default threads'}). cvxpy's whole time = "
        "eigendecompositions + problem construction + cvxpy's compilation + Clarabel's solve; the solve alone is "
        "Clarabel's own `solve_time`. Commands: `taskset -c 1 env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "
        "NUMBA_NUM_THREADS=1 python benchmarks/bench_smo_citi.py --m 3,6,12,24,48 --no-citi --out "
        "benchmarks/results/bench_smo_citi_cvxpy_repeats.json` and the same with `--datasets breast_cancer --m 96 "
        "--no-n-sweep --cvxpy-limit 100000 --out benchmarks/results/bench_smo_citi_m96_cvxpy.json`.\n"
        f"Machine: {_machine(machine['machine'])}.\n\n"
        + _table(["data", "n", "m", "SMO-MKL s (median)", "SMO runs", "cvxpy s (median)", "cvxpy runs",
                  "factor s", "compile s", "Clarabel solve s", "cvxpy / SMO", "Clarabel solve / SMO", "cvxpy status",
                  "SMO vs cvxpy objective (rel.)"], rows)
        + f"\n\nTypical ratio: the median over these {len(ratios)} points is "
        f"{float(np.median([t[2] for t in ratios])):.0f}x on the whole time and "
        f"{float(np.median([t[3] for t in ratios])):.0f}x on Clarabel's solve alone; at the largest point (m = {top[0]}, "
        f"n = {top[1]}) {top[2]:.0f}x and {top[3]:.0f}x. Over the points the whole-time ratio runs from "
        f"{min(t[2] for t in ratios):.0f}x to {max(t[2] for t in ratios):.0f}x: it depends on the size (cvxpy's time "
        "grows faster in m than SMO-MKL's), so no single figure describes it. \"optimal_inaccurate\" is Clarabel stopping short of its full tolerance; the "
        "objective column shows how close it still came to SMO-MKL's certified optimum (gap <= 1e-4)."
    )


_PEER_LABELS = {"spicy_hinge": "SpicyMKL hinge (block-1)", "spicy_logistic": "SpicyMKL logistic (block-1)",
                "smo": "SMO-MKL", "uniform": "UNIFORM", "alignment": "alignment (AMKL)",
                "easymkl": "EasyMKL (KOMD learner)", "fheuristic": "FHeuristic"}  # bench_peers.OUR_LABELS


_MKLPY_ORDER = ("EasyMKL", "AverageMKL", "FHeuristic", "PWMK", "CKA", "GRAM", "RMKL", "MEMO")


def _peer_cell(x: dict, key: str):
    v = x.get(key)
    return v if v is not None and x.get("status") == "ok" else "-"


def render_peers() -> str:
    r = _load("bench_peers.json")
    name = "bench_peers.json"
    if r is None:
        r, name = _load("bench_peers_quick.json"), "bench_peers_quick.json"
    head = "## mklscale against MKLpy 0.6 and cvxpy on the same banks (`python benchmarks/bench_peers.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    p, v = r["params"], r.get("peer_versions", {})
    load0 = r["load_average_at_start"][0]
    text = head + (
        f"{'Quick run (`--quick`): ' if p['quick'] else ''}tasks {', '.join(p['tasks'])}; n = "
        f"{', '.join(map(str, p['n']))} training points, up to {p['n_test']} test points (breast_cancer has 569 rows in "
        f"all); M = {', '.join(map(str, p['M']))} kernels ({p['family']}), unit diagonal, {p['dtype']}. Every method sees "
        f"the same Gram matrices: MKLpy reads them, exported from our bank, as float64 torch tensors held in memory "
        f"({'train kernels; each fit loads the test kernels after the fit' if 'peak_memory' in p else 'train and test'}); ours read the bank through the engine (block cache {p['cache_bytes']}) and compute the "
        f"cross kernels of the active kernels only. {_peers_footing(p)} Per-fit limit {p['time_limit_s']:.0f} s "
        f"(fit + prediction) and address-space cap {p['mem_limit_GB']} GB per fitting process; {p['skip_rule']}. "
        + (f"Peak memory is the peak resident set of the fitting process when the fit returns (MKLpy: {p['peak_memory']['mklpy']}; "
           f"ours: {p['peak_memory']['ours']}); both sides are warmed up on a tiny problem before timing. "
           if "peak_memory" in p else
           "Peak memory is the peak resident set of the process that fits and predicts (MKLpy: kernels included). ") +
        f"The ratio is the peer's fit time over the matching mklscale method's ("
        + ", ".join(f"{k} / {_PEER_LABELS.get(v, v)}" for k, v in p.get("match", {}).items())
        + f", the others / SpicyMKL hinge; the timed fit only, not the CV); > 1 means mklscale is faster. Load times (reading "
        f"the npz) are not in MKLpy's fit times; reading the bank is in ours.\n"
        f"Peers: MKLpy {v.get('MKLpy', '?')}, torch {v.get('torch', '?')}, scikit-learn {v.get('scikit-learn', '?')}, "
        f"cvxopt {v.get('cvxopt', '?')} (separate venv, `benchmarks/peers/setup_mklpy_venv.sh`); cvxpy "
        f"{r.get('cvxpy_version', '?')} (Clarabel).\n"
        f"Machine: {_machine(r['machine'])}; load average at start {r['load_average_at_start']} on "
        f"{r['machine']['cores']} cores; whole run {r['total_seconds'] / 60:.0f} min (`results/{name}`).\n"
    )
    if load0 > 4:
        text += (f"\n**The machine was busy (load average {load0} on {r['machine']['cores']} cores when the run "
                 "started): the times below are indicative and are to be re-run on a quiet machine.**\n")
    rows_all = r["grid"]
    for task in p["tasks"]:
        rows = []
        for x in (g for g in rows_all if g["task"] == task):
            for side, label, order in (("mklpy", "MKLpy ", _MKLPY_ORDER), ("ours", "", tuple(_PEER_LABELS))):
                for m, res in sorted(x.get(side, {}).items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
                    status, msg = res.get("status"), res.get("message", "")
                    note = "ok" if status == "ok" else (msg if msg.startswith(str(status)) else f"{status}: {msg}")[:170]
                    rows.append([label + (_PEER_LABELS.get(m, m) if side == "ours" else m), x["n"], x["M"],
                                 _peer_cell(res, "fit_seconds"),
                                 res["peak_rss_GB"] if status in ("ok", "error", "killed", "timeout") and "peak_rss_GB" in res else "-",
                                 _peer_cell(res, "test_accuracy"), _peer_cell(res, "ratio_time"),
                                 res.get("C", "-"), res.get("cv_seconds", "-"), _peer_stop(res), note.replace("|", "/")])
        n_test = sorted({g["n_test"] for g in rows_all if g["task"] == task})
        text += (f"\n### {task} (test points: {', '.join(map(str, n_test))})\n\n"
                 + _table(["method", "n", "M", "fit s", "peak memory GB", "test acc", "ratio (peer / ours)", "C",
                           "CV s", "iterations (stop)", "status"], rows)
                 + "\n")
    text += "\n" + _peers_per_method(r) + "\n" + _peers_summary(r) + "\n"
    cv = r.get("cvxpy") or []
    if cv:
        crow = [[c["task"], c["n"], c["M"], c["cvxpy"]["seconds"], c["smo"]["seconds"], c["spicy_hinge"]["seconds"],
                 c["cvxpy"]["objective"], c["smo"]["rel_diff_vs_cvxpy"], c["smo"]["gap"],
                 c["spicy_hinge"]["rel_diff_vs_smo_model"], c["cvxpy_over_smo_time"], c["cvxpy_over_spicy_time"]]
                for c in cv]
        text += (
            f"\ncvxpy (Clarabel, default tolerances) on the QCQP (L), C = {cv[0]['C']}, one run each (the comparison with "
            "repeats and cvxpy's time split into its parts is in the SMO-MKL section above), against SMO-MKL (certified relative gap "
            "1e-4, as in the SMO-MKL benchmark above) and SpicyMKL hinge block-1 with C' = sum_m ||f_m*|| / C from the SMO solution (the same solution), "
            "relative gap 1e-6. The SKM objective is -(L)/2; SpicyMKL's is compared with the SMO model's value in "
            "SpicyMKL's objective. cvxpy's time includes the eigen-factorisations.\n\n"
            + _table(["data", "n", "M", "cvxpy s", "SMO-MKL s", "SpicyMKL s", "cvxpy objective (SKM)",
                      "SMO vs cvxpy (rel.)", "SMO gap", "SpicyMKL vs SMO model (rel.)", "cvxpy / SMO time",
                      "cvxpy / SpicyMKL time"], crow) + "\n")
    png = name.replace(".json", ".png")
    text += f"\nFit time against M, per task and n (log-log): `results/{png}`.\n"
    return text


def _peers_footing(p: dict) -> str:
    """The equal-footing settings of a bench_peers run (issue 21), from its params."""
    if "cv" not in p:  # runs before issue 21
        return f"C = {p['C']} for every SVM (no model selection); GRAM, RMKL, MEMO ran {p['mklpy_max_iter']} iterations."
    cv, st = p["cv"], p["stopping"]
    text = (f"Matched pairs (same problem: {', '.join(f'{k} / {_PEER_LABELS.get(v, v)}' for k, v in p['match'].items())}) "
            f"use the same constants on both sides: SVM C = {p['C']}, {st['svm']}, EasyMKL as stated below; the "
            "per-peer table gives their test-label agreement. ")
    if "CKA" in p["match"]:
        text += ("One pair only shares its paper: MKLpy 0.6's CKA computes the alignment weights M^-1 a without the "
                 "constraint mu >= 0 of Cortes et al.'s alignf (its source: `weights = Minv @ a`, then scaled to unit "
                 "norm), so its combined kernel can be indefinite; ours solves the constrained QP (2.12). Their low "
                 "agreement below is that difference, not a tolerance. ")
    if cv["enabled"]:
        text += (f"The other peers ({', '.join(cv['mklpy_methods'])}) solve other problems than SpicyMKL hinge, so each "
                 f"side's constant is chosen by the same {cv['folds']}-fold stratified CV on the training part (the same "
                 f"fold rows on both sides, seed {cv['seed']}, {cv['metric']}, {cv['rule']}), 4 values per side: MKLpy's "
                 f"{cv['mklpy_parameter']} in {cv['mklpy_grid']}, ours {cv['ours_parameter']} in {cv['ours_grid']}; the "
                 "timed fit is the refit on the whole training part at the chosen value (column C), the CV's own time is "
                 f"the column CV s (CV limit {cv['time_limit_s']:.0f} s per method). ")
    else:
        text += f"No CV in this run (--no-cv): C = {p['C']} everywhere. "
    text += (f"Stopping: GRAM / RMKL / MEMO: {st['GRAM/RMKL/MEMO']}; SpicyMKL: {st['spicy']}; SMO-MKL: {st['smo']}.")
    return text


def _peer_stop(res: dict) -> str:
    if res.get("iterations") is None or res.get("status") != "ok":
        return "-"
    why = res.get("stopped_on") or ("converged" if res.get("converged") else "not converged")
    return f"{res['iterations']} ({why.split(' (')[0]})"


def _peers_per_method(r: dict) -> str:
    """One row per MKLpy method against the mklscale method that solves the same problem (``matched``):
    how many fits both sides finished, wins and losses on time, the median and range of the ratio, and
    accuracy differences; then EVERY loss, listed."""
    rows, lost = [], []
    for m in _MKLPY_ORDER:
        pairs = [(g, g["mklpy"][m]) for g in r["grid"] if m in g["mklpy"]]
        done = [(g, x) for g, x in pairs if x.get("status") == "ok" and "ratio_time" in x]
        if not pairs:
            continue
        matched = next((x["matched"] for _, x in pairs if x.get("matched")), None)
        ratios = [x["ratio_time"] for _, x in done]
        losses = sorted(((g, x) for g, x in done if x["ratio_time"] < 1.0), key=lambda t: t[1]["ratio_time"])
        acc = [(x["test_accuracy"], g["ours"][x["matched"]]["test_accuracy"]) for g, x in done]
        agree = [x["agreement"]["test_label_agreement"] for _, x in done
                 if "test_label_agreement" in x.get("agreement", {})]
        wdiff = [x["agreement"]["weights_max_abs_diff"] for _, x in done if "weights_max_abs_diff" in x.get("agreement", {})]
        rows.append([m, _PEER_LABELS.get(matched, matched) if matched else "-", len(pairs), len(done),
                     len(done) - len(losses), len(losses),
                     f"{statistics.median(ratios):.3g}" if ratios else "-",
                     f"{min(ratios):.3g} .. {max(ratios):.3g}" if ratios else "-",
                     sum(p > o + 0.02 for p, o in acc), sum(o > p + 0.02 for p, o in acc),
                     f"{min(agree):.3f} .. {max(agree):.3f}" if agree else "-",
                     f"{max(wdiff):.2g}" if wdiff else "-"])
        lost += [f"{m} vs {_PEER_LABELS.get(x['matched'], x['matched'])} on {g['task']} n={g['n']} M={g['M']} "
                 f"({x['ratio_time']:.2f})" for g, x in losses]
    text = ("Per peer (the ratio is the peer's fit time over the matched mklscale method's; > 1: mklscale faster; "
            "accuracy columns count fits where one side is more than 0.02 more accurate; for the pairs that solve the "
            "same problem, the share of test points both sides label alike and the largest difference of their "
            "kernel weights, normalised to sum one, check that they do):\n\n"
            + _table(["MKLpy method", "matched mklscale method", "grid points", "both finished", "mklscale faster",
                      "mklscale slower", "median ratio", "ratio range", "peer more accurate", "mklscale more accurate",
                      "same test labels (min .. max)", "max weight difference"],
                     rows) + "\n")
    stale = sorted(m for g in r["grid"] for m, x in g["mklpy"].items()
                   if m in ("EasyMKL", "FHeuristic") and x.get("matched") not in (None, m.lower()))
    if stale:
        text += ("\nThis run predates EasyMKL and FHeuristic on mklscale's engine: " + ", ".join(sorted(set(stale)))
                 + " are matched above to the method that stood in for them then; a rerun of bench_peers.py pairs "
                 "each with its own implementation (MATCH in bench_peers.py).\n")
    if lost:
        text += f"\nEvery fit where mklscale is slower ({len(lost)}): " + "; ".join(lost) + ".\n"
    return text


def _peers_summary(r: dict) -> str:
    """The paragraph under the tables, computed from the results."""
    grid = r["grid"]
    peer_ok = [(g, m, x) for g in grid for m, x in g["mklpy"].items() if x.get("status") == "ok"]
    failed = [(g, m, x) for g in grid for m, x in g["mklpy"].items() if x.get("status") not in ("ok", "not run")]
    ours_failed = [(g, m, x) for g in grid for m, x in g["ours"].items() if x.get("status") not in ("ok", "not run")]
    parts = []
    peak_peer = max(peer_ok, key=lambda t: t[2]["peak_rss_GB"], default=None)
    ours_ok = [(g, m, x) for g in grid for m, x in g["ours"].items() if x.get("status") == "ok"]
    peak_ours = max(ours_ok, key=lambda t: t[2]["peak_rss_GB"], default=None)
    if peak_peer and peak_ours:
        g, m, x = peak_peer
        go, mo, xo = peak_ours
        parts.append(f"Memory: MKLpy holds every kernel, so its peak grows as M n^2 (largest: {m} at n = {g['n']}, "
                     f"M = {g['M']}, {x['peak_rss_GB']:.2f} GB); the largest peak of ours is "
                     f"{xo['peak_rss_GB']:.2f} GB ({_PEER_LABELS[mo]} at n = {go['n']}, M = {go['M']}, a bank of "
                     f"{go['bank_GB']:.2f} GB on disk).")
    if failed:
        kinds = {}
        for g, m, x in failed:
            kinds.setdefault(m, []).append(f"{g['task']} n={g['n']} M={g['M']} ({x['status']})")
        parts.append("MKLpy failures (all): " + "; ".join(f"{m}: {', '.join(v)}"
                                                   for m, v in kinds.items()) + " (messages in the tables).")
    not_run = {}
    for g in grid:
        for side, label in (("mklpy", "MKLpy "), ("ours", "")):
            for m, x in g[side].items():
                if x.get("status") == "not run":
                    not_run.setdefault(label + _PEER_LABELS.get(m, m), []).append(g)
    if not_run:
        parts.append("Not run (skip rule; reasons in the tables): " + "; ".join(
            f"{k} at {len(v)} of {len(grid)} grid points (from n={min(g['n'] for g in v)}, "
            f"M={min(g['M'] for g in v if g['n'] == min(h['n'] for h in v))})" for k, v in not_run.items()) + ".")
    mem_loss = []
    for g in grid:
        peer_min = min((x["peak_rss_GB"] for x in g["mklpy"].values() if x.get("status") == "ok"), default=None)
        if peer_min is None:
            continue
        for m, x in g["ours"].items():
            if x.get("status") == "ok" and x["peak_rss_GB"] > max(1.2 * peer_min, peer_min + 0.2):
                mem_loss.append(f"{_PEER_LABELS[m]} {x['peak_rss_GB']:.2f} GB vs {peer_min:.2f} GB on {g['task']} "
                                f"n={g['n']} M={g['M']}")
    if mem_loss:
        parts.append("Where one of ours peaks above the smallest MKLpy peak of the same grid point (by more than "
                     "20% and 0.2 GB): " + "; ".join(mem_loss) + " (SMO-MKL holds a working set of up to 2 GiB of "
                     "float64 kernels on top of the engine's block cache).")
    if ours_failed:
        parts.append("mklscale failures: " + "; ".join(f"{_PEER_LABELS[m]} {g['task']} n={g['n']} M={g['M']} "
                                                       f"({x['status']})" for g, m, x in ours_failed) + ".")
    acc_loss = []
    for g in grid:
        best_peer = max((x["test_accuracy"] for x in g["mklpy"].values() if x.get("status") == "ok"), default=None)
        best_ours = max((x["test_accuracy"] for x in g["ours"].values() if x.get("status") == "ok"), default=None)
        if best_peer is not None and best_ours is not None and best_peer > best_ours:
            acc_loss.append(f"{g['task']} n={g['n']} M={g['M']} ({best_peer:.3f} vs {best_ours:.3f})")
    pair_loss = []
    for g in grid:
        for m, x in g["mklpy"].items():
            ref = g["ours"].get(x.get("matched", ""), {})
            if x.get("status") == "ok" and ref.get("status") == "ok" and x["test_accuracy"] > ref["test_accuracy"] + 0.02:
                pair_loss.append(f"{m} {x['test_accuracy']:.3f} vs {_PEER_LABELS[x['matched']]} {ref['test_accuracy']:.3f} "
                                 f"on {g['task']} n={g['n']} M={g['M']}")
    if pair_loss:
        parts.append("A peer more than 0.02 more accurate than its matching mklscale method: " + "; ".join(pair_loss) + ".")
    parts.append(("Best test accuracy of a peer above the best of ours: " + "; ".join(acc_loss) + "."
                  if acc_loss else "No peer reached a higher test accuracy than the best of ours at any grid point.")
                 + (" Accuracy differences of a point or two are within the noise of a few hundred test points."
                    if r["params"].get("cv", {}).get("enabled") else
                    " All methods use one fixed C (no model selection), so accuracy differences of a point or two "
                    "are within the noise of a few hundred test points."))
    return " ".join(parts)



# ---- scaling study (benchmarks/bench_scaling.py) -------------------------------------------------
def _scaling_cells(x: dict) -> list:
    if x["status"] == "ok":
        status = "ok" + (" (stopped by the time limit)" if x.get("hit_time_limit") else "") \
            + ("" if x["converged"] else ", not converged")
        return [x["seconds"], x["passes"], x["bank_reads"], x["active"], x["test_accuracy"], status]
    if x["status"] == "timeout":
        return [f"> {x['timeout_s']:.0f}", "-", "-", "-", "-", "timeout (killed)"]
    return ["-", "-", "-", "-", "-", (x["status"] + ": " + x.get("message", ""))[:120].replace("|", "/")]


def _scaling_losses(rows: list[dict], key: str) -> str:
    """Where SpicyMKL (our default solver) is not the fastest, and which solvers fail, from the rows."""
    parts = []
    by_point: dict = {}
    for x in rows:
        by_point.setdefault(x[key], []).append(x)
    faster = []
    for value, xs in sorted(by_point.items()):
        sp = next((x for x in xs if x["solver"] == "spicy" and x["status"] == "ok"), None)
        if sp is None:
            continue
        for x in xs:
            if x["solver"] != "spicy" and x["status"] == "ok" and x["seconds"] < sp["seconds"]:
                faster.append(f"{x['label']} at {key} = {value} ({x['seconds']:.3g} s vs {sp['seconds']:.3g} s)")
    if faster:
        parts.append("Faster than SpicyMKL: " + "; ".join(faster[:10]) + (" ..." if len(faster) > 10 else "") + ".")
    fails = [f"{x['label']} at {key} = {x[key]} ("
             + (x["status"] if x["status"] != "ok" else "stopped by the time limit" if x.get("hit_time_limit")
                else "not converged") + ")"
             for x in rows if x["status"] != "ok" or x.get("hit_time_limit") or not x.get("converged", True)]
    if fails:
        parts.append("Timeouts, skips, errors or unconverged fits: " + "; ".join(fails[:14])
                     + (" ..." if len(fails) > 14 else "") + ".")
    best_acc: dict = {}
    for value, xs in sorted(by_point.items()):
        ok = [x for x in xs if x["status"] == "ok"]
        if ok:
            top = max(ok, key=lambda x: x["test_accuracy"])
            best_acc[value] = f"{top['label']} {top['test_accuracy']:.3f}"
    if best_acc:
        parts.append("Best test accuracy per point: " + "; ".join(f"{k}: {v}" for k, v in best_acc.items()) + ".")
    return " ".join(parts)


def _scaling_summary(sec: dict, key: str, slopes_hi: dict, hi_name: str) -> str:
    """What the sweep shows, computed from the rows: growth of each solver's time over the sweep."""
    name = "M" if key == "M" else "n"
    parts = []
    for s in dict.fromkeys(x["solver"] for x in sec["rows"]):
        ok = sorted((x for x in sec["rows"] if x["solver"] == s and x["status"] == "ok" and not x.get("hit_time_limit")),
                    key=lambda x: x[key])
        if len(ok) >= 2:
            a, b = ok[0], ok[-1]
            parts.append(f"{a['label']} {b['seconds'] / a['seconds']:.3g}x (passes {a['passes']} -> {b['passes']})")
    lo = min(x[key] for x in sec["rows"])
    text = (f"From {name} = {lo} to the largest {name} each solver finished ({name} grows up to "
            f"{max(x[key] for x in sec['rows']) / lo:.0f}x), the fit time grows: " + ", ".join(parts) + ". ")
    superlinear = [f"{x} ({v:.2f})" for x, v in ((sec_label(sec, s), v) for s, v in slopes_hi.items()) if v > 1]
    if superlinear:
        text += f"Slope above 1 over {hi_name} (the time grows faster than the bank): {', '.join(superlinear)}. "
    top = max((x[key] for x in sec["rows"] if x["status"] == "ok"), default=None)
    if top is not None:
        at_top = sorted((x for x in sec["rows"] if x[key] == top and x["status"] == "ok" and not x.get("hit_time_limit")),
                        key=lambda x: x["seconds"])
        if at_top:
            text += (f"At {name} = {top} the order is " + " < ".join(f"{x['label']} ({x['seconds']:.3g} s)"
                                                                      for x in at_top) + ". ")
    return text


def sec_label(sec: dict, solver: str) -> str:
    return next(x["label"] for x in sec["rows"] if x["solver"] == solver)


def _scaling_sweep(r: dict, sec: dict, key: str, title: str, cmd: str, png: str) -> str:
    label = "M" if key == "M" else "n"
    rows = [[x[key], x["label"], *_scaling_cells(x)] for x in sorted(sec["rows"], key=lambda x: (x[key], x["solver"]))]
    if key == "M":
        slope_sets = [("all M", sec["slopes_all_M"]), ("M > 1000", sec["slopes_M_above_1000"])]
        pts_hi = [m for m in sec["Ms"] if m > 1000]
    else:
        slope_sets = [("all n", sec["slopes_all_n"]), ("n > 500", sec["slopes_n_above_500"])]
        pts_hi = [v for v in sec["ns"] if v > 500]
    solvers = list(dict.fromkeys(x["solver"] for x in sec["rows"]))
    labels = {x["solver"]: x["label"] for x in sec["rows"]}
    srows = [[labels[s]] + [d.get(s, "-") for _, d in slope_sets] for s in solvers]
    p = r["params"]
    builds = [f"{x[key]}: {x['build_seconds']:.1f} s" for x in sec["rows"] if x["solver"] == solvers[0]
              and x.get("build_seconds") is not None]
    text = (
        f"### {title} (`{cmd}`)\n\n"
        f"Machine: {_machine(r['machine'])}; load average {r['load_average_at_start']} at start, "
        f"{r['load_average_at_end']} at end, on {r['machine']['cores']} cores shared with other jobs; "
        f"whole run {r['total_seconds'] / 60:.0f} min. Per-fit limit {p['timeout_s']:.0f} s.\n\n"
        + _table([label, "solver", "fit s", "full passes", "bank reads", "active", "test acc", "status"], rows)
        + f"\n\nLog-log slope of the fit time in {label} (least squares over the points that finished; "
        f"'{slope_sets[1][0]}' uses {label} = {', '.join(map(str, pts_hi))}):\n\n"
        + _table(["solver"] + [f"slope over {name}" for name, _ in slope_sets], srows)
        + f"\n\nPlot (fit time and bank reads against {label}, log-log): `results/{png}`. "
        + (f"Bank builds this run (s): {', '.join(builds)}. " if builds else "Banks were reused from earlier runs. ")
        + "'Bank reads' is the engine's bytes read divided by the bank's bytes (full passes plus block reads); "
        "'full passes' counts only calls that streamed every kernel.\n\n"
        + _scaling_summary(sec, key, slope_sets[1][1], slope_sets[1][0])
        + _scaling_losses(sec["rows"], key) + "\n"
    )
    return text


def render_scaling() -> str:
    head = "## Scaling study (`python benchmarks/bench_scaling.py`)\n\n"
    quick = _load("bench_scaling_quick.json")
    text = head + (
        "IDA protocol on ringnorm (training rows `load('ringnorm', n, seed=0)`, 1000 test rows from seed 1), "
        "Gaussian kernels on random feature subsets (width 5 chi^2 + 0.1), unit trace, float32, for the six "
        "solvers with these settings:\n\n"
        + _table(["solver", "settings"], [[v["label"], v["note"]] for v in
                                          (quick or {}).get("params", {}).get("solvers", {}).values()])
        + "\n\nEvery fit runs in a spawned worker process after an untimed warm-up fit of the same solver on a "
        "6-kernel bank, under a wall-clock limit: a fit past it is killed and recorded as a timeout, and the "
        "solver is skipped at the larger sizes of that sweep. A `KernelSubsetEngine` of the largest bank would "
        "read kernels scattered over its shards, not a bank of M kernels, so every M is its own bank (data and "
        "spec seed 0, so a bank of given "
        "(n, M) is the one `bench_pass.py --big` builds).\n"
        + (f"A smoke run of every item at tiny sizes is `--quick` ({quick['total_seconds']:.0f} s on "
           f"{quick['machine']['date'][:10]}, `results/bench_scaling_quick.json`).\n" if quick else "")
    )
    for n in (200, 1000):
        r = _load(f"bench_scaling_m_n{n}.json")
        cmd = (r or {}).get("command") or f"python benchmarks/bench_scaling.py --m-scaling --n {n}"
        if r is None:
            text += f"\n### Scaling in M at n = {n} (`{cmd}`)\n\nNot recorded yet.\n"
            continue
        sec = r["m_scaling"]
        extra = (" At n = 1000 the banks of M <= 3000 are built here; the largest M is the bank of item 5 "
                 f"(`{sec['big_bank']}`)" + (", and its fits are the ones of item 6 below (same run, same bank, "
                                              "each in a fresh process)" if any(x.get("from_item") for x in sec["rows"])
                                             else "") + "." if sec.get("big_bank") else "")
        text += "\n" + _scaling_sweep(r, sec, "M", f"Scaling in M at n = {n}", cmd, f"bench_scaling_m_n{n}.png")
        if extra:
            text += extra + "\n"
    r = _load("bench_scaling_n.json")
    cmd = "python benchmarks/bench_scaling.py --n-scaling"
    if r is None:
        text += f"\n### Scaling in n at M = 100 (`{cmd}`)\n\nNot recorded yet.\n"
    else:
        text += "\n" + _scaling_sweep(r, r["n_scaling"], "n_train", f"Scaling in n at M = {r['n_scaling']['M']}",
                                      cmd, "bench_scaling_n.png")
    text += "\n" + _render_scaling_workers() + "\n" + _render_scaling_ooc() + "\n" + _render_scaling_physical()
    return text


def _render_scaling_workers() -> str:
    r = _load("bench_scaling_workers.json")
    head = "### Worker processes (`python benchmarks/bench_scaling.py --workers`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    w = r["workers"]
    s, m = w["split"], w["model"]
    rows = [[x["where"], x["pass_seconds"], x["pass_GB_per_s"], x["solve_seconds"], x["solve_passes"],
             x.get("solve_full_pass_seconds", "-")] for x in w["rows"]]
    proj = [[x["workers"], x["pass_seconds_model"], x["solve_seconds_model"]] for x in m["projection"]]
    chk = m["check_2_workers"]
    t = {x["workers"]: x for x in w["rows"]}
    two_vs_one = t[2]["pass_seconds"] / t[1]["pass_seconds"]
    thr_vs_two = t[2]["pass_seconds"] / t[0]["pass_seconds"]
    return head + (
        f"Bank M = {w['M']}, n = {w['n']} ({w['bank_GB']:.2f} GB), {w['page_cache']}; one quad_forms pass (k = 1) "
        f"median of {w['repeats']}, SpicyMKL (logistic, block-1, C = 0.05, gap 0.01) solve median of "
        f"{r['params']['repeats']}.\nMachine: {_machine(r['machine'])}; load average {r['load_average_at_start']} at "
        f"start on {r['machine']['cores']} cores.\n\n"
        + _table(["where", "pass s", "pass GB/s", "solve s", "solve full passes", "s in full passes (engine log)"], rows)
        + ("\n\nPlain reads of the same files (same cache state, seconds): " + ", ".join(
            f"{k} thread(s) {v:.3g}" for k, v in w["plain_reads_s"].items()) + "." if "plain_reads_s" in w else "")
        + f"\n\nMeasured split of one pass (same run): reading the bank files into a reused buffer {s['t_read_1thread_s']:.3g} s "
        f"(1 thread; {s['t_read_2threads_s']:.3g} s with 2), compute {s['t_cpu_1core_s']:.3g} s (the engine's kernels "
        f"on {s['t_cpu_measured_on_kernels']} cached blocks, one core, scaled to M), and the residual of the 1-worker "
        f"pass, t_ovh = {s['t_overhead_s']:.3g} s (scheduler, graph, transfers).\n\n"
        f"**Projection (a model, not a measurement):** `{m['formula']}`, with {m['terms']}. The model gives "
        f"{chk['model_s']:.3g} s per pass for 2 workers against {chk['measured_s']:.3g} s measured"
        + (f", and {chk['solve_model_s']:.3g} s per solve against {chk['solve_measured_s']:.3g} s" if "solve_model_s" in chk
           else "") + ".\n\n"
        + _table(["workers (model)", "pass s (model)", "SpicyMKL solve s (model)"], proj)
        + f"\n\nOn this 2-core machine 2 workers take {two_vs_one:.2f}x the pass time of 1 worker and "
        f"{thr_vs_two:.2f}x that of the threaded default: " + (
            "the worker processes lose to threads in one process here (per-task scheduling and result transfer "
            "on top of a pass that is short from the page cache); the model says how much of a pass is "
            "fixed overhead and so how far more workers can help."
            if thr_vs_two > 1 else "the workers beat the threaded default here.")
        + f" The model assumes a free core per worker; with a load average of {r['load_average_at_start'][0]} on "
        f"{r['machine']['cores']} cores that does not hold here, and the measured 2-worker pass is "
        f"{chk['measured_s'] / chk['model_s']:.2f}x the model's. Read the projection as what the measured I/O and "
        "compute split allow on free cores, not as a forecast for this machine.\n"
    )


def _render_scaling_ooc() -> str:
    r = _load("bench_scaling_ooc.json")
    cmd = f"python benchmarks/bench_scaling.py --out-of-core {r['out_of_core']['bank'] if r else 'BANK'}"
    head = f"### Out of core end to end (`{cmd}`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    o = r["out_of_core"]
    b = o["build"]
    build = ("Bank reused: " + b["note"] + "; `bench_build.py` above measures the build rate, and "
             "`--out-of-core NEW_PATH` builds and times a bank") if b["reused"] else \
        f"bank built in {b['seconds']:.0f} s ({b['kernels_per_s']:.1f} kernels/s, peak RSS {b['peak_rss_GB']:.2f} GB)"
    rows = [[x["where"], *(_scaling_cells(x)[:4]), x["peak_rss_GB"], x.get("peak_rss_driver_GB", "-"),
             _scaling_cells(x)[5]] for x in o["rows"]]
    ok = [x for x in o["rows"] if x["status"] == "ok"]
    met_t = [x["where"] for x in ok if x["seconds"] < o["targets"]["fit_seconds"]]
    met_m = [x["where"] for x in o["rows"] if x["peak_rss_GB"] < o["targets"]["peak_rss_GB"]]
    return head + (
        f"SpicyMKL (logistic, block-1, C = 0.05, gap 0.01) on M = {o['M']}, n = {o['n']} float32: {o['bank_GB']:.1f} GB "
        f"on disk against {o['memory_GB']:.1f} GB of RAM ({'larger' if o['larger_than_memory'] else 'NOT larger'} than "
        f"memory; {o['note']}). {build}.\nMachine: {_machine(r['machine'])}; load average {r['load_average_at_start']} "
        f"at start.\n\n"
        + _table(["where", "fit s", "full passes", "bank reads", "active", "peak RSS all processes GB",
                  "peak RSS benchmark process GB (not the fit)", "status"], rows)
        + f"\n\n{o['rss_note']}. Targets: fit under {o['targets']['fit_seconds']} s "
        f"({'met: ' + ', '.join(met_t) if met_t else 'NOT met'}), peak memory under {o['targets']['peak_rss_GB']} GB "
        f"({'met: ' + ', '.join(met_m) if met_m else 'NOT met'}).\n"
    )


def _render_scaling_physical() -> str:
    r = _load("bench_scaling_physical.json")
    cmd = (r or {}).get("command") or "python benchmarks/bench_scaling.py --physical BANK --physical-build"
    head = f"### Against the physical limit (`{cmd}`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    p = r["physical"]
    if "reference" not in p:  # a recording from before issue 21's direct-I/O reference
        rows = [[x["label"], *_scaling_cells(x)] for x in p["rows"]]
        return head + (
            f"M = {p['M']}, n = {p['n']} ({p['bank_GB']:.1f} GB, RAM {p['memory_GB']:.1f} GB). This recording predates "
            "the direct-I/O reference read (issue 21), so no fit is compared with the disk here; "
            "`python benchmarks/bench_scaling.py --physical BANK --physical-build` records it.\n"
            f"Machine: {_machine(r['machine'])}; load average {r['load_average_at_start']} at start.\n\n"
            + _table(["solver", "fit s", "full passes", "bank reads (bytes)", "active", "test acc", "status"], rows) + "\n")
    ref, cold = p["reference"], p["cold_pass"]
    reads = "; ".join(f"{x['threads']} thread{'s' if x['threads'] > 1 else ''} {x['seconds']:.1f} s "
                      f"({x['GB_per_s']:.2f} GB/s{'' if x['page_cache']['dropped'] else ', cache NOT dropped'})"
                      for x in p["direct_reads"])
    rows = []
    for x in p["rows"]:
        c = _scaling_cells(x)
        ratio = x.get("fit_over_reference",
                      f"> {x['fit_over_reference_at_least']:.3g}" if "fit_over_reference_at_least" in x else "-")
        per_read = x.get("fit_over_reads_x_reference")
        rows.append([x["label"], c[0], ratio, c[1], c[2], "-" if per_read is None else per_read, c[3], c[4], c[5]])
    sp = next((x for x in p["rows"] if x["solver"] == "spicy" and x["status"] == "ok"), None)
    target = p["target"]["spicy_fit_over_read"]
    verdict = (f"SpicyMKL's fit took {sp['fit_over_reference']:.2f} times as long as the reference read (target <= "
               f"{target:g}: {'met' if sp['fit_over_reference'] <= target else 'NOT met'}) while reading "
               f"{sp['bank_reads']:.3g} banks' worth of bytes, so each bank read of the fit took "
               f"{sp['fit_over_reads_x_reference']:.2f} times the reference read."
               if sp and sp.get("fit_over_reads_x_reference") else "SpicyMKL was not fitted, or did not finish.")
    return head + (
        f"M = {p['M']}, n = {p['n']} ({p['bank_GB']:.1f} GB, RAM {p['memory_GB']:.1f} GB). Reference: the fastest "
        f"direct-I/O read of the bank, {ref['seconds']:.1f} s ({ref['GB_per_s']:.2f} GB/s, {ref['threads']} "
        f"thread{'s' if ref['threads'] > 1 else ''}; {ref['how']}). Direct reads: {reads}. Cache: {p['cache_state']}.\n"
        f"Machine: {_machine(r['machine'])}; load average {r['load_average_at_start']} at start.\n\n"
        f"One engine quad_forms pass from a cold cache (fresh Engine, threaded default): {cold['seconds']:.1f} s, "
        f"{cold['GB_per_s']:.2f} GB/s, {cold['over_reference']:.2f} times the reference read"
        + ({"direct": " (the engine's direct reader: O_DIRECT in 8 MiB pieces, as a bank larger than memory is read; "
                      "the buffered reads it used before took 4.9x the reference on this bank, pinned to one core)",
            "copied": " (the engine's copying reader)"}.get(cold.get("reader"), "")) + ".\n\n"
        + _table(["solver", "fit s", "fit / reference read", "full passes", "bank reads (bytes)",
                  "fit / (bank reads x reference)", "active", "test acc", "status"], rows)
        + f"\n\nEach fit ran in a fresh worker process, the page cache dropped just before it. {verdict}\n"
    )


def render_checkpoint() -> str:
    r = _load("bench_checkpoint.json") or _load("bench_checkpoint_quick.json")
    head = "## Checkpoint overhead and time to resume (`python benchmarks/bench_checkpoint.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    p, load = r["params"], r["machine"].get("load_average_at_record")
    rows = []
    for row in r["rows"]:
        res, sec = row["resume"], row["seconds"]
        setting = ", ".join(f"{k}={v}" for k, v in row["params"].items() if k != "tol") or "defaults"
        rows.append([row["solver"], setting, sec["none"], f"{row['overhead']['every_10s']:+.1%}",
                     f"{row['overhead']['every_iteration']:+.1%}", row["checkpoint_writes"].get("every_iteration", 0),
                     res.get("checkpoint_bytes", "-"), res.get("resume_cost_seconds", "-"),
                     "yes" if res.get("same_weights") else "NO"])
    worst = max(row["overhead"]["every_10s"] for row in r["rows"])
    return head + (
        f"IDA bank (ringnorm, n = {p['n_train']}, M = {p['M']}), medians of {p['repeats']} interleaved repeats; "
        f"load average when recorded {load}. Machine: {_machine(r['machine'])}.\n\n"
        + _table(["solver", "setting", "fit s (no checkpoint)", "every 10 s", "every iteration",
                  "writes (every it.)", "checkpoint bytes", "resume cost s", "resumed = uninterrupted"], rows)
        + f"\n\nTarget: < {r['targets']['overhead every_10s']:.0%} overhead with a checkpoint every 10 s; the "
        f"largest measured here is {worst:+.1%}. At these solve times a 10 s schedule writes nothing "
        "unless the run is preempted, so that column is the cost of the per-iteration check (and the "
        "machine's noise: negative values are noise). 'Every iteration' is the worst case, an atomic npz "
        "write and fsync per outer iteration. The resume cost is the resumed fit's time minus the time the "
        "uninterrupted fit spent after the stop (reading the file, re-reading the working set); the last "
        "column checks the resumed weights are bit-identical.\n"
    )


def render_compare_versions() -> str:
    r = _load("compare_versions.json")
    head = "## Before and after a change: same-run ratios (`python benchmarks/compare_versions.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    loads = [run["load_1min"] for run in r["runs"]]
    rows = [[row["benchmark"], row["solver"], row["fits"], f"{row['median_ratio']:.2f}",
             f"{row['min_ratio']:.2f}-{row['max_ratio']:.2f}", row["seconds_before"], row["seconds_after"],
             "yes" if row["passes_equal"] else "NO"] for row in r["solvers"]]
    return head + (
        f"Commit {r['commits']['before']} (before) against {r['commits']['after']} (after), "
        f"`{r['command']}`: `bench_scaling.py --quick` and `bench_peers.py --quick --skip-mklpy` run alternately "
        f"in both versions, {r['rounds']} rounds ({r['total_seconds'] / 60:.0f} min); per fit the median seconds "
        f"of each version, then per solver the after/before ratios of those medians. Load average (1 min) at "
        f"the runs: median {statistics.median(loads):.2f}, range {min(loads):.2f}-{max(loads):.2f}. "
        f"Machine: {_machine(r['machine'])}.\n\n"
        + _table(["benchmark", "solver", "fits", "median after/before", "range", "summed s before",
                  "summed s after", "same passes"], rows)
        + "\n\nThe --quick fits take 0.05-2 s each and this shared VM's speed drifts by tens of per cent from one "
        "minute to the next, so these ratios move from run to run of the same command (a whole round of one version "
        "runs before the other's); the interleaved in-process fits of the next section are the measurement to "
        "read. The passes column is exact: a solver whose passes changed has changed behaviour.\n"
    )


def render_ab_fits() -> str:
    r = _load("ab_fits.json")
    head = "## Before and after a change: interleaved fits (`python benchmarks/ab_fits.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    loads = [e[k] for e in r["rounds"] for k in ("load_before", "load_after")]
    rows = [[row["solver"], f"{row['median_ratio']:.2f}", f"{row['min_ratio']:.2f}-{row['max_ratio']:.2f}",
             row["before_s"], row["after_s"]] for row in r["solvers"]]
    return head + (
        f"Commit {r['commits']['before']} (before) against {r['commits']['after']} (after), `{r['command']}`: "
        f"{len(r['rounds'])} rounds, each one process per version back to back timing six fits of every solver "
        "(median of the last five) on ringnorm n = 200, M = 100 with the real engine on one thread. Per solver: "
        f"the median over rounds of the after/before ratio of a pair. Load average (1 min) at the runs: median "
        f"{statistics.median(loads):.2f}, range {min(loads):.2f}-{max(loads):.2f}. Machine: {_machine(r['machine'])}.\n\n"
        + _table(["solver", "median after/before", "range over rounds", "median s before", "median s after"], rows)
        + "\n\nThe range shows the machine: the same fit varies by tens of per cent between rounds minutes apart, "
        "so a median within that range is no measurable change.\n"
    )



# ---- factor banks (issue 17) ----------------------------------------------------------------------
def render_factor() -> str:
    head = "## Factor banks: MKL at large n (`python benchmarks/bench_factor.py`)\n\n"
    parts = [head + (
        "Every kernel stored as L_m (n x r, float32), K~_m = L_m L_m^T, Nystrom on k-means++ landmarks drawn "
        "per kernel (`build_bank(..., rank=r)`); generated ringnorm, Gaussian kernels on random feature subsets, "
        "unit trace; SpicyMKL logistic (block-1, C = 0.05, tol 1e-3); prediction through the fitted model's "
        "landmarks. Each item runs in its own process; peak RSS is that process's ru_maxrss.\n")]
    s = _load("bench_factor_scale.json")
    if s is None:
        parts.append("### Scale (`--scale`)\n\nNot recorded yet.\n")
    else:
        x = s["result"]
        parts.append(
            f"### Scale (`--scale`): n = {x['n']:,}, M = {x['M']:,}, r = {x['rank']}, {x['n_test']:,} test rows\n\n"
            f"Machine: {_machine(s['machine'])}; load average at record {s['machine'].get('load_average_at_record')}.\n\n"
            + _table(["build s", "fit s", "predict s", "total s", "peak RSS GB", "bank GB", "passes", "active",
                      "gap", "test accuracy", "model bytes", "approx. error median / max"],
                     [[x["build_s"], x["fit_s"], x["predict_s"], x["total_s"], x["peak_rss_GB"], x["bank_GB"],
                       x["passes"], x["active"], x["gap"], x["accuracy"], x["model_bytes"],
                       f"{x['approx_error_rel']['median']:.3g} / {x['approx_error_rel']['max']:.3g}"]])
            + f"\n\nTargets: total under {s['targets']['total_s']} s, peak RSS under {s['targets']['peak_rss_GB']} GB.\n")
    sl = _load("bench_factor_n_slope.json")
    if sl is None:
        parts.append("### Fit time against n (`--n-slope`)\n\nNot recorded yet.\n")
    else:
        parts.append(
            "### Fit time against n (`--n-slope`)\n\n"
            f"Machine: {_machine(sl['machine'])}.\n\n"
            + _table(["n", "M", "r", "build s", "fit s", "passes", "active", "gap", "test accuracy"],
                     [[x["n"], x["M"], x["rank"], x["build_s"], x["fit_s"], x["passes"], x["active"], x["gap"],
                       x["accuracy"]] for x in sl["rows"]])
            + f"\n\nSlope of log fit time against log n: **{sl['slope_fit_s']:.2f}** (target <= {sl['target_slope']}; "
            f"dense banks before this issue: {sl['dense_slope_before']}).\n")
    a = _load("bench_factor_accuracy.json")
    if a is None:
        parts.append("### Accuracy against dense (`--accuracy`)\n\nNot recorded yet.\n")
    else:
        rows = [[x["dataset"], x["n"], x["solver"], x["rank"], x["accuracy"],
                 x.get("accuracy_minus_dense", 0.0) * 100, x.get("approx_error_rel", {}).get("median", 0.0),
                 x["fit_s"], x["gap"]] for x in a["rows"]]
        parts.append(
            "### Accuracy against dense (`--accuracy`)\n\n"
            f"Machine: {_machine(a['machine'])}.\n\n"
            + _table(["dataset", "n", "solver", "rank", "test accuracy", "minus dense (points)",
                      "approx. error median", "fit s", "gap"], rows)
            + "\n\nTarget: within 0.5 accuracy points of the dense bank at a stated rank. "
            + _accuracy_verdict(a["rows"]) + "\n")
    lm = _load("bench_factor_larger_than_memory.json")
    if lm is not None:
        x = lm["result"]
        parts.append(
            f"### A bank larger than memory (`--larger-than-memory`): n = {x['n']:,}, M = {x['M']:,}, r = {x['rank']}\n\n"
            f"Machine: {_machine(lm['machine'])}.\n\n"
            + _table(["bank GB", "build s", "fit s", "passes", "active", "gap", "peak RSS GB"],
                     [[x["bank_GB"], x["build_s"], x["fit_s"], x["passes"], x["active"], x["gap"], x["peak_rss_GB"]]])
            + f"\n\nTarget: fit under {lm['targets']['fit_s']} s.\n")
    return "\n".join(parts)


def _accuracy_verdict(rows: list[dict]) -> str:
    """The smallest rank from which every larger recorded rank is within 0.5 points of dense, per
    (dataset, n, solver), and the smallest rank that does it for all of them."""
    groups: dict = {}
    for x in rows:
        if x["rank"] != "dense":
            groups.setdefault((x["dataset"], x["n"], x["solver"]), []).append((int(x["rank"]), x["accuracy_minus_dense"]))
    within = {}
    for key, pts in groups.items():
        pts.sort()
        ok = [r for i, (r, _) in enumerate(pts) if all(d >= -0.005 for _, d in pts[i:])]
        within[key] = ok[0] if ok else None
    cells = [f"{d} n={n} {s}: {'r >= ' + str(r) if r else 'not within at any recorded rank'}"
             for (d, n, s), r in sorted(within.items())]
    ranks = [r for r in within.values()]
    overall = (f"Every dataset, size and solver is within 0.5 points from rank {max(ranks)} on."
               if ranks and None not in ranks else "Not every dataset, size and solver is within 0.5 points at the recorded ranks.")
    return overall + " Per case (from this rank on, every recorded larger rank is within): " + "; ".join(cells) + "."


def render_smo_factor() -> str:
    r = _load("bench_smo_factor.json")
    head = "## SMO-MKL on factor engines (`python benchmarks/bench_smo_factor.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    st = r["settings"]
    rows = [[x["n"], x["seconds"], x["passes"], x["smo_steps"], x["n_active"], x["gap"], x["objective"],
             x.get("dense_seconds", "-"), x.get("objective_rel_diff", "-")] for x in r["runs"]]
    return head + (
        f"In-memory factor engine, ringnorm, M = {st['M']}, r = {st['r']}, C = {st['C']}; the dense engine of the "
        f"same K~ = L L^T where it fits.\nMachine: {_machine(r['machine'])}.\n\n"
        + _table(["n", "fit s", "passes", "SMO steps", "active", "gap", "objective", "dense engine s",
                  "objective rel. diff"], rows)
        + ("\n\nSkipped: " + "; ".join(map(str, r["skipped"])) if r.get("skipped") else "") + "\n")


def render_peers_factor() -> str:
    r = _load("bench_peers_factor.json")
    head = ("## Large n side by side with MKLpy (`python benchmarks/bench_peers.py --tasks ringnorm --n 8000 --M 20 "
            "--rank 128 ...`)\n\n")
    if r is None:
        return head + "Not recorded yet.\n"
    out = [head + f"Machine: {_machine(r['machine'])}; load average at start {r['load_average_at_start']}.\n"]
    for g in r["grid"]:
        rows = []
        for side, label in (("mklpy", "MKLpy"), ("ours", "ours, dense bank"), ("ours_factor", "ours, factor bank")):
            for m, x in g.get(side, {}).items():
                if x.get("status") == "ok":
                    rows.append([label, m, x["fit_seconds"], x.get("predict_seconds", 0.0), x["peak_rss_GB"],
                                 x["test_accuracy"]])
                else:
                    rows.append([label, m, x.get("status"), "-", "-", x.get("message", "")[:80]])
        f = g.get("factor", {})
        out.append(
            f"{g['task']}, n = {g['n']:,}, M = {g['M']}, {g['n_test']} test rows; dense bank {g['bank_GB']:.2f} GB "
            f"(build {g['build_seconds']:.0f} s)" + (
                f"; factor bank r = {f['rank']}: {f['bank_GB']:.3f} GB (build {f['build_seconds']:.0f} s), "
                f"approximation error median {f['approx_error']['median']:.3g}, max {f['approx_error']['max']:.3g}"
                if f else "") + ".\n\n"
            + _table(["side", "method", "fit s", "predict s", "peak RSS GB", "test accuracy"], rows) + "\n")
    return "\n".join(out)


def render_spicy_newton() -> str:
    r = _load("bench_spicy_newton.json")
    head = "## SpicyMKL's Newton step on dense banks (`python benchmarks/bench_spicy_newton.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    p = r["params"]
    rows = [[x["n"], x["M"], x["old"]["seconds"], x["new"]["seconds"], x["speedup"], x["objective_rel_difference"],
             f"{x['old']['newton']} / {x['new']['newton']}", f"{x['old']['outer']} / {x['new']['outer']}"]
            for x in r["rows"]]
    return head + (
        f"ringnorm, {p['kernels']}; SpicyMKL {p['loss']}, {p['penalty']} (block-1), C = {p['C']}, tol {p['tol']}; "
        f"old = the dense Cholesky Newton solve (`newton_solver='{p['backends']['old']}'`), new = "
        f"`newton_solver='{p['backends']['new']}'` (Woodbury on pivoted Cholesky factors of the held kernels when "
        "their summed rank is small, else Newton-CG), run back to back in one process "
        f"({p['repeats']} repeat each).\nMachine: {_machine(r['machine'])}.\n\n"
        + _table(["n", "M", "old s", "new s", "speed-up", "objective rel. diff", "Newton steps old / new",
                  "outer its old / new"], rows)
        + "\n\nTarget (issue 17): n = 4000, M = 100 under 60 s (before: over 240 s).\n")


def render_objstore() -> str:
    name = "bench_objstore.json"
    r = _load(name)
    if r is None:
        r, name = _load("bench_objstore_quick.json"), "bench_objstore_quick.json"
    if r is None:
        return ""
    b, p, c = r["build"], r["pass"], r["client"]
    return (
        f"\n## Banks on an object store (`python benchmarks/bench_objstore.py`)\n\n"
        f"A dense bank of M = {r['M']} kernels at n = {r['n']} ({r['bank_MB']:.0f} MB, float32) on {r['server']}, "
        "against plain requests of the same bytes with the same client (obstore) in the same run; the local-disk "
        f"bank for comparison. Medians of the repeats.\nMachine: {_machine(r['machine'])}; load average "
        f"{r['machine'].get('load_average_at_record', '?')} on {r['machine']['cores']} cores (a shared machine: the "
        f"ratios, measured in one run, are the figures to read) (`results/{name}`).\n\n"
        + _table(["what", "ours MB/s", "plain requests MB/s", "ratio", "local disk MB/s"],
                 [["build (s3://)", b["s3_MBps"], b["plain_put_MBps"], b["ratio_to_plain_put"], b["local_disk_MBps"]],
                  ["quad_forms pass (s3://)", p["s3_quad_forms_MBps"], p["plain_ranged_get_MBps"],
                   p["ratio_to_plain_get"], p["local_quad_forms_MBps"]]])
        + f"\n\nTarget: the pass at >= {p['target']}x plain concurrent ranged GETs. Client choice (one 64 MB object): "
        f"obstore {c['obstore_1_get_MBps']:.0f} MB/s one GET, {c['obstore_8_ranges_MBps']:.0f} MB/s eight 8 MB ranges; "
        f"s3fs (zarr's fsspec store's client) {c['s3fs_1_get_MBps']:.0f} and {c['s3fs_8_ranges_MBps']:.0f} MB/s. "
        "A local server is bounded by this machine's CPU and loopback; how the figures change on a cloud store "
        "(per-request latency, bandwidth per worker) is stated as a model in docs/design.md, \"Storage backends\".\n")


def _mutation_table(before: dict, after: dict) -> str:
    rows = [[t, before["targets"].get(t, {}).get("mutants", "-"), before["targets"].get(t, {}).get("survived", "-"),
             a["mutants"], a["survived"]] for t, a in after["targets"].items()]
    return _table(["target", "mutants before", "survived before", "mutants after", "survived after"], rows)


def render_mutation() -> str:
    before, after = _load("mutation_before.json"), _load("mutation_after.json")
    if before is None or after is None:
        return ""
    text = ("\n## Mutation testing of the solver cores (`python benchmarks/mutation.py`, docs/mutation-testing.md)\n\n"
            "Targeted mutants of the certificate and bound code, run against the tests that cover each target, "
            "before and after the certificate tests of issue 21; which survivors are equivalent is argued in "
            "docs/mutation-testing.md.\n\n" + _mutation_table(before, after) + "\n")
    eb, ea = _load("mutation_engine_before.json"), _load("mutation_engine_after.json")
    if eb is not None and ea is not None:
        text += ("\nThe engine's readers and row-by-row sweep (`--targets reader_direct,pread_direct,reader_view,"
                 "quad_stream`), before and after the tests written for their survivors (a refused O_DIRECT, a read past "
                 "the end of a shard file, page-aligned pieces); before, the O_DIRECT read loop of `pread_direct` was "
                 "part of `reader_direct`:\n\n" + _mutation_table(eb, ea) + "\n")
    return text


from readme_first_hour import render_cv_path, render_defaults, render_quickstart  # noqa: E402
from readme_reliability import render_read_integrity  # noqa: E402

RENDERERS: list[Callable[[], str]] = [render_quickstart, render_defaults, render_cv_path, render_read_integrity, render_build, render_pass, render_pass_big, render_spicy, render_spicy_uci,
                                      render_spicy_ooc, render_smo_citi, render_pfbs, render_sgd_gcd,
                                      render_peers, render_scaling, render_checkpoint, render_compare_versions,
                                      render_ab_fits, render_factor, render_spicy_newton, render_smo_factor,
                                      render_peers_factor, render_objstore, render_mutation]

HEADER = """# Benchmarks

Every figure below is generated from the JSON files in `results/` by `python benchmarks/make_readme.py`;
re-run a benchmark, then that script, to update this page. Timings are medians on the machine
described in each section; performance is reported as ratios measured in the same run (ours versus
reading or writing the same bytes with numpy; ours versus a peer on the same bank), because the
machines are shared and noisy.

"""


def main() -> None:
    text = HEADER + "\n".join(render() for render in RENDERERS)
    (HERE / "README.md").write_text(text)
    print(f"wrote {HERE / 'README.md'}")


if __name__ == "__main__":
    main()
