"""Every environment variable memfit hands to the processes it starts, in one place.

A supervisor (``memfit run``, ``memfit share``, ``memfit doctor``) talks to the training
process it starts through these variables; the training side (``memfit.session``,
``MemoryMonitor``, ``memfit.configure_device``, the doctor's probe) reads them. Both
sides import the names from here, never spell them out.

The integers among them are read with :func:`env_int`, one rule for every reader.

Example:
    >>> WORKDIR_ENV
    'MEMFIT_WORKDIR'
    >>> env_int("MEMFIT_NO_SUCH_VARIABLE") is None
    True
"""

import os

from memfit.errors import MemfitError

__all__ = ["env_int", "EnvError", "WORKDIR_ENV", "SUPERVISOR_ENV", "RESTART_EVERY_ENV",
           "MAX_RSS_ENV",
           "GPU_MEMORY_LIMIT_ENV", "GPU_MEMORY_GROWTH_ENV", "SHARE_JOB_ENV", "SHARE_ENV",
           "CACHE_ENV", "DOCTOR_ENV", "DOCTOR_HOOK_ENV", "DOCTOR_DIR_ENV", "DOCTOR_RUN_ENV",
           "DOCTOR_STEPS_ENV", "DOCTOR_SECONDS_ENV", "DOCTOR_EPOCHS_ENV"]

# memfit run / watch / share -> the training process
WORKDIR_ENV = "MEMFIT_WORKDIR"                  # the workdir its supervisor chose
SUPERVISOR_ENV = "MEMFIT_SUPERVISOR"            # set: a supervisor restarts on exit 75
RESTART_EVERY_ENV = "MEMFIT_RESTART_EVERY"      # --restart-every N epochs
MAX_RSS_ENV = "MEMFIT_MAX_RSS"                  # --max-rss, in bytes

# memfit share -> a job
GPU_MEMORY_LIMIT_ENV = "MEMFIT_GPU_MEMORY_LIMIT"    # the per-process GPU cap (bytes or size)
GPU_MEMORY_GROWTH_ENV = "MEMFIT_GPU_MEMORY_GROWTH"  # 1/true/yes: allocate as needed
SHARE_JOB_ENV = "MEMFIT_SHARE_JOB"              # the job's name
SHARE_ENV = "MEMFIT_SHARE"                      # the job's share, in bytes

# the user -> memfit estimate / calibrate
CACHE_ENV = "MEMFIT_CACHE_DIR"                  # where the calibrated baseline is kept

# memfit doctor -> the probe inside the command
DOCTOR_ENV = "MEMFIT_DOCTOR"                    # 1: the sitecustomize shim loads the probe
DOCTOR_HOOK_ENV = "MEMFIT_DOCTOR_HOOK"          # the path of memfit.doctor.hook
DOCTOR_DIR_ENV = "MEMFIT_DOCTOR_DIR"            # where the probe writes its results
DOCTOR_RUN_ENV = "MEMFIT_DOCTOR_RUN"            # this run's id
DOCTOR_STEPS_ENV = "MEMFIT_DOCTOR_STEPS"        # stop after this many steps
DOCTOR_SECONDS_ENV = "MEMFIT_DOCTOR_SECONDS"    # ... or seconds after the start
DOCTOR_EPOCHS_ENV = "MEMFIT_DOCTOR_EPOCHS"      # ... or epoch ends over all fit() calls


class EnvError(MemfitError, ValueError):
    """A variable memfit hands to the processes it starts holds what memfit never writes."""


def env_int(name: str) -> int | None:
    """The integer in the environment variable ``name``; ``None`` when it is unset or empty.

    Example:
        >>> os.environ["MEMFIT_EXAMPLE"] = "12"
        >>> env_int("MEMFIT_EXAMPLE")
        12
        >>> os.environ["MEMFIT_EXAMPLE"] = "twelve"
        >>> try:
        ...     env_int("MEMFIT_EXAMPLE")
        ... except EnvError as e:
        ...     print(str(e)[-33:])
        Received: MEMFIT_EXAMPLE='twelve'
        >>> del os.environ["MEMFIT_EXAMPLE"]

    Args:
        name: the variable (one of the names above).

    Raises:
        EnvError: it is set to something that is not an integer, quoting it.
    """
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"${name} must be an integer, as the memfit process that started "
                       f"this one sets it. Received: {name}={raw!r}") from None
