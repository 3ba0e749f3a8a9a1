"""What every key-value backend (an object store, a process's memory) does the same way:
``KeyedStorage``, the base of ``objects.ObjectStorage`` and ``memory.MemoryStorage``.

- creation: the group is created in a local temporary folder (``group.create_bank_group``) and put
  with the root ``zarr.json`` last, after a marker ``.mklscale-creating``; a location holding the
  marker but no ``zarr.json`` is the leftover of an interrupted creation or copy and is cleared.
- an overwrite deletes ``zarr.json`` first: from then on the location is no bank, whatever is left.
- metadata arrays and attributes go through a zarr store over the same keys (``zarr_store``).

A backend adds its primitives (``size``, ``open_range``, ``put``, ``list``, ``delete``), its zarr
store, its writer lock and its version token.
"""

from __future__ import annotations

import tempfile
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path

from mklscale.bank.group import create_bank_group, open_bank_group, refuse_foreign
from mklscale.bank.storage.base import CREATING, Storage, download_tree, upload_tree
from mklscale.errors import BankMismatchError, InvalidInputError, NotABankError


class KeyedStorage(Storage):
    """A bank as objects under one location of a key-value store (module doc)."""

    @abstractmethod
    def zarr_store(self, read_only: bool = True):
        """A zarr store over this location's keys (metadata arrays and attributes)."""

    def check_access(self) -> None:
        """Fail with a clear error before any work when the store cannot be used (e.g. a missing bucket)."""

    def open_group(self, mode: str):
        self.check_access()
        if self.size("zarr.json") is None:
            return None
        return open_bank_group(self.location, mode, store=self.zarr_store(read_only=(mode == "r")))

    def open_bank_group(self, mode: str):
        group = self.open_group(mode)
        if group is None:
            raise NotABankError(f"no kernel bank at {self.location} (no zarr.json there); build one with build_bank "
                                "or `mklscale bank build`, or copy one there with `mklscale bank copy`")
        return group

    def create_group(self, replace: bool = False, **kwargs) -> None:
        self.put(CREATING, b"")
        with tempfile.TemporaryDirectory(prefix="mklscale-bank-") as tmp:
            local = Path(tmp) / "bank.zarr"
            create_bank_group(local, **kwargs)
            upload_tree(self, local)
        self.delete(CREATING)

    def delete_all(self, keys: list[str]) -> None:
        """Delete ``keys`` of a bank (an overwrite; what an interrupted creation or copy left)."""
        for key in sorted(keys, key=lambda k: (k != "zarr.json", k)):  # zarr.json first: no bank from then on
            self.delete(key)

    def refuse_target(self, overwrite: bool, fingerprint: str | None, open_bank: Callable) -> str:
        return "create"  # ``prepare`` checks the location under the lock

    def prepare(self, overwrite: bool, fingerprint: str | None, open_bank: Callable) -> str:
        """"resume" for the bank of the same fingerprint; "create" otherwise, after clearing the leftover of
        an interrupted creation or (``overwrite``) the bank there; refuses a location holding other objects."""
        self.check_access()
        keys = [key for key, _ in self.list()]
        if not keys:
            return "create"
        if "zarr.json" not in keys:
            if CREATING in keys:  # our own interrupted creation: nothing in it was ever a bank
                self.delete_all(keys)
                return "create"
            raise NotABankError(f"{self.location} holds objects and is not an mklscale kernel bank; choose another "
                                "prefix (mklscale never deletes objects it did not create)")
        group = self.open_group("r")
        if group is None:
            raise NotABankError(f"{self.location} holds a zarr.json that is not an mklscale kernel bank; choose "
                                "another prefix")
        if overwrite:
            refuse_foreign(self.location, keys, [name for name, _ in group.members()])
            self.delete_all(keys)
            return "create"
        if fingerprint is not None and open_bank(self.location).attrs.get("fingerprint") == fingerprint:
            return "resume"
        raise BankMismatchError(f"{self.location} holds a bank built from different data, kernel specs or settings; "
                                "pass overwrite=True (CLI: --overwrite) to replace it, or choose another prefix")

    def export_to(self, folder: Path) -> None:
        download_tree(self, folder)

    def install(self, source: Storage, overwrite: bool) -> None:
        """Marker first, every file, root ``zarr.json`` last, marker removed: the location is a bank
        only once all of it is there, and an interrupted copy is recognised and started again."""
        self.check_access()
        keys = [key for key, _ in self.list()]
        if CREATING in keys:  # an interrupted copy or creation of ours: start it again
            self.delete_all(keys)
        elif keys:
            if not overwrite:
                raise InvalidInputError(f"{self.location} is not empty; choose an empty prefix, or pass --overwrite "
                                        "to replace the bank there")
            self.prepare(True, None, lambda _: None)  # refuses anything that is not a bank
        self.put(CREATING, b"")
        with source.as_folder() as folder:
            upload_tree(self, folder)
        self.delete(CREATING)
