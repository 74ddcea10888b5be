"""Kills, preemption and full disks, end to end.

The training is benchmarks/fault_train.py (the fault campaign's), which records the phase
it is in, so that a kill can be aimed at one; the campaign itself (benchmarks/faults.py)
runs here in its fast variant: random phases, random instants inside them.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import memfit
from memfit.supervise import CheckpointStore

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import faults  # noqa: E402

EPOCHS = 2
ENV = faults.ENV


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "data"
    faults.make_data(path)
    return path


@pytest.fixture(scope="module")
def reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    root = tmp_path_factory.mktemp("reference")
    subprocess.run(faults.command(data, root / "out", "divides", EPOCHS), check=True,
                   env={**ENV, "MEMFIT_WORKDIR": str(root / "wd")},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return faults.finals(root / "out")


def _when(out: Path, phase: str, action) -> threading.Thread:
    """Runs ``action(pid)`` once, as soon as the training enters ``phase``."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = faults.read_phase(out)
            if now is not None and now[0] == phase:
                action(now[1])
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _after_checkpoint_in(out: Path, phase: str, action) -> threading.Thread:
    """Runs ``action(pid)`` once, when the training is back in ``phase`` after a
    checkpoint written in it (read from its phase log, which misses no change)."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                names = [(name, pid) for _, pid, name, _ in faults.phase_log(out)]
            except (OSError, ValueError):
                names = []
            for i in range(2, len(names)):
                if [n for n, _ in names[i - 2:i + 1]] == [phase, "checkpoint", phase]:
                    action(names[i][1])
                    return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_kill_after_an_epochs_last_step_checkpoint_resumes(data, reference, tmp_path):
    """checkpoint_every divides the epoch's steps: the step-20 checkpoint is written, then
    the process dies while validating. The resume skips every step of that epoch (none
    is trained, so Keras never builds its metrics) and must still finish the epoch with
    the uninterrupted run's logs; it used to crash-loop on "metric has not yet been
    built"."""
    out = tmp_path / "out"
    watcher = _after_checkpoint_in(out, "epoch-end", lambda pid: os.kill(pid, signal.SIGKILL))
    result = memfit.run(faults.command(data, out, "divides", EPOCHS), workdir=tmp_path / "wd",
                        backoff=0.0, out=False)
    watcher.join()
    assert result.finished, result
    assert [c.cause for c in result.children] == ["killed", "finished"]
    assert result.children[1].resumed_at == (0, 20)        # every step of epoch 1 done
    assert faults.identical(faults.finals(out), reference)


