"""The oneDNN CPU allocator's pool: where the step's large buffers live, and how much of it
is resident.

With oneDNN on (TensorFlow's default on x86), the CPU allocator is ``MklCPUAllocator``
(tensorflow/core/common_runtime/mkl_cpu_allocator.h): requests of at least 256 KiB
(``kSmallAllocationsThreshold``; smaller ones go to malloc) are served by a BFC allocator
(xla/tsl/framework/bfc_allocator.cc) that grows and never gives memory back. Its rules,
played here:

* a request is rounded up to 256 bytes (``kMinAllocationSize``);
* free chunks sit in 21 bins by size, bin ``i`` holding ``[256·2^i, 256·2^(i+1))``, each
  ordered by (size, address); a request takes the first chunk that fits, searching from
  its own bin upwards (best fit within a bin);
* a chunk of at least twice the request (or 128 MiB more) is split, the rest stays free;
* a freed chunk merges with free neighbours in its region;
* when nothing fits, a new region is taken from the system: 2 MiB at first, doubled until
  the request fits, and doubled again for the next one when it already did
  (``Extend``); regions are never returned.

Regions come from one aligned ``malloc`` each, so only the pages a tensor wrote are
resident: :func:`play_pool` reports the bytes in use at their peak (what
``tf.config.experimental.get_memory_info`` calls ``peak``), the regions' size, and the
pages touched so far (what the resident set sees).

Example:
    >>> pool = Pool()
    >>> a = pool.allocate(3 * 2**20)     # a 4 MiB region (2 MiB doubled), not split
    >>> b = pool.allocate(2**20)         # a second 4 MiB region (the next will be 8)
    >>> pool.free(a); c = pool.allocate(2**20)   # best fit: the 3 MiB left beside b
    >>> pool.region_bytes // 2**20, pool.peak_in_use // 2**20, pool.touched // 2**20
    (8, 5, 5)
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Hashable, Iterable

__all__ = ["POOL_THRESHOLD", "Pool", "PoolPeak", "play_pool"]

#: MklCPUAllocator's ``kSmallAllocationsThreshold``: requests of this size or more go to
#: the BFC pool.
POOL_THRESHOLD = 256 * 2**10
MIN_ALLOCATION = 256          # kMinAllocationSize
NUM_BINS = 21                 # kNumBins
FIRST_REGION = 2 * 2**20      # allow_growth: the first region
MAX_INTERNAL_FRAGMENTATION = 128 * 2**20
PAGE = 4096


def _rounded(n: int) -> int:
    return -(-n // MIN_ALLOCATION) * MIN_ALLOCATION


def _bin(size: int) -> int:
    return min(NUM_BINS - 1, (max(size, MIN_ALLOCATION) // MIN_ALLOCATION).bit_length() - 1)


@dataclasses.dataclass
class _Chunk:
    ptr: int
    size: int
    region: int
    used: bool = False
    prev: int | None = None
    next: int | None = None


class Pool:
    """A BFC allocator with growth on, as oneDNN's CPU allocator runs it (see the module
    docstring). Sizes in bytes; :meth:`allocate` returns a handle for :meth:`free`."""

    def __init__(self) -> None:
        self.chunks: dict[int, _Chunk] = {}
        self.bins: list[list[tuple[int, int, int]]] = [[] for _ in range(NUM_BINS)]
        self.regions: list[tuple[int, int]] = []     # (base, size)
        self.touched_pages: list[list[tuple[int, int]]] = []   # per region, merged
        self.next_region = FIRST_REGION
        self.in_use = self.peak_in_use = self.region_bytes = self.touched = 0
        self._ids = 0

    def allocate(self, num_bytes: int) -> int:
        """Serve a request of ``num_bytes``; returns the chunk's handle."""
        rounded = _rounded(max(num_bytes, 1))
        h = self._find(rounded)
        if h is None:
            self._extend(rounded)
            h = self._find(rounded)
        assert h is not None
        c = self.chunks[h]
        c.used = True
        self.in_use += c.size
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        self._touch(c.region, c.ptr, c.ptr + num_bytes)
        return h

    def free(self, h: int) -> None:
        """Give the chunk back; it merges with its free neighbours."""
        c = self.chunks[h]
        c.used = False
        self.in_use -= c.size
        if c.next is not None and not self.chunks[c.next].used:
            self._merge(h, c.next)
        if c.prev is not None and not self.chunks[c.prev].used:
            h = c.prev
            self._merge(h, self.chunks[h].next)
        self._insert(h)

    def _find(self, rounded: int) -> int | None:
        for b in range(_bin(rounded), NUM_BINS):
            chunks = self.bins[b]
            i = bisect.bisect_left(chunks, (rounded, -1, -1))
            if i < len(chunks):
                _, _, h = chunks.pop(i)
                c = self.chunks[h]
                if c.size >= 2 * rounded or c.size - rounded >= MAX_INTERNAL_FRAGMENTATION:
                    self._split(h, rounded)
                return h
        return None

    def _split(self, h: int, size: int) -> None:
        c = self.chunks[h]
        rest = self._new(_Chunk(c.ptr + size, c.size - size, c.region, prev=h, next=c.next))
        if c.next is not None:
            self.chunks[c.next].prev = rest
        c.next, c.size = rest, size
        self._insert(rest)

    def _merge(self, h: int, h_next: int) -> None:
        """Chunk ``h`` absorbs the free chunk after it."""
        c, n = self.chunks[h], self.chunks[h_next]
        self._remove(h_next)
        if not c.used:
            self._remove(h)
        c.size += n.size
        c.next = n.next
        if n.next is not None:
            self.chunks[n.next].prev = h
        del self.chunks[h_next]

    def _extend(self, rounded: int) -> None:
        increased = False
        while rounded > self.next_region:
            self.next_region *= 2
            increased = True
        size = self.next_region
        if not increased:
            self.next_region *= 2
        base = sum(s for _, s in self.regions) + len(self.regions) * PAGE
        self.regions.append((base, size))
        self.touched_pages.append([])
        self.region_bytes += size
        self._insert(self._new(_Chunk(base, size, len(self.regions) - 1)))

    def _new(self, c: _Chunk) -> int:
        self._ids += 1
        self.chunks[self._ids] = c
        return self._ids

    def _insert(self, h: int) -> None:
        c = self.chunks[h]
        bisect.insort(self.bins[_bin(c.size)], (c.size, c.ptr, h))

    def _remove(self, h: int) -> None:
        c = self.chunks[h]
        chunks = self.bins[_bin(c.size)]
        i = bisect.bisect_left(chunks, (c.size, c.ptr, h))
        if i < len(chunks) and chunks[i][2] == h:
            chunks.pop(i)

    def _touch(self, region: int, start: int, end: int) -> None:
        """Pages ``[start, end)`` become resident (merged into the region's spans)."""
        lo, hi = start // PAGE, -(-end // PAGE)
        spans = self.touched_pages[region]
        i = bisect.bisect_left(spans, (lo, lo))
        if i > 0 and spans[i - 1][1] >= lo:
            i -= 1
        j = i
        while j < len(spans) and spans[j][0] <= hi:
            lo, hi = min(lo, spans[j][0]), max(hi, spans[j][1])
            self.touched -= (spans[j][1] - spans[j][0]) * PAGE
            j += 1
        spans[i:j] = [(lo, hi)]
        self.touched += (hi - lo) * PAGE


