"""``memfit.pack``: write a source into checksummed TFRecord shards plus ``manifest.json``
(or, with ``format="arrays"``, into one ``.npy`` file per split and feature).

This module is the entry point: it checks the arguments (:class:`~memfit.data.packing.pack_options.
PackOptions`), opens the source (:mod:`memfit.data.sources`), makes the output directory
ready (:mod:`memfit.data.packing.pack_output`) and hands the work to a packer: TFRecord shards
(:mod:`~memfit.data.packing.pack_shards`) or ``.npy`` arrays
(:mod:`~memfit.data.packing.arrays_pack`).

Samples are written in a seeded global shuffle order (so every shard is already a mix),
in blocks of ``samples_per_record`` per record, split into shards of about equal size.
Shards are written under temporary names and renamed when complete; the manifest comes
last. Rerunning an interrupted pack with the same arguments keeps the shards that were
finished (after checking their sha256) and writes the rest.

Example:
    >>> import numpy as np, tempfile
    >>> out = tempfile.mkdtemp() + "/train"
    >>> result = pack({"x": np.zeros((1000, 8), "float32"), "y": np.arange(1000)}, out,
    ...               progress=False)
    >>> result.samples, sorted(result.manifest.features)
    (1000, ['x', 'y'])
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memfit.atomic import temporary_name
from memfit.data.format.arrays_format import ArraysManifest
from memfit.data.format.manifest import Manifest
from memfit.data.packing.arrays_pack import pack_arrays
from memfit.data.packing.pack_options import PackOptions, check_record_size, check_split_counts
from memfit.data.packing.pack_output import (
    STATE,
    after_interrupt,
    already_packed,
    check_output,
    clear_stale_temporaries,
    prepare_output,
    remove,
    undo,
    write_failed,
)
from memfit.data.packing.pack_replace import (
    Staging,
    check_replaceable,
    holds_pack,
    recover,
    remove_leftovers,
)
from memfit.data.packing.pack_shards import pack_shards, pack_stream
from memfit.data.sources.columns import ArraySource, StreamSource
from memfit.data.sources.csv_table import csv_to_npy
from memfit.data.sources.image_source import open_images
from memfit.data.sources.opening import open_source
from memfit.data.sources.parquet_source import open_parquet
from memfit.data.sources.tfrecord_source import open_tfrecords
from memfit.errors import DatasetError, Interrupted
from memfit.sizes import format_count, format_size

__all__ = ["pack", "PackResult"]


@dataclasses.dataclass
class PackResult:
    """What a pack wrote: the manifest, and how long it took.

    Attributes:
        path: the dataset directory.
        manifest: the manifest that was written (an ``ArraysManifest`` for
            ``format="arrays"``).
        seconds: wall time of the pack.
        kept_shards: shards of an interrupted earlier run that were verified and kept.
    """

    path: Path
    manifest: Manifest | ArraysManifest
    seconds: float
    kept_shards: int = 0

    @property
    def samples(self) -> int:
        return self.manifest.samples

    @property
    def bytes(self) -> int:
        return self.manifest.bytes

    def __str__(self) -> str:
        m = self.manifest
        if isinstance(m, Manifest):
            count = sum(len(s.shards) for s in m.splits.values())
            files = format_count(count, "shard")
        else:                                           # an arrays dataset
            count = m.file_count
            files = format_count(m.file_count, ".npy file")
        splits = ", ".join(f"{n}={s.samples:,}" for n, s in m.splits.items())
        rate = self.bytes / max(self.seconds, 1e-9)
        kept = f"; kept {format_count(self.kept_shards, 'verified shard')} from the " \
            f"interrupted run" \
            if self.kept_shards else ""
        if self.kept_shards == count:
            kept = "; it was complete already (the same pack): every file verified, none written"
        return (f"packed {format_count(self.samples, 'sample')} ({splits}) into {files}, "
                f"{format_size(self.bytes)} in {self.seconds:.1f} s "
                f"({format_size(rate)}/s, {self.samples / max(self.seconds, 1e-9):,.0f} "
                f"samples/s) at {self.path}{kept}")


def pack(source: Any = None, output: str | os.PathLike = "", *,
         csv: str | None = None, label: str | None = None,
         tfrecord: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
         parquet: str | os.PathLike | None = None,
         images: str | os.PathLike | None = None, image_size: Any = None,
         crop_to_aspect_ratio: bool = False, on_corrupt: str = "raise",
         keep_encoded: bool = False, variable: Iterable[str] = (),
         shards: int | None = None, shard_size: str | int | None = None,
         samples_per_record: int | None = None, compression: str | None = None,
         split: str | Mapping[str, float] | None = None, seed: int = 0, shuffle: bool = True,
         workers: int = 1, overwrite: bool = False, progress: bool = True,
         shuffle_buffer: str | int = "256MiB", format: str = "tfrecord") -> PackResult:
    """Packs a source into checksummed TFRecord shards (or ``.npy`` files) with a
    ``manifest.json``.

    Example:
        >>> memfit.pack({"x": "images.npy", "y": "labels.npy"}, "data/train",
        ...             split="train=0.9,val=0.1", shard_size="128MiB")   # doctest: +SKIP
        >>> memfit.pack({"x": "images.npy", "y": "labels.npy"}, "data/arrays",
        ...             split="train=0.9,val=0.1", format="arrays")       # doctest: +SKIP

    Args:
        source: a dict of feature name → array (or ``.npy`` path, memory-mapped), a path
            to an ``.npz``/``.npy`` file, or an iterable of dicts of arrays (one sample
            each; its length need not be known).
        output: the dataset directory to write.
        csv: instead of ``source``, a CSV file with a header row (numeric columns).
        label: with ``csv`` or ``parquet``, the label column: it becomes ``y``, the
            other numeric columns ``x`` (Parquet list columns: features of their names).
        parquet: instead of ``source``, a Parquet file (needs ``memfit[parquet]``), read
            row group by row group into ``.npy`` columns and packed as a CSV file is.
        tfrecord: instead of ``source``, TFRecord files of ``tf.train.Example`` records
            (plain, GZIP or ZLIB): a path or glob (``"data/path*.tfrecords"``) or a list
            of them. The feature spec is inferred from the records (serialised tensors
            become features of their dtype and shape) and every record is checked
            against it before anything is written.
        images: instead of ``source``, a folder of images in class sub-folders (what
            ``keras.utils.image_dataset_from_directory`` reads): features ``image``
            (uint8, ``image_size`` × 3) and ``label`` (int64, the index of the sorted
            class names, which the manifest's ``source`` lists).
        image_size: with ``images``: ``(height, width)`` or ``"128,128"``; images are
            resized bilinearly as Keras resizes them.
        crop_to_aspect_ratio: with ``images``: crop each image (centred) to the aspect
            ratio of ``image_size`` before resizing, as Keras's option of that name.
        on_corrupt: with ``images``: ``"raise"`` (a file that does not decode stops the
            pack, naming it, and nothing is left) or ``"skip"`` (every file is decoded
            once ahead; those that do not decode are left out with one warning line, and
            the manifest's ``source`` counts and names them).
        keep_encoded: with ``images``: store each file's bytes as they are (JPEG, PNG,
            GIF, BMP) instead of the decoded image, so shards stay small; every file is
            decoded once, only to check it. ``memfit.dataset`` decodes and resizes them
            in the stream (``tf.io.decode_image`` + bilinear ``tf.image.resize`` to
            ``image_size``), inside its byte budget; the manifest's ``image`` feature has
            a ``decode`` entry saying so.
        variable: features whose first dimension varies between samples.
        shards: the number of shards per split (exclusive with ``shard_size``).
        shard_size: the target size of one shard, e.g. ``"256MiB"``.
        samples_per_record: samples stored per record; by default about 256 KiB a record.
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        split: e.g. ``"train=0.9,val=0.1"``: a seeded permutation assigns samples to splits.
        seed: seeds the shuffle and the split.
        shuffle: write samples in a seeded global shuffle order (iterables: through a
            ``shuffle_buffer`` of that many bytes).
        workers: processes writing shards in parallel (``.npy``/CSV sources; in-memory
            arrays use threads). Each process starts by importing the ``__main__``
            script: call ``pack`` from a script under ``if __name__ == "__main__":``.
        overwrite: replace a dataset already in ``output``.
        progress: show a progress bar on stderr.
        shuffle_buffer: the byte budget of the shuffle buffer for iterable sources.
        format: ``"tfrecord"`` (shards, the default) or ``"arrays"``: one ``.npy`` file per
            split and feature, ``<split>/<feature>.npy``, for ``memfit.dataset``'s
            memory-mapped global-shuffle path (fixed-shape arrays of known length only;
            ``shards``, ``shard_size``, ``samples_per_record``, ``compression``, ``variable``
            and ``workers`` do not apply).

    Returns:
        A :class:`PackResult`; ``print`` it for the summary.

    Raises:
        DatasetError: for bad input, before anything is written.
    """
    started = time.perf_counter()
    inputs = {"csv": csv, "parquet": parquet, "tfrecord": tfrecord, "images": images}
    out = _check_call(source, output, inputs, label, image_size)
    for name, value, default in (("keep_encoded", keep_encoded, False),
                                 ("crop_to_aspect_ratio", crop_to_aspect_ratio, False),
                                 ("on_corrupt", on_corrupt, "raise")):
        if images is None and value != default:     # silently ignored, it would mislead
            raise DatasetError(f"{name} applies to images only (a folder of image files: "
                               f"images=, --images); leave it out for this source. "
                               f"Received: {name}={value!r}, images=None")
    options = PackOptions.of(shards=shards, shard_size=shard_size,
                             samples_per_record=samples_per_record, compression=compression,
                             split=split, seed=seed, shuffle=shuffle, workers=workers,
                             variable=variable, shuffle_buffer=shuffle_buffer, format=format)
    if options.format == "arrays" and source is not None \
            and not isinstance(source, str | os.PathLike | Mapping):
        raise DatasetError("format='arrays' needs arrays of known length (a dict of "
                           "arrays or .npy paths, an .npz/.npy file or a CSV file); pack "
                           "an iterable with format='tfrecord'. Received: "
                           f"source of type {type(source).__name__}")
    swapped = recover(out)              # a replacement killed between its two renames
    replacing = overwrite and holds_pack(out)
    if replacing:
        check_replaceable(out)          # before anything is written
    made = check_output(out)
    had_state = (out / STATE).is_file()
    # a CSV source converted to .npy, compressed TFRecord files decompressed: this call's
    csv_dir = temporary_name(out / "csv")
    try:
        src = _open(source, inputs, csv_dir, label, options,
                    dict(image_size=image_size, crop_to_aspect_ratio=crop_to_aspect_ratio,
                         on_corrupt=on_corrupt, keep_encoded=keep_encoded))
        fingerprint = options.fingerprint(src)
        if replacing:
            manifest, kept = _replace(src, out, options, fingerprint, progress, swapped,
                                      keep={csv_dir.name})
        else:
            manifest, kept = _pack_into(src, out, options, fingerprint, progress, made,
                                        keep={csv_dir.name})
    except Exception:           # bad input (a CSV cell...): the directories made go
        if made:
            remove(made[0])
        raise
    except KeyboardInterrupt:   # Ctrl-C: the finished shards stay, to resume from
        left = (f"rerun the same command to go on with the replacement of {str(out)!r} "
                f"(the dataset there stays whole until the new one is swapped in)"
                if replacing
                else after_interrupt(out, made, had_state))
        raise Interrupted(left) from None
    finally:
        shutil.rmtree(csv_dir, ignore_errors=True)
    if not replacing:
        remove_leftovers(out)           # a killed replacement's sibling, now stale
    return PackResult(path=out, manifest=manifest, seconds=time.perf_counter() - started,
                      kept_shards=kept)


def _pack_into(src: ArraySource | StreamSource, out: Path, options: PackOptions,
               fingerprint: str | None, progress: bool, made: list[Path],
               keep: set[str]) -> tuple[Manifest | ArraysManifest, int]:
    """Packs into ``out`` itself (resuming an interrupted pack there); a pack that fails
    removes what it wrote (a resumed one keeps its finished shards for the next try)."""
    before = set(os.listdir(out)) if out.is_dir() and not made else set()
    resuming = (out / STATE).is_file()
    try:
        done = _pack(src, out, options, fingerprint, progress=progress, keep=keep)
    except OSError as e:        # the disk is full, a file-size limit...: nothing half written
        undo(out, made, before, resuming)
        raise write_failed(e, out, kept=resuming) from e
    except Exception:           # bad input found on the way (a ragged iterable...)
        undo(out, made, before, resuming)
        raise
    (out / STATE).unlink(missing_ok=True)
    return done


def _replace(src: ArraySource | StreamSource, out: Path, options: PackOptions,
             fingerprint: str | None, progress: bool, swapped: bool,
             keep: set[str]) -> tuple[Manifest | ArraysManifest, int]:
    """Packs beside ``out`` and swaps the new dataset in (:mod:`memfit.data.packing.pack_replace`):
    the old one stays whole until then. A rerun after a killed replacement resumes its
    shards, or finds its work done (``out`` holds this very pack, every file verified)."""
    clear_stale_temporaries(out, keep)     # refuses a pack still writing into out
    staging = Staging(out)
    try:
        if staging.leftover or swapped:
            done = already_packed(out, fingerprint, keep)
            if done is not None:        # killed after its swap: only the cleaning was left
                staging.discard()
                return done
        staging.resume_or_clear(fingerprint)
        try:
            manifest, kept = _pack(src, staging.path, options, fingerprint, progress=progress,
                                   keep=())
            (staging.path / STATE).unlink(missing_ok=True)
            staging.swap(_files(manifest))
        except OSError as e:        # the disk is full...: the old dataset is untouched
            staging.abandon()
            raise write_failed(e, out, kept=not staging.discard_on_failure,
                               replacing=True) from e
        except Exception:           # bad input found on the way
            staging.abandon()
            raise
    finally:
        staging.close()
    return dataclasses.replace(manifest, path=out), kept


def _files(manifest: Manifest | ArraysManifest) -> list[str]:
    """The relative paths of a dataset's data files."""
    if isinstance(manifest, Manifest):
        return [sh.file for s in manifest.splits.values() for sh in s.shards]
    return [a.file for s in manifest.splits.values() for a in s.files.values()]


def _check_call(source: Any, output: str | os.PathLike, inputs: dict[str, Any],
                label: str | None, image_size: Any) -> Path:
    """The output directory; exactly one source (``source``, ``csv``, ``tfrecord``...)."""
    if not str(output):
        raise DatasetError("pack needs an output directory. Received: output=''")
    given = [k for k, v in inputs.items() if v is not None]
    if (source is not None) + len(given) != 1:
        listed = ", ".join(f"{k}={v!r}" for k, v in inputs.items())
        raise DatasetError(f"Give exactly one of source=..., {'=..., '.join(inputs)}=.... "
                           f"Received: source="
                           f"{'None' if source is None else type(source).__name__}, {listed}")
    if label is not None and inputs["csv"] is None and inputs["parquet"] is None:
        raise DatasetError(f"label applies to CSV and Parquet sources only. "
                           f"Received: label={label!r}")
    if (inputs["images"] is None) != (image_size is None):
        raise DatasetError(f"images and image_size go together: the folder and the "
                           f"(height, width) to resize to, e.g. images='photos/', "
                           f"image_size=(128, 128) (--images photos/ --image-size 128,128). "
                           f"Received: images={inputs['images']!r}, "
                           f"image_size={image_size!r}")
    return Path(output)


def _open(source: Any, inputs: dict[str, Any], csv_dir: Path, label: str | None,
          options: PackOptions, image_options: dict[str, Any]) -> ArraySource | StreamSource:
    """The source, checked: a CSV file is converted to ``.npy`` columns in ``csv_dir``
    first (compressed TFRecord files decompressed there); every split must get samples;
    ``format="arrays"`` takes fixed shapes only."""
    csv = inputs["csv"]
    src: ArraySource | StreamSource
    fixed = next((k for k in ("images", "parquet", "csv") if inputs[k] is not None), None)
    if options.variable and fixed is not None:
        raise DatasetError(f"variable applies to arrays, iterables and TFRecord files; the "
                           f"features of {fixed} have their shapes from the source (leave "
                           f"variable out). Received: variable={list(options.variable)}, "
                           f"{fixed}={inputs[fixed]!r}")
    if options.format == "arrays" and image_options.get("keep_encoded"):
        raise DatasetError("format='arrays' stores fixed-shape features only, and images "
                           "kept encoded vary in size: pack them with format='tfrecord', or "
                           "without keep_encoded (decoded to image_size). Received: "
                           "keep_encoded=True, format='arrays'")
    if inputs["tfrecord"] is not None:
        src = open_tfrecords(inputs["tfrecord"], csv_dir, variable=options.variable)
    elif inputs["images"] is not None:
        src = open_images(inputs["images"], **image_options)
    elif inputs["parquet"] is not None:
        src = open_parquet(inputs["parquet"], csv_dir, label=label)
    elif csv is not None:
        if not Path(csv).is_file():
            what = ("is a directory, not a CSV file: give the path of a CSV file"
                    if Path(csv).is_dir() else
                    "is not a regular file (a pipe or a device, and memfit reads a CSV file "
                    "twice: to check it, then to convert it): save it to a file and give "
                    "that path" if Path(csv).exists() else
                    "does not exist: give the path of a CSV file")
            raise DatasetError(f"{csv!r} {what}. Received: csv={csv!r}")
        paths, description = csv_to_npy(csv, csv_dir, label=label)   # checks every cell
        src = open_source(paths)
        src.description = description
        # What a rerun must match to resume: the CSV file, not its conversion (made again,
        # in a scratch directory of a new name, by every run).
        st = os.stat(csv)
        src.identity = (f"csv:{os.path.abspath(csv)}:{st.st_size}:{st.st_mtime_ns}:"
                        f"label={label}:{description}")
    else:
        src = open_source(source, variable=options.variable)
    if isinstance(src, ArraySource):
        check_split_counts(src.length, options)
    check_record_size(src, options)
    variable = [f.name for f in src.features.values() if f.variable]
    if options.format == "arrays" and variable:
        raise DatasetError(f"format='arrays' stores fixed-shape features only; {variable} vary "
                           f"in their first dimension. Pack them with format='tfrecord' or "
                           f"pad them. Received: variable={variable}")
    return src


def _pack(src: ArraySource | StreamSource, out: Path, options: PackOptions,
          fingerprint: str | None, *, progress: bool,
          keep: set[str]) -> tuple[Manifest | ArraysManifest, int]:
    """Packs ``src`` into ``out`` with the packer of its format: the manifest written and
    the files kept from an interrupted run. A pack that finished already (the same source
    and options, every file whole) is left as it is."""
    done = already_packed(out, fingerprint, keep)
    if done is not None:                # killed as it exited: rerun, nothing to do
        return done
    state = prepare_output(out, fingerprint, keep)
    if options.format == "arrays":
        assert isinstance(src, ArraySource)
        return pack_arrays(src, out, state, options, fingerprint=fingerprint,
                           progress=progress)
    if isinstance(src, ArraySource):
        return pack_shards(src, out, state, options, fingerprint, progress)
    return pack_stream(src, out, options, progress), 0
