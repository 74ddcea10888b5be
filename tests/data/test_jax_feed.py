"""``memfit.dataset`` on Keras's JAX backend without TensorFlow (issue 26, Data).

Each JAX part runs in a child process with ``KERAS_BACKEND=jax`` and a ``sitecustomize``
that makes the path finder find no ``tensorflow`` (as on a machine without it; the hook
of tests/test_without_frameworks.py), so that it is proven TF-free. This process (the
TensorFlow backend) reads the same datasets through ``tf.data`` and compares: the same
plan, the same batches batch for batch over two shuffled epochs, the same error.
"""

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import memfit
from memfit.errors import CorruptShardError
from tests.data.helpers import small_arrays
from tests.data.test_sources_tfrecord import _recipe_data, write_recipe

ROOT = Path(__file__).resolve().parents[2]


def _site(absent: tuple[str, ...]) -> str:
    return textwrap.dedent(f"""
        import importlib.machinery

        _find = importlib.machinery.PathFinder.find_spec

        def _find_spec(fullname, path=None, target=None):
            if fullname.split(".")[0] in {absent!r}:
                return None                     # not on any path entry: not installed
            return _find(fullname, path, target)

        importlib.machinery.PathFinder.find_spec = staticmethod(_find_spec)
    """)


def run_jax(tmp_path: Path, script: str, *, absent: tuple[str, ...] = ("tensorflow",
            "tf_keras"), timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs ``script`` on Keras's JAX backend with ``absent`` not installed (in ``env``,
    this process's environment by default)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_site(absent))
    env = {**(os.environ if env is None else env), "KERAS_BACKEND": "jax",
           "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src"), str(ROOT)]),
           "MEMFIT_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _plain(plan) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(plan)))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("jaxfeed")
    memfit.pack(small_arrays(1000), root / "ds", split="train=0.9,val=0.1", shards=6,
                samples_per_record=8, progress=False)
    arrays = small_arrays(700, seed=1)
    for name, a in arrays.items():
        np.save(root / f"{name}.npy", a)
    (root / "recipe").mkdir()                   # TFRecord files of the recipe, read in place
    x, y = _recipe_data(430, seed=2)
    write_recipe(root / "recipe", x, y, files=5)
    return root


def _cases(root: Path) -> dict[str, tuple[dict, int]]:
    """name → (memfit.dataset's arguments, passes read)."""
    ds, npy = str(root / "ds"), {k: str(root / f"{k}.npy") for k in ("x", "y", "id")}
    return {
        # a window of two batches: batches cut from 8 windows an epoch, the last short
        "blocks": (dict(path=ds, batch_size=64, split="train", memory_budget="128KiB",
                        seed=3), 2),
        "blocks_one_window": (dict(path=ds, batch_size=64, split="train", seed=3), 2),
        "blocks_epochs_range": (dict(path=ds, batch_size=64, split="train",
                                     memory_budget="128KiB", epoch=1, epochs=3), 1),
        "blocks_tuples_drop": (dict(path=ds, batch_size=50, split="train",
                                    features=["x", "id"], drop_remainder=True,
                                    memory_budget="128KiB"), 2),
        # a model's named inputs and its target; a feature in two places (autoencoders)
        "blocks_structured": (dict(path=ds, batch_size=64, split="train",
                                   features=({"b": "id", "a": "x"}, "x"),
                                   memory_budget="128KiB"), 1),
        "arrays": (dict(path=npy, batch_size=64, seed=3), 2),
        "arrays_structured": (dict(path=npy, batch_size=64, features=[{"x": "x"}, ["y"]]), 1),
        "arrays_epochs_range": (dict(path=npy, batch_size=64, features=["id", "x"],
                                     epoch=2, epochs=4), 1),
        # several windows an epoch: 1.6 MiB buys the readers and about 300 records
        "files": (dict(path=str(root / "recipe" / "path*.tfrecords"), batch_size=32,
                       memory_budget="1600KiB", seed=5), 2),
        "files_tuples_drop_epochs_range": (dict(
            path=[str(p) for p in sorted((root / "recipe").glob("*.tfrecords"))],
            batch_size=50, features=["label", "data"], drop_remainder=True, epoch=1,
            epochs=3), 1),
        "files_stored_order": (dict(path=str(root / "recipe" / "path*.tfrecords"),
                                    batch_size=64, shuffle=False), 1),
    }


