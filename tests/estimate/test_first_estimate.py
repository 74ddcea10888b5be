"""The first estimate on a machine: it measures the framework baseline once (caching it,
saying so in one line) and shows no TensorFlow start-up lines unless --verbose."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.env import CACHE_ENV
from memfit.estimate import baseline
from memfit.estimate.baseline import (
    DEFAULT_BASELINE,
    Calibration,
    CalibrationError,
    cache_path,
    ensure_calibration,
    framework_baseline,
)
from memfit.quiet import is_noise

ROOT = Path(__file__).resolve().parents[2]
NOISE_MARKS = ("All log messages before absl::InitializeLog", "oneDNN custom operations",
               "Could not find cuda drivers", "failed call to cuInit")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake(device="cpu", value=218 * 2**20):
    return Calibration(device=device, baseline=value, host_baseline=value, interpreter=2**24,
                       tensorflow="x", keras="x", host="h", runs=1, measured_at=0.0)


def test_nothing_cached_is_measured_once_and_said_in_one_line(empty_cache, monkeypatch,
                                                              caplog):
    runs = []
    monkeypatch.setattr(baseline, "calibrate",
                        lambda device, **kw: runs.append(kw) or fake(device))
    caplog.set_level(logging.INFO, logger="memfit")
    assert cache_path() == empty_cache / "calibration.json"
    assert framework_baseline("cpu") == (DEFAULT_BASELINE["cpu"], "default")
    assert ensure_calibration("cpu") == (218 * 2**20, "calibrated")
    assert [r.getMessage() for r in caplog.records] == [
        f"memfit: measured this machine's TensorFlow baseline once: 218.0 MiB (cached in "
        f"{empty_cache / 'calibration.json'}; `memfit calibrate` to redo it)"]
    assert runs == [{"runs": 1, "cache": False}]
    assert caplog.records[0].levelno == logging.WARNING     # seen without logging set up
    caplog.clear()
    assert ensure_calibration("cpu") == (218 * 2**20, "calibrated")     # cached: silent
    assert framework_baseline("cpu") == (218 * 2**20, "calibrated")
    assert runs == [{"runs": 1, "cache": False}] and not caplog.records


def test_a_failed_measurement_keeps_the_default_and_says_why(empty_cache, monkeypatch, caplog):
    def fails(device, **kw):
        raise CalibrationError("The calibration child failed (crashed): boom")

    monkeypatch.setattr(baseline, "calibrate", fails)
    assert ensure_calibration("cpu") == (DEFAULT_BASELINE["cpu"], "default")
    assert "using the default 220.0 MiB: run `memfit calibrate` to measure it" in caplog.text
    assert "boom" in caplog.text and not cache_path().exists()


def test_an_unwritable_cache_still_uses_the_measurement(tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(baseline, "calibrate", lambda device, **kw: fake(device))
    caplog.set_level(logging.INFO, logger="memfit")
    assert ensure_calibration("cpu") == (218 * 2**20, "calibrated")
    assert f"not cached: {str(tmp_path / 'file' / 'cache')!r} is not writable, set " \
           f"{CACHE_ENV}" in caplog.text


def test_a_gpu_estimate_without_a_gpu_here_keeps_the_default_and_says_so(empty_cache,
                                                                         monkeypatch, caplog):
    """An estimate for another machine's GPU is allowed, but not silently: one line says
    the GPU is not here, which baseline is used, and what to do."""
    monkeypatch.setattr(baseline, "calibrate", lambda *a, **kw: pytest.fail("measured"))
    for seen, device, said in (([], "gpu:0", "NVML sees no GPU"),
                               (None, "gpu:0", "NVML, the nvidia-ml-py package"),
                               ([{"index": 0}], "gpu:1", "NVML sees one: gpu:0")):
        monkeypatch.setattr(baseline, "nvml_devices", lambda seen=seen: seen)
        caplog.clear()
        assert ensure_calibration(device) == (DEFAULT_BASELINE["gpu"], "default")
        [line] = [r.getMessage() for r in caplog.records]
        assert line.startswith(f"memfit: {device} is not a GPU this machine has ({said}")
        assert "the default GPU baseline, 600.0 MiB" in line and "(--device cpu)" in line
        assert f"`memfit calibrate --device {device}` on the machine with that GPU" in line


def test_the_cli_says_the_gpu_note_its_own_way(tmp_path):
    """The same note from `memfit estimate --device gpu:0` names the option the command
    line's way first; the library's record is not rewritten for other handlers. (The note is
    about the device, not the model: the smallest model says it as well as MobileNetV3,
    which took 40 s more to estimate here.)"""
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    r = memfit("estimate", "tests.estimate.models:tiny", "-b", "2", "--device", "gpu:0",
               env=env)
    assert r.returncode in (0, 3), r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if "is not a GPU this machine has" in ln]
    assert "Give --device cpu (device='cpu' in Python) to estimate for this machine" in line


def memfit(*argv, env):
    return subprocess.run([sys.executable, "-m", "memfit", *argv], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)


def test_estimate_is_calibrated_and_quiet_and_verbose_shows_tensorflow(tmp_path):
    # As a user on a fresh machine runs it: TF_CPP_MIN_LOG_LEVEL unset, nothing cached.
    # One real calibration (one child process), then cached.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env[CACHE_ENV] = str(tmp_path / "cache")
    argv = ("estimate", "tests.estimate.models:tiny", "-b", "2")
    first = memfit(*argv, env=env)
    assert first.returncode == 0, first.stderr
    assert "framework baseline (calibrated)" in first.stdout
    lines = first.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "memfit: measured this machine's TensorFlow baseline once: ")
    assert lines[0].endswith(f"(cached in {tmp_path / 'cache' / 'calibration.json'}; "
                             f"`memfit calibrate` to redo it)")
    assert not any(mark in first.stderr + first.stdout for mark in NOISE_MARKS)
    verbose = memfit(*argv, "--verbose", env=env)
    assert verbose.returncode == 0 and verbose.stdout == first.stdout
    assert NOISE_MARKS[0] in verbose.stderr                          # TensorFlow's lines
    assert any(is_noise(line) for line in verbose.stderr.splitlines() if NOISE_MARKS[0]
               not in line)
    assert "measured this machine's" not in verbose.stderr           # cached now


def test_the_python_api_is_quiet_too(tmp_path):
    # memfit.estimate_memory() in a user's script: no start-up lines when memfit imports
    # TensorFlow, and none of the graph optimizer's lines when the script imported it
    # first (its own `import tensorflow` lines are the script's, left as they are).
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env[CACHE_ENV] = str(tmp_path / "cache")
    call = "import memfit; print(memfit.estimate_memory('tests.estimate.models:tiny', 2).total > 0)"
    for first in ("", "import tensorflow; "):
        out = subprocess.run([sys.executable, "-c", first + call], capture_output=True,
                             text=True, cwd=ROOT, env=env, timeout=600)
        assert out.returncode == 0 and out.stdout == "True\n", out.stderr[-2000:]
        ours = [line for line in out.stderr.splitlines()
                if not (first and any(m in line for m in NOISE_MARKS[:3]))
                and "cpu_feature_guard" not in line and "To enable the following" not in line]
        assert not any(is_noise(line) for line in ours), ours
        assert "Starting new session" not in out.stderr and "cuInit" not in out.stderr
