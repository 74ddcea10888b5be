"""The training step as a graph: trace it once, then play its tensors' lifetimes.

The step (forward, loss, gradients, optimizer update) is traced with ``tf.function`` on
a batch of :data:`PROBE_BATCH` samples: tracing is symbolic, nothing of that size is
allocated. Every tensor in the graph has a static shape; a dimension that is a multiple
of the probe batch is the batch dimension, so each tensor's size is known as
``fixed + per_sample × batch`` for *any* batch size.

:meth:`StepGraph.peak` then plays the graph the way TensorFlow's executor runs it: an op
starts when its inputs (and control inputs) are ready, in the order they became ready, on
one of :data:`THREADS` executor threads, and runs for a time estimated from its work
(:func:`_cost`); when it starts its outputs are allocated (or, for element-wise ops, take
over an input buffer that nobody else needs: TensorFlow forwards such buffers in place)
with the working buffer its CPU kernel allocates (:func:`_workspace`); a buffer is freed
when its last consumer ends. Views (``Identity``, ``Reshape``, ``ReadVariableOp``...)
share their input's buffer. Control flow is followed: the branches of ``If``, the body of
``While`` (whose accumulators — the per-time-step tensors kept for the backward pass, e.g.
in an LSTM — are sized from the pushes in the body × the trip count), and called
functions. Variables and the input batch are not counted here (they are separate
components).

On the CPU the graph played is the one TensorFlow's executor gets: the traced graph
rewritten by Grappler (:func:`_optimized`: constant folding, arithmetic rewrites, fusions,
pruning, ``If`` branches inlined), each node carrying the sizes found on the traced one.
Playing the traced graph instead over-estimates EfficientNetB0's step peak by 27 %.

Example:
    >>> step = trace(setup)                                       # doctest: +SKIP
    >>> step.peak(64).bytes                                      # doctest: +SKIP
    211812352
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import heapq
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["PROBE_BATCH", "StepGraph", "Peak", "trace"]

PROBE_BATCH = 997          # a prime that no layer dimension is likely to be a multiple of
# glibc raises its mmap threshold to the size of each mapped block freed, up to 32 MiB on
# 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): after the first step, smaller buffers come from
# the heap arenas (and stay there when freed), larger ones are mapped and unmapped.
MMAP_THRESHOLD_MAX = 32 * 2**20
# TensorFlow lets an element-wise op write over its input only when nobody else holds a
# reference to that buffer at the moment it runs. When several ops read a tensor, which
# of them runs last depends on the executor's threads: do not count on forwarding then.
FORWARD_SHARED = False
# Play the graph Grappler makes of the step (what the executor runs), not the traced one.
GRAPPLER = True
# TensorFlow's executor runs ready ops on an inter-op pool with a thread per CPU: while
# one thread is in a long convolution, another runs what else is ready (an optimizer
# update, say), and both hold their memory at once.
THREADS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)
# An op's duration (see _cost): a byte moved costs as much as this many multiply-adds,
# and every op this many more (the executor's own work per op).
BYTE_COST = 8
OP_COST = 100_000
# A CPU without float16 arithmetic (most x86) computes float16 MatMuls on float32 copies
# of their operands: see _widening.
WIDEN_FLOAT16 = True
_MATMULS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul"}

# Ops whose output is a view of input 0: no new memory.
_VIEWS = {"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
          "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics", "Bitcast",
          "ReadVariableOp", "_Retval", "Placeholder", "OptionalFromValue",
          "OptionalGetValue", "TensorListGetItem", "TensorListPopBack", "Switch", "Merge"}
# Element-wise ops that TensorFlow lets write over an input buffer nobody else needs.
_FORWARDING = {"Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign",
               "Neg", "Square", "Sqrt", "Rsqrt", "Exp", "Log", "Abs", "Reciprocal",
               "AddV2", "Add", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum",
               "Minimum", "SquaredDifference", "BiasAdd", "ReluGrad", "Relu6Grad", "EluGrad",
               "SeluGrad", "SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad", "Pow",
               "FloorMod", "FloorDiv", "AddN", "Cast", "LeakyRelu", "LeakyReluGrad",
               "MulNoNan", "Erf", "Softmax", "ClipByValue", "SelectV2", "Select",
               "OnesLike", "ZerosLike", "Sign", "Floor", "Ceil", "Round", "Log1p", "Expm1",
               "Sin", "Cos", "Inv", "InvGrad", "SoftplusGrad", "SoftsignGrad", "GeluGrad"}
# Convolutions (their arithmetic is counted by _cost).
_CONVOLUTIONS = {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
                 "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "DepthwiseConv2dNative",
                 "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
                 "_FusedConv2D"}
# The cache sizes TensorFlow's CPU convolution gradients size their im2col buffers to.
_CONV_GRADS = {"Conv2DBackpropFilter", "Conv2DBackpropInput"}
_L3_BYTES = 30 * 2**20
_L2_BYTES = 256 * 2**10
# Ops without side effects: Grappler prunes them when nobody reads their results.
PRUNE_DEAD = True
_PURE = (_FORWARDING | _CONVOLUTIONS | _MATMULS | (_VIEWS - {"Placeholder", "_Retval"})
         | {"Tile", "BroadcastTo", "Transpose", "Pad", "Sum", "Mean", "Prod", "Max", "Min",
            "ConcatV2", "Slice", "StridedSlice", "GatherV2", "ResourceGather", "Fill",
            "Shape", "ShapeN", "Size", "Rank", "Const", "Pack", "Unpack", "Split", "SplitV",
            "BiasAddGrad", "MaxPool", "MaxPoolGrad", "AvgPool", "AvgPoolGrad",
            "FusedBatchNormV3", "FusedBatchNormGradV3", "Conv2DBackpropInput",
            "DepthwiseConv2dNativeBackpropInput", "UnsortedSegmentSum", "Range",
            "BroadcastGradientArgs", "Reshape", "Cast", "Tanh", "Sigmoid"})
_FUNCTION_ATTRS = ("f", "then_branch", "else_branch", "body", "cond", "branches")
_LIST_WRITES = {"TensorListPushBack", "TensorListSetItem"}
_NO_MEMORY_DTYPES = {"resource", "variant", "string"}


@dataclasses.dataclass
class _Op:
    index: int
    name: str
    type: str
    inputs: list[str]            # tensor names
    controls: list[str]          # op names
    outputs: list[tuple[str, int, int]]   # (tensor name, fixed bytes, per-sample bytes)
    inner: tuple[int, int] = (0, 0)       # transient peak inside called functions
    extra: tuple[int, int] = (0, 0)       # accumulators a While keeps for the backward pass
    extra_items: int = 1                  # how many tensors make up ``extra``
    cost: tuple[int, int] = (0, 0)        # how long it runs, in multiply-adds (see _cost)
    workspace: tuple[int, int, int] = (0, 0, 0)   # kernel buffer: fixed, per sample, cap


def _bytes(fixed: int, per: int, cap: int, batch_size: int) -> int:
    """A buffer's size at ``batch_size``; a workspace touches at most ``cap`` bytes
    (pages never written are not resident)."""
    size = fixed + per * batch_size
    return min(size, cap) if cap else size


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
    """

    bytes: int
    op: str
    backward_bytes: int
    forward_bytes: int
    by_layer: dict[str, int]
    heap_bytes: int = 0
    mmap_bytes: int = 0


