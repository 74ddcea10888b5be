"""memfit's block reader (fixed-shape shards read straight into batches) against the
tf.data reader, and its integrity checks."""

import numpy as np
import pytest

import memfit
from memfit.data.format import records
from memfit.data.format.manifest import Feature, Manifest
from memfit.data.format.records import encode_example, frame
from memfit.data.read.blocks import block_layout
from memfit.data.read.blocks import block_reader as blocks
from memfit.data.read.blocks.block_plan import BlockReaderPlan
from memfit.errors import CorruptShardError
from tests.data.helpers import by_id, read_all, small_arrays


@pytest.fixture(autouse=True, params=["into batches", "gathered"])
def placement(request, monkeypatch):
    """Every test twice: samples read straight into their batch rows (memfit's C loop
    checks the CRCs of the scattered records), and records read into scratch buffers,
    then gathered (how the reader works where the extension was not built)."""
    if request.param == "gathered":
        monkeypatch.setattr(records, "NATIVE", None)
    elif records.NATIVE is None:
        pytest.skip("memfit.data.format.cwindow was not built (no C compiler at install)")
    return request.param


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    # 1000 samples, 5 shards per split, 8 samples a record: short last records.
    path = tmp_path_factory.mktemp("blocks") / "ds"
    memfit.pack(small_arrays(1000), path, split="train=0.9,val=0.1", shards=5,
                samples_per_record=8, progress=False)
    return path


@pytest.fixture()
def damaged(tmp_path):
    path = tmp_path / "ds"
    memfit.pack(small_arrays(400), path, shards=2, samples_per_record=10, progress=False)
    m = Manifest.load(path)
    shard = m.splits["train"].shards[0]
    full = block_layout.record_layout(list(m.features.values()), 10).frame_bytes
    return path, m.path / shard.file, full


def ids_of(batches):
    return [b["id"].tolist() for b in batches]


def epoch_ids(path, **kw):
    return ids_of(read_all(path, split="train", **kw)[1])


def test_the_block_reader_reads_fixed_shapes_and_says_so(packed):
    ds = memfit.dataset(packed, 64, split="train")
    plan = ds.memfit_plan
    assert plan.reader == "blocks" and "block reader" in str(plan)
    assert plan.window_samples % 64 == 0 and plan.estimated_bytes <= plan.memory_budget
    tf_plan = memfit.dataset(packed, 64, split="train", reader="tf").memfit_plan
    assert tf_plan.reader == "tf"


def test_variable_shapes_and_compression_stay_on_the_tf_reader(tmp_path):
    rows = [np.arange(i % 5 + 1, dtype=np.int32) for i in range(60)]
    memfit.pack({"tokens": rows, "id": np.arange(60)}, tmp_path / "v", variable=["tokens"],
                progress=False)
    plan = memfit.dataset(tmp_path / "v", 8).memfit_plan
    assert plan.reader == "tf" and "variable shape" in str(plan)
    memfit.pack(small_arrays(100), tmp_path / "z", compression="GZIP", progress=False)
    plan = memfit.dataset(tmp_path / "z", 8).memfit_plan
    assert plan.reader == "tf" and "GZIP" in plan.reader_note
    with pytest.raises(ValueError, match="block reader cannot read"):
        memfit.dataset(tmp_path / "z", 8, reader="blocks")
    with pytest.raises(ValueError, match="reader='mmap'"):
        memfit.dataset(tmp_path / "z", 8, reader="mmap")


