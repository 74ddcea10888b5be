"""What each Keras backend needs for a bit-identical resume, and what a session refuses.

A session's checkpoint is the same on every backend (weights, optimizer, seed generators,
metric states, the position, the callbacks' state); what differs is how the backend is
made deterministic, and what it cannot resume exactly:

- **TensorFlow**: ``deterministic=True`` turns on op determinism
  (``tf.config.experimental.enable_op_determinism``).
- **JAX**: on the CPU XLA's results do not depend on scheduling; on a GPU they do unless
  ``XLA_FLAGS`` holds ``--xla_gpu_deterministic_ops=true`` when JAX starts its backend.
  ``deterministic=True`` adds it to ``XLA_FLAGS`` when JAX has not started yet (no array
  made, no device listed), and is refused once it has on a GPU without it: XLA would
  not read it any more. TensorFlow is not imported.
- A training under ``keras.distribution`` (JAX's ``DataParallel``/``ModelParallel``) is
  refused on JAX: its variables are laid out across devices, and a checkpoint put back
  into them is not shown to resume bit-identically.

Example:
    >>> with_determinism_flag("--xla_cpu_enable_fast_math=false")
    '--xla_cpu_enable_fast_math=false --xla_gpu_deterministic_ops=true'
    >>> with_determinism_flag("--xla_gpu_deterministic_ops=true")
    '--xla_gpu_deterministic_ops=true'
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["enable_determinism", "refusal", "with_determinism_flag", "XLA_FLAGS_ENV",
           "DETERMINISM_FLAG"]

XLA_FLAGS_ENV = "XLA_FLAGS"
DETERMINISM_FLAG = "--xla_gpu_deterministic_ops=true"


def with_determinism_flag(flags: str) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with XLA's GPU determinism flag in it."""
    if "--xla_gpu_deterministic_ops" in flags:
        return flags
    return f"{flags} {DETERMINISM_FLAG}".strip()


def _jax_started() -> tuple[bool, list[str]]:
    """Whether JAX has started its backends, and the platforms it started."""
    try:
        from jax._src import xla_bridge
    except ImportError:             # no JAX (or one without it): nothing to set
        return True, []
    if not xla_bridge.backends_are_initialized():
        return False, []
    import jax

    return True, sorted({d.platform for d in jax.devices()})


def enable_determinism(backend: str) -> str | None:
    """Makes the backend's computations deterministic. Returns why it cannot, in one
    line (the session raises it), or ``None``.

    Args:
        backend: ``keras.backend.backend()``.
    """
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
        return None
    if backend != "jax":
        return None
    flags = os.environ.get(XLA_FLAGS_ENV, "")
    started, platforms = _jax_started()
    if not started:
        os.environ[XLA_FLAGS_ENV] = with_determinism_flag(flags)
        return None
    if "--xla_gpu_deterministic_ops" in flags or not set(platforms) - {"cpu"}:
        return None
    return (f"memfit.session(deterministic=True) came after JAX started its "
            f"{'/'.join(platforms)} backend, which reads XLA's determinism flag once, at "
            f"its start: create the session before the first JAX array, model or device "
            f"query, or start Python with {XLA_FLAGS_ENV}={DETERMINISM_FLAG}.")


def refusal(backend: str) -> str | None:
    """Why a training on ``backend`` cannot be resumed exactly, in one line, or ``None``.

    Args:
        backend: ``keras.backend.backend()``.
    """
    if backend != "jax":
        return None
    import keras

    distribution: Any = keras.distribution.distribution()
    if distribution is not None:
        return (f"memfit.session cannot resume a training under keras.distribution "
                f"({type(distribution).__name__}) exactly on JAX: its variables are laid "
                f"out across devices and a restored checkpoint is not shown to continue "
                f"bit-identically. Train without a distribution, or on the TensorFlow "
                f"backend.")
    return None
