"""A failed or killed pack leaves nothing behind: no temporary files after a rerun, no
half-written output after bad input or a full disk, and never a directory it did not make."""

import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import memfit
from memfit.data.format.manifest import MANIFEST, Manifest
from memfit.data.packing import arrays_pack, pack_shards
from memfit.data.packing.pack_output import STATE
from memfit.errors import DatasetError, Interrupted
from tests.data.helpers import small_arrays


def _ls(path):
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()                                  # reaped: the pid names no process now
    return proc.pid


class _Killed(BaseException):
    """What SIGKILL does to a pack, played in this process: it stops where it is, and no
    handler of the pack runs (a Ctrl-C's does: it removes a directory with nothing kept)."""


def _interrupted(arrays, out, after, by=KeyboardInterrupt, **kw):
    """A pack stopped (by Ctrl-C, or ``by``) after ``after`` shards were written; the
    exception it ended with."""
    real, calls = pack_shards.write_shard, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            raise by
        return real(*args, **kwargs)

    pack_shards.write_shard = flaky
    try:
        with pytest.raises(by) as e:
            memfit.pack(arrays, out, progress=False, **kw)
    finally:
        pack_shards.write_shard = real
    return e.value


def test_rerun_after_a_kill_removes_the_killed_packs_temporary_shard(tmp_path):
    arrays, kw = small_arrays(800), dict(shards=8, samples_per_record=16)
    reference = memfit.pack(arrays, tmp_path / "ref", progress=False, **kw)
    out = tmp_path / "d"
    _interrupted(arrays, out, after=3, **kw)
    # what SIGKILL leaves in the middle of a shard: its temporary file, half written
    orphan = out / f".tmp-{_dead_pid()}-train-00003-of-00008.tfrecord"
    orphan.write_bytes(b"half a shard")
    r = memfit.pack(arrays, out, progress=False, **kw)
    assert r.kept_shards == 3
    assert _ls(out) == _ls(tmp_path / "ref")                 # no stray file at all
    assert (out / MANIFEST).read_text() == (tmp_path / "ref" / MANIFEST).read_text()
    assert [s.sha256 for s in r.manifest.splits["train"].shards] == \
        [s.sha256 for s in reference.manifest.splits["train"].shards]
    assert memfit.verify(out).ok


def test_kill_inside_the_first_shard_or_before_the_state_is_removed_resumes(tmp_path):
    arrays, kw = small_arrays(400), dict(shards=4, samples_per_record=16)
    ref = tmp_path / "ref"
    memfit.pack(arrays, ref, progress=False, **kw)
    # killed while writing the very first shard: only its temporary file exists
    out = tmp_path / "first"
    _interrupted(arrays, out, after=0, by=_Killed, **kw)
    (out / f".tmp-{_dead_pid()}-train-00000-of-00004.tfrecord").write_bytes(b"x")
    memfit.pack(arrays, out, progress=False, **kw)
    assert _ls(out) == _ls(ref)
    # killed after the manifest was renamed into place but before the state was removed
    out = tmp_path / "late"
    real = Manifest.save

    def save_then_die(self, directory):
        real(self, directory)
        raise KeyboardInterrupt

    Manifest.save = save_then_die
    try:
        with pytest.raises(KeyboardInterrupt):
            memfit.pack(arrays, out, progress=False, **kw)
    finally:
        Manifest.save = real
    assert STATE in _ls(out) and MANIFEST in _ls(out)
    r = memfit.pack(arrays, out, progress=False, **kw)
    assert r.kept_shards == 4 and _ls(out) == _ls(ref) and memfit.verify(out).ok


def test_a_ctrl_c_keeps_the_finished_shards_and_says_so_or_leaves_nothing(tmp_path):
    """A stranger's Ctrl-C in the first pass of a GZIP TFRecord pack left an empty output
    directory, and `memfit pack: interrupted` said nothing of what was left."""
    arrays, kw = small_arrays(800), dict(shards=8, samples_per_record=16)
    e = _interrupted(arrays, tmp_path / "new", after=0, **kw)
    assert isinstance(e, Interrupted) and not (tmp_path / "new").exists()
    assert str(e) == f"nothing was kept ({str(tmp_path / 'new')!r}, which it had made, is removed)"
    deep = tmp_path / "a" / "b"                     # the outermost directory made goes
    _interrupted(arrays, deep, after=0, **kw)
    assert not (tmp_path / "a").exists()
    mine = tmp_path / "mine"                        # the user's own directory stays, empty
    mine.mkdir()
    e = _interrupted(arrays, mine, after=0, **kw)
    assert _ls(mine) == [] and str(e) == f"nothing finished was kept in {str(mine)!r}"
    out = tmp_path / "d"
    e = _interrupted(arrays, out, after=3, **kw)
    assert str(e) == (f"{str(out)!r} keeps the 3 shards finished: rerun the same command "
                      f"to resume there, or delete {str(out)!r} to start over")
    assert STATE in _ls(out) and not any(".tmp-" in n for n in _ls(out))
    assert memfit.pack(arrays, out, progress=False, **kw).kept_shards == 3


def test_the_command_says_what_a_ctrl_c_left(tmp_path, capsys, monkeypatch):
    from memfit.cli import main

    np.save(tmp_path / "x.npy", np.arange(4000, dtype=np.float32).reshape(1000, 4))
    real, calls = pack_shards.write_shard, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pack_shards, "write_shard", flaky)
    out = tmp_path / "out"
    assert main(["pack", f"x={tmp_path / 'x.npy'}", "-o", str(out), "--shards", "5",
                 "--quiet"]) == 130
    err = capsys.readouterr().err
    assert err == (f"memfit pack: interrupted; {str(out)!r} keeps the 2 shards finished: "
                   f"rerun the same command to resume there, or delete {str(out)!r} to "
                   f"start over\n")


