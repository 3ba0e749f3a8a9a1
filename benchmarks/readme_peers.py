"""benchmarks/README.md sections that compare: peers (MKLpy, SHOGUN, ...), versions, A/B fits, mutation testing."""

from __future__ import annotations

import statistics

from readme_common import _load, _machine, _table


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
        "The ratio is the peer's fit time over the matching mklscale method's ("
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
