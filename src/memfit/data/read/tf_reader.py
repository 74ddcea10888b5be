"""``tf.data``'s own TFRecord reader under memfit's plan: what ``memfit.dataset`` uses
for shards the block reader cannot read (variable-shape features, GZIP/ZLIB shards) or
when ``reader="tf"`` is asked for. For epoch ``e``::

    shard files, permuted by (seed, e)
      → interleave: read `cycle_length` shards at once (CRC32C checked per record)
      → batch `window_records` records (the shuffle window)
      → parse the window in one `tf.io.parse_example` + `tf.io.decode_raw` per feature
      → permute the window's samples by (seed, e, window)
      → rebatch to `batch_size` → prefetch

Features packed as encoded image files (``pack(images=..., keep_encoded=True)``: a
``decode`` entry in the manifest) are cut out of their blocks as one string a sample, and
after the permutation each sample is decoded (``tf.io.decode_image``, channels=3, first
frame), cropped as Keras crops when the pack asked for it, resized with bilinear
``tf.image.resize`` and rounded to uint8, in ``decode_calls`` parallel calls, then
batched.

Every random choice uses stateless ops seeded from ``(seed, epoch, ...)``
(:func:`stateless_seed`), so the order is a pure function of them. A shard with fewer
readable records than the manifest says (damaged, truncated, or its file gone) raises
memfit's :class:`~memfit.errors.CorruptShardError` naming the file and the first record
missing (:mod:`memfit.data.read.translate_errors`), or with ``on_corrupt="skip"`` is read up to
the damage with one warning per shard for the whole run.

Example:
    >>> stateless_seed(7, 3).numpy().tolist() == stateless_seed(7, 3).numpy().tolist()
    True
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from memfit.data.format.encoded_image import EncodedImage
from memfit.data.format.manifest import Manifest, Shard
from memfit.data.format.records import LENGTHS_SUFFIX
from memfit.data.read.feeder import epochs_dataset
from memfit.data.read.pipeline_tail import finish, warn_skipped
from memfit.data.read.plan import MAX_CYCLE, MAX_PREFETCH, DatasetPlan, steps_per_epoch
from memfit.data.read.translate_errors import assert_clean, what_to_do
from memfit.errors import DatasetError
from memfit.quiet import spend_tfrecord_reader_line
from memfit.sizes import format_size

__all__ = ["plan_tf", "build", "stateless_seed"]

# Bytes of a window alive at once while it is parsed and permuted: the record strings,
# the parsed strings, the joined/decoded values and the permuted copy.
_WINDOW_COPIES = 4
# The read buffer of each TFRecordDataset: TensorFlow's default, which it uses when no
# buffer_size is given (passing one, even this value, logs an info line on every file).
_READ_BUFFER = 256 * 1024
_WINDOW_CAP = 8 * 2**20         # bytes of decoded samples in one shuffle window
# decode_raw has no unsigned 32/64-bit output: decode the signed type and reinterpret.
_DECODE_AS = {tf.uint32: tf.int32, tf.uint64: tf.int64}


def plan_tf(manifest: Manifest, split: str, batch_size: int, budget: int, *,
            shuffle: bool, samples: int, drop_remainder: bool, seed: int, epoch: int,
            epochs: int | None, files: int) -> DatasetPlan:
    """Derives window, parallelism and prefetch depth from a byte budget.

    Mixing comes mostly from reading many shards at once (each shard is already a
    random sample of the data): a window holds records of ``cycle_length`` shards, so
    samples that met in one epoch rarely meet again. The window itself is capped at
    ``_WINDOW_CAP`` bytes: bigger windows cost page faults on every copy and gain little
    mixing once many shards are interleaved. What is left of the budget goes to prefetch.
    Shards are read by as many threads as there are cores: more threads read no faster
    here and each keeps its own glibc arena of freed buffers, so RSS creeps up with time.
    """
    cores = os.cpu_count() or 1
    k = manifest.samples_per_record
    sample_bytes = manifest.sample_bytes(split)
    record_bytes = sample_bytes * k
    images = [f.decode for f in manifest.features.values() if f.decode is not None]
    # Batches hold decoded images: the encoded bytes' mean plus the decoded size (an
    # upper bound); each decode call holds its largest image and the resize.
    out_bytes = sample_bytes + sum(e.decoded_bytes for e in images)
    batch_bytes = out_bytes * batch_size
    per_call = sum(e.work_bytes for e in images)
    cycle = max(1, min(files, MAX_CYCLE)) if shuffle else 1
    readers = cycle * (_READ_BUFFER + 2 * record_bytes)
    parallel = max(1, min(2, cores))
    need_min = readers + _WINDOW_COPIES * record_bytes * (parallel + 1) + 2 * batch_bytes \
        + per_call
    if budget < need_min:
        decoded = f" (decoded: {format_size(out_bytes)})" if images else ""
        raise DatasetError(
            f"memory_budget={format_size(budget)} is too small to stream batches of "
            f"{batch_size} samples of {format_size(sample_bytes)}{decoded} (records of {k} "
            f"samples): it needs at least {format_size(need_min)} ({need_min:,} bytes). Raise "
            f"memory_budget or lower batch_size. Received: memory_budget={budget}")
    spare = budget - readers - 2 * batch_bytes
    calls = 0
    if images:              # up to a core each, from at most a quarter of what is left
        calls = int(max(1, min(cores, (spare - per_call) // 4 // per_call + 1)))
        spare -= calls * per_call
    window_bytes = min(spare / (_WINDOW_COPIES * (parallel + 1)),
                       max(_WINDOW_CAP, 2 * batch_bytes))
    window_records = int(max(1, min(window_bytes // record_bytes, manifest.split(split).records)))
    if not shuffle:
        window_records = max(1, min(window_records, math.ceil(batch_size / k)))
    in_windows = _WINDOW_COPIES * record_bytes * window_records * (parallel + 1)
    prefetch = int(max(1, min(MAX_PREFETCH, (spare - in_windows) // max(batch_bytes, 1))))
    estimated = readers + in_windows + (prefetch + 1) * batch_bytes + calls * per_call
    note = ", ".join(f"{f.name} (encoded → {f.decode.height}x{f.decode.width}x3 uint8, "
                     f"largest {f.decode.largest[0]}x{f.decode.largest[1]})"
                     for f in manifest.features.values() if f.decode is not None)
    return DatasetPlan(path=str(manifest.path), split=split, batch_size=batch_size,
                       samples=samples,
                       steps_per_epoch=steps_per_epoch(samples, batch_size, drop_remainder),
                       memory_budget=budget,
                       estimated_bytes=int(estimated), window_records=window_records,
                       window_samples=window_records * k, cycle_length=cycle,
                       read_threads=min(cycle, cores), parallel_windows=parallel,
                       prefetch_batches=prefetch, seed=seed, epoch=epoch, epochs=epochs,
                       shuffle=shuffle, decode_calls=calls, decode_note=note)


def _decode_values(blocks: tf.Tensor, dtype_name: str, variable: bool) -> tf.Tensor:
    """Decodes a window of raw blocks into one flat tensor of values.

    Full records all have the same length and decode in one ``decode_raw`` without a
    copy to join them; a window holding a short record (the last of a split) or a
    variable feature is joined first.
    """
    dtype = tf.as_dtype(dtype_name)
    raw_type = _DECODE_AS.get(dtype, dtype)

    def joined() -> tf.Tensor:
        return tf.reshape(tf.io.decode_raw(tf.strings.reduce_join(blocks), raw_type), [-1])

    if variable:
        flat = joined()
    else:
        lengths = tf.strings.length(blocks)
        flat = tf.cond(tf.reduce_min(lengths) == tf.reduce_max(lengths),
                       lambda: tf.reshape(tf.io.decode_raw(blocks, raw_type), [-1]), joined)
    return flat if raw_type == dtype else tf.bitcast(flat, dtype)


def _encoded_samples(blocks: tf.Tensor, lengths: tf.SparseTensor) -> tf.Tensor:
    """One string a sample, cut out of each record's block of encoded files (sample
    ``i`` of a record is its bytes ``[sum(lengths[:i]), sum(lengths[:i + 1]))``)."""
    lengths = tf.RaggedTensor.from_sparse(lengths)
    starts = tf.math.cumsum(lengths, axis=1, exclusive=True)
    dense = lengths.to_tensor()
    cut = tf.strings.substr(blocks[:, None], starts.to_tensor(), dense)
    return tf.boolean_mask(cut, tf.sequence_mask(lengths.row_lengths(), tf.shape(dense)[1]))


def _decode_image(encoded: tf.Tensor, spec: EncodedImage) -> tf.Tensor:
    """One encoded image decoded as the packer decodes it: RGB (an animation's first
    frame), Keras's centred crop when asked, bilinear resize, rounded to uint8."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    size = (spec.height, spec.width)
    if spec.crop_to_aspect_ratio:           # keras's smart_resize crop, in float64 as there
        shape = tf.cast(tf.shape(image)[:2], tf.float64)
        h, w = shape[0], shape[1]
        ch = tf.maximum(tf.minimum(h, tf.floor(w * size[0] / size[1])), 1.0)
        cw = tf.maximum(tf.minimum(w, tf.floor(h * size[1] / size[0])), 1.0)
        top, left = tf.floor((h - ch) / 2), tf.floor((w - cw) / 2)
        box = tf.cast(tf.stack([top, left, ch, cw]), tf.int32)
        image = image[box[0]:box[0] + box[2], box[1]:box[1] + box[3]]
    resized = tf.image.resize(image, size, method="bilinear")
    out = tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
    return tf.ensure_shape(out, (*size, 3))


