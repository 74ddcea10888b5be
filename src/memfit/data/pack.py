"""``memfit.pack``: write a source into checksummed TFRecord shards plus ``manifest.json``
(or, with ``format="arrays"``, into one ``.npy`` file per split and feature: see
:mod:`memfit.data.arrays`).

Samples are written in a seeded global shuffle order (so every shard is already a mix),
in blocks of ``samples_per_record`` per record, split into shards of about equal size.
Shards are written under temporary names and renamed when complete; the manifest comes
last. Rerunning an interrupted pack with the same arguments keeps the shards that were
finished (after checking their sha256) and writes the rest.

Example:
    >>> import numpy as np, tempfile
    >>> out = tempfile.mkdtemp() + "/train"
    >>> result = pack({"x": np.zeros((1000, 8), "float32"), "y": np.arange(1000)}, out,
    ...               progress=False)
    >>> result.samples, sorted(result.manifest.features)
    (1000, ['x', 'y'])
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import errno
import gzip
import hashlib
import json
import math
import multiprocessing
import os
import re
import resource
import shutil
import signal
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memfit._version import __version__
from memfit.atomic import TMP_MARK, discard, file_sha256, temporary_name, write_text_atomic
from memfit.data.manifest import MANIFEST, Feature, Manifest, Shard, Split, shard_name
from memfit.data.records import LENGTHS_SUFFIX, encode_example, frame
from memfit.data.sources import ArraySource, StreamSource, csv_to_npy, open_source
from memfit.errors import DatasetError
from memfit.sizes import format_size, parse_size

if TYPE_CHECKING:
    from memfit.data.arrays import ArraysManifest

__all__ = ["pack", "PackResult", "parse_split"]

STATE = ".memfit-pack-state.json"
_TARGET_RECORD_BYTES = 256 * 1024
_MAX_SHARD_BYTES = 256 * 2**20
# Enough shards that the reader can interleave a different group of them every epoch.
_MIN_SHARDS = 64
_CHUNK_BYTES = 32 * 2**20


@dataclasses.dataclass
class PackResult:
    """What a pack wrote: the manifest, and how long it took.

    Attributes:
        path: the dataset directory.
        manifest: the manifest that was written (an ``ArraysManifest`` for
            ``format="arrays"``).
        seconds: wall time of the pack.
        kept_shards: shards of an interrupted earlier run that were verified and kept.
    """

    path: Path
    manifest: Manifest | ArraysManifest
    seconds: float
    kept_shards: int = 0

    @property
    def samples(self) -> int:
        return self.manifest.samples

    @property
    def bytes(self) -> int:
        return self.manifest.bytes

    def __str__(self) -> str:
        m = self.manifest
        if isinstance(m, Manifest):
            count = sum(len(s.shards) for s in m.splits.values())
            files = f"{count} shards"
        else:                                           # an arrays dataset
            count = m.file_count
            files = f"{m.file_count} .npy files"
        splits = ", ".join(f"{n}={s.samples:,}" for n, s in m.splits.items())
        rate = self.bytes / max(self.seconds, 1e-9)
        kept = f"; kept {self.kept_shards} verified shards from the interrupted run" \
            if self.kept_shards else ""
        if self.kept_shards == count:
            kept = "; it was complete already (the same pack): every file verified, none written"
        return (f"packed {self.samples:,} samples ({splits}) into {files}, "
                f"{format_size(self.bytes)} in {self.seconds:.1f} s "
                f"({format_size(rate)}/s, {self.samples / max(self.seconds, 1e-9):,.0f} "
                f"samples/s) at {self.path}{kept}")


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
    raw = {k: n * v for k, v in split.items()}
    counts = {k: int(math.floor(v)) for k, v in raw.items()}
    short = n - sum(counts.values())          # largest remainders get the leftover samples
    for k in sorted(raw, key=lambda k: raw[k] - counts[k], reverse=True)[:short]:
        counts[k] += 1
    return counts


def _default_samples_per_record(sample_bytes: float) -> int:
    k = max(1, int(_TARGET_RECORD_BYTES // max(sample_bytes, 1)))
    return min(1 << (k.bit_length() - 1), 4096)


class _ShardWriter:
    """Writes framed records to a temporary file, hashing what lands on disk."""

    def __init__(self, path: Path, compression: str | None):
        self.path = path
        self.tmp = temporary_name(path)
        self._file = open(self.tmp, "wb")
        self._sha = hashlib.sha256()
        self.bytes = self.records = self.samples = self.raw_bytes = 0
        self._gzip = gzip.GzipFile(fileobj=self, mode="wb", mtime=0) \
            if compression == "GZIP" else None
        self._zlib = zlib.compressobj() if compression == "ZLIB" else None

    # file-like sink for GzipFile
    def write(self, data: bytes) -> int:
        self._sha.update(data)
        self._file.write(data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        self._file.flush()

    def add(self, payload: bytes, samples: int, raw_bytes: int) -> None:
        record = frame(payload)
        if self._gzip is not None:
            self._gzip.write(record)
        elif self._zlib is not None:
            self.write(self._zlib.compress(record))
        else:
            self.write(record)
        self.records += 1
        self.samples += samples
        self.raw_bytes += raw_bytes

    def close(self) -> tuple[Shard, int]:
        if self._gzip is not None:
            self._gzip.close()
        if self._zlib is not None:
            self.write(self._zlib.flush())
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        shard = Shard(file=self.path.name, samples=self.samples, records=self.records,
                      bytes=self.bytes, sha256=self._sha.hexdigest())
        return shard, self.raw_bytes

    def abandon(self) -> None:
        discard(self._file, self.tmp)


def _encode_block(block: Mapping[str, Any], features: Mapping[str, Feature]) -> tuple[bytes, int]:
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


def _write_indexed_shard(source: ArraySource, indices: np.ndarray, path: Path, k: int,
                         compression: str | None,
                         report: Callable[[int], None] | None = None) -> tuple[Shard, int]:
    fixed = sum(f.sample_bytes or 64 for f in source.features.values())
    chunk = max(k, (_CHUNK_BYTES // max(fixed, 1)) // k * k)
    writer = _ShardWriter(path, compression)
    try:
        for start in range(0, len(indices), chunk):
            rows = source.take(indices[start:start + chunk])
            n = len(indices[start:start + chunk])
            for a in range(0, n, k):
                block = {name: col[a:a + k] for name, col in rows.items()}
                payload, raw_bytes = _encode_block(block, source.features)
                writer.add(payload, min(k, n - a), raw_bytes)
            source.release_pages()
            if report is not None:
                report(n)
        return writer.close()
    except BaseException:
        writer.abandon()
        raise


def _die_with_parent() -> None:
    """A writer process dies with the pack that started it (Linux): a killed pack must not
    leave writers that go on renaming shards into place while it is rerun."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)            # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _process_job(paths: dict[str, str], variable: list[str], indices: np.ndarray, path: str,
                 k: int, compression: str | None) -> tuple[Shard, int]:
    source = open_source(paths, variable=variable)
    assert isinstance(source, ArraySource)
    return _write_indexed_shard(source, indices, Path(path), k, compression)


