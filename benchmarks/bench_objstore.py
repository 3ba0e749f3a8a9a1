"""Banks on an S3-compatible object store (issue 20) against plain requests of the same bytes, on a
local SeaweedFS server started by this script (tests/_seaweed.py), in one run.

    python benchmarks/bench_objstore.py --quick     # M=40, n=300 (14 MB): a smoke run, seconds
    python benchmarks/bench_objstore.py             # M=2000, n=500 float32 = 2 GB (the issue's size; long)

Sections (results to benchmarks/results/bench_objstore[_quick].json):

- build: ``build_bank`` to s3:// against plain single-part PUTs (obstore) of the same shard bytes,
  and ``build_bank`` to a local folder, as MB/s of kernel data.
- pass: ``Engine.quad_forms`` (k = 1, threaded default) over the s3:// bank against plain concurrent
  ranged GETs of the same bytes with the same client (obstore, ``ObjectBank.read_into``: 8 MB
  parts, 16 threads) into one reused buffer per shard; target >= 0.8x. The same pass over the
  local-disk bank against ``np.fromfile`` of its shard files, for comparison.
- client: one 64 MB object read with obstore and with s3fs (zarr's fsspec store's client), single
  GET and 8 concurrent 8 MB ranges: why obstore is the client (docs/design.md, "Storage backends").

Times are medians over --repeats runs. A local server's figures are bounded by this machine's CPU
and loopback; docs/design.md states how they change on a real cloud store (a model, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from _seaweed import SeaweedServer  # noqa: E402
from machine import describe_machine  # noqa: E402

from mklscale.bank import build_bank, families  # noqa: E402
from mklscale.bank.storage.location import bank_location  # noqa: E402
from mklscale.bank.storage.objstore import ObjectBank  # noqa: E402
from mklscale.bank.shard_format import shard_key  # noqa: E402
from mklscale.engine import Engine  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--M", type=int, default=None)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="server data and the local bank (default: a temporary folder)")
    args = ap.parse_args()
    M = args.M or (40 if args.quick else 2000)
    n = args.n or (300 if args.quick else 500)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mklscale-bench-objstore-"))
    server = SeaweedServer(work / "seaweed").start()
    os.environ.update(server.env())
    try:
        results = run(server, work, M, n, args.repeats)
    finally:
        server.stop()
    results["machine"] = describe_machine(work)
    out = ROOT / "benchmarks" / "results" / f"bench_objstore{'_quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "machine"}, indent=2))
    print(f"-> {out}")


def run(server: SeaweedServer, work: Path, M: int, n: int, repeats: int) -> dict:
    X = np.random.default_rng(0).normal(size=(n, 8))
    specs = families.random_subsets(8, M, seed=0)
    bucket = server.new_bucket()
    url = f"s3://{bucket}/bank.zarr"
    mb = M * n * n * 4 / 2**20
    res: dict = {"M": M, "n": n, "bank_MB": round(mb, 1), "server": "SeaweedFS (weed server -s3, 127.0.0.1)"}

    # ---- build --------------------------------------------------------------------------------
    build_bank(X[:50], families.random_subsets(8, 4, seed=0), work / "warm.zarr", progress=False, overwrite=True)
    t = time.perf_counter()
    bank = build_bank(X, specs, url, progress=False)
    t_s3 = time.perf_counter() - t
    t = time.perf_counter()
    local = build_bank(X, specs, work / "local.zarr", progress=False, overwrite=True)
    t_local = time.perf_counter() - t
    ob = ObjectBank(bank_location(url))
    shards = [ob.get(shard_key(s)) for s in range(bank.n_shards)]
    plain = ObjectBank(bank_location(f"s3://{bucket}/plain"))
    with ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:  # as many PUTs at once as the build runs
        t = time.perf_counter()
        list(pool.map(lambda s: plain.put(f"shard-{s}", shards[s]), range(len(shards))))
        t_put = time.perf_counter() - t
    res["build"] = {"s3_MBps": mb / t_s3, "plain_put_MBps": mb / t_put, "ratio_to_plain_put": t_put / t_s3,
                    "local_disk_MBps": mb / t_local, "shards": bank.n_shards}

    # ---- pass ---------------------------------------------------------------------------------
    U = np.random.default_rng(1).normal(size=(1, n))
    remote_engine, local_engine = Engine(url, cache_bytes=0), Engine(local, cache_bytes=0)
    assert np.array_equal(remote_engine.quad_forms(U), local_engine.quad_forms(U))  # bit-identical, and warm
    buffers = [np.empty(len(b), np.uint8) for b in shards[:1]] * bank.n_shards

    def plain_gets() -> None:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # one shard per engine thread, as the pass
            list(pool.map(lambda s: ob.read_into(shard_key(s), 0, buffers[s][: len(shards[s])]), range(bank.n_shards)))

    def plain_files() -> None:
        for s in range(local.n_shards):
            np.fromfile(local.shard_file(s), dtype=np.uint8)

    t_pass = timed(lambda: remote_engine.quad_forms(U), repeats)
    t_get = timed(plain_gets, repeats)
    t_lpass = timed(lambda: local_engine.quad_forms(U), repeats)
    t_file = timed(plain_files, repeats)
    res["pass"] = {"s3_quad_forms_MBps": mb / t_pass, "plain_ranged_get_MBps": mb / t_get,
                   "ratio_to_plain_get": t_get / t_pass, "target": 0.8,
                   "local_quad_forms_MBps": mb / t_lpass, "local_plain_read_MBps": mb / t_file}

    # ---- client -------------------------------------------------------------------------------
    big = np.random.default_rng(2).integers(0, 255, size=64 * 2**20, dtype=np.uint8)
    ObjectBank(bank_location(f"s3://{bucket}/client")).put("big", big)
    client = {}
    import obstore

    st = ObjectBank(bank_location(f"s3://{bucket}/client")).store
    part = 8 * 2**20
    client["obstore_1_get_MBps"] = 64 / timed(lambda: obstore.get_range(st, "big", start=0, end=64 * 2**20), repeats)
    with ThreadPoolExecutor(8) as pool:
        client["obstore_8_ranges_MBps"] = 64 / timed(lambda: list(pool.map(
            lambda i: obstore.get_range(st, "big", start=i * part, end=(i + 1) * part), range(8))), repeats)
    try:
        import s3fs

        fs = s3fs.S3FileSystem()
        path = f"{bucket}/client/big"
        client["s3fs_1_get_MBps"] = 64 / timed(lambda: fs.cat_file(path, start=0, end=64 * 2**20), repeats)
        client["s3fs_8_ranges_MBps"] = 64 / timed(lambda: fs.cat_ranges([path] * 8, [i * part for i in range(8)],
                                                                        [(i + 1) * part for i in range(8)]), repeats)
    except ImportError:
        client["s3fs"] = "not installed"
    res["client"] = client
    return res


if __name__ == "__main__":
    main()
