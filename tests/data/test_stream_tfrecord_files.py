"""memfit.dataset([file, ...]) streams TFRecord files of tf.train.Example records in place,
on files written exactly by the recipe (tests/data/test_sources_tfrecord.py writes them):
the same samples as a pack of the same files, an order that is a pure function of
(seed, epoch), damaged and disagreeing records named, bad input refused in one line."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import memfit
from memfit.errors import CorruptShardError, DatasetError, MemfitError

from .test_sources_tfrecord import _example, _recipe_data, write_recipe

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _rows(ds):
    """The samples of one pass, as sorted (data bytes, label bytes) pairs, and the
    batches in order."""
    batches = [(a.numpy(), b.numpy()) for a, b in ds]
    rows = sorted((a[i].tobytes(), b[i].tobytes()) for a, b in batches
                  for i in range(len(a)))
    return rows, batches


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_in_place_gives_the_packs_samples_typed_and_shaped(tmp_path, compression):
    x, y = _recipe_data(203)
    paths = write_recipe(tmp_path, x, y, compression=compression)
    ds = memfit.dataset([str(p) for p in paths], 32, features=("data", "label"),
                        memory_budget="8MiB")
    plan = ds.memfit_plan
    assert plan.samples == 203 and plan.steps_per_epoch == 7 and plan.files == 4
    assert plan.estimated_bytes <= plan.memory_budget and "read in place" in str(plan)
    rows, batches = _rows(ds)
    assert batches[0][0].dtype == np.float32 and batches[0][0].shape == (32, 6, 5, 3)
    assert batches[0][1].dtype == np.float32 and batches[0][1].shape == (32, 2)
    memfit.pack(tfrecord=str(tmp_path / "path*.tfrecords"), output=tmp_path / "packed")
    packed, _ = _rows(memfit.dataset(tmp_path / "packed", 32, features=("data", "label")))
    assert rows == packed == sorted((a.tobytes(), b.tobytes()) for a, b in zip(x, y, strict=True))
    again, second = _rows(ds)                   # the next epoch: same samples, new order
    assert again == rows and not np.array_equal(second[0][0], batches[0][0])


def test_every_stored_dtype_comes_out_bit_for_bit(tmp_path):
    """Every dtype memfit stores, as serialize_tensor writes it, plus an int64 list: the
    fast path (one row of bytes a record, reinterpreted) gives the values exactly."""
    import tensorflow as tf

    from memfit.data.format.manifest import SUPPORTED_DTYPES

    rng = np.random.default_rng(7)
    n, shape = 70, (3, 2)
    cols = {}
    for name in SUPPORTED_DTYPES:
        raw = rng.integers(0, 256, (n, *shape, np.dtype(name).itemsize), dtype=np.uint8)
        values = raw.view(name).reshape(n, *shape)
        if name == "bool":
            values = raw[..., 0].reshape(n, *shape) % 2 == 1
        elif np.dtype(name).kind in "fc":
            values = np.nan_to_num(values, nan=1.5, posinf=2.5, neginf=-2.5)
        cols[name] = values
    ints = rng.integers(2**35, 2**36, (n, 4))          # varints of one length: same size
    path = tmp_path / "all.tfrecords"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(n):
            feature = {name: tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[tf.io.serialize_tensor(tf.constant(v[i])).numpy()]))
                for name, v in cols.items()}
            feature["ids"] = tf.train.Feature(int64_list=tf.train.Int64List(value=ints[i]))
            w.write(tf.train.Example(features=tf.train.Features(feature=feature))
                    .SerializeToString())
    ds = memfit.dataset([str(path)], 16, shuffle=False, epochs=1)
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    got = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    for name, values in cols.items():
        assert got[name].dtype == values.dtype, name
        assert got[name].tobytes() == values.tobytes(), name
    assert np.array_equal(got["ids"], ints)


def test_stored_order_with_shuffle_false_and_a_glob(tmp_path):
    x, y = _recipe_data(50)
    write_recipe(tmp_path, x, y, files=3)
    ds = memfit.dataset(str(tmp_path / "path*.tfrecords"), 16, shuffle=False, epochs=1)
    got = list(ds)
    assert np.array_equal(np.concatenate([b["data"].numpy() for b in got]), x)
    assert np.array_equal(np.concatenate([b["label"].numpy() for b in got]), y)


_ORDER = """
import hashlib, sys
import tensorflow as tf
import memfit
tf.random.set_seed(int(sys.argv[2]))             # the user's global seed changes nothing
for epoch in (1, 2):
    ds = memfit.dataset(sys.argv[1] + "/path*.tfrecords", 16, seed=7, epoch=epoch,
                        features=("data", "label"), memory_budget="4MiB")
    h = hashlib.sha256()
    for a, b in ds:
        h.update(a.numpy().tobytes()); h.update(b.numpy().tobytes())
    print(h.hexdigest())
