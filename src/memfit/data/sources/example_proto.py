"""``tf.train.Example`` and ``TensorProto`` bytes decoded without TensorFlow: what a
TFRecord file written by someone else holds, read in place.

memfit writes its own records by hand (:mod:`memfit.data.format.records`); this is the
other direction, for the records of other programs. It decodes only the wire format of
the few messages involved (``Example`` → ``Features`` → ``map<string, Feature>`` →
``BytesList``/``FloatList``/``Int64List``, and a ``TensorProto``: its ``tensor_content``,
as ``tf.io.serialize_tensor`` writes it, or its typed fields, ``float_val``…, as
``tf.make_tensor_proto`` may), packed and unpacked repeated fields alike. A tensor's
``tensor_content`` is viewed where it lies in the record, not copied. Nothing here imports
TensorFlow: ``memfit pack`` does not start it (nor print its start-up lines).

Example:
    >>> from memfit.data.format.records import encode_example
    >>> payload = encode_example({"data": b"\\x89PNG\\r\\n\\x1a\\n..."}, {"label": [3]})
    >>> values = parse_example(payload)
    >>> sorted(values), values["label"].kind, decode_list(payload, values["label"]).tolist()
    (['data', 'label'], 'int64_list', [3])
    >>> image_format(values["data"].value(payload))
    'png'
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["ProtoError", "Value", "TensorHeader", "parse_example", "decode_list",
           "parse_tensor_header", "image_format", "TENSOR_DTYPES"]

# TensorFlow's DataType enum (tensorflow/core/framework/types.proto) → NumPy, for the
# dtypes memfit can store.
TENSOR_DTYPES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8",
                 8: "complex64", 9: "int64", 10: "bool", 17: "uint16", 18: "complex128",
                 19: "float16", 22: "uint32", 23: "uint64"}
_UNSUPPORTED = {7: "string", 14: "bfloat16", 20: "resource", 21: "variant"}
_KINDS = {1: "bytes_list", 2: "float_list", 3: "int64_list"}
# The TensorProto field holding a dtype's values when they are not in tensor_content
# (tensorflow/core/framework/tensor.proto), and the width of one value on the wire: "<f4" or
# "<f8" (fixed32/fixed64; two a complex value) or None (a varint).
_TYPED_FIELDS = {"float32": (5, "<f4"), "float64": (6, "<f8"), "int32": (7, None),
                 "uint8": (7, None), "int16": (7, None), "int8": (7, None),
                 "uint16": (7, None), "complex64": (9, "<f4"), "int64": (10, None),
                 "bool": (11, None), "complex128": (12, "<f8"), "float16": (13, None),
                 "uint32": (16, None), "uint64": (17, None)}
_IMAGE_MAGIC = ((b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"),
                (b"GIF89a", "gif"), (b"BM", "bmp"))


class ProtoError(ValueError):
    """Bytes that are not the message they were read as."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ProtoError("a varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError("a varint longer than 10 bytes")


