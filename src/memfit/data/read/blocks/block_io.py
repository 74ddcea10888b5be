"""The block reader's reads: each piece of a window's records put where it goes, in one
pass, and each record's frame header, tags and CRC32C checked.

A window's order is decided before it is read (:mod:`memfit.data.read.blocks.block_reader`), so each
sample's destination is known: with memfit's C loop
(:func:`~memfit.data.read.blocks.block_layout.reads_into_batches`) each record is read with one
``preadv`` straight to its pieces (each sample's values to its batch row) and its CRC32C
checked over them while they are in the CPU cache, one call per window without the GIL (a
read that comes back short goes through a staging buffer); without it, a run of
consecutive records is read with one ``os.preadv`` that scatters each feature's bytes
into a contiguous per-feature scratch buffer (reused from call to call), the CRC32C is
computed over the pieces in place (:func:`memfit.data.format.records.crc32c_spans`), and the
reader gathers the samples into aligned batches. Either way the frame headers and
protobuf tags land in small side buffers and are checked against the layout.

Example:
    >>> tm = _template(record_layout([Feature("x", "float32", (3,))], 2), [12])
    >>> tm.kind.tolist(), tm.size.tolist()        # header, tags, sample 0, sample 1, CRC
    ([0, 1, 3, 3, 2], [12, 13, 12, 12, 4])
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from memfit.data.format import records as _records
from memfit.data.format.manifest import Feature
from memfit.data.format.records import crc32c_spans, mask_crc
from memfit.data.read.blocks.block_layout import RecordLayout, record_layout
from memfit.data.read.buffers import aligned_empty

__all__ = ["Buffers", "RecordReads", "GONE"]

GONE = "the file cannot be opened"      # why a record was not read: its file is gone

_IOV_MAX = 1024
try:
    _IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (ValueError, OSError, AttributeError):
    pass


@dataclasses.dataclass
class Buffers:
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


class RecordReads:
    """Reads records of a set of shards (sorted by shard and record), each piece where it
    goes, and says which were damaged (see the module docstring).

    Args:
        features: every feature of the dataset, in the manifest's order.
        k: samples per full record.
        files: the shard files; records: the records of each;
        last_samples: the samples of each shard's last record.
        requested: the indices of the features returned.
        direct: samples go straight into their batch rows (memfit's C loop).
        window: samples per window (the scratch a window needs at least).
    """

    def __init__(self, features: Sequence[Feature], k: int, files: Sequence[str],
                 records: np.ndarray, last_samples: np.ndarray, requested: Sequence[int],
                 direct: bool, window: int):
        self.features = list(features)
        self.k = k
        self.files = list(files)
        self.records = records
        self.requested = list(requested)
        self.direct = direct
        self.sample_bytes = [int(f.sample_bytes or 0) for f in self.features]
        self.full = record_layout(self.features, self.k)
        layouts: dict[int, RecordLayout] = {self.k: self.full}
        for n in set(last_samples.tolist()):
            layouts.setdefault(n, record_layout(self.features, n))
        skel = max(len(lay.skeleton) for lay in layouts.values())
        self._skel_bytes = max(skel, 1)
        # Layout 0 is a full record's; the others are the short last records' sizes.
        sizes = [self.k, *sorted(set(last_samples.tolist()) - {self.k})]
        layout_list = [layouts[n] for n in sizes]
        self._last_layout = np.array([sizes.index(n) for n in last_samples.tolist()],
                                     np.int64)
        self._templates = [_template(lay, self.sample_bytes) for lay in layout_list]
        self._pieces = np.array([len(t.kind) for t in self._templates], np.int64)
        self._frames = np.array([lay.frame_bytes for lay in layout_list], np.int64)
        self._want = [(np.frombuffer(lay.header, np.uint8), np.frombuffer(lay.skeleton, np.uint8))
                      for lay in layout_list]
        rows = window + 2 * self.k
        self.default_need = (rows, math.ceil(rows / self.k) + 2)

    def make_buffers(self, need: tuple[int, int]) -> Buffers:
        """A scratch set for ``need = (samples read, records read)`` (at least a window's)."""
        rows = max(need[0], self.default_need[0])
        records = max(need[1], self.default_need[1])
        # Read straight into batches, a requested feature's scratch only takes the samples
        # of the window's first and last records that lie outside it.
        data = [aligned_empty(((2 * self.k if self.direct and f in self.requested else rows)
                               * b,), np.dtype(np.uint8))
                for f, b in enumerate(self.sample_bytes)]
        return Buffers(rows=rows, records=records, data=data,
                       head=np.empty((records, 12), np.uint8),
                       skel=np.empty((records, self._skel_bytes), np.uint8),
                       foot=np.empty((records, 4), np.uint8),
                       iov=np.empty((rows * len(self.features) + records * 2
                                     * (len(self.full.pieces) + 2), 2), np.uint64),
                       stage=np.empty(self.full.frame_bytes, np.uint8))


    def read(self, shard: np.ndarray, record: np.ndarray, row: np.ndarray, bufs: Buffers,
             to: np.ndarray) -> tuple[np.ndarray, dict[int, str]]:
        """Reads the records (sorted by shard and record), placing sample ``j`` of record
        ``i``'s value of feature ``f`` at address ``to[f, row[i] + j]``.

        A record's bytes go, in file order, to its pieces: the frame header, tags and CRC
        to side buffers, each sample's values where ``to`` says (the I/O vectors are
        built with NumPy, no Python object per piece). With memfit's C loop
        (:func:`~memfit.data.read.blocks.block_layout.reads_into_batches`) each record is read
        with one ``preadv`` straight into its pieces and its CRC32C computed over them while
        they are in the CPU cache (read short: again through the staging buffer, then copied
        out). Without it, each run of consecutive records of a shard is one
        ``preadv`` straight into the pieces (merged where they continue one another in
        memory, as a record's samples in a scratch buffer do), and the CRC32C is computed
        in place afterwards. Then the headers and tags are compared with what the layout
        must hold.

        Returns:
            Which records are damaged (bool per record), and why, by record position.
        """
        layout = np.where(record == self.records[shard] - 1, self._last_layout[shard], 0)
        count = self._pieces[layout]
        first = np.cumsum(count) - count
        iov = bufs.iov[:int(count.sum())]
        self._place(layout, first, row, bufs, iov, to)
        frame = self._frames[layout]
        fds: dict[int, int] = {}
        gone: dict[int, str] = {}
        try:
            for s in np.unique(shard).tolist():
                try:
                    fds[s] = os.open(self.files[s], os.O_RDONLY)
                except OSError as err:      # deleted since the epoch began: read nothing,
                    gone[s] = err.strerror or str(err)     # so its records are cut short
                    fds[s] = os.open(os.devnull, os.O_RDONLY)
            if self.direct:
                got, crc = self._read_native(shard, record, first, count, fds, bufs, iov)
            else:
                got, crc = self._read_preadv(shard, record, first, count, frame, fds, iov)
        finally:
            for fd in fds.values():
                os.close(fd)
        damaged, why = self._verify(layout, got < frame, crc, bufs)
        for s, err in gone.items():
            for x in np.flatnonzero(shard == s).tolist():
                why[x] = f"{GONE}: {err}"
        return damaged, why

    def _place(self, layout: np.ndarray, first: np.ndarray, row: np.ndarray, bufs: Buffers,
               iov: np.ndarray, to: np.ndarray) -> None:
        """Fills the I/O vectors: each record's pieces, in file order, and where each goes."""
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

    def _verify(self, layout: np.ndarray, damaged: np.ndarray, crc: np.ndarray,
                bufs: Buffers) -> tuple[np.ndarray, dict[int, str]]:
        """Which records are damaged: cut short (``damaged`` on entry), frame headers and
        tags that are not what this layout must hold, or a CRC32C that does not match."""
        n = len(layout)
        why = {int(x): "cut short" for x in np.flatnonzero(damaged)}
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
        return damaged, why

    def _read_native(self, shard: np.ndarray, record: np.ndarray, first: np.ndarray,
                     count: np.ndarray, fds: dict[int, int], bufs: Buffers,
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