def leaves(batch, key=""):
    """``(key, array)`` of every array of a batch, however nested: a dict's by its keys, a
    tuple's or a list's by their places (``0``, ``1.image``...)."""
    items = (batch.items() if isinstance(batch, dict) else enumerate(batch)
             if isinstance(batch, tuple | list) else None)
    if items is None:
        return [(key, batch)]
    return [leaf for k, v in items for leaf in leaves(v, f"{key}.{k}" if key else str(k))]


FEED_SCRIPT = textwrap.indent(inspect.getsource(leaves), "    ") + """
    import json, sys
    import numpy as np
    import memfit
    cases = json.load(open("cases.json"))
    plans = {}
    for name, (kw, passes) in cases.items():
        kw = dict(kw)
        ds = memfit.dataset(kw.pop("path"), kw.pop("batch_size"), **kw)
        out = {}
        for p in range(passes):
            for b, batch in enumerate(ds):                  # PyDataset.__iter__: a pass
                for k, v in leaves(batch):
                    out[f"{p}/{b}/{k}"] = np.asarray(v)
        np.savez(f"{name}.npz", **out)
        plans[name] = [type(ds).__name__, type(ds.memfit_plan).__name__,
                       json.loads(json.dumps(ds.memfit_plan.__dict__))]
    assert "tensorflow" not in sys.modules, "TensorFlow was imported"
    json.dump(plans, open("plans.json", "w"))
    print("ok")
"""


