"""A description of the machine a benchmark ran on, stored next to its results."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
from pathlib import Path


def describe_machine(workdir: Path | None = None) -> dict:
    import dask
    import numba
    import numpy
    import psutil
    import zarr

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    disk = shutil.disk_usage(workdir if workdir and workdir.exists() else Path.cwd())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),  # fewer than all cores: pinned (taskset)
        "memory_GB": round(psutil.virtual_memory().total / 2**30, 1),
        "disk_free_GB": round(disk.free / 2**30, 1),
        "load_average_at_record": [round(x, 2) for x in os.getloadavg()],
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__, "numba": numba.__version__, "dask": dask.__version__, "zarr": zarr.__version__,
    }


def write_record(record: dict, out: Path) -> None:
    """Add the load average at the end to ``record["machine"]`` and write the record as JSON to ``out``."""
    import json

    record["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")
