"""A damaged, truncated or missing shard met inside model.fit/evaluate/predict or while
iterating ends with memfit's one-line CorruptShardError (file, record, what to do). A user's
script ends on a short traceback whose last line is that message. With
on_corrupt="skip", the damage is skipped with one warning and training goes on. Under
`memfit run`, a training that meets one stops at once with exit 65."""

import os
import pickle
import subprocess
import sys
import textwrap
import traceback

import keras
import numpy as np
import pytest
import tensorflow as tf

import memfit
from memfit import exitcodes
from memfit.data.format.manifest import Manifest
from memfit.data.read.translate_errors import installed
from memfit.errors import CorruptShardError
from memfit.quiet import is_noise

# The lines a user sees when `python train.py` ends on a damaged shard inside model.fit,
# TensorFlow's start-up lines aside. Measured with Keras 3.15 / TF 2.21: "Traceback", the
# frames of train.py, Keras's error_handler and TensorFlow's quick_execute (two lines
# each, and a line of carets), memfit's message. Before: 31 lines (block reader).
FIT_LINES = 9
# TensorFlow's own log adds the status once, at its default log level: 3 more lines.
FIT_LINES_DEFAULT_LOG = FIT_LINES + 3

TRAIN = textwrap.dedent('''
    import sys
    from pathlib import Path

    import keras

    import memfit
    from memfit.data.format.manifest import Manifest

    path, reader, on_corrupt, damage = sys.argv[1:5]
    options = {} if reader == "arrays" else {"reader": reader}
    ds = memfit.dataset(path, 32, features=("x", "y"), on_corrupt=on_corrupt, **options)
    if damage == "delete":          # after the dataset was made: met inside fit
        m = Manifest.load(path)
        (m.path / m.splits["train"].shards[0].file).unlink()
    elif damage == "cut":           # a .npy file cut short while it is mapped
        x = Path(path) / "train" / "x.npy"
        x.write_bytes(x.read_bytes()[:-1000])
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=3, verbose=0)
    print("done")
''')


def pack_small(path, fmt="tfrecord"):
    rng = np.random.default_rng(0)
    source = {"x": rng.random((400, 8), dtype=np.float32), "y": rng.integers(0, 2, 400)}
    if fmt == "arrays":
        memfit.pack(source, path, format="arrays", progress=False)
    else:
        memfit.pack(source, path, shards=2, samples_per_record=10, progress=False)
    return path


def first_shard(path):
    m = Manifest.load(path)
    return m.path / m.splits["train"].shards[0].file


def flip(file):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def truncate(file):
    file.write_bytes(file.read_bytes()[:-100])


