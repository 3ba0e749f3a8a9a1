"""benchmarks/README.md sections of the solvers: SpicyMKL, PFBS, SGD/GCD, SMO/Citi, factor banks."""

from __future__ import annotations

import statistics

import numpy as np

from readme_common import _load, _machine, _table


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


# ---- factor banks (issue 17) ----------------------------------------------------------------------
#: the solvers that form kernels as n x n matrices: an SVM on a combined kernel sum_m w_m K_m, or (sgd) each
#: sampled kernel added into its n x n iterate
FORMS_COMBINED = ("uniform", "easymkl", "alignment", "citi", "sgd")


def _factor_vs_dense() -> str:
    """``--vs-dense``: every solver at its defaults on the dense bank and on factor banks of the same kernels."""
    title = "### Factor banks against the dense bank, every solver (`--vs-dense`)\n\n"
    v = _load("bench_factor_vs_dense.json")
    if v is None:
        return title + "Not recorded yet.\n"
    import statistics

    floors = {(f["dataset"], f["n"]): f for f in v.get("combine_floor", [])}
    rows, slower, bound, harder = [], [], [], []
    for x in v["rows"]:
        ratio = None if x["ratios_to_dense"] is None else statistics.median(x["ratios_to_dense"])
        rows.append([x["dataset"], x["n"], x["solver"], x["rank"], f"{x['bank_bytes'] / 1e6:.0f}", x["median_s"],
                     "-" if ratio is None else f"{ratio:.2f}", x["accuracy"], x["gap"], x["converged"]])
        if ratio is not None and ratio > 1.0:
            slower.append(f"{x['solver']} on {x['dataset']} at rank {x['rank']} ({ratio:.2f})")
            if x["solver"] not in FORMS_COMBINED and "iterations" in x:
                dense = next(d for d in v["rows"] if d["rank"] == "dense" and d["solver"] == x["solver"]
                             and (d["dataset"], d["n"]) == (x["dataset"], x["n"]))
                unit = "SMO steps" if x["smo_steps"] else "iterations"
                work = (lambda row: row["smo_steps"] or row["iterations"])
                harder.append(f"{x['solver']} at rank {x['rank']} took {work(x):,} {unit} against {work(dense):,} on "
                              f"the dense bank ({x['median_s'] / work(x) * 1e6:.0f} against "
                              f"{dense['median_s'] / work(dense) * 1e6:.0f} us each)")
            floor = floors.get((x["dataset"], x["n"]), {})
            if x["solver"] in FORMS_COMBINED and floor.get(f"blas_r{x['rank']}", 0.0) > floor.get("dense", np.inf):
                bound.append(f"{x['solver']} at rank {x['rank']}")
    factor_rows = sum(x["ratios_to_dense"] is not None for x in v["rows"])
    floor_text = ""
    if floors:
        ranks = sorted({int(k[len("blas_r"):]) for f in floors.values() for k in f if k.startswith("blas_r")})
        floor_rows = [[d, n, f["dense"], *[f"{f[f'engine_r{r}']:.3g} / {f[f'blas_r{r}']:.3g}" for r in ranks]]
                      for (d, n), f in floors.items()]
        over_floor = [f[f"engine_r{r}"] / f[f"blas_r{r}"] for f in floors.values() for r in ranks]
        floor_text = (
            "\n\n**The floor of forming kernels as n x n matrices.** uniform, easymkl, alignment and citi (at every "
            "iteration) fit an SVM on sum_m w_m K_m, formed as an n x n matrix; sgd adds each sampled kernel into its "
            "n x n iterate. From the dense bank that is n^2 additions per kernel of stored entries; from factors it "
            "is n^2 r multiply-adds per kernel, whatever code does it. Seconds to "
            "form sum_m K_m / M (medians of the rounds): the dense bank's `engine.combine`, and per rank the factor "
            "bank's `engine.combine` / the floor, one float32 BLAS product F F^T of factors already in memory:\n\n"
            + _table(["dataset", "n", "dense bank"] + [f"rank {r}: engine / BLAS floor" for r in ranks], floor_rows)
            + "\n\n" + (f"Where the floor alone is slower than the dense bank's combine, a solver whose work is "
                         f"forming that kernel cannot meet the target on this machine: {', '.join(bound)}. "
                         "Above the dense cap (`lowrank.dense_ok`) the SVM-based ones already skip it: liblinear on "
                         "the features F (`_svm.fit_linear_svc`, O(n M r) per epoch), whose bias is regularised, "
                         "a slightly different problem from libsvm's; below the cap they keep libsvm's exact "
                         "problem and pay the floor. The engine's combine is float64 (the precision the solvers "
                         "certify their gaps in), one float64 BLAS product per combine block: "
                         f"{min(over_floor):.1f} to {max(over_floor):.1f}x the float32 floor." if bound else
                         "The floor is below the dense bank's combine at every recorded rank."))
    if harder:
        floor_text += ("\n\nThe other slower rows solve a harder problem, not with slower steps (the low-rank "
                       f"kernels are other kernels): {'; '.join(harder)} (the whole fit's seconds over its steps).")
    return (title + (f"`{v['command']}`. " if "command" in v else "") + f"Machine: {_machine(v['machine'])}; load average at record "
            f"{v['machine'].get('load_average_at_record')}.\n\n"
            f"Each solver at its defaults (`fit_solver(name, engine, y, 'classification')`), M = {v['M']} Gaussian "
            f"kernels on random feature subsets, on the dense float32 bank and on factor banks of the same specs; "
            f"{v['repeats']} rounds, each fitting on the dense bank and then on each factor bank in turn; seconds are "
            "medians, the ratio is the median over rounds of factor / dense (below 1: the factor bank is faster). "
            "Every factor bank here is the smaller one (bank MB). Target (issue 32): no solver slower on a factor "
            f"bank than on the dense bank whenever the factor bank is smaller: {factor_rows - len(slower)} of "
            f"{factor_rows} factor rows meet it"
            + (f"; slower: {', '.join(slower)}" if slower else "") + ".\n\n"
            + _table(["dataset", "n", "solver", "rank", "bank MB", "fit s", "factor / dense", "test accuracy", "gap",
                      "converged"], rows) + floor_text + "\n")


