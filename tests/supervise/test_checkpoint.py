"""The checkpoint store: atomic switch, what survives a kill, what is refused."""

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from memfit.atomic import TMP_MARK
from memfit.supervise import CheckpointError, CheckpointStore, checkpoint
from memfit.supervise.checkpoint import STATE_NAME, CheckpointWriteError, where
from memfit.supervise.state import CheckpointState


def write(store: CheckpointStore, epoch: int, step: int = 0) -> checkpoint.Checkpoint:
    return store.write({"epoch": epoch, "step": step},
                       lambda d: (d / "model.weights.h5").write_bytes(b"w" * 10))


def test_newest_complete_checkpoint_wins_and_two_are_kept(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    assert store.latest() is None
    for epoch in range(4):
        write(store, epoch)
    names = [p.name for _, p in store.complete()]
    assert names == ["ckpt-000002", "ckpt-000003"]
    latest = store.latest()
    assert latest.position == (3, 0) and latest.seq == 3
    assert latest.state["format"] == "memfit-checkpoint"
    assert (latest.path / "model.weights.h5").read_bytes() == b"w" * 10


def test_a_write_killed_before_its_rename_leaves_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    good = write(store, 1, 5)
    # What a writer SIGKILLed between its files and the rename leaves: a full directory
    # under a temporary name.
    leftover = store.directory / f"{TMP_MARK}4242-ckpt-000001"
    shutil.copytree(good.path, leftover)
    assert store.latest().position == (1, 5)         # still the good one
    assert store.clean() == [leftover]
    assert not any(p.name.startswith(TMP_MARK) for p in store.directory.iterdir())
    assert write(store, 2).seq == 1


def test_a_write_that_raises_leaves_nothing_and_keeps_the_previous(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path / "checkpoints")
    write(store, 1, 5)

    def interrupted(src, dst):
        raise KeyboardInterrupt("interrupted between the files and the rename")

    monkeypatch.setattr(checkpoint.os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write(store, 2)
    monkeypatch.undo()
    assert [p.name for p in store.directory.iterdir()] == ["ckpt-000000"]
    assert store.latest().position == (1, 5)


@pytest.mark.parametrize("code, hint", [(errno.ENOSPC, "free space"),
                                        (errno.EFBIG, "ulimit -f")])
def test_a_full_disk_keeps_the_previous_checkpoint_and_says_what_failed(tmp_path, code,
                                                                         hint):
    store = CheckpointStore(tmp_path / "checkpoints")
    write(store, 1, 5)

    def fill(directory):
        (directory / "model.weights.h5").write_bytes(b"w" * 5)
        raise OSError(code, os.strerror(code))

    with pytest.raises(CheckpointWriteError) as info:
        store.write({"epoch": 2, "step": 0}, fill)
    message = str(info.value)
    assert "ckpt-000001" in message and str(store.directory) in message
    assert os.strerror(code) in message and hint in message
    assert "previous checkpoint ckpt-000000 is kept" in message
    assert info.value.errno == code
    assert [p.name for p in store.directory.iterdir()] == ["ckpt-000000"]
    assert store.latest().position == (1, 5)


def test_a_real_file_size_limit_is_a_clear_error(tmp_path):
    """``ulimit -f``: Python ignores SIGXFSZ, so the write fails with EFBIG."""
    script = textwrap.dedent(f"""
        import resource
        from memfit.supervise import CheckpointStore, CheckpointWriteError
        store = CheckpointStore({str(tmp_path / "checkpoints")!r})
        store.write({{"epoch": 0, "step": 0}}, lambda d: (d / "a").write_bytes(b"x"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            store.write({{"epoch": 1, "step": 0}},
                        lambda d: (d / "a").write_bytes(b"x" * 100_000))
        except CheckpointWriteError as e:
            print("ERROR", e)
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERROR Could not write checkpoint ckpt-000001" in out.stdout
    assert "EFBIG" in out.stdout and "ckpt-000000 is kept" in out.stdout
    store = CheckpointStore(tmp_path / "checkpoints")
    assert [p.name for p in store.directory.iterdir()] == ["ckpt-000000"]


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "state"])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_used(tmp_path, capfd,
                                                                        damage):
    store = CheckpointStore(tmp_path / "checkpoints")
    write(store, 1, 5)
    newest = write(store, 2, 0)
    weights = newest.path / "model.weights.h5"
    if damage == "flip":
        _flip_a_byte(weights)
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:3])
    elif damage == "remove":
        weights.unlink()
    else:                                # the state itself: a digit changed by bit rot
        state = newest.path / STATE_NAME
        state.write_text(state.read_text().replace('"epoch": 2', '"epoch": 3'))
    assert store.latest().position == (1, 5)          # passed over, left in place
    assert (newest.path).exists()
    assert store.recover().position == (1, 5)
    err = capfd.readouterr().err
    named = STATE_NAME if damage == "state" else "model.weights.h5"
    assert "ckpt-000001" in err and named in err and "damaged" in err
    assert not newest.path.exists()
    assert (store.directory / "damaged-ckpt-000001").is_dir()
    # The next checkpoint is written after the good one, never over the damaged one.
    assert write(store, 2, 0).seq == 1


def test_only_damaged_checkpoints_is_an_error_not_a_fresh_start(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    only = write(store, 1, 5)
    _flip_a_byte(only.path / "model.weights.h5")
    with pytest.raises(CheckpointError, match="No usable checkpoint.*sha256"):
        store.recover()
    assert only.path.exists()


def test_a_checkpoint_written_before_checksums_still_loads(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    old = store.directory / "ckpt-000004"
    old.mkdir(parents=True)
    (old / STATE_NAME).write_text(json.dumps({"format": "memfit-checkpoint",
                                              "format_version": 1, "epoch": 3, "step": 0}))
    assert store.recover().position == (3, 0)


def test_a_damaged_state_file_is_a_clear_error(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    ckpt = write(store, 1)
    (ckpt.path / STATE_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match="ckpt-000000.*cannot be read"):
        store.latest()
    (ckpt.path / STATE_NAME).write_text(json.dumps([1, 2]))
    with pytest.raises(CheckpointError, match="not a JSON object"):
        store.latest()
    (ckpt.path / STATE_NAME).write_text(json.dumps({"format": "other", "epoch": 1}))
    with pytest.raises(CheckpointError, match="not a memfit checkpoint"):
        store.latest()


def test_keep_below_two_is_refused(tmp_path):
    with pytest.raises(ValueError, match="Received: keep=1"):
        CheckpointStore(tmp_path, keep=1)


def test_positions_read_like_keras_epochs():
    assert where(2, 0) == "the start of epoch 3"
    assert where(2, 17) == "epoch 3, step 17"


def test_files_are_flushed_before_the_rename(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path / "checkpoints")
    order = []
    real_fsync, real_rename = checkpoint._fsync_tree, os.rename
    monkeypatch.setattr(checkpoint, "_fsync_tree",
                        lambda d: (order.append("fsync"), real_fsync(d)))
    monkeypatch.setattr(checkpoint.os, "rename",
                        lambda a, b: (order.append("rename"), real_rename(a, b)))
    write(store, 0)
    assert order == ["fsync", "rename"]


def test_state_json_keeps_its_format(tmp_path, monkeypatch):
    """A CheckpointState is written as memfit has always written state.json (format 2:
    the same keys in the same order), and read back equal."""
    monkeypatch.setattr(checkpoint.time, "time", lambda: 1796030000.5)
    state = CheckpointState(epoch=3, step=17, seed=42, reason="steps",
                            history={"loss": [1.0, 0.5]}, logs={"loss": 0.25},
                            rng={"python": [3, [1, 2], None]},
                            fingerprint={"weights": [], "names": [], "optimizer": None,
                                         "optimizer_variables": 0})
    ckpt = CheckpointStore(tmp_path).write(state, lambda d: (d / "a").write_bytes(b"x"))
    record = json.loads((ckpt.path / STATE_NAME).read_text())
    assert list(record) == ["format", "format_version", "time", "epoch", "step", "seed",
                            "reason", "history", "logs", "rng", "fingerprint", "files",
                            "checksum"]
    assert record["format_version"] == 2 and record["time"] == 1796030000.5
    assert ckpt.contents == dataclasses.replace(state, time=1796030000.5)
    assert CheckpointStore(tmp_path).latest().contents == ckpt.contents


def test_a_state_with_a_wrong_field_counts_as_damaged(tmp_path, capfd):
    store = CheckpointStore(tmp_path / "checkpoints")
    write(store, 1, 5)
    newest = write(store, 2)
    path = newest.path / STATE_NAME
    record = json.loads(path.read_text())
    record["epoch"] = "two"
    body = {k: v for k, v in record.items() if k != "checksum"}
    record["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    path.write_text(json.dumps(record))
    assert store.recover().position == (1, 5)
    assert "Received: epoch='two'" in capfd.readouterr().err
    with pytest.raises(ValueError, match="Received: step=-1"):
        store.write({"epoch": 3, "step": -1}, lambda d: None)
