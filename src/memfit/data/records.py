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

import io
import struct
from collections.abc import Iterator, Mapping, Sequence

import google_crc32c

__all__ = ["encode_example", "frame", "iter_records", "RecordError", "LENGTHS_SUFFIX"]

LENGTHS_SUFFIX = "/lengths"
_MASK_DELTA = 0xA282EAD8


class RecordError(Exception):
    """A TFRecord frame that is damaged: bad length checksum, bad data checksum, or cut."""

    def __init__(self, message: str, index: int, offset: int):
        super().__init__(message)
        self.index = index
        self.offset = offset


def _masked_crc(data: bytes | memoryview) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)


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


def _field(tag: int, payload: bytes | Sequence[bytes]) -> list[bytes]:
    """A length-delimited protobuf field, as a list of byte pieces (joined once, later)."""
    if isinstance(payload, bytes | bytearray | memoryview):
        payload = [payload]
    size = sum(len(p) for p in payload)
    return [bytes([(tag << 3) | 2]), _varint(size), *payload]


def _entry(name: str, feature: list[bytes]) -> list[bytes]:
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
    entries: list[bytes] = []
    for name, data in raw.items():
        bytes_list = _field(1, data)                        # BytesList.value
        entries += _entry(name, _field(1, bytes_list))      # Feature.bytes_list
    for name, values in (int64s or {}).items():
        packed = b"".join(_varint(int(v)) for v in values)
        int64_list = _field(1, packed)                      # Int64List.value (packed)
        entries += _entry(name, _field(3, int64_list))      # Feature.int64_list
    return b"".join(_field(1, entries))                     # Example.features


def frame(payload: bytes) -> bytes:
    """Wraps one record in TFRecord framing: length, masked CRC32C of it, data, CRC."""
    header = struct.pack("<Q", len(payload))
    return b"".join((header, _masked_crc(header), payload, _masked_crc(payload)))


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