class StepGraph:
    """The traced training step: its ops, sizes, and a player for their lifetimes."""

    def __init__(self, ops: list[_Op], fetches: set[str], graph_ops: int,
                 scopes: dict[str, str] | None = None, run_ops: list[_Op] | None = None):
        self.ops = ops                     # as traced: layers and forward/backward from these
        self.run_ops = run_ops or ops      # as run: after Grappler's rewrites, when known
        self.fetches = fetches
        self.graph_ops = graph_ops         # ops in the step's graphs (functions included)
        self.scopes = scopes or {}         # name scope -> the layer that was called in it
        self._events: dict[int, list] = {}     # batch size (0: any) -> the schedule
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

    def _schedule(self, batch_size: int) -> list:
        """Plays the graph on :data:`THREADS` executor threads; returns the events in time
        order: ``(op, allocated buffers, freed buffers)``, one when an op starts (its
        outputs and its kernel scratch are allocated) and one when it ends (its scratch,
        and inputs nobody will read any more, are freed). With one thread the order does
        not depend on the batch size; with several it does (an op's duration is its
        :attr:`_Op.cost` at that batch size)."""
        key = batch_size if THREADS > 1 else 0
        if key in self._events:
            return self._events[key]
        ops = _prune(self.run_ops, self.fetches) if PRUNE_DEAD else self.run_ops
        by_name = {op.name: op for op in ops}
        producer: dict[str, _Op] = {}
        for op in ops:
            for t, _, _ in op.outputs:
                producer[t] = op
        consumers: dict[str, list[_Op]] = collections.defaultdict(list)
        waiting: dict[str, int] = {}
        for op in ops:
            deps = {producer[t].name for t in op.inputs if t in producer}
            deps |= {c for c in op.controls if c in by_name}
            waiting[op.name] = len(deps)
            for d in deps:
                consumers[d].append(op)
        reads: collections.Counter = collections.Counter()     # readers not yet finished
        for op in ops:
            for t in set(op.inputs):
                reads[t] += 1
        readers = collections.Counter(reads)                   # ops reading each tensor
        holds: dict[str, list[int]] = {}       # live tensor -> the buffers it keeps alive
        users: collections.Counter = collections.Counter()     # live tensors per buffer
        size: dict[int, tuple[int, int, str]] = {}
        items: dict[int, int] = {}             # accumulators: how many tensors they hold
        caps: dict[int, int] = {}              # workspaces: bytes they touch at most
        ready = collections.deque(op for op in ops if waiting[op.name] == 0)
        running: list = []                     # heap of (end time, order, op, scratch)
        done: set[str] = set()
        events = []
        now = 0

        def hold(t: str, buffers: list[int]) -> None:
            holds[t] = buffers
            for b in buffers:
                users[b] += 1

        def release(t: str, freed: list) -> None:
            for b in holds.pop(t, []):
                users[b] -= 1
                if users[b] == 0:
                    freed.append(b)

        def new_buffer(fixed: int, per: int, owner: str, allocated: list) -> int:
            b = len(size)
            size[b] = (fixed, per, owner)
            allocated.append(b)
            return b

        def start(op: _Op) -> None:
            allocated: list[int] = []
            for i, (t, fixed, per) in enumerate(op.outputs):
                if op.type in _VIEWS:
                    source = op.inputs[i] if op.type == "IdentityN" else (
                        op.inputs[0] if op.inputs else None)
                    if source in holds:
                        hold(t, list(holds[source]))
                    continue                       # a view, a variable or an outside tensor
                if fixed == 0 and per == 0:
                    continue
                taken = None
                if op.type in _FORWARDING:
                    for t_in in op.inputs:
                        buffers = holds.get(t_in)
                        if (buffers and len(buffers) == 1 and reads[t_in] == 1
                                and (FORWARD_SHARED or readers[t_in] == 1)
                                and users[buffers[0]] == 1 and t_in not in self.fetches
                                and size[buffers[0]][:2] == (fixed, per)):
                            taken = holds.pop(t_in)      # written over in place
                            users[taken[0]] -= 1
                            break
                hold(t, taken or [new_buffer(fixed, per, op.name, allocated)])
            if op.extra != (0, 0):
                b = new_buffer(*op.extra, op.name, allocated)
                items[b] = max(1, op.extra_items)  # many tensors, not one
                for t, _, _ in op.outputs:         # kept while its lists are read
                    holds.setdefault(t, []).append(b)
                    users[b] += 1
            scratch = [new_buffer(*op.inner, op.name, allocated)] if op.inner != (0, 0) else []
            if op.workspace != (0, 0, 0):
                scratch.append(new_buffer(*op.workspace[:2], op.name, allocated))
                caps[scratch[-1]] = op.workspace[2]
            events.append((op, [(b, *size[b], items.get(b, 0), caps.get(b, 0))
                                for b in allocated], []))
            end = now + op.cost[0] + op.cost[1] * batch_size if THREADS > 1 else now
            heapq.heappush(running, (end, len(events), op, scratch))

        def finish(op: _Op, scratch: list[int]) -> None:
            freed: list[int] = list(scratch)
            for t in set(op.inputs):
                reads[t] -= 1
            for t, _, _ in op.outputs:
                if reads[t] == 0 and t not in self.fetches:
                    release(t, freed)               # nobody reads it
            for t in set(op.inputs):
                if reads[t] == 0 and t not in self.fetches:
                    release(t, freed)
            events.append((op, [], freed))
            for c in consumers[op.name]:
                waiting[c.name] -= 1
                if waiting[c.name] == 0:
                    ready.append(c)

        while ready or running:
            while ready and len(running) < THREADS:
                op = ready.popleft()
                if op.name not in done:
                    done.add(op.name)
                    start(op)
            if running:
                now, _, op, scratch = heapq.heappop(running)
                finish(op, scratch)
        self._events[key] = events
        return events

    # -- evaluation at a batch size -------------------------------------------------------

    def peak(self, batch_size: int, mmap_threshold: int | None = None) -> Peak:
        """The simulated peak of live tensor bytes at ``batch_size``, and the peaks of
        the buffers glibc serves from its heap and from ``mmap`` (see :class:`Peak`).

        Args:
            batch_size: samples per step.
            mmap_threshold: glibc's mmap threshold in bytes when it is fixed (buffers of
                at least this size are mapped); ``None``: glibc's dynamic threshold,
                which ends at the largest buffer of the step (at most 32 MiB).
        """
        events = self._schedule(batch_size)
        if mmap_threshold is None:
            largest = max((_bytes(fixed, per, cap, batch_size) for _, allocated, _ in events
                           for _, fixed, per, _, items, cap in allocated if not items),
                          default=0)
            threshold = min(MMAP_THRESHOLD_MAX, largest)
        else:
            threshold = mmap_threshold - 1

        def mapped_by_glibc(size: int, items: int) -> bool:
            if items:       # an accumulator: many tensors, each its own allocation
                return mmap_threshold is not None and size // items > threshold
            return size > threshold

        live: dict[int, tuple[int, str, bool]] = {}
        total = heap = mapped = 0
        best, best_at, best_live = -1, "", {}
        heap_peak = mapped_peak = 0
        for op, allocated, freed in events:
            for b, fixed, per, name, items, cap in allocated:
                size = _bytes(fixed, per, cap, batch_size)
                is_mapped = mapped_by_glibc(size, items)
                live[b] = (size, name, is_mapped)
                total += size
                if is_mapped:
                    mapped += size
                else:
                    heap += size
            heap_peak = max(heap_peak, heap)
            mapped_peak = max(mapped_peak, mapped)
            if total > best:
                best, best_at, best_live = total, op.name, dict(live)
            for b in freed:
                size, _, is_mapped = live.pop(b)
                total -= size
                if is_mapped:
                    mapped -= size
                else:
                    heap -= size
        backward = forward = 0
        by_layer: dict[str, int] = collections.defaultdict(int)
        first_backward = self._first_backward()
        for size, name, _ in best_live.values():
            if self._index.get(name, first_backward) >= first_backward:
                backward += size
            else:
                forward += size
                by_layer[name] += size
        return Peak(bytes=max(best, 0), op=best_at, backward_bytes=backward,
                    forward_bytes=forward, by_layer=dict(by_layer), heap_bytes=heap_peak,
                    mmap_bytes=mapped_peak)

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


