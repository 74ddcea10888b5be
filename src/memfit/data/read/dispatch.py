"""``memfit.dataset``: stream a packed dataset as a ``tf.data.Dataset`` under a byte budget.

Two readers, one order model. Shards of fixed-shape features, uncompressed (what
``memfit.pack`` writes by default), are read by memfit's block reader
(:mod:`~memfit.data.read.blocks.block_reader`, planned by
:mod:`~memfit.data.read.blocks.block_plan`); anything else (variable-shape features,
GZIP/ZLIB shards, ``reader="tf"``) by ``tf.data``'s own TFRecord reader
(:mod:`~memfit.data.read.tf_reader`). Each reader's module says how it orders an epoch;
docs/data.md says it for users.

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
packs) are dispatched to :mod:`memfit.data.read.arrays_reader` (memory-mapped, a true global
shuffle). This module is the dispatcher: it checks the arguments, chooses the reader and
its plan (:class:`~memfit.data.read.plan.DatasetPlan`), and builds that reader's pipeline.

On Keras's other backends (``keras.backend.backend() != "tensorflow"``, read without
importing TensorFlow: :func:`memfit.frameworks.keras_backend`) the block reader and the
arrays reader are handed to Keras as a ``keras.utils.PyDataset``
(:mod:`memfit.data.read.feeds`), with the same plan and the same batches, and TensorFlow
is not imported. The TF reader's shards (variable-shape features, GZIP/ZLIB,
``reader="tf"``) are read with ``tf.data`` where TensorFlow is installed; where it is
not, the error says which packing avoids it.

Example:
    >>> ds = memfit.dataset("data/train", batch_size=256, features=("x", "y"),
    ...                     memory_budget="256MiB")                    # doctest: +SKIP
    >>> print(ds.memfit_plan)                                          # doctest: +SKIP
    >>> model.fit(ds, epochs=10)                                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memfit import checks
from memfit.data.format.arrays_format import is_arrays_source
from memfit.data.format.manifest import Manifest, Shard, Split, class_names_of
from memfit.data.read import arrays_reader
from memfit.data.read.arguments import (
    check_arguments,
    check_features,
    check_seed,
    check_shard,
    restructured,
    split_features,
)
from memfit.data.read.blocks.block_layout import why_not
from memfit.data.read.blocks.block_plan import BlockReaderPlan, plan_blocks
from memfit.data.read.blocks.block_reader import BlockReader, build
from memfit.data.read.files.tfrecord_files import is_tfrecord_files
from memfit.data.read.plan import DatasetPlan, settle_plan
from memfit.errors import CorruptShardError, DatasetError, FrameworkMissingError
from memfit.frameworks import TENSORFLOW_EXTRA, keras_backend
from memfit.quiet import ignore_keras_shuffle_warning, import_tensorflow
from memfit.sizes import parse_size

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["dataset"]


def dataset(path: str | os.PathLike | Mapping[str, Any], batch_size: int, *,
            split: str | None = None, features: Any = None,
            memory_budget: str | int = "256MiB", seed: int | None = None, epoch: int = 0,
            epochs: int | None = None, shuffle: bool = True, drop_remainder: bool = False,
            on_corrupt: str = "raise", shard: tuple[int, int] | None = None,
            input_context: tf.distribute.InputContext | None = None,
            cap_arenas: bool = True, indices: Any = None,
            cache: str | None = None, reader: str = "auto") -> tf.data.Dataset:
    """Streams a packed dataset (or ``.npy`` arrays) as a ``tf.data.Dataset`` for
    ``model.fit``.

    Shards of fixed-shape features without compression are read by memfit's block reader
    (:mod:`~memfit.data.read.blocks.block_reader`: each sample read straight into its batch
    row); others by ``tf.data``'s TFRecord reader. Both give every sample once
    per epoch in an order that is a pure function of ``(seed, epoch)``.

    ``.npy`` sources (a dict of feature name → ``.npy`` path, a directory of ``.npy``
    files, one ``.npy`` file, or a directory written by ``memfit.pack(...,
    format="arrays")``) are read by :func:`memfit.data.read.arrays_reader.dataset`: memory-mapped,
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
            in that order, e.g. ``("x", "y")`` for Keras; any nesting of tuples, lists and
            dicts of names yields that structure, e.g. ``({"image": "image", "table":
            "table"}, "price")`` for a model built on a dict of named inputs, or
            ``("x", "x")`` for an autoencoder (:mod:`memfit.data.read.arguments`).
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
            buffers, so memory climbs for the first epochs without the cap (docs/data.md
            measures it). No-op outside glibc.
        indices: ``.npy`` sources only: the samples to read (e.g. a train/validation part).
        cache: ``.npy`` sources only: ``"ram"`` loads the samples into memory first.
        reader: ``"auto"``: the block reader where it applies, else the TF reader;
            ``"tf"``: always ``tf.data.TFRecordDataset`` + ``tf.io.parse_example``;
            ``"blocks"``: the block reader, or an error saying why it cannot apply.

    Returns:
        A ``tf.data.Dataset`` (on Keras's other backends, a ``keras.utils.PyDataset`` of
        the same batches: :class:`~memfit.data.read.feeds.keras_feed.KerasFeed`); its
        ``memfit_plan`` attribute is the :class:`~memfit.data.read.plan.DatasetPlan`
        (an :class:`~memfit.data.read.arrays_reader.ArraysPlan` for ``.npy`` sources).
        A pack of a folder of images also has ``class_names`` (label ``i`` is
        ``class_names[i]``, as on ``keras.utils.image_dataset_from_directory``).

    Raises:
        FrameworkMissingError: on a backend other than TensorFlow, shards only the TF
            reader reads, and TensorFlow not installed.
    """
    names, structure = split_features(features)
    out = restructured(
        _read(path, batch_size, split=split, features=names, memory_budget=memory_budget,
              seed=seed, epoch=epoch, epochs=epochs, shuffle=shuffle,
              drop_remainder=drop_remainder, on_corrupt=on_corrupt, shard=shard,
              input_context=input_context, cap_arenas=cap_arenas, indices=indices,
              cache=cache, reader=reader),
        names, structure)
    classes = class_names_of(path)
    if classes:                 # a folder of images: label i is class_names[i], as Keras
        out.class_names = list(classes)
    return out


def _read(path: Any, batch_size: int, *, split: str | None, features: Any,
          memory_budget: str | int, seed: int | None, epoch: int, epochs: int | None,
          shuffle: bool, drop_remainder: bool, on_corrupt: str,
          shard: tuple[int, int] | None, input_context: Any, cap_arenas: bool,
          indices: Any, cache: str | None, reader: str) -> Any:
    """:func:`dataset` with ``features`` read as plain names (no structure)."""
    # Shuffled by construction: Keras's "`shuffle=True` ... will be ignored" is noise here.
    ignore_keras_shuffle_warning()
    backend = keras_backend()
    if not isinstance(path, str | os.PathLike | Mapping | list | tuple):
        raise DatasetError(f"memfit.dataset's path must be a packed directory, .npy arrays "
                           f"or TFRecord files (a path, a dict of paths, or a list of "
                           f"files). Received: path={path!r} of type {type(path).__name__}")
    if isinstance(path, list | tuple) and not path:
        raise DatasetError("memfit.dataset was given an empty list of files: give TFRecord "
                           "files or globs (['data/path1.tfrecords', ...]), a packed "
                           "directory, or .npy arrays. Received: path=[]")
    if is_arrays_source(path):
        arguments = dict(split=split, features=features, memory_budget=memory_budget,
                         seed=seed, epoch=epoch, epochs=epochs, shuffle=shuffle,
                         drop_remainder=drop_remainder, on_corrupt=on_corrupt, shard=shard,
                         input_context=input_context, cap_arenas=cap_arenas,
                         indices=indices, cache=cache)
        if backend != "tensorflow":         # a keras.utils.PyDataset: no TensorFlow
            from memfit.data.read.feeds.keras_feed import arrays_feed

            return arrays_feed(arrays_reader.open_arrays(path, batch_size, **arguments))
        import_tensorflow()
        return arrays_reader.dataset(path, batch_size, **arguments)
    if is_tfrecord_files(path):
        return _stream_files(path, batch_size, backend, split=split, features=features,
                             memory_budget=memory_budget, seed=seed, epoch=epoch,
                             epochs=epochs, shuffle=shuffle, drop_remainder=drop_remainder,
                             on_corrupt=on_corrupt, shard=shard, input_context=input_context,
                             cap_arenas=cap_arenas, indices=indices, cache=cache,
                             reader=reader)
    checks.choice("reader", reader, ("auto", "tf", "blocks"))
    if indices is not None or cache is not None:
        raise ValueError(f"indices= and cache= apply to .npy sources (memory-mapped arrays); "
                         f"{path} holds TFRecord shards: choose samples with split=... at "
                         f"pack time. Received: indices={'...' if indices is not None else None}"
                         f", cache={cache!r}")
    manifest = Manifest.load(path)
    sp = manifest.split(split)
    batch_size, epoch, epochs = check_arguments(batch_size=batch_size, on_corrupt=on_corrupt,
                                                epoch=epoch, epochs=epochs)
    features = check_features(features, manifest.features, path)
    seed = check_seed(manifest.seed if seed is None else seed)
    shard = check_shard(shard, input_context)
    shards = _present(manifest, _shards_of(sp, shard), on_corrupt)
    samples = sum(s.samples for s in shards)
    budget = parse_size(memory_budget, name="memory_budget", memory=True)
    names = tuple(features) if features is not None else tuple(manifest.features)
    plan = _choose(manifest, sp.name, shards, names, reader, where=path,
                   batch_size=batch_size, budget=budget, shuffle=shuffle, samples=samples,
                   drop_remainder=drop_remainder, seed=seed, epoch=epoch, epochs=epochs,
                   cap_arenas=cap_arenas, backend=backend)
    if isinstance(plan, BlockReaderPlan):
        assert plan.dataset is not None
        reader = BlockReader(manifest, shards, plan, on_corrupt)
        if backend != "tensorflow":         # a keras.utils.PyDataset: no TensorFlow
            from memfit.data.read.feeds.block_feed import block_feed

            return block_feed(reader, plan, features, drop_remainder=drop_remainder)
        import_tensorflow()
        return build(reader, plan.dataset, features, drop_remainder=drop_remainder,
                     sharded=shard is not None)
    from memfit.data.read import tf_reader

    return tf_reader.build(manifest, shards, plan, features, on_corrupt=on_corrupt,
                           drop_remainder=drop_remainder, sharded=shard is not None)


def _stream_files(path: Any, batch_size: int, backend: str, *, split: str | None,
                  indices: Any, cache: str | None, reader: str, **arguments: Any
                  ) -> tf.data.Dataset:
    """TFRecord files read in place (:mod:`memfit.data.read.files`): a ``tf.data``
    pipeline on TensorFlow, a ``keras.utils.PyDataset`` on other backends (plain files
    only); the arguments that apply to packed data or ``.npy`` arrays alone are refused."""
    given = {"split": split, "indices": indices, "cache": cache,
             "reader": None if reader == "auto" else reader}
    wrong = [f"{k}={v!r}" for k, v in given.items() if v is not None]
    if wrong:
        raise ValueError(f"{wrong[0].split('=')[0]}= does not apply to TFRecord files read "
                         f"in place (pack them with `memfit pack --tfrecord` for splits). "
                         f"Received: {', '.join(wrong)}")
    if backend != "tensorflow":         # a keras.utils.PyDataset: no TensorFlow
        from memfit.data.read.feeds.keras_feed import files_feed
        from memfit.data.read.files.files_open import open_in_place

        return files_feed(open_in_place(path, batch_size, **arguments), backend=backend)
    import_tensorflow()
    from memfit.data.read.files.files_reader import stream_files

    return stream_files(path, batch_size, **arguments)


def _shards_of(split: Split, shard: tuple[int, int] | None) -> list[Shard]:
    """The shard files one worker reads: every ``count``-th from ``index``."""
    shards = list(split.shards)
    if shard is None:
        return shards
    index, count = shard
    if count > len(shards):
        raise ValueError(f"Cannot shard {len(shards)} shard files {count} ways; repack with "
                         f"shards={count} or more. Received: shard={shard!r}")
    return shards[index::count]


def _choose(manifest: Manifest, split: str, shards: list[Shard], names: tuple[str, ...],
            reader: str, *, where: Any, batch_size: int, budget: int, shuffle: bool,
            samples: int, drop_remainder: bool, seed: int, epoch: int,
            epochs: int | None, cap_arenas: bool, backend: str) -> BlockReaderPlan | DatasetPlan:
    """The reader (the block reader where it applies, unless ``reader="tf"``) and its
    settled plan; ``reader="blocks"`` where it does not apply is an error saying why, and
    so is the TF reader on another Keras backend where TensorFlow is not installed."""
    why = "reader='tf' was asked for" if reader == "tf" else why_not(manifest, shards)
    if reader == "blocks" and why is not None:
        raise ValueError(f"The block reader cannot read {where}: {why}. Use reader='auto' or "
                         f"'tf'. Received: reader='blocks'")
    order = dict(shuffle=shuffle, samples=samples, drop_remainder=drop_remainder, seed=seed,
                 epoch=epoch, epochs=epochs)
    if why is None:
        return plan_blocks(manifest, split, batch_size, budget, names=names, shards=shards,
                           cap_arenas=cap_arenas, **order)
    if backend != "tensorflow" and importlib.util.find_spec("tensorflow") is None:
        if any(f.decode is not None for f in manifest.features.values()):
            raise FrameworkMissingError(
                f"memfit.dataset: {where} holds images kept encoded, which only tf.data "
                f"decodes, and TensorFlow is not installed (Keras runs on {backend}): pack "
                f"the folder without --keep-encoded (keep_encoded=False), or pip install "
                f"'memfit[{TENSORFLOW_EXTRA}]'")
        raise FrameworkMissingError(
            f"memfit.dataset: {where} needs TensorFlow's TFRecord reader ({why}), and "
            f"TensorFlow is not installed (Keras runs on {backend}): repack it with "
            f"`memfit pack` without --compression and --variable (the block reader needs "
            f"no TensorFlow), or pip install 'memfit[{TENSORFLOW_EXTRA}]'")
    import_tensorflow()         # memfit's doing on another backend: its lines are dropped
    from memfit.data.read import tf_reader

    plan = tf_reader.plan_tf(manifest, split, batch_size, budget, files=len(shards), **order)
    plan = dataclasses.replace(plan, reader_note=why) if reader == "auto" else plan
    return settle_plan(plan, batch_size=batch_size, samples=samples, cap_arenas=cap_arenas)


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
