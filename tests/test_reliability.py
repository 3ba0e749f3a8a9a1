"""Reliability on a real cluster (issue 9, items 2, 6 and 7).

- Worker loss: a worker process SIGKILLed in the middle of a pass, a bank build and a solve; the
  results must be the bits of an undisturbed run. The kill is made deterministic by a worker plugin
  (:class:`KillOnce`) that kills its own worker right after that worker finished its N-th task of
  the operation; a file created with O_EXCL makes it happen exactly once per test (the replacement
  worker gets the plugin too) and records when and whom it killed, so a kill that never happened,
  or happened after the operation ended, fails the test instead of passing it vacuously.
- Scheduler loss: a `dask scheduler` subprocess killed during a pass (and during a solve with a
  checkpoint) must raise ClusterUnavailableError within a bounded time, never hang.
- Memory bounds: passes over a ~200 MB bank on workers whose memory limit leaves 64 MB for tasks.
- TLS: one pass over a TLS-secured LocalCluster with temporary certificates.

Each test starts its own LocalCluster of worker processes (not the session ``cluster_client``):
these tests kill workers and schedulers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from distributed.diagnostics.plugin import WorkerPlugin

from mklscale.bank import KernelBank, build_bank, families
from mklscale.engine import Engine
from mklscale.errors import ClusterUnavailableError

pytestmark = pytest.mark.cluster

QUIET_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# ---- helpers -------------------------------------------------------------------------------------
class KillOnce(WorkerPlugin):
    """SIGKILL this worker right after it finished its ``after``-th task whose key starts with
    ``prefix`` — only the first worker of the whole test to get there (``flag`` is created with
    O_EXCL; it records the pid killed and the time)."""

    name = "mklscale-test-kill-once"

    def __init__(self, prefix: str, after: int, flag: str):
        self.prefix, self.after, self.flag = prefix, after, flag

    def setup(self, worker):
        self.count = 0

    def transition(self, key, start, finish, **kwargs):
        name = key[0] if isinstance(key, tuple) else key
        if finish != "memory" or start != "executing" or not isinstance(name, str) or not name.startswith(self.prefix):
            return
        self.count += 1
        if self.count < self.after:
            return
        try:
            fd = os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{os.getpid()} {time.time()!r}".encode())
        os.fsync(fd)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


def _worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def run_with_a_kill(client, tmp_path: Path, prefix: str, after: int, action):
    """Run ``action()`` while KillOnce is registered; check that exactly one worker died during
    it and that the cluster is back to 2 workers. Returns action's result."""
    client.wait_for_workers(2, timeout=120)
    pids = _worker_pids(client)
    flag = tmp_path / f"killed-{time.monotonic_ns()}"
    client.register_plugin(KillOnce(prefix, after, str(flag)))
    try:
        t0 = time.time()
        result = action()
        t1 = time.time()
    finally:
        client.unregister_worker_plugin(KillOnce.name)
    assert flag.is_file(), f"no worker was killed: the operation ran fewer than {after} '{prefix}' tasks on each worker"
    pid, when = flag.read_text().split()
    assert int(pid) in pids.values(), "the killed process was not one of the workers"
    assert t0 < float(when) < t1, "the kill did not land during the operation"
    client.wait_for_workers(2, timeout=120)
    assert int(pid) not in _worker_pids(client).values(), "the killed worker is still there"
    return result


@pytest.fixture(scope="module")
def proc_client():
    """A LocalCluster with two worker processes (1 thread each), for this module's kill tests."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": ":0"}) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def kill_bank(tmp_path_factory):
    """64 Gaussian kernels at n = 200 (10 MB), one kernel per shard."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((200, 3))
    y = np.where(X[:, 0] * X[:, 1] + 0.3 * rng.standard_normal(200) > 0, 1.0, -1.0)
    bank = build_bank(X, families.gaussian(np.geomspace(0.2, 20, 64)), tmp_path_factory.mktemp("kill") / "bank",
                      progress=False, shard_mb=0.16, chunk_mb=0.16)
    return bank, X, y