def _factor_targets(s: dict) -> str:
    t = s["targets"]
    parts = [f"total under {t['total_s']} s"]
    if "peak_rss_GB" in t:
        parts.append(f"peak RSS under {t['peak_rss_GB']} GB")
    if "active" in t:
        parts.append(f"at least {t['active']} kernels active (working set up to {s['result'].get('working_set_bytes')})")
    return "Targets: " + ", ".join(parts) + (f" ({t['note']})" if "note" in t else "") + "."


def render_factor() -> str:
    head = "## Factor banks: MKL at large n (`python benchmarks/bench_factor.py`)\n\n"
    parts = [head + (
        "Every kernel stored as L_m (n x r, float32), K~_m = L_m L_m^T, Nystrom on k-means++ landmarks drawn "
        "per kernel (`build_bank(..., rank=r)`); generated ringnorm, Gaussian kernels on random feature subsets, "
        "unit trace; SpicyMKL logistic (`--half-million-hinge`: the hinge loss, the loss SMO-MKL fits; "
        "`--half-million-smo`: SMO-MKL's problem (P) at C = 100 (SpicyMKL's hinge problem at lam ~ 24), whose \"auto\" method on a factor bank "
        "this large is the primal one, `method=\"primal\"`, `smo_primal.py`, its gap SMO-MKL's own) (block-1, "
        "C = 6e-5 n: 3 at n = 50,000, 30 at n = 500,000; `--many-active`: "
        "C = 0.0018 C_max, C_max = `spicy.c_max`, one pass counted in the fit; tol 1e-3; on a factor bank its "
        "\"auto\" method is the primal block descent, `method=\"bcd\"`, shown as method); prediction through the "
        "fitted model's landmarks. Each item runs in its own process; peak RSS is that process's ru_maxrss.\n")]
    for name, flag in (("bench_factor_scale.json", "--scale"), ("bench_factor_half_million.json", "--half-million"),
                       ("bench_factor_half_million_hinge.json", "--half-million-hinge"),
                       ("bench_factor_half_million_smo.json", "--half-million-smo"),
                       ("bench_factor_many_active.json", "--many-active")):
        s = _load(name)
        if s is None:
            parts.append(f"### `{flag}`\n\nNot recorded yet.\n")
            continue
        x = s["result"]
        parts.append(
            f"### `{flag}`: n = {x['n']:,}, M = {x['M']:,}, r = {x['rank']}, {x['n_test']:,} test rows\n\n"
            f"Machine: {_machine(s['machine'])}; load average at record {s['machine'].get('load_average_at_record')}.\n\n"
            + _table(["solver", "loss", "method", "C", "build s", "fit s", "predict s", "total s", "peak RSS GB", "bank GB", "passes",
                      "active", "gap", "test accuracy", "model bytes", "approx. error median / max"],
                     [[x.get("solver", "spicy"), x.get("loss") or "logistic", x.get("method") or "proximal", x.get("C", "-"), x["build_s"], x["fit_s"], x["predict_s"],
                       x["total_s"], x["peak_rss_GB"], x["bank_GB"], x["passes"], x["active"], x["gap"], x["accuracy"],
                       x["model_bytes"], f"{x['approx_error_rel']['median']:.3g} / {x['approx_error_rel']['max']:.3g}"]])
            + "\n\n" + _factor_targets(s) + "\n")
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
    parts.append(_factor_vs_dense())
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