def test_sigterm_while_validating_checkpoints_and_resumes_with_no_step_redone(
        data, reference, tmp_path):
    """A plain `python train.py` (no memfit run) gets SIGTERM during validation: it
    checkpoints the finished steps with their metric states and exits 143; started again,
    it skips them, validates again and ends bit-identical."""
    out, wd = tmp_path / "out", tmp_path / "wd"
    env = {**ENV, "MEMFIT_WORKDIR": str(wd)}
    proc = subprocess.Popen(faults.command(data, out, "divides", EPOCHS), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watcher = _when(out, "epoch-end", lambda pid: os.kill(pid, signal.SIGTERM))
    _, err = proc.communicate(timeout=120)
    watcher.join()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "SIGTERM received" in err and "exiting with code 143" in err
    ckpt = CheckpointStore(wd / "checkpoints").latest()
    assert ckpt.position == (0, 20) and ckpt.state["reason"] == "preempted (SIGTERM)"
    trained = faults.read_phase(out)[2]
    subprocess.run(faults.command(data, out, "divides", EPOCHS), env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = [p for _, p, name, _ in faults.phase_log(out) if name == "import"]
    assert faults.restored_iterations(out, pids[1]) == trained == 20     # none redone
    assert faults.identical(faults.finals(out), reference)


def test_sigterm_to_memfit_run_stops_both_after_a_checkpoint(data, reference, tmp_path):
    out, wd = tmp_path / "out", tmp_path / "wd"
    cmd = [sys.executable, "-m", "memfit", "run", "--workdir", str(wd), "--",
           *faults.command(data, out, "divides", EPOCHS)]
    parent = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    steps = []

    def term(pid: int) -> None:
        time.sleep(0.05)
        steps.append(faults.read_phase(out)[2])
        parent.send_signal(signal.SIGTERM)

    watcher = _when(out, "step", term)
    _, err = parent.communicate(timeout=120)
    watcher.join()
    assert parent.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped (interrupted)" in err and "Traceback" not in err
    ckpt = CheckpointStore(wd / "checkpoints").latest()
    trained = faults.read_phase(out)[2]
    assert ckpt.state["reason"] == "preempted (SIGTERM)"
    assert ckpt.position[0] * 20 + ckpt.position[1] == trained   # the checkpoint is the exit
    subprocess.run(cmd, env=ENV, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    pids = [p for _, p, name, _ in faults.phase_log(out) if name == "import"]
    assert faults.restored_iterations(out, pids[1]) == trained
    assert faults.identical(faults.finals(out), reference)


def test_a_checkpoint_that_cannot_be_written_stops_the_run_clearly(tmp_path):
    """The file-size limit (``ulimit -f``) refuses the checkpoint: the training says what
    failed and where, leaves no temporary directory, exits 74, and memfit run stops
    instead of restarting into the same wall."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    memfit.pack({"x": x, "y": x[:, :1]}, tmp_path / "data", shards=2, progress=False)
    script = ROOT / "tests" / "supervise" / "scripts" / "train.py"
    limited = [sys.executable, "-c",
               "import os, resource, sys; "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY)); "
               "os.execv(sys.executable, [sys.executable] + sys.argv[1:])",
               str(script), str(tmp_path / "data"), str(tmp_path / "out"), "--epochs", "2",
               "--units", "2048"]
    err_file = tmp_path / "stderr"
    with open(err_file, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "memfit", "run", "--workdir",
                               str(tmp_path / "wd"), "--", *limited], env=ENV,
                              stdout=subprocess.DEVNULL, stderr=err, timeout=180)
    text = err_file.read_text()
    assert proc.returncode == 74, text[-3000:]
    assert "memfit: error: Could not write checkpoint ckpt-000000" in text
    assert "File too large (EFBIG)" in text and "ulimit -f" in text
    assert "could not write its checkpoint" in text            # memfit run's stop reason
    assert "Traceback" not in text
    assert list((tmp_path / "wd" / "checkpoints").iterdir()) == []
    events = [json.loads(line) for line in (tmp_path / "wd" / "memory.jsonl").open()]
    assert any(e.get("event") == "stop" and e.get("reason") == "checkpoint-write"
               for e in events)


def test_the_fast_fault_campaign(tmp_path):
    """benchmarks/faults.py --fast: six SIGKILLs in two runs, aimed one at each phase (in
    a random order, each at a random instant inside it), and SIGTERMs to a plain process
    and to memfit run, on the augment configuration (the full campaign, every
    configuration, is benchmarks/faults.py's); every run ends bit-identical, every
    checkpoint after a kill loads, no SIGTERM redoes a step."""
    report = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "faults.py"), "--fast",
                           "--json", str(report)], env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    kills = [r for r in result["records"] if r["signal"] == "SIGKILL"]
    terms = [r for r in result["records"] if r["signal"] != "SIGKILL"]
    assert len(kills) == 6 and len(terms) == 2
    assert sorted(r["target"] for r in kills) == sorted(faults.PHASES)   # every phase aimed at
    assert all(o["finished"] and o["identical"] for o in result["outcomes"])
    assert not any(r["checkpoint_problem"] for r in result["records"])
    assert all(r.get("redone") == 0 for r in terms), terms
    assert len({r["phase"] for r in kills}) >= 3               # not one phase only
    assert "| training kills survived bit-identical / total SIGKILLs | 100 % | 6 / 6" \
        in proc.stdout


def test_sigterm_after_fit_failed_still_ends_the_process(tmp_path):
    """fit() left by an exception never calls on_train_end: SIGTERM must then keep its
    default effect, not wait for a step that will never come."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, time
        import keras, numpy as np, memfit
        with memfit.session({str(tmp_path / "wd")!r}, seed=1, verbose=0) as s:
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            class Boom(keras.callbacks.Callback):
                def on_epoch_end(self, epoch, logs=None):
                    raise RuntimeError("boom")
            try:
                model.fit(np.zeros((8, 4)), np.zeros((8, 1)), epochs=2, verbose=0,
                          callbacks=[s.callback, Boom()])
            except RuntimeError:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
                print("STILL ALIVE")
        """))
    proc = subprocess.run([sys.executable, str(script)], env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM, proc.stdout + proc.stderr[-2000:]
    assert "STILL ALIVE" not in proc.stdout


def test_two_preemptions_in_one_epoch_under_mirrored_strategy(data, tmp_path):
    """Under MirroredStrategy a metric keeps one partial sum per replica; a checkpoint
    must keep the partials, not their sum (assigning a sum splits it evenly, and the
    epoch's logged loss then differs in its last bits). Two SIGTERMs inside one epoch,
    at steps that are not multiples of checkpoint_every, in the second and last epoch (it
    was the third of three: one more epoch for the reference and for the first preempted
    process each, and no case more)."""
    reference = tmp_path / "reference"
    subprocess.run(faults.command(data, reference / "out", "mirrored", EPOCHS), check=True,
                   env={**ENV, "MEMFIT_WORKDIR": str(reference / "wd")},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out, env = tmp_path / "out", {**ENV, "MEMFIT_WORKDIR": str(tmp_path / "wd")}
    for at in (31, 36):         # epoch 2, steps 11 and 16
        proc = subprocess.Popen(faults.command(data, out, "mirrored", EPOCHS), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None:
            now = faults.read_phase(out)
            if now and now[1] == proc.pid and now[0] == "step" and now[2] >= at:
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.002)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    subprocess.run(faults.command(data, out, "mirrored", EPOCHS), env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert CheckpointStore(tmp_path / "wd" / "checkpoints").latest().position == (EPOCHS, 0)
    assert faults.identical(faults.finals(out), faults.finals(reference / "out"))
