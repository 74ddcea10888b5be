"""The training step as a graph: trace it once, then play its tensors' lifetimes.

The step (forward, loss, gradients, optimizer update) is traced with ``tf.function`` on
a batch of :data:`~memfit.estimate.kernels.PROBE_BATCH` samples: tracing is symbolic,
nothing of that size is allocated. Every tensor in the graph has a static shape; a
dimension that is a multiple of the probe batch is the batch dimension, so each tensor's
size is known as ``fixed + per_sample × batch`` for *any* batch size
(:func:`memfit.estimate.kernels.tensor_sizes`).

Each traced op becomes an :class:`~memfit.estimate.schedule.Op` with its outputs' sizes,
its kernel's buffers and its duration (:mod:`memfit.estimate.kernels`). Control flow is
followed: the branches of ``If``, the body of ``While`` (whose accumulators — the
per-time-step tensors kept for the backward pass, e.g. in an LSTM — are sized from the
pushes in the body × the trip count; the TensorLists it is given — a recurrent layer's
input, unstacked — are kept by its outputs, see
:meth:`~memfit.estimate.schedule.Executor.keep_lists`), and called functions, each
function's transient peak counted on the op that calls it. Variables and the input
batch are not counted here (they are separate components).

On the CPU the graph played is the one TensorFlow's executor gets: the traced graph
rewritten by Grappler (:mod:`memfit.estimate.grappler`). :meth:`StepGraph.peak` plays it
the way the executor runs it (:mod:`memfit.estimate.schedule`).

Example:
    >>> import keras
    >>> from memfit.estimate.training import prepare
    >>> model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    >>> step = trace(prepare(model, optimizer="sgd"))
    >>> step.peak(64).bytes > step.peak(8).bytes > 0
    True
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Iterable, Iterator
from typing import Any

from memfit import checks
from memfit.estimate.grappler import optimized
from memfit.estimate.kernels import (
    LOOPS,
    PROBE_BATCH,
    cost,
    list_buffer,
    list_items,
    tensor_sizes,
    widening,
    workspace,
)
from memfit.estimate.schedule import DEPTH_FIRST, Executor, Op, StepEvent, executor_threads
from memfit.estimate.step_peak import Peak, PeakCurve, peak
from memfit.quiet import filtered_stderr

__all__ = ["StepGraph", "trace"]

_FUNCTION_ATTRS = ("f", "then_branch", "else_branch", "body", "cond", "branches")
_LIST_WRITES = {"TensorListPushBack", "TensorListSetItem"}
_MAX_DEPTH = 8                 # functions called by functions... followed this deep


class StepGraph:
    """The traced training step: its ops, their sizes, and the play of their lifetimes.

    Example:
        >>> from memfit.estimate.schedule import Op
        >>> ops = [Op(0, "x", "Mul", [], [], [("x:0", 0, 4)]),
        ...        Op(1, "y", "Mul", ["x:0"], [], [("y:0", 0, 8)])]
        >>> StepGraph(ops, {"y:0"}, graph_ops=2, threads=1).peak(100).bytes
        1200

    Args:
        ops: the ops as traced (layers and the forward/backward split come from these).
        fetches: the tensors the step returns.
        graph_ops: ops in the step's graphs, called functions included.
        scopes: name scope -> the layer that was called in it.
        run_ops: the ops as run (after Grappler's rewrites), when known; else ``ops``.
        threads: TensorFlow's executor threads to play on (its inter-op pool: one per
            CPU of the training process); ``None``: this process's CPUs
            (:func:`~memfit.estimate.schedule.executor_threads`).
    """

    def __init__(self, ops: list[Op], fetches: set[str], graph_ops: int,
                 scopes: dict[str, str] | None = None, run_ops: list[Op] | None = None,
                 *, threads: int | None = None):
        self.ops = ops
        self.run_ops = run_ops or ops
        self.fetches = fetches
        self.graph_ops = graph_ops
        self.scopes = scopes or {}
        self.threads = executor_threads() if threads is None else checks.count(
            "threads", threads, example=2)
        # (batch size (0: any), order) -> the play, and the pools played from it
        self._events: dict[tuple[int, str], list[StepEvent]] = {}
        self._pools: dict[tuple[int, str], dict] = {}
        self._curves: dict[tuple, PeakCurve] = {}     # a play with its split held
        self._index = {op.name: op.index for op in ops}

    def layer_of(self, op_name: str, layer_names: set[str]) -> str | None:
        """The innermost layer among ``layer_names`` whose call made ``op_name`` (forward
        ops, and their gradients under ``gradient_tape/``), or ``None``."""
        name = op_name.removeprefix("gradient_tape/")
        best, depth = None, -1
        parts = name.split("/")
        for i in range(len(parts) - 1, 0, -1):
            layer = self.scopes.get("/".join(parts[:i]))
            if layer is not None and layer in layer_names and i > depth:
                best, depth = layer, i
                break
        return best

    # -- the schedule -------------------------------------------------------------------

    def schedule(self, batch_size: int, order: str = DEPTH_FIRST) -> list[StepEvent]:
        """The play of the step's ops at ``batch_size``: an event when each op starts and
        one when it ends, in time order (:class:`~memfit.estimate.schedule.Executor`, in
        ``order``). With one thread the order does not depend on the batch size (played
        once)."""
        key = (self._play_key(batch_size), order)
        if key not in self._events:
            self._events[key] = Executor(self.run_ops, self.fetches, threads=self.threads,
                                         batch_size=batch_size, order=order).play()
        return self._events[key]

    def peak(self, batch_size: int, mmap_threshold: int | None = None, *,
             played_at: int | None = None, pool: bool = False, kept: Iterable[int] = (),
             step_inputs: Iterable[int] = (), order: str = DEPTH_FIRST) -> Peak:
        """The simulated peak of live tensor bytes at ``batch_size``, and the peaks of
        the buffers glibc serves from its heap and from ``mmap`` (see
        :class:`~memfit.estimate.step_peak.Peak`).

        Args:
            batch_size: samples per step.
            mmap_threshold: glibc's mmap threshold in bytes when it is fixed (buffers of
                at least this size are mapped); ``None``: glibc's dynamic threshold,
                which ends at the largest buffer of the step (at most 32 MiB).
            played_at: take the order of the ops, and which buffers glibc maps, from
                the play at this batch size, with every buffer sized at
                ``batch_size`` (``None``: played at ``batch_size``). The peak is then
                non-decreasing in ``batch_size``.
            pool, kept, step_inputs: the process allocates through oneDNN's pool; the
                buffers it keeps, and the bytes per sample of those each step takes
                first (see :func:`~memfit.estimate.step_peak.peak`).
            order: the play's order (:data:`~memfit.estimate.schedule.ORDERS`).
        """
        first = self._first_backward()
        at = batch_size if played_at is None else played_at
        return peak(self.schedule(at, order), batch_size, mmap_threshold,
                    is_backward=lambda name: self._index.get(name, first) >= first,
                    split_batch=played_at, pool=pool, kept=kept, step_inputs=step_inputs,
                    memo=self._pools.setdefault((self._play_key(at), order), {}))

    def held_peak(self, batch_size: int, played_at: int, mmap_threshold: int | None = None, *,
                  pool: bool = False, kept: Iterable[int] = (),
                  step_inputs: Iterable[int] = (),
                  order: str = DEPTH_FIRST) -> tuple[int, int, int, int]:
        """``(bytes, heap_bytes, mmap_bytes, pool_bytes)`` of :meth:`peak` with
        ``played_at``, from the play's :class:`~memfit.estimate.step_peak.PeakCurve` (made
        once per play and split): the same integers, without playing the events again
        for each batch size (the estimate's high end asks for many)."""
        kept, step_inputs = tuple(kept), tuple(step_inputs)
        play = (self._play_key(played_at), order)
        key = (play, played_at, mmap_threshold, pool, kept, step_inputs)
        if key not in self._curves:
            self._curves[key] = PeakCurve(
                self.schedule(played_at, order), played_at, mmap_threshold, pool=pool,
                kept=kept, step_inputs=step_inputs, memo=self._pools.setdefault(play, {}))
        return self._curves[key].at(batch_size)

    def _play_key(self, batch_size: int) -> int:
        """Which play a batch size gets: its own, or with one thread the one play (the
        order does not depend on the batch size)."""
        return batch_size if self.threads > 1 else 0

    def _first_backward(self) -> int:
        """Creation index of the first backward op: ops made before it are the forward
        pass and the loss; from it on, gradients and the optimizer update."""
        return min((op.index for op in self.ops if op.name.startswith("gradient_tape/")),
                   default=len(self.ops))

    def kept_for_backward(self) -> dict[str, int]:
        """Per-sample bytes of forward tensors that backward ops read, by producing op."""
        producer = {t: (op, per) for op in self.ops for t, _, per in op.outputs}
        kept: dict[str, int] = {}
        for op in self.ops:
            if not op.name.startswith("gradient_tape/"):
                continue
            for t in op.inputs:
                src = producer.get(t)
                if src is None or src[0].name.startswith("gradient_tape/"):
                    continue
                kept[t] = src[1]
        out: dict[str, int] = collections.defaultdict(int)
        for t, per in kept.items():
            out[t.rsplit(":", 1)[0]] += per
        return dict(out)


def trace(setup: Any, cpu: bool = True, threads: int | None = None,
          onednn: bool = False) -> StepGraph:
    """Traces one training step of a compiled model (see the module docstring).

    Args:
        setup: a :class:`memfit.estimate.training.Setup`.
        cpu: the step runs on a CPU: its kernels' buffers are counted (float16 MatMuls
            widen their operands to float32) and Grappler's graph is played. Otherwise
            the traced graph is played, without kernel buffers.
        threads: the executor threads of the training process (see :class:`StepGraph`);
            ``None``: this process's CPUs.
        onednn: the training process runs oneDNN's kernels (their buffers, not
            TensorFlow's: :func:`~memfit.estimate.kernels.workspace`).

    Returns:
        The :class:`StepGraph`; call ``.peak(batch_size)`` on it.
    """
    import tensorflow as tf

    model = setup.model
    x, y = _probe_batch(setup)
    if hasattr(model, "_symbolic_build"):
        model._symbolic_build(data_batch=(x, y, None))
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)

    def step(x: Any, y: Any) -> Any:
        return model.train_step((x, y))

    scopes: dict[str, str] = {}
    with _recording_scopes(model, scopes):
        concrete = tf.function(step, autograph=False).get_concrete_function(x, y)
    graph = concrete.graph
    collector = _Collector(cpu, executor_threads() if threads is None else
                           checks.count("threads", threads, example=2), onednn=onednn)
    ops, count = collector.collect(graph)
    fetches = {t.name for t in graph.outputs}
    with filtered_stderr():     # the optimizer's device query and session log lines
        run_ops = optimized(graph, ops, collector.functions) if cpu else None
    return StepGraph(ops, fetches, count, scopes, run_ops, threads=collector.threads)


