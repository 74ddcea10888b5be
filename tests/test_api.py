"""The public API: ``memfit.estimate_memory``, ``memfit.share_jobs`` and
``memfit.run_doctor`` are plain functions; ``memfit.estimate``, ``memfit.share`` and
``memfit.doctor`` are the packages, still callable as the old functions for one release with
a DeprecationWarning; importing memfit starts no TensorFlow."""

import subprocess
import sys


def test_the_entry_points_are_functions_and_the_packages_are_packages():
    code = """
import inspect, sys, types, warnings
import memfit
import memfit.estimate.search, memfit.share.planner, memfit.doctor.findings
import memfit.estimate as e
from memfit.estimate import Estimator
from memfit import share as sharing
for f in (memfit.estimate_memory, memfit.share_jobs, memfit.run_doctor):
    assert inspect.isfunction(f), f
for m in (memfit.estimate, memfit.share, memfit.doctor, e, sharing):
    assert isinstance(m, types.ModuleType) and m is sys.modules[m.__name__], m
assert e.Estimator is Estimator and Estimator.__module__ == "memfit.estimate.estimator"
assert memfit.estimate_memory.__module__ == "memfit.estimate.estimator"
assert "tensorflow" not in sys.modules and "keras" not in sys.modules
# the old spelling: a call of the package runs the function, and warns once per call
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        memfit.share("no-such-jobs.toml", budget="1GiB")
    except Exception as exc:
        err = exc
try:
    memfit.share_jobs("no-such-jobs.toml", budget="1GiB")
except Exception as exc:
    assert type(exc) is type(err) and str(exc) == str(err), (exc, err)
[w] = caught
assert w.category is DeprecationWarning, w
assert "memfit.share(...) is deprecated" in str(w.message), w.message
assert "memfit.share_jobs(...)" in str(w.message), w.message
assert w.filename == "<string>", w.filename      # points at the caller's line
assert callable(memfit.estimate) and callable(memfit.doctor)
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
