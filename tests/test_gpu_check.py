"""benchmarks/gpu_check.py runs end to end on the CPU (JAX_PLATFORMS=cpu): it says that no
GPU was there and nothing was measured on a device, and exits 0, so that it runs the day one
is lent. (Its figures from an H200 are in docs/gpu.md.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_the_gpu_check_runs_on_the_cpu_and_says_it_measured_nothing(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--parts",
                           "estimate,share", "--parallel", "2", "--workdir",
                           str(tmp_path / "work"), "--out", str(out)],
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no GPU: JAX ran on the cpu, so nothing was measured on a device" in done.stdout
    assert "TensorFlow not imported" in done.stdout
    results = json.loads((out / "gpu_check.json").read_text())
    assert set(results) == {"estimate", "share"}
    panel = results["estimate"]["results"]
    assert {r["name"] for r in panel} == {"lenet", "gru", "mlp_deep"}
    # On the CPU every case has XLA's estimate and no device figure.
    assert all(r["predicted"] > r["exact"] > 0 and r["measured"] is None for r in panel)
    assert results["share"]["returncode"] == 0
    assert len(results["share"]["results"]) == 4          # the four trainings ran
    assert (out / "gpu_check.md").read_text().count("## ") == 2
