"""Packing the new sources (issue 30): peak RSS for a small and a large source of each
kind, and the pack throughput of the recipe's TFRecord files against a plain write +
fsync of as many incompressible bytes.

    python benchmarks/pack_sources.py --small 256MiB --large 1GiB --dir /tmp/memfit-bench

Each pack runs in a child process (``memfit pack``, progress off); its peak RSS is the
kernel's ``ru_maxrss`` for that child, and its anonymous and file-backed peaks (``RssAnon``,
``RssFile`` of ``/proc/PID/status``, sampled every 20 ms) are shown beside it: memfit judges
the anonymous one. The sources, with random (incompressible) values:

- ``tfrecord``: the recipe: one ``tf.train.Example`` a sample, ``data`` =
  ``tf.io.serialize_tensor(x)`` of a float32 64×64×3 array, ``label`` a float list of 10,
  written with ``tf.io.TFRecordWriter`` into 4 files.
- ``images``: PNGs of 256×256 noise in 4 class folders, packed at 128×128.
- ``parquet``: 64 float32 columns, a list<float32> column of 64 and an int64 label, in row
  groups of 65,536 rows.

Prints a markdown table; ``--json FILE`` also writes the figures as JSON (sizes, peaks and
ratios per kind, and the pack ÷ write + fsync throughput ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from memfit.sizes import format_size, parse_size

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def make_tfrecord(directory: Path, nbytes: int) -> list[str]:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    shape = (64, 64, 3)
    n = max(4, nbytes // (4 * int(np.prod(shape))))
    per = -(-n // 4)
    for f in range(4):
        with tf.io.TFRecordWriter(str(directory / f"path{f + 1}.tfrecords")) as w:
            for _ in range(f * per, min(n, (f + 1) * per)):
                x = rng.standard_normal(shape, dtype=np.float32)
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "data": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[tf.io.serialize_tensor(x).numpy()])),
                    "label": tf.train.Feature(float_list=tf.train.FloatList(
                        value=rng.random(10, dtype=np.float32)))}))
                w.write(ex.SerializeToString())
    return ["--tfrecord", str(directory / "path*.tfrecords")]


def make_images(directory: Path, nbytes: int) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    done, i = 0, 0
    while done < nbytes:
        cls = directory / "photos" / f"class{i % 4}"
        cls.mkdir(parents=True, exist_ok=True)
        path = cls / f"{i:06d}.png"
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(
            path, compress_level=1)
        done += path.stat().st_size
        i += 1
    return ["--images", str(directory / "photos"), "--image-size", "128,128"]


def make_parquet(directory: Path, nbytes: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    rows_per_group = 65536
    row_bytes = 4 * 64 + 4 * 64 + 8
    groups = max(1, nbytes // (row_bytes * rows_per_group))
    cols = [f"c{j}" for j in range(64)]
    schema = pa.schema([*(pa.field(c, pa.float32()) for c in cols),
                        pa.field("emb", pa.list_(pa.float32())), pa.field("target", pa.int64())])
    with pq.ParquetWriter(directory / "table.parquet", schema, compression="none") as w:
        for _ in range(groups):
            data = {c: rng.random(rows_per_group, dtype=np.float32) for c in cols}
            emb = rng.random((rows_per_group, 64), dtype=np.float32)
            data["emb"] = pa.ListArray.from_arrays(
                np.arange(0, emb.size + 1, 64, dtype=np.int32), pa.array(emb.reshape(-1)))
            data["target"] = rng.integers(0, 10, rows_per_group)
            w.write_table(pa.table(data, schema=schema))
    return ["--parquet", str(directory / "table.parquet"), "--label", "target"]


def make_child(kind: str, where: Path, nbytes: int) -> list[str]:
    """Writes a source in a child process (this one stays small: a child forked from it
    starts with its RSS, which ``ru_maxrss`` would count)."""
    out = subprocess.run([sys.executable, __file__, "--make", kind, str(where), str(nbytes)],
                         env=ENV, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1].split("\t")


def sample_rss(pid: int, peaks: dict[str, int], done: threading.Event) -> None:
    """Keeps the highest ``RssAnon`` and ``RssFile`` (bytes) of process ``pid`` in
    ``peaks`` until ``done`` is set or the process is gone."""
    while not done.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in peaks:
                        peaks[key] = max(peaks[key], int(line.split()[1]) * 1024)
        except OSError:
            return
        done.wait(0.02)


def pack_child(args: list[str], out: Path) -> tuple[float, float, int, int, int]:
    """Seconds (wall, and the pack's own as it reports them), peak RSS, peak anonymous and
    peak file-backed RSS (bytes) of ``memfit pack ARGS -o OUT`` in a child process."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "memfit", "pack", *args, "-o", str(out),
                             "--quiet"], env=ENV, stdout=subprocess.PIPE, text=True)
    peaks = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(proc.pid, peaks, done), daemon=True)
    sampler.start()
    text = proc.stdout.read() if proc.stdout is not None else ""
    done.set()                                      # before the wait reaps the child
    sampler.join()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"memfit pack {' '.join(args)} failed")
    own = float(text.split(" in ")[1].split(" s ")[0])
    return (time.perf_counter() - started, own, usage.ru_maxrss * 1024, peaks["RssAnon"],
            peaks["RssFile"])


