"""Pieces shared by memfit's ``tf.data`` pipelines: the TFRecord reader of
:mod:`memfit.data.stream`, the block reader of :mod:`memfit.data.blocks` and the ``.npy``
reader of :mod:`memfit.data.arrays`.

- :func:`order_rng`: the NumPy generator every random order is drawn from, a pure
  function of ``(seed, epoch, ...)``.
- :func:`aligned_empty` and :class:`BufferPool`: batches TensorFlow can wrap without a
  copy, and scratch buffers reused from call to call (a fresh buffer costs a page fault
  per 4 KiB written).
- :func:`epochs_dataset` and :func:`finish`: the epoch counter (``epochs=None``: each new
  pass is the next epoch) or range (``epochs=N``), and the common tail (known
  cardinality, prefetch, no auto-sharding when sharded by hand, the plan attached).
- :class:`WindowFeeder` and :func:`pass_epochs`: the block reader's windows and the arrays
  path's batches, built ahead on threads and handed to a sequential ``map`` in order.
- :func:`corrupt_shard_error`: memfit's :class:`~memfit.errors.CorruptShardError` for the
  TensorFlow error a damaged shard becomes inside ``tf.data``; iterating a dataset
  :func:`finish` returns raises it instead of the TensorFlow error.

Example:
    >>> rng = order_rng(0, 3)                   # epoch 3 of seed 0
    >>> batch = aligned_empty((256, 32), np.dtype("float32"))
    >>> batch.ctypes.data % 64
    0
"""

from __future__ import annotations

import math
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from memfit.errors import CorruptShardError

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["ALIGN", "aligned_empty", "touch", "BufferPool", "RecyclingBuffers", "order_rng",
           "epochs_dataset", "pass_epochs", "WindowFeeder", "finish", "corrupt_shard_error"]

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
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
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
            # A buffer no view refers to has two references: the list's and getrefcount's.
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
        start = -raw.ctypes.data % ALIGN
        return raw[start:start + nbytes].view(dtype).reshape(shape)


def check_arguments(*, batch_size: Any, on_corrupt: Any, epoch: Any, epochs: Any) -> None:
    """The argument checks every reader's ``dataset()`` starts with (errors quote the
    value)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer. "
                         f"Received: batch_size={batch_size!r}")
    if on_corrupt not in ("raise", "skip"):
        raise ValueError(f"on_corrupt must be 'raise' or 'skip'. "
                         f"Received: on_corrupt={on_corrupt!r}")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer. Received: epoch={epoch!r}")
    if epochs is not None and (not isinstance(epochs, int) or epochs <= epoch):
        raise ValueError(f"epochs must be an integer greater than epoch={epoch}, or None. "
                         f"Received: epochs={epochs!r}")


def check_features(features: Any, names: Any, where: Any) -> tuple[str, ...] | None:
    """``features`` as a tuple (``None`` stays ``None``), each one of ``names``, once."""
    if features is None:
        return None
    features = (features,) if isinstance(features, str) else tuple(features)
    unknown = [f for f in features if f not in names]
    if unknown:
        raise ValueError(f"No feature {unknown[0]!r} in {where}; it has "
                         f"{sorted(names)}. Received: features={features}")
    if len(set(features)) != len(features):
        raise ValueError(f"features names a feature twice. Received: features={features}")
    return features


def check_seed(seed: Any) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer. Received: seed={seed!r}")
    return seed


def settle_plan(plan: Any, *, batch_size: int, samples: int, cap_arenas: bool,
                log: Any) -> Any:
    """The last steps every reader's plan goes through: refuse a plan with no batch, cap
    glibc's arenas if asked (recorded in the plan), and log what was chosen."""
    if plan.steps_per_epoch == 0:
        raise ValueError(f"drop_remainder=True with batch_size={batch_size} larger than the "
                         f"{samples:,} samples leaves no batch. Received: "
                         f"batch_size={batch_size}")
    if cap_arenas:
        import dataclasses
        import os

        from memfit.memory.allocator import limit_arenas

        plan = dataclasses.replace(plan, arena_limit=limit_arenas(max(2, os.cpu_count() or 1)))
    log.info("%s", plan)
    return plan


