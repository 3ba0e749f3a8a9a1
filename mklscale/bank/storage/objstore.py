"""Banks on S3-compatible object stores (``s3://bucket/prefix``, issue 20): the client and the few
operations a bank needs from it.

The client is obstore (Rust's ``object_store`` crate), for metadata through zarr's
``zarr.storage.ObjectStore`` and for shard bytes directly: ranged GETs, single-part PUTs, HEADs.
It was chosen over zarr's fsspec store (s3fs / aiobotocore) because it read about twice as fast
here (benchmarks/bench_objstore.py; docs/design.md, "Storage backends"), retries 5xx / slow-down
responses and dropped connections with exponential backoff by itself, and offers conditional
writes (``mode="create"``).

Configuration comes from the standard environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, read by obstore itself) and
may be overridden by storage options carried by the ``ObjectURL`` (``location``). Nothing here
writes or logs them; error messages name the URL only.

A shard is one object, written with one PUT (atomic: readers see the old object or the new one)
and checked afterwards (``put_verified``: its size, and its MD5 where the store's ETag is one) before
the build may mark its kernels complete. Every request has a bounded wait: it is retried with
exponential backoff (0.1 s doubling to at most 5 s) until the retry deadline ``retry_timeout_s``
(default ``RETRY_TIMEOUT_S``, 60 s, or ``MKLSCALE_S3_RETRY_TIMEOUT_S``; the number of retries is not what ends it, ``max_retries`` defaults
to ``MAX_RETRIES``, more than that deadline holds), after which an unreachable or failing server
raises ObjectStoreError naming the URL (CLI: one line, exit 2).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlsplit

import numpy as np
from zarr.storage import ObjectStore as ZarrObjectStore

from mklscale.bank.storage.location import ObjectURL
from mklscale.errors import BankLockLostError, InvalidInputError, ObjectStoreError

#: Seconds a request keeps being retried (5xx, slow-down, refused connections) before it fails.
RETRY_TIMEOUT_S = float(os.environ.get("MKLSCALE_S3_RETRY_TIMEOUT_S", 60.0))  # a storage option overrides it
#: More retries than fit in the deadline (about 12 per minute at the longest backoff): the deadline ends them.
MAX_RETRIES = 1000
#: Bytes per ranged GET when one read is split into concurrent requests.
PART_BYTES = 8 * 2**20
#: Concurrent ranged GETs of one process.
GET_THREADS = 16

_STORES: dict[tuple, object] = {}
_STORES_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_MD5_ETAG = re.compile(r'^"?([0-9a-f]{32})"?$')


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(GET_THREADS, thread_name_prefix="mklscale-get")
        return _POOL


def _endpoint(options: dict) -> str | None:
    """The endpoint URL in use; one holding credentials (``user:secret@``) is refused without showing it."""
    endpoint = options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    parts = urlsplit(str(endpoint or ""))
    if parts.username is not None or parts.password is not None:
        raise InvalidInputError("the S3 endpoint URL holds credentials (user:secret@...); they would end up in "
                                "logs and error messages: give the endpoint as scheme://host:port and the "
                                "credentials as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or [storage_options])")
    return endpoint


def s3_store(url: ObjectURL):
    """The obstore ``S3Store`` rooted at the bank's prefix (one per process and URL + options)."""
    try:
        from obstore.store import S3Store
    except ImportError:
        raise InvalidInputError(f"{url}: banks on object stores need obstore; install it with "
                                "pip install 'mklscale[s3]' (or pip install obstore)") from None

    options = url.option_dict
    key = (url.bucket, url.prefix, url.options, _endpoint(options), os.environ.get("AWS_ACCESS_KEY_ID"))
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is not None:
            return store
    kwargs = {name: options[opt] for opt, name in (("endpoint_url", "endpoint"), ("access_key_id", "access_key_id"),
                                                   ("secret_access_key", "secret_access_key"),
                                                   ("session_token", "session_token"), ("region", "region"))
              if options.get(opt) is not None}
    endpoint = _endpoint(options)
    if "region" not in kwargs and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        kwargs["region"] = "us-east-1"  # what S3-compatible servers accept; AWS redirects are not followed
    timeout = float(options.get("retry_timeout_s", RETRY_TIMEOUT_S))
    store = S3Store(
        url.bucket, prefix=url.prefix or None,
        client_options={"allow_http": bool(endpoint and endpoint.startswith("http://")),
                        "connect_timeout": timedelta(seconds=min(10.0, timeout)),
                        "timeout": timedelta(seconds=max(timeout, 30.0))},
        retry_config={"max_retries": int(options.get("max_retries", MAX_RETRIES)),
                      "retry_timeout": timedelta(seconds=timeout),
                      "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5),
                                  "base": 2}},
        **kwargs)
    with _STORES_LOCK:
        _STORES[key] = store
    return store