def _prune(ops: list[_Op], fetches: set[str]) -> list[_Op]:
    """The ops that run: Grappler removes pure ops whose results nobody reads (e.g. the
    gradient with respect to the model's input), and then their producers, in turn."""
    reads = collections.Counter(t for op in ops for t in set(op.inputs))
    controlling = {c for op in ops for c in op.controls}
    producer = {t: op for op in ops for t, _, _ in op.outputs}
    dead: set[str] = set()

    def unused(op: _Op) -> bool:
        return (op.name not in dead and op.type in _PURE and bool(op.outputs)
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


def _sizes(tensor: Any) -> tuple[int, int]:
    dtype = tensor.dtype
    if dtype.name in _NO_MEMORY_DTYPES or tensor.shape.rank is None:
        return 0, 0
    dims = tensor.shape.as_list()
    if any(d is None for d in dims):
        return 0, 0
    n = 1
    for d in dims:
        n *= d
    size = n * dtype.size
    if any(d > 0 and d % PROBE_BATCH == 0 for d in dims):
        return 0, size // PROBE_BATCH
    return size, 0


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
    variable read, an element of another list, a constant). A loop variable pushed at
    the top of the body (an LSTM's cell state, whose gradient needs the previous step's)
    is a new buffer when the value carried to the next iteration is not itself pushed;
    when it is (the hidden state, pushed as the cell's output), it is counted there."""
    pushes = [op.inputs[-1] for op in body.get_operations() if op.type in _LIST_WRITES]
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
        f, p = _sizes(item)
        fixed += f * trips
        per += p * trips
    return fixed, per


def _widening(op: Any) -> tuple[int, int]:
    """float32 copies a CPU kernel makes of float16 operands (no float16 arithmetic): a
    float16 MatMul multiplies float32 copies of its inputs into a float32 output, then
    narrows it (seen in TensorFlow's allocator during a mixed_float16 step). float16
    convolutions work in float16 (their im2col buffers are float16)."""
    if not op.outputs or op.outputs[0].dtype.name != "float16" or op.type not in _MATMULS:
        return 0, 0
    parts = [_sizes(t) for t in list(op.inputs) + list(op.outputs)]
    return 2 * sum(f for f, _ in parts), 2 * sum(p for _, p in parts)


def _workspace(op: Any) -> tuple[int, int, int]:
    """The buffer a CPU kernel of the training step allocates while it runs, as (fixed,
    per-sample, most bytes touched). In a ``tf.function`` TensorFlow runs its own
    kernels (eager ops get oneDNN's instead):

    * the gradients of a 2-D convolution multiply through an im2col buffer of ``shard``
      images sized to a 30 MiB "L3 cache" (TensorFlow's conv_grad_*_ops.cc: a 32->64
      channel 3x3 filter gradient on 30x30 outputs holds [24, 900, 288] floats); only
      the images of the batch are written, so a small batch touches fewer pages. The
      input gradient uses one image's buffer when each thread's share of the work is
      above a 256 KiB "L2 cache";
    * MaxPoolGrad recomputes the argmax (int64) and copies the pooled output.

    The forward convolution (Eigen) and the depthwise kernels pack in cache-sized
    blocks: nothing batch-sized."""
    try:
        if op.type == "MaxPoolGrad":
            f, p = _sizes(op.inputs[1])
            widen = 1 + 8 // (op.inputs[1].dtype.size or 8)
            return f * widen, p * widen, 0
        if op.type not in _CONV_GRADS:
            return 0, 0, 0
        out = op.inputs[2].shape.as_list()
        filt = (op.outputs[0] if op.type == "Conv2DBackpropFilter"
                else op.inputs[1]).shape.as_list()
        filter_total = filt[0] * filt[1] * filt[2]
        output_image = out[1] * out[2]
        size = op.outputs[0].dtype.size
    except (IndexError, TypeError, ValueError):
        return 0, 0, 0
    if not (filter_total and output_image and size):
        return 0, 0, 0
    column = output_image * filter_total * size       # one image's im2col buffer
    work = column + (output_image + filter_total) * filt[3] * size
    if op.type == "Conv2DBackpropInput" and work // THREADS >= _L2_BYTES:
        return column, 0, 0                           # a parallel contraction per image
    shard = -(-_L3_BYTES // work)
    return 0, column, shard * column


def _cost(op: Any) -> tuple[int, int]:
    """How long ``op`` runs, as (fixed, per-sample) multiply-adds: a convolution's or a
    MatMul's arithmetic, plus :data:`BYTE_COST` per byte it reads and writes, plus
    :data:`OP_COST`. Only the ratios between ops matter (they decide what runs together
    on the executor's threads)."""
    fixed, per = OP_COST, 0
    for t in list(op.inputs) + list(op.outputs):
        f, p = _sizes(t)
        fixed, per = fixed + BYTE_COST * f, per + BYTE_COST * p
    try:
        if op.type in _CONVOLUTIONS:
            # 2 x (filter elements / output channels) per element of the output side.
            if "BackpropFilter" in op.type:
                act, filt = op.inputs[2], op.outputs[0]
            elif "BackpropInput" in op.type:
                act, filt = op.inputs[2], op.inputs[1]
            else:
                act, filt = op.outputs[0], op.inputs[1]
            f, p = _sizes(act)
            dims = filt.shape.as_list()
            channels = act.shape.as_list()[-1]
            if channels and all(dims) and act.dtype.size:
                weights = 1
                for d in dims:
                    weights *= d
                k = 2 * weights // channels // act.dtype.size
                fixed, per = fixed + k * f, per + k * p
        elif op.type in _MATMULS:
            a = op.inputs[0]
            adjoint = False
            for attr in ("transpose_a", "adj_x"):
                with contextlib.suppress(ValueError, TypeError):
                    adjoint = bool(op.get_attr(attr))
            dims = a.shape.as_list()
            inner = dims[-2] if adjoint else dims[-1]
            f, p = _sizes(op.outputs[0])
            size = op.outputs[0].dtype.size
            if inner and size and inner % PROBE_BATCH == 0:    # summed over the batch
                per += 2 * inner // PROBE_BATCH * f // size
            elif inner and size:
                fixed, per = fixed + 2 * inner * f // size, per + 2 * inner * p // size
    except (ValueError, IndexError, TypeError):     # a shape we cannot read: bytes only
        pass
    return fixed, per


def _collect(graph: Any, depth: int = 0, cpu: bool = True,
             functions: dict[str, list[_Op]] | None = None) -> tuple[list[_Op], int]:
    """The ops of ``graph`` with their sizes and kernel scratch; the ops of each function
    it calls go to ``functions`` (by function name)."""
    ops = []
    count = 0
    for index, op in enumerate(graph.get_operations()):
        count += 1
        inner = (0, 0)
        extra = (0, 0)
        items = 1
        work = (0, 0)                      # the cost of the functions it runs
        if depth < 8:
            for fname in _function_names(op):
                fg = _function_graph(graph, fname)
                if fg is None:
                    continue
                sub_ops, sub_count = _collect(fg, depth + 1, cpu, functions)
                if functions is not None:
                    functions[fname] = sub_ops
                count += sub_count
                sub = StepGraph(sub_ops, {t.name for t in fg.outputs}, sub_count)
                p = _linear_peak(sub)
                inner = (max(inner[0], p[0]), max(inner[1], p[1]))
                trips = _trip_count(op) if op.type in _LOOPS else 1
                work = (work[0] + trips * sum(o.cost[0] for o in sub_ops),
                        work[1] + trips * sum(o.cost[1] for o in sub_ops))
                if op.type in _LOOPS and fname == op.get_attr("body").name:
                    extra = _accumulated(fg, trips)
                    items = trips * max(1, sum(o.type in _LIST_WRITES
                                               for o in fg.get_operations()))
        if cpu and WIDEN_FLOAT16:
            wf, wp = _widening(op)
            inner = (inner[0] + wf, inner[1] + wp)
        ops.append(_Op(index=index, name=op.name, type=op.type,
                       inputs=[t.name for t in op.inputs],
                       controls=[c.name for c in op.control_inputs],
                       outputs=[(t.name, *_sizes(t)) for t in op.outputs],
                       inner=inner, extra=extra, extra_items=items,
                       cost=tuple(a + b for a, b in zip(_cost(op), work, strict=True)),
                       workspace=_workspace(op) if cpu else (0, 0, 0)))
    return ops, count


def _linear_peak(step: StepGraph) -> tuple[int, int]:
    """A function's transient peak as (fixed, per-sample), from two batch sizes."""
    a, b = step.peak(1).bytes, step.peak(1001).bytes
    per = max(0, (b - a) // 1000)
    return max(0, a - per), per


def trace(setup: Any, cpu: bool = True) -> StepGraph:
    """Traces one training step of a compiled model (see the module docstring).

    Args:
        setup: a :class:`memfit.estimate.training.Setup`.
        cpu: the step runs on a CPU (float16 kernels widen their operands to float32).

    Returns:
        The :class:`StepGraph`; call ``.peak(batch_size)`` on it.
    """
    import tensorflow as tf

    model = setup.model

    def spec(shape: tuple[int, ...], dtype: str) -> Any:
        return tf.TensorSpec((PROBE_BATCH, *shape), dtype)

    xs = [spec(s, d) for s, d in setup.inputs]
    ys = [spec(s, d) for s, d in setup.targets]
    x = xs[0] if len(xs) == 1 else xs
    y = ys[0] if len(ys) == 1 else ys
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
    functions: dict[str, list[_Op]] = {}
    ops, count = _collect(graph, cpu=cpu, functions=functions)
    fetches = {t.name for t in graph.outputs}
    run_ops = _optimized(graph, ops, functions) if GRAPPLER and cpu else None
    return StepGraph(ops, fetches, count, scopes, run_ops)


# -- the graph as TensorFlow runs it: after Grappler ---------------------------------------

_SIZES, _INNER, _EXTRA, _COST, _WORKSPACE = (
    "_memfit_sizes", "_memfit_inner", "_memfit_extra", "_memfit_cost", "_memfit_workspace")
_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
_LOOPS = {"While", "StatelessWhile"}


def _annotate(node: Any, op: _Op | None) -> None:
    """Writes what the play needs of ``op`` onto its NodeDef, in attributes Grappler
    carries along when it copies, inlines or keeps the node. A ``While`` stays one op:
    the play sizes its loop as a whole (lowered, it would be a cycle of Enter, Merge,
    Switch and NextIteration nodes)."""
    if node.op in _LOOPS:
        node.attr["_lower_using_switch_merge"].b = False
    if op is None:
        return
    node.attr[_SIZES].list.i.extend(x for _, f, p in op.outputs for x in (f, p))
    node.attr[_INNER].list.i.extend(op.inner)
    node.attr[_EXTRA].list.i.extend((*op.extra, op.extra_items))
    node.attr[_COST].list.i.extend(op.cost)
    node.attr[_WORKSPACE].list.i.extend(op.workspace)


def _optimized(graph: Any, ops: list[_Op], functions: dict[str, list[_Op]]) -> list[_Op] | None:
    """The step's ops as TensorFlow's executor gets them: the traced graph rewritten by
    Grappler (the default optimizers TensorFlow runs on a function before its first call:
    constant folding, arithmetic simplification, fusions such as Conv2D+BiasAdd, pruning,
    the inlining of called functions and ``If`` branches), with the sizes and kernel
    scratch of :func:`_collect` carried over on each node. ``None`` when Grappler cannot
    run on this graph (the traced graph is played instead)."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.framework import meta_graph
    from tensorflow.python.grappler import cluster, tf_optimizer

    graph_def = graph.as_graph_def()
    by_name = {op.name: op for op in ops}
    for node in graph_def.node:
        node.device = _CPU
        _annotate(node, by_name.get(node.name))
    for function in graph_def.library.function:
        sub = {op.name: op for op in functions.get(function.signature.name, [])}
        for node in function.node_def:
            _annotate(node, sub.get(node.name))
    meta = meta_graph.create_meta_graph_def(graph_def=graph_def, graph=graph)
    keep = meta_graph_pb2.CollectionDef()
    keep.node_list.value.extend([t.name for t in graph.outputs]
                                + [op.name for op in graph.control_outputs])
    meta.collection_def["train_op"].CopyFrom(keep)
    try:
        optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta,
                                               cluster=cluster.Cluster())
    except Exception:                   # noqa: BLE001 - Grappler's errors are not typed
        return None
    if any(node.op == "NextIteration" for node in optimized.node):
        return None                         # a loop the play cannot follow
    producer = {t: op for op in ops for t, _, _ in op.outputs}
    kept = {node.name for node in optimized.node}
    arity: collections.Counter = collections.Counter()   # outputs read, per node
    for node in optimized.node:
        for i in node.input:
            name, _, slot = i.lstrip("^").partition(":")
            arity[name] = max(arity[name], int(slot or 0) + 1)
    run = []
    for index, node in enumerate(optimized.node):
        inputs = [i if ":" in i else f"{i}:0" for i in node.input if not i.startswith("^")]
        sizes = list(node.attr[_SIZES].list.i) if _SIZES in node.attr else None
        inner = tuple(node.attr[_INNER].list.i) if _INNER in node.attr else (0, 0)
        extra = tuple(node.attr[_EXTRA].list.i) if _EXTRA in node.attr else (0, 0, 1)
        cost = tuple(node.attr[_COST].list.i) if _COST in node.attr else (OP_COST, 0)
        workspace = (tuple(node.attr[_WORKSPACE].list.i) if _WORKSPACE in node.attr
                     else (0, 0, 0))
        traced = by_name.get(node.name)
        if sizes is None and traced is not None:   # a node Grappler made in its place
            sizes = [x for _, f, p in traced.outputs for x in (f, p)]
            inner, cost, workspace = traced.inner, traced.cost, traced.workspace
        if traced is not None and traced.type != node.op:
            # A fusion (Conv2D+BiasAdd+Relu as _FusedConv2D, named after the Relu): it
            # also has the scratch and the work of the ops it swallowed, up its first input.
            fused = producer.get(traced.inputs[0]) if traced.inputs else None
            while fused is not None and fused.name not in kept:
                inner = (inner[0] + fused.inner[0], inner[1] + fused.inner[1])
                cost = (cost[0] + fused.cost[0], cost[1] + fused.cost[1])
                fused = producer.get(fused.inputs[0]) if fused.inputs else None
        sizes = (sizes or []) + [0, 0] * max(0, arity[node.name] - len(sizes or []) // 2)
        outputs = [(f"{node.name}:{i // 2}", sizes[i], sizes[i + 1])
                   for i in range(0, len(sizes), 2)]
        run.append(_Op(index=index, name=node.name, type=node.op, inputs=inputs,
                       controls=[i[1:] for i in node.input if i.startswith("^")],
                       outputs=outputs, inner=(inner[0], inner[1]),
                       extra=(extra[0], extra[1]), extra_items=extra[2],
                       cost=(cost[0], cost[1]),
                       workspace=(workspace[0], workspace[1], workspace[2])))
    return run


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
