"""TFRecord files of ``tf.train.Example`` records (plain, GZIP or ZLIB) as a source.

The files are read twice, record by record, never whole. The first pass checks every
frame's CRC32C, infers the feature spec from the first record and checks every other
record against it, and notes where each record lies (16 bytes a record). Only then is
anything written. The second pass is the packer's: :meth:`TFRecordSource.take` reads the
records it asks for with ``pread`` and decodes them. A serialised tensor becomes a typed
feature of its own dtype and shape, decoded once, here. Compressed files are
decompressed into the pack's scratch directory during the first pass, because a
compressed stream cannot be read at an offset.

What a record's features become (:class:`RecordFeature`):

- ``float_list`` of ``n`` values → float32 ``(n,)``; ``n == 1`` in every record → ``()``.
- ``int64_list`` → int64, the same way.
- ``bytes_list`` of one value that is a serialised ``TensorProto``
  (``tf.io.serialize_tensor``) → its dtype and shape.
- one encoded image (JPEG, PNG, GIF, BMP) or other bytes → uint8 ``(None,)``: the bytes as
  they are (decode an image with ``tf.io.decode_image`` when streaming).
- a feature named in ``variable`` may vary in its first dimension (length of a list).

Example:
    >>> import tempfile
    >>> from memfit.data.format.records import encode_example, frame
    >>> d = Path(tempfile.mkdtemp())
    >>> payload = encode_example({}, {"label": [7]})
    >>> _ = (d / "a.tfrecords").write_bytes(frame(payload) * 3)
    >>> src = open_tfrecords(str(d / "*.tfrecords"), d / "scratch")
    >>> src.length, str(src.spec["label"])
    (3, 'int64_list of 1 value → int64 ()')
    >>> src.take(np.array([2, 0]))["label"].tolist()
    [7, 7]
"""

from __future__ import annotations

import array
import dataclasses
import glob
import gzip
import hashlib
import io
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c
import numpy as np

from memfit.data.format.manifest import Feature, check_feature_name
from memfit.data.format.records import RecordError, frame, iter_records, mask_crc
from memfit.data.sources.columns import ArraySource, Columns
from memfit.data.sources.example_proto import (
    ProtoError,
    TensorHeader,
    Value,
    decode_list,
    image_format,
    parse_example,
    parse_tensor_header,
)
from memfit.errors import DatasetError
from memfit.sizes import format_count

__all__ = ["RecordFeature", "SpecCheck", "TFRecordSource", "open_tfrecords",
           "describe_tfrecords", "expand_tfrecord_paths", "compression_of", "open_stream",
           "decode_payload"]


@dataclasses.dataclass(frozen=True)
class RecordFeature:
    """What one feature of the records holds, and the feature memfit packs it as.

    Attributes:
        name: the feature's key in the ``Example``.
        kind: ``"float_list"``, ``"int64_list"``, ``"tensor"`` (a serialised tensor),
            ``"image"`` (encoded, kept as bytes) or ``"bytes"``.
        dtype, shape: what it is packed as (``shape[0]`` is ``None`` when variable).
        detail: the values in the first record: the list's length, or the image format.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int | None, ...]
    detail: str = ""

    def same(self, other: RecordFeature) -> bool:
        return (self.kind, self.dtype, self.shape) == (other.kind, other.dtype, other.shape)

    @property
    def feature(self) -> Feature:
        return Feature(self.name, self.dtype, self.shape)

    def __str__(self) -> str:
        shape = "(" + ", ".join("None" if d is None else str(d) for d in self.shape) + \
            ("," if len(self.shape) == 1 else "") + ")"
        image = f"encoded image (bytes; {self.detail} in the first record)"
        what = {"tensor": "serialized tensor", "image": image,
                "bytes": "bytes"}.get(self.kind, f"{self.kind} of {self.detail}")
        return f"{what} → {self.dtype} {shape}"


class _Refused(Exception):
    """A record's feature memfit cannot pack (the caller names the file and record)."""


