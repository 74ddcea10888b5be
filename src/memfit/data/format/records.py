"""The on-disk record format: TFRecord framing and ``tf.train.Example`` encoding.

memfit writes shards without importing TensorFlow (so that packing workers start in
milliseconds), encoding the two protobuf messages it needs by hand. The bytes are
exactly what ``tf.io.TFRecordWriter`` and ``tf.train.Example.SerializeToString()``
produce for the same content; the tests read them back with plain TensorFlow.

A record holds a *block* of up to ``samples_per_record`` consecutive samples. Each
feature becomes one ``bytes_list`` value: the block's values in C order, little-endian.
A variable-shape feature (first dimension varies) adds ``"<name>/lengths"``, an
``int64_list`` with each sample's first-dimension length.

Example:
    >>> payload = encode_example({"x": b"\\x00\\x01"}, {"x/lengths": [2]})
    >>> framed = frame(payload)
    >>> list(iter_records(io.BytesIO(framed)))[0][1] == payload
    True
"""

from __future__ import annotations

import ctypes
import io
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import google_crc32c
import numpy as np

__all__ = ["encode_example", "example_layout", "example_length", "frame", "frame_header",
           "iter_records", "crc32c_at", "crc32c_spans", "NATIVE", "mask_crc", "RecordError",
           "LENGTHS_SUFFIX", "MAX_EXAMPLE_BYTES"]

LENGTHS_SUFFIX = "/lengths"
# The largest serialised tf.train.Example TensorFlow parses: protobuf's limit on a
# message, 2 GiB - 1 (its parsers count bytes in a signed 32-bit int).
MAX_EXAMPLE_BYTES = 2**31 - 1
_MASK_DELTA = 0xA282EAD8


class RecordError(Exception):
    """A TFRecord frame that is damaged: bad length checksum, bad data checksum, or cut."""

    def __init__(self, message: str, index: int, offset: int):
        super().__init__(message)
        self.index = index
        self.offset = offset


