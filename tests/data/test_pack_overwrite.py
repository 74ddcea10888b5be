"""overwrite=True never loses the dataset: the new one is packed beside the old one and
swapped in, so a kill at any step leaves the old dataset or the new one, whole and
verifying; a rerun gives the new one, byte for byte, with nothing left beside it."""

import errno
import fcntl
import hashlib
import os

import numpy as np
import pytest

import memfit
from memfit.data.format.manifest import Manifest
from memfit.data.packing import pack_replace, pack_shards
from memfit.errors import DatasetError
from tests.data.helpers import small_arrays

OLD = dict(shards=3, samples_per_record=16)
NEW = dict(shards=4, samples_per_record=16)


class Killed(BaseException):
    """What SIGKILL does to a pack, in-process: it stops, no handler runs."""


def _files(d):
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def setting(tmp_path):
    """An old dataset in home/out beside the user's files; the new one's reference."""
    home = tmp_path / "home"
    out = home / "out"
    memfit.pack(small_arrays(300, seed=1), out, progress=False, **OLD)
    (out / "notes.txt").write_text("mine")
    (out / "raw").mkdir()
    (out / "raw" / "a.bin").write_bytes(b"\0" * 10)
    ref = tmp_path / "ref"
    memfit.pack(small_arrays(400, seed=2), ref, progress=False, **NEW)
    users = {"notes.txt": _files(out)["notes.txt"], "raw/a.bin": _files(out)["raw/a.bin"]}
    return out, _files(out), {**_files(ref), **users}


def _pack_new(out, **kw):
    return memfit.pack(small_arrays(400, seed=2), out, overwrite=True, progress=False,
                       **NEW, **kw)


def _after_rerun(out, new):
    assert _files(out) == new
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]     # nothing beside it
    assert memfit.verify(out).ok


@pytest.mark.parametrize("after", [0, 2])
def test_overwrite_killed_while_writing_keeps_the_old_dataset(setting, monkeypatch, after):
    """The old code deleted the old dataset first: killed here, it left neither."""
    out, old, new = setting
    real, calls = pack_shards.write_shard, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(pack_shards, "write_shard", dies)
    with pytest.raises(Killed):
        _pack_new(out)
    monkeypatch.setattr(pack_shards, "write_shard", real)
    assert _files(out) == old and memfit.verify(out).ok
    r = _pack_new(out)                  # the same command again resumes the new one
    assert r.kept_shards == after
    _after_rerun(out, new)


def _kill_on_call(monkeypatch, module, name, n, before=True):
    """Replaces ``module.name`` by one that dies at its n-th call (before or after it)."""
    real, calls = getattr(module, name), []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) == n and before:
            raise Killed
        result = real(*args, **kwargs)
        if len(calls) == n:
            raise Killed
        return result

    monkeypatch.setattr(module, name, dies)


def _no_exchange(monkeypatch):
    monkeypatch.setattr(pack_replace, "_exchange", lambda a, b: False)


