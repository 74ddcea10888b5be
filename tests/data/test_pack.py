import importlib
import json

import numpy as np
import pytest

import memfit
from memfit.data.format.manifest import MANIFEST, Manifest
from memfit.data.packing import pack_shards
from memfit.errors import DatasetError
from tests.data.helpers import by_id, read_all, small_arrays

pack_module = importlib.import_module("memfit.data.packing.packer")   # the module, not the function

DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64"]


def test_round_trip_every_dtype_fixed_shapes(tmp_path):
    rng = np.random.default_rng(1)
    n = 257
    arrays = {"id": np.arange(n)}
    for dt in DTYPES:
        if dt == "bool":
            arrays[dt] = rng.integers(0, 2, (n, 3)).astype(bool)
        elif dt.startswith(("int", "uint")):
            info = np.iinfo(dt)
            arrays[dt] = rng.integers(info.min, info.max, (n, 2, 2), dtype=dt, endpoint=True)
        else:
            arrays[dt] = rng.standard_normal((n, 5)).astype(dt)
    arrays["scalar"] = rng.standard_normal(n).astype(">f8")     # big-endian input is fine
    memfit.pack(arrays, tmp_path / "ds", samples_per_record=8, progress=False)
    got, _ = read_all(tmp_path / "ds", shuffle=False)
    got = by_id(got)
    for name, arr in arrays.items():
        assert got[name].dtype == arr.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got[name], arr, err_msg=name)


def test_round_trip_variable_shapes(tmp_path):
    rng = np.random.default_rng(2)
    n = 101
    tokens = [rng.integers(0, 1000, rng.integers(0, 9)).astype(np.int32) for _ in range(n)]
    points = [rng.random((rng.integers(1, 5), 3)).astype(np.float32) for _ in range(n)]
    memfit.pack({"tokens": tokens, "points": points, "id": np.arange(n)}, tmp_path / "ds",
                variable=["tokens", "points"], samples_per_record=4, progress=False)
    m = Manifest.load(tmp_path / "ds")
    assert m.features["tokens"].shape == (None,) and m.features["points"].shape == (None, 3)
    ds = memfit.dataset(tmp_path / "ds", 16, shuffle=False)
    seen = {}
    for b in ds:
        for i, t, p in zip(b["id"].numpy(), b["tokens"], b["points"], strict=True):
            seen[int(i)] = (t.numpy(), p.numpy())
    assert sorted(seen) == list(range(n))
    for i in range(n):
        np.testing.assert_array_equal(seen[i][0], tokens[i])
        np.testing.assert_array_equal(seen[i][1], points[i])


