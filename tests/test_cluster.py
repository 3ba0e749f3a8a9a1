"""Cluster runtime: configs, and real clusters (local, a scheduler address, single-node SLURM).

Nothing here is mocked. The ``cluster`` tests start a real ``dask scheduler`` and two ``dask
worker`` processes; the ``slurm`` tests submit real jobs and skip only when no SLURM controller
answers (set one up with ``cluster/slurm/setup_single_node.sh``, as .ci/run does). Tests that run
the pipeline command skip while ``pipelines/tiny.toml`` or ``mklscale/pipeline/`` is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mklscale.errors import ClusterUnavailableError, ConfigError
from mklscale.runtime.cluster import (
    AddressConfig,
    LocalConfig,
    PBSConfig,
    SlurmConfig,
    jobqueue_kwargs,
    load_cluster_config,
    open_client,
)

from _processes import stop_processes

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "cluster").glob("*.toml"))
TINY = ROOT / "pipelines" / "tiny.toml"
SBATCH_TEMPLATE = ROOT / "cluster" / "slurm" / "mklscale.sbatch"
# BLAS threads on top of Dask worker processes only oversubscribe the 2 CI cores.
QUIET_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

needs_pipeline = pytest.mark.skipif(
    not (TINY.is_file() and (ROOT / "mklscale" / "pipeline").is_dir()),
    reason="pipelines/tiny.toml or mklscale/pipeline/ does not exist yet")


# ---------------------------------------------------------------------------------------------
# Config loading


def test_every_shipped_config_loads():
    assert {p.name for p in CONFIGS} >= {"local.toml", "address.toml", "slurm.toml", "pbs.toml"}
    kinds = {load_cluster_config(p).kind for p in CONFIGS}
    assert kinds >= {"local", "address", "slurm", "pbs"}


def test_shipped_configs_have_the_documented_values():
    assert load_cluster_config(ROOT / "cluster" / "local.toml") == LocalConfig()
    assert load_cluster_config(ROOT / "cluster" / "address.toml").address == "tcp://127.0.0.1:8786"
    slurm = load_cluster_config(ROOT / "cluster" / "slurm.toml")
    assert isinstance(slurm, SlurmConfig) and slurm.cores == 4 and slurm.queue == "debug"
    assert isinstance(load_cluster_config(ROOT / "cluster" / "pbs.toml"), PBSConfig)


def test_default_is_two_local_worker_processes():
    config = load_cluster_config(None)
    assert config == LocalConfig(n_workers=2, threads_per_worker=1, processes=True)


def test_unknown_key_names_the_key_the_file_and_the_allowed_keys(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('kind = "local"\nn_worker = 3\n')
    with pytest.raises(ConfigError) as err:
        load_cluster_config(path)
    msg = str(err.value)
    assert "'n_worker'" in msg and str(path) in msg and "n_workers" in msg and "allowed keys" in msg


@pytest.mark.parametrize("data, key, expected", [
    ({"kind": "local", "n_workers": "2"}, "n_workers", "an integer"),
    ({"kind": "local", "processes": 1}, "processes", "true or false"),
    ({"kind": "address", "address": "tcp://h:1", "timeout_s": "10"}, "timeout_s", "a number"),
    ({"kind": "slurm", "job_directives": "--qos=x"}, "job_directives", "a list of strings"),
    ({"kind": "slurm", "cores": True}, "cores", "an integer"),
])
def test_wrong_type_names_key_and_expected_type(data, key, expected):
    with pytest.raises(ConfigError, match=f"'{key}'.*expected {expected}"):
        load_cluster_config(data)


@pytest.mark.parametrize("data, key", [
    ({"kind": "local", "n_workers": 0}, "n_workers"),
    ({"kind": "local", "memory_limit": "lots"}, "memory_limit"),
    ({"kind": "address", "address": "nowhere"}, "address"),
    ({"kind": "slurm", "walltime": "2 hours"}, "walltime"),
    ({"kind": "pbs", "cores": 2, "processes": 4}, "processes"),
])
def test_impossible_values_are_config_errors(data, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_cluster_config(data)


@pytest.mark.parametrize("data, words", [
    ({"kind": "kubernetes"}, "'kubernetes'"),
    ({"n_workers": 2}, "no 'kind'"),
    ({"kind": "address"}, "missing required key(s) 'address'"),
])
def test_bad_kind_or_missing_required_key(data, words):
    with pytest.raises(ConfigError) as err:
        load_cluster_config(data)
    assert words in str(err.value) and ("'local', 'address', 'slurm', 'pbs'" in str(err.value) or "address" in words)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_cluster_config(tmp_path / "absent.toml")
    (tmp_path / "bad.toml").write_text('kind = "local\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_cluster_config(tmp_path / "bad.toml")


def test_jobqueue_keys_map_to_dask_jobqueue_arguments(tmp_path):
    config = load_cluster_config({"kind": "slurm", "cores": 2, "memory": "3GB", "job_directives": ["--qos=short"],
                                  "job_script_prologue": ["echo hi"], "queue": "debug", "account": "proj"})
    kwargs = jobqueue_kwargs(config)
    assert kwargs["job_extra_directives"] == ["--qos=short"] and kwargs["job_script_prologue"] == ["echo hi"]
    assert kwargs["queue"] == "debug" and kwargs["account"] == "proj" and kwargs["python"] == sys.executable
    assert "interface" not in kwargs  # unset keys are left to dask-jobqueue's defaults
    dask_jobqueue = pytest.importorskip("dask_jobqueue")
    with dask_jobqueue.SLURMCluster(**kwargs) as cluster:  # starts a scheduler; submits no job
        script = cluster.job_script()
    assert "#SBATCH --qos=short" in script and "#SBATCH -p debug" in script and "#SBATCH -A proj" in script


@pytest.mark.parametrize("name, directive", [("slurm.toml", "#SBATCH --cpus-per-task=4"),
                                             ("pbs.toml", "#PBS -l select=1:ncpus=4")])
def test_shipped_jobqueue_configs_render_job_scripts(name, directive, tmp_path, monkeypatch):
    dask_jobqueue = pytest.importorskip("dask_jobqueue")
    monkeypatch.chdir(tmp_path)  # log_directory = "dask-logs" is created relative to the working directory
    config = load_cluster_config(ROOT / "cluster" / name)
    cls = dask_jobqueue.SLURMCluster if config.kind == "slurm" else dask_jobqueue.PBSCluster
    with cls(**jobqueue_kwargs(config)) as cluster:
        script = cluster.job_script()
    assert directive in script and "01:00:00" in script and sys.executable in script


# ---------------------------------------------------------------------------------------------
# Opening clients


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_fails_within_the_timeout():
    timeout = 2.0
    start = time.monotonic()
    with pytest.raises(ClusterUnavailableError, match="no Dask scheduler answered") as err:
        with open_client(AddressConfig(address=f"tcp://127.0.0.1:{_free_port()}", timeout_s=timeout)):
            pass
    assert time.monotonic() - start < timeout + 3.0
    assert "dask scheduler" in str(err.value)


def test_jobqueue_without_submit_command_says_so(monkeypatch, tmp_path):
    pytest.importorskip("dask_jobqueue")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no qsub here
    with pytest.raises(ClusterUnavailableError, match="`qsub` is not on PATH"):
        with open_client({"kind": "pbs"}):
            pass


# Tasks below call only stdlib functions (os.getpid, os.getenv): workers outside this process
# (`dask worker`, SLURM jobs) cannot import this test module, so its own functions would not unpickle.


def _pid_on_each_worker(client) -> dict[str, int]:
    """Run os.getpid as a task pinned to each worker in turn: proves every worker executes tasks."""
    workers = sorted(client.nthreads())
    futures = {w: client.submit(os.getpid, workers=[w], allow_other_workers=False, pure=False) for w in workers}
    return {w: f.result() for w, f in futures.items()}


def _checked_sum_and_workers(client) -> set[str]:
    """A dask.array reduction over 16 chunks (result checked); returns the workers that ran it."""
    import dask.array as da
    from distributed import get_task_stream

    x = da.arange(1_600_000, chunks=100_000, dtype="float64")
    with get_task_stream(client) as stream:
        assert client.compute(x.sum()).result() == 1_600_000 * 1_599_999 / 2
    return {t["worker"] for t in stream.data}


def test_default_local_cluster_runs_on_two_processes(capsys):
    with open_client(None) as client:
        pids = _pid_on_each_worker(client)
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    assert "Dask cluster (local) with 2 worker(s)" in capsys.readouterr().err


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:  # the child keeps its own copy of the file descriptor
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **QUIET_ENV))


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dask scheduler exited ({proc.returncode}):\n{log.read_text()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"dask scheduler not listening on {port} after {timeout_s}s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def scheduler_address(tmp_path_factory):
    """A real `dask scheduler` on a free port with two `dask worker` processes (1 thread each)."""
    logs = tmp_path_factory.mktemp("dask-logs")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [_spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                    logs / "scheduler.log")]
    try:
        _wait_listening(port, procs[0], 60, logs / "scheduler.log")
        for i in range(2):
            procs.append(_spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                                 "--no-dashboard", "--name", f"w{i}", "--local-directory", str(logs)],
                                logs / f"worker{i}.log"))
        yield address
    finally:  # workers first: a worker told to stop while its scheduler closes can hang in shutdown
        stop_processes(procs[1:])
        stop_processes(procs[:1])


@pytest.mark.cluster
def test_address_client_uses_both_workers(scheduler_address, capsys):
    config = AddressConfig(address=scheduler_address, timeout_s=60, min_workers=2)
    with open_client(config) as client:
        pids = _pid_on_each_worker(client)
        ran_on = _checked_sum_and_workers(client)
    assert len(pids) == 2 and len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    assert ran_on == set(pids), "the reduction did not use both workers"
    assert "Dask cluster (address) with 2 worker(s)" in capsys.readouterr().err


@pytest.mark.cluster
def test_address_with_too_few_workers_fails_within_the_timeout(scheduler_address):
    start = time.monotonic()
    with pytest.raises(ClusterUnavailableError, match="fewer than 5 worker"):
        with open_client(AddressConfig(address=scheduler_address, timeout_s=2, min_workers=5), quiet=True):
            pass
    assert time.monotonic() - start < 5.0


def _run_pipeline_cli(cluster_toml: Path, out: Path, timeout_s: float = 300) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mklscale.cli", "run", str(TINY), "--cluster", str(cluster_toml),
                           "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=timeout_s,
                          cwd=ROOT, env=dict(os.environ, **QUIET_ENV))
    assert proc.returncode == 0, f"mklscale run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return _check_results(out)


def _check_results(out: Path) -> dict:
    results = json.loads((out / "results.json").read_text())
    assert isinstance(results["solvers"], list) and results["solvers"]
    for solver in results["solvers"]:
        assert isinstance(solver["metrics"], dict) and solver["metrics"]
    return results


@pytest.mark.cluster
@needs_pipeline
def test_pipeline_on_a_scheduler_address(scheduler_address, tmp_path):
    cluster_toml = tmp_path / "address.toml"
    cluster_toml.write_text(f'kind = "address"\naddress = "{scheduler_address}"\ntimeout_s = 30\nmin_workers = 2\n')
    results = _run_pipeline_cli(cluster_toml, tmp_path / "run")
    if "cluster" in results:
        assert results["cluster"]["kind"] == "address" and results["cluster"]["workers"] == 2


# ---------------------------------------------------------------------------------------------
# Single-node SLURM (cluster/slurm/setup_single_node.sh)


@pytest.fixture(scope="session")
def slurm():
    """Skip unless a SLURM controller answers and a node is up; returns the node's state."""
    setup = "run cluster/slurm/setup_single_node.sh as root to start a single-node SLURM"
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip(f"SLURM not installed (no sinfo/sbatch on PATH); {setup}")
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip(f"SLURM controller not responding (sinfo timed out); {setup}")
    states = [s.strip("*~#!%$@^-") for s in proc.stdout.split()]
    if proc.returncode != 0 or not any(s in ("idle", "mix", "alloc", "comp") for s in states):
        pytest.skip(f"SLURM has no usable node (sinfo rc={proc.returncode}, states={states}, "
                    f"{proc.stderr.strip()[:200]}); {setup}")
    return states