def data_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in out.iterdir() if p.suffix == ".tfrecord")


def write_fsync(path: Path, nbytes: int) -> float:
    """Seconds to write ``nbytes`` of random bytes in 8 MiB pieces and fsync them."""
    chunk = np.random.default_rng(1).bytes(8 * 2**20)
    started = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", default="256MiB")
    ap.add_argument("--large", default="1GiB")
    ap.add_argument("--dir", default="/tmp/memfit-pack-sources")
    ap.add_argument("--kinds", default="tfrecord,images,parquet")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    ap.add_argument("--make", nargs=3, help=argparse.SUPPRESS)      # KIND DIR BYTES (a child)
    a = ap.parse_args()
    makers = {"tfrecord": make_tfrecord, "images": make_images, "parquet": make_parquet}
    if a.make:
        print("\t".join(makers[a.make[0]](Path(a.make[1]), int(a.make[2]))))
        return
    root = Path(a.dir)
    rows = []
    throughput = None
    figures: dict = {"small": a.small, "large": a.large, "kinds": {}}
    for kind in a.kinds.split(","):
        peaks = {}
        for label, size in (("small", a.small), ("large", a.large)):
            where = root / f"{kind}-{label}"
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir(parents=True)
            args = make_child(kind, where, parse_size(size))
            src = tree_bytes(where)
            seconds, own, peak, anon, file = pack_child(args, where / "out")
            peaks[label] = (src, seconds, peak, anon, file)
            if kind == "tfrecord" and label == "large":
                written = data_bytes(where / "out")
                disk = write_fsync(where / "plain.bin", written)
                throughput = (written, seconds, own, disk)
            shutil.rmtree(where)
        cells = []
        for src, sec, peak, anon, file in (peaks["small"], peaks["large"]):
            cells.append(f"{format_size(src)}: {format_size(peak)} (anon {format_size(anon)}, "
                         f"file {format_size(file)}; {sec:.1f} s)")
        (*_, s_peak, s_anon, _), (*_, l_peak, l_anon, _) = peaks["small"], peaks["large"]
        fields = ("source_bytes", "seconds", "peak_rss", "peak_anon", "peak_file")
        figures["kinds"][kind] = {"small": dict(zip(fields, peaks["small"], strict=True)),
                                  "large": dict(zip(fields, peaks["large"], strict=True)),
                                  "rss_ratio": l_peak / s_peak, "anon_ratio": l_anon / s_anon}
        rows.append(f"| {kind} | {cells[0]} | {cells[1]} | {l_peak / s_peak:.2f} "
                    f"| {l_anon / s_anon:.2f} |")
    print("| source | small: peak RSS (peak anon, file-backed; pack time) | large: the same | "
          "large ÷ small, RSS (goal ≤ 1.1) | large ÷ small, anon |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    if throughput is not None:
        written, seconds, own, disk = throughput
        print(f"\npack of the recipe's TFRecord files: {format_size(written)} of shards in "
              f"{own:.1f} s as the pack reports it, {seconds:.1f} s with the process start "
              f"({format_size(written / own)}/s); write + fsync of as many random bytes: "
              f"{disk:.1f} s ({format_size(written / disk)}/s); ratio {disk / own:.2f} "
              f"({disk / seconds:.2f} with the start; goal ≥ 0.5)")
        figures["tfrecord_pack"] = {
            "shard_bytes": written, "pack_seconds": own, "pack_seconds_with_start": seconds,
            "write_fsync_seconds": disk, "ratio": disk / own, "ratio_with_start": disk / seconds}
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
