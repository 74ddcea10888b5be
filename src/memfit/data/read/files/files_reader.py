"""TFRecord files of ``tf.train.Example`` records streamed in place as a ``tf.data``
pipeline, under memfit's plan (:mod:`memfit.data.read.files.files_plan`). For epoch ``e``::

    files, permuted by (seed, e)
      → interleave: `cycle_length` files read at once, a chunk of 64 records from each in
        turn (deterministic)
      → windows of `window_samples` records (whole batches), each window's records
        permuted by (seed, e, window)
      → batches of `batch_size` in the permuted order
      → prefetch

Plain files (every file uncompressed: the usual case) are read **record by record where
the records lie** (:mod:`memfit.data.read.files.record_gather`): opening the files noted
where each record starts, so the interleave and the windows are computed as lists of
records, and each batch's records are read straight into the batch (one ``preadv`` a
record, CRC32C checked), ``parallel_batches`` batches at once. Nothing waits for a window
to be read and no window is held: a window is an order, its records stay in the page
cache (the kernel is asked to read each window's span ahead). A damaged record (a bad
CRC32C, a file cut or changed since it was opened) stops the stream with a
``CorruptShardError`` naming the file and the record; with ``on_corrupt="skip"`` that
record alone is left out, with one warning line.

Compressed files (GZIP, ZLIB) cannot be read at an offset, so they are read in sequence:
``TFRecordDataset`` interleaved, each chunk decoded as it is read, the window of decoded
samples held and permuted whole (below). Both give the same batches for the same records
(``tests/data/test_stream_tfrecord_files.py``).

Records travel through tf.data a chunk or a window at a time, never one by one: a
tf.data step per record (a shuffle buffer, ``unbatch``, ``batch``) costs more than
reading the record.

The order is a pure function of ``(seed, epoch)``: the file order and each window's
permutation are drawn from NumPy generators seeded from them
(:class:`~memfit.data.read.files.record_gather.EpochOrder`, as for packed data), and the
interleave is deterministic; Keras's other backends read plain files in the same order
(:func:`~memfit.data.read.feeds.keras_feed.files_feed`).
It is coarser than a packed dataset's: a sample only meets the samples of its window (the
``window_samples`` records around it in the interleaved stream; the whole epoch when the
budget holds it), where packing permutes all samples once and the readers mix shards of
that permutation.

Decoding a chunk (compressed files): records built like the first one (same size, same
bytes outside the values: what ``tf.io.serialize_tensor`` + ``TFRecordWriter`` write for
fixed shapes) are turned into one ``uint8`` row each (one ``decode_raw`` for the chunk),
their shared bytes compared with the first record's at once, and each feature's columns
reinterpreted as its dtype (``bitcast``, no string per record); ``int64`` lists go through
``tf.io.parse_example``. A chunk with any other record is decoded in Python by the pack's
own code (:func:`~memfit.data.sources.tfrecord_source.decode_payload`), each such record
checked first (:class:`~memfit.data.sources.tfrecord_source.SpecCheck`): one that
disagrees stops the stream with a ``CorruptShardError`` naming the file and the
record. So does a damaged record (a bad CRC32C, a file cut short), unless
``on_corrupt="skip"`` (then the rest of that file is left out: a compressed stream cannot
be resumed after damage).

Example:
    >>> ds = memfit.dataset("data/path*.tfrecords", 256)        # doctest: +SKIP
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import tensorflow as tf

from memfit.data.read.feeder import epochs_dataset
from memfit.data.read.files.files_open import InPlace, open_in_place
from memfit.data.read.files.files_plan import CHUNK_RECORDS
from memfit.data.read.files.record_gather import decode_into
from memfit.data.read.pipeline_tail import finish, warn_skipped
from memfit.data.read.translate_errors import assert_clean
from memfit.data.sources.tfrecord_source import RecordFeature
from memfit.errors import CorruptShardError
from memfit.quiet import spend_tfrecord_reader_line

__all__ = ["stream_files"]

_NO_ERROR = np.array(b"")


class _Steps:
    """The pipeline's steps over one set of files (see the module docstring)."""

    def __init__(self, opened: InPlace, *, on_corrupt: str, drop_remainder: bool):
        files, plan = opened.files, opened.plan
        self.files, self.plan, self.order = files, plan, opened.order
        self.batches = opened.batches
        self.on_corrupt, self.drop_remainder = on_corrupt, drop_remainder
        self.feats: dict[str, RecordFeature] = {n: files.spec[n] for n in opened.picked}
        self.paths = tf.constant([str(p) for p in files.files])
        self.compression = tf.constant([c or "" for c in files.compression])
        self.expected = tf.constant(files.records, tf.int64)
        self._warned: set[bytes] = set()
        self._lock = threading.Lock()
        layout = files.check.layout
        self.layout = layout if layout is not None and all(
            f.kind in ("tensor", "float_list", "int64_list") for f in files.spec.values()) \
            else None
        if self.layout is not None:             # the bytes every record shares, and where
            at = np.concatenate([np.arange(a, b) for a, b in self.layout.fixed] or
                                [np.zeros(0, np.int64)])
            self._fixed_at = tf.constant(at, tf.int64)
            self._fixed_bytes = tf.constant(np.frombuffer(self.layout.first, np.uint8)[at])

    # -- reading ---------------------------------------------------------------------
    def read_file(self, i: tf.Tensor) -> tf.data.Dataset:
        """``(file index, record index, record)`` of file ``i`` in chunks of
        :data:`CHUNK_RECORDS` records, the count checked at its end against the count found
        when it was opened (``TFRecordDataset`` stops quietly at a damaged record under
        ``ignore_errors``)."""
        file, records = self.paths[i], self.expected[i]
        # Read with TensorFlow's default buffer (READ_BUFFER), not named: naming it logs.
        raw = tf.data.TFRecordDataset(file, compression_type=self.compression[i]
                                      ).ignore_errors().batch(CHUNK_RECORDS)
        end = tf.data.Dataset.from_tensors((tf.constant([], tf.string), True))
        marked = raw.map(lambda r: (r, False)).concatenate(end)

        def count(n: tf.Tensor, item: tuple) -> tuple:
            chunk, is_end = item
            ok = tf.logical_or(tf.logical_not(is_end), tf.equal(n, records))
            with tf.control_dependencies([self._check_count(ok, file, n, records)]):
                k = tf.size(chunk, out_type=tf.int64)
                return n + k, (tf.fill([k], i), n + tf.range(k), chunk, is_end)

        # Checked, and passed on, a chunk of records at a time: a tf.data step per record
        # costs more than reading it.
        return (marked.scan(tf.constant(0, tf.int64), count)
                .filter(lambda i, n, r, is_end: tf.logical_not(is_end))
                .map(lambda i, n, r, is_end: (i, n, r)))

    def _check_count(self, ok: tf.Tensor, file: tf.Tensor, n: tf.Tensor,
                     records: tf.Tensor) -> tf.Tensor:
        if self.on_corrupt == "raise":
            def message() -> tf.Tensor:
                return tf.strings.join([
                    "memfit: TFRecord file ", file, " is corrupt or truncated: record ",
                    tf.strings.as_string(n), " of ", tf.strings.as_string(records),
                    " cannot be read (bad CRC32C or cut short). Write the file again or "
                    "leave it out; or pass on_corrupt='skip' to train without the "
                    "damaged records."])

            return assert_clean(tf.cond(ok, lambda: tf.constant(""), message))
        return tf.cond(ok, lambda: tf.constant(True), lambda: tf.numpy_function(
            self._warn, [file, n, records], tf.bool, stateful=True))

    def _warn(self, file: bytes, n: np.int64, records: np.int64) -> np.bool_:
        with self._lock:
            if file in self._warned:
                return np.True_
            self._warned.add(file)
        warn_skipped(f"memfit: WARNING: skipped {int(records - n):,} unreadable records of "
                     f"TFRecord file {file.decode('utf-8', 'replace')} from record {int(n)} "
                     f"on (damaged or truncated).")
        return np.True_

    # -- decoding --------------------------------------------------------------------
    def decode(self, fi: tf.Tensor, ri: tf.Tensor, r: tf.Tensor) -> dict[str, tf.Tensor]:
        """A batch of records decoded: at fixed offsets when every record is built like
        the first, else in Python (each odd record checked)."""
        if self.layout is None:
            return self._slow(fi, ri, r)
        width = len(self.layout.first)

        def same_size() -> dict[str, tf.Tensor]:
            # Every record as one row of bytes (one copy, no string per record), its
            # bytes outside the values compared with the first record's at once.
            rows = tf.io.decode_raw(r, tf.uint8, fixed_length=width)
            like_first = tf.reduce_all(tf.equal(tf.gather(rows, self._fixed_at, axis=1),
                                                self._fixed_bytes))
            return tf.cond(like_first, lambda: self._fast(rows, r),
                           lambda: self._slow(fi, ri, r))

        return tf.cond(tf.reduce_all(tf.equal(tf.strings.length(r), width)), same_size,
                       lambda: self._slow(fi, ri, r))

    def _fast(self, rows: tf.Tensor, r: tf.Tensor) -> dict[str, tf.Tensor]:
        """The values cut out of ``rows`` (the records' bytes, one row each) and
        reinterpreted in place as their dtype (stored little-endian)."""
        assert self.layout is not None
        out, ints = {}, {}
        for name, f in self.feats.items():
            if f.kind == "int64_list":
                ints[name] = tf.io.FixedLenFeature(f.shape, tf.int64)
                continue
            a, b = self.layout.values[name]
            dtype = tf.as_dtype(f.dtype)
            size = np.dtype(f.dtype).itemsize
            values = rows[:, a:b]
            if dtype == tf.bool:
                values = tf.not_equal(values, 0)
            elif size > 1:
                values = tf.reshape(values, [-1, (b - a) // size, size])
                if sys.byteorder == "big":
                    values = tf.reverse(values, axis=[-1])
                values = tf.bitcast(values, dtype)
            elif dtype != tf.uint8:
                values = tf.bitcast(values, dtype)
            out[name] = tf.reshape(values, [-1, *f.shape])
        if ints:
            out.update(tf.io.parse_example(r, ints))
        return out

    def _slow(self, fi: tf.Tensor, ri: tf.Tensor, r: tf.Tensor) -> dict[str, tf.Tensor]:
        return self._in_python(self._py_decode, [fi, ri, r])

    def _in_python(self, func: Any, args: list[tf.Tensor]) -> dict[str, tf.Tensor]:
        """The features, as ``func(*args)`` returns them (one array each, in order), from a
        ``numpy_function``. A ``CorruptShardError`` it raises fails the step with an
        assertion whose text is memfit's message (:func:`assert_clean`), as the packed
        readers do: an exception raised in a ``numpy_function`` has TensorFlow log it
        with its Python traceback, twice, before the user sees memfit's error."""
        feats = list(self.feats.values())

        def checked(*arrays: np.ndarray) -> list[np.ndarray]:
            try:
                return [*func(*arrays), _NO_ERROR]
            except CorruptShardError as e:      # arrays of the declared types, never used
                return [*(np.zeros((0, *f.shape), f.dtype) for f in feats),
                        np.array(str(e).encode("utf-8"))]

        *values, error = tf.numpy_function(
            checked, args, [*(tf.as_dtype(f.dtype) for f in feats), tf.string],
            stateful=False)
        with tf.control_dependencies([assert_clean(error)]):
            values = [tf.identity(v) for v in values]
        out = {}
        for (name, f), v in zip(self.feats.items(), values, strict=True):
            v.set_shape([None, *f.shape])
            out[name] = v
        return out

    def _py_decode(self, fi: np.ndarray, ri: np.ndarray, r: np.ndarray) -> list[np.ndarray]:
        out = [np.empty((len(r), *f.shape), f.dtype) for f in self.feats.values()]
        for row, payload in enumerate(r.tolist()):
            decode_into(self.files, self.feats, int(fi[row]), int(ri[row]), payload, out, row)
        return out

    # -- an epoch --------------------------------------------------------------------
    def one_epoch(self, e: tf.Tensor) -> tf.data.Dataset:
        plan = self.plan
        if self.batches is not None:
            return self.gathered_epoch(e)
        order = tf.numpy_function(self.order.files, [e], tf.int64, stateful=False)
        order.set_shape([len(self.files.files)])
        listing = tf.data.Dataset.from_tensor_slices(order)
        parallel = plan.parallel_batches
        if not plan.shuffle:
            return (listing.flat_map(self.read_file)
                    .map(self.decode, num_parallel_calls=parallel, deterministic=True)
                    .rebatch(plan.batch_size, drop_remainder=self.drop_remainder))
        chunks = listing.interleave(self.read_file, cycle_length=plan.cycle_length,
                                    block_length=1, num_parallel_calls=plan.read_threads,
                                    deterministic=True)
        # Decoded a chunk at a time as it is read, before the window: the window and the
        # batches then hold the values alone, moved as whole rows (no string per record).
        decoded = chunks.map(self.decode, num_parallel_calls=parallel, deterministic=True)
        windows = decoded.rebatch(plan.window_samples).enumerate()
        return windows.flat_map(lambda k, w: self.window_batches(e, k, w))

    def gathered_epoch(self, e: tf.Tensor) -> tf.data.Dataset:
        """The epoch's batches read record by record (plain files,
        :class:`~memfit.data.read.files.record_gather.InPlaceBatches`): the same records in
        the same order as the files read in sequence."""
        batches = self.batches
        assert batches is not None

        def read(s: tf.Tensor) -> dict[str, tf.Tensor]:
            return self._in_python(batches, [e, s])

        ds = tf.data.Dataset.range(self.plan.steps_per_epoch).map(
            read, num_parallel_calls=self.plan.parallel_batches, deterministic=True)
        if self.on_corrupt == "skip":               # a batch of damaged records alone
            ds = ds.filter(lambda b: tf.shape(next(iter(b.values())))[0] > 0)
        return ds

    def window_batches(self, e: tf.Tensor, k: tf.Tensor,
                       window: dict[str, tf.Tensor]) -> tf.data.Dataset:
        """The batches of window ``k`` of epoch ``e`` (decoded values), its samples
        permuted by ``(seed, epoch, k)`` (:meth:`~memfit.data.read.files.record_gather.
        EpochOrder.window_perm`): each sample is copied once, into its batch."""
        n = tf.shape(next(iter(window.values())), out_type=tf.int64)[0]
        perm = tf.numpy_function(self.order.window_perm, [e, k, n], tf.int64, stateful=False)
        perm.set_shape([None])
        size = self.plan.batch_size
        count = n // size if self.drop_remainder else (n + size - 1) // size

        def batch(j: tf.Tensor) -> dict[str, tf.Tensor]:
            p = perm[j * size:(j + 1) * size]
            return {name: tf.gather(v, p) for name, v in window.items()}

        return tf.data.Dataset.range(count).map(
            batch, num_parallel_calls=self.plan.parallel_batches, deterministic=True)


def stream_files(path: Any, batch_size: int, **arguments: Any) -> tf.data.Dataset:
    """``memfit.dataset`` for TFRecord files read in place (the arguments are
    ``memfit.dataset``'s, checked by
    :func:`~memfit.data.read.files.files_open.open_in_place`). Returns the dataset, its plan
    as ``ds.memfit_plan``.

    Raises:
        DatasetError: for bad input (see :func:`~memfit.data.read.files.tfrecord_files.open_files`),
            and for features that are not fixed-shape numbers (pack those files first).
    """
    opened = open_in_place(path, batch_size, **arguments)
    plan, names = opened.plan, opened.names
    if opened.batches is None:             # compressed: read by TFRecordDataset
        spend_tfrecord_reader_line()        # its info line, where it is dropped
    steps = _Steps(opened, on_corrupt=arguments.get("on_corrupt", "raise"),
                   drop_remainder=arguments.get("drop_remainder", False))
    epoch_ds, counter = epochs_dataset(plan.epoch, plan.epochs)
    ds = epoch_ds.flat_map(steps.one_epoch)
    if names is not None:
        ds = ds.map(lambda d: tuple(d[n] for n in names) if len(names) > 1 else d[names[0]])
    return finish(ds, plan, counter, sharded=arguments.get("shard") is not None
                  or arguments.get("input_context") is not None,
                  check_cardinality=arguments.get("on_corrupt", "raise") == "raise")