@pytest.fixture
def slurm_workers(slurm):
    """SLURM is up and dask-jobqueue (the `hpc` extra) is installed, so Dask workers can run in jobs."""
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue not installed: pip install 'mklscale[hpc]'")
    return slurm


def _queued_job_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i", "-t", "PD,R,CF"], capture_output=True, text=True, timeout=20)
    return set(out.stdout.split())


def _wait_until_gone(job_ids: set[str], timeout_s: float = 30) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while (left := job_ids & _queued_job_ids()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _slurm_config(tmp_path: Path, **changes) -> SlurmConfig:
    """One 1-core worker job with its scratch space and logs under tmp_path."""
    keys = dict(cores=1, memory="1GB", processes=1, jobs=1, walltime="00:10:00", startup_timeout_s=90,
                local_directory=str(tmp_path / "scratch"), log_directory=str(tmp_path / "logs"))
    return SlurmConfig(**{**keys, **changes})


def _toml_value(v) -> str:
    return json.dumps(list(v) if isinstance(v, tuple) else v)  # JSON strings, lists and numbers are TOML too


@pytest.mark.slurm
def test_slurm_workers_run_inside_a_slurm_job(slurm_workers, tmp_path, capsys):
    with open_client(_slurm_config(tmp_path)) as client:
        in_task = client.submit(os.getenv, "SLURM_JOB_ID", pure=False).result()
        per_worker = client.run(os.getenv, "SLURM_JOB_ID")
        assert in_task is not None and in_task.isdigit()
        assert set(per_worker.values()) == {in_task}
        assert in_task in _queued_job_ids()
    assert "Dask cluster (slurm) with 1 worker(s)" in capsys.readouterr().err
    assert not _wait_until_gone({in_task}), f"SLURM job {in_task} was not cancelled on exit"
    assert list((tmp_path / "logs").glob(f"*{in_task}*")), "no job log in log_directory"


@pytest.mark.slurm
def test_slurm_workers_that_never_start_raise_and_jobs_are_cancelled(slurm_workers, tmp_path):
    before = _queued_job_ids()
    config = _slurm_config(tmp_path, job_directives=("--begin=now+1hour",), startup_timeout_s=3)
    start = time.monotonic()
    with pytest.raises(ClusterUnavailableError, match=r"no Dask worker joined within 3s.*squeue"):
        with open_client(config):
            pass
    assert time.monotonic() - start < 30
    assert not _wait_until_gone(_queued_job_ids() - before), "pending worker job left in the queue"


@pytest.mark.slurm
def test_sigterm_while_waiting_for_workers_cancels_the_jobs(slurm_workers, tmp_path):
    """SLURM preempting the driver (SIGTERM) must not leave its worker jobs queued: here a job that
    may only start in an hour would otherwise stay pending all that time."""
    keys = {"kind": "slurm", "cores": 1, "memory": "1GB", "walltime": "00:10:00", "startup_timeout_s": 120,
            "job_directives": ["--begin=now+1hour"], "log_directory": str(tmp_path / "logs")}
    driver = tmp_path / "driver.py"
    driver.write_text("from mklscale.runtime.cluster import open_client\n"
                      f"with open_client({keys!r}, quiet=True):\n"
                      "    pass\n")
    before = _queued_job_ids()
    new: set[str] = set()
    proc = subprocess.Popen([sys.executable, str(driver)], stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=dict(os.environ, **QUIET_ENV))
    try:
        deadline = time.monotonic() + 60
        while not (new := _queued_job_ids() - before) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        assert new, f"the driver submitted no job (exit {proc.poll()})"
        proc.terminate()
        assert proc.wait(timeout=30) == 143, proc.stderr.read()
        left = _wait_until_gone(new, timeout_s=15)
        assert not left, f"pending worker job(s) {left} still queued after the driver got SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
        if new:
            subprocess.run(["scancel", *new], timeout=20)  # whatever the outcome, leave no job behind


@pytest.mark.slow  # ~15-20 s on 2 cores; its two halves (workers in SLURM jobs, the pipeline on remote workers) run by default
@pytest.mark.slurm
@needs_pipeline
def test_pipeline_on_slurm_workers(slurm_workers, tmp_path):
    config = _slurm_config(tmp_path)
    cluster_toml = tmp_path / "slurm.toml"
    cluster_toml.write_text('kind = "slurm"\n' + "".join(
        f"{k} = {_toml_value(getattr(config, k))}\n"
        for k in ("cores", "memory", "processes", "jobs", "walltime", "local_directory", "log_directory",
                  "startup_timeout_s")))
    assert load_cluster_config(cluster_toml) == config
    results = _run_pipeline_cli(cluster_toml, tmp_path / "run")
    if "cluster" in results:
        assert results["cluster"]["kind"] == "slurm"


def _sbatch(env: dict, tmp_path: Path, *options: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", "--parsable", "--cpus-per-task=1", "--mem=2G", "--time=00:10:00",
                           f"--output={tmp_path}/job-%j.out", "--export=ALL", *options, str(SBATCH_TEMPLATE)],
                          capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                          env=dict(os.environ, **QUIET_ENV, **env))


