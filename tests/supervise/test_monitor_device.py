"""MemoryMonitor's device verdict, judged on series measured on an NVIDIA H200 through Keras
on JAX (benchmarks/gpu_check.py, 2026-12-04): the allocator's bytes in use and NVML's memory
of the process at each of 8 epoch ends, in MiB. A leak grows the bytes in use; a churn of
growing temporaries grows only NVML's figure (JAX's pool keeps what it grew to)."""

import json

import pytest

from memfit import MemoryMonitor
from memfit.memory.log import read_log

MIB = 2**20
MEASURED = {   # (bytes in use, NVML per process), MiB, at epoch ends
    "leak": ([1616, 2640, 3664, 4688, 5712, 6736, 7760, 8784],
             [2670, 4718, 4718, 8814, 8814, 8814, 8814, 17006]),
    "level": ([4688] * 8, [5742] * 8),
    "churn": ([592] * 8, [2670, 4718, 8814, 8814, 17006, 17006, 17006, 17006]),
}
EXPECTED = {"leak": "leak", "level": "stable", "churn": "allocator-retention"}


def _judge(tmp_path, in_use, held):
    monitor = MemoryMonitor(tmp_path, verbose=0)
    monitor.on_train_begin()
    for epoch, (used, nvml) in enumerate(zip(in_use, held, strict=True)):
        record = {"gpu": {"GPU:0": {"current": used * MIB, "peak": used * MIB}}}
        if nvml is not None:
            record["nvml"] = nvml * MIB
        monitor.log.write("epoch_end", epoch=epoch, rss=1, **record)
        monitor._device_epoch(record, epoch)
    monitor.log.close()
    return monitor


@pytest.mark.parametrize("case", sorted(MEASURED))
def test_the_device_verdict_on_series_measured_on_a_gpu(tmp_path, case):
    in_use, held = MEASURED[case]
    monitor = _judge(tmp_path, in_use, held)
    assert monitor.device_verdict.kind == EXPECTED[case]
    logged = [r for r in read_log(monitor.log_path) if r.get("event") == "verdict"]
    assert all(r["scope"] == "device" for r in logged)
    if case != "level":
        assert logged[-1]["verdict"] == EXPECTED[case]
        assert "JAX" in logged[-1]["explanation"] or "device" in logged[-1]["explanation"]


def test_without_nvml_the_bytes_in_use_alone_judge(tmp_path):
    in_use, _ = MEASURED["leak"]
    assert _judge(tmp_path, in_use, [None] * 8).device_verdict.kind == "leak"
    in_use, _ = MEASURED["churn"]
    assert _judge(tmp_path, in_use, [None] * 8).device_verdict.kind == "stable"


def test_no_device_figures_no_device_verdict(tmp_path):
    monitor = MemoryMonitor(tmp_path, verbose=0)
    monitor.on_train_begin()
    monitor._device_epoch({"rss": 1}, 0)
    assert monitor.device_verdict is None and monitor.device_in_use == []
    json.dumps(monitor.device_held)
