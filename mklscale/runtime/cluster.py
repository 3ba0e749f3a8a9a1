"""Dask clusters from small TOML configs: in-process, a running scheduler, or SLURM/PBS jobs.

A cluster config is a flat TOML file whose ``kind`` picks one of four ways to get Dask workers::

    kind = "local"      # a LocalCluster in this process (the default when no config is given)
    n_workers = 2

    kind = "address"    # connect to a scheduler someone started (`dask scheduler`, `dask worker`)
    address = "tcp://127.0.0.1:8786"

    kind = "slurm"      # submit worker jobs with dask-jobqueue (SLURMCluster / PBSCluster)
    cores = 4           # kind = "pbs" takes the same keys
    memory = "16GB"
    jobs = 2

TLS (Dask's ``distributed.security.Security``): ``kind = "local"`` takes ``tls = true``
(temporary certificates made in memory); ``address``, ``slurm`` and ``pbs`` take ``tls_ca_file``,
``tls_cert`` and ``tls_key`` (PEM files; see ``cluster/tls.toml`` and ``cluster/README.md``).

The keys of each kind, their types and defaults are the fields of :class:`LocalConfig`,
:class:`AddressConfig` and :class:`JobqueueConfig` (documented there; ``cluster/*.toml`` show all
of them with comments). Unknown keys, wrong types and impossible values raise
:class:`~mklscale.errors.ConfigError` naming the file and the key; nothing in a config is
evaluated.

:func:`open_client` turns a config into a ``distributed.Client`` and tears everything down
(workers stopped, batch jobs cancelled) when the ``with`` block ends. A scheduler that cannot be
reached or workers that never arrive raise :class:`~mklscale.errors.ClusterUnavailableError`
after a bounded wait, never a hang.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

from mklscale.config import read_toml
from mklscale.errors import ClusterUnavailableError, ConfigError
from mklscale.runtime.interrupt import held

KINDS = ("local", "address", "slurm", "pbs")

_WALLTIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Base of the per-kind configs. ``source`` names the file (or ``<dict>``) for messages."""

    kind: ClassVar[str] = ""
    source: str = field(default="<default>", compare=False, repr=False)

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for name in keys_of(type(self)):
            value = getattr(self, name)
            if not _matches(value, hints[name]):
                quoted = isinstance(value, str) and hints[name] in (int, float, bool)
                hint = " without quotes (TOML quotes only strings)" if quoted else ""
                self._fail(name, f"expected {_describe(hints[name])}, got {value!r} ({type(value).__name__}); "
                                 f"set it to {_describe(hints[name])}{hint}")
            if isinstance(value, list):  # frozen and hashable: lists become tuples
                object.__setattr__(self, name, tuple(value))
            elif hints[name] is float and isinstance(value, int):
                object.__setattr__(self, name, float(value))
        self._check()

    def _check(self) -> None:
        """Value checks beyond types; subclasses raise through :meth:`_fail`."""

    def _fail(self, key: str, problem: str) -> None:
        raise ConfigError(f"cluster config {self.source}: key '{key}' (kind = \"{self.kind}\"): {problem}")

    def _positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) <= 0:
                self._fail(name, f"must be > 0, got {getattr(self, name)!r}; give a positive value")


@dataclass(frozen=True, kw_only=True)
class LocalConfig(ClusterConfig):
    """``kind = "local"``: a ``distributed.LocalCluster`` started inside this process.

    Keys: ``n_workers`` (int, default 2), ``threads_per_worker`` (int, default 1), ``processes``
    (bool, default true: one OS process per worker, so numba/numpy code runs in parallel without
    the GIL), ``memory_limit`` (per worker: "auto" = the machine's memory split evenly, or a size
    such as "4GB"; 0 = no limit), ``dashboard`` (bool, default false: serve the dashboard on a free
    port and print its link), ``tls`` (bool, default false: scheduler, workers and client talk
    over ``tls://`` with temporary certificates, ``Security.temporary()``; needs ``cryptography``).
    """

    kind: ClassVar[str] = "local"
    n_workers: int = 2
    threads_per_worker: int = 1
    processes: bool = True
    memory_limit: str | int = "auto"
    dashboard: bool = False
    tls: bool = False

    def _check(self) -> None:
        self._positive("n_workers", "threads_per_worker")
        _check_bytes(self, "memory_limit", allow=("auto",))