@pytest.mark.slurm
def test_sbatch_template_execs_the_pipeline_and_forwards_sigterm(slurm, tmp_path):
    """A stand-in for `mklscale` records its arguments and whether the job's SIGTERM reached it."""
    fake = tmp_path / "fake_mklscale.py"
    fake.write_text(
        "import json, os, signal, sys, time, pathlib\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1]); out.mkdir(parents=True, exist_ok=True)\n"
        "def term(*_): (out / 'terminated').write_text(str(os.getpid())); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "(out / 'args.json').write_text(json.dumps(sys.argv[1:]))\n"
        "time.sleep(120)\n")
    out = tmp_path / "run"
    env = {"PIPELINE": "pipelines/x.toml", "CLUSTER": "cluster/local.toml", "OUT": str(out),
           "MKLSCALE": f"{sys.executable} {fake}"}
    proc = _sbatch(env, tmp_path, timeout_s=30)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while not (out / "args.json").exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert json.loads((out / "args.json").read_text()) == [
            "run", "pipelines/x.toml", "--cluster", "cluster/local.toml", "--out", str(out), "--resume"]
        # What --signal=B:TERM@120 does before the time limit: SIGTERM to the batch shell only.
        subprocess.run(["scancel", "--batch", "--signal=TERM", job], check=True, timeout=20)
        deadline = time.monotonic() + 30
        while not (out / "terminated").exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert (out / "terminated").exists(), "SIGTERM to the batch shell did not reach the pipeline process"
    finally:
        subprocess.run(["scancel", job], timeout=20)
    assert not _wait_until_gone({job})
    log = (tmp_path / f"job-{job}.out").read_text()
    assert f"mklscale job {job}" in log and "pipeline=pipelines/x.toml" in log