ONE_KERNEL = 200 * 200 * 4


# ---- worker loss ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [None, 20])
def test_worker_killed_mid_pass_gives_identical_result(proc_client, kill_bank, tmp_path, rank):
    """quad_forms with 64 one-kernel tasks (dense kernels, or rank-20 factors: issue 17); a worker dies
    after its 8th task."""
    bank, X, _ = kill_bank
    task_bytes = ONE_KERNEL
    if rank is not None:
        task_bytes = 200 * rank * 4  # one factor
        bank = build_bank(X, families.gaussian(np.geomspace(0.2, 20, 64)), tmp_path / "factor", rank=rank,
                          max_error=1.0, progress=False, shard_mb=task_bytes / 2**20, chunk_mb=task_bytes / 2**20)
    U = np.random.default_rng(1).standard_normal((1000, bank.n))
    with Engine(bank, task_bytes=task_bytes) as eng:
        ref = eng.quad_forms(U)
    with Engine(bank, client=proc_client, task_bytes=task_bytes) as eng:
        got = run_with_a_kill(proc_client, tmp_path, "mklscale-quad_forms", 8, lambda: eng.quad_forms(U))
    assert got.shape == (64, 1000) and np.array_equal(got, ref)


@pytest.mark.slow
def test_worker_killed_mid_build_gives_identical_bank(proc_client, tmp_path):
    """A 96-kernel build, one kernel per shard (96 tasks); a worker dies after its 10th shard.
    The stored bytes' checksums, every kernel's statistics and the gram array equal an undisturbed
    (threaded) build's."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((160, 4))
    specs = families.gaussian(np.geomspace(0.1, 30, 48)) + families.gaussian(np.geomspace(0.15, 25, 48), features=[0, 2])
    kw = {"progress": False, "shard_mb": 160 * 160 * 4 / 2**20, "chunk_mb": 160 * 160 * 4 / 2**20, "flush_every_s": 0}
    ref = build_bank(X, specs, tmp_path / "ref", **kw)
    got = run_with_a_kill(proc_client, tmp_path, "mklscale-build", 10,
                          lambda: build_bank(X, specs, tmp_path / "killed", client=proc_client, **kw))
    got = KernelBank.open(tmp_path / "killed")
    assert len(got) == len(ref) == 96 and got.complete.all()
    assert np.array_equal(got.checksums, ref.checksums)
    assert np.array_equal(np.asarray(got.lambda_max), np.asarray(ref.lambda_max))
    assert got.verify().ok
    with Engine(got) as e1, Engine(ref) as e2:
        assert np.array_equal(e1.blocks(np.arange(96), keep=False), e2.blocks(np.arange(96), keep=False))


def test_worker_killed_mid_solve_gives_identical_model(proc_client, kill_bank, tmp_path):
    """SpicyMKL (logistic, l1) over the 64-kernel bank on the cluster; a worker dies after its
    40th quad_forms task (the first pass has 64 tasks for 2 workers, so the kill lands in a later
    pass or late in the first one). Weights, dual coefficients and bias equal the threaded fit."""
    from mklscale.solvers import spicy

    bank, _, y = kill_bank
    with Engine(bank, task_bytes=ONE_KERNEL) as eng:
        ref = spicy.fit(eng, y, 0.5, loss="logistic", tol=1e-6)
        ref_passes = eng.stats["passes"]
    assert ref_passes >= 2, "the solve must make several passes for the kill to land mid-solve"
    with Engine(bank, client=proc_client, task_bytes=ONE_KERNEL) as eng:
        got = run_with_a_kill(proc_client, tmp_path, "mklscale-quad_forms", 40,
                              lambda: spicy.fit(eng, y, 0.5, loss="logistic", tol=1e-6))
    assert np.array_equal(got.weights, ref.weights)
    assert np.array_equal(got.dual_coef, ref.dual_coef)
    assert got.bias == ref.bias


# ---- scheduler loss ------------------------------------------------------------------------------
class KillPid(WorkerPlugin):
    """Send ``sig`` (default SIGKILL) to process ``pid`` (the scheduler) once this worker finished
    its ``after``-th task whose key starts with ``prefix``."""

    name = "mklscale-test-kill-scheduler"

    def __init__(self, prefix: str, after: int, pid: int, sig: int = signal.SIGKILL):
        self.prefix, self.after, self.pid, self.sig, self.count = prefix, after, pid, sig, 0

    def transition(self, key, start, finish, **kwargs):
        name = key[0] if isinstance(key, tuple) else key
        if finish == "memory" and start == "executing" and isinstance(name, str) and name.startswith(self.prefix):
            self.count += 1
            if self.count == self.after:
                os.kill(self.pid, self.sig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, **QUIET_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, env=env)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=30)


@pytest.fixture
def doomed_scheduler(tmp_path):
    """(address, scheduler process) of a `dask scheduler` subprocess with one `dask worker`."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [_spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                    tmp_path / "scheduler.log")]
    try:
        deadline = time.monotonic() + 60
        while True:
            assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.2)
        procs.append(_spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                             "--no-dashboard", "--local-directory", str(tmp_path)], tmp_path / "worker.log"))
        yield address, procs[0]
    finally:
        _stop(procs)


