"""``mklscale bank copy SRC DST``: move a bank between a folder and an object store (either way, or
store to store), then verify every kernel's crc32c at the destination.

Objects and files have the same names (``storage``), so a copy (``Storage.install``) is the bank's files, byte for byte:
to an object store the root ``zarr.json`` goes last (after a ``.mklscale-creating`` marker, removed
at the end), so the destination is a bank only once all of it is there; to a folder the copy is
staged beside the destination and renamed into place (``runtime.atomic.swap_into_place``). The copy
holds the destination's writer lock (``Storage.writer``) and never waits for another writer: a bank
being built or repaired there is refused (BankLockedError).
"""

from __future__ import annotations

from mklscale.bank.size import human
from mklscale.bank.storage import storage_for
from mklscale.bank.store import KernelBank, VerifyReport
from mklscale.errors import InvalidInputError


def copy_bank(src, dst, *, overwrite: bool = False, progress: bool = False) -> VerifyReport:
    """Copy the bank at ``src`` to ``dst`` (paths or s3:// URLs); returns a verify of the copy
    (``ok`` when every kernel's bytes match its checksum). A non-empty destination is refused
    unless ``overwrite`` and it holds a bank."""
    source, target = storage_for(src), storage_for(dst)
    if str(source) == str(target):
        raise InvalidInputError(f"bank copy: the source and the destination are the same ({source})")
    KernelBank.open(source)  # NotABankError, ObjectStoreError... before anything is written
    _check_room(source, target)
    with target.writer("copy (bank copy)", wait=False) as fenced:  # one writer per bank, the copy too
        fenced.install(source, overwrite)
    return KernelBank.open(target).verify(progress=progress, mark_bad=False)


def _check_room(source, target) -> None:
    """Refuse, before anything is written, a copy to a disk with less free space than the bank takes
    (the copy is staged beside the destination, so an old bank there is not counted as room)."""
    room = target.room()
    if room is None:
        return
    need, (free, _) = source.total_bytes(), room
    if need > free:
        raise InvalidInputError(f"bank copy: the bank takes {human(need)}, more than the {human(free)} free on the disk "
                                f"holding {target}; free some space there or copy it to another disk or to s3://")
