"""The TFRecord packer: a source written as checksummed shards of framed
``tf.train.Example`` records plus ``manifest.json`` (what ``memfit.pack`` writes by
default).

Samples are written in a seeded global shuffle order (so every shard is already a mix),
in blocks of ``samples_per_record`` per record, split into shards of about equal size.
Sources of known length (:func:`pack_shards`) are cut into shards ahead and written by
``workers`` processes (or threads, for arrays in memory), each shard under a temporary
name renamed when complete; the state of the pack records every shard finished, so a
rerun keeps the shards that still match their sha256. Each writer overlaps its stages
(:class:`~memfit.data.packing.pack_writing.WritePipe`): it gathers and frames the next
rows while a thread hashes and writes the records before them, and a second thread syncs
and renames the finished shards. Iterables of unknown length
(:func:`pack_stream`) go through a bounded shuffle buffer, their shards cut by size.

Example:
    >>> payload, raw = encode_block({"x": np.zeros((2, 3), "float32")},
    ...                             {"x": Feature("x", "float32", (3,))})
    >>> raw, len(payload)
    (24, 37)
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import gzip
import math
import multiprocessing
import os
import struct
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from memfit._version import __version__
from memfit.atomic import TMP_MARK, file_sha256, temporary_name
from memfit.data.format.manifest import Feature, Manifest, Shard, Split, shard_name
from memfit.data.format.records import (
    LENGTHS_SUFFIX,
    crc32c_spans,
    encode_example,
    example_layout,
    frame,
    frame_header,
    mask_crc,
)
from memfit.data.packing.pack_options import (
    CHUNK_BYTES,
    PackOptions,
    gather,
    progress_bar,
    split_order,
)
from memfit.data.packing.pack_output import save_state
from memfit.data.packing.pack_replace import shown_name
from memfit.data.packing.pack_writing import (
    HashingWriter,
    WritePipe,
    unguarded_script,
    writer_died,
)
from memfit.data.sources.columns import ArraySource, StreamSource
from memfit.data.sources.opening import open_source
from memfit.errors import DatasetError
from memfit.lifeline import die_with_parent

__all__ = ["ShardWriter", "encode_block", "write_shard", "pack_shards",
           "pack_stream"]

_TARGET_RECORD_BYTES = 256 * 1024
_MAX_SHARD_BYTES = 256 * 2**20
# Enough shards that the reader can interleave a different group of them every epoch.
_MIN_SHARDS = 64
_STREAM_SHARD_BYTES = 64 * 2**20
# Rows gathered at once by a pipelined writer: one piece being gathered, one waiting, one
# being written (about 48 MiB in flight).
_PIPE_CHUNK_BYTES = 16 * 2**20


def _default_samples_per_record(sample_bytes: float) -> int:
    k = max(1, int(_TARGET_RECORD_BYTES // max(sample_bytes, 1)))
    return min(1 << (k.bit_length() - 1), 4096)


class ShardWriter(HashingWriter):
    """Writes framed records to a temporary file, hashing what lands on disk."""

    def __init__(self, path: Path, compression: str | None):
        super().__init__(path)
        self.records = self.samples = self.raw_bytes = 0
        self._gzip = gzip.GzipFile(fileobj=self, mode="wb", mtime=0) \
            if compression == "GZIP" else None
        self._zlib = zlib.compressobj() if compression == "ZLIB" else None

    def add(self, payload: bytes, samples: int, raw_bytes: int) -> None:
        """Appends one record (``payload`` is framed here)."""
        self.add_frame([frame(payload)], samples, raw_bytes)

    def add_frame(self, pieces: Sequence[Any], samples: int, raw_bytes: int) -> None:
        """Appends one framed record given as pieces (bytes or buffers) that make it up in
        order; uncompressed, each piece is hashed and written as it is (no copy)."""
        if self._gzip is not None:
            self._gzip.write(b"".join(pieces))
        elif self._zlib is not None:
            self.write(self._zlib.compress(b"".join(pieces)))
        else:
            for piece in pieces:
                self.write(piece)
        self.records += 1
        self.samples += samples
        self.raw_bytes += raw_bytes

    def finish(self) -> None:
        """Writes what a compressor still holds: every byte of the shard is written."""
        if self._gzip is not None:
            self._gzip.close()
            self._gzip = None
        if self._zlib is not None:
            self.write(self._zlib.flush())
            self._zlib = None

    def seal(self) -> tuple[Shard, int]:
        """Syncs the finished shard and renames it into place: ``(its Shard, decoded
        bytes)``."""
        sha256 = self.commit()
        shard = Shard(file=self.path.name, samples=self.samples, records=self.records,
                      bytes=self.bytes, sha256=sha256)
        return shard, self.raw_bytes

    def close(self) -> tuple[Shard, int]:
        """Finishes the shard and renames it into place: ``(its Shard, decoded bytes)``."""
        self.finish()
        return self.seal()


def encode_block(block: Mapping[str, Any], features: Mapping[str, Feature]) -> tuple[bytes, int]:
    """One record's payload for a block of samples, and the bytes of their values."""
    raw: dict[str, Any] = {}
    lengths: dict[str, list[int]] = {}
    size = 0
    for name, f in features.items():
        value = block[name]
        if f.variable:
            lengths[name + LENGTHS_SUFFIX] = [len(r) for r in value]
            value = np.concatenate([np.asarray(r).reshape(-1, *f.inner_shape) for r in value])
        arr = np.ascontiguousarray(value, dtype=np.dtype(f.dtype).newbyteorder("<"))
        data = memoryview(arr).cast("B")
        raw[name] = data
        size += data.nbytes
    return encode_example(raw, lengths), size


