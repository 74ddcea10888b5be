"""TFRecord files opened for ``memfit.dataset`` in place: the arguments checked, the
files opened (:func:`~memfit.data.read.files.tfrecord_files.open_files`), the features
chosen, the plan the budget buys (:func:`~memfit.data.read.files.files_plan.plan_files`)
and, for plain files, the reader of records by index and the epochs' order
(:mod:`memfit.data.read.files.record_gather`). No TensorFlow: the ``tf.data`` pipeline
(:mod:`memfit.data.read.files.files_reader`) and the Keras feed of other backends
(:func:`memfit.data.read.feeds.keras_feed.files_feed`) both start here.

Example:
    >>> opened = open_in_place("data/path*.tfrecords", 256)         # doctest: +SKIP
    >>> opened.plan.by_record, opened.batches is not None           # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from memfit.data.read.arguments import check_arguments, check_features, check_seed, check_shard
from memfit.data.read.files.files_plan import FilesPlan, plan_files
from memfit.data.read.files.record_gather import EpochOrder, InPlaceBatches, RecordGather
from memfit.data.read.files.tfrecord_files import TFRecordFiles, open_files
from memfit.data.read.plan import settle_plan
from memfit.errors import DatasetError
from memfit.sizes import parse_size

__all__ = ["InPlace", "open_in_place", "pack_command"]


@dataclasses.dataclass(frozen=True)
class InPlace:
    """What :func:`open_in_place` found and chose.

    Attributes:
        files: the files (this worker's, when sharded).
        plan: the settled plan.
        names: the features asked for (``None``: all, as dict batches).
        picked: the features read, in order.
        order: the epochs' order (file order, interleave, windows, their permutations).
        batches: plain files: batch ``(epoch, step)`` read by record; ``None`` when a
            file is compressed (read in sequence by ``tf.data``).
    """

    files: TFRecordFiles
    plan: FilesPlan
    names: tuple[str, ...] | None
    picked: tuple[str, ...]
    order: EpochOrder
    batches: InPlaceBatches | None


def pack_command(files: TFRecordFiles) -> str:
    """The ``memfit pack`` command that packs exactly ``files`` (the first three named).

    Example:
        >>> from pathlib import Path
        >>> f = TFRecordFiles((Path("a.tfrecords"), Path("b.tfrecords")), (None, None),
        ...                   (1, 1), 10, None)                       # doctest: +SKIP
        >>> pack_command(f)                                           # doctest: +SKIP
        "memfit pack --tfrecord 'a.tfrecords' 'b.tfrecords' -o data/train"
    """
    named = " ".join(f"'{p}'" for p in files.files[:3])
    more = f" ... ({len(files.files)} files)" if len(files.files) > 3 else ""
    return f"memfit pack --tfrecord {named}{more} -o data/train"


def open_in_place(path: Any, batch_size: int, *, features: Sequence[str] | None = None,
                  memory_budget: str | int = "256MiB", seed: int | None = None,
                  epoch: int = 0, epochs: int | None = None, shuffle: bool = True,
                  drop_remainder: bool = False, on_corrupt: str = "raise",
                  shard: tuple[int, int] | None = None, input_context: Any = None,
                  cap_arenas: bool = True) -> InPlace:
    """Checks ``memfit.dataset``'s arguments for TFRecord files read in place, opens the
    files and plans the reading (``seed=None`` is 0).

    Args:
        path: a path or glob, or a list of them; the rest as ``memfit.dataset``'s.

    Raises:
        DatasetError: for bad input (see
            :func:`~memfit.data.read.files.tfrecord_files.open_files`), and for features
            that are not fixed-shape numbers (pack those files first).
    """
    batch_size, epoch, epochs = check_arguments(batch_size=batch_size, on_corrupt=on_corrupt,
                                                epoch=epoch, epochs=epochs)
    seed = check_seed(0 if seed is None else seed)
    shard = check_shard(shard, input_context)
    files = open_files(path, on_corrupt=on_corrupt)
    names = check_features(features, files.spec, files.describe())
    # Only the features returned must be fixed-shape numbers: one left out by features=
    # (a string id beside the data) is not read.
    odd = [files.spec[n] for n in (names if names is not None else files.spec)
           if files.spec[n].kind in ("image", "bytes") or None in files.spec[n].shape]
    if odd:
        fixed = [n for n in files.spec if files.spec[n] not in odd]
        leave = (f", or leave it out with features={tuple(fixed)!r}"
                 if fixed and names is None else "")
        raise DatasetError(f"memfit.dataset streams TFRecord files in place when every "
                           f"feature it returns has a fixed shape; feature {odd[0].name!r} "
                           f"is {odd[0]}. Pack the files first: {pack_command(files)}{leave}")
    if shard is not None:
        index, count = shard
        if count > len(files.files):
            raise ValueError(f"Cannot shard {len(files.files)} TFRecord files {count} ways. "
                             f"Received: shard={shard!r}")
        files = files.subset(range(index, len(files.files), count))
    picked = tuple(names) if names is not None else tuple(files.spec)
    sample_bytes = sum(math.prod(files.spec[n].shape) * np.dtype(files.spec[n].dtype).itemsize
                       for n in picked)
    samples = sum(files.records)
    gather = RecordGather(files, picked, on_corrupt) if files.plain else None
    plan = plan_files(files.describe(), samples, files.records, batch_size=batch_size,
                      budget=parse_size(memory_budget, name="memory_budget", memory=True),
                      record_bytes=files.record_bytes, sample_bytes=max(1, sample_bytes),
                      shuffle=shuffle, drop_remainder=drop_remainder, seed=seed,
                      epoch=epoch, epochs=epochs,
                      index_bytes=None if gather is None else
                      gather.index_bytes + EpochOrder.BYTES_PER_RECORD * samples)
    plan = settle_plan(plan, batch_size=batch_size, samples=samples, cap_arenas=cap_arenas)
    order = EpochOrder(files.records, seed=seed, shuffle=shuffle, cycle=plan.cycle_length,
                       window=plan.window_samples, batch_size=batch_size,
                       steps=plan.steps_per_epoch)
    batches = None if gather is None else InPlaceBatches(gather, order)
    return InPlace(files, plan, None if names is None else tuple(names), picked, order,
                   batches)