def _wait_for_job(job: str, timeout_s: float) -> str:
    """Poll `scontrol show job` until the job ends; returns e.g. "COMPLETED 0:0" (state, exit code).

    (`sbatch --wait` would do, but it polls at growing intervals and can add ~30 s.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=20).stdout
        fields = dict(f.split("=", 1) for f in info.split() if "=" in f)
        if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return f"{fields['JobState']} {fields.get('ExitCode')}"
        time.sleep(0.5)
    subprocess.run(["scancel", job], timeout=20)
    raise AssertionError(f"SLURM job {job} did not finish within {timeout_s}s (cancelled)")


@pytest.mark.slurm
@needs_pipeline
def test_sbatch_template_runs_the_tiny_pipeline(slurm, tmp_path):
    local = tmp_path / "local.toml"
    local.write_text('kind = "local"\nn_workers = 1\nthreads_per_worker = 1\nprocesses = false\n')  # a 1-CPU job
    out = tmp_path / "run"
    env = {"PIPELINE": str(TINY), "CLUSTER": str(local), "OUT": str(out), "MKLSCALE": f"{sys.executable} -m mklscale.cli"}
    proc = _sbatch(env, tmp_path, timeout_s=30)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    state = _wait_for_job(job, timeout_s=240)
    log = tmp_path / f"job-{job}.out"
    assert state == "COMPLETED 0:0", f"job {job}: {state}\n{log.read_text() if log.exists() else '(no output file)'}"
    assert f"mklscale job {job}" in log.read_text()
    _check_results(out)
