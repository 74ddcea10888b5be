"""Plain TFRecord files read in place record by record: where each record lies is known
from opening them (:func:`~memfit.data.read.files.tfrecord_files.open_files` reads every
12-byte header), so a batch is read straight from the files in its permuted order, one
``preadv`` a record into the batch's rows, with no window of decoded samples held first.

Two parts, no TensorFlow:

* :func:`stream_order`: the records of an epoch in the order ``tf.data``'s deterministic
  interleave reads the files (``cycle`` files at once, :data:`CHUNK_RECORDS` records from
  each in turn, the next file taking the slot of one that ends): the order the
  sequential reader of compressed files streams them in, so a window cut from it holds
  the same records either way.
* :class:`RecordGather`: the records of a batch, read, checked and decoded. A record as
  large as the first, when every feature is a serialised tensor or a float list, is read
  in place by memfit's C loop (``cwindow.read_records``, the block reader's, without the
  GIL): one ``preadv`` scatters its frame header, the bytes every record shares, each
  selected feature's values straight into its row of the batch, and its CRC; the CRC32C
  of its data is computed there, and the shared bytes compared with the first record's
  at once for the batch, so the kernel's copy out of the page cache is the only copy.
  Any other record (and every record without the C extension) is read whole, checked
  against the spec and decoded by the pack's own code
  (:func:`~memfit.data.sources.tfrecord_source.decode_payload`). A damaged record (a bad
  CRC32C, a length that changed, a file now shorter) raises a ``CorruptShardError``
  naming the file and the record; with ``on_corrupt="skip"`` that record alone is left
  out of its batch, with one warning line.

Example:
    >>> stream_order([3, 2], np.array([1, 0]), cycle=2, chunk=2).tolist()
    [3, 4, 0, 1, 2]
"""

from __future__ import annotations

import math
import os
import struct
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import google_crc32c
import numpy as np

from memfit.data.format import records as _records
from memfit.data.format.records import frame_header, mask_crc
from memfit.data.read.feeder import order_rng
from memfit.data.read.files.files_plan import CHUNK_RECORDS
from memfit.data.read.files.tfrecord_files import TFRecordFiles, damaged
from memfit.data.read.pipeline_tail import warn_skipped
from memfit.data.sources.tfrecord_source import RecordFeature, decode_payload
from memfit.errors import CorruptShardError, DatasetError

__all__ = ["stream_order", "EpochOrder", "InPlaceBatches", "RecordGather", "decode_into"]

_WARNINGS_A_FILE = 10           # skipped records named one by one, then one line more

def stream_order(records: Sequence[int], order: np.ndarray, *, cycle: int,
                 chunk: int = CHUNK_RECORDS) -> np.ndarray:
    """The records of one epoch (global indices: file ``f``'s record ``r`` is
    ``sum(records[:f]) + r``) in the order ``tf.data.Dataset.interleave(cycle_length=cycle,
    block_length=1, deterministic=True)`` reads them when each file yields chunks of
    ``chunk`` records: one chunk from each open file in turn; a file that ends leaves its
    slot empty until the turn comes back to it, when the next file in ``order`` takes it.

    Example:
        >>> stream_order([1, 4, 2], np.array([0, 1, 2]), cycle=2, chunk=2).tolist()
        [0, 1, 2, 3, 4, 5, 6]

    Args:
        records: the records in each file.
        order: this epoch's file order (indices into ``records``).
        cycle: files read at once.
        chunk: records a file yields at a time.
    """
    starts = np.concatenate([[0], np.cumsum(records, dtype=np.int64)])
    pieces: list[np.ndarray] = []
    slots: list[list[int] | None] = [None] * max(1, cycle)
    pending = iter(int(f) for f in order)
    end_of_input, open_, i = False, 0, 0
    while not end_of_input or open_ > 0:
        slot = slots[i]
        if slot is not None:
            f, r = slot
            n = int(records[f])
            if r < n:
                k = min(chunk, n - r)
                pieces.append(np.arange(starts[f] + r, starts[f] + r + k, dtype=np.int64))
                slot[1] = r + k
            else:
                slots[i], open_ = None, open_ - 1
            i = (i + 1) % len(slots)
        elif not end_of_input:
            f_next = next(pending, None)
            if f_next is None:
                end_of_input = True
            else:
                slots[i], open_ = [f_next, 0], open_ + 1
        else:
            i = (i + 1) % len(slots)
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


