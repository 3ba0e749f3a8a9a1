"""benchmarks/README.md sections of issue 32: where the time of a SpicyMKL fit on a factor bank goes
(profile_factor.py), before/after ratios of its changes, and skglm as a group-lasso peer (bench_skglm.py)."""

from __future__ import annotations

from readme_common import RESULTS, _load, _table, machine_with_load


def render_profile_factor() -> str:
    head = "## Where a factor-bank fit spends its time (`python benchmarks/profile_factor.py`)\n\n"
    r = _load("profile_factor.json")
    if r is None:
        return head + "Not recorded yet.\n"
    out = [head + (
        "SpicyMKL's proximal method (logistic, block-1, C = 6e-5 n, tol 1e-3; before the primal block descent became \"auto\" on factor banks) on the factor bank of issue 32: ringnorm, M Gaussian "
        "kernels on random feature subsets, rank r, float32. The fit runs once plainly (fit s) and once under "
        "cProfile with timers around its phases (inclusive seconds; indented phases are inside the one above; "
        "\"other\" is the fit outside the top-level phases: proximal updates, the gamma schedule, logging). "
        + machine_with_load(r["machine"]) + "\n")]
    for x in r["rows"]:
        rows = [[("&nbsp;&nbsp;" if p["parent"] else "") + p["phase"], p["seconds"], p["calls"],
                 100.0 * p["seconds"] / x["fit_profiled_s"]] for p in x["phases"]]
        rows.append(["other", x["other_s"], "-", 100.0 * x["other_s"] / x["fit_profiled_s"]])
        top = [[f["function"], f["calls"], f["tottime_s"], f["cumtime_s"]] for f in x["top_functions"][:8]]
        out.append(
            f"### n = {x['n']:,}, M = {x['M']}, r = {x['rank']}, C = {x['C']:.3g}\n\n"
            f"Fit {x['fit_s']:.2f} s ({x['fit_profiled_s']:.2f} s profiled); bank {x['bank_GB']:.3f} GB ("
            + (f"build {x['build_s']:.0f} s" if x["build_s"] >= 1.0 else "built before, reused") + "); "
            f"{x['passes']} passes, {x['outer_iterations']} outer iterations, "
            f"{x['newton_steps']} Newton steps, {x['active']} kernels active, gap {x['gap']:.2g}; working set per "
            f"outer iteration {x['working_set']}.\n\n"
            + _table(["phase", "seconds", "calls", "% of profiled fit"], rows)
            + "\n\nFunctions with the most own time (cProfile tottime):\n\n"
            + _table(["function", "calls", "own s", "cumulative s"], top) + "\n")
    ab = _load("profile_factor_ab.json")
    if ab is not None:
        rows = [[x["n"], x["M"], x["rank"], x["rounds"], x["before_s"], x["after_s"], x["ratio_after_before"],
                 " / ".join(f"{v:.2f}" for v in x["ratios"]),
                 f"{x['runs']['before'][0]['newton_steps']} / {x['runs']['after'][0]['newton_steps']}",
                 f"{x['runs']['before'][0]['objective']:.7g} / {x['runs']['after'][0]['objective']:.7g}"]
                for x in ab["rows"]]
        out.append(
            "### Before and after (`--ab`)\n\n"
            f"The same fit in the package under `{ab['before']}` (before"
            + (f": {ab['before_note']}" if ab.get("before_note") else "") + ") and in this checkout (after), one "
            "process per fit, alternating before, after, before, ...; the ratio is the median of the pairs' "
            f"after / before. {machine_with_load(ab['machine'])}\n\n"
            + _table(["n", "M", "r", "pairs", "before s", "after s", "after / before", "pair ratios", "Newton steps",
                      "objective"], rows)
            + ("" if "machine_n50000" not in ab else
               f"\n\nThe n = 50,000 row is a separate run: {machine_with_load(ab['machine_n50000'])}") + "\n")
    return "\n".join(out)


def render_profile_bcd() -> str:
    head = "## Where a block-descent fit spends its time (`python benchmarks/profile_bcd.py`)\n\n"
    r = _load("profile_bcd.json")
    if r is None:
        return head + "Not recorded yet.\n"
    runs = r["rows"]
    label = [f"n = {x['n']:,}, {x['loss']}, {x['C_fraction']:g} C_max, " + ("Gram" if x["gram"] else "no Gram")
             for x in runs]
    depth: dict[str, int] = {}   # a phase is indented one step further than the phase it is inside
    for p in runs[0]["phases"]:
        depth[p["phase"]] = 0 if p["parent"] is None else depth[p["parent"]] + 1
    rows = [["&nbsp;&nbsp;" * depth[p["phase"]] + p["phase"]]
            + [f"{x['phases'][i]['seconds']:.1f} ({x['phases'][i]['calls']})" for x in runs]
            for i, p in enumerate(runs[0]["phases"])]
    rows.append(["fit (profiled)"] + [f"{x['fit_profiled_s']:.1f}" for x in runs])
    rows.append(["epochs / Newton steps"] + [f"{x['epochs']} / {x['newton_steps']}" for x in runs])
    rows.append(["active / gap"] + [f"{x['active']} / {x['gap']:.1e}" for x in runs])
    rows.append(["working set sizes"] + [", ".join(map(str, x["working_set"])) for x in runs])
    machines = sorted({machine_with_load(x["machine"]) for x in runs})
    return head + (
        "SpicyMKL's primal block descent (`bcd.py`, what \"auto\" runs on factor banks) on bench_skglm.py's "
        "problem (ringnorm, M Gaussian kernels on random feature subsets, float32 factors of rank 64), tol 1e-5, "
        "under cProfile: inclusive seconds (calls) of the solver's phases, indented ones inside the one above "
        "(profile_bcd.py's docstring names the function behind each). \"no Gram\" is the fit with the square "
        "loss's Newton-CG products over the factors (two passes over the nonzero blocks' factors per CG "
        "iteration), as before `_factor_gram.py`; \"Gram\" multiplies by the Gram of W's centred factors instead. "
        + " ".join(machines) + "\n\n" + _table(["phase"] + label, rows) + "\n")


