"""What both packers share (the TFRecord shards of :mod:`memfit.data.packing.pack_shards` and the
``.npy`` files of :mod:`memfit.data.packing.arrays_pack`): the options of a pack, checked in one
place (:class:`PackOptions`), the samples each split gets (:func:`split_order`, one
seeded permutation), files written under a temporary name with their sha256
(:class:`HashingWriter`), written and finished in background threads while the next
bytes are prepared (:class:`WritePipe`, :class:`Committer`: fsync and rename), and the
progress bar.

Example:
    >>> options = PackOptions.of(split="train=0.75,val=0.25", seed=1)
    >>> order, splits = split_order(8, options)
    >>> [(name, len(idx)) for name, idx in splits]
    [('train', 6), ('val', 2)]
    >>> sorted(np.concatenate([idx for _, idx in splits]).tolist()) == list(range(8))
    True
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import errno
import fcntl
import hashlib
import json
import math
import mmap
import os
import queue
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from memfit import checks
from memfit.atomic import discard, temporary_name
from memfit.data.sources.columns import ArraySource, StreamSource
from memfit.errors import DatasetError
from memfit.sizes import parse_size

__all__ = ["PackOptions", "HashingWriter", "Committer", "WritePipe", "gather", "CHUNK_BYTES",
           "parse_split", "split_counts", "check_split_counts", "split_order", "progress_bar"]

CHUNK_BYTES = 32 * 2**20        # bytes of rows read from a source at once
STAGING_BYTES = 4 * 2**20       # a HashingWriter's direct writes
ALIGN = 4096                    # what O_DIRECT needs of addresses, sizes and offsets


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
        raise DatasetError(f"{', '.join(extra)} apply to format='tfrecord' only; "
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
    if isinstance(split, str):
        parts = {}
        for item in split.split(","):
            name, sep, value = item.partition("=")
            try:
                if not sep:
                    raise ValueError
                parts[name.strip()] = float(value)
            except ValueError:
                raise DatasetError(f"split must look like 'train=0.9,val=0.1'. "
                                   f"Received: split={split!r}") from None
        split = parts
    split = dict(split)
    bad = [n for n, v in split.items() if not n or "/" in n or "-" in n or not 0 < v <= 1]
    total = sum(split.values())
    if bad or not split or abs(total - 1) > 1e-6:
        raise DatasetError(f"split needs names without '-' or '/' and fractions in (0, 1] "
                           f"that sum to 1 (they sum to {total:g}). Received: split={split}")
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
    """A tqdm bar of samples on stderr (disabled: does nothing)."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit=" samples", unit_scale=True,
                desc=what, dynamic_ncols=True, leave=False)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