class EpochOrder:
    """The order of every epoch of files read in place, a pure function of ``(seed,
    epoch)`` (NumPy's generators, :func:`~memfit.data.read.feeder.order_rng`, as for
    packed data; TensorFlow's global seed plays no part): the file order, permuted by
    ``(seed, epoch, 0)``; the records interleaved (:func:`stream_order`); cut into windows
    of ``window`` records, each permuted by ``(seed, epoch, 1, window)``; the batches cut
    from that in turn (a window short of the epoch holds whole batches, so no batch
    spans two windows). Unshuffled: the files one after another, in the order given.

    Example:
        >>> order = EpochOrder([3, 3], seed=0, shuffle=False, cycle=1, window=0,
        ...                    batch_size=4, steps=2)
        >>> [order.batch(0, s).tolist() for s in range(2)]
        [[0, 1, 2, 3], [4, 5]]

    Args:
        records: the records in each file.
        seed, shuffle: the dataset's.
        cycle, window: the plan's ``cycle_length`` and ``window_samples``.
        batch_size, steps: the batch size and the batches of an epoch.
    """

    #: What the order holds a record: the last two epochs' orders, int64 each.
    BYTES_PER_RECORD = 16

    def __init__(self, records: Sequence[int], *, seed: int, shuffle: bool, cycle: int,
                 window: int, batch_size: int, steps: int):
        self.records = tuple(int(n) for n in records)
        self.seed, self.shuffle, self.cycle = seed, shuffle, cycle
        self.window, self.batch_size, self.steps = window, batch_size, steps
        self._cached: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def files(self, epoch: int) -> np.ndarray:
        """The file order of ``epoch``."""
        n = len(self.records)
        return order_rng(self.seed, epoch, 0).permutation(n) if self.shuffle else np.arange(n)

    def window_perm(self, epoch: int, k: int, n: int) -> np.ndarray:
        """The permutation of window ``k`` (``n`` records) of ``epoch``."""
        return order_rng(self.seed, epoch, 1, k).permutation(n)

    def ids(self, epoch: int) -> np.ndarray:
        """Every record of ``epoch`` (global indices) in the order its batches take them;
        the last two epochs asked for are kept (8 bytes a record each)."""
        with self._lock:
            got = self._cached.get(epoch)
        if got is not None:
            return got
        stream = stream_order(self.records, self.files(epoch),
                              cycle=self.cycle if self.shuffle else 1)
        if self.shuffle:
            width = max(1, self.window)
            stream = np.concatenate([
                w[self.window_perm(epoch, k, len(w))]
                for k, w in enumerate(np.split(stream, range(width, len(stream), width)))])
        with self._lock:
            self._cached = {e: a for e, a in self._cached.items() if e == epoch - 1}
            self._cached[epoch] = stream
        return stream

    def batch(self, epoch: int, step: int) -> np.ndarray:
        """The records of batch ``step`` of ``epoch``."""
        b = self.batch_size
        return self.ids(epoch)[step * b:(step + 1) * b]

    def starts_window(self, step: int) -> bool:
        """Whether batch ``step`` is the first of its window."""
        return self.shuffle and self.window > 0 and (step * self.batch_size) % self.window == 0

    def window_of(self, epoch: int, step: int) -> np.ndarray:
        """The records of the window batch ``step`` of ``epoch`` falls in."""
        k = step * self.batch_size // max(1, self.window)
        return self.ids(epoch)[k * self.window:(k + 1) * self.window]


class InPlaceBatches:
    """Batch ``(epoch, step)`` of plain files read in place: its records in the epoch's
    order (:class:`EpochOrder`), read by :class:`RecordGather`; at a window's first batch
    the kernel is asked to read the window's span of the files ahead. Thread-safe.

    Args:
        gather: the reader of records by index.
        order: the epochs' order.
    """

    def __init__(self, gather: RecordGather, order: EpochOrder):
        self.gather, self.order = gather, order

    def __call__(self, epoch: int, step: int) -> list[np.ndarray]:
        epoch, step = int(epoch), int(step)
        if self.order.starts_window(step):
            self.gather.advise(self.order.window_of(epoch, step))
        return self.gather.read(self.order.batch(epoch, step))


