"""memfit.quiet: TensorFlow's start-up lines filtered by what they say, nothing else."""

import os
import sys
import warnings

import numpy as np
import pytest

from memfit import quiet
from memfit.memory import process
from memfit.quiet import FilteredPopen, LineFilter, is_noise, quieted, strip_noise

# As TensorFlow 2.21 prints them on this machine (no GPU), in order.
STARTUP = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796135732.561436   21952 port.cc:153] oneDNN custom operations are on. You may \
see slightly different numerical results due to floating-point round-off errors from \
different computation orders. To turn them off, set the environment variable \
`TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1796135732.561688   21952 cudart_stub.cc:31] Could not find cuda drivers on your \
machine, GPU will not be used.
I0000 00:00:1796135732.647923   21952 cpu_feature_guard.cc:227] This TensorFlow binary is \
optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI FMA, in \
other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1796135735.855504   21952 cuda_platform.cc:52] failed call to cuInit: INTERNAL: \
CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I0000 00:00:1796135816.346990   22985 devices.cc:67] Number of eligible GPUs (core count >= \
8, compute capability >= 0.0): 0
I0000 00:00:1796135816.347236   22985 single_machine.cc:376] Starting new session
2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not \
find cuda drivers on your machine, GPU will not be used.
"""
KEPT = """\
Epoch 1/2
W0000 00:00:1796135816.347236   22985 bfc_allocator.cc:501] Allocator (cpu) ran out of memory
E0000 00:00:1796135816.347236   22985 some_op.cc:12] a real error
Information: I keep this
"""


def test_every_startup_line_is_noise_and_nothing_else():
    assert all(is_noise(line) for line in STARTUP.splitlines())
    assert not any(is_noise(line) for line in KEPT.splitlines())
    mixed = "".join(a + b for a, b in zip(STARTUP.splitlines(True), KEPT.splitlines(True),
                                          strict=False))
    assert strip_noise(mixed) == KEPT


def test_the_tfrecord_readers_first_line_is_noise_and_its_errors_are_not():
    tfrecord = ("I0000 00:00:1796607337.122145   18742 tf_record_dataset_op.cc:390] "
                "TFRecordDataset `buffer_size` is unspecified, default to 262144",
                "I0000 00:00:1796607305.684049   18102 tf_record_dataset_op.cc:396] The default "
                "buffer size is 262144, which is overridden by the user specified "
                "`buffer_size` of 262144")
    assert all(is_noise(line) for line in tfrecord)
    assert not is_noise("W0000 00:00:1796607305.684049   18102 tf_record_dataset_op.cc:401] "
                        "DATA_LOSS: corrupted record at 12")


def test_the_line_filter_passes_progress_at_once_and_holds_what_may_be_noise():
    f = LineFilter()
    assert f.feed(b"\r 10%|#") == b"\r 10%|#" and not f.pending   # a progress bar: at once
    assert f.feed(b"#\r 20%|##\n") == b"#\r 20%|##\n"
    # a line written in two parts waits for its end: the other stream's line is not
    # spliced into it (a stranger's "memfit: resuming ... (seed 7)Epoch 2/20")
    assert f.feed(b"memfit: resuming from ckpt-000000 (seed 7)") == b"" and f.pending
    assert f.feed(b"\n") == b"memfit: resuming from ckpt-000000 (seed 7)\n"
    mixed = "".join(a + b for a, b in zip(STARTUP.splitlines(True), KEPT.splitlines(True),
                                          strict=False)).encode()
    out = b"".join(f.feed(mixed[i:i + 7]) for i in range(0, len(mixed), 7))
    assert out + f.flush() == KEPT.encode()                      # in 7-byte pieces
    assert f.feed(b"I0000 00:00:1.2 ") == b"" and f.pending       # held: may be noise
    assert f.flush() == b"I0000 00:00:1.2 " and f.feed(b"x\n") == b"x\n"


CHILD = ("import sys\n"
         f"sys.stderr.write({STARTUP!r})\n"
         "sys.stderr.write('user error line\\n'); sys.stderr.flush()\n"
         "print('user output', flush=True)\n")


def test_a_filtered_child_keeps_its_output_and_loses_the_startup_lines(tmp_path):
    err = tmp_path / "err.txt"
    with open(err, "wb") as f:
        proc = FilteredPopen([sys.executable, "-c", CHILD], stderr=f,
                             stdout=open(tmp_path / "out.txt", "wb"))
    assert proc.wait() == 0 and proc.stderr is None
    assert err.read_text() == "user error line\n"     # all there once wait() returned
    assert (tmp_path / "out.txt").read_text() == "user output\n"


def test_start_filters_only_inside_quieted(tmp_path):
    def run() -> str:
        with open(tmp_path / "err.txt", "wb") as f:
            assert process.start([sys.executable, "-c", CHILD], {}, stderr=f).wait() == 0
        return (tmp_path / "err.txt").read_text()

    assert STARTUP in run()                       # memfit watch, library calls: unchanged
    with quieted():
        assert quiet.filters_children()
        assert run() == "user error line\n"
        level = process.start([sys.executable, "-c", "import os; print(os.environ.get("
                               "'TF_CPP_MIN_LOG_LEVEL'))"], {}, stdout=open(tmp_path / "env", "wb"))
        assert level.wait() == 0               # the environment is not changed
        assert (tmp_path / "env").read_text().strip() == str(os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
    with quieted(False):                          # --verbose
        assert STARTUP in run()
    assert not quiet.filters_children()


def test_memfit_datasets_do_not_trigger_kerass_shuffle_warning(tmp_path):
    import keras

    import memfit

    rng = np.random.default_rng(0)
    memfit.pack({"x": rng.random((64, 4), dtype=np.float32),
                 "y": rng.random((64, 1), dtype=np.float32)}, tmp_path / "ds")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = memfit.dataset(tmp_path / "ds", 16, features=("x", "y"))
        model.fit(ds, epochs=1, verbose=0)
    assert not [w for w in seen if "shuffle=True" in str(w.message)]


def test_a_grandchild_holding_stderr_does_not_hold_up_wait(tmp_path):
    import signal
    import time

    keeper = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(30)']); print(p.pid); "
              "print('parent done', file=sys.stderr)")
    with open(tmp_path / "err", "wb") as f, open(tmp_path / "out", "wb") as out:
        proc = FilteredPopen([sys.executable, "-c", keeper], stderr=f, stdout=out)
    started = time.monotonic()
    try:
        assert proc.wait() == 0 and time.monotonic() - started < 10
        again = time.monotonic()
        assert proc.poll() == 0 and proc.wait() == 0 and time.monotonic() - again < 0.5
        assert (tmp_path / "err").read_text() == "parent done\n"
    finally:
        os.kill(int((tmp_path / "out").read_text()), signal.SIGKILL)


# As JAX 0.10 logs them when it starts its backend: with logging's default format, bare
# (logging's last-resort handler), and in absl's format (TensorFlow imported too).
JAX_STARTUP = """\
INFO:jax._src.xla_bridge:Unable to initialize backend 'tpu': INTERNAL: Failed to open \
libtpu.so: libtpu.so: cannot open shared object file: No such file or directory
Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: libtpu.so: cannot \
open shared object file: No such file or directory
I0917 14:44:05.157831 140221 xla_bridge.py:846] Unable to initialize backend 'tpu': \
INTERNAL: Failed to open libtpu.so
An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed. \
Falling back to cpu.
WARNING:jax._src.xla_bridge:A Google TPU may be present on this machine, but either a \
TPU-enabled jaxlib or libtpu is not installed. Falling back to cpu.
"""
JAX_KEPT = """\
Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices.
WARNING:jax._src.xla_bridge:something else JAX says
"""


def test_jaxs_startup_lines_are_noise_and_its_real_errors_are_not():
    assert all(is_noise(line) for line in JAX_STARTUP.splitlines())
    assert not any(is_noise(line) for line in JAX_KEPT.splitlines())
    f = LineFilter()
    data = (JAX_STARTUP + JAX_KEPT).encode()
    out = b"".join(f.feed(data[i:i + 5]) for i in range(0, len(data), 5))
    assert out + f.flush() == JAX_KEPT.encode()


JAX_CHILD = ("import logging, sys\n"
             "logging.basicConfig(level=logging.INFO)\n"
             "import jax\n"
             "print(jax.devices()[0].platform)\n"
             "print('user line', file=sys.stderr)\n")


def test_a_jax_child_started_by_memfit_loses_the_tpu_line(tmp_path):
    pytest.importorskip("jax")

    def run() -> str:
        with open(tmp_path / "err.txt", "wb") as f:
            env = {"JAX_PLATFORMS": ""}
            assert process.start([sys.executable, "-c", JAX_CHILD], env, stderr=f,
                                 stdout=open(os.devnull, "wb")).wait() == 0
        return (tmp_path / "err.txt").read_text()

    plain = run()
    assert "Unable to initialize backend 'tpu'" in plain     # what JAX prints here
    with quieted():
        kept = run()
    assert "Unable to initialize backend 'tpu'" not in kept and "user line" in kept


def test_jaxs_logger_is_filtered_in_memfits_own_process(caplog):
    import logging

    logger = logging.getLogger("jax._src.xla_bridge")
    tpu = "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so"
    with caplog.at_level(logging.INFO, logger="jax._src.xla_bridge"):
        with quieted():
            logger.info(tpu)
            logger.info("a line JAX means")
        logger.info(tpu)                       # the filter is gone after the block
    assert [r.getMessage() for r in caplog.records] == ["a line JAX means", tpu]


def test_the_library_run_and_doctor_leave_out_the_startup_lines_as_their_commands_do(
        tmp_path, capfd):
    """A stranger's memfit.run(...) and memfit.run_doctor(...) showed 3-6 start-up lines of
    every child, which `memfit run` and `memfit doctor` leave out."""
    import memfit

    command = [sys.executable, "-c", CHILD]
    for call in (lambda: memfit.run(command, workdir=tmp_path / "run", out=False),
                 lambda: memfit.run_doctor(command, workdir=tmp_path / "doctor")):
        call()
        err = capfd.readouterr().err
        assert "user error line" in err and "oneDNN" not in err and "cuInit" not in err, err
    with quieted(False):                          # asked for: shown
        memfit.run(command, workdir=tmp_path / "shown", out=False)
    assert STARTUP in capfd.readouterr().err
