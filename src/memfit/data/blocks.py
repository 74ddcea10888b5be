"""memfit's block reader: packed shards of fixed-shape features read straight into batches.

Every record of a memfit shard is a ``tf.train.Example`` that memfit encoded itself: a
block of ``samples_per_record`` samples, each feature one ``bytes_list`` value of raw
little-endian bytes (:mod:`memfit.data.records`). When every feature has a fixed shape,
all full records of a split have the same length and keep each feature's bytes at the
same offsets, and only the last record of a shard may hold fewer samples. So the reader
knows where everything is without parsing anything, and, since a window's order is
decided before it is read, where each sample goes: with memfit's C loop
(:func:`reads_into_batches`) each record is read into a staging buffer that stays in the
CPU cache, its CRC32C checked there, and each sample's values copied to its batch row,
one call per window without the GIL; without it, a run of consecutive records is read
with one ``os.preadv`` that scatters each feature's bytes into a contiguous per-feature
scratch buffer (reused from call to call), the CRC32C is computed over the pieces in
place (:func:`memfit.data.records.crc32c_spans`), and one ``np.take`` per feature gathers
the samples into aligned batches. Either way the frame headers and protobuf tags land in
small side buffers and are checked against the layout.

The order of epoch ``e`` (a pure function of ``(seed, e)``):

1. the shard files are permuted by ``(seed, e)`` and read ``cycle`` at a time, round-robin
   one record from each; a shard that ends hands its lane to the next file in the
   permutation (the record sequence of ``tf.data``'s ``interleave``);
2. that sequence of samples is cut into *windows* of ``window`` samples, a whole number
   of batches; the samples of window ``w`` are permuted by ``(seed, e, w)`` and cut into
   batches.

So batch ``b``'s samples are a pure function of ``(seed, e, b)``: any window can be built
at any time, by any thread, in any order. The record sequence of an epoch costs a few
NumPy operations over the manifest's record counts (16 bytes a record, nothing per
sample) and is computed once per epoch.

Integrity: a record whose frame header, tags or CRC32C does not match, or that lies past
the end of its (truncated) file, raises :class:`ShardReadError` naming the shard file and
the record's index (``tf.errors.InvalidArgumentError`` through ``tf.data``); with
``on_corrupt="skip"`` its samples are left out and a warning on stderr counts the
records skipped. Fixed-length records let the reader go on after a damaged record
instead of losing the rest of the shard.

Example:
    >>> m = Manifest.load("data/train")                                # doctest: +SKIP
    >>> why_not(m, m.split("train").shards) is None                    # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from memfit.data import records as _records
from memfit.data.manifest import Feature, Manifest, Shard
from memfit.data.pipeline import (
    BufferPool,
    RecyclingBuffers,
    WindowFeeder,
    aligned_empty,
    finish,
    order_rng,
    pass_epochs,
    touch,
)
from memfit.data.records import (
    crc32c_spans,
    example_layout,
    frame_header,
    mask_crc,
)
from memfit.errors import CorruptShardError

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["BlockReader", "RecordLayout", "ShardReadError", "record_layout", "why_not",
           "reads_into_batches", "build"]

log = logging.getLogger("memfit")

_IOV_MAX = 1024
try:
    _IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (ValueError, OSError, AttributeError):
    pass
# Bytes of bookkeeping per record read besides its tags: frame header and CRC (16), the
# I/O vectors of its header, tags and CRC (16 a piece) and the epoch's record sequence;
# and per sample and feature: the I/O vector of its value.
RECORD_OVERHEAD = 96
SAMPLE_OVERHEAD = 16


class ShardReadError(CorruptShardError, ValueError):
    """A shard record that cannot be read: damaged, cut short, or not memfit's layout.

    A ``ValueError`` too, so that ``tf.data`` reports it as ``InvalidArgumentError``.
    """


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
    """The layout :func:`memfit.data.records.encode_example` gives a record of
    ``samples`` samples of these (fixed-shape) features, in the manifest's order.

    Example:
        >>> lay = record_layout([Feature("x", "float32", (3,))], 2)
        >>> lay.frame_bytes, [p[0] for p in lay.pieces]
        (54, [-1, 0])

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
    into its batch row: it needs memfit's C loop (``memfit.data.cwindow``, built at
    install where a C compiler is found), which reads each record into a staging buffer
    that stays in the CPU cache, checks its CRC32C there and copies each sample to its
    row, and no byte swapping. Otherwise records are read into scratch buffers in order
    and their samples gathered into batches afterwards: two more trips through memory.

    Example:
        >>> reads_into_batches(["<f4", "<i8"]) == (_records.NATIVE is not None)
        True

    Args:
        dtypes: the stored dtypes of the features returned.
    """
    return (_records.NATIVE is not None
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


@dataclasses.dataclass
class _Epoch:
    """The record sequence of one epoch."""

    shard: np.ndarray           # int32, shard index of each record, in sequence order
    record: np.ndarray          # int32, record index inside its shard
    starts: np.ndarray          # int64, len + 1: first sequence position of each record


@dataclasses.dataclass
class _Buffers:
    """One window's scratch: a buffer per feature (every sample read, in read order, when
    the samples are gathered afterwards; read straight into batches, the features not
    asked for, and for the others the samples of the first and last records that lie
    outside the window), frame headers, tags, CRCs, and the I/O vectors."""

    rows: int
    records: int
    data: list[np.ndarray]          # per feature: uint8, rows * sample_bytes
    head: np.ndarray                # uint8 [records, 12]
    skel: np.ndarray                # uint8 [records, skeleton bytes]
    foot: np.ndarray                # uint8 [records, 4]
    iov: np.ndarray                 # uint64 [pieces, 2]: struct iovec, all records
    stage: np.ndarray               # uint8 [frame bytes]: one record (the C loop's)


@dataclasses.dataclass(frozen=True)
class _Template:
    """A frame's pieces in file order, one per sample for feature values: the frame
    header, the tags (the skeleton), each feature's values sample by sample, the CRC.

    ``kind`` is 0 for the header, 1 for tags, 2 for the CRC, 3 for a sample's value of
    feature ``feature`` (sample ``sample`` of the record); ``offset`` is where tags sit
    in the record's skeleton; ``size`` is each piece's bytes.
    """

    kind: np.ndarray                # int8 [pieces]
    feature: np.ndarray             # int64 [pieces]
    sample: np.ndarray              # int64 [pieces]
    offset: np.ndarray              # uint64 [pieces]
    size: np.ndarray                # uint64 [pieces]


def _template(layout: RecordLayout, sample_bytes: list[int]) -> _Template:
    cols = [(0, 0, 0, 0, 12)]
    for f, off, n in layout.pieces:
        if f < 0:
            cols.append((1, 0, 0, off, n))
        else:
            cols.extend((3, f, j, 0, sample_bytes[f]) for j in range(layout.samples))
    cols.append((2, 0, 0, 0, 4))
    kind, feature, sample, offset, size = zip(*cols, strict=True)
    return _Template(np.array(kind, np.int8), np.array(feature, np.int64),
                     np.array(sample, np.int64), np.array(offset, np.uint64),
                     np.array(size, np.uint64))


def _bind_preadv() -> Any:
    """libc's ``preadv`` through ctypes (the GIL is released during the call), or None."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.preadv
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
        fn.restype = ctypes.c_ssize_t
        return fn
    except (OSError, AttributeError):
        return None


