"""Other programs' TFRecord files opened for streaming in place: each file's compression
(from its first bytes), its records counted, its first record's spec inferred and checked
against the other files' with the pack's own check
(:class:`~memfit.data.sources.tfrecord_source.SpecCheck`). No TensorFlow.

Counting a plain file reads each record's 12-byte header and skips its data, so opening
costs a few bytes a record; a GZIP or ZLIB file is decompressed once to count (a
compressed stream cannot be skipped through). Records after each file's first are checked
while streaming (:mod:`memfit.data.read.files.files_reader`), not here.

Example:
    >>> import tempfile
    >>> from memfit.data.format.records import encode_example, frame
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "a.tfrecords").write_bytes(frame(encode_example({}, {"y": [7]})) * 3)
    >>> files = open_files([d / "a.tfrecords"])
    >>> files.records, str(files.spec["y"])
    ((3,), 'int64_list of 1 value → int64 ()')
"""

from __future__ import annotations

import array
import dataclasses
import glob
import os
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from memfit.data.format.records import mask_crc
from memfit.data.read.pipeline_tail import warn_skipped
from memfit.data.sources.tfrecord_source import (
    RecordFeature,
    SpecCheck,
    compression_of,
    expand_tfrecord_paths,
    open_stream,
)
from memfit.errors import CorruptShardError, DatasetError
from memfit.sizes import format_count

__all__ = ["TFRecordFiles", "open_files", "is_tfrecord_files", "damaged"]

_NOT_FILES = (".npy", ".npz", ".json")


def is_tfrecord_files(source: Any) -> bool:
    """Whether ``memfit.dataset`` should stream ``source`` as TFRecord files in place: a
    list or tuple of paths or globs, a glob, or a path to a file (not a directory, not
    ``.npy``/``.npz``/``manifest.json``).

    Example:
        >>> is_tfrecord_files(["a.tfrecords"]), is_tfrecord_files("data/*.tfrecords")
        (True, True)
    """
    if isinstance(source, list | tuple):
        return len(source) > 0 and all(isinstance(s, str | os.PathLike) for s in source)
    if not isinstance(source, str | os.PathLike) or isinstance(source, Mapping):
        return False
    text = str(source)
    if glob.has_magic(text):
        return True
    return os.path.isfile(text) and not text.endswith(_NOT_FILES)


def damaged(path: Path | str, record: int, records: int | None, why: str) -> str:
    """memfit's one line for a damaged record of a file read in place (what
    :mod:`memfit.data.read.translate_errors` turns into a ``CorruptShardError``).

    Example:
        >>> damaged("a.tfrecords", 25, None, "bad CRC32C of its length")[:62]
        'memfit: TFRecord file a.tfrecords is corrupt or truncated: rec'
        >>> "record 25 cannot be read" in damaged("a.tfrecords", 25, None, "cut short")
        True

    Args:
        records: the records in the file, or ``None`` where the damage hides how many
            (a length whose checksum fails: no record after it can be found).
    """
    of = "" if records is None else f" of {records}"
    return (f"memfit: TFRecord file {path} is corrupt or truncated: record {record}{of} "
            f"cannot be read ({why}). Write the file again or leave it out; or pass "
            f"on_corrupt='skip' to train without the damaged records.")


@dataclasses.dataclass(frozen=True)
class TFRecordFiles:
    """The files, as opened.

    Attributes:
        files: the files, in the order given (each glob's matches sorted).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"`` for each.
        records: the records in each file.
        record_bytes: the mean size of a record's frame.
        check: the spec and its check (its ``spec``, ``first`` and ``layout``).
        offsets: for each plain file, where each record's frame starts, and its end
            (``records + 1`` int64 values); ``None`` for a compressed file.
    """

    files: tuple[Path, ...]
    compression: tuple[str | None, ...]
    records: tuple[int, ...]
    record_bytes: int
    check: SpecCheck = dataclasses.field(compare=False)
    offsets: tuple[np.ndarray | None, ...] = dataclasses.field(compare=False, default=())

    @property
    def plain(self) -> bool:
        """Whether every file is plain, so its records can be read where they lie."""
        return len(self.offsets) == len(self.files) and \
            all(o is not None for o in self.offsets)

    def subset(self, keep: Sequence[int]) -> TFRecordFiles:
        """The files at ``keep``, in that order (a shard of them)."""
        return TFRecordFiles(tuple(self.files[k] for k in keep),
                             tuple(self.compression[k] for k in keep),
                             tuple(self.records[k] for k in keep), self.record_bytes,
                             self.check, tuple(self.offsets[k] for k in keep))

    @property
    def spec(self) -> dict[str, RecordFeature]:
        return self.check.spec

    def describe(self) -> str:
        shown = ", ".join(str(f) for f in self.files[:2])
        return (f"{format_count(len(self.files), 'TFRecord file')} ({shown}"
                f"{', ...' if len(self.files) > 2 else ''})")


