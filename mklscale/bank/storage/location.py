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

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class ObjectURL:
    """A bank on an S3-compatible object store: ``s3://bucket/prefix``; every object of the bank
    has a key under ``prefix/`` (``prefix/zarr.json``, ``prefix/gram/c/0/0/0``, ...).

    ``options`` holds storage-option overrides as sorted (key, value) pairs; it is hidden from
    ``str``/``repr`` and ignored by ``==`` and ``hash`` (it may hold secrets). ``fence``: the token
    of the writer lock a writer holds (``objlock``), set on the URL its writes go through, so every
    write made through it, in any process, first checks that the lock is still its own."""

    bucket: str
    prefix: str
    options: tuple[tuple[str, object], ...] = field(default=(), repr=False, compare=False)
    fence: str | None = field(default=None, repr=False, compare=False)

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
        return ObjectURL(self.bucket, self.prefix, _check_options(options), self.fence)

    def with_fence(self, token: str | None) -> ObjectURL:
        """This URL with its writes fenced by the writer lock whose token is ``token``."""
        return ObjectURL(self.bucket, self.prefix, self.options, token)

    @property
    def option_dict(self) -> dict:
        return dict(self.options)


def is_url(path) -> bool:
    """True when ``path`` is written as a URL (``scheme://...``) or is an ``ObjectURL``."""
    if isinstance(path, ObjectURL):
        return True
    return isinstance(path, str) and bool(_URL.match(path))


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
        if match is None and isinstance(text, str):
            _refuse_misspelt_url(text)
        location = Path(text) if match is None else _parse_url(text, match.group(1).lower())
    if isinstance(location, Path):
        if storage_options:
            raise InvalidInputError(f"storage options were given for the local path {location}; they apply only to "
                                    "object-store URLs (s3://bucket/prefix)")
        return location
    return location.with_options(storage_options)


def placed(path, base: Path, storage_options: dict | None = None) -> tuple[Path | ObjectURL, bool]:
    """Where a bank path written in a config file points, and whether it is shared: a URL or an
    absolute folder is used as given (shared: other runs may use the same bank), a relative folder is
    placed under ``base`` (the run's own). ``storage_options`` as in ``bank_location``."""
    location = bank_location(path, storage_options)
    if isinstance(location, ObjectURL) or location.is_absolute():
        return location, True
    return Path(base) / location, False


#: Schemes whose spelling without "//" (``s3:/bucket/x``, ``s3:bucket/x``) is a mistyped URL, not a folder.
_URL_LIKE = re.compile(r"^(s3|s3a|gs|gcs|az|abfs|abfss|http|https|file):", re.IGNORECASE)


def _refuse_misspelt_url(text: str) -> None:
    match = _URL_LIKE.match(text)
    if match:
        rest = text[match.end():].lstrip("/")
        raise InvalidInputError(
            f"{text!r} looks like an object-store URL without its '//': write s3://{rest} (for a local folder whose "
            f"name starts with {match.group(0)!r}, write ./{text})")


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
    """The copy of a pipeline spec kept in a run directory: the text itself when, parsed, it holds no
    secret storage option anywhere; else the parsed document written back (``tomli_w``) with every
    secret's value "<redacted>". Secrets are found by parsing, so no spelling keeps one (quoted keys,
    multi-line or literal strings, inline or dotted tables); the rewritten copy loses the comments."""
    import tomllib

    import tomli_w

    doc = tomllib.loads(text)
    redacted = _redact_secrets(doc)
    if redacted == doc:
        return text
    return ("# this copy of the pipeline was written back from the parsed file with its storage secrets "
            "redacted (comments are not kept)\n" + tomli_w.dumps(redacted))


def _redact_secrets(value):
    if isinstance(value, dict):
        return {k: ("<redacted>" if k in SECRET_OPTION_KEYS else _redact_secrets(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_secrets(v) for v in value]
    return value
