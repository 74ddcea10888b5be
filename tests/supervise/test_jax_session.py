"""memfit.session on Keras's JAX backend: exact resumes, without TensorFlow in the training.

End to end, tests/supervise/scripts/jax_train.py trains on noise held in memory (NumPy
arrays given to fit with shuffle=True, or a PyDataset ordered by (seed, epoch)), with
Dropout, BatchNormalization, a metric, EarlyStopping, ReduceLROnPlateau, ModelCheckpoint,
CSVLogger, LearningRateScheduler, TerminateOnNaN and a user callback with
get_state/set_state. Uninterrupted it stops early; restarted every epoch by memfit run, or
SIGKILLed inside an epoch and started again, it must end with the same weights, history,
callback end states and CSV file, bit for bit. Every process runs with KERAS_BACKEND=jax.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import memfit

pytest.importorskip("jax")

SCRIPT = Path(__file__).parent / "scripts" / "jax_train.py"
ENV = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}


def command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), str(out), *extra]


def train(out: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(out, *extra), env={**ENV, "MEMFIT_WORKDIR": str(workdir)},
                          capture_output=True, text=True)


def outcome(out: Path) -> dict:
    with np.load(out / "final.npz") as f:
        weights = [f[k] for k in f.files]
    return {"weights": weights, "history": json.loads((out / "history.json").read_text()),
            "summary": json.loads((out / "summary.json").read_text()),
            "csv": (out / "log.csv").read_text()}


def assert_same(got: dict, want: dict) -> None:
    assert len(got["weights"]) == len(want["weights"])
    for a, b in zip(got["weights"], want["weights"], strict=True):
        assert np.array_equal(a, b), float(np.abs(a - b).max())
    assert got["history"] == want["history"]
    assert got["summary"] == want["summary"]
    assert got["csv"] == want["csv"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, dict] = {}

    def get(data: str) -> dict:
        if data not in cache:
            base = tmp_path_factory.mktemp(f"reference-{data}")
            done = train(base / "out", base / "wd", "--data", data)
            assert done.returncode == 0, done.stderr[-3000:]
            ref = cache[data] = outcome(base / "out")
            history = ref["history"]
            # The story the test needs: stopped early, the rate lowered on the plateau,
            # and no TensorFlow in a JAX training.
            assert 3 < len(history["loss"]) < 12, len(history["loss"])
            assert ref["summary"]["stopped_epoch"] == len(history["loss"]) - 1
            assert len(set(history["learning_rate"])) >= 3, history["learning_rate"]
            assert ref["summary"]["tensorflow"] is False
        return cache[data]

    return get


def test_restart_every_epoch_on_jax_is_bit_identical(reference, tmp_path, monkeypatch):
    want = reference("arrays")
    monkeypatch.setenv("KERAS_BACKEND", "jax")          # for memfit run's children
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    result = memfit.run(command(tmp_path / "out"), workdir=tmp_path / "wd",
                        restart_every=1, out=False)
    assert result.finished and result.exit_code == 0
    assert len(result.children) == len(want["history"]["loss"])    # one process an epoch
    assert_same(outcome(tmp_path / "out"), want)


@pytest.mark.parametrize("data", ["arrays", "pydataset", "memfit"])
def test_a_kill_inside_an_epoch_on_jax_resumes_exactly(reference, tmp_path, data):
    """SIGKILL after step 23 (epoch 2, step 7; the checkpoint is at step 20). The resumed
    epoch draws the same shuffle of the NumPy arrays (the session puts NumPy's generator
    back as the epoch began, then as the checkpoint left it after the skipped steps), its
    skipped steps go through JAX's (state, iterator) train function, and the metric
    states go into JAX's step state, not into variables it is about to donate."""
    want = reference(data)
    args = ("--data", data, "--checkpoint-every", "5", "--kill-at", "23")
    first = train(tmp_path / "out", tmp_path / "wd", *args)
    assert first.returncode == -9, first.stderr[-3000:]
    second = train(tmp_path / "out", tmp_path / "wd", *args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert_same(outcome(tmp_path / "out"), want)


def run_jax(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env={**ENV, **env}, capture_output=True, text=True)


def test_seeding_on_jax_does_what_keras_does_without_importing_tensorflow():
    """rng.seed_everything repeats keras.utils.set_random_seed less its TensorFlow import;
    this fails if a Keras release makes set_random_seed do more."""
    done = run_jax("""
        import random, sys
        import keras, numpy as np
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils.rng_utils import get_random_seed
        from memfit.supervise import rng

        def state():
            generator = seed_generator.global_seed_generator()
            return (random.random(), float(np.random.random()),
                    get_random_seed(),
                    np.asarray(generator.state.numpy()).tolist(),
                    float(keras.random.uniform(()).tolist()))

        rng.seed_everything(123)
        ours = state()
        assert "tensorflow" not in sys.modules, "seeding imported TensorFlow"
        global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
        keras.utils.set_random_seed(123)
        assert state() == ours, (state(), ours)
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_deterministic_on_jax_sets_xlas_flag_before_jax_starts_and_imports_no_tf(tmp_path):
    done = run_jax(f"""
        import os, sys
        import memfit
        with memfit.session({str(tmp_path)!r}, seed=1, deterministic=True, verbose=0):
            print(os.environ["XLA_FLAGS"])
        print("tensorflow" in sys.modules)
    """, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == [
        "--xla_force_host_platform_device_count=1 --xla_gpu_deterministic_ops=true", "False"]


def test_exactness_refuses_in_one_line_what_jax_cannot_resume_exactly(tmp_path):
    """A keras.distribution on JAX; deterministic=True after JAX started on a GPU (the
    refusal's wording is checked with the platform list faked: no GPU here)."""
    done = run_jax(f"""
        import keras, numpy as np
        import memfit
        from memfit.supervise import exactness
        from memfit.supervise.restart_protocol import SessionConfigError

        exactness._jax_started = lambda: (True, ["gpu"])
        try:
            memfit.session({str(tmp_path / "a")!r}, deterministic=True, verbose=0)
        except SessionConfigError as e:
            print("refused:", e)
        keras.distribution.set_distribution(keras.distribution.DataParallel())
        with memfit.session({str(tmp_path / "b")!r}, seed=1, verbose=0) as s:
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            try:
                model.fit(np.zeros((8, 4)), np.zeros((8, 1)), epochs=1, verbose=0,
                          callbacks=[s.callback])
            except SessionConfigError as e:
                print("refused:", e)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("refused:")]
    assert len(lines) == 2, done.stdout
    assert "came after JAX started its gpu backend" in lines[0]
    assert "XLA_FLAGS=--xla_gpu_deterministic_ops=true" in lines[0]
    assert "keras.distribution (DataParallel) exactly on JAX" in lines[1]
    assert not (tmp_path / "b" / "checkpoints").exists()      # refused before training