def _probe_batch(setup: Any) -> tuple[Any, Any]:
    """Symbolic inputs and targets of :data:`~memfit.estimate.kernels.PROBE_BATCH`
    samples, structured as the model takes them (:meth:`~memfit.estimate.training.Setup.batch`)."""
    import tensorflow as tf

    def spec(shape: tuple[int, ...], dtype: str) -> Any:
        return tf.TensorSpec((PROBE_BATCH, *shape), dtype)

    return setup.batch([spec(s, d) for s, d in setup.inputs],
                       [spec(s, d) for s, d in setup.targets])


@dataclasses.dataclass
class _Calls:
    """What the functions an op calls add to it."""

    inner: tuple[int, int] = (0, 0)     # the largest transient peak among them
    extra: tuple[int, int] = (0, 0)     # a While's accumulators
    items: int = 1                      # how many tensors make up ``extra``
    work: tuple[int, int] = (0, 0)      # their cost (a loop's: × its trip count)
    ops: int = 0                        # their ops


class _Collector:
    """Makes the :class:`~memfit.estimate.schedule.Op` of every traced op, following the
    functions each calls; the ops of each function go to :attr:`functions` (by name)."""

    def __init__(self, cpu: bool, threads: int, onednn: bool = False):
        self.cpu = cpu
        self.threads = threads
        self.onednn = onednn
        self.functions: dict[str, list[Op]] = {}

    def collect(self, graph: Any, depth: int = 0) -> tuple[list[Op], int]:
        """The ops of ``graph`` with their sizes and kernel scratch, and how many ops it
        and the functions it calls hold."""
        ops = []
        count = 0
        for index, op in enumerate(graph.get_operations()):
            calls = self.calls(op, graph, depth) if depth < _MAX_DEPTH else _Calls()
            count += 1 + calls.ops
            inner = calls.inner
            if self.cpu:
                wf, wp = widening(op)
                inner = (inner[0] + wf, inner[1] + wp)
            extra, items = calls.extra, calls.items
            lf, lp, n = list_buffer(op)
            if n:
                extra, items = (lf, lp), n
            ops.append(Op(index=index, name=op.name, type=op.type,
                          inputs=[t.name for t in op.inputs],
                          controls=[c.name for c in op.control_inputs],
                          outputs=[(t.name, *tensor_sizes(t)) for t in op.outputs],
                          inner=inner, extra=extra, extra_items=items,
                          cost=tuple(a + b for a, b in zip(cost(op), calls.work, strict=True)),
                          workspace=(workspace(op, self.threads, self.onednn) if self.cpu
                                     else (0, 0, 0)),
                          **self.lists(op, graph, depth)))
        return ops, count

    def lists(self, op: Any, graph: Any, depth: int) -> dict[str, tuple[int, ...]]:
        """A loop's inputs that are TensorLists of known tensors (``carried`` to its
        outputs), and those whose elements its body pushes to an accumulator
        (``referenced``; see :meth:`~memfit.estimate.schedule.Executor.keep_lists`)."""
        if op.type not in LOOPS or depth >= _MAX_DEPTH:
            return {}
        carried = tuple(i for i, t in enumerate(op.inputs)
                        if t.dtype.name == "variant" and list_items(t)[2])
        body = _function_graph(graph, op.get_attr("body").name)
        if not carried or body is None:
            return {"carried": carried}
        placeholders = {t.name: i for i, t in enumerate(body.inputs)}
        referenced = set()
        for push in body.get_operations():
            item = push.inputs[-1] if push.type in _LIST_WRITES else None
            if item is not None and item.op.type == "TensorListGetItem":
                source = item.op.inputs[0]
                while source.op.type == "Identity":
                    source = source.op.inputs[0]
                referenced.add(placeholders.get(source.name, -1))
        return {"carried": carried, "referenced": tuple(i for i in carried if i in referenced)}

    def calls(self, op: Any, graph: Any, depth: int) -> _Calls:
        """The functions ``op`` calls (branches, loop bodies, called functions), collected
        and played on their own."""
        c = _Calls()
        for fname in _function_names(op):
            fg = _function_graph(graph, fname)
            if fg is None:
                continue
            sub_ops, sub_count = self.collect(fg, depth + 1)
            self.functions[fname] = sub_ops
            c.ops += sub_count
            sub = StepGraph(sub_ops, {t.name for t in fg.outputs}, sub_count,
                            threads=self.threads)
            p = _linear_peak(sub)
            c.inner = (max(c.inner[0], p[0]), max(c.inner[1], p[1]))
            trips = _trip_count(op) if op.type in LOOPS else 1
            c.work = (c.work[0] + trips * sum(o.cost[0] for o in sub_ops),
                      c.work[1] + trips * sum(o.cost[1] for o in sub_ops))
            if op.type in LOOPS and fname == op.get_attr("body").name:
                c.extra = _accumulated(fg, trips)
                c.items = trips * max(1, sum(o.type in _LIST_WRITES
                                             for o in fg.get_operations()))
        return c


