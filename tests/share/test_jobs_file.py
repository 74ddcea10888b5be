"""Bad jobs files are rejected before anything starts, with errors that quote the value."""

import importlib
import sys
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.share import JobsFileError, load_jobs, parse_jobs, plan

HOLD = Path(__file__).parent / "scripts" / "hold.py"
GOOD = f'''
[[job]]
name = "a"
command = ["python", "{HOLD}", "--mib", "1", "--seconds", "0"]
need = "100MiB"
'''


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobs.toml"
    path.write_text(text)
    return path


BAD = [
    (GOOD.replace("need =", "nede ="), ["unknown key 'nede'", "did you mean 'need'?",
                                        "Received: nede='100MiB'"]),
    ('bugdet = "1GiB"\n' + GOOD, ["unknown key 'bugdet'", "did you mean 'budget'?",
                                  "Received: bugdet='1GiB'"]),
    (GOOD.replace("[[job]]", "[[jobs]]"), ["unknown key 'jobs'", "did you mean 'job'?"]),
    ('budget = "1GiB"\n' + GOOD.replace('"100MiB"', '"4GiB"'),
     ["more than the whole budget 1.0 GiB", "need 4.0 GiB + overhead 16.0 MiB",
      "Received: need='4GiB'"]),
    (GOOD.replace("command =", "# command ="), ["job 1 ('a'): missing command"]),
    (GOOD + GOOD, ["job 2: duplicate name 'a' (job 1 has it too)"]),
    (GOOD.replace("need =", "nede =") + GOOD.replace('"100MiB"', '"lots"'),   # both bad too
     ["3 problems", "unknown key 'nede'", "need is not a size",
      "job 2: duplicate name 'a' (job 1 has it too)"]),
    (GOOD.replace('"100MiB"', '"lots"'), ["need is not a size", "Received: need='lots'"]),
    (GOOD.replace('"100MiB"', '-5'), ["need must be a non-negative", "Received: need=-5"]),
    ('budget = "much"\n' + GOOD, ["budget is not a size", "Received: budget='much'"]),
    ("", ["is empty: it lists no jobs", "[[job]]"]),
    ("   \n# nothing\n", ["no jobs: add one [[job]] table"]),
    ('budget = "1GiB"\n', ["no jobs: add one [[job]] table"]),
    ("[[job]\nname = 'a'", ["is not valid TOML"]),
    (GOOD.replace(f'"python", "{HOLD}"', '"no-such-program-xyz"'),
     ["command not found: 'no-such-program-xyz' is not on the PATH"]),
    (GOOD.replace(f'"python", "{HOLD}"', '"./missing/train.sh"'),
     ["command not found: './missing/train.sh' is not a file"]),
    (GOOD.replace('command = [', 'command = [] #'), ["command is empty", "command=[]"]),
    (GOOD.replace('command = [', 'command = 42 #'), ["command must be a list of strings",
                                                     "Received: command=42"]),
    (GOOD.replace('"100MiB"', '"auto"'), ["need = 'auto' estimates the need of a Keras model",
                                          "Received: model=None",
                                          "Received: batch_size=None"]),
    (GOOD + "batch_size = 8\n", ["batch_size serves only need = 'auto'"]),
    (GOOD.replace('name = "a"', 'name = "a/b"'), ["name must be", "Received: name='a/b'"]),
    (GOOD + "restart = 'yes'\n", ["restart must be true or false", "Received: restart='yes'"]),
    (GOOD + "env = { X = true }\n", ["env must be a table", "Received: env={'X': True}"]),
    ('device = "tpu"\n' + GOOD, ["device must be 'cpu' or 'gpu:N'", "Received: device='tpu'"]),
    (GOOD.replace("nede", "x").replace("need =", "nede =") + GOOD.replace('"a"', '"b"')
     .replace('"100MiB"', '"x"'), ["2 problems", "unknown key 'nede'", "Received: need='x'"]),
    # a bad device is listed with the file's other problems, not after they are fixed
    ('device = "foo"\nbudget = "lots"\n' + GOOD.replace('"100MiB"', '"x"'),
     ["3 problems", "top of the file: device must be 'cpu' or 'gpu:N'",
      "Received: device='foo'", "Received: budget='lots'", "Received: need='x'"]),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=range(len(BAD)))
