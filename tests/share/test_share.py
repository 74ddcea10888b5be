"""memfit share end to end on the CPU, with small jobs that hold a known amount of memory.

The jobs are tests/share/scripts/hold.py (no TensorFlow): each holds N MiB for some
seconds; a "liar" claims a small need and keeps growing. The per-process overhead is
given (16 MiB: a bare Python holds about 3 MiB) so that the numbers stay small.
"""

import json
import math
import sys
from pathlib import Path

import pytest

import memfit
from memfit.cli import main
from memfit.errors import MemfitError
from memfit.memory.log import read_log
from memfit.share import plan
from memfit.share.planner import SUPERVISOR_RSS

HOLD = Path(__file__).parent / "scripts" / "hold.py"
MIB = 2**20
OVERHEAD = "16MiB"


def hold(mib: float, seconds: float, *extra: str) -> list[str]:
    return ["python", str(HOLD), "--mib", str(mib), "--seconds", str(seconds), *extra]


def intervals(records: list[dict]) -> list[tuple[float, float, int, str]]:
    """(start, end, share, job) of every job, from its job_start and exit events."""
    starts = {r["job"]: r for r in records if r["event"] == "job_start"}
    ends = {r["job"]: r for r in records if r["event"] == "exit" and "job" in r}
    return [(s["t"], ends[name]["t"], s["share"], name) for name, s in starts.items()]


def test_four_jobs_two_at_a_time_never_over_the_budget(tmp_path):
    budget = 240 * MIB            # each job: 100 MiB + 16 MiB overhead; two fit, three do not
    jobs = [{"name": n, "command": hold(100, 1.5), "need": "100MiB"} for n in "abcd"]
    result = memfit.share_jobs(jobs, budget=budget, device="cpu", overhead=OVERHEAD,
                          workdir=tmp_path, interval=0.1, out=False)
    summary = str(result)                         # shown when an assertion fails
    assert result.ok and result.exit_code == 0, summary
    assert [j.state for j in result.jobs] == ["finished"] * 4, summary
    assert all(j.exit_code == 0 and j.share == 116 * MIB for j in result.jobs), summary
    assert all(100 * MIB <= j.peak <= 116 * MIB for j in result.jobs), summary
    # two at a time, so well below running them one after another (same run, same load)
    assert result.makespan < 0.8 * result.serial, summary
    assert result.max_charged == 232 * MIB, summary

    records = list(read_log(result.log_path))
    assert records[0]["source"] == "share" and records[0]["budget"] == budget
    # the shares charged at once, rebuilt from job_start/exit: never above the budget
    spans = intervals(records)
    assert len(spans) == 4
    for t, *_ in spans:
        concurrent = [s for s in spans if s[0] <= t < s[1]]
        assert sum(s[2] for s in concurrent) <= budget
        assert len(concurrent) <= 2
    assert max(len([s for s in spans if s[0] <= t < s[1]]) for t, *_ in spans) == 2
    # the memory measured at each sweep (one tick): never above the budget either
    by_tick: dict[int, list[dict]] = {}
    for r in records:
        if r["event"] == "sample":
            assert r["job"] in "abcd" and r["share"] == 116 * MIB and r["scope"] == "tree"
            by_tick.setdefault(r["tick"], []).append(r)
    assert by_tick and max(len(v) for v in by_tick.values()) == 2
    assert max(sum(r["rss_anon"] for r in v) for v in by_tick.values()) <= budget
    assert max(sum(r["rss_anon"] for r in v) for v in by_tick.values()) > 200 * MIB
    sweeps = [r for r in records if r["event"] == "share"]
    assert max(r["charged"] for r in sweeps) == 232 * MIB
    assert all(r["charged"] <= budget and r["in_use"] <= budget for r in sweeps)
    # each job's samples under its own pid, with its job name
    pids = {r["job"]: r["pid"] for r in records if r["event"] == "job_start"}
    assert len(set(pids.values())) == 4
    assert all(r["pid"] == pids[r["job"]] for r in records if r["event"] == "sample")
    # per-job output and record
    for j in result.jobs:
        assert (j.directory / "stdout.log").read_text().startswith("held 100 MiB")
        record = json.loads((j.directory / "job.json").read_text())
        assert record["exit_code"] == 0 and record["peak"] == j.peak

    # memfit report draws every job on one timeline
    from memfit.report import load, write_report

    data = load(tmp_path)
    drawn = {p.pid: p for p in data.processes.values() if p.samples}
    assert set(drawn) == set(pids.values())
    assert all("hold.py" in p.command for p in drawn.values())
    report = write_report(tmp_path)
    assert report.png.stat().st_size > 10_000 and len(report.summary) == 4


