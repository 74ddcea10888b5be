"""The play: the training step's ops run the way TensorFlow's executor runs them, and the
buffers they hold over time.

An op starts when its inputs (and control inputs) are ready, in the order they became
ready, on one of ``threads`` executor threads (TensorFlow's inter-op pool has a thread
per CPU: while one thread is in a long convolution, another runs what else is ready, an
optimizer update say, and both hold their memory at once), and runs for a time estimated
from its work (:func:`memfit.estimate.kernels.cost`). When it starts, its outputs are
allocated (or, for element-wise ops, take over an input buffer that nobody else needs:
TensorFlow forwards such buffers in place) with the working buffer its CPU kernel
allocates; views share their input's buffer. When it ends, its working buffers are freed,
and so is every tensor it read for the last time. Ops whose results nobody reads are
pruned first, as Grappler prunes them.

:class:`Executor` plays the ops and returns the events in time order; :func:`peak` reads
the live bytes at their worst moment at one batch size, and how glibc serves them.

Example:
    >>> ops = [Op(0, "x", "Mul", [], [], [("x:0", 0, 4)]),
    ...        Op(1, "y", "Mul", ["x:0"], [], [("y:0", 0, 8)])]
    >>> events = Executor(ops, {"y:0"}, threads=1, batch_size=1).play()
    >>> [(e.op.name, len(e.allocated), e.freed) for e in events]
    [('x', 1, []), ('x', 0, []), ('y', 1, []), ('y', 0, [0])]
    >>> peak(events, 100, None, is_backward=lambda name: False).bytes   # x and y
    1200
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import os
from collections.abc import Callable, Hashable, Iterable
from typing import NamedTuple

from memfit.estimate.kernels import FORWARDING, PURE, VIEWS, tensor_bytes
from memfit.estimate.pool import POOL_THRESHOLD, PoolPeak, play_pool

__all__ = ["Op", "Buffer", "StepEvent", "Executor", "Peak", "PeakCurve", "peak", "prune",
           "executor_threads", "MMAP_THRESHOLD_MAX"]

# glibc raises its mmap threshold to the size of each mapped block freed, up to 32 MiB on
# 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): after the first step, smaller buffers come from
# the heap arenas (and stay there when freed), larger ones are mapped and unmapped.
MMAP_THRESHOLD_MAX = 32 * 2**20


def executor_threads() -> int:
    """The threads of TensorFlow's inter-op pool in this process: one per CPU it may run
    on (the default ``threads`` of the play)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


@dataclasses.dataclass
class Op:
    """One op of the step, as the play sees it (sizes as ``(fixed, per-sample)`` bytes)."""

    index: int
    name: str
    type: str
    inputs: list[str]            # tensor names
    controls: list[str]          # op names
    outputs: list[tuple[str, int, int]]   # (tensor name, fixed bytes, per-sample bytes)
    inner: tuple[int, int] = (0, 0)       # transient peak inside called functions
    extra: tuple[int, int] = (0, 0)       # accumulators a While keeps for the backward pass
    extra_items: int = 1                  # how many tensors make up ``extra``
    cost: tuple[int, int] = (0, 0)        # how long it runs, in multiply-adds (kernels.cost)
    workspace: tuple[int, int, int] = (0, 0, 0)   # kernel buffer: fixed, per sample, cap
    carried: tuple[int, ...] = ()         # a loop's TensorList inputs, carried to its outputs
    referenced: tuple[int, ...] = ()      # of those, lists its accumulators read from


class Buffer(NamedTuple):
    """One allocation of the play."""

    id: int
    fixed: int
    per: int
    owner: str           # the op that allocated it
    items: int = 0       # an accumulator: how many tensors it holds (0: one buffer)
    cap: int = 0         # a kernel workspace: the most bytes it touches (0: no cap)


class StepEvent(NamedTuple):
    """An op starts (``allocated``: its outputs and kernel scratch) or ends (``freed``:
    the ids of its scratch, and of buffers nobody will read any more)."""

    op: Op
    allocated: list[Buffer]
    freed: list[int]


