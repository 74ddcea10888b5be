"""memfit estimate under KERAS_BACKEND=jax: one line saying to run it on TensorFlow."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")


def test_the_estimate_on_jax_is_refused_in_one_line_with_exit_2():
    done = subprocess.run([sys.executable, "-m", "memfit", "estimate", "models:tiny",
                           "--batch-size", "8"], cwd=Path(__file__).parent,
                          env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": ""},
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines                  # no traceback, no JAX start-up line
    assert "Keras runs on the jax backend" in lines[0]
    assert "KERAS_BACKEND=tensorflow" in lines[0]