def render_lowrank_floor() -> str:
    """Factor banks' test accuracy beside the best rank-r approximation's (bench_lowrank_floor.py)."""
    title = "## Low-rank accuracy against its floor (`python benchmarks/bench_lowrank_floor.py`)\n\n"
    d = _load("bench_lowrank_floor.json")
    if d is None:
        return title + "Not recorded yet.\n"
    methods = [m for m in ("best rank-r", "nystrom k-means++", "nystrom uniform", "nystrom rls", "cholesky tol 1e-3")
               if any(x["method"] == m for x in d["rows"])]
    parts = [title + "SMO-MKL at its defaults on M Gaussian kernels over random feature subsets (the protocol of "
             "`bench_factor.py --accuracy`, 2000 test rows): the dense bank, the **best rank-r** approximation of "
             "every kernel (truncated eigendecomposition, the floor: Eckart-Young-Mirsky; new points by the Nystrom "
             "extension over all training rows) and the factor banks at the same rank: Nystrom on k-means++, uniform "
             "or ridge-leverage-score landmarks (recursive RLS-Nystrom, Musco & Musco 2017) and pivoted Cholesky to "
             "relative residual trace 1e-3 (at most r columns). Cells: test accuracy minus the dense bank's, in points, "
             "then the median relative trace error (tr K - tr K~) / tr K of the kernels. Target: every method within "
             "0.5 points of dense at the smallest rank where the best rank-r approximation is (0.5 points = 10 of "
             "the 2000 test rows: differences of that size are within what a change of landmarks alone moves)."]
    datasets = sorted({(x["dataset"], x["n"], x["M"]) for x in d["rows"]})
    verdicts = []
    for name, n, M in datasets:
        rows = [x for x in d["rows"] if (x["dataset"], x["n"], x["M"]) == (name, n, M)]
        dense = next(x for x in rows if x["method"] == "dense")
        ranks = sorted({x["rank"] for x in rows if x["rank"] != "dense"})
        cell = {(x["method"], x["rank"]): x for x in rows}
        table = [[r] + [f"{cell[m, r]['accuracy_minus_dense']:+.2f}; {cell[m, r]['approx_error_median']:.3f}"
                        if (m, r) in cell else "" for m in methods] for r in ranks]
        parts.append(f"**{name}**, n = {n}, M = {M}: dense test accuracy {dense['accuracy']:.4f} "
                     f"(fit {dense['fit_s']:.1f} s, {dense['active']} kernels kept).\n\n"
                     + _table(["rank"] + methods, table))
        floor = next((r for r in ranks if ("best rank-r", r) in cell
                      and cell["best rank-r", r]["accuracy_minus_dense"] >= -0.5 - 1e-9), None)
        if floor is None:
            verdicts.append(f"{name}: the best rank-r approximation is not within 0.5 points at any recorded rank")
            continue
        missed = [f"{m} ({cell[m, floor]['accuracy_minus_dense']:+.2f} points, trace error "
                  f"{cell[m, floor]['approx_error_median']:.3f} against the floor's "
                  f"{cell['best rank-r', floor]['approx_error_median']:.3f})"
                  for m in methods[1:] if (m, floor) in cell and cell[m, floor]["accuracy_minus_dense"] < -0.5 - 1e-9]
        verdicts.append(f"{name}: the floor is within 0.5 points from r = {floor}; there "
                        + ("every method is too" if not missed else "missed by " + ", ".join(missed)))
    parts.append("Verdict per dataset: " + "; ".join(verdicts) + ".")
    parts.append(f"Machine: {_machine(d['machine'])}; load average {d['machine'].get('load_average_at_record')} at the "
                 f"start, {d['machine'].get('load_average_at_end')} at the end.\n")
    return "\n\n".join(parts)