def test_a_live_process_temporary_file_is_refused_not_deleted(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    busy = out / f".tmp-{os.getppid()}-train-00000-of-00001.tfrecord"
    busy.write_bytes(b"being written")
    with pytest.raises(DatasetError, match=f"pid {os.getppid()}, still running"):
        memfit.pack(small_arrays(50), out, progress=False)
    assert _ls(out) == [busy.name]


def _ragged():
    for i in range(2000):
        yield {"x": np.zeros(64 if i < 1500 else 65, np.float32)}


@pytest.mark.parametrize("case", ["csv", "empty split", "ragged iterable", "empty iterable split"])
def test_bad_input_found_late_leaves_no_output(tmp_path, case):
    csv = tmp_path / "t.csv"
    csv.write_text("a,b\n" + "".join(f"{i},{i}\n" for i in range(100)) + "3,x\n")
    calls = {
        "csv": lambda out: memfit.pack(csv=str(csv), output=out, progress=False),
        "empty split": lambda out: memfit.pack(small_arrays(10), out, progress=False,
                                               split="train=0.99,val=0.01"),
        "ragged iterable": lambda out: memfit.pack(_ragged(), out, shard_size="16KiB",
                                                   progress=False, shuffle=False),
        "empty iterable split": lambda out: memfit.pack(
            ({"x": np.zeros(64, np.float32)} for _ in range(300)), out, split="a=0.999,b=0.001",
            shard_size="16KiB", progress=False),
    }
    with pytest.raises(DatasetError):
        calls[case](tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()           # the directories it made are gone
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError):
        calls[case](existing)
    assert _ls(existing) == ["notes.txt"]            # kept, and nothing added


def test_output_under_a_regular_file_is_refused_clearly(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(DatasetError, match="'.*afile' is a file, not a directory") as e:
        memfit.pack(small_arrays(10), tmp_path / "afile" / "sub", progress=False)
    assert "Received: output=" in str(e.value)
    with pytest.raises(DatasetError, match="is a file, not a directory"):
        memfit.pack(small_arrays(10), tmp_path / "afile", progress=False)


@pytest.mark.parametrize("fmt", ["tfrecord", "arrays"])
def test_a_full_disk_is_reported_and_leaves_nothing(tmp_path, monkeypatch, fmt):
    calls = []
    writer = pack_shards.ShardWriter if fmt == "tfrecord" else arrays_pack.NpyWriter
    real = writer.write

    def full(self, data):
        calls.append(1)
        if len(calls) > 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(writer, "write", full)
    out = tmp_path / "d"
    with pytest.raises(DatasetError, match="is full") as e:
        memfit.pack(small_arrays(4000), out, shards=8, samples_per_record=4, format=fmt,
                    progress=False) if fmt == "tfrecord" else \
            memfit.pack(small_arrays(4000), out, format=fmt, progress=False,
                        split="train=0.5,val=0.5")
    assert "Free space" in str(e.value) and "nothing of this pack was kept" in str(e.value)
    assert not out.exists()


def test_file_size_limit_from_the_command_line_is_one_line_exit_2(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((4000, 64), np.float32))
    limit = 256 * 1024

    def cap():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "memfit", "pack", f"x={tmp_path / 'x.npy'}",
                           "-o", str(out), "--shards", "2", "--quiet"], preexec_fn=cap,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("memfit pack: error: A file grew past this process's "
                                  "file-size limit (256.0 KiB")
    assert "--shard-size" in proc.stderr
    assert not out.exists()


def test_manifest_is_written_after_every_shard_and_state_goes_last(tmp_path):
    """The order that makes a kill at any instant resumable: state first, manifest, then
    the state is removed."""
    out = tmp_path / "d"
    seen = []
    real = Manifest.save

    def save(self, directory):
        seen.append(sorted(p.name for p in out.iterdir()))
        real(self, directory)

    Manifest.save = save
    try:
        memfit.pack(small_arrays(100), out, shards=2, progress=False)
    finally:
        Manifest.save = real
    assert seen == [[".memfit-pack-state.json", "train-00000-of-00002.tfrecord",
                     "train-00001-of-00002.tfrecord"]]
    assert json.loads((out / MANIFEST).read_text())["totals"]["shards"] == 2
    assert _ls(out) == [MANIFEST, "train-00000-of-00002.tfrecord",
                        "train-00001-of-00002.tfrecord"]


def test_rerunning_a_finished_pack_verifies_it_and_succeeds(tmp_path):
    """A kill that lands as the pack exits leaves a complete dataset: the rerun of the same
    command succeeds without writing; other data or a damaged shard are still refused."""
    arrays, out = small_arrays(200), tmp_path / "d"
    memfit.pack(arrays, out, shards=2, progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = memfit.pack(arrays, out, shards=2, progress=False)
    assert again.kept_shards == 2 and "complete already" in str(again)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with pytest.raises(DatasetError, match="already holds a complete memfit dataset"):
        memfit.pack(arrays, out, shards=4, progress=False)
    shard = out / "train-00000-of-00002.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-1] + b"!")
    with pytest.raises(DatasetError, match="already holds a complete memfit dataset"):
        memfit.pack(arrays, out, shards=2, progress=False)
