"""The driver side of tests/test_hosts.py: run on the driver host (``Hosts.driver``), it connects to
the hosts' scheduler and does the steps named, in order, on an s3:// bank, writing its results to ``--out`` (an .npz,
plus a .json of facts about the run).

    build   the workers build the bank straight into S3 (shards PUT from the worker hosts)
    pass    quad_forms, one kernel per task; ``--fault-after K`` prints ``FAULT`` on
            stdout once K tasks of the first step (build or pass) have finished, so the test can
            hit a host mid-step
    verify  KernelBank.verify on the bank (every kernel's checksum against its stored bytes)
    combine the combined kernel of all kernels
    fit     MKLClassifier(solver="spicy").fit_bank on the bank
    look    what each worker sees: its mklscale, its /tmp, whether the driver's files show
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

from mklscale.bank import build_bank, families
from mklscale.engine import Engine

class FinishedTasks(SchedulerPlugin):
    """Counts the tasks whose key starts with ``prefix`` that the scheduler has seen finish."""

    name = "mklh-finished"

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.n = 0

    def transition(self, key, start, finish, *args, **kwargs):
        name = key[0] if isinstance(key, tuple) else key
        if finish == "memory" and isinstance(name, str) and name.startswith(self.prefix):
            self.n += 1


def _finished(dask_scheduler):
    return dask_scheduler.plugins[FinishedTasks.name].n


def _signal_fault(client, prefix: str, after: int, facts: dict, stop: threading.Event) -> None:
    """Print FAULT (for the test to strike) once ``after`` tasks named ``prefix...`` have finished."""
    client.register_plugin(FinishedTasks(prefix))

    def watch():
        while not stop.is_set():
            if client.run_on_scheduler(_finished) >= after:
                facts["fault_at"] = time.time()
                print("FAULT", flush=True)
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def data(n: int, m: int):
    rng = np.random.default_rng(9)
    X = rng.standard_normal((n, 3))
    y = np.where(X[:, 0] * X[:, 1] + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y, families.gaussian(np.geomspace(0.2, 20, m))


LAYOUT = dict(shard_mb=0.16, chunk_mb=0.16)  # n = 200: one kernel per shard


def _look(driver_paths):
    import mklscale

    return {"mklscale": mklscale.__file__, "tmp": sorted(os.listdir("/tmp")),
            "sees": [p for p in driver_paths if os.path.exists(p)], "s3": os.environ.get("AWS_ENDPOINT_URL"),
            "bank_env": os.environ.get("AWS_ACCESS_KEY_ID") is not None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("steps", nargs="+", choices=["build", "verify", "pass", "combine", "fit", "look"])
    p.add_argument("--scheduler", required=True)
    p.add_argument("--bank", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--fault-after", type=int, default=0,
                   help="print FAULT once this many tasks of the first step have finished")
    p.add_argument("--workers", type=int, default=1, help="wait for this many workers first")
    args = p.parse_args()
    X, y, specs = data(args.n, args.m)
    facts: dict = {}
    arrays: dict = {}
    with Client(args.scheduler, timeout=30) as client:
        client.wait_for_workers(args.workers, timeout=120)
        stop = threading.Event()
        if args.fault_after:
            _signal_fault(client, "mklscale-build" if args.steps[0] == "build" else "mklscale-quad_forms",
                          args.fault_after, facts, stop)
        try:
            for step in args.steps:
                STEPS[step](client, args, X, y, specs, facts, arrays)
        finally:
            stop.set()
    np.savez(args.out + ".npz", **arrays)
    with open(args.out + ".json", "w") as f:
        json.dump(facts, f)


def look(client, args, X, y, specs, facts, arrays):
    # files the driver has: this script (in the repository) and the folder its results go to
    mine = [os.path.abspath(__file__), os.path.dirname(os.path.abspath(args.out))]
    assert all(os.path.exists(p) for p in mine)
    facts["workers"] = client.run(_look, mine)


def build(client, args, X, y, specs, facts, arrays):
    facts["start"] = time.time()
    bank = build_bank(X, specs, args.bank, client=client, progress=False, **LAYOUT)
    facts["end"] = time.time()
    arrays.update(checksums=bank.checksums, complete=bank.complete)


def verify(client, args, X, y, specs, facts, arrays):
    from mklscale.bank import KernelBank

    facts["verify_ok"] = bool(KernelBank.open(args.bank).verify().ok)


def fit(client, args, X, y, specs, facts, arrays):
    from mklscale.estimators import MKLClassifier

    est = MKLClassifier(solver="spicy", C=0.1, client=client).fit_bank(args.bank, y)
    arrays["weights"] = est.kernel_weights_.to_numpy()


def pass_(client, args, X, y, specs, facts, arrays):
    U = np.random.default_rng(3).normal(size=(2, args.n))
    engine = Engine(args.bank, client=client, cache_bytes=0, task_bytes=args.n * args.n * 4)
    client.get_task_stream(start=time.time())  # the scheduler records tasks from now on
    facts["start"] = time.time()
    arrays["quad"] = engine.quad_forms(U)  # (not inside get_task_stream: its exit would hide the pass's error)
    facts["end"] = time.time()
    facts["ran_on"] = sorted({t["worker"] for t in client.get_task_stream(start=facts["start"])})


def combine(client, args, X, y, specs, facts, arrays):
    engine = Engine(args.bank, client=client, cache_bytes=0, task_bytes=args.n * args.n * 4)
    arrays["combined"] = engine.combine(np.linspace(0, 1, args.m))


STEPS = {"look": look, "build": build, "verify": verify, "fit": fit, "pass": pass_, "combine": combine}

if __name__ == "__main__":
    main()