@pytest.mark.parametrize("batch_size", [7, 64, 900])
@pytest.mark.parametrize("shuffle", [True, False])
def test_same_samples_per_epoch_as_the_tf_reader(packed, batch_size, shuffle):
    arrays = small_arrays(1000)
    for epoch in (0, 3):
        fast, batches = read_all(packed, split="train", batch_size=batch_size, epoch=epoch,
                                 shuffle=shuffle)
        slow, _ = read_all(packed, split="train", batch_size=batch_size, epoch=epoch,
                           shuffle=shuffle, reader="tf")
        assert sorted(fast["id"].tolist()) == sorted(slow["id"].tolist())
        assert len(set(fast["id"].tolist())) == 900
        assert [len(b["id"]) for b in batches] == \
            [batch_size] * (900 // batch_size) + ([900 % batch_size] if 900 % batch_size else [])
        got = by_id(fast)
        for name in ("x", "y"):
            np.testing.assert_array_equal(got[name], arrays[name][got["id"]])
    if not shuffle:     # stored order is the same for both readers
        assert fast["id"].tolist() == slow["id"].tolist()


def test_windows_are_pure_functions_of_seed_epoch_and_index(packed):
    m = Manifest.load(packed)
    shards = m.splits["train"].shards

    def reader():
        plan = BlockReaderPlan(names=("id",), seed=4, shuffle=True, cycle=3, window=64,
                               batch_size=32, samples=900)
        return blocks.BlockReader(m, shards, plan, on_corrupt="raise")

    a, b = reader(), reader()
    forward = [a.window(2, w)[0].tolist() for w in range(a.windows)]
    backward = [b.window(2, w)[0].tolist() for w in reversed(range(b.windows))][::-1]
    assert forward == backward                     # any order, any thread, same windows
    assert sorted(sum(forward, [])) == sorted(np.concatenate(
        [c for w in range(a.windows) for c in a.window(5, w)]).tolist())
    assert forward != [a.window(3, w)[0].tolist() for w in range(a.windows)]


def test_epochs_mode_and_counter_mode_agree(packed):
    ds = memfit.dataset(packed, 50, split="train", seed=3)
    passes = [[b["id"].numpy().tolist() for b in ds] for _ in range(3)]
    multi = memfit.dataset(packed, 50, split="train", seed=3, epochs=3)
    flat = [b["id"].numpy().tolist() for b in multi]
    assert flat == passes[0] + passes[1] + passes[2]
    assert passes[2] == epoch_ids(packed, batch_size=50, seed=3, epoch=2)


def test_a_pass_given_up_still_moves_the_counter_and_the_next_one_is_exact(packed):
    # The feeder builds the next windows ahead (into the next epoch); a pass left after
    # two batches must not leak its windows into the next pass, which is epoch 1 whole.
    ds = memfit.dataset(packed, 50, split="train", seed=3, memory_budget="48KiB")
    assert ds.memfit_plan.window_samples <= 100        # 9 windows an epoch or more
    it = iter(ds)
    first = [next(it)["id"].numpy().tolist() for _ in range(2)]
    del it
    whole = [b["id"].numpy().tolist() for b in ds]
    exact = {"batch_size": 50, "seed": 3, "memory_budget": "48KiB"}
    assert first == epoch_ids(packed, epoch=0, **exact)[:2]
    assert whole == epoch_ids(packed, epoch=1, **exact)
    assert ds.memfit_epoch_counter.numpy() == 2


def test_two_passes_read_at_once_each_get_a_whole_epoch(packed):
    ds = memfit.dataset(packed, 50, split="train", seed=3, memory_budget="48KiB")
    a, b = iter(ds), iter(ds)
    got_a, got_b = [], []
    for x, y in zip(a, b, strict=True):             # interleaved, batch by batch
        got_a.append(x["id"].numpy().tolist())
        got_b.append(y["id"].numpy().tolist())
    exact = {"batch_size": 50, "seed": 3, "memory_budget": "48KiB"}
    assert got_a == epoch_ids(packed, epoch=0, **exact)
    assert got_b == epoch_ids(packed, epoch=1, **exact)


def test_an_error_in_a_window_built_ahead_reaches_the_pass_that_reads_it(damaged):
    path, bad, full = damaged
    data = bytearray(bad.read_bytes())
    data[7 * full + full // 2] ^= 0xFF                 # record 7: samples 70-79
    bad.write_bytes(bytes(data))
    ds = memfit.dataset(path, 8, shuffle=False, memory_budget="28KiB")
    assert ds.memfit_plan.window_samples == 32         # record 7 is in window 2, built ahead
    seen = []
    with pytest.raises(CorruptShardError, match="record 7 of 20"):
        for b in ds:
            seen.extend(b["id"].numpy().tolist())
    assert len(seen) == len(set(seen)) == 64           # windows 0 and 1, then the error


def test_features_subset_returns_only_what_is_asked(packed):
    ds = memfit.dataset(packed, 32, split="val", features=("y", "id"))
    y, i = next(iter(ds))
    np.testing.assert_array_equal(y.numpy(), small_arrays(1000)["y"][i.numpy()])
    m = Manifest.load(packed)
    plan = BlockReaderPlan(names=("y",), seed=0, shuffle=False, cycle=1, window=32,
                           batch_size=32, samples=100)
    reader = blocks.BlockReader(m, m.splits["val"].shards, plan, on_corrupt="raise")
    out = reader.window(0, 0)
    assert len(out) == 1 and out[0].dtype == np.int64 and out[0].shape == (32,)
    assert set(reader._outputs) == {reader.requested[0]}     # no buffers for x or id


def test_drop_remainder_gives_static_full_batches(packed):
    ds = memfit.dataset(packed, 64, split="train", features=("x", "y"), drop_remainder=True)
    assert ds.element_spec[0].shape.as_list() == [64, 4, 3]
    sizes = [int(x.shape[0]) for x, _ in ds]
    assert sizes == [64] * 14 and ds.cardinality().numpy() == 14


def test_shuffle_mixes_shards_within_batches(packed):
    stored = read_all(packed, split="train", shuffle=False, batch_size=64)[0]["id"].tolist()
    pos = {v: i for i, v in enumerate(stored)}
    shard_of = {v: i * 5 // 900 for v, i in pos.items()}          # about 180 per shard
    first = epoch_ids(packed, batch_size=64)[0]
    assert len({shard_of[v] for v in first}) >= 3


def test_record_layout_matches_what_pack_writes():
    feats = [Feature("x", "float32", (2, 3)), Feature("y", "int64", ())]
    for n in (1, 5, 100):
        lay = block_layout.record_layout(feats, n)
        x = np.arange(n * 6, dtype="<f4").tobytes()
        y = np.arange(n, dtype="<i8").tobytes()
        framed = frame(encode_example({"x": x, "y": y}))
        assert len(framed) == lay.frame_bytes and framed[:12] == lay.header
        payload, pieces = framed[12:-4], []
        at = 0
        for f, off, size in lay.pieces:
            pieces.append(payload[at:at + size])
            if f < 0:
                assert payload[at:at + size] == lay.skeleton[off:off + size]
            at += size
        assert [p for (f, _, _), p in zip(lay.pieces, pieces, strict=True) if f >= 0] == [x, y]


def test_a_corrupt_record_names_the_file_and_the_record(damaged):
    path, bad, full = damaged
    data = bytearray(bad.read_bytes())
    data[7 * full + full // 2] ^= 0xFF                 # inside record 7's data
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError) as e:
        for _ in memfit.dataset(path, 32):
            pass
    message = str(e.value)
    assert str(bad) in message and "record 7 of 20" in message and "CRC32C" in message


def test_a_damaged_length_names_the_record_too(damaged):
    path, bad, full = damaged
    data = bytearray(bad.read_bytes())
    data[3 * full + 2] ^= 0x01                         # record 3's length field
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="record 3 of 20"):
        for _ in memfit.dataset(path, 32, shuffle=False):
            pass


def test_a_truncated_shard_names_the_first_record_cut(damaged):
    path, bad, full = damaged
    bad.write_bytes(bad.read_bytes()[:12 * full + 5])
    with pytest.raises(CorruptShardError) as e:
        for _ in memfit.dataset(path, 32):
            pass
    assert str(bad) in str(e.value) and "record 12 of 20" in str(e.value)


def test_a_longer_shard_is_refused(damaged):
    path, bad, _ = damaged
    bad.write_bytes(bad.read_bytes() + b"\0" * 10)
    with pytest.raises(CorruptShardError, match="more than the manifest says"):
        for _ in memfit.dataset(path, 32):
            pass


def test_skip_leaves_out_only_the_damaged_record(damaged, capfd):
    path, bad, full = damaged
    data = bytearray(bad.read_bytes())
    data[4 * full + full // 2] ^= 0xFF                 # record 4 of the first shard
    bad.write_bytes(bytes(data))
    ds = memfit.dataset(path, 32, on_corrupt="skip")
    ids = np.concatenate([b["id"].numpy() for b in ds])
    assert len(ids) == 390 and len(set(ids.tolist())) == 390
    err = capfd.readouterr().err
    assert f"skipped 1 unreadable records of shard {bad}" in err and "records [4]" in err
    assert err.count("skipped 1 unreadable records") == 1      # not again for windows ahead
    # the next epoch skips it again, without saying it again
    assert len(np.concatenate([b["id"].numpy() for b in ds])) == 390
    assert capfd.readouterr().err.count("skipped 1 unreadable records") == 0


def test_skip_past_a_truncation_counts_the_records_lost(damaged, capfd):
    path, bad, full = damaged
    bad.write_bytes(bad.read_bytes()[:15 * full + 3])  # records 15..19 cut
    ids = np.concatenate([b["id"].numpy() for b in memfit.dataset(path, 32,
                                                                   on_corrupt="skip")])
    assert len(ids) == 350 and len(set(ids.tolist())) == 350
    err = capfd.readouterr().err
    assert f"skipped 5 unreadable records of shard {bad} from record 15 on" in err


def test_plan_shrinks_the_window_before_refusing(packed):
    small = memfit.dataset(packed, 32, split="train", memory_budget="64KiB").memfit_plan
    big = memfit.dataset(packed, 32, split="train", memory_budget="64MiB").memfit_plan
    assert small.window_samples < big.window_samples
    assert small.estimated_bytes <= 64 * 1024
    with pytest.raises(memfit.errors.DatasetError, match="it needs at least") as e:
        memfit.dataset(packed, 32, split="train", memory_budget="1KiB")
    # exact bytes beside the rounded size: a stranger's 1.5 MiB was told it needed 1.5 MiB
    need = int(str(e.value).split("it needs at least ")[1].split(" (")[1].split(" bytes")[0]
               .replace(",", ""))
    memfit.dataset(packed, 32, split="train", memory_budget=need)       # enough, exactly
    with pytest.raises(memfit.errors.DatasetError, match="it needs at least"):
        memfit.dataset(packed, 32, split="train", memory_budget=need - 1)


def test_sharded_workers_split_the_samples(packed):
    parts = [read_all(packed, split="train", shard=(i, 2), batch_size=16)[0]["id"].tolist()
             for i in range(2)]
    assert not set(parts[0]) & set(parts[1]) and len(parts[0]) + len(parts[1]) == 900


def test_a_first_record_not_laid_out_as_packed_goes_to_the_tf_reader(damaged):
    path, bad, _ = damaged
    data = bytearray(bad.read_bytes())
    data[2] ^= 0x01                                    # record 0's length field
    bad.write_bytes(bytes(data))
    ds = memfit.dataset(path, 32)
    assert ds.memfit_plan.reader == "tf" and "not laid out" in ds.memfit_plan.reader_note
    with pytest.raises(CorruptShardError, match=bad.name):
        for _ in ds:
            pass


def test_a_split_smaller_than_the_window_is_said_to_be_shuffled_whole(packed):
    """A stranger's 2,700-sample split was said to be shuffled in windows of 161,344
    samples (5042 batches): the plan shows the window the split fills."""
    plan = memfit.dataset(packed, 64, split="val").memfit_plan      # 100 samples
    assert plan.window_samples > 100
    text = str(plan)
    assert "shuffle window 100 samples (2 batches, the whole split)" in text, text
    assert "windows of 100 samples" in text and f"{plan.window_samples:,}" not in text


def test_a_batch_larger_than_the_split_is_not_counted_as_in_flight(packed):
    """A stranger's batch size of 100,000 over 2,700 samples was said to hold 69.0 MiB in
    flight, for 190 KiB of data: a batch is at most the split, in the block reader and the
    arrays reader alike."""
    whole = memfit.dataset(packed, 100, split="val").memfit_plan            # 100 samples
    huge = memfit.dataset(packed, 100_000, split="val").memfit_plan
    assert huge.estimated_bytes == whole.estimated_bytes, (huge, whole)
    assert "(1 batch, the whole split)" in str(huge), str(huge)
    x = {"x": np.zeros((300, 64), np.float32)}
    arrays_whole = memfit.dataset(x, 300).memfit_plan
    arrays_huge = memfit.dataset(x, 30_000).memfit_plan
    assert arrays_huge.estimated_bytes == arrays_whole.estimated_bytes