def _record_spec(payload: bytes, variable: frozenset[str]) -> dict[str, RecordFeature]:
    """The spec of one record (raises :class:`_Refused` or ``ProtoError``)."""
    out = {}
    for name, value in parse_example(payload).items():
        var = name in variable
        if value.kind in ("float_list", "int64_list"):
            n = value.count(payload)
            shape: tuple[int | None, ...] = (None,) if var else (() if n == 1 else (n,))
            dtype = "float32" if value.kind == "float_list" else "int64"
            out[name] = RecordFeature(name, value.kind, dtype, shape,
                                      format_count(n, "value"))
            continue
        if value.kind == "empty":
            raise _Refused(f"feature {name!r} has no kind set (no bytes_list, float_list or "
                           f"int64_list)")
        if len(value.spans) != 1:
            raise _Refused(f"feature {name!r} is a bytes_list of {len(value.spans)} values; "
                           f"memfit packs one bytes value a feature (a serialised tensor, "
                           f"an encoded image or raw bytes)")
        first, end = value.spans[0]
        header = parse_tensor_header(payload, first, end)
        if isinstance(header, str):
            raise _Refused(f"feature {name!r} is a serialised tensor of dtype {header}, "
                           f"which memfit cannot store; convert it to a numeric dtype")
        if isinstance(header, TensorHeader):
            if var and not header.shape:
                raise _Refused(f"feature {name!r} is a scalar tensor; a variable feature "
                               f"needs at least one dimension")
            shape = (None, *header.shape[1:]) if var else header.shape
            out[name] = RecordFeature(name, "tensor", header.dtype, shape)
            continue
        fmt = image_format(value.value(payload))
        out[name] = RecordFeature(name, "image" if fmt else "bytes", "uint8", (None,),
                                  fmt or "")
    for f in out.values():
        if f.shape and f.shape[0] == 0:
            raise _Refused(f"feature {f.name!r} has no values ({f.kind} of length 0); "
                           f"declare it variable (variable=[{f.name!r}], --variable "
                           f"{f.name}) if its length varies")
    return out


class _Layout:
    """Where the values lie in records built like the first one: a record of the same
    size whose other bytes (keys, tags, lengths, a tensor's dtype and shape) are those of
    the first has the same spec and its values at the same offsets, so it is checked and
    decoded without parsing it (records with a bytes feature other than a tensor vary in
    size and are parsed).

    Example:
        >>> from memfit.data.format.records import encode_example
        >>> a, b = encode_example({}, {"y": [1, 2]}), encode_example({}, {"y": [3, 4]})
        >>> layout = _Layout.of(a, _record_spec(a, frozenset()))
        >>> layout.matches(b), layout.matches(encode_example({}, {"y": [3]}))
        (True, False)
    """

    def __init__(self, first: bytes, values: dict[str, tuple[int, int]]):
        self.first = first
        self.values = values
        cuts = sorted(values.values())
        edges = [0, *(x for span in cuts for x in span), len(first)]
        self.fixed = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2)
                      if edges[i + 1] > edges[i]]

    @classmethod
    def of(cls, payload: bytes, spec: dict[str, RecordFeature]) -> _Layout | None:
        """The layout of ``payload`` (the first record), or ``None`` when its values
        cannot lie at fixed offsets (bytes features, unpacked lists)."""
        values = {}
        for name, value in parse_example(payload).items():
            f = spec[name]
            if f.kind == "tensor":
                header = parse_tensor_header(payload, *value.spans[0])
                if not isinstance(header, TensorHeader) or header.content is None:
                    return None
                values[name] = header.content
            elif f.kind in ("float_list", "int64_list") and value.packed == (True,):
                values[name] = value.spans[0]
            else:
                return None
        return cls(payload, values)

    def matches(self, payload: bytes) -> bool:
        first = self.first
        return len(payload) == len(first) and all(
            payload[a:b] == first[a:b] for a, b in self.fixed)


