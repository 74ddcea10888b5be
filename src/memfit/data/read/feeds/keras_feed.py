"""``memfit.dataset`` as a ``keras.utils.PyDataset``: the same batches as the ``tf.data``
pipeline, with no TensorFlow (Keras on JAX or PyTorch).

A reader that builds batch ``s`` of epoch ``e`` with NumPy alone (the block reader's
windows, :mod:`memfit.data.read.feeds.block_feed`; the arrays reader's gather,
:func:`~memfit.data.read.arrays_reader.open_arrays`) is handed to :class:`KerasFeed`.
Keras asks a ``PyDataset`` for its batches by index, in an order of its own: ``fit``
shuffles the indices of every epoch (``shuffle=True``, its default), with Python's
``random``. The order must stay memfit's, a pure function of ``(seed, epoch)``, as on
``tf.data``, which Keras cannot shuffle. So the feed hands over the batches of a pass in
memfit's order whatever index is asked (``for batch in ds`` and Keras without shuffling
ask ``0, 1, 2, ...``: the same): the ``k``-th batch asked for in a pass is

- ``epochs=None``: step ``k`` of the pass's epoch. Each pass is the next epoch, as each
  new ``tf.data`` iterator is; a pass ends when its ``steps_per_epoch`` batches have been
  handed over (Keras asks for exactly that many).
- ``epochs=N``: one pass yields epochs ``epoch .. N - 1``: step ``k % steps_per_epoch``
  of epoch ``epoch + k // steps_per_epoch``, as on ``tf.data``.

Keras asks for one batch of a fresh pass alone to build an unbuilt model
(``_symbolic_build`` in ``fit``/``evaluate``, the first call in ``predict``), then calls
``on_epoch_end`` and starts the pass again. A pass that handed over one batch when
``on_epoch_end`` comes is taken as that look and starts again, so ``fit``'s first epoch
reads epoch ``epoch`` from its step 0 (on the TF path on the JAX backend the look counts
as a pass, and ``fit`` starts at epoch ``epoch + 1``). Keras's ``on_epoch_begin`` and
``on_epoch_end`` cannot count passes: ``fit`` calls ``on_epoch_end`` once before its first
epoch, and a plain ``for batch in ds`` calls neither. Two limits follow: an epoch of one
batch cannot tell the look from a pass (there the look is a pass, as on the TF path), and
``fit(..., steps_per_epoch=1)`` over an epoch of several batches reads step 0 again each
Keras epoch.

The batches are built ahead on memfit's threads by
:class:`~memfit.data.read.feeder.WindowFeeder` (into the next epoch, as for ``tf.data``),
so the feed asks Keras for no workers of its own (``workers=1``: batches are asked for in
order, from one thread). A damaged shard or array file raises
:class:`~memfit.errors.CorruptShardError` from the feed's own frame, its message naming the
file and the record, with no chained traceback.

Example:
    >>> import numpy as np
    >>> from memfit.data.read.arrays_reader import open_arrays
    >>> np.save("x.npy", np.arange(10, dtype="float32"))
    >>> feed = arrays_feed(open_arrays({"x": "x.npy"}, 4, features=("x",), seed=0))
    >>> len(feed), feed.memfit_plan.steps_per_epoch
    (3, 3)
    >>> first = [feed[i].tolist() for i in range(3)]          # epoch 0
    >>> second = [feed[i].tolist() for i in range(3)]         # the next pass: epoch 1
    >>> sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(10))
    True
    >>> first != second
    True
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from memfit.data.read.arguments import place
from memfit.data.read.arrays_reader import ArraysBatches
from memfit.data.read.feeder import WindowFeeder
from memfit.data.read.files.files_open import InPlace, pack_command
from memfit.data.read.plan import ReaderPlan
from memfit.errors import CorruptShardError, DatasetError
from memfit.sizes import format_count

__all__ = ["KerasFeed", "arrays_feed", "files_feed"]


class KerasFeed(keras.utils.PyDataset):
    """The batches of a memfit reader as a ``keras.utils.PyDataset``, handed over in
    memfit's order whatever index Keras asks for (see the module docstring).

    Example: see the module docstring.

    Args:
        batch: ``batch(epoch, step)`` → one array per name (thread-safe; it may raise
            :class:`~memfit.errors.CorruptShardError`).
        plan: the reader's plan (``steps_per_epoch``, ``epoch``, ``epochs``), kept as
            ``memfit_plan``.
        names: the feature of each array.
        as_dict: dict batches; else tuples (one name: the array alone), as ``tf.data``.
    """

    def __init__(self, batch: Callable[[int, int], list[np.ndarray]], plan: ReaderPlan, *,
                 names: Sequence[str], as_dict: bool):
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=1)
        self.memfit_plan = plan
        self._batch = batch
        self._names = tuple(names)
        self._as_dict = as_dict
        self._structure: Any = None
        self._steps = plan.steps_per_epoch
        self._per_pass = self._steps * (1 if plan.epochs is None else plan.epochs - plan.epoch)
        self._pass = 0                               # passes begun before this one
        self._handed = 0                             # batches this pass handed over
        self._lock = threading.Lock()

    @property
    def num_batches(self) -> int:
        """Batches of one pass: ``steps_per_epoch`` (× the epochs of one pass)."""
        return self._per_pass

    def __len__(self) -> int:
        return self._per_pass

    def next_position(self) -> tuple[int, int]:
        """``(epoch, step)`` of the next batch handed over (see the module docstring)."""
        plan = self.memfit_plan
        with self._lock:
            if self._handed >= self._per_pass:       # the pass is over: the next one
                self._pass, self._handed = self._pass + 1, 0
            k = self._handed
            self._handed += 1
            if plan.epochs is not None:
                return plan.epoch + k // self._steps, k % self._steps
            return plan.epoch + self._pass, k

    def on_epoch_end(self) -> None:
        """Keras's end of an epoch: a pass that handed over only its first batch was
        Keras's look at it, and starts again (see the module docstring)."""
        with self._lock:
            if self._handed == 1 and self._per_pass > 1:
                self._handed = 0

    def __getitem__(self, index: Any) -> Any:
        index = operator.index(index)
        if not 0 <= index < self._per_pass:
            raise IndexError(f"memfit.dataset has "
                             f"{format_count(self._per_pass, 'batch', 'batches')} a pass. "
                             f"Received: index={index}")
        e, s = self.next_position()
        try:
            arrays = self._batch(e, s)
        except CorruptShardError as err:   # one memfit frame, not the reader's threads
            raise CorruptShardError(str(err), err.file, err.record) from None
        if self._structure is not None:
            return place(self._structure, self._names, arrays)
        if self._as_dict:
            return dict(zip(self._names, arrays, strict=True))
        return tuple(arrays) if len(arrays) > 1 else arrays[0]

    def hand_over_in(self, structure: Any) -> None:
        """Hands each batch over in ``structure``, a nesting of the feed's names
        (:func:`memfit.data.read.arguments.place`), instead of a tuple or a dict.

        Args:
            structure: tuples, lists and dicts of feature names.
        """
        self._structure = structure


