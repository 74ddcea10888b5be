import numpy as np
import pytest
import tensorflow as tf

import memfit
from memfit.errors import DatasetError
from tests.data.helpers import read_all, small_arrays


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "ds"
    memfit.pack(small_arrays(1000), path, split="train=0.9,val=0.1", shards=6,
                samples_per_record=8, progress=False)
    return path


def ids(batches):
    return [b["id"].tolist() for b in batches]


def epoch_batches(path, **kw):
    return ids(read_all(path, split="train", **kw)[1])


def test_every_sample_exactly_once_per_epoch(packed):
    cols, batches = read_all(packed, split="train", batch_size=64)
    assert sorted(cols["id"].tolist()) == sorted(set(cols["id"].tolist()))
    assert len(cols["id"]) == 900
    assert [len(b["id"]) for b in batches] == [64] * 14 + [4]


def test_drop_remainder_gives_full_batches_only(packed):
    _, batches = read_all(packed, split="train", batch_size=64, drop_remainder=True)
    assert [len(b["id"]) for b in batches] == [64] * 14
    ds = memfit.dataset(packed, 64, split="train", drop_remainder=True)
    assert ds.memfit_plan.steps_per_epoch == 14 and ds.cardinality().numpy() == 14


def test_order_is_a_pure_function_of_seed_and_epoch(packed):
    a = epoch_batches(packed, seed=5, epoch=3)
    b = epoch_batches(packed, seed=5, epoch=3)
    assert a == b
    assert a != epoch_batches(packed, seed=5, epoch=4)
    assert a != epoch_batches(packed, seed=6, epoch=3)


def test_each_pass_is_the_next_epoch_and_epoch_k_can_be_asked_directly(packed):
    ds = memfit.dataset(packed, 64, split="train", seed=1)
    passes = [[b["id"].numpy().tolist() for b in ds] for _ in range(3)]
    assert passes[0] != passes[1] != passes[2]
    assert passes[2] == epoch_batches(packed, seed=1, epoch=2)
    # one pass over several epochs (for steps_per_epoch) gives the same batches
    multi = memfit.dataset(packed, 64, split="train", seed=1, epoch=1, epochs=3)
    flat = [b["id"].numpy().tolist() for b in multi]
    assert flat == passes[1] + passes[2]
    assert multi.cardinality().numpy() == 2 * multi.memfit_plan.steps_per_epoch


def test_global_tf_seed_does_not_change_the_order(packed):
    a = epoch_batches(packed, seed=2)
    tf.random.set_seed(1234)
    b = epoch_batches(packed, seed=2)
    assert a == b


def test_shuffle_mixes_records_and_shards(packed):
    batches = epoch_batches(packed, batch_size=64)
    stored = read_all(packed, split="train", shuffle=False, batch_size=64)[0]["id"].tolist()
    pos = {v: i for i, v in enumerate(stored)}
    epoch = [pos[v] for b in batches for v in b]
    rho = np.corrcoef(np.argsort(np.argsort(epoch)), np.arange(len(epoch)))[0, 1]
    assert abs(rho) < 0.5
    # samples of one record (8 consecutive stored samples) do not all stay in one batch
    first_batch = set(batches[0])
    assert len({pos[v] // 8 for v in first_batch}) > 30


def test_tuple_features_and_dict_elements(packed):
    ds = memfit.dataset(packed, 32, split="val", features=("x", "y"))
    x, y = next(iter(ds))
    assert x.shape == (32, 4, 3) and x.dtype == tf.float32 and y.dtype == tf.int64
    single = memfit.dataset(packed, 32, split="val", features="y")
    assert next(iter(single)).shape == (32,)


def test_plan_follows_the_budget(packed):
    small = memfit.dataset(packed, 32, split="train", memory_budget="6MiB").memfit_plan
    big = memfit.dataset(packed, 32, split="train", memory_budget="64MiB").memfit_plan
    assert small.window_records <= big.window_records
    assert small.estimated_bytes <= 6 * 2**20
    assert "budget 6.0 MiB" in str(small) and "steps/epoch" in str(small)


def test_a_split_smaller_than_a_window_is_planned_as_what_it_holds(tmp_path):
    """A stranger's 200-sample split of 52 KiB was said to hold 75.7 MiB in flight (a full
    window of 56,704 samples); it held about 12 MB. A split shorter than a window fills one
    short window: the estimate counts its batches, and the window (the order) stays."""
    rng = np.random.default_rng(0)
    memfit.pack({"x": rng.random((20_200, 64), dtype=np.float32)}, tmp_path / "d",
                split="train=0.99,val=0.01", progress=False)
    val = memfit.dataset(tmp_path / "d", 64, split="val", memory_budget="256MiB").memfit_plan
    train = memfit.dataset(tmp_path / "d", 64, split="train",
                           memory_budget="256MiB").memfit_plan
    assert val.samples == 202 and val.window_samples == train.window_samples > 10_000
    data = 202 * 64 * 4
    assert val.estimated_bytes < 2 * 2**20 + 20 * data, str(val)     # index, 4 batches...
    assert train.estimated_bytes > 10 * val.estimated_bytes


@pytest.mark.parametrize("kwargs,message", [
    ({"batch_size": 0}, "batch_size=0"),
    ({"batch_size": 8, "memory_budget": "2KiB"}, "memory_budget=2.0 KiB is too small"),
    ({"batch_size": 8, "features": ("x", "nope")}, "No feature 'nope'"),
    ({"batch_size": 8, "features": ()}, "features names no feature: give one or more of"),
    ({"batch_size": 8, "features": []}, "Received: features=()"),
    ({"batch_size": 8, "split": "test"}, "No split 'test'"),
    ({"batch_size": 8, "split": None}, "several splits"),
    ({"batch_size": 8, "on_corrupt": "ignore"}, "on_corrupt='ignore'"),
    ({"batch_size": 8, "epoch": 3, "epochs": 2}, "epochs=2"),
    ({"batch_size": 8, "shard": (2, 2)}, "shard=(2, 2)"),
    ({"batch_size": 8, "shard": (0, 99)}, "repack with shards=99"),
])
def test_bad_arguments_are_clear_errors(packed, kwargs, message):
    kwargs.setdefault("split", "train")
    if kwargs["split"] is None:
        del kwargs["split"]
    with pytest.raises(ValueError) as e:
        memfit.dataset(packed, **kwargs)
    assert message in str(e.value)


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="manifest.json is missing"):
        memfit.dataset(tmp_path, 8)
    # a path that is not there is not told that a manifest is missing in it
    with pytest.raises(DatasetError, match="nope': no such file or directory") as e:
        memfit.dataset(tmp_path / "nope", 8)
    assert "manifest" not in str(e.value)


def test_shards_split_the_data_between_workers(packed):
    parts = [set(read_all(packed, split="train", shard=(i, 3))[0]["id"].tolist())
             for i in range(3)]
    assert sum(map(len, parts)) == 900 and len(set.union(*parts)) == 900