@dataclass(frozen=True, kw_only=True)
class AddressConfig(ClusterConfig):
    """``kind = "address"``: connect to a running scheduler.

    Keys: ``address`` (str, required, e.g. "tcp://10.0.0.5:8786"), ``timeout_s`` (number, default
    10: how long to try to connect, and then how long to wait for ``min_workers``),
    ``min_workers`` (int, default 1: wait until that many workers are connected; 0 = don't wait).
    Start the other side with ``dask scheduler --port 8786`` and ``dask worker tcp://HOST:8786``.
    For a scheduler on ``tls://HOST:PORT``: ``tls_ca_file`` (the CA certificate, PEM),
    ``tls_cert`` (this client's certificate, PEM, signed by that CA) and ``tls_key`` (its private
    key; leave it out when ``tls_cert`` holds the key too). All three are paths; relative paths
    are taken from the directory mklscale runs in.
    """

    kind: ClassVar[str] = "address"
    address: str
    timeout_s: float = 10.0
    min_workers: int = 1
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def _check(self) -> None:
        if not self.address or any(c.isspace() for c in self.address) or ":" not in self.address:
            self._fail("address", f"expected 'tcp://HOST:PORT' (e.g. \"tcp://127.0.0.1:8786\"), got {self.address!r}")
        self._positive("timeout_s")
        if self.min_workers < 0:
            self._fail("min_workers", f"must be >= 0, got {self.min_workers}")
        _check_tls(self, self.address.startswith("tls://"))


@dataclass(frozen=True, kw_only=True)
class JobqueueConfig(ClusterConfig):
    """``kind = "slurm"`` or ``"pbs"``: Dask workers in batch jobs (dask-jobqueue).

    Each job runs ``processes`` worker processes sharing ``cores`` cores and ``memory``; the
    scheduler runs in this process and must be reachable from the compute nodes. Keys:

    - ``cores`` (int, default 1), ``memory`` (str, default "4GB"), ``processes`` (int, default 1):
      resources of ONE job and how many Dask workers it runs.
    - ``jobs`` (int, default 1): how many such jobs to submit.
    - ``walltime`` (str, default "01:00:00"), ``queue`` (partition / queue), ``account``.
    - ``job_directives`` (list of str): extra ``#SBATCH`` / ``#PBS`` lines, e.g. ["--qos=short"].
    - ``job_script_prologue`` (list of str): shell lines run before the worker starts, e.g.
      ["source /path/to/venv/bin/activate"].
    - ``interface`` (str): network interface for scheduler and workers (e.g. "ib0" on InfiniBand).
    - ``local_directory``: workers' scratch directory; ``log_directory``: where job output goes.
    - ``python`` (str, default: this interpreter): the Python that starts workers on the nodes.
    - ``startup_timeout_s`` (number, default 120): how long to wait for the first worker.
    - ``dashboard`` (bool, default false): serve the dashboard on a free port and print its link.
    - ``tls_ca_file``, ``tls_cert``, ``tls_key`` (str): run scheduler, workers and client over
      ``tls://`` with these PEM files (CA certificate, a certificate signed by it, its key); the
      same paths must be readable on the compute nodes (a shared file system).
    """

    kind: ClassVar[str] = "slurm"
    cores: int = 1
    memory: str = "4GB"
    processes: int = 1
    jobs: int = 1
    walltime: str = "01:00:00"
    queue: str | None = None
    account: str | None = None
    job_directives: tuple[str, ...] = ()
    job_script_prologue: tuple[str, ...] = ()
    interface: str | None = None
    local_directory: str | None = None
    log_directory: str | None = None
    python: str = field(default_factory=lambda: sys.executable)
    startup_timeout_s: float = 120.0
    dashboard: bool = False
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def _check(self) -> None:
        _check_tls(self, self.tls_ca_file is not None or self.tls_cert is not None or self.tls_key is not None)
        self._positive("cores", "processes", "jobs", "startup_timeout_s")
        if self.processes > self.cores:
            self._fail("processes", f"{self.processes} worker processes per job need at least as many cores (cores = {self.cores})")
        _check_bytes(self, "memory")
        if not _WALLTIME.match(self.walltime):
            self._fail("walltime", f"expected [D-]HH:MM:SS such as \"01:00:00\", got {self.walltime!r}")


@dataclass(frozen=True, kw_only=True)
class SlurmConfig(JobqueueConfig):
    """``kind = "slurm"``: see :class:`JobqueueConfig` (queue = partition, ``#SBATCH`` directives)."""

    kind: ClassVar[str] = "slurm"


@dataclass(frozen=True, kw_only=True)
class PBSConfig(JobqueueConfig):
    """``kind = "pbs"``: see :class:`JobqueueConfig` (``#PBS`` directives)."""

    kind: ClassVar[str] = "pbs"


