"""memfit run + memfit.session end to end: exact resumes, kills, failures, memory restarts.

Every case runs tests/supervise/scripts/train.py (a small Keras model with Dropout, Adam
and a metric, on a packed dataset) in child processes and compares with one
uninterrupted run of the same script.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest

import memfit
from memfit.memory.log import read_log
from memfit.supervise import CheckpointStore
from tests.once import shared

SCRIPT = Path(__file__).parent / "scripts" / "train.py"
EPOCHS = 6


def command(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), str(data), str(out), "--epochs", str(EPOCHS), *extra]


def finals(out: Path) -> tuple[list[np.ndarray], dict]:
    with np.load(out / "final.npz") as f:
        weights = [f[k] for k in f.files]
    return weights, json.loads((out / "history.json").read_text())


def assert_same_training(out: Path, reference: tuple[list[np.ndarray], dict]) -> None:
    weights, history = finals(out)
    for got, want in zip(weights, reference[0], strict=True):
        assert np.array_equal(got, want), float(np.abs(got - want).max())
    assert history == reference[1]
    assert len(history["loss"]) == EPOCHS


def make_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packed regression set every case trains on (made once a session: test_warm.py
    reads it too)."""
    def pack(path: Path) -> None:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(1024, 16)).astype("float32")
        y = (x @ rng.normal(size=(16, 1))).astype("float32")
        memfit.pack({"x": x, "y": y}, path / "data", shards=4, progress=False)

    return shared(tmp_path_factory, "supervise-data", pack) / "data"