class HashingWriter:
    """A file written under a temporary name (``.tmp-<pid>-<name>``), hashing the bytes
    that land on disk, renamed into place when complete (:meth:`commit`) or deleted
    (:meth:`abandon`): a reader never sees half a file under its final name.

    Where the file system allows it, the file is written with ``O_DIRECT`` from a
    page-aligned staging buffer of :data:`STAGING_BYTES`, written by an I/O thread while
    the next bytes are hashed and staged in a second buffer (the bytes go to the disk
    without a copy in the page cache, whose upkeep cost this machine's kernel more than
    the disk took: 2 GiB written and fsynced in 1.2 s direct, 4.4-7.2 s buffered), the
    tail that does not fill a block written through the page cache; elsewhere (tmpfs...),
    buffered. The bytes, and their sha256, are the same either way.

    Example:
        >>> import tempfile
        >>> w = HashingWriter(Path(tempfile.mkdtemp()) / "a.bin")
        >>> w.write(b"memfit"), w.commit()[:12], w.path.read_bytes()
        (6, '294850f9e395', b'memfit')
    """

    def __init__(self, path: Path, direct: bool = True):
        self.path = path
        self.tmp = temporary_name(path)
        self._sha = hashlib.sha256()
        self.bytes = 0
        self._stages: list[mmap.mmap] = []
        self._staged = 0
        self._io: cf.ThreadPoolExecutor | None = None
        self._inflight: cf.Future | None = None
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(self.tmp, flags | os.O_DIRECT, 0o666)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        if fd >= 0:
            self._file: IO[bytes] = open(fd, "wb", buffering=0)
            self._stages = [mmap.mmap(-1, STAGING_BYTES), mmap.mmap(-1, STAGING_BYTES)]
            self._io = cf.ThreadPoolExecutor(1, thread_name_prefix="memfit-direct")
        else:
            self._file = open(self.tmp, "wb")

    def write(self, data: Any) -> int:
        """Writes ``data`` (bytes or a buffer); returns its size (a file-like sink)."""
        self._sha.update(data)
        size = memoryview(data).nbytes
        if not self._stages:
            self._file.write(data)
        else:
            view = memoryview(data).cast("B")
            done = 0
            while done < size:
                n = min(size - done, STAGING_BYTES - self._staged)
                self._stages[0][self._staged:self._staged + n] = view[done:done + n]
                self._staged += n
                done += n
                if self._staged == STAGING_BYTES:
                    self._flip()
        self.bytes += size
        return size

    def _flip(self) -> None:
        """Writes the full staging buffer in the I/O thread (after the one before it) and
        stages the next bytes in the other buffer meanwhile."""
        assert self._io is not None
        self._wait()
        full = self._stages[0]
        self._inflight = self._io.submit(self._write_out, full, STAGING_BYTES)
        self._stages.reverse()
        self._staged = 0

    def _wait(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def _write_out(self, stage: mmap.mmap, n: int) -> None:
        """Writes the first ``n`` bytes of ``stage``: the whole blocks direct, the tail
        through the page cache."""
        fd = self._file.fileno()
        aligned = n - n % ALIGN
        try:
            _write_all(fd, memoryview(stage)[:aligned])
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._buffered(fd)                  # a file system that refuses O_DIRECT writes
            _write_all(fd, memoryview(stage)[:aligned])
        if n > aligned:
            self._buffered(fd)
            _write_all(fd, memoryview(stage)[aligned:n])

    @staticmethod
    def _buffered(fd: int) -> None:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)

    def flush(self) -> None:
        """Flushes Python's buffer (direct: the staged bytes wait for :meth:`commit`)."""
        if not self._stages:
            self._file.flush()

    def commit(self) -> str:
        """Syncs the file and renames it into place; returns its sha256."""
        if self._stages:
            self._wait()
            self._write_out(self._stages[0], self._staged)
            self._release_stages()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        return self._sha.hexdigest()

    def abandon(self) -> None:
        """Closes and deletes the temporary file."""
        try:
            self._wait()
        except OSError:
            pass
        discard(self._file, self.tmp)
        self._release_stages()

    def _release_stages(self) -> None:
        stages, self._stages = self._stages, []
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
        for stage in stages:
            try:
                stage.close()
            except BufferError:     # a view of it lives on in a traceback: freed with it
                pass


