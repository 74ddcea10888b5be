"""``memfit.configure_device()``: the GPU memory cap (or memory growth) of one training process.

Called at the top of a training script, before TensorFlow touches the GPU. Without
arguments it applies what ``memfit share`` (or ``memfit run`` started by it) handed
down in the environment:

    MEMFIT_GPU_MEMORY_LIMIT   the per-process cap: bytes, or a size such as ``"2GiB"``
    MEMFIT_GPU_MEMORY_GROWTH  ``1``/``true``/``yes``: allocate as needed instead of
                              reserving (``0``/``false``/``no``: TensorFlow's default)

The cap becomes ``tf.config.set_logical_device_configuration(gpu,
[tf.config.LogicalDeviceConfiguration(memory_limit=MiB)])`` on every visible GPU; growth
becomes ``tf.config.experimental.set_memory_growth(gpu, True)``. On a machine without a
GPU it does nothing and says so (CPU memory is enforced from outside, by ``memfit
share`` watching the process's RSS). TensorFlow refuses both settings once it has
initialised the GPU (any op, model or dataset created before): that ``RuntimeError`` is
turned into a :class:`DeviceConfigError` that says where to move the call.

A cap does not bound the process's real GPU use: the CUDA context, cuBLAS/cuDNN
workspaces and TensorFlow's own bookkeeping come on top (a 1,024 MiB cap used about
2,099 MiB in one report). ``memfit share`` charges every job that per-process overhead
too, measured by ``memfit calibrate --device gpu:0``.

Example:
    >>> import memfit
    >>> config = memfit.configure_device()          # doctest: +SKIP
    >>> print(config.message)                       # doctest: +SKIP
    no GPU is visible to TensorFlow: nothing to configure on the CPU (...)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from memfit.env import GPU_MEMORY_GROWTH_ENV, GPU_MEMORY_LIMIT_ENV
from memfit.errors import MemfitError
from memfit.frameworks import keras_backend
from memfit.sizes import format_size, parse_size

__all__ = ["configure_device", "DeviceConfig", "DeviceConfigError", "device_settings",
           "device_env"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
_MIB = 2**20

log = logging.getLogger("memfit.share")


class DeviceConfigError(MemfitError, ValueError):
    """A device setting that cannot be applied as given (or not any more: TF started)."""


@dataclasses.dataclass(frozen=True)
class DeviceConfig:
    """What :func:`configure_device` did.

    Attributes:
        memory_limit: the cap in bytes (rounded down to whole MiB, as TensorFlow takes
            it), or ``None``.
        growth: memory growth as set, or ``None`` when not asked.
        source: where the settings came from: ``"arguments"``, ``"environment"`` or
            ``"none"``.
        gpus: the physical GPUs configured (their TensorFlow names); empty on the CPU.
        applied: whether anything was changed in TensorFlow.
        message: one line saying what was done (also logged).
    """

    memory_limit: int | None
    growth: bool | None
    source: str
    gpus: tuple[str, ...]
    applied: bool
    message: str

    def __str__(self) -> str:
        return self.message


def _parse_growth(value: Any, name: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise DeviceConfigError(f"{name} must be true or false (1/0, yes/no). "
                            f"Received: {name}={value!r}")


def device_settings(memory_limit: str | int | None = None, growth: bool | None = None, *,
                    environ: Mapping[str, str] | None = None) -> tuple[int | None, bool | None,
                                                                       str]:
    """The cap and growth to apply: from the arguments, else from the environment.

    Pure (imports no TensorFlow): what :func:`configure_device` would do.

    Example:
        >>> device_settings(environ={"MEMFIT_GPU_MEMORY_LIMIT": "1GiB"})
        (1073741824, None, 'environment')
        >>> device_settings(memory_limit="512MiB", environ={})
        (536870912, None, 'arguments')

    Args:
        memory_limit: the cap (``"2GiB"``, bytes), or ``None`` to look at
            ``$MEMFIT_GPU_MEMORY_LIMIT``.
        growth: memory growth, or ``None`` to look at ``$MEMFIT_GPU_MEMORY_GROWTH``.
        environ: the environment to read (default ``os.environ``).

    Returns:
        ``(memory_limit in bytes or None, growth or None, source)``.

    Raises:
        DeviceConfigError: for a size that is not one, a cap under 1 MiB, a growth value
            that is not a boolean, or a cap together with growth (TensorFlow refuses
            both on one GPU), each quoting the value.
    """
    environ = os.environ if environ is None else environ
    if memory_limit is not None or growth is not None:
        source = "arguments"
        name_limit, name_growth = "memory_limit", "growth"
    else:
        source = "environment"
        memory_limit = environ.get(GPU_MEMORY_LIMIT_ENV) or None
        growth = environ.get(GPU_MEMORY_GROWTH_ENV)             # type: ignore[assignment]
        name_limit, name_growth = GPU_MEMORY_LIMIT_ENV, GPU_MEMORY_GROWTH_ENV
    if growth is not None and not isinstance(growth, bool | str):
        raise DeviceConfigError(f"{name_growth} must be True or False. "
                                f"Received: {name_growth}={growth!r}")
    growth = _parse_growth(growth, name_growth)
    limit = None
    if memory_limit is not None:
        try:
            limit = parse_size(memory_limit, name=name_limit, memory=True)
        except ValueError as e:
            raise DeviceConfigError(str(e)) from None
        if limit < _MIB:
            raise DeviceConfigError(f"{name_limit} must be at least 1 MiB (TensorFlow takes "
                                    f"the cap in whole MiB). Received: "
                                    f"{name_limit}={memory_limit!r}")
    if limit is not None and growth:
        raise DeviceConfigError(
            f"Give either a memory cap or memory growth, not both: TensorFlow refuses memory "
            f"growth on a GPU with a cap. Received: {name_limit}={memory_limit!r}, "
            f"{name_growth}={growth!r}")
    if limit is None and growth is None:
        source = "none"
    return limit, growth, source


#: JAX's own switches (read when JAX starts its GPU backend): allocate as needed instead of
#: 75 % of the card at once, and at most this share of the card's total memory.
XLA_PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
XLA_MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def device_env(memory_limit: int | None = None, growth: bool | None = None, *,
               card_total: int | None = None) -> dict[str, str]:
    """The environment that hands a GPU job its cap (bytes) or growth, in the forms the
    frameworks obey: for TensorFlow through the job's ``configure_device()``
    (``$MEMFIT_GPU_MEMORY_LIMIT``, ``$MEMFIT_GPU_MEMORY_GROWTH``), for JAX through its own
    variables (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` always, so that a second training
    can start on the card, and ``XLA_PYTHON_CLIENT_MEM_FRACTION`` = the cap's share of the
    card when its total is known).

    Example:
        >>> device_env(memory_limit=2**30)
        {'MEMFIT_GPU_MEMORY_LIMIT': '1073741824', 'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
        >>> device_env(memory_limit=2**30, card_total=16 * 2**30)[XLA_MEM_FRACTION_ENV]
        '0.0625'

    Args:
        memory_limit: the cap, bytes (``None``: no cap).
        growth: allocate as needed (``None``: say nothing).
        card_total: the card's memory, bytes, for JAX's fraction (``None``: unknown).
    """
    env = {}
    if memory_limit is not None:
        env[GPU_MEMORY_LIMIT_ENV] = str(int(memory_limit))
    if growth is not None:
        env[GPU_MEMORY_GROWTH_ENV] = "1" if growth else "0"
    env[XLA_PREALLOCATE_ENV] = "false"
    if memory_limit is not None and card_total:
        env[XLA_MEM_FRACTION_ENV] = f"{min(1.0, memory_limit / card_total):.4f}"
    return env


def _jax_started() -> bool:
    """Whether JAX has started its backends (its allocator settings are fixed then)."""
    import sys

    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:        # noqa: BLE001 - another JAX: assume started, the safe side
        return True


def _jax_may_use_a_gpu() -> bool:
    """Whether JAX here could run on a GPU, asked without starting it: ``JAX_PLATFORMS``
    names one (or is not set), and a CUDA or ROCm plugin of JAX is installed."""
    import pkgutil

    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and not any(p in platforms for p in ("cuda", "gpu", "rocm")):
        return False
    return any(m.name.startswith(("jax_cuda", "jax_rocm")) for m in pkgutil.iter_modules())


def _configure_jax(limit: int | None, grow: bool | None, source: str) -> DeviceConfig:
    """On Keras's JAX backend: JAX takes its cap from its own variables, read when it
    starts its GPU backend: no preallocation (growth, or any cap) and the cap as a share
    of the card (``XLA_PYTHON_CLIENT_MEM_FRACTION``, which ``memfit share`` hands its
    jobs, computed from the card it sees)."""
    if not _jax_may_use_a_gpu():
        # as on TensorFlow: nothing to do, said (a stranger's cap on a CPU machine raised
        # about XLA_PYTHON_CLIENT_MEM_FRACTION, and growth said "on" with no GPU)
        wanted = f"a cap of {format_size(limit)}" if limit is not None else \
            f"memory growth {'on' if grow else 'off'}"
        message = (f"configure_device: JAX here has no GPU to run on (no CUDA or ROCm plugin, "
                   f"or JAX_PLATFORMS without one), so {wanted} does nothing on the CPU (CPU "
                   f"memory is enforced from outside: memfit share watches each job's RSS)")
        log.info(message)
        return DeviceConfig(limit, grow, source, (), False, message)
    fraction = os.environ.get(XLA_MEM_FRACTION_ENV)
    if limit is not None and fraction is None:
        raise DeviceConfigError(
            f"configure_device on Keras's JAX backend cannot turn a cap of "
            f"{format_size(limit)} into the share of the card JAX takes: set "
            f"{XLA_MEM_FRACTION_ENV} (a fraction of the card, such as 0.25) and "
            f"{XLA_PREALLOCATE_ENV}=false before JAX starts (memfit share sets both for its "
            f"jobs). Received: memory_limit={limit}")
    wanted = {XLA_PREALLOCATE_ENV: "false"} if limit is not None or grow else {}
    if _jax_started():
        if any(os.environ.get(k) != v for k, v in wanted.items()):
            raise DeviceConfigError(
                f"configure_device came too late: JAX has already started its backend and "
                f"reads {XLA_PREALLOCATE_ENV} only then. Call memfit.configure_device() at "
                f"the top of the script, before any JAX array or Keras model.")
        applied = False
    else:
        os.environ.update(wanted)
        applied = bool(wanted)
    what = (f"a cap of {format_size(limit)} ({XLA_MEM_FRACTION_ENV}={fraction})"
            if limit is not None else f"memory growth {'on' if grow else 'off'}")
    message = (f"configure_device: {what} on Keras's JAX backend, {XLA_PREALLOCATE_ENV}="
               f"{os.environ.get(XLA_PREALLOCATE_ENV, 'true (JAX default)')} (from the "
               f"{source})")
    log.info(message)
    return DeviceConfig(limit, grow, source, ("jax",), applied, message)


def _configure_torch(limit: int | None, grow: bool | None, source: str) -> DeviceConfig:
    """On Keras's PyTorch backend: the cap as PyTorch's per-process memory fraction of
    each visible GPU (PyTorch allocates as needed: growth is its default)."""
    import torch

    if not torch.cuda.is_available():
        message = ("configure_device: no GPU is visible to PyTorch, so nothing is "
                   "configured on the CPU (CPU memory is enforced from outside: memfit share "
                   "watches each job's RSS)")
        log.info(message)
        return DeviceConfig(limit, grow, source, (), False, message)
    names = []
    for i in range(torch.cuda.device_count()):
        if limit is not None:
            total = torch.cuda.get_device_properties(i).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), i)
        names.append(f"cuda:{i}")
    wanted = (f"a cap of {format_size(limit)}" if limit is not None else
              "memory growth (PyTorch's default)")
    message = f"configure_device: {wanted} on {', '.join(names)} (PyTorch, from the {source})"
    log.info(message)
    return DeviceConfig(limit, grow, source, tuple(names), limit is not None, message)


def _tensorflow() -> Any:
    """TensorFlow (imported here: ``import memfit`` never imports it)."""
    import tensorflow as tf

    return tf


def _current(tf: Any, gpu: Any) -> tuple[int | None, bool | None]:
    """The cap (MiB) and growth TensorFlow holds for ``gpu`` now (``None``: unknown)."""
    limit = None
    try:
        configs = tf.config.get_logical_device_configuration(gpu)
        if configs:
            limit = getattr(configs[0], "memory_limit", None)
    except Exception:                                   # noqa: BLE001 - older TF, fakes
        pass
    try:
        growth = tf.config.experimental.get_memory_growth(gpu)
    except Exception:                                   # noqa: BLE001
        growth = None
    return limit, growth


def configure_device(memory_limit: str | int | None = None,
                     growth: bool | None = None) -> DeviceConfig:
    """Caps this process's TensorFlow GPU memory, or turns on memory growth.

    On Keras's other backends it hands the cap over in the form that framework obeys: on
    JAX no preallocation, the cap being the share of the card in
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (``memfit share`` sets it); on PyTorch
    ``torch.cuda.set_per_process_memory_fraction``. TensorFlow is needed only on its own
    backend.

    Call it at the top of the training script, before any TensorFlow op, model or
    dataset: TensorFlow fixes its GPU configuration when it first uses the GPU. Without
    arguments it applies what ``memfit share`` set in ``$MEMFIT_GPU_MEMORY_LIMIT`` /
    ``$MEMFIT_GPU_MEMORY_GROWTH`` (nothing, when run outside it). On a machine without a
    GPU it changes nothing and says so. Calling it again with the same settings after
    TensorFlow started is fine; different settings are an error.

    Example:
        >>> import memfit
        >>> memfit.configure_device()                       # doctest: +SKIP
        >>> memfit.configure_device(memory_limit="2GiB")    # doctest: +SKIP
        >>> memfit.configure_device(growth=True)            # doctest: +SKIP

    Args:
        memory_limit: the GPU memory TensorFlow's allocator may use in this process
            (``"2GiB"``, ``"1500MB"``, bytes); TensorFlow takes whole MiB. The real use
            is higher by the per-process overhead (CUDA context, cuDNN/cuBLAS).
        growth: ``True`` to allocate GPU memory as needed instead of reserving almost
            all of it at the start.

    Returns:
        A :class:`DeviceConfig`; its ``message`` says what was done.

    Raises:
        DeviceConfigError: for a bad value (quoted), for a cap together with growth, or
            when TensorFlow has already initialised the GPU with other settings.
    """
    limit, grow, source = device_settings(memory_limit, growth)
    if source == "none":
        message = (f"configure_device: nothing to configure (no memory_limit or growth given, "
                   f"and neither ${GPU_MEMORY_LIMIT_ENV} nor ${GPU_MEMORY_GROWTH_ENV} is set)")
        log.info(message)
        return DeviceConfig(None, None, source, (), False, message)
    if source == "arguments":
        handed = os.environ.get(GPU_MEMORY_LIMIT_ENV)
        try:
            share_limit = parse_size(handed) if handed else None
        except ValueError:
            share_limit = None
        if share_limit is not None and (limit is None or limit > share_limit):
            log.warning("configure_device: memfit share gave this job a cap of %s "
                        "($%s); the arguments ask for %s: the job may be stopped for going "
                        "over its share", format_size(share_limit), GPU_MEMORY_LIMIT_ENV,
                        "no cap" if limit is None else format_size(limit))
    backend = keras_backend()
    if backend == "jax":
        return _configure_jax(limit, grow, source)
    if backend == "torch":
        return _configure_torch(limit, grow, source)
    tf = _tensorflow()
    gpus = list(tf.config.list_physical_devices("GPU"))     # does not initialise the GPU
    wanted = ("a cap of " + format_size(limit // _MIB * _MIB)) if limit is not None else \
        f"memory growth {'on' if grow else 'off'}"
    if not gpus:
        message = (f"configure_device: no GPU is visible to TensorFlow, so {wanted} does "
                   f"nothing on the CPU (CPU memory is enforced from outside: memfit share "
                   f"watches each job's RSS)")
        log.info(message)
        return DeviceConfig(limit, grow, source, (), False, message)
    names = tuple(str(getattr(g, "name", g)) for g in gpus)
    mib = None if limit is None else limit // _MIB
    for gpu in gpus:
        try:
            if mib is not None:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=mib)])
            else:
                tf.config.experimental.set_memory_growth(gpu, bool(grow))
        except RuntimeError as e:
            have_limit, have_growth = _current(tf, gpu)
            if (mib is not None and have_limit == mib) or \
                    (mib is None and have_growth is not None and have_growth == bool(grow)):
                continue                        # already so: a second call, same settings
            raise DeviceConfigError(
                f"configure_device came too late: TensorFlow has already initialised "
                f"{getattr(gpu, 'name', gpu)} and cannot apply {wanted} any more "
                f"(TensorFlow said: {e}). Call memfit.configure_device() at the top of the "
                f"script, before any TensorFlow op, model, dataset or "
                f"tf.config.list_logical_devices() call.") from None
    message = f"configure_device: {wanted} on {', '.join(names)} (from the {source})"
    log.info(message)
    return DeviceConfig(None if mib is None else mib * _MIB, grow, source, names, True,
                        message)