"""


def test_same_seed_and_epoch_give_the_same_batches_in_two_processes(tmp_path):
    import tensorflow as tf

    x, y = _recipe_data(120)
    write_recipe(tmp_path, x, y)
    script = tmp_path / "order.py"
    script.write_text(_ORDER)
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "2"],
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.split()[-2:]
    assert first != second                      # another epoch, another order
    # ... and the same batches as epoch 1 reached by a pass in this process, under
    # another global seed
    tf.random.set_seed(1)
    ds = memfit.dataset(str(tmp_path / "path*.tfrecords"), 16, seed=7, epoch=0,
                        features=("data", "label"), memory_budget="4MiB")
    list(ds)                                    # epoch 0
    h = hashlib.sha256()
    for a, b in ds:                             # epoch 1
        h.update(a.numpy().tobytes())
        h.update(b.numpy().tobytes())
    assert h.hexdigest() == first


def _flip(path: Path, record: int) -> None:
    """Flips a byte in the data of ``record`` (records of equal size)."""
    data = bytearray(path.read_bytes())
    (length,) = np.frombuffer(bytes(data[:8]), "<u8")
    data[record * (int(length) + 16) + 12 + int(length) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_named_by_file_and_record(tmp_path, capsys):
    x, y = _recipe_data(80)
    paths = write_recipe(tmp_path, x, y)
    _flip(paths[1], 5)
    ds = memfit.dataset([str(p) for p in paths], 16, features=("data", "label"),
                        memory_budget="4MiB")
    with pytest.raises(CorruptShardError) as e:
        list(ds)
    assert e.value.file == str(paths[1]) and e.value.record == 5
    assert str(e.value).startswith(f"memfit: TFRecord file {paths[1]} is corrupt")
    assert "\n" not in str(e.value)
    skip = memfit.dataset([str(p) for p in paths], 16, features=("data", "label"),
                          memory_budget="4MiB", on_corrupt="skip")
    rows, _ = _rows(skip)
    # plain files are read record by record: record 5 of path2 alone is left out
    keep = [i for i in range(80) if i != 20 + 5]
    assert rows == sorted((x[i].tobytes(), y[i].tobytes()) for i in keep)
    err = capsys.readouterr().err
    assert err.count("skipped") == 1
    assert f"skipped record 5 of TFRecord file {paths[1]} (bad CRC32C of its data)" in err
    again, _ = _rows(skip)                      # the next epoch: no second warning
    assert again == rows and "skipped" not in capsys.readouterr().err


def test_a_file_changed_after_it_was_opened_is_named(tmp_path, capsys):
    x, y = _recipe_data(60)
    paths = write_recipe(tmp_path, x, y, files=3)
    ds = memfit.dataset([str(p) for p in paths], 8, features=("data", "label"),
                        memory_budget="4MiB")
    skip = memfit.dataset([str(p) for p in paths], 8, features=("data", "label"),
                          memory_budget="4MiB", on_corrupt="skip")
    data = paths[2].read_bytes()
    paths[2].write_bytes(data[:len(data) * 3 // 4 + 7])     # records 15 on cut off
    with pytest.raises(CorruptShardError, match=r"path3.tfrecords is corrupt or truncated: "
                                                r"record 1[5-9] of 20 cannot be read \(cut "
                                                r"short since it was opened\)") as e:
        list(ds)
    assert e.value.file == str(paths[2]) and 15 <= e.value.record < 20
    rows, _ = _rows(skip)
    assert rows == sorted((x[i].tobytes(), y[i].tobytes()) for i in range(55))
    assert capsys.readouterr().err.count("memfit: WARNING: skipped record") == 5


@pytest.mark.parametrize("case", range(4))
def test_plain_files_read_by_record_give_the_batches_of_the_files_read_in_sequence(
        tmp_path, case):
    """Plain files are read record by record where they lie; compressed ones in sequence
    through tf.data's interleave. Both give the same batches: the same file order, the
    same interleave (here with more files than are read at once, of uneven lengths, some
    empty), the same windows and permutations (windows short of the epoch here)."""
    import tensorflow as tf

    rng = np.random.default_rng(case)
    files = [1, 19, 5, 3][case]
    sizes = rng.integers(0, 200, files)
    sizes[0] = 1500 if files == 1 else max(sizes[0], 1)
    x, y = _recipe_data(int(sizes.sum()), seed=case)
    for sub, compression in (("plain", None), ("zlib", "ZLIB")):
        (tmp_path / sub).mkdir()
        at = 0
        for f, n in enumerate(sizes):
            with tf.io.TFRecordWriter(str(tmp_path / sub / f"p{f:02d}.tfrecords"),
                                      options=compression) as w:
                for i in range(at, at + int(n)):
                    w.write(_example(x[i], y[i]))
            at += int(n)
    budget = min(files, 16) * 263_000 + int(rng.uniform(0.3, 0.6) * 2**20)
    kw = dict(features=("data", "label"), memory_budget=budget, seed=case, epochs=2,
              drop_remainder=case == 2, shuffle=case != 3)
    by_record = memfit.dataset(str(tmp_path / "plain" / "*.tfrecords"), 13 + 7 * case, **kw)
    in_sequence = memfit.dataset(str(tmp_path / "zlib" / "*.tfrecords"), 13 + 7 * case, **kw)
    assert by_record.memfit_plan.by_record and not in_sequence.memfit_plan.by_record
    assert "record by record" in str(by_record.memfit_plan)
    if case != 3:
        assert by_record.memfit_plan.window_samples < sizes.sum()   # more than one window
    a, b = list(by_record), list(in_sequence)
    assert len(a) == len(b) == 2 * by_record.memfit_plan.steps_per_epoch
    for (p, q), (r, s) in zip(a, b, strict=True):
        assert np.array_equal(p.numpy(), r.numpy()) and np.array_equal(q.numpy(), s.numpy())


def test_a_file_cut_short_is_named_when_opened(tmp_path):
    x, y = _recipe_data(40)
    paths = write_recipe(tmp_path, x, y)
    paths[2].write_bytes(paths[2].read_bytes()[:-100])
    with pytest.raises(CorruptShardError, match="path3.tfrecords is corrupt or truncated: "
                                                "record 9 "):
        memfit.dataset([str(p) for p in paths], 8)


def test_a_broken_length_in_a_gzip_file_names_the_record_without_a_count(tmp_path):
    """No record after a length whose checksum fails can be found, so how many the file
    holds is unknown: the message names the record, without 'of ?'."""
    import gzip

    from memfit.data.format.records import iter_records

    x, y = _recipe_data(40)
    path = write_recipe(tmp_path, x, y, files=1)[0]
    data = bytearray(path.read_bytes())
    starts = [offset for offset, _ in iter_records(open(path, "rb"))]
    data[starts[25] + 2] ^= 0xFF                        # record 25's length
    gz = tmp_path / "path1.tfrecords.gz"
    gz.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(CorruptShardError) as e:
        memfit.dataset([str(gz)], 8)
    assert f"TFRecord file {gz} is corrupt or truncated: record 25 cannot be read (" \
        in str(e.value)
    assert "of ?" not in str(e.value) and e.value.record == 25


def test_skip_reads_a_file_cut_short_before_it_was_opened_up_to_the_cut(tmp_path, capsys):
    x, y = _recipe_data(40)
    paths = write_recipe(tmp_path, x, y)
    paths[2].write_bytes(paths[2].read_bytes()[:-100])          # record 9 of 10 cut
    ds = memfit.dataset([str(p) for p in paths], 8, features=("data", "label"),
                        on_corrupt="skip")
    err = capsys.readouterr().err
    assert err.count("memfit: WARNING") == 1
    assert f"TFRecord file {paths[2]} is damaged at record 9 (cut short)" in err
    rows, _ = _rows(ds)
    assert rows == sorted((x[i].tobytes(), y[i].tobytes()) for i in range(40) if i != 29)


def test_many_damaged_records_of_a_file_are_named_ten_times_then_once(tmp_path, capsys):
    x, y = _recipe_data(60)
    paths = write_recipe(tmp_path, x, y, files=2)
    ds = memfit.dataset([str(p) for p in paths], 8, features=("data", "label"),
                        on_corrupt="skip")
    for record in range(30):                        # every record of the first file
        _flip(paths[0], record)
    rows, _ = _rows(ds)
    assert rows == sorted((x[i].tobytes(), y[i].tobytes()) for i in range(30, 60))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 11 and all(line.startswith("memfit: WARNING: ") for line in lines)
    assert lines[-1] == (f"memfit: WARNING: more damaged records of TFRecord file "
                         f"{paths[0]} are skipped without a line each.")


def test_bad_input_is_one_line_and_a_memfit_error(tmp_path):
    x, y = _recipe_data(20)
    paths = write_recipe(tmp_path, x, y, files=2)
    with pytest.raises(DatasetError, match="No TFRecord file matches") as e:
        memfit.dataset(str(tmp_path / "nothing*.tfrecords"), 8)
    not_tfrecord = tmp_path / "notes.tfrecords"
    not_tfrecord.write_text("these are notes, not records\n" * 10)
    with pytest.raises(DatasetError, match="is not a TFRecord file") as e:
        memfit.dataset([str(paths[0]), str(not_tfrecord)], 8)
    assert "\n" not in str(e.value)
    import tensorflow as tf

    other = tmp_path / "other.tfrecords"                # a first record of another shape
    with tf.io.TFRecordWriter(str(other)) as w:
        w.write(_example(np.zeros((6, 5, 4), np.float32), [0.0, 1.0]))
    with pytest.raises(DatasetError, match=r"record 0: feature 'data' is serialized tensor "
                                           r"→ float32 \(6, 5, 4\).*The records disagree"):
        memfit.dataset([str(paths[0]), str(other)], 8)
    with pytest.raises(ValueError, match="split= does not apply"):
        memfit.dataset([str(paths[0])], 8, split="train")
    with pytest.raises(DatasetError, match=r"too small .* it needs at least [\d,]+ bytes"):
        memfit.dataset([str(paths[0])], 8, memory_budget="4KiB")
    with pytest.raises(DatasetError, match=r"an empty list of files"):
        memfit.dataset([], 8)
    with pytest.raises(DatasetError, match=r"holds TFRecord files but no manifest, so no "
                                           r"memfit pack wrote it: to read the files in place"):
        memfit.dataset(str(tmp_path), 8)


def test_a_record_that_disagrees_later_in_a_file_is_named(tmp_path):
    import tensorflow as tf

    x, y = _recipe_data(12)
    path = tmp_path / "mixed.tfrecords"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(12):
            w.write(_example(x[i] if i != 7 else np.zeros((6, 5, 4), np.float32), y[i]))
    for on_corrupt in ("raise", "skip"):        # not damage: skip does not leave it out
        ds = memfit.dataset([str(path)], 4, shuffle=False, features=("data", "label"),
                            on_corrupt=on_corrupt)
        with pytest.raises(CorruptShardError) as e:
            list(ds)
        assert e.value.file == str(path) and e.value.record == 7
        assert "(6, 5, 4)" in str(e.value) and isinstance(e.value, MemfitError)


def test_other_keras_backends_read_plain_files_and_are_told_to_pack_compressed_ones(
        tmp_path, monkeypatch):
    """On another Keras backend (tests/data/test_jax_feed.py runs JAX without TensorFlow
    and compares the batches): plain files come as a PyDataset; compressed ones, which only
    tf.data reads in place, are refused in one line."""
    from memfit.data.read import dispatch
    from memfit.data.read.feeds.keras_feed import KerasFeed

    x, y = _recipe_data(10)
    plain = write_recipe(tmp_path, x, y, files=1)
    (tmp_path / "gz").mkdir()
    packed = write_recipe(tmp_path / "gz", x, y, files=1, compression="GZIP")
    monkeypatch.setattr(dispatch, "keras_backend", lambda: "jax")
    feed = memfit.dataset([str(plain[0])], 8, features=("data", "label"))
    assert isinstance(feed, KerasFeed) and len(feed) == 2
    with pytest.raises(DatasetError, match=r"compressed TFRecord files in place on Keras's "
                                           r"TensorFlow backend only .* Keras runs on jax: "
                                           r"pack them first "
                                           r"\(memfit pack --tfrecord '.*gz.path1.tfrecords'"
                                           r" -o data/train\)") as e:
        memfit.dataset([str(packed[0])], 8)
    assert "\n" not in str(e.value)


def test_on_another_backend_a_feature_left_out_need_not_have_a_fixed_shape(tmp_path,
                                                                            monkeypatch):
    """A stranger's files held a string id beside the data: features= without it was
    refused for the id. Only the features returned must be fixed-shape numbers; with all
    of them, the refusal says which to leave out."""
    import tensorflow as tf

    from memfit.data.read import dispatch

    path = tmp_path / "ids.tfrecords"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(10):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i + 0.5])),
                "id": tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[f"sample-{i}".encode()]))})).SerializeToString())
    monkeypatch.setattr(dispatch, "keras_backend", lambda: "jax")
    feed = memfit.dataset([str(path)], 4, features=("x",), shuffle=False, epochs=1)
    got = np.concatenate([np.asarray(feed[i]) for i in range(len(feed))])
    assert np.array_equal(got.reshape(10, 2), [[i, i + 0.5] for i in range(10)])
    with pytest.raises(DatasetError, match=r"feature 'id' is .* or leave it out with "
                                           r"features=\('x',\)"):
        memfit.dataset([str(path)], 4)


def test_records_read_in_python_without_the_c_loop_are_the_same(tmp_path, monkeypatch):
    """Without memfit's C extension every record is read whole and decoded in Python by
    the pack's own code: the same batches as the C loop's reads in place."""
    from memfit.data.format import records

    x, y = _recipe_data(90)
    paths = write_recipe(tmp_path, x, y, files=3)
    with open(paths[1], "ab") as f:                  # one record more, written by memfit
        f.write(records.frame(_example(x[0], [5.0, 6.0])))
    kw = dict(features=("data", "label"), memory_budget="4MiB", seed=3, epochs=2)
    with_c = [(a.numpy(), b.numpy()) for a, b in memfit.dataset(
        [str(p) for p in paths], 16, **kw)]
    if records.NATIVE is None:
        pytest.fail("memfit.data.format.cwindow did not build: reinstall")
    monkeypatch.setattr(records, "NATIVE", None)
    in_python = [(a.numpy(), b.numpy()) for a, b in memfit.dataset(
        [str(p) for p in paths], 16, **kw)]
    assert len(with_c) == len(in_python) == 2 * 6
    for (a, b), (c, d) in zip(with_c, in_python, strict=True):
        assert np.array_equal(a, c) and np.array_equal(b, d)
    rows, _ = _rows(memfit.dataset([str(p) for p in paths], 91, features=("data", "label"),
                                   epochs=1))
    assert len(rows) == 91
    assert rows == sorted([(x[i].tobytes(), y[i].tobytes()) for i in range(90)]
                          + [(x[0].tobytes(), np.array([5.0, 6.0], np.float32).tobytes())])


@pytest.mark.parametrize("trial", range(6))
def test_bytes_flipped_at_random_leave_out_exactly_their_records(tmp_path, capsys, trial):
    """Bytes flipped at random places (header, data, CRC) after the files were opened:
    ``on_corrupt="raise"`` names one of the damaged records; ``"skip"`` leaves out exactly
    the damaged records, each named once, and every other record comes out intact."""
    rng = np.random.default_rng(100 + trial)
    x, y = _recipe_data(60, seed=trial)
    paths = write_recipe(tmp_path, x, y, files=3)
    kw = dict(features=("data", "label"), memory_budget="4MiB", seed=trial)
    raising = memfit.dataset([str(p) for p in paths], 8, **kw)
    skipping = memfit.dataset([str(p) for p in paths], 8, on_corrupt="skip", **kw)
    frame = paths[0].stat().st_size // 20                  # records of equal size
    hit = set()
    for _ in range(int(rng.integers(1, 4))):
        f, at = int(rng.integers(0, 3)), int(rng.integers(0, 20 * frame))
        data = bytearray(paths[f].read_bytes())
        data[at] ^= 1 << int(rng.integers(0, 8))
        paths[f].write_bytes(bytes(data))
        hit.add((f, at // frame))
    with pytest.raises(CorruptShardError) as e:
        list(raising)
    assert (paths.index(Path(e.value.file)), e.value.record) in hit
    rows, _ = _rows(skipping)
    keep = [i for i in range(60) if (i // 20, i % 20) not in hit]
    assert rows == sorted((x[i].tobytes(), y[i].tobytes()) for i in keep)
    err = capsys.readouterr().err
    assert err.count("memfit: WARNING: skipped record") == len(hit)
    for f, r in hit:
        assert f"skipped record {r} of TFRecord file {paths[f]}" in err


def test_on_another_backend_a_batch_that_lost_every_record_is_replaced(
        tmp_path, monkeypatch, capsys):
    """Keras asks a PyDataset for as many batches as were planned: on another backend a
    batch short by a damaged record stays short, and one that lost every record is
    replaced by the next batch of its epoch."""
    from memfit.data.read import dispatch

    x, y = _recipe_data(12)
    path = write_recipe(tmp_path, x, y, files=1)[0]
    monkeypatch.setattr(dispatch, "keras_backend", lambda: "jax")
    feed = memfit.dataset([str(path)], 4, features=("data", "label"), shuffle=False,
                          on_corrupt="skip")
    for record in (0, 1, 2, 3, 9):
        _flip(path, record)
    got = [np.asarray(feed[i][0]) for i in range(len(feed))]
    assert [len(b) for b in got] == [4, 4, 3]
    assert np.array_equal(got[0], x[4:8]) and np.array_equal(got[1], x[4:8])
    assert np.array_equal(got[2], x[[8, 10, 11]])
    assert capsys.readouterr().err.count("memfit: WARNING: skipped record") == 5


# -- what reaches the user's stderr: memfit's error, not TensorFlow's log lines --------------

DAMAGED_CHILD = """\
import sys