CONFIG_CLASSES: dict[str, type[ClusterConfig]] = {"local": LocalConfig, "address": AddressConfig,
                                                  "slurm": SlurmConfig, "pbs": PBSConfig}


def keys_of(cls: type[ClusterConfig]) -> list[str]:
    """The TOML keys a config class accepts (its fields, without ``source``)."""
    return [f.name for f in fields(cls) if f.name != "source"]


def load_cluster_config(path_or_dict: str | Path | Mapping[str, Any] | ClusterConfig | None) -> ClusterConfig:
    """Read and validate a cluster config: a TOML file path, an already parsed mapping, a config
    object (returned as is) or None (the default: local, 2 worker processes, 1 thread each).

    Raises ConfigError for a missing/unparsable file, a missing or unknown ``kind``, unknown keys
    (the message lists the allowed ones), wrong types and impossible values.
    """
    if path_or_dict is None:
        return LocalConfig()
    if isinstance(path_or_dict, ClusterConfig):
        return path_or_dict
    if isinstance(path_or_dict, Mapping):
        return _from_mapping(path_or_dict, "<dict>")
    path = Path(path_or_dict)
    data = read_toml(path, "cluster config")
    return _from_mapping(data, str(path))


def _from_mapping(data: Mapping[str, Any], source: str) -> ClusterConfig:
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in CONFIG_CLASSES:
        got = "no 'kind' key" if kind is None else f"kind = {kind!r}"
        raise ConfigError(f"cluster config {source}: {got}; set kind to one of {', '.join(map(repr, KINDS))}")
    cls = CONFIG_CLASSES[kind]
    allowed = keys_of(cls)
    unknown = sorted(set(data) - set(allowed) - {"kind"})
    if unknown:
        raise ConfigError(f"cluster config {source}: unknown key(s) {', '.join(map(repr, unknown))} for kind = \"{kind}\"; "
                          f"remove or rename them (allowed keys: kind, {', '.join(allowed)})")
    missing = [f.name for f in fields(cls) if f.name in allowed and f.name not in data
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"cluster config {source}: missing required key(s) {', '.join(map(repr, missing))} for kind = \"{kind}\"; "
                          "add them to the file")
    return cls(source=source, **{k: v for k, v in data.items() if k != "kind"})


def _matches(value: Any, tp: Any) -> bool:
    """Whether a parsed TOML value fits a field annotation (bool is not an int; int is a float)."""
    if get_origin(tp) in (Union, types.UnionType):
        return any(_matches(value, arg) for arg in get_args(tp))
    if tp is type(None):
        return value is None
    if get_origin(tp) is tuple:
        return isinstance(value, (list, tuple)) and all(_matches(v, get_args(tp)[0]) for v in value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, tp)


def _describe(tp: Any) -> str:
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp) if a is not type(None))
    if get_origin(tp) is tuple:
        return f"a list of {_describe(get_args(tp)[0]).removeprefix('a ')}s"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _check_bytes(config: ClusterConfig, key: str, allow: tuple[str, ...] = ()) -> None:
    from dask.utils import parse_bytes

    value = getattr(config, key)
    if isinstance(value, int):
        if value < 0:
            config._fail(key, f"must be >= 0, got {value}")
        return
    if value in allow:
        return
    try:
        parse_bytes(value)
    except (ValueError, TypeError):
        config._fail(key, f"expected a size such as \"4GB\" or \"512MiB\"{' or ' + repr(allow[0]) if allow else ''}, got {value!r}")


TLS_KEYS = ("tls_ca_file", "tls_cert", "tls_key")


def _check_tls(config: ClusterConfig, wanted: bool) -> None:
    """TLS keys: CA and certificate together, and for ``kind = "address"`` a ``tls://`` address
    exactly when they are given. (That the files exist is checked when the cluster is opened, by
    :func:`security_of`: shipped example configs name files that only their users have.)"""
    given = [k for k in TLS_KEYS if getattr(config, k) is not None]
    address = getattr(config, "address", None)
    if given and address is not None and not address.startswith("tls://"):
        config._fail("address", f"{', '.join(given)} given but the address {address!r} is not tls://; "
                                "write it as \"tls://HOST:PORT\" or remove the tls_* keys")
    if not wanted:
        return
    if not given and _tls_from_dask_config():
        return  # `distributed.comm.tls.*` in Dask's own config (~/.config/dask) supplies the certificates
    for key in ("tls_ca_file", "tls_cert"):
        if getattr(config, key) is None:
            what = f"the address {address!r} is tls://" if address is not None and not given else f"{', '.join(given)} given"
            config._fail(key, f"missing: {what}; set tls_ca_file (the CA certificate) and tls_cert (a certificate "
                              "signed by it, with tls_key for its key), see cluster/tls.toml")
    for key in given:
        if not getattr(config, key):
            config._fail(key, "is empty; give the path of a PEM file (see cluster/README.md, TLS)")


