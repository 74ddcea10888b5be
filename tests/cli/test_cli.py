import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from memfit.cli import SUBCOMMANDS, build_parser, main


def test_help_lists_every_subcommand_and_version_prints(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for module in SUBCOMMANDS:
        assert module.NAME in out
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("memfit 0.")


def test_console_script_is_installed():
    bin_dir = __import__("pathlib").Path(sys.executable).parent
    out = subprocess.run([str(bin_dir / "memfit"), "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "pack" in out and "verify" in out


def test_every_subcommand_has_help_with_an_example():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        text = p.format_help()
        assert "memfit " + name in text and "example" in text, name


def test_pack_inspect_verify_round_trip(tmp_path, capsys):
    np.save(tmp_path / "images.npy", np.zeros((100, 8, 8), np.uint8))
    np.save(tmp_path / "labels.npy", np.arange(100))
    out = tmp_path / "data"
    rc = main(["pack", f"x={tmp_path / 'images.npy'}", f"y={tmp_path / 'labels.npy'}",
               "-o", str(out), "--split", "train=0.9,val=0.1", "--shards", "2", "--quiet"])
    assert rc == 0
    assert "packed 100 samples (train=90, val=10) into 4 shards" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "uint8" in text and "(8, 8)" in text and "train" in text and "val" in text
    assert main(["verify", str(out), "--quiet"]) == 0
    assert "OK" in capsys.readouterr().out
    shard = sorted(out.glob("train-*"))[0]
    shard.write_bytes(shard.read_bytes()[:-10])
    assert main(["verify", str(out), "--quiet"]) == 1
    assert shard.name in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["pack", "-o", "X"], "Give NAME=FILE.npy inputs"),
    (["pack", "x", "-o", "X"], "Unknown source file type 'x'"),
    (["pack", "x=a.npy", "x=b.npy", "-o", "X"], "given twice"),
    (["pack", "=a.npy", "y=b.npy", "-o", "X"], "NAME=FILE.npy"),
    (["pack", "x=missing.npy", "-o", "X"], "no such file 'missing.npy'"),
    (["inspect", "nowhere"], "No memfit dataset at 'nowhere'"),
    # what was wrong, and what to do: a path that is not there, a directory of no pack
    (["inspect", "missing.npy"], "No memfit dataset at 'missing.npy': no such file or "
                                 "directory. Check the path: give the directory memfit pack "
                                 "wrote (its -o DIR), or pack your data first"),
    (["verify", "missing.npy"], "'missing.npy': no such file or directory. Check the path"),
    (["inspect", "."], "No memfit dataset at '.': manifest.json is missing. No memfit pack "
                       "wrote it: give the directory memfit pack wrote (its -o DIR)"),
    (["verify", "."], "No memfit pack wrote it: give the directory memfit pack wrote"),
    # an option named as the user typed it, not as Python spells it
    (["run", "--workdir", "X", "--max-rss", "lots", "--", "true"], "Received: --max-rss lots"),
    (["run", "--workdir", "X", "--restart-every", "0", "--", "true"],
     "--restart-every must be an integer >= 1, such as 1. It counts epochs. "
     "Received: --restart-every 0"),
    (["run", "--max-rss", "2GiB", "--hard-rss", "1GiB", "--", "true"],
     "--hard-rss must be above --max-rss: the graceful restart at --max-rss comes first"),
    (["pack", "x=x.npy", "-o", "X", "--shard-size", "0"],
     "--shard-size must be positive. Received: --shard-size 0"),
    (["pack", "x=x.npy", "-o", "X", "--seed", "-1"], "--seed must be an integer >= 0"),
    (["pack", "x=x.npy", "-o", "X", "--label", "y"],
     "--label applies to CSV and Parquet sources only. Received: --label y"),
    (["pack", "x=x.npy", "-o", "X", "--image-size", "3,3"],
     "--images and --image-size go together: the folder and the (height, width) to resize "
     "to, e.g. --images photos/ --image-size 128,128 (images='photos/', image_size=(128, 128) "
     "in Python). Received: no --images, --image-size 3,3"),
    (["pack", "x=x.npy", "-o", "X", "--format", "arrays", "--compression", "GZIP"],
     "--compression applies to --format tfrecord only; --format arrays writes"),
    (["pack", "x=x.npy", "-o", "X", "--crop-to-aspect-ratio"],
     "Received: --crop-to-aspect-ratio, no --images"),
    (["calibrate", "--runs", "0"], "--runs must be an integer >= 1"),
    # ...but a name that is the user's own (a feature, a jobs file's key) is left alone
    (["pack", "x=x.npy", "seed=y.npy", "-o", "X", "--seed", "3"],
     "Received lengths: x=4, seed=2"),
    (["share", "jobs.toml", "--restart"], "job 1 ('a'): restart must be true or false. "
                                          "Received: restart='x'"),
])
def test_cli_errors_are_one_clear_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    if argv[0] == "pack":
        np.save(tmp_path / "x.npy", np.zeros((4, 2), np.float32))
        np.save(tmp_path / "y.npy", np.zeros((2,), np.int64))
    (tmp_path / "jobs.toml").write_text("[[job]]\nname = 'a'\ncommand = ['true']\n"
                                        "restart = 'x'\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memfit {argv[0]}: error:") and message in err, err
    assert not (tmp_path / "X").exists()


