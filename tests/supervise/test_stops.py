"""Why ``memfit run`` stops: restarts for ``--max-rss`` that make no headway.

A stranger set ``--max-rss`` between a process's start-up and its first step's peak: the
run took 11 one-step processes before ``--max-restarts`` stopped it, with no hint why.
"""

from __future__ import annotations

import signal
import sys

import pytest

import memfit
from memfit.memory.probe import Sample, oom_kills
from memfit.supervise.run_results import Cause, ChildRun
from memfit.supervise.stops import STALLED_AFTER, memory_stall, repeated, tally

MIB = 2**20


def _child(resumed, ended, cause=Cause.RESTART, reason="max-rss", mib=700, code=75,
           oom=None):
    peak = Sample(t=0.0, pid=1, rss=mib * MIB, rss_anon=mib * MIB, rss_file=0)
    return ChildRun(pid=1, exit_code=code, cause=cause, reason=reason, started=0.0, ended=1.0,
                    peak=peak, resumed_at=resumed, ended_at=ended, oom_killed=oom)


def _steps(n, start=0, **kw):
    return [_child((0, start + i), (0, start + i + 1), **kw) for i in range(n)]


def test_one_step_max_rss_restarts_in_a_row_stop_with_the_peak_to_raise_above():
    runs = _steps(STALLED_AFTER - 1, mib=650) + [_child((0, 9), (0, 10), mib=710)]
    said = memory_stall(runs, 600 * MIB)
    assert said is not None
    assert f"{STALLED_AFTER} processes in a row reached --max-rss 600.0 MiB" in said
    assert "650.0 MiB–710.0 MiB" in said and "Raise --max-rss above 710.0 MiB" in said


def test_headway_fewer_restarts_or_no_limit_do_not_stop():
    assert memory_stall(_steps(STALLED_AFTER - 1), 600 * MIB) is None
    assert memory_stall(_steps(STALLED_AFTER), None) is None
    # one of them trained five steps: a slow leak restarted by memory, not a stall
    runs = _steps(STALLED_AFTER - 1) + [_child((0, 5), (0, 10))]
    assert memory_stall(runs, 600 * MIB) is None
    # crashes after one step are not memory restarts (repeated() judges those)
    assert memory_stall(_steps(STALLED_AFTER, cause=Cause.CRASH, reason="exit code 1"),
                        600 * MIB) is None
    # one step across an epoch's end is an epoch of headway, not judged here
    assert memory_stall(_steps(STALLED_AFTER - 1) + [_child((0, 3), (1, 0))],
                        600 * MIB) is None


def test_the_same_failure_twice_with_no_progress_is_said_once():
    same = [_child((0, 4), (0, 4), cause=Cause.CRASH, reason="exit code 1")] * 2
    assert "twice in a row at epoch 1, step 4" in repeated(same)
    assert repeated(same[:1]) is None
    assert "two restarts for --max-rss in a row made no progress" in \
        repeated([_child((0, 4), (0, 4))] * 2)


def test_sigkills_the_oom_killer_did_not_send_are_not_a_loop():
    """On JAX a process recompiles for seconds before its first checkpoint, so random
    SIGKILLs landed twice in a row with no progress between and were called a loop."""
    def killed(oom):
        return _child((0, 0), (0, 0), cause=Cause.KILLED, reason="SIGKILL", code=137, oom=oom)

    assert repeated([killed(False), killed(False)]) is None
    assert "twice in a row" in repeated([killed(True), killed(True)])
    assert "twice in a row" in repeated([killed(None), killed(None)])   # the kernel is silent
    assert "twice in a row" in repeated([killed(False), killed(True)])


def test_the_tally_counts_why_and_names_the_fix_when_memory_led():
    runs = _steps(3) + [_child((0, 3), (0, 9), cause=Cause.KILLED, reason="SIGKILL")]
    said = tally(runs)
    assert said.startswith("3 for --max-rss, 1 killed;") and "raise --max-rss" in said
    assert tally(runs[2:]) == "1 for --max-rss, 1 killed"


# A training without a framework that speaks the restart protocol as a session does: it
# resumes from the newest checkpoint, holds memory above --max-rss, and on the request
# checkpoints one step further and exits 75.
CHILD = """
import os, sys, time
from memfit.supervise.checkpoint import CheckpointStore
from memfit.supervise.restart_protocol import read_request
from memfit.supervise.state import CheckpointState
wd = os.environ["MEMFIT_WORKDIR"]
store = CheckpointStore(os.path.join(wd, "checkpoints"))
latest = store.latest()
step = latest.step if latest else 0
if step >= 20:
    sys.exit(0)
held = bytearray(int(sys.argv[1]) * 2**20)
held[::4096] = b"x" * len(held[::4096])
for _ in range(400):
    if read_request(wd) is not None:
        store.write(CheckpointState(epoch=0, step=step + 1, reason="max-rss"),
                    lambda d: None)
        sys.exit(75)
    time.sleep(0.025)
sys.exit(1)
"""


def test_a_run_whose_processes_each_reach_max_rss_at_once_stops_with_the_fix(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    result = memfit.run([sys.executable, str(script), "120"], workdir=tmp_path / "wd",
                        max_rss="80MiB", interval=0.05, backoff=0.0, start="cold",
                        out=False)
    assert [c.cause for c in result.children] == ["restart"] * STALLED_AFTER
    assert result.epoch == 0 and not result.finished
    assert f"{STALLED_AFTER} processes in a row reached --max-rss 80.0 MiB" in \
        result.stop_reason
    assert "Raise --max-rss above" in result.stop_reason


KILLED_TWICE = """
import os, pathlib, signal, sys
n = pathlib.Path(sys.argv[1])
runs = int(n.read_text()) + 1 if n.exists() else 1
n.write_text(str(runs))
if runs <= 2:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_two_sigkills_in_a_row_not_sent_by_the_oom_killer_are_restarted(tmp_path):
    if oom_kills() is None:
        pytest.skip("this kernel does not count OOM kills (/proc/vmstat oom_kill)")
    script = tmp_path / "killed.py"
    script.write_text(KILLED_TWICE)
    before = oom_kills()
    result = memfit.run([sys.executable, str(script), str(tmp_path / "n")],
                        workdir=tmp_path / "wd", backoff=0.0, start="cold", out=False)
    if oom_kills() != before:
        pytest.skip("the OOM killer killed something on this machine meanwhile")
    assert result.finished, result.stop_reason
    assert [c.cause for c in result.children] == ["killed", "killed", "finished"]
    assert [c.oom_killed for c in result.children[:2]] == [False, False]
    assert all(c.exit_code == 128 + signal.SIGKILL for c in result.children[:2])
    assert result.children[0].reason == \
        "SIGKILL, not by the OOM killer: the kernel counted none meanwhile"