@pytest.fixture(scope="module")
def jax_read(sources, tmp_path_factory):
    """Every case read on JAX, in one child process: (plans, folder of .npz)."""
    work = tmp_path_factory.mktemp("jaxread")
    (work / "cases.json").write_text(json.dumps(_cases(sources)))
    out = run_jax(work, FEED_SCRIPT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    return json.loads((work / "plans.json").read_text()), work


def _tf_passes(kw: dict, passes: int) -> tuple[dict, object]:
    kw = dict(kw)
    ds = memfit.dataset(kw.pop("path"), kw.pop("batch_size"), **kw)
    out = {}
    for p in range(passes):
        for b, batch in enumerate(ds):                      # a new iterator: a pass
            for k, v in leaves(batch):
                out[f"{p}/{b}/{k}"] = v.numpy()
    return out, ds.memfit_plan


@pytest.mark.parametrize("case", ["blocks", "blocks_one_window", "blocks_epochs_range",
                                  "blocks_tuples_drop", "blocks_structured", "arrays",
                                  "arrays_structured", "arrays_epochs_range",
                                  "files", "files_tuples_drop_epochs_range",
                                  "files_stored_order"])
def test_the_same_plan_and_the_same_batches_as_the_tf_path(case, sources, jax_read):
    plans, work = jax_read
    kw, passes = _cases(sources)[case]
    want, tf_plan = _tf_passes(kw, passes)
    feed_type, plan_type, plan = plans[case]
    assert feed_type == "KerasFeed" and plan_type == type(tf_plan).__name__
    assert plan == _plain(tf_plan)                  # the same plan: budget, window, order
    assert tf_plan.estimated_bytes <= tf_plan.memory_budget
    got = dict(np.load(work / f"{case}.npz"))
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    if case in ("blocks", "files"):                 # several windows, and epochs differ
        assert tf_plan.window_samples < tf_plan.samples
    if passes == 2:
        first = [k for k in want if k.startswith("0/")]       # the passes are two epochs
        assert any(not np.array_equal(want[k], want["1" + k[1:]]) for k in first)


FIT_SCRIPT = """
    import json, sys
    import numpy as np
    import keras
    import memfit
    rng = np.random.default_rng(0)
    x = rng.random((1200, 8), dtype=np.float32)
    y = (x.sum(axis=1) > 4).astype(np.float32)
    memfit.pack({"x": x, "y": y}, "fit", shards=4, samples_per_record=16, progress=False)
    np.save("x.npy", x); np.save("y.npy", y)
    result = {}
    for name, source in (("blocks", "fit"), ("arrays", {"x": "x.npy", "y": "y.npy"})):
        ds = memfit.dataset(source, 64, features=("x", "y"), memory_budget="1MiB")
        reads = []
        position = ds.next_position
        ds.next_position = lambda: (reads.append(position()), reads[-1])[1]
        steps = []

        class Count(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                steps.append(0)

            def on_train_batch_end(self, batch, logs=None):
                steps[-1] += 1

        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
        # shuffle=True (the default): Keras asks for the batches in an order of its own
        history = model.fit(ds, epochs=3, verbose=0, callbacks=[Count()], shuffle=True)
        result[name] = dict(loss=history.history["loss"], steps=steps, reads=reads,
                            planned=ds.memfit_plan.steps_per_epoch)
    assert "tensorflow" not in sys.modules, "TensorFlow was imported"
    print(json.dumps(result))
"""


def test_model_fit_on_jax_trains_from_the_feed_epoch_after_epoch(tmp_path):
    out = run_jax(tmp_path, FIT_SCRIPT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert r["planned"] == 19, name                       # ceil(1200 / 64)
        assert r["steps"] == [19, 19, 19], name
        assert r["loss"][2] < r["loss"][1] < r["loss"][0], (name, r["loss"])
        reads = [tuple(p) for p in r["reads"]]
        # Keras looks at a batch to build the model; then epochs 0, 1, 2 in memfit's order
        assert reads[0] == (0, 0), name
        assert reads[1:] == [(e, s) for e in range(3) for s in range(19)], name


def _damaged_copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    shard = sorted(dst.glob("train-*.tfrecord"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return dst


CORRUPT_SCRIPT = """
    import sys
    import keras
    import memfit
    ds = memfit.dataset("bad", 64, split="train", features=("x", "y"),
                        on_corrupt=sys.argv[1] if len(sys.argv) > 1 else "{on_corrupt}")
    model = keras.Sequential([keras.Input((4, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(ds, epochs=2, verbose=0)
    print("epochs", len(history.history["loss"]), "tensorflow" in sys.modules)
"""


def test_a_flipped_byte_ends_with_memfits_one_line_error(sources, tmp_path, monkeypatch):
    _damaged_copy(sources / "ds", tmp_path / "bad")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CorruptShardError) as tf_error:        # the TF path's error
        for _ in memfit.dataset("bad", 64, split="train", features=("x", "y")):
            pass
    out = run_jax(tmp_path, CORRUPT_SCRIPT.format(on_corrupt="raise"))
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1, out.stderr[-3000:]
    assert last == f"memfit.errors.CorruptShardError: {tf_error.value}", out.stderr[-3000:]
    assert "record" in last and "train-" in last
    assert out.stderr.count("Traceback") == 1 and "During handling" not in out.stderr


def test_skip_warns_once_and_trains_on(sources, tmp_path):
    _damaged_copy(sources / "ds", tmp_path / "bad")
    out = run_jax(tmp_path, CORRUPT_SCRIPT.format(on_corrupt="skip"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("epochs 2 False"), out.stdout
    warnings = [line for line in out.stderr.splitlines() if "memfit: WARNING: skipped" in line]
    assert len(warnings) == 1 and "1 unreadable records" in warnings[0], out.stderr[-3000:]
    assert "ran out of data" not in out.stderr


def test_skip_keeps_the_planned_batches_and_every_sample_that_survives(sources, tmp_path):
    _damaged_copy(sources / "ds", tmp_path / "bad")
    out = run_jax(tmp_path, """
        import json
        import memfit
        ds = memfit.dataset("bad", 64, split="train", features=("id",), on_corrupt="skip",
                            memory_budget="128KiB")
        print(json.dumps([[ds[i].tolist() for i in range(len(ds))] for _ in range(2)]))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    passes = json.loads(out.stdout.strip().splitlines()[-1])
    for batches in passes:
        assert [len(b) for b in batches] == [64] * 14 + [4]    # as planned
        ids = [i for b in batches for i in b]
        assert 900 - 8 <= len(set(ids)) < 900                  # one record of 8 lost
    assert passes[0] != passes[1]


def test_a_tf_only_dataset_says_how_to_pack_it_for_jax(tmp_path):
    memfit.pack(small_arrays(100), tmp_path / "gz", shards=2, compression="GZIP",
                progress=False)
    out = run_jax(tmp_path, """
        import memfit
        from memfit.errors import FrameworkMissingError
        try:
            memfit.dataset("gz", 32)
        except FrameworkMissingError as e:
            print(e)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = out.stdout.strip().splitlines()
    assert "--compression" in line and "pip install 'memfit[tensorflow]'" in line, line
    assert "GZIP" in line


def test_on_jax_only_keras_and_jax_are_required(tmp_path):
    out = run_jax(tmp_path, """
        import memfit
        try:
            memfit.dataset
        except ImportError as e:
            print(e)
    """, absent=("tensorflow", "tf_keras", "keras", "jax", "jaxlib"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "memfit.dataset on Keras's JAX backend needs jax" in out.stdout
    assert "pip install 'memfit[jax]'" in out.stdout
    out = run_jax(tmp_path, """
        import memfit
        print(memfit.dataset.__module__)
    """)
    assert out.returncode == 0 and "dispatch" in out.stdout, out.stderr[-3000:]