def mask_crc(crc: int) -> int:
    """TFRecord's masked form of a CRC32C (what the frame stores, little-endian)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _masked_crc(data: bytes | memoryview) -> bytes:
    return struct.pack("<I", mask_crc(google_crc32c.value(data)))


def _bind_crc32c() -> Callable[[int, int, int], int]:
    """``crc32c_extend(crc, address, nbytes)`` of the C library google_crc32c wraps.

    google_crc32c's Python functions take ``bytes`` only (a slice of a NumPy buffer would
    be copied first) and keep the GIL below 1 MiB; the C function it is built on takes a
    pointer and, called through ``ctypes.CDLL``, runs without the GIL, whatever the size.
    (Keeping the GIL for small pieces, as google_crc32c does, made the block reader's
    throughput bimodal on the development machine: about half the processes ran at half
    speed, one window builder holding the GIL through its CRC loop while the other
    waited.) Falls back to copying the bytes when the symbol cannot be found (a build
    without the bundled library).
    """
    try:
        from google_crc32c import _crc32c  # type: ignore[attr-defined]

        fn = ctypes.CDLL(_crc32c.__file__).crc32c_extend
        fn.restype = ctypes.c_uint32
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        probe = ctypes.create_string_buffer(b"memfit", 6)
        if fn(0, ctypes.addressof(probe), 6) != google_crc32c.value(b"memfit"):
            raise OSError("crc32c_extend gave a different checksum")
        return fn
    except (ImportError, OSError, AttributeError):
        return lambda crc, address, nbytes: google_crc32c.extend(
            crc, ctypes.string_at(address, nbytes))


crc32c_at: Callable[[int, int, int], int] = _bind_crc32c()
crc32c_at.__doc__ = """``crc32c_at(crc, address, nbytes)``: extends ``crc`` (0 to start) with
the ``nbytes`` bytes at ``address`` (e.g. ``array.ctypes.data + offset``), without copying
them and without holding the GIL. The caller keeps the buffer alive."""


def _bind_native() -> tuple[Any, int] | None:
    """memfit's C loops (``memfit.data.format.cwindow``) and the address of the
    ``crc32c_extend`` they call, or ``None`` where the extension was not built (no C
    compiler at install) or the C function could not be found."""
    try:
        from memfit.data.format import cwindow  # type: ignore[attr-defined]
    except ImportError:
        return None
    if not isinstance(crc32c_at, ctypes._CFuncPtr):
        return None
    return cwindow, ctypes.cast(crc32c_at, ctypes.c_void_p).value


NATIVE = _bind_native()


def crc32c_spans(pieces: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """The CRC32C of records scattered over pieces of memory, one call for all of them.

    Record ``i`` is the concatenation, in order, of pieces ``spans[i, 0]`` up to (not
    including) ``spans[i, 1]``; a piece is an ``(address, bytes)`` pair. With memfit's C
    extension (``NATIVE``) the loop runs in C without the GIL; without it, in
    Python, one :func:`crc32c_at` call per piece.

    Example:
        >>> data = np.frombuffer(b"memfit", np.uint8)
        >>> a = data.ctypes.data
        >>> pieces = np.array([[a, 3], [a + 3, 3], [a, 6]], np.uint64)
        >>> crcs = crc32c_spans(pieces, np.array([[0, 2], [2, 3]], np.int64))
        >>> int(crcs[0]) == int(crcs[1]) == google_crc32c.value(b"memfit")
        True

    Args:
        pieces: uint64 ``[P, 2]``, C order: address and length of each piece. The caller
            keeps the memory alive.
        spans: int64 ``[n, 2]``, C order: each record's first piece and its end.
    """
    pieces = np.ascontiguousarray(pieces, np.uint64)
    spans = np.ascontiguousarray(spans, np.int64)
    if pieces.ndim != 2 or pieces.shape[1] != 2 or spans.ndim != 2 or spans.shape[1] != 2:
        raise ValueError(f"pieces and spans must be [P, 2] and [n, 2] arrays. Received: "
                         f"pieces.shape={pieces.shape}, spans.shape={spans.shape}")
    if len(spans) and (spans.min() < 0 or spans.max() > len(pieces)
                       or (spans[:, 1] < spans[:, 0]).any()):
        raise ValueError(f"spans must lie within the {len(pieces)} pieces, first <= end. "
                         f"Received: spans from {spans.min()} to {spans.max()}")
    out = np.zeros(len(spans), np.uint32)
    if NATIVE is not None:
        module, extend = NATIVE
        module.crc_spans(extend, pieces.ctypes.data, spans.ctypes.data, len(spans),
                         out.ctypes.data)
        return out
    addr, size = pieces[:, 0].tolist(), pieces[:, 1].tolist()
    for i, (first, end) in enumerate(spans.tolist()):
        crc = 0
        for p in range(first, end):
            crc = crc32c_at(crc, addr[p], size[p])
        out[i] = crc
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= 0xFFFFFFFFFFFFFFFF          # int64 values are encoded as their two's complement
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class _Hole:
    """Stands for a feature's bytes in :func:`example_layout`: only their length is known."""

    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int):
        self.name = name
        self.size = size

    def __len__(self) -> int:
        return self.size


def _field(tag: int, payload: bytes | memoryview | _Hole | list) -> list:
    """A length-delimited protobuf field, as a list of byte pieces (joined once, later)."""
    if not isinstance(payload, list):
        payload = [payload]
    size = sum(len(p) for p in payload)
    return [bytes([(tag << 3) | 2]), _varint(size), *payload]


def _entry(name: str, feature: list) -> list:
    key = name.encode("utf-8")
    return _field(1, [*_field(1, key), *_field(2, feature)])


def encode_example(raw: Mapping[str, bytes | memoryview],
                   int64s: Mapping[str, Sequence[int]] | None = None) -> bytes:
    """Serialises a ``tf.train.Example`` with ``bytes_list`` and ``int64_list`` features.

    Args:
        raw: feature name → the bytes of its single ``bytes_list`` value.
        int64s: feature name → the values of its ``int64_list``.

    Returns:
        The serialised message, byte for byte what TensorFlow's protobuf would write
        (map entries in the order given).
    """
    return b"".join(_example_pieces(raw, int64s))


