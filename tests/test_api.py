"""The public API: ``memfit.estimate``, ``memfit.share`` and ``memfit.doctor`` are plain
functions, and stay so whatever else is imported; importing memfit starts no TensorFlow."""

import subprocess
import sys


def test_the_entry_points_are_functions_after_any_import():
    code = """
import inspect, sys
import memfit
import memfit.estimate.search, memfit.share.planner, memfit.doctor.findings
from memfit.estimate import Estimator
from memfit import share as sharing
for f in (memfit.estimate, memfit.share, memfit.doctor, sharing):
    assert inspect.isfunction(f), f
assert Estimator.__module__ == "memfit.estimate.estimator"
assert memfit.estimate.__module__ == "memfit.estimate.estimator"
assert "tensorflow" not in sys.modules and "keras" not in sys.modules
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_every_public_name_resolves():
    import memfit

    lazy = ("dataset", "DatasetPlan", "session", "MemoryMonitor")   # they import Keras
    missing = [n for n in memfit.__all__ if n not in lazy and getattr(memfit, n, None) is None]
    assert not missing
