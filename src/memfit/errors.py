"""memfit's exceptions: each message says what was wrong, with the value, and what to do."""

from __future__ import annotations

import errno
import os
import re

__all__ = ["MemfitError", "DatasetError", "CorruptShardError", "FrameworkMissingError",
           "Interrupted", "write_failure", "cause"]


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


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C (SIGINT) that stopped work which leaves something on disk: the message
    says what was left and what to do (``memfit pack``: the shards kept, and that the same
    command resumes). A :class:`KeyboardInterrupt`, so that whatever stops on one still
    does; ``memfit.cli.main`` prints the message after ``interrupted``.

    Example:
        >>> str(Interrupted("'out' keeps 3 finished shards"))
        "'out' keeps 3 finished shards"
    """


_WRITE_HINTS = {errno.ENOSPC: "free space on that disk",
                errno.EDQUOT: "free space within your disk quota",
                errno.EFBIG: "raise the file-size limit (ulimit -f)",
                errno.EROFS: "give a writable --workdir",
                errno.EACCES: "give a writable --workdir"}


def write_failure(error: OSError, default: str = "fix the cause") -> tuple[str, str]:
    """What a write the disk refused says, in a few words with its code, and what to do:
    one wording for every file memfit writes in a workdir (checkpoints, the memory log).

    Example:
        >>> write_failure(OSError(errno.EFBIG, "File too large"))
        ('File too large (EFBIG)', 'raise the file-size limit (ulimit -f)')

    Args:
        error: the error the write raised.
        default: the fix for an error without a known one.

    Returns:
        ``(what, hint)``: the system's words for the errno with its name, and the fix.
    """
    # A library's own text (h5py's) runs over several lines; the errno says it shortly.
    what = os.strerror(error.errno) if error.errno else str(error)
    code = errno.errorcode.get(error.errno or 0)
    return (f"{what} ({code})" if code else what,
            _WRITE_HINTS.get(error.errno or 0, default))


#: Terminal colour and cursor codes (Keras colours its messages) and runs of whitespace.
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SPACE = re.compile(r"\s+")


def cause(error: BaseException, limit: int = 300) -> str:
    r"""A framework's exception as it goes inside one of memfit's one-line messages: its
    type and text, without terminal colour codes, its lines joined, cut at ``limit``
    characters. Keras's own messages run over several lines and colour a part of them.

    Example:
        >>> cause(ValueError("Exception when calling Functional.call().\n\n\x1b[1mThe "
        ...                  "structure doesn't match.\x1b[0m"))
        "ValueError: Exception when calling Functional.call(). The structure doesn't match."
        >>> cause(RuntimeError("x" * 10), limit=5)
        'RuntimeError: xxxx…'

    Args:
        error: the exception a framework raised.
        limit: the most characters of its text to keep.
    """
    text = _SPACE.sub(" ", _ESCAPES.sub("", str(error))).strip()
    if len(text) > limit:
        text = text[:limit - 1].rstrip() + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
