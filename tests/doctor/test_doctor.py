"""memfit doctor end to end: each script in scripts/ triggers exactly one finding (clean.py
none), measured in a real child process run for a few steps; and bad input.

Each child run takes 5-11 s on 2 cores (most of it importing TensorFlow); each script
runs once (module-scoped fixture) and its result is checked by several tests.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.doctor import doctor
from memfit.doctor.data_rules import BUFFER_MIN, DATA_MIN
from memfit.memory.process import CommandStartError

SCRIPTS = Path(__file__).parent / "scripts"
MiB = 2**20

# script -> (steps, the one finding it triggers)
CASES = {
    "clean": (30, None),
    "data_in_ram": (20, "data-in-ram"),
    "activations": (6, "activations"),
    "leak": (40, "memory-growth"),
    "shuffle_buffer": (8, "pipeline-buffers"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            steps, _ = CASES[name]
            workdir = tmp_path_factory.mktemp(name)
            cache[name] = doctor([sys.executable, str(SCRIPTS / f"{name}.py")], steps=steps,
                                 workdir=workdir)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_each_script_triggers_exactly_its_finding(results, name):
    steps, expected = CASES[name]
    result = results(name)
    assert result.exit_code == 0, str(result)
    assert result.probe and result.stopped == "steps" and result.steps == steps, str(result)
    assert result.kinds == ([] if expected is None else [expected]), str(result)
    text = str(result)
    if expected is None:
        assert "No memory problem found" in text
    else:
        finding = result.findings[0]
        assert finding.bytes > 0 and finding.fix and finding.measured and finding.why
        assert f"1. {finding.title}" in text and "Fix:" in text


def test_data_in_ram_measures_the_arrays_and_the_keras_copy(results):
    f = results("data_in_ram").finding("data-in-ram")
    assert f.details["fit_arrays"] == 8192 * 4096 * 4 + 8192 * 4
    assert f.details["keras_copy"] > 64 * MiB           # Keras holds the data twice
    assert f.details["held"] >= DATA_MIN
    assert 'np.save("data/x.npy", x_train)' in f.fix[0]  # the script's own variable name
    assert "memfit.dataset(" in f.fix[1] and "memfit pack x=data/x.npy" in f.fix[3]


def test_activations_come_from_the_estimator_with_the_layers_and_smaller_batches(results):
    result = results("activations")
    f = result.finding("activations")
    assert f.details["batch_size"] == 64
    # What halving the batch halves: at the step's peak the backward pass's buffers (an
    # input gradient, the incoming gradient, the filter gradient's im2col shard) outweigh
    # the one activation still alive.
    assert f.details["batch_memory"] >= 0.4 * f.details["model_bytes"]
    assert 0 < f.details["activations"] < f.details["batch_memory"]
    assert [layer["name"] for layer in f.details["layers"][:2]] == ["conv2d", "conv2d_1"]
    assert [s["batch_size"] for s in f.details["smaller"]] == [32, 16]
    assert f.details["smaller"][0]["total"] < f.details["total"]
    model_file = f.details["model_file"]
    assert model_file and Path(model_file).exists()          # for the memfit estimate command
    assert any(line.startswith(f"memfit estimate {model_file} -b 32") for line in f.fix)


def test_leak_is_classified_per_step_with_a_trim_probe(results):
    result = results("leak")
    f = result.finding("memory-growth")
    assert f.details["verdict"] == "leak" and f.details["basis"] == "steps"
    assert 1.5 * MiB < f.details["per_step"] < 2.5 * MiB          # 2 MiB kept per batch
    assert f.details["released"] is not None                      # probed in-process
    assert f.details["planned_steps"] == 10 * 128
    assert any(line.startswith("memfit run --max-rss ") for line in f.fix)
    # the in-process verdict is the log's last one, for `memfit report`
    verdicts = [json.loads(line) for line in result.log_path.read_text().splitlines()
                if '"event":"verdict"' in line]
    assert verdicts[-1]["source"] == "doctor" and verdicts[-1]["verdict"] == "leak"
    # ... said in steps, as the doctor says it, not "/epoch over 10 epochs" of 40 steps
    assert "/step over 40 training steps" in verdicts[-1]["headline"], verdicts[-1]
    assert "epoch" not in verdicts[-1]["headline"]
    assert verdicts[-1]["explanation"].startswith("Memory keeps growing step after step")
    # and memfit report of the doctor's workdir shows what the doctor found
    from memfit.report import write_report

    report = write_report(result.log_path.parent)
    assert report.doctor.startswith("memfit doctor found memory-growth (about ")
    assert report.doctor in report.verdicts[0].note


def test_shuffle_buffer_is_sized_from_the_pipeline(results):
    f = results("shuffle_buffer").finding("pipeline-buffers")
    (buffer,) = f.details["buffers"]
    assert buffer["kind"] == "shuffle" and buffer["buffer_size"] == 2000
    assert buffer["element_bytes"] == 64 * 64 * 3 * 4 + 4
    assert buffer["bytes"] == 2000 * buffer["element_bytes"] >= BUFFER_MIN
    assert f.fix[0].startswith("ds.shuffle(buffer_size=341)")


def test_clean_run_writes_log_and_json(results):
    result = results("clean")
    data = json.loads((result.workdir / "doctor.json").read_text())
    assert data["format"] == "memfit-doctor" and data["findings"] == []
    events = {json.loads(line)["event"] for line in result.log_path.read_text().splitlines()}
    assert {"start", "sample", "batch", "exit", "findings"} <= events
    assert result.verdict["verdict"] in ("stable", "warm-up")


def test_cli_json_keeps_stdout_for_json_and_tf_keras_is_probed(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "memfit", "doctor", "--json", "--steps", "5", "--workdir",
         str(tmp_path), "--", sys.executable, "-c",
         "print('from the script'); import numpy as np, tensorflow as tf; "
         "keras = tf.keras; "        # tf.keras: TensorFlow imports keras itself
         "m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]); "
         "m.compile('sgd', 'mse'); m.fit(np.zeros((64, 2)), np.zeros((64, 1)), verbose=0)"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)                       # nothing but JSON on stdout
    assert data["steps"] == 2 and data["stopped"] is None and data["findings"] == []
    assert "from the script" in out.stderr


def test_command_without_keras_is_left_alone(tmp_path):
    result = doctor([sys.executable, "-c", "print('no keras here')"], workdir=tmp_path)
    assert result.exit_code == 0 and not result.probe and result.findings == ()
    assert "did not report" in str(result)


def test_exit_code_of_a_failing_command_is_kept(tmp_path):
    result = doctor([sys.executable, "-c", "raise SystemExit(3)"], workdir=tmp_path)
    assert result.exit_code == 3 and "exit code 3" in str(result)


@pytest.mark.parametrize("kwargs,message", [
    ({"steps": 0}, "steps must be an integer >= 1 (or None), such as 100. Received: steps=0"),
    ({"steps": True}, "Received: steps=True"),
    ({"steps": 2.5}, "Received: steps=2.5"),
    ({"seconds": -1}, "seconds must be a positive number of seconds (or None), such as 60. "
                      "Received: seconds=-1"),
    ({"seconds": float("nan")}, "Received: seconds=nan"),
    ({"steps": 10, "seconds": 5}, "give steps or seconds, not both. Received: steps=10, "
                                  "seconds=5"),
    ({"interval": 0}, "interval must be a positive number of seconds, such as 0.2. "
                      "Received: interval=0"),
])
def test_bad_limits_are_refused_before_anything_runs(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as e:
        doctor([sys.executable, "-c", "pass"], workdir=tmp_path / "wd", **kwargs)
    assert message in str(e.value)
    assert not (tmp_path / "wd").exists()


def test_bad_commands(tmp_path):
    with pytest.raises(ValueError, match="command is empty"):
        doctor([], workdir=tmp_path)
    with pytest.raises(ValueError, match="Received: command='python train.py'"):
        doctor("python train.py", workdir=tmp_path)
    with pytest.raises(CommandStartError) as e:
        doctor(["nosuchcmd-memfit"], workdir=tmp_path)
    assert e.value.exit_code == 127


@pytest.mark.parametrize("argv,message", [
    (["doctor"], "give the command to run after '--'"),
    (["doctor", "--steps", "0", "--", "python", "t.py"],
     "argument --steps: must be an integer >= 1, such as 3. Received: '0'"),
    (["doctor", "--steps", "ten", "--", "python", "t.py"],
     "argument --steps: must be an integer >= 1, such as 3. Received: 'ten'"),
    (["doctor", "--seconds", "-3", "--", "python", "t.py"],
     "argument --seconds: must be a positive number of seconds, such as 0.5. Received: '-3'"),
    (["doctor", "--steps", "5", "--seconds", "3", "--", "python", "t.py"],
     "not allowed with argument"),
])
def test_cli_bad_input(capsys, argv, message):
    from memfit.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_help_has_an_example(capsys):
    from memfit.cli import main

    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "memfit doctor -- python train.py" in out


def test_a_second_run_on_a_session_script_says_it_resumed(tmp_path):
    """A stranger ran the doctor twice on a memfit.session() script: the second run
    resumed from the first one's checkpoints in the doctor's workdir, trained 0 steps and
    was told to give the doctor a longer run. It is told that it resumed, and how to have
    the doctor see the whole run."""
    script = tmp_path / "train.py"
    script.write_text(
        "import keras, numpy as np, memfit\n"
        "with memfit.session(seed=3, verbose=0) as s:\n"
        "    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])\n"
        "    m.compile('sgd', 'mse')\n"
        "    m.fit(np.zeros((64, 4)), np.zeros((64, 1)), batch_size=16, epochs=2, verbose=0,\n"
        "          callbacks=[s.callback])\n")
    workdir = tmp_path / "wd"
    first = doctor([sys.executable, str(script)], workdir=workdir)
    assert first.exit_code == 0 and first.resumed is None and first.steps == 8, str(first)
    assert "resumed" not in str(first)
    second = doctor([sys.executable, str(script)], workdir=workdir)
    assert second.resumed == {"epoch": 2, "step": 0} and second.steps == 0, str(second)
    text = " ".join(str(second).split())
    assert f"resumed at epoch 3 from a checkpoint an earlier run left in " \
           f"{workdir / 'checkpoints'}" in text, text
    assert "give the doctor a fresh --workdir" in text and "longer run" not in text
    assert json.loads((workdir / "doctor.json").read_text())["resumed"] == second.resumed


def test_a_crash_under_the_doctor_shows_the_scripts_traceback_without_the_probes(tmp_path,
                                                                                   capfd):
    """A stranger's Ctrl-C under the doctor showed its probe's frames (`hook.py`,
    `fit_probe.py`) inside the script's traceback, and a crashed script was told to give
    the doctor a longer run."""
    (tmp_path / "keras").mkdir()            # a keras whose import fails: the probe's hook
    (tmp_path / "keras" / "__init__.py").write_text("raise RuntimeError('broken keras')\n")
    (tmp_path / "train.py").write_text("import keras\n")
    result = doctor([sys.executable, str(tmp_path / "train.py")], workdir=tmp_path / "wd")
    err = capfd.readouterr().err
    assert result.exit_code == 1
    assert 'train.py", line 1, in <module>' in err and "RuntimeError: broken keras" in err
    assert "memfit" not in err.replace(str(tmp_path), ""), err      # no probe frame
    text = str(result)
    assert "The command failed (exit code 1)" in text
    assert "give the doctor a longer run" not in text


def test_a_command_ended_by_ctrl_c_is_said_to_be_interrupted(tmp_path, capfd):
    """A Ctrl-C met while the probe's hook loads Keras: the script's traceback without
    the probe's frames, and the exit by SIGINT Python gives it (status 130, not 1)."""
    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "__init__.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
    (tmp_path / "train.py").write_text("import keras\n")
    result = doctor([sys.executable, str(tmp_path / "train.py")], workdir=tmp_path / "wd")
    assert result.exit_code == 130, str(result)
    assert "The command was interrupted (Ctrl-C, exit code 130)" in str(result), str(result)
    err = capfd.readouterr().err
    assert err.rstrip().endswith("KeyboardInterrupt") and 'train.py", line 1' in err
    assert "memfit" not in err.replace(str(tmp_path), ""), err
