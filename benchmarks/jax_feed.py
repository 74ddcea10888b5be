"""Throughput of ``memfit.dataset`` on Keras's JAX backend (issue 26): the TF-free feed
(a ``keras.utils.PyDataset`` over the block reader and over the arrays reader) against
the ``tf.data`` pipeline (the TF path, what the JAX backend got before) and against
in-memory NumPy arrays (``model.fit(x, y, batch_size=256, shuffle=True)``).

Run from the repository root::

    .venv/bin/python benchmarks/jax_feed.py               # 16,384 samples, 3 rounds
    .venv/bin/python benchmarks/jax_feed.py --samples 32768 --rounds 5

Every side runs in its own child process on ``KERAS_BACKEND=jax`` (``JAX_PLATFORMS=cpu``
unless set): the feeds with TensorFlow made absent (the path finder finds no
``tensorflow``, as in tests/data/test_jax_feed.py), the TF path with TensorFlow imported
(the child makes ``memfit.dataset`` take the TensorFlow branch). A child builds its
input, runs one untimed epoch (compilation, warm page cache), then times ``--epochs``
epochs of ``model.fit`` (32x32x3 float32 images, 10 classes, Flatten → Dense(64) →
Dense(10), batch 256) and of plain iteration over the same input, and reports
samples/s. The rounds are interleaved (every side once per round, in turn), and the table
gives each side's median over the rounds and its spread (lowest–highest). The markdown
table goes to stdout, progress lines to stderr; data lives under ``--data-dir``
(default ``bench-data/jax_feed``) and is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
IMAGE = (32, 32, 3)
BATCH = 256
SIDES = ("feed_blocks", "feed_arrays", "tf_path", "numpy")
LABEL = {"feed_blocks": "JAX feed, block reader (TFRecord shards)",
         "feed_arrays": "JAX feed, arrays reader (.npy)",
         "tf_path": "TF path (tf.data, block reader) on JAX",
         "numpy": "in-memory NumPy arrays"}

NO_TF = textwrap.dedent("""
    import importlib.machinery

    _find = importlib.machinery.PathFinder.find_spec

    def _find_spec(fullname, path=None, target=None):
        if fullname.split(".")[0] in ("tensorflow", "tf_keras"):
            return None
        return _find(fullname, path, target)

    importlib.machinery.PathFinder.find_spec = staticmethod(_find_spec)
""")

CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    side, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import keras
    import memfit
    if side == "tf_path":                  # the tf.data pipeline, on the JAX backend
        import memfit.data.read.dispatch as dispatch
        dispatch.keras_backend = lambda: "tensorflow"
    if side in ("feed_blocks", "tf_path"):
        ds = memfit.dataset(data + "/pack", 256, features=("x", "y"))
        n = ds.memfit_plan.samples
    elif side == "feed_arrays":
        ds = memfit.dataset({"x": data + "/x.npy", "y": data + "/y.npy"}, 256,
                            features=("x", "y"))
        n = ds.memfit_plan.samples
    else:
        x, y = np.load(data + "/x.npy"), np.load(data + "/y.npy")
        n = len(x)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def fit(k):
        if side == "numpy":
            model.fit(x, y, batch_size=256, epochs=k, shuffle=True, verbose=0)
        else:
            model.fit(ds, epochs=k, verbose=0)

    def iterate():
        if side == "numpy":
            perm = np.random.default_rng(0).permutation(n)
            for a in range(0, n, 256):
                ids = np.sort(perm[a:a + 256])
                _ = x[ids], y[ids]
        elif side == "tf_path":
            for b in ds.as_numpy_iterator():
                pass
        else:
            for b in ds:
                pass

    fit(1)                                       # compile, warm the page cache
    t = time.perf_counter(); fit(epochs); fit_rate = n * epochs / (time.perf_counter() - t)
    iterate()
    t = time.perf_counter()
    for _ in range(epochs):
        iterate()
    read_rate = n * epochs / (time.perf_counter() - t)
    print(json.dumps({"fit": fit_rate, "read": read_rate,
                      "tensorflow": "tensorflow" in sys.modules}))
""")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_data(data: Path, n: int) -> None:
    """``x.npy``/``y.npy`` and their pack (default options: the block reader reads it)."""
    if (data / "pack" / "manifest.json").exists():
        return
    import memfit

    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    x = np.lib.format.open_memmap(data / "x.npy", "w+", np.float32, (n, *IMAGE))
    for a in range(0, n, 4096):
        x[a:a + 4096] = rng.random((min(4096, n - a), *IMAGE), dtype=np.float32)
    x.flush()
    np.save(data / "y.npy", rng.integers(0, 10, n).astype(np.int64))
    memfit.pack({"x": str(data / "x.npy"), "y": str(data / "y.npy")}, data / "pack",
                progress=False, overwrite=True)


def run_side(side: str, data: Path, epochs: int, site: Path) -> dict:
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join(
               ([str(site)] if side.startswith("feed") else []) + [str(REPO / "src")])}
    env.setdefault("JAX_PLATFORMS", "cpu")
    out = subprocess.run([sys.executable, "-c", CHILD, side, str(data), str(epochs)],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{side} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if side.startswith("feed") and result["tensorflow"]:
        raise SystemExit(f"{side} imported TensorFlow")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3)")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per child")
    parser.add_argument("--data-dir", type=Path, default=REPO / "bench-data" / "jax_feed")
    args = parser.parse_args(argv)
    data = args.data_dir / f"n{args.samples}"
    make_data(data, args.samples)
    site = args.data_dir / "no-tf-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_TF)
    rates: dict[str, dict[str, list[float]]] = {s: {"fit": [], "read": []} for s in SIDES}
    start = time.time()
    for r in range(args.rounds):
        for side in SIDES:
            got = run_side(side, data, args.epochs, site)
            for k in ("fit", "read"):
                rates[side][k].append(got[k])
            log(f"round {r + 1}/{args.rounds} {side}: fit {got['fit']:,.0f}/s, "
                f"read {got['read']:,.0f}/s ({time.time() - start:.0f} s)")
    base = {k: statistics.median(rates["numpy"][k]) for k in ("fit", "read")}
    tf_base = {k: statistics.median(rates["tf_path"][k]) for k in ("fit", "read")}
    print(f"{args.samples:,} samples of 32x32x3 float32, batch {BATCH}, KERAS_BACKEND=jax "
          f"(CPU), median of {args.rounds} interleaved rounds (lowest–highest), "
          f"{args.epochs} timed epochs a child\n")
    print("| input | model.fit samples/s | ÷ NumPy | ÷ TF path | iteration samples/s "
          "| ÷ NumPy | ÷ TF path |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for side in SIDES:
        cells = []
        for k in ("fit", "read"):
            v = rates[side][k]
            m = statistics.median(v)
            cells += [f"{m:,.0f} ({min(v):,.0f}–{max(v):,.0f})", f"{m / base[k]:.2f}",
                      f"{m / tf_base[k]:.2f}"]
        print(f"| {LABEL[side]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