def _linear_peak(step: StepGraph) -> tuple[int, int]:
    """A function's transient peak as (fixed, per-sample), from two batch sizes."""
    a, b = step.peak(1).bytes, step.peak(1001).bytes
    per = max(0, (b - a) // 1000)
    return max(0, a - per), per


def _function_graph(graph: Any, name: str) -> Any:
    g = graph
    while g is not None:
        f = g._get_function(name) if hasattr(g, "_get_function") else None
        if f is not None:
            return getattr(f, "graph", None)
        g = getattr(g, "outer_graph", None)
    return None


def _function_names(op: Any) -> list[str]:
    names = []
    for attr in _FUNCTION_ATTRS:
        try:
            value = op.get_attr(attr)
        except (ValueError, TypeError):
            continue
        values = value if isinstance(value, list) else [value]
        names += [v.name for v in values if hasattr(v, "name")]
    return names


def _constant(tensor: Any) -> int | None:
    from tensorflow.python.framework import tensor_util

    try:
        value = tensor_util.constant_value(tensor)
    except Exception:                   # noqa: BLE001
        return None
    if value is None or getattr(value, "size", 0) != 1:
        return None
    return int(value.reshape(-1)[0])


def _trip_count(op: Any) -> int:
    """How many iterations a While runs: from the TensorLists it is given, else 1."""
    trips = []
    for t in op.inputs:
        src = t.op
        if src.type == "TensorListReserve":
            n = _constant(src.inputs[1])
            if n and n > 0:
                trips.append(n)
        elif src.type == "TensorListFromTensor":
            dims = src.inputs[0].shape.as_list()
            if dims and dims[0]:
                trips.append(dims[0])
    if len(op.inputs) > 1:
        n = _constant(op.inputs[1])
        if n and n > 0:
            trips.append(n)
    return max(trips) if trips else 1


def _accumulated(body: Any, trips: int) -> tuple[int, int]:
    """Bytes a While body writes into TensorLists over ``trips`` iterations: a new buffer
    per iteration for each tensor pushed, except those that share one already held (a
    variable read, an element of another list, a constant). A tensor pushed to two
    lists is one buffer: a list holds a reference, not a copy (a SimpleRNN writes its
    state to the output list and pushes it to the gradient's accumulator: 25 MiB once,
    not twice, in TensorFlow's BFC allocator at batch 512 over 100 steps of 128 units).
    A loop variable pushed at the top of the body (an LSTM's cell state, whose gradient
    needs the previous step's) is a new buffer when the value carried to the next
    iteration is not itself pushed; when it is (the hidden state, pushed as the cell's
    output), it is counted there."""
    pushes = list({op.inputs[-1].name: op.inputs[-1] for op in body.get_operations()
                   if op.type in _LIST_WRITES}.values())
    pushed = {t.name for t in pushes}
    carried = dict(zip((t.name for t in body.inputs), body.outputs, strict=False))
    fixed = per = 0
    for item in pushes:
        if item.op.type in ("ReadVariableOp", "Identity", "Const", "TensorListGetItem"):
            continue
        if item.op.type == "Placeholder":
            following = carried.get(item.name)
            while following is not None and following.op.type == "Identity":
                following = following.op.inputs[0]
            if following is None or following.name in pushed | {item.name}:
                continue                        # loop-invariant, or counted where made
        f, p = tensor_sizes(item)
        fixed += f * trips
        per += p * trips
    return fixed, per


@contextlib.contextmanager
def _recording_scopes(model: Any, scopes: dict[str, str]) -> Iterator[None]:
    """Records the graph name scope each layer's ``call`` runs in, while tracing."""
    import tensorflow as tf

    patched = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        original = layer.call

        def wrapped(*args: Any, _original: Any = original, _name: str = layer.name,
                    **kwargs: Any) -> Any:
            scope = tf.compat.v1.get_default_graph().get_name_scope()
            scopes.setdefault(scope, _name)
            return _original(*args, **kwargs)

        object.__setattr__(layer, "call", functools.wraps(original)(wrapped))
        patched.append(layer)
    try:
        yield
    finally:
        for layer in patched:
            with contextlib.suppress(AttributeError):
                object.__delattr__(layer, "call")
