"""The block reader's plan: its window, parallelism and prefetch depth from a byte budget,
and the memory model behind them (every byte the reader of
:mod:`~memfit.data.read.blocks.block_reader` holds: its scratch buffers of
:mod:`~memfit.data.read.blocks.block_io`, its outputs, its record sequences).

A window (a whole number of batches) is read into its batches of the requested
features, with scratch for what the CRC covers but the window does not return: the
features not asked for, and the samples of its first and last records that lie outside
it (without memfit's C extension: every feature read into scratch buffers, then gathered
into batches); ``parallel_windows`` windows are built at once, and the batches handed
on keep their window's output alive until consumed.

:func:`plan_blocks` makes the whole plan from the budget, once: ``ds.memfit_plan`` (settled
as every reader's plan is) inside the :class:`BlockReaderPlan` the reader is built from;
the reader decides nothing again.

Example:
    >>> outputs_alive(parallel=4, prefetch=4, batch_size=256, window=2048)
    7
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from memfit.data.format.manifest import Manifest, Shard
from memfit.data.read.blocks.block_layout import reads_into_batches, record_layout
from memfit.data.read.plan import (
    MAX_CYCLE,
    MAX_PREFETCH,
    DatasetPlan,
    settle_plan,
    steps_per_epoch,
)
from memfit.errors import DatasetError
from memfit.sizes import format_size

__all__ = ["BlockMemory", "BlockReaderPlan", "outputs_alive", "plan_blocks", "reader_plan"]

# Bytes of bookkeeping per record read besides its tags: frame header and CRC (16), the
# I/O vectors of its header, tags and CRC (16 a piece) and the epoch's record sequence;
# and per sample and feature: the I/O vector of its value.
RECORD_OVERHEAD = 96
SAMPLE_OVERHEAD = 16
_MAX_BUILDERS = 4               # windows the block reader builds at once
_WINDOW_CAP = 16 * 2**20        # bytes read for one window: long reads, and still a window
#                                 that stays small beside a budget (docs/data.md: figures)
EPOCHS_KEPT = 2                 # record sequences the reader keeps (16 bytes a record)


def outputs_alive(parallel: int, prefetch: int, batch_size: int, window: int) -> int:
    """Window outputs alive at once: built ahead by the feeder (``parallel``), the one
    being rebatched, and those whose batches the prefetch buffer and the consumer still
    hold (two windows when the prefetched batches fit in one window; one more for every
    window's worth of prefetched batches)."""
    return parallel + 3 + (prefetch * batch_size) // window


@dataclasses.dataclass(frozen=True)
class BlockReaderPlan:
    """Everything the block reader does, decided before it is built (by
    :func:`plan_blocks`, or by hand in a test).

    Args:
        names: the features returned, in order.
        seed: the order's seed; shuffle: ``False`` reads in stored order.
        cycle: shards read at once, round-robin (1 without shuffling; at most the shards).
        window: samples per window, a whole number of batches.
        batch_size: samples per batch.
        samples: samples read an epoch (a whole number of batches with
            ``drop_remainder``).
        builders: windows built at once (the scratch buffer sets kept).
        outputs_alive: windows whose output the pipeline holds at once (built, being
            rebatched, prefetched): the output buffers kept for reuse.
        epochs_kept: epochs whose record sequence is kept (the one read and the next,
            which the feeder builds into ahead).
        dataset: the plan ``ds.memfit_plan`` shows (``None`` for a reader made by hand).
    """

    names: tuple[str, ...]
    seed: int
    shuffle: bool
    cycle: int
    window: int
    batch_size: int
    samples: int
    builders: int = 1
    outputs_alive: int = 4
    epochs_kept: int = EPOCHS_KEPT
    dataset: DatasetPlan | None = None


def reader_plan(plan: DatasetPlan, names: Sequence[str], *,
                drop_remainder: bool) -> BlockReaderPlan:
    """The block reader's plan from the dataset's (settled) plan.

    Args:
        plan: the dataset's plan, as ``ds.memfit_plan`` will show it.
        names: the features returned.
        drop_remainder: whether a last, smaller batch is dropped.
    """
    return BlockReaderPlan(dataset=plan,
        names=tuple(names), seed=plan.seed, shuffle=plan.shuffle, cycle=plan.cycle_length,
        window=plan.window_samples, batch_size=plan.batch_size,
        samples=plan.steps_per_epoch * plan.batch_size if drop_remainder else plan.samples,
        builders=max(1, plan.parallel_windows),
        outputs_alive=outputs_alive(plan.parallel_windows, plan.prefetch_batches,
                                    plan.batch_size, plan.window_samples))


@dataclasses.dataclass(frozen=True)
class BlockMemory:
    """The bytes the block reader holds for a read of some features of some shards.

    Attributes:
        batch_size: samples per batch; k: samples per record.
        read_bytes: bytes read per sample, with the I/O vector of each feature's value.
        out_bytes: bytes returned per sample (the features asked for).
        direct: samples are read straight into their batch rows (memfit's C loop).
        index: bytes of the record sequences kept.
        record_bytes: bookkeeping per record read (``RECORD_OVERHEAD`` and its tags).
        frame_bytes: a full record's frame (the C loop's staging buffer).
    """

    batch_size: int
    k: int
    read_bytes: int
    out_bytes: int
    direct: bool
    index: int
    record_bytes: int
    frame_bytes: int

    @classmethod
    def of(cls, manifest: Manifest, names: Sequence[str], shards: Sequence[Shard],
           batch_size: int) -> BlockMemory:
        """The model for reading features ``names`` of ``shards`` in batches."""
        k = manifest.samples_per_record
        full = record_layout(list(manifest.features.values()), k)
        return cls(batch_size=batch_size, k=k,
                   read_bytes=sum(int(f.sample_bytes or 0) + SAMPLE_OVERHEAD
                                  for f in manifest.features.values()),
                   out_bytes=max(1, sum(int(manifest.features[n].sample_bytes or 0)
                                        for n in names)),
                   direct=reads_into_batches([manifest.features[n].dtype for n in names]),
                   index=EPOCHS_KEPT * 16 * (sum(s.records for s in shards) + 1),
                   record_bytes=RECORD_OVERHEAD + len(full.skeleton),
                   frame_bytes=full.frame_bytes)

    def need(self, m: int, parallel: int, prefetch: int) -> int:
        """Bytes held with windows of ``m`` batches, ``parallel`` built at once and
        ``prefetch`` batches prefetched."""
        k, size = self.k, m * self.batch_size
        # Scratch per sample read: every feature when gathering; with samples read straight
        # into their batch rows only the features not returned (the requested ones keep two
        # records' worth, for the samples of the window's first and last records outside it).
        kept = self.out_bytes if self.direct else 0
        read = ((size + 2 * k) * (self.read_bytes - kept) + 2 * k * kept
                + (math.ceil(size / k) + 2) * self.record_bytes
                + self.frame_bytes)                      # + the C loop's staging record
        alive = outputs_alive(parallel, prefetch, self.batch_size, size)
        return self.index + parallel * read + alive * size * self.out_bytes


def _fit(memory: BlockMemory, budget: int, cycle: int) -> tuple[int, int, int]:
    """``(batches per window, windows built at once, prefetch)`` within ``budget``: the
    window aims at ``_WINDOW_CAP`` bytes read and at least two records of each of the
    ``cycle`` shards read round-robin; a small budget shrinks the window first, then
    prefetch, then parallelism; one that cannot hold a one-batch window is refused with
    the minimum it needs."""
    batch_size, k = memory.batch_size, memory.k
    target = max(_WINDOW_CAP // max(memory.read_bytes, 1), 2 * cycle * k, batch_size)
    m = math.ceil(target / batch_size)
    parallel = max(1, min(_MAX_BUILDERS, os.cpu_count() or 1))
    prefetch = MAX_PREFETCH
    while memory.need(m, parallel, prefetch) > budget:
        if m > 1:
            m = max(1, m // 2)
        elif prefetch > 1:
            prefetch -= 1
        elif parallel > 1:
            parallel -= 1
        else:
            raise DatasetError(
                f"memory_budget={format_size(budget)} is too small to stream batches of "
                f"{batch_size} samples of {format_size(memory.read_bytes)} (records of {k} "
                f"samples): it needs at least {format_size(memory.need(1, 1, 1))} "
                f"({memory.need(1, 1, 1):,} bytes). Raise "
                f"memory_budget or lower batch_size. Received: memory_budget={budget}")
    return m, parallel, prefetch


def plan_blocks(manifest: Manifest, split: str, batch_size: int, budget: int, *,
                names: Sequence[str], shards: Sequence[Shard], shuffle: bool, samples: int,
                drop_remainder: bool, seed: int, epoch: int, epochs: int | None,
                cap_arenas: bool) -> BlockReaderPlan:
    """The block reader's window, parallelism and prefetch depth from a byte budget (see
    the module docstring).

    Args:
        manifest: the dataset; split: the split read; batch_size: samples per batch.
        budget: the byte budget.
        names: the features returned; shards: the shards read (a worker's share).
        shuffle, samples, drop_remainder, seed, epoch, epochs, cap_arenas: as for
            :func:`memfit.data.read.dispatch.dataset`.
    """
    k = manifest.samples_per_record
    memory = BlockMemory.of(manifest, names, shards, batch_size)
    cycle = max(1, min(len(shards), MAX_CYCLE)) if shuffle else 1
    m, parallel, prefetch = _fit(memory, budget, cycle)
    window = m * batch_size
    # A split smaller than a window fills one short window: what is held is its batches
    # (a stranger's 200-sample split was said to hold 75.7 MiB; it held about 12 MB).
    held = min(m, max(1, math.ceil(samples / batch_size))) if samples > 0 else m
    # ...and a batch is at most the split (a batch size of 100,000 over 2,700 samples was
    # said to hold 69.0 MiB in flight): the figure only, the window and order stay.
    shown = dataclasses.replace(memory, batch_size=samples) if 0 < samples < batch_size \
        else memory
    dataset = DatasetPlan(path=str(manifest.path), split=split, batch_size=batch_size,
                       samples=samples,
                       steps_per_epoch=steps_per_epoch(samples, batch_size, drop_remainder),
                       memory_budget=budget,
                       estimated_bytes=int(shown.need(held, parallel, prefetch)),
                       window_records=math.ceil(window / k), window_samples=window,
                       cycle_length=cycle, read_threads=parallel, parallel_windows=parallel,
                       prefetch_batches=prefetch, seed=seed, epoch=epoch, epochs=epochs,
                       shuffle=shuffle, reader="blocks",
                       reader_note="each sample read straight into its batch row"
                       if memory.direct
                       else "records read into reused buffers, their samples then gathered "
                            "into batches: memfit's C extension "
                            "memfit.data.format.cwindow is not built")
    dataset = settle_plan(dataset, batch_size=batch_size, samples=samples,
                          cap_arenas=cap_arenas)
    return reader_plan(dataset, names, drop_remainder=drop_remainder)