#: A lost scheduler must be reported within this many seconds (runner: POLL_S, HEARTBEAT_S...).
LOST_BOUND_S = 30.0


def test_scheduler_killed_mid_pass_raises_cluster_unavailable(doomed_scheduler, kill_bank):
    """The scheduler process is SIGKILLed after the worker finished its 3rd of 64 tasks: the pass
    raises ClusterUnavailableError naming the scheduler, within LOST_BOUND_S (no hang)."""
    from distributed import Client

    address, scheduler = doomed_scheduler
    bank, _, _ = kill_bank
    u = np.linspace(-1.0, 1.0, bank.n)
    client = Client(address, timeout="30s")
    try:
        client.wait_for_workers(1, timeout=60)
        eng = Engine(bank, client=client, task_bytes=ONE_KERNEL)
        assert np.isfinite(eng.quad_forms(u)).all()  # warm: numba compiled in the worker
        client.register_plugin(KillPid("mklscale-quad_forms", 3, scheduler.pid))
        out: dict = {}

        def work():
            try:
                out["value"] = eng.quad_forms(np.ones((200, bank.n)))
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                out["error"] = exc

        t0 = time.monotonic()
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        thread.join(LOST_BOUND_S + 30)
        elapsed = time.monotonic() - t0
        assert not thread.is_alive(), f"the pass still hangs {elapsed:.0f}s after the scheduler was killed"
        assert scheduler.wait(timeout=5) == -signal.SIGKILL, "the scheduler was not killed"
        assert "value" not in out, "the pass finished without its scheduler"
        err = out["error"]
        assert isinstance(err, ClusterUnavailableError), repr(err)
        assert address in str(err) and "quad_forms" in str(err)
        assert elapsed < LOST_BOUND_S
        with pytest.raises(ClusterUnavailableError):  # the next pass fails at once, too
            eng.quad_forms(u)
    finally:
        client.close(timeout=5)