def arrays_feed(src: ArraysBatches) -> KerasFeed:
    """The arrays reader's batches as a :class:`KerasFeed`: gathered ahead on
    ``parallel_reads`` threads, in order, into the next epoch's first batches (as the
    ``tf.data`` pipeline of :func:`memfit.data.read.arrays_reader.dataset` gathers them).

    Example: see the module docstring.

    Args:
        src: the opened and planned source
            (:func:`~memfit.data.read.arrays_reader.open_arrays`).
    """
    plan = src.plan
    feeder = WindowFeeder(src.batch_of, plan.steps_per_epoch, epoch=plan.epoch,
                          epochs=plan.epochs, workers=plan.parallel_reads,
                          ahead=plan.parallel_reads)

    def batch(e: int, s: int) -> list[np.ndarray]:
        return feeder(np.array([e, s]))

    return KerasFeed(batch, plan, names=src.names, as_dict=src.features is None)


def files_feed(opened: InPlace, *, backend: str | None = None) -> KerasFeed:
    """Plain TFRecord files read in place as a :class:`KerasFeed`: the batches of the
    ``tf.data`` pipeline (:mod:`memfit.data.read.files.files_reader`), read ahead on
    ``parallel_batches`` threads, into the next epoch. With ``on_corrupt="skip"`` a batch
    is short by its damaged records, as there; one that lost every record is replaced by
    the next batch of its epoch that did not (Keras asks for as many batches as were
    planned, and an empty batch cannot be trained on).

    Example:
        >>> from memfit.data.read.files.files_open import open_in_place
        >>> feed = files_feed(open_in_place("data/path*.tfrecords", 256))  # doctest: +SKIP

    Args:
        opened: the files opened and planned
            (:func:`~memfit.data.read.files.files_open.open_in_place`); every one plain.
        backend: Keras's backend, for the message (default: ``keras.backend.backend()``).

    Raises:
        DatasetError: a file is compressed (only ``tf.data`` reads those in place).
    """
    plan, batches = opened.plan, opened.batches
    if batches is None:
        raise DatasetError(f"memfit.dataset reads compressed TFRecord files in place on "
                           f"Keras's TensorFlow backend only (tf.data decompresses them), "
                           f"and Keras runs on {backend or keras.backend.backend()}: pack "
                           f"them first "
                           f"({pack_command(opened.files)}), or decompress them.")
    steps = plan.steps_per_epoch

    def build(e: int, s: int) -> list[np.ndarray]:
        out = batches(e, s)
        for later in range(1, steps):
            if len(out[0]):
                return out
            out = batches(e, (s + later) % steps)
        if not len(out[0]):
            raise DatasetError(f"Every record of epoch {e} of {opened.files.describe()} is "
                               f"damaged: nothing to train on.")
        return out

    feeder = WindowFeeder(build, steps, epoch=plan.epoch, epochs=plan.epochs,
                          workers=plan.parallel_batches, ahead=plan.prefetch_batches)

    def batch(e: int, s: int) -> list[np.ndarray]:
        return feeder(np.array([e, s]))

    return KerasFeed(batch, plan, names=opened.picked, as_dict=opened.names is None)
