"""Where a bank's bytes live: the shard-store protocol (``base.Storage``) and its backends.

``storage_for(location)`` is the one place that decides which backend a location names: a folder
(``local.LocalStorage``), ``s3://bucket/prefix`` (``objects.ObjectStorage``), ``memory://name`` for
tests (``memory.MemoryStorage``). Everything outside this package asks the storage it gets for what
it needs (bytes, the group, the writer lock, capabilities such as ``mappable``) and never which
backend it is.

Modules: ``location`` (parsing a user's path or URL), ``base`` (the protocol), ``local`` and
``writer_lock`` (folders), ``keyed`` (what key-value backends share), ``objects``, ``objstore`` and
``objlock`` (S3-compatible object stores), ``memory``.
"""

from __future__ import annotations

from mklscale.bank.storage.base import RangeReader, Storage
from mklscale.bank.storage.location import ObjectURL, bank_location
from mklscale.bank.storage.memory import MemoryLocation

__all__ = ["MemoryLocation", "ObjectURL", "RangeReader", "Storage", "bank_location", "storage_for"]


def storage_for(location, storage_options: dict | None = None) -> Storage:
    """The storage of the bank at ``location``: a path, an ``s3://`` URL (``storage_options``
    override the AWS_* environment variables), an ``ObjectURL``, a ``MemoryLocation`` or a
    ``Storage`` (returned as it is). Other schemes are refused (``location.bank_location``)."""
    if isinstance(location, Storage):
        return location
    if isinstance(location, MemoryLocation):
        from mklscale.bank.storage.memory import MemoryStorage

        return MemoryStorage(location)
    location = bank_location(location, storage_options)
    if isinstance(location, ObjectURL):
        from mklscale.bank.storage.objects import ObjectStorage

        return ObjectStorage(location)
    from mklscale.bank.storage.local import LocalStorage

    return LocalStorage(location)
