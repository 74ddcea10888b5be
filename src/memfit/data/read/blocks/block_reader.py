"""memfit's block reader: packed shards of fixed-shape features read straight into batches.

The modules of the block reader: :mod:`memfit.data.read.blocks.block_layout` (where everything is in
a record, and whether the reader can read a set of shards), :mod:`memfit.data.read.blocks.block_io`
(each piece of a window's records read to where it goes, and checked),
:mod:`memfit.data.read.blocks.block_plan` (the window, parallelism and prefetch depth from the byte
budget: the reader's memory model), and this one: which samples make each window, and
the ``tf.data`` pipeline over the windows.

Since a window's order is decided before it is read, the reader knows where each sample
goes: with memfit's C loop (:func:`~memfit.data.read.blocks.block_layout.reads_into_batches`) each
sample is read straight into its batch row; without it, records are read into scratch
buffers (reused from call to call) and one ``np.take`` per feature gathers the samples
into aligned batches.

The order of epoch ``e`` (a pure function of ``(seed, e)``):

1. the shard files are permuted by ``(seed, e)`` and read ``cycle`` at a time, round-robin
   one record from each; a shard that ends hands its lane to the next file in the
   permutation (the record sequence of ``tf.data``'s ``interleave``);
2. that sequence of samples is cut into *windows* of ``window`` samples, a whole number
   of batches; the samples of window ``w`` are permuted by ``(seed, e, w)`` and cut into
   batches.

So batch ``b``'s samples are a pure function of ``(seed, e, b)``: any window can be built
at any time, by any thread, in any order. The record sequence of an epoch costs a few
NumPy operations over the manifest's record counts (16 bytes a record, nothing per
sample) and is computed once per epoch.

Integrity: a record whose frame header, tags or CRC32C does not match, that lies past
the end of its (truncated) file, or whose file is gone, raises :class:`ShardReadError`
naming the shard file and the record's index (through ``tf.data``, the
:class:`~memfit.errors.CorruptShardError` of :mod:`memfit.data.read.translate_errors`); with
``on_corrupt="skip"`` its samples are left out and one warning on stderr counts the
records skipped. Fixed-length records let the reader go on after a damaged record
instead of losing the rest of the shard.

Example:
    >>> import tempfile
    >>> from memfit.data.packing.packer import pack
    >>> out = tempfile.mkdtemp() + "/d"
    >>> _ = pack({"x": np.zeros((100, 3), "float32"), "y": np.arange(100)}, out, shards=2,
    ...          samples_per_record=8, progress=False)
    >>> m = Manifest.load(out)
    >>> plan = BlockReaderPlan(names=("x", "y"), seed=0, shuffle=True, cycle=2, window=64,
    ...                        batch_size=32, samples=100)
    >>> reader = BlockReader(m, m.split("train").shards, plan, on_corrupt="raise")
    >>> x, y = reader.window(0, 0)                  # epoch 0, window 0: two batches
    >>> x.shape, reader.windows
    ((64, 3), 2)
    >>> ids = np.concatenate([reader.window(0, w)[1] for w in range(reader.windows)])
    >>> sorted(ids.tolist()) == list(range(100))    # every sample once an epoch
    True
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from memfit.data.format.manifest import Manifest, Shard
from memfit.data.read.blocks.block_io import GONE, Buffers, RecordReads
from memfit.data.read.blocks.block_layout import reads_into_batches
from memfit.data.read.blocks.block_plan import BlockReaderPlan
from memfit.data.read.buffers import BufferPool, RecyclingBuffers, touch
from memfit.data.read.feeder import WindowFeeder, fed_dataset, order_rng
from memfit.data.read.pipeline_tail import finish, warn_skipped
from memfit.data.read.plan import DatasetPlan
from memfit.data.read.translate_errors import what_to_do
from memfit.errors import CorruptShardError

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["BlockReader", "ShardReadError", "build"]


class ShardReadError(CorruptShardError, ValueError):
    """A shard record that cannot be read: damaged, cut short, or not memfit's layout.

    A ``ValueError`` too, as TensorFlow's readers raise for bad input.
    """




@dataclasses.dataclass
class _Epoch:
    """The record sequence of one epoch."""

    shard: np.ndarray           # int32, shard index of each record, in sequence order
    record: np.ndarray          # int32, record index inside its shard
    starts: np.ndarray          # int64, len + 1: first sequence position of each record



class BlockReader:
    """Builds the windows of samples of a set of shards (see the module docstring).

    ``window(e, w)`` is the ``tf.numpy_function`` of :func:`build`: it returns window
    ``w`` of epoch ``e``, one array per requested feature, already in batch order.

    Example: see the module docstring.

    Args:
        manifest: the dataset's manifest
            (:func:`~memfit.data.read.blocks.block_layout.why_not` must have said yes).
        shards: the shards to read (a worker's share of a split).
        plan: what to read and how
            (:class:`~memfit.data.read.blocks.block_plan.BlockReaderPlan`).
        on_corrupt: ``"raise"`` or ``"skip"``.

    The first window asked for takes every buffer the plan counts (``builders`` scratch
    sets, ``outputs_alive`` outputs per feature) and touches their pages: the reader's
    memory is then flat from the first batch on, whatever the length of the run.
    """

    def __init__(self, manifest: Manifest, shards: Sequence[Shard], plan: BlockReaderPlan,
                 on_corrupt: str):
        if not 1 <= plan.cycle <= max(1, len(shards)) or (plan.cycle > 1 and not plan.shuffle):
            raise ValueError(f"cycle={plan.cycle} for {len(shards)} shards "
                             f"(shuffle={plan.shuffle}): the plan must clamp it")
        self.plan = plan
        base = manifest.path
        self.where = str(base) if base is not None else "the dataset directory"
        self.files = [str(base / s.file) if base is not None else s.file for s in shards]
        self.records = np.array([s.records for s in shards], np.int64)
        self.k = manifest.samples_per_record
        self.features = list(manifest.features.values())
        self.names = list(plan.names)
        self.requested = [next(i for i, f in enumerate(self.features) if f.name == n)
                          for n in self.names]
        self.sample_bytes = [int(f.sample_bytes or 0) for f in self.features]
        self.dtypes = [np.dtype(f.dtype).newbyteorder("<") for f in self.features]
        self.last_samples = np.array([s.samples - (s.records - 1) * self.k for s in shards],
                                     np.int64)
        self.file_bytes = np.array([s.bytes for s in shards], np.int64)
        self.seed = plan.seed
        self.shuffle = plan.shuffle
        self.cycle = plan.cycle
        self.window_samples = plan.window
        self.batch_size = plan.batch_size
        self.samples = plan.samples
        self.windows = max(1, math.ceil(plan.samples / plan.window))
        self.on_corrupt = on_corrupt
        self._epochs: dict[int, _Epoch] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[int, int]] = set()
        self._warn_lock = threading.Lock()          # _warn runs under _lock, too
        self.direct = reads_into_batches([self.dtypes[f] for f in self.requested])
        self._io = RecordReads(self.features, self.k, self.files, self.records,
                               self.last_samples, self.requested, self.direct, plan.window)
        self.full = self._io.full
        self._pool: BufferPool[Buffers] = BufferPool(
            self._io.make_buffers, lambda b, need: b.rows >= need[0] and b.records >= need[1])
        self._outputs = {f: RecyclingBuffers(plan.outputs_alive) for f in self.requested}
        self._builders = plan.builders
        self._reserved = False
        self._reserve_lock = threading.Lock()

    def _reserve(self) -> None:
        """Takes the planned buffers at once (see the class docstring); other first
        callers wait for it, so that none of them makes a buffer set of its own."""
        with self._reserve_lock:
            if self._reserved:
                return
            self._reserve_now()
            self._reserved = True

    def _reserve_now(self) -> None:
        def prepare(bufs: Buffers) -> None:
            for a in (*bufs.data, bufs.head, bufs.skel, bufs.foot, bufs.iov, bufs.stage):
                touch(a)

        self._pool.reserve(self._builders, self._io.default_need, prepare)
        rows = min(self.window_samples, self.samples)
        for f in self.requested:
            self._outputs[f].reserve(rows * self.dtypes[f].itemsize
                                     * math.prod(self.features[f].shape or ()))

    # -- the epoch's record sequence ------------------------------------------------------
    def _epoch(self, e: int) -> _Epoch:
        with self._lock:
            ep = self._epochs.get(e)
            if ep is None:
                ep = self._sequence(e)
                self._epochs[e] = ep
                for old in sorted(self._epochs)[:-self.plan.epochs_kept]:
                    del self._epochs[old]
            return ep

    def _sequence(self, e: int) -> _Epoch:
        """Shards permuted by (seed, e), read ``cycle`` at a time, round-robin."""
        n = len(self.files)
        order = order_rng(self.seed, e, 0).permutation(n) if self.shuffle else np.arange(n)
        lane = np.empty(n, np.int64)
        begin = np.empty(n, np.int64)
        free = [(0, slot) for slot in range(self.cycle)]      # (step it is free at, lane)
        for i, s in enumerate(order):
            at, slot = heapq.heappop(free)
            lane[i], begin[i] = slot, at
            heapq.heappush(free, (at + int(self.records[s]), slot))
        counts = self.records[order]
        shard = np.repeat(order, counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        record = np.arange(len(shard), dtype=np.int64) - first
        key = (np.repeat(begin, counts) + record) * self.cycle + np.repeat(lane, counts)
        seq = np.argsort(key, kind="stable")
        shard, record = shard[seq], record[seq]
        bad = self._check_sizes(e)
        n_samples = np.where(record == self.records[shard] - 1, self.last_samples[shard],
                             self.k)
        if bad:
            width = int(self.records.max()) + 1
            drop = np.isin(shard * width + record, [s * width + r for s, r in bad])
            shard, record, n_samples = shard[~drop], record[~drop], n_samples[~drop]
        starts = np.zeros(len(shard) + 1, np.int64)
        np.cumsum(n_samples, out=starts[1:])
        return _Epoch(shard.astype(np.int32), record.astype(np.int32), starts)

    def _check_sizes(self, e: int) -> set[tuple[int, int]]:
        """Files shorter or longer than the manifest says: an error, or (skip) the records
        past the end, with a warning."""
        bad: set[tuple[int, int]] = set()
        full = self.full.frame_bytes
        for s, file in enumerate(self.files):
            try:
                size = os.stat(file).st_size
            except OSError as err:
                if self.on_corrupt == "raise":
                    self._raise(s, 0, err.strerror or str(err),
                                "missing" if isinstance(err, FileNotFoundError)
                                else "unreadable")
                lost = list(range(int(self.records[s])))
                bad.update((s, r) for r in lost)
                self._warn_gone(s, err.strerror or str(err))
                continue
            expected = int(self.file_bytes[s])
            if size == expected:
                continue
            records = int(self.records[s])
            if size > expected:
                message = (f"memfit: shard {file} is corrupt or truncated: it has {size:,} "
                           f"bytes, {size - expected:,} more than the manifest says "
                           f"(written over after packing?).")
                if self.on_corrupt == "raise":
                    raise ShardReadError(f"{message} {what_to_do(self.where)}", file)
                self._warn(e, s, [], message + " Reading its records as they are.")
                continue
            cut = min(size // full, records - 1)        # first record not wholly there
            if self.on_corrupt == "raise":
                self._raise(s, cut, f"the file has {size:,} of its {expected:,} bytes")
            lost = list(range(cut, records))
            bad.update((s, r) for r in lost)
            self._warn(e, s, lost, f"memfit: WARNING: skipped {len(lost)} unreadable records "
                                   f"of shard {file} from record {cut} on (the file is cut "
                                   f"short: {size:,} of {expected:,} bytes).")
        return bad

    def _raise(self, s: int, record: int, why: str,
               state: str = "corrupt or truncated") -> None:
        """Raises memfit's one-line error for record ``record`` of shard ``s``."""
        raise ShardReadError(
            f"memfit: shard {self.files[s]} is {state}: record {record} of "
            f"{int(self.records[s])} cannot be read ({why}). {what_to_do(self.where)}",
            self.files[s], record) from None

    def _warn(self, e: int, s: int, records: list[int], message: str) -> None:
        """Prints a skip warning once per damaged record (to stderr, like tf.print): the
        windows built ahead read the next epochs' damage too, and every epoch meets the
        same damage again; the first warning said it."""
        with self._warn_lock:
            keys = {(s, r) for r in records} or {(s, -1)}
            if keys <= self._warned:
                return
            self._warned |= keys
        warn_skipped(message)

    def _warn_gone(self, s: int, why: str) -> None:
        """One warning for a shard whose file is gone, whether a window or an epoch's
        size check found it first."""
        self._warn(-1, s, list(range(-2, int(self.records[s]))),
                   f"memfit: WARNING: skipped shard {self.files[s]}: it cannot be read "
                   f"({why}); its {int(self.records[s])} records are left out.")

    def _damaged(self, e: int, shard: np.ndarray, record: np.ndarray, damaged: np.ndarray,
                 why: dict[int, str]) -> None:
        first = int(np.flatnonzero(damaged)[0])
        s, r = int(shard[first]), int(record[first])
        if self.on_corrupt == "raise":
            self._raise(s, r, why[first])
        for s in np.unique(shard[damaged]).tolist():
            at = np.flatnonzero(damaged & (shard == s))
            if why[int(at[0])].startswith(GONE):
                self._warn_gone(s, why[int(at[0])][len(GONE) + 2:])
                continue
            lost = sorted(record[at].tolist())
            self._warn(e, s, lost, f"memfit: WARNING: skipped {len(lost)} unreadable records "
                                   f"of shard {self.files[s]} (records {lost}: damaged; "
                                   f"bad CRC32C, length or tags).")

    # -- one window -----------------------------------------------------------------------
    def window(self, e: Any, w: Any) -> list[np.ndarray]:
        """Window ``w`` of epoch ``e``: one aligned array per requested feature, its
        samples in batch order (``batch_size`` at a time)."""
        e, w = int(e), int(w)
        if not self._reserved:
            self._reserve()
        ep = self._epoch(e)
        a = w * self.window_samples
        b = min(a + self.window_samples, self.samples, int(ep.starts[-1]))
        if a >= b:
            return self._empty()
        starts = ep.starts
        i0 = int(np.searchsorted(starts, a, side="right")) - 1
        i1 = int(np.searchsorted(starts, b, side="left"))
        shard, record = ep.shard[i0:i1], ep.record[i0:i1]
        sizes = starts[i0 + 1:i1 + 1] - starts[i0:i1]
        read = np.lexsort((record, shard))                 # file order: runs, locality
        row = np.empty(len(read), np.int64)
        row[read] = np.cumsum(sizes[read]) - sizes[read]
        lo = np.maximum(a - starts[i0:i1], 0)
        hi = np.minimum(b - starts[i0:i1], sizes)
        take = hi - lo
        idx = np.arange(int(take.sum()), dtype=np.int64)
        rows = np.repeat(row + lo - (np.cumsum(take) - take), take) + idx
        perm = order_rng(self.seed, e, 1, w).permutation(len(rows)) if self.shuffle \
            else slice(None)
        rows = rows[perm]                   # output position -> sample read (row space)
        read_rows = int(sizes.sum())
        bufs = self._pool.get((read_rows, len(read)))
        try:
            # Where each sample read goes: to its batch row (direct), else to the scratch
            # buffer in read order (samples outside the window, features not asked for).
            to = np.empty((len(self.features), read_rows), np.uint64)
            t = np.arange(read_rows, dtype=np.uint64)
            if self.direct:
                outside = np.ones(read_rows, bool)
                outside[rows] = False
                spare = np.flatnonzero(outside)             # at most 2 * (k - 1)
            for f, data in enumerate(bufs.data):
                size = np.uint64(self.sample_bytes[f])
                if self.direct and f in self.requested:
                    to[f, spare] = data.ctypes.data + t[:len(spare)] * size
                else:
                    to[f] = data.ctypes.data + t * size
            out = []
            for f in self.requested:
                out.append(self._outputs[f].array((len(rows), *self.features[f].shape),
                                                  self.dtypes[f].newbyteorder("=")))
                if self.direct:
                    to[f, rows] = (out[-1].ctypes.data + t[:len(rows)]
                                   * np.uint64(self.sample_bytes[f]))
            damaged, why = self._io.read(shard[read], record[read], row[read], bufs, to)
            if damaged.any():
                self._damaged(e, shard[read], record[read], damaged, why)
            if not self.direct:
                for f, dest in zip(self.requested, out, strict=True):
                    src = bufs.data[f][:bufs.rows * self.sample_bytes[f]].view(
                        self.dtypes[f]).reshape(bufs.rows, *self.features[f].shape)
                    if self.dtypes[f].isnative:
                        np.take(src, rows, axis=0, out=dest, mode="clip")   # no buffering
                    else:
                        dest[...] = src[rows]
            if damaged.any():                               # on_corrupt="skip"
                bad_seq = np.zeros(len(read), bool)
                bad_seq[read[damaged]] = True
                keep = ~bad_seq[np.repeat(np.arange(len(read)), take)[perm]]
                out = [dest[keep] for dest in out]
            return out
        finally:
            self._pool.put(bufs)

    def _empty(self) -> list[np.ndarray]:
        return [np.empty((0, *self.features[f].shape), self.dtypes[f].newbyteorder("="))
                for f in self.requested]

    def output_dtypes(self) -> list[np.dtype]:
        """The dtype of each returned array (native byte order)."""
        return [self.dtypes[f].newbyteorder("=") for f in self.requested]

    def output_shapes(self) -> list[tuple[int, ...]]:
        """The per-sample shape of each returned array."""
        return [tuple(self.features[f].shape) for f in self.requested]  # type: ignore[misc]


def build(reader: BlockReader, plan: DatasetPlan, features: Sequence[str] | None, *,
          drop_remainder: bool, sharded: bool) -> tf.data.Dataset:
    """The ``tf.data`` pipeline over a :class:`BlockReader`::

        (epoch, window) pairs (a scan over the epoch counter) or, with ``epochs=N``,
        element numbers → map(numpy_function(WindowFeeder(reader.window)))
        → rebatch(batch_size) (dim-0 slices: no copy) → prefetch

    The feeder (:class:`memfit.data.read.feeder.WindowFeeder`) builds ``parallel_windows``
    windows ahead on its own threads, into the next epoch, and hands them to a
    sequential map in order: a new iterator instantiates two small functions (one with
    ``epochs=N``) and finds its first windows built. A pass of several epochs
    (``epochs=N``) runs on without a pause between them. Windows hold whole batches,
    but for the last one of an epoch, which may end with a smaller batch: with
    ``epochs=N`` the rebatch then cycles through the epoch's batch sizes, so no batch
    spans two epochs. (Skipping damaged records, ``on_corrupt="skip"``, leaves windows
    short: batches are then cut across windows, and, with ``epochs=N``, across epochs.)

    Args:
        reader: the reader.
        plan: the :class:`~memfit.data.read.plan.DatasetPlan` (epochs, parallelism, prefetch).
        features: ``None`` for dict elements, else the names for tuple elements (one name:
            the tensor alone).
        drop_remainder: drop the last, smaller batch of each epoch (static batch size).
        sharded: sharded by hand (tf.distribute must not shard again).
    """
    import tensorflow as tf

    batch = plan.batch_size
    feeder = WindowFeeder(reader.window, reader.windows, epoch=plan.epoch, epochs=plan.epochs,
                          workers=plan.parallel_windows, ahead=plan.parallel_windows)

    ds, counter = fed_dataset(feeder, reader.windows, epoch=plan.epoch, epochs=plan.epochs,
                              names=reader.names, dtypes=reader.output_dtypes(),
                              shapes=reader.output_shapes(), rows=None,
                              as_dict=features is None)
    tail = reader.samples % batch
    if plan.epochs is not None and tail and not drop_remainder and reader.on_corrupt == "raise":
        sizes = np.full(plan.steps_per_epoch, batch, np.int64)
        sizes[-1] = tail
        ds = ds.rebatch(tf.constant(sizes))           # cycles: every epoch ends on its tail
    else:
        ds = ds.rebatch(batch, drop_remainder=drop_remainder)
    # Skipping damaged records leaves fewer batches than planned: no cardinality then.
    return finish(ds, plan, counter, sharded=sharded,
                  check_cardinality=reader.on_corrupt == "raise")
