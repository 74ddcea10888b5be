"""The C allocator (glibc): give freed memory back, and limit how much it can keep.

glibc keeps freed chunks in its arenas, so RSS can stay high after ``del`` and
``gc.collect()``: that is *allocator retention*, not a leak, and ``malloc_trim(0)``
returns it. Each new thread may also get an arena of its own (up to 8 per core), each
keeping its own freed chunks: tf.data starts new threads for every new iterator, so a
training that iterates a dataset anew each epoch grows by an arena's worth per epoch
until the limit. :func:`limit_arenas` caps their number (``mallopt(M_ARENA_MAX)``).

glibc also serves a buffer from those arenas unless it is at least the *mmap threshold*,
which by default moves at run time (it rises to the size of each mapped buffer freed, up
to 32 MiB): after a first training step, most step buffers come from the arenas and stay
resident when freed, by an amount that differs from run to run. A **fixed** threshold
(:data:`FIXED_MMAP_THRESHOLD`, 128 KiB) maps every buffer of 128 KiB or more and returns
it on free: the peak of a training process then follows its live tensors, 9-40 % lower
and the same from run to run, at a cost in step time (every large tensor is a fresh
mapping). memfit's estimate and its measuring children take the policy as an argument
(``allocator="default"`` or ``"fixed"``; :func:`policy_env` is the environment of a
child under a policy) and :func:`fix_mmap_threshold` applies the fixed one to the
calling process.

Example:
    >>> released = malloc_trim()      # bytes of anonymous RSS released (None: not glibc)
    >>> policy_env("fixed")
    {'MALLOC_MMAP_THRESHOLD_': '131072'}
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import os
from typing import Any

from memfit import checks
from memfit.errors import MemfitError
from memfit.memory.probe import sample

__all__ = ["malloc_trim", "malloc_free", "malloc_in_use", "trim_available", "require_trim",
           "limit_arenas", "Release", "ReleaseProbe",
           "ALLOCATOR_POLICIES", "FIXED_MMAP_THRESHOLD", "policy_env", "check_policy",
           "fix_mmap_threshold", "current_policy"]

_M_ARENA_MAX = -8                # mallopt parameter number in glibc's malloc.h
_M_MMAP_THRESHOLD = -3

#: The fixed mmap threshold of the ``"fixed"`` policy: glibc's own starting value.
FIXED_MMAP_THRESHOLD = 128 * 1024
_ENV = "MALLOC_MMAP_THRESHOLD_"
#: ``"fixed"``: mmap threshold fixed at 128 KiB; ``"default"``: glibc as it comes (the
#: dynamic threshold, what a plain process runs under).
ALLOCATOR_POLICIES = ("fixed", "default")

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


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc 2.33 and later)."""
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_free() -> int | None:
    """The bytes glibc holds free in its arenas (``mallinfo2().fordblks``): memory the
    program freed and the allocator kept for reuse. Where it grows as much as anonymous
    RSS does, the growth is allocator retention, not a leak, measured without trimming.
    It walks every arena's free lists: tens of microseconds.

    Example:
        >>> free = malloc_free()            # None: not glibc 2.33 or later
        >>> free is None or free >= 0
        True

    Returns:
        Bytes, or ``None`` where the C library has no ``mallinfo2``.
    """
    info = _mallinfo2()
    return None if info is None else int(info.fordblks)


def malloc_in_use() -> int | None:
    """The bytes glibc has handed out and not had back: chunks in use in its arenas and
    mapped chunks (``mallinfo2().uordblks + hblkhd``). Where it grows as much as anonymous
    RSS does, live allocations hold the growth: a trim that gives memory back then gave
    back other free memory, and the growth is not allocator retention. (Python's small
    objects live in its own mapped arenas, outside this count.)

    Example:
        >>> used = malloc_in_use()          # None: not glibc 2.33 or later
        >>> used is None or used > 0
        True

    Returns:
        Bytes, or ``None`` where the C library has no ``mallinfo2``.
    """
    info = _mallinfo2()
    return None if info is None else int(info.uordblks + info.hblkhd)


def _mallinfo2() -> _MallInfo2 | None:
    lib = _load()
    info = getattr(lib, "mallinfo2", None) if lib else None
    if info is None:
        return None
    info.restype = _MallInfo2
    return info()


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
    count = checks.count("count", count, example=2)
    lib = _load()
    if not lib:
        return None
    if _arena_limit is None or count < _arena_limit:
        if lib.mallopt(_M_ARENA_MAX, count) == 1:
            _arena_limit = count
    return _arena_limit


def check_policy(policy: str) -> str:
    """Validates an allocator policy name (one of :data:`ALLOCATOR_POLICIES`).

    Example:
        >>> check_policy("fixed")
        'fixed'

    Args:
        policy: the name to check.

    Raises:
        ValueError: for any other value, quoting it.
    """
    return checks.choice("allocator", policy, ALLOCATOR_POLICIES)


