"""How large a bank will be on disk, checked before any kernel is computed or any file written.

``bank_bytes`` is the one size formula: the bytes a bank's files occupy once built (dense or factor
data with the shard layout's padding and indexes, the per-kernel metadata, a factor bank's
landmarks and (r, r) transforms, the stored features, imported cross kernels, each file rounded
up to whole 4 KiB blocks). ``check_fits`` compares the bytes a build still has to write with the
free space of the disk that will hold the bank and, for the estimators' bank cache, the bank's
size with the cache's cap (``$MKLSCALE_CACHE_MAX``); over a limit it raises ``BankTooLargeError``
(an InvalidInputError) whose one-line message names the size, the limit and the remedies with
their sizes for this data, spelled as the caller's entry point spells them (``SPELLINGS``). Every
entry point that creates a bank calls it first: the estimators' cache, ``mklscale fit`` (through
the estimators), pipelines, ``mklscale bank build``, ``KernelBank.from_arrays`` and ``build_bank``
itself, so ``--n-kernels 1000000000`` or a 227 GB default bank fails in a second instead of filling
the disk.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from mklscale.bank import cache
from mklscale.bank.features import chunk_columns
from mklscale.bank.group import PER_KERNEL_FLOATS, layout_for
from mklscale.bank.shard_format import index_nbytes
from mklscale.errors import InvalidInputError

#: files take whole blocks of this many bytes on the usual file systems (ext4, xfs, tmpfs pages)
BLOCK = 4096
#: bytes of one kernel's spec JSON in the (compressed) ``spec`` array, an upper estimate
SPEC_BYTES = 64
#: the ranks a "use a factor bank" remedy may suggest, largest first (the largest that fits is named)
SUGGESTED_RANKS = (256, 128, 64, 32, 16)

#: How each entry point spells the remedies: the factor-bank option ("{r}": the rank; None where a
#: factor bank is not an option) and where a larger disk goes ("{need}": the size it needs).
SPELLINGS = {
    "estimator": {"rank": "rank={r}", "computed": "computed=True",
                  "disk": "pass cache_dir= a folder on a disk with {need} free"},
    "function": {"rank": "rank={r}", "computed": "computed=True", "disk": "give a path on a disk with {need} free"},
    "import": {"rank": None, "disk": "give a path on a disk with {need} free"},
    "cli-fit": {"rank": "--rank {r}", "computed": "--computed yes", "disk": "pass --cache-dir a folder on a disk with {need} free"},
    "cli-build": {"rank": "--rank {r}", "computed": "--computed",
                  "disk": "give --out a path on a disk with {need} free"},
    "pipeline": {"rank": "rank = {r} in [bank]", "computed": "computed = true in [bank]",
                 "disk": "put the run (--out) or [bank] path on a disk with {need} free"},
}


def _blocks(nbytes: int) -> int:
    return -(-int(nbytes) // BLOCK) * BLOCK


def bank_bytes(M: int, n: int, dtype: str = "float32", rank: int | None = None, *, n_features: int = 0,
               n_cross: int = 0, layout: tuple[int, int] | None = None, chunk_mb: float = 16,
               shard_mb: float = 64, computed: bool = False) -> int:
    """Bytes the files of a built bank of M kernels over n rows occupy (``group`` has the layout).

    - data: one file per shard of ``kernels_per_shard`` kernels, each n x n (dense) or n x r (a factor
      bank, ``rank`` r), the last inner chunk zero-padded to ``kernels_per_chunk`` kernels, plus the
      shard index (``shard_format``); none for a ``computed`` bank (its kernels are never stored); ``layout`` (kernels per chunk, per shard) as recorded in a bank's
      attributes, else ``group.layout_for(chunk_mb, shard_mb)`` as a build makes it;
    - per kernel: trace, fro, lambda_max, norm_factor (float64), checksum, meta_checksum, complete, the
      spec's JSON;
      a factor bank adds its rank, landmarks (r int64), transform (r x r float64), approx_error and
      exact_trace (``group.FACTOR_META``);
    - the standardised features X (n x ``n_features`` float64, in chunks of whole columns of about
      ``chunk_mb``; 0 for imported Gram matrices), their mean and scale, and the attributes (train row
      ids, X's chunk checksums), imported cross kernels (M x ``n_cross`` x n);
    - every file rounded up to whole ``BLOCK`` bytes, every array with its zarr.json.

    Metadata arrays are counted uncompressed (zarr compresses them a little): an upper estimate
    within a few percent of what a build writes (tests/test_size_checks.py).
    """
    M, n = int(M), int(n)
    item = np.dtype(dtype).itemsize
    width = n if rank is None else max(1, min(int(rank), n))
    per_chunk, per_shard = layout or layout_for(M, n, item, chunk_mb, shard_mb, width)
    full, last = divmod(M, per_shard)

    def per_shard_file(file_bytes) -> int:  # the files of every shard: full ones and the last one
        return full * _blocks(file_bytes(per_shard)) + (_blocks(file_bytes(last)) if last else 0)

    tail = index_nbytes(per_chunk, per_shard)
    total = BLOCK + (0 if computed else per_shard_file(lambda k: -(-k // per_chunk) * per_chunk * n * width * item
                                                                 + tail))
    per_kernel = {name: 8 for name in PER_KERNEL_FLOATS} | {"checksum": 4, "meta_checksum": 4, "complete": 1,
                                                            "spec": SPEC_BYTES}
    if rank is not None:
        per_kernel |= {"rank": 4, "approx_error": 8, "exact_trace": 8}
        for row_bytes in (width * 8, width * width * 8):  # landmarks, transform: one chunk per shard
            total += BLOCK + per_shard_file(lambda k, b=row_bytes: k * b)
    total += sum(BLOCK + _blocks(M * b) for b in per_kernel.values())
    n_chunks = 0
    if n_features:  # X in chunks of whole columns (edge chunks stored whole), its mean and scale
        d = int(n_features)
        cols = min(d, chunk_columns(n, chunk_mb))
        n_chunks = -(-d // cols)
        total += BLOCK + n_chunks * _blocks(n * cols * 8) + 2 * (BLOCK + _blocks(8 * d))
    if n_cross:
        total += BLOCK + M * _blocks(int(n_cross) * n * item)
    attrs = 2048 + 8 * n + 12 * n_chunks  # root zarr.json: train_rows, X's chunk checksums, layout, ...
    return total + _blocks(attrs)


def count_kernels(kernels, n_features: int) -> int:
    """The number of specs ``families.resolve(kernels, n_features)`` gives, without generating
    ``random_subsets`` specs (their number is the description's n_kernels, checked)."""
    from mklscale.bank import families

    items = kernels if isinstance(kernels, (list, tuple)) else [kernels]
    total = 0
    for item in items:
        if isinstance(item, (str, dict)) and not (isinstance(item, dict) and "params" in item):
            family, params = families.parameters(item)
            if family == "random_subsets":
                total += params["n_kernels"]
                continue
        total += len(families.resolve(item, n_features))
    return total


@dataclasses.dataclass(frozen=True)
class Oversize:
    """What ``check_fits`` found: the bank, its size, and the limits it is over (None: not over)."""

    path: str
    M: int
    n: int
    dtype: str
    rank: int | None
    n_features: int
    n_cross: int
    total: int            # bytes of the whole bank
    to_write: int         # bytes still to write (a resumed bank holds the rest already)
    disk_free: int | None  # free bytes of the disk holding the bank, when to_write exceeds them
    mount: str            # that disk's mount point
    cap: int | None       # the cache cap, when the bank exceeds it
    cap_text: str         # $MKLSCALE_CACHE_MAX as set
    computed: bool = False  # a computed bank (features and metadata only)


class BankTooLargeError(InvalidInputError):
    """A bank that would not fit its disk or the bank cache's cap, refused before any work.
    ``oversize`` holds the facts; ``respelled(spelling)`` is the same error worded for another entry
    point (``mklscale fit`` rewords the estimators' error with CLI options)."""

    def __init__(self, oversize: Oversize, spelling: str):
        self.oversize = oversize
        super().__init__(too_large_message(oversize, spelling))

    def respelled(self, spelling: str) -> BankTooLargeError:
        return BankTooLargeError(self.oversize, spelling)


def check_fits(path: str | os.PathLike, M: int, n: int, dtype: str = "float32", rank: int | None = None, *,
               n_features: int = 0, n_cross: int = 0, chunk_mb: float = 16, shard_mb: float = 64,
               action: str | None = None, overwrite: bool = False, cap: int | None = None,
               spelling: str = "function", computed: bool = False) -> None:
    """Raise BankTooLargeError when a bank (``bank_bytes`` of these arguments) to be written at ``path``
    does not fit, before anything is written.

    The bytes still to write are compared with the free space of the disk holding ``path`` (its
    nearest existing folder). ``action`` says what the build will do with ``path``: "create" (nothing
    there, or an import that builds its new store beside the old one: the whole bank), "resume" (a
    bank there already holds part of it: only the rest; a complete one needs nothing) or "replace"
    (``build_bank``'s overwrite: the old store is removed before the kernels are written, so its
    bytes count as free); None infers it from what is at ``path`` and ``overwrite``. ``cap``: the
    estimators' bank cache's cap in bytes (None: no cap), which the whole bank must not exceed
    when anything is to be written. A bank on an object store (``s3://``) has no disk to ask and is
    not checked. ``spelling``: the entry point, for the remedies' wording (``SPELLINGS``).
    """
    from mklscale.bank.storage import storage_for

    storage = storage_for(path)
    room = storage.room()
    if room is None:
        return  # an object store (s3://...): no disk to ask
    if M < 1 or n < 1 or (rank is not None and rank < 1):
        return  # input the build refuses with its own message
    total = bank_bytes(M, n, dtype, rank, n_features=n_features, n_cross=n_cross, chunk_mb=chunk_mb,
                       shard_mb=shard_mb, computed=computed)
    to_write = _to_write(storage, total, action, overwrite)
    if to_write == 0:
        return
    free, mount = room
    over_disk, over_cap = to_write > free, cap is not None and total > cap
    if over_disk or over_cap:
        found = Oversize(str(storage), int(M), int(n), np.dtype(dtype).name, None if rank is None else int(rank),
                         int(n_features), int(n_cross), total, to_write, free if over_disk else None,
                         mount, cap if over_cap else None, cache.max_setting(), bool(computed))
        raise BankTooLargeError(found, spelling)


def _to_write(storage, total: int, action: str | None, overwrite: bool) -> int:
    """Bytes a build at ``storage`` still has to put on its disk (``check_fits``' ``action``)."""
    group = storage.open_group("r")
    if action is None:
        action = "create" if group is None else "replace" if overwrite else "resume"
    if action == "create":
        return total
    if action == "resume" and group is not None:
        try:
            if np.asarray(group["complete"][:]).all():
                return 0
        except Exception:  # noqa: BLE001 - damaged metadata: the build reports it; count the bank as partial
            pass
    return max(0, total - storage.total_bytes())


def too_large_message(o: Oversize, spelling: str) -> str:
    """The one-line refusal: the bank's size, the limit(s) it is over, and the remedies with their sizes
    for this data (a factor bank's rank, fewer kernels, fewer rows, a larger cap, a larger disk), worded
    for the entry point ``spelling`` (a key of ``SPELLINGS``)."""
    words = SPELLINGS[spelling]
    kind = "computed" if o.computed else "dense" if o.rank is None else f"factor (rank {o.rank})"
    cross = f" with cross kernels of {o.n_cross} rows" if o.n_cross else ""
    head = f"a {kind} bank of {o.M} kernels over n = {o.n} rows ({o.dtype}){cross} takes {human(o.total)}"
    if o.to_write < o.total:
        head += f" ({human(o.to_write)} of it still to write)"
    limits, room = [], []
    if o.cap is not None:
        limits.append(f"more than the bank cache's cap MKLSCALE_CACHE_MAX={o.cap_text}")
        room.append(o.cap)
    if o.disk_free is not None:
        limits.append(f"more than the {human(o.disk_free)} free on the disk holding {o.path} (mounted at {o.mount})")
        room.append(o.disk_free)
    room_bytes = min(room)

    def size(**kw) -> int:
        args = {"M": o.M, "n": o.n, "dtype": o.dtype, "rank": o.rank, "n_features": o.n_features,
                "n_cross": o.n_cross, "computed": o.computed} | kw
        return bank_bytes(args.pop("M"), args.pop("n"), **args)

    remedies = []
    ranks = [r for r in SUGGESTED_RANKS if r < min(o.n, o.rank or o.n) and size(rank=r) <= room_bytes]
    if words["rank"] and ranks:
        what = "a factor bank" if o.rank is None else "a smaller rank"
        remedies.append(f"{words['rank'].format(r=ranks[0])} ({what}, n x {ranks[0]} per kernel) stores "
                        f"{human(size(rank=ranks[0]))}")
    if words.get("computed") and o.rank is None and not o.computed and o.n_features \
            and size(computed=True) <= room_bytes:
        remedies.append(f"{words['computed']} (no kernel stored: every pass computes them from the features) stores "
                        f"{human(size(computed=True))}")
    fit_M = _largest(lambda m: size(M=m) <= room_bytes, o.M - 1)
    if fit_M:
        each = (o.total - size(M=1)) / max(o.M - 1, 1)
        remedies.append(f"fewer kernels: at most {fit_M} of the {o.M} fit ({human(each)} each)")
    fit_n = _largest(lambda n: size(n=n) <= room_bytes, o.n - 1) if spelling != "import" else 0
    if fit_n >= 10:
        remedies.append(f"fewer rows: n = {fit_n} stores {human(size(n=fit_n))}")
    if o.cap is not None:
        remedies.append(f"set MKLSCALE_CACHE_MAX={_round_up(o.total)} (or none)")
    if o.disk_free is not None:
        remedies.append(words["disk"].format(need=human(o.total)))
    return f"{head}, {' and '.join(limits)}; the build did not start. Remedies: {'; '.join(remedies)}"


def _largest(fits, upper: int) -> int:
    """The largest k in 1..upper with fits(k) (fits monotone: true up to some k); 0 if none."""
    if upper < 1 or not fits(1):
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def human(nbytes: float) -> str:
    """Bytes in decimal units, three significant digits: '227 GB', '4.1 MB'."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(nbytes) < 999.5 or unit == "PB":
            return f"{nbytes:.3g} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1000
    return f"{nbytes:.3g} PB"


def _round_up(nbytes: int) -> str:
    """A size of at least ``nbytes`` with two significant digits, as $MKLSCALE_CACHE_MAX takes it: '230GB'."""
    for unit, scale in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale or unit == "kB":
            value = nbytes / scale
            step = 10 ** (math.floor(math.log10(value)) - 1) if value >= 1 else 0.1
            up = math.ceil(value / step - 1e-9) * step
            return f"{up:.10g}{unit}"
    return f"{nbytes}B"