_libc_preadv = _bind_preadv()


def _preadv(fd: int, iov: int, count: int, offset: int, want: int) -> int:
    """Reads ``want`` bytes at ``offset`` into the ``count`` I/O vectors at address ``iov``;
    returns the bytes read (fewer only at the end of the file)."""
    import ctypes

    if _libc_preadv is None:                                # no preadv: read, then copy
        vec = np.ctypeslib.as_array((ctypes.c_uint64 * (2 * count)).from_address(iov))
        data = os.pread(fd, want, offset)
        pos = 0
        for at, length in vec.reshape(-1, 2).tolist():
            piece = data[pos:pos + length]
            ctypes.memmove(at, piece, len(piece))
            pos += length
        return len(data)
    got = _libc_preadv(fd, iov, count, offset)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    if 0 < got < want:                                      # a short read: finish it
        vec = np.ctypeslib.as_array((ctypes.c_uint64 * (2 * count)).from_address(iov))
        pos = 0
        for at, length in vec.reshape(-1, 2).tolist():
            if pos + length > got:
                skip = max(0, got - pos)
                rest = os.pread(fd, length - skip, offset + pos + skip)
                ctypes.memmove(at + skip, rest, len(rest))
                if len(rest) < length - skip:
                    return pos + skip + len(rest)
            pos += length
        return want
    return int(got)


