"""``memfit inspect`` and ``memfit verify``: describe a packed dataset, check every byte.

Neither imports TensorFlow: verification reads each shard once, checking its sha256
against the manifest and every record's CRC32C checksums. Arrays datasets
(``format="arrays"``) get each ``.npy`` file's sha256 and header checked; a plain
directory of ``.npy`` files (no manifest) gets its headers, sizes and lengths checked.

Example:
    >>> import tempfile, numpy as np
    >>> from memfit.data.packing.packer import pack
    >>> out = tempfile.mkdtemp() + "/d"
    >>> _ = pack({"x": np.zeros((10, 2), "float32")}, out, progress=False)
    >>> report = verify(out)
    >>> report.ok, report.problems
    (True, [])
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Callable
from pathlib import Path

from memfit.data.format.arrays_format import FORMAT as ARRAYS
from memfit.data.format.arrays_format import (
    ArraysManifest,
    is_arrays_source,
    manifest_format,
    open_npy,
)
from memfit.data.format.manifest import Manifest, Shard
from memfit.data.format.records import LENGTHS_SUFFIX, RecordError, iter_records
from memfit.sizes import format_count, format_size, plural

__all__ = ["inspect", "verify", "VerifyReport", "Problem", "total_bytes"]


def _kind(path: str | os.PathLike) -> str:
    """``"tfrecord"``, ``"arrays"`` (a memfit-arrays directory) or ``"npy"`` (plain .npy
    files without a manifest)."""
    if not os.path.exists(path):
        return "tfrecord"           # the manifest's reader says what is missing, and why
    fmt = manifest_format(path)
    if fmt == ARRAYS:
        return "arrays"
    if fmt is None and is_arrays_source(path):
        return "npy"
    return "tfrecord"


def _plain_npy(path: str | os.PathLike) -> dict[str, Path]:
    p = Path(path)
    if p.suffix == ".npy":
        return {p.stem: p}
    return {f.stem: f for f in sorted(p.glob("*.npy")) if not f.name.startswith(".")}


def total_bytes(path: str | os.PathLike) -> int:
    """Bytes on disk of a dataset's data files (for progress bars).

    Example:
        >>> import tempfile, numpy as np
        >>> from memfit.data.packing.packer import pack
        >>> out = tempfile.mkdtemp() + "/d"
        >>> _ = pack({"x": np.zeros((10, 2), "float32")}, out, progress=False)
        >>> total_bytes(out)
        109
    """
    kind = _kind(path)
    if kind == "arrays":
        return ArraysManifest.load(path).bytes
    if kind == "npy":
        return sum(f.stat().st_size for f in _plain_npy(path).values() if f.is_file())
    return Manifest.load(path).bytes


def _shape(shape: tuple) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + \
        ("," if len(shape) == 1 else "") + ")"


def _head(m: Manifest | ArraysManifest, title: str, layout: str) -> list[str]:
    """The first lines of a packed dataset's description, up to its features."""
    return [title,
            f"  {format_count(m.samples, 'sample')}, {format_size(m.bytes)} on disk{layout}, "
            f"seed {m.seed}{' (shuffled at pack time)' if m.shuffled else ''}",
            f"  source: {m.source or '?'}; written by memfit {m.memfit_version}",
            "  features:"]


def _inspect_arrays(path: str | os.PathLike) -> str:
    m = ArraysManifest.load(path)
    lines = _head(m, f"memfit arrays dataset {m.path} (.npy files, memory-mapped when read)",
                  f" in {format_count(m.file_count, '.npy file')}")
    width = max(len(n) for n in m.features)
    for f in m.features.values():
        lines.append(f"    {f.name:<{width}}  {f.dtype:<8} {_shape(f.shape):<16} "
                     f"{format_size(f.sample_bytes)}/sample")
    lines.append("  splits:")
    for s in m.splits.values():
        files = ", ".join(a.file for a in s.files.values())
        lines.append(f"    {s.name:<8} {s.samples:>12,} {plural(s.samples, 'sample'):<7} "
                     f"{format_size(s.bytes):>11}  "
                     f"{files}")
    return "\n".join(lines)


def _inspect_npy(path: str | os.PathLike) -> str:
    files = _plain_npy(path)
    plain = "file" if Path(path).suffix == ".npy" else "directory"
    lines = [f".npy arrays {path} (no manifest: a plain {plain}, read memory-mapped)",
             "  features:"]
    width = max([len(n) for n in files] + [1])
    for name, f in files.items():
        a = open_npy(name, f)       # an unreadable file is the error (exit 2), not a row
        lines.append(f"    {name:<{width}}  {a.dtype.name:<8} {len(a):>12,} "
                     f"{plural(len(a), 'sample') + ' of':<10} "
                     f"{_shape(a.shape[1:]):<16} {format_size(f.stat().st_size):>11}")
    return "\n".join(lines)