def _tls_from_dask_config() -> bool:
    import dask

    return bool(dask.config.get("distributed.comm.tls.ca-file", None))


def security_of(config: ClusterConfig) -> Any:
    """The ``distributed.security.Security`` a config asks for, or None for plain tcp. Raises
    ConfigError naming the key when a certificate or key file does not exist."""
    from distributed.security import Security

    if isinstance(config, LocalConfig):
        if not config.tls:
            return None
        try:
            return Security.temporary()
        except ImportError:
            raise ClusterUnavailableError(f"cluster config {config.source}: tls = true needs the 'cryptography' package "
                                          "for temporary certificates: pip install cryptography") from None
    ca = getattr(config, "tls_ca_file", None)
    if ca is None:
        return None
    for key in TLS_KEYS:
        value = getattr(config, key)
        if value is not None and not Path(value).expanduser().is_file():
            config._fail(key, f"no such file: {value!r} (from {Path.cwd()}); give the path of a PEM file "
                              "(how to make them: cluster/README.md, section TLS)")
    # absolute paths: batch jobs start workers in other directories
    ca, cert = str(Path(ca).expanduser().resolve()), str(Path(config.tls_cert).expanduser().resolve())
    key = None if config.tls_key is None else str(Path(config.tls_key).expanduser().resolve())
    return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key,
                    require_encryption=True)


# ---------------------------------------------------------------------------------------------
# Opening a client


