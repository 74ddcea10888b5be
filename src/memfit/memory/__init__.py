"""Memory: sizes, the one probe, the shared log, the leak classifier and the monitor.

``MemoryMonitor`` imports Keras; it is loaded on first use.
"""

from typing import Any

from memfit.memory.allocator import malloc_trim
from memfit.memory.classify import Verdict, classify
from memfit.memory.log import MemoryLog, read_log
from memfit.memory.probe import Measurement, Sample, measure, sample
from memfit.memory.sizes import format_size, parse_size

__all__ = ["Measurement", "MemoryLog", "MemoryMonitor", "Sample", "Verdict", "classify",
           "format_size", "malloc_trim", "measure", "parse_size", "read_log", "sample"]


def __getattr__(name: str) -> Any:
    if name == "MemoryMonitor":
        from memfit.memory.monitor import MemoryMonitor

        return MemoryMonitor
    raise AttributeError(f"module 'memfit.memory' has no attribute {name!r}")