class Committer:
    """Commits finished files in a background thread (``commit``: fsync, rename into
    place, as :meth:`HashingWriter.commit`), in the order they are handed over, while the
    caller writes the next ones; ``on_batch`` receives ``[(key, what commit returned)]``
    for the files committed since its last call, each time the thread catches up (a pack
    records them in its state once for several files when the disk is the slower side).

    A commit that fails stops the committer: the files handed over after it are deleted
    (their ``abandon``), :attr:`error` holds the exception and :meth:`close` raises it.
    Leaving a ``with`` block waits for every file handed over (after an interrupt, too:
    what was finished is kept, for a rerun to resume).

    Example:
        >>> import tempfile
        >>> done = []
        >>> with Committer(done.extend) as c:
        ...     w = HashingWriter(Path(tempfile.mkdtemp()) / "a.bin")
        ...     _ = w.write(b"memfit")
        ...     c.submit("a", w.commit, w.abandon)
        >>> done[0][0], done[0][1][:12]
        ('a', '294850f9e395')

    Args:
        on_batch: called in the committer's thread with the files committed, in order.
    """

    def __init__(self, on_batch: Callable[[list[tuple[Hashable, Any]]], None]):
        self.on_batch = on_batch
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[Hashable, Callable[[], Any], Callable[[], None]]
                                 | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="memfit-commit", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, commit: Callable[[], Any],
               abandon: Callable[[], None]) -> None:
        """Hands over a file whose every byte is written: ``commit()`` syncs and renames it
        (its result goes to ``on_batch`` with ``key``), ``abandon()`` deletes it instead."""
        self._queue.put((key, commit, abandon))

    def _run(self) -> None:
        batch: list[tuple[Hashable, Any]] = []
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, commit, abandon = item
            if self.error is not None:
                abandon()
                continue
            try:
                batch.append((key, commit()))
                if self._queue.empty() or self._queue.queue[0] is None:
                    done, batch = batch, []
                    self.on_batch(done)
            except BaseException as e:                  # close() raises it
                self.error = e
                abandon()
                done, batch = batch, []     # committed before the failure: still reported
                if done:
                    try:
                        self.on_batch(done)
                    except BaseException:   # noqa: BLE001 -- the first error is raised
                        pass

    def close(self) -> None:
        """Waits for every file handed over; raises the first commit's error, if any."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is None:
            self.close()
            return
        self._queue.put(None)                   # interrupted: finish what was handed over
        self._thread.join()


class WritePipe:
    """Overlaps preparing a file's bytes with writing them: the caller hands over work
    (:meth:`put`: a function that writes, say, a piece of records into a
    :class:`HashingWriter`, which hashes as it writes; hashlib and the file write release
    the GIL on large buffers), a writer thread runs it in order while the caller prepares
    the next piece, and a :class:`Committer` syncs and renames each finished file
    (:meth:`complete`), then reports it to ``on_batch``. At most one piece of work waits
    between the caller and the writer thread.

    Leaving the ``with`` block waits for all of it; an error in a thread stops the pipe
    (the caller's next :meth:`put` raises it, else the end of the block does). After an
    interrupt, the files completed are still committed (a rerun keeps them) and those
    not completed are deleted.

    Example:
        >>> import tempfile
        >>> done = []
        >>> with WritePipe(done.extend) as pipe:
        ...     w = HashingWriter(Path(tempfile.mkdtemp()) / "a.bin")
        ...     pipe.adopt(w)
        ...     pipe.put(lambda: w.write(b"memfit"))
        ...     pipe.complete(w, "a", lambda: None, w.commit)
        >>> done[0][0], done[0][1][:12]
        ('a', '294850f9e395')

    Args:
        on_batch: receives ``[(key, what commit returned)]`` in the committer's thread.
    """

    def __init__(self, on_batch: Callable[[list[tuple[Hashable, Any]]], None]):
        self.committer = Committer(on_batch)
        self.error: BaseException | None = None
        self._pending: set[HashingWriter] = set()   # handed to the pipe, not committed
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="memfit-write", daemon=True)
        self._thread.start()

    def adopt(self, writer: HashingWriter) -> None:
        """From now on the pipe commits ``writer`` (once completed) or deletes it."""
        self._pending.add(writer)

    def put(self, work: Callable[[], Any]) -> None:
        """Runs ``work()`` in the writer thread after the work before it; raises the
        error that stopped a thread of the pipe."""
        for error in (self.error, self.committer.error):
            if error is not None:
                raise error
        self._queue.put(work)

    def complete(self, writer: HashingWriter, key: Hashable, finish: Callable[[], None],
                 commit: Callable[[], Any]) -> None:
        """After the work handed over, ``finish()`` (the last bytes), then the committer
        runs ``commit()`` (sync and rename; its result goes to ``on_batch`` as ``key``)."""
        def hand_over() -> None:
            finish()
            self._pending.discard(writer)
            self.committer.submit(key, commit, writer.abandon)

        self.put(hand_over)

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            if self.error is not None or self.committer.error is not None:
                continue                                # deleted when the pipe closes
            try:
                work()
            except BaseException as e:                  # the caller raises it
                self.error = e

    def __enter__(self) -> WritePipe:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self._queue.put(None)
        self._thread.join()
        for writer in self._pending:
            writer.abandon()
        self._pending.clear()
        if kind is not None:
            self.committer.__exit__(kind, value, tb)
            return
        self.committer.close()
        if self.error is not None:
            raise self.error