# A temporary name made by memfit.atomic.temporary_name: ".tmp-<pid>-<name>".
_TEMPORARY = re.compile(rf"^{re.escape(TMP_MARK)}(\d+)-")


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _clear_stale_temporaries(out: Path, keep: Collection[str]) -> None:
    """Deletes the temporary files (``.tmp-<pid>-...``, in ``out`` and its split
    subdirectories) of packs that were killed: a rerun must not leave them behind.

    Raises:
        DatasetError: if one belongs to a process still running (another pack writing
            into the same directory).
    """
    dirs = [out] + [p for p in out.iterdir() if p.is_dir() and not p.is_symlink()
                    and not p.name.startswith(TMP_MARK)]
    for d in dirs:
        for p in d.iterdir():
            match = _TEMPORARY.match(p.name)
            if match is None or p.name in keep:
                continue
            pid = int(match.group(1))
            if pid != os.getpid() and _running(pid):
                raise DatasetError(
                    f"{str(p)!r} is being written by another process (pid {pid}, still "
                    f"running): two packs into one directory would mix their files. Wait "
                    f"for it to finish, or stop it, then rerun this command.")
            _remove(p)


def _read_state(out: Path) -> dict[str, Any] | None:
    state_file = out / STATE
    if not state_file.exists():
        return None
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        state = None
    if not isinstance(state, dict):
        raise DatasetError(f"{str(state_file)!r}, the record of an interrupted pack, is "
                           f"damaged; pass overwrite=True (--overwrite) to start over.")
    return state


