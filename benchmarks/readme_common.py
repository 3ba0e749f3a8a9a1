"""What the README renderers share: the results folder, reading a result, a markdown table, the machine line."""

from __future__ import annotations

import json
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


def machine_with_load(m: dict) -> str:
    """The machine line of the newer sections: CPU, cores, memory and the load average at start and end."""
    load = m.get("load_average_at_record"), m.get("load_average_at_end")
    return (f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_GB')} GB; load average "
            f"{load[0]} at the start, {load[1]} at the end; {m.get('date')}.")


def plain_table(header: list[str], rows: list[list]) -> str:
    """A markdown table of cells already formatted (``_table`` formats floats itself)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
