"""The fast variant of benchmarks/faults_pack.py: `memfit pack` SIGKILLed at random
instants, then rerun, gives the clean pack's bytes, file for file, and no stray file."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import faults_pack  # noqa: E402


def test_sigkill_at_random_instants_then_rerun_is_byte_identical(tmp_path):
    lines = []
    outcome = faults_pack.campaign(tmp_path, kills=3, seed=7, size=48 * 2**20, shards=24,
                                   earliest=faults_pack.startup_seconds(), log=lines.append)
    assert outcome.kills == 3
    assert outcome.identical == 3, outcome.details
    assert outcome.stray_files == 0 and outcome.failed_reruns == 0
    assert "| 3 |" in outcome.table()


def test_the_campaign_sees_a_stray_file(tmp_path):
    """Its checks can fail: a leftover temporary file or an unlisted one is counted."""
    (tmp_path / "manifest.json").write_text('{"splits": {"train": {"shards": '
                                            '[{"file": "train-00000-of-00001.tfrecord"}]}}}')
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    (tmp_path / ".tmp-123-train-00000-of-00001.tfrecord").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert faults_pack.strays(tmp_path) == [".tmp-123-train-00000-of-00001.tfrecord",
                                            "notes.txt"]


def test_sigkill_during_overwrite_leaves_old_or_new_then_rerun_is_byte_identical(tmp_path):
    """`memfit pack --overwrite` over a different dataset, SIGKILLed at random instants
    while it runs: the path holds the old dataset or the new one, whole and verifying
    (the old code left neither), and the rerun the new one with nothing beside it."""
    lines = []
    outcome = faults_pack.campaign_overwrite(tmp_path, kills=3, seed=11, size=32 * 2**20,
                                             shards=16, earliest=faults_pack.startup_seconds(),
                                             log=lines.append)
    assert outcome.kills == 3 and outcome.held_old + outcome.held_new == 3, outcome.details
    assert outcome.held_neither == 0 and outcome.verify_failed == 0, outcome.details
    assert outcome.identical == 3 and outcome.stray_files == 0, outcome.details
    assert outcome.ok and "| 3 |" in outcome.table()
