"""The order of what a pass reads, and the windows it reads, built ahead in that order.

- :func:`order_rng`: the NumPy generator every random order is drawn from, a pure
  function of ``(seed, epoch, ...)``.
- :func:`epochs_dataset` and :func:`pass_epochs`: the epochs one pass runs, from a
  counter (``epochs=None``: each new pass is the next epoch) or a range (``epochs=N``).
- :class:`WindowFeeder` and :func:`fed_dataset`: the block reader's windows and the
  arrays reader's batches, built ahead on threads and handed to a sequential ``map`` in
  order.

Example:
    >>> rng = order_rng(0, 3)                   # epoch 3 of seed 0
    >>> rng.permutation(4).tolist() == order_rng(0, 3).permutation(4).tolist()
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from memfit.errors import CorruptShardError

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["order_rng", "epochs_dataset", "pass_epochs", "WindowFeeder", "fed_dataset"]

_NO_ERROR = np.array(b"")


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
        >>> pairs, counter = pass_epochs(0, 3)
        >>> [p.tolist() for p in pairs.as_numpy_iterator()]
        [[0, 0], [0, 1], [0, 2]]
        >>> [p.tolist() for p in pairs.as_numpy_iterator()]        # the next pass: epoch 1
        [[1, 0], [1, 1], [1, 2]]

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


def fed_dataset(feed: Callable[[Any], list[np.ndarray]], per_epoch: int, *, epoch: int,
                epochs: int | None, names: Sequence[str], dtypes: Sequence[np.dtype],
                shapes: Sequence[tuple[int, ...]], rows: int | None,
                as_dict: bool) -> tuple[tf.data.Dataset, Any]:
    """The arrays ``feed`` hands over (a :class:`WindowFeeder`), one element per window
    of a pass::

        (epoch, window) pairs (:func:`pass_epochs`) or, with ``epochs=N``, element
        numbers → map(numpy_function(feed))

    A :class:`~memfit.errors.CorruptShardError` that ``feed`` raises fails the element with
    an assertion whose text is its message
    (:func:`memfit.data.read.translate_errors.assert_clean`), which reaches the user as that
    error again, not as a ``numpy_function``'s traceback; the pass's later windows fail
    with it too.

    Args:
        feed: ``feed(element)`` → one array per name (it may raise memfit's errors).
        per_epoch: windows per epoch.
        epoch, epochs: the first epoch, and ``None`` (one epoch per pass) or the end of
            the range one pass runs.
        names, dtypes, shapes: each array's feature name, dtype and per-sample shape.
        rows: the arrays' first dimension when it is always the same, else ``None``.
        as_dict: dict elements; else tuples (one name: the tensor alone).

    Returns:
        ``(dataset, the epoch counter variable or None)``.
    """
    import tensorflow as tf

    from memfit.data.read.translate_errors import assert_clean

    types = [tf.as_dtype(d) for d in dtypes]

    def checked(element: Any) -> list[np.ndarray]:
        try:
            return [*feed(element), _NO_ERROR]
        except CorruptShardError as e:      # arrays of the declared shapes, never used
            return [*(np.zeros((rows or 0, *shape), d) for d, shape in
                      zip(dtypes, shapes, strict=True)), np.array(str(e).encode("utf-8"))]

    # The message of a window that failed in this pass, else "". The pass's later windows
    # fail with it too, without calling Python: tf.data's prefetch goes on asking for them,
    # and a Python call still under way when the interpreter exits hangs the exit. A new
    # pass (its window 0) calls the reader again.
    failed = tf.Variable("", trainable=False, name="memfit_window_error")

    def window(element: tf.Tensor) -> Any:
        first = tf.equal(element[1] if epochs is None else element, 0)
        earlier = tf.where(first, "", failed.read_value())

        def read() -> list[tf.Tensor]:
            # stateful: the feeder builds ahead in order; tf.data keeps this map sequential.
            return tf.numpy_function(checked, [element], [*types, tf.string], stateful=True)

        def refuse() -> list[tf.Tensor]:
            return [*(tf.zeros([rows or 0, *shape], t) for t, shape in
                      zip(types, shapes, strict=True)), earlier]

        *got, error = tf.cond(tf.equal(earlier, ""), read, refuse)
        with tf.control_dependencies([failed.assign(error)]):
            check = assert_clean(error)
        with tf.control_dependencies([check]):
            got = [tf.identity(t) for t in got]
        for t, shape in zip(got, shapes, strict=True):
            t.set_shape([rows, *shape])
        if as_dict:
            return dict(zip(names, got, strict=True))
        return tuple(got) if len(got) > 1 else got[0]

    if epochs is None:                               # one epoch per pass, from the counter
        elements, counter = pass_epochs(epoch, per_epoch)
    else:                                            # epochs epoch .. epochs - 1 in one pass
        elements, counter = tf.data.Dataset.range((epochs - epoch) * per_epoch), None
    return elements.map(window), counter
