"""Side-by-side ratios for memfit's data path, all measured in one run.

Run from the repository root::

    .venv/bin/python benchmarks/stream.py            # full run (~5-7 min on 2 cores)
    .venv/bin/python benchmarks/stream.py --quick    # smoke run (smaller sizes, ~3-4 min)

The same data is used everywhere: 32x32x3 float32 images and int64 labels (random, from
NumPy, written to ``.npy`` with ``np.lib.format.open_memmap`` chunk by chunk so memory
stays bounded), batch size 256, page cache warm. Every throughput is the median of
``--passes`` timed passes over one epoch, after one untimed warm-up pass; the passes of
the two sides of a ratio are interleaved (A, B, A, B, ...) so that a noisy neighbour on
the CPU hits both alike. Throughput counts samples while iterating the dataset in Python.

What is compared (see docs/benchmarks.md):

1. ``memfit.dataset`` vs ``from_tensor_slices(...).shuffle(B).batch(256).prefetch(AUTOTUNE)``
   of the arrays in RAM, with ``B`` = the stream plan's ``window_samples``. The stream is
   measured with both of its readers: the block reader (the default for fixed-shape,
   uncompressed shards) and ``reader="tf"`` (``tf.data.TFRecordDataset`` +
   ``parse_example``, the reader before the block reader existed): before and after,
   side by side in one run.
2. ``model.fit(memfit stream)`` vs ``model.fit(x, y, batch_size=256, shuffle=True)``.
3. the stream vs ``np.fromfile`` of every shard file (the physical limit).
4. the stream vs the common TFRecord recipe (``serialize_tensor`` per sample, read with
   ``parse_single_example`` + ``parse_tensor``); ``memfit.pack`` vs that recipe's writer.
5. peak RSS of a child process streaming a big dataset vs a small one (both readers).
6. shuffle quality (rank correlation with storage order, batch-mates kept across epochs;
   both readers).
7. the arrays path (``memfit.dataset`` over the ``.npy`` files: memory-mapped, a global
   permutation per epoch) beside the stream and the in-memory pipeline: throughput with
   the page cache warm (in the passes of 1) and cold (each pass in a fresh child, the
   files' pages evicted with ``posix_fadvise(DONTNEED)`` first: no root needed), peak
   anonymous and file-backed RSS of a child for a small and a big source, shuffle quality.

The markdown table goes to stdout, progress lines to stderr. Data lives under
``--data-dir`` (default ``bench-data/``, git-ignored) and is reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import memfit

REPO = Path(__file__).resolve().parents[1]
IMAGE = (32, 32, 3)
BATCH = 256
SAMPLE_BYTES = int(np.prod(IMAGE)) * 4 + 8        # x float32 + y int64
CHUNK_BYTES = 64 * 2**20                          # rows generated at once
RECIPE_SHUFFLE = 3000
_STARTED = time.perf_counter()

# The child of measurement 5: stream one epoch, report memory as JSON (one line on stdout).
# With a third argument "arrays", PATH is a directory of x.npy/y.npy read by the arrays path;
# with "tf", PATH is read with memfit.dataset(..., reader="tf").
CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
import memfit

path, budget = sys.argv[1], sys.argv[2]
source, extra = path, {}
if sys.argv[3:] == ["arrays"]:
    source = {"x": f"{path}/x.npy", "y": f"{path}/y.npy"}
elif sys.argv[3:] == ["tf"]:
    extra = {"reader": "tf"}
ds = memfit.dataset(source, 256, features=("x", "y"), memory_budget=budget, **extra)
n = 0
started = time.perf_counter()
with memfit.measure() as m:
    for x, y in ds:
        n += int(x.shape[0])
seconds = time.perf_counter() - started
print(json.dumps({
    "samples": n, "seconds": seconds,
    "baseline_anon": m.before.rss_anon, "baseline_rss": m.before.rss,
    "peak_anon": m.peak.rss_anon, "peak_rss": m.peak.rss,
    "baseline_file": m.before.rss_file, "peak_file": m.peak.rss_file,
    "estimated_bytes": ds.memfit_plan.estimated_bytes,
}))
"""

# One process per pipeline, as a training has: build one pipeline (the block-reader stream,
# the arrays path or the in-memory one), one untimed warm-up pass, then PASSES timed
# passes; prints their samples/s as JSON. In one process with the other pipelines alive,
# their idle thread pools and left-over work make every hand-over between threads wait
# for the scheduler; see docs/benchmarks.md.
ISOLATED_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import memfit

kind, path, src, budget, passes, window = sys.argv[1:7]
if kind == "memfit":
    ds = memfit.dataset(path, 256, features=("x", "y"), memory_budget=budget)
elif kind == "arrays":
    ds = memfit.dataset({"x": f"{src}/x.npy", "y": f"{src}/y.npy"}, 256,
                        features=("x", "y"), memory_budget=budget)
else:
    x, y = np.load(f"{src}/x.npy"), np.load(f"{src}/y.npy")
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(int(window)).batch(256)
          .prefetch(tf.data.AUTOTUNE))
rates = []
for p in range(int(passes) + 1):
    n, started = 0, time.perf_counter()
    for xb, yb in ds:
        n += int(xb.shape[0])
    if p:
        rates.append(n / (time.perf_counter() - started))
print(json.dumps({"rates": rates}))
"""

# One cold pass: build the dataset, evict its files from the page cache (posix_fadvise
# DONTNEED: works without root; pages mapped by another process would stay, so the parent
# maps none of them), check with fincore what is still resident, then time one epoch
# (pipeline start included).
COLD_CHILD = r"""
import json, os, subprocess, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
import memfit

