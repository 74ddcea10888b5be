"""memfit's exceptions: each message says what was wrong, with the value, and what to do."""

from __future__ import annotations

__all__ = ["MemfitError", "DatasetError", "CorruptShardError", "FrameworkMissingError"]


class MemfitError(Exception):
    """Base class of memfit's own errors.

    Attributes:
        exit_code: what the ``memfit`` command exits with when this error ends it: 2
            (bad input) unless a subclass says otherwise (a command that does not exist:
            127, as in a shell). ``memfit.cli.main`` handles every one of them, once.
    """

    exit_code: int = 2


class DatasetError(MemfitError, ValueError):
    """A dataset directory or a source cannot be used as asked."""


class CorruptShardError(MemfitError):
    """A shard's bytes do not match its checksums (CRC32C per record, sha256 per file)."""

    def __init__(self, message: str, file: str, record: int | None = None):
        super().__init__(message)
        self.file = file
        self.record = record


class FrameworkMissingError(MemfitError, ImportError):
    """A capability needs a framework that is not installed (TensorFlow, Keras); the
    message names the extra that installs it. An :class:`ImportError` too, so that
    ``except ImportError`` still catches it."""
