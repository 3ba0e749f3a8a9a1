"""What checking every kernel's crc32c as it is read costs a pass (issue 29: target <= 10 % of the cached pass).

    python benchmarks/bench_read_integrity.py                 # 120 kernels of n = 1000 (float32, 480 MB), 5 pairs
    python benchmarks/bench_read_integrity.py --kernels 40 --pairs 3    # a smoke run

One threaded Engine over a local bank; the pass is ``quad_forms`` with one vector (what SpicyMKL and the
certificates run most). Each case runs as pairs A B A B ... in one process, A with the reader's checks and B
with them bypassed (``KernelReader._compare`` / ``_check_whole`` and the row pieces' ``checksum_extend``
replaced by no-ops for B only, the rest of the code the same), so a change of load hits both; the ratio A / B of each pair and their median are recorded.

- **cached** (mapped, the bank in the page cache): the checks of a mapped file version run once per process,
  so A is timed on its later passes; the first mapped pass, which does check every kernel, is a case of its own
  (**mapped, first pass**: the process's record of checked kernels is cleared before each A).
- **copied** (the path of banks larger than half the memory and of object stores): every pass checks.

Results: benchmarks/results/bench_read_integrity.json; the table is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe_machine, write_record  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.engine import Engine, reader  # noqa: E402
from mklscale.bank.storage import local as local_storage  # noqa: E402


def timed_pass(engine, U) -> float:
    U = U + np.random.default_rng().normal(size=U.shape) * 1e-3  # new vectors: no result is reused
    t0 = time.perf_counter()
    engine.quad_forms(U)
    return time.perf_counter() - t0


def pairs(engine, U, n_pairs: int, before_a=None) -> dict:
    checked_compare, checked_whole = reader.KernelReader._compare, reader.KernelReader._check_whole
    extend = reader.checksum_extend
    a, b = [], []
    for _ in range(n_pairs):
        if before_a is not None:
            before_a()
        a.append(timed_pass(engine, U))
        reader.KernelReader._compare = lambda self, m, crc: None
        reader.KernelReader._check_whole = lambda self, shard, m0, block: None
        reader.checksum_extend = lambda crc, block: 0
        try:
            b.append(timed_pass(engine, U))
        finally:
            reader.KernelReader._compare, reader.KernelReader._check_whole = checked_compare, checked_whole
            reader.checksum_extend = extend
    ratios = [x / y for x, y in zip(a, b)]
    return {"checked_s": a, "unchecked_s": b, "ratios": ratios, "median_checked_s": statistics.median(a),
            "median_unchecked_s": statistics.median(b), "median_ratio": statistics.median(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=120)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "bench_read_integrity.json")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mklscale-bench-integrity-"))
    X = np.random.default_rng(0).normal(size=(args.n, 20))
    bank = build_bank(X, families.random_subsets(20, args.kernels, seed=0), workdir / "bank.zarr", progress=False)
    U = np.random.default_rng(1).normal(size=(1, args.n))
    record = {"machine": describe_machine(workdir), "kernels": args.kernels, "n": args.n, "bytes": bank.nbytes,
              "pairs": args.pairs, "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "cases": {}}
    with Engine(bank, cache_bytes=0) as engine:  # within map_limit(): mapped; no driver cache: every pass reads
        engine.quad_forms(U)  # page cache, mappings, numba: warm
        record["cases"]["cached (mapped)"] = pairs(engine, U, args.pairs)
        record["cases"]["mapped, first pass"] = pairs(engine, U, args.pairs, before_a=local_storage._CHECKED.clear)
    os.environ["MKLSCALE_MAP_BYTES"] = "0"  # the reader then copies pieces into its buffers
    with Engine(bank, cache_bytes=0) as engine:
        engine.quad_forms(U)
        record["cases"]["copied"] = pairs(engine, U, args.pairs)
    for name, case in record["cases"].items():
        print(f"{name:20s} checked {case['median_checked_s'] * 1e3:7.1f} ms  unchecked "
              f"{case['median_unchecked_s'] * 1e3:7.1f} ms  ratio {case['median_ratio']:.3f}", flush=True)
    write_record(record, args.out)


if __name__ == "__main__":
    main()
