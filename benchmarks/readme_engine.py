"""benchmarks/README.md sections of the engine and the platform: builds, passes, scaling, checkpoints, object stores."""

from __future__ import annotations

from readme_common import _load, _machine, _table


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


def render_hosts_scaling() -> str:
    title = "\n## Passes across hosts (`python benchmarks/bench_hosts_scaling.py`)\n\n"
    parts = []
    for name, label in (("bench_hosts_scaling.json", "full"),
                        ("bench_hosts_unlimited.json", "the same with unlimited links (--rate 10gbit --name "
                         "bench_hosts_unlimited): what the 2 cores alone allow"),
                        ("bench_hosts_scaling_quick.json", "quick (--quick; one shard, so one task a pass: no scaling "
                         "to see, a smoke run)")):
        r = _load(name)
        if r is None:
            continue
        rows = [[c["workers"], f"{c['pass']['seconds']:.2f}", f"{c['speedup']:.2f}" if c["speedup"] else "-",
                 f"{0.8 * c['workers']:.1f}", "yes" if c["server_bound"] else "no",
                 "yes" if c["meets_0.8N"] else "no", f"{c['fit']['seconds']:.1f}", c["fit"].get("passes")]
                for c in sorted(r["curve"], key=lambda c: c["workers"])]
        s3 = r["server"]
        parts.append(
            f"**{label}**: M = {r['M']} Gaussian kernels at n = {r['n']} ({r['bank_MB']:.0f} MB float32) on S3 "
            f"(SeaweedFS on a host of its own, link unlimited), every worker host's link limited to {r['rate']} "
            f"({r['rate_MBps']:.0f} MB/s) with tc tbf; the server alone serves {s3['MBps']:.0f} MB/s ({s3['objects']} "
            f"shard object(s), 16 concurrent GETs from the driver host). A `quad_forms` pass (median of {r['repeats']}) "
            "and a SpicyMKL fit end to end per number of worker hosts; speed-up against one worker host; "
            "'server-bound': N x link rate exceeds the server's throughput.\n\n"
            + _table(["worker hosts", "pass (s)", "speed-up", "0.8 N", "server-bound", ">= 0.8 N", "fit (s)",
                      "fit passes"], rows)
            + "\n\n" + _machine(r["machine"]) + "\n")
    faults = _table(["fault (tests/test_hosts.py)", "outcome the test asserts"], [
        ["a worker host killed mid-pass (`test_worker_host_killed_mid_pass_...`)", "bit-identical result"],
        ["a worker host's link down mid-pass, healed (`..._partitioned_mid_pass_and_healed_...`)", "bit-identical"],
        ["a worker host cut off 30 s, 100 % loss (`..._partitioned_30s_by_packet_loss_...`, slow)",
         "bit-identical; that worker exits after Dask's 30 s TCP timeout"],
        ["a straggler with a 10x slower link (`test_straggler_host_...`, slow)", "bit-identical"],
        ["a bank build while a worker host is partitioned (`test_bank_build_while_...`, slow)",
         "identical checksums, verify passes"],
        ["the S3 link with 5 % loss (`test_s3_link_with_5_percent_loss_...`, slow)", "build, pass and fit identical"],
        ["the S3 link with 5 % loss and +200 ms round trip (a userspace delay: no netem here; slow)", "identical"],
        ["the scheduler's host partitioned briefly, then for long (slow)",
         "identical; then ClusterUnavailableError, exit 2"],
        ["`mklscale run PIPELINE --cluster address.toml`, the bank built by the workers into S3",
         "results.json equal to a LocalCluster run's"]])
    if not parts:
        return title + "not recorded yet\n\n" + faults + "\n"
    return (title + "Hosts made on this one machine by cluster/hosts.py (network namespaces on a bridge, a private "
            "mount namespace each): the scheduler, the S3 server and each `dask worker` on hosts of their own, "
            "the bank built by the worker hosts into S3 (issue 33). All of them share this machine's 2 cores.\n\n"
            + "\n".join(parts) + "\nFaults across hosts, each a test run by default or with `-m slow`:\n\n" + faults + "\n")