@pytest.mark.slow
def test_frozen_scheduler_raises_within_the_heartbeat_bound(doomed_scheduler, kill_bank):
    """The scheduler is SIGSTOPped mid-pass (its connections stay open, nothing answers): the
    runner's heartbeat must give up within HEARTBEAT_S + HEARTBEAT_TIMEOUT_S (+ slack)."""
    from distributed import Client

    from mklscale.engine import runner

    address, scheduler = doomed_scheduler
    bank, _, _ = kill_bank
    client = Client(address, timeout="30s")
    try:
        client.wait_for_workers(1, timeout=60)
        eng = Engine(bank, client=client, task_bytes=ONE_KERNEL)
        eng.quad_forms(np.ones(bank.n))
        client.register_plugin(KillPid("mklscale-quad_forms", 3, scheduler.pid, signal.SIGSTOP))
        t0 = time.monotonic()
        with pytest.raises(ClusterUnavailableError, match="lost the Dask scheduler"):
            eng.quad_forms(np.ones((200, bank.n)))
        elapsed = time.monotonic() - t0
        assert elapsed < runner.HEARTBEAT_S + runner.HEARTBEAT_TIMEOUT_S + 10, elapsed
        assert scheduler.poll() is None  # stopped, not dead: only the heartbeat could tell
    finally:
        scheduler.kill()
        client.close(timeout=5)


def test_scheduler_killed_mid_solve_raises_and_the_checkpoint_resumes(doomed_scheduler, kill_bank, tmp_path):
    """SpicyMKL with a checkpoint written every outer iteration; the scheduler is SIGKILLed during
    the solve's second pass (after the single worker's 70th quad_forms task; the first pass has
    64). The fit raises ClusterUnavailableError within LOST_BOUND_S; the checkpoint on disk then
    resumes on the threaded engine to the undisturbed fit's model, bit for bit."""
    from distributed import Client

    from mklscale.runtime.checkpoint import Checkpoint
    from mklscale.solvers import spicy

    address, scheduler = doomed_scheduler
    bank, _, y = kill_bank
    with Engine(bank, task_bytes=ONE_KERNEL) as eng:
        ref = spicy.fit(eng, y, 0.5, loss="logistic", tol=1e-6)
    path = tmp_path / "spicy.npz"
    client = Client(address, timeout="30s")
    try:
        client.wait_for_workers(1, timeout=60)
        client.register_plugin(KillPid("mklscale-quad_forms", 70, scheduler.pid))
        with Engine(bank, client=client, task_bytes=ONE_KERNEL) as eng:
            t0 = time.monotonic()
            with pytest.raises(ClusterUnavailableError, match="lost the Dask scheduler"):
                spicy.fit(eng, y, 0.5, loss="logistic", tol=1e-6,
                          checkpoint=Checkpoint(path, {"test": "scheduler-loss"}, every_s=None, every_iter=1))
            elapsed = time.monotonic() - t0
        assert scheduler.wait(timeout=5) == -signal.SIGKILL, "the scheduler was not killed"
        assert elapsed < LOST_BOUND_S + 20  # the solve itself takes a few seconds before the kill
    finally:
        client.close(timeout=5)
    saved = Checkpoint(path, {"test": "scheduler-loss"}, every_s=None, every_iter=1)
    assert saved.load()["iteration"] >= 1, "no checkpoint was written before the scheduler died"
    with Engine(bank, task_bytes=ONE_KERNEL) as eng:
        resumed = spicy.fit(eng, y, 0.5, loss="logistic", tol=1e-6, checkpoint=saved)
    assert np.array_equal(resumed.weights, ref.weights) and np.array_equal(resumed.dual_coef, ref.dual_coef)
    assert resumed.bias == ref.bias


