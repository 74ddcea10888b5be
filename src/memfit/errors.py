"""memfit's exceptions: each message says what was wrong, with the value, and what to do."""

from __future__ import annotations

__all__ = ["MemfitError", "DatasetError", "CorruptShardError"]


class MemfitError(Exception):
    """Base class of memfit's own errors."""


class DatasetError(MemfitError, ValueError):
    """A dataset directory or a source cannot be used as asked."""


class CorruptShardError(MemfitError):
    """A shard's bytes do not match its checksums (CRC32C per record, sha256 per file)."""

    def __init__(self, message: str, file: str, record: int | None = None):
        super().__init__(message)
        self.file = file
        self.record = record
