"""Network namespaces joined by a bridge: the machinery under cluster/hosts.py.

One run of the harness owns every namespace whose name starts with its *run name*
``mklh-<owner pid>-<token>``; the bridge lives in a namespace of its own (``<run>-switch``), each
host in ``<run>-<host>`` with one veth link (``eth0`` inside, ``v-<host>`` on the bridge). Interface
names are private to their namespace, so parallel runs never collide, and no address, route or
rule is ever added to the namespace the harness was started in. Removing a run's namespaces
removes its links and bridge with them.

Three layers remove a run: ``Network.close`` (normal exit, exceptions, Ctrl-C), a reaper process
that cleans up as soon as the owner process dies (even by SIGKILL), and ``clean_stale`` at the
start of every run (a run whose owner is gone, e.g. the reaper was killed too).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

FAMILY = "mklh"
NETNS_DIR = Path("/run/netns")
SUBNET = "10.77.0"  # private: no route leads out of the run's namespaces
_RUN_RE = re.compile(rf"^({FAMILY}-(\d+)-[0-9a-f]+)-")


class HostsUnavailable(RuntimeError):
    """The machine cannot make hosts (not root, no iproute2, no namespaces); the message says why."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; a failure raises with the command and ip's own message."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def in_ns(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a short command inside namespace ``ns`` (tc, iptables, probes)."""
    proc = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` in {ns} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def check_machine() -> None:
    """Raise HostsUnavailable saying what is missing: root, iproute2, unshare, namespaces."""
    if os.geteuid() != 0:
        raise HostsUnavailable("making hosts needs root (network and mount namespaces); run as root")
    for tool in ("ip", "tc", "unshare", "mount"):
        if shutil.which(tool) is None:
            raise HostsUnavailable(f"`{tool}` is not installed (iproute2 / util-linux); run cluster/setup_hosts.sh")
    name = f"{FAMILY}-{os.getpid()}-probe{secrets.token_hex(3)}-x"
    proc = ip("netns", "add", name, check=False)
    if proc.returncode != 0:
        raise HostsUnavailable(f"cannot create a network namespace: {proc.stderr.strip()}")
    try:
        veth = ip("-n", name, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1", check=False)
        bridge = ip("-n", name, "link", "add", "br0", "type", "bridge", check=False)
        for what, p in (("a veth pair", veth), ("a bridge", bridge)):
            if p.returncode != 0:
                raise HostsUnavailable(f"cannot create {what} in a namespace: {p.stderr.strip()}")
    finally:
        ip("netns", "del", name, check=False)


def has_iptables() -> bool:
    """Whether packet drops by rule (loss, partitions that keep the link up) can be set."""
    return shutil.which("iptables") is not None


def _alive(pid: int, ns_created: float) -> bool:
    """Whether the owner ``pid`` still runs and is the process that created the namespace
    (a pid reused by a newer process does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK") <= ns_created + 2.0


def namespaces(prefix: str = FAMILY + "-") -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob(prefix + "*")) if NETNS_DIR.is_dir() else []


def kill_processes(ns: str) -> None:
    """SIGKILL every process in the network namespace ``ns`` (a host's power going off), until none is left
    (at most about 5 s: processes forked meanwhile are killed in the next round)."""
    for _ in range(50):
        pids = [int(p) for p in ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


_RATE_UNITS = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}


def rate_bytes(rate: str) -> float:
    """Bytes per second of a tc rate in kbit, mbit or gbit ('200mbit' -> 25e6); ValueError otherwise."""
    for unit, factor in _RATE_UNITS.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * factor
    raise ValueError(f"a rate must end in kbit, mbit or gbit (tc syntax), got {rate!r}")


def _burst_for(rate: str) -> str:
    """tbf's bucket for ``rate`` (tc syntax): 20 ms of it, at least 64 kB (other units: 64 kB)."""
    try:
        per_s = rate_bytes(rate)
    except ValueError:
        per_s = 0.0
    return f"{max(64 * 1024, int(per_s * 0.020)) // 1024}kb"


def remove_namespace(ns: str) -> None:
    """SIGKILL every process in ``ns``, then delete it."""
    kill_processes(ns)
    ip("netns", "del", ns, check=False)


def remove_run(run: str) -> list[str]:
    """Remove every namespace of run ``run`` (hosts first, the switch last); returns their names."""
    found = namespaces(run + "-")
    for ns in sorted(found, key=lambda n: n.endswith("-switch")):
        remove_namespace(ns)
    return found


def clean_stale() -> list[str]:
    """Remove the namespaces of runs whose owner process is gone; returns their names."""
    removed = []
    for ns in namespaces():
        m = _RUN_RE.match(ns)
        if not m:
            continue
        try:
            created = (NETNS_DIR / ns).stat().st_mtime
        except FileNotFoundError:
            continue
        if not _alive(int(m.group(2)), created):
            remove_namespace(ns)
            removed.append(ns)
    return removed


class Network:
    """A bridge in a namespace of its own and hosts attached to it, one address each."""

    def __init__(self):
        self.run = f"{FAMILY}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.run}-switch"
        self.hosts: dict[str, str] = {}  # host name -> address
        self._reaper: subprocess.Popen | None = None
        ip("netns", "add", self.switch)
        self._start_reaper()
        ip("-n", self.switch, "link", "set", "lo", "up")
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")

    def ns(self, host: str) -> str:
        return f"{self.run}-{host}"

    def add_host(self, host: str) -> str:
        """A namespace for ``host`` on the bridge; returns its address."""
        if not re.fullmatch(r"[a-z][a-z0-9]{0,12}", host) or host == "switch" or host in self.hosts:
            raise ValueError(f"bad or repeated host name {host!r} (lowercase letters and digits, up to 13)")
        address = f"{SUBNET}.{len(self.hosts) + 2}"
        ns = self.ns(host)
        ip("netns", "add", ns)
        ip("-n", self.switch, "link", "add", f"v-{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("-n", self.switch, "link", "set", f"v-{host}", "master", "br0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        self.hosts[host] = address
        return address

    # ---- link faults -------------------------------------------------------------------------------
    def known(self, host: str) -> str:
        """``host``, or a ValueError naming the hosts there are."""
        if host not in self.hosts:
            raise ValueError(f"no host {host!r} in this run; hosts: {', '.join(self.hosts) or 'none'}")
        return host

    def link(self, host: str, up: bool) -> None:
        """Take ``host``'s link down (a pulled cable: nothing passes) or bring it back up."""
        self.known(host)
        ip("-n", self.switch, "link", "set", f"v-{host}", "up" if up else "down")

    def drop(self, host: str, probability: float | None) -> None:
        """Drop each packet to and from ``host`` with ``probability`` (1.0: a partition with the link
        up, as netem loss 100 %); None removes the rule. Needs iptables (netfilter)."""
        self.known(host)
        if probability is not None and not 0.0 < probability <= 1.0:
            raise ValueError(f"drop probability must be in (0, 1], got {probability}")
        if not has_iptables():  # after the arguments: a bad one is refused as such on any machine
            raise HostsUnavailable("packet loss needs iptables (netfilter); run cluster/setup_hosts.sh")
        ns = self.ns(host)
        for chain in ("INPUT", "OUTPUT"):
            in_ns(ns, "iptables", "-F", chain)
            if probability is None:
                continue
            match = [] if probability >= 1.0 else ["-m", "statistic", "--mode", "random", "--probability",
                                                   f"{probability:.6f}"]
            # loopback stays: a host's own processes keep talking to each other
            in_ns(ns, "iptables", "-A", chain, "!", "-i" if chain == "INPUT" else "-o", "lo", *match, "-j", "DROP")

    def rate(self, host: str, rate: str | None, burst: str | None = None) -> None:
        """Limit ``host``'s link to ``rate`` (tc syntax, e.g. '200mbit') in both directions with tbf;
        None removes the limit. ``burst`` (None: 20 ms of the rate, at least 64 kB): the bucket must
        outlast the moments the kernel cannot release packets on time, or a busy machine (several
        hosts on 2 cores) delivers far less than the rate."""
        self.known(host)
        burst = burst or _burst_for(rate or "0kbit")
        for ns, dev in ((self.ns(host), "eth0"), (self.switch, f"v-{host}")):
            if rate is None:
                in_ns(ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            else:
                in_ns(ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                      "latency", "50ms")

    # ---- teardown ---------------------------------------------------------------------------------
    def _start_reaper(self) -> None:
        """A process in its own session that removes this run once this process dies (SIGKILL too)."""
        self._reaper = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "reap", self.run, str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def close(self) -> None:
        """Remove every namespace of the run: processes, links, bridge. Safe to call twice."""
        remove_run(self.run)
        self.hosts.clear()
        if self._reaper is not None and self._reaper.poll() is None:
            self._reaper.terminate()
            self._reaper.wait(10)


def _reap(run: str, owner: int) -> None:
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        remove_run(run)
        return
    import select

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the owner closed the run itself
    select.select([fd], [], [])
    remove_run(run)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "reap":
        _reap(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 2 and sys.argv[1] == "clean":
        for ns in clean_stale():
            print(f"removed stale namespace {ns}")
    else:
        sys.exit(f"usage: {sys.argv[0]} clean | reap RUN OWNER_PID")
