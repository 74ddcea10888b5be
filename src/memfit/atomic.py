"""Writing files so that a reader never sees half of one: write a temporary name, then rename.

Example:
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.json"
    >>> write_text_atomic(p, "{}")
    >>> p.read_text()
    '{}'
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO

__all__ = ["temporary_name", "write_text_atomic", "discard", "file_sha256", "TMP_MARK"]

TMP_MARK = ".tmp-"


def temporary_name(path: str | os.PathLike) -> Path:
    """A unique temporary sibling of ``path`` (same directory, so rename is atomic)."""
    path = Path(path)
    return path.with_name(f"{TMP_MARK}{os.getpid()}-{path.name}")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` via a temporary file, fsync and rename."""
    tmp = temporary_name(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def discard(file: IO, tmp: str | os.PathLike) -> None:
    """Gives up a file being written under a temporary name: closes it (a close that
    fails again, as on a full disk, is ignored) and removes the temporary file.

    Args:
        file: the open file.
        tmp: its temporary name (see :func:`temporary_name`).
    """
    try:
        file.close()
    except OSError:
        pass
    finally:
        Path(tmp).unlink(missing_ok=True)


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, as hex; read in 4 MiB pieces.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a"
        >>> _ = p.write_bytes(b"")
        >>> file_sha256(p)[:12]
        'e3b0c44298fc'

    Args:
        path: the file.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