import keras
import tensorflow

import memfit

tensorflow.config.list_physical_devices()       # the script's start-up lines: before the mark
from memfit.errors import CorruptShardError

plain, compressed = sys.argv[1:]
print("MARK", file=sys.stderr, flush=True)


def run(what, call):
    try:
        call()
    except CorruptShardError as e:
        print(what, e, file=sys.stderr, flush=True)


ds = memfit.dataset(plain + "/*.tfrecords", 8, features=("data", "label"))
run("iterated:", lambda: list(ds))
model = keras.Sequential([keras.Input((6, 5, 3)), keras.layers.Flatten(),
                          keras.layers.Dense(2)])
model.compile("sgd", "mse")
run("fit:", lambda: model.fit(ds, epochs=1, verbose=0))
mixed = memfit.dataset([compressed], 4, shuffle=False, features=("data", "label"))
run("compressed:", lambda: list(mixed))
"""


def test_a_damaged_record_read_in_place_reaches_stderr_as_memfits_error_alone(tmp_path):
    # A CorruptShardError raised inside the reader's numpy_function made TensorFlow log
    # it with its Python traceback, twice (op_kernel.cc, then local_rendezvous.cc), before
    # the user saw memfit's error: 59 lines under model.fit.
    import tensorflow as tf

    from .helpers import tensorflow_lines, user_env

    x, y = _recipe_data(80)
    (tmp_path / "plain").mkdir()
    paths = write_recipe(tmp_path / "plain", x, y)
    _flip(paths[1], 5)
    mixed = tmp_path / "mixed.tfrecords"        # GZIP: read in sequence, decoded in Python
    with tf.io.TFRecordWriter(str(mixed), options="GZIP") as w:
        for i in range(12):
            w.write(_example(x[i] if i != 7 else np.zeros((6, 5, 4), np.float32), y[i]))
    script = tmp_path / "child.py"
    script.write_text(DAMAGED_CHILD)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "plain"), str(mixed)],
                       env=user_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    after = r.stderr.split("MARK\n", 1)[1]
    assert "Traceback" not in after and "op_kernel.cc" not in after, after
    # What remains of TensorFlow's: one line (and its "[[node ...]]" lines) that its
    # runtime logs at warning level for any error that ends a tf.data iteration, memfit's
    # or not; only TF_CPP_MIN_LOG_LEVEL=2, set before TensorFlow is imported, hides it,
    # and with it every other warning and error TensorFlow logs.
    logged = tensorflow_lines(after)
    assert all("local_rendezvous.cc" in line for line in logged) and len(logged) <= 3, after
    ours = [line for line in after.splitlines()
            if line not in logged and not line.startswith("\t [[")]
    damaged = (f"memfit: TFRecord file {paths[1]} is corrupt or truncated: record 5 of 20 "
               f"cannot be read (bad CRC32C of its data).")
    assert len(ours) == 3, after
    assert ours[0].startswith(f"iterated: {damaged}") and ours[1].startswith(f"fit: {damaged}")
    assert ours[2].startswith(f"compressed: memfit: TFRecord file {mixed} is not like its "
                              f"first record: record 7 of 12 disagrees.")


READERS_CHILD = """\
import sys

