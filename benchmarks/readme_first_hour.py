"""The benchmarks/README.md sections of issue 28 (a user's first hour): defaults, CV along paths, the main job.

Each renderer turns one JSON file of ``results/`` into a markdown section; ``make_readme.py`` calls them.
"""

from __future__ import annotations

import statistics

from readme_common import _load
from readme_common import machine_with_load as _machine
from readme_common import plain_table as _table


def render_defaults() -> str:
    r = _load("bench_defaults.json")
    if r is None:
        return "\n## Defaults on the shipped datasets (`python benchmarks/bench_defaults.py`)\n\nnot recorded yet\n"
    fits = r["fits"]
    datasets = list(dict.fromkeys(f["dataset"] for f in fits))
    solvers = list(dict.fromkeys(f["solver"] for f in fits))
    cell = {(f["dataset"], f["solver"]): f for f in fits}
    rows = []
    for s in solvers:
        row = [s]
        for d in datasets:
            f = cell.get((d, s))
            row.append("" if f is None else f"{f['median_seconds']:.2f}{'' if f['converged'] else ' (!)'}")
        rows.append(row)
    slow = [f for f in fits if f["median_seconds"] > 10.0]
    unconverged = [f for f in fits if not f["converged"]]
    sizes = {d: next(f for f in fits if f["dataset"] == d) for d in datasets}
    head = ["solver"] + [f"{d} (n={sizes[d]['n_train']}, M={sizes[d]['M']})" for d in datasets]
    scores = [[s] + [f"{cell[(d, s)]['test_score']:.3f}" if (d, s) in cell else "" for d in datasets] for s in solvers]
    scores.append(["null model"] + [f"{sizes[d]['null_score']:.3f}" for d in datasets])
    text = (
        "\n## Defaults on the shipped datasets (`python benchmarks/bench_defaults.py`)\n\n"
        "Every solver at its defaults (`kernels=\"auto\"`, `C=\"auto\"`) on a stratified 75 % of each dataset; the "
        "bank is built once per dataset and reused, so a figure is the fit a user repeats: the solve of every "
        f"head and the model, median of {r['repeats']} fits, in seconds. (!) marks a fit that did not converge.\n\n"
        + _table(head, rows) + "\n\n"
        + f"{len(fits) - len(unconverged)} of {len(fits)} fits converged; "
        + (f"{len(slow)} took more than 10 s: " + ", ".join(f"{f['solver']} on {f['dataset']} "
                                                            f"({f['median_seconds']:.1f} s)" for f in slow)
           if slow else "every fit took less than 10 s") + ".\n\n"
        "Held-out score of the same fits (accuracy; R^2 for diabetes) beside the null model (the majority rate; "
        "the mean predictor's R^2 = 0):\n\n" + _table(["solver"] + datasets, scores) + "\n\n" + _machine(r["machine"])
        + "\n")
    return text


def render_cv_path() -> str:
    r = _load("bench_cv_path.json")
    if r is None:
        return "\n## Cross-validation along warm-started paths (`python benchmarks/bench_cv_path.py`)\n\nnot recorded yet\n"
    rows = []
    for d in r["datasets"]:
        for c in d["cases"]:
            m = c["median"]
            reached = sum(1 for v in c["warm_mean"] if v == v)     # values every fold reached (not NaN)
            split = (f"{c['fits_to_choice_s']:.2f} / {c['fits_past_choice_s']:.2f}"
                     if "fits_past_choice_s" in c else "-")
            rows.append([f"{d['dataset']} (n={d['n']}, M={d['M']})", c["solver"], f"{m['warm_cv']:.2f}", split,
                         f"{m['cold_cv']:.2f}", f"{m['one_fit']:.2f}", f"{c['warm_over_one_fit']:.1f}",
                         f"{c['cold_over_warm']:.1f}", f"{reached}/{len(c['grid'])}",
                         f"{c['chosen_warm']:.3g} / {c['chosen_cold']:.3g}"])
    cases = [(d, c) for d in r["datasets"] for c in d["cases"]]
    met = [f"{c['solver']} on {d['dataset']} ({c['warm_over_one_fit']:.1f})" for d, c in cases
           if c["warm_over_one_fit"] <= 3]

    def alone_over_target(part: str) -> list[str]:
        """The missed rows where the warm CV's solves ``part`` alone exceed 3 x one fit (x one fit)."""
        return [f"{c['solver']} on {d['dataset']} ({c[part] / c['median']['one_fit']:.1f})" for d, c in cases
                if c["warm_over_one_fit"] > 3 and part in c and c[part] > 3 * c["median"]["one_fit"]]

    past_alone, to_choice = alone_over_target("fits_past_choice_s"), alone_over_target("fits_to_choice_s")
    floor = ("" if not past_alone and not to_choice else
             " Where the seconds go (the column \"solves to / past the choice\": the warm CV's solves up to and "
             "including the chosen value, and after it): "
             + (f"the solves past the chosen value alone, which a path must make to see that its best is behind "
                f"it, exceed 3 x one fit on {', '.join(past_alone)} (x one fit)" if past_alone else "")
             + ("; " if past_alone and to_choice else "")
             + (f"the warm solves up to the chosen value alone exceed it on {', '.join(to_choice)}"
                if to_choice else "") + ".")
    return (
        "\n## Cross-validation along warm-started paths (`python benchmarks/bench_cv_path.py`)\n\n"
        f"{r['folds']}-fold CV over each solver's 10-value \"auto\" grid on one bank (the datasets' default "
        "\"auto\" bank): **warm** is the CV core of MKLClassifierCV and the pipelines (each fold a path from the "
        "most regularised value, every solve starting from the previous solution, the path stopped two values "
        "past the fold's peak), **cold** solves every (value, fold) from scratch over the whole grid, **one fit** "
        "is the refit on all rows at the chosen value. Seconds, medians of "
        f"{r['repeats']} rounds run in turn, after one untimed CV at the grid's first value (each solver's compiled "
        "code loaded, which the first timed CV would otherwise pay alone). The issue's target is warm CV <= 3 x one fit; met "
        f"by {len(met)} of {len(rows)}: {', '.join(met) or 'none'}. Where it is missed, the three folds' fits "
        "at the values each path passes through (up to two past its best) add up to more: warm starts save less "
        "than the grid multiplies (the cold / warm column), and the values past the chosen one cost more than it "
        "(PFBS's FISTA iterations and Citi's alternations grow as the regularisation falls)." + floor + "\n\n"
        + _table(["dataset", "solver", "warm CV", "solves to / past the choice", "cold CV", "one fit",
                  "warm / one fit", "cold / warm", "values reached", "chosen warm / cold"], rows)
        + "\n\nWhere the chosen values differ, the cold CV saw the whole grid and found a better mean score "
        "past the point where the warm paths stopped (the scores are not unimodal in C there); "
        "`patience=None` in `mklscale.solvers.cv.cross_validate` solves every value.\n\n" + _earlier_rows(r)
        + _machine(r["machine"]) + "\n")