def _example_pieces(raw: Mapping[str, bytes | memoryview | _Hole],
                    int64s: Mapping[str, Sequence[int]] | None = None) -> list:
    entries: list = []
    for name, data in raw.items():
        bytes_list = _field(1, data)                        # BytesList.value
        entries += _entry(name, _field(1, bytes_list))      # Feature.bytes_list
    for name, values in (int64s or {}).items():
        packed = b"".join(_varint(int(v)) for v in values)
        int64_list = _field(1, packed)                      # Int64List.value (packed)
        entries += _entry(name, _field(3, int64_list))      # Feature.int64_list
    return _field(1, entries)                               # Example.features


def example_layout(sizes: Mapping[str, int]) -> list[bytes | tuple[str, int]]:
    """Where each feature's bytes lie in the ``tf.train.Example`` that
    :func:`encode_example` writes for ``bytes_list`` features of these sizes.

    Example:
        >>> [p if isinstance(p, tuple) else len(p) for p in example_layout({"x": 8, "y": 1000})]
        [14, ('x', 8), 15, ('y', 1000)]

    Args:
        sizes: feature name → bytes of its value, in the order :func:`encode_example`
            receives them.

    Returns:
        The serialised message as pieces in order: ``bytes`` that are always the same
        for these sizes (tags and lengths), and ``(name, size)`` where a feature's bytes go.
    """
    out: list[bytes | tuple[str, int]] = []
    for piece in _example_pieces({n: _Hole(n, s) for n, s in sizes.items()}):
        if isinstance(piece, _Hole):
            out.append((piece.name, piece.size))
        elif out and isinstance(out[-1], bytes):
            out[-1] += bytes(piece)
        else:
            out.append(bytes(piece))
    return out


def example_length(sizes: Mapping[str, int]) -> int:
    """The bytes of the ``tf.train.Example`` that :func:`encode_example` writes for
    ``bytes_list`` features of these sizes (tags and lengths included).

    Example:
        >>> example_length({"x": 8, "y": 1000}) == len(encode_example({"x": b"0" * 8,
        ...                                                             "y": b"0" * 1000}))
        True
    """
    return sum(p[1] if isinstance(p, tuple) else len(p) for p in example_layout(sizes))


def frame_header(length: int) -> bytes:
    """The first 12 bytes of a TFRecord frame holding ``length`` bytes of data."""
    header = struct.pack("<Q", length)
    return header + _masked_crc(header)


def frame(payload: bytes) -> bytes:
    """Wraps one record in TFRecord framing: length, masked CRC32C of it, data, CRC."""
    return b"".join((frame_header(len(payload)), payload, _masked_crc(payload)))


def iter_records(stream: io.RawIOBase | io.BufferedIOBase,
                 check: bool = True) -> Iterator[tuple[int, bytes]]:
    """Reads TFRecord frames from a binary stream, checking both checksums.

    Yields:
        ``(byte_offset, payload)`` for each record.

    Raises:
        RecordError: at the first damaged or truncated record, with its index and offset.
    """
    index = offset = 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12:
            raise RecordError(f"truncated record header at record {index} (byte {offset})",
                              index, offset)
        length_bytes, length_crc = header[:8], header[8:]
        if check and _masked_crc(length_bytes) != length_crc:
            raise RecordError(f"corrupt length checksum at record {index} (byte {offset})",
                              index, offset)
        (length,) = struct.unpack("<Q", length_bytes)
        payload = stream.read(length)
        data_crc = stream.read(4)
        if len(payload) < length or len(data_crc) < 4:
            raise RecordError(f"truncated record {index} (byte {offset}): expected {length} "
                              f"bytes of data", index, offset)
        if check and _masked_crc(payload) != data_crc:
            raise RecordError(f"corrupt data checksum at record {index} (byte {offset})",
                              index, offset)
        yield offset, payload
        offset += 16 + length
        index += 1
