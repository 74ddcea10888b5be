"""What ``memfit.dataset`` buys with the byte budget for TFRecord files read in place:
the :class:`FilesPlan` (a :class:`~memfit.data.read.plan.ReaderPlan`, settled like every
reader's) and :func:`plan_files` that sizes it.

The budget pays, in this order: the file readers (``cycle_length`` files at once, each
with a 256 KiB buffer), the chunks of :data:`CHUNK_RECORDS` records decoded in parallel
(their records and values) and the batches gathered in parallel, a prefetch of up to
:data:`~memfit.data.read.plan.MAX_PREFETCH` batches, and what is left the window of decoded
samples permuted whole (at most one epoch's samples; short of an epoch, whole batches). A
bigger budget mixes more. Plain files read record by record (``by_record``) get the same
windows, so the same order, but hold only the index of the records and the order of
the last two epochs (36 bytes a record) and the batches being read: their
``estimated_bytes`` counts those.

Example:
    >>> plan = plan_files("2 files", 1000, [600, 400], batch_size=100, budget=2**26,
    ...                   record_bytes=1000, sample_bytes=800, shuffle=True,
    ...                   drop_remainder=False, seed=0, epoch=0, epochs=None)
    >>> plan.window_samples, plan.cycle_length, plan.steps_per_epoch
    (1000, 2, 10)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from memfit.data.read.plan import MAX_CYCLE, MAX_PREFETCH, plan_summary, steps_per_epoch
from memfit.errors import DatasetError
from memfit.sizes import format_count, format_size

__all__ = ["FilesPlan", "plan_files", "READ_BUFFER", "CHUNK_RECORDS"]

#: The read buffer of each ``TFRecordDataset``: TensorFlow's default, which it uses when no
#: ``buffer_size`` is given (passing one, even this value, logs an info line each file).
READ_BUFFER = 256 * 1024
CHUNK_RECORDS = 64          # records read, counted and decoded at a time
_DECODE_COPIES = 3          # a chunk's records as rows of bytes, the values cut, the result


@dataclasses.dataclass(frozen=True)
class FilesPlan:
    """What ``memfit.dataset`` chose for TFRecord files read in place.

    Attributes:
        path: the files, described; files: how many are read.
        batch_size, samples, steps_per_epoch: as for every plan.
        memory_budget: the budget; estimated_bytes: what the plan holds at most.
        window_samples: the window permuted whole, in samples (decoded; one a record).
        cycle_length: files read at once (interleaved a record each), by read_threads.
        parallel_batches: batches decoded at once; prefetch_batches: batches ahead.
        seed, epoch, epochs, shuffle, arena_limit: as for every plan.
        by_record: every file is plain and each batch is read record by record where the
            records lie (:mod:`memfit.data.read.files.record_gather`): the window is an
            order, not memory held (its records stay in the page cache), and the index of
            every record is held instead.
    """

    path: str
    files: int
    batch_size: int
    samples: int
    steps_per_epoch: int
    memory_budget: int
    estimated_bytes: int
    window_samples: int
    cycle_length: int
    read_threads: int
    parallel_batches: int
    prefetch_batches: int
    seed: int
    epoch: int
    epochs: int | None
    shuffle: bool
    arena_limit: int | None = None
    by_record: bool = False
    reader: str = "tfrecord files in place"

    def __str__(self) -> str:
        if self.by_record:
            order = (f"file order shuffled per epoch, {format_count(self.cycle_length, 'file')} "
                     f"interleaved, windows of {format_count(self.window_samples, 'record')} each "
                     f"permuted whole, each batch read record by record where the records "
                     f"lie" if self.shuffle else
                     "stored order, each batch read record by record where the records lie")
            how = (f"{format_count(self.parallel_batches, 'batch', 'batches')} read and "
                   f"decoded in parallel")
        else:
            order = (f"file order shuffled per epoch, {format_count(self.cycle_length, 'file')} "
                     f"interleaved by {format_count(self.read_threads, 'thread')}, windows of "
                     f"{format_count(self.window_samples, 'sample')} each permuted whole"
                     if self.shuffle else "stored order")
            how = (f"{format_count(self.parallel_batches, 'chunk')} of "
                   f"{format_count(CHUNK_RECORDS, 'record')} decoded in parallel")
        return (f"memfit.dataset {self.path} (read in place, not packed): budget "
                f"{format_size(self.memory_budget)} → {order}, {how}, prefetch "
                f"{format_count(self.prefetch_batches, 'batch', 'batches')}; about "
                f"{format_size(self.estimated_bytes)} in flight. {plan_summary(self)}")


def plan_files(path: str, samples: int, records: Sequence[int], *, batch_size: int,
               budget: int, record_bytes: int, sample_bytes: int, shuffle: bool,
               drop_remainder: bool, seed: int, epoch: int, epochs: int | None,
               index_bytes: int | None = None) -> FilesPlan:
    """The plan for ``samples`` records in files of ``records`` each (see the module
    docstring). With ``index_bytes`` (every file plain, read record by record) the window
    is the same order as without, but the records are read into their batches where they
    lie: what is held is the index and the batches, not the window.

    Raises:
        DatasetError: a budget too small for the readers, one batch decoded and one
            prefetched (it says how much is needed).
    """
    cores = os.cpu_count() or 1
    cycle = max(1, min(len(records), MAX_CYCLE)) if shuffle else 1
    readers = cycle * (READ_BUFFER + 2 * record_bytes)
    parallel = max(1, min(2, cores))
    batch_bytes = batch_size * sample_bytes
    chunk = CHUNK_RECORDS * (record_bytes + _DECODE_COPIES * sample_bytes)
    decoding = parallel * (chunk + batch_bytes)
    least_buffer = min(samples, batch_size) if shuffle else 0
    reading = parallel * (batch_size * record_bytes + batch_bytes)
    need_min = (readers + decoding + batch_bytes + least_buffer * sample_bytes
                if index_bytes is None else index_bytes + reading + batch_bytes)
    if budget < need_min:
        raise DatasetError(
            f"memory_budget={format_size(budget)} is too small to stream batches of "
            f"{batch_size} records of {format_size(record_bytes)} from TFRecord files: it "
            f"needs at least {need_min:,} bytes ({format_size(need_min)}). Raise "
            f"memory_budget or lower batch_size. Received: memory_budget={budget}")
    spare = budget - readers - decoding - least_buffer * sample_bytes
    prefetch = int(max(1, min(MAX_PREFETCH, spare // (2 * max(batch_bytes, 1)))))
    buffer = 0
    if shuffle:
        left = budget - readers - decoding - prefetch * batch_bytes
        buffer = int(min(samples, left // sample_bytes))
        if buffer < samples:            # a window short of an epoch holds whole batches
            buffer = buffer // batch_size * batch_size
        buffer = max(least_buffer, buffer)
    estimated = readers + decoding + prefetch * batch_bytes + buffer * sample_bytes
    if index_bytes is not None:     # no file readers, no window; the index instead
        estimated = index_bytes + reading + prefetch * batch_bytes
    return FilesPlan(path=path, files=len(records), batch_size=batch_size, samples=samples,
                     steps_per_epoch=steps_per_epoch(samples, batch_size, drop_remainder),
                     memory_budget=budget, estimated_bytes=int(estimated),
                     window_samples=buffer, cycle_length=cycle,
                     read_threads=min(cycle, cores), parallel_batches=parallel,
                     prefetch_batches=prefetch, seed=seed, epoch=epoch, epochs=epochs,
                     shuffle=shuffle, by_record=index_bytes is not None)
