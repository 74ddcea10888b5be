"""The block reader's windows cut into batches for :class:`~memfit.data.read.feeds.
keras_feed.KerasFeed`, with no TensorFlow.

A window of the block reader (:meth:`~memfit.data.read.blocks.block_reader.BlockReader.
window`) holds whole batches in batch order, but for the last window of an epoch, which
may end with a smaller batch. So batch ``s`` of epoch ``e`` is rows ``r * B .. (r + 1) * B``
of window ``s // m`` (``m`` batches a window, ``r = s % m``): the batches the ``tf.data``
pipeline's ``rebatch`` cuts, with ``epochs=N`` too (no batch spans two epochs). Windows
are built ahead on the plan's ``parallel_windows`` threads by
:class:`~memfit.data.read.feeder.WindowFeeder`, into the next epoch; the window being cut
is kept until its last batch is handed over.

``on_corrupt="skip"``: a damaged record's samples are left out of their window, so
windows come out short. The batches are then cut from the stream of the epoch's samples
that survive, window after window, as ``tf.data``'s ``rebatch`` cuts them. Keras asks a
``PyDataset`` for the number of batches it said before the damage is met, and a pass
cannot end early, so an epoch keeps its planned batches and their sizes: the samples it
lost are made up by its first samples again (the ``tf.data`` pipeline yields fewer
batches instead). The skip warning is the reader's, once per damaged record.

Example:
    >>> import tempfile
    >>> from memfit.data.format.manifest import Manifest
    >>> from memfit.data.packing.packer import pack
    >>> from memfit.data.read.blocks.block_plan import BlockReaderPlan
    >>> from memfit.data.read.blocks.block_reader import BlockReader
    >>> out = tempfile.mkdtemp() + "/d"
    >>> _ = pack({"x": np.zeros((100, 3), "float32"), "y": np.arange(100)}, out, shards=2,
    ...          samples_per_record=8, progress=False)
    >>> m = Manifest.load(out)
    >>> plan = BlockReaderPlan(names=("x", "y"), seed=0, shuffle=True, cycle=2, window=64,
    ...                        batch_size=32, samples=100)
    >>> batches = WindowBatches(BlockReader(m, m.split("train").shards, plan, "raise"),
    ...                         epoch=0, epochs=None, parallel=1)
    >>> [len(batches(0, s)[1]) for s in range(4)]
    [32, 32, 32, 4]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from memfit.data.read.blocks.block_plan import BlockReaderPlan
from memfit.data.read.blocks.block_reader import BlockReader
from memfit.data.read.feeder import WindowFeeder
from memfit.data.read.feeds.keras_feed import KerasFeed
from memfit.data.read.plan import DatasetPlan, steps_per_epoch
from memfit.errors import CorruptShardError

__all__ = ["WindowBatches", "SurvivingBatches", "block_feed"]


class WindowBatches:
    """Batch ``s`` of epoch ``e``: a slice of its window (see the module docstring).

    Example: see the module docstring.

    Args:
        reader: the block reader.
        epoch, epochs: the plan's first epoch and the end of one pass's range (or
            ``None``), for the windows built ahead.
        parallel: windows built at once (the plan's ``parallel_windows``).
    """

    def __init__(self, reader: BlockReader, *, epoch: int, epochs: int | None,
                 parallel: int):
        self.reader = reader
        self.batch_size = reader.batch_size
        self.per_window = max(1, reader.window_samples // reader.batch_size)
        self.feeder = WindowFeeder(reader.window, reader.windows, epoch=epoch,
                                   epochs=epochs, workers=parallel, ahead=parallel)
        self._lock = threading.Lock()
        self._key: tuple[int, int] | None = None
        self._window: list[np.ndarray] = []

    def window(self, e: int, w: int) -> list[np.ndarray]:
        """Window ``w`` of epoch ``e`` (the one being cut is kept)."""
        with self._lock:
            if self._key != (e, w):
                self._window = []                   # let the reader recycle it
                self._window = self.feeder(np.array([e, w]))
                self._key = (e, w)
            return self._window

    def __call__(self, e: int, s: int) -> list[np.ndarray]:
        w, r = divmod(s, self.per_window)
        rows = slice(r * self.batch_size, (r + 1) * self.batch_size)
        return [a[rows] for a in self.window(e, w)]


class SurvivingBatches(WindowBatches):
    """``on_corrupt="skip"``: batches cut from the stream of an epoch's surviving samples,
    each of its planned size; an epoch that lost samples starts over to fill its last
    batches (see the module docstring). Asked in order (Keras does), each batch costs
    its own rows; asked out of order, the epoch is cut again from its start.

    Args:
        reader: the block reader (``on_corrupt="skip"``).
        epoch, epochs, parallel: as for :class:`WindowBatches`.
        drop_remainder: every batch full (the plan's ``steps_per_epoch`` of them).
    """

    def __init__(self, reader: BlockReader, *, epoch: int, epochs: int | None,
                 parallel: int, drop_remainder: bool):
        super().__init__(reader, epoch=epoch, epochs=epochs, parallel=parallel)
        self.steps = steps_per_epoch(reader.samples, reader.batch_size, drop_remainder)
        tail = reader.samples - (self.steps - 1) * reader.batch_size
        self.last = reader.batch_size if drop_remainder else tail
        self._at: tuple[int, int] = (-1, 0)        # (epoch, next step) of the stream
        self._next_window = 0
        self._rest: list[np.ndarray] = []          # rows of the window being cut
        self._stream_lock = threading.Lock()

    def __call__(self, e: int, s: int) -> list[np.ndarray]:
        with self._stream_lock:
            if self._at != (e, s):
                if self._at[0] != e or s < self._at[1]:
                    self._at, self._next_window, self._rest = (e, 0), 0, []
                while self._at[1] < s:                      # out of order: cut up to s
                    self._cut(e, self._size(self._at[1]))
                    self._at = (e, self._at[1] + 1)
            out = self._cut(e, self._size(s))
            self._at = (e, s + 1)
            return out

    def _size(self, s: int) -> int:
        return self.last if s == self.steps - 1 else self.batch_size

    def _cut(self, e: int, size: int) -> list[np.ndarray]:
        parts: list[list[np.ndarray]] = []
        need, empty_windows = size, 0
        while need > 0:
            if not self._rest or len(self._rest[0]) == 0:
                if self._next_window >= self.reader.windows:
                    self._next_window = 0                   # lost samples: start over
                got = self.feeder(np.array([e, self._next_window]))
                self._next_window += 1
                self._rest = [np.array(a) for a in got]     # the reader recycles its own
                empty_windows = empty_windows + 1 if len(self._rest[0]) == 0 else 0
                if empty_windows > self.reader.windows:
                    raise CorruptShardError(
                        f"memfit: shard files of {self.reader.where} are corrupt or "
                        f"truncated: no record of epoch {e} can be read. Run `memfit verify "
                        f"{self.reader.where}`, then repack or restore them.",
                        self.reader.where)
                continue
            take = min(need, len(self._rest[0]))
            parts.append([a[:take] for a in self._rest])
            self._rest = [a[take:] for a in self._rest]
            need -= take
        if len(parts) == 1:
            return parts[0]
        return [np.concatenate(column) for column in zip(*parts, strict=True)]


def block_feed(reader: BlockReader, plan: BlockReaderPlan, features: Sequence[str] | None,
               *, drop_remainder: bool) -> KerasFeed:
    """The block reader as a :class:`~memfit.data.read.feeds.keras_feed.KerasFeed`: the
    same batches, plan (``memfit_plan`` is ``plan.dataset``) and errors as the ``tf.data``
    pipeline of :func:`memfit.data.read.blocks.block_reader.build`.

    Args:
        reader: the block reader, built from ``plan``.
        plan: the block reader's plan (settled: its ``dataset`` is set).
        features: ``None`` for dict batches, else the names for tuple batches.
        drop_remainder: drop the last, smaller batch of each epoch.
    """
    settled: DatasetPlan | None = plan.dataset
    assert settled is not None
    order = dict(epoch=settled.epoch, epochs=settled.epochs,
                 parallel=settled.parallel_windows)
    batches: WindowBatches = (WindowBatches(reader, **order) if reader.on_corrupt == "raise"
                              else SurvivingBatches(reader, **order,
                                                    drop_remainder=drop_remainder))
    return KerasFeed(batches, settled, names=reader.names, as_dict=features is None)