def prepare_output(out: Path, overwrite: bool, fingerprint: str | None,
                    keep: Collection[str] = ()) -> dict[str, Any]:
    """Checks the output directory; returns the resumable state (shards already done).

    ``keep``: names in ``out`` that this call made and still needs (its CSV conversion).
    The state of a fresh pack is written at once, so that a pack killed at any instant
    can be finished by rerunning it; a resumed state has ``"resumed": True``.
    """
    if out.exists() and not out.is_dir():
        raise DatasetError(f"The output {str(out)!r} is a file, not a directory. Choose a "
                           f"directory (it is created if missing).")
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise DatasetError(f"The output directory {str(out)!r} is not writable.")
    _clear_stale_temporaries(out, keep)
    ours = [p for p in out.iterdir() if p.name not in keep and (
            p.name in (MANIFEST, STATE) or ".tfrecord" in p.name or p.name.startswith(TMP_MARK))]
    if overwrite:
        for p in ours:
            _remove(p)
        return _start_state(out, fingerprint)
    state = _read_state(out)
    if state is not None and fingerprint is not None and state.get("fingerprint") == fingerprint:
        # Interrupted, perhaps after the manifest was written (the state goes last).
        return {**state, "resumed": True}
    if (out / MANIFEST).exists():
        raise DatasetError(f"{str(out)!r} already holds a complete memfit dataset. Choose another "
                           f"output directory, or pass overwrite=True (--overwrite) to replace it.")
    if state is not None:
        raise DatasetError(f"{str(out)!r} holds an interrupted pack of different data or options; "
                           f"rerun that pack command to finish it, or pass overwrite=True "
                           f"(--overwrite) to start over.")
    if any(".tfrecord" in p.name for p in ours):
        raise DatasetError(f"{str(out)!r} already holds TFRecord shards that memfit did not "
                           f"start; choose an empty directory or pass overwrite=True.")
    return _start_state(out, fingerprint)


def _start_state(out: Path, fingerprint: str | None) -> dict[str, Any]:
    if fingerprint is None:         # an iterable: a rerun cannot tell it is the same data
        return {}
    state = {"fingerprint": fingerprint}
    write_text_atomic(out / STATE, json.dumps(state))
    return state


def _already_packed(out: Path, fingerprint: str | None,
                    keep: Collection[str]) -> tuple[Manifest | ArraysManifest, int] | None:
    """The complete dataset in ``out`` when this very pack made it (same source and
    options) and every file still has its sha256, with the number of files; else ``None``."""
    from memfit.data.arrays import FORMAT as ARRAYS
    from memfit.data.arrays import ArraysManifest, manifest_format

    if fingerprint is None or not (out / MANIFEST).is_file() or (out / STATE).exists():
        return None
    try:
        if manifest_format(out) == ARRAYS:
            m: Manifest | ArraysManifest = ArraysManifest.load(out)
            files = {a.file: a.sha256 for s in m.splits.values() for a in s.files.values()}
        else:
            m = Manifest.load(out)
            files = {sh.file: sh.sha256 for s in m.splits.values() for sh in s.shards}
    except DatasetError:
        return None
    if m.fingerprint != fingerprint or any(
            not (out / f).is_file() or file_sha256(out / f) != sha for f, sha in files.items()):
        return None
    _clear_stale_temporaries(out, keep)
    return m, len(files)


