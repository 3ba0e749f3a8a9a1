"""A bank in a folder of a local or shared file system: ``LocalStorage`` (the protocol: ``base``).

Objects are files at their keys (``gram/c/3/0/0``). Writes are a temporary file renamed into
place; a shard is written with direct I/O (``shard_format.write_shard_file``); a group is created
in a temporary sibling folder and renamed into place (``group.create_bank_group``). The writer lock
is ``flock`` on ``.<name>.lock`` beside the folder (``writer_lock``); taking it sweeps what a killed
writer left and refuses symbolic links leading out of the store.

Mapped reading (``mapped_file``, used by the engine's reader): a shard file is mapped read-only once
per process and version (device, inode, size, mtime); mappings beyond ``map_limit()`` bytes are let
go least recently used first. ``map_limit``: ``MKLSCALE_MAP_BYTES``, or half the physical memory
and, in a Dask worker with a memory limit, a quarter of that limit (its nanny restarts workers by
resident set, in which mapped pages count).
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import shutil
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mklscale.bank import shard_format
from mklscale.bank.direct_io import pread_direct
from mklscale.bank.fs_errors import require_writable
from mklscale.bank.group import create_bank_group, open_bank_group, refuse_foreign
from mklscale.bank.storage.base import RangeReader, Storage
from mklscale.bank.storage.writer_lock import bank_writer, by_this_process, describe, holder, is_held
from mklscale.errors import BankCorruptError, BankMismatchError, InvalidInputError, NotABankError, ReadOnlyStoreError
from mklscale.runtime.atomic import swap_into_place

_MAPS: OrderedDict[tuple, tuple[str, np.ndarray]] = OrderedDict()  # key -> (path, whole-file array)
_MAPS_LOCK = threading.Lock()
#: mapped file version -> the kernels in it whose bytes this process has checked (checked once per version)
_CHECKED: dict[tuple, set[int]] = {}


def physical_memory() -> int:
    """Bytes of physical memory (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _dask_worker_memory_limit() -> int:
    """The memory limit of the Dask worker running this code (0: not in a worker, or no limit)."""
    distributed = sys.modules.get("distributed")  # never imported just for this
    if distributed is None:
        return 0
    try:
        worker = distributed.get_worker()
    except ValueError:
        return 0
    return int(getattr(getattr(worker, "memory_manager", None), "memory_limit", 0) or 0)


def map_limit() -> int:
    """Largest bank (bytes of shard files) read through mappings, and the most bytes of shard
    files this process keeps mapped (module doc)."""
    env = os.environ.get("MKLSCALE_MAP_BYTES")
    if env is not None:
        try:
            return max(0, int(float(env)))
        except ValueError:
            raise ValueError(f"MKLSCALE_MAP_BYTES must be a number of bytes (0 turns mapped reading off), "
                             f"got {env!r}") from None
    limit = physical_memory() // 2
    worker = _dask_worker_memory_limit()
    return min(limit, worker // 4) if worker else limit


def _replaced(path: str, key: tuple) -> bool:
    """Whether the file mapped under ``key`` is no longer the one at ``path`` (rebuilt or deleted)."""
    try:
        st = os.stat(path)
    except OSError:
        return True
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != key


def _version(file) -> tuple:
    st = os.fstat(file.fileno())
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def mapped_file(file) -> np.ndarray:
    """The whole of the open file ``file`` as a read-only uint8 array backed by a shared mapping,
    made once per process per (device, inode, size, mtime) and kept (least recently used first
    out beyond ``map_limit()`` bytes; an evicted mapping is unmapped when its last view goes).
    Making a new mapping also lets go of those whose file has since been replaced or deleted, so a
    rebuilt bank's old shard files do not keep their disk space for the life of the process."""
    key = _version(file)
    with _MAPS_LOCK:
        entry = _MAPS.get(key)
        if entry is not None:
            _MAPS.move_to_end(key)
            return entry[1]
    data = np.frombuffer(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    with _MAPS_LOCK:
        for old in [k for k, (path, _) in _MAPS.items() if _replaced(path, k)]:
            del _MAPS[old]
            _CHECKED.pop(old, None)
        entry = _MAPS.setdefault(key, (file.name, data))
        _MAPS.move_to_end(key)
        limit, total = map_limit(), sum(d.size for _, d in _MAPS.values())
        while total > limit and len(_MAPS) > 1:
            total -= _MAPS.popitem(last=False)[1][1].size
    return entry[1]


class LocalRange(RangeReader):
    """One open file: plain reads, views of its mapping, O_DIRECT reads."""

    def __init__(self, path: Path):
        self.path = path
        self.where = str(path)
        self._direct_fd: int | None = None
        self.file = open(path, "rb", buffering=0)  # FileNotFoundError: the caller says what is missing
        self.size = os.fstat(self.file.fileno()).st_size

    def _short(self, offset: int, nbytes: int) -> BankCorruptError:
        return BankCorruptError(f"{self.path} ended early (wanted {nbytes} bytes at offset {offset}); "
                                "the shard needs repair")

    def read_into(self, offset: int, out: np.ndarray) -> None:
        view = memoryview(out).cast("B")
        self.file.seek(offset)
        done = 0
        while done < len(view):
            got = self.file.readinto(view[done:])
            if not got:
                raise self._short(offset, len(view))
            done += got

    def read_direct(self, offset: int, nbytes: int) -> np.ndarray | None:
        if self._direct_fd is None:
            try:
                self._direct_fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            except OSError:
                self._direct_fd = -1
        if self._direct_fd < 0 or not hasattr(os, "O_DIRECT"):
            return None
        try:
            data = pread_direct(self._direct_fd, offset, nbytes)
        except OSError:  # EINVAL: this filesystem takes O_DIRECT at open but not for reads
            os.close(self._direct_fd)
            self._direct_fd = -1
            return None
        if data is None:
            raise self._short(offset, nbytes)
        return data

    def checked(self) -> set[int]:
        with _MAPS_LOCK:
            return _CHECKED.setdefault(_version(self.file), set())

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        data = mapped_file(self.file)
        if offset + nbytes > data.size:
            raise self._short(offset, nbytes)
        return data[offset:offset + nbytes]

    def close(self) -> None:
        self.file.close()
        if self._direct_fd is not None and self._direct_fd >= 0:
            os.close(self._direct_fd)
        self._direct_fd = None


class LocalStorage(Storage):
    """A bank in the folder ``location`` (module doc)."""

    mappable = True
    reachable_from_workers = False  # only through a shared file system, at the same absolute path

    def __init__(self, location: Path):
        self.location = Path(location)

    def _file(self, key: str) -> Path:
        return self.location / key

    # ---- bytes ------------------------------------------------------------------------------
    def size(self, key: str) -> int | None:
        try:
            return os.stat(self._file(key)).st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def open_range(self, key: str) -> LocalRange | None:
        try:
            return LocalRange(self._file(key))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read(self, key: str) -> np.ndarray | None:
        file = self._file(key)
        return np.fromfile(file, dtype=np.uint8) if file.is_file() else None

    def put(self, key: str, data) -> None:
        target = self._file(key)
        self.location.mkdir(parents=True, exist_ok=True)
        shard_format.shard_folder(self.location, target)  # never through a link leading out of the folder
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
        try:
            with open(tmp, "wb") as f:
                f.write(memoryview(data).cast("B"))
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def write_shard(self, s: int, block: np.ndarray, per_chunk: int, per_shard: int, array: str = "gram") -> None:
        shard_format.write_shard_file(self.location, s, block, per_chunk, per_shard, array)

    def list(self) -> list[tuple[str, int]]:
        out = []
        for folder, _, files in os.walk(self.location):
            for name in files:
                full = os.path.join(folder, name)
                out.append((os.path.relpath(full, self.location).replace(os.sep, "/"), os.stat(full).st_size))
        return sorted(out)

    def delete(self, key: str) -> None:
        self._file(key).unlink(missing_ok=True)

    def describe(self, key: str) -> str:
        return f"file {self._file(key)}"

    def total_bytes(self) -> int:
        return disk_usage(self.location)

    def room(self) -> tuple[int, str]:
        """Free bytes beside the folder (a new store is staged there and renamed into place)."""
        parent = self.location.absolute().parent
        existing = next((p for p in [parent, *parent.parents] if p.exists()), Path("."))
        return shutil.disk_usage(existing).free, _mount_point(existing)

    # ---- the bank's group -------------------------------------------------------------------
    def open_group(self, mode: str):
        return open_bank_group(self.location, mode) if self.location.is_dir() else None

    def open_bank_group(self, mode: str):
        if not self.location.exists():
            raise NotABankError(f"no kernel bank at {self.location}: the path does not exist (build one with "
                                "build_bank or `mklscale bank build`)")
        group = self.open_group(mode)
        if group is None:
            raise NotABankError(f"{self.location} exists but is not an mklscale kernel bank (no bank metadata found); "
                                "give the folder written by `mklscale bank build` (or by build_bank)")
        if mode != "r":
            require_writable(self.location)
        return group

    def create_group(self, replace: bool = False, **kwargs) -> None:
        create_bank_group(self.location, replace=replace, **kwargs)

    def version(self) -> tuple[str, int]:
        # the metadata file's mtime tells a bank rebuilt at the same path from the one opened before
        return str(self.location.resolve()), os.stat(self.location / "zarr.json").st_mtime_ns

    @property
    def worker_location(self) -> str:
        return str(self.location.resolve())  # workers run in other folders

    # ---- writers ----------------------------------------------------------------------------
    @contextmanager
    def writer(self, what: str, wait: bool | float = True) -> Iterator[LocalStorage]:
        with bank_writer(self.location, what, wait):
            _sweep_leftovers(self.location)
            yield self

    def other_writer(self) -> str | None:
        info = holder(self.location)
        if info is None or not is_held(self.location) or by_this_process(info):
            return None
        return describe(info)

    # ---- what a build does with its target --------------------------------------------------
    def _empty(self) -> bool:
        return not self.location.exists() or (self.location.is_dir() and not any(self.location.iterdir()))

    def refuse_target(self, overwrite: bool, fingerprint: str | None, open_bank: Callable) -> str:
        path = self.location
        if self._empty():
            return "create"
        if not self.is_bank():
            raise NotABankError(f"{path} exists and is not an mklscale kernel bank; choose another path "
                                "(mklscale never deletes a folder it did not create)")
        if overwrite:
            refuse_foreign(path, [key for key, _ in self.list()], [name for name, _ in self.open_group("r").members()])
            return "replace"
        existing = open_bank(path).attrs.get("fingerprint")  # damaged metadata: BankCorruptError
        if fingerprint is not None and existing == fingerprint:
            return "resume"
        raise BankMismatchError(f"{path} holds a bank built from different data, kernel specs or settings; "
                                "pass overwrite=True (CLI: --overwrite) to replace it, or choose another path")

    def prepare(self, overwrite: bool, fingerprint: str | None, open_bank: Callable) -> str:
        path = self.location
        if not path.exists():
            parent = path.parent if str(path.parent) else Path(".")
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ReadOnlyStoreError(f"cannot create the folder {parent} ({exc.strerror or exc}); choose a "
                                         "writable path") from None
            require_writable(parent)
            return "create"
        if self._empty():
            require_writable(path)
            return "create"
        action = self.refuse_target(overwrite, fingerprint, open_bank)
        if action == "replace":
            require_writable(path)
            require_writable(path.parent)
        return action

    # ---- copies -----------------------------------------------------------------------------
    def export_to(self, folder: Path) -> None:
        shutil.copytree(self.location, folder)

    @contextmanager
    def as_folder(self) -> Iterator[Path]:
        yield self.location

    def install(self, source: Storage, overwrite: bool) -> None:
        """The copy is staged beside the folder and renamed into place (``runtime.atomic.swap_into_place``)."""
        dst = self.location
        if not self._empty() and (not overwrite or not self.is_bank()):
            raise InvalidInputError(f"{dst} exists and is not empty; choose a new folder"
                                    + ("" if overwrite else ", or pass --overwrite to replace the bank there"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        staged = dst.with_name(f".{dst.name}.copying")
        shutil.rmtree(staged, ignore_errors=True)
        try:
            source.export_to(staged)
            if dst.is_dir() and not any(dst.iterdir()):
                dst.rmdir()
            swap_into_place(staged, dst)
        finally:
            shutil.rmtree(staged, ignore_errors=True)


def disk_usage(path: str | os.PathLike) -> int:
    """Bytes of the files under ``path`` (allocated blocks where the platform says, else their sizes)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(root, f), follow_symlinks=False)
                total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


def _mount_point(folder: Path) -> str:
    """The mount point of the file system holding ``folder`` (the topmost ancestor on the same device)."""
    here = Path(os.path.abspath(folder))
    dev = os.stat(here).st_dev
    while here.parent != here and os.stat(here.parent).st_dev == dev:
        here = here.parent
    return str(here)


def _sweep_leftovers(path: Path) -> None:
    """Remove what a killed writer left (temporary stores beside the bank, ``.partial`` files in it)
    and refuse a store holding a symbolic link that leads out of it (BankCorruptError)."""
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*-*"):
        if leftover.name.startswith((f".{path.name}.partial-", f".{path.name}.old-")):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    leftover.unlink()
    if not path.is_dir():
        return
    root = os.path.realpath(path)
    for folder, dirs, files in os.walk(path):  # does not descend into symlinked folders
        for name in dirs + files:
            entry = os.path.join(folder, name)
            if os.path.islink(entry):
                target = os.path.realpath(entry)
                if os.path.commonpath([root, target]) != root:
                    raise BankCorruptError(
                        f"{entry} is a symbolic link to {target}, outside the bank {path}; mklscale never writes "
                        "through links that leave the store: replace the link by the folder or file it points to "
                        "(or remove it; `mklscale bank repair` then rewrites what was there)")
        for name in files:
            # a shard's (shard_format) or zarr's own temporary file; a cluster build's probe (runtime.cluster)
            if name.endswith(".partial") or name.startswith(".mklscale-probe-"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