def order_rng(seed: int, *keys: int) -> np.random.Generator:
    """The generator of one random choice: ``PCG64(SeedSequence([seed, *keys]))``.

    The same ``(seed, *keys)`` always gives the same draws, whatever the process, the
    thread or TensorFlow's global seed.

    Args:
        seed: the dataset's seed.
        *keys: what the choice belongs to, e.g. ``(epoch,)`` or ``(epoch, 1, window)``.
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [int(seed), *(int(k) for k in keys)])))


def epochs_dataset(epoch: int, epochs: int | None) -> tuple[tf.data.Dataset, Any]:
    """The epochs one pass runs: ``epochs=None``: one epoch per pass, read from a counter
    that every new iterator (Keras makes one per epoch) advances; an int: ``epoch ..
    epochs - 1`` in one pass.

    Args:
        epoch: the first epoch.
        epochs: ``None`` or the end of the range.

    Returns:
        ``(dataset of epoch numbers (int64), the counter variable or None)``.
    """
    import tensorflow as tf

    if epochs is None:
        counter = tf.Variable(epoch, dtype=tf.int64, trainable=False, name="memfit_epoch")
        return tf.data.Dataset.from_tensors(0).map(lambda _: counter.assign_add(1) - 1), counter
    return tf.data.Dataset.range(epoch, epochs), None


def pass_epochs(epoch: int, per_epoch: int) -> tuple[tf.data.Dataset, Any]:
    """``(epoch, index)`` pairs of one pass that reads one epoch, the next one every pass
    (Keras starts a pass per epoch): int64 vectors of two.

    The epoch comes from a counter variable that a ``scan`` advances at the pass's first
    element, so each iterator has its own epoch (a pass given up early still counts; two
    passes read at once each get one). The scan adds by ``first`` (1, then 0) rather than
    branching with ``tf.cond``: a new iterator instantiates one small function instead of
    three (each goes through grappler when an iterator is made).

    Example:
        >>> pairs, counter = pass_epochs(0, 3)                         # doctest: +SKIP
        >>> [p.tolist() for p in pairs.as_numpy_iterator()]            # doctest: +SKIP
        [[0, 0], [0, 1], [0, 2]]

    Args:
        epoch: the first pass's epoch.
        per_epoch: pairs per epoch (indices ``0 .. per_epoch - 1``).

    Returns:
        ``(dataset of pairs, the counter variable)``.
    """
    import tensorflow as tf

    counter = tf.Variable(epoch, dtype=tf.int64, trainable=False, name="memfit_epoch")

    def pair(state: tf.Tensor, i: tf.Tensor) -> tuple:
        first = state < 0
        e = tf.where(first, counter.assign_add(tf.cast(first, tf.int64)) - 1, state)
        return e, tf.stack([e, i])

    return tf.data.Dataset.range(per_epoch).scan(tf.constant(-1, tf.int64), pair), counter


class WindowFeeder:
    """Hands ``tf.data`` the windows of a pass in order, built ahead on ``workers`` threads.

    A window is a pure function of ``(epoch, index)`` (``build(e, w)``), so it can be
    built before it is asked for. The feeder is the function of a *sequential* ``map``:
    its element is an ``(epoch, index)`` pair (:func:`pass_epochs`), or, with ``epochs``
    set, the element number ``i`` of a pass over epochs ``epoch .. epochs - 1`` (window
    ``i % per_epoch`` of epoch ``epoch + i // per_epoch``: no function to make pairs).
    Each call queues the next ``ahead`` windows; after an epoch's last window those are
    the first windows of the next epoch, so a new iterator (Keras makes one per epoch)
    finds its first batches ready instead of waiting for them.

    Example:
        >>> feed = WindowFeeder(lambda e, w: [np.full(2, 10 * e + w)], 3, epoch=0,
        ...                     epochs=2, workers=2, ahead=2)
        >>> [int(feed(i)[0][0]) for i in range(6)]
        [0, 1, 2, 10, 11, 12]
        >>> int(feed(np.array([5, 1]))[0][0])
        51

    Args:
        build: ``build(epoch, index)`` → the window's arrays (thread-safe).
        per_epoch: windows per epoch.
        epoch: the first epoch.
        epochs: the end of the epoch range of one pass, or ``None`` (one epoch per pass).
        workers: threads building windows.
        ahead: windows queued beyond the one asked for.
    """

    def __init__(self, build: Callable[[int, int], list[np.ndarray]], per_epoch: int, *,
                 epoch: int, epochs: int | None, workers: int, ahead: int):
        from concurrent.futures import ThreadPoolExecutor

        self._build = build
        self.per_epoch = max(1, per_epoch)
        self.epoch = epoch
        self.epochs = epochs
        self.ahead = max(0, ahead)
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="memfit-window")
        self._pending: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()

    def __call__(self, element: Any) -> list[np.ndarray]:
        x = np.asarray(element)
        if x.ndim == 0:
            i = int(x)
            e, w = self.epoch + i // self.per_epoch, i % self.per_epoch
        else:
            e, w = int(x[0]), int(x[1])
        with self._lock:
            job = self._pending.pop((e, w), None)
            if job is None:
                job = self._pool.submit(self._build, e, w)
            wanted = self._following(e, w)
            for key in [k for k in self._pending if k not in wanted]:
                self._pending.pop(key).cancel()          # another pass's: not needed now
            for key in wanted:
                if key not in self._pending:
                    self._pending[key] = self._pool.submit(self._build, *key)
        return job.result()

    def _following(self, e: int, w: int) -> list[tuple[int, int]]:
        """The ``ahead`` windows after ``(e, w)``, into the next epoch."""
        out = []
        for _ in range(self.ahead):
            w += 1
            if w >= self.per_epoch:
                e, w = e + 1, 0
                if self.epochs is not None and e >= self.epochs:
                    break
            out.append((e, w))
        return out


def finish(ds: tf.data.Dataset, plan: Any, counter: Any, *, sharded: bool,
           check_cardinality: bool = True) -> tf.data.Dataset:
    """The common tail of memfit's pipelines.

    Args:
        ds: the batches of all the epochs of one pass.
        plan: the plan (``steps_per_epoch``, ``epoch``, ``epochs``, ``prefetch_batches``),
            attached as ``memfit_plan``.
        counter: the epoch counter of :func:`epochs_dataset` (attached as
            ``memfit_epoch_counter``), or ``None``.
        sharded: the caller shards by hand: tf.distribute must not shard again.
        check_cardinality: assert ``steps_per_epoch`` batches per epoch (a known length
            lets Keras show progress and size its epochs without a warning).
    """
    import tensorflow as tf

    if check_cardinality:
        passes = 1 if plan.epochs is None else plan.epochs - plan.epoch
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.steps_per_epoch * passes))
    ds = ds.prefetch(plan.prefetch_batches)
    if sharded:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)
    _raise_memfit_errors(ds)
    ds.memfit_plan = plan
    if counter is not None:
        ds.memfit_epoch_counter = counter
    return ds


# memfit's messages about a damaged shard, as TensorFlow passes them on: a numpy_function's
# exception text ("ShardReadError: memfit: shard FILE ...") or the bracketed items of a
# tf.debugging.Assert ("[memfit: shard] [FILE] [is corrupt or truncated: record] [N] ...").
_MESSAGE = re.compile(r"(?:ShardReadError|CorruptShardError): (memfit: shard [^\n]*)")
_ASSERTED = re.compile(r"\[memfit: shard\] \[(?P<file>[^\]]*)\] \[is corrupt or truncated: "
                       r"record\] \[(?P<record>\d+)\] \[of\] \[(?P<records>\d+)\]")
_FILE = re.compile(r"memfit: shard (\S+) ")
_RECORD = re.compile(r": record (\d+) of")


def corrupt_shard_error(error: BaseException) -> CorruptShardError | None:
    """memfit's own short error for a TensorFlow error that carries memfit's message about
    a damaged shard (``None`` for any other error).

    Inside ``tf.data``, a Python exception becomes a TensorFlow ``InvalidArgumentError``
    with the traceback in its text, and an assertion a bracketed list: this finds the
    shard file and record again.

    Example:
        >>> e = corrupt_shard_error(ValueError("ShardReadError: memfit: shard /d/a.tfrecord "
        ...                                    "is corrupt or truncated: record 3 of 9 ..."))
        >>> e.file, e.record
        ('/d/a.tfrecord', 3)
    """
    text = str(getattr(error, "message", None) or error)
    found = _ASSERTED.search(text)
    if found is not None:
        file, record = found["file"].strip("'\""), int(found["record"])
        message = (f"memfit: shard {file} is corrupt or truncated: record {record} of "
                   f"{found['records']} cannot be read (bad CRC32C or cut short). Run "
                   f"`memfit verify {Path(file).parent}`; pass on_corrupt='skip' to read past "
                   f"damaged shards.")
        return CorruptShardError(message, file, record)
    found = _MESSAGE.search(text)
    if found is None:
        return None
    message = found[1].strip()
    file = _FILE.search(message)
    record = _RECORD.search(message)
    return CorruptShardError(message, file[1] if file else "?",
                             int(record[1]) if record else None)


_CHECKED: dict[type, type] = {}


def _checked(cls: type, methods: tuple[str, ...]) -> type:
    """A subclass of ``cls`` whose ``methods`` raise :class:`CorruptShardError` where the
    TensorFlow error they raise carries memfit's message about a damaged shard."""
    sub = _CHECKED.get(cls)
    if sub is not None:
        return sub

    def checking(name: str) -> Callable[..., Any]:
        base = getattr(cls, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return base(self, *args, **kwargs)
            except Exception as e:
                error = corrupt_shard_error(e) if type(e).__module__.startswith(
                    "tensorflow") else None
                if error is None:
                    raise
                raise error from None           # the TF error stays in __context__
        method.__name__ = name
        method.__doc__ = base.__doc__
        return method

    body: dict[str, Any] = {name: checking(name) for name in methods}
    if "__iter__" in methods:
        iterate = body["__iter__"]

        def __iter__(self: Any) -> Any:
            it = iterate(self)
            try:
                it.__class__ = _checked(type(it), ("__next__", "get_next"))
            except TypeError:                   # not a plain Python class: leave it be
                pass
            return it
        body["__iter__"] = __iter__
    sub = type(cls.__name__, (cls,), {**body, "__module__": cls.__module__,
                                      "__qualname__": cls.__qualname__})
    _CHECKED[cls] = sub
    return sub


def _raise_memfit_errors(ds: tf.data.Dataset) -> None:
    """Iterating ``ds`` in Python (``for batch in ds``, ``next(iter(ds))``) raises
    :class:`CorruptShardError` for a damaged shard instead of a long TensorFlow error.

    Inside a ``tf.function`` (``model.fit``) TensorFlow's error is raised as it is; its
    text then starts with memfit's message."""
    try:
        ds.__class__ = _checked(type(ds), ("__iter__",))
    except TypeError:
        pass
