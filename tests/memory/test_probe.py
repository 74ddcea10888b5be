import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from memfit.memory import measure, probe, sample
from memfit.memory.probe import _parse_status

linux = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")


@linux
def test_sample_splits_anon_and_file():
    s = sample()
    assert s.pid == os.getpid()
    assert s.rss_anon is not None and s.rss_file is not None
    assert s.rss_anon + s.rss_file <= s.rss + s.rss_file  # parts never exceed what they split
    assert abs(s.rss - (s.rss_anon + s.rss_file + (s.rss_shmem or 0))) < 2**20


@linux
def test_measure_sees_anonymous_peak_of_a_freed_block():
    with measure(interval=0.005) as m:
        block = np.ones(64 * 2**20 // 8)        # 64 MiB, touched
        time.sleep(0.05)
        del block
    assert m.peak.rss_anon - m.before.rss_anon > 60 * 2**20
    assert m.after.rss_anon < m.peak.rss_anon
    assert "peak" in str(m)


@linux
def test_mapped_file_pages_count_as_file_not_anon(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.ones(32 * 2**20 // 8))
    with measure() as m:
        arr = np.load(path, mmap_mode="r")
        total = float(arr.sum())                 # touches every page of the mapping
    assert total == 32 * 2**20 // 8
    assert m.peak.rss_file - m.before.rss_file > 24 * 2**20
    assert m.peak.rss_anon - m.before.rss_anon < 8 * 2**20


@linux
def test_tree_sums_children():
    base = sample(tree=True)
    child = subprocess.Popen([sys.executable, "-c",
                              "import time; b = bytearray(48 * 2**20); time.sleep(30)"])
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            tree = sample(tree=True)
            if tree.rss_anon - base.rss_anon > 40 * 2**20:
                break
            time.sleep(0.05)
        assert tree.processes == base.processes + 1
        assert tree.rss_anon - base.rss_anon > 40 * 2**20
        assert sample().rss_anon - base.rss_anon < 40 * 2**20   # not counted without tree
    finally:
        child.kill()
        child.wait()


@linux
def test_a_zombie_is_gone_not_a_sample():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.time() + 10
        while time.time() < deadline and psutil.Process(child.pid).status() != "zombie":
            time.sleep(0.01)                      # exited, not reaped: a zombie
        with pytest.raises(ProcessLookupError, match=f"pid={child.pid}"):
            sample(child.pid)
    finally:
        child.wait()


def test_a_process_without_an_address_space_holds_no_memory():
    # what /proc/PID/status prints for a process in the middle of exiting (its memory
    # released, not yet a zombie): no Vm*/Rss* lines. The CI once logged such a sample
    # without its anonymous/file split; it is zero, not unknown.
    exiting = "Name:\tpython\nState:\tR (running)\nPid:\t4242\nThreads:\t1\n"
    assert _parse_status(exiting) == {"rss": 0, "rss_anon": 0, "rss_file": 0, "rss_shmem": 0}
    assert _parse_status(exiting.replace("R (running)", "Z (zombie)")) is None
    alive = exiting + "VmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nRssAnon:\t  512 kB\n"
    assert _parse_status(alive) == {"rss_peak": 2 * 2**20, "rss": 2**20, "rss_anon": 2**19}


def test_unknown_pid_is_a_clear_error():
    with pytest.raises(ProcessLookupError, match="pid=999999999"):
        sample(999999999)


def test_measure_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval=0"):
        with measure(interval=0):
            pass


def test_the_kernel_tells_a_shared_address_space_from_a_forked_one():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert probe.shares_memory(os.getpid(), os.getpid())
        assert not probe.shares_memory(os.getpid(), child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_child_in_its_parents_memory_is_not_counted_twice(monkeypatch):
    """A vfork child before its exec shows its parent's whole memory as its own: the tree
    counts it once (the helper's memory), not twice."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.5)
        both = sample(tree=True)
        monkeypatch.setattr(probe, "shares_memory", lambda a, b: b == child.pid)
        alone = sample(tree=True)
        assert both.processes == alone.processes + 1
        assert alone.rss < both.rss
    finally:
        child.kill()
        child.wait()


def test_descendants_below_a_level_leave_out_the_children():
    """A tether's child is memfit run: killing the training means everything below it."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(30)']); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 10
        while len(probe.descendants(child.pid)) < 1 and time.time() < deadline:
            time.sleep(0.05)
        grandchildren = probe.descendants(child.pid)
        assert len(grandchildren) == 1
        everyone = probe.descendants(os.getpid())
        assert child.pid in everyone and grandchildren[0] in everyone
        below = probe.descendants(os.getpid(), below=1)
        assert child.pid not in below and grandchildren[0] in below
    finally:
        for pid in probe.descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()