def _check_output(out: Path) -> list[Path]:
    """Refuses an output path that cannot be a directory, before anything is written.

    Returns:
        The directories that do not exist yet, outermost first (this call creates them,
        and removes them again if it fails).
    """
    missing = []
    p = out.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        if not missing:
            raise DatasetError(f"The output {str(out)!r} is a file, not a directory. Choose a "
                               f"directory (it is created if missing). Received: "
                               f"output={str(out)!r}")
        raise DatasetError(f"Cannot create the output directory {str(out)!r}: {str(p)!r} is a "
                           f"file, not a directory. Choose a path under a directory. Received: "
                           f"output={str(out)!r}")
    if not os.access(p, os.W_OK | os.X_OK):
        what = "output directory" if not missing else "directory that would hold the output"
        raise DatasetError(f"The {what} {str(p)!r} is not writable. Choose another output "
                           f"directory. Received: output={str(out)!r}")
    return missing[::-1]


def _undo(out: Path, made: list[Path], before: set[str], resuming: bool,
          overwrite: bool) -> None:
    """Removes what a failed pack call wrote, and nothing else: the directories it made;
    else the files it added (a resumed pack keeps its finished shards for the next try)."""
    if made:
        _remove(made[0])
        return
    if not out.is_dir():
        return
    mine = re.compile(rf"^{re.escape(TMP_MARK)}{os.getpid()}-")
    for p in out.iterdir():
        if mine.match(p.name):
            _remove(p)
        elif resuming and not overwrite:
            continue
        elif p.name not in before or (overwrite and (p.name in (MANIFEST, STATE)
                                                     or ".tfrecord" in p.name)):
            _remove(p)


def _write_failed(e: OSError, out: Path, kept: bool) -> DatasetError:
    """The error for a pack that the disk stopped (full, over the file-size limit...)."""
    left = ("the shards finished before are kept: rerun the same command to resume"
            if kept else "nothing of this pack was kept")
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DatasetError(f"The disk (or quota) holding {str(out)!r} is full ({e.strerror}); "
                            f"{left}. Free space there or choose another output directory, "
                            f"then rerun.")
    if e.errno == errno.EFBIG:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else format_size(soft)
        return DatasetError(f"A file grew past this process's file-size limit ({limit}, "
                            f"`ulimit -f`) while packing into {str(out)!r}; {left}. Raise the "
                            f"limit (`ulimit -f unlimited`) or write smaller shards "
                            f"(shard_size=..., --shard-size 64MiB), then rerun.")
    where = f" ({e.filename})" if e.filename else ""
    return DatasetError(f"Packing into {str(out)!r} failed: {e.strerror or e}{where}; {left}. "
                        f"Fix the cause or choose another output directory, then rerun.")


