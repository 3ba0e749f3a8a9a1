"""Where a bank lives: a local (or shared-filesystem) folder, or an object-store URL.

``bank_location(path)`` turns what a user gave (a path, a string, an ``ObjectURL``) into either a
``pathlib.Path`` or an ``ObjectURL`` (``s3://bucket/prefix``). Any other URL scheme is refused with
a clear error, so ``build_bank(X, specs, "gs://b/bank")`` never writes a local folder named ``gs:``.

Credentials are never part of a location: a URL holding ``user:secret@`` is refused, and the
storage options an ``ObjectURL`` carries (overrides of the ``AWS_*`` environment variables, from a
storage-options table in a TOML config) are left out of its ``str``, ``repr`` and equality, so a
URL written into a bank, a result, a log or a report never carries a secret.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from mklscale.errors import InvalidInputError

#: URL schemes a bank path may have (besides none: a local path; and ``file://``, read as one).
SUPPORTED_SCHEMES = ("s3",)

#: Keys a storage-options table may set (each overrides the environment variable in brackets).
STORAGE_OPTION_KEYS = {
    "endpoint_url": "AWS_ENDPOINT_URL",
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
    "region": "AWS_REGION",
    "retry_timeout_s": None,  # bounded wait on an unreachable or failing server (default 60 s)
    "max_retries": None,
}

#: Storage options that are secrets: never written into banks, results, logs or reports.
SECRET_OPTION_KEYS = ("access_key_id", "secret_access_key", "session_token")
_SECRET_TOML = re.compile(r"""\b(%s)(\s*=\s*)("[^"\n]*"|'[^'\n]*')""" % "|".join(SECRET_OPTION_KEYS))

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class ObjectURL:
    """A bank on an S3-compatible object store: ``s3://bucket/prefix``; every object of the bank
    has a key under ``prefix/`` (``prefix/zarr.json``, ``prefix/gram/c/0/0/0``, ...).

    ``options`` holds storage-option overrides as sorted (key, value) pairs; it is hidden from
    ``str``/``repr`` and ignored by ``==`` and ``hash`` (it may hold secrets)."""

    bucket: str
    prefix: str
    options: tuple[tuple[str, object], ...] = field(default=(), repr=False, compare=False)

    scheme = "s3"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    def __repr__(self) -> str:
        return f"ObjectURL({str(self)!r})"

    def __fspath__(self) -> str:  # refuse silently becoming a local path
        raise TypeError(f"{self} is an object-store URL, not a local path")

    @property
    def name(self) -> str:
        """The last part of the prefix (as ``Path.name`` of a folder)."""
        return self.prefix.rsplit("/", 1)[-1]

    def child(self, *parts: str) -> str:
        """The key relative to the bank (what the bank's store, rooted at ``prefix``, is given)."""
        return "/".join(p.strip("/") for p in parts if p)

    def with_options(self, options: dict | None) -> ObjectURL:
        """This URL carrying storage-option overrides (checked: unknown keys are an error)."""
        if not options:
            return self
        return ObjectURL(self.bucket, self.prefix, _check_options(options))

    @property
    def option_dict(self) -> dict:
        return dict(self.options)


def is_url(path) -> bool:
    """True when ``path`` is written as a URL (``scheme://...``) or is an ``ObjectURL``."""
    if isinstance(path, ObjectURL):
        return True
    return isinstance(path, str) and bool(_URL.match(path))


def is_remote(path) -> bool:
    """True when ``path`` names a bank on an object store."""
    return isinstance(bank_location(path), ObjectURL)


def bank_location(path, storage_options: dict | None = None) -> Path | ObjectURL:
    """A ``Path`` for a local bank, an ``ObjectURL`` for ``s3://bucket/prefix``.

    Refuses (InvalidInputError, saying what is supported) any other scheme, a URL without a
    bucket or a prefix, one holding credentials (``user:secret@``), a query or a fragment.
    ``storage_options`` (overrides of the AWS_* environment variables) attach to an ObjectURL;
    for a local path they are an error.
    """
    if isinstance(path, ObjectURL):
        return path.with_options(storage_options)
    if isinstance(path, Path):
        location = path
    else:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidInputError(f"a bank path must be a string, a path or an s3:// URL, got {type(path).__name__}")
        text = os.fspath(path)
        match = _URL.match(text) if isinstance(text, str) else None
        location = Path(text) if match is None else _parse_url(text, match.group(1).lower())
    if isinstance(location, Path):
        if storage_options:
            raise InvalidInputError(f"storage options were given for the local path {location}; they apply only to "
                                    "object-store URLs (s3://bucket/prefix)")
        return location
    return location.with_options(storage_options)


def _parse_url(text: str, scheme: str) -> Path | ObjectURL:
    parts = urlsplit(text)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidInputError(f"{text}: a file:// URL must name a local path (file:///abs/path)")
        return Path(parts.path)
    if scheme not in SUPPORTED_SCHEMES:
        raise InvalidInputError(
            f"unsupported URL scheme {scheme!r} in the bank path {text!r}: a bank path is a local or shared "
            "folder, or an S3-compatible object store URL s3://bucket/prefix (for other S3-compatible servers "
            "set AWS_ENDPOINT_URL); copy the bank to one of those")
    if "@" in parts.netloc:
        raise InvalidInputError(
            "the bank URL holds credentials (user:secret@): never put them in a URL (it ends up in logs and "
            "reports); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or a [storage_options] table")
    if parts.query or parts.fragment:
        raise InvalidInputError(f"the bank URL {text!r} has a query or fragment; give s3://bucket/prefix only")
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not _BUCKET.match(bucket or ""):
        raise InvalidInputError(f"{text!r}: {bucket!r} is not a valid bucket name (3-63 characters: lowercase "
                                "letters, digits, '.', '-'); give s3://bucket/prefix")
    if not prefix:
        raise InvalidInputError(f"{text!r} names a whole bucket; give the bank a prefix inside it: "
                                f"s3://{bucket}/name.zarr")
    if any(p in ("", ".", "..") for p in prefix.split("/")):
        raise InvalidInputError(f"{text!r}: the prefix must not contain empty, '.' or '..' parts")
    return ObjectURL(bucket, prefix)


def _check_options(options: dict) -> tuple[tuple[str, object], ...]:
    if not isinstance(options, dict):
        raise InvalidInputError(f"storage options must be a table (dict), got {type(options).__name__}")
    unknown = sorted(set(options) - set(STORAGE_OPTION_KEYS))
    if unknown:
        raise InvalidInputError(f"unknown storage option(s) {unknown}; known: {sorted(STORAGE_OPTION_KEYS)}")
    return tuple(sorted(options.items()))



def redact_options(options: dict | None) -> dict | None:
    """A copy of a storage-options table with the secrets replaced by "<redacted>"."""
    if not isinstance(options, dict):
        return options
    return {k: ("<redacted>" if k in SECRET_OPTION_KEYS else v) for k, v in options.items()}


def redact_toml(text: str) -> str:
    """TOML text with the values of secret storage options replaced by "<redacted>" (for the copy of
    a pipeline spec kept in a run directory)."""
    return _SECRET_TOML.sub(lambda m: f'{m.group(1)}{m.group(2)}"<redacted>"', text)
