"""The framework baseline: memory a training process holds before it has a model.

On the CPU it is the anonymous RSS of a fresh Python process after ``import tensorflow,
keras`` and one eager op (the runtime and its thread pools started). On a GPU it is the
device memory the driver charges to such a process (NVML: CUDA context, cuBLAS/cuDNN
handles, TensorFlow's first allocator region): memory a per-process cap does not
include. :func:`calibrate` measures it in a child process, once per machine, and caches
it; :func:`framework_baseline` returns the cached value or a default;
:func:`ensure_calibration` (what the first ``memfit.estimate``/``memfit estimate`` or
``find-batch-size`` on a machine calls) measures it when nothing is cached, caches it
and says so in one line::

    memfit: measured this machine's TensorFlow baseline once: 218.3 MiB (cached in
    /home/me/.cache/memfit/calibration.json; `memfit calibrate` to redo it)

The cache is ``$XDG_CACHE_HOME/memfit/calibration.json`` (``~/.cache/memfit/...``), or
``$MEMFIT_CACHE_DIR/calibration.json`` when that is set (tests, CI, a shared cache),
keyed by host, device and the versions of TensorFlow, Keras and JAX (TensorFlow imports
JAX where it is installed, which changes the baseline), written atomically.

Example:
    >>> c = calibrate("cpu")                                    # doctest: +SKIP
    >>> print(c)                                                # doctest: +SKIP
    cpu baseline 217.4 MiB (TensorFlow 2.21.0, host build-01, 3 runs)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

from memfit import checks
from memfit.atomic import write_text_atomic
from memfit.env import CACHE_ENV
from memfit.errors import MemfitError
from memfit.estimate.measure import run_child
from memfit.frameworks import keras_backend, require_for_training
from memfit.memory.probe import nvml_devices
from memfit.sizes import format_size

__all__ = ["Calibration", "calibrate", "load_calibration", "framework_baseline",
           "ensure_calibration", "save_calibration", "cache_path", "DEFAULT_BASELINE",
           "check_device"]

log = logging.getLogger("memfit.estimate")

FORMAT = "memfit-calibration"
# Used until `memfit calibrate` ran: TF 2.21 + Keras 3 on x86-64 Linux (CPU: anonymous
# RSS; GPU: NVML per-process memory of a CUDA context with TensorFlow started).
DEFAULT_BASELINE = {"cpu": 220 * 2**20, "gpu": 600 * 2**20}


class CalibrationError(MemfitError):
    """The baseline could not be measured (no GPU, no NVML, the child failed)."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A measured framework baseline.

    Attributes:
        device: ``"cpu"`` or ``"gpu:N"``.
        baseline: bytes the framework holds before a model exists (CPU: anonymous RSS;
            GPU: device memory charged to the process).
        host_baseline: anonymous RSS of the same process (on a GPU, the host side).
        interpreter: anonymous RSS of the bare Python interpreter, before the import.
        tensorflow: TensorFlow version measured with.
        keras: Keras version.
        host: the machine (``platform.node()``).
        runs: how many child processes were measured (the median is kept).
        measured_at: Unix time.
        backend: Keras's backend in the measured process (``"tensorflow"``, ``"jax"``).
        jax: JAX version on the JAX backend (``"-"`` otherwise).
    """

    device: str
    baseline: int
    host_baseline: int
    interpreter: int
    tensorflow: str
    keras: str
    host: str
    runs: int
    measured_at: float
    backend: str = "tensorflow"
    jax: str = "-"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        framework = (f"JAX {self.jax}, Keras {self.keras}" if self.backend == "jax"
                     else f"TensorFlow {self.tensorflow}")
        return (f"{self.device} baseline {format_size(self.baseline)} ({framework}, host "
                f"{self.host}, median of {self.runs} runs; "
                f"the bare interpreter: {format_size(self.interpreter)})")


def check_device(device: str) -> str:
    """``"cpu"``, ``"gpu"`` (= ``"gpu:0"``) or ``"gpu:N"``; raises for anything else.

    Example:
        >>> check_device("GPU"), check_device("gpu:1")
        ('gpu:0', 'gpu:1')

    Raises:
        MemfitError: quoting the value.
    """
    text = device.strip().lower() if isinstance(device, str) else ""
    if text == "gpu":
        text = "gpu:0"
    if text == "cpu" or (text.startswith("gpu:") and text[4:].isdigit()):
        return text
    raise MemfitError(f"device must be 'cpu' or 'gpu:N' (such as 'gpu:0'). "
                      f"Received: device={device!r}")


def cache_path() -> Path:
    """Where calibrations are cached: ``$MEMFIT_CACHE_DIR/calibration.json`` when that is
    set, else ``$XDG_CACHE_HOME/memfit/calibration.json`` (``~/.cache/memfit/...``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "calibration.json"
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "memfit" / "calibration.json"


def _key(device: str, frameworks: str) -> str:
    backend = keras_backend()
    # The TensorFlow key stays as it was, so that existing caches keep their entries.
    return f"{platform.node()}|{device}|{frameworks}" + (
        "" if backend == "tensorflow" else f"|{backend}")


def _framework_name() -> str:
    return {"tensorflow": "TensorFlow", "jax": "JAX"}.get(keras_backend(), keras_backend())


#: What ``import tensorflow, keras`` loads, whose versions change the baseline. TensorFlow
#: imports JAX where it is installed (``tensorflow/lite/python/util.py``): +36 MiB of
#: anonymous RSS per process here (docs/estimate.md), so a baseline measured before JAX
#: was installed is stale after.
_BASELINE_PACKAGES = ("tensorflow", "keras", "jax")


def _frameworks_key() -> str:
    """The versions of :data:`_BASELINE_PACKAGES` (``-`` for one not installed), the
    cache key's last part: ``"tf2.21.0 keras3.15.1 jax0.10.2"``."""
    from importlib import metadata

    parts = []
    for name in _BASELINE_PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "-"
        parts.append(f"{'tf' if name == 'tensorflow' else name}{version}")
    return " ".join(parts)


def _read_cache() -> dict:
    path = cache_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    return data.get("entries", {})


def load_calibration(device: str = "cpu") -> Calibration | None:
    """The cached calibration of this machine for ``device``, or ``None``."""
    device = check_device(device)
    entry = _read_cache().get(_key(device, _frameworks_key()))
    if not entry:
        return None
    try:
        return Calibration(**entry)
    except TypeError:
        return None


def framework_baseline(device: str = "cpu") -> tuple[int, str]:
    """The baseline in bytes and where it came from (``"calibrated"`` or ``"default"``)."""
    device = check_device(device)
    c = load_calibration(device)
    if c is not None:
        return c.baseline, "calibrated"
    return DEFAULT_BASELINE["gpu" if device.startswith("gpu") else "cpu"], "default"


def ensure_calibration(device: str = "cpu") -> tuple[int, str]:
    """The baseline in bytes and where it came from, measured now when this machine has
    none cached for ``device`` (once: the result is cached, and one line says so).

    The first estimate on a machine calls it, so that it never silently uses
    :data:`DEFAULT_BASELINE`. The default is kept, saying why in one line, when the
    baseline cannot be measured here: the child fails, or ``device`` is a GPU this machine
    does not have (an estimate for another machine: calibrate there).

    Example:
        >>> ensure_calibration("cpu")                            # doctest: +SKIP
        memfit: measured this machine's TensorFlow baseline once: 218.3 MiB (cached in ...)
        (228904960, 'calibrated')

    Args:
        device: ``"cpu"`` or ``"gpu:N"``.

    Returns:
        ``(bytes, "calibrated")``, or ``(bytes, "default")`` when it was not measured.
    """
    device = check_device(device)
    cached = load_calibration(device)
    if cached is not None:
        return cached.baseline, "calibrated"
    default = DEFAULT_BASELINE["gpu" if device.startswith("gpu") else "cpu"]
    on = "" if device == "cpu" else f" on {device}"
    redo = "memfit calibrate" + ("" if device == "cpu" else f" --device {device}")
    if device.startswith("gpu") and not _gpu_visible(device):
        log.warning("memfit: %s is not a GPU this machine has (%s); the estimate uses the "
                    "default GPU baseline, %s, as for another machine. Give device='cpu' "
                    "(--device cpu) to estimate for this machine, or run `%s` on the "
                    "machine with that GPU.", device, _gpus_seen(), format_size(default),
                    redo)
        return default, "default"
    try:
        c = calibrate(device, runs=1, cache=False)
    except CalibrationError as e:
        log.warning("memfit: could not measure this machine's %s baseline%s (%s); "
                    "using the default %s: run `%s` to measure it.", _framework_name(), on, e,
                    format_size(default), redo)
        return default, "default"
    try:
        save_calibration(c)
        where = f"cached in {cache_path()}"
    except CalibrationError:
        where = (f"not cached: {str(cache_path().parent)!r} is not writable, set "
                 f"{CACHE_ENV} to a writable directory")
    # a warning, so that a Python script (no logging set up) sees it as the CLI does: a
    # stranger's first memfit.estimate_memory() waited seconds for it without a word
    log.warning("memfit: measured this machine's %s baseline%s once: %s (%s; `%s` to "
                "redo it)", _framework_name(), on, format_size(c.baseline), where, redo)
    return c.baseline, "calibrated"


def calibrate(device: str = "cpu", *, runs: int = 3, cache: bool = True,
              timeout: float = 300.0) -> Calibration:
    """Measures the framework baseline in ``runs`` fresh child processes (the median).

    Example:
        >>> c = calibrate("cpu", runs=1)                        # doctest: +SKIP
        >>> c.baseline > 100 * 2**20                            # doctest: +SKIP
        True

    Args:
        device: ``"cpu"`` or ``"gpu:N"``.
        runs: child processes to measure; the median is kept.
        cache: write the result to :func:`cache_path` (atomically).
        timeout: seconds per child.

    Raises:
        CalibrationError: when the child fails, or on a GPU without NVML or a GPU.
    """
    require_for_training("memfit calibrate")
    device = check_device(device)
    runs = checks.count("runs", runs, hint="Child processes to measure (the median is kept).")
    if device.startswith("gpu") and not _gpu_present():
        raise CalibrationError(
            f"No NVIDIA GPU is visible for {device}: NVML (the nvidia-ml-py package and an "
            f"NVIDIA driver) reports none. Calibrate with --device cpu here.")
    reports = []
    for _ in range(runs):
        r = run_child({"mode": "calibrate", "device": device}, timeout=timeout)
        if r.status != "ok":
            raise CalibrationError(f"The calibration child failed ({r.status}): {r.message}")
        reports.append(r.report)
    if device.startswith("gpu"):
        values = [rep.get("nvml") for rep in reports]
        if any(v is None for v in values):
            raise CalibrationError(
                f"No GPU memory was charged to the calibration process on {device}: "
                f"NVML (the nvidia-ml-py package and an NVIDIA driver) or the GPU is not "
                f"available. Calibrate with --device cpu here.")
        baseline = int(statistics.median(values))
    else:
        baseline = int(statistics.median(rep["baseline_anon"] for rep in reports))
    c = Calibration(device=device, baseline=baseline,
                    host_baseline=int(statistics.median(rep["baseline_anon"]
                                                        for rep in reports)),
                    interpreter=int(statistics.median(rep["interpreter_anon"]
                                                      for rep in reports)),
                    tensorflow=reports[0]["tensorflow"], keras=reports[0]["keras"],
                    host=platform.node(), runs=runs, measured_at=time.time(),
                    backend=reports[0].get("backend", "tensorflow"),
                    jax=reports[0].get("jax", "-"))
    if cache:
        save_calibration(c)
    return c


def _gpu_present() -> bool:
    """Whether NVML sees at least one GPU (checked before starting a child for it)."""
    return bool(nvml_devices())


def _gpu_visible(device: str) -> bool:
    """Whether NVML sees the GPU ``device`` (``"gpu:N"``) names."""
    return int(device.split(":")[1]) < len(nvml_devices() or [])


def _gpus_seen() -> str:
    """What NVML sees, for the line that says a GPU is not here."""
    devices = nvml_devices()
    if devices is None:
        return "NVML, the nvidia-ml-py package with an NVIDIA driver, is not available"
    if not devices:
        return "NVML sees no GPU"
    if len(devices) == 1:
        return "NVML sees one: gpu:0"
    return f"NVML sees {len(devices)}: gpu:0 to gpu:{len(devices) - 1}"


def save_calibration(c: Calibration) -> Path:
    """Caches ``c`` (atomically) for its device, beside the other devices' calibrations.

    Example:
        >>> save_calibration(calibrate("cpu", cache=False))      # doctest: +SKIP
        PosixPath('/home/me/.cache/memfit/calibration.json')

    Args:
        c: a calibration of this machine (:func:`calibrate`).

    Returns:
        The cache file (:func:`cache_path`).

    Raises:
        CalibrationError: when the cache cannot be written.
    """
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read_cache()
        entries[_key(c.device, _frameworks_key())] = c.to_json()
        write_text_atomic(path, json.dumps({"format": FORMAT, "version": 1,
                                            "entries": entries}, indent=1))
        return path
    except OSError as e:
        raise CalibrationError(f"Cannot write the calibration cache {str(path)!r}: "
                               f"{e.strerror}. Set {CACHE_ENV} (or XDG_CACHE_HOME) to a "
                               f"writable directory.") from None