kind, path, budget = sys.argv[1:4]
if kind == "arrays":
    files = [f"{path}/x.npy", f"{path}/y.npy"]
    ds = memfit.dataset({"x": files[0], "y": files[1]}, 256, features=("x", "y"),
                        memory_budget=budget)
else:
    files = memfit.Manifest.load(path).files()
    ds = memfit.dataset(path, 256, features=("x", "y"), memory_budget=budget)
for f in files:
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
total = sum(os.path.getsize(f) for f in files)
try:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
                         capture_output=True, text=True, check=True).stdout
    resident = sum(int(v) for v in out.split())
except (OSError, subprocess.CalledProcessError, ValueError):
    resident = None
n = 0
started = time.perf_counter()
for x, y in ds:
    n += int(x.shape[0])
print(json.dumps({"samples": n, "seconds": time.perf_counter() - started,
                  "bytes": total, "resident": resident}))
"""


# -- small helpers --------------------------------------------------------------------------

def log(message: str) -> None:
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def rate(value: float) -> str:
    return f"{value:,.0f} samples/s"


def size(value: float) -> str:
    return memfit.format_size(int(value))


def count_samples(ds: Any) -> int:
    """Iterates a dataset once in Python; returns the number of samples seen."""
    n = 0
    for batch in ds:
        first = batch[0] if isinstance(batch, tuple | list) else batch
        n += int(first.shape[0])
    return n


def interleaved(name: str, sides: dict[str, Callable[[], int]],
                passes: int) -> dict[str, list[float]]:
    """Warm each side once, then time ``passes`` interleaved passes; samples/s of each."""
    for side, fn in sides.items():
        started = time.perf_counter()
        fn()
        log(f"{name}: warm-up {side} ({time.perf_counter() - started:.1f} s)")
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for p in range(passes):
        for side, fn in sides.items():
            started = time.perf_counter()
            n = fn()
            seconds = time.perf_counter() - started
            rates[side].append(n / seconds)
            log(f"{name}: pass {p + 1}/{passes} {side}: {n:,} samples in {seconds:.2f} s "
                f"= {rate(n / seconds)}")
    return rates


# -- data -----------------------------------------------------------------------------------

def _write_npy(path: Path, shape: tuple[int, ...], dtype: str,
               fill: Callable[[int, int], np.ndarray]) -> None:
    """Writes a .npy chunk by chunk through a memory map, remapping per chunk so that the
    pages written do not pile up in this process."""
    tmp = path.with_name(path.stem + ".partial.npy")
    np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape).flush()
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
    rows = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, shape[0], rows):
        stop = min(start + rows, shape[0])
        out = np.load(tmp, mmap_mode="r+")
        out[start:stop] = fill(start, stop)
        out.flush()
        del out
    os.replace(tmp, path)


def make_source(data_dir: Path, n: int, with_id: bool) -> dict[str, Path]:
    """Random images/labels (and ids) as .npy files; reused when already there."""
    folder = data_dir / f"src-{n}"
    paths = {"x": folder / "x.npy", "y": folder / "y.npy"}
    if with_id:
        paths["id"] = folder / "id.npy"
    stamp = folder / "done.json"
    done = json.loads(stamp.read_text()) if stamp.exists() else {}
    if done.get("n") == n and all(p.exists() for p in paths.values()) \
            and set(done.get("features", [])) >= set(paths):
        log(f"data: reusing {n:,} samples in {folder}")
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    log(f"data: writing {n:,} samples ({size(n * SAMPLE_BYTES)}) to {folder}")
    rng = np.random.default_rng(n)
    _write_npy(paths["x"], (n, *IMAGE), "float32",
               lambda a, b: rng.random((b - a, *IMAGE), dtype=np.float32))
    _write_npy(paths["y"], (n,), "int64", lambda a, b: rng.integers(0, 10, b - a))
    _write_npy(folder / "id.npy", (n,), "int64", lambda a, b: np.arange(a, b))
    paths["id"] = folder / "id.npy"
    stamp.write_text(json.dumps({"n": n, "features": sorted(paths)}))
    return {k: v for k, v in paths.items() if with_id or k != "id"}


def warm(paths: list[Path | str]) -> int:
    """Reads files once (page cache warm); returns the bytes read."""
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total


def ensure_pack(sources: dict[str, Path], out: Path, workers: int = 2) -> memfit.Manifest:
    """Packs ``sources`` into ``out`` unless an identical pack is already there."""
    stamp = out.with_name(out.name + ".stamp.json")
    key = {n: [str(p), p.stat().st_size, p.stat().st_mtime_ns] for n, p in sources.items()}
    if stamp.exists() and (out / "manifest.json").exists() \
            and json.loads(stamp.read_text()) == key:
        log(f"pack: reusing {out}")
        return memfit.Manifest.load(out)
    log(f"pack: packing {sorted(sources)} into {out} ({workers} workers, not timed)")
    stamp.unlink(missing_ok=True)
    res = memfit.pack({n: str(p) for n, p in sources.items()}, out, progress=False,
                      overwrite=True, workers=workers)
    log(f"pack: {res}")
    stamp.write_text(json.dumps(key))
    return res.manifest


# -- the common recipe ----------------------------------------------------------------------

def recipe_write(x_path: Path, y_path: Path, out: Path) -> int:
    """One tf.train.Example per sample, tensors stored with tf.io.serialize_tensor."""
    import tensorflow as tf

    x = np.load(x_path, mmap_mode="r")
    y = np.load(y_path, mmap_mode="r")
    with tf.io.TFRecordWriter(str(out)) as writer:
        for i in range(len(x)):
            feature = {
                "x": tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[tf.io.serialize_tensor(x[i]).numpy()])),
                "y": tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[tf.io.serialize_tensor(y[i]).numpy()])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
    return len(x)


def recipe_dataset(path: Path) -> Any:
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([], tf.string),
            "y": tf.io.FixedLenFeature([], tf.string)}

    def parse(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, spec)
        x = tf.reshape(tf.io.parse_tensor(example["x"], tf.float32), IMAGE)
        y = tf.reshape(tf.io.parse_tensor(example["y"], tf.int64), [])
        return x, y

    return (tf.data.TFRecordDataset(str(path)).shuffle(RECIPE_SHUFFLE)
            .map(parse, num_parallel_calls=8).batch(BATCH).prefetch(64))


# -- shuffle quality ------------------------------------------------------------------------

def epoch_batches(ds: Any) -> list[np.ndarray]:
    return [np.asarray(b) for b in ds]


def spearman(storage_pos: np.ndarray, ids_in_epoch: np.ndarray) -> float:
    """Rank correlation of storage position vs epoch position (both are permutations,
    so the ranks are the positions themselves)."""
    a = storage_pos[ids_in_epoch].astype(np.float64)
    b = np.arange(len(a), dtype=np.float64)
    return float(np.corrcoef(a, b)[0, 1])


def batchmates_kept(epoch0: list[np.ndarray], epoch1: list[np.ndarray], n: int) -> float:
    """Mean share of a sample's epoch-1 batch-mates that were its batch-mates in epoch 0."""
    b0 = np.empty(n, np.int64)
    b1 = np.empty(n, np.int64)
    for i, b in enumerate(epoch0):
        b0[b] = i
    for i, b in enumerate(epoch1):
        b1[b] = i
    size1 = np.array([len(b) for b in epoch1])[b1]
    _, inverse, counts = np.unique(b0 * len(epoch1) + b1, return_inverse=True,
                                   return_counts=True)
    shared = counts[inverse] - 1
    ok = size1 > 1
    return float(np.mean(shared[ok] / (size1[ok] - 1)))