def _records(rows: Mapping[str, Any], features: Mapping[str, Feature], k: int,
             layouts: dict[int, tuple[list, np.ndarray, int]]) -> list:
    """Gathered rows as framed records of ``k`` samples, each a list of pieces: the frame
    header, the ``tf.train.Example``'s tags and lengths, views of the rows' bytes (no
    copy), the CRC32C of the data (one call for all records). Byte for byte
    ``frame(encode_block(...)[0])``; a source with variable features goes that way.

    Returns:
        ``[(pieces, samples, decoded bytes)]``; the pieces refer to ``rows``' memory.
    """
    n = len(next(iter(rows.values())))
    if any(f.variable for f in features.values()):
        out = []
        for a in range(0, n, k):
            payload, raw = encode_block({name: col[a:a + k] for name, col in rows.items()},
                                        features)
            out.append(([frame(payload)], min(k, n - a), raw))
        return out
    cols = {name: np.ascontiguousarray(rows[name], dtype=np.dtype(f.dtype).newbyteorder("<"))
            for name, f in features.items()}
    row_bytes = {name: col.nbytes // max(n, 1) for name, col in cols.items()}
    views = {name: memoryview(col).cast("B") for name, col in cols.items()}
    sample = sum(row_bytes.values())
    addresses, spans, records = [], [], []
    for a in range(0, n, k):
        m = min(k, n - a)
        if m not in layouts:
            layout = example_layout({name: m * b for name, b in row_bytes.items()})
            fixed = np.array([np.frombuffer(p, np.uint8).ctypes.data if isinstance(p, bytes)
                              else 0 for p in layout], np.uint64)
            layouts[m] = (layout, fixed, sum(p[1] if isinstance(p, tuple) else len(p)
                                             for p in layout))
        layout, fixed, length = layouts[m]
        first = len(addresses)
        pieces: list[Any] = [frame_header(length)]
        for p, address in zip(layout, fixed.tolist(), strict=True):
            if isinstance(p, tuple):
                name, size = p
                start = a * row_bytes[name]
                pieces.append(views[name][start:start + size])
                addresses.append((cols[name].ctypes.data + start, size))
            else:
                pieces.append(p)
                addresses.append((address, len(p)))
        spans.append((first, len(addresses)))
        records.append((pieces, m, m * sample))
    crcs = crc32c_spans(np.array(addresses, np.uint64), np.array(spans, np.int64))
    for (pieces, _, _), crc in zip(records, crcs.tolist(), strict=True):
        pieces.append(struct.pack("<I", mask_crc(crc)))
    return records


def write_shard(source: ArraySource, indices: np.ndarray, path: Path, k: int,
                compression: str | None, report: Callable[[int], None] | None = None, *,
                pipe: WritePipe | None = None, key: Hashable = None
                ) -> tuple[Shard, int] | None:
    """Writes the samples ``indices`` of ``source`` as one shard, ``k`` a record (reading
    ~16 MiB of rows at a time, or the source's ``chunk_bytes`` if smaller, then releasing
    their pages), its stages overlapped (:class:`~memfit.data.packing.pack_writing.WritePipe`).

    Example:
        >>> import tempfile
        >>> from memfit.data.sources.columns import ArraySource
        >>> src = ArraySource({"x": np.arange(6.0)})
        >>> done = []
        >>> with WritePipe(done.extend) as pipe:
        ...     write_shard(src, np.arange(6), Path(tempfile.mkdtemp()) / "s.tfrecord", 2,
        ...                 None, pipe=pipe, key="s")
        >>> done[0][0], done[0][1][0].records
        ('s', 3)

    Args:
        report: called with the samples of each piece of rows gathered.
        pipe: hand the shard to this pipe and return once every record is handed over
            (the pipe commits it as ``key``; returns ``None``); without one, returns
            ``(its Shard, decoded bytes)`` once the shard is in place.
    """
    if pipe is None:
        done: list[tuple[Hashable, Any]] = []
        with WritePipe(done.extend) as own:
            _feed_shard(source, indices, path, k, compression, report, own, key)
        return done[0][1]
    _feed_shard(source, indices, path, k, compression, report, pipe, key)
    return None


def _feed_shard(source: ArraySource, indices: np.ndarray, path: Path, k: int,
                compression: str | None, report: Callable[[int], None] | None,
                pipe: WritePipe, key: Hashable) -> None:
    fixed = sum(f.sample_bytes or 64 for f in source.features.values())
    chunk_bytes = min(getattr(source, "chunk_bytes", CHUNK_BYTES), _PIPE_CHUNK_BYTES)
    chunk = max(k, (chunk_bytes // max(fixed, 1)) // k * k)
    writer = ShardWriter(path, compression)
    pipe.adopt(writer)
    layouts: dict[int, tuple[list, np.ndarray, int]] = {}
    for start in range(0, len(indices), chunk):
        rows = gather(source, indices[start:start + chunk])
        n = len(indices[start:start + chunk])
        records = _records(rows, source.features, k, layouts)
        source.release_pages()
        pipe.put(lambda records=records: [writer.add_frame(*r) for r in records])
        if report is not None:
            report(n)
    pipe.complete(writer, key, writer.finish, writer.seal)


def _process_job(paths: dict[str, str], variable: list[str], indices: np.ndarray, path: str,
                 k: int, compression: str | None) -> tuple[Shard, int]:
    source = open_source(paths, variable=variable)
    assert isinstance(source, ArraySource)
    return write_shard(source, indices, Path(path), k, compression)


def _split(name: str, shards: list[tuple[Shard, int]]) -> Split:
    """A split from its written shards and their decoded bytes."""
    return Split(name=name, samples=sum(s.samples for s, _ in shards),
                 records=sum(s.records for s, _ in shards),
                 raw_bytes=sum(r for _, r in shards), shards=tuple(s for s, _ in shards))


def _save_manifest(src: ArraySource | StreamSource, out: Path, splits: dict[str, Split], k: int,
                   options: PackOptions, fingerprint: str | None) -> Manifest:
    manifest = Manifest(features=dict(src.features), splits=splits, samples_per_record=k,
                        compression=options.compression, seed=options.seed,
                        shuffled=bool(options.shuffle), memfit_version=__version__,
                        source=src.description, path=out, fingerprint=fingerprint or "",
                        class_names=tuple(src.class_names))
    manifest.save(out)
    return manifest


class _Job(NamedTuple):
    """One shard to write: shard ``index`` of ``count`` of a split, and its samples."""

    split: str
    index: int
    count: int
    indices: np.ndarray

    def file(self, compression: str | None) -> str:
        return shard_name(self.split, self.index, self.count, compression)


def _sample_bytes(src: ArraySource, order: np.ndarray) -> float:
    """Mean bytes of a sample: fixed features exactly, variable ones from (up to) the
    first 1000 samples of the order."""
    fixed = sum(f.sample_bytes or 0 for f in src.features.values())
    variable_bytes = 0.0
    if any(f.variable for f in src.features.values()):
        probe = src.take(order[: min(src.length, 1000)])
        variable_bytes = sum(sum(np.asarray(r).nbytes for r in probe[f.name]) / len(probe[f.name])
                             for f in src.features.values() if f.variable)
    return fixed + variable_bytes


def _samples_per_record(options: PackOptions, sample_bytes: float, smallest: int) -> int:
    """``samples_per_record``, or about 256 KiB a record; an explicit shard count or shard
    size is honoured: small data gets smaller records, not fewer or larger shards (a
    stranger's ``--shard-size 20KB`` gave one shard of 152 KiB, silently)."""
    k = options.samples_per_record or _default_samples_per_record(sample_bytes)
    if options.samples_per_record is None and options.shards is not None:
        while k > 1 and math.ceil(smallest / k) < options.shards:
            k //= 2
    if options.samples_per_record is None and options.shard_bytes is not None:
        while k > 1 and k * sample_bytes > options.shard_bytes:
            k //= 2
    return k


def _jobs(splits: list[tuple[str, np.ndarray]], k: int, sample_bytes: float,
          options: PackOptions) -> list[_Job]:
    """The shards of each split: ``options.shards``, or enough for the shard size (by
    default at most ``_MAX_SHARD_BYTES``, at least ``_MIN_SHARDS``), whole records each."""
    jobs = []
    for name, idx in splits:
        count = len(idx)
        records = math.ceil(count / k)
        if options.shards is not None:
            num = options.shards
        elif options.shard_bytes is not None:
            num = math.ceil(count * sample_bytes / options.shard_bytes)
        else:
            num = max(math.ceil(count * sample_bytes / _MAX_SHARD_BYTES), _MIN_SHARDS)
        num = max(1, min(num, records))
        bounds = np.linspace(0, records, num + 1).round().astype(int) * k
        for i in range(num):
            jobs.append(_Job(name, i, num, idx[bounds[i]:min(bounds[i + 1], count)]))
    return jobs


class _Finished:
    """The shards written so far, each recorded in the pack's state as it finishes; on a
    rerun, the shards of the interrupted pack whose sha256 still matches."""

    def __init__(self, out: Path, state: dict[str, Any], fingerprint: str | None):
        self.out = out
        self.fingerprint = fingerprint
        self.shards: dict[str, tuple[Shard, int]] = {}
        for file, info in state.get("shards", {}).items():
            if (out / file).exists() and file_sha256(out / file) == info["shard"]["sha256"]:
                self.shards[file] = (Shard(**info["shard"]), info["raw_bytes"])
        self.kept = len(self.shards)

    def record(self, file: str, result: tuple[Shard, int]) -> None:
        self.record_batch([(file, result)])

    def record_batch(self, results: list[tuple[Any, tuple[Shard, int]]]) -> None:
        """Records shards finished (in their state file, once for all of them)."""
        for file, result in results:
            self.shards[file] = result
        save_state(self.out, {
            "fingerprint": self.fingerprint,
            "shards": {f: {"shard": dataclasses.asdict(s), "raw_bytes": r}
                       for f, (s, r) in self.shards.items()}})


def _write_in_parallel(src: ArraySource, out: Path, todo: list[_Job], k: int,
                       options: PackOptions, done: _Finished, report: Callable[[int], None]
                       ) -> None:
    """Writes the shards on ``options.workers`` processes (``.npy`` files: each reopens
    them) or threads (arrays in memory), recording each as it finishes."""
    compression = options.compression
    reopen = set(src.paths) == set(src.columns)
    if reopen:
        unguarded = unguarded_script()
        if unguarded:
            # Found before a writer starts: each would import the script and pack again
            # (then die, each with its traceback, and leave semaphores behind).
            raise DatasetError(f"memfit.pack(workers={options.workers}) cannot start its "
                               f"writer processes: {unguarded}")
        pool: cf.Executor = cf.ProcessPoolExecutor(
            options.workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=die_with_parent, initargs=(os.getpid(),))
    else:
        pool = cf.ThreadPoolExecutor(options.workers)
    variable = [f.name for f in src.features.values() if f.variable]
    with pool:
        futures = {}
        for job in todo:
            file = job.file(compression)
            if reopen:
                fut = pool.submit(_process_job, src.paths, variable, job.indices,
                                  str(out / file), k, compression)
            else:
                fut = pool.submit(write_shard, src, job.indices, out / file, k, compression)
            futures[fut] = (file, len(job.indices))
        try:
            for fut in cf.as_completed(futures):
                file, count = futures[fut]
                done.record(file, fut.result())
                report(count)
        except BaseException as e:
            pool.shutdown(wait=True, cancel_futures=True)
            if isinstance(e, cf.process.BrokenProcessPool):
                raise DatasetError(writer_died(options.workers)) from None
            raise


def pack_shards(src: ArraySource, out: Path, state: dict[str, Any], options: PackOptions,
                fingerprint: str | None, progress: bool) -> tuple[Manifest, int]:
    """Writes a source of known length as shards (see the module docstring).

    Args:
        src: the source; out: the output directory (:func:`~memfit.data.packing.pack_output.
            prepare_output` made it ready and returned ``state``).
        options: the pack's options; fingerprint: what is packed (``None``: an iterable).
        progress: show a progress bar.

    Returns:
        The manifest written and the number of shards kept from an interrupted run.
    """
    order, splits = split_order(src.length, options)
    sample_bytes = _sample_bytes(src, order)
    k = _samples_per_record(options, sample_bytes, min(len(idx) for _, idx in splits))
    jobs = _jobs(splits, k, sample_bytes, options)
    done = _Finished(out, state, fingerprint)
    compression = options.compression
    todo = [job for job in jobs if job.file(compression) not in done.shards]
    bar = progress_bar(src.length, progress, f"pack {shown_name(out)}")
    bar.update(src.length - sum(len(job.indices) for job in todo))
    try:
        if options.workers == 1 or len(todo) <= 1:
            with WritePipe(done.record_batch) as pipe:
                for job in todo:
                    file = job.file(compression)
                    write_shard(src, job.indices, out / file, k, compression, bar.update,
                                pipe=pipe, key=file)
        else:
            _write_in_parallel(src, out, todo, k, options, done, bar.update)
    finally:
        bar.close()
    written = {name: _split(name, [done.shards[job.file(compression)] for job in jobs
                                   if job.split == name]) for name, _ in splits}
    return _save_manifest(src, out, written, k, options, fingerprint), done.kept


class _StreamShards:
    """The shards of an iterable, per split: samples gathered into blocks of ``k``
    (decided from the first sample unless given), blocks appended to a shard until it
    holds ``shard_bytes``; shards keep temporary names until every split has one."""

    def __init__(self, src: StreamSource, out: Path, options: PackOptions,
                 rng: np.random.Generator, report: Callable[[int], None]):
        self.src = src
        self.out = out
        self.compression = options.compression
        self.shard_bytes = options.shard_bytes or _STREAM_SHARD_BYTES
        self.k = options.samples_per_record
        self.rng = rng
        self.report = report
        self.names = list(options.fractions)
        self.probs = np.array([options.fractions[s] for s in self.names])
        self.pending: dict[str, list[dict]] = {s: [] for s in self.names}
        self.writers: dict[str, ShardWriter | None] = {s: None for s in self.names}
        self.finished: dict[str, list[tuple[Shard, int]]] = {s: [] for s in self.names}

    def emit(self, s: dict) -> None:
        """Sends one sample to a split drawn by its fraction."""
        names = self.names
        name = names[0] if len(names) == 1 else names[self.rng.choice(len(names), p=self.probs)]
        if self.k is None:
            self.k = _default_samples_per_record(_nbytes(s))
        self.pending[name].append(s)
        if len(self.pending[name]) >= self.k:
            self._flush_block(name)
        self.report(1)

    def _flush_block(self, name: str) -> None:
        block_samples = self.pending[name]
        block = {f: [s[f] for s in block_samples] for f in self.src.features}
        for f, feat in self.src.features.items():
            if not feat.variable:
                block[f] = np.stack(block[f])
        payload, raw_bytes = encode_block(block, self.src.features)
        if self.writers[name] is None:
            part = len(self.finished[name])
            self.writers[name] = ShardWriter(
                temporary_name(self.out / f"{name}-{part:05d}.part"), self.compression)
        w = self.writers[name]
        assert w is not None
        w.add(payload, len(block_samples), raw_bytes)
        self.pending[name] = []
        if w.bytes >= self.shard_bytes:
            self.finished[name].append(w.close())
            self.writers[name] = None

    def close(self) -> None:
        """Writes the blocks left and finishes every open shard."""
        for name in self.names:
            if self.pending[name]:
                self._flush_block(name)
            w = self.writers[name]
            if w is not None:
                self.finished[name].append(w.close())
                self.writers[name] = None

    def abandon(self) -> None:
        """Deletes every shard of this pack (open or finished, under temporary names)."""
        for w in self.writers.values():
            if w is not None:
                w.abandon()
        self.remove_parts()

    def remove_parts(self) -> None:
        for p in self.out.glob(f"{TMP_MARK}{os.getpid()}-*.part"):
            p.unlink()

    def splits(self) -> dict[str, Split]:
        """The splits, each shard renamed to its final name."""
        splits = {}
        for name in self.names:
            count = len(self.finished[name])
            shard_list = []
            for i, (shard, raw) in enumerate(self.finished[name]):
                final = shard_name(name, i, count, self.compression)
                os.replace(self.out / shard.file, self.out / final)
                shard_list.append((dataclasses.replace(shard, file=final), raw))
            splits[name] = _split(name, shard_list)
        return splits


def _nbytes(sample: dict) -> int:
    return sum(v.nbytes for v in sample.values())


def pack_stream(src: StreamSource, out: Path, options: PackOptions, progress: bool) -> Manifest:
    """Packs an iterable of unknown length: bounded shuffle buffer, shards cut by size."""
    rng = np.random.default_rng(options.seed)
    if options.shards is not None:
        raise DatasetError(f"An iterable source has no known length: give shard_size instead "
                           f"of shards. Received: shards={options.shards!r}")
    bar = progress_bar(None, progress, f"pack {shown_name(out)}")
    shards = _StreamShards(src, out, options, rng, bar.update)
    buffer: list[dict] = []
    held = 0
    try:
        for s in src.samples():
            if not options.shuffle:
                shards.emit(s)
                continue
            buffer.append(s)
            held += _nbytes(s)
            if held >= options.buffer_bytes:
                j = int(rng.integers(len(buffer)))
                buffer[j], buffer[-1] = buffer[-1], buffer[j]
                out_s = buffer.pop()
                held -= _nbytes(out_s)
                shards.emit(out_s)
        for j in rng.permutation(len(buffer)):
            shards.emit(buffer[j])
        shards.close()
    except BaseException:
        shards.abandon()
        raise
    finally:
        bar.close()
    for name in shards.names:           # before any shard gets its final name
        if not shards.finished[name]:
            shards.remove_parts()
            raise DatasetError(f"split {name!r} received no samples; use fewer splits or more "
                               f"data. Received: split={options.split}")
    return _save_manifest(src, out, shards.splits(), shards.k or 1, options, None)
