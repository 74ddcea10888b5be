"""Pack arrays (.npy, memory-mapped), an .npz, a CSV or Parquet file, TFRecord files of
tf.train.Example records or a folder of images (one sub-folder a class) into checksummed
TFRecord shards with a manifest.json, in a seeded shuffle order. With --format arrays,
write one .npy file per split and feature instead (<split>/<feature>.npy, sha256 in the
manifest), for memfit.dataset's memory-mapped reader with a global shuffle.

examples:
  memfit pack x=images.npy y=labels.npy -o data/train
  memfit pack x=images.npy y=labels.npy -o data/arrays --format arrays --split train=0.9,val=0.1
  memfit pack data.npz -o data/all --split train=0.9,val=0.1 --shard-size 128MiB
  memfit pack --csv table.csv --label target -o data/table --compression GZIP
  memfit pack --tfrecord 'data/path*.tfrecords' -o data/train   # spec inferred, checked
  memfit pack --images photos/ --image-size 128,128 -o data/photos   # photos/<class>/*.jpg
  memfit pack --images photos/ --image-size 128,128 --keep-encoded -o data/photos  # small
  memfit pack --parquet table.parquet --label target -o data/table   # needs memfit[parquet]
  memfit pack x=images.npy y=labels.npy -o data/train --overwrite   # replace it, safely
"""

from __future__ import annotations

import argparse
import signal
import sys

from memfit.cli.common import count
from memfit.data.packing.packer import pack
from memfit.data.sources.parquet_source import use_system_pool
from memfit.errors import DatasetError
from memfit.memory.allocator import fix_mmap_threshold

NAME = "pack"
HELP = ("pack arrays, an .npz, CSV, Parquet or TFRecord files, or a folder of images into "
        "checksummed shards (or .npy)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("inputs", nargs="*", metavar="NAME=FILE.npy | FILE.npz",
                   help="named .npy arrays (memory-mapped) or one .npz archive")
    p.add_argument("-o", "--output", required=True, help="dataset directory to write")
    p.add_argument("--csv", help="pack this CSV file (header row, numeric columns) instead")
    p.add_argument("--tfrecord", nargs="+", action="extend", metavar="FILE|GLOB",
                   help="pack these TFRecord files of tf.train.Example records (plain, GZIP "
                        "or ZLIB; quote a glob) instead; the spec is inferred from them")
    p.add_argument("--parquet", metavar="FILE",
                   help="pack this Parquet file instead (numeric and fixed-length list "
                        "columns, read row group by row group; needs memfit[parquet])")
    p.add_argument("--images", metavar="FOLDER",
                   help="pack this folder of images in class sub-folders instead (JPEG, "
                        "PNG, BMP, GIF; labels from the sorted sub-folder names, as "
                        "keras.utils.image_dataset_from_directory)")
    p.add_argument("--image-size", metavar="H,W",
                   help="with --images: the height and width images are resized to "
                        "(bilinear, as Keras); H,W or HxW")
    p.add_argument("--crop-to-aspect-ratio", action="store_true",
                   help="with --images: crop each image (centred) to the aspect ratio of "
                        "--image-size before resizing")
    p.add_argument("--on-corrupt", choices=["raise", "skip"], default="raise",
                   help="with --images: a file that does not decode stops the pack "
                        "(raise, default) or is left out with a warning (skip)")
    p.add_argument("--keep-encoded", action="store_true",
                   help="with --images: keep each file's bytes as they are (small shards); "
                        "memfit.dataset decodes and resizes them in the stream")
    p.add_argument("--format", choices=["tfrecord", "arrays"], default="tfrecord",
                   help="tfrecord: checksummed shards (default); arrays: one .npy file per "
                        "split and feature, read memory-mapped with a global shuffle")
    p.add_argument("--label", help="with --csv or --parquet: the label column (becomes y; "
                                   "the other numeric columns x)")
    p.add_argument("--variable", action="append", default=[], metavar="NAME",
                   help="a feature whose first dimension varies (repeatable)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--shards", type=count, help="number of shards per split")
    group.add_argument("--shard-size", help="target shard size, e.g. 256MiB")
    p.add_argument("--samples-per-record", type=count,
                   help="samples per record (default: about 256 KiB a record)")
    p.add_argument("--compression", choices=["GZIP", "ZLIB", "none"], default="none",
                   help="shard compression (tfrecord format only)")
    p.add_argument("--split", help="e.g. train=0.9,val=0.1 (seeded permutation)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle and split (0)")
    p.add_argument("--no-shuffle", action="store_true", help="keep the source order")
    p.add_argument("--workers", type=count, default=1, help="parallel writer processes (1)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset in --output: the new one is written beside it "
                        "and swapped in, so a failure or kill leaves the old or the new "
                        "(rerun the same command to finish a killed one)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _source(inputs: list[str]) -> object:
    if len(inputs) == 1 and "=" not in inputs[0]:
        return inputs[0]
    arrays = {}
    for item in inputs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise DatasetError(f"Inputs are NAME=FILE.npy (or a single FILE.npz). "
                               f"Received: {item!r}")
        if name in arrays:
            raise DatasetError(f"Feature {name!r} is given twice. Received: {inputs}")
        arrays[name] = path
    return arrays


def run(args: argparse.Namespace) -> int:
    # Past `ulimit -f`, write() must fail with EFBIG (reported, nothing half written), not
    # kill the process (SIGXFSZ's default). CPython ignores it already; an embedding host or
    # a parent that reset it may not have.
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if args.keep_encoded and not args.images:
        raise DatasetError("--keep-encoded applies to --images FOLDER only (image files "
                           "kept encoded). Received: --keep-encoded without --images")
    given = [bool(args.inputs), bool(args.csv), bool(args.parquet), bool(args.tfrecord),
             bool(args.images)]
    if sum(given) != 1:
        raise DatasetError(f"Give NAME=FILE.npy inputs, an .npz, --csv FILE, --parquet FILE, "
                           f"--tfrecord FILES or --images FOLDER (one of them). Received: "
                           f"inputs={args.inputs}, --csv={args.csv!r}, "
                           f"--parquet={args.parquet!r}, --tfrecord={args.tfrecord}, "
                           f"--images={args.images!r}")
    if args.parquet:
        # Row groups are large buffers freed at once: pyarrow's own pool (mimalloc) and
        # glibc's moving mmap threshold kept them, and the peak grew with the table
        # (1.11-1.17x from 0.25 to 2 GB); pyarrow on malloc with a fixed threshold
        # returns each when freed (anon 1.03x), at no cost in time here.
        fix_mmap_threshold()
        use_system_pool()
    tfrecord = args.tfrecord[0] if args.tfrecord and len(args.tfrecord) == 1 else args.tfrecord
    result = pack(_source(args.inputs) if args.inputs else None, args.output, csv=args.csv,
                  parquet=args.parquet, tfrecord=tfrecord, images=args.images,
                  image_size=args.image_size,
                  crop_to_aspect_ratio=args.crop_to_aspect_ratio, on_corrupt=args.on_corrupt,
                  keep_encoded=args.keep_encoded,
                  label=args.label, variable=args.variable, shards=args.shards,
                  shard_size=args.shard_size, samples_per_record=args.samples_per_record,
                  compression=None if args.compression == "none" else args.compression,
                  split=args.split, seed=args.seed, shuffle=not args.no_shuffle,
                  workers=args.workers, overwrite=args.overwrite,
                  progress=not args.quiet and sys.stderr.isatty(),   # bars: terminals only
                  format=args.format)
    print(result)
    return 0