_HTTP_STATUS = re.compile(r"(?<![\d.:])([1-5]\d\d)(?![\d.])")


def describe_error(exc: BaseException, url: ObjectURL, doing: str) -> ObjectStoreError:
    """An ObjectStoreError saying what went wrong with ``url`` and what to do (never credentials)."""
    text = str(exc)
    first = text.split("\n", 1)[0]
    status = {int(code) for code in _HTTP_STATUS.findall(first)}  # "403", not the digits of a port or a size
    if "NoSuchBucket" in text or (404 in status and "list" in first):
        why = (f"the bucket {url.bucket!r} does not exist at the endpoint ({_endpoint(url.option_dict) or 'AWS'}); "
               "create it, or check the URL and AWS_ENDPOINT_URL")
    elif status & {401, 403} or type(exc).__name__ in ("PermissionDeniedError",
                                                                                 "UnauthenticatedError"):
        why = ("access denied: the credentials are wrong or lack permission; check AWS_ACCESS_KEY_ID / "
               "AWS_SECRET_ACCESS_KEY (or the [storage_options] table)")
    elif "error sending request" in first or "retries" in first or "timed out" in first.lower():
        why = (f"the server at {_endpoint(url.option_dict) or 'AWS'} cannot be reached or kept failing "
               "past the retry deadline; check that it is running and AWS_ENDPOINT_URL, then run the same command "
               "again (finished work is kept)")
    else:
        why = first[:300]
    return ObjectStoreError(f"{doing} {url}: {why}")