def check_epoch(batches: list[np.ndarray], n: int, what: str) -> np.ndarray:
    ids = np.concatenate(batches)
    if len(ids) != n or not np.array_equal(np.sort(ids), np.arange(n)):
        raise SystemExit(f"{what}: an epoch did not yield every sample exactly once "
                         f"({len(ids)} samples, {len(np.unique(ids))} distinct, expected {n}).")
    return ids


def shuffle_quality(path: Path, n: int, budget: str, window: int,
                    id_file: Path) -> dict[str, dict]:
    import tensorflow as tf

    log("shuffle: reading storage order (shuffle=False) and two stream epochs")
    stored = check_epoch(epoch_batches(memfit.dataset(path, BATCH, features=("id",),
                                                      shuffle=False, memory_budget=budget)),
                         n, "memfit shuffle=False")
    storage_pos = np.empty(n, np.int64)
    storage_pos[stored] = np.arange(n)
    stream = memfit.dataset(path, BATCH, features=("id",), memory_budget=budget)
    s0, s1 = epoch_batches(stream), epoch_batches(stream)
    log("shuffle: two epochs of the stream with reader='tf'")
    tf_stream = memfit.dataset(path, BATCH, features=("id",), memory_budget=budget, reader="tf")
    t0, t1 = epoch_batches(tf_stream), epoch_batches(tf_stream)
    log(f"shuffle: two in-memory epochs (shuffle({window:,}))")
    memory = (tf.data.Dataset.from_tensor_slices(np.arange(n, dtype=np.int64))
              .shuffle(window).batch(BATCH).prefetch(tf.data.AUTOTUNE))
    m0, m1 = epoch_batches(memory), epoch_batches(memory)
    log("shuffle: two epochs of the arrays path over id.npy (storage order = file order)")
    arrays = memfit.dataset({"id": str(id_file)}, BATCH, features=("id",), memory_budget=budget)
    a0, a1 = epoch_batches(arrays), epoch_batches(arrays)
    out: dict[str, dict] = {}
    for side, (e0, e1, pos) in {"memfit": (s0, s1, storage_pos),
                                 "memfit-tf": (t0, t1, storage_pos),
                                 "memory": (m0, m1, np.arange(n)),
                                 "arrays": (a0, a1, np.arange(n))}.items():
        rhos = [spearman(pos, check_epoch(e, n, side)) for e in (e0, e1)]
        out[side] = {"rho": rhos, "abs_rho": float(np.mean(np.abs(rhos))),
                     "kept": batchmates_kept(e0, e1, n)}
    return out


# -- peak RSS of a child --------------------------------------------------------------------

def run_child(code: str, *args: str, what: str) -> dict:
    """Runs ``code`` in a fresh Python; returns the JSON object of its last ``{`` line."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env,
                          capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the {what} child failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def child_peak(path: Path, budget: str, arrays: bool = False, reader: str = "") -> dict:
    extra = ["arrays"] if arrays else ([reader] if reader else [])
    result = run_child(CHILD, str(path), budget, *extra, what=f"streaming ({path})")
    what = " (arrays path)" if arrays else (f" (reader={reader!r})" if reader else "")
    log(f"rss: {path.name}{what}: {result['samples']:,} samples "
        f"in {result['seconds']:.1f} s, baseline anon {size(result['baseline_anon'])}, peak "
        f"anon {size(result['peak_anon'])}, peak file-backed {size(result['peak_file'])}, "
        f"peak total {size(result['peak_rss'])}")
    return result


# A child packing the big set from memory-mapped .npy files: how much anonymous memory
# packing a file larger than RAM needs.
PACK_CHILD = r"""
import json, sys, shutil, tempfile
import memfit

src, scratch = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(dir=scratch)
out = tmp + "/pack"
with memfit.measure() as m:
    r = memfit.pack({"x": f"{src}/x.npy", "y": f"{src}/y.npy"}, out, progress=False)
shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps({"bytes": r.bytes, "seconds": r.seconds,
                  "anon_growth": m.peak.rss_anon - m.before.rss_anon,
                  "peak_file": m.peak.rss_file}))
"""


def pack_peak(source: dict[str, Path], scratch: Path) -> dict:
    result = run_child(PACK_CHILD, str(source["x"].parent), str(scratch), what="packing")
    log(f"pack rss: {size(result['bytes'])} packed in {result['seconds']:.1f} s, anon growth "
        f"{size(result['anon_growth'])}, peak file-backed {size(result['peak_file'])}")
    return result


# -- the run --------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, help="samples in the throughput dataset "
                   "(default 25000, about 300 MB; 8000 with --quick)")
    p.add_argument("--big-gb", type=float, help="size of the big dataset of the peak-RSS "
                   "test, in GB (default 4; 1 with --quick)")
    p.add_argument("--small-gb", type=float, default=0.25,
                   help="size of the small dataset of the peak-RSS test, in GB (0.25)")
    p.add_argument("--budget", default="256MiB", help="memory_budget of every stream (256MiB)")
    p.add_argument("--passes", type=int, default=3, help="timed passes per measurement (3)")
    p.add_argument("--rss-runs", type=int, default=3,
                   help="children per size in the peak-RSS test; medians are kept (3)")
    p.add_argument("--data-dir", default=str(REPO / "bench-data"),
                   help="where the data goes (default: bench-data/ in the repository)")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    args = p.parse_args(argv)
    if args.samples is None:
        args.samples = 8000 if args.quick else 25000
    if args.big_gb is None:
        args.big_gb = 1.0 if args.quick else 4.0
    if (args.samples < 2 * BATCH or args.passes < 1 or args.rss_runs < 1
            or args.big_gb <= 0 or args.small_gb <= 0):
        p.error(f"need --samples >= {2 * BATCH}, --passes >= 1, --rss-runs >= 1 and positive "
                f"sizes. Received: samples={args.samples}, passes={args.passes}, "
                f"rss_runs={args.rss_runs}, big_gb={args.big_gb}, small_gb={args.small_gb}")
    return args


def measure_writes(src: dict[str, Path], data_dir: Path, n: int,
                   passes: int) -> tuple[dict[str, list[float]], Path, Path]:
    """5b: ``memfit.pack`` vs the recipe's per-sample writing loop, interleaved. Each
    writer's previous output is deleted outside the timer."""
    pack_dir = data_dir / f"pack-xy-{n}"
    recipe_dir = data_dir / f"recipe-{n}"
    recipe_file = recipe_dir / "train.tfrecord"

    def do_pack() -> int:
        return memfit.pack({"x": str(src["x"]), "y": str(src["y"])}, pack_dir,
                           progress=False, overwrite=True).samples

    def do_recipe() -> int:
        recipe_dir.mkdir(parents=True)
        return recipe_write(src["x"], src["y"], recipe_file)

    rates: dict[str, list[float]] = {"memfit.pack": [], "recipe": []}
    for p in range(passes + 1):
        for side, fn, out in (("memfit.pack", do_pack, pack_dir),
                              ("recipe", do_recipe, recipe_dir)):
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            count = fn()
            seconds = time.perf_counter() - started
            label = "warm-up" if p == 0 else f"pass {p}/{passes}"
            log(f"write: {label} {side}: {count:,} samples in {seconds:.2f} s "
                f"= {rate(count / seconds)}")
            if p:
                rates[side].append(count / seconds)
    return rates, pack_dir, recipe_file


def measure_reads(src: dict[str, Path], pack_dir: Path, recipe_file: Path, budget: str,
                  passes: int) -> tuple[dict[str, list[float]], Any]:
    """1, 4, 5a: stream vs in-memory (same shuffle buffer) vs raw bytes vs the recipe."""
    import tensorflow as tf

    manifest = memfit.Manifest.load(pack_dir)
    shard_files = manifest.files()
    stream = memfit.dataset(pack_dir, BATCH, features=("x", "y"), memory_budget=budget)
    plan = stream.memfit_plan
    log(f"plan: {plan}")
    tf_stream = memfit.dataset(pack_dir, BATCH, features=("x", "y"), memory_budget=budget,
                               reader="tf")
    log(f"plan (reader='tf'): {tf_stream.memfit_plan}")
    arrays = memfit.dataset({"x": str(src["x"]), "y": str(src["y"])}, BATCH,
                            features=("x", "y"), memory_budget=budget)
    log(f"arrays plan: {arrays.memfit_plan}")
    x, y = np.load(src["x"]), np.load(src["y"])
    memory = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(plan.window_samples)
              .batch(BATCH).prefetch(tf.data.AUTOTUNE))
    recipe = recipe_dataset(recipe_file)
    warm([*shard_files, recipe_file])

    def raw_read() -> int:
        for f in shard_files:
            np.fromfile(f, dtype=np.uint8)
        return manifest.samples

    # TensorFlow's own TFRecord reader over the same shards, nothing after it (records are
    # read and CRC-checked, not parsed): what any TFRecord stream here pays first.
    records = tf.data.TFRecordDataset(shard_files, num_parallel_reads=os.cpu_count())

    def tfrecord_read() -> int:
        for _ in records.batch(64):
            pass
        return manifest.samples

    rates = interleaved("read", {
        "memfit": lambda: count_samples(stream),
        "memfit-tf": lambda: count_samples(tf_stream),
        "arrays": lambda: count_samples(arrays),
        "in-memory": lambda: count_samples(memory),
        "recipe": lambda: count_samples(recipe),
        "np.fromfile": raw_read,
        "TFRecordDataset": tfrecord_read,
    }, passes)
    return rates, (plan, arrays.memfit_plan, tf_stream.memfit_plan)