# Each step of the replacement, the kill landing in it; the dataset at `out` then: old or new.
STEPS = {
    "manifest written": (lambda mp: _kill_on_call(mp, Manifest, "save", 1, before=False),
                         "old"),
    "carrying the user's files": (lambda mp: _kill_on_call(mp, pack_replace, "_carry", 2),
                                  "old"),
    "before the exchange": (lambda mp: _kill_on_call(mp, pack_replace, "_exchange", 1), "old"),
    "after the exchange": (lambda mp: _kill_on_call(mp, pack_replace, "_exchange", 1,
                                                    before=False), "new"),
    "deleting the old one": (lambda mp: _kill_on_call(mp, pack_replace, "_delete_tree", 1),
                             "new"),
    "no exchange: first rename": (lambda mp: (_no_exchange(mp),
                                              _kill_on_call(mp, os, "rename", 1)), "old"),
    "no exchange: between the renames": (lambda mp: (_no_exchange(mp),
                                                     _kill_on_call(mp, os, "rename", 2)),
                                         "moved"),
    "no exchange: deleting the old one": (lambda mp: (_no_exchange(mp), _kill_on_call(
        mp, pack_replace, "_delete_tree", 2)), "new"),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_overwrite_killed_at_each_step_of_the_swap(setting, monkeypatch, step):
    out, old, new = setting
    install, left = STEPS[step]
    with monkeypatch.context() as mp:
        install(mp)
        with pytest.raises(Killed):
            _pack_new(out)
    if left == "moved":     # only without RENAME_EXCHANGE: the next pack puts it back
        assert not out.exists() and _files(pack_replace.old_path(out)) == old
    else:
        assert _files(out) == (old if left == "old" else new) and memfit.verify(out).ok
    r = _pack_new(out)
    assert r.kept_shards == 4           # the new shards were finished: none written again
    _after_rerun(out, new)


def test_bad_input_found_late_or_a_full_disk_leave_the_old_dataset(setting, monkeypatch):
    out, old, _ = setting

    def ragged():
        for i in range(400):
            yield {"x": np.zeros(8 if i < 300 else 9, np.float32)}

    with pytest.raises(DatasetError, match="different shapes|first dimension"):
        memfit.pack(ragged(), out, overwrite=True, shard_size="1KiB", progress=False)
    assert _files(out) == old and sorted(p.name for p in out.parent.iterdir()) == ["out"]
    with pytest.raises(DatasetError, match="x=10, y=9"):
        memfit.pack({"x": np.zeros((10, 2)), "y": np.zeros(9)}, out, overwrite=True,
                    progress=False)
    assert _files(out) == old and sorted(p.name for p in out.parent.iterdir()) == ["out"]

    real = pack_shards.ShardWriter.write

    def full(self, data):
        if self.records >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(pack_shards.ShardWriter, "write", full)
    with pytest.raises(DatasetError, match="is full") as e:
        _pack_new(out)
    assert "is untouched" in str(e.value) and "room for both" in str(e.value)
    assert _files(out) == old and sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_users_files_are_kept_across_formats(tmp_path):
    """The user's files in the directory (even the pack's own inputs) survive each
    replacement; an arrays dataset's split directories are replaced with it."""
    out = tmp_path / "out"
    out.mkdir()
    arrays = small_arrays(200)
    for k, v in arrays.items():
        np.save(out / f"{k}.npy", v)
    inputs = {k: str(out / f"{k}.npy") for k in arrays}
    before = _files(out)
    memfit.pack(inputs, out, format="arrays", split="train=0.5,val=0.5", progress=False)
    (out / "train" / "README").write_text("about train")
    x_inode = os.stat(out / "x.npy").st_ino
    memfit.pack(inputs, out, shards=2, overwrite=True, progress=False)
    assert os.stat(out / "x.npy").st_ino == x_inode             # linked across, not copied
    got = _files(out)
    readme = hashlib.sha256(b"about train").hexdigest()
    assert {k: got[k] for k in before} == before and got["train/README"] == readme
    assert not any(k.endswith(".npy") and "/" in k for k in got)      # the arrays are gone
    memfit.pack(inputs, out, format="arrays", overwrite=True, progress=False)
    got = _files(out)
    assert {k: got[k] for k in before} == before and got["train/README"] == readme
    assert not any(".tfrecord" in k for k in got) and memfit.verify(out).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_users_tfrecord_files_are_never_taken_for_shards(tmp_path, capsys):
    """A stranger's --overwrite deleted the TFRecord files of the output directory, the
    pack's own input among them: every name with ".tfrecord" was taken for a shard. Only
    names as memfit names its shards are: beside a dataset the user's TFRecord files are
    carried into the new one; in a directory with no dataset they are refused, with or
    without overwrite, and nothing there changes."""
    import tensorflow as tf

    from memfit.cli import main

    out = tmp_path / "c"
    out.mkdir()
    kinds = ("mine.tfrecords", "b.tfrecord", "c.tfrecord.gz", "d-00000-of-00002.tfrecords")
    with tf.io.TFRecordWriter(str(out / "mine.tfrecords")) as w:
        for i in range(50):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "v": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}))
                .SerializeToString())
    for name in kinds[1:]:
        (out / name).write_bytes(b"the user's")
    (out / "notes.txt").write_text("notes")
    before = _files(out)
    for overwrite in ([], ["--overwrite"]):
        code = main(["pack", "--tfrecord", str(out / "mine.tfrecords"), "-o", str(out),
                     *overwrite])
        err = capsys.readouterr().err
        assert code == 2 and "holds TFRecord files that no memfit pack wrote" in err, err
        assert "(b.tfrecord, c.tfrecord.gz, d-00000-of-00002.tfrecords and 1 more)" in err
        assert "overwrite" not in err.split("pack wrote")[1]
        assert _files(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    # beside a dataset: carried across a replacement, the pack's input among them
    data = tmp_path / "data"
    memfit.pack({"v": np.arange(50)}, data, shards=2, progress=False)
    for name in kinds:
        os.link(out / name, data / name)
    users = {k: v for k, v in _files(out).items() if k in kinds}
    memfit.pack(tfrecord=str(data / "mine.tfrecords"), output=data, shards=3, overwrite=True,
                progress=False)
    got = _files(data)
    assert {k: got[k] for k in kinds} == users and memfit.verify(data).ok
    assert len(Manifest.load(data).split("train").shards) == 3


def test_rerun_rules_after_a_killed_overwrite(setting, monkeypatch):
    """Another pack with overwrite starts the sibling over; a pack without overwrite is
    refused as before and leaves it; one that succeeds removes it; a second replacing
    pack at the same time is refused."""
    out, old, new = setting
    _kill_on_call(monkeypatch, pack_shards, "write_shard", 2)
    with pytest.raises(Killed):
        _pack_new(out)
    monkeypatch.undo()
    staging = pack_replace.staging_path(out)
    assert staging.is_dir()
    with pytest.raises(DatasetError, match="already holds a complete memfit dataset"):
        memfit.pack(small_arrays(400, seed=2), out, progress=False, **NEW)
    assert staging.is_dir() and _files(out) == old
    fd = os.open(staging, os.O_RDONLY)          # a live pack holding it
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(DatasetError, match="Another memfit pack is replacing"):
            _pack_new(out)
    finally:
        os.close(fd)
    assert _files(out) == old
    r = memfit.pack(small_arrays(400, seed=3), out, overwrite=True, progress=False, **NEW)
    assert r.kept_shards == 0 and sorted(p.name for p in out.parent.iterdir()) == ["out"]
    _kill_on_call(monkeypatch, pack_shards, "write_shard", 2)
    with pytest.raises(Killed):
        _pack_new(out)
    monkeypatch.undo()
    again = memfit.pack(small_arrays(400, seed=3), out, progress=False, **NEW)
    assert "complete already" in str(again) and not staging.exists()


def test_overwrite_from_inside_the_directory_is_refused(setting, monkeypatch):
    out, old, _ = setting
    monkeypatch.chdir(out / "raw")
    with pytest.raises(DatasetError, match="working directory .* is inside"):
        _pack_new(out)
    assert _files(out) == old and sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_a_symlinked_directory_is_replaced_where_it_really_is(setting, monkeypatch):
    """The sibling goes beside the real directory (the link is kept); where a hard link
    cannot be made the user's files are copied."""
    out, _, new = setting
    link = out.parent.parent / "link"
    link.symlink_to(out)
    kept = out.parent.parent / "notes.kept"
    os.link(out / "notes.txt", kept)                            # the user's inode
    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.EPERM, "no hard links here")))
    r = _pack_new(link)
    assert r.path == link and link.is_symlink()
    _after_rerun(out, new)
    assert not os.path.samefile(out / "notes.txt", kept)       # a copy, not a link


