"""``.npy`` sources: memory-mapped random access with a true global shuffle.

``memfit.dataset`` reads ``.npy`` arrays straight from disk when it is given

- a dict of feature name → ``.npy`` path (or in-memory array),
- a directory of ``.npy`` files (one array per feature, the feature name is the file stem),
- one ``.npy`` file, or
- a "memfit-arrays" directory written by ``memfit.pack(..., format="arrays")``
  (``<split>/<feature>.npy`` plus a ``manifest.json`` with dtypes, shapes and sha256).

The pipeline, for epoch ``e``::

    ids = a permutation of all sample indices (or of ``indices=``), by (seed, e)
      → batch s gathered from ids[s*B:(s+1)*B] ahead of time, in order, on
        ``parallel_reads`` threads (pipeline.WindowFeeder): sort the batch's ids, np.take
        from the memory-mapped arrays (reads in file order), un-sort to the permuted order
      → a sequential map(tf.numpy_function(next batch)) over (epoch, step) pairs
      → prefetch

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
import hashlib
import io
import json
import logging
import math
import mmap
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memfit._version import __version__
from memfit.atomic import discard, file_sha256, temporary_name, write_text_atomic
from memfit.data.manifest import MANIFEST, Feature, ManifestSchema
from memfit.data.pipeline import (
    BufferPool,
    RecyclingBuffers,
    WindowFeeder,
    check_arguments,
    check_features,
    check_seed,
    finish,
    order_rng,
    pass_epochs,
    settle_plan,
)
from memfit.data.sources import _check_dtype
from memfit.errors import DatasetError
from memfit.sizes import format_size, parse_size

if TYPE_CHECKING:
    import tensorflow as tf

    from memfit.data.sources import ArraySource

__all__ = ["ArraysManifest", "ArraysPlan", "ArrayFile", "ArraysSplit", "FORMAT",
           "FORMAT_VERSION", "dataset", "is_arrays_source", "manifest_format", "open_npy",
           "pack_arrays", "remove_arrays_dataset"]

log = logging.getLogger("memfit")

FORMAT = "memfit-arrays"
FORMAT_VERSION = 1
_CHUNK_BYTES = 32 * 2**20       # rows read at once while packing or caching
_MAX_PREFETCH = 4               # batches
_MAX_PARALLEL = 4               # gathers at once
# Copies of a batch alive during one gather: the rows read in sorted order, the batch in
# permuted order, and the tensor TensorFlow makes of it when it cannot share the buffer.
_GATHER_COPIES = 3
_INDEX_COPIES = 4               # the indices, this epoch's ids, the next epoch's, a temporary


# -- the "memfit-arrays" directory ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ArrayFile:
    """One ``.npy`` file of a split: its path relative to the dataset, size and sha256."""

    file: str
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class ArraysSplit:
    """A split of an arrays dataset: its sample count and one ``.npy`` file per feature."""

    name: str
    samples: int
    files: dict[str, ArrayFile]

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())


@dataclasses.dataclass(frozen=True)
class ArraysManifest:
    """``manifest.json`` of a "memfit-arrays" directory (written last: its presence means
    every ``.npy`` file is complete).

    Layout: ``<split>/<feature>.npy``, each a plain ``.npy`` file (C order, little-endian)
    whose first dimension is the split's samples, so ``np.load(path, mmap_mode="r")`` reads
    it without memfit.

    Example:
        >>> m = ArraysManifest.load("data/train")                      # doctest: +SKIP
        >>> m.splits["train"].files["x"].file                           # doctest: +SKIP
        'train/x.npy'
    """

    features: dict[str, Feature]
    splits: dict[str, ArraysSplit]
    seed: int
    shuffled: bool
    memfit_version: str
    source: str = ""
    path: Path | None = None
    # What memfit.pack packed (the source's identity and the options): a rerun of the same
    # pack finds its dataset complete instead of refusing it.
    fingerprint: str = ""

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.splits.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.splits.values())

    @property
    def file_count(self) -> int:
        return sum(len(s.files) for s in self.splits.values())

    def split(self, name: str | None) -> ArraysSplit:
        """The split called ``name``; ``None`` means the only split there is."""
        if name is None:
            if len(self.splits) == 1:
                return next(iter(self.splits.values()))
            raise ValueError(f"This dataset has several splits; choose one with "
                             f"split=... from {sorted(self.splits)}. Received: split=None")
        if name not in self.splits:
            raise ValueError(f"No split {name!r} in {self.path}: it has {sorted(self.splits)}. "
                             f"Received: split={name!r}")
        return self.splits[name]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "memfit_version": self.memfit_version,
            "seed": self.seed,
            "shuffled": self.shuffled,
            "source": self.source,
            "fingerprint": self.fingerprint,
            "features": {n: {"dtype": f.dtype, "shape": list(f.shape)}
                         for n, f in self.features.items()},
            "splits": {n: {"samples": s.samples,
                           "files": {f: dataclasses.asdict(a) for f, a in s.files.items()}}
                       for n, s in self.splits.items()},
            "totals": {"samples": self.samples, "bytes": self.bytes, "files": self.file_count},
            "layout": ("One .npy file per split and feature, <split>/<feature>.npy: C order, "
                       "little-endian, first dimension = samples of the split, the rest = "
                       "the feature's shape. Read with np.load(path, mmap_mode='r')."),
        }

    def save(self, directory: str | os.PathLike) -> None:
        write_text_atomic(Path(directory) / MANIFEST, json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ArraysManifest:
        """Reads ``DIRECTORY/manifest.json`` of an arrays dataset.

        Raises:
            DatasetError: if there is no complete memfit arrays dataset there.
        """
        path = Path(directory)
        file = path if path.name == MANIFEST else path / MANIFEST
        if not file.exists():
            raise DatasetError(f"No memfit dataset at {str(path)!r}: {MANIFEST} is missing.")
        schema = ManifestSchema(file)
        doc = schema.document(FORMAT, FORMAT_VERSION)
        features = schema.features(doc, variable=False)
        splits = {}
        listed = schema.mapping(schema.field(doc, "splits"), "splits", nonempty=True)
        for name, s in listed.items():
            where = f"splits.{name}"
            s = schema.mapping(s, where)
            files = {}
            for f, a in schema.mapping(schema.field(s, "files", where), f"{where}.files",
                                       nonempty=True).items():
                at = f"{where}.files.{f}"
                a = schema.mapping(a, at)
                files[f] = ArrayFile(file=schema.file_name(schema.field(a, "file", at),
                                                           f"{at}.file"),
                                     bytes=schema.count(a, "bytes", at),
                                     sha256=schema.sha256(schema.field(a, "sha256", at),
                                                          f"{at}.sha256"))
            if set(files) != set(features):
                raise schema.error(f"{where}.files", sorted(files),
                                   f"one file per feature {sorted(features)}")
            splits[name] = ArraysSplit(name, schema.count(s, "samples", where, positive=True),
                                       files)
        return cls(features=features, splits=splits, seed=schema.count(doc, "seed"),
                   shuffled=schema.flag(doc, "shuffled"),
                   memfit_version=schema.text(doc, "memfit_version"),
                   source=schema.text(doc, "source", default=""), path=file.parent,
                   fingerprint=schema.text(doc, "fingerprint", default=""))


def manifest_format(path: str | os.PathLike) -> str | None:
    """The ``format`` of ``PATH/manifest.json`` (or of that file), ``None`` without one.

    Example:
        >>> manifest_format("data/train")                              # doctest: +SKIP
        'memfit-arrays'
    """
    p = Path(path)
    file = p if p.name == MANIFEST else p / MANIFEST
    if not file.is_file():
        return None
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DatasetError(f"{file} is damaged or not a memfit manifest: {e!r}") from e
    return doc.get("format") if isinstance(doc, dict) else None


def is_arrays_source(source: Any) -> bool:
    """Whether ``memfit.dataset`` should read ``source`` as ``.npy`` arrays.

    True for a mapping (feature name → ``.npy`` path or array), a ``.npy`` path, a
    "memfit-arrays" directory, and a directory of ``.npy`` files without a manifest or
    TFRecord shards.

    Example:
        >>> is_arrays_source({"x": "x.npy"}), is_arrays_source("data/x.npy")
        (True, True)
    """
    if isinstance(source, Mapping):
        return True
    if not isinstance(source, str | os.PathLike):
        return False
    p = Path(source)
    if p.suffix == ".npy":
        return True
    if p.is_dir() or (p.name == MANIFEST and p.is_file()):
        fmt = manifest_format(p)
        if fmt is not None:
            return fmt == FORMAT
        return p.is_dir() and any(p.glob("*.npy")) and not any(p.glob("*.tfrecord*"))
    return False


# -- opening .npy files -----------------------------------------------------------------------

def _read_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    # Version 3.0 (utf-8 field names) has the 2.0 layout; NumPy reads it privately.
    return np.lib.format._read_array_header(f, version)  # type: ignore[attr-defined]


def open_npy(name: str, path: str | os.PathLike) -> np.memmap:
    """Memory-maps one feature's ``.npy`` file after checking it is whole and usable.

    Example:
        >>> x = open_npy("x", "x.npy")                                  # doctest: +SKIP

    Args:
        name: the feature name (for the error messages).
        path: the ``.npy`` file.

    Raises:
        DatasetError: naming the file when it is missing, not a ``.npy`` file, truncated
            or longer than its header says, of an unsupported dtype, or has no samples.
    """
    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a .npy file" if p.is_dir() else "does not exist"
        raise DatasetError(f"Feature {name!r}: {str(p)!r} {what}. Received: {name}={str(p)!r}")
    size = p.stat().st_size
    try:
        with open(p, "rb") as f:
            shape, fortran, dtype = _read_header(f)
            offset = f.tell()
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} is not a readable .npy file "
                           f"({e}).") from None
    _check_dtype(name, dtype, where=f" (file {str(p)!r})")
    if len(shape) == 0:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} holds a scalar, not an array of "
                           f"samples (first dimension = samples).")
    expected = offset + math.prod(shape) * dtype.itemsize
    if size < expected:
        raise DatasetError(
            f"Feature {name!r}: {str(p)!r} is truncated: its header describes "
            f"{dtype}{tuple(shape)}, {expected:,} bytes with the header, but the file has "
            f"{size:,} bytes. Write it again (np.save) or restore it from a copy.")
    if size > expected:
        raise DatasetError(
            f"Feature {name!r}: {str(p)!r} has {size - expected:,} bytes more than its header "
            f"describes ({dtype}{tuple(shape)}, {expected:,} bytes with the header); it is "
            f"not a file np.save wrote (overwritten in place?).")
    if shape[0] == 0:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} has no samples (shape {shape}).")
    if 0 in shape[1:]:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} has an empty sample shape "
                           f"{tuple(shape[1:])}. Received: {name}.shape={tuple(shape)}")
    return np.memmap(p, dtype=dtype, mode="r", offset=offset, shape=tuple(shape),
                     order="F" if fortran else "C")


@dataclasses.dataclass
class _Source:
    """What a source resolved to: where each feature is, and where it came from."""

    description: str
    paths: dict[str, str]                   # feature → .npy path
    arrays: dict[str, np.ndarray]           # feature → in-memory array
    manifest: ArraysManifest | None = None
    split: str | None = None

    @property
    def names(self) -> list[str]:
        return [*self.paths, *self.arrays]


def _resolve(source: Any, split: str | None) -> _Source:
    if isinstance(source, Mapping):
        if not source:
            raise DatasetError("The source has no features: give at least one, e.g. "
                               "{'x': 'x.npy', 'y': 'y.npy'}. Received: {}")
        paths, arrays = {}, {}
        for name, value in source.items():
            if not isinstance(name, str) or not name or "/" in name:
                raise DatasetError(f"Feature names must be non-empty strings without '/'. "
                                   f"Received: {name!r}")
            if isinstance(value, str | os.PathLike):
                paths[name] = str(value)
            elif isinstance(value, np.ndarray):
                arrays[name] = value
            else:
                raise DatasetError(f"Feature {name!r} must be a .npy path or a NumPy array. "
                                   f"Received: {name}={type(value).__name__}")
        desc = ", ".join([f"{k}={v}" for k, v in paths.items()]
                         + [f"{k}=<array {a.dtype}{a.shape}>" for k, a in arrays.items()])
        src = _Source(desc, paths, arrays)
    else:
        p = Path(source)
        if p.suffix == ".npy":
            src = _Source(str(p), {p.stem: str(p)}, {})
        elif manifest_format(p) == FORMAT:
            m = ArraysManifest.load(p)
            sp = m.split(split)
            return _Source(f"{m.path} [{sp.name}]",
                           {n: str(m.path / a.file) for n, a in sp.files.items()}, {},
                           manifest=m, split=sp.name)
        elif p.is_dir():
            files = sorted(f for f in p.glob("*.npy") if not f.name.startswith("."))
            if not files:
                raise DatasetError(f"No .npy files in {str(p)!r}: a directory source holds one "
                                   f".npy file per feature (the name is the file stem).")
            src = _Source(str(p), {f.stem: str(f) for f in files}, {})
        else:
            raise DatasetError(f"No such .npy file or directory: {str(p)!r}.")
    if split is not None:
        raise ValueError(f"split applies to datasets written by memfit.pack; {src.description} "
                         f"has no splits: select samples with indices=... instead. "
                         f"Received: split={split!r}")
    return src


def _open_columns(src: _Source, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Opens and checks the features asked for; all must have the same length."""
    cols: dict[str, np.ndarray] = {}
    for name in names:
        if name in src.arrays:
            arr = src.arrays[name]
            _check_dtype(name, arr.dtype)
            if arr.ndim == 0 or len(arr) == 0:
                raise DatasetError(f"Feature {name!r} has no samples. "
                                   f"Received: {name}.shape={arr.shape}")
            cols[name] = arr
            continue
        arr = open_npy(name, src.paths[name])
        if src.manifest is not None:
            f = src.manifest.features[name]
            entry = src.manifest.split(src.split).files[name]
            expected = (src.manifest.split(src.split).samples, *f.shape)
            if np.dtype(arr.dtype).name != f.dtype or tuple(arr.shape) != expected:
                raise DatasetError(
                    f"Feature {name!r}: {src.paths[name]!r} holds {arr.dtype}{arr.shape}; the "
                    f"manifest says {f.dtype}{expected}. The dataset was changed after "
                    f"packing: run `memfit verify {src.manifest.path}`.")
            if os.path.getsize(src.paths[name]) != entry.bytes:
                raise DatasetError(f"Feature {name!r}: {src.paths[name]!r} is not the size the "
                                   f"manifest says ({entry.bytes:,} bytes); run `memfit verify "
                                   f"{src.manifest.path}`.")
        cols[name] = arr
    lengths = {n: len(c) for n, c in cols.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{n}={v:,}" for n, v in lengths.items())
        files = "; ".join(f"{n}: {src.paths.get(n, 'in memory')}" for n in lengths)
        raise DatasetError(f"All features need the same number of samples (first dimension). "
                           f"Received lengths: {listed} ({files})")
    return cols


def _check_indices(indices: Any, n: int) -> np.ndarray:
    """Validates an index subset (integers or a boolean mask) against ``n`` samples."""
    try:
        idx = np.asarray(indices)
    except Exception as e:  # noqa: BLE001 - anything that is not array-like
        raise ValueError(f"indices must be a 1-D array of sample indices or a boolean mask. "
                         f"Received: indices of type {type(indices).__name__} ({e})") from None
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise ValueError(f"A boolean indices mask needs one value per sample ({n:,}). "
                             f"Received: indices.shape={idx.shape}")
        idx = np.flatnonzero(idx)
    elif idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"indices must be a 1-D array of integer sample indices (or a boolean "
                         f"mask). Received: indices with dtype {idx.dtype} and shape "
                         f"{idx.shape}")
    if idx.size == 0:
        raise ValueError("indices selects no samples. Received: indices=[] (empty)")
    idx = idx.astype(np.int64, copy=False)
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        at = int(np.argmax(bad))
        raise ValueError(f"indices must lie in [0, {n:,}) (the source has {n:,} samples); "
                         f"{int(bad.sum()):,} do not. Received: indices[{at}]={int(idx[at])}")
    sorted_idx = np.sort(idx)
    dup = sorted_idx[1:] == sorted_idx[:-1]
    if dup.any():
        value = int(sorted_idx[1:][np.argmax(dup)])
        distinct = idx.size - int(dup.sum())
        raise ValueError(f"indices holds duplicates (e.g. {value} more than once); each "
                         f"sample is yielded once per epoch. Received: indices with "
                         f"{idx.size:,} values, {distinct:,} distinct")
    return idx