def test_pipeline_that_loses_its_scheduler_names_the_resume_command(doomed_scheduler, tmp_path, monkeypatch):
    """A pipeline on a scheduler address whose scheduler dies during a solve stops with
    ClusterUnavailableError (bounded) naming the run directory and the --resume command, keeping the
    bank; `--resume` on another cluster then finishes the run. (Every pass goes to the cluster:
    MKLSCALE_LOCAL_PASS_BYTES=0; by default a bank this small would be reduced in the driver.)"""
    from distributed import Client

    from mklscale.pipeline import run_pipeline

    monkeypatch.setenv("MKLSCALE_LOCAL_PASS_BYTES", "0")

    address, scheduler = doomed_scheduler
    spec = {"name": "lost", "dataset": {"name": "breast_cancer", "max_train": 60},
            "bank": {"families": [{"family": "gaussian", "widths": [1, 2, 5], "features": "all"},
                                  {"family": "linear", "features": "all"}]},
            "solver": [{"name": "spicy", "solver": "spicy", "C": 0.05, "tol": 1e-8}], "report": {"enabled": False}}
    with Client(address, timeout="30s") as client:
        client.wait_for_workers(1, timeout=60)
        client.register_plugin(KillPid("mklscale-quad_forms", 2, scheduler.pid))
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    with pytest.raises(ClusterUnavailableError) as info:
        run_pipeline(spec, out=run_dir, cluster={"kind": "address", "address": address}, quiet=True)
    assert time.monotonic() - t0 < LOST_BOUND_S + 30
    assert scheduler.wait(timeout=5) == -signal.SIGKILL, "the scheduler was not killed"
    message = str(info.value)
    assert "lost the Dask scheduler" in message and f"--out {run_dir} --resume" in message
    assert (run_dir / "bank.zarr").is_dir() and not (run_dir / "results.json").exists()
    resumed = run_pipeline(spec, out=run_dir, cluster={"kind": "local", "n_workers": 1, "processes": False},
                           quiet=True, resume=True)
    assert resumed["solvers"][0]["status"] == "ok" and resumed["bank"]["kernels_computed"] == 0


# ---- memory bounds -------------------------------------------------------------------------------
#: Memory a worker's tasks may use, above the worker's idle footprint.
TASK_HEADROOM = 64 * 2**20


@pytest.fixture(scope="module")
def big_bank(tmp_path_factory):
    """500 Gaussian kernels at n = 320 in float32: 205 MB, 20 kernels (8 MB) per shard."""
    X = np.random.default_rng(5).standard_normal((320, 12))
    bank = build_bank(X, families.gaussian(np.geomspace(0.1, 50, 500)), tmp_path_factory.mktemp("big") / "bank",
                      progress=False, shard_mb=8, chunk_mb=8)
    assert bank.nbytes > 3 * TASK_HEADROOM
    return bank


class _RssSampler(threading.Thread):
    """Peak RSS of the given processes, sampled every 10 ms until stopped."""

    def __init__(self, pids):
        import psutil

        super().__init__(daemon=True)
        self.procs = {pid: psutil.Process(pid) for pid in pids}
        self.peak = {pid: 0 for pid in pids}
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            for pid, proc in self.procs.items():
                self.peak[pid] = max(self.peak[pid], proc.memory_info().rss)
            self.samples += 1
            self._stop_event.wait(0.01)

    def stop(self):
        self._stop_event.set()
        self.join(10)


