"""The C allocator (glibc): give freed memory back, and limit how much it can keep.

glibc keeps freed chunks in its arenas, so RSS can stay high after ``del`` and
``gc.collect()``: that is *allocator retention*, not a leak, and ``malloc_trim(0)``
returns it. Each new thread may also get an arena of its own (up to 8 per core), each
keeping its own freed chunks: tf.data starts new threads for every new iterator, so a
training that iterates a dataset anew each epoch grows by an arena's worth per epoch
until the limit. :func:`limit_arenas` caps their number (``mallopt(M_ARENA_MAX)``).

Example:
    >>> released = malloc_trim()      # bytes of anonymous RSS released (None: not glibc)
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from memfit.errors import MemfitError
from memfit.memory.probe import sample

__all__ = ["malloc_trim", "trim_available", "require_trim", "limit_arenas"]

_M_ARENA_MAX = -8                # mallopt parameter number in glibc's malloc.h

_libc: Any = None


def _load() -> Any:
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            lib.malloc_trim.restype = ctypes.c_int
            lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.mallopt.restype = ctypes.c_int
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


_arena_limit: int | None = None


def limit_arenas(count: int) -> int | None:
    """Caps glibc's malloc arenas for threads created from now on (``M_ARENA_MAX``).

    Lowers the cap only: a cap already set lower (by an earlier call) is kept. Threads
    beyond the cap share arenas, so freed memory is reused instead of being kept once
    per thread.

    Args:
        count: the most arenas; at least 1.

    Returns:
        The cap in force, or ``None`` where the C library is not glibc (nothing done).
    """
    global _arena_limit
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer. Received: count={count!r}")
    lib = _load()
    if not lib:
        return None
    if _arena_limit is None or count < _arena_limit:
        if lib.mallopt(_M_ARENA_MAX, count) == 1:
            _arena_limit = count
    return _arena_limit