def pack(source: Any = None, output: str | os.PathLike = "", *,
         csv: str | None = None, label: str | None = None, variable: Iterable[str] = (),
         shards: int | None = None, shard_size: str | int | None = None,
         samples_per_record: int | None = None, compression: str | None = None,
         split: str | Mapping[str, float] | None = None, seed: int = 0, shuffle: bool = True,
         workers: int = 1, overwrite: bool = False, progress: bool = True,
         shuffle_buffer: str | int = "256MiB", format: str = "tfrecord") -> PackResult:
    """Packs a source into checksummed TFRecord shards (or ``.npy`` files) with a
    ``manifest.json``.

    Example:
        >>> memfit.pack({"x": "images.npy", "y": "labels.npy"}, "data/train",
        ...             split="train=0.9,val=0.1", shard_size="128MiB")   # doctest: +SKIP
        >>> memfit.pack({"x": "images.npy", "y": "labels.npy"}, "data/arrays",
        ...             split="train=0.9,val=0.1", format="arrays")       # doctest: +SKIP

    Args:
        source: a dict of feature name → array (or ``.npy`` path, memory-mapped), a path
            to an ``.npz``/``.npy`` file, or an iterable of dicts of arrays (one sample
            each; its length need not be known).
        output: the dataset directory to write.
        csv: instead of ``source``, a CSV file with a header row (numeric columns).
        label: with ``csv``, the label column: it becomes ``y``, the rest ``x``.
        variable: features whose first dimension varies between samples.
        shards: the number of shards per split (exclusive with ``shard_size``).
        shard_size: the target size of one shard, e.g. ``"256MiB"``.
        samples_per_record: samples stored per record; by default about 256 KiB a record.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        split: e.g. ``"train=0.9,val=0.1"``: a seeded permutation assigns samples to splits.
        seed: seeds the shuffle and the split.
        shuffle: write samples in a seeded global shuffle order (iterables: through a
            ``shuffle_buffer`` of that many bytes).
        workers: processes writing shards in parallel (``.npy``/CSV sources; in-memory
            arrays use threads).
        overwrite: replace a dataset already in ``output``.
        progress: show a progress bar on stderr.
        shuffle_buffer: the byte budget of the shuffle buffer for iterable sources.
        format: ``"tfrecord"`` (shards, the default) or ``"arrays"``: one ``.npy`` file per
            split and feature, ``<split>/<feature>.npy``, for ``memfit.dataset``'s
            memory-mapped global-shuffle path (fixed-shape arrays of known length only;
            ``shards``, ``shard_size``, ``samples_per_record``, ``compression``, ``variable``
            and ``workers`` do not apply).

    Returns:
        A :class:`PackResult`; ``print`` it for the summary.

    Raises:
        DatasetError: for bad input, before anything is written.
    """
    started = time.perf_counter()
    if not str(output):
        raise DatasetError("pack needs an output directory. Received: output=''")
    out = Path(output)
    if (source is None) == (csv is None):
        raise DatasetError(f"Give exactly one of source=... or csv=.... Received: "
                           f"source={'None' if source is None else type(source).__name__}, "
                           f"csv={csv!r}")
    if label is not None and csv is None:
        raise DatasetError(f"label applies to CSV sources only. Received: label={label!r}")
    if shards is not None and shard_size is not None:
        raise DatasetError(f"Give shards or shard_size, not both. Received: shards={shards!r}, "
                           f"shard_size={shard_size!r}")
    if shards is not None and (not isinstance(shards, int) or shards < 1):
        raise DatasetError(f"shards must be a positive integer. Received: shards={shards!r}")
    shard_bytes = parse_size(shard_size, name="shard_size") if shard_size is not None else None
    if shard_bytes is not None and shard_bytes < 1:
        raise DatasetError(f"shard_size must be positive. Received: shard_size={shard_size!r}")
    if compression is not None:
        compression = str(compression).upper()
        if compression in ("", "NONE"):
            compression = None
        elif compression not in ("GZIP", "ZLIB"):
            raise DatasetError(f"compression must be None, 'GZIP' or 'ZLIB'. "
                               f"Received: compression={compression!r}")
    if samples_per_record is not None and (not isinstance(samples_per_record, int)
                                           or samples_per_record < 1):
        raise DatasetError(f"samples_per_record must be a positive integer. "
                           f"Received: samples_per_record={samples_per_record!r}")
    if not isinstance(workers, int) or workers < 1:
        raise DatasetError(f"workers must be a positive integer. Received: workers={workers!r}")
    if not isinstance(seed, int) or seed < 0:
        raise DatasetError(f"seed must be a non-negative integer. Received: seed={seed!r}")
    if format not in ("tfrecord", "arrays"):
        raise DatasetError(f"format must be 'tfrecord' or 'arrays'. Received: format={format!r}")
    if format == "arrays":
        variable = list(variable)
        extra: dict[str, Any] = {
            k: v for k, v in (("shards", shards), ("shard_size", shard_size),
                              ("samples_per_record", samples_per_record),
                              ("compression", compression)) if v is not None}
        if variable:
            extra["variable"] = variable
        if workers != 1:
            extra["workers"] = workers
        if extra:
            listed = ", ".join(f"{k}={v!r}" for k, v in extra.items())
            raise DatasetError(f"{', '.join(extra)} apply to format='tfrecord' only; "
                               f"format='arrays' writes one .npy file per split and feature. "
                               f"Received: {listed}")
        if source is not None and not isinstance(source, str | os.PathLike | Mapping):
            raise DatasetError("format='arrays' needs arrays of known length (a dict of "
                               "arrays or .npy paths, an .npz/.npy file or a CSV file); pack "
                               "an iterable with format='tfrecord'. Received: "
                               f"source of type {type(source).__name__}")
    fractions = parse_split(split)
    buffer_bytes = parse_size(shuffle_buffer, name="shuffle_buffer")
    made = _check_output(out)
    before = set(os.listdir(out)) if not made else set()
    resuming = (out / STATE).is_file()
    csv_dir = temporary_name(out / "csv")    # a CSV source converted to .npy, for this call
    manifest: Manifest | ArraysManifest
    try:
        if csv is not None:
            if not Path(csv).is_file():
                raise DatasetError(f"No such CSV file: {csv!r}.")
            paths = csv_to_npy(csv, csv_dir, label=label)     # checks every cell first
            src: ArraySource | StreamSource = open_source(paths)
            src.description = csv
        else:
            src = open_source(source, variable=variable)
        if isinstance(src, ArraySource):
            for name, count in split_counts(src.length, fractions or {"train": 1.0}).items():
                if count == 0:
                    raise DatasetError(f"split {name!r} gets no samples out of {src.length}; "
                                       f"use fewer splits or more data. Received: "
                                       f"split={fractions}")
        options = dict(shards=shards, shard_bytes=shard_bytes, k=samples_per_record,
                       compression=compression, split=fractions, seed=seed, shuffle=shuffle,
                       features={n: f.to_json() for n, f in src.features.items()})
        if format == "arrays":
            options["format"] = "arrays"
        if isinstance(src, ArraySource):
            fingerprint = hashlib.sha256((src.fingerprint() + json.dumps(options, sort_keys=True)
                                          ).encode()).hexdigest()
        else:
            fingerprint = None
        keep = {csv_dir.name}
        done = None if overwrite else _already_packed(out, fingerprint, keep)
        if done is not None:                # killed as it exited: rerun, nothing to do
            manifest, kept = done
        elif format == "arrays":
            from memfit.data.arrays import pack_arrays

            assert isinstance(src, ArraySource)
            manifest, kept = pack_arrays(src, out, fingerprint=fingerprint, options=options,
                                         overwrite=overwrite, progress=progress, keep=keep)
        else:
            if overwrite:       # an arrays dataset there: its .npy files go too
                from memfit.data.arrays import remove_arrays_dataset

                remove_arrays_dataset(out)
            state = prepare_output(out, overwrite, fingerprint, keep)
            if isinstance(src, ArraySource):
                manifest, kept = _pack_arrays(src, out, state, fingerprint, options, workers,
                                              progress)
            else:
                manifest, kept = _pack_stream(src, out, options, buffer_bytes, progress), 0
    except OSError as e:        # the disk is full, a file-size limit...: nothing half written
        _undo(out, made, before, resuming, overwrite)
        raise _write_failed(e, out, kept=resuming and not overwrite) from e
    except Exception:           # bad input found on the way (a ragged iterable...)
        _undo(out, made, before, resuming, overwrite)
        raise
    finally:
        shutil.rmtree(csv_dir, ignore_errors=True)
    (out / STATE).unlink(missing_ok=True)
    return PackResult(path=out, manifest=manifest, seconds=time.perf_counter() - started,
                      kept_shards=kept)


