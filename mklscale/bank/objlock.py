"""One writer per bank on an object store: a lock object with an expiry, taken and renewed by
conditional writes.

The lock of the bank ``s3://bucket/p/bank.zarr`` is the object ``p/.bank.zarr.lock`` beside it (so
it outlives the bank's objects being replaced by ``overwrite``). It holds JSON: the holder's pid,
host, what it does, a random token and ``expires`` (Unix seconds).

- take: PUT with If-None-Match: * (``mode="create"``): exactly one of two writers succeeds.
- held: a thread renews it every ``TTL_S / 3`` seconds by a PUT with If-Match: <its ETag>, so the
  expiry moves on while the holder lives; every record differs (token, counter), so ETags differ.
- a lock whose ``expires`` has passed belongs to a holder that died (a crashed build cannot
  renew it), as does one whose holder ran on this host and whose process is gone: it is taken over by a PUT with If-Match: <the stale ETag>; of two writers doing so at
  once, one wins.
- release: DELETE when the ``with`` block ends.

Another writer waits (polling) or, with ``wait=False`` / after ``wait`` seconds, raises
BankLockedError naming the holder. The filesystem counterpart for folders is a flock beside the
bank; this module is its object-store twin, with the same ``wait`` meaning.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from mklscale.bank.location import ObjectURL
from mklscale.bank.objstore import ObjectBank
from mklscale.errors import BankLockedError

#: Seconds a lock stays valid without renewal (a crashed writer blocks others at most this long).
TTL_S = 60.0
POLL_S = 0.5


def lock_url(url: ObjectURL) -> tuple[ObjectURL, str]:
    """(the store the lock lives in: the bank's parent prefix, the lock's key in it)."""
    parent, _, name = url.prefix.rpartition("/")
    return ObjectURL(url.bucket, parent, url.options), f".{name}.lock"


def _record(what: str, token: str, count: int) -> bytes:
    now = time.time()
    return json.dumps({"pid": os.getpid(), "host": platform.node(), "what": what, "token": token, "count": count,
                       "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "expires": now + TTL_S}).encode()


def _describe(info: dict) -> str:
    return (f"pid {info.get('pid')} on host {info.get('host')} ({info.get('what', 'writing')} since "
            f"{info.get('since', '?')}; the lock expires {max(0, info.get('expires', 0) - time.time()):.0f} s from now "
            "unless renewed)")


@contextmanager
def object_writer(url: ObjectURL, what: str, wait: bool | float = True) -> Iterator[None]:
    """Hold the writer lock of the bank at ``url`` for the ``with`` block (module docstring)."""
    from obstore.exceptions import PreconditionError

    ObjectBank(url).check_access()  # a missing bucket or wrong credentials: a clear error, nothing written
    where, key = lock_url(url)
    ob = ObjectBank(where)
    token = uuid.uuid4().hex
    deadline = None if wait is True else time.monotonic() + (0.0 if wait is False else float(wait))
    said = False
    while True:
        try:
            etag = ob.put(key, _record(what, token, 0), create=True)["e_tag"]
            break
        except FileExistsError:
            pass
        meta = ob.head(key)
        if meta is None:
            continue  # released meanwhile
        try:
            info = json.loads(bytes(ob.get(key)))
        except (FileNotFoundError, ValueError):
            info = {}
        if _dead(info):  # its holder died: take it over, once
            try:
                etag = _put_if(ob, key, _record(what, token, 0), meta["e_tag"])
                break
            except PreconditionError:
                continue
        if deadline is not None and time.monotonic() >= deadline:
            raise BankLockedError(f"bank {url} is being written by {_describe(info)}; wait for it to finish, or run "
                                  "again later (a crashed writer's lock expires by itself)")
        if not said:
            print(f"mklscale: waiting for bank {url}: it is being written by {_describe(info)}", file=sys.stderr)
            said = True
        time.sleep(POLL_S)

    stop = threading.Event()
    state = {"etag": etag, "count": 0}

    def renew() -> None:
        while not stop.wait(TTL_S / 3):
            state["count"] += 1
            try:
                state["etag"] = _put_if(ob, key, _record(what, token, state["count"]), state["etag"])
            except Exception as exc:  # noqa: BLE001 - reported, the build itself decides its fate
                print(f"mklscale: warning: could not renew the writer lock of {url}: {type(exc).__name__}",
                      file=sys.stderr)

    thread = threading.Thread(target=renew, name="mklscale-lock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        try:
            ob.delete(key)
        except Exception:  # noqa: BLE001 - the server went away: the lock expires by itself
            pass


def _dead(info: dict) -> bool:
    """True when the lock's holder is gone: its expiry has passed, or it ran on this host and its
    process no longer exists (a killed build on this machine need not wait for the expiry)."""
    if float(info.get("expires", 0)) < time.time():
        return True
    if info.get("host") != platform.node() or not isinstance(info.get("pid"), int):
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _put_if(ob: ObjectBank, key: str, data: bytes, etag: str) -> str:
    import obstore

    return obstore.put(ob.store, key, data, use_multipart=False, mode={"e_tag": etag})["e_tag"]