def measure_isolated(src: dict[str, Path], pack_dir: Path, budget: str, passes: int,
                     window: int) -> dict[str, list[float]]:
    """1 again, each pipeline alone in its own process (as a training runs it): ``passes``
    rounds, each a fresh child per pipeline in turn (a warm-up pass, then 3 timed
    passes; the child's median counts)."""
    rates: dict[str, list[float]] = {"memfit": [], "arrays": [], "in-memory": []}
    for r in range(passes):
        for kind in rates:
            out = run_child(ISOLATED_CHILD, kind, str(pack_dir), str(src["x"].parent), budget,
                            "3", str(window), what=f"isolated {kind}")
            rates[kind].append(statistics.median(out["rates"]))
            log(f"isolated: round {r + 1}/{passes} {kind}: "
                f"{', '.join(rate(v) for v in out['rates'])}")
    return rates


def measure_cold(src: dict[str, Path], pack_dir: Path, budget: str,
                 passes: int) -> dict[str, Any]:
    """7: one epoch with the page cache cold, arrays path vs stream, each pass a fresh
    child (interleaved). Runs before anything in this process maps the .npy files."""
    rates: dict[str, list[float]] = {"arrays": [], "memfit": []}
    resident: list[float] = []
    for p in range(passes):
        for side, path in (("arrays", src["x"].parent), ("memfit", pack_dir)):
            r = run_child(COLD_CHILD, side, str(path), budget, what=f"cold {side}")
            rates[side].append(r["samples"] / r["seconds"])
            if r["resident"] is not None:
                resident.append(r["resident"] / r["bytes"])
            log(f"cold: pass {p + 1}/{passes} {side}: {r['samples']:,} samples in "
                f"{r['seconds']:.2f} s = {rate(r['samples'] / r['seconds'])}; resident after "
                f"eviction: {'n/a' if r['resident'] is None else size(r['resident'])} of "
                f"{size(r['bytes'])}")
    return {"rates": rates, "resident": max(resident) if resident else None}


def measure_fit(src: dict[str, Path], pack_dir: Path, budget: str,
                passes: int) -> dict[str, list[float]]:
    """3: the same trivial model fitted on NumPy arrays and on the stream."""
    import keras

    x, y = np.load(src["x"]), np.load(src["y"])
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(IMAGE), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    stream = memfit.dataset(pack_dir, BATCH, features=("x", "y"), memory_budget=budget)

    def fit_numpy() -> int:
        model.fit(x, y, batch_size=BATCH, shuffle=True, epochs=1, verbose=0)
        return len(x)

    def fit_memfit() -> int:
        model.fit(stream, epochs=1, verbose=0)
        return stream.memfit_plan.samples

    return interleaved("fit", {"memfit": fit_memfit, "numpy": fit_numpy}, passes)


def measure_rss(data_dir: Path, sizes_gb: dict[str, float], budget: str,
                runs: int) -> dict[str, dict]:
    """6: peak RSS of a child streaming one epoch of a small and of a big dataset
    (``runs`` children each, alternating; the median of each number is kept)."""
    datasets = {}
    for label, gb in sizes_gb.items():
        count = max(2 * BATCH, int(gb * 1e9 / SAMPLE_BYTES))
        source = make_source(data_dir, count, with_id=False)
        datasets[label] = (gb, count, ensure_pack(source, data_dir / f"pack-xy-{count}"))
    results: dict[str, list[dict]] = {label: [] for label in
                                      [*datasets, *(f"arrays-{k}" for k in datasets),
                                       *(f"tf-{k}" for k in datasets)]}
    for _ in range(runs):
        for label, (_, count, manifest) in datasets.items():
            results[label].append(child_peak(manifest.path, budget))
            results[f"tf-{label}"].append(child_peak(manifest.path, budget, reader="tf"))
            npy_dir = make_source(data_dir, count, with_id=False)["x"].parent
            results[f"arrays-{label}"].append(child_peak(npy_dir, budget, arrays=True))
    out: dict[str, dict] = {"pack": pack_peak(make_source(
        data_dir, datasets["big"][1], with_id=False), data_dir)}
    for label, (gb, count, manifest) in datasets.items():
        for key in (label, f"arrays-{label}", f"tf-{label}"):
            runs_ = results[key]
            nbytes = count * SAMPLE_BYTES if key.startswith("arrays") else manifest.bytes
            out[key] = {"gb": gb, "samples": count, "bytes": nbytes, "runs": runs_,
                        **{k: statistics.median(r[k] for r in runs_) for k in runs_[0]}}
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    n, budget, passes = args.samples, args.budget, args.passes
    load = os.getloadavg()[0]
    log(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} cores, "
        f"load {load:.2f}; {n:,} samples, budget {budget}, data in {data_dir}")

    src = make_source(data_dir, n, with_id=True)
    warm(list(src.values()))
    writes, pack_dir, recipe_file = measure_writes(src, data_dir, n, passes)
    cold = measure_cold(src, pack_dir, budget, passes)
    reads, (plan, arrays_plan, tf_plan) = measure_reads(src, pack_dir, recipe_file, budget,
                                                        passes)
    fits = measure_fit(src, pack_dir, budget, passes)
    isolated = measure_isolated(src, pack_dir, budget, passes, plan.window_samples)

    id_dir = ensure_pack(src, data_dir / f"pack-xyid-{n}").path
    id_window = memfit.dataset(id_dir, BATCH, features=("id",),
                               memory_budget=budget).memfit_plan.window_samples
    shuffle = shuffle_quality(id_dir, n, budget, id_window, src["id"])

    rss = measure_rss(data_dir, {"small": args.small_gb, "big": args.big_gb}, budget,
                      args.rss_runs)

    elapsed = time.perf_counter() - _STARTED
    print(render(args, tf.__version__, keras.__version__, load, plan, reads, fits, writes,
                 shuffle, id_window, rss, memfit.parse_size(budget), elapsed, cold,
                 arrays_plan, tf_plan, isolated))
    log(f"done in {elapsed:.0f} s")


