"""Where everything is in a record of a memfit shard of fixed-shape features, and whether
memfit's block reader (:mod:`memfit.data.read.blocks.block_reader`) can read a set of shards.

Every record of a memfit shard is a ``tf.train.Example`` that memfit encoded itself: a
block of ``samples_per_record`` samples, each feature one ``bytes_list`` value of raw
little-endian bytes (:mod:`memfit.data.format.records`). When every feature has a fixed shape,
all full records of a split have the same length and keep each feature's bytes at the
same offsets, and only the last record of a shard may hold fewer samples. So the reader
knows where everything is without parsing anything (:func:`record_layout`).

Example:
    >>> lay = record_layout([Feature("x", "float32", (3,)), Feature("y", "int64", ())], 4)
    >>> lay.samples, lay.header == frame_header(lay.frame_bytes - 16)
    (4, True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from memfit.data.format import records
from memfit.data.format.manifest import Feature, Manifest, Shard
from memfit.data.format.records import example_layout, frame_header

__all__ = ["RecordLayout", "record_layout", "reads_into_batches", "why_not"]


@dataclasses.dataclass(frozen=True)
class RecordLayout:
    """Where a record of ``samples`` samples keeps its pieces (fixed-shape features).

    Attributes:
        samples: samples in the record.
        frame_bytes: bytes of the whole frame (12 header + payload + 4 CRC).
        header: the frame's first 12 bytes (length and its masked CRC32C).
        skeleton: the payload's bytes that are not feature values (tags and lengths),
            concatenated in order.
        pieces: the payload in order, as ``(feature index or -1 for skeleton, offset in
            the skeleton or the feature's block, bytes)``.
    """

    samples: int
    frame_bytes: int
    header: bytes
    skeleton: bytes
    pieces: tuple[tuple[int, int, int], ...]


def record_layout(features: Sequence[Feature], samples: int) -> RecordLayout:
    """The layout :func:`memfit.data.format.records.encode_example` gives a record of
    ``samples`` samples of these (fixed-shape) features, in the manifest's order.

    Example:
        >>> lay = record_layout([Feature("x", "float32", (3,))], 2)
        >>> lay.frame_bytes, [p[0] for p in lay.pieces]
        (53, [-1, 0])

    Args:
        features: every feature of the dataset, in the manifest's order.
        samples: samples in the record.
    """
    parts = example_layout({f.name: samples * int(f.sample_bytes or 0) for f in features})
    index = {f.name: i for i, f in enumerate(features)}
    pieces = []
    skeleton = b""
    for part in parts:
        if isinstance(part, bytes):
            pieces.append((-1, len(skeleton), len(part)))
            skeleton += part
        else:
            pieces.append((index[part[0]], 0, part[1]))
    payload = sum(p[2] for p in pieces)
    return RecordLayout(samples=samples, frame_bytes=12 + payload + 4,
                        header=frame_header(payload), skeleton=skeleton, pieces=tuple(pieces))


def reads_into_batches(dtypes: Sequence[Any]) -> bool:
    """Whether the block reader reads each sample of these (little-endian) dtypes straight
    into its batch row: it needs memfit's C loop (``memfit.data.format.cwindow``, built at
    install where a C compiler is found), which reads each record with one ``preadv``
    straight to its pieces (each sample to its row) and checks its CRC32C over them while
    they are in the CPU cache, and no byte swapping. Otherwise records are read into
    scratch buffers in order and their samples gathered into batches afterwards: two more
    trips through memory.

    Example:
        >>> reads_into_batches(["<f4", "<i8"]) == (records.NATIVE is not None)
        True

    Args:
        dtypes: the stored dtypes of the features returned.
    """
    return (records.NATIVE is not None
            and all(np.dtype(d).newbyteorder("<").isnative for d in dtypes))


def why_not(manifest: Manifest, shards: Sequence[Shard]) -> str | None:
    """Why the block reader cannot read these shards (``None``: it can).

    It reads uncompressed shards whose features all have a fixed shape and whose records
    are full but for the last of each shard (what ``memfit.pack`` writes), and checks
    the frame header and tags of the first shard's first record against that layout (a
    shard written some other way goes to the TF reader; a damaged one too, which then
    reports the damage).

    Args:
        manifest: the dataset's manifest.
        shards: the shards to read.
    """
    if manifest.compression:
        return f"the shards are {manifest.compression}-compressed"
    encoded = [f.name for f in manifest.features.values() if f.decode is not None]
    if encoded:
        return f"features {encoded} are image files kept encoded, decoded by tf.data"
    variable = [f.name for f in manifest.features.values() if f.variable]
    if variable:
        return f"features {variable} have a variable shape"
    k = manifest.samples_per_record
    features = list(manifest.features.values())
    full = record_layout(features, k)
    for s in shards:
        last = s.samples - (s.records - 1) * k
        if s.records < 1 or not 1 <= last <= k:
            return (f"shard {s.file} holds {s.samples} samples in {s.records} records, not "
                    f"full records of {k} and a last one")
        size = (s.records - 1) * full.frame_bytes + record_layout(features, last).frame_bytes
        if size != s.bytes:
            return (f"shard {s.file} has {s.bytes} bytes in the manifest, not the {size} "
                    f"that records of this layout take")
    if shards and manifest.path is not None:
        first = shards[0]
        lay = full if first.records > 1 else record_layout(features, first.samples)
        file = manifest.path / first.file
        try:
            with open(file, "rb") as f:
                data = f.read(lay.frame_bytes)
        except OSError as e:
            return f"{file} cannot be read ({e})"
        at, skeleton = 12, b""
        for f_, _, size in lay.pieces:
            if f_ < 0:
                skeleton += data[at:at + size]
            at += size
        if data[:12] != lay.header or skeleton != lay.skeleton:
            return f"the first record of {file} is not laid out as memfit.pack writes it"
    return None
