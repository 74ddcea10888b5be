"""What both packers share (the TFRecord shards of :mod:`memfit.data.packing.pack_shards` and the
``.npy`` files of :mod:`memfit.data.packing.arrays_pack`): the options of a pack, checked in one
place (:class:`PackOptions`), the samples each split gets (:func:`split_order`, one
seeded permutation), the rows of a source gathered for a shard (:func:`gather`), and the
progress bar. Writing the files is :mod:`memfit.data.packing.pack_writing`.

Example:
    >>> options = PackOptions.of(split="train=0.75,val=0.25", seed=1)
    >>> order, splits = split_order(8, options)
    >>> [(name, len(idx)) for name, idx in splits]
    [('train', 6), ('val', 2)]
    >>> sorted(np.concatenate([idx for _, idx in splits]).tolist()) == list(range(8))
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from memfit import checks
from memfit.data.format.records import MAX_EXAMPLE_BYTES, example_length
from memfit.data.sources.columns import ArraySource, StreamSource
from memfit.errors import DatasetError
from memfit.sizes import format_count, format_size, parse_size

__all__ = ["PackOptions", "gather", "CHUNK_BYTES", "parse_split", "split_counts",
           "check_split_counts", "check_record_size", "split_order", "progress_bar"]

CHUNK_BYTES = 32 * 2**20        # bytes of rows read from a source at once


@dataclasses.dataclass(frozen=True)
class PackOptions:
    """How ``memfit.pack`` writes a dataset, checked (:meth:`of`).

    Attributes:
        format: ``"tfrecord"`` or ``"arrays"``.
        shards, shard_bytes: shards per split, or the target bytes of one (``None``:
            memfit's default); samples_per_record: samples a record (``None``: ~256 KiB).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        split: split name → fraction of the samples (``None``: one split, ``train``).
        seed: seeds the shuffle and the split; shuffle: write in a seeded shuffle order.
        workers: processes (or threads) writing shards.
        variable: features whose first dimension varies.
        buffer_bytes: the shuffle buffer of an iterable source.
    """

    format: str = "tfrecord"
    shards: int | None = None
    shard_bytes: int | None = None
    samples_per_record: int | None = None
    compression: str | None = None
    split: dict[str, float] | None = None
    seed: int = 0
    shuffle: bool = True
    workers: int = 1
    variable: tuple[str, ...] = ()
    buffer_bytes: int = 256 * 2**20

    @classmethod
    def of(cls, *, shards: Any = None, shard_size: Any = None, samples_per_record: Any = None,
           compression: Any = None, split: Any = None, seed: Any = 0, shuffle: Any = True,
           workers: Any = 1, variable: Iterable[str] = (), shuffle_buffer: Any = "256MiB",
           format: Any = "tfrecord") -> PackOptions:
        """The options of ``memfit.pack``'s arguments of the same names, checked.

        Raises:
            DatasetError: naming the argument and its value, before anything is written.
        """
        try:
            return cls._of(shards=shards, shard_size=shard_size, k=samples_per_record,
                           compression=compression, split=split, seed=seed, shuffle=shuffle,
                           workers=workers, variable=tuple(variable),
                           shuffle_buffer=shuffle_buffer, format=format)
        except DatasetError:
            raise
        except ValueError as e:                    # memfit.checks: bad input to pack
            raise DatasetError(str(e)) from None

    @classmethod
    def _of(cls, *, shards: Any, shard_size: Any, k: Any, compression: Any, split: Any,
            seed: Any, shuffle: Any, workers: Any, variable: tuple[str, ...],
            shuffle_buffer: Any, format: Any) -> PackOptions:
        if shards is not None and shard_size is not None:
            raise DatasetError(f"Give shards or shard_size, not both. Received: "
                               f"shards={shards!r}, shard_size={shard_size!r}")
        shards = checks.count("shards", shards, optional=True)
        shard_bytes = parse_size(shard_size, name="shard_size") if shard_size is not None \
            else None
        if shard_bytes is not None and shard_bytes < 1:
            raise DatasetError(f"shard_size must be positive. Received: shard_size={shard_size!r}")
        compression = _compression(compression)
        k = checks.count("samples_per_record", k, optional=True, example=64)
        workers = checks.count("workers", workers)
        seed = checks.count("seed", seed, minimum=0)
        checks.choice("format", format, ("tfrecord", "arrays"))
        if format == "arrays":
            _only_tfrecord(shards=shards, shard_size=shard_size, samples_per_record=k,
                           compression=compression, variable=list(variable), workers=workers)
        return cls(format=format, shards=shards, shard_bytes=shard_bytes, samples_per_record=k,
                   compression=compression, split=parse_split(split), seed=seed,
                   shuffle=checks.flag("shuffle", shuffle), workers=workers, variable=variable,
                   buffer_bytes=parse_size(shuffle_buffer, name="shuffle_buffer"))

    @property
    def fractions(self) -> dict[str, float]:
        """Split name → fraction of the samples (``{"train": 1.0}`` without splits)."""
        return {"train": 1.0} if self.split is None else self.split

    def fingerprint(self, src: ArraySource | StreamSource) -> str | None:
        """What this pack packs (the source's identity and the options), recorded in its
        state and manifest: a rerun of the same pack resumes it, or finds it complete.
        ``None`` for an iterable: a rerun cannot tell it is the same data."""
        if not isinstance(src, ArraySource):
            return None
        options = dict(shards=self.shards, shard_bytes=self.shard_bytes,
                       k=self.samples_per_record, compression=self.compression,
                       split=self.split, seed=self.seed, shuffle=self.shuffle,
                       features={n: f.to_json() for n, f in src.features.items()})
        if self.format == "arrays":
            options["format"] = "arrays"
        return hashlib.sha256((src.fingerprint() + json.dumps(options, sort_keys=True)
                               ).encode()).hexdigest()


def _compression(compression: Any) -> str | None:
    if compression is None:
        return None
    compression = str(compression).upper()
    if compression in ("", "NONE"):
        return None
    if compression not in ("GZIP", "ZLIB"):
        raise DatasetError(f"compression must be None, 'GZIP' or 'ZLIB'. "
                           f"Received: compression={compression!r}")
    return compression


def _only_tfrecord(**given: Any) -> None:
    """Refuses the options format="arrays" has no use for."""
    extra = {k: v for k, v in given.items()
             if not (v is None or (k == "variable" and not v) or (k == "workers" and v == 1))}
    if extra:
        listed = ", ".join(f"{k}={v!r}" for k, v in extra.items())
        verb = "applies" if len(extra) == 1 else "apply"
        raise DatasetError(f"{', '.join(extra)} {verb} to format='tfrecord' only; "
                           f"format='arrays' writes one .npy file per split and feature. "
                           f"Received: {listed}")


def parse_split(split: str | Mapping[str, float] | None) -> dict[str, float] | None:
    """Parses ``"train=0.9,val=0.1"`` (or a dict) into fractions that sum to 1.

    Example:
        >>> parse_split("train=0.9,val=0.1")
        {'train': 0.9, 'val': 0.1}
    """
    if split is None:
        return None
    # as the user wrote it ("--split train=0.9,val=0.2", not a Python dict: a stranger)
    shown = repr(split) if isinstance(split, str) else str(dict(split))
    if isinstance(split, str):
        parts = {}
        for item in split.split(","):
            name, sep, value = item.partition("=")
            try:
                if not sep:
                    raise ValueError
                fraction = float(value)
            except ValueError:
                raise DatasetError(f"split must look like 'train=0.9,val=0.1'. "
                                   f"Received: split={split!r}") from None
            if name.strip() in parts:
                raise DatasetError(f"split names {name.strip()!r} twice: give each split "
                                   f"once. Received: split={split!r}")
            parts[name.strip()] = fraction
        split = parts
    split = dict(split)
    names = [n for n in split if not n or "/" in n or "-" in n]
    if names:
        raise DatasetError(f"split needs names without '-' or '/' (they name files). "
                           f"Received: split={shown}")
    outside = [f"{n}={v:g}" for n, v in split.items() if not 0 < v <= 1]
    if outside:
        raise DatasetError(f"split needs each fraction in (0, 1]: {', '.join(outside)} is "
                           f"not (leave out a split that gets nothing). "
                           f"Received: split={shown}")
    total = sum(split.values())
    if not split or abs(total - 1) > 1e-6:
        raise DatasetError(f"split needs fractions that sum to 1 (they sum to {total:g}). "
                           f"Received: split={shown}")
    return split


def split_counts(n: int, split: dict[str, float]) -> dict[str, int]:
    """Samples per split: ``n * fraction`` rounded down, the samples left over going to
    the largest remainders.

    Example:
        >>> split_counts(10, {"train": 0.84, "val": 0.16})
        {'train': 8, 'val': 2}
    """
    raw = {k: n * v for k, v in split.items()}
    counts = {k: int(math.floor(v)) for k, v in raw.items()}
    short = n - sum(counts.values())          # largest remainders get the leftover samples
    for k in sorted(raw, key=lambda k: raw[k] - counts[k], reverse=True)[:short]:
        counts[k] += 1
    return counts


def check_split_counts(n: int, options: PackOptions) -> dict[str, int]:
    """:func:`split_counts`; a split that gets no sample is an error."""
    counts = split_counts(n, options.fractions)
    for name, count in counts.items():
        if count == 0:
            raise DatasetError(f"split {name!r} gets no samples out of {n}; use fewer splits or "
                               f"more data. Received: split={options.split}")
    return counts


def check_record_size(src: ArraySource | StreamSource, options: PackOptions) -> None:
    """Refuses, before anything is written, samples whose record (``samples_per_record``
    of them; by default one, where a sample passes the ~256 KiB a record) would be larger
    than a ``tf.train.Example`` can be: TensorFlow could not read it back. Only the
    fixed-shape features are counted (a variable one's size is known once read).

    Raises:
        DatasetError: naming the record's bytes, the features' sizes, and what to do.
    """
    fixed = {n: f.sample_bytes for n, f in src.features.items() if f.sample_bytes is not None}
    if options.format != "tfrecord" or not fixed:
        return
    k = options.samples_per_record or 1
    length = example_length({n: k * b for n, b in fixed.items()})
    if length <= MAX_EXAMPLE_BYTES:
        return
    sizes = ", ".join(f"{n} {src.features[n].dtype} {tuple(src.features[n].shape)} "
                      f"{b:,} bytes" for n, b in fixed.items())
    todo = "Make the samples smaller (for images a smaller image_size), or pack with " \
           "format='arrays' (--format arrays), whose files have no such limit"
    if k > 1 and example_length(fixed) <= MAX_EXAMPLE_BYTES:
        todo = "Give a smaller samples_per_record (--samples-per-record)"
    raise DatasetError(f"A record of {format_count(k, 'sample')} (a sample: {sizes}) "
                       f"would be {format_size(length)} ({length:,} bytes), too large for "
                       f"the shards' format: a tf.train.Example holds at most "
                       f"{MAX_EXAMPLE_BYTES:,} bytes (protobuf's 2 GiB limit), so "
                       f"TensorFlow could not read it back. {todo}. Received: "
                       f"samples_per_record={options.samples_per_record}")


def split_order(n: int, options: PackOptions) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """The samples each split gets, in the order they are written: a permutation seeded
    by ``options.seed`` (when shuffling or splitting) cut into the splits' counts, each
    split's samples in that shuffled order (else sorted: source order).

    Returns:
        ``(the permutation, [(split, its sample indices)])``.
    """
    rng = np.random.default_rng(options.seed)
    order = rng.permutation(n) if (options.shuffle or options.split) else np.arange(n)
    splits = []
    start = 0
    for name, count in check_split_counts(n, options).items():
        idx = order[start:start + count]
        splits.append((name, idx if options.shuffle else np.sort(idx)))
        start += count
    return order, splits


# .npy columns of at least this much a row are read with pread, a row a call.
_PREAD_ROW_BYTES = 4096
# .npy columns no larger than this are gathered through their memory map.
_MAPPED_COLUMN_BYTES = 64 * 2**20


def _npy_layout(path: str, col: np.ndarray) -> int | None:
    """The offset of the data in the ``.npy`` file ``path`` if it holds ``col`` as rows
    in C order, else ``None``."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            shape, fortran, dtype = _read_header(f, version)
            offset = f.tell()
    except (OSError, ValueError):
        return None
    if fortran or tuple(shape) != col.shape or dtype != col.dtype:
        return None
    return offset


def _read_header(f: Any, version: tuple[int, int]) -> tuple[tuple[int, ...], bool, np.dtype]:
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def gather(src: ArraySource, indices: np.ndarray) -> dict[str, Any]:
    """``src.take(indices)``, faster for the ``.npy`` files of :func:`memfit.pack`'s
    usual source: a column of rows of at least 4 KiB is read with ``pread``, each row
    straight into its place (no page faults, no pages mapped: here 2 GiB of 12 KiB rows
    gathered in 1.0 s against 2.0 s through the memory map); a column of at most 64 MiB
    through its memory map. Any other source or column: ``src.take``. The same values.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> np.save(path, np.arange(4096.0).reshape(4, 1024))
        >>> src = ArraySource({"x": np.load(path, mmap_mode="r")}, paths={"x": path})
        >>> gather(src, np.array([3, 0]))["x"][:, 0].tolist()
        [3072.0, 0.0]
    """
    if type(src) is not ArraySource or set(src.paths) != set(src.columns):
        return src.take(indices)
    plan: dict[str, int | None] = {}
    for name, col in src.columns.items():
        if not isinstance(col, np.memmap):
            return src.take(indices)
        row_bytes = col.dtype.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
        if col.nbytes <= _MAPPED_COLUMN_BYTES:
            plan[name] = None
            continue
        offset = _npy_layout(src.paths[name], col) if row_bytes >= _PREAD_ROW_BYTES else None
        if offset is None:
            return src.take(indices)
        plan[name] = offset
    order = np.argsort(indices, kind="stable")
    rows = indices[order].tolist()
    places = order.tolist()
    out: dict[str, Any] = {}
    for name, col in src.columns.items():
        offset = plan[name]
        if offset is None:
            out[name] = np.take(col, indices, axis=0)
            continue
        result = np.empty((len(indices), *col.shape[1:]), col.dtype)
        view = memoryview(result).cast("B")
        size = result.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
        fd = os.open(src.paths[name], os.O_RDONLY | os.O_CLOEXEC)
        try:
            for place, row in zip(places, rows, strict=True):
                if os.preadv(fd, [view[place * size:(place + 1) * size]],
                             offset + row * size) != size:
                    raise DatasetError(f"{src.paths[name]!r} got shorter while it was "
                                       f"being packed; pack it again.")
        finally:
            os.close(fd)
        out[name] = result
    return out


def progress_bar(total: int | None, enabled: bool, what: str) -> Any:
    """A tqdm bar of samples on stderr, drawn only on a terminal (disabled, or stderr a
    file or a pipe: does nothing). In a log its redraws are noise: ``make demo > log``
    kept 17 of them, each a line long, before the summary line; ``memfit verify`` does
    the same."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled or not sys.stderr.isatty(),
                unit=" samples", unit_scale=True, desc=what, dynamic_ncols=True, leave=False)