def make_reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The uninterrupted run: one process, no supervisor. Deterministic, so run once a
    session (one TensorFlow process less: test_warm.py compares with it too)."""
    def train(base: Path) -> None:
        subprocess.run(command(data, base / "out"), check=True,
                       env={**os.environ, "MEMFIT_WORKDIR": str(base / "wd")})

    return finals(shared(tmp_path_factory, "supervise-reference", train) / "out")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    return make_reference(data, tmp_path_factory)


def test_restart_every_epoch_equals_an_uninterrupted_run(data, reference, tmp_path, capfd):
    result = memfit.run(command(data, tmp_path / "out"), workdir=tmp_path / "wd",
                        restart_every=1, out=False)
    assert result.finished and result.exit_code == 0
    # fit(verbose=0) has no progress bar to end: no blank line before the session's
    # "checkpointed at ..." (a stranger saw one before every restart)
    lines = capfd.readouterr().err.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("memfit: checkpointed at")]
    assert len(said) == EPOCHS - 1 and all(lines[i - 1].strip() for i in said), lines
    assert len(result.children) == EPOCHS
    assert result.restarts == {"every 1 epoch": EPOCHS - 1}
    assert result.epoch == EPOCHS
    assert_same_training(tmp_path / "out", reference)
    events = [r for r in read_log(tmp_path / "wd" / "memory.jsonl")]
    restarts = [r for r in events if r["event"] == "restart"]
    assert [r["epoch"] for r in restarts] == list(range(1, EPOCHS))
    assert {r["pid"] for r in events if r["event"] == "resume"} == \
        {c.pid for c in result.children}
    # Time lost runs to the end of each new process's first step (its trace or compile is
    # start-up too; on JAX 3-4 s came after the resume event and were left out).
    resumed = {r["pid"]: r["t"] for r in events if r["event"] == "resume"}
    stepped = {r["pid"]: r["t"] for r in events if r["event"] == "first_step"}
    assert set(stepped) == set(resumed) and all(stepped[p] > resumed[p] for p in stepped)
    starts = sum(stepped[b.pid] - a.ended
                 for a, b in zip(result.children, result.children[1:], strict=False))
    assert result.lost >= starts > 0
    assert "first step's compile" in str(result)
    # The report draws every restart on the timeline.
    from memfit.report.data import load

    run = load(tmp_path / "wd")
    assert len(run.events("restart")) == EPOCHS - 1
    assert "every 1 epoch" in str(result)


def _checkpoints_readable(store: CheckpointStore) -> None:
    ckpt = store.latest()
    if ckpt is None:
        return
    with h5py.File(ckpt.weights, "r") as f:
        f.visititems(lambda name, obj: obj[()] if isinstance(obj, h5py.Dataset) else None)
    with np.load(ckpt.arrays) as arrays:
        for key in arrays.files:
            arrays[key]


def _is_training(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE and str(SCRIPT) in p.cmdline()
    except psutil.Error:
        return False


KILLS = 6


def test_sigkill_at_random_points_resumes_to_the_same_weights(data, reference, tmp_path,
                                                              monkeypatch):
    """Six SIGKILLs at random instants after fresh progress, plus one inside a checkpoint
    write (between writing the files and the rename): the run still ends with the
    uninterrupted run's weights and history, and the newest checkpoint always loads.
    (benchmarks/faults.py is the campaign of many more, in every phase.)"""
    wd, out = tmp_path / "wd", tmp_path / "out"
    store = CheckpointStore(wd / "checkpoints")
    marker = out / "killed-in-checkpoint"
    kills: list[tuple[int, tuple[int, int]]] = []
    done = threading.Event()
    problems: list[str] = []

    def killer() -> None:
        rnd = random.Random(1234)
        me = psutil.Process()
        seen_pid, start_seq = None, -1
        while not done.is_set() and len(kills) < KILLS:
            kids = [p for p in me.children() if _is_training(p)]
            if not kids:
                time.sleep(0.05)
                continue
            child = kids[0]
            if child.pid != seen_pid:       # a new process: it must make progress first
                seen_pid = child.pid
                found = store.complete()
                start_seq = found[-1][0] if found else -1
            found = store.complete()
            if not found or found[-1][0] <= start_seq:
                time.sleep(0.05)
                continue
            time.sleep(rnd.uniform(0.0, 0.8))
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
            if marker.exists() and marker.read_text() == str(child.pid):
                # It killed itself in its checkpoint write while this waited (it writes
                # the marker first): that death is the planned one, not one of these.
                seen_pid = None
                continue
            ckpt = store.latest()
            kills.append((child.pid, ckpt.position if ckpt else (0, 0)))
            seen_pid = None
            try:
                _checkpoints_readable(store)
            except Exception as e:          # noqa: BLE001 - reported by the test
                problems.append(repr(e))

    monkeypatch.setenv("KILL_IN_CHECKPOINT", "3")
    # Slow enough steps that the kills, each after up to 0.8 s of fresh progress, fit in
    # the run: at 0.02 s a step a fast machine finished training after nine (CI, once).
    monkeypatch.setenv("STEP_SLEEP", "0.04")
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        result = memfit.run(command(data, out, "--checkpoint-every", "5"), workdir=wd,
                            max_restarts=20, backoff=0.0, interval=0.2, out=False)
    finally:
        done.set()
        thread.join()
    assert not problems
    assert len(kills) == KILLS, kills
    assert marker.exists()
    assert result.finished, result
    causes = [c.cause for c in result.children[:-1]]
    assert causes.count("killed") == KILLS + 1, result
    assert any(c.resumed_at[1] for c in result.children), "no mid-epoch resume happened"
    assert_same_training(out, reference)


def test_a_slow_leak_is_restarted_by_memory_and_trains_exactly(data, reference, tmp_path,
                                                                monkeypatch):
    """4 MiB kept per step (~770 MiB over the run) under --max-rss 450MiB: the process is
    asked to checkpoint mid-epoch and restarted, several times, and the run still ends
    with the uninterrupted run's weights."""
    monkeypatch.setenv("LEAK_PER_STEP", str(4 * 2**20))
    monkeypatch.setenv("STEP_SLEEP", "0.02")
    result = memfit.run(command(data, tmp_path / "out"), workdir=tmp_path / "wd",
                        max_rss="450MiB", interval=0.1, backoff=0.0, out=False)
    assert result.finished, result
    assert result.restarts.get("max-rss", 0) >= 2, result
    assert all(c.peak.rss_anon < 600 * 2**20 for c in result.children), result
    assert any(c.resumed_at[1] for c in result.children), "no mid-epoch resume happened"
    assert_same_training(tmp_path / "out", reference)
    requests = [r for r in read_log(tmp_path / "wd" / "memory.jsonl")
                if r["event"] == "request"]
    assert len(requests) >= 2 and all(r["rss"] >= 450 * 2**20 for r in requests)


