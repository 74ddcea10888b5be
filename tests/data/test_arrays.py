"""The .npy path of memfit.dataset: memory-mapped random access with a global shuffle."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import memfit
from memfit.data.format.arrays_format import ArraysManifest
from memfit.data.format.manifest import MANIFEST
from memfit.data.read.arrays_reader import ArraysPlan
from memfit.errors import DatasetError
from tests.data.helpers import small_arrays

N = 500


@pytest.fixture(scope="module")
def npy_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("arrays") / "src"
    path.mkdir()
    for name, arr in small_arrays(N).items():
        np.save(path / f"{name}.npy", arr)
    return path


def epoch_ids(source, **kw):
    kw.setdefault("batch_size", 64)
    return [b.numpy().tolist() for b in memfit.dataset(source, features="id", **kw)]


def flat(batches):
    return [i for b in batches for i in b]


def test_directory_and_dict_sources_yield_the_right_rows(npy_dir):
    arrays = small_arrays(N)
    ds = memfit.dataset(npy_dir, 64)
    assert isinstance(ds.memfit_plan, ArraysPlan)
    batches = list(ds)
    assert set(batches[0]) == {"x", "y", "id"}
    for b in batches:                                 # every row is the one its id names
        ids = b["id"].numpy()
        np.testing.assert_array_equal(b["x"].numpy(), arrays["x"][ids])
        np.testing.assert_array_equal(b["y"].numpy(), arrays["y"][ids])
    paths = {k: str(npy_dir / f"{k}.npy") for k in ("x", "y")}
    x, y = next(iter(memfit.dataset(paths, 32, features=("x", "y"))))
    assert x.shape == (32, 4, 3) and x.dtype == tf.float32 and y.dtype == tf.int64


def test_every_sample_exactly_once_per_epoch(npy_dir):
    batches = epoch_ids(npy_dir)
    assert sorted(flat(batches)) == list(range(N))
    assert [len(b) for b in batches] == [64] * 7 + [52]
    ds = memfit.dataset(npy_dir, 64, drop_remainder=True, features="id")
    dropped = [b.numpy().tolist() for b in ds]
    assert [len(b) for b in dropped] == [64] * 7
    assert len(set(flat(dropped))) == 448
    assert ds.cardinality().numpy() == 7 == ds.memfit_plan.steps_per_epoch
    assert ds.element_spec.shape == (64,)             # static batch size for Keras


def test_order_is_a_pure_function_of_seed_and_epoch(npy_dir):
    a = epoch_ids(npy_dir, seed=5, epoch=3)
    assert a == epoch_ids(npy_dir, seed=5, epoch=3)
    assert a != epoch_ids(npy_dir, seed=5, epoch=4)
    assert a != epoch_ids(npy_dir, seed=6, epoch=3)
    # the documented generator: PCG64(SeedSequence([seed, epoch])) permutes the indices
    order = np.arange(N, dtype=np.int32)
    np.random.Generator(np.random.PCG64(np.random.SeedSequence([5, 3]))).shuffle(order)
    assert flat(a) == order.tolist()
    tf.random.set_seed(99)                            # TF's global seed plays no part
    assert a == epoch_ids(npy_dir, seed=5, epoch=3)


def test_passes_are_epochs_and_epoch_k_asked_directly_matches(npy_dir):
    ds = memfit.dataset(npy_dir, 64, features="id", seed=1)
    passes = [[b.numpy().tolist() for b in ds] for _ in range(3)]
    assert passes[0] != passes[1] != passes[2]
    assert passes[2] == epoch_ids(npy_dir, seed=1, epoch=2)
    multi = memfit.dataset(npy_dir, 64, features="id", seed=1, epoch=1, epochs=3)
    assert [b.numpy().tolist() for b in multi] == passes[1] + passes[2]
    assert multi.cardinality().numpy() == 2 * multi.memfit_plan.steps_per_epoch


def test_shuffle_is_global_and_unsorted_within_batches(npy_dir):
    ids = np.array(flat(epoch_ids(npy_dir)))
    rho = np.corrcoef(ids, np.arange(N))[0, 1]
    assert abs(rho) < 0.2                             # no trace of the file order
    first = epoch_ids(npy_dir)[0]
    assert first != sorted(first)                     # reads sorted, batch un-sorted
    assert max(first) - min(first) > N / 2            # a batch spans the whole file
    assert flat(epoch_ids(npy_dir, shuffle=False)) == list(range(N))


def test_index_subsets_for_train_and_validation(npy_dir):
    rng = np.random.default_rng(0)
    perm = rng.permutation(N)
    train_idx, val_idx = perm[:400], perm[400:]
    train = epoch_ids(npy_dir, indices=train_idx, seed=3)
    assert sorted(flat(train)) == sorted(train_idx.tolist())
    assert train == epoch_ids(npy_dir, indices=train_idx, seed=3)
    assert train != epoch_ids(npy_dir, indices=train_idx, seed=3, epoch=1)
    val = epoch_ids(npy_dir, indices=val_idx, shuffle=False)
    assert flat(val) == val_idx.tolist()              # given order without shuffle
    mask = np.zeros(N, bool)
    mask[10:20] = True
    assert sorted(flat(epoch_ids(npy_dir, indices=mask))) == list(range(10, 20))
    plan = memfit.dataset(npy_dir, 64, indices=train_idx).memfit_plan
    assert plan.samples == 400 and plan.steps_per_epoch == 7


def test_shards_are_disjoint_and_cover_every_sample(npy_dir):
    parts = [flat(epoch_ids(npy_dir, shard=(i, 3), seed=2)) for i in range(3)]
    assert sorted(sum(parts, [])) == list(range(N))
    everything = flat(epoch_ids(npy_dir, seed=2))
    assert parts[1] == everything[1::3]


def test_cache_ram_gives_the_same_batches(npy_dir):
    idx = np.arange(0, N, 2)
    mapped = memfit.dataset(npy_dir, 50, indices=idx, seed=4)
    cached = memfit.dataset(npy_dir, 50, indices=idx, seed=4, cache="ram")
    assert cached.memfit_plan.cache_bytes == 250 * (4 * 3 * 4 + 8 + 8)
    for a, b in zip(mapped, cached, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    with pytest.raises(DatasetError) as e:
        memfit.dataset(npy_dir, 50, cache="ram", memory_budget="20KiB")
    assert "cache='ram' needs 31.2 KiB" in str(e.value)
    assert "memory_budget=20.0 KiB" in str(e.value)


def test_plan_follows_the_budget_and_prints_its_choices(npy_dir):
    small = memfit.dataset(npy_dir, 64, memory_budget="40KiB").memfit_plan
    big = memfit.dataset(npy_dir, 64, memory_budget="64MiB").memfit_plan
    assert small.prefetch_batches <= big.prefetch_batches
    assert small.parallel_reads <= big.parallel_reads
    assert small.estimated_bytes <= 40 * 1024 <= big.estimated_bytes + 64 * 2**20
    text = str(big)
    assert "global shuffle of 500 samples" in text and "steps/epoch" in text
    assert "memory-mapped" in text and "budget 64.0 MiB" in text
    with pytest.raises(DatasetError, match="memory_budget=10.0 KiB is too small"):
        memfit.dataset(npy_dir, 64, memory_budget="10KiB")


@pytest.mark.parametrize("kwargs,message", [
    ({"batch_size": 0}, "batch_size=0"),
    ({"batch_size": -3}, "batch_size=-3"),
    ({"batch_size": 8, "features": ("x", "nope")}, "No feature 'nope'"),
    ({"batch_size": 8, "indices": [0, 1, 500]}, "indices[2]=500"),
    ({"batch_size": 8, "indices": [-1, 2]}, "indices[0]=-1"),
    ({"batch_size": 8, "indices": [3, 4, 3]}, "duplicates (e.g. 3"),
    ({"batch_size": 8, "indices": []}, "selects no samples"),
    ({"batch_size": 8, "indices": [0.5, 1.5]}, "dtype float64"),
    ({"batch_size": 8, "indices": np.ones(3, bool)}, "one value per sample (500)"),
    ({"batch_size": 8, "cache": "disk"}, "cache='disk'"),
    ({"batch_size": 8, "split": "train"}, "indices=... instead"),
    ({"batch_size": 8, "shard": (3, 3)}, "shard=(3, 3)"),
    ({"batch_size": 8, "epoch": 2, "epochs": 1}, "epochs=1"),
    ({"batch_size": 501, "drop_remainder": True}, "leaves no batch"),
])
def test_bad_arguments_are_clear_errors(npy_dir, kwargs, message):
    with pytest.raises(ValueError) as e:
        memfit.dataset(npy_dir, **kwargs)
    assert message in str(e.value)


def write(path, **arrays):
    path.mkdir(parents=True, exist_ok=True)
    for k, v in arrays.items():
        np.save(path / f"{k}.npy", v)
    return path


def test_different_lengths_are_refused_with_the_lengths(tmp_path):
    src = write(tmp_path / "s", x=np.zeros((10, 2), np.float32), y=np.zeros(9))
    with pytest.raises(DatasetError) as e:
        memfit.dataset(src, 4)
    assert "x=10, y=9" in str(e.value) and "y.npy" in str(e.value)
    # a feature that is not asked for is not checked
    assert memfit.dataset(src, 4, features="x").memfit_plan.samples == 10


def test_unsupported_dtype_is_refused_naming_the_file(tmp_path):
    src = write(tmp_path / "s", x=np.zeros((4, 2)), s=np.array(["a", "b", "c", "d"]))
    with pytest.raises(DatasetError) as e:
        memfit.dataset(src, 2)
    assert "'s'" in str(e.value) and "<U1" in str(e.value) and "s.npy" in str(e.value)


def test_missing_file_is_named(tmp_path):
    x = write(tmp_path / "s", x=np.zeros((4, 2)))
    with pytest.raises(DatasetError) as e:
        memfit.dataset({"x": x / "x.npy", "y": tmp_path / "nope.npy"}, 2)
    assert "nope.npy" in str(e.value) and "does not exist" in str(e.value)
    with pytest.raises(DatasetError, match="absent.npy' does not exist"):
        memfit.dataset(str(tmp_path / "absent.npy"), 2)


def test_truncated_or_damaged_npy_is_named(tmp_path):
    src = write(tmp_path / "s", x=np.zeros((100, 8), np.float32), y=np.arange(100))
    good = (src / "y.npy").read_bytes()
    (src / "y.npy").write_bytes(good[:-40])
    with pytest.raises(DatasetError) as e:
        memfit.dataset(src, 10)
    assert "y.npy" in str(e.value) and "truncated" in str(e.value)
    assert "int64(100,)" in str(e.value)
    (src / "y.npy").write_bytes(good + b"junk")
    with pytest.raises(DatasetError, match="4 bytes more than its header"):
        memfit.dataset(src, 10)
    (src / "y.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(DatasetError) as e:
        memfit.dataset(src, 10)
    assert "y.npy" in str(e.value) and "not a readable .npy file" in str(e.value)
    (src / "y.npy").write_bytes(b"")
    with pytest.raises(DatasetError, match="y.npy"):
        memfit.dataset(src, 10)


def test_tfrecord_path_refuses_npy_only_arguments(tmp_path):
    memfit.pack(small_arrays(50), tmp_path / "tf", progress=False)
    with pytest.raises(ValueError, match="apply to .npy sources"):
        memfit.dataset(tmp_path / "tf", 8, indices=[1, 2])


def test_pack_arrays_round_trip_with_manifest_and_sha256(tmp_path):
    import hashlib

    arrays = small_arrays(1000)
    arrays["big"] = np.arange(1000, dtype=">i4")             # big-endian in, little out
    r = memfit.pack(arrays, tmp_path / "a", split="train=0.8,val=0.2", format="arrays",
                    progress=False)
    assert "into 8 .npy files" in str(r)
    doc = json.loads((tmp_path / "a" / MANIFEST).read_text())
    assert doc["format"] == "memfit-arrays" and doc["format_version"] == 1
    assert doc["features"]["x"] == {"dtype": "float32", "shape": [4, 3]}
    assert {n: s["samples"] for n, s in doc["splits"].items()} == {"train": 800, "val": 200}
    for split in doc["splits"].values():
        for f in split["files"].values():
            data = (tmp_path / "a" / f["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
    assert not any(".tmp-" in p.name for p in (tmp_path / "a").rglob("*"))
    assert not (tmp_path / "a" / ".memfit-pack-state.json").exists()
    # plain NumPy reads it; the ids are a disjoint split of the source
    train_ids = np.load(tmp_path / "a" / "train" / "id.npy")
    val_ids = np.load(tmp_path / "a" / "val" / "id.npy")
    assert sorted([*train_ids, *val_ids]) == list(range(1000))
    np.testing.assert_array_equal(np.load(tmp_path / "a" / "train" / "x.npy"),
                                  arrays["x"][train_ids])
    assert np.load(tmp_path / "a" / "train" / "big.npy").dtype == np.dtype("<i4")
    # memfit.dataset reads it like the TFRecord pack: split, seed from the manifest
    ds = memfit.dataset(tmp_path / "a", 64, split="val", shuffle=False)
    got = {k: np.concatenate([b[k].numpy() for b in ds]) for k in ("id", "x", "big")}
    np.testing.assert_array_equal(got["id"], val_ids)
    np.testing.assert_array_equal(got["x"], arrays["x"][val_ids])
    np.testing.assert_array_equal(got["big"], arrays["big"][val_ids])
    with pytest.raises(ValueError, match="several splits"):
        memfit.dataset(tmp_path / "a", 64)
    m = ArraysManifest.load(tmp_path / "a")
    assert m.samples == 1000 and m.file_count == 8
    # inspect and verify understand it; damage is found and named
    text = memfit.inspect(tmp_path / "a")
    assert "memfit arrays dataset" in text and "train/x.npy" in text and "800" in text
    report = memfit.verify(tmp_path / "a")
    assert report.ok and report.shards == 8 and report.records == 1000, str(report)
    victim = tmp_path / "a" / "train" / "y.npy"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    report = memfit.verify(tmp_path / "a")
    assert not report.ok and [p.file for p in report.problems] == ["train/y.npy"]
    assert "sha256" in str(report)
    victim.write_bytes(bytes(data[:-16]))
    with pytest.raises(DatasetError, match="train/y.npy"):
        memfit.dataset(tmp_path / "a", 64, split="train")


def test_packed_file_that_no_longer_matches_its_manifest_is_named(tmp_path):
    memfit.pack(small_arrays(100), tmp_path / "a", format="arrays", progress=False)
    y = tmp_path / "a" / "train" / "y.npy"
    np.save(y, np.zeros(100, np.float64))             # same size, another dtype
    with pytest.raises(DatasetError) as e:
        memfit.dataset(tmp_path / "a", 10)
    assert "train/y.npy" in str(e.value) and "holds float64(100,)" in str(e.value)
    assert "manifest says int64(100,)" in str(e.value) and "memfit verify" in str(e.value)
    np.save(y, np.zeros(99, np.int64))                 # one sample short
    with pytest.raises(DatasetError, match="int64\\(99,\\); the manifest says int64\\(100,\\)"):
        memfit.dataset(tmp_path / "a", 10)
    assert memfit.dataset(tmp_path / "a", 10, features=("x", "id")).memfit_plan.samples == 100


def test_mapped_pages_are_file_backed_not_anonymous(tmp_path):
    """Reading an epoch maps the file (rss_file grows); anonymous memory stays small."""
    x = np.ones((2048, 12288), np.uint8)               # 24 MiB
    src = write(tmp_path / "s", x=x)
    ds = memfit.dataset(src, 64, features="x", memory_budget="16MiB", seed=1)
    assert ds.memfit_plan.estimated_bytes <= 16 * 2**20
    with memfit.measure() as m:
        total = sum(int(b.numpy().sum()) for b in ds)
    assert total == x.size
    assert m.peak.rss_file - m.before.rss_file >= 20 * 2**20     # the whole file mapped
    assert m.peak.rss_anon - m.before.rss_anon < 20 * 2**20      # not copied


def test_pack_arrays_refuses_tfrecord_options_and_existing_data(tmp_path):
    with pytest.raises(DatasetError, match="shards, compression apply to format='tfrecord'"):
        memfit.pack(small_arrays(20), tmp_path / "o", format="arrays", shards=2,
                    compression="GZIP", progress=False)
    with pytest.raises(DatasetError, match="format='arrays' needs arrays of known length"):
        memfit.pack(iter([{"x": np.zeros(2)}]), tmp_path / "o", format="arrays",
                    progress=False)
    with pytest.raises(DatasetError, match="format='parquet'"):
        memfit.pack(small_arrays(20), tmp_path / "o", format="parquet", progress=False)
    assert not (tmp_path / "o").exists()
    memfit.pack(small_arrays(20), tmp_path / "d", format="arrays", progress=False)
    with pytest.raises(DatasetError, match="already holds a complete memfit dataset"):
        memfit.pack(small_arrays(30), tmp_path / "d", format="arrays", progress=False)
    r = memfit.pack(small_arrays(30), tmp_path / "d", format="arrays", overwrite=True,
                    progress=False)
    assert r.samples == 30 and ArraysManifest.load(tmp_path / "d").samples == 30
    # replacing it with TFRecord shards removes the .npy files too
    memfit.pack(small_arrays(30), tmp_path / "d", overwrite=True, progress=False)
    assert not (tmp_path / "d" / "train").exists()
    assert memfit.Manifest.load(tmp_path / "d").samples == 30


def test_cli_pack_arrays_inspect_and_verify(tmp_path, capsys):
    from memfit.cli import main

    src = write(tmp_path / "s", **small_arrays(120))
    assert main(["pack", f"x={src / 'x.npy'}", f"y={src / 'y.npy'}", "-o",
                 str(tmp_path / "a"), "--format", "arrays", "--quiet"]) == 0
    assert "into 2 .npy files" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "a")]) == 0
    assert "memfit arrays dataset" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "a"), "--quiet"]) == 0
    assert "OK (sha256 and .npy headers match" in capsys.readouterr().out
    assert main(["inspect", str(src)]) == 0                    # a plain .npy directory
    out = capsys.readouterr().out
    assert "x" in out and "120 samples" in out
    (src / "id.npy").write_bytes((src / "id.npy").read_bytes()[:-8])
    assert main(["verify", str(src), "--quiet"]) == 1
    assert "id.npy" in capsys.readouterr().out
    assert main(["pack", f"x={src / 'x.npy'}", "-o", str(tmp_path / "b"), "--format",
                 "arrays", "--compression", "GZIP", "--quiet"]) == 2
    assert "--format tfrecord only" in capsys.readouterr().err


def test_model_fit_from_the_arrays_path(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1200, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    src = write(tmp_path / "s", x=x, y=y)
    perm = np.random.default_rng(1).permutation(1200)
    train = memfit.dataset(src, 32, features=("x", "y"), indices=perm[:1000])
    val = memfit.dataset(src, 100, features=("x", "y"), indices=perm[1000:], shuffle=False,
                         cache="ram")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(train, validation_data=val, epochs=4, verbose=0)
    assert len(history.history["loss"]) == 4
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.9
    assert train.memfit_epoch_counter.numpy() == 4        # one epoch per Keras pass