def test_pack_csv_from_the_command_line(tmp_path, capsys):
    csv = tmp_path / "t.csv"
    csv.write_text("f1,f2,label\n" + "".join(f"{i},{2 * i},{i % 2}\n" for i in range(40)))
    rc = main(["pack", "--csv", str(csv), "--label", "label", "-o", str(tmp_path / "d"),
               "--compression", "GZIP", "--quiet"])
    assert rc == 0 and "packed 40 samples" in capsys.readouterr().out
    main(["inspect", str(tmp_path / "d")])
    assert "compression: GZIP" in capsys.readouterr().out


def test_run_without_a_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--restart-every", "1"])
    assert e.value.code == 2
    assert "give the command to run after '--'" in capsys.readouterr().err


def test_run_passes_the_exit_code_through_and_logs_the_exit(tmp_path, capsys):
    rc = main(["run", "--workdir", str(tmp_path), "--max-restarts", "0", "--", sys.executable,
               "-c", "print('hello from the command')"])
    captured = capsys.readouterr()
    assert rc == 0 and "finished in " in captured.err and "epochs" not in \
        captured.err.splitlines()[0]
    assert "wrote no checkpoint" in captured.err            # no memfit.session: said
    assert main(["run", "--workdir", str(tmp_path / "missing"), "--", "no-such-cmd-memfit"]) \
        == 127
    assert "command not found: 'no-such-cmd-memfit'" in capsys.readouterr().err


def _packed(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((100, 4), np.float32))
    out = tmp_path / "data"
    assert main(["pack", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--shards", "2",
                 "--quiet"]) == 0
    return out