def inspect(path: str | os.PathLike) -> str:
    """A readable description of a dataset: schema, splits, counts and sizes.

    Args:
        path: the dataset directory (or its ``manifest.json``), a directory of ``.npy``
            files or one ``.npy`` file.

    Raises:
        DatasetError: naming the file, when a manifest or an ``.npy`` file cannot be read.
    """
    kind = _kind(path)
    if kind == "arrays":
        return _inspect_arrays(path)
    if kind == "npy":
        return _inspect_npy(path)
    m = Manifest.load(path)
    lines = _head(m, f"memfit dataset {m.path}",
                  f", {format_count(m.samples_per_record, 'sample')} per record, "
                  f"compression: {m.compression or 'none'}")
    width = max(len(n) for n in m.features)
    for f in m.features.values():
        per = "variable" if f.variable else f"{format_size(f.sample_bytes)}/sample"
        lines.append(f"    {f.name:<{width}}  {f.dtype:<8} {_shape(f.shape):<16} "
                     f"{f.encoding:<12} {per}")
    lines.append("  splits:")
    for s in m.splits.values():
        lines.append(f"    {s.name:<8} {s.samples:>12,} {plural(s.samples, 'sample'):<7} "
                     f"{s.records:>10,} {plural(s.records, 'record'):<7} "
                     f"{len(s.shards):>5} {plural(len(s.shards), 'shard'):<6} "
                     f"{format_size(s.bytes):>11} "
                     f"({format_size(s.raw_bytes)} decoded)")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One piece of damage: the shard file, the record where known, and what is wrong."""

    file: str
    record: int | None
    message: str

    def __str__(self) -> str:
        where = f" record {self.record}" if self.record is not None else ""
        return f"{self.file}{where}: {self.message}"


@dataclasses.dataclass
class VerifyReport:
    """What ``verify`` found. For ``.npy`` datasets ``shards`` counts files and
    ``records`` samples (``kind`` says which: ``"tfrecord"``, ``"arrays"``, ``"npy"``)."""

    path: Path
    shards: int = 0
    records: int = 0
    bytes: int = 0
    problems: list[Problem] = dataclasses.field(default_factory=list)
    kind: str = "tfrecord"

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        # "verified" only what passed: with problems, what was read is what was checked
        did = "verified" if self.ok else "checked"
        if self.kind == "tfrecord":
            head = (f"{did} {format_count(self.shards, 'shard')}, "
                    f"{format_count(self.records, 'record')} read, {format_size(self.bytes)} "
                    f"at {self.path}: ")
            checked = "sha256 and every record CRC32C match"
        else:
            head = (f"{did} {format_count(self.shards, '.npy file')}, "
                    f"{format_count(self.records, 'sample')}, {format_size(self.bytes)} at "
                    f"{self.path}: ")
            checked = ("sha256 and .npy headers match the manifest" if self.kind == "arrays"
                       else "headers, sizes and lengths; no manifest, so no checksums")
        if self.ok:
            return head + f"OK ({checked})"
        # what to do, as the reader's error says it (a stranger found no next step here)
        todo = ("Restore the damaged files from a copy, or pack the dataset again (memfit "
                "pack); to train on what is intact, read it with on_corrupt='skip'.")
        return head + f"{format_count(len(self.problems), 'problem')}\n" + "\n".join(
            f"  {p}" for p in self.problems) + f"\n{todo}"


class _HashingReader(io.RawIOBase):
    def __init__(self, f, sha):
        self._f, self._sha = f, sha

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._f.readinto(b)
        if n:
            self._sha.update(memoryview(b)[:n])
        return n or 0


class _ZlibReader(io.RawIOBase):
    def __init__(self, f):
        self._f, self._d, self._buf = f, zlib.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while len(self._buf) < len(b):
            chunk = self._f.read(1 << 20)
            if not chunk:
                self._buf += self._d.flush()
                break
            self._buf += self._d.decompress(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _sample_counter(m: Manifest) -> Callable[[bytes], int] | None:
    """How many samples a record holds, read from it: the length list of a variable
    feature, or a fixed feature's bytes ÷ one sample's (``None``: no feature tells)."""
    from memfit.data.sources.example_proto import ProtoError, parse_example

    for f in m.features.values():
        key = f.name + LENGTHS_SUFFIX if f.variable else f.name
        size = 1 if f.variable else f.sample_bytes or 0
        if size <= 0:
            continue

        def count(payload: bytes, key: str = key, size: int = size,
                  lengths: bool = f.variable) -> int:
            try:
                value = parse_example(payload).get(key)
            except ProtoError:
                return -1
            if value is None or not value.spans:
                return -1
            return value.count(payload) if lengths else len(value.value(payload)) // size
        return count
    return None


def _check_shard(path: Path, shard: Shard, compression: str | None,
                 samples_in: Callable[[bytes], int] | None = None
                 ) -> tuple[int, list[Problem]]:
    problems = []
    if not path.exists():
        return 0, [Problem(shard.file, None, "file is missing")]
    size = path.stat().st_size
    if size != shard.bytes:
        problems.append(Problem(shard.file, None, f"size is {size} bytes; the manifest says "
                                                  f"{shard.bytes} (truncated or overwritten)"))
    sha = hashlib.sha256()
    count = samples = 0
    with open(path, "rb", buffering=0) as raw:
        hashing = io.BufferedReader(_HashingReader(raw, sha), buffer_size=1 << 20)
        if compression == "GZIP":
            stream: io.BufferedIOBase = gzip.GzipFile(fileobj=hashing, mode="rb")
        elif compression == "ZLIB":
            stream = io.BufferedReader(_ZlibReader(hashing), buffer_size=1 << 20)
        else:
            stream = hashing
        try:
            for _, payload in iter_records(stream):
                count += 1
                if samples_in is not None:
                    samples += samples_in(payload)
        except RecordError as e:
            problems.append(Problem(shard.file, e.index, str(e)))
        except (OSError, EOFError, zlib.error) as e:
            problems.append(Problem(shard.file, count, f"cannot decompress: {e}"))
        while hashing.read(1 << 20):     # hash the rest after damage, for the sha check
            pass
    if sha.hexdigest() != shard.sha256:
        problems.append(Problem(shard.file, None, "sha256 does not match the manifest"))
    if count != shard.records and not any(p.record is not None for p in problems):
        problems.append(Problem(shard.file, None, f"holds {count} records; the manifest says "
                                                  f"{shard.records}"))
    elif samples_in is not None and samples != shard.samples and not problems:
        # a manifest edited to fewer samples verified OK, then the reader stopped on
        # TensorFlow's "expected to contain 10 elements" (a stranger)
        problems.append(Problem(shard.file, None, f"holds {samples} samples; the manifest "
                                                  f"says {shard.samples}"))
    return count, problems


def verify(path: str | os.PathLike,
           progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Checks every shard's sha256 and every record's CRC32C checksums.

    Example:
        >>> import tempfile, numpy as np
        >>> from memfit.data.packing.packer import pack
        >>> out = tempfile.mkdtemp() + "/d"
        >>> _ = pack({"x": np.zeros((10, 2), "float32")}, out, progress=False)
        >>> print(verify(out))                                  # doctest: +ELLIPSIS
        verified 1 shard, 1 record read, 109 B at .../d: OK (sha256 and every record CRC32C match)

    Args:
        path: the dataset directory (TFRecord or arrays), or a directory of ``.npy`` files.
        progress: called with the bytes of each shard (or file) once it is checked.

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is ``False`` when anything is damaged, and
        ``report.problems`` names each shard file (and record) that is.
    """
    kind = _kind(path)
    if kind == "arrays":
        return _verify_arrays(path, progress)
    if kind == "npy":
        return _verify_npy(path, progress)
    m = Manifest.load(path)
    report = VerifyReport(path=m.path)
    samples_in = _sample_counter(m)
    for split in m.splits.values():
        for shard in split.shards:
            count, problems = _check_shard(m.path / shard.file, shard, m.compression,
                                           samples_in)
            report.shards += 1
            report.records += count
            report.bytes += shard.bytes
            report.problems += problems
            if progress is not None:
                progress(shard.bytes)
    return report