def _earlier_rows(r: dict) -> str:
    """A line naming the rows a ``--merge`` run kept from an earlier run, with that run's date and load."""
    kept: dict = {}
    for d in r["datasets"]:
        for c in d["cases"]:
            if "recorded" in c:
                kept.setdefault((c["recorded"]["date"], str(c["recorded"]["load_average"])), []).append(
                    f"{c['solver']} on {d['dataset']}")
    return "".join(f"Rows from an earlier run ({date}, load average {load}): {', '.join(rows)}.\n\n"
                   for (date, load), rows in kept.items())


def render_quickstart() -> str:
    r = _load("bench_quickstart.json")
    if r is None:
        return "\n## The main job (`python benchmarks/bench_quickstart.py`)\n\nnot recorded yet\n"
    rows = []
    for kind in ("first", "warm"):
        runs = [x for x in r["runs"] if x["kind"] == kind]
        med = lambda key: statistics.median(x[key] for x in runs)  # noqa: E731
        names = list(runs[0]["solvers"])
        rows.append([kind, f"{med('wall'):.1f}", f"{med('bank_seconds'):.2f}"]
                    + [f"{statistics.median(x['solvers'][n]['cv_seconds'] for x in runs):.2f} + "
                       f"{statistics.median(x['solvers'][n]['refit_seconds'] for x in runs):.2f}" for n in names]
                    + [f"{med('rest_of_run'):.2f}", f"{med('outside_run'):.2f}"])
    first = r["runs"][0]
    accuracy = ", ".join(f"{n} {v['test_accuracy']:.3f} (kept {v['kept']} kernels)" for n, v in first["solvers"].items())
    return (
        "\n## The main job (`python benchmarks/bench_quickstart.py`)\n\n"
        "`mklscale run pipelines/quickstart.toml` as a fresh clone runs it (**first**: every `__pycache__` of the "
        "package removed, so Python recompiles its bytecode and numba compiles and caches every kernel the job "
        "uses) and again with the caches (**warm**), alternating, medians of "
        f"{sum(1 for x in r['runs'] if x['kind'] == 'first')} each. Target: under 30 s first, 15 s warm. Where the "
        "seconds go: the bank build, each solver's cross-validation + refit (results.json's own timings), the "
        "rest of the run (loading the data, starting the LocalCluster's two worker processes), and what lies "
        "outside the run (Python start-up and imports, writing results.json and the HTML report); importing "
        f"the pipeline, the estimators and distributed alone takes {r['import_seconds']:.1f} s.\n\n"
        + _table(["run", "wall (s)", "bank"] + [f"{n}: CV + refit" for n in first["solvers"]]
                 + ["rest of run", "outside the run"], rows)
        + f"\n\nTest accuracy on the held-out quarter: {accuracy}; majority rate {first['majority']:.3f}.\n\n"
        + _machine(r["machine"]) + "\n")
