"""The GPU side of a training process: its TensorFlow memory settings, and who else is there.

:func:`gpu_state` is called in the training process (by the probe) after some steps. It
reads, for every GPU TensorFlow sees, whether memory growth is on and whether a cap
(``memory_limit`` of a logical device configuration) is set, and from NVML every device's
total memory and the processes using it: this process (its memory is the probe's
:func:`memfit.memory.probe.nvml_memory`) and the others. Without a GPU, without NVML or
without TensorFlow it returns ``None``: nothing to diagnose.

Example:
    >>> gpu_state() is None or "devices" in gpu_state()     # doctest: +SKIP
    True
"""

from __future__ import annotations

import os
import sys
from typing import Any

from memfit.memory.probe import nvml_devices, nvml_memory, tf_gpu_memory

__all__ = ["gpu_state", "growth_from_environment"]


def growth_from_environment() -> bool:
    """Whether ``$TF_FORCE_GPU_ALLOW_GROWTH`` turns memory growth on for every GPU."""
    return os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").lower() == "true"


def _settings(tf: Any) -> list[dict]:
    out = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            growth = bool(tf.config.experimental.get_memory_growth(gpu))
        except Exception:       # noqa: BLE001
            growth = None
        limit = None
        try:
            configs = tf.config.get_logical_device_configuration(gpu) or []
            limits = [c.memory_limit for c in configs if getattr(c, "memory_limit", None)]
            limit = int(sum(limits) * 2**20) if limits else None
        except Exception:       # noqa: BLE001
            pass
        out.append({"name": gpu.name, "growth": growth or growth_from_environment(),
                    "memory_limit": limit})
    return out


def gpu_state(pid: int | None = None) -> dict | None:
    """This process's GPU settings and the devices' use, or ``None`` without a GPU.

    Returns:
        ``{"gpus": [{"name", "growth", "memory_limit"}], "devices": [{"index", "name",
        "total", "used", "own", "others": [{"pid", "used"}]}], "own": bytes, "allocator":
        {"GPU:0": {"current", "peak"}}}``, sizes in bytes; ``devices`` is ``None`` where
        NVML is not available.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        gpus = _settings(tf)
    except Exception:           # noqa: BLE001
        return None
    if not gpus:
        return None
    pid = os.getpid() if pid is None else pid
    return {"gpus": gpus, "devices": nvml_devices(pid), "own": nvml_memory(pid),
            "allocator": tf_gpu_memory()}