class BlockReader:
    """Builds the windows of samples of a set of shards (see the module docstring).

    ``window(e, w)`` is the ``tf.numpy_function`` of :func:`build`: it returns window
    ``w`` of epoch ``e``, one array per requested feature, already in batch order.

    Example:
        >>> reader = BlockReader(m, m.split("train").shards, ("x", "y"), seed=0,
        ...                      shuffle=True, cycle=16, window=768, batch_size=256,
        ...                      samples=25000, on_corrupt="raise")  # doctest: +SKIP
        >>> x, y = reader.window(0, 0)                                 # doctest: +SKIP

    Args:
        manifest: the dataset's manifest (:func:`why_not` must have said yes).
        shards: the shards to read (a worker's share of a split).
        names: the features to return, in order.
        seed: the order's seed.
        shuffle: ``False`` reads in stored order: shard by shard, record by record.
        cycle: shards read at once (round-robin) when shuffling.
        window: samples per window, a whole number of batches.
        batch_size: samples per batch.
        samples: samples per epoch (fewer than the shards hold with ``drop_remainder``).
        on_corrupt: ``"raise"`` or ``"skip"``.
        outputs_alive: windows whose output the pipeline holds at once (built, being
            rebatched, prefetched): the output buffers kept for reuse.
        builders: windows built at once (the scratch buffer sets kept).

    The first window asked for takes every buffer the plan counts (``builders`` scratch
    sets, ``outputs_alive`` outputs per feature) and touches their pages: the reader's
    memory is then flat from the first batch on, whatever the length of the run.
    """

    def __init__(self, manifest: Manifest, shards: Sequence[Shard], names: Sequence[str], *,
                 seed: int, shuffle: bool, cycle: int, window: int, batch_size: int,
                 samples: int, on_corrupt: str, outputs_alive: int = 4, builders: int = 1):
        base = manifest.path
        self.files = [str(base / s.file) if base is not None else s.file for s in shards]
        self.records = np.array([s.records for s in shards], np.int64)
        self.k = manifest.samples_per_record
        self.features = list(manifest.features.values())
        self.names = list(names)
        self.requested = [next(i for i, f in enumerate(self.features) if f.name == n)
                          for n in self.names]
        self.sample_bytes = [int(f.sample_bytes or 0) for f in self.features]
        self.dtypes = [np.dtype(f.dtype).newbyteorder("<") for f in self.features]
        self.full = record_layout(self.features, self.k)
        self.last_samples = np.array([s.samples - (s.records - 1) * self.k for s in shards],
                                     np.int64)
        self._layouts: dict[int, RecordLayout] = {self.k: self.full}
        for n in set(self.last_samples.tolist()):
            self._layouts.setdefault(n, record_layout(self.features, n))
        self.file_bytes = np.array([s.bytes for s in shards], np.int64)
        self.seed = seed
        self.shuffle = shuffle
        self.cycle = max(1, min(cycle, len(shards))) if shuffle else 1
        self.window_samples = window
        self.batch_size = batch_size
        self.samples = samples
        self.windows = max(1, math.ceil(samples / window))
        self.on_corrupt = on_corrupt
        self._epochs: dict[int, _Epoch] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[int, int]] = set()
        self._warn_lock = threading.Lock()          # _warn runs under _lock, too
        skel = max(len(lay.skeleton) for lay in self._layouts.values())
        self._skel_bytes = max(skel, 1)
        # Layout 0 is a full record's; the others are the short last records' sizes.
        sizes = [self.k, *sorted(set(self.last_samples.tolist()) - {self.k})]
        self._layout_list = [self._layouts[n] for n in sizes]
        self._last_layout = np.array([sizes.index(n) for n in self.last_samples.tolist()],
                                     np.int64)
        self._templates = [_template(lay, self.sample_bytes) for lay in self._layout_list]
        self._pieces = np.array([len(t.kind) for t in self._templates], np.int64)
        self._frames = np.array([lay.frame_bytes for lay in self._layout_list], np.int64)
        self.direct = reads_into_batches([self.dtypes[f] for f in self.requested])
        self._want = [(np.frombuffer(lay.header, np.uint8), np.frombuffer(lay.skeleton, np.uint8))
                      for lay in self._layout_list]
        rows = window + 2 * self.k
        self._pool: BufferPool[_Buffers] = BufferPool(
            self._make_buffers, lambda b, need: b.rows >= need[0] and b.records >= need[1])
        self._default_need = (rows, math.ceil(rows / self.k) + 2)
        self._outputs = {f: RecyclingBuffers(outputs_alive) for f in self.requested}
        self._builders = max(1, builders)
        self._reserved = False
        self._reserve_lock = threading.Lock()

    def _reserve(self) -> None:
        """Takes the planned buffers at once (see the class docstring); other first
        callers wait for it, so that none of them makes a buffer set of its own."""
        with self._reserve_lock:
            if self._reserved:
                return
            self._reserve_now()
            self._reserved = True

    def _reserve_now(self) -> None:
        def prepare(bufs: _Buffers) -> None:
            for a in (*bufs.data, bufs.head, bufs.skel, bufs.foot, bufs.iov, bufs.stage):
                touch(a)

        self._pool.reserve(self._builders, self._default_need, prepare)
        rows = min(self.window_samples, self.samples)
        for f in self.requested:
            self._outputs[f].reserve(rows * self.dtypes[f].itemsize
                                     * math.prod(self.features[f].shape or ()))

    # -- the epoch's record sequence ------------------------------------------------------
    def _epoch(self, e: int) -> _Epoch:
        with self._lock:
            ep = self._epochs.get(e)
            if ep is None:
                ep = self._sequence(e)
                self._epochs[e] = ep
                for old in sorted(self._epochs)[:-2]:          # keep two epochs
                    del self._epochs[old]
            return ep

    def _sequence(self, e: int) -> _Epoch:
        """Shards permuted by (seed, e), read ``cycle`` at a time, round-robin."""
        n = len(self.files)
        order = order_rng(self.seed, e, 0).permutation(n) if self.shuffle else np.arange(n)
        lane = np.empty(n, np.int64)
        begin = np.empty(n, np.int64)
        free = [(0, slot) for slot in range(self.cycle)]      # (step it is free at, lane)
        for i, s in enumerate(order):
            at, slot = heapq.heappop(free)
            lane[i], begin[i] = slot, at
            heapq.heappush(free, (at + int(self.records[s]), slot))
        counts = self.records[order]
        shard = np.repeat(order, counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        record = np.arange(len(shard), dtype=np.int64) - first
        key = (np.repeat(begin, counts) + record) * self.cycle + np.repeat(lane, counts)
        seq = np.argsort(key, kind="stable")
        shard, record = shard[seq], record[seq]
        bad = self._check_sizes(e)
        n_samples = np.where(record == self.records[shard] - 1, self.last_samples[shard],
                             self.k)
        if bad:
            width = int(self.records.max()) + 1
            drop = np.isin(shard * width + record, [s * width + r for s, r in bad])
            shard, record, n_samples = shard[~drop], record[~drop], n_samples[~drop]
        starts = np.zeros(len(shard) + 1, np.int64)
        np.cumsum(n_samples, out=starts[1:])
        return _Epoch(shard.astype(np.int32), record.astype(np.int32), starts)

    def _check_sizes(self, e: int) -> set[tuple[int, int]]:
        """Files shorter or longer than the manifest says: an error, or (skip) the records
        past the end, with a warning."""
        bad: set[tuple[int, int]] = set()
        full = self.full.frame_bytes
        for s, file in enumerate(self.files):
            try:
                size = os.stat(file).st_size
            except OSError as err:
                if self.on_corrupt == "raise":
                    raise ShardReadError(f"memfit: shard {file} cannot be read ({err}). Run "
                                         f"`memfit verify` on the dataset; pass "
                                         f"on_corrupt='skip' to read past it.", file) from None
                lost = list(range(int(self.records[s])))
                bad.update((s, r) for r in lost)
                self._warn(e, s, lost, f"memfit: WARNING: skipped shard {file}: it cannot be "
                                       f"read ({err.strerror}); its {len(lost)} records are "
                                       f"left out.")
                continue
            expected = int(self.file_bytes[s])
            if size == expected:
                continue
            records = int(self.records[s])
            if size > expected:
                message = (f"memfit: shard {file} is corrupt or truncated: it has {size:,} "
                           f"bytes, {size - expected:,} more than the manifest says "
                           f"(written over after packing?). Run `memfit verify` on the "
                           f"dataset.")
                if self.on_corrupt == "raise":
                    raise ShardReadError(message, file)
                self._warn(e, s, [], message + " Reading its records as they are.")
                continue
            cut = min(size // full, records - 1)        # first record not wholly there
            if self.on_corrupt == "raise":
                raise ShardReadError(
                    f"memfit: shard {file} is corrupt or truncated: record {cut} of {records} "
                    f"cannot be read (the file has {size:,} of its {expected:,} bytes). Run "
                    f"`memfit verify` on the dataset; pass on_corrupt='skip' to read past "
                    f"damaged records.", file, cut)
            lost = list(range(cut, records))
            bad.update((s, r) for r in lost)
            self._warn(e, s, lost, f"memfit: WARNING: skipped {len(lost)} unreadable records "
                                   f"of shard {file} from record {cut} on (the file is cut "
                                   f"short: {size:,} of {expected:,} bytes).")
        return bad

    def _warn(self, e: int, s: int, records: list[int], message: str) -> None:
        """Prints a skip warning once per damaged record (to stderr, like tf.print): the
        windows built ahead read the next epochs' damage too, and every epoch meets the
        same damage again; the first warning said it."""
        with self._warn_lock:
            keys = {(s, r) for r in records} or {(s, -1)}
            if keys <= self._warned:
                return
            self._warned |= keys
        print(message, file=sys.stderr, flush=True)
        log.debug("%s", message)

    # -- reading --------------------------------------------------------------------------
    def _make_buffers(self, need: tuple[int, int]) -> _Buffers:
        rows = max(need[0], self._default_need[0])
        records = max(need[1], self._default_need[1])
        # Read straight into batches, a requested feature's scratch only takes the samples
        # of the window's first and last records that lie outside it.
        data = [aligned_empty(((2 * self.k if self.direct and f in self.requested else rows)
                               * b,), np.dtype(np.uint8))
                for f, b in enumerate(self.sample_bytes)]
        return _Buffers(rows=rows, records=records, data=data,
                        head=np.empty((records, 12), np.uint8),
                        skel=np.empty((records, self._skel_bytes), np.uint8),
                        foot=np.empty((records, 4), np.uint8),
                        iov=np.empty((rows * len(self.features) + records * 2
                                      * (len(self.full.pieces) + 2), 2), np.uint64),
                        stage=np.empty(self.full.frame_bytes, np.uint8))

    def _read(self, shard: np.ndarray, record: np.ndarray, row: np.ndarray,
              bufs: _Buffers, e: int, to: np.ndarray) -> np.ndarray:
        """Reads the records (sorted by shard and record), placing sample ``j`` of record
        ``i``'s value of feature ``f`` at address ``to[f, row[i] + j]``; returns which
        records were damaged (raises on the first one unless skipping).

        A record's bytes go, in file order, to its pieces: the frame header, tags and CRC
        to side buffers, each sample's values where ``to`` says (the I/O vectors are
        built with NumPy, no Python object per piece). With memfit's C loop
        (:func:`reads_into_batches`) each record is read into a staging buffer, its
        CRC32C computed there while it is in the CPU cache, and its pieces copied out.
        Without it, each run of consecutive records of a shard is one ``preadv`` straight
        into the pieces (merged where they continue one another in memory, as a record's
        samples in a scratch buffer do), and the CRC32C is computed in place afterwards.
        Then the headers and tags are compared with what the layout must hold.
        """
        n = len(shard)
        layout = np.where(record == self.records[shard] - 1, self._last_layout[shard], 0)
        count = self._pieces[layout]
        first = np.cumsum(count) - count
        iov = bufs.iov[:int(count.sum())]
        head, skel, foot = (bufs.head.ctypes.data, bufs.skel.ctypes.data,
                            bufs.foot.ctypes.data)
        for lid in np.unique(layout).tolist():
            tm = self._templates[lid]
            slot = np.flatnonzero(layout == lid)
            at = first[slot][:, None] + np.arange(len(tm.kind))[None, :]
            u = slot.astype(np.uint64)[:, None]
            addr = np.empty(at.shape, np.uint64)
            for kind, base, stride in ((0, head, 12), (1, skel, self._skel_bytes),
                                       (2, foot, 4)):
                cols = tm.kind == kind
                addr[:, cols] = base + u * np.uint64(stride) + tm.offset[cols][None, :]
            cols = tm.kind == 3
            addr[:, cols] = to[tm.feature[cols][None, :],
                               row[slot][:, None] + tm.sample[cols][None, :]]
            iov[at, 0] = addr
            iov[at, 1] = tm.size[None, :]
        frame = self._frames[layout]
        files = np.unique(shard).tolist()
        fds = {s: os.open(self.files[s], os.O_RDONLY) for s in files}
        try:
            if self.direct:
                got, crc = self._read_native(shard, record, first, count, fds, bufs, iov)
            else:
                got, crc = self._read_preadv(shard, record, first, count, frame, fds, iov)
        finally:
            for fd in fds.values():
                os.close(fd)
        damaged = got < frame
        why = {int(x): "cut short" for x in np.flatnonzero(damaged)}
        # Frame headers and tags: what this layout must hold.
        for lid, (want_head, want_skel) in enumerate(self._want):
            rows_ = layout == lid
            if not rows_.any():
                continue
            bad = (bufs.head[:n][rows_] != want_head).any(axis=1)
            bad |= (bufs.skel[:n, :len(want_skel)][rows_] != want_skel).any(axis=1)
            for x in np.flatnonzero(rows_)[bad]:
                if not damaged[x]:
                    damaged[x] = True
                    why[int(x)] = "bad length or tags: not the record the manifest describes"
        for x in np.flatnonzero((mask_crc(crc) != bufs.foot[:n].view("<u4").reshape(-1))
                                & ~damaged):
            damaged[x] = True
            why[int(x)] = "bad CRC32C of its data"
        if damaged.any():
            self._damaged(e, shard, record, damaged, why)
        return damaged

    def _read_native(self, shard: np.ndarray, record: np.ndarray, first: np.ndarray,
                     count: np.ndarray, fds: dict[int, int], bufs: _Buffers,
                     iov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bytes read and CRC32C of each record, through memfit's C loop (one call)."""
        module, extend = _records.NATIVE  # type: ignore[misc]
        n = len(shard)
        fd = np.array([fds[s] for s in shard.tolist()], np.int32)
        offset = record.astype(np.int64) * self.full.frame_bytes
        spans = np.stack([first, first + count], axis=1).astype(np.int64)
        got = np.zeros(n, np.int64)
        crc = np.zeros(n, np.uint32)
        module.read_records(extend, n, fd.ctypes.data, offset.ctypes.data, iov.ctypes.data,
                            spans.ctypes.data, bufs.stage.ctypes.data, bufs.stage.nbytes,
                            got.ctypes.data, crc.ctypes.data)
        return got, crc

    def _read_preadv(self, shard: np.ndarray, record: np.ndarray, first: np.ndarray,
                     count: np.ndarray, frame: np.ndarray, fds: dict[int, int],
                     iov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bytes read and CRC32C of each record: ``preadv`` per run, CRCs in place."""
        n = len(shard)
        record_of = np.repeat(np.arange(n), count)
        payload = np.ones(len(iov), bool)
        payload[first] = False
        payload[first + count - 1] = False
        joins = ((iov[:-1, 0] + iov[:-1, 1] == iov[1:, 0]) & payload[:-1] & payload[1:]
                 & (record_of[:-1] == record_of[1:]))
        starts = np.flatnonzero(np.concatenate(([True], ~joins)))
        new = np.cumsum(np.concatenate(([True], ~joins))) - 1
        sizes = np.add.reduceat(iov[:, 1], starts)
        iov[:len(starts), 0] = iov[starts, 0]
        iov[:len(starts), 1] = sizes
        first, end = new[first], new[first + count - 1] + 1
        iov = iov[:len(starts)]
        got = np.zeros(n, np.int64)
        # Runs: the same shard, consecutive records; at most _IOV_MAX vectors a call.
        cut = np.flatnonzero((shard[1:] != shard[:-1]) | (record[1:] != record[:-1] + 1)) + 1
        iov_addr = iov.ctypes.data
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), n], strict=True):
            p0, p1 = int(first[a]), int(end[b - 1])
            offset = int(record[a]) * self.full.frame_bytes
            done = 0
            for i in range(p0, p1, _IOV_MAX):
                j = min(p1, i + _IOV_MAX)
                want = int(iov[i:j, 1].sum())
                step = _preadv(fds[int(shard[a])], iov_addr + i * 16, j - i, offset + done,
                               want)
                done += step
                if step < want:                         # cut short under our feet
                    break
            before = np.cumsum(frame[a:b]) - frame[a:b]
            got[a:b] = np.clip(done - before, 0, frame[a:b])
        crc = crc32c_spans(iov, np.stack([first + 1, end - 1], axis=1))
        return got, crc

    def _damaged(self, e: int, shard: np.ndarray, record: np.ndarray, damaged: np.ndarray,
                 why: dict[int, str]) -> None:
        first = int(np.flatnonzero(damaged)[0])
        s, r = int(shard[first]), int(record[first])
        if self.on_corrupt == "raise":
            raise ShardReadError(
                f"memfit: shard {self.files[s]} is corrupt or truncated: record {r} of "
                f"{int(self.records[s])} cannot be read ({why[first]}). Run `memfit verify` "
                f"on the dataset; pass on_corrupt='skip' to read past damaged records.",
                self.files[s], r)
        for s in np.unique(shard[damaged]).tolist():
            lost = sorted(record[damaged & (shard == s)].tolist())
            self._warn(e, s, lost, f"memfit: WARNING: skipped {len(lost)} unreadable records "
                                   f"of shard {self.files[s]} (records {lost}: damaged; "
                                   f"bad CRC32C, length or tags).")

    # -- one window -----------------------------------------------------------------------
    def window(self, e: Any, w: Any) -> list[np.ndarray]:
        """Window ``w`` of epoch ``e``: one aligned array per requested feature, its
        samples in batch order (``batch_size`` at a time)."""
        e, w = int(e), int(w)
        if not self._reserved:
            self._reserve()
        ep = self._epoch(e)
        a = w * self.window_samples
        b = min(a + self.window_samples, self.samples, int(ep.starts[-1]))
        if a >= b:
            return self._empty()
        starts = ep.starts
        i0 = int(np.searchsorted(starts, a, side="right")) - 1
        i1 = int(np.searchsorted(starts, b, side="left"))
        shard, record = ep.shard[i0:i1], ep.record[i0:i1]
        sizes = starts[i0 + 1:i1 + 1] - starts[i0:i1]
        read = np.lexsort((record, shard))                 # file order: runs, locality
        row = np.empty(len(read), np.int64)
        row[read] = np.cumsum(sizes[read]) - sizes[read]
        lo = np.maximum(a - starts[i0:i1], 0)
        hi = np.minimum(b - starts[i0:i1], sizes)
        take = hi - lo
        idx = np.arange(int(take.sum()), dtype=np.int64)
        rows = np.repeat(row + lo - (np.cumsum(take) - take), take) + idx
        perm = order_rng(self.seed, e, 1, w).permutation(len(rows)) if self.shuffle \
            else slice(None)
        rows = rows[perm]                   # output position -> sample read (row space)
        read_rows = int(sizes.sum())
        bufs = self._pool.get((read_rows, len(read)))
        try:
            # Where each sample read goes: to its batch row (direct), else to the scratch
            # buffer in read order (samples outside the window, features not asked for).
            to = np.empty((len(self.features), read_rows), np.uint64)
            t = np.arange(read_rows, dtype=np.uint64)
            if self.direct:
                outside = np.ones(read_rows, bool)
                outside[rows] = False
                spare = np.flatnonzero(outside)             # at most 2 * (k - 1)
            for f, data in enumerate(bufs.data):
                size = np.uint64(self.sample_bytes[f])
                if self.direct and f in self.requested:
                    to[f, spare] = data.ctypes.data + t[:len(spare)] * size
                else:
                    to[f] = data.ctypes.data + t * size
            out = []
            for f in self.requested:
                out.append(self._outputs[f].array((len(rows), *self.features[f].shape),
                                                  self.dtypes[f].newbyteorder("=")))
                if self.direct:
                    to[f, rows] = (out[-1].ctypes.data + t[:len(rows)]
                                   * np.uint64(self.sample_bytes[f]))
            damaged = self._read(shard[read], record[read], row[read], bufs, e, to)
            if not self.direct:
                for f, dest in zip(self.requested, out, strict=True):
                    src = bufs.data[f][:bufs.rows * self.sample_bytes[f]].view(
                        self.dtypes[f]).reshape(bufs.rows, *self.features[f].shape)
                    if self.dtypes[f].isnative:
                        np.take(src, rows, axis=0, out=dest, mode="clip")   # no buffering
                    else:
                        dest[...] = src[rows]
            if damaged.any():                               # on_corrupt="skip"
                bad_seq = np.zeros(len(read), bool)
                bad_seq[read[damaged]] = True
                keep = ~bad_seq[np.repeat(np.arange(len(read)), take)[perm]]
                out = [dest[keep] for dest in out]
            return out
        finally:
            self._pool.put(bufs)

    def _empty(self) -> list[np.ndarray]:
        return [np.empty((0, *self.features[f].shape), self.dtypes[f].newbyteorder("="))
                for f in self.requested]

    def output_dtypes(self) -> list[np.dtype]:
        """The dtype of each returned array (native byte order)."""
        return [self.dtypes[f].newbyteorder("=") for f in self.requested]

    def output_shapes(self) -> list[tuple[int, ...]]:
        """The per-sample shape of each returned array."""
        return [tuple(self.features[f].shape) for f in self.requested]  # type: ignore[misc]


def build(reader: BlockReader, plan: Any, features: Sequence[str] | None, *,
          drop_remainder: bool, sharded: bool) -> tf.data.Dataset:
    """The ``tf.data`` pipeline over a :class:`BlockReader`::

        (epoch, window) pairs (a scan over the epoch counter) or, with ``epochs=N``,
        element numbers → map(numpy_function(WindowFeeder(reader.window)))
        → rebatch(batch_size) (dim-0 slices: no copy) → prefetch

    The feeder (:class:`memfit.data.pipeline.WindowFeeder`) builds ``parallel_windows``
    windows ahead on its own threads, into the next epoch, and hands them to a
    sequential map in order: a new iterator instantiates two small functions (one with
    ``epochs=N``) and finds its first windows built. A pass of several epochs
    (``epochs=N``) runs on without a pause between them. Windows hold whole batches,
    but for the last one of an epoch, which may end with a smaller batch: with
    ``epochs=N`` the rebatch then cycles through the epoch's batch sizes, so no batch
    spans two epochs. (Skipping damaged records, ``on_corrupt="skip"``, leaves windows
    short: batches are then cut across windows, and, with ``epochs=N``, across epochs.)

    Args:
        reader: the reader.
        plan: the :class:`memfit.data.stream.DatasetPlan` (epochs, parallelism, prefetch).
        features: ``None`` for dict elements, else the names for tuple elements (one name:
            the tensor alone).
        drop_remainder: drop the last, smaller batch of each epoch (static batch size).
        sharded: sharded by hand (tf.distribute must not shard again).
    """
    import tensorflow as tf

    names = reader.names
    types = [tf.as_dtype(d) for d in reader.output_dtypes()]
    shapes = reader.output_shapes()
    batch = plan.batch_size
    feeder = WindowFeeder(reader.window, reader.windows, epoch=plan.epoch, epochs=plan.epochs,
                          workers=plan.parallel_windows, ahead=plan.parallel_windows)

    def feed(element: Any) -> list[np.ndarray]:
        try:
            return feeder(element)
        except CorruptShardError as e:
            # Raised afresh here, the traceback TensorFlow copies into its error is this
            # frame's, not the reader threads': memfit's message stays near the top.
            raise ShardReadError(str(e), e.file, e.record) from None

    def window(element: tf.Tensor) -> Any:
        # stateful: the feeder builds ahead in order, so tf.data must keep this map sequential.
        got = tf.numpy_function(feed, [element], types, stateful=True)
        for t, shape in zip(got, shapes, strict=True):
            t.set_shape([None, *shape])
        if features is None:
            return dict(zip(names, got, strict=True))
        return tuple(got) if len(got) > 1 else got[0]

    if plan.epochs is None:                          # one epoch per pass, from the counter
        elements, counter = pass_epochs(plan.epoch, reader.windows)
    else:                                            # epochs epoch .. epochs - 1 in one pass
        elements = tf.data.Dataset.range((plan.epochs - plan.epoch) * reader.windows)
        counter = None
    ds = elements.map(window)
    tail = reader.samples % batch
    if plan.epochs is not None and tail and not drop_remainder and reader.on_corrupt == "raise":
        sizes = np.full(plan.steps_per_epoch, batch, np.int64)
        sizes[-1] = tail
        ds = ds.rebatch(tf.constant(sizes))           # cycles: every epoch ends on its tail
    else:
        ds = ds.rebatch(batch, drop_remainder=drop_remainder)
    # Skipping damaged records leaves fewer batches than planned: no cardinality then.
    return finish(ds, plan, counter, sharded=sharded,
                  check_cardinality=reader.on_corrupt == "raise")
