"""The one process sampler: a process tree's memory, sampled from outside, logged and kept.

``memfit watch``, ``memfit run``, ``memfit share`` and the estimate's measuring child
all watch another process the same way: every tick, :func:`memfit.memory.probe.sample`
over the whole tree (data-loader workers count), optionally NVML's per-process GPU
memory, one ``sample`` event in the shared log, a running peak, and the samples kept
evenly spaced and bounded (:class:`EvenSamples`) for the verdict. A tree that has just
ended gives ``None``, not an error.

Example:
    >>> import subprocess, sys
    >>> proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    >>> sampler = TreeSampler(proc.pid)
    >>> s = sampler.take()
    >>> s is not None and sampler.peak.rss > 0 and sampler.samples.seen == 1
    True
    >>> _ = proc.wait()
"""

from __future__ import annotations

from typing import Any

from memfit.memory.log import Event, MemoryLog
from memfit.memory.probe import Sample, nvml_memory, peak_of, sample

__all__ = ["TreeSampler", "EvenSamples", "MAX_KEPT"]

MAX_KEPT = 20_000            # samples kept for the verdict (a week at 0.5 s is 1.2 M)


class EvenSamples:
    """The samples of a run of any length, kept evenly spaced and bounded: past
    ``limit``, every other one is dropped and only every other new one kept from then
    on (the log keeps them all). Time slices and the start-up and teardown cuts need
    coverage over the run, not every sample.

    Example:
        >>> kept = EvenSamples(limit=4)
        >>> for i in range(10):
        ...     kept.add(i)
        >>> kept.items, kept.last
        ([0, 4, 8], 9)

    Args:
        limit: the most samples to keep.
    """

    def __init__(self, limit: int = MAX_KEPT):
        self.limit = limit
        self.items: list = []
        self.last: Any = None
        self.seen = 0
        self._stride = 1

    def add(self, item: Any) -> None:
        """Counts a new sample, and keeps it if it falls on the current spacing."""
        if self.seen % self._stride == 0:
            self.items.append(item)
            if len(self.items) > self.limit:
                del self.items[1::2]
                self._stride *= 2
        self.seen += 1
        self.last = item


class TreeSampler:
    """Samples one process tree on demand: :meth:`take` once per tick.

    Args:
        pid: the root of the tree.
        log: where each sample is written as a ``sample`` event (``scope: "tree"``), or
            ``None``.
        samples: the :class:`EvenSamples` to add each sample to (a supervisor passes one
            across several children); a new one when ``None``.
        gpu: also read NVML's GPU memory of the tree (``gpu_now``, ``nvml`` in the log).
        **fields: more fields for every ``sample`` event (``job=...``).

    Attributes:
        peak: the field-wise peak of every sample taken (``None`` before the first).
        last: the last sample taken, or ``None``.
        gpu_now: NVML's figure at the last sample (``None`` off the GPU).
        gpu_peak: the highest ``gpu_now``.
    """

    def __init__(self, pid: int, *, log: MemoryLog | None = None,
                 samples: EvenSamples | None = None, gpu: bool = False, **fields: Any):
        self.pid = pid
        self.log = log
        self.samples = EvenSamples() if samples is None else samples
        self.gpu = gpu
        self.fields = fields
        self.peak: Sample | None = None
        self.last: Sample | None = None
        self.gpu_now: int | None = None
        self.gpu_peak: int | None = None

    def take(self, **fields: Any) -> Sample | None:
        """One sample of the tree (logged, kept, peaked), or ``None`` once it has ended
        (a zombie has no memory left). ``fields`` go into this sample's log event."""
        try:
            s = sample(self.pid, tree=True)
        except ProcessLookupError:
            return None
        if self.gpu:
            self.gpu_now = nvml_memory(self.pid, tree=True)
            if self.gpu_now is not None:
                self.gpu_peak = max(self.gpu_peak or 0, self.gpu_now)
        if self.log is not None:
            self.log.write(Event.SAMPLE, scope="tree", **self.fields, **fields,
                           nvml=self.gpu_now, **s.as_record())
        self.samples.add(s)
        self.peak = peak_of(self.peak, s)
        self.last = s
        return s
