"""The arrays reader: ``.npy`` sources read memory-mapped, with a true global shuffle.

``memfit.dataset`` reads ``.npy`` arrays straight from disk when it is given

- a dict of feature name → ``.npy`` path (or in-memory array),
- a directory of ``.npy`` files (one array per feature, the feature name is the file stem),
- one ``.npy`` file, or
- a "memfit-arrays" directory written by ``memfit.pack(..., format="arrays")``
  (``<split>/<feature>.npy`` plus a ``manifest.json`` with dtypes, shapes and sha256:
  :mod:`memfit.data.format.arrays_format`).

(:mod:`memfit.data.read.arrays_input` opens and checks them.)

The pipeline, for epoch ``e``::

    ids = a permutation of all sample indices (or of ``indices=``), by (seed, e)
      → batch s gathered from ids[s*B:(s+1)*B] ahead of time, in order, on
        ``parallel_reads`` threads (feeder.WindowFeeder): sort the batch's ids, np.take
        from the memory-mapped arrays (reads in file order), un-sort to the permuted order
      → a sequential map(tf.numpy_function(next batch)) over (epoch, step) pairs
      → prefetch

A ``.npy`` file cut short after it was opened (rewritten in place while training reads it:
``np.save`` truncates before it writes) would kill the process with SIGBUS at the first
read past its new end. So each batch first checks the size of the mapped files, a
``fstat`` each, and stops with :class:`~memfit.errors.CorruptShardError` naming the file
and the first sample gone instead (:class:`_WholeFiles`). Bytes changed in place cannot be
seen without reading them all: ``memfit verify`` checks a packed arrays directory's
sha256.

The permutation comes from ``numpy.random.Generator(PCG64(SeedSequence([seed, e])))``:
the order is a pure function of ``(seed, epoch)``, so epoch ``k`` asked directly equals
epoch ``k`` of an uninterrupted run. Anonymous memory is the batches in flight (bounded by
``memory_budget``) plus the index arrays (4 or 8 bytes a sample); the arrays themselves are
memory-mapped, so the pages read show as file-backed RSS (page cache the kernel can drop at
any time), not as anonymous memory.

Example:
    >>> ds = memfit.dataset({"x": "x.npy", "y": "y.npy"}, 256, features=("x", "y"),
    ...                     memory_budget="256MiB")                    # doctest: +SKIP
    >>> print(ds.memfit_plan)                                          # doctest: +SKIP
    >>> model.fit(ds, epochs=10)                                       # doctest: +SKIP
"""


from __future__ import annotations

import dataclasses
import math
import mmap
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from memfit.data.read.arguments import check_arguments, check_features, check_seed, check_shard
from memfit.data.read.arrays_input import ArraysInput, check_indices, open_columns, resolve
from memfit.data.read.buffers import BufferPool, RecyclingBuffers, release_pages
from memfit.data.read.feeder import WindowFeeder, fed_dataset, order_rng
from memfit.data.read.pipeline_tail import finish
from memfit.data.read.plan import plan_summary, settle_plan, steps_per_epoch
from memfit.errors import CorruptShardError, DatasetError
from memfit.sizes import format_count, format_size, parse_size

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["ArraysPlan", "ArraysBatches", "dataset", "open_arrays"]

_CHUNK_BYTES = 32 * 2**20       # rows read at once while caching
_MAX_PREFETCH = 4               # batches
_MAX_PARALLEL = 4               # gathers at once
# Copies of a batch alive during one gather: the rows read in sorted order, the batch in
# permuted order, and the tensor TensorFlow makes of it when it cannot share the buffer.
_GATHER_COPIES = 3
_INDEX_COPIES = 4               # the indices, this epoch's ids, the next epoch's, a temporary


