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
    memfit.estimate_memory(...) a Keras model's training memory, before running it
    memfit.share_jobs(...)    run several trainings on one device within a memory budget
    memfit.configure_device() in a job: the GPU memory cap (or growth) memfit share hands down
    memfit.run_doctor(...)    run a training for a few steps: ranked findings, with fixes
    memfit.parse_size / format_size

``memfit.estimate``, ``memfit.share`` and ``memfit.doctor`` are the packages
(``import memfit.estimate as e`` gives the package). Calling one of them as the function
it used to be still works for this release, with a DeprecationWarning
(:mod:`memfit.callable_package`).

Layers (docs/architecture.md; ``tests/test_architecture.py`` enforces them): every import
points down this list or stays inside its own package, with no cycles and no
``_private`` name used from another module.

    base       errors, exitcodes, env (every MEMFIT_* name), checks, sizes, atomic,
               workdir, quiet, device
    memory     the probe, the process sampler and launcher, the log, the allocator,
               the leak classifier, watch
    data       packing and streaming          estimate   the memory model, measuring
    report     plots and the HTML report of any memfit log
    supervise  memfit run, memfit.session, MemoryMonitor       share   memfit share
    doctor     memfit doctor
    cli        one module per subcommand
"""

from memfit.command_start import hold_interrupts

hold_interrupts()        # the `memfit` command only: a Ctrl-C while it imports is one line

from typing import Any

from memfit._version import __version__
from memfit.data import Manifest, PackResult, inspect, pack, verify
from memfit.device import configure_device
from memfit.doctor.checkup import doctor as run_doctor
from memfit.errors import CorruptShardError, DatasetError, FrameworkMissingError, MemfitError
from memfit.estimate.estimator import estimate as estimate_memory
from memfit.estimate.memory_estimate import Estimate
from memfit.frameworks import TENSORFLOW_EXTRA, require, require_for_data
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
from memfit.share.runner import share as share_jobs
from memfit.supervise import RunResult, run

__all__ = ["__version__", "CorruptShardError", "DatasetError", "DatasetPlan", "Estimate",
           "FrameworkMissingError", "MemfitError", "Manifest", "Measurement", "MemoryMonitor",
           "PackResult", "RunResult", "Sample", "Verdict", "classify", "configure_device",
           "dataset", "estimate_memory", "format_size", "inspect", "malloc_trim", "measure",
           "pack", "parse_size", "run", "run_doctor", "sample", "session", "share_jobs",
           "verify"]


def __getattr__(name: str) -> Any:
    # TensorFlow is imported on first use of the streaming API, not by `import memfit`.
    if name in ("dataset", "DatasetPlan"):
        require_for_data("memfit.dataset")   # TensorFlow on its backend, else Keras
        from memfit.data.read import dispatch as stream

        return getattr(stream, name)
    if name == "session":
        require("keras", "memfit.session", TENSORFLOW_EXTRA)
        from memfit.supervise.session import session

        return session
    if name == "MemoryMonitor":
        require("keras", "memfit.MemoryMonitor", TENSORFLOW_EXTRA)
        from memfit.supervise.monitor import MemoryMonitor

        return MemoryMonitor
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
