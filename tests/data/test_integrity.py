import numpy as np
import pytest
import tensorflow as tf

import memfit
from memfit.data.format.manifest import Manifest
from memfit.errors import CorruptShardError, DatasetError
from tests.data.helpers import small_arrays

READERS = ["blocks", "tf"]


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


@pytest.mark.parametrize("reader", READERS)
def test_corrupt_record_stops_with_memfits_own_short_error(packed, reader):
    bad = shard_path(packed)
    corrupt(bad, bad.stat().st_size // 2)
    with pytest.raises(CorruptShardError) as e:
        for _ in memfit.dataset(packed, 32, reader=reader):
            pass
    message = str(e.value)
    assert message.startswith(f"memfit: shard {bad} is corrupt or truncated: record 10 of 20")
    assert "\n" not in message and len(message) < 280 + len(str(bad)) + len(str(packed))
    assert f"memfit verify {packed}" in message
    assert e.value.file == str(bad) and e.value.record == 10
    assert isinstance(e.value, tf.errors.InvalidArgumentError)    # TensorFlow's error, still
    assert "memfit: shard" in e.value.message
    with pytest.raises(CorruptShardError):                        # next(iter(ds)) too
        ds = memfit.dataset(packed, 400, reader=reader, shuffle=False)
        next(iter(ds))
    report = memfit.verify(packed)
    assert not report.ok
    assert any(p.file == bad.name and p.record is not None for p in report.problems)
    assert any("sha256" in p.message for p in report.problems)
    assert bad.name in str(report)


def test_other_tensorflow_errors_are_not_translated():
    from memfit.data.read.translate_errors import corrupt_shard_error, install

    assert install()
    assert corrupt_shard_error("shape mismatch") is None
    plain = tf.errors.InvalidArgumentError(None, None, "shape mismatch")
    assert type(plain) is tf.errors.InvalidArgumentError
    mentions = tf.errors.InvalidArgumentError(None, None, "memfit: a message of the user's")
    assert not isinstance(mentions, CorruptShardError)


@pytest.mark.parametrize("at", [0.2, 0.5, 0.8])
def test_damage_in_a_gzip_shard_is_not_pinned_on_the_record_where_reading_stopped(tmp_path,
                                                                                  at):
    """TensorFlow decompresses a GZIP shard in chunks and loses the one holding damaged
    compressed bytes, so it stops reading at the start of that chunk (here the first
    record, wherever the damage is). The message says what is known: from which record on
    nothing could be read, and that the damage is there or after it; verify names the
    record."""
    rng = np.random.default_rng(0)
    path = tmp_path / "gz"
    memfit.pack({"x": rng.random((2000, 16), dtype="float32"), "y": np.arange(2000)}, path,
                compression="GZIP", shards=1, samples_per_record=1, shuffle=False,
                progress=False)
    bad = shard_path(path)
    corrupt(bad, int(bad.stat().st_size * at))
    with pytest.raises(CorruptShardError) as e:
        for _ in memfit.dataset(path, 50, shuffle=False):
            pass
    message = str(e.value)
    stopped = int(message.split("its records from ")[1].split(" ")[0])
    assert message.startswith(f"memfit: shard {bad} is corrupt or truncated: its records "
                              f"from {stopped} on, of 2000, cannot be read")
    assert f"at record {stopped} or after it" in message
    assert e.value.file == str(bad) and e.value.record is None
    damaged = [p.record for p in memfit.verify(path).problems if p.record is not None]
    assert len(damaged) == 1 and damaged[0] >= stopped


def test_truncated_shard_is_named_too(packed):
    bad = shard_path(packed, 1)
    bad.write_bytes(bad.read_bytes()[:-100])
    with pytest.raises(CorruptShardError, match=bad.name):
        for _ in memfit.dataset(packed, 32):
            pass
    problems = memfit.verify(packed).problems
    assert any("truncated" in p.message for p in problems)
    assert any("size is" in p.message for p in problems)


@pytest.mark.parametrize("reader", READERS)
def test_skip_reads_past_damage_and_warns_once_with_a_count(packed, capfd, reader):
    bad = shard_path(packed)
    corrupt(bad, bad.stat().st_size - 50)              # inside the last record
    ids = np.concatenate([b["id"].numpy() for b in memfit.dataset(packed, 32, reader=reader,
                                                                  on_corrupt="skip")])
    assert len(ids) == 390 and len(set(ids.tolist())) == 390
    err = capfd.readouterr().err
    assert err.count("skipped 1 unreadable records") == 1 and bad.name in err


@pytest.mark.parametrize("reader", READERS)
def test_skip_leaves_out_a_missing_shard_with_one_warning(packed, capfd, reader):
    gone = shard_path(packed)
    gone.unlink()
    ds = memfit.dataset(packed, 32, reader=reader, on_corrupt="skip")
    ids = np.concatenate([b["id"].numpy() for b in ds])
    assert len(ids) == 200 and len(set(ids.tolist())) == 200
    err = capfd.readouterr().err
    assert err.count("WARNING") == 1
    assert f"skipped shard {gone}: the file is missing; its 200 samples" in err
    with pytest.raises(CorruptShardError, match=f"shard {gone} is missing") as e:
        memfit.dataset(packed, 32, reader=reader)
    assert e.value.file == str(gone)


def test_a_shard_deleted_while_reading_is_skipped_by_the_block_reader(packed, capfd):
    ds = memfit.dataset(packed, 32, reader="blocks", on_corrupt="skip")
    shard_path(packed, 1).unlink()                     # after the dataset was built
    ids = np.concatenate([b["id"].numpy() for b in ds])
    assert len(ids) == 200
    assert capfd.readouterr().err.count("cannot be read") == 1


def test_missing_shard_is_reported(packed):
    shard_path(packed).unlink()
    report = memfit.verify(packed)
    assert [p.message for p in report.problems] == ["file is missing"]
    # a stranger read "verified 3 shards ... 1 problem(s)" where a shard was missing
    assert str(report).startswith(f"checked {report.shards} shards, ")
    assert ": 1 problem\n" in str(report) and "verified" not in str(report)
    # and what to do next (a stranger found none)
    assert str(report).endswith("\nRestore the damaged files from a copy, or pack the "
                                "dataset again (memfit pack); to train on what is intact, "
                                "read it with on_corrupt='skip'.")


def test_a_manifest_that_is_not_json_is_said_in_words_with_what_to_do(packed):
    text = (packed / "manifest.json").read_text()
    (packed / "manifest.json").write_text(text[:-40])
    with pytest.raises(DatasetError) as e:
        memfit.dataset(packed, 8)
    assert "JSONDecodeError(" not in str(e.value), e.value   # a Python repr, before
    assert "is damaged or not a memfit manifest (Unterminated string" in str(e.value) \
        or "is damaged or not a memfit manifest (Expecting" in str(e.value), e.value
    assert str(e.value).endswith("Pack the dataset again (memfit pack) or restore "
                                 "manifest.json from a copy.")


def test_clean_dataset_verifies(packed):
    report = memfit.verify(packed)
    assert report.ok and report.records == 40 and "OK" in str(report)


def test_verify_counts_the_samples_a_shard_holds_against_the_manifest(tmp_path):
    """A stranger edited a shard's sample count in manifest.json: verify said OK, and the
    reader then stopped on TensorFlow's "Input dataset was expected to contain 10
    elements". Verify reads each record's samples too (fixed and variable features)."""
    import json

    for name, arrays, kw in (
            ("fixed", small_arrays(400), dict(shards=4, samples_per_record=20)),
            ("ragged", {"t": [np.arange(i % 7 + 1) for i in range(90)]},
             dict(shards=3, samples_per_record=8, variable=["t"]))):
        out = tmp_path / name
        memfit.pack(arrays, out, progress=False, **kw)
        assert memfit.verify(out).ok
        doc = json.loads((out / "manifest.json").read_text())
        shard = doc["splits"]["train"]["shards"][1]
        real = shard["samples"]
        shard["samples"] -= 10                       # the records stay the same in number
        doc["splits"]["train"]["samples"] -= 10
        (out / "manifest.json").write_text(json.dumps(doc))
        report = memfit.verify(out)
        assert [p.message for p in report.problems] == [
            f"holds {real} samples; the manifest says {real - 10}"], name