def test_a_job_over_its_share_is_stopped_and_the_others_finish(tmp_path):
    jobs = [{"name": "n1", "command": hold(40, 2.0), "need": "50MiB"},
            {"name": "liar", "command": hold(10, 4.0, "--grow-to", "400"), "need": "30MiB"},
            {"name": "n2", "command": hold(40, 2.0), "need": "50MiB"}]
    result = memfit.share_jobs(jobs, budget="400MiB", device="cpu", overhead=OVERHEAD,
                          workdir=tmp_path, interval=0.1, out=False)
    liar = result["liar"]
    assert liar.state == "stopped" and liar.exit_code == 128 + 9
    assert "went above its share 46.0 MiB" in liar.reason
    assert liar.share < liar.peak < 300 * MIB       # caught long before its 400 MiB
    assert result["n1"].state == result["n2"].state == "finished"
    assert liar.ended < min(result["n1"].ended, result["n2"].ended)
    assert result.exit_code == 1
    kills = [r for r in read_log(result.log_path) if r["event"] == "kill"]
    assert [(k["job"], k["reason"], k["pid"]) for k in kills] == \
        [("liar", "over-share", liar.pid)]
    assert "liar" in str(result) and "stopped" in str(result)


def test_with_restart_a_job_over_its_share_is_restarted(tmp_path):
    # The liar grows past its share in its first run only (a marker in its workdir).
    jobs = [{"name": "n1", "command": hold(40, 2.5), "need": "50MiB"},
            {"name": "liar", "command": hold(10, 1.0, "--grow-to", "400", "--once",
                                              "--step-seconds", "0.1"),
             "need": "30MiB"}]
    result = memfit.share_jobs(jobs, budget="400MiB", device="cpu", overhead=OVERHEAD,
                          workdir=tmp_path, interval=0.1, restart=True, out=False)
    assert result.ok, str(result)
    liar = result["liar"]
    assert liar.state == "finished" and liar.restarts == 1
    assert liar.share == 30 * MIB + 16 * MIB + SUPERVISOR_RSS
    assert result["n1"].restarts == 0
    restarts = [r for r in read_log(result.log_path) if r["event"] == "restart"]
    assert [(r["job"], r["pid"]) for r in restarts] == [("liar", liar.pid)]
    # memfit run kept its own log and checkpoints directory in the job's directory
    inner = [r["event"] for r in read_log(liar.directory / "memory.jsonl")]
    assert "restart" in inner


def test_a_need_left_out_is_learned_from_the_previous_run(tmp_path):
    jobs = [{"name": "x", "command": hold(30, 0.3)}]
    first = plan(jobs, budget="1GiB", device="cpu", overhead=OVERHEAD, workdir=tmp_path)
    (job,) = first.jobs
    assert job.exclusive and job.charge == 2**30 and job.need_source == "unknown"
    assert "runs alone" in first.warnings[0]
    result = memfit.share_jobs(first, interval=0.1, out=False)
    assert result.ok
    peak = result["x"].peak
    second = plan(jobs, budget="1GiB", device="cpu", overhead=OVERHEAD, workdir=tmp_path)
    (job,) = second.jobs
    assert job.need_source == "learned" and not job.exclusive
    assert job.charge == math.ceil(peak * 1.1)         # the peak + 10 %
    assert "learned: peak" in job.note
    # another command is another job: nothing learned
    other = plan([{"name": "x", "command": hold(31, 0.3)}], budget="1GiB", device="cpu",
                 overhead=OVERHEAD, workdir=tmp_path)
    assert other.jobs[0].exclusive


def test_the_command_line_runs_a_jobs_file(tmp_path, capsys):
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'budget = "200MiB"\noverhead = "{OVERHEAD}"\ndevice = "cpu"\n'
                    + "".join(f'[[job]]\nname = "{n}"\ncommand = {json.dumps(hold(20, 0.3))}\n'
                              f'need = "30MiB"\n' for n in ("p", "q"))
                    + f'[[job]]\nname = "bad"\ncommand = {json.dumps(hold(1, 0, "--exit", "3"))}'
                    f'\nneed = "10MiB"\n')
    code = main(["share", str(jobs), "--workdir", str(tmp_path / "wd"), "--interval", "0.1"])
    err = capsys.readouterr().err
    assert code == 1                                    # one job failed
    assert "started p" in err and "bad failed (exit code 3)" in err
    assert "memfit share: 3 jobs on cpu, budget 200.0 MiB: 2 finished, 1 failed" in err
    assert "makespan" in err and "one after another" in err
    assert (tmp_path / "wd" / "jobs" / "bad" / "job.json").exists()


def test_a_bad_interval_and_a_workdir_with_another_log(tmp_path):
    jobs = [{"name": "x", "command": hold(1, 0)}]
    with pytest.raises(ValueError, match="Received: interval=0"):
        memfit.share_jobs(jobs, interval=0, out=False)
    (tmp_path / "memory.jsonl").write_text("a,b\n1,2\n")
    with pytest.raises(MemfitError, match="not a memfit log"):
        plan(jobs, budget="1GiB", device="cpu", overhead=OVERHEAD, workdir=tmp_path)


