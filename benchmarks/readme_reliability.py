"""benchmarks/README.md sections of the reliability issues (rendered by make_readme.py)."""

from __future__ import annotations

from readme_common import _load
from readme_common import machine_with_load as _machine
from readme_common import plain_table as _table


def render_read_integrity() -> str:
    r = _load("bench_read_integrity.json")
    if r is None:
        return "\n## Integrity on read (`python benchmarks/bench_read_integrity.py`)\n\nnot recorded yet\n"
    rows = [[name, f"{c['median_checked_s'] * 1e3:.1f}", f"{c['median_unchecked_s'] * 1e3:.1f}",
             f"{c['median_ratio']:.3f}", ", ".join(f"{x:.3f}" for x in c["ratios"])]
            for name, c in r["cases"].items()]
    return (
        "\n## Integrity on read (`python benchmarks/bench_read_integrity.py`)\n\n"
        f"What checking every kernel's crc32c as a pass reads it costs: a `quad_forms` pass (one vector) over "
        f"{r['kernels']} kernels of n = {r['n']} ({r['bytes'] / 1e6:.0f} MB, float32) on one threaded Engine without "
        "its driver cache, checked (A) against the same code with the checks replaced by no-ops (B), in "
        f"{r['pairs']} A B pairs per case; milliseconds, medians, and each pair's ratio A / B. Target: <= 10 % of "
        "the cached pass. A mapped (cached) bank is checked once per process per shard-file version, so its "
        "later passes pay nothing and its first pass pays one crc32c sweep; the copied path (banks over half the "
        "memory, object stores) checks on every pass, in the same sweep as the copy.\n\n"
        + _table(["case", "checked (ms)", "unchecked (ms)", "median ratio", "ratios"], rows)
        + "\n\n" + _machine(r["machine"]) + "\n")
