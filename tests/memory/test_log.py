"""The memory log when the disk refuses a line: the run it watches goes on, and the log
stays readable for the runs that append to it later."""

import json
import os
import resource
import subprocess
import sys

import pytest

from memfit.memory.log import LogError, MemoryLog, read_log

linux = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")


def _small_file_limit() -> None:
    # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG (as on a full
    # disk with ENOSPC) instead of killing the process.
    resource.setrlimit(resource.RLIMIT_FSIZE, (600, resource.RLIM_INFINITY))


@linux
def test_a_log_the_disk_refuses_warns_once_and_the_watched_command_goes_on(tmp_path):
    code = "import sys, time; time.sleep(0.5); sys.exit(3)"
    out = subprocess.run(
        [sys.executable, "-m", "memfit", "watch", "--workdir", str(tmp_path / "wd"),
         "--interval", "0.05", "--", sys.executable, "-c", code],
        preexec_fn=_small_file_limit, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 3, out.stderr              # the command's own exit code
    warned = [line for line in out.stderr.splitlines()
              if "could not write the memory log" in line]
    assert len(warned) == 1, out.stderr
    assert "File too large (EFBIG)" in warned[0] and "ulimit -f" in warned[0], warned
    assert "exited with code 3" in out.stderr           # the summary is still printed
    assert [r["event"] for r in read_log(tmp_path / "wd" / "memory.jsonl")][0] == "start"


def test_a_run_appended_to_a_log_cut_short_by_the_disk_reads_whole(tmp_path):
    path = tmp_path / "memory.jsonl"
    with MemoryLog(path, source="first") as log:
        log.write("sample", rss=1, rss_anon=1, rss_file=0)
    with open(path, "a") as f:                  # the disk took half of the next line
        f.write('{"t":1.5,"pid":1,"event":"sam')
    with MemoryLog(path, source="second") as log:
        log.write("sample", rss=2, rss_anon=2, rss_file=0)
    records = list(read_log(path))
    assert [(r["event"], r.get("source")) for r in records] == [
        ("start", "first"), ("sample", None), ("start", "second"), ("sample", None)]
    assert records[-1]["rss"] == 2


def test_a_damaged_line_that_is_not_a_cut_record_is_still_refused(tmp_path):
    path = tmp_path / "memory.jsonl"
    with MemoryLog(path, source="first") as log:
        log.write("sample", rss=1, rss_anon=1, rss_file=0)
    with open(path, "a") as f:
        f.write("not json\n" + json.dumps({"t": 2, "pid": 1, "event": "sample"}) + "\n")
    with pytest.raises(LogError, match="line 3 is not a memfit log record: 'not json'"):
        list(read_log(path))


def test_a_log_that_cannot_be_opened_is_one_line_with_what_to_do(tmp_path):
    where = tmp_path / "memory.jsonl"
    where.mkdir()                               # a directory where the log should be
    with pytest.raises(LogError) as e:
        MemoryLog(where, source="x")
    assert str(where) in str(e.value) and "\n" not in str(e.value)
    assert "Is a directory (EISDIR); choose another --workdir" in str(e.value)