def _split(name: str, shards: list[tuple[Shard, int]]) -> Split:
    """A split from its written shards and their decoded bytes."""
    return Split(name=name, samples=sum(s.samples for s, _ in shards),
                 records=sum(s.records for s, _ in shards),
                 raw_bytes=sum(r for _, r in shards), shards=tuple(s for s, _ in shards))


def progress_bar(total: int | None, enabled: bool, what: str):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit=" samples", unit_scale=True,
                desc=what, dynamic_ncols=True, leave=False)


def _pack_arrays(src: ArraySource, out: Path, state: dict, fingerprint: str | None,
                 options: dict, workers: int, progress: bool) -> tuple[Manifest, int]:
    n = src.length
    rng = np.random.default_rng(options["seed"])
    order = rng.permutation(n) if (options["shuffle"] or options["split"]) else np.arange(n)
    split_names = {"train": 1.0} if options["split"] is None else options["split"]
    counts = split_counts(n, split_names)
    fixed = sum(f.sample_bytes or 0 for f in src.features.values())
    variable_bytes = 0.0
    if any(f.variable for f in src.features.values()):
        probe = src.take(order[: min(n, 1000)])
        variable_bytes = sum(sum(np.asarray(r).nbytes for r in probe[f.name]) / len(probe[f.name])
                             for f in src.features.values() if f.variable)
    sample_bytes = fixed + variable_bytes
    k = options["k"] or _default_samples_per_record(sample_bytes)
    if options["k"] is None and options["shards"] is not None:
        # Honour an explicit shard count: small data gets smaller records, not fewer shards.
        smallest = min(counts.values())
        while k > 1 and math.ceil(smallest / k) < options["shards"]:
            k //= 2

    jobs = []          # (split, index, count, indices)
    start = 0
    for name, count in counts.items():
        if count == 0:
            raise DatasetError(f"split {name!r} gets no samples out of {n}; use fewer splits or "
                               f"more data. Received: split={options['split']}")
        idx = order[start:start + count]
        if not options["shuffle"]:
            idx = np.sort(idx)
        start += count
        records = math.ceil(count / k)
        if options["shards"] is not None:
            num = options["shards"]
        elif options["shard_bytes"] is not None:
            num = math.ceil(count * sample_bytes / options["shard_bytes"])
        else:
            num = max(math.ceil(count * sample_bytes / _MAX_SHARD_BYTES), _MIN_SHARDS)
        num = max(1, min(num, records))
        bounds = np.linspace(0, records, num + 1).round().astype(int) * k
        for i in range(num):
            jobs.append((name, i, num, idx[bounds[i]:min(bounds[i + 1], count)]))

    done: dict[str, dict] = {}
    kept = 0
    for file, info in state.get("shards", {}).items():
        if (out / file).exists() and file_sha256(out / file) == info["shard"]["sha256"]:
            done[file] = info
            kept += 1
    results: dict[str, tuple[Shard, int]] = {
        f: (Shard(**i["shard"]), i["raw_bytes"]) for f, i in done.items()}

    def record(file: str, res: tuple[Shard, int]) -> None:
        results[file] = res
        write_text_atomic(out / STATE, json.dumps({
            "fingerprint": fingerprint,
            "shards": {f: {"shard": dataclasses.asdict(s), "raw_bytes": r}
                       for f, (s, r) in results.items()}}))

    compression = options["compression"]
    todo = [(s, i, c, idx) for s, i, c, idx in jobs
            if shard_name(s, i, c, compression) not in results]
    bar = progress_bar(n, progress, f"pack {out.name}")
    bar.update(n - sum(len(j[3]) for j in todo))
    try:
        if workers == 1 or len(todo) <= 1:
            for s, i, c, idx in todo:
                file = shard_name(s, i, c, compression)
                record(file, _write_indexed_shard(src, idx, out / file, k, compression,
                                                  bar.update))
        else:
            reopen = set(src.paths) == set(src.columns)
            if reopen:
                pool: cf.Executor = cf.ProcessPoolExecutor(
                    workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_die_with_parent)
            else:
                pool = cf.ThreadPoolExecutor(workers)
            variable = [f.name for f in src.features.values() if f.variable]
            with pool:
                futures = {}
                for s, i, c, idx in todo:
                    file = shard_name(s, i, c, compression)
                    if reopen:
                        fut = pool.submit(_process_job, src.paths, variable, idx,
                                          str(out / file), k, compression)
                    else:
                        fut = pool.submit(_write_indexed_shard, src, idx, out / file, k,
                                          compression)
                    futures[fut] = (file, len(idx))
                try:
                    for fut in cf.as_completed(futures):
                        file, count = futures[fut]
                        record(file, fut.result())
                        bar.update(count)
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        bar.close()

    splits = {}
    for name in counts:
        shard_list = [results[shard_name(s, i, c, compression)] for s, i, c, _ in jobs if s == name]
        splits[name] = _split(name, shard_list)
    manifest = Manifest(features=dict(src.features), splits=splits, samples_per_record=k,
                        compression=compression, seed=options["seed"],
                        shuffled=bool(options["shuffle"]), memfit_version=__version__,
                        source=src.description, path=out, fingerprint=fingerprint or "")
    manifest.save(out)
    return manifest, kept


