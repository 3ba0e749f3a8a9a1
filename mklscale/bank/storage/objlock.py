"""One writer per bank on an object store: a lock object with an expiry, taken and renewed by
conditional writes, and every write of its holder fenced by it.

The lock of the bank ``s3://bucket/p/bank.zarr`` is the object ``p/.bank.zarr.lock`` beside it (so
it outlives the bank's objects being replaced by ``overwrite``). It holds JSON: the holder's pid,
host, what it does, a random token and ``expires`` (Unix seconds).

- take: PUT with If-None-Match: * (``mode="create"``): exactly one of two writers succeeds.
- held: a thread renews it every ``objstore.TTL_S / 3`` seconds by a PUT with If-Match: <its ETag>, so the
  expiry moves on while the holder lives; every record differs (token, counter), so ETags differ.
  A renewal refused (another writer holds the lock now) marks the lock lost.
- a lock whose ``expires`` has passed belongs to a holder that died or paused past it (a crashed
  build cannot renew it), as does one whose holder ran on this host and whose process is gone: it is
  taken over by a PUT with If-Match: <the stale ETag>; of two writers doing so at once, one wins.
- release: a PUT with If-Match: <its own ETag> of a record that has expired (a tombstone the next
  writer takes over), never a DELETE: a holder that lost the lock leaves the new holder's alone.

**Fencing.** S3 has no write conditional on another object, so the holder's writes are fenced by
the lease: ``object_writer`` yields the bank's URL carrying its token (``ObjectURL.fence``), and every
write through that URL, in the driver or on a worker, first calls ``objstore.check_fence``: it reads the
lock record (at most once per ``FENCE_RECHECK_S``) and refuses (``BankLockLostError``) unless the
token is its own and the lease has at least ``MARGIN_S`` left; between two reads it trusts the
lease only as long as the last one allows (minus ``MARGIN_S``). Nobody takes a lock over before
its expiry, so a write started inside the lease lands before any other writer can hold the bank,
unless the writer freezes for more than ``MARGIN_S`` between that check and its PUT. A writer
paused past its lease (SIGSTOP, a swapped-out VM) thus stops at its next write with an error, and
the ``with`` block ends with one if the lock was lost meanwhile.

Another writer waits (polling) or, with ``wait=False`` / after ``wait`` seconds, raises
BankLockedError naming the holder. The lock is re-entrant within a thread (a repair verifies and
marks bad kernels under it). The filesystem counterpart for folders is a flock beside the bank
(``writer_lock``); this module is its object-store twin, with the same ``wait`` meaning.
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

from mklscale.bank.storage import objstore
from mklscale.bank.storage.location import ObjectURL
from mklscale.bank.storage.objstore import ObjectBank, describe_lock, lock_url, read_lock
from mklscale.errors import BankLockedError, BankLockLostError, ObjectStoreError

POLL_S = 0.5

_held: dict[tuple, tuple[int, str, int]] = {}  # lock -> (owning thread, token, depth)
_held_guard = threading.Lock()


def _record(what: str, token: str, count: int) -> bytes:
    now = time.time()
    return json.dumps({"pid": os.getpid(), "host": platform.node(), "what": what, "token": token, "count": count,
                       "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "expires": now + objstore.TTL_S}).encode()


@contextmanager
def object_writer(url: ObjectURL, what: str, wait: bool | float = True) -> Iterator[ObjectURL]:
    """Hold the writer lock of the bank at ``url`` for the ``with`` block; yields ``url`` fenced by it
    (write through the yielded URL: module docstring, "Fencing")."""
    where, key = lock_url(url)
    ident = (where.bucket, where.prefix, key)
    me = threading.get_ident()
    with _held_guard:
        mine = _held.get(ident)
        if mine is not None and mine[0] == me:
            _held[ident] = (me, mine[1], mine[2] + 1)
    if mine is not None and mine[0] == me:  # re-entered by the holder's own thread
        try:
            yield url.with_fence(mine[1])
        finally:
            with _held_guard:
                owner, token, depth = _held[ident]
                _held[ident] = (owner, token, depth - 1)
        return

    ObjectBank(url).check_access()  # a missing bucket or wrong credentials: a clear error, nothing written
    ob = ObjectBank(where)
    token = uuid.uuid4().hex
    etag = _take(ob, key, url, what, token, wait)
    state = {"etag": etag, "count": 0, "lost": None}
    with _held_guard:
        _held[ident] = (me, token, 1)
    stop = threading.Event()

    def renew() -> None:
        from obstore.exceptions import PreconditionError

        while not stop.wait(objstore.TTL_S / 3):
            state["count"] += 1
            try:
                state["etag"] = _put_if(ob, key, _record(what, token, state["count"]), state["etag"])
            except (PreconditionError, FileNotFoundError):
                state["lost"] = "another writer took the lock over"
                return
            except Exception as exc:  # noqa: BLE001 - a server hiccup: the fence decides at the next write
                print(f"mklscale: warning: could not renew the writer lock of {url}: {type(exc).__name__}; "
                      "trying again", file=sys.stderr)

    thread = threading.Thread(target=renew, name="mklscale-lock", daemon=True)
    thread.start()
    fenced = url.with_fence(token)
    failed = unreachable = False
    try:
        yield fenced
    except BaseException as exc:
        failed = True
        unreachable = isinstance(exc, ObjectStoreError)
        # a writer that lost its lock meets the new holder's bank half-replaced (a missing array): say so
        if not isinstance(exc, (BankLockLostError, KeyboardInterrupt, ObjectStoreError)):
            info = None if state["lost"] else read_lock(ob, key)  # a renewal may have seen it already
            if state["lost"] or (info is not None and info.get("token") != token):
                raise BankLockLostError(_lost_message(url, what, "another writer took the lock over")) from exc
        raise
    finally:
        stop.set()
        # a server out of reach: no renewal or release waits out the retry deadline again (the lock expires)
        thread.join(1.0 if unreachable else None)
        with _held_guard:
            del _held[ident]
        objstore.forget_lease(url.with_fence(token))
        lost = state["lost"] or (None if unreachable else _release(ob, key, what, token, state["etag"]))
        if lost and not failed:
            raise BankLockLostError(_lost_message(url, what, lost))


def _lost_message(url: ObjectURL, what: str, why: str) -> str:
    return (f"the writer lock of bank {url} was lost while {what} ran ({why}: this process paused or could not "
            f"reach the server for longer than the lock's {objstore.TTL_S:.0f} s lease); what it would have written after "
            "that was refused. Check the bank (`mklscale bank verify`) and run the same command again")


def _take(ob: ObjectBank, key: str, url: ObjectURL, what: str, token: str, wait: bool | float) -> str:
    """Take the lock object (waiting as ``wait`` says); its ETag."""
    from obstore.exceptions import PreconditionError

    deadline = None if wait is True else time.monotonic() + (0.0 if wait is False else float(wait))
    said = False
    while True:
        try:
            return ob.put(key, _record(what, token, 0), create=True)["e_tag"]
        except FileExistsError:
            pass
        meta = ob.head(key)
        if meta is None:
            continue  # released meanwhile
        info = read_lock(ob, key) or {}
        if _dead(info):  # its holder died, paused past its expiry or released it: take it over, once
            try:
                return _put_if(ob, key, _record(what, token, 0), meta["e_tag"])
            except PreconditionError:
                continue
        if deadline is not None and time.monotonic() >= deadline:
            raise BankLockedError(f"bank {url} is being written by {describe_lock(info)}; wait for it to finish, or run "
                                  "again later (a crashed writer's lock expires by itself)")
        if not said:
            print(f"mklscale: waiting for bank {url}: it is being written by {describe_lock(info)}", file=sys.stderr)
            said = True
        time.sleep(POLL_S)


def _release(ob: ObjectBank, key: str, what: str, token: str, etag: str) -> str | None:
    """Let go of the lock by a conditional PUT of an expired record; the reason when it was no longer
    ours (None: released)."""
    from obstore.exceptions import PreconditionError

    record = json.loads(_record(what, token, -1))
    record.update(expires=0, released=True)
    try:
        _put_if(ob, key, json.dumps(record).encode(), etag)
    except (PreconditionError, FileNotFoundError):
        return "another writer took the lock over"
    except Exception:  # noqa: BLE001 - the server went away: the lock expires by itself
        pass
    return None


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
