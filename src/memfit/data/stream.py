"""``memfit.dataset``: stream a packed dataset as a ``tf.data.Dataset`` under a byte budget.

Two readers, one order model. Shards of fixed-shape features, uncompressed (what
``memfit.pack`` writes by default), are read by memfit's block reader
(:mod:`memfit.data.blocks`), for epoch ``e``::

    shard files, permuted by (seed, e), read `cycle_length` at a time round-robin
      → the record sequence, cut into windows of a whole number of batches
      → windows built ahead, in order, on `parallel_windows` threads (permute the
        window's samples by (seed, e, window); read each record through a staging buffer
        that stays in the CPU cache, check its CRC32C there and copy every sample
        straight into its row of the aligned batches, in memfit's C loop; check frame
        headers and tags), into the next epoch's first windows
      → a sequential .map(numpy_function: hand over the next window)
      → rebatch to `batch_size` → prefetch

Anything else (variable-shape features, GZIP/ZLIB shards, ``reader="tf"``) is read by
``tf.data``'s own TFRecord reader::

    shard files, permuted by (seed, e)
      → interleave: read `cycle_length` shards at once (CRC32C checked per record)
      → batch `window_records` records (the shuffle window)
      → parse the window in one `tf.io.parse_example` + `tf.io.decode_raw` per feature
      → permute the window's samples by (seed, e, window)
      → rebatch to `batch_size` → prefetch

``memory_budget`` decides the window, the read parallelism and the prefetch depth from the
record sizes in the manifest (print ``ds.memfit_plan`` to see them, and which reader).
Nothing in the pipeline grows with the number of samples (the block reader keeps 16 bytes
per record of the epoch's record sequence), so peak memory does not grow with the data.

The order is a pure function of ``(seed, epoch)``: every random choice uses stateless
ops seeded from them, so ``dataset(..., epoch=k)`` yields exactly the batches of epoch
``k`` of an uninterrupted run. Each new pass over the returned dataset (Keras starts one
per epoch) moves to the next epoch; with ``epochs=N`` one pass runs all epochs from
``epoch`` to ``N - 1`` (use ``steps_per_epoch=ds.memfit_plan.steps_per_epoch``).

``.npy`` sources (dicts of paths, directories of ``.npy`` files, ``format="arrays"``
packs) are dispatched to :mod:`memfit.data.arrays` (memory-mapped, a true global shuffle).

Example:
    >>> ds = memfit.dataset("data/train", batch_size=256, features=("x", "y"),
    ...                     memory_budget="256MiB")                    # doctest: +SKIP
    >>> print(ds.memfit_plan)                                          # doctest: +SKIP
    >>> model.fit(ds, epochs=10)                                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf

from memfit.data import arrays, blocks
from memfit.data.manifest import Manifest, Shard
from memfit.data.pipeline import (
    check_arguments,
    check_features,
    check_seed,
    epochs_dataset,
    finish,
    settle_plan,
)
from memfit.data.records import LENGTHS_SUFFIX
from memfit.errors import CorruptShardError, DatasetError
from memfit.quiet import ignore_keras_shuffle_warning
from memfit.sizes import format_size, parse_size

__all__ = ["dataset", "DatasetPlan", "plan_dataset"]

log = logging.getLogger("memfit")

# Bytes of a window alive at once while it is parsed and permuted: the record strings,
# the parsed strings, the joined/decoded values and the permuted copy.
_WINDOW_COPIES = 4
_READ_BUFFER = 256 * 1024
_MAX_CYCLE = 16                 # shards read at once
_WINDOW_CAP = 8 * 2**20         # bytes of decoded samples in one shuffle window
_MAX_PREFETCH = 4               # batches: the model, not the reader, is usually the bottleneck
_MAX_BUILDERS = 4               # windows the block reader builds at once
_BLOCK_WINDOW_CAP = 16 * 2**20  # bytes read for one window of the block reader (measured:
#                               16 MiB ran 1.2x faster than 8 MiB, 32 MiB 1.1x faster again)
_EPOCHS_KEPT = 2                # record sequences the block reader keeps (16 bytes a record)
# decode_raw has no unsigned 32/64-bit output: decode the signed type and reinterpret.
_DECODE_AS = {tf.uint32: tf.int32, tf.uint64: tf.int64}


@dataclasses.dataclass(frozen=True)
class DatasetPlan:
    """What ``memfit.dataset`` chose from the budget, and what it will yield.

    Attributes:
        path: the dataset directory; split: the split read.
        batch_size: samples per batch; steps_per_epoch: batches per epoch.
        samples: samples per epoch (of this shard, when sharded).
        memory_budget: the byte budget asked for; estimated_bytes: what the plan needs.
        window_records / window_samples: the shuffle window, in records and samples.
        cycle_length: shards read at once, by ``read_threads`` threads.
        parallel_windows: windows decoded at once.
        prefetch_batches: batches prepared ahead of the model.
        seed, epoch, epochs: the order's seed, the first epoch, the epoch count (or None).
        arena_limit: glibc malloc arenas the process is capped at (``None``: not capped).
        reader: ``"blocks"`` (memfit's block reader: windows of whole batches built by
            ``parallel_windows`` threads) or ``"tf"`` (``tf.data.TFRecordDataset``).
        reader_note: why the TF reader was chosen, when it was not asked for; with the
            block reader, how samples reach their batch rows
            (:func:`memfit.data.blocks.reads_into_batches`).
    """

    path: str
    split: str
    batch_size: int
    samples: int
    steps_per_epoch: int
    memory_budget: int
    estimated_bytes: int
    window_records: int
    window_samples: int
    cycle_length: int
    read_threads: int
    parallel_windows: int
    prefetch_batches: int
    seed: int
    epoch: int
    epochs: int | None
    shuffle: bool
    arena_limit: int | None = None
    reader: str = "tf"
    reader_note: str = ""

    def __str__(self) -> str:
        if self.reader == "blocks":
            batches = self.window_samples // self.batch_size
            order = (f"shuffle window {self.window_samples:,} samples ({batches} batches) over "
                     f"{self.cycle_length} shards read round-robin" if self.shuffle
                     else "stored order")
            return (f"memfit.dataset {self.path} [{self.split}]: budget "
                    f"{format_size(self.memory_budget)} → {order}; memfit's block reader "
                    f"({self.reader_note}, CRC32C checked, windows of "
                    f"{self.window_samples:,} samples), "
                    f"{self.parallel_windows} windows built ahead, prefetch "
                    f"{self.prefetch_batches} batches; about {format_size(self.estimated_bytes)} "
                    f"in flight. {self.samples:,} samples → {self.steps_per_epoch} steps/epoch of "
                    f"{self.batch_size}; seed={self.seed}, starting at epoch {self.epoch}."
                    + (f" glibc malloc arenas capped at {self.arena_limit}."
                       if self.arena_limit else ""))
        order = (f"shuffle window {self.window_records} records ({self.window_samples:,} "
                 f"samples)" if self.shuffle else "stored order")
        note = f" (tf.data's TFRecord reader: {self.reader_note})" if self.reader_note else ""
        return (f"memfit.dataset {self.path} [{self.split}]{note}: budget "
                f"{format_size(self.memory_budget)} → {order}, {self.cycle_length} shards read "
                f"at once by {self.read_threads} threads, {self.parallel_windows} windows "
                f"decoded in parallel, prefetch {self.prefetch_batches} batches; about "
                f"{format_size(self.estimated_bytes)} in flight. {self.samples:,} samples → "
                f"{self.steps_per_epoch} steps/epoch of {self.batch_size}; seed={self.seed}, "
                f"starting at epoch {self.epoch}."
                + (f" glibc malloc arenas capped at {self.arena_limit}."
                   if self.arena_limit else ""))


def plan_dataset(manifest: Manifest, split: str, batch_size: int, budget: int, *,
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
    batch_bytes = sample_bytes * batch_size
    cycle = max(1, min(files, _MAX_CYCLE)) if shuffle else 1
    readers = cycle * (_READ_BUFFER + 2 * record_bytes)
    parallel = max(1, min(2, cores))
    need_min = readers + _WINDOW_COPIES * record_bytes * (parallel + 1) + 2 * batch_bytes
    if budget < need_min:
        raise DatasetError(
            f"memory_budget={format_size(budget)} is too small to stream batches of "
            f"{batch_size} samples of {format_size(sample_bytes)} (records of {k} samples): it "
            f"needs at least {format_size(need_min)}. Raise memory_budget or lower batch_size. "
            f"Received: memory_budget={budget}")
    spare = budget - readers - 2 * batch_bytes
    window_bytes = min(spare / (_WINDOW_COPIES * (parallel + 1)),
                       max(_WINDOW_CAP, 2 * batch_bytes))
    window_records = int(max(1, min(window_bytes // record_bytes, manifest.split(split).records)))
    if not shuffle:
        window_records = max(1, min(window_records, math.ceil(batch_size / k)))
    in_windows = _WINDOW_COPIES * record_bytes * window_records * (parallel + 1)
    prefetch = int(max(1, min(_MAX_PREFETCH, (spare - in_windows) // max(batch_bytes, 1))))
    estimated = readers + in_windows + (prefetch + 1) * batch_bytes
    steps = samples // batch_size if drop_remainder else math.ceil(samples / batch_size)
    return DatasetPlan(path=str(manifest.path), split=split, batch_size=batch_size,
                       samples=samples, steps_per_epoch=steps, memory_budget=budget,
                       estimated_bytes=int(estimated), window_records=window_records,
                       window_samples=window_records * k, cycle_length=cycle,
                       read_threads=min(cycle, cores), parallel_windows=parallel,
                       prefetch_batches=prefetch, seed=seed, epoch=epoch, epochs=epochs,
                       shuffle=shuffle)


def _outputs_alive(parallel: int, prefetch: int, batch_size: int, window: int) -> int:
    """Window outputs alive at once: built ahead by the feeder (``parallel``), the one
    being rebatched, and those whose batches the prefetch buffer and the consumer still
    hold (two windows when the prefetched batches fit in one window; one more for every
    window's worth of prefetched batches)."""
    return parallel + 3 + (prefetch * batch_size) // window


def plan_blocks(manifest: Manifest, split: str, batch_size: int, budget: int, *,
                names: Sequence[str], shards: Sequence[Shard], shuffle: bool, samples: int,
                drop_remainder: bool, seed: int, epoch: int,
                epochs: int | None) -> DatasetPlan:
    """The block reader's window, parallelism and prefetch depth from a byte budget.

    A window (a whole number of batches) is read into its batches of the requested
    features, with scratch for what the CRC covers but the window does not return: the
    features not asked for, and the samples of its first and last records that lie
    outside it (without memfit's C extension: every feature read into scratch buffers,
    then gathered into batches);
    ``parallel_windows`` windows are built at once, and the batches handed on keep their
    window's output alive until consumed. The window aims at ``_BLOCK_WINDOW_CAP`` bytes read
    and at least two records of each of the ``cycle_length`` shards read round-robin;
    a small budget shrinks the window first, then prefetch, then parallelism, and one
    that cannot hold a one-batch window is refused with the minimum it needs.

    Args:
        manifest: the dataset; split: the split read; batch_size: samples per batch.
        budget: the byte budget.
        names: the features returned; shards: the shards read (a worker's share).
        shuffle, samples, drop_remainder, seed, epoch, epochs: as for :func:`dataset`.
    """
    cores = os.cpu_count() or 1
    k = manifest.samples_per_record
    read_bytes = sum(int(f.sample_bytes or 0) + blocks.SAMPLE_OVERHEAD
                     for f in manifest.features.values())
    out_bytes = max(1, sum(int(manifest.features[n].sample_bytes or 0) for n in names))
    direct = blocks.reads_into_batches([manifest.features[n].dtype for n in names])
    # Scratch per sample read: every feature when gathering; with samples read straight
    # into their batch rows only the features not returned (the requested ones keep two
    # records' worth, for the samples of the window's first and last records outside it).
    kept = out_bytes if direct else 0
    cycle = max(1, min(len(shards), _MAX_CYCLE)) if shuffle else 1
    records = sum(s.records for s in shards)
    index = _EPOCHS_KEPT * 16 * (records + 1)
    full = blocks.record_layout(list(manifest.features.values()), k)
    overhead = blocks.RECORD_OVERHEAD + len(full.skeleton)

    def need(m: int, parallel: int, prefetch: int) -> int:
        size = m * batch_size
        read = ((size + 2 * k) * (read_bytes - kept) + 2 * k * kept
                + (math.ceil(size / k) + 2) * overhead
                + full.frame_bytes)                      # + the C loop's staging record
        out = size * out_bytes
        alive = _outputs_alive(parallel, prefetch, batch_size, size)
        return index + parallel * read + alive * out

    target = max(_BLOCK_WINDOW_CAP // max(read_bytes, 1), 2 * cycle * k, batch_size)
    m = math.ceil(target / batch_size)
    parallel = max(1, min(_MAX_BUILDERS, cores))
    prefetch = _MAX_PREFETCH
    while need(m, parallel, prefetch) > budget:
        if m > 1:
            m = max(1, m // 2)
        elif prefetch > 1:
            prefetch -= 1
        elif parallel > 1:
            parallel -= 1
        else:
            raise DatasetError(
                f"memory_budget={format_size(budget)} is too small to stream batches of "
                f"{batch_size} samples of {format_size(read_bytes)} (records of {k} samples): "
                f"it needs at least {format_size(need(1, 1, 1))}. Raise memory_budget or "
                f"lower batch_size. Received: memory_budget={budget}")
    steps = samples // batch_size if drop_remainder else math.ceil(samples / batch_size)
    window = m * batch_size
    return DatasetPlan(path=str(manifest.path), split=split, batch_size=batch_size,
                       samples=samples, steps_per_epoch=steps, memory_budget=budget,
                       estimated_bytes=int(need(m, parallel, prefetch)),
                       window_records=math.ceil(window / k), window_samples=window,
                       cycle_length=cycle, read_threads=parallel, parallel_windows=parallel,
                       prefetch_batches=prefetch, seed=seed, epoch=epoch, epochs=epochs,
                       shuffle=shuffle, reader="blocks",
                       reader_note="each sample read straight into its batch row" if direct
                       else "records read into reused buffers, their samples then gathered "
                            "into batches: memfit's C extension memfit.data.cwindow is not built")


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


def _seed(seed: int, *data: tf.Tensor | int) -> tf.Tensor:
    """A stateless seed pair derived from ``seed`` and the given integers."""
    s = tf.constant([seed & 0x7FFFFFFF, 0x6D656D66], tf.int64)   # "memf"
    for d in data:
        s = tf.random.experimental.stateless_fold_in(s, tf.cast(d, tf.int64))
    return s


def dataset(path: str | os.PathLike | Mapping[str, Any], batch_size: int, *,
            split: str | None = None, features: Sequence[str] | None = None,
            memory_budget: str | int = "256MiB", seed: int | None = None, epoch: int = 0,
            epochs: int | None = None, shuffle: bool = True, drop_remainder: bool = False,
            on_corrupt: str = "raise", shard: tuple[int, int] | None = None,
            input_context: tf.distribute.InputContext | None = None,
            cap_arenas: bool = True, indices: Any = None,
            cache: str | None = None, reader: str = "auto") -> tf.data.Dataset:
    """Streams a packed dataset (or ``.npy`` arrays) as a ``tf.data.Dataset`` for
    ``model.fit``.

    Shards of fixed-shape features without compression are read by memfit's block reader
    (:mod:`memfit.data.blocks`: each sample read straight into its batch row); others
    by ``tf.data``'s TFRecord reader. Both give every sample once
    per epoch in an order that is a pure function of ``(seed, epoch)``.

    ``.npy`` sources (a dict of feature name → ``.npy`` path, a directory of ``.npy``
    files, one ``.npy`` file, or a directory written by ``memfit.pack(...,
    format="arrays")``) are read by :func:`memfit.data.arrays.dataset`: memory-mapped,
    a global permutation per epoch, batches gathered with sorted reads; the arguments
    mean the same there (see it for ``indices`` and ``cache``).

    Example:
        >>> ds = memfit.dataset("data/train", 128, features=("x", "y"))  # doctest: +SKIP
        >>> val = memfit.dataset("data/train", 128, split="val", features=("x", "y"),
        ...                      shuffle=False)                          # doctest: +SKIP
        >>> model.fit(ds, validation_data=val, epochs=5)                 # doctest: +SKIP
        >>> ds = memfit.dataset({"x": "x.npy", "y": "y.npy"}, 128,
        ...                     features=("x", "y"))                     # doctest: +SKIP

    Args:
        path: the directory ``memfit.pack`` wrote, or a ``.npy`` source (above).
        batch_size: samples per batch (per replica, with ``input_context``).
        split: the split to read; may be omitted when there is only one.
        features: ``None`` yields dicts of all features; a sequence of names yields tuples
            in that order, e.g. ``("x", "y")`` for Keras.
        memory_budget: bytes the pipeline may hold (``"256MiB"``, ``2**28``...): it sets
            the shuffle window, read parallelism and prefetch depth.
        seed: the order's seed; defaults to the seed the dataset was packed with.
        epoch: the epoch the first pass yields (to resume a run at epoch ``epoch``).
        epochs: ``None``: each pass is one epoch, the next pass the next epoch. An int:
            one pass yields epochs ``epoch .. epochs - 1`` back to back (pair it with
            ``steps_per_epoch=ds.memfit_plan.steps_per_epoch``).
        shuffle: ``False`` reads samples in stored order (for evaluation).
        drop_remainder: drop the last, smaller batch of each epoch.
        on_corrupt: ``"raise"``: a damaged or truncated shard stops with an error naming
            the file and the record; ``"skip"``: unreadable records are skipped with a
            warning that counts them (the block reader skips only the damaged records and
            those past a truncation; the TF reader the rest of the shard). Batches may then
            be fewer or smaller, and the dataset's cardinality is not asserted.
        shard: ``(index, count)``: read only every ``count``-th shard file from ``index``
            (one worker of several).
        input_context: from ``strategy.distribute_datasets_from_function``; sets ``shard``
            from the input pipeline id.
        cap_arenas: cap glibc's malloc arenas at one per core for the whole process
            (:func:`memfit.memory.allocator.limit_arenas`). tf.data starts new threads for
            every pass, and each new thread may get an arena that keeps its freed
            buffers: without the cap, a Keras training grew by ~15 MiB an epoch for its
            first ~10 epochs (flat with it). No-op outside glibc.
        indices: ``.npy`` sources only: the samples to read (e.g. a train/validation part).
        cache: ``.npy`` sources only: ``"ram"`` loads the samples into memory first.
        reader: ``"auto"``: the block reader where it applies, else the TF reader;
            ``"tf"``: always ``tf.data.TFRecordDataset`` + ``tf.io.parse_example``;
            ``"blocks"``: the block reader, or an error saying why it cannot apply.

    Returns:
        A ``tf.data.Dataset``; its ``memfit_plan`` attribute is the :class:`DatasetPlan`
        (an :class:`~memfit.data.arrays.ArraysPlan` for ``.npy`` sources).
    """
    # Shuffled by construction: Keras's "`shuffle=True` ... will be ignored" is noise here.
    ignore_keras_shuffle_warning()
    if arrays.is_arrays_source(path):
        return arrays.dataset(
            path, batch_size, split=split, features=features, memory_budget=memory_budget,
            seed=seed, epoch=epoch, epochs=epochs, shuffle=shuffle,
            drop_remainder=drop_remainder, on_corrupt=on_corrupt, shard=shard,
            input_context=input_context, cap_arenas=cap_arenas, indices=indices, cache=cache)
    if reader not in ("auto", "tf", "blocks"):
        raise ValueError(f"reader must be 'auto', 'tf' or 'blocks'. Received: reader={reader!r}")
    if indices is not None or cache is not None:
        raise ValueError(f"indices= and cache= apply to .npy sources (memory-mapped arrays); "
                         f"{path} holds TFRecord shards: choose samples with split=... at "
                         f"pack time. Received: indices={'...' if indices is not None else None}"
                         f", cache={cache!r}")
    manifest = Manifest.load(path)
    sp = manifest.split(split)
    check_arguments(batch_size=batch_size, on_corrupt=on_corrupt, epoch=epoch, epochs=epochs)
    features = check_features(features, manifest.features, path)
    seed = check_seed(manifest.seed if seed is None else seed)
    if input_context is not None:
        shard = (input_context.input_pipeline_id, input_context.num_input_pipelines)
    shards = list(sp.shards)
    if shard is not None:
        index, count = shard
        if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
            raise ValueError(f"shard must be (index, count) with 0 <= index < count. "
                             f"Received: shard={shard!r}")
        if count > len(shards):
            raise ValueError(f"Cannot shard {len(shards)} shard files {count} ways; repack with "
                             f"shards={count} or more. Received: shard={shard!r}")
        shards = shards[index::count]
    shards = _present(manifest, shards, on_corrupt)
    samples = sum(s.samples for s in shards)
    budget = parse_size(memory_budget, name="memory_budget")
    names = tuple(features) if features is not None else tuple(manifest.features)
    why = "reader='tf' was asked for" if reader == "tf" else blocks.why_not(manifest, shards)
    if reader == "blocks" and why is not None:
        raise ValueError(f"The block reader cannot read {path}: {why}. Use reader='auto' or "
                         f"'tf'. Received: reader='blocks'")
    if why is None:
        plan = plan_blocks(manifest, sp.name, batch_size, budget, names=names, shards=shards,
                           shuffle=shuffle, samples=samples, drop_remainder=drop_remainder,
                           seed=seed, epoch=epoch, epochs=epochs)
    else:
        plan = plan_dataset(manifest, sp.name, batch_size, budget, shuffle=shuffle,
                            samples=samples, drop_remainder=drop_remainder, seed=seed,
                            epoch=epoch, epochs=epochs, files=len(shards))
        if reader == "auto":
            plan = dataclasses.replace(plan, reader_note=why)
    plan = settle_plan(plan, batch_size=batch_size, samples=samples,
                       cap_arenas=cap_arenas, log=log)
    if plan.reader == "blocks":
        block_reader = blocks.BlockReader(
            manifest, shards, names, seed=seed, shuffle=shuffle, cycle=plan.cycle_length,
            window=plan.window_samples, batch_size=batch_size,
            samples=plan.steps_per_epoch * batch_size if drop_remainder else samples,
            on_corrupt=on_corrupt, builders=plan.parallel_windows, outputs_alive=_outputs_alive(
                plan.parallel_windows, plan.prefetch_batches, batch_size, plan.window_samples))
        return blocks.build(block_reader, plan, features, drop_remainder=drop_remainder,
                            sharded=shard is not None)
    return _tf_pipeline(manifest, shards, plan, features, on_corrupt=on_corrupt,
                        drop_remainder=drop_remainder, sharded=shard is not None)


def _present(manifest: Manifest, shards: list[Shard], on_corrupt: str) -> list[Shard]:
    """The shards whose files exist. A missing one is an error naming it, or, with
    ``on_corrupt="skip"``, left out with one warning that names it and counts its samples
    (TensorFlow's reader would retry a missing file for ever)."""
    base = manifest.path or Path(".")
    missing = [s for s in shards if not (base / s.file).is_file()]
    if not missing:
        return shards
    first = base / missing[0].file
    if on_corrupt == "raise":
        raise CorruptShardError(
            f"memfit: shard {first} is missing ({len(missing)} of {len(shards)} shard files "
            f"are). Restore it, or repack; `memfit verify {base}` lists the damage; pass "
            f"on_corrupt='skip' to read the other shards.", str(first))
    kept = [s for s in shards if s not in missing]
    if not kept:
        raise CorruptShardError(f"memfit: every shard file of this split is missing, e.g. "
                                f"{first}; nothing to read. Restore them, or repack.",
                                str(first))
    for s in missing:
        print(f"memfit: WARNING: skipped shard {base / s.file}: the file is missing; its "
              f"{s.samples:,} samples ({s.records:,} records) are left out.",
              file=sys.stderr, flush=True)
    return kept


def _tf_pipeline(manifest: Manifest, shards: Sequence[Shard], plan: DatasetPlan,
                 features: Sequence[str] | None, *, on_corrupt: str, drop_remainder: bool,
                 sharded: bool) -> tf.data.Dataset:
    """The pipeline over ``tf.data.TFRecordDataset`` (see the module docstring)."""
    seed, batch_size, shuffle = plan.seed, plan.batch_size, plan.shuffle
    base = manifest.path
    files = tf.constant([str(base / s.file) for s in shards])
    expected = tf.constant([s.records for s in shards], tf.int64)
    compression = manifest.compression or ""
    # Only the features asked for are parsed and decoded.
    feats = {n: manifest.features[n] for n in (features or manifest.features)}
    spec = {k: v for k, v in manifest.tf_feature_spec().items()
            if k.split(LENGTHS_SUFFIX)[0] in feats}

    def read_shard(file: tf.Tensor, records: tf.Tensor) -> tf.data.Dataset:
        raw = tf.data.TFRecordDataset(file, compression_type=compression,
                                      buffer_size=_READ_BUFFER).ignore_errors()
        end = tf.data.Dataset.from_tensors((tf.constant(b""), True))
        marked = raw.map(lambda r: (r, False)).concatenate(end)

        def count(n: tf.Tensor, item: tuple) -> tuple:
            record, is_end = item
            ok = tf.logical_or(tf.logical_not(is_end), tf.equal(n, records))
            if on_corrupt == "raise":
                check = tf.debugging.Assert(ok, [
                    "memfit: shard", file, "is corrupt or truncated: record", n, "of", records,
                    "cannot be read (bad CRC32C or cut short). Run `memfit verify` on the "
                    "dataset; pass on_corrupt='skip' to read past damaged shards."])
            else:
                check = tf.cond(ok, tf.no_op, lambda: tf.print(
                    "memfit: WARNING: skipped", records - n, "unreadable records of shard",
                    file, "from record", n, "on (damaged or truncated).", output_stream=sys.stderr))
            with tf.control_dependencies([check]):
                return n + 1, (record, is_end)

        return (marked.scan(tf.constant(0, tf.int64), count)
                .filter(lambda r, is_end: tf.logical_not(is_end)).map(lambda r, is_end: r))

    def decode(seed_e: tf.Tensor, index: tf.Tensor, records: tf.Tensor) -> dict:
        parsed = tf.io.parse_example(records, spec)
        out = {}
        for name, f in feats.items():
            values = tf.reshape(_decode_values(parsed[name], f.dtype, f.variable),
                                [-1, *f.inner_shape])
            if f.variable:
                lengths = parsed[name + LENGTHS_SUFFIX].values
                values = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
            out[name] = values
        if shuffle:
            n = tf.shape(out[next(iter(feats))], out_type=tf.int64)[0]
            perm = tf.random.experimental.stateless_shuffle(
                tf.range(n), seed=tf.random.experimental.stateless_fold_in(seed_e, index))
            out = {k: tf.gather(v, perm) for k, v in out.items()}
        return out

    def one_epoch(e: tf.Tensor) -> tf.data.Dataset:
        seed_e = _seed(seed, e)
        order = tf.range(len(shards), dtype=tf.int64)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(order, seed=seed_e)
        listing = tf.data.Dataset.from_tensor_slices((tf.gather(files, order),
                                                      tf.gather(expected, order)))
        if shuffle:
            records = listing.interleave(read_shard, cycle_length=plan.cycle_length,
                                         block_length=1,
                                         num_parallel_calls=plan.read_threads,
                                         deterministic=True)
        else:
            records = listing.flat_map(read_shard)
        windows = records.batch(plan.window_records).enumerate()
        decoded = windows.map(lambda i, r: decode(_seed(seed, e, 1), i, r),
                              num_parallel_calls=plan.parallel_windows, deterministic=True)
        return decoded.rebatch(batch_size, drop_remainder=drop_remainder)

    epoch_ds, counter = epochs_dataset(plan.epoch, plan.epochs)
    ds = epoch_ds.flat_map(one_epoch)
    if features is not None:
        names = tuple(features)
        ds = ds.map(lambda d: tuple(d[n] for n in names) if len(names) > 1 else d[names[0]])
    return finish(ds, plan, counter, sharded=sharded)
