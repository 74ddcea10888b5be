"""The checkpoint store: atomic switch, what survives a kill, what is refused."""

import json
import os

import pytest

from memfit.atomic import TMP_MARK
from memfit.supervise import CheckpointError, CheckpointStore, checkpoint
from memfit.supervise.checkpoint import STATE_NAME, where


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


def test_a_write_killed_before_its_rename_leaves_the_previous_checkpoint(tmp_path,
                                                                          monkeypatch):
    store = CheckpointStore(tmp_path / "checkpoints")
    write(store, 1, 5)

    def killed(src, dst):
        raise KeyboardInterrupt("killed between the files and the rename")

    monkeypatch.setattr(checkpoint.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        write(store, 2)
    monkeypatch.undo()
    leftovers = [p for p in store.directory.iterdir() if p.name.startswith(TMP_MARK)]
    assert len(leftovers) == 1                       # the half-written one
    assert store.latest().position == (1, 5)         # still the good one
    assert store.clean() == leftovers
    assert not any(p.name.startswith(TMP_MARK) for p in store.directory.iterdir())
    assert write(store, 2).seq == 1


def test_a_damaged_state_file_is_a_clear_error(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    ckpt = write(store, 1)
    (ckpt.path / STATE_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match="ckpt-000000.*cannot be read"):
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
