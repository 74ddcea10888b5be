"""``memfit inspect`` and ``memfit verify``: describe a packed dataset, check every byte.

Neither imports TensorFlow: verification reads each shard once, checking its sha256
against the manifest and every record's CRC32C checksums.

Example:
    >>> report = verify("data/train")            # doctest: +SKIP
    >>> report.ok, report.problems               # doctest: +SKIP
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

from memfit.data.manifest import Manifest, Shard
from memfit.data.records import RecordError, iter_records
from memfit.memory.sizes import format_size

__all__ = ["inspect", "verify", "VerifyReport", "Problem"]


def inspect(path: str | os.PathLike) -> str:
    """A readable description of a dataset: schema, splits, counts and sizes.

    Args:
        path: the dataset directory (or its ``manifest.json``).
    """
    m = Manifest.load(path)
    lines = [f"memfit dataset {m.path}",
             f"  {m.samples:,} samples, {format_size(m.bytes)} on disk, "
             f"{m.samples_per_record} samples per record, compression: {m.compression or 'none'}, "
             f"seed {m.seed}{' (shuffled at pack time)' if m.shuffled else ''}",
             f"  source: {m.source or '?'}; written by memfit {m.memfit_version}",
             "  features:"]
    width = max(len(n) for n in m.features)
    for f in m.features.values():
        shape = "(" + ", ".join("None" if d is None else str(d) for d in f.shape) + \
            ("," if len(f.shape) == 1 else "") + ")"
        per = "variable" if f.variable else f"{format_size(f.sample_bytes)}/sample"
        lines.append(f"    {f.name:<{width}}  {f.dtype:<8} {shape:<16} {f.encoding:<12} {per}")
    lines.append("  splits:")
    for s in m.splits.values():
        lines.append(f"    {s.name:<8} {s.samples:>12,} samples {s.records:>10,} records "
                     f"{len(s.shards):>5} shards {format_size(s.bytes):>11} "
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
    path: Path
    shards: int = 0
    records: int = 0
    bytes: int = 0
    problems: list[Problem] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = (f"verified {self.shards} shards, {self.records:,} records, "
                f"{format_size(self.bytes)} at {self.path}: ")
        if self.ok:
            return head + "OK (sha256 and every record CRC32C match)"
        return head + f"{len(self.problems)} problem(s)\n" + "\n".join(
            f"  {p}" for p in self.problems)


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


def _check_shard(path: Path, shard: Shard, compression: str | None) -> tuple[int, list[Problem]]:
    problems = []
    if not path.exists():
        return 0, [Problem(shard.file, None, "file is missing")]
    size = path.stat().st_size
    if size != shard.bytes:
        problems.append(Problem(shard.file, None, f"size is {size} bytes; the manifest says "
                                                  f"{shard.bytes} (truncated or overwritten)"))
    sha = hashlib.sha256()
    count = 0
    with open(path, "rb", buffering=0) as raw:
        hashing = io.BufferedReader(_HashingReader(raw, sha), buffer_size=1 << 20)
        if compression == "GZIP":
            stream: io.BufferedIOBase = gzip.GzipFile(fileobj=hashing, mode="rb")
        elif compression == "ZLIB":
            stream = io.BufferedReader(_ZlibReader(hashing), buffer_size=1 << 20)
        else:
            stream = hashing
        try:
            for _ in iter_records(stream):
                count += 1
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
    return count, problems


def verify(path: str | os.PathLike,
           progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Checks every shard's sha256 and every record's CRC32C checksums.

    Args:
        path: the dataset directory.
        progress: called with the bytes of each shard once it is checked.

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is ``False`` when anything is damaged, and
        ``report.problems`` names each shard file (and record) that is.
    """
    m = Manifest.load(path)
    report = VerifyReport(path=m.path)
    for split in m.splits.values():
        for shard in split.shards:
            count, problems = _check_shard(m.path / shard.file, shard, m.compression)
            report.shards += 1
            report.records += count
            report.bytes += shard.bytes
            report.problems += problems
            if progress is not None:
                progress(shard.bytes)
    return report