def run_script(tmp_path, *args, log_level="2"):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if log_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = log_level
    p = subprocess.run([sys.executable, str(script), *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=180)
    shown = [line for line in p.stderr.splitlines() if not is_noise(line)]
    return p, shown


# -- what `python train.py` shows ------------------------------------------------------------

@pytest.mark.parametrize(("reader", "damage", "log_level", "expect"), [
    ("blocks", "flip", None, "is corrupt or truncated: record 10 of 20 cannot be read"),
    ("tf", "delete", "2", "is missing: record 0 of 20 cannot be read"),    # and no hang
])
def test_a_damaged_shard_ends_the_script_on_memfits_line(tmp_path, reader, damage, log_level,
                                                       expect):
    data = pack_small(tmp_path / "data")
    bad = first_shard(data)
    if damage == "flip":
        flip(bad)
    p, shown = run_script(tmp_path, data, reader, "raise",
                          damage if damage == "delete" else "-", log_level=log_level)
    assert p.returncode == 1, p.stderr          # Python's status for an uncaught exception
    assert "done" not in p.stdout
    last = shown[-1]
    assert last.startswith(f"memfit.errors.CorruptShardError: memfit: shard {bad} {expect}")
    assert last.endswith(f"Run `memfit verify {data}`, then repack or restore the file; or "
                         f"pass on_corrupt='skip' to train without the damaged records.")
    assert len(shown) <= (FIT_LINES if log_level else FIT_LINES_DEFAULT_LOG), "\n".join(shown)
    assert shown[-FIT_LINES] == "Traceback (most recent call last):"
    if not log_level:                           # TensorFlow's own log: the status, once
        assert "local_rendezvous" in shown[0] and "memfit: shard" in shown[0]
    assert "InvalidArgumentError" not in p.stderr and "numpy_function" not in p.stderr


def test_a_npy_file_cut_short_while_mapped_is_memfits_error_not_a_bus_error(tmp_path):
    data = pack_small(tmp_path / "arrays", fmt="arrays")
    p, shown = run_script(tmp_path, data, "arrays", "raise", "cut")
    assert p.returncode == 1, p.stderr                      # not -7 (SIGBUS)
    x = data / "train" / "x.npy"
    assert shown[-1].startswith(f"memfit.errors.CorruptShardError: memfit: array file {x} is "
                                f"truncated: sample ")
    assert "cannot be read (the file has 11,928 of its 12,928 bytes" in shown[-1]
    assert len(shown) <= FIT_LINES, "\n".join(shown)


def test_skip_warns_once_and_training_goes_on(tmp_path):
    flipped = pack_small(tmp_path / "flipped")
    flip(first_shard(flipped))
    deleted = pack_small(tmp_path / "deleted")
    script = tmp_path / "skip.py"
    script.write_text(textwrap.dedent('''
        import sys
        import keras
        import memfit
        from memfit.data.format.manifest import Manifest

        for path, reader in ((sys.argv[1], "blocks"), (sys.argv[2], "tf")):
            ds = memfit.dataset(path, 32, features=("x", "y"), reader=reader,
                                on_corrupt="skip")
            if reader == "tf":          # deleted after the dataset was made
                m = Manifest.load(path)
                (m.path / m.splits["train"].shards[0].file).unlink()
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
            model.compile("sgd", "sparse_categorical_crossentropy")
            model.fit(ds, epochs=3, verbose=0)
            print(reader, "epochs", len(model.history.history["loss"]))
    '''))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run([sys.executable, str(script), str(flipped), str(deleted)], env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert "blocks epochs 3" in p.stdout and "tf epochs 3" in p.stdout   # training went on
    shown = [line for line in p.stderr.splitlines() if not is_noise(line)]
    assert shown == [                                    # one line each, in three epochs
        f"memfit: WARNING: skipped 1 unreadable records of shard {first_shard(flipped)} "
        f"(records [10]: damaged; bad CRC32C, length or tags).",
        f"memfit: WARNING: skipped shard {first_shard(deleted)}: the file is missing; its 20 "
        f"records are left out."], p.stderr


def test_memfit_run_stops_at_once_on_a_damaged_shard(tmp_path):
    data = pack_small(tmp_path / "data")
    bad = first_shard(data)
    flip(bad)
    script = tmp_path / "supervised.py"
    script.write_text(textwrap.dedent(f'''
        import keras, memfit
        with memfit.session(seed=1) as s:
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            train = s.dataset({str(data)!r}, 32, features=("x", "y"))
            model.fit(train, epochs=3, verbose=0, callbacks=[s.callback])
    '''))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run([sys.executable, "-m", "memfit", "run", "--workdir", str(tmp_path / "wd"),
                        "--", sys.executable, str(script)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == exitcodes.DATA_ERROR, p.stderr
    lines = [line for line in p.stderr.splitlines() if not is_noise(line)]
    assert lines[0].startswith(f"memfit: shard {bad} is corrupt or truncated: record 10 of 20")
    assert "Traceback" not in p.stderr and "restarting" not in p.stderr
    assert "stopped (the command met a damaged dataset (exit 65" in p.stderr
    assert "0 restarts" in p.stderr


# -- in this process: every way of reading, the error's fields ------------------------------

@pytest.fixture(scope="module")
def model():
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


READS = {
    "fit": lambda m, ds: m.fit(ds, epochs=1, verbose=0),
    "evaluate": lambda m, ds: m.evaluate(ds, verbose=0),
    "predict": lambda m, ds: m.predict(ds, verbose=0),
    "iterate": lambda m, ds: [None for _ in ds],
    "map": lambda m, ds: [None for _ in ds.map(lambda x, y: (x * 2, y))],
    "fit a mapped dataset": lambda m, ds: m.fit(ds.map(lambda x, y: (x, y)), verbose=0),
}


@pytest.mark.parametrize("reader", ["blocks", "tf"])
@pytest.mark.parametrize("read", list(READS))
def test_the_hook_turns_tensorflows_error_into_memfits(tmp_path, model, reader, read):
    data = pack_small(tmp_path / "data")
    bad = first_shard(data)
    flip(bad)
    ds = memfit.dataset(data, 32, features=("x", "y"), reader=reader, shuffle=False)
    assert installed()
    with pytest.raises(CorruptShardError) as e:
        READS[read](model, ds)
    assert (e.value.file, e.value.record) == (str(bad), 10)
    assert str(e.value).startswith(f"memfit: shard {bad} is corrupt or truncated: record 10")
    assert "\n" not in str(e.value)
    assert isinstance(e.value, tf.errors.InvalidArgumentError)     # still TensorFlow's too
    assert "memfit: shard" in e.value.message
    if read in ("iterate", "predict"):         # Python iterates memfit's dataset itself:
        frames = [f.filename for f in traceback.extract_tb(e.value.__traceback__)]
        assert not [f for f in frames if "tensorflow" in f], frames     # no TF frames
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is CorruptShardError and (back.file, back.record) == (str(bad), 10)


def test_a_shard_deleted_after_the_dataset_was_made_is_named(tmp_path, model):
    data = pack_small(tmp_path / "data")
    ds = memfit.dataset(data, 32, features=("x", "y"), reader="blocks")
    gone = first_shard(data)
    gone.unlink()
    with pytest.raises(CorruptShardError) as e:
        model.fit(ds, epochs=1, verbose=0)
    assert (e.value.file, e.value.record) == (str(gone), 0)
    assert str(e.value).startswith(f"memfit: shard {gone} is missing: record 0 of 20 cannot "
                                   f"be read (No such file or directory).")


@pytest.mark.parametrize("reader", ["blocks", "tf"])
def test_a_file_name_tensorflow_escapes_comes_back_whole(tmp_path, reader):
    data = pack_small(tmp_path / "donnée 'a' \"b\"")
    bad = first_shard(data)
    truncate(bad)
    with pytest.raises(CorruptShardError) as e:
        for _ in memfit.dataset(data, 32, reader=reader):
            pass
    assert e.value.file == str(bad) and e.value.record == 19
    assert f"memfit verify {data}`" in str(e.value)


def edit_counts(path, more):
    """The manifest says `more` samples more (or fewer) in its first shard than it holds."""
    import json

    file = path / "manifest.json"
    m = json.loads(file.read_text())
    split = m["splits"]["train"]
    split["shards"][0]["samples"] += more
    split["samples"] += more
    m["totals"]["samples"] += more
    file.write_text(json.dumps(m))


@pytest.mark.parametrize("reader", ["auto", "tf"])
@pytest.mark.parametrize(("more", "read", "said"), [
    (40, "fit", "gave 13 batches where its manifest promises 14: its shards hold fewer samples"),
    (40, "iterate", "gave 13 batches where its manifest promises 14: its shards hold fewer "
                    "samples"),
    # fit stops at the count it was promised; a loop reads on, and is told
    (-40, "iterate", "gave more than 12 batches where its manifest promises 12: its shards "
                     "hold more samples")])
def test_a_manifest_whose_counts_disagree_with_its_shards_is_said_as_such(
        tmp_path, model, reader, more, said, read):
    """A stranger's hand-edited count ended iteration on tf.data's "Input dataset was
    expected to contain 18 elements but contained only 16 elements"."""
    data = pack_small(tmp_path / "data")                  # 400 samples: 13 batches of 32
    edit_counts(data, more)
    ds = memfit.dataset(data, 32, features=("x", "y"), reader=reader, shuffle=False)
    with pytest.raises(CorruptShardError) as e:
        READS[read](model, ds)
    assert str(e.value) == (f"memfit: the pack {data} {said} than the manifest says (the "
                            f"manifest was edited, or a shard replaced). Run `memfit verify "
                            f"{data}`, then pack again.")
    # another dataset's count that nothing of memfit's promised stays TensorFlow's
    other = tf.data.Dataset.range(5).apply(tf.data.experimental.assert_cardinality(977))
    with pytest.raises(tf.errors.FailedPreconditionError) as e:
        list(other)
    assert not isinstance(e.value, CorruptShardError)