def _verify_arrays(path: str | os.PathLike,
                   progress: Callable[[int], None] | None) -> VerifyReport:
    m = ArraysManifest.load(path)
    report = VerifyReport(path=m.path, kind="arrays")
    for split in m.splits.values():
        for name, entry in split.files.items():
            file = m.path / entry.file
            report.shards += 1
            report.bytes += entry.bytes
            if not file.exists():
                report.problems.append(Problem(entry.file, None, "file is missing"))
                continue
            size = file.stat().st_size
            if size != entry.bytes:
                report.problems.append(Problem(entry.file, None, f"size is {size} bytes; the "
                                               f"manifest says {entry.bytes} (truncated or "
                                               f"overwritten)"))
            sha = hashlib.sha256()
            with open(file, "rb") as f:
                while chunk := f.read(1 << 22):
                    sha.update(chunk)
            if sha.hexdigest() != entry.sha256:
                report.problems.append(Problem(entry.file, None,
                                               "sha256 does not match the manifest"))
            f_ = m.features[name]
            try:
                arr = open_npy(name, file)
                expected = (split.samples, *f_.shape)
                if arr.dtype.name != f_.dtype or tuple(arr.shape) != expected:
                    report.problems.append(Problem(
                        entry.file, None, f"holds {arr.dtype}{arr.shape}; the manifest says "
                                          f"{f_.dtype}{expected}"))
            except ValueError as e:
                report.problems.append(Problem(entry.file, None, str(e)))
            if progress is not None:
                progress(entry.bytes)
        report.records += split.samples
    return report


def _verify_npy(path: str | os.PathLike,
                progress: Callable[[int], None] | None) -> VerifyReport:
    files = _plain_npy(path)
    report = VerifyReport(path=Path(path), kind="npy")
    lengths = {}
    for name, file in files.items():
        report.shards += 1
        size = file.stat().st_size if file.is_file() else 0
        report.bytes += size
        try:
            lengths[name] = len(open_npy(name, file))
        except ValueError as e:
            report.problems.append(Problem(file.name, None, str(e)))
        if progress is not None:
            progress(size)
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{n}={v:,}" for n, v in lengths.items())
        report.problems.append(Problem(str(path), None, f"features have different lengths: "
                                                        f"{listed}"))
    report.records = max(lengths.values(), default=0)
    return report