def test_bad_jobs_files_are_rejected_before_anything_starts(tmp_path, capsys, text, expected):
    path = write(tmp_path, text)
    workdir = tmp_path / "wd"
    with pytest.raises(JobsFileError) as info:
        plan(path, workdir=workdir, overhead="16MiB")
    for part in expected:
        assert part in str(info.value), str(info.value)
    # the command line says the same, exits 2, and starts nothing
    assert main(["share", str(path), "--workdir", str(workdir), "--overhead", "16MiB"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit share: error: ") and expected[0] in err
    assert not workdir.exists()


def test_a_missing_file_and_a_directory(tmp_path):
    with pytest.raises(JobsFileError, match="No jobs file at .*nope.toml"):
        load_jobs(tmp_path / "nope.toml")
    with pytest.raises(JobsFileError, match="is a directory"):
        load_jobs(tmp_path)


def test_a_good_file_and_its_defaults(tmp_path):
    path = write(tmp_path, 'budget = "1GiB"\noverhead = "20MiB"\ndevice = "cpu"\n' + GOOD +
                 '\n[[job]]\ncommand = "python -c pass"\nneed = 0\nenv = { SEED = 3 }\n')
    spec = load_jobs(path)
    assert spec.budget == 2**30 and spec.overhead == 20 * 2**20 and spec.device == "cpu"
    a, second = spec.jobs
    assert a.command[0] == sys.executable            # "python" is this Python
    assert second.name == "job2" and second.command == (sys.executable, "-c", "pass")
    assert second.need == 0 and second.env == {"SEED": "3"}
    p = plan(path, workdir=tmp_path / "wd")
    assert (p.budget, p.budget_source, p.overhead, p.overhead_source) == \
        (2**30, f"from {path}", 20 * 2**20, "given")
    assert [j.charge for j in p.jobs] == [120 * 2**20, 20 * 2**20]
    # arguments win over the file
    p = plan(path, workdir=tmp_path / "wd", budget="500MiB", overhead="1MiB")
    assert (p.budget, p.overhead) == (500 * 2**20, 2**20)


def test_jobs_from_python_are_checked_the_same_way():
    with pytest.raises(JobsFileError, match="missing command"):
        parse_jobs([{"name": "a"}])
    with pytest.raises(JobsFileError, match="each job must be a table"):
        parse_jobs(["python train.py"])
    with pytest.raises(JobsFileError, match="jobs must be a jobs file path, or a list"):
        parse_jobs(42)  # type: ignore[arg-type]


def test_the_default_overhead_is_the_baseline_measured_once(tmp_path, monkeypatch):
    """Nothing cached: the first plan measures this machine's baseline and caches it, as
    the first estimate does. A stranger's examples/jobs.toml ran on the 220 MiB default
    against a 263 MiB baseline, and two of its four jobs were stopped for it."""
    import memfit.estimate.baseline as baseline

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path / "cache"))   # nothing calibrated
    measured = []

    def calibrate(device, runs=3, cache=True):
        measured.append(device)
        return baseline.Calibration(device=device, baseline=250 * 2**20,
                                    host_baseline=250 * 2**20, interpreter=20 * 2**20,
                                    tensorflow="x", keras="y", host="h", runs=runs,
                                    measured_at=0.0, backend="tensorflow", jax="-")

    monkeypatch.setattr(baseline, "calibrate", calibrate)
    for _ in range(2):
        p = plan(write(tmp_path, GOOD), budget="2GiB", device="cpu", workdir=tmp_path / "wd")
        assert p.overhead == 250 * 2**20 and p.overhead_source == "calibrated"
        assert p.jobs[0].charge == 100 * 2**20 + 250 * 2**20
    assert measured == ["cpu"]                                  # once, then cached

    def fails(device, runs=3, cache=True):
        raise baseline.CalibrationError("no TensorFlow here")

    monkeypatch.setattr(baseline, "calibrate", fails)
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path / "empty"))
    p = plan(write(tmp_path, GOOD), budget="2GiB", device="cpu", workdir=tmp_path / "wd")
    assert p.overhead == baseline.DEFAULT_BASELINE["cpu"]
    assert p.overhead_source == "default: run memfit calibrate"


