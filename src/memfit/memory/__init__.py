"""Memory: sizes, the one probe, and (later) the monitor and leak classifier."""

from memfit.memory.probe import Measurement, Sample, measure, sample
from memfit.memory.sizes import format_size, parse_size

__all__ = ["Measurement", "Sample", "format_size", "measure", "parse_size", "sample"]
