"""``mklscale bank copy SRC DST``: move a bank between a folder and an object store (either way, or
store to store), then verify every kernel's crc32c at the destination.

Objects and files have the same names (``remote``), so a copy is the bank's files, byte for byte:
to an object store the root ``zarr.json`` goes last (after a ``.mklscale-creating`` marker, removed
at the end), so the destination is a bank only once all of it is there; to a folder the copy is
staged beside the destination and renamed into place (``runtime.atomic.swap_into_place``). The copy
holds the destination's writer lock (``store.writing``) and never waits for another writer: a bank
being built or repaired there is refused (BankLockedError).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mklscale.bank import remote
from mklscale.bank.cache import disk_usage
from mklscale.bank.location import ObjectURL, bank_location
from mklscale.bank.objstore import ObjectBank
from mklscale.bank.size import human
from mklscale.bank.store import KernelBank, VerifyReport, writing
from mklscale.errors import InvalidInputError
from mklscale.runtime.atomic import swap_into_place


def copy_bank(src, dst, *, overwrite: bool = False, progress: bool = False) -> VerifyReport:
    """Copy the bank at ``src`` to ``dst`` (paths or s3:// URLs); returns a verify of the copy
    (``ok`` when every kernel's bytes match its checksum). A non-empty destination is refused
    unless ``overwrite`` and it holds a bank."""
    src, dst = bank_location(src), bank_location(dst)
    if str(src) == str(dst):
        raise InvalidInputError(f"bank copy: the source and the destination are the same ({src})")
    KernelBank.open(src)  # NotABankError, ObjectStoreError... before anything is written
    if not isinstance(dst, ObjectURL):
        _check_room(src, dst)
    with writing(dst, "copy (bank copy)", wait=False) as target:  # one writer per bank, the copy too
        _copy_locked(src, target, overwrite)
    return KernelBank.open(dst).verify(progress=progress, mark_bad=False)


def _check_room(src, dst: Path) -> None:
    """Refuse, before anything is written, a copy to a disk with less free space than the bank takes
    (the copy is staged beside the destination, so an old bank there is not counted as room)."""
    if isinstance(src, ObjectURL):
        need = sum(int(meta["size"]) for meta in ObjectBank(src).list())
    else:
        need = disk_usage(src)
    existing = next(p for p in [dst, *dst.absolute().parents] if p.exists())
    free = shutil.disk_usage(existing).free
    if need > free:
        raise InvalidInputError(f"bank copy: the bank takes {human(need)}, more than the {human(free)} free on the disk "
                                f"holding {dst}; free some space there or copy it to another disk or to s3://")


def _copy_locked(src, dst, overwrite: bool) -> None:
    if isinstance(dst, ObjectURL):
        ob = ObjectBank(dst)
        ob.check_access()
        keys = [meta["path"] for meta in ob.list()]
        if remote.CREATING in keys:  # an interrupted copy or creation of ours: start it again
            remote.delete_all(ob, keys)
        elif keys:
            if not overwrite:
                raise InvalidInputError(f"{dst} is not empty; choose an empty prefix, or pass --overwrite to replace "
                                        "the bank there")
            remote.prepare(dst, True, None, lambda _: False)  # refuses anything that is not a bank
        ob.put(remote.CREATING, b"")
        if isinstance(src, ObjectURL):
            with tempfile.TemporaryDirectory(prefix="mklscale-copy-") as tmp:
                ObjectBank(src).download_tree(Path(tmp) / "bank")
                ob.upload_tree(Path(tmp) / "bank")
        else:
            ob.upload_tree(src)
        ob.delete(remote.CREATING)
    else:
        if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
            if not overwrite or not KernelBank.is_bank(dst):
                raise InvalidInputError(f"{dst} exists and is not empty; choose a new folder"
                                        + ("" if overwrite else ", or pass --overwrite to replace the bank there"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        staged = dst.with_name(f".{dst.name}.copying")
        shutil.rmtree(staged, ignore_errors=True)
        try:
            if isinstance(src, ObjectURL):
                ObjectBank(src).download_tree(staged)
            else:
                shutil.copytree(src, staged)
            if dst.is_dir() and not any(dst.iterdir()):
                dst.rmdir()
            swap_into_place(staged, dst)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