def _fields(buf: bytes, start: int, end: int):
    """``(field number, wire type, value)`` of each field in ``buf[start:end]``: the
    integer of a varint, ``(first, end)`` of anything else."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value
            continue
        if wire == 2:
            size, pos = _varint(buf, pos, end)
            stop = pos + size
        elif wire == 5:
            stop = pos + 4
        elif wire == 1:
            stop = pos + 8
        else:
            raise ProtoError(f"field {number} has wire type {wire}, which no message here uses")
        if stop > end:
            raise ProtoError(f"field {number} runs past the end of its message")
        yield number, wire, (pos, stop)
        pos = stop


@dataclasses.dataclass(frozen=True)
class Value:
    """Where one feature's values lie in a serialised ``Example``.

    Attributes:
        kind: ``"bytes_list"``, ``"float_list"``, ``"int64_list"`` (``"empty"``: no kind set).
        spans: ``(first, end)`` of each ``bytes_list`` value, or of each piece of a numeric
            list's values (one when packed).
        packed: the numeric values are packed (``float_list``/``int64_list``).
    """

    kind: str
    spans: tuple[tuple[int, int], ...]
    packed: tuple[bool, ...] = ()

    def value(self, payload: bytes, i: int = 0) -> memoryview:
        """The ``i``-th bytes value (a view into ``payload``)."""
        first, end = self.spans[i]
        return memoryview(payload)[first:end]

    def count(self, payload: bytes) -> int:
        """The number of values: byte strings, floats or integers."""
        if self.kind in ("bytes_list", "empty"):
            return len(self.spans)
        if self.kind == "float_list":
            return sum((b - a) // 4 if p else 1 for (a, b), p in zip(self.spans, self.packed,
                                                                  strict=True))
        return len(decode_list(payload, self))


def parse_example(payload: bytes) -> dict[str, Value]:
    """Feature name → where its values lie, for one serialised ``tf.train.Example``.

    Raises:
        ProtoError: when the bytes are not an ``Example``.
    """
    out: dict[str, Value] = {}
    n = len(payload)
    for number, wire, span in _fields(payload, 0, n):
        if number != 1 or wire != 2:                  # Example.features
            continue
        for fn, fw, entry in _fields(payload, *span):
            if fn != 1 or fw != 2:                    # Features.feature (map entries)
                continue
            name, feature = None, None
            for en, ew, part in _fields(payload, *entry):
                if en == 1 and ew == 2:
                    name = bytes(payload[part[0]:part[1]]).decode("utf-8", "replace")
                elif en == 2 and ew == 2:
                    feature = part
            if name is None:
                raise ProtoError("a feature without a name")
            out[name] = _feature(payload, feature)
    return out


def _feature(payload: bytes, span: tuple[int, int] | None) -> Value:
    if span is None:
        return Value("empty", ())
    kind, spans, packed = "empty", [], []
    for number, wire, inner in _fields(payload, *span):
        if number not in _KINDS or wire != 2:
            continue
        kind = _KINDS[number]
        spans, packed = [], []                        # the last kind set wins (oneof)
        for vn, vw, value in _fields(payload, *inner):
            if vn != 1:
                continue
            if kind == "bytes_list":
                if vw != 2:
                    raise ProtoError("a bytes_list value that is not length-delimited")
                spans.append(value)
            elif vw == 2:
                spans.append(value)
                packed.append(True)
            elif (kind, vw) in (("float_list", 5), ("int64_list", 0)):
                spans.append(value if vw == 5 else (value, value))
                packed.append(False)
            else:
                raise ProtoError(f"a {kind} value of wire type {vw}")
    return Value(kind, tuple(spans), tuple(packed))


def _varints(buf: bytes, pos: int, end: int) -> list[int]:
    """The varints packed in ``buf[pos:end]``, as unsigned 64-bit integers."""
    out = []
    while pos < end:
        v, pos = _varint(buf, pos, end)
        out.append(v & 0xFFFF_FFFF_FFFF_FFFF)
    return out


def decode_list(payload: bytes, value: Value) -> np.ndarray:
    """The values of a ``float_list`` (float32) or ``int64_list`` (int64)."""
    if value.kind == "float_list":
        parts = [np.frombuffer(payload, "<f4", (b - a) // 4, a)
                 for a, b in value.spans]
        return np.concatenate(parts).astype(np.float32) if len(parts) != 1 \
            else parts[0].astype(np.float32)
    ints: list[int] = []
    for (a, b), p in zip(value.spans, value.packed, strict=True):
        if not p:
            ints.append(a & 0xFFFF_FFFF_FFFF_FFFF)    # an unpacked varint, decoded already
            continue
        ints.extend(_varints(payload, a, b))
    arr = np.array(ints, dtype=np.uint64)
    return arr.view(np.int64)                         # two's complement


@dataclasses.dataclass(frozen=True)
class TensorHeader:
    """A serialised ``TensorProto``: its dtype and shape, and where its values lie.

    ``content`` is ``None`` for a tensor whose values are in the typed fields
    (``float_val``…) rather than ``tensor_content``: :meth:`array` decodes them as
    ``tf.io.parse_tensor`` does.
    """

    dtype: str
    shape: tuple[int, ...]
    content: tuple[int, int] | None
    span: tuple[int, int] = (0, 0)

    def array(self, buf: bytes) -> np.ndarray:
        """The tensor's values, viewed in ``buf`` (what the header was parsed from)."""
        if self.content is None:
            return _typed_values(buf, self.span, self.dtype, self.shape)
        dt = np.dtype(self.dtype).newbyteorder("<")
        return np.frombuffer(buf, dt, math.prod(self.shape), self.content[0]
                             ).reshape(self.shape)