@dataclasses.dataclass
class PoolPeak:
    """The pool after the steps played (bytes).

    Attributes:
        in_use: the most bytes of chunks in use at once during a step, over what the
            pool held when the step began (``get_memory_info``'s ``peak`` then).
        regions: the regions taken from the system.
        touched: the pages written so far, over those the kept buffers fill: the
            resident memory of the pool, beyond the kept buffers.
    """

    in_use: int = 0
    regions: int = 0
    touched: int = 0


def play_pool(steps: Iterable[list[tuple[list[tuple[Hashable, int]], list[Hashable]]]], *,
              kept: Iterable[int] = (), step_inputs: Iterable[int] = ()) -> PoolPeak:
    """Play the pool through training steps.

    Example:
        >>> step = [([(1, 2**20), (2, 2**20)], []), ([], [1, 2])]
        >>> p = play_pool([step, step], kept=[2**20])
        >>> p.in_use // 2**20, p.regions // 2**20, p.touched // 2**20
        (2, 6, 2)

    Args:
        steps: per step, its events in time order: ``(allocated, freed)`` with
            ``allocated`` as ``(buffer id, bytes)`` and ``freed`` as buffer ids (only the
            pool's buffers: at least :data:`POOL_THRESHOLD`).
        kept: buffers allocated before the first step and never freed (variables and
            optimizer slots, in creation order).
        step_inputs: buffers each step takes first and frees last (the input batch).
    """
    pool = Pool()
    kept_bytes = 0
    for size in kept:
        if size >= POOL_THRESHOLD:
            pool.allocate(size)
            kept_bytes += size
    in_use = 0
    for events in steps:
        start = pool.in_use
        handles: dict[Hashable, int] = {}
        pool.peak_in_use = start
        inputs = [pool.allocate(s) for s in step_inputs if s >= POOL_THRESHOLD]
        for allocated, freed in events:
            for b, size in allocated:
                handles[b] = pool.allocate(size)
            for b in freed:
                if b in handles:
                    pool.free(handles.pop(b))
        for h in inputs + list(handles.values()):     # what the step returned dies too
            pool.free(h)
        in_use = max(in_use, pool.peak_in_use - start)
    return PoolPeak(in_use=in_use, regions=pool.region_bytes,
                    touched=max(0, pool.touched - kept_bytes))
