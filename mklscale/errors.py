"""The one exception hierarchy of mklscale.

Every error raised on bad input says what was wrong and what to do about it. Each class also
derives from the builtin exception a caller would naturally catch (ValueError, FileExistsError...),
so ``except ValueError`` keeps working for scikit-learn style code.
"""

from __future__ import annotations

import os
import signal


class MKLScaleError(Exception):
    """Base class of every error mklscale raises on purpose."""


class InvalidInputError(MKLScaleError, ValueError):
    """An argument has the wrong shape, type, value range, or contains NaN/inf."""


class SpecError(InvalidInputError):
    """A kernel spec is malformed: unknown family, bad parameter, bad feature subset."""


class BankError(MKLScaleError):
    """Base class of errors about a kernel bank on disk."""


class NotABankError(BankError, FileExistsError):
    """A path exists but does not hold an mklscale kernel bank."""


class BankMismatchError(BankError, ValueError):
    """An existing bank was built from other data, specs or settings than the ones given."""


class BankIncompleteError(BankError, RuntimeError):
    """The bank has kernels that are not finished (or are corrupt) and the caller did not allow it."""


class BankCorruptError(BankError, RuntimeError):
    """Stored kernel data does not match its recorded checksum."""


class BankLockedError(BankError, RuntimeError):
    """Another process writes the bank (build, repair, verify's marking) and the caller did not wait."""


class BankLockLostError(BankLockedError):
    """A writer found that the bank's writer lock is no longer its own (it paused past the lock's expiry
    and another writer took the bank over): it stopped before writing anything more."""


class SchemaVersionError(BankError, ValueError):
    """A store or file was written by a newer mklscale schema than this one reads."""


class ReadOnlyStoreError(BankError, PermissionError):
    """The store cannot be written (read-only file system or permissions)."""


class DiskFullError(BankError, OSError):
    """The file system holding a bank ran out of space (ENOSPC/EDQUOT) while writing it."""


class ObjectStoreError(BankError, ConnectionError):
    """An object store (s3://) holding a bank cannot be reached, refuses the credentials, has no such
    bucket, or kept failing past the retry deadline (issue 20, ``mklscale.bank.storage.objstore``)."""


class ConfigError(InvalidInputError):
    """A TOML config has unknown keys, wrong types or impossible values."""


class ClusterUnavailableError(MKLScaleError, RuntimeError):
    """A Dask scheduler or batch system named by a cluster config cannot be reached or started in time."""


class ModelFileError(MKLScaleError, ValueError):
    """A saved model is missing, truncated, inconsistent or of a newer schema than this mklscale reads."""


class OutputWriteError(MKLScaleError, OSError):
    """An output (a model folder, a predictions file) cannot be written: the disk is full, read-only or
    not permitted. Nothing half-written is left at the output's path."""


class Preempted(MKLScaleError):
    """SIGTERM/SIGINT arrived during a solve; the state was saved to ``checkpoint`` (resume from it)."""

    def __init__(self, signum: int, checkpoint: os.PathLike | None):
        self.signum, self.checkpoint = signum, checkpoint
        where = f"state saved to {checkpoint}; resume with --resume (or fit(..., resume=True))" if checkpoint \
            else "no checkpoint configured, progress is lost"
        super().__init__(f"stopped by {signal.Signals(signum).name}: {where}")


class Stopped(BaseException):
    """SIGINT/SIGTERM stopped a command (see ``mklscale.runtime.interrupt``); ``str()`` is the one line
    the CLI prints: the signal, what was saved and how to continue. Like KeyboardInterrupt it is not
    an ``Exception``, so no ``except Exception`` on the way up swallows it."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(message or f"stopped by {self.signal_name}")


class CheckpointError(MKLScaleError):
    """A checkpoint cannot be written (disk full, read-only) or read (truncated, other problem)."""