def _count(path: Path, compression: str | None, check: SpecCheck, on_corrupt: str
           ) -> tuple[int, int, np.ndarray | None]:
    """Records in one file, their frames' bytes and, for a plain file, where each frame
    starts and where the last ends; its first record checked. A damaged frame (a length
    whose checksum fails, a file cut short, a first record whose data fails) raises, or
    under ``on_corrupt="skip"`` ends the file there with one warning: no record after it
    can be found."""
    size = os.path.getsize(path)
    count = total = 0
    starts = array.array("q")

    def ended() -> tuple[int, int, np.ndarray | None]:
        return count, total, \
            np.frombuffer(starts, np.int64).copy() if compression is None else None

    def damage(why: str, records: int | None) -> tuple[int, int, np.ndarray | None]:
        if on_corrupt == "raise":
            raise CorruptShardError(damaged(path, count, records, why), str(path), count)
        warn_skipped(f"memfit: WARNING: TFRecord file {path} is damaged at record {count} "
                     f"({why}): it is read up to there; the records after it cannot be "
                     f"found.")
        return ended()

    with open_stream(path, compression) as f:
        while True:
            starts.append(total)
            header = f.read(12)
            if not header:
                return ended()
            if len(header) < 12 or struct.pack("<I", mask_crc(
                    google_crc32c.value(header[:8]))) != header[8:]:
                if count == 0:
                    raise DatasetError(f"{str(path)!r} is not a TFRecord file (its first "
                                       f"record's length checksum does not match). "
                                       f"memfit.dataset streams files of tf.train.Example "
                                       f"records, plain, GZIP or ZLIB.")
                return damage("bad CRC32C of its length, or cut short", None)
            (length,) = struct.unpack("<Q", header[:8])
            if count == 0 or compression is not None:
                data = f.read(length + 4)
                if len(data) < length + 4:
                    return damage("cut short", count + 1)
                if count == 0:
                    if struct.pack("<I", mask_crc(google_crc32c.value(data[:-4]))) != data[-4:]:
                        return damage("bad CRC32C of its data", None)
                    check.check(path, 0, data[:-4])
            else:
                end = f.seek(length + 4, os.SEEK_CUR)
                if end > size:
                    return damage("cut short", count + 1)
            count += 1
            total += 16 + length


def open_files(patterns: str | os.PathLike | Sequence[str | os.PathLike], *,
               variable: Iterable[str] = (), on_corrupt: str = "raise") -> TFRecordFiles:
    """Opens TFRecord files (paths or globs) for streaming in place.

    Raises:
        DatasetError: a glob or path that matches nothing, a file that is not TFRecord,
            a first record that is not a ``tf.train.Example`` or disagrees with another
            file's first record (naming both), no records at all.
        CorruptShardError: a file cut short, or a damaged first record (under
            ``on_corrupt="skip"``: that file is read up to the damage, with a warning).
    """
    files = expand_tfrecord_paths(patterns)
    check = SpecCheck(variable, in_place=True)
    compression = tuple(compression_of(p) for p in files)
    counted = []
    for path, comp in zip(files, compression, strict=True):
        try:
            counted.append(_count(path, comp, check, on_corrupt))
        except (OSError, EOFError, zlib.error) as e:
            raise DatasetError(f"TFRecord file {str(path)!r} cannot be read: {e}.") from None
    records = tuple(n for n, _, _ in counted)
    if sum(records) == 0:
        raise DatasetError(f"The TFRecord files hold no records: "
                           f"{', '.join(map(str, files[:3]))}; nothing to stream.")
    bytes_ = sum(b for _, b, _ in counted)
    return TFRecordFiles(tuple(files), compression, records,
                         max(1, bytes_ // sum(records)), check,
                         tuple(o for _, _, o in counted))
