"""Putting the probe into the command without editing it: a ``sitecustomize.py`` shim.

Python imports a module named ``sitecustomize`` at start-up, from the first directory on
``sys.path`` that has one; ``$PYTHONPATH`` comes first. :func:`prepare` writes a small
``sitecustomize.py`` into ``WORKDIR/.doctor/site/`` and :func:`environment` returns the
variables that put that directory first on ``$PYTHONPATH`` and tell the probe what to do:

    MEMFIT_DOCTOR          ``1``: the shim does nothing without it
    MEMFIT_DOCTOR_HOOK     the path of :mod:`memfit.doctor.hook` (loaded by path)
    MEMFIT_DOCTOR_DIR      where the probe writes ``probe-RUN-PID.json``
    MEMFIT_DOCTOR_RUN      this run's id (so that old results are never read)
    MEMFIT_DOCTOR_STEPS    stop training after this many steps, or
    MEMFIT_DOCTOR_SECONDS  ... this many seconds after the process started (or sooner:
                           ``MEMFIT_DOCTOR_EPOCHS`` epoch ends over all fit() calls)

The names come from :mod:`memfit.env`. The shim runs at the start of every Python process
of the command, before its script, so it imports nothing but the standard library
(``import memfit`` would load NumPy into every process): its text is written with the
names filled in, and it hands the hook the time limit it read.

The shim then imports the ``sitecustomize`` that would have been imported without it
(a virtual environment's, a distribution's), so nothing the user had is lost. Python
started with ``-S``, ``-I`` or ``-E`` ignores ``$PYTHONPATH``: the probe is then absent
and only the outside view (the process tree's memory) is diagnosed.

Example:
    >>> import tempfile
    >>> site_dir = prepare(tempfile.mkdtemp())
    >>> (site_dir / "sitecustomize.py").exists()
    True
    >>> environment(site_dir, tempfile.mkdtemp(), "r1", steps=10)[DOCTOR_STEPS_ENV]
    '10'
"""

from __future__ import annotations

import os
from pathlib import Path

from memfit.atomic import write_text_atomic
from memfit.env import (
    DOCTOR_DIR_ENV,
    DOCTOR_ENV,
    DOCTOR_EPOCHS_ENV,
    DOCTOR_HOOK_ENV,
    DOCTOR_RUN_ENV,
    DOCTOR_SECONDS_ENV,
    DOCTOR_STEPS_ENV,
)

__all__ = ["prepare", "environment", "SHIM"]

# The shim's text, with the variables' names filled in below (see the module docstring).
_SHIM_TEMPLATE = '''\
"""Written by `memfit doctor`: loads memfit's probe into this Python process when
${doctor} is set, then runs the sitecustomize that was there before (if any)."""
import os as _os
import sys as _sys


def _memfit_doctor_site():
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    hook = _os.environ.get({hook!r})
    if _os.environ.get({doctor!r}) and hook:
        try:
            spec = importlib.util.spec_from_file_location("_memfit_doctor_hook", hook)
            module = importlib.util.module_from_spec(spec)
            _sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            module.install(_os.environ.get({seconds!r}))
        except Exception as e:
            _sys.stderr.write("memfit doctor: the probe did not load (%s: %s)\\n"
                              % (type(e).__name__, e))
    path = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_memfit_doctor_site()
del _memfit_doctor_site
'''
SHIM = _SHIM_TEMPLATE.format(doctor=DOCTOR_ENV, hook=DOCTOR_HOOK_ENV, seconds=DOCTOR_SECONDS_ENV)


def prepare(workdir: str | os.PathLike) -> Path:
    """Writes the shim into ``WORKDIR/.doctor/site/`` and returns that directory.

    Args:
        workdir: the doctor's workdir (it must exist and be writable).
    """
    site_dir = Path(workdir) / ".doctor" / "site"
    site_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(site_dir / "sitecustomize.py", SHIM)
    return site_dir


def environment(site_dir: str | os.PathLike, results_dir: str | os.PathLike, run_id: str, *,
                steps: int | None = None, seconds: float | None = None,
                epochs: int | None = None) -> dict[str, str]:
    """The variables to add to the command's environment (see the module docstring).

    Args:
        site_dir: the directory :func:`prepare` returned.
        results_dir: where the probe writes its results.
        run_id: this run's id.
        steps: training steps after which the probe stops the command.
        seconds: or seconds after the start after which it does.
        epochs: or epoch ends, over all ``fit`` calls, after which it does.
    """
    from memfit.doctor import hook

    previous = os.environ.get("PYTHONPATH")
    env = {"PYTHONPATH": os.fspath(site_dir) + (os.pathsep + previous if previous else ""),
           DOCTOR_ENV: "1", DOCTOR_HOOK_ENV: os.path.abspath(hook.__file__),
           DOCTOR_DIR_ENV: os.fspath(results_dir), DOCTOR_RUN_ENV: run_id}
    if steps is not None:
        env[DOCTOR_STEPS_ENV] = str(steps)
    if seconds is not None:
        env[DOCTOR_SECONDS_ENV] = repr(float(seconds))
    if epochs is not None:
        env[DOCTOR_EPOCHS_ENV] = str(epochs)
    return env
