"""Give memory that the program freed back to the OS: glibc's ``malloc_trim(0)``.

glibc keeps freed chunks in its arenas, so RSS can stay high after ``del`` and
``gc.collect()``: that is *allocator retention*, not a leak, and ``malloc_trim(0)``
returns it.

Example:
    >>> released = malloc_trim()      # bytes of anonymous RSS released (None: not glibc)
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from memfit.errors import MemfitError
from memfit.memory.probe import sample

__all__ = ["malloc_trim", "trim_available", "require_trim"]

_libc: Any = None


def _load() -> Any:
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            lib.malloc_trim.restype = ctypes.c_int
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    return _libc


def trim_available() -> bool:
    """Whether the C library has ``malloc_trim`` (glibc does; musl and macOS do not)."""
    return bool(_load())


def require_trim(what: str) -> None:
    """Raises a clear error when ``malloc_trim`` is missing.

    Raises:
        MemfitError: naming ``what`` asked for it.
    """
    if not trim_available():
        raise MemfitError(f"{what} needs glibc's malloc_trim, which this C library does not "
                          f"have (musl, macOS). Leave it unset on this platform.")


def malloc_trim() -> int | None:
    """Calls ``malloc_trim(0)`` and returns the anonymous RSS it released, in bytes.

    Returns:
        Bytes released (0 or more), or ``None`` where there is no ``malloc_trim``.
    """
    lib = _load()
    if not lib:
        return None
    before = sample().anon_or_total
    lib.malloc_trim(0)
    return max(0, before - sample().anon_or_total)