def _literal_pattern(path: str) -> str:
    """``path`` as a ``tf.io.matching_files`` pattern that matches only itself."""
    return re.sub(r"([*?\[\\])", r"\\\1", path)


def stateless_seed(seed: int, *data: tf.Tensor | int) -> tf.Tensor:
    """A stateless seed pair derived from ``seed`` and the given integers."""
    s = tf.constant([seed & 0x7FFFFFFF, 0x6D656D66], tf.int64)   # "memf"
    for d in data:
        s = tf.random.experimental.stateless_fold_in(s, tf.cast(d, tf.int64))
    return s



class _Steps:
    """The TF reader's steps over the shards of one dataset, in pipeline order (see the
    module docstring): :meth:`read_shard`, :meth:`decode`, and :meth:`one_epoch` that
    chains them for an epoch."""

    def __init__(self, manifest: Manifest, shards: Sequence[Shard], plan: DatasetPlan,
                 features: Sequence[str] | None, *, on_corrupt: str, drop_remainder: bool):
        self.plan = plan
        self.on_corrupt = on_corrupt
        self.drop_remainder = drop_remainder
        self.shard_count = len(shards)
        base = manifest.path
        self.where = str(base)
        self._warned: set[bytes] = set()
        self._warn_lock = threading.Lock()
        self.files = tf.constant([str(base / s.file) for s in shards])
        self.patterns = tf.constant([_literal_pattern(str(base / s.file)) for s in shards])
        self.expected = tf.constant([s.records for s in shards], tf.int64)
        self.compression = manifest.compression or ""
        # Only the features asked for are parsed and decoded.
        self.feats = {n: manifest.features[n] for n in (features or manifest.features)}
        self.spec = {k: v for k, v in manifest.tf_feature_spec().items()
                     if k.split(LENGTHS_SUFFIX)[0] in self.feats}

    def read_shard(self, file: tf.Tensor, pattern: tf.Tensor,
                   records: tf.Tensor) -> tf.data.Dataset:
        """The records of one shard, their count checked against the manifest's at its
        end (``TFRecordDataset`` stops quietly at a damaged record). A missing file is
        not opened: ``ignore_errors`` would retry it for ever. (Its existence is asked of
        ``tf.io.matching_files``, not Python: a Python call in a pipeline still running
        when the interpreter exits can hang the exit.)"""
        exists = tf.size(tf.io.matching_files(pattern)) > 0
        names = tf.data.Dataset.from_tensors(file).filter(lambda _: exists)
        raw = tf.data.TFRecordDataset(names, compression_type=self.compression
                                      ).ignore_errors()       # _READ_BUFFER: the default
        end = tf.data.Dataset.from_tensors((tf.constant(b""), True))
        marked = raw.map(lambda r: (r, False)).concatenate(end)

        def count(n: tf.Tensor, item: tuple) -> tuple:
            record, is_end = item
            ok = tf.logical_or(tf.logical_not(is_end), tf.equal(n, records))
            with tf.control_dependencies([self._check_count(ok, file, n, records, exists)]):
                return n + 1, (record, is_end)

        return (marked.scan(tf.constant(0, tf.int64), count)
                .filter(lambda r, is_end: tf.logical_not(is_end)).map(lambda r, is_end: r))

    def _check_count(self, ok: tf.Tensor, file: tf.Tensor, n: tf.Tensor,
                     records: tf.Tensor, exists: tf.Tensor) -> tf.Tensor:
        """An assertion that the shard was read to its end, whose text is memfit's
        message (``on_corrupt="raise"``), or a warning when it was not (``"skip"``)."""
        if self.on_corrupt == "raise":
            def message() -> tf.Tensor:
                if self.compression:
                    # TensorFlow decompresses in chunks and loses the one that holds the
                    # damage: n is where reading stopped, not the damaged record.
                    n_, of = tf.strings.as_string(n), tf.strings.as_string(records)
                    damage = tf.strings.join([
                        ": its records from ", n_, " on, of ", of, ", cannot be read (bad "
                        "CRC32C, damaged ", self.compression, " data or cut short, at "
                        "record ", n_, " or after it: a compressed shard is decompressed "
                        "in chunks, and the chunk holding the damage is lost). "])
                else:
                    damage = tf.strings.join([
                        ": record ", tf.strings.as_string(n), " of ",
                        tf.strings.as_string(records), " cannot be read (bad CRC32C or cut "
                        "short). "])
                gone = tf.strings.join([": record ", tf.strings.as_string(n), " of ",
                                        tf.strings.as_string(records), " cannot be read "
                                        "(the file is gone). "])
                return tf.strings.join([
                    "memfit: shard ", file, " is ",
                    tf.where(exists, "corrupt or truncated", "missing"),
                    tf.where(exists, damage, gone), what_to_do(self.where)])

            return assert_clean(tf.cond(ok, lambda: tf.constant(""), message))
        return tf.cond(ok, lambda: tf.constant(True), lambda: tf.numpy_function(
            self._warn, [file, n, records, exists], tf.bool, stateful=True))

    def _warn(self, file: bytes, n: np.int64, records: np.int64, exists: bool) -> np.bool_:
        """Prints the skip warning of a shard once for the whole run (each epoch reads the
        same damage again)."""
        with self._warn_lock:
            if file in self._warned:
                return np.True_
            self._warned.add(file)
        name = file.decode("utf-8", "replace")
        if exists:
            message = (f"memfit: WARNING: skipped {int(records - n):,} unreadable records of "
                       f"shard {name} from record {int(n)} on (damaged or truncated).")
        else:
            message = (f"memfit: WARNING: skipped shard {name}: the file is missing; its "
                       f"{int(records):,} records are left out.")
        warn_skipped(message)
        return np.True_

    def decode(self, seed_e: tf.Tensor, index: tf.Tensor, records: tf.Tensor) -> dict:
        """A window of records parsed and decoded, its samples permuted by
        ``(seed, e, window)`` when shuffling (encoded images: one string a sample)."""
        parsed = tf.io.parse_example(records, self.spec)
        out = {}
        for name, f in self.feats.items():
            if f.decode is not None:
                out[name] = _encoded_samples(parsed[name], parsed[name + LENGTHS_SUFFIX])
                continue
            values = tf.reshape(_decode_values(parsed[name], f.dtype, f.variable),
                                [-1, *f.inner_shape])
            if f.variable:
                lengths = parsed[name + LENGTHS_SUFFIX].values
                values = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
            out[name] = values
        if self.plan.shuffle:
            n = tf.shape(out[next(iter(self.feats))], out_type=tf.int64)[0]
            perm = tf.random.experimental.stateless_shuffle(
                tf.range(n), seed=tf.random.experimental.stateless_fold_in(seed_e, index))
            out = {k: tf.gather(v, perm) for k, v in out.items()}
        return out

    def one_epoch(self, e: tf.Tensor) -> tf.data.Dataset:
        """The batches of epoch ``e``."""
        plan, seed = self.plan, self.plan.seed
        seed_e = stateless_seed(seed, e)
        order = tf.range(self.shard_count, dtype=tf.int64)
        if plan.shuffle:
            order = tf.random.experimental.stateless_shuffle(order, seed=seed_e)
        listing = tf.data.Dataset.from_tensor_slices((tf.gather(self.files, order),
                                                      tf.gather(self.patterns, order),
                                                      tf.gather(self.expected, order)))
        if plan.shuffle:
            records = listing.interleave(self.read_shard, cycle_length=plan.cycle_length,
                                         block_length=1,
                                         num_parallel_calls=plan.read_threads,
                                         deterministic=True)
        else:
            records = listing.flat_map(self.read_shard)
        windows = records.batch(plan.window_records).enumerate()
        decoded = windows.map(lambda i, r: self.decode(stateless_seed(seed, e, 1), i, r),
                              num_parallel_calls=plan.parallel_windows, deterministic=True)
        images = {n: f.decode for n, f in self.feats.items() if f.decode is not None}
        if not images:
            return decoded.rebatch(plan.batch_size, drop_remainder=self.drop_remainder)

        def decode_images(sample: dict) -> dict:
            return {n: _decode_image(v, images[n]) if n in images else v
                    for n, v in sample.items()}

        return (decoded.unbatch()
                .map(decode_images, num_parallel_calls=plan.decode_calls, deterministic=True)
                .batch(plan.batch_size, drop_remainder=self.drop_remainder))


