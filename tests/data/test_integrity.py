import numpy as np
import pytest
import tensorflow as tf

import memfit
from memfit.data.manifest import Manifest
from tests.data.helpers import small_arrays


@pytest.fixture()
def packed(tmp_path):
    path = tmp_path / "ds"
    memfit.pack(small_arrays(400), path, shards=2, samples_per_record=10, progress=False)
    return path


def shard_path(path, i=0):
    m = Manifest.load(path)
    return m.path / m.splits["train"].shards[i].file


def corrupt(file, at):
    data = bytearray(file.read_bytes())
    data[at] ^= 0xFF
    file.write_bytes(bytes(data))


def test_corrupt_record_stops_with_the_shard_named(packed):
    bad = shard_path(packed)
    corrupt(bad, bad.stat().st_size // 2)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        for _ in memfit.dataset(packed, 32):
            pass
    assert bad.name in str(e.value) and "corrupt or truncated" in str(e.value)
    report = memfit.verify(packed)
    assert not report.ok
    assert any(p.file == bad.name and p.record is not None for p in report.problems)
    assert any("sha256" in p.message for p in report.problems)
    assert bad.name in str(report)


def test_truncated_shard_is_named_too(packed):
    bad = shard_path(packed, 1)
    bad.write_bytes(bad.read_bytes()[:-100])
    with pytest.raises(tf.errors.InvalidArgumentError, match=bad.name):
        for _ in memfit.dataset(packed, 32):
            pass
    problems = memfit.verify(packed).problems
    assert any("truncated" in p.message for p in problems)
    assert any("size is" in p.message for p in problems)


def test_skip_reads_past_damage_and_warns_with_a_count(packed, capfd):
    bad = shard_path(packed)
    corrupt(bad, bad.stat().st_size - 50)              # inside the last record
    ids = np.concatenate([b["id"].numpy() for b in memfit.dataset(packed, 32,
                                                                  on_corrupt="skip")])
    assert len(ids) == 390 and len(set(ids.tolist())) == 390
    err = capfd.readouterr().err
    assert "skipped 1 unreadable records" in err and bad.name in err


def test_missing_shard_is_reported(packed):
    shard_path(packed).unlink()
    report = memfit.verify(packed)
    assert [p.message for p in report.problems] == ["file is missing"]


def test_clean_dataset_verifies(packed):
    report = memfit.verify(packed)
    assert report.ok and report.records == 40 and "OK" in str(report)
