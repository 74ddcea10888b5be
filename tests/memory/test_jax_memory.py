"""Memory on Keras's JAX backend: the probe's device statistics, and MemoryMonitor,
memfit watch and memfit doctor on a small JAX training (scripts/jax_fit.py, no TensorFlow
in it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.memory.log import read_log
from memfit.memory.probe import device_stats, extended_record, jax_device_memory

SCRIPT = Path(__file__).parent / "scripts" / "jax_fit.py"
ENV = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}


class FakeDevice:
    def __init__(self, platform, index, stats):
        self.platform, self.id, self._stats = platform, index, stats

    def memory_stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def test_device_statistics_are_read_where_the_device_keeps_them():
    gpu = {"bytes_in_use": 3 << 20, "peak_bytes_in_use": 7 << 20, "bytes_limit": 16 << 30,
           "num_allocs": 12}
    devices = [FakeDevice("cpu", 0, None),                         # the CPU: no statistics
               FakeDevice("gpu", 0, gpu),
               FakeDevice("gpu", 1, {"bytes_in_use": 5}),          # no peak, no limit
               FakeDevice("tpu", 0, NotImplementedError("no stats"))]
    assert device_stats(devices) == {
        "GPU:0": {"current": 3 << 20, "peak": 7 << 20, "limit": 16 << 30},
        "GPU:1": {"current": 5, "peak": 5}}
    assert device_stats(devices[:1]) is None and device_stats([]) is None


def test_the_probe_reads_jax_only_once_jax_has_started_and_never_imports_it():
    code = ("import sys\n"
            "from memfit.memory.probe import jax_device_memory, extended_record\n"
            "assert jax_device_memory() is None and 'jax' not in sys.modules\n"
            "import jax\n"
            "assert jax_device_memory() is None        # imported, not started\n"
            "from jax._src import xla_bridge\n"
            "assert not xla_bridge.backends_are_initialized()\n"
            "jax.numpy.ones(3).block_until_ready()\n"
            "on_gpu = jax.default_backend() == 'gpu'\n"
            "stats = jax_device_memory()\n"
            "assert (stats is not None) == on_gpu, stats\n"
            "assert ('gpu' in extended_record()) == on_gpu\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "JAX_PLATFORMS": ""},
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_on_a_gpu_the_record_holds_jaxs_allocator_figures():
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("no GPU visible to JAX")
    block = jax.device_put(jax.numpy.ones((1 << 20,), "float32"), gpus[0])
    block.block_until_ready()
    stats = jax_device_memory()
    name = f"GPU:{gpus[0].id}"
    assert stats[name]["current"] >= 4 << 20 and stats[name]["peak"] >= stats[name]["current"]
    assert extended_record()["gpu"][name]["limit"] > 0


def test_memory_monitor_logs_epochs_and_a_verdict_on_jax(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--monitor", str(tmp_path)],
                          env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    records = list(read_log(tmp_path / "memory.jsonl"))
    epochs = [r for r in records if r["event"] == "epoch_end"]
    assert [r["epoch"] for r in epochs] == list(range(7))
    assert all(r["rss_anon"] > 0 for r in epochs)
    verdicts = [r for r in records if r["event"] == "verdict"]
    assert verdicts and verdicts[-1]["verdict"] == done.stdout.split()[-1]
    assert verdicts[-1]["verdict"] in ("stable", "warm-up", "allocator-retention", "leak")


def test_memfit_watch_judges_a_jax_training(tmp_path):
    done = subprocess.run([sys.executable, "-m", "memfit", "watch", "--workdir",
                           str(tmp_path), "--", sys.executable, str(SCRIPT)],
                          env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exited with code 0" in done.stderr and "verdict" in done.stderr
    assert "Traceback" not in done.stderr
    assert any(r["event"] == "sample" for r in read_log(tmp_path / "memory.jsonl"))


def test_memfit_doctor_measures_a_jax_training_without_tensorflow(tmp_path):
    done = subprocess.run([sys.executable, "-m", "memfit", "doctor", "--workdir",
                           str(tmp_path), "--json", "--", sys.executable, str(SCRIPT)],
                          env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["probe"] and report["steps"] > 0 and report["findings"] == [], report
    # The estimator traces TensorFlow graphs: it is not run inside a JAX training.
    [probe] = (tmp_path / ".doctor").glob("probe-*.json")
    assert json.loads(probe.read_text())["estimate"] is None