import tensorflow as tf

import memfit
from memfit.data.read.files.files_plan import READ_BUFFER

tf.config.list_physical_devices()               # the script's start-up lines: before the mark

files, packed = sys.argv[1:]
print("MARK", file=sys.stderr, flush=True)
for path in (files, packed):
    print(sum(len(y) for _, y in memfit.dataset(path, 8, features=("data", "label"))))
print("MARK", file=sys.stderr, flush=True)
list(tf.data.TFRecordDataset(tf.io.matching_files(files), compression_type="GZIP",
                             buffer_size=1))
print(READ_BUFFER)
"""


def test_tensorflows_tfrecord_reader_logs_nothing(tmp_path):
    # TensorFlow logs an info line the first time a process opens a TFRecord file ("The
    # default buffer size is 262144, which is overridden by the user specified
    # buffer_size of 262144" as memfit named it; "... is unspecified, default to 262144"
    # if not), in a tf.data thread: for GZIP files read in place, and packs read by the
    # TF reader (compressed, variable-shape, --keep-encoded).
    from .helpers import tensorflow_lines, user_env

    x, y = _recipe_data(40)
    (tmp_path / "gz").mkdir()
    write_recipe(tmp_path / "gz", x, y, files=2, compression="GZIP")
    memfit.pack({"data": x, "label": y}, tmp_path / "packed", compression="GZIP",
                progress=False)
    script = tmp_path / "child.py"
    script.write_text(READERS_CHILD)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "gz" / "*.tfrecords"),
                        str(tmp_path / "packed")], env=user_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    counts, read_buffer = r.stdout.split()[:2], int(r.stdout.split()[2])
    assert counts == ["40", "40"]
    _, reading, probe = r.stderr.split("MARK\n")
    assert tensorflow_lines(reading) == [], reading
    # The bytes read are the same: the buffer memfit named is the one TensorFlow reads
    # with when none is named (what it says when one is).
    assert f"The default buffer size is {read_buffer}, which is overridden" in probe, probe