def policy_env(policy: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that gives a process started with it the allocator ``policy``.

    Example:
        >>> import os, subprocess, sys
        >>> env = {**os.environ, **policy_env("fixed")}
        >>> subprocess.run([sys.executable, "train.py"], env=env)   # doctest: +SKIP

    Args:
        policy: ``"fixed"`` (mmap threshold fixed at 128 KiB) or ``"default"``.
        env: an environment to update and return (a copy is made); ``None``: only the
            variables the policy sets. For ``"default"`` the threshold variable is
            removed from it, so the process gets glibc's dynamic threshold.

    Returns:
        The environment variables (``{"MALLOC_MMAP_THRESHOLD_": "131072"}`` for
        ``"fixed"``), merged into a copy of ``env`` when one is given.
    """
    check_policy(policy)
    out = dict(env) if env is not None else {}
    if policy == "fixed":
        out[_ENV] = str(FIXED_MMAP_THRESHOLD)
    else:
        out.pop(_ENV, None)
    return out


_fixed_here = False


def fix_mmap_threshold(threshold: int = FIXED_MMAP_THRESHOLD) -> bool | None:
    """Fixes glibc's mmap threshold in this process (``mallopt(M_MMAP_THRESHOLD)``).

    The same as starting the process with ``MALLOC_MMAP_THRESHOLD_=131072`` for every
    allocation made afterwards: call it first thing, before importing TensorFlow, to
    get the ``"fixed"`` policy that ``memfit.estimate_memory(..., allocator="fixed")`` predicts.

    Example:
        >>> from memfit.memory.allocator import fix_mmap_threshold
        >>> fix_mmap_threshold()                    # doctest: +SKIP
        True

    Args:
        threshold: bytes; buffers at least this large are mapped and returned on free.

    Returns:
        ``True`` when set, ``None`` where the C library is not glibc (nothing done).
    """
    global _fixed_here
    threshold = checks.count("threshold", threshold, minimum=4096,
                             example=FIXED_MMAP_THRESHOLD, hint="It is in bytes.")
    lib = _load()
    if not lib:
        return None
    ok = lib.mallopt(_M_MMAP_THRESHOLD, threshold) == 1
    if ok and threshold == FIXED_MMAP_THRESHOLD:
        _fixed_here = True
    return ok


def current_policy() -> str:
    """The allocator policy of this process: ``"fixed"`` when it was started with
    :func:`policy_env` or called :func:`fix_mmap_threshold`, else ``"default"``.

    Example:
        >>> current_policy() in ALLOCATOR_POLICIES
        True
    """
    if _fixed_here or os.environ.get(_ENV) == str(FIXED_MMAP_THRESHOLD):
        return "fixed"
    return "default"


@dataclasses.dataclass(frozen=True)
class Release:
    """What one full ``gc.collect()`` between two ``fit()`` calls left, and what a trim gave.

    Attributes:
        before: anonymous RSS when the probe was armed (the end of the ``fit`` call).
        after_collect: anonymous RSS right after the collection (after ``del`` +
            ``gc.collect()``): what stayed.
        released: bytes a ``malloc_trim(0)`` right after gave back (``None``: no trim).
    """

    before: int
    after_collect: int
    released: int | None

    def to_record(self) -> dict:
        return dataclasses.asdict(self)


class ReleaseProbe:
    """Measures the memory kept after ``del`` + ``gc.collect()`` between ``fit()`` calls.

    Armed at the end of a ``fit`` call, it waits (a ``gc.callbacks`` entry, costless
    otherwise) for the next full collection (``gc.collect()``, generation 2), samples
    anonymous RSS right after it, calls ``malloc_trim(0)`` and records what it gave back;
    then it disarms until the next ``arm``. Memory that a collection has freed but that
    stays resident until a trim is allocator retention: the seed story of a script that
    builds a Python list of arrays every epoch and ``del``s it.

    Example:
        >>> probe = ReleaseProbe()
        >>> probe.arm()
        >>> _ = gc.collect()
        >>> len(probe.releases) == (1 if trim_available() else 0)
        True
        >>> probe.close()

    Args:
        trim: call ``malloc_trim(0)`` after the collection (``False``: only sample).
    """

    def __init__(self, *, trim: bool = True):
        self.trim = trim
        self.releases: list[Release] = []
        self._armed_at: int | None = None
        self._installed = False

    def arm(self) -> None:
        """Waits for the next full collection (from now; once)."""
        if not trim_available():
            return
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        self._armed_at = sample().anon_or_total

    def disarm(self) -> None:
        """Stops waiting (a ``fit`` call starts)."""
        self._armed_at = None

    def close(self) -> None:
        """Removes the ``gc.callbacks`` entry."""
        self._armed_at = None
        if self._installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._installed = False

    @property
    def largest(self) -> Release | None:
        """The release that gave back the most (``None``: none seen)."""
        return max(self.releases, key=lambda r: r.released or 0, default=None)

    def _callback(self, phase: str, info: dict) -> None:
        if phase != "stop" or self._armed_at is None or info.get("generation") != 2:
            return
        before, self._armed_at = self._armed_at, None
        try:
            after = sample().anon_or_total
            released = malloc_trim() if self.trim else None
        except Exception:       # noqa: BLE001 - never break a collection
            return
        self.releases.append(Release(before, after, released))