def expand_tfrecord_paths(patterns: str | os.PathLike | Sequence[str | os.PathLike]
                          ) -> list[Path]:
    """The files named by paths and glob patterns, each pattern's matches sorted; a file
    that more than one of them names is read once, where it first appears.

    Raises:
        DatasetError: for a pattern that matches no file, or a path that is a directory.
    """
    if isinstance(patterns, str | os.PathLike):
        patterns = [patterns]
    files: list[Path] = []
    seen: set[Path] = set()
    for pattern in patterns:
        text = str(pattern)
        if not glob.has_magic(text) and os.path.isdir(text):
            raise DatasetError(f"{text!r} is a directory, not a TFRecord file: give its files "
                               f"(a quoted glob such as "
                               f"{os.path.join(text, '*.tfrecords')!r}). "
                               f"Received: tfrecord={text!r}")
        matches = sorted(glob.glob(text)) if glob.has_magic(text) else \
            ([text] if os.path.exists(text) else [])
        matches = [m for m in matches if not os.path.isdir(m)]
        if not matches:
            raise DatasetError(f"No TFRecord file matches {text!r}: check the path (quote a "
                               f"glob so that memfit expands it, e.g. 'data/*.tfrecords'). "
                               f"Received: tfrecord={text!r}")
        for m in map(Path, matches):        # a file named twice is read once
            if m not in seen:
                seen.add(m)
                files.append(m)
    return files


