"""Memory: the one probe, the process sampler, the shared log, the allocator and the
leak classifier. (The Keras callback, ``memfit.MemoryMonitor``, is training-side: it
lives in :mod:`memfit.supervise.monitor`.)
"""

from memfit.memory.allocator import malloc_trim
from memfit.memory.classifier import Verdict, classify
from memfit.memory.log import MemoryLog, read_log
from memfit.memory.probe import Measurement, Sample, measure, sample
from memfit.sizes import format_size, parse_size

__all__ = ["Measurement", "MemoryLog", "Sample", "Verdict", "classify",
           "format_size", "malloc_trim", "measure", "parse_size", "read_log", "sample"]

