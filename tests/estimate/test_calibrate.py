"""`memfit calibrate`: measured once per machine, cached atomically, used by the estimate."""

import json

import pytest

from memfit.cli import main
from memfit.env import CACHE_ENV
from memfit.errors import MemfitError
from memfit.estimate import calibrate, framework_baseline, load_calibration
from memfit.estimate.baseline import DEFAULT_BASELINE, cache_path, check_device


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)       # the XDG location, as users have it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_calibrate_caches_the_cpu_baseline(cache_home, capsys):
    assert framework_baseline("cpu") == (DEFAULT_BASELINE["cpu"], "default")
    assert main(["calibrate", "--runs", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "cpu" and out["cache"] == str(cache_home / "memfit" /
                                                          "calibration.json")
    # TensorFlow + Keras imported: far more than the bare interpreter.
    assert out["baseline"] > out["interpreter"] + 50 * 2**20
    cached = load_calibration("cpu")
    assert cached is not None and cached.baseline == out["baseline"]
    assert framework_baseline("cpu") == (out["baseline"], "calibrated")
    assert not list(cache_path().parent.glob(".tmp-*"))       # written atomically
    assert main(["calibrate", "--show"]) == 0
    assert "cpu baseline" in capsys.readouterr().out


def test_a_damaged_cache_is_ignored(cache_home):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text("{not json")
    assert load_calibration("cpu") is None
    assert framework_baseline("cpu")[1] == "default"


def test_devices_are_checked():
    assert check_device("gpu") == "gpu:0" and check_device("CPU") == "cpu"
    with pytest.raises(MemfitError, match="device='tpu'"):
        check_device("tpu")


def test_gpu_calibration_without_a_gpu_is_a_clear_error(cache_home):
    from memfit.memory.probe import nvml_memory

    if nvml_memory() is not None:            # pragma: no cover - a GPU machine
        pytest.skip("a GPU is here: the GPU path is exercised for real")
    with pytest.raises(MemfitError, match="Calibrate with --device cpu"):
        calibrate("gpu:0", runs=1, cache=False)
    assert load_calibration("gpu:0") is None


def test_a_gpu_baseline_is_measured_with_memory_growth(monkeypatch):
    # Without growth TensorFlow's first GPU op reserves most of the card, and NVML would
    # report that as the framework's baseline. Here (no GPU) the op falls back to the CPU.
    from memfit import device
    from memfit.estimate import child

    calls = []
    monkeypatch.setattr(device, "configure_device", lambda **kw: calls.append(kw))
    out = child._framework_baseline("gpu:0")
    assert calls == [{"growth": True}] and out["device"] == "gpu:0"
    calls.clear()
    child._framework_baseline("cpu")
    assert calls == []