def render_skglm() -> str:
    head = "## skglm on the same group lasso (`python benchmarks/bench_skglm.py`)\n\n"
    names = sorted(p.name for p in RESULTS.glob("bench_skglm*.json") if "quick" not in p.name)
    if not names:
        return head + "Not recorded yet.\n"
    out = [head + (
        "SpicyMKL's block-1 problem on a factor bank, sum_i loss(y_i, sum_m L_m v_m + b) + C sum_m ||v_m||, is "
        "the group lasso over Phi = [L_1 ... L_M] with groups of r columns and an unpenalised intercept; skglm "
        "solves it as LogisticGroup (GroupProxNewton) or QuadraticGroup (GroupBCD) with WeightedGroupL2 at "
        "alpha = C / n (its datafits are means over the n points; tests/test_skglm_peer.py checks both the "
        "scaling and the optimum). Ringnorm, Gaussian kernels on random feature subsets, float32 factors (skglm "
        "gets them widened to float64, outside its timing); C = fraction x C_max. Each row alternates ours and "
        "skglm; seconds are medians, skglm / ours the median of the pairs' ratios (> 1: ours faster); P diff = "
        "(P_skglm - P_ours) / P_ours in our units. skglm runs in a process of its own (`peers/skglm_run.py`); "
        "with `--skglm-cap` it is stopped after that many seconds of solving: its seconds then read '> cap', "
        "its ratio '>= cap / ours' (a lower bound; a stopped run is not repeated), P diff is the last "
        "objective it printed, and 'ours to that objective' is when the model of one of our epochs (the fit's "
        "history: SpicyMKL's model from the epoch's dual point, what the fit returns when that epoch is "
        "certified) first had an objective that low, so cap / that is skglm / ours at equal objective (plots: "
        "`results/<name>.png`; that model's objective rises where kernels join the working set, the iterate's "
        "own does not). 'skglm to 1e-5' is when skglm's printed objective (every outer iteration, "
        "proximal Newton step or 10th epoch) first came within 1e-5 relative of ours (- where not recorded, "
        "never where it did not).\n")]
    for name in names:
        r = _load(name)
        st = r["settings"]
        rows = [[x["n"], x["loss"], f"{x['C_fraction']:.3g}", x["C"], x["ours_active"],
                 "-" if x["skglm_active"] is None else x["skglm_active"], x["ours_s"],
                 x["skglm_s"] if x.get("skglm_finished", True) else f"> {x['skglm_s']:.0f}",
                 _skglm_reached(x), x["speedup"] if x.get("skglm_finished", True) else f">= {x['speedup']:.3g}",
                 _ours_to_level(x),
                 x["ours_gap"], f"{x['objective_rel_diff']:+.1e}", x["ours_passes"],
                 x.get("ours_method", "proximal")] for x in r["rows"]]
        out.append(
            f"`results/{name}`: skglm {r['skglm_version']}, M = {st['M']}, r = {st['rank']}, ours to a certified "
            f"relative gap of {st['tol']:g}, skglm to its tol {st['skglm_tol']:g}, {_runs(r)}. "
            + machine_with_load(r["machine"]) + "\n\n"
            + _table(["n", "loss", "C / C_max", "C", "active (ours)", "active (skglm)", "ours s", "skglm s",
                      "skglm to 1e-5 s", "skglm / ours", "ours to that objective s (skglm / ours)", "our gap", "P diff", "our passes", "our method"], rows) + "\n")
    return "\n".join(out)


def _runs(record: dict) -> str:
    """How many runs each side made: skglm once where it was stopped at its cap (a second would hit it too)."""
    repeats = record["settings"]["repeats"]
    if all(x.get("skglm_finished", True) for x in record["rows"]):
        return f"{repeats} runs each"
    return f"ours {repeats} runs, skglm one run stopped at its cap of {record['settings']['skglm_cap']:g} s"


def _ours_to_level(row: dict) -> str:
    """For a row whose skglm run was stopped at its cap: when the model of one of our epochs first had the objective skglm
    had then, and cap / that (skglm / ours at equal objective); '-' for finished or older rows."""
    t = row.get("ours_to_skglm_level_s")
    if row.get("skglm_finished", True) or t is None:
        return "-"
    return f"{t:.3g} (>= {row['skglm_cap_s'] / t:.3g})"


def _skglm_reached(row: dict):
    """Seconds until skglm's objective came within 1e-5 of ours: '-' where not recorded, 'never' where not."""
    if "skglm_match_s" not in row:
        return "-"
    return "never" if row["skglm_match_s"] is None else row["skglm_match_s"]