def test_a_pack_still_writing_into_the_directory_is_not_replaced(setting):
    out, old, _ = setting
    busy = out / f".tmp-{os.getppid()}-train-00000-of-00003.tfrecord"
    busy.write_bytes(b"being written")
    with pytest.raises(DatasetError, match=f"pid {os.getppid()}, still running"):
        _pack_new(out)
    busy.unlink()
    assert _files(out) == old and sorted(p.name for p in out.parent.iterdir()) == ["out"]


@pytest.mark.parametrize("fmt", ["shards", "arrays"])
def test_the_progress_bar_names_the_dataset_and_stays_out_of_logs(setting, monkeypatch,
                                                                  capsys, fmt):
    """`make demo > log` kept 17 redraws of a bar named `pack .out.memfit-new` (the
    staging sibling of an overwrite, a directory the user never made) in the log. On a
    terminal the bar names the dataset; in a file or a pipe there is none."""
    out, _, _ = setting
    kw = {} if fmt == "shards" else {"format": "arrays"}
    memfit.pack(small_arrays(400, seed=2), out, overwrite=True, progress=True, **kw)
    assert capsys.readouterr().err == ""                # stderr is not a terminal here
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    memfit.pack(small_arrays(400, seed=3), out, overwrite=True, progress=True, **kw)
    err = capsys.readouterr().err
    assert "pack out:" in err and "memfit-new" not in err, err
