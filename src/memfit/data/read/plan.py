"""What a reader chose from the memory budget: the :class:`ReaderPlan` every reader's
``memfit.dataset`` returns as ``ds.memfit_plan``, and the steps every plan goes through.

- :class:`ReaderPlan`: what every reader's plan tells (batches, samples, bytes, order); the
  pipeline's common tail (:func:`memfit.data.read.pipeline_tail.finish`) reads it.
- :class:`DatasetPlan`: the plan of packed TFRecord shards, read by memfit's block
  reader (:mod:`memfit.data.read.blocks.block_plan` sizes it) or by ``tf.data``'s TFRecord reader
  (:mod:`memfit.data.read.tf_reader`). ``.npy`` sources have
  :class:`~memfit.data.read.arrays_reader.ArraysPlan`.
- :func:`settle_plan`: refuses a plan with no batch, caps glibc's arenas, logs the plan.

Example:
    >>> steps_per_epoch(1000, 256, drop_remainder=False), steps_per_epoch(1000, 256, True)
    (4, 3)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Protocol, TypeVar

from memfit.sizes import format_count, format_size

__all__ = ["ReaderPlan", "DatasetPlan", "MAX_CYCLE", "MAX_PREFETCH", "settle_plan",
           "steps_per_epoch", "plan_summary"]

log = logging.getLogger("memfit")

MAX_CYCLE = 16                  # shards read at once
MAX_PREFETCH = 4                # batches: the model, not the reader, is usually the bottleneck


class ReaderPlan(Protocol):
    """What every reader's plan tells: :class:`DatasetPlan` (TFRecord shards) and
    :class:`~memfit.data.read.arrays_reader.ArraysPlan` (``.npy`` arrays) both are one."""

    @property
    def batch_size(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def steps_per_epoch(self) -> int: ...
    @property
    def memory_budget(self) -> int: ...
    @property
    def estimated_bytes(self) -> int: ...
    @property
    def window_samples(self) -> int: ...
    @property
    def prefetch_batches(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def epochs(self) -> int | None: ...
    @property
    def shuffle(self) -> bool: ...
    @property
    def arena_limit(self) -> int | None: ...


P = TypeVar("P", bound=ReaderPlan)


@dataclasses.dataclass(frozen=True)
class DatasetPlan:
    """What ``memfit.dataset`` chose from the budget, and what it will yield.

    Attributes:
        path: the dataset directory; split: the split read.
        batch_size: samples per batch; steps_per_epoch: batches per epoch.
        samples: samples per epoch (of this shard, when sharded).
        memory_budget: the byte budget asked for; estimated_bytes: what the plan needs.
        window_records / window_samples: the shuffle window, in records and samples.
        cycle_length: shards read at once, by ``read_threads`` threads.
        parallel_windows: windows decoded at once.
        prefetch_batches: batches prepared ahead of the model.
        seed, epoch, epochs: the order's seed, the first epoch, the epoch count (or None).
        arena_limit: glibc malloc arenas the process is capped at (``None``: not capped).
        reader: ``"blocks"`` (memfit's block reader: windows of whole batches built by
            ``parallel_windows`` threads) or ``"tf"`` (``tf.data.TFRecordDataset``).
        reader_note: why the TF reader was chosen, when it was not asked for; with the
            block reader, how samples reach their batch rows
            (:func:`memfit.data.read.blocks.block_layout.reads_into_batches`).
        decode_calls: images decoded at once (features kept encoded at pack time; 0:
            nothing to decode); decode_note: what is decoded, and to what.
    """

    path: str
    split: str
    batch_size: int
    samples: int
    steps_per_epoch: int
    memory_budget: int
    estimated_bytes: int
    window_records: int
    window_samples: int
    cycle_length: int
    read_threads: int
    parallel_windows: int
    prefetch_batches: int
    seed: int
    epoch: int
    epochs: int | None
    shuffle: bool
    arena_limit: int | None = None
    reader: str = "tf"
    reader_note: str = ""
    decode_calls: int = 0
    decode_note: str = ""

    def __str__(self) -> str:
        if self.reader == "blocks":
            # A split smaller than the window is one short window: the whole split (a
            # stranger's 2,700 samples were said to be shuffled in windows of 161,344).
            window = min(self.window_samples, self.samples) if self.samples > 0 \
                else self.window_samples
            whole = ", the whole split" if window < self.window_samples else ""
            batches = -(-window // self.batch_size) if whole else window // self.batch_size
            order = (f"shuffle window {format_count(window, 'sample')} "
                     f"({format_count(batches, 'batch', 'batches')}{whole}) over "
                     f"{format_count(self.cycle_length, 'shard')} read round-robin"
                     if self.shuffle else "stored order")
            return (f"memfit.dataset {self.path} [{self.split}]: budget "
                    f"{format_size(self.memory_budget)} → {order}; memfit's block reader "
                    f"({self.reader_note}, CRC32C checked, windows of "
                    f"{format_count(window, 'sample')}), "
                    f"{format_count(self.parallel_windows, 'window')} built ahead, prefetch "
                    f"{format_count(self.prefetch_batches, 'batch', 'batches')}; about "
                    f"{format_size(self.estimated_bytes)} in flight. {plan_summary(self)}")
        order = (f"shuffle window {format_count(self.window_records, 'record')} "
                 f"({format_count(self.window_samples, 'sample')})" if self.shuffle
                 else "stored order")
        note = f" (tf.data's TFRecord reader: {self.reader_note})" if self.reader_note else ""
        decodes = (f"then decodes {self.decode_note} in "
                   f"{format_count(self.decode_calls, 'parallel call')}, "
                   if self.decode_calls else "")
        return (f"memfit.dataset {self.path} [{self.split}]{note}: budget "
                f"{format_size(self.memory_budget)} → {order}, "
                f"{format_count(self.cycle_length, 'shard')} read at once by "
                f"{format_count(self.read_threads, 'thread')}, "
                f"{format_count(self.parallel_windows, 'window')} decoded in parallel, "
                f"{decodes}prefetch {format_count(self.prefetch_batches, 'batch', 'batches')}; "
                f"about {format_size(self.estimated_bytes)} in flight. {plan_summary(self)}")


def plan_summary(plan: ReaderPlan) -> str:
    """The end of every plan's description: what an epoch yields and where the order
    starts (and the arena cap, when there is one)."""
    return (f"{format_count(plan.samples, 'sample')} → "
            f"{format_count(plan.steps_per_epoch, 'step')}/epoch of "
            f"{plan.batch_size}; seed={plan.seed}, starting at epoch {plan.epoch}."
            + (f" glibc malloc arenas capped at {plan.arena_limit}." if plan.arena_limit
               else ""))


def steps_per_epoch(samples: int, batch_size: int, drop_remainder: bool) -> int:
    """Batches in an epoch of ``samples``: the last, smaller one counts unless dropped."""
    return samples // batch_size if drop_remainder else math.ceil(samples / batch_size)


def settle_plan(plan: P, *, batch_size: int, samples: int, cap_arenas: bool) -> P:
    """The last steps every reader's plan goes through: refuse a plan with no batch, cap
    glibc's arenas if asked (recorded in the plan), and log what was chosen.

    Args:
        plan: the reader's plan (a frozen dataclass).
        batch_size, samples: what the plan was made for (quoted in the error).
        cap_arenas: cap glibc's malloc arenas at one per core (at least two).
    """
    if plan.steps_per_epoch == 0:
        raise ValueError(f"drop_remainder=True with batch_size={batch_size} larger than the "
                         f"{samples:,} samples leaves no batch. Received: "
                         f"batch_size={batch_size}")
    if cap_arenas:
        from memfit.memory.allocator import limit_arenas

        plan = dataclasses.replace(  # type: ignore[type-var]
            plan, arena_limit=limit_arenas(max(2, os.cpu_count() or 1)))
    log.info("%s", plan)
    return plan
