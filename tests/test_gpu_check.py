"""benchmarks/gpu_check.py runs end to end on the CPU (JAX_PLATFORMS=cpu): it says that no
GPU was there and nothing was measured, and exits 0, so that it runs the day one is lent."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_the_gpu_check_runs_on_the_cpu_and_says_it_measured_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "1", "--width", "64",
                           "--workdir", str(tmp_path)],
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no GPU: JAX ran on cpu, so nothing was measured" in done.stdout
    assert "TensorFlow imported by 0 of 2 trainings" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 0 ")
            or line.startswith("| 1 ")]
    assert len(rows) == 2, done.stdout
    assert (tmp_path / "job0-wd" / "memory.jsonl").exists()      # MemoryMonitor's log