@dataclasses.dataclass(frozen=True)
class ArraysPlan:
    """What ``memfit.dataset`` chose for a ``.npy`` source, and what it will yield.

    The sibling of :class:`memfit.data.read.plan.DatasetPlan` (both are a
    :class:`~memfit.data.read.plan.ReaderPlan`) (same ``batch_size``,
    ``samples``, ``steps_per_epoch``, ``memory_budget``, ``estimated_bytes``,
    ``prefetch_batches``, ``seed``, ``epoch``, ``epochs``, ``shuffle``, ``arena_limit``).

    Attributes:
        path: the source (paths or directory); split: the split read, if any.
        features: the features read; sample_bytes: bytes of one sample of them.
        samples: samples per epoch (of this worker, when sharded).
        mapped_bytes: bytes of the arrays mapped (page cache; file-backed RSS).
        index_bytes: anonymous bytes of the index arrays (permutations).
        cache_bytes: anonymous bytes of the arrays held in RAM with ``cache="ram"``.
        parallel_reads: batches gathered ahead, at once; prefetch_batches: batches prepared ahead.
    """

    path: str
    split: str | None
    features: tuple[str, ...]
    batch_size: int
    samples: int
    steps_per_epoch: int
    memory_budget: int
    estimated_bytes: int
    sample_bytes: int
    mapped_bytes: int
    index_bytes: int
    cache_bytes: int
    parallel_reads: int
    prefetch_batches: int
    seed: int
    epoch: int
    epochs: int | None
    shuffle: bool
    cache: str | None = None
    arena_limit: int | None = None

    @property
    def window_samples(self) -> int:
        """The shuffle's reach in samples: the whole epoch (a global permutation)."""
        return self.samples if self.shuffle else 1

    def __str__(self) -> str:
        order = (f"global shuffle of {format_count(self.samples, 'sample')} (a permutation "
                 f"by (seed, epoch))"
                 if self.shuffle else "stored order")
        where = (f"{format_size(self.cache_bytes)} cached in RAM" if self.cache
                 else f"{format_size(self.mapped_bytes)} memory-mapped (page cache: file-backed "
                      f"RSS, not counted against the budget)")
        return (f"memfit.dataset {self.path} (.npy arrays): budget "
                f"{format_size(self.memory_budget)} → {order}, batches gathered with sorted "
                f"reads, {self.parallel_reads} built ahead, prefetch "
                f"{format_count(self.prefetch_batches, 'batch', 'batches')}; about "
                f"{format_size(self.estimated_bytes)} anonymous in flight "
                f"(incl. {format_size(self.index_bytes)} of indices); {where}. "
                f"{plan_summary(self)}")


