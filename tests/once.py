"""Things the tests make once per session and share across modules and pytest workers.

An uninterrupted reference training (a TensorFlow process: several CPU-seconds of import
alone) that two test modules compare with used to run once in each, and with
pytest-xdist's ``--dist loadfile`` once per worker; :func:`shared` makes it once per
session, whichever worker asks first, and the others wait for it and read the same files.
Only for what is deterministic and read, never written, by the tests that share it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def shared(tmp_path_factory: pytest.TempPathFactory, name: str,
           make: Callable[[Path], None]) -> Path:
    """The directory ``name``, made by ``make(path)`` once in this pytest session.

    ``make`` writes into a temporary directory, renamed to ``name`` once it returned (a
    failed ``make`` leaves nothing; the next caller tries again). A lock file serializes
    the workers of one session; their common base directory is the parent of each
    worker's own temporary directory."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent              # pytest-N/, above popen-gw0/ and popen-gw1/
    root = base / "shared"
    root.mkdir(exist_ok=True)
    done = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            partial = root / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            make(partial)
            partial.rename(done)
    return done
