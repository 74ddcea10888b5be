"""The play: the training step's ops run the way TensorFlow's executor runs them, and the
buffers they hold over time.

An op starts when its inputs (and control inputs) are ready, on one of ``threads``
executor threads (TensorFlow's inter-op pool has a thread per CPU: while one thread is in
a long convolution, another runs what else is ready, an optimizer update say, and both
hold their memory at once), chosen as TensorFlow's executor and Eigen's pool choose
(:meth:`Executor.schedule_ready`, :meth:`Executor.next_op`: the thread whose op ended goes
on with one op it made ready, depth first), and runs for a time estimated from its work
(:func:`memfit.estimate.kernels.cost`). When it starts, its outputs are allocated (or,
for element-wise ops, take over an input buffer that no other reader still needs:
TensorFlow forwards such buffers in place) with the working buffer its CPU kernel
allocates; views share their input's buffer. When it ends, its working buffers are freed,
and so is every tensor it read for the last time. Ops whose results nobody reads are
pruned first, as Grappler prunes them.

:class:`Executor` plays the ops and returns the events in time order;
:func:`memfit.estimate.step_peak.peak` reads the live bytes at their worst moment.

Example:
    >>> ops = [Op(0, "x", "Mul", [], [], [("x:0", 0, 4)]),
    ...        Op(1, "y", "Mul", ["x:0"], [], [("y:0", 0, 8)])]
    >>> events = Executor(ops, {"y:0"}, threads=1, batch_size=1).play()
    >>> [(e.op.name, len(e.allocated), e.freed) for e in events]
    [('x', 1, []), ('x', 0, []), ('y', 1, []), ('y', 0, [0])]
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import os
from typing import NamedTuple

from memfit.estimate.kernels import FORWARDING, PURE, VIEWS

__all__ = ["Op", "Buffer", "StepEvent", "Executor", "INEXPENSIVE", "DEPTH_FIRST",
           "BREADTH_FIRST", "ORDERS", "prune", "executor_threads"]

#: The play's orders (:class:`Executor`): TensorFlow's own (``"depth"``: a thread goes on
#: with an op its last op made ready), and every ready op in the order it became ready,
#: any thread taking the oldest (``"breadth"``: chains side by side, and an input buffer
#: forwarded only to a tensor's single reader). The estimate's point plays the first;
#: its high end the second (TensorFlow's threads do not always keep to its own order:
#: docs/estimate.md, "The play").
DEPTH_FIRST, BREADTH_FIRST = "depth", "breadth"
ORDERS = (DEPTH_FIRST, BREADTH_FIRST)

#: Kernels whose ``IsExpensive()`` is false: TensorFlow's executor runs them inline on the
#: thread that made them ready (constants, views and shape queries).
INEXPENSIVE = VIEWS | {"Const", "Shape", "ShapeN", "Rank", "Size", "BroadcastGradientArgs",
                       "NoOp", "VarHandleOp"}


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
        order: :data:`DEPTH_FIRST` (TensorFlow's executor) or :data:`BREADTH_FIRST`.
    """

    def __init__(self, ops: list[Op], fetches: set[str], *, threads: int, batch_size: int,
                 order: str = DEPTH_FIRST):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
        self.order = order
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
        # The step's first ops go to the pool from outside it; an op that ends hands the
        # ops it made ready to its own thread (see schedule_ready).
        self.outside = collections.deque(op for op in self.ops if self.waiting[op.name] == 0)
        self.inline: list[collections.deque] = [collections.deque() for _ in range(threads)]
        self.queue: list[collections.deque] = [collections.deque() for _ in range(threads)]
        self.idle: list[int] = list(range(threads))
        self.thread_of: dict[str, int] = {}     # op -> the thread that ran it
        self.running: list = []       # heap of (end time, order, op, scratch, thread)
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
        while True:
            self.start_ready_ops()
            if not self.running:
                return self.events
            self.finish_next()

    # -- an op starts ----------------------------------------------------------------------

    def start_ready_ops(self) -> None:
        """Each idle thread takes its next op (:meth:`next_op`) until none is left."""
        for thread in sorted(self.idle):
            op = self.next_op(thread)
            if op is not None:
                self.idle.remove(thread)
                self.started.add(op.name)
                self.start(op, thread)

    def next_op(self, thread: int) -> Op | None:
        """What ``thread`` runs next, as Eigen's pool and TensorFlow's executor choose
        it: the ops its last op made ready to run inline, in order; else the newest op
        in its own queue (Eigen pushes and pops a worker's own tasks at the front); else
        the oldest op in another thread's queue (stolen from the back); else one of the
        step's first ops."""
        others = [self.queue[(thread + i) % self.threads] for i in range(1, self.threads)]
        for source, take in ((self.inline[thread], "popleft"), (self.queue[thread], "popleft"),
                             *((q, "pop") for q in others), (self.outside, "popleft")):
            while source:
                op = getattr(source, take)()
                if op.name not in self.started:
                    return op
        return None

    def start(self, op: Op, thread: int = 0) -> None:
        """``op`` starts on ``thread``: its outputs, its accumulators and its kernel
        scratch are allocated; it runs until ``now`` + its duration."""
        self.thread_of[op.name] = thread
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
        heapq.heappush(self.running, (end, len(self.events), op, scratch, thread))

    def share_input(self, op: Op, i: int, tensor: str) -> None:
        """A view: output ``i`` keeps its input's buffers (nothing for a variable or a
        tensor from outside the step)."""
        source = op.inputs[i] if op.type == "IdentityN" else (
            op.inputs[0] if op.inputs else None)
        if source in self.holds:
            self.hold(tensor, list(self.holds[source]))

    def forwarded_input(self, op: Op, fixed: int, per: int) -> list[int] | None:
        """The buffer of an input that ``op`` may write over in place: of its size, with
        no reader left but ``op`` (TensorFlow forwards when nobody else holds a
        reference: a reader that has ended dropped its own, one still running has not;
        breadth first, only to a tensor's single reader), and not returned by the step.
        Taken from that input; ``None`` when there is none."""
        for t_in in op.inputs:
            buffers = self.holds.get(t_in)
            readers = self.reads if self.order == DEPTH_FIRST else self.readers
            if (buffers and len(buffers) == 1 and readers[t_in] == 1
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
        self.now, _, op, scratch, thread = heapq.heappop(self.running)
        self.finish(op, scratch, thread)
        self.idle.append(thread)

    def finish(self, op: Op, scratch: list[int], thread: int = 0) -> None:
        """``op`` ends: its scratch is freed, and its outputs nobody reads and its inputs
        nobody will read any more are released; the ops waiting only for it are ready
        (:meth:`schedule_ready`)."""
        freed: list[int] = list(scratch)
        inputs = set(op.inputs)
        for t in inputs:
            self.reads[t] -= 1
        for t in [t for t, _, _ in op.outputs] + list(inputs):
            if self.reads[t] == 0 and t not in self.fetches:
                self.release(t, freed)
        self.events.append(StepEvent(op, [], freed))
        ready = []
        for c in self.consumers[op.name]:
            self.waiting[c.name] -= 1
            if self.waiting[c.name] == 0:
                ready.append(c)
        self.schedule_ready(ready, thread)

    def schedule_ready(self, ready: list[Op], thread: int) -> None:
        """TensorFlow's ``ExecutorState::ScheduleReady`` on the thread whose op made
        ``ready`` ready: inexpensive ops (:data:`INEXPENSIVE`) run inline on that thread;
        of the others, the last one too when nothing is inline, and the rest go to the
        front of the thread's queue, where an idle thread steals them from the back. (On
        CPU every kernel counts as expensive until it has run some 90 times, its cost
        estimate decaying from 10^8 cycles: always, in the steps measured here.) So a
        thread follows a chain of element-wise ops depth first, Adam's update of one
        variable at a time, rather than starting every ready op side by side. Breadth
        first: ``ready`` joins the one queue every thread takes the oldest op from."""
        if self.order == BREADTH_FIRST:
            self.outside.extend(ready)
            return
        last: Op | None = None
        expensive: list[Op] = []
        # In the reverse of the order the traced graph lists the readers: it matched the
        # profiler's trace of TensorFlow's runs (docs/estimate.md, "The play").
        for op in reversed(ready):
            if op.type in INEXPENSIVE:
                self.inline[thread].append(op)
            else:
                if last is not None:
                    expensive.append(last)
                last = op
        if last is not None:
            if self.inline[thread]:
                expensive.append(last)
            else:
                self.inline[thread].append(last)
        for op in expensive:
            self.queue[thread].appendleft(op)

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
