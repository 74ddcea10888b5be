"""The estimate tests use their own calibration cache (MEMFIT_CACHE_DIR), never the
user's: a CPU calibration of the default value is cached there once per session, so
that no test measures the baseline unless it means to (see test_calibrate.py)."""

import platform
import time

import pytest

from memfit.env import CACHE_ENV
from memfit.estimate.baseline import (
    DEFAULT_BASELINE,
    Calibration,
    save_calibration,
)


@pytest.fixture(scope="session")
def calibrated_cache(tmp_path_factory):
    """A cache directory holding a CPU calibration of :data:`DEFAULT_BASELINE`."""
    import os

    directory = tmp_path_factory.mktemp("memfit-cache")
    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(directory)
    try:
        save_calibration(Calibration(
            device="cpu", baseline=DEFAULT_BASELINE["cpu"],
            host_baseline=DEFAULT_BASELINE["cpu"], interpreter=12 * 2**20, tensorflow="test",
            keras="test", host=platform.node(), runs=1, measured_at=time.time()))
    finally:
        if previous is None:
            os.environ.pop(CACHE_ENV)
        else:
            os.environ[CACHE_ENV] = previous
    return directory


@pytest.fixture(autouse=True)
def _own_calibration_cache(calibrated_cache, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(calibrated_cache))