def test_a_deterministic_failure_stops_after_one_retry(data, tmp_path, monkeypatch):
    monkeypatch.setenv("CRASH_AT_EPOCH", "2")
    result = memfit.run(command(data, tmp_path / "out"), workdir=tmp_path / "wd",
                        backoff=0.0, out=False)
    assert not result.finished
    assert [c.cause for c in result.children] == ["crash", "crash"]
    assert [c.ended_at for c in result.children] == [(2, 0), (2, 0)]
    assert "twice in a row at the start of epoch 3" in result.stop_reason
    assert result.exit_code == 1
    stops = [r for r in read_log(tmp_path / "wd" / "memory.jsonl") if r["event"] == "stop"]
    assert stops and "twice in a row" in stops[-1]["reason"]


def test_sigterms_sent_to_the_training_from_outside_are_restarted_not_called_a_loop(
        tmp_path):
    """A stranger's two SIGTERMs to the training during its start-up stopped the run with
    "killed (SIGTERM) twice in a row ... it will not go away by restarting"."""
    script = tmp_path / "term.py"
    script.write_text(f"import os, signal, pathlib\n"
                      f"n = pathlib.Path({str(tmp_path / 'count')!r})\n"
                      f"runs = int(n.read_text()) + 1 if n.exists() else 1\n"
                      f"n.write_text(str(runs))\n"
                      f"if runs <= 2:\n"
                      f"    os.kill(os.getpid(), signal.SIGTERM)\n")
    result = memfit.run([sys.executable, str(script)], workdir=tmp_path / "wd",
                        backoff=0.0, out=False)
    assert result.finished, result.stop_reason
    assert [c.cause for c in result.children] == ["killed", "killed", "finished"]


HOG = [sys.executable, "-c",
       "import time\nx = []\nfor _ in range(4000):\n    x.append(bytearray(2**20))\n"
       "    time.sleep(0.005)\n"]


def test_hard_rss_kills_and_a_repeat_stops(tmp_path):
    result = memfit.run(HOG, workdir=tmp_path, hard_rss="120MiB", interval=0.05,
                        backoff=0.0, out=False)
    assert [c.cause for c in result.children] == ["hard-rss", "hard-rss"]
    assert all(c.exit_code == 128 + signal.SIGKILL for c in result.children)
    assert "twice in a row" in result.stop_reason
    kills = [r for r in read_log(tmp_path / "memory.jsonl") if r["event"] == "kill"]
    assert len(kills) == 2 and all(r["rss"] >= 120 * 2**20 for r in kills)


def test_a_command_that_ignores_the_request_is_killed_after_the_grace(tmp_path):
    result = memfit.run(HOG, workdir=tmp_path, max_rss="80MiB", grace=0.5, interval=0.05,
                        backoff=0.0, max_restarts=0, out=False)
    assert result.children[0].cause == "unresponsive"
    assert "--max-restarts 0" in result.stop_reason


def test_another_models_checkpoints_are_refused_and_kept(data, tmp_path):
    wd = tmp_path / "wd"
    subprocess.run(command(data, tmp_path / "a")[:-2] + ["--epochs", "1"], check=True,
                   env={**os.environ, "MEMFIT_WORKDIR": str(wd)})
    before = {p.name: (p / "state.json").read_bytes()
              for _, p in CheckpointStore(wd / "checkpoints").complete()}
    assert before
    result = memfit.run(command(data, tmp_path / "b", "--units", "64"), workdir=wd,
                        out=False)
    assert [c.cause for c in result.children] == ["config"]
    assert result.exit_code == 78 and "configuration error" in result.stop_reason
    after = {p.name: (p / "state.json").read_bytes()
             for _, p in CheckpointStore(wd / "checkpoints").complete()}
    assert after == before
    stop = [r for r in read_log(wd / "memory.jsonl") if r["event"] == "stop"][0]
    assert "another model" in stop["message"] and "(16, 32)" in stop["message"]