def _typed_values(buf: bytes, span: tuple[int, int], dtype: str,
                  shape: tuple[int, ...]) -> np.ndarray:
    """The values of a ``TensorProto`` kept in its typed field (``float_val``…), as
    TensorFlow reads them (``Tensor::FromProto``): the field of the tensor's dtype only;
    values past the shape's size ignored; too few filled out with the last one, none with
    zeros; an ``int_val`` cast to an 8- or 16-bit dtype wraps, a ``half_val`` holds
    float16 bits.

    Example:
        >>> proto = bytes([8, 1, 18, 4, 18, 2, 8, 3, 42, 8]) + np.float32([1.5, 2]).tobytes()
        >>> parse_tensor_header(proto).array(proto).tolist()         # float_val [1.5, 2]
        [1.5, 2.0, 2.0]
    """
    number, width = _TYPED_FIELDS[dtype]
    pieces: list[np.ndarray] = []
    for n, wire, value in _fields(buf, *span):
        if n != number:
            continue
        if width is not None and wire in (2, 5 if width == "<f4" else 1):
            a, b = value                             # packed, or one fixed-width value
            pieces.append(np.frombuffer(buf, width, (b - a) // int(width[2]), a))
        elif width is None and wire == 2:
            pieces.append(np.array(_varints(buf, *value), np.uint64))
        elif width is None and wire == 0:
            pieces.append(np.array([value & 0xFFFF_FFFF_FFFF_FFFF], np.uint64))
        # another wire type: an unknown field to protobuf, which TensorFlow does not read
    raw = np.concatenate(pieces) if pieces else np.zeros(0, width or np.uint64)
    if width is not None:
        if dtype.startswith("complex"):
            raw = raw[:len(raw) // 2 * 2].view(f"<c{2 * int(width[2])}")
        values = raw.astype(dtype)
    elif dtype == "bool":
        values = raw != 0
    elif dtype == "float16":
        values = raw.astype(np.uint16).view(np.float16)
    elif number == 7:                                 # int_val: an int32, then cast
        values = raw.astype(np.uint32).view(np.int32).astype(dtype)
    elif dtype == "int64":
        values = raw.view(np.int64)                   # two's complement
    else:
        values = raw.astype(dtype)                    # uint32_val truncates, as protobuf
    size = math.prod(shape)
    if len(values) >= size:
        values = values[:size]
    elif len(values):
        values = np.concatenate([values, np.full(size - len(values), values[-1])])
    else:
        values = np.zeros(size, dtype)
    return np.ascontiguousarray(values, dtype).reshape(shape)


def parse_tensor_header(buf: bytes, start: int = 0,
                        end: int | None = None) -> TensorHeader | str | None:
    """The header of ``buf[start:end]`` if it is a serialised ``TensorProto`` of a dtype
    memfit can store; the name of its dtype if it is one of another dtype; ``None`` if it
    is not one (checked strictly: known fields only, values of exactly the shape's size).

    Example:
        >>> parse_tensor_header(b"not a tensor") is None
        True
    """
    end = len(buf) if end is None else end
    if end - start < 2 or buf[start] != 0x08:         # field 1 (dtype), a varint, first
        return None
    dtype_enum, shape, content, typed = None, None, None, False
    try:
        for number, wire, value in _fields(buf, start, end):
            if number == 1 and wire == 0:
                dtype_enum = value
            elif number == 2 and wire == 2:
                shape = _shape(buf, value)
            elif number == 3 and wire == 0:
                pass                                  # version_number
            elif number == 4 and wire == 2:
                content = value
            elif 5 <= number <= 17 and number != 14:  # float_val ... uint64_val
                typed = True
            else:
                return None
    except ProtoError:
        return None
    if dtype_enum in _UNSUPPORTED and shape is not None:
        return _UNSUPPORTED[dtype_enum]
    if dtype_enum not in TENSOR_DTYPES or shape is None:
        return None
    dtype = TENSOR_DTYPES[dtype_enum]
    if content is None:
        return TensorHeader(dtype, shape, None, (start, end)) \
            if typed or math.prod(shape) == 0 else None
    if content[1] - content[0] != math.prod(shape) * np.dtype(dtype).itemsize:
        return None
    return TensorHeader(dtype, shape, content, (start, end))


def _shape(buf: bytes, span: tuple[int, int]) -> tuple[int, ...]:
    dims = []
    for number, wire, value in _fields(buf, *span):
        if number == 2 and wire == 2:                 # TensorShapeProto.dim
            size = 0
            for dn, dw, dv in _fields(buf, *value):
                if dn == 1 and dw == 0:
                    size = dv
            if size >= 1 << 62:
                raise ProtoError("a negative (unknown) dimension")
            dims.append(size)
        elif number == 3 and wire == 0 and value:     # unknown_rank
            raise ProtoError("a shape of unknown rank")
    return tuple(dims)


def image_format(data: bytes | memoryview) -> str | None:
    """``"jpeg"``, ``"png"``, ``"gif"`` or ``"bmp"`` when ``data`` starts as an encoded
    image of that format does, else ``None``."""
    head = bytes(data[:8])
    for magic, name in _IMAGE_MAGIC:
        if head.startswith(magic):
            if name == "bmp" and len(data) < 26:
                return None
            return name
    return None