def _pack_stream(src: StreamSource, out: Path, options: dict, buffer_bytes: int,
                 progress: bool) -> Manifest:
    """Packs an iterable of unknown length: bounded shuffle buffer, shards cut by size."""
    rng = np.random.default_rng(options["seed"])
    fractions = options["split"] or {"train": 1.0}
    names = list(fractions)
    probs = np.array([fractions[s] for s in names])
    compression = options["compression"]
    shard_bytes = options["shard_bytes"] or 64 * 2**20
    if options["shards"] is not None:
        raise DatasetError(f"An iterable source has no known length: give shard_size instead "
                           f"of shards. Received: shards={options['shards']!r}")
    k = options["k"]
    pending: dict[str, list[dict]] = {s: [] for s in names}
    writers: dict[str, _ShardWriter | None] = {s: None for s in names}
    finished: dict[str, list[tuple[Shard, int]]] = {s: [] for s in names}
    bar = progress_bar(None, progress, f"pack {out.name}")

    def sample_nbytes(s: dict) -> int:
        return sum(v.nbytes for v in s.values())

    def flush_block(name: str) -> None:
        block_samples = pending[name]
        block = {f: [s[f] for s in block_samples] for f in src.features}
        for f, feat in src.features.items():
            if not feat.variable:
                block[f] = np.stack(block[f])
        payload, raw_bytes = _encode_block(block, src.features)
        if writers[name] is None:
            part = len(finished[name])
            writers[name] = _ShardWriter(temporary_name(out / f"{name}-{part:05d}.part"),
                                         compression)
        w = writers[name]
        w.add(payload, len(block_samples), raw_bytes)
        pending[name] = []
        if w.bytes >= shard_bytes:
            finished[name].append(w.close())
            writers[name] = None

    def emit(s: dict) -> None:
        nonlocal k
        name = names[0] if len(names) == 1 else names[rng.choice(len(names), p=probs)]
        if k is None:
            k = _default_samples_per_record(sample_nbytes(s))
        pending[name].append(s)
        if len(pending[name]) >= k:
            flush_block(name)
        bar.update(1)

    buffer: list[dict] = []
    held = 0
    try:
        for s in src.samples():
            if not options["shuffle"]:
                emit(s)
                continue
            buffer.append(s)
            held += sample_nbytes(s)
            if held >= buffer_bytes:
                j = int(rng.integers(len(buffer)))
                buffer[j], buffer[-1] = buffer[-1], buffer[j]
                out_s = buffer.pop()
                held -= sample_nbytes(out_s)
                emit(out_s)
        for j in rng.permutation(len(buffer)):
            emit(buffer[j])
        for name in names:
            if pending[name]:
                flush_block(name)
            if writers[name] is not None:
                finished[name].append(writers[name].close())
                writers[name] = None
    except BaseException:
        for w in writers.values():
            if w is not None:
                w.abandon()
        for p in out.glob(f"{TMP_MARK}{os.getpid()}-*.part"):
            p.unlink()
        raise
    finally:
        bar.close()
    for name in names:           # before any shard gets its final name
        if not finished[name]:
            for p in out.glob(f"{TMP_MARK}{os.getpid()}-*.part"):
                p.unlink()
            raise DatasetError(f"split {name!r} received no samples; use fewer splits or more "
                               f"data. Received: split={options['split']}")
    splits = {}
    for name in names:
        count = len(finished[name])
        shard_list = []
        for i, (shard, raw) in enumerate(finished[name]):
            final = shard_name(name, i, count, compression)
            os.replace(out / shard.file, out / final)
            shard_list.append((dataclasses.replace(shard, file=final), raw))
        splits[name] = _split(name, shard_list)
    manifest = Manifest(features=dict(src.features), splits=splits, samples_per_record=k or 1,
                        compression=compression, seed=options["seed"],
                        shuffled=bool(options["shuffle"]), memfit_version=__version__,
                        source=src.description, path=out)
    manifest.save(out)
    return manifest