class RecordGather:
    """Reads batches of records of plain TFRecord files by their global index (see the
    module docstring). Thread-safe: each read is a ``preadv`` at an offset.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from memfit.data.format.records import encode_example, frame
        >>> from memfit.data.read.files.tfrecord_files import open_files
        >>> d = Path(tempfile.mkdtemp())
        >>> records = [frame(encode_example({}, {"y": [i]})) for i in range(5)]
        >>> _ = (d / "a.tfrecords").write_bytes(b"".join(records))
        >>> gather = RecordGather(open_files([d / "a.tfrecords"]), ["y"], "raise")
        >>> gather.read(np.array([4, 0, 2]))[0].ravel().tolist()
        [4, 0, 2]

    Args:
        files: the opened files; every one plain (``files.offsets`` known).
        names: the features to return, in order.
        on_corrupt: ``"raise"`` or ``"skip"``.
    """

    def __init__(self, files: TFRecordFiles, names: Sequence[str], on_corrupt: str):
        if any(o is None for o in files.offsets):
            raise ValueError("RecordGather reads plain files only; compressed files are "
                             "read in sequence.")
        self.files, self.on_corrupt = files, on_corrupt
        self.feats: dict[str, RecordFeature] = {n: files.spec[n] for n in names}
        self.file_of = np.repeat(np.arange(len(files.files), dtype=np.int32), files.records)
        self.first = np.concatenate([[0], np.cumsum(files.records, dtype=np.int64)])
        self.offset = np.concatenate([o[:-1] for o in files.offsets])    # type: ignore[index]
        self.size = np.concatenate([np.diff(o) - 16 for o in files.offsets])  # type: ignore[arg-type]
        layout = files.check.layout
        self.layout = layout
        self.width = len(layout.first) if layout is not None else -1
        # Records built like the first are read in place: one preadv a record straight to
        # its pieces (header, the bytes every record shares, each selected feature's
        # values to its row of the batch, the rest, the CRC), in C (``records.NATIVE``).
        self.direct = layout is not None and sys.byteorder == "little" and all(
            f.kind in ("tensor", "float_list") for f in files.spec.values())
        if self.direct:
            assert layout is not None
            self._plan_pieces(layout)
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[int, int]] = set()
        self._told: dict[int, int] = {}             # warning lines printed, by file
        weakref.finalize(self, _close_all, self._fds)

    @property
    def index_bytes(self) -> int:
        """What the index of every record costs in memory."""
        return self.file_of.nbytes + self.first.nbytes + self.offset.nbytes + self.size.nbytes

    def _fd(self, f: int) -> int:
        fd = self._fds.get(f)
        if fd is None:
            with self._lock:
                fd = self._fds.get(f)
                if fd is None:
                    fd = self._fds[f] = os.open(self.files.files[f], os.O_RDONLY)
        return fd

    def advise(self, ids: np.ndarray) -> None:
        """Asks the kernel to read ahead the span of each file that ``ids`` fall in (a
        window's records), so the reads that follow find them in the page cache."""
        if not hasattr(os, "posix_fadvise") or len(ids) == 0:
            return
        files = self.file_of[ids]
        for f in np.unique(files).tolist():
            mine = ids[files == f]
            lo = int(self.offset[mine].min())
            hi = int((self.offset[mine] + self.size[mine]).max()) + 16
            try:
                os.posix_fadvise(self._fd(f), lo, hi - lo,
                                 os.POSIX_FADV_WILLNEED)
            except OSError:
                return

    def _plan_pieces(self, layout: Any) -> None:
        """Where each byte of a record built like the first goes: ``self.pieces`` lists,
        in record order, ``(buffer, column, length)``; the buffers are ``"fixed"`` (the
        bytes every such record shares, compared with the first's), ``"scratch"`` (values
        not returned as they lie: features not selected, booleans) and a selected
        feature's name (straight to its row of the batch)."""
        segments = [(a, b, "fixed") for a, b in layout.fixed]
        segments += [(a, b, name) for name, (a, b) in layout.values.items()]
        self.pieces: list[tuple[str, int, int]] = []
        self.bools: dict[str, int] = {}        # a boolean feature's column in scratch
        used = {"fixed": 0, "scratch": 0}
        shared = []
        for a, b, what in sorted(segments):
            if b <= a:
                continue
            if what in self.feats and np.dtype(self.feats[what].dtype) != np.bool_:
                self.pieces.append((what, 0, b - a))
                continue
            buffer = "fixed" if what == "fixed" else "scratch"
            if buffer == "fixed":
                shared.append(layout.first[a:b])
            elif what in self.feats:
                self.bools[what] = used["scratch"]
            self.pieces.append((buffer, used[buffer], b - a))
            used[buffer] += b - a
        self.fixed_width, self.scratch_width = used["fixed"], used["scratch"]
        self.fixed_bytes = np.frombuffer(b"".join(shared), np.uint8)
        self.length_header = np.frombuffer(frame_header(self.width)[:12], np.uint8)

    # -- reading ----------------------------------------------------------------------
    def read(self, ids: np.ndarray) -> list[np.ndarray]:
        """The selected features of the records ``ids`` (global indices), in that order;
        with ``on_corrupt="skip"`` a damaged record's row is left out."""
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        out = [np.empty((n, *f.shape), f.dtype) for f in self.feats.values()]
        why: dict[int, str] = {}
        direct = np.zeros(n, bool)
        if self.direct and _records.NATIVE is not None:
            direct = self.size[ids] == self.width
            if direct.any():
                self._read_direct(ids, np.flatnonzero(direct), out, why)
        for k in np.flatnonzero(~direct).tolist():
            self._read_one(int(ids[k]), out, k, why)
        if not why:
            return out
        ok = np.ones(n, bool)
        for k, reason in sorted(why.items()):
            ok[k] = False
            self._damaged(int(ids[k]), reason)
        return [col[ok] for col in out]

    def _read_direct(self, ids: np.ndarray, rows: np.ndarray, out: list[np.ndarray],
                     why: dict[int, str]) -> None:
        """Records ``ids[rows]``, each as large as the first record, read in place to
        their pieces (one C call); those not built like the first are read again whole."""
        module, extend = _records.NATIVE  # type: ignore[misc]
        m = len(rows)
        head = np.empty((m, 12), np.uint8)
        foot = np.empty((m, 4), np.uint8)
        fixed = np.empty((m, max(1, self.fixed_width)), np.uint8)
        scratch = np.empty((m, max(1, self.scratch_width)), np.uint8)
        columns = dict(zip(self.feats, out, strict=True))
        template = [(head.ctypes.data, 12, 12)]
        for what, column, length in self.pieces:
            if what == "fixed":
                template.append((fixed.ctypes.data + column, fixed.shape[1], length))
            elif what == "scratch":
                template.append((scratch.ctypes.data + column, scratch.shape[1], length))
            else:
                col = columns[what]
                row_bytes = col.itemsize * math.prod(col.shape[1:])
                template.append((col.ctypes.data, row_bytes, length))
        template.append((foot.ctypes.data, 4, 4))
        base, stride, length = (np.array(t, np.uint64) for t in zip(*template, strict=True))
        # the batch's rows: a selected feature's piece goes to row rows[j], the others to j
        to_batch = np.array([what in columns for what, _, _ in [("head", 0, 0),
                             *self.pieces, ("foot", 0, 0)]], bool)
        at = np.where(to_batch[None, :], rows[:, None], np.arange(m)[:, None]).astype(np.uint64)
        iov = np.empty((m, len(template), 2), np.uint64)
        iov[..., 0] = base[None, :] + at * stride[None, :]
        iov[..., 1] = length[None, :]
        fds = np.array([self._fd(int(f)) for f in self.file_of[ids[rows]].tolist()], np.int32)
        offsets = np.ascontiguousarray(self.offset[ids[rows]])
        spans = np.stack([np.arange(m), np.arange(1, m + 1)], 1).astype(np.int64) * len(template)
        stage = np.empty(self.width + 16, np.uint8)
        got = np.zeros(m, np.int64)
        crc = np.zeros(m, np.uint32)
        module.read_records(extend, m, fds.ctypes.data, offsets.ctypes.data, iov.ctypes.data,
                            spans.ctypes.data, stage.ctypes.data, stage.nbytes,
                            got.ctypes.data, crc.ctypes.data)
        whole = got == self.width + 16
        length_ok = (head == self.length_header).all(axis=1)
        crc_ok = mask_crc(crc) == foot.view("<u4").ravel()
        like = whole & length_ok & crc_ok & (fixed[:, :self.fixed_width] ==
                                             self.fixed_bytes).all(axis=1)
        for name, column in self.bools.items():
            f = self.feats[name]
            width = math.prod(f.shape)
            columns[name][rows] = (scratch[:, column:column + width] != 0).reshape(-1, *f.shape)
        for j in np.flatnonzero(~whole).tolist():
            why[int(rows[j])] = "cut short since it was opened"
        for j in np.flatnonzero(whole & ~length_ok).tolist():
            why[int(rows[j])] = "its length changed since it was opened"
        for j in np.flatnonzero(whole & length_ok & ~crc_ok).tolist():
            why[int(rows[j])] = "bad CRC32C of its data"
        for j in np.flatnonzero(whole & length_ok & crc_ok & ~like).tolist():
            self._read_one(int(ids[rows[j]]), out, int(rows[j]), why)   # not like the first

    def _read_one(self, gid: int, out: list[np.ndarray], row: int,
                  why: dict[int, str]) -> None:
        """Record ``gid`` read whole, checked, and decoded by the pack's own code."""
        f = int(self.file_of[gid])
        size = int(self.size[gid])
        data = os.pread(self._fd(f), size + 16, int(self.offset[gid]))
        payload = data[12:12 + size]
        if len(data) < size + 16:
            why[row] = "cut short since it was opened"
        elif struct.unpack_from("<Q", data)[0] != size:
            why[row] = "its length changed since it was opened"
        elif mask_crc(google_crc32c.value(payload)) != struct.unpack_from("<I", data, 12 + size)[0]:
            why[row] = "bad CRC32C of its data"
        else:
            self._slow(gid, payload, out, row)

    def _damaged(self, gid: int, why: str) -> None:
        f = int(self.file_of[gid])
        record = gid - int(self.first[f])
        path = self.files.files[f]
        if self.on_corrupt == "raise":
            raise CorruptShardError(damaged(path, record, self.files.records[f], why),
                                    str(path), record)
        with self._lock:                # one line at a time from the parallel readers
            if (f, record) in self._warned:
                return
            self._warned.add((f, record))
            told = self._told[f] = self._told.get(f, 0) + 1
            if told <= _WARNINGS_A_FILE:
                warn_skipped(f"memfit: WARNING: skipped record {record} of TFRecord file "
                             f"{path} ({why}).")
            if told == _WARNINGS_A_FILE:
                warn_skipped(f"memfit: WARNING: more damaged records of TFRecord file "
                             f"{path} are skipped without a line each.")

    def _slow(self, gid: int, payload: bytes, out: list[np.ndarray], row: int) -> None:
        f = int(self.file_of[gid])
        decode_into(self.files, self.feats, f, gid - int(self.first[f]), payload, out, row)