def _hog(nbytes: int) -> int:
    """Hold ``nbytes`` of touched memory for 2 s (a task that breaks the limit, as a control)."""
    block = np.ones(nbytes // 8)
    time.sleep(2.0)
    return int(block[-1])


def test_passes_over_a_bank_3x_the_workers_memory_stay_within_it(big_bank):
    """Measure: each worker process's resident set size (RSS, psutil, sampled every 10 ms from the
    driver) minus that worker's own idle RSS after a warm-up round of the same passes (Python,
    Dask, numba and the compiled kernels: ~100+ MB that no task uses). That increase — the memory the tasks use — must
    stay below 64 MB while several passes read the whole 205 MB bank (quad_forms with 4 vectors,
    frobenius, matvecs, combine of all 500 kernels) with 8 MB tasks.

    Enforcement by Dask: after the warm-up each worker's nanny gets memory_limit = (idle RSS +
    64 MB) / 0.95, so its monitor (every 20 ms here) terminates a worker whose RSS exceeds idle +
    64 MB; the test asserts no such restart happened (same worker pids, no
    "worker-restart-memory" events). Results are checked bit for bit against the threaded run.
    Control: afterwards a task holding 96 MB must get its worker terminated by the same limits.
    """
    import dask
    from distributed import Client, LocalCluster

    bank = big_bank
    rng = np.random.default_rng(2)
    U = rng.standard_normal((4, bank.n))
    T = rng.standard_normal((bank.n, bank.n))
    w = rng.random(len(bank))
    task_bytes = 8 * 2**20

    def passes(eng):
        return {"quad": eng.quad_forms(U), "frob": eng.frobenius(T), "matvecs": eng.matvecs(U[0]),
                "combine": eng.combine(w)}

    with Engine(bank, task_bytes=task_bytes) as eng:
        ref = passes(eng)
    memory = {"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False,
              "distributed.worker.memory.pause": False, "distributed.worker.memory.terminate": 0.95,
              "distributed.worker.memory.monitor-interval": "20ms", "distributed.scheduler.allowed-failures": 0}
    with dask.config.set(memory), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                         memory_limit="4GB") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        with Engine(bank, client=client, task_bytes=task_bytes) as eng:
            warm = passes(eng)  # warm-up: numba compiles, imports, zarr and thread pools settle in each worker
            import psutil

            pids = _worker_pids(client)
            idle = {pid: psutil.Process(pid).memory_info().rss for pid in pids.values()}
            for nanny in cluster.workers.values():
                pid = nanny.process.process.pid
                nanny.memory_manager.memory_limit = int((idle[pid] + TASK_HEADROOM) / 0.95)
            sampler = _RssSampler(pids.values())
            sampler.start()
            try:
                got = passes(eng)
            finally:
                sampler.stop()
        assert sampler.samples > 10
        assert _worker_pids(client) == pids, "a worker was restarted"
        assert not client.get_events("worker-restart-memory"), "Dask restarted a worker for its memory"
        from distributed import KilledWorker

        with pytest.raises(KilledWorker):  # the control: the limits in force do stop a greedy task
            client.submit(_hog, 96 * 2**20, pure=False).result(timeout=60)
        assert client.get_events("worker-restart-memory")
    used = {pid: sampler.peak[pid] - idle[pid] for pid in idle}
    print(f"worker memory used by tasks (MB): { {p: round(u / 2**20, 1) for p, u in used.items()} }")
    assert max(used.values()) < TASK_HEADROOM, f"worker memory used by tasks (bytes): {used}"
    assert max(used.values()) > 0, "the sampler saw nothing"
    for key in ref:
        assert np.array_equal(got[key], ref[key]), key
        assert np.array_equal(warm[key], ref[key]), key


# ---- TLS -----------------------------------------------------------------------------------------
def test_one_pass_over_a_tls_cluster_matches_threaded(kill_bank, tmp_path):
    """A LocalCluster on tls:// with temporary certificates (``Security.temporary()``, needs the
    ``cryptography`` package): every address is tls://; a client with certificates of another CA
    is refused; a client opened by ``open_client`` from a ``kind = "address"`` config naming the
    certificate files (written as PEM) runs a quad_forms pass that equals the threaded result bit
    for bit."""
    pytest.importorskip("cryptography")
    from distributed import Client, LocalCluster
    from distributed.security import Security

    from mklscale.runtime.cluster import open_client

    bank, _, _ = kill_bank
    U = np.random.default_rng(4).standard_normal((3, bank.n))
    with Engine(bank) as eng:
        ref = eng.quad_forms(U)
    sec = Security.temporary()
    assert sec.require_encryption
    (tmp_path / "ca.pem").write_text(sec.tls_ca_file)
    (tmp_path / "cert.pem").write_text(sec.tls_client_cert)
    (tmp_path / "key.pem").write_text(sec.tls_client_key)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, protocol="tls://", security=sec,
                      dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        config = {"kind": "address", "address": address, "timeout_s": 60, "min_workers": 1,
                  "tls_ca_file": str(tmp_path / "ca.pem"), "tls_cert": str(tmp_path / "cert.pem"),
                  "tls_key": str(tmp_path / "key.pem")}
        with open_client(config, quiet=True) as client:
            assert all(w.startswith("tls://") for w in client.scheduler_info()["workers"])
            with Engine(bank, client=client) as eng:
                got = eng.quad_forms(U)
        with pytest.raises(OSError, match="TLS"):  # certificates of another CA: the handshake fails
            Client(address, security=Security.temporary(), timeout="5s").close()
    assert np.array_equal(got, ref)


