"""memfit run's warm start: processes forked from a parent that imported the frameworks.

The end-to-end cases run tests/supervise/scripts/train.py, as test_run.py does, and
compare with its uninterrupted run; the random-kill campaign is benchmarks/faults.py's.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import memfit
from memfit.memory.log import read_log
from memfit.memory.warm import WarmParent, WarmStartError
from memfit.supervise import warm
from tests.supervise.test_run import (
    EPOCHS,
    assert_same_training,
    command,
    make_data,
    make_reference,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    return make_reference(data, tmp_path_factory)


def script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


# ---- which commands start warm -----------------------------------------------------------

def test_a_script_importing_keras_starts_warm_with_its_interpreter_options(tmp_path):
    path = script(tmp_path, """
        import numpy
        import keras
        from tensorflow import data
        """)
    planned = warm.plan([sys.executable, "-u", str(path), "--epochs", "3"])
    assert isinstance(planned, warm.Plan)
    assert planned.modules == ("keras", "tensorflow")
    assert planned.flags == ("-u",)
    assert planned.argv == (str(path), "--epochs", "3")


def test_a_framework_imported_in_a_branch_is_left_to_keras(tmp_path):
    """A script that imports TensorFlow only for one backend must not get it imported
    for the other: the warm parent imports Keras, which brings the backend it is given."""
    path = script(tmp_path, """
        import sys
        if sys.argv[1] == "tensorflow":
            import tensorflow
        import keras
        """)
    assert warm.plan(["python", str(path)]).modules == ("keras",)
    inside = script(tmp_path, """
        def main():
            import keras
        main()
        """, "inside.py")
    assert warm.plan(["python", str(inside)]).modules == ("keras",)


@pytest.mark.parametrize("words, reason", [
    (["bash", "train.sh"], "bash is not a Python interpreter"),
    (["python", "-c", "import keras"], "is not `python script.py ...`"),
    (["python", "-m", "train"], "is not `python script.py ...`"),
    (["python", "missing.py"], "is not `python script.py ...`"),
])
def test_commands_that_cannot_start_warm_say_why(words, reason, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.sh").write_text("true\n")
    assert reason in warm.plan(words)


def test_a_script_without_a_framework_or_unreadable_starts_cold(tmp_path):
    plain = script(tmp_path, "import numpy\nprint(1)\n")
    assert "imports none of keras, tensorflow, jax" in warm.plan(["python", str(plain)])
    broken = script(tmp_path, "import keras\ndef (:\n", "broken.py")
    assert "could not be read ahead (SyntaxError)" in warm.plan(["python", str(broken)])


# ---- end to end ---------------------------------------------------------------------------

def test_a_warm_run_forks_every_process_and_trains_exactly(data, reference, tmp_path):
    result = memfit.run(command(data, tmp_path / "out"), workdir=tmp_path / "wd",
                        restart_every=1, start="warm", out=False)
    assert result.finished and len(result.children) == EPOCHS
    assert [c.start for c in result.children] == ["warm"] * EPOCHS
    assert_same_training(tmp_path / "out", reference)
    events = list(read_log(tmp_path / "wd" / "memory.jsonl"))
    parent = [e for e in events if e["event"] == "warm"]
    assert len(parent) == 1 and "keras" in parent[0]["modules"]
    assert [e["start"] for e in events if e["event"] == "exit" and "start" in e] == \
        ["warm"] * EPOCHS
    assert not _alive(parent[0]["pid"])              # the warm parent ended with the run
    assert "processes started warm (forked from a parent that imported keras" in str(result)


def test_auto_starts_warm_only_where_restarts_are_planned(data, tmp_path):
    crash_only = memfit.run(command(data, tmp_path / "a", "--epochs", "1"),
                            workdir=tmp_path / "wa", out=False)
    assert crash_only.finished and crash_only.children[0].start == "cold"
    assert crash_only.start.startswith("cold (no --restart-every or --max-rss")
    planned = memfit.run(command(data, tmp_path / "b", "--epochs", "2"),
                         workdir=tmp_path / "wb", restart_every=1, out=False)
    assert [c.start for c in planned.children] == ["warm", "warm"]


SWITCHES_BACKEND = """
    import os, sys
    os.environ["KERAS_BACKEND"] = {backend!r}
    import keras
    out = sys.argv[1]
    with open(out, "a") as f:
        f.write(keras.backend.backend() + "\\n")
    raise SystemExit(0 if len(open(out).read().split()) > 1 else 75)
    """


def test_a_script_that_switches_the_backend_is_started_again_cold(tmp_path, monkeypatch,
                                                                  capfd):
    """The warm parent imported Keras on TensorFlow; a script that asks for JAX stops
    at that line (before it uses Keras) and runs as a new interpreter from then on."""
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    path = script(tmp_path, SWITCHES_BACKEND.format(backend="jax"))
    out = tmp_path / "backends.txt"
    result = memfit.run([sys.executable, str(path), str(out)], workdir=tmp_path / "wd",
                        restart_every=1, start="warm", out=False)
    assert result.finished
    assert [(c.start, c.exit_code) for c in result.children] == \
        [("warm", 76), ("cold", 75), ("cold", 0)]
    assert out.read_text().split() == ["jax", "jax"]       # never ran on the wrong backend
    err = capfd.readouterr().err
    assert "sets KERAS_BACKEND='jax' (the warm parent imported Keras on 'tensorflow')" in err
    assert "Traceback" not in err
    assert "then cold (the script changed a variable" in result.start
    # exit 76 wrote no checkpoint: not "checkpointed and exited for a restart (start cold)"
    first = result.children[0].pid
    assert f"process {first} exited to be started again as a new interpreter;" in err
    assert f"process {first} checkpointed" not in err


def test_a_script_that_sets_the_backend_already_loaded_stays_warm(tmp_path, monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    path = script(tmp_path, SWITCHES_BACKEND.format(backend="tensorflow"))
    out = tmp_path / "backends.txt"
    result = memfit.run([sys.executable, str(path), str(out)], workdir=tmp_path / "wd",
                        restart_every=1, start="warm", out=False)
    assert result.finished
    assert [(c.start, c.exit_code) for c in result.children] == [("warm", 75), ("warm", 0)]


def test_a_warm_process_keeps_a_sigint_its_shell_ignores(tmp_path):
    # `memfit run ... &` in a script: the shell ignores SIGINT for it, and a training
    # started cold inherits that ignore (forward_signals keeps it); a forked one must too.
    path = script(tmp_path, """
        import signal
        import sys
        import keras
        open(sys.argv[1], "w").write(str(signal.getsignal(signal.SIGINT)))
        """)
    out = tmp_path / "sigint.txt"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = memfit.run([sys.executable, str(path), str(out)], workdir=tmp_path / "wd",
                            start="warm", out=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [(c.start, c.exit_code) for c in result.children] == [("warm", 0)]
    assert out.read_text() == str(signal.SIG_IGN)


def test_a_crash_of_a_warm_process_is_retried_as_a_new_interpreter(tmp_path, capfd):
    path = script(tmp_path, """
        import sys
        from pathlib import Path
        import keras
        marker = Path(sys.argv[1])
        if not marker.exists():
            marker.write_text("crashed once")
            raise RuntimeError("boom")
        """)
    result = memfit.run([sys.executable, str(path), str(tmp_path / "marker")],
                        workdir=tmp_path / "wd", restart_every=1, start="warm", backoff=0.1,
                        out=False)
    assert result.finished
    assert [(c.start, c.cause) for c in result.children] == [("warm", "crash"),
                                                             ("cold", "finished")]
    err = capfd.readouterr().err
    assert "RuntimeError: boom" in err                  # the script's own traceback
    assert "starting the training as a new interpreter from now on: process" in err


def test_a_killed_warm_parent_leaves_the_run_to_finish_cold(data, reference, tmp_path):
    """The warm parent is SIGKILLed while its third forked process trains (the first two
    ran whole epochs warm): the run goes on cold and ends exactly. Killed during the first
    one instead, five of the six epochs each paid a cold TensorFlow start; after the
    third, three do, and the parent still dies with a forked process alive, as before."""
    wd = tmp_path / "wd"
    run = subprocess.Popen(
        [sys.executable, "-m", "memfit", "run", "--workdir", str(wd), "--restart-every", "1",
         "--start", "warm", "--interval", "0.2", "--", *command(data, tmp_path / "out")],
        env={**os.environ, "STEP_SLEEP": "0.01"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    parent = None
    deadline = time.monotonic() + 120
    while parent is None and time.monotonic() < deadline and run.poll() is None:
        events = list(read_log(wd / "memory.jsonl")) if (wd / "memory.jsonl").exists() else []
        if len({e["pid"] for e in events if e["event"] == "resume"}) >= 3:
            parent = next(e["pid"] for e in events if e["event"] == "warm")
        time.sleep(0.05)
    assert parent is not None, run.communicate()
    os.kill(parent, signal.SIGKILL)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    assert_same_training(tmp_path / "out", reference)
    assert "the warm parent ended (killed?)" in err
    exits = [e for e in read_log(wd / "memory.jsonl") if e["event"] == "exit" and "start" in e]
    assert exits[0]["start"] == "warm" and exits[-1]["start"] == "cold"
    assert "Traceback" not in err
    # The process forked from it checkpointed and exited for its restart, but its exit
    # status went with the warm parent: not a made-up 137, "killed" (a stranger's report).
    [row] = [ln for ln in err.splitlines() if "exit status was lost" in ln]
    assert row.split()[2] == "?" and row.endswith(
        "restart: every 1 epoch (its exit status was lost with the warm parent)"), row


def test_sigkills_at_random_instants_of_warm_processes_resume_bit_identical(tmp_path):
    """benchmarks/faults.py's warm runs: memfit run --start warm --restart-every 1 with
    its forked training processes SIGKILLed at random instants of random phases, with
    the callbacks people use beside memfit; every run ends bit-identical."""
    report = tmp_path / "faults.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "faults.py"), "--configs", "callbacks",
         "--runs", "0", "--terms", "0", "--warm-runs", "1", "--kills", "4", "--epochs", "2",
         "--seed", "5", "--json", str(report)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    [outcome] = result["outcomes"]
    assert outcome["finished"] and outcome["identical"]
    assert 3 <= len(result["records"]) <= 4      # the last process may finish first
    assert not any(r["checkpoint_problem"] for r in result["records"])
    assert outcome["warm_processes"] == outcome["processes"] >= 5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_python_without_memfit_is_named_as_the_reason_the_warm_parent_failed(tmp_path):
    # `memfit run -- python train.py` where `python` on the PATH is another interpreter
    # (a virtualenv's memfit run without the environment activated): the warm parent's
    # `from memfit.memory.warm import serve` fails, which it tells by exit code 3
    plan = warm.Plan(python=sys.executable, flags=("-I", "-S"), script=str(tmp_path / "t.py"),
                     argv=("t.py",), modules=("keras",))
    with pytest.raises(WarmStartError, match="cannot import memfit: it is not the Python"):
        WarmParent(plan.python, plan.flags, plan.modules, {}).open(timeout=60)
