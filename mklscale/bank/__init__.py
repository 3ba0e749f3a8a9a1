"""Kernel banks: specs that compute Gram matrices, the zarr store that holds them, and the build.

Modules, each importing only those listed before it (``tests/test_layering.py`` checks there is no
import cycle): ``_compute`` (numba kernels), ``spec`` and ``families`` (KernelSpec), ``factor`` (factor
banks' math: Nystrom, pivoted Cholesky, ``factor_rows``), ``inputs`` (checks of user input), ``normalize`` (normalisation rules), ``stats`` (per-kernel statistics,
crc32c), ``direct_io`` (O_DIRECT writes), ``shard_format`` (the shard files' bytes), ``fs_errors``
(disk full, read-only store), ``group`` (the zarr group: layout, creation), ``storage`` (where the
bytes live: folders, object stores), ``metadata`` (a bank's metadata checked on open), ``shards`` (computing and writing shards as tasks),
``integrity`` (verify, the record of bad kernels, repair), ``store`` (KernelBank),
``build`` (build_bank, repair_bank), ``transfer`` (bank copy), ``cache`` (the estimators' bank cache: locks, size cap, eviction).
"""

from mklscale.bank import families
from mklscale.bank.build import build_bank, repair_bank
from mklscale.bank.spec import KernelSpec
from mklscale.bank.store import KernelBank, VerifyReport

__all__ = ["KernelBank", "KernelSpec", "VerifyReport", "build_bank", "families", "repair_bank"]