def test_max_rss_below_the_baseline_is_a_clear_error(data, tmp_path, capfd):
    result = memfit.run(command(data, tmp_path / "out"), workdir=tmp_path / "wd",
                        max_rss="64MiB", out=False)
    assert [c.cause for c in result.children] == ["config"]
    err = capfd.readouterr().err
    assert "--max-rss 64.0 MiB is below this training process's memory" in err


@pytest.mark.parametrize("kwargs, message", [
    ({"restart_every": 0}, "Received: restart_every=0"),
    ({"max_restarts": -1}, "Received: max_restarts=-1"),
    ({"interval": 0}, "Received: interval=0"),
    ({"max_rss": "2GiB", "hard_rss": "1GiB"}, "hard_rss must be above max_rss"),
    ({"max_rss": "lots"}, "lots"),
    ({"max_rss": 0}, "max_rss must be a size above zero"),
    ({"max_rss": "0GiB"}, "Received: max_rss=0"),
    ({"hard_rss": "0"}, "hard_rss must be a size above zero"),
    ({"stop_grace": -1}, "Received: stop_grace=-1"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        memfit.run(["true"], workdir=tmp_path / "wd", **kwargs)
    assert not (tmp_path / "wd").exists()


@pytest.mark.parametrize("option", ["--max-rss", "--hard-rss"])
def test_a_zero_memory_limit_is_one_clear_line_and_exit_2(tmp_path, capsys, option):
    from memfit.cli import main

    assert main(["run", "--workdir", str(tmp_path / "wd"), option, "0", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit run: error:") and "above zero" in err
    assert "Traceback" not in err and not (tmp_path / "wd").exists()


def test_a_command_without_a_session_is_said_to_be_unrestartable(tmp_path):
    """A stranger's --restart-every 1 on a plain Keras script trained 40 epochs in one
    process and was told "finished after 0 epochs". Nothing checkpointed: the summary
    says what memfit run cannot do for it, and counts no epochs."""
    script = tmp_path / "plain.py"
    script.write_text("import time\ntime.sleep(0.2)\nprint('trained')\n")
    result = memfit.run([sys.executable, str(script)], workdir=tmp_path / "wd",
                        restart_every=1, out=False)
    text = str(result)
    assert result.finished and not result.checkpointed and len(result.children) == 1
    assert "finished in " in text and "epoch" not in text.splitlines()[0], text
    assert "wrote no checkpoint" in text and "--restart-every does nothing" in text
    with_session = memfit.RunResult(0, True, None, (), 3, 1.0, 0.0, tmp_path)
    assert "finished after 3 epochs" in str(with_session)
    assert "wrote no checkpoint" not in str(with_session)


def test_an_empty_command_is_refused():
    with pytest.raises(ValueError, match="command is empty"):
        memfit.run([])


def test_ctrl_c_stops_the_command_and_the_run(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    parent = subprocess.Popen([sys.executable, "-m", "memfit", "run", "--workdir",
                               str(tmp_path), "--", *sleeper], stderr=subprocess.PIPE,
                              text=True)
    deadline = time.time() + 30
    while time.time() < deadline and not psutil.Process(parent.pid).children():
        time.sleep(0.05)
    child = psutil.Process(parent.pid).children()[0]
    time.sleep(0.3)
    parent.send_signal(signal.SIGINT)
    _, err = parent.communicate(timeout=20)
    assert parent.returncode == 130, err
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert "stopped (interrupted)" in err


def test_a_session_that_fails_before_its_first_checkpoint_is_not_called_sessionless(tmp_path):
    """A stranger's session script that named a feature its dataset lacks (and one that
    met a damaged shard, exit 65 from the session itself) was told that it "does not train
    inside memfit.session()" and to add the two lines it had: the session's start is in
    the log, so the summary leaves that note out."""
    script = tmp_path / "bad_input.py"
    script.write_text("import memfit\n"
                      "with memfit.session(seed=1):\n"
                      "    raise ValueError(\"No feature 'image' in data/train\")\n")
    result = memfit.run([sys.executable, str(script)], workdir=tmp_path / "wd",
                        max_restarts=0, out=False)
    assert not result.finished and result.checkpointed, str(result)
    assert "wrote no checkpoint" not in str(result)
    assert "session" in {r["event"] for r in read_log(tmp_path / "wd" / "memory.jsonl")}