def decode_into(files: TFRecordFiles, feats: dict[str, RecordFeature], f: int, index: int,
                payload: bytes, out: list[np.ndarray], row: int) -> None:
    """Record ``index`` of file ``f`` checked against the files' spec and its features
    ``feats`` decoded into row ``row`` of ``out`` (one array a feature), by the pack's own
    code (:func:`~memfit.data.sources.tfrecord_source.decode_payload`).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from memfit.data.format.records import encode_example, frame
        >>> from memfit.data.read.files.tfrecord_files import open_files
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.tfrecords").write_bytes(frame(encode_example({}, {"y": [7]})))
        >>> files, out = open_files([d / "a.tfrecords"]), [np.zeros(2, np.int64)]
        >>> decode_into(files, files.spec, 0, 0, encode_example({}, {"y": [8]}), out, 1)
        >>> out[0].tolist()
        [0, 8]

    Args:
        files: the opened files; f, index: the record's file and its index there.
        feats: the features to decode, in the order of ``out``.
        payload: the record's data; out, row: where its values go.

    Raises:
        CorruptShardError: the record is not like the first record (naming it and why).
    """
    check = files.check
    path = files.files[f]
    if check.layout is None or not check.layout.matches(payload):
        try:
            check.check(path, index, payload)
        except DatasetError as e:
            raise CorruptShardError(
                f"memfit: TFRecord file {path} is not like its first record: record "
                f"{index} of {files.records[f]} disagrees. {e}", str(path), index) from None
    values = decode_payload(payload, check.spec, check.layout)
    for col, (name, feat) in zip(out, feats.items(), strict=True):
        col[row] = np.asarray(values[name]).reshape(feat.shape)


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