def test_npy_inputs_are_memory_mapped_and_npz_and_csv_work(tmp_path, monkeypatch):
    arrays = small_arrays(200)
    for k, v in arrays.items():
        np.save(tmp_path / f"{k}.npy", v)
    r = memfit.pack({k: str(tmp_path / f"{k}.npy") for k in arrays}, tmp_path / "a",
                    progress=False)
    assert r.samples == 200 and "x=" in r.manifest.source
    np.savez(tmp_path / "all.npz", **arrays)
    memfit.pack(str(tmp_path / "all.npz"), tmp_path / "b", progress=False)
    for d in ("a", "b"):
        got = by_id(read_all(tmp_path / d, shuffle=False)[0])
        for k in arrays:
            np.testing.assert_array_equal(got[k], arrays[k])

    csv = tmp_path / "t.csv"
    csv.write_text("a,b,target\n" + "".join(f"{i},{i / 4},{i % 3}\n" for i in range(50)))
    memfit.pack(csv=str(csv), output=tmp_path / "c", label="target", shuffle=False,
                progress=False)
    m = Manifest.load(tmp_path / "c")
    assert m.features["x"].shape == (2,) and m.features["x"].dtype == "float32"
    assert m.features["y"].dtype == "int64"
    got = read_all(tmp_path / "c", shuffle=False)[0]
    np.testing.assert_allclose(got["x"], [[i, i / 4] for i in range(50)])
    np.testing.assert_array_equal(got["y"], [i % 3 for i in range(50)])
    assert not any(".tmp-" in p.name for p in (tmp_path / "c").iterdir())

    # overwrite=True packs beside the old dataset: the CSV conversion this call made (in
    # the old directory) is still whole while the new one is written, and goes after
    prepare, seen = pack_module.prepare_output, []

    def spy(work, fingerprint, keep=()):
        state = prepare(work, fingerprint, keep)
        (conversion,) = [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".tmp-")]
        seen.append((work.name, sorted(p.name for p in conversion.iterdir())))
        return state

    monkeypatch.setattr(pack_module, "prepare_output", spy)
    memfit.pack(csv=str(csv), output=tmp_path / "c", label="target", shuffle=False,
                overwrite=True, progress=False)
    assert seen == [(".c.memfit-new", ["x.npy", "y.npy"])]
    assert not any(".tmp-" in p.name for p in (tmp_path / "c").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_iterable_of_unknown_length(tmp_path):
    rng = np.random.default_rng(3)

    def gen():
        for i in range(500):
            yield {"x": rng.random(6).astype(np.float32), "id": np.int64(i)}

    r = memfit.pack(gen(), tmp_path / "g", shard_size="4KiB", samples_per_record=4,
                    shuffle_buffer="2KiB", progress=False)
    files = [s.file for s in r.manifest.splits["train"].shards]
    assert len(files) > 2 and files[0] == f"train-00000-of-{len(files):05d}.tfrecord"
    got = read_all(tmp_path / "g", shuffle=False)[0]
    assert sorted(got["id"].tolist()) == list(range(500))
    assert got["id"].tolist() != list(range(500))          # the buffer shuffled them


def test_split_shards_and_names(tmp_path):
    r = memfit.pack(small_arrays(1000), tmp_path / "s", split="train=0.8,val=0.2", shards=3,
                    samples_per_record=16, progress=False)
    m = r.manifest
    assert {n: s.samples for n, s in m.splits.items()} == {"train": 800, "val": 200}
    assert [s.file for s in m.splits["val"].shards] == [
        f"val-0000{i}-of-00003.tfrecord" for i in range(3)]
    ids = [set(read_all(tmp_path / "s", split=s, shuffle=False)[0]["id"]) for s in ("train", "val")]
    assert not ids[0] & ids[1] and len(ids[0] | ids[1]) == 1000
    doc = json.loads((tmp_path / "s" / MANIFEST).read_text())
    assert doc["totals"]["samples"] == 1000 and doc["format_version"] == 1
    assert all(len(sh["sha256"]) == 64 for sp in doc["splits"].values() for sh in sp["shards"])
    # the seeded permutation: packing again gives the same bytes, another seed does not
    r2 = memfit.pack(small_arrays(1000), tmp_path / "s2", split="train=0.8,val=0.2", shards=3,
                     samples_per_record=16, progress=False)
    r3 = memfit.pack(small_arrays(1000), tmp_path / "s3", split="train=0.8,val=0.2", shards=3,
                     samples_per_record=16, seed=7, progress=False)
    sha = lambda res: [s.sha256 for s in res.manifest.splits["train"].shards]  # noqa: E731
    assert sha(r) == sha(r2) != sha(r3)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compression_round_trip(tmp_path, compression):
    arrays = small_arrays(300)
    r = memfit.pack(arrays, tmp_path / "z", compression=compression, shards=2, progress=False)
    assert r.manifest.splits["train"].shards[0].file.endswith({"GZIP": ".gz", "ZLIB": ".zz"}
                                                              [compression])
    got = by_id(read_all(tmp_path / "z")[0])
    np.testing.assert_array_equal(got["x"], arrays["x"])
    assert memfit.verify(tmp_path / "z").ok


@pytest.mark.parametrize("workers_source", ["npy", "arrays"])
def test_parallel_workers_write_the_same_bytes(tmp_path, workers_source):
    arrays = small_arrays(2000)
    if workers_source == "npy":
        for k, v in arrays.items():
            np.save(tmp_path / f"{k}.npy", v)
        source = {k: str(tmp_path / f"{k}.npy") for k in arrays}
    else:
        source = arrays
    one = memfit.pack(source, tmp_path / "w1", shards=4, progress=False)
    two = memfit.pack(source, tmp_path / "w2", shards=4, workers=2, progress=False)
    assert [s.sha256 for s in one.manifest.splits["train"].shards] == \
           [s.sha256 for s in two.manifest.splits["train"].shards]


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """Each writer process starts by importing the script (spawn): without the guard it
    packs again there and dies; the pack says so in one line, not BrokenProcessPool."""
    import subprocess
    import sys

    np.save(tmp_path / "x.npy", np.zeros((2000, 256), "float32"))
    script = tmp_path / "noguard.py"
    script.write_text("import memfit\n"
                      "memfit.pack({'x': 'x.npy'}, 'out', shards=4, workers=2, progress=False)\n")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode != 0
    assert last.startswith("memfit.errors.DatasetError: memfit.pack(workers=2) cannot start") \
        and 'if __name__ == "__main__":' in last, run.stderr[-2000:]
    # found before any writer started: no writer's traceback, no leaked semaphores
    assert run.stderr.count("Traceback") == 1 and "resource_tracker" not in run.stderr
    assert not any(tmp_path.glob("out*/*.tfrecord*"))


@pytest.mark.parametrize("orphaned", [False, True])
def test_a_writer_whose_pack_died_while_it_started_exits(orphaned):
    """PR_SET_PDEATHSIG set after the pack was killed never fires: the writer checks its
    parent itself, or it would write shards beside the rerun (faults_pack --workers 2)."""
    import os
    import subprocess
    import sys

    parent = os.getpid() + (1 if orphaned else 0)
    code = ("from memfit.lifeline import die_with_parent\n"
            f"die_with_parent({parent}); print('alive')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert (run.returncode, run.stdout.strip()) == ((1, "") if orphaned else (0, "alive"))


def _ls(path):
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


@pytest.mark.parametrize("source,kwargs,message", [
    ({"x": np.zeros((10, 2)), "y": np.zeros(9)}, {}, "x=10, y=9"),
    ({"x": np.array(["a", "b"])}, {}, "'x' has dtype <U1"),
    ({"x": np.array([{"a": 1}, None], dtype=object)}, {}, "'x'"),
    ({"x": [np.zeros(3), np.zeros(4)]}, {}, "rows of different shapes"),
    ({"x": np.zeros((4, 2))}, {"variable": ["nope"]}, "nope"),
    ({"x": [np.zeros((2, 3)), np.zeros((2, 4))]}, {"variable": ["x"]}, "first dimension"),
    ({"x": np.zeros((4, 2))}, {"shards": 2, "shard_size": "1MiB"}, "not both"),
    ({"x": np.zeros((4, 2))}, {"split": "train=0.5,val=0.6"}, "sum to 1.1"),
    ({"x": np.zeros((4, 2))}, {"compression": "LZ4"}, "compression='LZ4'"),
    ({"x": np.zeros((4, 2))}, {"shard_size": "lots"}, "shard_size='lots'"),
    ({"x": np.zeros((0, 2))}, {}, "no samples"),
    ("missing.npz", {}, "missing.npz"),
    (42, {}, "Cannot pack a int"),
])
def test_bad_input_is_rejected_before_anything_is_written(tmp_path, source, kwargs, message):
    out = tmp_path / "out"
    with pytest.raises(ValueError) as e:      # DatasetError is a ValueError
        memfit.pack(source, out, progress=False, **kwargs)
    assert message in str(e.value)
    assert _ls(out) == []


def test_a_damaged_npz_and_a_file_that_is_not_npy_are_one_line_errors(tmp_path, capsys):
    """An archive cut short (a zip file's start, no end) once raised zipfile's BadZipFile
    with a traceback; a file that is not NumPy's was answered by NumPy's advice to unpickle
    it (``allow_pickle=``, ``pickle.load()``)."""
    from memfit.cli import main

    np.savez(tmp_path / "whole.npz", x=np.zeros((1000, 10)), y=np.arange(1000))
    whole = (tmp_path / "whole.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "text.npz").write_text("x,y\n1,2\n")
    (tmp_path / "text.npy").write_text("x,y\n1,2\n")
    with open(tmp_path / "objects.npy", "wb") as f:
        np.save(f, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    cases = [(str(tmp_path / "cut.npz"), "np.savez"), (str(tmp_path / "text.npz"), "np.savez"),
             ({"x": str(tmp_path / "text.npy")}, "np.save"),
             ({"x": str(tmp_path / "objects.npy")}, "dtype object")]
    for source, fix in cases:
        with pytest.raises(DatasetError) as e:
            memfit.pack(source, tmp_path / "out", progress=False)
        text = str(e.value)
        named = source if isinstance(source, str) else source["x"]
        assert repr(named) in text and fix in text, text
        assert "pickle" not in text.replace("unpickle", ""), text
        assert not (tmp_path / "out").exists()
    assert main(["pack", str(tmp_path / "cut.npz"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit pack: error: ") and err.count("\n") == 1, err


def test_output_holding_a_dataset_needs_overwrite(tmp_path):
    memfit.pack(small_arrays(50), tmp_path / "d", progress=False)
    before = (tmp_path / "d" / MANIFEST).read_text()
    with pytest.raises(DatasetError, match="already holds a complete memfit dataset"):
        memfit.pack(small_arrays(60), tmp_path / "d", progress=False)
    assert (tmp_path / "d" / MANIFEST).read_text() == before
    r = memfit.pack(small_arrays(60), tmp_path / "d", overwrite=True, progress=False)
    assert r.samples == 60 and Manifest.load(tmp_path / "d").samples == 60


def test_interrupted_pack_resumes_and_keeps_verified_shards(tmp_path, monkeypatch):
    arrays = small_arrays(1600)
    reference = memfit.pack(arrays, tmp_path / "ref", shards=8, samples_per_record=16,
                            progress=False)
    real = pack_shards.write_shard
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pack_shards, "write_shard", flaky)
    with pytest.raises(KeyboardInterrupt):
        memfit.pack(arrays, tmp_path / "d", shards=8, samples_per_record=16, progress=False)
    monkeypatch.setattr(pack_shards, "write_shard", real)
    with pytest.raises(DatasetError, match="interrupted"):
        Manifest.load(tmp_path / "d")                       # nothing looks complete
    assert not any(".tmp-" in n for n in _ls(tmp_path / "d"))
    # damage one finished shard: it must be rewritten, the others kept
    first = tmp_path / "d" / "train-00000-of-00008.tfrecord"
    first.write_bytes(first.read_bytes()[:-3] + b"xyz")
    with pytest.raises(DatasetError, match="different data"):
        memfit.pack(small_arrays(1601), tmp_path / "d", shards=8, samples_per_record=16,
                    progress=False)
    resumed = memfit.pack(arrays, tmp_path / "d", shards=8, samples_per_record=16, progress=False)
    assert resumed.kept_shards == 2
    assert [s.sha256 for s in resumed.manifest.splits["train"].shards] == \
           [s.sha256 for s in reference.manifest.splits["train"].shards]
    assert memfit.verify(tmp_path / "d").ok


def test_summary_line_says_samples_bytes_rate_and_shards(tmp_path):
    r = memfit.pack(small_arrays(100), tmp_path / "d", shards=2, progress=False)
    text = str(r)
    assert "packed 100 samples" in text and "2 shards" in text and "/s" in text


def test_a_shard_size_below_the_default_record_gets_smaller_records_not_one_big_shard(
        tmp_path):
    """A stranger's --shard-size 20KB on 152 KiB of images gave one shard of 152 KiB: the
    default record (about 256 KiB) was never cut to fit. Records now shrink to the shard
    size, as they do for an explicit shard count; a shard holds whole records, so it can
    pass the size by less than one record."""
    x = np.random.default_rng(0).random((200, 16, 16, 3), dtype=np.float32)   # 3 KiB each
    r = memfit.pack({"x": x, "y": np.arange(200)}, tmp_path / "d", shard_size="20KB",
                    progress=False)
    shards = r.manifest.splits["train"].shards
    k = r.manifest.samples_per_record
    assert k * 3 * 1024 <= 20_000 and len(shards) == 31
    assert max(s.bytes for s in shards) < 20_000 + k * 3200
    np.testing.assert_array_equal(
        np.sort(np.concatenate([b[1].numpy() for b in memfit.dataset(
            tmp_path / "d", 50, features=("x", "y"), shuffle=False)])), np.arange(200))


def test_a_bad_split_is_shown_as_it_was_written(tmp_path):
    """A stranger's `--split train=0.9,val=0.2` came back as `{'train': 0.9, 'val': 0.2}`."""
    with pytest.raises(DatasetError, match=r"sum to 1\.1\)\. Received: "
                                           r"split='train=0\.9,val=0\.2'$"):
        memfit.pack(small_arrays(20), tmp_path / "d", split="train=0.9,val=0.2",
                    progress=False)
    assert not (tmp_path / "d").exists()