def test_need_auto_uses_the_estimator(tmp_path, monkeypatch):
    plan_module = importlib.import_module("memfit.share.planner")

    seen = []

    def fake(job, device):
        seen.append((job.auto["model"], job.auto["batch_size"], device))
        return 123 * 2**20, "auto: estimate of m:f at batch 8"

    monkeypatch.setattr(plan_module, "_estimate_need", fake)
    text = GOOD.replace('"100MiB"', '"auto"') + 'model = "m:f"\nbatch_size = 8\n'
    p = plan(write(tmp_path, text), budget="1GiB", device="cpu", overhead="10MiB",
             workdir=tmp_path / "wd")
    assert seen == [("m:f", 8, "cpu")]
    assert p.jobs[0].need == 123 * 2**20 and p.jobs[0].need_source == "auto"
    assert p.jobs[0].charge == 133 * 2**20

    monkeypatch.setattr(plan_module, "_estimate_need",
                        lambda job, device: (None, "cannot estimate 'm:f' (error): no module"))
    with pytest.raises(JobsFileError, match="need = 'auto': cannot estimate 'm:f'"):
        plan(write(tmp_path, text), budget="1GiB", device="cpu", overhead="10MiB",
             workdir=tmp_path / "wd")


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path, capsys):
    path = write(tmp_path, GOOD + GOOD.replace('"a"', '"b"').replace('"100MiB"', '"300MiB"'))
    workdir = tmp_path / "wd"
    assert main(["share", str(path), "--dry-run", "--budget", "400MiB", "--overhead",
                 "16MiB", "--device", "cpu", "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert "budget 400.0 MiB (given)" in out and "316.0 MiB" in out
    assert "starting first: b (316.0 MiB of 400.0 MiB); the other queues" in out
    # both fit: nothing queues, and the plan does not say that something does
    assert main(["share", str(path), "--dry-run", "--budget", "1GiB", "--overhead",
                 "16MiB", "--device", "cpu", "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert "starting together: b, a (432.0 MiB of 1.0 GiB)\n" in out, out
    assert "note:" not in out
    assert not workdir.exists()


def test_dry_run_refuses_what_the_run_refuses_and_says_what_it_would(tmp_path, capsys,
                                                                    monkeypatch):
    """A stranger's dry run accepted --interval -1 and a GPU this machine does not have,
    which the real run refuses."""
    import memfit.share.planner as planner

    path = write(tmp_path, GOOD)
    with pytest.raises(SystemExit) as e:
        main(["share", str(path), "--dry-run", "--interval", "-1"])
    assert e.value.code == 2
    assert "argument --interval: must be a positive number of seconds" in capsys.readouterr().err
    monkeypatch.setattr(planner, "gpu_memory", lambda index: None)     # no GPU visible
    assert main(["share", str(path), "--dry-run", "--budget", "1GiB", "--overhead", "16MiB",
                 "--device", "gpu:7", "--workdir", str(tmp_path / "wd")]) == 0
    assert ("note: no GPU 7 is visible here (NVML finds no such card): memfit share would "
            "refuse to run these jobs on this machine") in capsys.readouterr().out


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["share", "--help"])
    out = capsys.readouterr().out
    assert "[[job]]" in out and "memfit share examples/jobs.toml" in out
    assert "--budget" in out and "--restart" in out


def test_a_bad_option_is_named_as_the_option_and_a_bad_file_value_as_the_files(
        tmp_path, capsys):
    """A stranger's `memfit share jobs.toml --budget lots` said "jobs.toml: budget is not a
    size": his file had no budget. The file's own values still say the file."""
    (tmp_path / "jobs.toml").write_text('[[job]]\nname = "a"\ncommand = "python -c pass"\n'
                                        'need = "10MiB"\n')
    for option, value in (("--budget", "lots"), ("--device", "foo"), ("--overhead", "x")):
        assert main(["share", str(tmp_path / "jobs.toml"), "--dry-run", option, value,
                     "--workdir", str(tmp_path / "w")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"memfit share: error: {option} ") and "jobs.toml" not in err
        assert err.rstrip().endswith(f"Received: {option} {value}"), err
    (tmp_path / "bad.toml").write_text('budget = "lots"\n' +
                                       (tmp_path / "jobs.toml").read_text())
    with pytest.raises(JobsFileError, match=r"bad.toml: top of the file: budget is not a size"):
        plan(tmp_path / "bad.toml", workdir=tmp_path / "w")