class ObjectBank:
    """The objects of one bank: keys are relative to the bank's prefix (``zarr.json``,
    ``gram/c/3/0/0``)."""

    def __init__(self, url: ObjectURL):
        self.url = url
        self.store = s3_store(url)

    def _call(self, doing: str, fn, *args, **kwargs):
        from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError

        try:
            return fn(*args, **kwargs)
        except (FileNotFoundError, AlreadyExistsError, PreconditionError):  # answers, not failures
            raise
        except (BaseError, OSError, RuntimeError) as exc:
            raise describe_error(exc, self.url, doing) from None

    # ---- access ----------------------------------------------------------------------------------
    def check_access(self) -> None:
        """One LIST request: raises ObjectStoreError (missing bucket, wrong credentials, no server)
        before any work starts."""
        import obstore

        self._call("cannot use", obstore.list_with_delimiter, self.store)

    def zarr_store(self, read_only: bool = True):
        """zarr's ObjectStore over this bank (its metadata arrays and attributes): ``BankZarrStore``."""
        return BankZarrStore(self.store, self.url, read_only)

    # ---- objects ---------------------------------------------------------------------------------
    def head(self, key: str) -> dict | None:
        """{size, e_tag, ...} of the object ``key``, or None when there is none."""
        import obstore

        try:
            return self._call(f"cannot read {key} of", obstore.head, self.store, key)
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def get(self, key: str) -> memoryview:
        """The whole object ``key``; FileNotFoundError when there is none."""
        import obstore

        return memoryview(self._call(f"cannot read {key} of", lambda: obstore.get(self.store, key).bytes()))

    def read_into(self, key: str, offset: int, out: np.ndarray) -> None:
        """Bytes [offset, offset + out.nbytes) of ``key`` into ``out`` (a C-contiguous array),
        as concurrent ranged GETs of ``PART_BYTES``; raises FileNotFoundError or ObjectStoreError,
        and BankCorruptError-worthy short objects raise EOFError."""
        import obstore

        raw = out.reshape(-1).view(np.uint8)
        n = raw.size

        def part(a: int) -> None:
            b = min(n, a + PART_BYTES)
            got = self._call(f"cannot read {key} of", obstore.get_range, self.store, key, start=offset + a,
                             end=offset + b)
            if len(got) != b - a:
                raise EOFError(f"{key} of {self.url} ended early (wanted bytes {offset + a}..{offset + b})")
            raw[a:b] = np.frombuffer(got, np.uint8)

        starts = range(0, n, PART_BYTES)
        if len(starts) <= 1:
            for a in starts:
                part(a)
            return
        for fut in [_pool().submit(part, a) for a in starts]:
            fut.result()

    def put(self, key: str, data, create: bool = False) -> dict:
        """One single-part PUT of ``data`` (atomic). ``create``: fail with FileExistsError when the
        object exists (a conditional write, If-None-Match)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        check_fence(self.url)
        try:
            return self._call(f"cannot write {key} to", obstore.put, self.store, key, data, use_multipart=False,
                              mode="create" if create else "overwrite")
        except (AlreadyExistsError, PreconditionError):
            raise FileExistsError(f"{key} of {self.url} exists") from None

    def put_verified(self, key: str, data) -> None:
        """PUT ``data`` and check that the stored object has its size and (where the ETag is an
        MD5, as for single-part PUTs on S3, MinIO and SeaweedFS) its MD5; else ObjectStoreError."""
        view = memoryview(data).cast("B")
        self.put(key, view)
        meta = self.head(key)
        md5 = _MD5_ETAG.match((meta or {}).get("e_tag") or "")
        if meta is None or int(meta["size"]) != view.nbytes or (md5 and md5.group(1) != hashlib.md5(view).hexdigest()):
            raise ObjectStoreError(f"{key} of {self.url} does not hold what was written (size "
                                   f"{None if meta is None else meta['size']} of {view.nbytes}); run the same command again")

    def delete(self, key: str) -> None:
        import obstore

        check_fence(self.url)
        try:
            self._call(f"cannot delete {key} of", obstore.delete, self.store, key)
        except FileNotFoundError:
            pass

    def list(self, prefix: str = "") -> list[dict]:
        """Every object under the bank (or under ``prefix`` inside it): [{path, size, ...}]."""
        import obstore

        def collect():
            return [meta for batch in obstore.list(self.store, prefix=prefix or None) for meta in batch]

        return self._call("cannot list", collect)


# ---- the writer lock's record and the fence (the lock protocol itself: ``objlock``) ------------------
#: Seconds a lock stays valid without renewal (a crashed writer blocks others at most this long);
#: MKLSCALE_S3_LOCK_TTL_S sets it (every writer of a bank must use the same value).
TTL_S = float(os.environ.get("MKLSCALE_S3_LOCK_TTL_S", 60.0))
#: A fenced write needs at least this much of the lease left (renewals keep 2/3 to all of it).
MARGIN_S = TTL_S / 3
#: How often a fenced writer re-reads the lock record at most (it trusts the lease in between).
FENCE_RECHECK_S = TTL_S / 12

_leases: dict[tuple, float] = {}  # (lock, token) -> monotonic time until which writes need no re-read


def lock_url(url: ObjectURL) -> tuple[ObjectURL, str]:
    """(the store the bank's writer lock lives in: the bank's parent prefix, the lock's key in it)."""
    parent, _, name = url.prefix.rpartition("/")
    return ObjectURL(url.bucket, parent, url.options), f".{name}.lock"


def read_lock(ob: ObjectBank, key: str) -> dict | None:
    """The lock record ``key`` of ``ob`` (a dict), or None when there is none or it is not JSON."""
    try:
        info = json.loads(bytes(ob.get(key)))
    except (FileNotFoundError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def describe_lock(info: dict) -> str:
    return (f"pid {info.get('pid')} on host {info.get('host')} ({info.get('what', 'writing')} since "
            f"{info.get('since', '?')}; the lock expires {max(0, info.get('expires', 0) - time.time()):.0f} s from now "
            "unless renewed)")


def check_fence(url: ObjectURL) -> None:
    """Before a write through ``url``: when it carries a writer's token (``ObjectURL.fence``), raise
    BankLockLostError unless that writer still holds the lock with ``MARGIN_S`` of its lease left
    (``objlock``, "Fencing"). Reads the lock record at most every ``FENCE_RECHECK_S``."""
    if url.fence is None:
        return
    where, key = lock_url(url)
    ident = (where.bucket, where.prefix, key, url.fence)
    now = time.monotonic()
    if now < _leases.get(ident, -1.0):
        return
    info = read_lock(ObjectBank(where), key)
    left = float(info.get("expires", 0)) - time.time() if info else -1.0
    if not info or info.get("token") != url.fence or info.get("released") or left < MARGIN_S:
        who = "nobody" if not info or info.get("released") else describe_lock(info)
        raise BankLockLostError(
            f"this writer no longer holds the writer lock of bank {url} (it is held by {who}; this process "
            f"paused or lost the server for longer than the lock's {TTL_S:.0f} s lease), so it stopped before "
            "writing: nothing more was written. Check the bank (`mklscale bank verify`) and run the same "
            "command again")
    _leases[ident] = now + min(FENCE_RECHECK_S, left - MARGIN_S)


def forget_lease(url: ObjectURL) -> None:
    """Drop what this process trusted of the lease of ``url``'s writer (its lock was released)."""
    where, key = lock_url(url)
    _leases.pop((where.bucket, where.prefix, key, url.fence), None)


def _translated(doing: str):
    """Decorate a coroutine method of ``BankZarrStore``: obstore's errors become ObjectStoreError naming
    the bank (a server out of reach: one line, exit 2, never obstore's dump); a write first checks the fence."""
    def wrap(method):
        @functools.wraps(method)
        async def call(self, *args, **kwargs):
            from obstore.exceptions import BaseError

            if doing == "write":
                check_fence(self.url)
            try:
                return await method(self, *args, **kwargs)
            except BaseError as exc:
                raise describe_error(exc, self.url, f"cannot {doing} metadata of") from None
        return call
    return wrap


class BankZarrStore(ZarrObjectStore):
    """zarr's ObjectStore over a bank on an object store: its errors are ObjectStoreError naming the
    bank, and over a fenced URL its writes check the writer lock first (``check_fence``)."""

    def __init__(self, store, url: ObjectURL, read_only: bool = True):
        super().__init__(store, read_only=read_only)
        self.url = url

    def with_read_only(self, read_only: bool = False):
        return type(self)(self.store, self.url, read_only)

    get = _translated("read")(ZarrObjectStore.get)
    get_partial_values = _translated("read")(ZarrObjectStore.get_partial_values)
    exists = _translated("read")(ZarrObjectStore.exists)
    getsize = _translated("read")(ZarrObjectStore.getsize)
    is_empty = _translated("read")(ZarrObjectStore.is_empty)
    set = _translated("write")(ZarrObjectStore.set)
    set_if_not_exists = _translated("write")(ZarrObjectStore.set_if_not_exists)
    delete = _translated("write")(ZarrObjectStore.delete)
    delete_dir = _translated("write")(ZarrObjectStore.delete_dir)
