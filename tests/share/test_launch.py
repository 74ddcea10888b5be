"""memfit.share.launch: how one planned job is started (its command, environment, files)."""

import sys

from memfit.env import GPU_MEMORY_GROWTH_ENV, SHARE_ENV, SHARE_JOB_ENV, WORKDIR_ENV
from memfit.share.launch import (
    CUDA_DEVICES_ENV,
    REQUEST_AT,
    job_command,
    job_environment,
    start_job,
)
from memfit.share.layout import JobFiles, JobRecord
from memfit.share.planner import SUPERVISOR_RSS, PlannedJob

MIB = 2**20


def planned(need, restart=False, env=None):
    return PlannedJob(name="a", command=(sys.executable, "-c", "print('hi')"), need=need,
                      need_source="given", note="given", charge=(need or 0) + 100 * MIB,
                      exclusive=need is None, restart=restart, env=env or {}, index=1)


def test_a_supervised_job_runs_under_memfit_run_held_to_its_share(tmp_path):
    job = planned(200 * MIB, restart=True)
    files = JobFiles.of(tmp_path, "a")
    command = job_command(job, "cpu", files, interval=0.25)
    limit = job.charge - SUPERVISOR_RSS
    assert command[:4] == [sys.executable, "-m", "memfit", "run"]
    assert command[command.index("--workdir") + 1] == str(files.directory)
    assert command[command.index("--interval") + 1] == "0.25"
    assert command[command.index("--start") + 1] == "cold"     # no warm parent in a share
    assert command[command.index("--max-rss") + 1] == str(int(limit * REQUEST_AT))
    assert command[command.index("--hard-rss") + 1] == str(limit)
    assert command[command.index("--") + 1:] == list(job.command)
    on_gpu = job_command(job, "gpu:0", files)
    assert "--max-rss" not in on_gpu and "--hard-rss" not in on_gpu
    assert job_command(planned(200 * MIB), "cpu", files) == list(job.command)


def test_the_environment_names_the_job_its_share_and_its_device(tmp_path):
    files = JobFiles.of(tmp_path, "a")
    env = job_environment(planned(200 * MIB, env={"X": "1"}), "cpu", files)
    assert env[WORKDIR_ENV] == str(files.directory.resolve())
    assert env[SHARE_JOB_ENV] == "a" and env[SHARE_ENV] == str(300 * MIB)
    assert env[CUDA_DEVICES_ENV] == "-1" and env["X"] == "1"
    alone = job_environment(planned(None, env={CUDA_DEVICES_ENV: "3"}), "gpu:1", files)
    assert alone[GPU_MEMORY_GROWTH_ENV] == "1"
    assert alone[CUDA_DEVICES_ENV] == "3"          # the jobs file's env wins


def test_a_started_job_writes_its_output_in_its_directory(tmp_path):
    files = JobFiles.of(tmp_path, "a")
    proc = start_job(planned(200 * MIB), "cpu", files)
    assert proc.wait(timeout=60) == 0
    assert files.stdout.read_text() == "hi\n" and files.stderr.exists()


def test_a_job_record_is_read_back_and_a_bad_one_is_none(tmp_path):
    files = JobFiles.of(tmp_path, "a").create()
    assert files.read_record() is None
    record = JobRecord(name="a", command=("python", "x.py"), device="cpu", exit_code=0,
                       state="finished", peak=5, host_peak=5, share=10, need=4,
                       need_source="given", duration=1.0, restarts=0, t=2.0)
    files.write_record(record)
    assert files.read_record() == record
    files.record.write_text('{"name": "a"}')
    assert files.read_record() is None


def test_a_record_the_disk_refuses_is_lost_not_raised_and_leaves_no_temporary(tmp_path):
    files = JobFiles.of(tmp_path, "a").create()
    files.record.mkdir()                        # the rename cannot land (as on a full disk)
    record = JobRecord(name="a", command=("python", "x.py"), device="cpu", exit_code=0,
                       state="finished", peak=5, host_peak=5, share=10, need=4,
                       need_source="given", duration=1.0, restarts=0, t=2.0)
    files.write_record(record)                  # the share's loop goes on
    assert sorted(p.name for p in files.directory.iterdir()) == ["job.json"]
    assert files.read_record() is None
