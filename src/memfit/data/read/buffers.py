"""Memory the input pipelines reuse instead of taking anew: aligned batches TensorFlow can
wrap without a copy, pools of scratch buffers, and batches taken back once TensorFlow lets
go of them (a fresh buffer costs a page fault and a zeroed page per 4 KiB written).

- :func:`aligned_empty` and :func:`touch`: a 64-byte aligned array, its pages made
  resident ahead of a timed call.
- :class:`BufferPool`: scratch buffer sets, one per concurrent user.
- :class:`RecyclingBuffers`: the batches handed to TensorFlow, reused once no array views
  them any more.
- :func:`release_pages`: unmaps the pages of memory-mapped arrays from this process.

Example:
    >>> batch = aligned_empty((256, 32), np.dtype("float32"))
    >>> batch.ctypes.data % 64
    0
"""

from __future__ import annotations

import math
import mmap
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import numpy as np

__all__ = ["ALIGN", "aligned_empty", "touch", "BufferPool", "RecyclingBuffers",
           "release_pages"]

ALIGN = 64                      # TensorFlow shares (does not copy) 64-byte aligned buffers

T = TypeVar("T")


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-order array whose data is ``align``-byte aligned (TensorFlow
    wraps a 64-byte aligned buffer as a tensor without copying it).

    Args:
        shape: the array's shape.
        dtype: its dtype.
        align: the alignment in bytes (a power of two).
    """
    return _aligned_view(np.empty(math.prod(shape) * dtype.itemsize + align, np.uint8),
                         shape, dtype, align)


def _aligned_view(raw: np.ndarray, shape: tuple[int, ...], dtype: np.dtype,
                  align: int = ALIGN) -> np.ndarray:
    """The ``shape``/``dtype`` array at the first ``align``-byte boundary of ``raw``."""
    nbytes = math.prod(shape) * dtype.itemsize
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def touch(array: np.ndarray) -> None:
    """Writes one byte per 4 KiB page of a (C-contiguous) array: its memory is resident
    now, not at the first write of a later, timed call."""
    flat = array.reshape(-1).view(np.uint8)
    flat[::4096] = 0


class BufferPool(Generic[T]):
    """A thread-safe free list of scratch buffer sets, one per concurrent user.

    Example:
        >>> pool = BufferPool(lambda n: np.empty(n), lambda buf, n: len(buf) >= n)
        >>> buf = pool.get(10); pool.put(buf)
        >>> pool.get(5) is buf
        True

    Args:
        make: ``make(need)`` builds a new buffer set for a request of size ``need``.
        fits: ``fits(buffers, need)``: whether a pooled set can serve that request.
    """

    def __init__(self, make: Callable[[Any], T], fits: Callable[[T, Any], bool]):
        self._make = make
        self._fits = fits
        self._free: list[T] = []
        self._lock = threading.Lock()

    def get(self, need: Any) -> T:
        """A pooled buffer set that fits ``need``, or a new one."""
        with self._lock:
            bufs = self._free.pop() if self._free else None
        if bufs is None or not self._fits(bufs, need):
            bufs = self._make(need)
        return bufs

    def put(self, bufs: T) -> None:
        """Returns a buffer set for the next call."""
        with self._lock:
            self._free.append(bufs)

    def reserve(self, count: int, need: Any, prepare: Callable[[T], None]) -> None:
        """Makes sure ``count`` sets that fit ``need`` are pooled; new sets go through
        ``prepare`` (e.g. to touch their pages) before anyone can get them."""
        with self._lock:
            missing = count - sum(1 for b in self._free if self._fits(b, need))
        new = [self._make(need) for _ in range(missing)]
        for bufs in new:
            prepare(bufs)
        with self._lock:
            self._free.extend(new)


class RecyclingBuffers:
    """Aligned arrays handed to TensorFlow, taken back once nothing refers to them.

    A batch returned from a ``tf.numpy_function`` is wrapped without a copy and lives as
    long as TensorFlow's tensors (and their slices) do; a fresh array each time costs a
    page fault and a zeroed page per 4 KiB. This pool keeps up to ``keep`` raw buffers
    and hands out one that no array views any more (CPython reference counts: the pool's
    own reference is the only one left), else a new one (kept if there is room).

    Example:
        >>> pool = RecyclingBuffers(keep=2)
        >>> a = pool.array((4, 8), np.dtype("float32"))
        >>> b = pool.array((4, 8), np.dtype("float32"))
        >>> a.ctypes.data == b.ctypes.data
        False
        >>> address = a.ctypes.data; del a
        >>> pool.array((4, 8), np.dtype("float32")).ctypes.data == address
        True

    Args:
        keep: the most buffers kept for reuse (what the plan counts as alive at once).
    """

    def __init__(self, keep: int):
        self.keep = max(1, keep)
        self._bufs: list[np.ndarray] = []
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> None:
        """Keeps ``keep`` buffers of at least ``nbytes`` bytes, their pages touched, so that
        the arrays handed out later never take new memory (within ``keep`` alive)."""
        with self._lock:
            self._bufs = [b for b in self._bufs if b.nbytes >= nbytes + ALIGN]
            while len(self._bufs) < self.keep:
                raw = np.empty(nbytes + ALIGN, np.uint8)
                touch(raw)
                self._bufs.append(raw)

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised aligned C-order array of this shape and dtype."""
        nbytes = math.prod(shape) * dtype.itemsize
        raw = None
        with self._lock:
            bufs = self._bufs
            # Free: no array views the buffer any more. A NumPy view (and a view of a
            # view) holds a reference to the buffer it views, so a free buffer has two:
            # the list's and getrefcount's own argument (tests/data/test_buffers.py).
            free = [i for i in range(len(bufs)) if sys.getrefcount(bufs[i]) <= 2]
            for i in free:
                if bufs[i].nbytes >= nbytes + ALIGN:
                    raw = bufs[i]
                    break
            if raw is None:
                raw = np.empty(nbytes + ALIGN, np.uint8)
                if len(bufs) < self.keep:
                    bufs.append(raw)
                elif free:                      # replace a free buffer that is too small
                    bufs[free[0]] = raw
        return _aligned_view(raw, shape, dtype)


def release_pages(arrays: Iterable[Any]) -> None:
    """Unmaps the pages of memory-mapped arrays from this process (the page cache keeps
    them): file-backed RSS drops, nothing is lost. Other arrays are left alone.

    Example:
        >>> release_pages([np.zeros(3)])                # not memory-mapped: nothing to do
    """
    for array in arrays:
        mm = getattr(array, "_mmap", None)
        if isinstance(mm, mmap.mmap) and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED)
