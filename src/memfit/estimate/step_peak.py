"""The peak of a play: the live bytes of the step's buffers at their worst moment at one
batch size, and how glibc (its heap or ``mmap``) or oneDNN's pool serves them
(:func:`peak`); :class:`PeakCurve` reads the same figures at any batch size from one play.

Example:
    >>> from memfit.estimate.schedule import Executor, Op
    >>> ops = [Op(0, "x", "Mul", [], [], [("x:0", 0, 4)]),
    ...        Op(1, "y", "Mul", ["x:0"], [], [("y:0", 0, 8)])]
    >>> events = Executor(ops, {"y:0"}, threads=1, batch_size=1).play()
    >>> peak(events, 100, None, is_backward=lambda name: False).bytes   # x and y
    1200
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable, Iterable

from memfit.estimate.kernels import tensor_bytes
from memfit.estimate.pool import POOL_THRESHOLD, PoolPeak, play_pool
from memfit.estimate.schedule import Buffer, StepEvent

__all__ = ["Peak", "PeakCurve", "peak", "MMAP_THRESHOLD_MAX", "POOL_STEPS"]

# glibc raises its mmap threshold to the size of each mapped block freed, up to 32 MiB on
# 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): after the first step, smaller buffers come from
# the heap arenas (and stay there when freed), larger ones are mapped and unmapped.
MMAP_THRESHOLD_MAX = 32 * 2**20


@dataclasses.dataclass
class Peak:
    """The simulated peak of a training step at one batch size.

    Attributes:
        bytes: live tensor bytes at the peak (variables and the input batch excluded).
        op: the op running when the peak was reached.
        backward_bytes: of those, bytes of tensors produced by the backward pass
            (gradients and their temporaries).
        forward_bytes: bytes of tensors produced by the forward pass (activations kept
            for the backward pass, and the loss).
        by_layer: bytes at the peak per layer name (forward tensors, by producing op).
        heap_bytes: the peak of live buffers small enough for glibc to serve from its
            heap once the step has run (at most :data:`MMAP_THRESHOLD_MAX`, or the
            largest buffer): memory glibc keeps after they are freed.
        mmap_bytes: the peak of live larger buffers, which glibc maps and unmaps.
        pool_bytes: with oneDNN's allocator, the pages of its pool the steps wrote,
            beyond the kept buffers (:func:`~memfit.estimate.pool.play_pool`): it serves
            the buffers of :data:`~memfit.estimate.pool.POOL_THRESHOLD` or more, which
            are then in neither ``heap_bytes`` nor ``mmap_bytes``.
        pool_in_use: the pool's peak of bytes in use during a step.
    """

    bytes: int
    op: str
    backward_bytes: int
    forward_bytes: int
    by_layer: dict[str, int]
    heap_bytes: int = 0
    mmap_bytes: int = 0
    pool_bytes: int = 0
    pool_in_use: int = 0


#: Training steps the pool is played through (the pages it touches add up over steps).
POOL_STEPS = 4


def peak(events: list[StepEvent], batch_size: int, mmap_threshold: int | None, *,
         is_backward: Callable[[str], bool], split_batch: int | None = None,
         pool: bool = False, kept: Iterable[int] = (), step_inputs: Iterable[int] = (),
         memo: dict | None = None) -> Peak:
    """The peak of live bytes over ``events`` at ``batch_size``, and the peaks of the
    buffers glibc serves from its heap and from ``mmap`` (see :class:`Peak`).

    Args:
        events: a play (:meth:`Executor.play`).
        batch_size: samples per step.
        mmap_threshold: glibc's mmap threshold in bytes when it is fixed (buffers of at
            least this size are mapped); ``None``: glibc's dynamic threshold, which ends
            at the largest buffer of the step (at most 32 MiB).
        is_backward: whether a buffer made by the op of this name is the backward
            pass's.
        split_batch: decide which buffers glibc maps from their sizes at this batch
            size instead (``None``: at ``batch_size``). With the play and the split
            held, every peak is non-decreasing in ``batch_size`` (what the estimate's
            high end needs: a buffer that crosses the threshold would otherwise move
            from the heap's scale to the mapped one).
        pool: the process allocates through oneDNN's pool (:mod:`memfit.estimate.pool`),
            played over :data:`POOL_STEPS` steps.
        kept: the pool's buffers made before the step and kept (variables, slots).
        step_inputs: the bytes per sample of the buffers each step takes first (the
            input batch).
        memo: a dict kept by the caller across calls with the same ``events``: the
            pool's play depends on ``split_batch`` only, so it is played once for each
            (the estimate's high end asks for the same play at many batch sizes).

    With ``split_batch``, the pool is played with the buffers sized at ``split_batch``
    too, and its pages scale with the peak of the pooled buffers at ``batch_size``: the
    pool's placement changes with the sizes (it can need fewer pages for larger
    buffers), its share of waste is kept from the play.
    """
    split_at = batch_size if split_batch is None else split_batch
    threshold = _largest_heap_buffer(events, split_at, mmap_threshold)

    def served_by(b: Buffer) -> str:
        return _served_by(b, split_at, threshold, mmap_threshold, pool)

    live: dict[int, tuple[int, str, str]] = {}
    total = 0
    by_kind = dict.fromkeys(("heap", "mapped", "pool"), 0)
    peaks = dict(by_kind)
    pool_events: list[tuple[list[tuple[Hashable, int]], list[Hashable]]] = []
    pieces: dict[int, list[Hashable]] = {}     # a pooled buffer: the pool's allocations
    played_size: dict[int, int] = {}           # a pooled buffer's size at split_at
    at_split = split_peak = 0                  # pooled bytes live at split_at sizes
    best, best_at, best_live = -1, "", {}
    for op, allocated, freed in events:
        pooled: list[tuple[Hashable, int]] = []
        for b in allocated:
            size = tensor_bytes(b.fixed, b.per, b.cap, batch_size)
            kind = served_by(b)
            live[b.id] = (size, b.owner, kind)
            total += size
            by_kind[kind] += size
            peaks[kind] = max(peaks[kind], by_kind[kind])
            if kind == "pool":
                n = max(b.items, 1)
                pieces[b.id] = [(b.id, i) for i in range(n)]
                played_size[b.id] = tensor_bytes(b.fixed, b.per, b.cap, split_at)
                pooled += [(piece, played_size[b.id] // n) for piece in pieces[b.id]]
                at_split += played_size[b.id]
                split_peak = max(split_peak, at_split)
        if total > best:
            best, best_at, best_live = total, op.name, dict(live)
        unpooled: list[Hashable] = []
        for b_id in freed:
            size, _, kind = live.pop(b_id)
            total -= size
            by_kind[kind] -= size
            if kind == "pool":
                unpooled += pieces.pop(b_id)
                at_split -= played_size.pop(b_id)
        if pool:
            pool_events.append((pooled, unpooled))
    kept, step_inputs = tuple(kept), tuple(step_inputs)
    inputs = sum(step_inputs)
    key = (split_at, mmap_threshold, kept, step_inputs)
    if not pool:
        the_pool = PoolPeak()
    elif memo is not None and key in memo:
        the_pool = memo[key]
    else:
        the_pool = play_pool([pool_events] * POOL_STEPS, kept=kept,
                             step_inputs=[per * split_at for per in step_inputs])
        if memo is not None:
            memo[key] = the_pool
    pages = the_pool.touched
    if pool and split_at != batch_size and split_peak + inputs:
        pages = round(pages * (peaks["pool"] + inputs * batch_size)
                      / (split_peak + inputs * split_at))
    backward, forward, by_layer = _by_pass(best_live.values(), is_backward)
    return Peak(bytes=max(best, 0), op=best_at, backward_bytes=backward,
                forward_bytes=forward, by_layer=by_layer, heap_bytes=peaks["heap"],
                mmap_bytes=peaks["mapped"], pool_bytes=pages,
                pool_in_use=the_pool.in_use)


def _served_by(b: Buffer, split_at: int, threshold: int, mmap_threshold: int | None,
               pool: bool) -> str:
    """``pool`` (oneDNN's pool), ``mapped`` (glibc maps it) or ``heap``: decided from the
    buffer's size at ``split_at``."""
    size = tensor_bytes(b.fixed, b.per, b.cap, split_at)
    each = size // max(b.items, 1)          # an accumulator: many tensors, each its own
    if pool and each >= POOL_THRESHOLD:
        return "pool"
    if b.items:
        return "mapped" if mmap_threshold is not None and each > threshold else "heap"
    return "mapped" if size > threshold else "heap"


class PeakCurve:
    """:func:`peak`'s byte figures for one play with glibc's split held at ``split_batch``
    (``peak(..., split_batch=split_batch)``), at any batch size, without playing the
    events again: every buffer's kind is fixed by the split, its size is
    ``tensor_bytes`` at the batch size, and the live bytes of each kind after each
    event's allocations are sums over the buffers' lifetimes (a cumulative sum). The
    same integers as :func:`peak` (``tests/estimate/test_graph.py`` compares them); the
    estimate's high end asks for one play at many batch sizes.

    Example:
        >>> from memfit.estimate.schedule import Executor, Op
        >>> ops = [Op(0, "x", "Mul", [], [], [("x:0", 0, 4)]),
        ...        Op(1, "y", "Mul", ["x:0"], [], [("y:0", 0, 8)])]
        >>> events = Executor(ops, {"y:0"}, threads=1, batch_size=1).play()
        >>> PeakCurve(events, 1, None).at(100)       # bytes, heap, mapped, pool pages
        (1200, 1200, 0, 0)

    Args:
        events, mmap_threshold, pool, kept, step_inputs, memo: as for :func:`peak`.
        split_batch: the batch size the split (and the pool's play) is taken at.
    """

    def __init__(self, events: list[StepEvent], split_batch: int, mmap_threshold: int | None,
                 *, pool: bool = False, kept: Iterable[int] = (),
                 step_inputs: Iterable[int] = (), memo: dict | None = None):
        import numpy as np

        step_inputs = tuple(step_inputs)
        self._split, self._pool = split_batch, pool
        self._inputs = sum(step_inputs)
        self._touched = peak(events, split_batch, mmap_threshold, is_backward=lambda _: False,
                             split_batch=split_batch, pool=pool, kept=kept,
                             step_inputs=step_inputs, memo=memo).pool_bytes
        threshold = _largest_heap_buffer(events, split_batch, mmap_threshold)
        kinds = ("heap", "mapped", "pool")
        rows: list[list[int]] = []          # fixed, per, cap, kind, start, end
        open_: dict[int, int] = {}
        for t, (_, allocated, freed) in enumerate(events):
            for b in allocated:
                kind = kinds.index(_served_by(b, split_batch, threshold, mmap_threshold, pool))
                open_[b.id] = len(rows)
                rows.append([b.fixed, b.per, b.cap, kind, t, len(events)])
            for b_id in freed:
                rows[open_.pop(b_id)][5] = t + 1
        table = np.array(rows, dtype=np.int64).reshape(-1, 6)
        self._n = len(events)
        self._fixed, self._per, self._cap = table[:, 0], table[:, 1], table[:, 2]
        self._kind, self._start, self._end = table[:, 3], table[:, 4], table[:, 5]
        self._split_peak = self._peaks(split_batch)[3]

    def _peaks(self, batch_size: int) -> tuple[int, int, int, int]:
        """The most live bytes after any event's allocations: in all, and of the
        buffers of each kind (heap, mapped, pool)."""
        import numpy as np

        size = self._fixed + self._per * batch_size
        size = np.where(self._cap > 0, np.minimum(size, self._cap), size)
        total = np.zeros(self._n, dtype=np.int64)
        peaks = []
        for k in range(3):
            mine = self._kind == k
            change = np.zeros(self._n + 1, dtype=np.int64)
            np.add.at(change, self._start[mine], size[mine])
            np.subtract.at(change, self._end[mine], size[mine])
            live = np.cumsum(change[:-1])
            total += live
            peaks.append(max(0, int(live.max())) if self._n else 0)
        return (max(0, int(total.max())) if self._n else 0, *peaks)

    def at(self, batch_size: int) -> tuple[int, int, int, int]:
        """``(bytes, heap_bytes, mmap_bytes, pool_bytes)`` of :func:`peak` at
        ``batch_size``."""
        best, heap, mapped, pooled = self._peaks(batch_size)
        pages = self._touched
        if self._pool and self._split != batch_size and self._split_peak + self._inputs:
            pages = round(pages * (pooled + self._inputs * batch_size)
                          / (self._split_peak + self._inputs * self._split))
        return best, heap, mapped, pages


def _largest_heap_buffer(events: list[StepEvent], batch_size: int,
                         mmap_threshold: int | None) -> int:
    """The largest buffer glibc serves from its heap: below a fixed ``mmap_threshold``;
    else (glibc's dynamic threshold) the largest buffer of the step, up to
    :data:`MMAP_THRESHOLD_MAX`."""
    if mmap_threshold is not None:
        return mmap_threshold - 1
    largest = max((tensor_bytes(b.fixed, b.per, b.cap, batch_size) for e in events
                   for b in e.allocated if not b.items), default=0)
    return min(MMAP_THRESHOLD_MAX, largest)


def _by_pass(live: Iterable[tuple[int, str, bool]], is_backward: Callable[[str], bool]
             ) -> tuple[int, int, dict[str, int]]:
    """Live ``(size, owner, mapped)`` buffers split into backward and forward bytes, and
    the forward bytes by the op that made them."""
    backward = forward = 0
    by_layer: dict[str, int] = collections.defaultdict(int)
    for size, name, _ in live:
        if is_backward(name):
            backward += size
        else:
            forward += size
            by_layer[name] += size
    return backward, forward, dict(by_layer)
