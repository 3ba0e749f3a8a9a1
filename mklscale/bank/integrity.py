"""Bank integrity: verify a bank's stored bytes and metadata, record what is bad, repair it.

``verify`` re-reads kernels and compares their crc32c with ``checksum``, and each kernel's recorded
normalisation, statistics and spec with its ``meta_checksum`` (``stats.meta_checksum``). A kernel it
finds bad (flipped bytes, a missing or truncated shard, edited metadata) is recorded in the bank when
its store is writable (``record_bad``, holding the writer lock): its ``complete`` flag is cleared and
``attrs["integrity"]["bad"][str(m)]`` keeps the reason. Everything that refuses unfinished kernels
(the Engine, ``KernelBank.require_complete``) therefore refuses corrupt ones without re-reading the
bank on every open. A recorded reason counts only while the kernel's ``complete`` flag is clear, so
a rebuild or ``repair`` (which set it again) retires it. ``repair`` recomputes the shards holding
bad kernels from their specs and the stored features (``shards.compute_shards``).

This module sits below ``store.KernelBank`` (whose ``verify`` and ``repair`` call it): it works on
the bank object it is given and never imports the class.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from mklscale.bank.group import creation_info
from mklscale.bank.shards import compute_shards
from mklscale.bank.stats import checksum, meta_checksums
from mklscale.errors import ObjectStoreError, SpecError


@dataclass
class VerifyReport:
    """What ``KernelBank.verify`` found: kernels whose bytes do not match their checksum."""

    checked: int
    bad: list[tuple[int, str, str]] = field(default_factory=list)  # (index, name, reason)
    incomplete: list[int] = field(default_factory=list)
    #: True: newly found bad kernels were marked unfinished on disk; False: the store is read-only
    #: and they could not be; None: nothing new to mark.
    marked: bool | None = None
    #: damage of the bank as a whole (its stored features X), beside the kernels'
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad and not self.incomplete and not self.problems

    @property
    def bad_indices(self) -> list[int]:
        return [b[0] for b in self.bad]

    def __str__(self) -> str:
        lines = [f"checked {self.checked} kernel(s): " + ("OK" if self.ok else "PROBLEMS")]
        lines += [f"  kernel {m} ({name}): {why}" for m, name, why in self.bad]
        lines += [f"  {problem}" for problem in self.problems]
        if self.incomplete:
            shown = ", ".join(map(str, self.incomplete[:20]))
            more = "" if len(self.incomplete) <= 20 else f" ... (+{len(self.incomplete) - 20})"
            lines.append(f"  {len(self.incomplete)} kernel(s) not built yet: {shown}{more}")
        if self.bad:
            lines.append("  bad kernels are marked unfinished in the bank (solvers skip or refuse them); "
                         "run `mklscale bank repair PATH` to recompute them" if self.marked is not False else
                         "  the store is read-only, so bad kernels could not be marked; copy the bank to a "
                         "writable folder and run `mklscale bank repair PATH` there")
        return "\n".join(lines)


def verify(bank, kernels: Sequence[int] | None = None, threads: int = 4, progress: bool = False,
           mark_bad: bool = True, wait: bool | float = True) -> VerifyReport:
    """Re-read every complete kernel, recompute its crc32c and compare with the recorded one.

    A missing, truncated or garbled shard file makes all of its kernels bad (the reason says
    which). With ``mark_bad`` (default) newly found bad kernels are recorded on disk (module
    docstring): their ``complete`` flag is cleared, so solvers refuse them until
    ``repair``; on a read-only store this is skipped and ``report.marked`` is False. Kernels
    recorded bad by an earlier verify are reported bad again, with their recorded reason.
    Marking takes the bank's writer lock (``writer_lock``); ``wait`` says what to do while another
    process holds it (a build or repair): True waits, False or a number of seconds raise
    BankLockedError when it is still held.
    """
    from tqdm.auto import tqdm

    complete = bank.complete
    sel = np.arange(bank.M) if kernels is None else np.array([bank._check_index(m) for m in kernels], dtype=np.int64)
    recorded = bank.recorded_bad()
    report = VerifyReport(checked=0)
    report.bad = [(int(m), bank.specs[m].name, f"{recorded[m]} (found by an earlier verify)")
                  for m in sel if int(m) in recorded]
    report.incomplete = [int(m) for m in sel if not complete[m] and int(m) not in recorded]
    todo = np.array([m for m in sel if complete[m]], dtype=np.int64)
    report.checked = int(todo.size)
    S = bank.kernels_per_shard
    groups = [todo[(todo // S) == s] for s in np.unique(todo // S)]
    if bank.features is not None:  # every column chunk of X read and checked once
        report.problems += bank.features.scan_problems()[:1]
    found: list[tuple[int, str, str]] = _check_metadata(bank, todo)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for bad in tqdm(pool.map(functools.partial(_check_shard, bank), groups), total=len(groups), disable=not progress,
                        unit="shard", desc="verify"):
            found += bad
    found = sorted({m: (m, name, why) for m, name, why in found}.values())  # one reason per kernel
    if found and mark_bad:
        report.marked = record_bad(bank, {m: why for m, _, why in found}, wait)
    report.bad = sorted(report.bad + found)
    return report


def _check_shard(bank, ms: np.ndarray) -> list[tuple[int, str, str]]:
    """(kernel, name, reason) for the kernels ms (all of one shard) whose stored bytes are bad."""
    S = bank.kernels_per_shard
    s = int(ms[0]) // S
    if bank.plain_layout and bank.storage.size(bank.shard_key(s)) is None:
        where = bank.storage.describe(bank.shard_key(s))
        return [(int(m), bank.specs[m].name, f"shard {where} is missing") for m in ms]
    try:
        block = bank.read_shard(s)
    except Exception as exc:  # a truncated or garbled shard fails to decode
        return [(int(m), bank.specs[m].name, f"unreadable: {type(exc).__name__}: {exc}") for m in ms]
    expected = bank.checksums
    return [(int(m), bank.specs[m].name, "checksum mismatch")
            for m in ms if checksum(block[m - s * S]) != int(expected[m])]


def _check_metadata(bank, ms: np.ndarray) -> list[tuple[int, str, str]]:
    """(kernel, name, reason) for the kernels ms whose recorded normalisation, statistics or spec
    disagree with their ``meta_checksum`` (banks written before it existed: none)."""
    if "meta_checksum" not in bank.group:
        return []
    recorded, now = bank.group["meta_checksum"][:][ms], meta_checksums(bank.group, ms)
    return [(int(m), bank.specs[m].name, "its recorded normalisation factor, statistics or spec do not match "
             "their checksum (metadata edited or damaged)") for m, r, c in zip(ms, recorded, now) if r != c]


def record_bad(bank, bad: dict[int, str], wait: bool | float = True) -> bool:
    """Record kernels found bad, holding the writer lock: the reason in ``attrs["integrity"]``
    first, then clear their ``complete`` flags, reading the flags of the other kernels from disk
    under the lock (each write is atomic). Returns False when the store is read-only."""
    try:
        with bank.storage.writer("verify (marking bad kernels)", wait) as target:
            group = target.open_group("r+")
            record = dict((group.attrs.get("integrity") or {}).get("bad") or {})
            record.update({str(m): why for m, why in bad.items()})
            group.attrs["integrity"] = {"bad": record, "verified": creation_info()["time"]}
            flags = group["complete"][:]
            flags[list(bad)] = False
            group["complete"][:] = flags
    except ObjectStoreError:  # an object store that cannot be reached is not a read-only one
        raise
    except OSError:  # read-only or full: report without marking
        return False
    finally:
        bank.reload()
    return True


def forget_bad(bank, kernels: Sequence[int]) -> None:
    """Drop the recorded reasons of ``kernels`` (after they were recomputed)."""
    group = bank.storage.open_group("r+")
    record = dict((group.attrs.get("integrity") or {}).get("bad") or {})
    if any(str(int(m)) in record for m in kernels):
        for m in kernels:
            record.pop(str(int(m)), None)
        group.attrs["integrity"] = {"bad": record, "verified": (group.attrs.get("integrity") or {}).get("verified")}
    bank.reload()


# ---- repair ----------------------------------------------------------------------------------------
@dataclass
class RepairReport:
    """What ``repair_bank`` did: the kernels it was asked to fix, the shards it rewrote (every
    kernel of those), and ``after``: a verify of those shards once rewritten."""

    kernels: list[int]
    shards: list[int]
    after: VerifyReport

    @property
    def ok(self) -> bool:
        return self.after.ok

    def __str__(self) -> str:
        if not self.kernels:
            return "nothing to repair: every kernel verifies"
        return (f"repaired {len(self.kernels)} kernel(s) ({self.kernels[:10]}{' ...' if len(self.kernels) > 10 else ''}) "
                f"by rewriting {len(self.shards)} shard(s); afterwards: {self.after}")


def repair(storage, open_bank: Callable, kernels: Sequence[int] | None = None, client=None,
           progress: bool = True, wait: bool | float = True) -> RepairReport:
    """Recompute kernels of a bank built from features, from their specs and the stored X.

    ``kernels=None`` repairs what ``verify`` reports bad or unfinished (a full verify; it also
    records them on disk). A shard is written whole (temporary file + rename), so every shard
    holding a target is recomputed; its other kernels must come out bit-identical to their recorded
    checksums (the build is deterministic), which the task checks before writing. Statistics,
    checksums and ``complete`` flags are updated as shards finish and the recorded bad reasons
    dropped. Banks imported with ``from_arrays`` hold no features: repair raises SpecError saying
    to re-import them. A read-only store raises ReadOnlyStoreError before anything is read.
    Damaged metadata (missing arrays, impossible attributes, unreadable specs) raises
    BankCorruptError when the bank is opened: repair cannot fix it. The repair holds the bank's
    writer lock throughout (``wait`` as in ``build_bank``). ``storage``: the bank's; ``open_bank``:
    ``KernelBank.open`` (this module sits below the bank class, which calls it).
    """
    with storage.writer("repair", wait) as target:
        return _repair_locked(open_bank(target, mode="r+"), kernels, client, progress)


def _repair_locked(bank, kernels, client, progress: bool) -> RepairReport:
    if bank.features is None:
        raise SpecError(f"bank {bank.path} was imported from Gram matrices (KernelBank.from_arrays) and holds no "
                        "features, so its kernels cannot be recomputed; re-import them: "
                        "KernelBank.from_arrays(grams, path, ..., overwrite=True)")
    if kernels is None:
        found = verify(bank, progress=progress)
        targets = sorted(set(found.bad_indices) | set(found.incomplete))
    else:
        targets = sorted({bank._check_index(m) for m in kernels})
    if not targets:
        return RepairReport([], [], verify(bank, kernels=[]))
    S = bank.kernels_per_shard
    keep = bank.complete
    keep[targets] = False
    shards = sorted({m // S for m in targets})
    # stored kernels get X whole (checked); a computed bank's tasks read the checked chunks they need
    Xs = bank.X_train if bank.stores_kernels else None
    compute_shards(bank, bank.specs, Xs, shards, keep=keep, client=client, progress=progress)
    forget_bad(bank, targets)
    rewritten = [m for s in shards for m in range(*bank.shard_range(s))]
    return RepairReport(targets, shards, verify(bank, kernels=rewritten))


