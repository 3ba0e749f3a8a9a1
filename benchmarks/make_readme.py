"""Generate benchmarks/README.md from the recorded JSON results: no figure is typed by hand.

    python benchmarks/make_readme.py

Each benchmark has a renderer that turns its JSON into a markdown section; a missing result file
renders as "not recorded yet". The prose around the tables lives in this file, next to the code
that fills them.
"""

from __future__ import annotations

import json
import statistics
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
    return (f"{m['cpu']}, {m['cores']} cores, {m['memory_GB']} GB RAM, {m['disk_free_GB']} GB disk free; "
            f"Python {m['python']}, numpy {m['numpy']}, numba {m['numba']}, dask {m['dask']}, zarr {m['zarr']}; "
            f"run {m['date']}")


def render_build() -> str:
    r = _load("bench_build.json")
    head = "## Bank build (`python benchmarks/bench_build.py`)\n\n"
    if r is None:
        return head + "Not recorded yet.\n"
    m, p = r["median"], r["params"]
    return head + (
        f"M = {p['M']} Gaussian kernels (random feature subsets, IDA recipe) at n = {p['n']}, {p['dtype']}, "
        f"{p['threads']} threads, {p['shards']} shards; medians of {p['repeats']} alternating repeats.\n"
        f"Machine: {_machine(r['machine'])}.\n\n"
        + _table(["kernels/s", "build GB/s", "plain write GB/s", "build / plain write", "target"],
                 [[m["kernels_per_s"], m["build_GBps"], m["plain_write_GBps"], m["build_over_plain_write"],
                   f">= {r['target']['build_over_plain_write']}"]])
        + "\n\nThe plain write is numpy writing the same bytes as the same number of files with the same "
        "threads. The build also computes every kernel (distance matrix, exp, normalisation), its trace, "
        "Frobenius norm, largest eigenvalue (Lanczos) and crc32c checksum, so the ratio measures that "
        "compute against the disk: on a machine whose disk is slower than its cores the ratio rises.\n"
    )


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
    return head + (
        f"n = {p['n_train']} training / {p['n_test']} test points, C = {p['C']}, tol = {p['tol']} (relative "
        f"duality gap, certified over all M kernels), {p['kernels']}; median of {p['repeats']} fits.\n"
        f"Machine: {_machine(r['machine'])}.\n\n"
        + _table(["data", "M", "loss", "penalty", "seconds", "full passes", "outer its", "active", "test acc", "gap"], rows)
        + f"\n\nMedian full passes over the bank per solve: {med_passes:g} (target <= 6).\n"
    )


RENDERERS: list[Callable[[], str]] = [render_build, render_spicy]

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