def test_tls_config_keys_are_validated(tmp_path):
    from mklscale.errors import ConfigError
    from mklscale.runtime.cluster import (
        jobqueue_kwargs,
        load_cluster_config,
        open_client,
    )

    example = Path(__file__).parents[1] / "cluster" / "tls.toml"
    shipped = load_cluster_config(example)  # its paths are placeholders: checked only when opened
    assert shipped.address.startswith("tls://") and shipped.tls_ca_file and shipped.tls_cert and shipped.tls_key
    start = time.monotonic()
    with pytest.raises(ConfigError, match="tls_ca_file.*no such file"), open_client(shipped, quiet=True):
        pass
    assert time.monotonic() - start < 5
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    files = {"tls_ca_file": str(tmp_path / "ca.pem"), "tls_cert": str(tmp_path / "cert.pem"),
             "tls_key": str(tmp_path / "key.pem")}
    text = example.read_text()
    for key, value in files.items():
        text = "\n".join(f'{key} = "{value}"' if line.startswith(f"{key} ") else line for line in text.splitlines())
    (tmp_path / "tls.toml").write_text(text)
    config = load_cluster_config(tmp_path / "tls.toml")
    assert config.address.startswith("tls://") and config.tls_ca_file == files["tls_ca_file"]
    with pytest.raises(ConfigError, match="not tls://"):
        load_cluster_config({"kind": "address", "address": "tcp://127.0.0.1:8786", **files})
    with pytest.raises(ConfigError, match="tls_ca_file.*missing"):
        load_cluster_config({"kind": "address", "address": "tls://127.0.0.1:8786"})
    with pytest.raises(ConfigError, match="tls_cert.*missing"):
        load_cluster_config({"kind": "pbs", "tls_ca_file": files["tls_ca_file"]})
    with pytest.raises(ConfigError, match="'tls'.*true or false"):
        load_cluster_config({"kind": "local", "tls": "yes"})
    plain = jobqueue_kwargs(load_cluster_config({"kind": "slurm"}))
    assert "security" not in plain and "protocol" not in plain
    kw = jobqueue_kwargs(load_cluster_config({"kind": "slurm", **files}))
    assert kw["protocol"] == "tls://" and kw["security"].require_encryption
    assert kw["security"].tls_worker_cert == str(Path(files["tls_cert"]).resolve())
    assert kw["security"].tls_ca_file == str(Path(files["tls_ca_file"]).resolve())


def test_local_config_with_tls_runs_over_tls(kill_bank):
    """``kind = "local"`` with ``tls = true``: the cluster open_client starts listens on tls://
    only (temporary certificates) and a pass over it equals the threaded one."""
    pytest.importorskip("cryptography")
    from mklscale.runtime.cluster import open_client

    bank, _, _ = kill_bank
    u = np.linspace(-1.0, 1.0, bank.n)
    with Engine(bank) as eng:
        ref = eng.quad_forms(u)
    with open_client({"kind": "local", "tls": True, "n_workers": 1, "processes": False}, quiet=True) as client:
        assert client.scheduler.address.startswith("tls://") and client.security.require_encryption
        assert all(w.startswith("tls://") for w in client.scheduler_info()["workers"])
        with Engine(bank, client=client) as eng:
            got = eng.quad_forms(u)
    assert np.array_equal(got, ref)