@contextlib.contextmanager
def open_client(config: ClusterConfig | str | Path | Mapping[str, Any] | None = None,
                quiet: bool = False) -> Iterator[Any]:
    """Start or connect to the cluster a config describes and yield a ``distributed.Client``.

    ``config`` is anything :func:`load_cluster_config` accepts (None = local default). Unless
    ``quiet``, prints one line (stderr) with the number of workers and the dashboard link, if any.
    On exit the client is closed and whatever was started is stopped (local workers, batch jobs
    cancelled), also when the process gets SIGTERM meanwhile (see :func:`_sigterm_unwinds`); a
    scheduler given by address is left running. Raises ClusterUnavailableError when the scheduler
    cannot be reached or no worker arrives in time.
    """
    config = load_cluster_config(config)
    starters = {"local": _local, "address": _address, "slurm": _jobqueue, "pbs": _jobqueue}
    with _sigterm_unwinds(), starters[config.kind](config) as client:
        if not quiet:
            _announce(client, config)
        yield client


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While a cluster is open, SIGTERM (a batch system's preemption or time-limit warning) raises
    SystemExit(143) so ``with`` blocks unwind and batch jobs get cancelled, instead of the process
    dying on the spot and leaving worker jobs queued until their walltime. Only in the main thread
    and only when SIGTERM has its default action (a handler the caller installed is kept)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise:  # a handler set inside the block is not ours to undo
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _local(config: LocalConfig) -> Iterator[Any]:
    from distributed import Client, LocalCluster

    security = security_of(config)
    tls = {} if security is None else {"protocol": "tls://", "security": security}
    with contextlib.ExitStack() as stack:
        # workers started here ignore Ctrl-C: it stops only this process, which then closes them
        # (runtime.interrupt.held)
        with held():
            try:
                cluster = stack.enter_context(LocalCluster(
                    n_workers=config.n_workers, threads_per_worker=config.threads_per_worker,
                    processes=config.processes, memory_limit=config.memory_limit,
                    dashboard_address=":0" if config.dashboard else None,
                    scheduler_kwargs={"dashboard_address": ":0"}, **tls))  # its bare HTTP port: any free one
            except Exception as exc:  # noqa: BLE001 - any failure to start is reported the same way
                raise ClusterUnavailableError(f"could not start a local Dask cluster ({config.n_workers} workers, "
                                              f"processes={config.processes}): {exc}; try fewer workers or "
                                              "processes = false") from exc
            client = stack.enter_context(Client(cluster, security=security))
        yield client


@contextlib.contextmanager
def _address(config: AddressConfig) -> Iterator[Any]:
    from distributed import Client

    start = time.monotonic()
    try:
        client = Client(config.address, timeout=f"{config.timeout_s}s", security=security_of(config))
    except (OSError, TimeoutError) as exc:
        raise ClusterUnavailableError(
            f"no Dask scheduler answered at {config.address} within {config.timeout_s:g}s ({exc}). "
            f"Check that `dask scheduler` runs there and the port is reachable from here, or raise "
            f"timeout_s in {config.source}") from None
    with client:
        left = max(config.timeout_s - (time.monotonic() - start), 1.0)
        _wait_for_workers(client, config.min_workers, left,
                          f"scheduler {config.address} has fewer than {config.min_workers} worker(s) after "
                          f"{config.timeout_s:g}s; start some with `dask worker {config.address}` or lower "
                          f"min_workers in {config.source}")
        yield client


@contextlib.contextmanager
def _jobqueue(config: JobqueueConfig) -> Iterator[Any]:
    from distributed import Client

    cluster_class, submit = _jobqueue_class(config)
    kwargs = jobqueue_kwargs(config)  # a missing certificate file is a ConfigError, not a cluster failure
    try:
        cluster = cluster_class(**kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ClusterUnavailableError(f"could not set up a {config.kind.upper()} Dask cluster from {config.source}: {exc}") from exc
    with cluster, Client(cluster) as client:  # the client takes the cluster's security
        cluster.scale(jobs=config.jobs)
        log_hint = f"the job logs in {config.log_directory}" if config.log_directory else "the job output files"
        _wait_for_workers(client, 1, config.startup_timeout_s,
                          f"no Dask worker joined within {config.startup_timeout_s:g}s after submitting {config.jobs} "
                          f"{config.kind.upper()} job(s) with `{submit}`. Check the queue (jobs still pending? "
                          f"{'squeue --me' if config.kind == 'slurm' else 'qstat -u $USER'}), {log_hint}, and that "
                          f"compute nodes reach the scheduler at {cluster.scheduler_address} (set `interface`); "
                          f"or raise startup_timeout_s in {config.source}")
        yield client


def _jobqueue_class(config: JobqueueConfig) -> tuple[type, str]:
    try:
        import dask_jobqueue
    except ImportError:
        raise ClusterUnavailableError(f"cluster config {config.source} asks for {config.kind.upper()} jobs, which need "
                                      f"dask-jobqueue: pip install 'mklscale[hpc]'") from None
    submit = {"slurm": "sbatch", "pbs": "qsub"}[config.kind]
    if shutil.which(submit) is None:
        raise ClusterUnavailableError(f"cluster config {config.source} asks for {config.kind.upper()} jobs but `{submit}` "
                                      f"is not on PATH; run on a login node of the cluster (or use kind = \"local\")")
    cls = dask_jobqueue.SLURMCluster if config.kind == "slurm" else dask_jobqueue.PBSCluster
    return cls, submit


def jobqueue_kwargs(config: JobqueueConfig) -> dict[str, Any]:
    """The dask-jobqueue ``SLURMCluster`` / ``PBSCluster`` arguments a config maps to."""
    kwargs = dict(cores=config.cores, memory=config.memory, processes=config.processes, walltime=config.walltime,
                  queue=config.queue, account=config.account, interface=config.interface,
                  local_directory=config.local_directory, log_directory=config.log_directory,
                  python=config.python, job_extra_directives=list(config.job_directives),
                  job_script_prologue=list(config.job_script_prologue), job_name="mklscale-worker",
                  scheduler_options={"dashboard_address": ":0", "dashboard": config.dashboard})
    security = security_of(config)
    if security is not None:
        kwargs.update(security=security, protocol="tls://")
    return {k: v for k, v in kwargs.items() if v is not None}


def _wait_for_workers(client: Any, n: int, timeout_s: float, message: str) -> None:
    if n <= 0:
        return
    try:
        client.wait_for_workers(n, timeout=timeout_s)
    except (TimeoutError, OSError):
        raise ClusterUnavailableError(message) from None


def _announce(client: Any, config: ClusterConfig) -> None:
    link = _dashboard_link(client, config)
    line = f"mklscale: Dask cluster ({config.kind}) with {len(client.nthreads())} worker(s)"
    print(line + (f"; dashboard: {link}" if link else ""), file=sys.stderr, flush=True)


def _dashboard_link(client: Any, config: ClusterConfig) -> str | None:
    """The dashboard URL, or None when there is none. A scheduler started without a dashboard still
    lists its bare HTTP port, so for a scheduler we did not start the page is fetched (1 s) first."""
    if not getattr(config, "dashboard", True):
        return None
    try:
        link = client.dashboard_link
    except Exception:  # noqa: BLE001 - no HTTP service at all
        return None
    if not link or config.kind != "address":
        return link or None
    import urllib.request

    try:
        with urllib.request.urlopen(link, timeout=1.0) as response:
            return link if response.status == 200 else None
    except (OSError, ValueError):
        return None
