"""memfit: train Keras models on data larger than RAM, near the device's memory limit,
and see where the memory went.

Public API (re-exports only):

    memfit.pack(...)          write a source into checksummed TFRecord shards
    memfit.dataset(...)       stream them as a tf.data.Dataset under a byte budget
    memfit.inspect / verify   describe / check a packed dataset
    memfit.measure()          RSS before/after/peak of a block (anonymous and file apart)
    memfit.MemoryMonitor      Keras callback: memory log + leak/retention/warm-up verdict
    memfit.classify(...)      the verdict from epoch-end RSS values; memfit.malloc_trim()
    memfit.session(...)       in a training script: checkpoint every epoch, resume exactly
    memfit.run(...)           run a training command, restarting it from its checkpoints
    memfit.estimate(...)      a Keras model's training memory, before running it
    memfit.share(...)         run several trainings on one device within a memory budget
    memfit.configure_device() in a job: the GPU memory cap (or growth) memfit share hands down
    memfit.doctor(...)        run a training for a few steps: ranked findings, with fixes
    memfit.parse_size / format_size
"""

from typing import Any

from memfit._version import __version__
from memfit.data import Manifest, PackResult, inspect, pack, verify
from memfit.memory import (
    Measurement,
    Sample,
    Verdict,
    classify,
    format_size,
    malloc_trim,
    measure,
    parse_size,
    sample,
)
from memfit.supervise import RunResult, run

__all__ = ["__version__", "DatasetPlan", "Estimate", "Manifest", "Measurement", "MemoryMonitor",
           "PackResult", "RunResult", "Sample", "Verdict", "classify", "configure_device",
           "dataset", "doctor", "estimate", "format_size", "inspect", "malloc_trim", "measure",
           "pack", "parse_size", "run", "sample", "session", "share", "verify"]


def __getattr__(name: str) -> Any:
    # TensorFlow is imported on first use of the streaming API, not by `import memfit`.
    if name in ("dataset", "DatasetPlan"):
        from memfit.data import stream

        return getattr(stream, name)
    if name == "session":
        from memfit.supervise.session import session

        return session
    if name in ("estimate", "Estimate"):    # the package is callable: memfit.estimate(model, 32)
        import memfit.estimate

        return memfit.estimate if name == "estimate" else memfit.estimate.Estimate
    if name in ("share", "configure_device"):   # the package is callable: memfit.share(jobs)
        import memfit.share

        return memfit.share if name == "share" else memfit.share.configure_device
    if name == "doctor":        # the package is callable: memfit.doctor(["python", "t.py"])
        import memfit.doctor

        return memfit.doctor
    if name == "MemoryMonitor":
        from memfit.supervise.monitor import MemoryMonitor

        return MemoryMonitor
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