def test_import_memfit_stays_free_of_tensorflow():
    import subprocess

    code = ("import sys, memfit; memfit.share; memfit.configure_device; "
            "import memfit.cli; print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_sigterm_stops_every_job_and_starts_no_more(tmp_path):
    import os
    import signal
    import subprocess
    import time

    import psutil

    jobs = tmp_path / "jobs.toml"
    jobs.write_text('budget = "100MiB"\n' + "".join(
        f'[[job]]\nname = "{n}"\ncommand = {json.dumps(hold(10, 60))}\nneed = "20MiB"\n'
        for n in ("a", "b", "c")))
    workdir = tmp_path / "wd"
    proc = subprocess.Popen([sys.executable, "-m", "memfit", "share", str(jobs), "--workdir",
                             str(workdir), "--overhead", OVERHEAD, "--device", "cpu",
                             "--interval", "0.1"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log = workdir / "memory.jsonl"
    deadline = time.monotonic() + 60
    started: list[dict] = []
    while len(started) < 2 and time.monotonic() < deadline:       # two fit, one queues
        time.sleep(0.1)
        if log.exists():
            started = [r for r in read_log(log) if r["event"] == "job_start"]
    assert len(started) == 2, "the jobs did not start"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGTERM: stopping 2 running job(s); 1 not started" in err
    assert "2 interrupted, 1 not started" in err
    for r in started:
        assert not psutil.pid_exists(r["pid"]) or \
            psutil.Process(r["pid"]).status() == psutil.STATUS_ZOMBIE
    events = [r["event"] for r in read_log(log)]
    assert events.count("job_start") == 2 and events[-1] == "stop"


@pytest.mark.slow
def test_a_real_keras_training_with_need_auto(tmp_path):
    """examples/share/train.py trains a small MLP; its need is memfit's estimate (made in a
    child process: this one imports no TensorFlow), next to a job without TensorFlow."""
    train = Path(__file__).parents[2] / "examples" / "share" / "train.py"
    jobs = [{"name": "keras", "command": ["python", str(train), "--epochs", "1",
                                          "--samples", "512"],
             "need": "auto", "model": f"{train}:build_model", "batch_size": 32},
            {"name": "plain", "command": hold(20, 1.0), "need": "30MiB"}]
    # 300 MiB of overhead: generous for TensorFlow's baseline (218 MiB calibrated here)
    p = plan(jobs, budget="1GiB", device="cpu", overhead="300MiB", workdir=tmp_path)
    keras_job = next(j for j in p.jobs if j.name == "keras")
    assert keras_job.need_source == "auto" and 2**20 < keras_job.need < 200 * 2**20
    result = memfit.share_jobs(p, interval=0.2, out=False)
    assert result.ok, str(result)
    keras_result = result["keras"]
    assert 150 * MIB < keras_result.peak <= keras_result.share
    assert "loss" in (keras_result.directory / "stdout.log").read_text()
    # on the CPU memfit share hands down no GPU setting: configure_device says so
    assert "configure_device: nothing to configure" in \
        (keras_result.directory / "stdout.log").read_text()


def test_two_needs_estimated_in_one_plan_pay_one_import(tmp_path, monkeypatch):
    """Each `need = 'auto'` is estimated in a child; two or more of them are forked from one
    warm parent that imported the frameworks once (memfit.estimate.measure.warm_children),
    and a larger batch still needs more. (Batch sizes no other test asks for: the planner
    keeps each estimate for the session.)"""
    from memfit.memory.warm import WarmParent

    forked = []
    real_start = WarmParent.start
    monkeypatch.setattr(WarmParent, "start",
                        lambda self, *a, **k: forked.append(k.get("module")) or
                        real_start(self, *a, **k))
    train = Path(__file__).parents[2] / "examples" / "share" / "train.py"
    jobs = [{"name": f"b{b}", "command": ["python", str(train)], "need": "auto",
             "model": f"{train}:build_model", "batch_size": b} for b in (48, 4096)]
    p = plan(jobs, budget="4GiB", device="cpu", overhead="300MiB", workdir=tmp_path)
    small, large = (next(j for j in p.jobs if j.name == n) for n in ("b48", "b4096"))
    assert forked == ["memfit.estimate.child"] * 2
    assert small.need_source == large.need_source == "auto"
    assert 2**20 < small.need < large.need, (small.need, large.need)


def test_a_gpu_this_machine_does_not_have_is_refused_before_anything_starts(tmp_path):
    """Without the card nothing could watch or enforce the jobs' GPU memory: one clear
    error (exit 2 from the CLI), not a run with every peak '-' and exit 0."""
    workdir = tmp_path / "share"
    jobs = [{"name": "a", "command": [sys.executable, "-c", "pass"], "need": "64MiB"}]
    with pytest.raises(MemfitError, match="cannot see GPU 99") as e:
        memfit.share_jobs(jobs, device="gpu:99", budget="1GiB", overhead="16MiB",
                     workdir=workdir, out=False)
    assert e.value.exit_code == 2 and "--device cpu" in str(e.value)
    assert not workdir.exists()