def _plan(*, source: str, split: str | None, features: tuple[str, ...], batch_size: int,
          budget: int, sample_bytes: int, mapped_bytes: int, total: int, samples: int,
          index_itemsize: int, cache: str | None, shuffle: bool, drop_remainder: bool,
          seed: int, epoch: int, epochs: int | None) -> ArraysPlan:
    """Parallel gathers and prefetch depth from the budget; refuses one that cannot hold
    one gather, one batch handed over, one prefetched and one consumed (or the cache)."""
    cores = os.cpu_count() or 1
    batch_bytes = sample_bytes * batch_size
    index_bytes = _INDEX_COPIES * index_itemsize * total
    cache_bytes = sample_bytes * total if cache else 0
    fixed = index_bytes + cache_bytes
    need_min = fixed + (_GATHER_COPIES + 3) * batch_bytes
    if budget < need_min:
        if cache:
            raise DatasetError(
                f"cache='ram' needs {format_size(cache_bytes)} for {total:,} samples of "
                f"{format_size(sample_bytes)} plus {format_size(need_min - cache_bytes)} for "
                f"the pipeline: {format_size(need_min)} in all, more than "
                f"memory_budget={format_size(budget)}. Raise memory_budget to at least "
                f"{format_size(need_min)} or leave cache=None (memory-mapped reads). "
                f"Received: memory_budget={budget}, cache={cache!r}")
        raise DatasetError(
            f"memory_budget={format_size(budget)} is too small to gather batches of "
            f"{batch_size} samples of {format_size(sample_bytes)}: it needs at least "
            f"{format_size(need_min)} ({need_min:,} bytes: {format_size(index_bytes)} of "
            f"indices for {total:,} samples, {_GATHER_COPIES + 3} batches of "
            f"{format_size(batch_bytes)}). Raise memory_budget or lower batch_size. "
            f"Received: memory_budget={budget}")
    spare = budget - fixed - 2 * batch_bytes          # one handed over, one being consumed
    parallel = int(max(1, min(_MAX_PARALLEL, max(2, cores),
                              (spare - batch_bytes) // (_GATHER_COPIES * batch_bytes))))
    prefetch = int(max(1, min(_MAX_PREFETCH,
                              (spare - parallel * _GATHER_COPIES * batch_bytes) // batch_bytes)))
    # A batch is at most the split: what is in flight is sized by that (the figure only).
    held = sample_bytes * min(batch_size, samples) if samples > 0 else batch_bytes
    estimated = fixed + (parallel * _GATHER_COPIES + prefetch + 2) * held
    return ArraysPlan(path=source, split=split, features=features, batch_size=batch_size,
                      samples=samples,
                      steps_per_epoch=steps_per_epoch(samples, batch_size, drop_remainder),
                      memory_budget=budget,
                      estimated_bytes=int(estimated), sample_bytes=int(sample_bytes),
                      mapped_bytes=int(mapped_bytes), index_bytes=int(index_bytes),
                      cache_bytes=int(cache_bytes), parallel_reads=parallel,
                      prefetch_batches=prefetch, seed=seed, epoch=epoch, epochs=epochs,
                      shuffle=shuffle, cache=cache)


class _Gatherer:
    """Gathers the rows of a batch from every column: sorted reads, permuted output.

    The rows are first read in ascending index order (file order: locality on disk and in
    the page cache) into a reused scratch buffer, then scattered into an aligned batch in
    the permuted order. Reusing buffers matters: a fresh buffer per batch costs a page
    fault per 4 KiB written. The scratch buffers are pooled (one set per concurrent call)
    and the batches recycled once TensorFlow lets go of them (``keep`` of them: the
    batches in flight); ``np.take`` runs with ``mode="clip"`` (the ids are checked
    beforehand): with ``out=`` and the default ``mode="raise"`` NumPy gathers into a
    temporary buffer first, several times slower.

    Args:
        columns: the arrays (memory-mapped or in memory), rows = samples.
        dtypes: the dtype of each returned batch.
        keep: batches alive at once (gathered, prefetched, consumed): buffers recycled.
    """

    def __init__(self, columns: Sequence[np.ndarray], dtypes: Sequence[np.dtype],
                 keep: int = 4):
        self.columns = list(columns)
        self.dtypes = list(dtypes)
        self._pool: BufferPool[list[np.ndarray]] = BufferPool(
            lambda n: [np.empty((n, *c.shape[1:]), c.dtype) for c in self.columns],
            lambda bufs, n: len(bufs[0]) >= n)
        self._batches = [RecyclingBuffers(keep) for _ in self.columns]

    def __call__(self, ids: np.ndarray) -> list[np.ndarray]:
        """The rows ``ids`` of every column, in the order of ``ids``."""
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        n = len(ids)
        scratch = self._pool.get(n)
        out = []
        try:
            for col, dtype, buf, batches in zip(self.columns, self.dtypes, scratch,
                                                self._batches, strict=True):
                rows = np.take(col, sorted_ids, axis=0, out=buf[:n], mode="clip")  # ascending
                batch = batches.array((n, *col.shape[1:]), dtype)
                batch[order] = rows                                     # permuted order
                out.append(batch)
        finally:
            self._pool.put(scratch)
        return out


class _WholeFiles:
    """Checks, before a batch is read, that the memory-mapped ``.npy`` files are still as
    long as when they were opened (see the module docstring).

    Args:
        columns: the arrays read, by feature (those not memory-mapped are not checked).
        paths: each memory-mapped feature's file.
    """

    def __init__(self, columns: Mapping[str, np.ndarray], paths: Mapping[str, str]):
        self._files = []
        for name, col in columns.items():
            mapped = _mapping(col)
            if mapped is None or name not in paths:
                continue
            row = math.prod(col.shape[1:]) * col.dtype.itemsize
            self._files.append((paths[name], mapped, int(getattr(col, "offset", 0)), row,
                                len(col), mapped.size()))

    def check(self, ids: np.ndarray) -> None:
        """Raises :class:`CorruptShardError` when a file lost rows that ``ids`` reads."""
        for path, mapped, offset, row, rows, expected in self._files:
            size = mapped.size()                        # fstat of the mapped file
            if size >= expected:
                continue
            whole = max(0, (size - offset) // row) if row else rows
            lost = ids[ids >= whole]
            if not len(lost):
                continue
            raise CorruptShardError(
                f"memfit: array file {path} is truncated: sample {int(lost.min())} of "
                f"{rows:,} cannot be read (the file has {size:,} of its {expected:,} bytes: "
                f"it was cut short after it was opened, e.g. written again while training "
                f"read it). Write it again in full and restart; `memfit verify` checks a "
                f"packed arrays directory.", path, int(lost.min()))


def _mapping(col: np.ndarray) -> mmap.mmap | None:
    """The ``mmap`` a memory-mapped array reads, or ``None``."""
    base: Any = col
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base


def _load_into_ram(columns: dict[str, np.ndarray], ids: np.ndarray | None,
                   dtypes: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """Copies the rows ``ids`` (all rows when ``None``) of each column into RAM, reading in
    file order ``_CHUNK_BYTES`` at a time and unmapping each chunk's pages after it."""
    out: dict[str, np.ndarray] = {}
    for name, col in columns.items():
        n = len(col) if ids is None else len(ids)
        row_bytes = max(1, math.prod(col.shape[1:]) * col.dtype.itemsize)
        chunk = max(1, _CHUNK_BYTES // row_bytes)
        dest = np.empty((n, *col.shape[1:]), dtypes[name])
        order = None if ids is None else np.argsort(ids, kind="stable")
        for a in range(0, n, chunk):
            if order is None:
                dest[a:a + chunk] = col[a:a + chunk]
            else:
                dest[order[a:a + chunk]] = np.take(col, ids[order[a:a + chunk]], axis=0)
            release_pages([col])
        out[name] = dest
    return out


def dataset(source: Any, batch_size: int, *, split: str | None = None,
            features: Sequence[str] | None = None, memory_budget: str | int = "256MiB",
            seed: int | None = None, epoch: int = 0, epochs: int | None = None,
            shuffle: bool = True, drop_remainder: bool = False, on_corrupt: str = "raise",
            shard: tuple[int, int] | None = None,
            input_context: tf.distribute.InputContext | None = None,
            cap_arenas: bool = True, indices: Any = None,
            cache: str | None = None) -> tf.data.Dataset:
    """Reads ``.npy`` arrays as a ``tf.data.Dataset``: a global shuffle per epoch, batches
    gathered from memory-mapped files. ``memfit.dataset`` calls this for ``.npy`` sources.

    Example:
        >>> ds = memfit.dataset({"x": "x.npy", "y": "y.npy"}, 128,
        ...                     features=("x", "y"))                   # doctest: +SKIP
        >>> n = len(np.load("y.npy", mmap_mode="r"))                    # doctest: +SKIP
        >>> val = memfit.dataset("data/", 128, features=("x", "y"), shuffle=False,
        ...                      indices=np.arange(n - 1000, n))        # doctest: +SKIP

    Args:
        source: a dict of feature name → ``.npy`` path (or NumPy array), a directory of
            ``.npy`` files (feature name = file stem), one ``.npy`` file, or a directory
            written by ``memfit.pack(..., format="arrays")``.
        batch_size: samples per batch (per replica, with ``input_context``).
        split: the split of a packed arrays directory (may be omitted when there is one).
        features: ``None`` yields dicts of all features; a sequence of names yields tuples
            in that order (one name: the tensor alone), e.g. ``("x", "y")`` for Keras.
        memory_budget: bytes of anonymous memory the pipeline may hold: it sets the
            parallel gathers and the prefetch depth, and must hold the index arrays (and
            the data, with ``cache="ram"``). Mapped file pages are page cache, not counted.
        seed: the order's seed; defaults to a packed dataset's seed, else 0.
        epoch: the epoch the first pass yields.
        epochs: ``None``: each pass is the next epoch; an int: one pass yields epochs
            ``epoch .. epochs - 1`` back to back.
        shuffle: ``False`` yields samples in index order (for evaluation).
        drop_remainder: drop the last, smaller batch of each epoch.
        on_corrupt: accepted for symmetry with TFRecord sources; ``.npy`` files are checked
            whole when opened (a truncated file is refused naming it) and before each
            batch (a file cut short since raises), so nothing is skipped.
        shard: ``(index, count)``: this worker yields positions ``index, index + count, ...``
            of each epoch's permutation (disjoint, together every sample once).
        input_context: from ``strategy.distribute_datasets_from_function``; sets ``shard``.
        cap_arenas: cap glibc's malloc arenas at one per core (see ``memfit.dataset``).
        indices: the samples to read (integer indices or a boolean mask), e.g. a train or
            validation part of the arrays; each epoch permutes this subset.
        cache: ``"ram"`` copies the samples into memory first (they must fit in
            ``memory_budget`` with the pipeline); ``None`` reads the memory-mapped files.

    Returns:
        A ``tf.data.Dataset``; its ``memfit_plan`` attribute is an :class:`ArraysPlan`.
    """
    return _build(open_arrays(
        source, batch_size, split=split, features=features, memory_budget=memory_budget,
        seed=seed, epoch=epoch, epochs=epochs, shuffle=shuffle, drop_remainder=drop_remainder,
        on_corrupt=on_corrupt, shard=shard, input_context=input_context,
        cap_arenas=cap_arenas, indices=indices, cache=cache))


@dataclasses.dataclass
class ArraysBatches:
    """A ``.npy`` source opened and planned: batch ``s`` of epoch ``e`` is
    ``batch_of(e, s)``, with no framework. The ``tf.data`` pipeline
    (:func:`dataset`) and the Keras feed of other backends
    (:mod:`memfit.data.read.feeds.keras_feed`) both hand over these batches.

    Attributes:
        plan: the :class:`ArraysPlan`.
        names: the features of each batch, in order; dtypes, shapes: of each array
            (per-sample shapes).
        features: the caller's ``features`` (``None``: dict elements).
        sharded: sharded by hand (``shard``/``input_context``).
        drop_remainder: whether the last, smaller batch of an epoch is dropped.
    """

    plan: ArraysPlan
    names: tuple[str, ...]
    dtypes: list[np.dtype]
    shapes: list[tuple[int, ...]]
    features: tuple[str, ...] | None
    sharded: bool
    drop_remainder: bool
    batch_of: Callable[[int, int], list[np.ndarray]]


def open_arrays(source: Any, batch_size: int, *, split: str | None = None,
                features: Sequence[str] | None = None, memory_budget: str | int = "256MiB",
                seed: int | None = None, epoch: int = 0, epochs: int | None = None,
                shuffle: bool = True, drop_remainder: bool = False,
                on_corrupt: str = "raise", shard: tuple[int, int] | None = None,
                input_context: Any = None, cap_arenas: bool = True, indices: Any = None,
                cache: str | None = None) -> ArraysBatches:
    """Checks the arguments, opens and plans a ``.npy`` source (the arguments of
    :func:`dataset`); no framework is imported.

    Example:
        >>> np.save("x.npy", np.arange(10, dtype="float32"))
        >>> src = open_arrays({"x": "x.npy"}, 4, features=("x",), shuffle=False)
        >>> src.plan.steps_per_epoch, src.batch_of(0, 2)[0].tolist()
        (3, [8.0, 9.0])
    """
    batch_size, epoch, epochs = check_arguments(batch_size=batch_size, on_corrupt=on_corrupt,
                                                epoch=epoch, epochs=epochs)
    if cache not in (None, "ram"):
        raise ValueError(f"cache must be None or 'ram'. Received: cache={cache!r}")
    src = resolve(source, split)
    features = check_features(features, src.names, src.description)
    names = features if features is not None else tuple(src.names)
    default_seed = src.manifest.seed if src.manifest is not None else 0
    seed = check_seed(default_seed if seed is None else seed)
    shard = check_shard(shard, input_context)
    budget = parse_size(memory_budget, name="memory_budget", memory=True)

    columns = open_columns(src, names)
    n = len(next(iter(columns.values())))
    subset = None if indices is None else check_indices(indices, n)
    total = n if subset is None else len(subset)
    samples = _worker_samples(total, shard)
    id_dtype = np.dtype(np.int32 if n < 2**31 else np.int64)
    dtypes = {k: c.dtype.newbyteorder("=") for k, c in columns.items()}
    plan = _plan(source=src.description, split=src.split, features=names,
                 batch_size=batch_size, budget=budget, **_sizes(columns, src), total=total,
                 samples=samples, index_itemsize=id_dtype.itemsize, cache=cache,
                 shuffle=shuffle, drop_remainder=drop_remainder, seed=seed, epoch=epoch,
                 epochs=epochs)
    plan = settle_plan(plan, batch_size=batch_size, samples=samples, cap_arenas=cap_arenas)

    if cache:
        columns = _load_into_ram(columns, subset, dtypes)
        base = None                          # cached rows are the subset, in its order
    else:
        base = None if subset is None else subset.astype(id_dtype)
    order = _EpochIds(total, id_dtype, base, plan, shard, drop_remainder)
    whole = _WholeFiles(columns, src.paths)
    cols = [np.asarray(columns[n]) for n in names]       # plain views of the mappings
    out_dtypes = [dtypes[n] for n in names]
    # Batches alive: built ahead (parallel), handed over, prefetched, with the consumer.
    gather_np = _Gatherer(cols, out_dtypes,
                          keep=plan.parallel_reads + plan.prefetch_batches + 2)
    per_epoch = order.per_epoch

    def batch_of(e: int, s: int) -> list[np.ndarray]:
        ids = order(e)[s * batch_size:min((s + 1) * batch_size, per_epoch)]
        whole.check(ids)
        return gather_np(ids)

    return ArraysBatches(plan=plan, names=names, dtypes=out_dtypes,
                         shapes=[tuple(c.shape[1:]) for c in cols],
                         features=tuple(features) if features is not None else None,
                         sharded=shard is not None, drop_remainder=drop_remainder,
                         batch_of=batch_of)




def _worker_samples(total: int, shard: tuple[int, int] | None) -> int:
    """The samples of an epoch this worker yields (positions ``index, index + count, ...``
    of each epoch's permutation); none is an error."""
    samples = total if shard is None else len(range(shard[0], total, shard[1]))
    if samples == 0:
        raise ValueError(f"shard={shard!r} leaves this worker no samples of {total:,}. "
                         f"Received: shard={shard!r}")
    return samples


def _sizes(columns: Mapping[str, np.ndarray], src: ArraysInput) -> dict[str, int]:
    """Bytes of one sample of the features read, and of the arrays memory-mapped."""
    return dict(sample_bytes=sum(math.prod(c.shape[1:]) * c.dtype.itemsize
                                 for c in columns.values()),
                mapped_bytes=sum(c.nbytes for k, c in columns.items() if k in src.paths))


class _EpochIds:
    """The ids each epoch reads, in order: a permutation of ``range(total)`` by
    ``(seed, e)`` (or ``range(total)``), this worker's share of it, mapped through
    ``base`` (the ``indices=`` subset) when there is one. Two epochs are kept: this one
    and the next, whose first batches are built ahead."""

    def __init__(self, total: int, id_dtype: np.dtype, base: np.ndarray | None,
                 plan: ArraysPlan, shard: tuple[int, int] | None, drop_remainder: bool):
        self.total = total
        self.id_dtype = id_dtype
        self.base = base
        self.seed = plan.seed
        self.shuffle = plan.shuffle
        self.shard = shard
        self.per_epoch = (plan.steps_per_epoch * plan.batch_size if drop_remainder
                          else plan.samples)
        self._by_epoch: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __call__(self, e: int) -> np.ndarray:
        with self._lock:
            ids = self._by_epoch.get(e)
        if ids is None:
            order = np.arange(self.total, dtype=self.id_dtype)
            if self.shuffle:
                order_rng(self.seed, e).shuffle(order)
            if self.shard is not None:
                order = order[self.shard[0]::self.shard[1]]
            order = order[:self.per_epoch]
            ids = np.ascontiguousarray(order if self.base is None else self.base[order])
            with self._lock:
                self._by_epoch[e] = ids
                for old in sorted(self._by_epoch)[:-2]:
                    del self._by_epoch[old]
        return ids


def _build(src: ArraysBatches) -> tf.data.Dataset:
    """The tf.data pipeline: (epoch, step) pairs → a sequential map handing over batches
    gathered ahead on ``parallel_reads`` threads (:class:`WindowFeeder`, into the next
    epoch's first batches) → prefetch."""
    plan = src.plan
    feeder = WindowFeeder(src.batch_of, plan.steps_per_epoch, epoch=plan.epoch,
                          epochs=plan.epochs, workers=plan.parallel_reads,
                          ahead=plan.parallel_reads)
    ds, counter = fed_dataset(feeder, plan.steps_per_epoch, epoch=plan.epoch,
                              epochs=plan.epochs, names=src.names, dtypes=src.dtypes,
                              shapes=src.shapes,
                              rows=plan.batch_size if src.drop_remainder else None,
                              as_dict=src.features is None)
    return finish(ds, plan, counter, sharded=src.sharded)