# -- the plan ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ArraysPlan:
    """What ``memfit.dataset`` chose for a ``.npy`` source, and what it will yield.

    The sibling of :class:`memfit.data.stream.DatasetPlan` (same ``batch_size``,
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
        order = (f"global shuffle of {self.samples:,} samples (a permutation by (seed, epoch))"
                 if self.shuffle else "stored order")
        where = (f"{format_size(self.cache_bytes)} cached in RAM" if self.cache
                 else f"{format_size(self.mapped_bytes)} memory-mapped (page cache: file-backed "
                      f"RSS, not counted against the budget)")
        return (f"memfit.dataset {self.path} (.npy arrays): budget "
                f"{format_size(self.memory_budget)} → {order}, batches gathered with sorted "
                f"reads, {self.parallel_reads} built ahead, prefetch {self.prefetch_batches} "
                f"batches; about {format_size(self.estimated_bytes)} anonymous in flight "
                f"(incl. {format_size(self.index_bytes)} of indices); {where}. "
                f"{self.samples:,} samples → {self.steps_per_epoch} steps/epoch of "
                f"{self.batch_size}; seed={self.seed}, starting at epoch {self.epoch}."
                + (f" glibc malloc arenas capped at {self.arena_limit}."
                   if self.arena_limit else ""))


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
            f"{format_size(need_min)} ({format_size(index_bytes)} of indices for {total:,} "
            f"samples, {_GATHER_COPIES + 3} batches of {format_size(batch_bytes)}). Raise "
            f"memory_budget or lower batch_size. Received: memory_budget={budget}")
    spare = budget - fixed - 2 * batch_bytes          # one handed over, one being consumed
    parallel = int(max(1, min(_MAX_PARALLEL, max(2, cores),
                              (spare - batch_bytes) // (_GATHER_COPIES * batch_bytes))))
    prefetch = int(max(1, min(_MAX_PREFETCH,
                              (spare - parallel * _GATHER_COPIES * batch_bytes) // batch_bytes)))
    estimated = fixed + (parallel * _GATHER_COPIES + prefetch + 2) * batch_bytes
    steps = samples // batch_size if drop_remainder else math.ceil(samples / batch_size)
    return ArraysPlan(path=source, split=split, features=features, batch_size=batch_size,
                      samples=samples, steps_per_epoch=steps, memory_budget=budget,
                      estimated_bytes=int(estimated), sample_bytes=int(sample_bytes),
                      mapped_bytes=int(mapped_bytes), index_bytes=int(index_bytes),
                      cache_bytes=int(cache_bytes), parallel_reads=parallel,
                      prefetch_batches=prefetch, seed=seed, epoch=epoch, epochs=epochs,
                      shuffle=shuffle, cache=cache)


# -- reading ----------------------------------------------------------------------------------

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


def _release(columns: Mapping[str, np.ndarray]) -> None:
    """Unmaps the pages of memory-mapped columns from this process (the page cache keeps
    them): file-backed RSS drops, nothing is lost."""
    for col in columns.values():
        mm = getattr(col, "_mmap", None)
        if isinstance(mm, mmap.mmap) and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_DONTNEED)


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
            _release({name: col})
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
            whole when opened (a truncated file is refused naming it), so nothing is skipped.
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
    check_arguments(batch_size=batch_size, on_corrupt=on_corrupt, epoch=epoch, epochs=epochs)
    if cache not in (None, "ram"):
        raise ValueError(f"cache must be None or 'ram'. Received: cache={cache!r}")
    src = _resolve(source, split)
    features = check_features(features, src.names, src.description)
    names = features if features is not None else tuple(src.names)
    default_seed = src.manifest.seed if src.manifest is not None else 0
    seed = check_seed(default_seed if seed is None else seed)
    if input_context is not None:
        shard = (input_context.input_pipeline_id, input_context.num_input_pipelines)
    if shard is not None:
        index, count = shard
        if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
            raise ValueError(f"shard must be (index, count) with 0 <= index < count. "
                             f"Received: shard={shard!r}")
    budget = parse_size(memory_budget, name="memory_budget")

    columns = _open_columns(src, names)
    n = len(next(iter(columns.values())))
    subset = None if indices is None else _check_indices(indices, n)
    total = n if subset is None else len(subset)
    samples = total if shard is None else len(range(shard[0], total, shard[1]))
    if samples == 0:
        raise ValueError(f"shard={shard!r} leaves this worker no samples of {total:,}. "
                         f"Received: shard={shard!r}")
    id_dtype = np.dtype(np.int32 if n < 2**31 else np.int64)
    dtypes = {k: c.dtype.newbyteorder("=") for k, c in columns.items()}
    sample_bytes = sum(math.prod(c.shape[1:]) * c.dtype.itemsize for c in columns.values())
    mapped = sum(c.nbytes for k, c in columns.items() if k in src.paths)
    plan = _plan(source=src.description, split=src.split, features=names,
                 batch_size=batch_size, budget=budget, sample_bytes=sample_bytes,
                 mapped_bytes=mapped, total=total, samples=samples,
                 index_itemsize=id_dtype.itemsize, cache=cache, shuffle=shuffle,
                 drop_remainder=drop_remainder, seed=seed, epoch=epoch, epochs=epochs)
    plan = settle_plan(plan, batch_size=batch_size, samples=samples,
                       cap_arenas=cap_arenas, log=log)

    if cache:
        columns = _load_into_ram(columns, subset, dtypes)
        base = None                          # cached rows are the subset, in its order
    else:
        base = None if subset is None else subset.astype(id_dtype)
    return _build(columns, dtypes, names, base, total, plan, id_dtype,
                  tuple(features) if features is not None else None, shard, drop_remainder)


def _build(columns: dict[str, np.ndarray], dtypes: Mapping[str, np.dtype],
           names: tuple[str, ...], base: np.ndarray | None, total: int, plan: ArraysPlan,
           id_dtype: np.dtype, features: tuple[str, ...] | None,
           shard: tuple[int, int] | None, drop_remainder: bool) -> tf.data.Dataset:
    """The tf.data pipeline: (epoch, step) pairs → a sequential map handing over batches
    gathered ahead on ``parallel_reads`` threads (:class:`WindowFeeder`, into the next
    epoch's first batches) → prefetch."""
    import tensorflow as tf

    seed, batch, steps = plan.seed, plan.batch_size, plan.steps_per_epoch
    per_epoch = steps * batch if drop_remainder else plan.samples
    cols = [np.asarray(columns[n]) for n in names]       # plain views of the mappings
    out_dtypes = [dtypes[n] for n in names]
    # Batches alive: built ahead (parallel), handed over, prefetched, with the consumer.
    gather_np = _Gatherer(cols, out_dtypes,
                          keep=plan.parallel_reads + plan.prefetch_batches + 2)
    ids_by_epoch: dict[int, np.ndarray] = {}
    lock = threading.Lock()

    def epoch_ids(e: int) -> np.ndarray:
        """The ids epoch ``e`` reads, in order (two epochs kept: this one and the next,
        whose first batches are built ahead)."""
        with lock:
            ids = ids_by_epoch.get(e)
        if ids is None:
            order = np.arange(total, dtype=id_dtype)
            if plan.shuffle:
                order_rng(seed, e).shuffle(order)
            if shard is not None:
                order = order[shard[0]::shard[1]]
            order = order[:per_epoch]
            ids = np.ascontiguousarray(order if base is None else base[order])
            with lock:
                ids_by_epoch[e] = ids
                for old in sorted(ids_by_epoch)[:-2]:
                    del ids_by_epoch[old]
        return ids

    def batch_of(e: int, s: int) -> list[np.ndarray]:
        return gather_np(epoch_ids(e)[s * batch:min((s + 1) * batch, per_epoch)])

    feeder = WindowFeeder(batch_of, steps, epoch=plan.epoch, epochs=plan.epochs,
                          workers=plan.parallel_reads, ahead=plan.parallel_reads)

    def gather(element: tf.Tensor) -> Any:
        # stateful: the feeder builds ahead in order, so tf.data must keep this map sequential.
        got = tf.numpy_function(feeder, [element], [tf.as_dtype(d) for d in out_dtypes],
                                stateful=True)
        for t, c in zip(got, cols, strict=True):
            t.set_shape([batch if drop_remainder else None, *c.shape[1:]])
        if features is None:
            return dict(zip(names, got, strict=True))
        return tuple(got) if len(got) > 1 else got[0]

    if plan.epochs is None:                          # one epoch per pass, from the counter
        elements, counter = pass_epochs(plan.epoch, steps)
    else:                                            # epochs epoch .. epochs - 1 in one pass
        elements, counter = tf.data.Dataset.range((plan.epochs - plan.epoch) * steps), None
    return finish(elements.map(gather), plan, counter, sharded=shard is not None)


# -- packing ----------------------------------------------------------------------------------

def remove_arrays_dataset(out: Path) -> None:
    """Deletes the ``.npy`` files an arrays dataset (or an interrupted arrays pack) in
    ``out`` lists, and split directories left empty (for ``overwrite=True``)."""
    from memfit.data.pack import STATE

    files: list[str] = []
    if manifest_format(out) == FORMAT:
        try:
            m = ArraysManifest.load(out)
            files += [a.file for s in m.splits.values() for a in s.files.values()]
        except DatasetError:
            pass
    state = out / STATE
    if state.is_file():
        try:
            files += list(json.loads(state.read_text()).get("files", {}))
        except (OSError, ValueError):
            pass
    for rel in files:
        p = out / rel
        p.unlink(missing_ok=True)
        if p.parent != out and p.parent.is_dir() and not any(p.parent.iterdir()):
            p.parent.rmdir()


class _NpyWriter:
    """Writes one ``.npy`` file to a temporary name, hashing the bytes that land on disk."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]):
        self.path = path
        self.tmp = temporary_name(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.dtype = dtype
        self._sha = hashlib.sha256()
        self.bytes = 0
        self._file = open(self.tmp, "wb")
        header = io.BytesIO()
        meta = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                "shape": shape}
        try:
            np.lib.format.write_array_header_1_0(header, meta)
        except ValueError:                              # a header over 64 KiB
            header = io.BytesIO()
            np.lib.format.write_array_header_2_0(header, meta)
        self.write(header.getvalue())

    def write(self, data: Any) -> None:
        self._sha.update(data)
        self._file.write(data)
        self.bytes += memoryview(data).nbytes

    def close(self) -> ArrayFile:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        return ArrayFile(file="", bytes=self.bytes, sha256=self._sha.hexdigest())

    def abandon(self) -> None:
        discard(self._file, self.tmp)


def _write_split(src: ArraySource, out: Path, split: str, idx: np.ndarray,
                 report: Callable[[int], None]) -> dict[str, ArrayFile]:
    """Writes one ``.npy`` file per feature for the samples ``idx``, in one pass over the
    source (reads ~32 MiB of rows at a time in file order, then releases their pages)."""
    dtypes = {n: np.dtype(f.dtype).newbyteorder("<") for n, f in src.features.items()}
    writers = {n: _NpyWriter(out / split / f"{n}.npy", dtypes[n], (len(idx), *f.shape))
               for n, f in src.features.items()}
    try:
        sample_bytes = sum(f.sample_bytes or 1 for f in src.features.values())
        chunk = max(1, _CHUNK_BYTES // sample_bytes)
        for a in range(0, len(idx), chunk):
            rows = src.take(idx[a:a + chunk])
            for name, w in writers.items():
                w.write(memoryview(np.ascontiguousarray(rows[name], dtype=dtypes[name]))
                        .cast("B"))
            src.release_pages()
            report(len(idx[a:a + chunk]))
        return {n: dataclasses.replace(w.close(), file=f"{split}/{n}.npy")
                for n, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abandon()
        raise


def pack_arrays(src: ArraySource, out: Path, *, fingerprint: str | None, options: dict,
                overwrite: bool, progress: bool,
                keep: Collection[str] = ()) -> tuple[ArraysManifest, int]:
    """Writes ``src`` as a "memfit-arrays" directory (``memfit.pack(..., format="arrays")``
    calls this after validating its arguments).

    Samples go to splits by the same seeded permutation as the TFRecord format, in that
    shuffled order when ``options["shuffle"]`` (else in source order). Each file is written
    to a temporary name and renamed; ``manifest.json`` comes last. An interrupted pack
    rerun with the same arguments keeps the splits whose files' sha256 still match.
    ``keep``: names in ``out`` this call made and still needs (its CSV conversion).

    Returns:
        The manifest written and the number of files kept from an interrupted run.
    """
    from memfit.data.pack import STATE, prepare_output, progress_bar, split_counts

    if any(f.variable for f in src.features.values()):
        names = [f.name for f in src.features.values() if f.variable]
        raise DatasetError(f"format='arrays' stores fixed-shape features only; {names} vary "
                           f"in their first dimension. Pack them with format='tfrecord' or "
                           f"pad them. Received: variable={names}")
    if overwrite:
        remove_arrays_dataset(out)
    state = prepare_output(out, overwrite, fingerprint, keep)
    n = src.length
    rng = np.random.default_rng(options["seed"])
    order = rng.permutation(n) if (options["shuffle"] or options["split"]) else np.arange(n)
    fractions = {"train": 1.0} if options["split"] is None else options["split"]
    counts = split_counts(n, fractions)
    jobs = []
    start = 0
    for name, count in counts.items():
        if count == 0:
            raise DatasetError(f"split {name!r} gets no samples out of {n}; use fewer splits or "
                               f"more data. Received: split={options['split']}")
        idx = order[start:start + count]
        jobs.append((name, idx if options["shuffle"] else np.sort(idx)))
        start += count
    done: dict[str, dict] = dict(state.get("files", {}))
    for name, _ in jobs:
        for f in src.features:
            rel = f"{name}/{f}.npy"
            # A resumed pack may have renamed a file into place and been killed before
            # recording it: it is rewritten. Otherwise the file is someone else's.
            if (out / rel).exists() and rel not in done and not state.get("resumed"):
                raise DatasetError(f"{str(out / rel)!r} already exists and memfit did not write "
                                   f"it; choose an empty output directory or pass "
                                   f"overwrite=True (--overwrite).")

    def kept(name: str) -> dict[str, ArrayFile] | None:
        files = {}
        for f in src.features:
            rel = f"{name}/{f}.npy"
            info = done.get(rel)
            if info is None or not (out / rel).is_file() \
                    or file_sha256(out / rel) != info["sha256"]:
                return None
            files[f] = ArrayFile(file=rel, bytes=int(info["bytes"]), sha256=info["sha256"])
        return files

    splits: dict[str, ArraysSplit] = {}
    reused = 0
    bar = progress_bar(n, progress, f"pack {out.name}")
    try:
        for name, idx in jobs:
            files = kept(name)
            if files is not None:
                reused += len(files)
                bar.update(len(idx))
            else:
                files = _write_split(src, out, name, idx, bar.update)
                done.update({a.file: {"bytes": a.bytes, "sha256": a.sha256}
                             for a in files.values()})
                write_text_atomic(out / STATE, json.dumps({"fingerprint": fingerprint,
                                                           "files": done}))
            splits[name] = ArraysSplit(name, len(idx), files)
    finally:
        bar.close()
    manifest = ArraysManifest(features=dict(src.features), splits=splits,
                              seed=options["seed"], shuffled=bool(options["shuffle"]),
                              memfit_version=__version__, source=src.description, path=out,
                              fingerprint=fingerprint or "")
    manifest.save(out)
    return manifest, reused