# -- the table ------------------------------------------------------------------------------

def _row(measure: str, ours: str, theirs: str, ratio: float | None, goal: str,
         met: bool | None) -> str:
    r = "—" if ratio is None else f"{ratio:.2f}×"
    m = "—" if met is None else ("yes" if met else "**no**")
    return f"| {measure} | {ours} | {theirs} | {r} | {goal} | {m} |"


def render(args: argparse.Namespace, tf_version: str, keras_version: str, load: float,
           plan: Any, reads: dict[str, list[float]], fits: dict[str, list[float]],
           writes: dict[str, list[float]], shuffle: dict[str, dict], id_window: int,
           rss: dict[str, dict], budget_bytes: int, elapsed: float, cold: dict[str, Any],
           arrays_plan: Any, tf_plan: Any, isolated: dict[str, list[float]]) -> str:
    n = args.samples
    med = {f"{group}/{side}": statistics.median(v)
           for group, d in (("read", reads), ("fit", fits), ("write", writes))
           for side, v in d.items()}
    stream = med["read/memfit"]
    small, big = rss["small"], rss["big"]
    limit = budget_bytes + big["baseline_anon"]
    r_mem = stream / med["read/in-memory"]
    r_recipe = stream / med["read/recipe"]
    r_write = med["write/memfit.pack"] / med["write/recipe"]
    r_anon = big["peak_anon"] / small["peak_anon"]
    r_total = big["peak_rss"] / small["peak_rss"]
    sm, mm, am = shuffle["memfit"], shuffle["memory"], shuffle["arrays"]
    tm = shuffle["memfit-tf"]
    before = med["read/memfit-tf"]                      # the stream with reader="tf"
    t_small, t_big = rss["tf-small"], rss["tf-big"]
    rt_anon = t_big["peak_anon"] / t_small["peak_anon"]
    rt_total = t_big["peak_rss"] / t_small["peak_rss"]
    t_limit = budget_bytes + t_big["baseline_anon"]
    arr = med["read/arrays"]
    cold_med = {side: statistics.median(v) for side, v in cold["rates"].items()}
    a_small, a_big = rss["arrays-small"], rss["arrays-big"]
    a_limit = budget_bytes + a_big["baseline_anon"]
    a_small_file = a_small["peak_file"] - a_small["baseline_file"]
    a_big_file = a_big["peak_file"] - a_big["baseline_file"]
    ra_anon = a_big["peak_anon"] / a_small["peak_anon"]
    ra_mem = arr / med["read/in-memory"]
    resident = "n/a (no fincore)" if cold["resident"] is None \
        else f"at most {cold['resident']:.1%} of the files resident after eviction"
    iso = {side: statistics.median(v) for side, v in isolated.items()}
    r_iso = iso["memfit"] / iso["in-memory"]
    rows = [
        "| measure | memfit | baseline | ratio | goal | met? |",
        "|---|---|---|---|---|---|",
        _row(f"read, each pipeline in its own process (as a training runs it): stream "
             f"(block reader) ÷ in-memory `from_tensor_slices` → "
             f"`shuffle({plan.window_samples:,})` → `batch` → `prefetch`", rate(iso["memfit"]),
             rate(iso["in-memory"]), r_iso, "≥ 1.0", r_iso >= 1.0),
        _row("read, each in its own process: arrays path ÷ in-memory", rate(iso["arrays"]),
             rate(iso["in-memory"]), iso["arrays"] / iso["in-memory"], "≥ 1.0",
             iso["arrays"] >= iso["in-memory"]),
        _row(f"read, all pipelines in one process, passes interleaved: stream (block reader) "
             f"÷ in-memory `from_tensor_slices` → `shuffle({plan.window_samples:,})` → "
             f"`batch` → `prefetch`", rate(stream),
             rate(med["read/in-memory"]), r_mem, "≥ 1.0", r_mem >= 1.0),
        _row("read, before: stream with `reader=\"tf\"` ÷ the same in-memory pipeline",
             rate(before), rate(med["read/in-memory"]), before / med["read/in-memory"],
             "≥ 1.0", before >= med["read/in-memory"]),
        _row("read: stream (block reader) ÷ common recipe (`parse_single_example` + "
             "`parse_tensor`)", rate(stream), rate(med["read/recipe"]), r_recipe, "≥ 2.0",
             r_recipe >= 2.0),
        _row("read, before: stream with `reader=\"tf\"` ÷ common recipe", rate(before),
             rate(med["read/recipe"]), before / med["read/recipe"], "≥ 2.0",
             before >= 2.0 * med["read/recipe"]),
        _row("read: block reader ÷ `reader=\"tf\"` (after ÷ before)", rate(stream),
             rate(before), stream / before, "—", None),
        _row("read: stream ÷ raw `np.fromfile` of the shard files (physical limit)",
             rate(stream), rate(med["read/np.fromfile"]), stream / med["read/np.fromfile"],
             "—", None),
        _row("read: stream ÷ a bare `TFRecordDataset` over the same shards (reader + CRC only)",
             rate(stream), rate(med["read/TFRecordDataset"]),
             stream / med["read/TFRecordDataset"], "—", None),
        _row("read: bare `TFRecordDataset` ÷ in-memory (the ceiling of any TFRecord stream)",
             rate(med["read/TFRecordDataset"]), rate(med["read/in-memory"]),
             med["read/TFRecordDataset"] / med["read/in-memory"], "—", None),
        _row("write: `memfit.pack` (from .npy) ÷ recipe's per-sample `TFRecordWriter` loop",
             rate(med["write/memfit.pack"]), rate(med["write/recipe"]), r_write, "≥ 3",
             r_write >= 3),
        _row("`model.fit`, trivial model: stream ÷ NumPy arrays (`shuffle=True`)",
             rate(med["fit/memfit"]), rate(med["fit/numpy"]),
             med["fit/memfit"] / med["fit/numpy"], "—", None),
        _row(f"peak anon RSS of a child streaming {big['gb']:g} GB ÷ {small['gb']:g} GB",
             size(big["peak_anon"]), size(small["peak_anon"]), r_anon, "≤ 1.05",
             r_anon <= 1.05),
        _row(f"peak total RSS of a child streaming {big['gb']:g} GB ÷ {small['gb']:g} GB",
             size(big["peak_rss"]), size(small["peak_rss"]), r_total, "≤ 1.05",
             r_total <= 1.05),
        _row(f"peak anon RSS ({big['gb']:g} GB) ÷ (memory_budget + TF baseline "
             f"{size(big['baseline_anon'])})", size(big["peak_anon"]), size(limit),
             big["peak_anon"] / limit, "≤ 1.0", big["peak_anon"] <= limit),
        _row(f"before, `reader=\"tf\"`: peak anon RSS {big['gb']:g} GB ÷ {small['gb']:g} GB",
             size(t_big["peak_anon"]), size(t_small["peak_anon"]), rt_anon, "≤ 1.05",
             rt_anon <= 1.05),
        _row(f"before, `reader=\"tf\"`: peak total RSS {big['gb']:g} GB ÷ {small['gb']:g} GB",
             size(t_big["peak_rss"]), size(t_small["peak_rss"]), rt_total, "≤ 1.05",
             rt_total <= 1.05),
        _row(f"before, `reader=\"tf\"`: peak anon RSS ({big['gb']:g} GB) ÷ (memory_budget + "
             f"TF baseline {size(t_big['baseline_anon'])})", size(t_big["peak_anon"]),
             size(t_limit), t_big["peak_anon"] / t_limit, "≤ 1.0",
             t_big["peak_anon"] <= t_limit),
        _row(f"anon RSS growth of a child packing the {big['gb']:g} GB set from memory-mapped "
             f".npy (peak file-backed {size(rss['pack']['peak_file'])})",
             size(rss["pack"]["anon_growth"]), "—", None, "bounded (~32 MiB chunks)", None),
        _row("shuffle: \\|Spearman ρ\\| of storage vs epoch position, mean of 2 epochs "
             "(lower is better)", f"{sm['abs_rho']:.3f}", f"{mm['abs_rho']:.3f}",
             sm["abs_rho"] / mm["abs_rho"] if mm["abs_rho"] else None, "—", None),
        _row(f"shuffle: share of epoch-1 batch-mates already batch-mates in epoch 0 "
             f"(lower is better; random ≈ {(BATCH - 1) / (n - 1):.4f})",
             f"{sm['kept']:.4f}", f"{mm['kept']:.4f}",
             sm["kept"] / mm["kept"] if mm["kept"] else None, "—", None),
        _row("shuffle, before (`reader=\"tf\"`): \\|Spearman ρ\\| ÷ in-memory",
             f"{tm['abs_rho']:.3f}", f"{mm['abs_rho']:.3f}",
             tm["abs_rho"] / mm["abs_rho"] if mm["abs_rho"] else None, "—", None),
        _row("shuffle, before (`reader=\"tf\"`): batch-mates kept ÷ in-memory",
             f"{tm['kept']:.4f}", f"{mm['kept']:.4f}",
             tm["kept"] / mm["kept"] if mm["kept"] else None, "—", None),
        _row("read: arrays path (.npy memory-mapped, global shuffle) ÷ in-memory "
             "`from_tensor_slices` (page cache warm)", rate(arr), rate(med["read/in-memory"]),
             ra_mem, "≥ 1.0", ra_mem >= 1.0),
        _row("read: arrays path ÷ TFRecord stream (page cache warm)", rate(arr), rate(stream),
             arr / stream, "—", None),
        _row(f"read: arrays path ÷ TFRecord stream, page cache cold (fresh child per pass, "
             f"files evicted with `posix_fadvise(DONTNEED)`; {resident})",
             rate(cold_med["arrays"]), rate(cold_med["memfit"]),
             cold_med["arrays"] / cold_med["memfit"], "—", None),
        _row(f"peak anon RSS of a child reading {a_big['gb']:g} GB of .npy by the arrays path "
             f"÷ {a_small['gb']:g} GB", size(a_big["peak_anon"]), size(a_small["peak_anon"]),
             ra_anon, "≤ 1.05", ra_anon <= 1.05),
        _row(f"peak anon RSS, arrays path ({a_big['gb']:g} GB) ÷ (memory_budget + TF baseline "
             f"{size(a_big['baseline_anon'])})", size(a_big["peak_anon"]), size(a_limit),
             a_big["peak_anon"] / a_limit, "≤ 1.0", a_big["peak_anon"] <= a_limit),
        _row(f"file-backed RSS growth (peak − baseline: mapped page cache, not a leak), arrays "
             f"path {a_big['gb']:g} GB ÷ {a_small['gb']:g} GB", size(a_big_file),
             size(a_small_file), a_big_file / a_small_file if a_small_file else None, "—",
             None),
        _row("shuffle: \\|Spearman ρ\\| of file vs epoch position, arrays path ÷ TFRecord "
             "stream (lower is better)", f"{am['abs_rho']:.3f}", f"{sm['abs_rho']:.3f}",
             am["abs_rho"] / sm["abs_rho"] if sm["abs_rho"] else None, "—", None),
        _row("shuffle: share of epoch-1 batch-mates already batch-mates in epoch 0, arrays "
             "path ÷ TFRecord stream", f"{am['kept']:.4f}", f"{sm['kept']:.4f}",
             am["kept"] / sm["kept"] if sm["kept"] else None, "—", None),
    ]
    python = os.path.relpath(sys.executable) \
        if Path(sys.executable).is_relative_to(Path.cwd()) else sys.executable
    command = shlex.join([python, os.path.relpath(__file__), *sys.argv[1:]])
    mode = "--quick smoke run" if args.quick else "full run"

    def spread(d: dict[str, list[float]]) -> str:
        return "; ".join(f"{side} {min(v):,.0f}–{max(v):,.0f}" for side, v in d.items())

    def runs(r: dict) -> str:
        return ", ".join(f"{size(x['peak_anon'])}/{size(x['peak_rss'])}" for x in r["runs"])

    def arr_runs(r: dict) -> str:
        return ", ".join(f"{size(x['peak_anon'])}/{size(x['peak_file'])}" for x in r["runs"])

    notes = [
        "",
        f"Command: `{command}` ({mode}, {elapsed / 60:.1f} min, {time.strftime('%Y-%m-%d')})",
        "",
        f"- Setup: TensorFlow {tf_version}, Keras {keras_version}, {os.cpu_count()} CPU cores, "
        f"1-min load average {load:.2f} at start. {n:,} samples of 32×32×3 float32 + int64 "
        f"label ({size(n * SAMPLE_BYTES)}), batch {BATCH}, memory_budget "
        f"{size(budget_bytes)}. Throughput: median of {args.passes} interleaved passes after "
        f"a warm-up pass, page cache warm.",
        f"- Spread of the passes (samples/s): read: {spread(reads)}. write: {spread(writes)}. "
        f"fit: {spread(fits)}. Each pipeline in its own process ({args.passes} rounds of "
        f"one child per pipeline, each child's median of 3 passes after a warm-up): "
        f"{spread(isolated)}.",
        f"- Stream plan: {plan}",
        f"- Stream plan with `reader=\"tf\"` (before): {tf_plan}",
        f"- Peak RSS: children stream one epoch of {small['samples']:,} samples "
        f"({size(small['bytes'])} of shards) and {big['samples']:,} samples "
        f"({size(big['bytes'])}); medians of {args.rss_runs} children each. Anon/total peaks "
        f"per child: small {runs(small)}; big {runs(big)}. TF baseline (anon RSS after "
        f"`import tensorflow` and building the dataset): {size(small['baseline_anon'])} / "
        f"{size(big['baseline_anon'])} (total {size(small['baseline_rss'])} / "
        f"{size(big['baseline_rss'])}). Growth while streaming (peak − baseline, anon): "
        f"{size(small['peak_anon'] - small['baseline_anon'])} / "
        f"{size(big['peak_anon'] - big['baseline_anon'])}, plan estimate "
        f"{size(big['estimated_bytes'])}. Epoch time {small['seconds']:.1f} s / "
        f"{big['seconds']:.1f} s. With `reader=\"tf\"`: anon/total peaks small "
        f"{runs(t_small)}; big {runs(t_big)}; epoch time {t_small['seconds']:.1f} s / "
        f"{t_big['seconds']:.1f} s.",
        f"- Shuffle: {n:,} samples packed with an `id` feature; in-memory buffer "
        f"`shuffle({id_window:,})` = the stream's window. Spearman ρ per epoch: memfit "
        f"{sm['rho'][0]:+.3f} / {sm['rho'][1]:+.3f} (`reader=\"tf\"`: {tm['rho'][0]:+.3f} / "
        f"{tm['rho'][1]:+.3f}), in-memory {mm['rho'][0]:+.3f} / "
        f"{mm['rho'][1]:+.3f}. memfit's storage order is what `shuffle=False` yields (shard "
        f"by shard, record by record; `memfit.pack` already wrote a seeded global "
        f"permutation of the source); the in-memory pipeline's is the array order.",
        f"- Arrays path: `memfit.dataset({{'x': x.npy, 'y': y.npy}}, 256, features=('x', "
        f"'y'), memory_budget=...)` over the same source files. Plan: {arrays_plan}",
        f"- Arrays path, cold: spread {spread(cold['rates'])} samples/s; each pass is a fresh "
        f"child (TensorFlow import not timed; the pipeline start is), its files evicted from "
        f"the page cache just before the epoch; {resident}. This runs in a VM: the host may "
        f"still cache the virtual disk, so 'cold' here is a lower bound on the cost of a "
        f"real disk read.",
        f"- Arrays path, peak RSS: the same children as above with the arrays path over the "
        f".npy sources ({a_small['samples']:,} and {a_big['samples']:,} samples). Anon/file "
        f"peaks per child: small {arr_runs(a_small)}; big {arr_runs(a_big)}. Baseline anon "
        f"{size(a_small['baseline_anon'])} / {size(a_big['baseline_anon'])}; growth while "
        f"reading (anon) {size(a_small['peak_anon'] - a_small['baseline_anon'])} / "
        f"{size(a_big['peak_anon'] - a_big['baseline_anon'])}, plan estimate "
        f"{size(a_big['estimated_bytes'])}. Epoch time {a_small['seconds']:.1f} s / "
        f"{a_big['seconds']:.1f} s. File-backed RSS grows with the pages read (it is the "
        f"page cache, mapped): harmless, the kernel drops it under pressure.",
        f"- Arrays path, shuffle: Spearman ρ per epoch {am['rho'][0]:+.3f} / "
        f"{am['rho'][1]:+.3f} (storage order = file order; a global permutation per epoch).",
    ]
    return "\n".join(rows + notes)


if __name__ == "__main__":
    main()