@pytest.mark.parametrize("command", ["verify", "inspect"])
@pytest.mark.parametrize("edit,message", [
    (lambda m: [], "holds a JSON list ([]), not an object"),
    (lambda m: 3, "holds a JSON int (3), not an object"),
    (lambda m: {**m, "splits": {"train": {**m["splits"]["train"], "samples": -100}}},
     "splits.train.samples is -100, not a non-negative integer"),
    (lambda m: {**m, "splits": {"train": {**m["splits"]["train"], "shards": [
        {**m["splits"]["train"]["shards"][0], "samples": "50"},
        m["splits"]["train"]["shards"][1]]}}},
     'splits.train.shards[0].samples is "50", not a positive integer'),
    (lambda m: {**m, "splits": {"train": {**m["splits"]["train"], "samples": 99}}},
     "splits.train.samples is 99, not the sum over its shards (100)"),
    (lambda m: {**m, "samples_per_record": 0}, "samples_per_record is 0, not a positive"),
])
def test_a_manifest_that_is_not_a_memfit_manifest_is_one_clear_line(tmp_path, capsys, command,
                                                                    edit, message):
    out = _packed(tmp_path)
    capsys.readouterr()
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    assert main([command, str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memfit {command}: error: {manifest}") and message in err
    assert err.count("\n") == 1 and "restore manifest.json from a copy" in err


def test_pack_under_a_regular_file_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    np.save(tmp_path / "x.npy", np.zeros((10, 2)))
    assert main(["pack", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "afile" / "sub"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit pack: error: Cannot create the output directory")
    assert "is a file, not a directory" in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_output_into_a_closed_pipe_is_not_a_traceback(tmp_path, command):
    out = _packed(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "memfit", command, str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                  # like `| head -1` gone before memfit prints
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 128 + 13, err       # as a shell reports SIGPIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception" not in err


# What TensorFlow prints at start-up on a machine without a GPU (issue 15), then the
# command's own output.
NOISY = (
    "import sys\n"
    "sys.stderr.write('WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR\\n')\n"
    "sys.stderr.write('I0000 00:00:1796135732.561688   21952 cudart_stub.cc:31] Could not "
    "find cuda drivers on your machine, GPU will not be used.\\n')\n"
    "sys.stderr.write('E0000 00:00:1796135735.855504   21952 cuda_platform.cc:52] failed "
    "call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\\n')\n"
    "sys.stderr.write('the command on stderr\\n')\n"
    "print('the command on stdout')\n")


@pytest.mark.parametrize("argv,shown", [(["run", "--max-restarts", "0"], False),
                                        (["run", "--max-restarts", "0", "--verbose"], True),
                                        (["watch"], True)])
def test_run_hides_tensorflows_startup_lines_verbose_and_watch_show_them(tmp_path, capfd,
                                                                         argv, shown):
    (tmp_path / "noisy.py").write_text(NOISY)
    rc = main([*argv, "--workdir", str(tmp_path), "--", sys.executable,
               str(tmp_path / "noisy.py")])
    out, err = capfd.readouterr()
    assert rc == 0 and "the command on stdout" in out and "the command on stderr" in err
    for line in ("All log messages before absl::InitializeLog()", "Could not find cuda "
                 "drivers", "failed call to cuInit"):
        assert (line in err) is shown, err


def test_no_progress_bar_where_stderr_is_not_a_terminal(tmp_path):
    """In a log or a pipe (CI), pack and verify draw no bar: its redraws would be noise."""
    import subprocess
    import sys

    import numpy as np

    np.save(tmp_path / "x.npy", np.zeros((500, 4), "float32"))
    for args in (["pack", str(tmp_path / "x.npy"), "-o", str(tmp_path / "ds")],
                 ["verify", str(tmp_path / "ds")]):
        out = subprocess.run([sys.executable, "-m", "memfit", *args], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "%|" not in out.stderr and "\r" not in out.stderr, out.stderr


def test_the_cli_names_an_option_its_own_way_first(tmp_path, capsys):
    """The library's message names overwrite=True (--overwrite); the command line says
    --overwrite first, the Python spelling after it."""
    np.save(tmp_path / "x.npy", np.zeros((10, 2), np.float32))
    out = tmp_path / "data"
    assert main(["pack", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["pack", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--seed", "5",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "or pass --overwrite (overwrite=True in Python) to replace it." in err, err
    assert "(--overwrite)" not in err


def test_other_libraries_info_logs_are_not_printed_but_memfits_are(tmp_path):
    """The CLI shows memfit's own INFO lines (the first estimate's calibration line), not
    another library's (matplotlib's "generated new fontManager" on a fresh machine, when
    Keras imports it)."""
    code = ("import logging, sys\n"
            "from memfit import cli\n"
            "from memfit.cli import inspect_cmd\n"
            "def run(args):\n"
            "    logging.getLogger('matplotlib.font_manager').info('generated new fontManager')\n"
            "    logging.getLogger('memfit.estimate').info('memfit: its own line')\n"
            "inspect_cmd.run = run\n"
            "sys.exit(cli.main(['inspect', 'x']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "memfit: its own line" in out.stderr
    assert "fontManager" not in out.stderr


def test_one_of_a_thing_is_not_plural(tmp_path, capsys):
    """A pack of one sample says "1 sample", "1 shard", "1 record" (not "1 shards"), in
    the pack's summary, inspect's table, verify's line and the reading plan."""
    from memfit.data.read.plan import DatasetPlan

    np.save(tmp_path / "x.npy", np.zeros((1, 3), np.float32))
    out = tmp_path / "one"
    assert main(["pack", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--quiet"]) == 0
    assert main(["inspect", str(out)]) == 0
    assert main(["verify", str(out), "--quiet"]) == 0
    assert main(["inspect", str(tmp_path / "x.npy")]) == 0
    text = capsys.readouterr().out
    assert "packed 1 sample (train=1) into 1 shard," in text
    assert "  1 sample, " in text and " 1 sample " in text and " 1 record " in text
    assert " 1 shard " in text and "verified 1 shard, 1 record read" in text
    assert "1 sample of " in text
    plan = DatasetPlan(path=str(out), split="train", batch_size=1, samples=1,
                       steps_per_epoch=1, memory_budget=2**20, estimated_bytes=100,
                       window_records=1, window_samples=1, cycle_length=1, read_threads=1,
                       parallel_windows=1, prefetch_batches=1, seed=0, epoch=0, epochs=None,
                       shuffle=True)
    for reader in ("blocks", "tf"):
        said = str(dataclasses.replace(plan, reader=reader))
        assert "1 sample → 1 step/epoch of 1" in said, said
        for wrong in ("1 samples", "1 shards", "1 batches", "1 windows", "1 threads",
                      "1 records", "1 steps"):
            assert wrong not in said, said


def test_a_ctrl_c_while_the_command_imports_is_one_line_not_a_traceback(tmp_path):
    """A Ctrl-C in the command's first second (memfit's imports, before main can catch
    anything) printed Python's KeyboardInterrupt traceback from inside an import. The
    signal is sent once NumPy is loaded into the process (its C extension in
    /proc/PID/maps), which memfit's imports reach well before they end."""
    import os
    import pathlib
    import signal
    import time

    memfit = pathlib.Path(sys.executable).parent / "memfit"
    proc = subprocess.Popen([str(memfit), "watch", "--", sys.executable, "-c",
                             "import time; time.sleep(30)"], start_new_session=True, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/maps") as f:
                if "_multiarray_umath" in f.read():
                    break
        os.killpg(proc.pid, signal.SIGINT)           # the terminal's Ctrl-C: the group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().endswith("interrupted"), err


def test_only_the_memfit_console_script_holds_ctrl_c(tmp_path):
    from memfit.command_start import hold_interrupts

    mine = tmp_path / "memfit"                       # a user's own program called memfit
    mine.write_text("import memfit\n")
    assert not hold_interrupts(argv0=str(mine))
    assert not hold_interrupts(argv0=sys.executable)


@pytest.mark.parametrize("argv", [["share", "jobs.toml", "--nosuch"],
                                  ["pack", "x=a.npy", "-o", "out", "--nosuch"],
                                  ["run", "--nosuch", "--", "python", "-c", "1"]])
def test_a_stray_option_is_shown_with_its_commands_usage_not_memfits(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: memfit {argv[0]} " in err
    assert f"memfit {argv[0]}: error: unrecognized arguments: --nosuch" in err
    assert "COMMAND ..." not in err