def build(manifest: Manifest, shards: Sequence[Shard], plan: DatasetPlan,
          features: Sequence[str] | None, *, on_corrupt: str, drop_remainder: bool,
          sharded: bool) -> tf.data.Dataset:
    """The pipeline over ``tf.data.TFRecordDataset`` (see the module docstring).

    Args:
        manifest: the dataset; shards: the shards read (a worker's share).
        plan: the plan of :func:`plan_tf`.
        features: ``None`` for dict elements, else the names for tuple elements (one name:
            the tensor alone).
        on_corrupt: ``"raise"`` or ``"skip"``.
        drop_remainder: drop the last, smaller batch of each epoch.
        sharded: sharded by hand (tf.distribute must not shard again).
    """
    spend_tfrecord_reader_line()        # TFRecordDataset's info line, where it is dropped
    steps = _Steps(manifest, shards, plan, features, on_corrupt=on_corrupt,
                   drop_remainder=drop_remainder)
    epoch_ds, counter = epochs_dataset(plan.epoch, plan.epochs)
    ds = epoch_ds.flat_map(steps.one_epoch)
    if features is not None:
        names = tuple(features)
        ds = ds.map(lambda d: tuple(d[n] for n in names) if len(names) > 1 else d[names[0]])
    # Skipping damaged records leaves fewer batches than planned: no cardinality then.
    return finish(ds, plan, counter, sharded=sharded, check_cardinality=on_corrupt == "raise")