def prune(ops: list[Op], fetches: set[str]) -> list[Op]:
    """The ops that run: Grappler removes pure ops whose results nobody reads (e.g. the
    gradient with respect to the model's input), and then their producers, in turn."""
    reads = collections.Counter(t for op in ops for t in set(op.inputs))
    controlling = {c for op in ops for c in op.controls}
    producer = {t: op for op in ops for t, _, _ in op.outputs}
    dead: set[str] = set()

    def unused(op: Op) -> bool:
        return (op.name not in dead and op.type in PURE and bool(op.outputs)
                and op.name not in controlling
                and all(reads[t] == 0 and t not in fetches for t, _, _ in op.outputs))

    todo = [op for op in ops if unused(op)]
    while todo:
        op = todo.pop()
        if not unused(op):
            continue
        dead.add(op.name)
        for t in set(op.inputs):
            reads[t] -= 1
            src = producer.get(t)
            if src is not None and unused(src):
                todo.append(src)
    return [op for op in ops if op.name not in dead]


class Executor:
    """TensorFlow's executor playing the step's ops on ``threads`` threads.

    With one thread the order does not depend on the batch size; with several it does
    (an op's duration is its :attr:`Op.cost` at that batch size).

    Args:
        ops: the step's ops (pruned here, see :func:`prune`).
        fetches: the tensors the step returns (never freed).
        threads: executor threads (see :func:`executor_threads`).
        batch_size: samples per step (it sets the ops' durations).
    """

    def __init__(self, ops: list[Op], fetches: set[str], *, threads: int, batch_size: int):
        self.ops = prune(ops, fetches)
        self.fetches = fetches
        self.threads = threads
        self.batch_size = batch_size
        self.consumers: dict[str, list[Op]] = collections.defaultdict(list)
        self.waiting: dict[str, int] = {}      # op -> producers not yet ended
        self._wire()
        self.reads: collections.Counter = collections.Counter()   # readers not yet ended
        for op in self.ops:
            for t in set(op.inputs):
                self.reads[t] += 1
        self.readers = collections.Counter(self.reads)             # readers in all
        self.holds: dict[str, list[int]] = {}   # live tensor -> the buffers it keeps alive
        self.users: collections.Counter = collections.Counter()   # live tensors per buffer
        self.buffers: list[Buffer] = []
        self.ready = collections.deque(op for op in self.ops if self.waiting[op.name] == 0)
        self.running: list = []                 # heap of (end time, order, op, scratch)
        self.started: set[str] = set()
        self.events: list[StepEvent] = []
        self.now = 0

    def _wire(self) -> None:
        """Who waits for whom: an op waits for the producers of its inputs and for its
        control inputs."""
        by_name = {op.name: op for op in self.ops}
        producer = {t: op for op in self.ops for t, _, _ in op.outputs}
        for op in self.ops:
            deps = {producer[t].name for t in op.inputs if t in producer}
            deps |= {c for c in op.controls if c in by_name}
            self.waiting[op.name] = len(deps)
            for d in deps:
                self.consumers[d].append(op)

    def play(self) -> list[StepEvent]:
        """Runs every op; returns the events in time order."""
        while self.ready or self.running:
            self.start_ready_ops()
            if self.running:
                self.finish_next()
        return self.events

    # -- an op starts ----------------------------------------------------------------------

    def start_ready_ops(self) -> None:
        """Free threads take the ready ops, in the order they became ready."""
        while self.ready and len(self.running) < self.threads:
            op = self.ready.popleft()
            if op.name not in self.started:
                self.started.add(op.name)
                self.start(op)

    def start(self, op: Op) -> None:
        """``op`` starts: its outputs, its accumulators and its kernel scratch are
        allocated; it runs until ``now`` + its duration."""
        allocated: list[Buffer] = []
        for i, (t, fixed, per) in enumerate(op.outputs):
            if op.type in VIEWS:
                self.share_input(op, i, t)
            elif fixed or per:
                taken = self.forwarded_input(op, fixed, per) if op.type in FORWARDING else None
                self.hold(t, taken or [self.allocate(fixed, per, op.name, allocated)])
        if op.extra != (0, 0):
            self.keep_accumulators(op, allocated)
        if op.carried:
            self.keep_lists(op)
        scratch = ([self.allocate(*op.inner, op.name, allocated)] if op.inner != (0, 0)
                   else [])
        if op.workspace != (0, 0, 0):
            fixed, per, cap = op.workspace
            scratch.append(self.allocate(fixed, per, op.name, allocated, cap=cap))
        self.events.append(StepEvent(op, allocated, []))
        end = (self.now + op.cost[0] + op.cost[1] * self.batch_size if self.threads > 1
               else self.now)
        heapq.heappush(self.running, (end, len(self.events), op, scratch))

    def share_input(self, op: Op, i: int, tensor: str) -> None:
        """A view: output ``i`` keeps its input's buffers (nothing for a variable or a
        tensor from outside the step)."""
        source = op.inputs[i] if op.type == "IdentityN" else (
            op.inputs[0] if op.inputs else None)
        if source in self.holds:
            self.hold(tensor, list(self.holds[source]))

    def forwarded_input(self, op: Op, fixed: int, per: int) -> list[int] | None:
        """The buffer of an input that ``op`` may write over in place: of its size, read
        by ``op`` alone (with several readers, which one runs last depends on the
        threads: TensorFlow forwards only when nobody else holds a reference), and not
        returned by the step. Taken from that input; ``None`` when there is none."""
        for t_in in op.inputs:
            buffers = self.holds.get(t_in)
            if (buffers and len(buffers) == 1 and self.readers[t_in] == 1
                    and self.users[buffers[0]] == 1 and t_in not in self.fetches
                    and self.buffers[buffers[0]].fixed == fixed
                    and self.buffers[buffers[0]].per == per):
                taken = self.holds.pop(t_in)      # written over in place
                self.users[taken[0]] -= 1
                return taken
        return None

    def keep_accumulators(self, op: Op, allocated: list[Buffer]) -> None:
        """A While's accumulators (many tensors, one per time step): kept while its
        outputs, the lists the backward pass reads, are."""
        b = self.allocate(*op.extra, op.name, allocated, items=max(1, op.extra_items))
        for t, _, _ in op.outputs:
            self.holds.setdefault(t, []).append(b)
            self.users[b] += 1

    def keep_lists(self, op: Op) -> None:
        """A loop's TensorList inputs (a recurrent layer's unstacked input sequence, the
        list its gradient loop fills): the loop carries each to the output of the same
        index, which keeps it. A list whose elements the loop's accumulators keep (the
        input of each time step, for the weights' gradient) is kept by every output,
        as the accumulators are (:meth:`keep_accumulators`)."""
        names = [t for t, _, _ in op.outputs]
        for i in op.carried:
            keepers = names if i in op.referenced else names[i:i + 1]
            for b in self.holds.get(op.inputs[i], []) if i < len(op.inputs) else []:
                for t in keepers:
                    self.holds.setdefault(t, []).append(b)
                    self.users[b] += 1

    # -- an op ends ------------------------------------------------------------------------

    def finish_next(self) -> None:
        """The running op that ends first frees its thread."""
        self.now, _, op, scratch = heapq.heappop(self.running)
        self.finish(op, scratch)

    def finish(self, op: Op, scratch: list[int]) -> None:
        """``op`` ends: its scratch is freed, and its outputs nobody reads and its inputs
        nobody will read any more are released; the ops waiting only for it are ready."""
        freed: list[int] = list(scratch)
        inputs = set(op.inputs)
        for t in inputs:
            self.reads[t] -= 1
        for t in [t for t, _, _ in op.outputs] + list(inputs):
            if self.reads[t] == 0 and t not in self.fetches:
                self.release(t, freed)
        self.events.append(StepEvent(op, [], freed))
        for c in self.consumers[op.name]:
            self.waiting[c.name] -= 1
            if self.waiting[c.name] == 0:
                self.ready.append(c)

    # -- buffers ---------------------------------------------------------------------------

    def allocate(self, fixed: int, per: int, owner: str, allocated: list[Buffer], *,
                 items: int = 0, cap: int = 0) -> int:
        """A new buffer, recorded in ``allocated``; returns its id."""
        b = Buffer(len(self.buffers), fixed, per, owner, items, cap)
        self.buffers.append(b)
        allocated.append(b)
        return b.id

    def hold(self, tensor: str, buffers: list[int]) -> None:
        """``tensor`` is live and keeps ``buffers`` alive."""
        self.holds[tensor] = buffers
        for b in buffers:
            self.users[b] += 1

    def release(self, tensor: str, freed: list[int]) -> None:
        """``tensor`` is dead: its buffers that no other live tensor keeps go to
        ``freed``."""
        for b in self.holds.pop(tensor, []):
            self.users[b] -= 1
            if self.users[b] == 0:
                freed.append(b)


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