class _ZlibStream(io.RawIOBase):
    """A ZLIB-compressed file read as its decompressed bytes."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self._z = zlib.decompressobj()
        self._buf = bytearray()
        self._pos = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:             # type: ignore[override]
        while (n < 0 or len(self._buf) - self._pos < n) and not self._z.eof:
            chunk = self._f.read(1 << 20)
            if not chunk:
                break
            if self._pos:
                del self._buf[:self._pos]
                self._pos = 0
            self._buf += self._z.decompress(chunk)
        stop = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = bytes(self._buf[self._pos:stop])
        self._pos = stop
        return out

    def close(self) -> None:
        self._f.close()
        super().close()


def open_file(path: Path) -> BinaryIO:
    """``path`` opened for reading, or the reason it cannot be, said as a DatasetError."""
    try:
        return open(path, "rb")
    except PermissionError as e:
        raise DatasetError(f"TFRecord file {str(path)!r} cannot be read ({e.strerror}): give "
                           f"memfit read access to it (chmod), or leave it out of the "
                           f"paths. Received: {str(path)!r}") from None
    except OSError as e:
        raise DatasetError(f"TFRecord file {str(path)!r} cannot be opened ({e.strerror}). "
                           f"Received: {str(path)!r}") from None


def compression_of(path: Path) -> str | None:
    """``None`` (plain), ``"GZIP"`` or ``"ZLIB"``, from the first bytes of the file."""
    with open_file(path) as f:
        head = f.read(12)
    if len(head) < 12 or struct.pack("<I", mask_crc(google_crc32c.value(head[:8]))) == head[8:]:
        return None                                   # empty, or a valid first frame
    if head[:2] == b"\x1f\x8b":
        return "GZIP"
    try:
        zlib.decompressobj().decompress(head)
        return "ZLIB"
    except zlib.error:
        return None                                   # plain, damaged: the reader says so


def open_stream(path: Path, compression: str | None) -> BinaryIO:
    f = open_file(path)
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=f)               # type: ignore[return-value]
    if compression == "ZLIB":
        return _ZlibStream(f)                         # type: ignore[return-value]
    return f


class SpecCheck:
    """The spec of a set of records: inferred from the first record :meth:`check` is
    given, and every later record checked against it (what the pack's first pass and
    ``memfit.dataset``'s in-place reader both run).

    Args:
        variable: features whose first dimension may vary.
        in_place: the records are read in place (``memfit.dataset``), not packed: a
            varying shape is advised to be packed.

    Attributes:
        spec: the features of the first record (empty until then), sorted by name.
        first: ``(file, record index)`` of that record.
        layout: where the values lie in records built like the first one (``None`` when
            they cannot lie at fixed offsets): such records are checked without parsing.

    Raises:
        DatasetError: from :meth:`check`, naming the file, the record and both specs.
    """

    def __init__(self, variable: Iterable[str] = (), *, in_place: bool = False):
        self.variable = frozenset(variable)
        self.in_place = in_place
        self.spec: dict[str, RecordFeature] = {}
        self.first: tuple[Path, int] | None = None
        self.layout: _Layout | None = None

    def check(self, path: Path, index: int, payload: bytes) -> None:
        """Checks record ``index`` of ``path`` against the spec (the first sets it)."""
        if self.layout is not None and self.layout.matches(payload):
            return                                    # built like the first record
        where = f"TFRecord file {str(path)!r} record {index}"
        try:
            spec = _record_spec(payload, self.variable)
        except ProtoError as e:
            raise DatasetError(f"{where} is not a tf.train.Example ({e}). memfit reads "
                               f"files of tf.train.Example records.") from None
        except _Refused as e:
            raise DatasetError(f"{where}: {e}.") from None
        if self.first is None:
            for name in spec:
                check_feature_name(name)
            if not spec:
                raise DatasetError(f"{where} has no features.")
            self.spec, self.first = dict(sorted(spec.items())), (path, index)
            self.layout = _Layout.of(payload, self.spec)
            return
        if spec.keys() == self.spec.keys() and all(spec[n].same(self.spec[n]) for n in spec):
            return
        first = f"file {str(self.first[0])!r} record {self.first[1]}"
        if spec.keys() != self.spec.keys():
            missing = sorted(set(self.spec) - set(spec))
            extra = sorted(set(spec) - set(self.spec))
            raise DatasetError(
                f"{where} has features {sorted(spec)}, {first} had {sorted(self.spec)}"
                f"{f' (missing: {missing})' if missing else ''}"
                f"{f' (not in the first: {extra})' if extra else ''}. Every record must "
                f"have the same features.")
        name = next(n for n in spec if not spec[n].same(self.spec[n]))
        hint = "" if name in self.variable or spec[name].kind not in (
            "float_list", "int64_list", "tensor") else \
            (f" If its first dimension varies, pack the files declaring it variable "
             f"(memfit pack --tfrecord ... --variable {name}): memfit.dataset reads fixed "
             f"shapes in place." if self.in_place else
             f" If its first dimension varies, declare it variable (variable=[{name!r}], "
             f"--variable {name}).")
        raise DatasetError(f"{where}: feature {name!r} is {spec[name]}; {first} had "
                           f"{self.spec[name]}. The records disagree.{hint}")



class TFRecordSource(ArraySource):
    """TFRecord files, indexed and checked by a first pass, read record by record.

    It has the members of :class:`~memfit.data.sources.columns.ArraySource` (random
    access, known length), so either packer writes it.

    Args:
        files: the TFRecord files, in order.
        scratch: a directory for decompressed copies of compressed files.
        variable: features whose first dimension (a list's length) may vary.
        description: what was packed, for the manifest (the spec is added to it).
    """

    random_access = True
    # Rows a packer asks for at once. Records are read and decoded one by one, so a large
    # chunk buys nothing and its decoded rows are what a pack holds: with the packers'
    # 32 MiB, a 1 GB pack's 16 MiB shards held 12 MiB more than a 0.25 GB pack's 4 MiB
    # ones (anonymous peak 42.9 against 30.4 MiB; issue 30). 1 MiB rather than 4, with
    # 2 MiB staging buffers: the pack's peak RSS 52.8 MiB for 2 GiB, 51.8 for 0.25 GiB
    # (1.02; 1.22 at 4 MiB), its time unchanged (3.4-4.0 s for 2 GiB).
    chunk_bytes = 2**20

    def __init__(self, files: Sequence[Path], scratch: Path, *, variable: Iterable[str] = (),
                 description: str = ""):
        self.files = list(files)
        self.variable = frozenset(variable)
        self.paths: dict[str, str] = {}                 # nothing to memory-map
        self.compression = [compression_of(p) for p in self.files]
        self.read_paths = list(self.files)
        self._file = array.array("i")
        self._offset = array.array("q")
        self._size = array.array("q")
        self.records_per_file: list[int] = []
        self._checker = SpecCheck(self.variable)
        for i, path in enumerate(self.files):
            self._scan(i, path, scratch)
        self.spec = self._checker.spec
        self._layout = self._checker.layout
        if not self._offset:
            raise DatasetError(f"The TFRecord files hold no records: "
                               f"{', '.join(map(str, self.files[:3]))}"
                               f"{' ...' if len(self.files) > 3 else ''}; nothing to pack.")
        unknown = self.variable - set(self.spec)
        if unknown:
            raise DatasetError(f"variable names features the records do not have: "
                               f"{sorted(unknown)}; features are {sorted(self.spec)}.")
        self.length = len(self._offset)
        self.features = {n: f.feature for n, f in self.spec.items()}
        self.columns: Columns = dict.fromkeys(self.features)   # names only: see take
        self._index = (np.frombuffer(self._file, np.int32), np.frombuffer(self._offset, np.int64),
                       np.frombuffer(self._size, np.int64))
        spec = "; ".join(f"{n}: {f}" for n, f in self.spec.items())
        self.description = (f"{description or 'tfrecord files'} "
                            f"({format_count(len(self.files), 'file')}, "
                            f"{format_count(self.length, 'record')}; {spec})")

    def _scan(self, i: int, path: Path, scratch: Path) -> None:
        """The first pass over one file: checks, spec, where each record lies."""
        compression = self.compression[i]
        copy = None
        if compression is not None:
            scratch.mkdir(parents=True, exist_ok=True)
            self.read_paths[i] = scratch / f"{i:05d}.tfrecord"
            copy = open(self.read_paths[i], "wb")
        count = 0
        try:
            with open_stream(path, compression) as stream:
                for index, (offset, payload) in enumerate(iter_records(stream)):
                    self._checker.check(path, index, payload)
                    if copy is not None:
                        copy.write(frame(payload))
                    self._file.append(i)
                    self._offset.append(offset)
                    self._size.append(len(payload))
                    count += 1
        except RecordError as e:
            if e.index == 0 and e.offset == 0:
                # Not one good frame: another kind of file (a text file named .tfrecords
                # was called damaged, "write it again", which it never was: a stranger).
                if ".tfrec" not in path.name:
                    raise DatasetError(f"{str(path)!r} is not a TFRecord file: its first "
                                       f"bytes are not a TFRecord frame (nor GZIP or ZLIB). "
                                       f"Give TFRecord files of tf.train.Example records; a "
                                       f"Parquet, CSV or .npz file is packed with its own "
                                       f"option (--parquet, --csv, or as arrays).") from None
                raise DatasetError(f"{str(path)!r} is not a TFRecord file, or is damaged "
                                   f"from its first byte: its first bytes are not a TFRecord "
                                   f"frame (nor GZIP or ZLIB; {e}). Give TFRecord files of "
                                   f"tf.train.Example records, or leave this one out of the "
                                   f"pattern.") from None
            raise DatasetError(f"TFRecord file {str(path)!r} is damaged: {e} (its CRC32C "
                               f"does not match, or the file is cut short). Write the file "
                               f"again, or leave it out of the pattern.") from None
        except (OSError, EOFError, zlib.error) as e:
            what = {None: "", "GZIP": " (GZIP)", "ZLIB": " (ZLIB)"}[compression]
            raise DatasetError(f"TFRecord file {str(path)!r}{what} cannot be read after "
                               f"record {count}: {e}.") from None
        finally:
            if copy is not None:
                copy.close()
        self.records_per_file.append(count)

    def take(self, indices: np.ndarray) -> Columns:
        """The records at ``indices``, decoded, in that order (read in file order)."""
        indices = np.asarray(indices, np.int64)
        files, offsets, sizes = (a[indices] for a in self._index)
        order = np.lexsort((offsets, files))
        out: Columns = {}
        for name, f in self.features.items():
            out[name] = [None] * len(indices) if f.variable else \
                np.empty((len(indices), *f.shape), f.dtype)
        fds: dict[int, int] = {}
        try:
            for row in order.tolist():
                i = int(files[row])
                if i not in fds:
                    fds[i] = os.open(self.read_paths[i], os.O_RDONLY)
                self._decode(i, int(offsets[row]), int(sizes[row]), fds[i], out, row)
        finally:
            for fd in fds.values():
                os.close(fd)
        return out

    def _decode(self, i: int, offset: int, size: int, fd: int, out: Columns, row: int) -> None:
        data = os.pread(fd, size + 16, offset)
        payload = data[12:12 + size]
        if len(data) < size + 16 or struct.unpack("<I", data[-4:])[0] != \
                mask_crc(google_crc32c.value(payload)):
            raise DatasetError(f"TFRecord file {str(self.files[i])!r} changed while it was "
                               f"packed: the record at byte {offset} no longer matches its "
                               f"checksum. Pack it again once it is no longer written.")
        for name, arr in decode_payload(payload, self.spec, self._layout).items():
            self._put(out[name], row, arr, self.spec[name], i, offset)

    def _put(self, col: Any, row: int, arr: np.ndarray, f: Feature | RecordFeature, i: int,
             offset: int) -> None:
        if isinstance(col, list):
            col[row] = np.array(arr).reshape(-1, *f.shape[1:])
            return
        try:
            col[row] = arr.reshape(f.shape)
        except ValueError:
            raise DatasetError(f"TFRecord file {str(self.files[i])!r} record at byte "
                               f"{offset}: feature {f.name!r} has {arr.size} values, not "
                               f"the shape {f.shape} of the first record.") from None

    def release_pages(self) -> None:
        """Nothing is memory-mapped: ``pread`` leaves no pages in the process."""

    def fingerprint(self) -> str:
        """The files (path, size, mtime) and the spec."""
        h = hashlib.sha256()
        for path in self.files:
            st = os.stat(path)
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        h.update(self.description.encode())
        return h.hexdigest()


def decode_payload(payload: bytes, spec: dict[str, RecordFeature],
                   layout: _Layout | None) -> dict[str, np.ndarray]:
    """The values of one record of ``spec`` (not yet reshaped): viewed at the layout's
    offsets when the record is built like the first one, else parsed."""
    out: dict[str, np.ndarray] = {}
    if layout is not None and layout.matches(payload):
        for name, f in spec.items():
            first, end = layout.values[name]
            if f.kind == "int64_list":
                out[name] = decode_list(payload, Value(f.kind, ((first, end),), (True,)))
            else:
                dtype = np.dtype(f.dtype).newbyteorder("<")
                out[name] = np.frombuffer(payload, dtype, (end - first) // dtype.itemsize,
                                          first)
        return out
    values = parse_example(payload)
    for name, f in spec.items():
        value = values[name]
        if f.kind in ("float_list", "int64_list"):
            out[name] = decode_list(payload, value)
        elif f.kind == "tensor":
            header = parse_tensor_header(payload, *value.spans[0])
            assert isinstance(header, TensorHeader)
            out[name] = header.array(payload)
        else:
            out[name] = np.frombuffer(value.value(payload), np.uint8)
    return out


def open_tfrecords(patterns: str | os.PathLike | Sequence[str | os.PathLike], scratch: Path,
                   *, variable: Iterable[str] = ()) -> TFRecordSource:
    """TFRecord files (paths or glob patterns) opened as a source: checked, spec inferred.

    Args:
        patterns: a path or glob (``"data/path*.tfrecords"``), or a list of them.
        scratch: where compressed files are decompressed for the pack.
        variable: features whose first dimension may vary between records.

    Raises:
        DatasetError: for no matching file, a damaged record, a record that is not a
            ``tf.train.Example``, records that disagree (naming file, record, both specs).
    """
    files = expand_tfrecord_paths(patterns)
    shown = patterns if isinstance(patterns, str | os.PathLike) else \
        ", ".join(map(str, patterns))
    return TFRecordSource(files, scratch, variable=variable, description=f"tfrecord {shown}")


def describe_tfrecords(patterns: str | os.PathLike | Sequence[str | os.PathLike]) -> str:
    """What ``memfit inspect`` prints for TFRecord files: files, records and the spec
    inferred from them (every record is read and checked)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="memfit-inspect-") as scratch:
        src = open_tfrecords(patterns, Path(scratch))
    lines = [f"TFRecord files {patterns if isinstance(patterns, str) else list(patterns)} "
             f"(not packed: `memfit pack --tfrecord ...` packs them)",
             f"  {format_count(src.length, 'record')} in {format_count(len(src.files), 'file')}"
             f", every record checked"]
    for path, comp, count in zip(src.files, src.compression, src.records_per_file, strict=True):
        lines.append(f"    {str(path)}  {format_count(count, 'record')}, compression: "
                     f"{comp or 'none'}")
    lines.append("  features (what each record holds → what memfit packs):")
    width = max(len(n) for n in src.spec)
    lines += [f"    {n:<{width}}  {f}" for n, f in src.spec.items()]
    return "\n".join(lines)

